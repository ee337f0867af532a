"""Layer 3: the drafters trained for a target -- Medusa heads, EAGLE and EAGLE-3 drafts, DFlash drafters,
Learn2PD filters, and the draft models of the zoo -- on disk, and which target each one belongs to.

:data:`KINDS` is the one registry of drafter kinds: what each is, the keyword a method's ``generate``
takes it as, and where the zoo keeps it. The front door (:mod:`refimpl.methods`), the benchmark and the
exporters read it; a new kind of drafter is one entry there (its method is one row of
:data:`refimpl.methods.METHODS`).

A drafter is trained on one target's outputs or features, so it belongs to that target's *weights*, not
to a folder name. Every drafter folder records the target it was trained for in ``target.json``: the
zoo name and the :func:`fingerprint` of its weights. :func:`zoo_name` says which zoo target a model is
(by fingerprint; None for any other model, whatever its folder is called) and :func:`folder` attaches a
zoo drafter to a target only when the fingerprints agree.

Files of a drafter trained on top of a frozen target: ``<folder>/<kind>.safetensors`` (its own tensors,
plus ``kept_ids`` when its head scores a subset of the vocabulary), ``<folder>/config.json`` (its shapes
and, for an exporter, the mapping to the serving engine's names), ``<folder>/target.json``. :func:`save`
and :func:`load` write and read them; :func:`zoo` is what the front door uses: the zoo's drafter for a
target, loaded once and kept with it, in the form that runs fastest beside it (an EAGLE draft on the
lean CPU forward's int8 panels when the target runs that forward, :mod:`refimpl.models.lean_draft`).
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
from dataclasses import dataclass
from typing import Callable

from .. import dflash, eagle, eagle3, learn2pd, medusa
from ..lm import check_taps, check_width
from .hf import MODELS_DIR

SAMPLES = 64  # weight values a fingerprint records


@dataclass(frozen=True)
class Kind:
    """A kind of drafter (an entry of :data:`KINDS`). Either a whole model of the zoo, named per zoo target
    (``models``: zoo target -> zoo model), or a module trained on a frozen target, saved under
    ``models/<kind>-<target>/`` (``cls`` its class; ``state`` / ``config`` / ``build``: its tensors, its
    config.json, and the drafter rebuilt for a target from them)."""

    what: str  #: its name in messages: "EAGLE-3 draft"
    arg: str | None  #: the keyword its method's ``generate`` takes it as (None: no method drafts with it)
    models: dict | None = None
    cls: type | None = None
    state: Callable | None = None
    config: Callable | None = None
    build: Callable | None = None


# -- which target a drafter belongs to ----------------------------------------------------------------
def fingerprint(lm) -> dict:
    """What identifies a model's weights: a digest of its parameters' names and shapes, and ``SAMPLES``
    values spread evenly over all of them (a dtype change moves each by under 1%, a fine-tune moves many
    by far more). Computed once per model object (:meth:`refimpl.lm.LM.once`)."""
    def compute():
        params = [(n, p) for n, p in lm.model.named_parameters()]
        shapes = hashlib.sha256("\n".join(f"{n} {tuple(p.shape)}" for n, p in params).encode()).hexdigest()[:16]
        sizes = [p.numel() for _, p in params]
        total, values, at, start = sum(sizes), [], 0, 0
        for i in range(SAMPLES):  # the i-th of SAMPLES evenly spaced positions over the concatenated weights
            want = i * (total - 1) // max(SAMPLES - 1, 1)
            while start + sizes[at] <= want:
                start, at = start + sizes[at], at + 1
            values.append(float(params[at][1].detach().reshape(-1)[want - start]))
        return {"shapes": shapes, "values": values}
    return lm.once(("fingerprint",), compute)


def same_weights(recorded: dict, fp: dict) -> bool:
    """Do a recorded fingerprint and a model's agree (same names and shapes, values within 1% + 1e-4)?"""
    return recorded.get("shapes") == fp["shapes"] and len(recorded.get("values", [])) == len(fp["values"]) and all(
        abs(a - b) <= 1e-4 + 1e-2 * abs(b) for a, b in zip(recorded["values"], fp["values"]))


def record_target(folder: str, target, name: str | None = None, path: str | None = None) -> None:
    """Write ``folder/target.json``: the name (default ``target.name``) and fingerprint of ``target``, and
    ``path``, where to load it from (a target outside the zoo: what an exporter loads)."""
    os.makedirs(folder, exist_ok=True)
    rec = {"target": name or target.name, "fingerprint": fingerprint(target)}
    if path is not None:
        rec["path"] = os.path.abspath(path) if os.path.isdir(path) else path
    with open(os.path.join(folder, "target.json"), "w") as f:
        json.dump(rec, f, indent=1)


def recorded(folder: str) -> dict | None:
    """``folder/target.json`` (None where the folder records no target)."""
    path = os.path.join(folder, "target.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def trained_for(folder: str, target) -> bool:
    """Was the drafter in ``folder`` trained for ``target``'s weights?"""
    rec = recorded(folder)
    return rec is not None and same_weights(rec["fingerprint"], fingerprint(target))


def zoo_name(target) -> str | None:
    """The zoo target ``target`` is, by its weights (a drafter of the zoo recorded its fingerprint), or None."""
    def find():
        for path in sorted(glob.glob(os.path.join(MODELS_DIR, "*", "target.json"))):
            rec = recorded(os.path.dirname(path))
            if same_weights(rec["fingerprint"], fingerprint(target)):
                return rec["target"]
        return None
    return target.once(("zoo name",), find)


def folder(target, kind: str) -> str | None:
    """The zoo's folder of a ``kind`` drafter trained for ``target`` (``models/<kind>-<zoo name>``), or None."""
    name = zoo_name(target)
    path = os.path.join(MODELS_DIR, f"{kind}-{name}")
    return path if name is not None and os.path.exists(weights_file(path, kind)) and trained_for(path, target) else None


# -- files ------------------------------------------------------------------------------------------
def weights_file(path: str, kind: str) -> str:
    return os.path.join(path, f"{kind}.safetensors")


def save(drafter, path: str, target, report: dict | None = None) -> None:
    """Write ``drafter`` (Medusa heads, an EAGLE / EAGLE-3 draft, a Learn2PD filter) trained for ``target`` to
    ``path``: its tensors (fp16; a filter's fp32), ``config.json`` and ``target.json``."""
    from safetensors.torch import save_file

    kind = next((k for k, c in KINDS.items() if c.cls is not None and type(drafter) is c.cls), None)
    if kind is None:
        raise ValueError(f"drafter must be one of {[c.cls.__name__ for c in KINDS.values() if c.cls]}, "
                         f"got {type(drafter).__name__}")
    state, cfg = KINDS[kind].state(drafter), KINDS[kind].config(drafter)
    cfg.update(base_model=target.name, report=report or {})
    kept = getattr(drafter, "kept", None)
    os.makedirs(path, exist_ok=True)
    if kept is not None:
        state = {**state, "kept_ids": kept.int().cpu().contiguous()}
    save_file(state, weights_file(path, kind), metadata={"format": "pt"})
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    record_target(path, target)


def load(target, kind: str, path: str | None = None):
    """The ``kind`` drafter (:data:`KINDS`) for ``target`` from ``path`` (None: the zoo's, :func:`folder`), on
    ``target``'s device, as saved (no fast form). A drafter whose shapes do not fit ``target`` is refused
    with a ``ValueError`` naming the mismatch; a missing one is a ``FileNotFoundError`` saying how to train it."""
    from safetensors.torch import load_file

    what = KINDS[kind].what
    path = path or folder(target, kind)
    if path is None or not os.path.exists(weights_file(path, kind)):
        name = zoo_name(target)
        raise FileNotFoundError(f"no {what} for {target.name!r}" + (
            f": train one with `python -m refimpl.train {kind}-{name}`" if name else
            " in the zoo (its drafters belong to the zoo's targets' weights); train your own"))
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    state = load_file(weights_file(path, kind))
    kept = state.pop("kept_ids").long() if "kept_ids" in state else None
    return KINDS[kind].build(target, state, kept, cfg)


def model_folder(target, kind: str) -> str | None:
    """Where the zoo keeps a whole-model ``kind`` drafter for ``target``: the zoo's own model for its zoo targets
    (``KINDS[kind].models``), else ``models/<kind>-<name>`` (one trained for your own model, :mod:`refimpl.train.own`);
    None when there is none trained for ``target``'s weights."""
    from . import in_zoo

    name = zoo_name(target)
    if name is None:
        return None
    zoo_model = check_kind(kind).models.get(name)
    if zoo_model is not None and not in_zoo(zoo_model):
        return None
    path = os.path.join(MODELS_DIR, zoo_model or f"{kind}-{name}")
    return path if os.path.exists(os.path.join(path, "config.json")) and trained_for(path, target) else None


def has(target, kind: str) -> bool:
    """Does the zoo hold a ``kind`` drafter (:data:`KINDS`) trained for ``target``'s weights? A target is known
    by its weights, never by its folder's name (:func:`zoo_name`)."""
    if check_kind(kind).models is None:
        return folder(target, kind) is not None
    return model_folder(target, kind) is not None


def from_folder(target, kind: str, path: str):
    """The ``kind`` drafter saved in folder ``path`` for ``target``, in the form :func:`zoo` gives (what the
    front door loads for ``draft="DIR"``). A drafter trained for other weights is refused with a ``ValueError``
    (its ``target.json`` fingerprint); a plain draft model (kinds ``draft``, ``dlm``) may record none: any
    model with the target's tokenizer drafts losslessly."""
    from . import load as load_model

    c = check_kind(kind)
    path = check_folder(target, kind, path)
    if c.models is not None:
        return load_model(path, device=target.device)
    return fast(target, kind, load(target, kind, path))


def check_folder(target, kind: str, path, arg: str | None = None) -> str:
    """``path`` as a string, after checking that it is a folder holding a ``kind`` drafter trained for ``target``'s
    weights (its ``target.json``; a plain draft model, kinds ``draft`` and ``dlm``, may record none); else a
    ``ValueError`` naming ``arg`` (None: the keyword the kind's method takes it as)."""
    c = check_kind(kind)
    arg, path = arg or c.arg, os.fspath(path)
    if not os.path.isdir(path):
        raise ValueError(f"{arg}: {path!r} is not a folder")
    rec = recorded(path)
    if rec is None and kind not in ("draft", "dlm"):
        raise ValueError(f"{arg}: {path!r} records no target (the target.json every trainer of a {c.what} "
                         f"writes beside it)")
    if rec is not None and not same_weights(rec["fingerprint"], fingerprint(target)):
        raise ValueError(f"{arg}: the {c.what} in {path!r} was trained for other weights ({rec['target']!r}), "
                         f"not for {getattr(target, 'name', '?')!r}")
    return path


def zoo(target, kind: str):
    """The zoo's ``kind`` drafter for ``target``, loaded once per target and kept with it, in its fast form:
    a whole model as :func:`refimpl.models.load` gives it on the target's device; an EAGLE / EAGLE-3 draft
    beside a target on the lean CPU forward runs its products on that forward's kernel, on int8 panels
    (:func:`refimpl.models.lean_draft.lean`; the same trees up to rounding)."""
    from . import load as load_model

    models = check_kind(kind).models

    def build():
        if models is not None:  # the zoo's own model by its zoo name (its loader), else the folder
            return load_model(models.get(zoo_name(target)) or model_folder(target, kind), device=target.device)
        return fast(target, kind, load(target, kind))
    return target.once(("zoo drafter", kind), build)


def fast(target, kind: str, d):
    """A drafter module ``d`` in the form that runs fastest beside ``target``: an EAGLE / EAGLE-3 draft or a DFlash
    drafter beside a target on the lean CPU forward runs its products on that forward's kernel, on int8 panels
    (the same drafts up to rounding)."""
    from .lean_draft import lean
    from .lean_llama import LeanLM

    return lean(d, int8=True) if kind in ("eagle", "eagle3", "dflash") and isinstance(target, LeanLM) else d


def check_kind(kind: str) -> Kind:
    """``KINDS[kind]``; ``ValueError`` naming ``kind`` for one that does not exist."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {sorted(KINDS)}, got {kind!r}")
    return KINDS[kind]


# -- each kind's tensors, config and constructor --------------------------------------------------------
def half_state(module) -> dict:
    return {k: v.detach().half().contiguous() for k, v in module.state_dict().items()}


def medusa_state(heads) -> dict:
    """Medusa's own key names (``medusa_head.{k}.0.linear``); the shared LM head is not stored."""
    out = {}
    for k, b in enumerate(heads.blocks):
        out[f"medusa_head.{k}.0.linear.weight"] = b.weight.detach().half().contiguous()
        out[f"medusa_head.{k}.0.linear.bias"] = b.bias.detach().half().contiguous()
    return out


def medusa_config(heads) -> dict:
    H = heads.lm_head.shape[1]
    return {"architecture": "medusa-1 (frozen base, shared frozen LM head)", "medusa_num_heads": heads.num_heads,
            "medusa_num_layers": 1, "hidden_size": H, "vocab_kept": None if heads.kept is None else int(heads.kept.numel()),
            "lm_head": "not stored: medusa_head.{k}.1.weight = the base model's lm_head.weight (rows kept_ids if any)",
            "vllm": {"config": {"model_type": "medusa", "architectures": ["MedusaModel"], "num_heads": heads.num_heads,
                                "num_hidden_layers": 1, "hidden_size": H, "original_lm_head": True,
                                "medusa_fc_bias": True, "truncated_vocab_size": "the base vocabulary (ours propose "
                                "only kept_ids tokens; over the full vocabulary a top-k can differ)"},
                     "weights": {"blocks.{k}.layers.0.weight": "medusa_head.{k}.0.linear.weight",
                                 "blocks.{k}.layers.0.bias": "medusa_head.{k}.0.linear.bias",
                                 "lm_heads.{k}.weight": "the base model's lm_head.weight (original_lm_head: shared)"}},
            "accuracy": heads.accuracy}


def eagle_config(d) -> dict:
    return {"architecture": "eagle-1 style: fc(concat(embed, feature)) + 1 decoder layer, target's frozen "
                            "embedding and LM head (not stored)", "hidden_size": d.hidden_size, "num_heads": d.num_heads,
            "intermediate_size": d.intermediate, "rope_theta": d.rope_theta,
            "vocab_kept": None if d.kept is None else int(d.kept.numel()),
            "feature": "target's last hidden state AFTER its final norm"}


def eagle3_config(d) -> dict:
    return {"architecture": "eagle-3: fc(target layers taps) -> 1 decoder layer on [norm(embed); norm(g)], own "
                            "final norm and LM head over the kept vocabulary; target's frozen embedding (not stored)",
            "taps": list(d.taps), "hidden_size": d.hidden_size, "num_heads": d.num_heads, "num_kv_heads": d.num_kv_heads,
            "head_dim": d.head_dim, "intermediate_size": d.intermediate, "rope_theta": d.rope_theta,
            "vocab_kept": None if d.kept is None else int(d.kept.numel())}


def dflash_config(d) -> dict:
    return {"architecture": "dflash: fc(target layers taps) -> hidden_norm, injected as keys / values into every "
                            "Qwen3-style draft layer; non-causal block [root, MASK...]; target's frozen embedding "
                            "and LM head rows (not stored)", "taps": list(d.taps),
            "target_layer_ids": [t - 1 for t in d.taps], "num_layers": len(d.layers), "hidden_size": d.hidden_size,
            "num_heads": d.num_heads, "num_kv_heads": d.num_kv_heads, "head_dim": d.head_dim,
            "intermediate_size": d.intermediate, "rope_theta": d.rope_theta, "block_size": d.block,
            "mask_token_id": d.mask_id, "vocab_kept": None if d.kept is None else int(d.kept.numel()),
            "rms_norm_eps": d.norm.eps, "heldout_accept": None if d.accept is None else list(d.accept)}


def build_dflash(target, state, kept, cfg):
    check_width("drafter", cfg["hidden_size"], target)
    d = dflash.new_draft(target, num_layers=cfg["num_layers"], block=cfg["block_size"], mask_id=cfg["mask_token_id"],
                         taps=tuple(cfg["taps"]), kept=kept, num_heads=cfg["num_heads"], num_kv_heads=cfg["num_kv_heads"],
                         head_dim=cfg["head_dim"], intermediate=cfg["intermediate_size"], rope_theta=cfg["rope_theta"],
                         eps=cfg["rms_norm_eps"], accept=cfg.get("heldout_accept"))
    missing, unexpected = d.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    if unexpected or set(missing) != {"head.weight"}:
        raise ValueError(f"the DFlash drafter's file does not fit: missing {missing}, unexpected {unexpected}")
    return d.to(target.device).eval()


def learn2pd_config(f) -> dict:
    return {"architecture": f"learn2pd filter: MLP {learn2pd.NUM_FEATURES} x block_length -> hidden -> block_length",
            "block_length": f.block_length, "hidden": f.hidden,
            "features": ["confidence", "top1 - top2 gap", "same argmax as the previous step"]}


def build_medusa(target, state, kept, cfg):
    check_width("heads", cfg["hidden_size"], target)
    W = target.model.get_output_embeddings().weight.detach().float()
    heads = medusa.MedusaHeads(W if kept is None else W[kept.to(W.device)], cfg["medusa_num_heads"], kept,
                               cfg.get("accuracy"))
    for k, b in enumerate(heads.blocks):
        b.weight.data.copy_(state[f"medusa_head.{k}.0.linear.weight"].float())
        b.bias.data.copy_(state[f"medusa_head.{k}.0.linear.bias"].float())
    return heads.to(target.device).eval()


def build_eagle(target, state, kept, cfg):
    check_width("draft", cfg["hidden_size"], target)
    d = eagle.new_draft(target, num_heads=cfg["num_heads"], intermediate=cfg["intermediate_size"],
                        rope_theta=cfg["rope_theta"], kept=kept)
    d.load_state_dict({k: v.float() for k, v in state.items()})
    return d.to(target.device).eval()


def build_eagle3(target, state, kept, cfg):
    check_width("draft", cfg["hidden_size"], target)
    check_taps(cfg["taps"], target.num_layers)
    d = eagle3.new_draft(target, taps=tuple(cfg["taps"]), kept=kept, num_heads=cfg["num_heads"],
                         num_kv_heads=cfg["num_kv_heads"], head_dim=cfg["head_dim"],
                         intermediate=cfg["intermediate_size"], rope_theta=cfg["rope_theta"])
    d.load_state_dict({k: v.float() for k, v in state.items()})
    return d.to(target.device).eval()


def build_learn2pd(dllm, state, kept, cfg):
    f = learn2pd.Filter(cfg["block_length"], cfg["hidden"])
    f.load_state_dict(state)
    return f.eval()


def dflash_state(d) -> dict:
    """Its own tensors; the head is the target's (frozen, rebuilt from the target)."""
    return {k: v for k, v in half_state(d).items() if not k.startswith("head.")}


def learn2pd_state(f) -> dict:
    """A filter's ~1 K parameters, in fp32."""
    return {k: v.detach().float().contiguous() for k, v in f.state_dict().items()}


#: the one registry of drafter kinds (see the module doc)
KINDS = {
    "draft": Kind("draft model", "draft", models={"tiny": "tiny-draft", "smollm2-135m": "smollm2-135m-draft"}),
    "dlm": Kind("block-diffusion drafter", "dlm", models={"tiny": "tiny-bdlm"}),
    "pard": Kind("PARD draft model", "draft", models={"tiny": "tiny-pard", "smollm2-135m": "smollm2-135m-pard"}),
    "medusa": Kind("Medusa heads", "heads", cls=medusa.MedusaHeads, state=medusa_state, config=medusa_config,
                   build=build_medusa),
    "eagle": Kind("EAGLE draft", "draft", cls=eagle.EagleDraft, state=half_state, config=eagle_config, build=build_eagle),
    "eagle3": Kind("EAGLE-3 draft", "draft", cls=eagle3.Eagle3Draft, state=half_state, config=eagle3_config,
                   build=build_eagle3),
    "dflash": Kind("DFlash drafter", "draft", cls=dflash.DFlashDraft, state=dflash_state, config=dflash_config,
                   build=build_dflash),
    "learn2pd": Kind("Learn2PD filter", None, cls=learn2pd.Filter, state=learn2pd_state, config=learn2pd_config,
                     build=build_learn2pd),
}
