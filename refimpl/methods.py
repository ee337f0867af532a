"""The front door: ``refimpl.generate(target, prompts, method=..., **options)``, every decoding method
of the course by name, each at its module's preset for the target (``PRESETS`` in the module).

::

    from refimpl import generate, models

    target = models.load("smollm2-135m")
    ids = target.encode("The capital of France is")
    g = generate(target, [ids], max_new_tokens=64)                # method="fastest"
    g = generate(target, [ids], method="prompt_lookup")            # one word changes the method
    g = generate(target, [ids], method="eagle3", preset="paper")   # or a module's other preset

``method="fastest"`` takes the first method of :data:`FASTEST` (the committed capstone results,
``bench_results/capstone/``, fastest lossless method first; a test keeps the two in step) whose
drafter the zoo has for this target: no method is ever re-timed at call time. A method that needs a
drafter (a draft model, Medusa heads, an EAGLE draft) gets the zoo's for the target unless one is
passed (``draft=``, ``heads=``, ``dlm=``); a drafter, a method or an option that does not exist is a
``ValueError`` that lists what does. Every method returns a :class:`refimpl.generation.Generation`;
greedy output equals :func:`refimpl.autoregressive.generate`'s under every preset.

Layer 3 (it loads drafters from the zoo): ``import refimpl`` stays light, ``refimpl.generate``
imports this module at its first call.
"""
from __future__ import annotations

import inspect
import os

from . import (adaptive, autoregressive, dflash, dllm_draft, dynamic_tree, eagle, eagle3, jacobi, lookahead, medusa,
               models, pard, retrieval, speculative, tree)
from .generation import Generation
from .lm import check_rollback
from .models import drafters

#: method name -> (module, what it drafts with: "draft" a draft LM, "dlm" a block-diffusion LM,
#: "heads" / "eagle" / "eagle3" trained heads, None nothing, and the options it fixes)
METHODS = {
    "ar": (autoregressive, None, {}),
    "speculative": (speculative, "draft", {}),
    "adaptive": (adaptive, "draft", {}),
    "tree": (tree, "draft", {}),
    "dynamic_tree": (dynamic_tree, "draft", {}),
    "medusa": (medusa, "medusa", {}),
    "eagle": (eagle, "eagle", {}),
    "eagle3": (eagle3, "eagle3", {}),
    "jacobi": (jacobi, None, {}),
    "lookahead": (lookahead, None, {}),
    "prompt_lookup": (retrieval, None, {"method": "prompt_lookup"}),
    "sam": (retrieval, None, {"method": "sam"}),
    "recycling": (retrieval, None, {"method": "recycling"}),
    "sam+recycling": (retrieval, None, {"method": "sam+recycling"}),
    "dllm_draft": (dllm_draft, "dlm", {}),
    "pard": (pard, "pard", {}),
    "dflash": (dflash, "dflash", {}),
}

#: what a method's ``generate`` calls the drafter it takes, by kind
DRAFTER_ARG = {"draft": "draft", "dlm": "dlm", "pard": "draft", "medusa": "heads", "eagle": "draft", "eagle3": "draft",
               "dflash": "draft"}

#: drafters that are whole models of the zoo (by kind: the zoo table naming each target's)
LM_DRAFTERS = {"draft": "DRAFT_FOR", "dlm": "DLLM_FOR", "pard": "PARD_FOR"}

#: per zoo target, the lossless methods faster than AR, fastest first, at their default presets
#: (greedy, ``bench_results/capstone/capstone_<target>.json``); then ``"ar"``. A target outside the
#: zoo takes SmolLM2's order (a real pretrained model), skipping methods it has no drafter for.
FASTEST = {
    "smollm2-135m": ("eagle3", "eagle", "prompt_lookup", "speculative", "dynamic_tree", "lookahead", "ar"),
    "tiny": ("prompt_lookup", "sam+recycling", "dflash", "medusa", "recycling", "sam", "ar"),
}


def has_drafter(target, kind: str | None) -> bool:
    """Does the zoo hold ``kind``'s drafter (see :data:`METHODS`) trained for ``target``'s weights? A target is
    known by its weights, never by its folder's name (:func:`refimpl.models.drafters.zoo_name`)."""
    if kind is None:
        return True
    if kind in LM_DRAFTERS:
        table, name = getattr(models, LM_DRAFTERS[kind]), drafters.zoo_name(target)
        return name in table and models.in_zoo(table[name]) and drafters.trained_for(
            os.path.join(models.MODELS_DIR, table[name]), target)
    return drafters.folder(target, kind) is not None


def available(target) -> list[str]:
    """The methods :func:`generate` can run on ``target`` with the zoo's drafters, in :data:`METHODS` order
    (only ``"ar"`` when the target's cache cannot be rolled back: :meth:`refimpl.lm.LM.rollback_problem`)."""
    if target.rollback_problem() if hasattr(target, "rollback_problem") else None:
        return ["ar"]
    return [m for m, (_, kind, _) in METHODS.items() if has_drafter(target, kind)]


def fastest(target) -> str:
    """The first method of ``target``'s :data:`FASTEST` order (by the zoo target it is; another model takes
    SmolLM2's order) that it can run."""
    order, can = FASTEST.get(drafters.zoo_name(target), FASTEST["smollm2-135m"]), available(target)
    return next(m for m in order if m in can)


def drafter(target, kind: str):
    """The zoo's drafter of ``kind`` for ``target``, loaded once and kept with it: a draft LM (``"draft"``), a
    block-diffusion drafter (``"dlm"``), Medusa heads or an EAGLE / EAGLE-3 draft in its fast form."""
    if kind not in LM_DRAFTERS:
        return drafters.zoo(target, kind)
    table = getattr(models, LM_DRAFTERS[kind])
    return target.once(("zoo", kind), lambda: models.load(table[drafters.zoo_name(target)], device=target.device))


def generate(target, prompts, method: str = "fastest", **options) -> Generation:
    """Decode ``prompts`` (a ragged batch of token-id lists) with ``method`` at its module's preset
    for ``target``; ``options`` go to the method's ``generate`` (``max_new_tokens``, ``temperature``,
    ``preset``, a tree's size, ``draft=``, ...). See the module doc."""
    if method == "fastest":
        method = fastest(target)
    if method not in METHODS:
        raise ValueError(f"method must be 'fastest' or one of {sorted(METHODS)}, got {method!r}")
    module, kind, fixed = METHODS[method]
    if method != "ar":
        check_rollback(target, f"method {method!r}")
    takes = list(inspect.signature(module.generate).parameters)[2:]  # after (target, prompts)
    unknown = sorted(set(options) - set(takes) | set(options) & set(fixed))
    if unknown:
        allowed = sorted(set(takes) - set(fixed))
        raise ValueError(f"method {method!r} does not take {unknown}; it takes {allowed}")
    slot = DRAFTER_ARG.get(kind)
    if slot is not None and options.get(slot) is None:
        if not has_drafter(target, kind):
            raise ValueError(f"the zoo has no {kind} drafter for this target ({getattr(target, 'name', '?')!r}: "
                             f"the zoo's drafters belong to its targets' weights); pass {slot}=... or pick one of "
                             f"the methods it can run: {available(target)}")
        options[slot] = drafter(target, kind)
    return module.generate(target, prompts, **fixed, **options)
