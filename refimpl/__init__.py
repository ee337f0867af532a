"""refimpl: the tested reference implementation behind the course notebooks.

Five layers; a module imports only from layers below it (and, inside layer 2, from earlier
chapters), never above, and nothing imports ``train`` or ``bench``::

    5 bench    refimpl/bench/      python -m refimpl.bench: suites and the one table of benchmark rows
    4 train    refimpl/train/      python -m refimpl.train NAME: every trainer and data builder
    3 models   refimpl/models/     models.load(name): the zoo table, SmolLM2 conversion, CPU fast paths
    2 chapters refimpl/*.py        one algorithm per file: autoregressive, speculative (the verification
                                   core), drafts, copy_prior, adaptive, retrieval, diffusion_lm, diffusion, ...
    1 core     refimpl/lm.py       the LM adapter; generation.py: Generation/Stats + input checks;
               refimpl/sampling.py, data.py (the corpus), prompts.py (the benchmark prompts)

The core files stay at the top of the package, where the public API has always had them
(``refimpl.sampling``, ``refimpl.generation``); ``import refimpl`` loads the core only.
``refimpl.generate(target, prompts, method=...)`` is the front door to every method
(:mod:`refimpl.methods`, layer 3, imported at its first call). Start
with :mod:`refimpl.models` (``load``), :mod:`refimpl.autoregressive` (the baseline) and
:mod:`refimpl.speculative` (the verification core every drafting method plugs into).
"""
from .generation import Generation, Stats  # noqa: F401

__version__ = "0.1.0"


def generate(target, prompts, method: str = "fastest", **options) -> Generation:
    """The front door: decode ``prompts`` (a ragged batch of token-id lists) with any method of the course
    by name (``"fastest"``, ``"ar"``, ``"speculative"``, ``"dynamic_tree"``, ``"medusa"``, ``"eagle3"``,
    ``"prompt_lookup"``, ...) at its module's preset for ``target``; ``options`` go to the method's
    ``generate`` (``max_new_tokens``, ``temperature``, ``preset``, a tree's size, ``draft=``, ...). A method
    that drafts with a trained drafter gets the zoo's for the target unless one is passed. The tables it
    reads (:mod:`refimpl.methods`, layer 3) are imported at the first call, so that ``import refimpl``
    stays the core alone."""
    import inspect

    from .methods import METHODS, fastest, with_drafter

    if method == "fastest":
        method = fastest(target)
    if method not in METHODS:
        raise ValueError(f"method must be 'fastest' or one of {sorted(METHODS)}, got {method!r}")
    module, kind, fixed = METHODS[method]
    takes = list(inspect.signature(module.generate).parameters)[2:]  # after (target, prompts)
    unknown = sorted(set(options) - set(takes) | set(options) & set(fixed))
    if unknown:
        raise ValueError(f"method {method!r} does not take {unknown}; it takes {sorted(set(takes) - set(fixed))}")
    return module.generate(target, prompts, **fixed, **with_drafter(target, kind, options))
