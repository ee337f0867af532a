"""The one adapter every decoder talks to: :class:`LM`, a Hugging Face causal LM plus its tokenizer.

- ``lm.logits(input_ids)``: (B, T) -> (B, T, V) float logits, no cache (the teaching baseline);
- ``lm.forward(input_ids, cache, position_ids, attention_mask)``: the cached step every
  decoder uses; ``attention_mask`` is either a 2-D padding mask (B, past + Q) of 1/0, or a 4-D
  additive float mask (B, 1, Q, past + Q) for token trees (0 = attend, -inf = blocked);
- ``LM.crop(cache, length)``: roll the KV cache back to its first ``length`` positions.

Also the batch helpers every decoder shares: :func:`left_pad` (a ragged batch as one block) and
:func:`positions_from_mask` (position ids that skip the pads). Loading by name lives one layer up,
in :mod:`refimpl.models`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch


def default_device() -> torch.device:
    """The device the course runs on: ``$REFIMPL_DEVICE`` when set (``cpu``, ``cuda``, ``cuda:1``),
    else CUDA when present, else the CPU. Every notebook's setup cell and ``models.load`` ask here,
    so one variable moves the whole course (``REFIMPL_DEVICE=cpu`` on a GPU machine, say)."""
    name = os.environ.get("REFIMPL_DEVICE", "").strip()
    if name:
        try:
            dev = torch.device(name)
        except RuntimeError as e:
            raise ValueError(f"REFIMPL_DEVICE must name a torch device (cpu, cuda, cuda:1), got {name!r}") from e
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"REFIMPL_DEVICE={name!r} but torch sees no CUDA device")
        return dev
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def as_token_batch(input_ids) -> torch.Tensor:
    """Token ids as a (B, T) long tensor: a list or a 1-D tensor becomes one row."""
    if not isinstance(input_ids, torch.Tensor):
        input_ids = torch.tensor(input_ids, dtype=torch.long, device="cpu")  # the caller moves it
    return input_ids[None] if input_ids.dim() == 1 else input_ids


@dataclass
class LM:
    """A causal LM and its tokenizer, with the calls decoders need."""

    model: torch.nn.Module
    tokenizer: object
    name: str = "model"

    def __post_init__(self):
        self.model.eval()
        cfg = self.model.config
        self.config = cfg
        self.vocab_size = self.model.get_output_embeddings().weight.shape[0]
        self.max_length = int(getattr(cfg, "max_position_embeddings", 2048))
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if eos is None:
            eos = cfg.eos_token_id if isinstance(cfg.eos_token_id, int) else None
        self.eos_token_id = eos
        pad = getattr(self.tokenizer, "pad_token_id", None)
        self.pad_token_id = pad if pad is not None else (eos if eos is not None else 0)
        self.mask_token_id = getattr(self.tokenizer, "mask_token_id", None)
        self.built = {}  # what :meth:`once` built for this target (the zoo's drafts and heads)
        self.layer_types = self.windows = None  # a Hugging Face model's attention layers (refimpl.window_cache)
        if hasattr(cfg, "get_text_config"):
            from .window_cache import attention_windows, layer_types

            self.layer_types, self.windows = layer_types(cfg), attention_windows(cfg)
        self.windowed = any(w is not None for w in self.windows or ())

    # -- properties ---------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def num_layers(self) -> int:
        return self.config.num_hidden_layers

    def once(self, key, build):
        """``build()``, called at the first use of ``key`` and kept with this target: the zoo's
        draft or heads for it, in their fast form, which every ``generate`` call would otherwise load
        and pack again (milliseconds to tens of ms, a large share of a short generation)."""
        if key not in self.built:
            self.built[key] = build()
        return self.built[key]

    def fast_draft(self, draft, int8: bool = False):
        """``draft`` (an EAGLE draft) in the form that runs fastest beside this target: here, as it
        is. A target on the lean CPU forward (:class:`refimpl.models.lean_llama.LeanLM`) moves the
        draft's products onto the same kernel (``int8``: on int8 panels)."""
        return draft

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids) -> str:
        return self.tokenizer.decode(ids)

    # -- forward passes -----------------------------------------------------------------
    @torch.no_grad()
    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) token ids -> (B, T, V) float32 logits, full causal attention, no cache.

        For a left-padded batch pass the 2-D padding ``attention_mask`` and ``position_ids``.
        """
        input_ids = as_token_batch(input_ids).to(self.device)
        out = self.model(
            input_ids=input_ids,
            attention_mask=None if attention_mask is None else attention_mask.to(self.device),
            position_ids=None if position_ids is None else position_ids.to(self.device),
            use_cache=False,
        )
        return out.logits.float()

    def new_cache(self):
        """An empty KV cache: Hugging Face's ``DynamicCache``, or for a model with sliding-window layers a
        :class:`refimpl.window_cache.WindowCache` (it keeps what a rejected draft needs to be undone)."""
        if self.windowed:
            from .window_cache import WindowCache

            return WindowCache()
        from transformers import DynamicCache

        return DynamicCache(config=self.config)

    def rollback_problem(self) -> str | None:
        """Why this model's cache cannot be rolled back past a rejected draft (a recurrent or chunked
        layer, ...: :func:`refimpl.window_cache.rollback_problem`), or None: every method can run."""
        if self.layer_types is None:
            return None
        from .window_cache import rollback_problem

        return self.once(("rollback problem",), lambda: rollback_problem(self.model))

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, cache=None, position_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, output_hidden_states=False,
                logits_to_keep: int = 0):
        """One cached step. ``input_ids`` (B, Q) are appended after the ``past`` cached tokens.

        Returns ``(logits (B, Q, V) float32, cache)``, or ``(logits, cache, hidden)`` with
        ``hidden`` the last layer's hidden states (B, Q, H) when ``output_hidden_states`` is True;
        a tuple of layer ids instead (:func:`check_taps`) gives those layers' residual streams side
        by side, (B, Q, len(taps) H): EAGLE-3's multi-layer features from the same call.
        ``logits_to_keep=n`` computes logits for the last ``n`` positions only (0 = all): a
        prefill that needs only the next token skips the (Q, V) output projection.
        """
        taps = None if isinstance(output_hidden_states, bool) else check_taps(output_hidden_states, self.num_layers)
        if cache is None:
            cache = self.new_cache()
        positions = None
        if self.windowed:
            from .window_cache import WindowCache, layer_masks

            if isinstance(cache, WindowCache):  # windows measured in positions, across holes
                attention_mask, positions = layer_masks(cache, self.layer_types, self.windows, input_ids.shape[0],
                                                        input_ids.shape[1], position_ids, attention_mask, self.dtype,
                                                        self.device)
                position_ids = positions
        if attention_mask is not None and not isinstance(attention_mask, dict) and attention_mask.dim() == 4:
            attention_mask = attention_mask.to(device=self.device, dtype=self.dtype)
        out = self.model(
            input_ids=input_ids.to(self.device),
            past_key_values=cache,
            position_ids=None if position_ids is None else position_ids.to(self.device),
            attention_mask=attention_mask if attention_mask is None or isinstance(attention_mask, dict)
            else attention_mask.to(self.device),
            use_cache=True,
            output_hidden_states=bool(output_hidden_states),
            logits_to_keep=logits_to_keep,
        )
        if positions is not None:
            cache.append_positions(positions)
        if output_hidden_states is True:
            return out.logits.float(), out.past_key_values, out.hidden_states[-1]
        if taps:
            return out.logits.float(), out.past_key_values, torch.cat([out.hidden_states[i] for i in taps], -1)
        return out.logits.float(), out.past_key_values

    @staticmethod
    def cache_length(cache) -> int:
        return 0 if cache is None else cache.get_seq_length()

    @staticmethod
    def crop(cache, length: int):
        """Keep the first ``length`` cached positions (``DynamicCache.crop`` with a negative count)."""
        drop = cache.get_seq_length() - length
        if drop < 0:
            raise ValueError(f"cannot crop a cache of {cache.get_seq_length()} positions to {length}")
        if drop > 0:
            cache.crop(-drop)
        return cache

    @staticmethod
    def move_slots(cache, dst: int, src: torch.Tensor) -> None:
        """Copy each row's cached positions ``src`` (B, k) to positions ``dst .. dst + k - 1``.

        The compaction after a token-tree verification: the accepted path's keys and values move
        into place without another forward. Works on a Hugging Face ``DynamicCache`` and on
        :class:`refimpl.models.lean_llama.KVCache` (both keep (B, H, S, D) tensors per layer).
        """
        k_new = src.shape[1]
        if k_new == 0 or torch.equal(src, torch.arange(dst, dst + k_new, device=src.device).expand_as(src)):
            return  # every row's path is already in place (its first node at each depth): nothing moves
        if hasattr(cache, "move") and cache.move(dst, src):  # the lean cache: every layer in one kernel call
            return
        layers = [(lay.keys, lay.values) for lay in cache.layers] if hasattr(cache, "layers") else \
            list(zip(cache.keys, cache.values))
        for keys, values in layers:
            if keys is None:
                continue
            idx = src.to(keys.device)[:, None, :, None].expand(-1, keys.shape[1], -1, keys.shape[3])
            keys[:, :, dst:dst + k_new] = keys.gather(2, idx)  # gather copies first: overlaps are safe
            values[:, :, dst:dst + k_new] = values.gather(2, idx)


def check_rollback(lm, method: str, role: str = "target") -> None:
    """A ``ValueError`` before decoding when ``method`` would have to roll back the cache of ``lm`` (the
    ``role``) and cannot (:meth:`LM.rollback_problem`): it names the layer and the way out."""
    why = lm.rollback_problem() if hasattr(lm, "rollback_problem") else None
    if why:
        raise ValueError(f"{method} cannot run with this {role} ({getattr(lm, 'name', '?')}): {why}. Decode it "
                         "with autoregressive.generate (method='ar'), which never rolls a cache back")


def check_taps(taps, num_layers: int) -> tuple[int, ...]:
    """Layer ids whose residual streams a forward returns (Hugging Face's ``hidden_states[i]``: the
    input of layer i, i.e. after i layers; ``num_layers`` = after the final norm) -> a tuple of ints."""
    if isinstance(taps, (str, bytes)) or not hasattr(taps, "__iter__"):
        raise ValueError(f"output_hidden_states must be True/False or a tuple of layer ids, got {taps!r}")
    taps = tuple(taps)
    if not taps or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i <= num_layers for i in taps):
        raise ValueError(f"output_hidden_states: layer ids must be ints in [0, {num_layers}], got {taps!r}")
    return taps


def check_width(role: str, width: int, target) -> None:
    """A drafter trained on a target's hidden states (Medusa heads, an EAGLE draft) must match its width."""
    if width != target.config.hidden_size:
        raise ValueError(f"{role} was trained for hidden size {width}, the target has {target.config.hidden_size}")


def left_pad(prompts: list[list[int]], pad_id: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged prompts -> (ids (B, L), mask (B, L)) with pads on the left (mask 0 on pads)."""
    L = max(len(p) for p in prompts)
    rows = [[pad_id] * (L - len(p)) + list(p) for p in prompts]
    mask = [[0] * (L - len(p)) + [1] * len(p) for p in prompts]
    return (torch.tensor(rows, dtype=torch.long, device=device).view(len(prompts), L),
            torch.tensor(mask, dtype=torch.long, device=device).view(len(prompts), L))


def positions_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position ids (B, L) that count real tokens only: 0, 1, 2, ... from each row's first token."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def causal_after(B: int, T: int, P: int, device) -> torch.Tensor:
    """(B, T, P + T) bool: T new queries after P cached keys, none of them padding, see every cached
    key and the new ones up to themselves (the EAGLE drafts' ``step`` when ``allow`` is None)."""
    return torch.ones(T, P + T, dtype=torch.bool, device=device).tril(P)[None].expand(B, T, P + T)


def decoder_of(model):
    """The inner decoder of a Hugging Face causal LM (``model.model`` for Llama-like models)."""
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers"):
        raise ValueError("model must be a Llama-like causal LM with model.model.layers")
    return inner
