"""The front door's tables. ``refimpl.generate(target, prompts, method=..., **options)`` (the one door, in
``refimpl/__init__.py``) runs every decoding method of the course by name, each at its module's preset for
the target (``PRESETS`` in the module), from :data:`METHODS`, :data:`FASTEST` and :func:`available`.

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
passed (``draft=``, ``heads=``, ``dlm=``: the drafter, or the folder it was saved in, e.g. one
``python -m refimpl.train eagle3 --target PATH`` wrote); a drafter, a method or an option that does not exist is a
``ValueError`` that lists what does. Every method returns a :class:`refimpl.generation.Generation`;
greedy output equals :func:`refimpl.autoregressive.generate`'s under every preset.

Layer 3 (it loads drafters from the zoo): ``import refimpl`` stays light, ``refimpl.generate``
imports this module at its first call.
"""
from __future__ import annotations

import os

from . import (adaptive, autoregressive, dflash, dllm_draft, dynamic_tree, eagle, eagle3, jacobi, lookahead, medusa,
               pard, retrieval, speculative, tree)
from .lm import check_rollback
from .models import drafters

#: method name -> (module, the kind of drafter it drafts with (:data:`refimpl.models.drafters.KINDS`: the
#: keyword its ``generate`` takes it as, where the zoo keeps it) or None, the options it fixes)
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

#: per zoo target, the lossless methods faster than AR, fastest first, at their default presets
#: (greedy, ``bench_results/capstone/capstone_<target>.json``); then ``"ar"``. A target outside the
#: zoo takes SmolLM2's order (a real pretrained model), skipping methods it has no drafter for.
FASTEST = {
    "smollm2-135m": ("eagle3", "eagle", "pard", "prompt_lookup", "speculative", "dflash", "dynamic_tree", "lookahead",
                     "ar"),
    "tiny": ("prompt_lookup", "sam+recycling", "dflash", "medusa", "recycling", "sam", "ar"),
}


def available(target) -> list[str]:
    """The methods :func:`generate` can run on ``target`` with the zoo's drafters, in :data:`METHODS` order
    (only ``"ar"`` when the target's cache cannot be rolled back: :meth:`refimpl.lm.LM.rollback_problem`)."""
    try:
        check_rollback(target, "a drafting method")
    except ValueError:
        return ["ar"]
    return [m for m, (_, kind, _) in METHODS.items() if kind is None or drafters.has(target, kind)]


def fastest(target) -> str:
    """The first method of ``target``'s :data:`FASTEST` order (by the zoo target it is; another model takes
    SmolLM2's order) that it can run."""
    order, can = FASTEST.get(drafters.zoo_name(target), FASTEST["smollm2-135m"]), available(target)
    return next(m for m in order if m in can)


def with_drafter(target, kind: str | None, options: dict) -> dict:
    """``options`` with the zoo's ``kind`` drafter for ``target`` under the keyword its method takes
    (:data:`refimpl.models.drafters.KINDS`), unless ``options`` passes one; a folder passed there (a path) is
    loaded if its drafter was trained for ``target``'s weights (:func:`refimpl.models.drafters.from_folder`);
    ``ValueError`` naming the kind and what ``target`` can run when the zoo has none for it."""
    slot = None if kind is None else drafters.KINDS[kind].arg
    if slot is not None and isinstance(options.get(slot), (str, os.PathLike)):  # a folder: checked by its weights
        return {**options, slot: drafters.from_folder(target, kind, options[slot])}
    if slot is None or options.get(slot) is not None:
        return options
    if not drafters.has(target, kind):
        raise ValueError(f"the zoo has no {drafters.KINDS[kind].what} for this target ({getattr(target, 'name', '?')!r}: "
                         f"the zoo's drafters belong to its targets' weights); pass {slot}=... or pick one of the "
                         f"methods it can run: {available(target)}")
    return {**options, slot: drafters.zoo(target, kind)}
