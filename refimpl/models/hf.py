"""Loading Hugging Face causal LMs from folders: our committed ones, a converted cache, the local hub cache.

Nothing is ever downloaded: a missing model raises ``FileNotFoundError`` naming it and how to get it.
"""
from __future__ import annotations

import contextlib
import os

import torch

from ..lm import LM, default_device

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: the committed weights of our zoo (``models/NAME`` at the repository root)
MODELS_DIR = os.path.join(ROOT, "models")


def cache_dir() -> str:
    """Where converted models are cached: ``$REFIMPL_CACHE`` or ``~/.cache/refimpl``."""
    return os.environ.get("REFIMPL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "refimpl")


def zoo_folder(name: str, how: str, marker: str = "config.json") -> str:
    """``models/NAME``, or ``FileNotFoundError`` naming the model and ``how`` to get it."""
    path = os.path.join(MODELS_DIR, name)
    if not os.path.exists(os.path.join(path, marker)):
        raise FileNotFoundError(f"model {name!r} not found at {path}; {how}")
    return path


@contextlib.contextmanager
def quiet_loading():
    """transformers' progress bars (its "Loading weights" bar) off inside the block, back as they were
    after: loading a model prints nothing."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def place(model, device=None, dtype=None, attn=None):
    """Move ``model`` to ``device`` (default: cuda when present) in ``dtype`` (default fp32), set ``attn``."""
    device = torch.device(device) if device is not None else default_device()
    model = model.to(device=device, dtype=dtype or torch.float32)
    if attn is not None:
        set_attention(model, attn)
    return model


def load_folder(path: str, name: str | None = None, device=None, dtype=None, attn=None) -> LM:
    """A folder with ``config.json`` + safetensors + tokenizer files (our zoo format, or any HF save)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not os.path.exists(os.path.join(path, "config.json")):
        raise FileNotFoundError(f"{path} has no config.json")
    tok = AutoTokenizer.from_pretrained(path)
    with quiet_loading():
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return LM(place(model, device, dtype, attn), tok, name=name or os.path.basename(os.path.normpath(path)))


def load_hub_cache(name: str, device=None, dtype=None, attn=None, known=()) -> LM:
    """A Hugging Face id that is already in the local cache (``local_files_only``)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(name, local_files_only=True)
        with quiet_loading():
            model = AutoModelForCausalLM.from_pretrained(name, local_files_only=True, dtype=torch.float32)
    except (OSError, ValueError) as e:
        raise FileNotFoundError(
            f"model {name!r} is neither in our zoo ({', '.join(sorted(known))}), nor a local folder, nor in "
            f"the local Hugging Face cache. Nothing is downloaded at run time: fetch it yourself once "
            f"(huggingface-cli download {name}) or pass a folder with its files."
        ) from e
    return LM(place(model, device, dtype, attn), tok, name=name)


def set_attention(model, attn: str) -> None:
    """Switch attention: "eager", "sdpa", or "triton" (our kernel, registered with transformers)."""
    if attn == "triton":
        from .attention import register_triton_attention

        model.set_attn_implementation(register_triton_attention())
    elif attn in ("eager", "sdpa"):
        model.set_attn_implementation(attn)
    else:
        raise ValueError(f"attn must be None, 'eager', 'sdpa' or 'triton', got {attn!r}")
