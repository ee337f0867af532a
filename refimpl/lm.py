"""The one adapter every decoder talks to: :class:`LM`, a Hugging Face causal LM plus its tokenizer.

- ``lm.logits(input_ids)``: (B, T) -> (B, T, V) float logits, no cache (the teaching baseline);
- ``lm.forward(input_ids, cache, position_ids, attention_mask)``: the cached step every
  decoder uses; ``attention_mask`` is either a 2-D padding mask (B, past + Q) of 1/0, or a 4-D
  additive float mask (B, 1, Q, past + Q) for token trees (0 = attend, -inf = blocked);
- ``LM.crop(cache, length)``: roll the KV cache back to its first ``length`` positions.

Sliding-window attention under draft / verify / roll back. Models such as Mistral 7B v0.1, Phi-3,
Gemma 2 / 3 (local layers) and gpt-oss restrict some or all attention layers to a window of the last
``W`` positions: the query at position ``i`` sees the keys at positions ``j`` with ``i - W < j <= i``
(Beltagy, Peters, Cohan, "Longformer", arXiv 2004.05150, §3.1; Jiang et al., "Mistral 7B", arXiv
2310.06825, §2). Hugging Face's cache for such a layer keeps only the last ``W - 1`` keys: once the window
is full, the keys a rejected draft pushed out are gone; a tree's compaction indexes slots by place; a row
with holes (:mod:`refimpl.slot_cache`) has fewer real tokens in its last ``W`` slots than the window
allows. So :meth:`LM.new_cache` gives such a model a :class:`WindowCache`: every layer keeps every
position (a full-attention cache's memory), each slot's position id is recorded, and :func:`layer_masks`
measures each window in positions, not slots: every method stays exact, for any window. A layer no
cache here can roll back (a recurrent state, chunked attention, a layer reading another's cache) is
named by :meth:`LM.rollback_problem`; the decoders refuse it before decoding (:func:`check_rollback`).
Loading by name lives one layer up, in :mod:`refimpl.models`.
"""
from __future__ import annotations

import inspect
import os
from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import get_layer_types_and_kwargs

from .primitives import additive, causal_after


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
        self.layer_types = self.windows = None  # a Hugging Face model's attention layers (see the module doc)
        if hasattr(cfg, "get_text_config"):
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

    def tree_form(self):
        """``(lm, copy)``: the LM that scores a token tree for this draft, and the copy prior it carries
        as ``(bias, max_ngram, min_ngram)`` (None: none). Here ``(self, None)``; a draft that raises its
        own logits by context lookups (:class:`refimpl.copy_prior.ContextCopyLM`) hands over its inner
        LM and the prior, which a tree proposer applies per node."""
        return self, None

    def host(self, *columns: torch.Tensor) -> tuple:
        """Small integer tensors (b, k_i) as lists of rows on the host, with one device sync per call (on
        an accelerator one concatenation, one copy); on a CPU, with nothing to sync, each its own list."""
        if self.device.type == "cpu":
            return tuple(c.tolist() for c in columns)
        rows, out, at = torch.cat([c.long() for c in columns], 1).tolist(), [], 0
        for c in columns:
            out.append([r[at:at + c.shape[1]] for r in rows])
            at += c.shape[1]
        return tuple(out)

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
        :class:`WindowCache` (it keeps what a rejected draft needs to be undone)."""
        return WindowCache() if self.windowed else DynamicCache(config=self.config)

    def rollback_problem(self) -> str | None:
        """Why this model's cache cannot be rolled back past a rejected draft (a recurrent or chunked
        layer, ...: :func:`rollback_problem`), or None: every method can run."""
        if self.layer_types is None:
            return None
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


def check_vocab(role: str, vocab: int, target, exact: bool = True) -> None:
    """A drafter scores ``vocab`` token ids (``exact``: the whole vocabulary; else the largest id + 1 of the
    subset it keeps): it must fit the target's."""
    if vocab != target.vocab_size if exact else vocab > target.vocab_size:
        raise ValueError(f"{role} was trained for a vocabulary of {vocab} tokens, the target has {target.vocab_size}")


def check_feature_draft(draft, cls, target) -> None:
    """A drafter reading ``target``'s layer features (EAGLE-3, DFlash): a ``cls`` of its width, vocabulary, depth."""
    if not isinstance(draft, cls):
        raise ValueError(f"draft must be of type {cls.__name__}, got {type(draft).__name__}")
    check_width("draft", draft.hidden_size, target)
    check_vocab("draft", draft.embed.shape[0], target)
    check_taps(draft.taps, target.num_layers)


def decoder_of(model):
    """The inner decoder of a Hugging Face causal LM (``model.model`` for Llama-like models)."""
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers"):
        raise ValueError("model must be a Llama-like causal LM with model.model.layers")
    return inner


# -- sliding windows: a cache that can always be rolled back (see the module doc) -------------------
#: the layer types whose keys and values this cache can keep, crop and move: window None = full
SUPPORTED = ("full_attention", "sliding_attention")


def layer_types(config) -> list[str]:
    """Hugging Face's attention type of every decoder layer (``full_attention``, ``sliding_attention``, ...)."""
    return list(get_layer_types_and_kwargs(config.get_text_config(decoder=True))[0])


def attention_windows(config) -> list[int | None]:
    """The window ``W`` of every decoder layer (None: full attention; a layer type this cache does not
    support counts as full here, :func:`rollback_problem` names it)."""
    types, kwargs = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
    return [kw.get("sliding_window") if t == "sliding_attention" else None for t, kw in zip(types, kwargs)]


def takes_mask_mapping(model) -> bool:
    """Does the model's decoder accept a ``{layer type: mask}`` mapping as its attention mask (the
    transformers 5 models with mixed layers do: ``isinstance(attention_mask, dict)`` in their forward)?"""
    inner = getattr(model, "model", model)
    try:
        src = inspect.getsource(type(inner).forward)
    except (OSError, TypeError):
        return False
    return "attention_mask, dict)" in src


def rollback_problem(model) -> str | None:
    """Why the draft / verify / roll back loop cannot run on ``model`` (a Hugging Face causal LM), or None."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "get_text_config"):
        return None  # not a Hugging Face model (the lean forward, a test double): its cache rolls back
    types = layer_types(config)
    for i, t in enumerate(types):
        if t not in SUPPORTED:
            return (f"layer {i} is a {t!r} layer, whose cache cannot be rolled back past a rejected draft "
                    f"(supported: {', '.join(SUPPORTED)})")
    if len(set(attention_windows(config))) > 1 and not takes_mask_mapping(model):
        return (f"it mixes {sorted(set(types))} layers, and {type(model).__name__}'s forward takes no "
                "per-layer-type attention masks")
    return None


class WindowCache(DynamicCache):
    """A ``DynamicCache`` whose layers all keep every position (sliding ones too) and which records
    the position id of every cached slot of every row: ``positions`` (B, S) long.

    :meth:`LM.forward` appends the new tokens' positions after each call; ``crop``,
    ``batch_select_indices`` and :meth:`move` keep them in step with the keys and values."""

    def __init__(self):
        super().__init__()  # no config: every layer a plain DynamicLayer, which keeps everything
        self.positions: torch.Tensor | None = None

    def append_positions(self, pos: torch.Tensor) -> None:
        """Record the position ids (B, Q) of the slots the last forward appended."""
        self.positions = pos if self.positions is None else torch.cat([self.positions, pos], 1)

    def crop(self, max_length: int) -> None:
        super().crop(max_length)
        if self.positions is not None:
            self.positions = self.positions[:, : self.get_seq_length()]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        if self.positions is not None:
            self.positions = self.positions[indices.to(self.positions.device)]

    def move(self, dst: int, src: torch.Tensor) -> bool:
        """Copy each row's slots ``src`` (B, k) to ``dst .. dst + k - 1`` in every layer (a token tree's
        compaction, :meth:`LM.move_slots`), positions included. Returns True (done)."""
        k = src.shape[1]
        for lay in self.layers:
            if lay.keys is None or lay.keys.numel() == 0:
                continue
            idx = src.to(lay.keys.device)[:, None, :, None].expand(-1, lay.keys.shape[1], -1, lay.keys.shape[3])
            lay.keys[:, :, dst:dst + k] = lay.keys.gather(2, idx)  # gather copies first: overlaps are safe
            lay.values[:, :, dst:dst + k] = lay.values.gather(2, idx)
        pos = self.positions
        pos[:, dst:dst + k] = pos.gather(1, src.to(pos.device))
        return True


def layer_masks(cache: WindowCache, types: list, windows: list, batch: int, Q: int, position_ids, attention_mask,
                dtype, device):
    """The attention mask(s) for ``Q`` new tokens at ``position_ids`` (B or 1, Q) after ``cache``, and
    the new tokens' positions (B, Q).

    ``attention_mask`` is the caller's: None (causal), a 2-D padding / slot mask (B, S + Q) of 1/0, or
    a 4-D additive mask (B, 1, Q, S + Q) (a token tree's). Every layer gets that mask; a sliding layer
    of window ``W`` also blocks the keys whose position is ``W`` or more below the query's. Returns
    one (B, 1, Q, S + Q) additive mask when all layers share a window, else ``{layer type: mask}``
    (``types``, ``windows``: :func:`layer_types` and :func:`attention_windows` of the model's config)."""
    S = cache.get_seq_length()
    if position_ids is None:  # Hugging Face's default: the next slots
        position_ids = torch.arange(S, S + Q, device=device)[None]
    qpos = position_ids.to(device).expand(batch, Q)  # (B, Q)
    past = cache.positions if cache.positions is not None else qpos.new_zeros((batch, 0))
    kpos = torch.cat([past.to(device), qpos], 1)  # (B, S + Q)
    if attention_mask is not None and attention_mask.dim() == 4:
        allow = attention_mask[:, 0].to(device) == 0  # (B, Q, S + Q)
    else:
        allow = causal_after(batch, Q, S, device)
        if attention_mask is not None:
            allow = allow & attention_mask.to(device).bool()[:, None, :]
        allow = allow.clone()
    diag = torch.arange(Q, device=device)
    allow[:, diag, S + diag] = True  # every new token sees itself: a pad's row is never empty
    gap = qpos[:, :, None] - kpos[:, None, :]  # (B, Q, S + Q) how far below the query each key sits
    masks = {t: additive(allow if w is None else allow & (gap < w), dtype) for t, w in zip(types, windows)}
    return (next(iter(masks.values())) if len(masks) == 1 else masks), qpos
