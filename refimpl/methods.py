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

from . import (adaptive, autoregressive, dflash, dllm_draft, dynamic_tree, eagle, eagle3, jacobi, lookahead, medusa,
               pard, retrieval, speculative, tree)
from .generation import Generation
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
    "smollm2-135m": ("eagle3", "eagle", "prompt_lookup", "speculative", "dynamic_tree", "lookahead", "ar"),
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


def generate(target, prompts, method: str = "fastest", **options) -> Generation:
    """Decode ``prompts`` (a ragged batch of token-id lists) with ``method`` at its module's preset
    for ``target``; ``options`` go to the method's ``generate`` (``max_new_tokens``, ``temperature``,
    ``preset``, a tree's size, ``draft=``, ...). See the module doc."""
    if method == "fastest":
        method = fastest(target)
    if method not in METHODS:
        raise ValueError(f"method must be 'fastest' or one of {sorted(METHODS)}, got {method!r}")
    module, kind, fixed = METHODS[method]
    takes = list(inspect.signature(module.generate).parameters)[2:]  # after (target, prompts)
    unknown = sorted(set(options) - set(takes) | set(options) & set(fixed))
    if unknown:
        allowed = sorted(set(takes) - set(fixed))
        raise ValueError(f"method {method!r} does not take {unknown}; it takes {allowed}")
    slot = None if kind is None else drafters.KINDS[kind].arg
    if slot is not None and options.get(slot) is None:
        if not drafters.has(target, kind):
            raise ValueError(f"the zoo has no {drafters.KINDS[kind].what} for this target "
                             f"({getattr(target, 'name', '?')!r}: the zoo's drafters belong to its targets' weights); "
                             f"pass {slot}=... or pick one of the methods it can run: {available(target)}")
        options[slot] = drafters.zoo(target, kind)
    return module.generate(target, prompts, **fixed, **options)
