"""The one table of decode-benchmark rows: every method the course builds, at its module's named
presets (``PRESETS``), next to Hugging Face's own implementation where it has one (same model, same
prompts, same process).

A row is a :class:`refimpl.bench.decode.Method`: ``run(ctx, prompt_ids, max_new_tokens) ->
Generation`` on one prompt, the roles it needs (``"draft"``: the zoo's draft for the target,
:data:`refimpl.models.drafters.KINDS`) and whether its greedy output must equal AR greedy (``exact``).
Rows of the course's methods are :func:`preset_row`\\ s: a front-door method (:data:`refimpl.methods.METHODS`),
one of its module's presets and, for a sweep, options on top; they run through
:func:`refimpl.generate`, exactly the call a user makes, so the numbers a chapter quotes are
the defaults a user gets. A test checks that every row names a preset its module exports.
"""
from __future__ import annotations

from .. import autoregressive, drafts, generate, methods, speculative
from ..copy_prior import ContextCopyLM
from ..generation import preset_options
from ..lm import LM
from .decode import Context, Method, hf_assisted, hf_generate

#: sampling rows run at this temperature (greedy rows at 0)
SAMPLING_T = 0.7


def default_exit_layer(num_layers: int) -> int:
    """A reasonable early exit for gamma = 4: a quarter of the layers (at least 1)."""
    return max(1, num_layers // 4)


def row_name(method: str, preset: str, options: dict) -> str:
    """``"eagle3 [cpu]"``, ``"speculative [cpu] T=0.7"``, ``"eagle3 [cpu] total=3 depth=3"``: what a row runs."""
    extra = " ".join(f"T={v}" if k == "temperature" else f"{k}={v}" for k, v in options.items())
    return f"{method} [{preset}]" + (f" {extra}" if extra else "")


def preset_row(method: str, preset: str = "cpu", **options) -> Method:
    """The row that runs ``refimpl.generate(target, [ids], method, preset=preset, **options)``.
    ``options``: the preset's own options to change (a sweep) and ``temperature`` (a sampling row,
    seeded by the run's generator). Refuses a method, preset or option its module does not have."""
    module, kind, _ = methods.METHODS[method]
    temperature = options.get("temperature", 0.0)
    tuned = {k: v for k, v in options.items() if k != "temperature"}
    # the options it runs with (refuses a preset that does not exist or does not set these options)
    resolved = preset_options(module.PRESETS, preset, None, **tuned) if method != "ar" else {}
    lossy = tuned.get("acceptance") == "typical" and temperature > 0

    def run(ctx: Context, ids, n):
        extra = {kind: ctx.draft} if kind == "draft" and ctx.draft is not None else {}
        if temperature:
            extra.update(temperature=temperature, generator=ctx.generator)
        if method != "ar":
            extra["preset"] = preset
        return generate(ctx.target, [ids], method, max_new_tokens=n, **tuned, **extra)

    needs = ("target",) if kind is None else ("target", kind)
    name = row_name(method, preset, options) + (" (LOSSY)" if lossy else "")
    config = ", ".join(f"{k} {'auto' if v is None else v}" for k, v in resolved.items())  # None: set by the model
    return Method(name, run, needs=needs, exact=not temperature, method=method, preset=preset, options=dict(options),
                  config=config)


def self_spec(ctx: Context, ids, n):
    """Greedy speculative decoding with the target's own first layers as the draft (built once per target)."""
    key = ("exit", id(ctx.target))
    if key not in ctx.memo:
        ctx.memo[key] = drafts.early_exit(ctx.target, default_exit_layer(ctx.target.num_layers))
    return speculative.generate(ctx.target, [ids], draft=ctx.memo[key], max_new_tokens=n)


def hf_forward_ar(ctx: Context, ids, n):
    """Our AR loop on the same weights through Hugging Face's forward (``models.load(fast=False)``'s
    path): with the ``ar (cache)`` row it measures the lean forward's gain in one process."""
    plain = LM(ctx.target.model, ctx.target.tokenizer, name=ctx.target.name)
    return autoregressive.generate(plain, ids, max_new_tokens=n)


def without_copy_prior(ctx: Context, ids, n):
    """The zoo draft without its copy prior (the ablation of :class:`refimpl.copy_prior.ContextCopyLM`)."""
    inner = ctx.draft.lm if isinstance(ctx.draft, ContextCopyLM) else ctx.draft
    return speculative.generate(ctx.target, [ids], draft=inner, max_new_tokens=n)


def preset_rows(method: str) -> list[Method]:
    """One row per distinct preset of ``method``'s module (a preset equal to an earlier one is the
    same run); for a retrieval rule, the presets of that rule."""
    module, _, fixed = methods.METHODS[method]
    seen, out = [], []
    for name, opts in getattr(module, "PRESETS", {}).items():
        if opts not in seen and all(opts.get(k) == v for k, v in fixed.items()):
            seen.append(opts)
            out.append(preset_row(method, name))
    return out


#: EAGLE-3's tree-size sweep around its ``"cpu"`` preset: (total, depth)
EAGLE3_SIZES = [(1, 1), (2, 2), (3, 3), (4, 4), (6, 5), (10, 6)]


def decode_rows() -> list[Method]:
    """Every row, in table order (``--methods`` picks by substring): every preset of every method,
    the ablations the chapters discuss, Hugging Face's implementations, and EAGLE-3's size sweep."""
    D = ("target", "draft")
    out = [
        Method("ar (cache)", lambda c, p, n: autoregressive.generate(c.target, p, max_new_tokens=n), method="ar"),
        Method("ar (hf forward)", hf_forward_ar),
        Method("ar (no cache)", lambda c, p, n: autoregressive.generate(c.target, p, max_new_tokens=n,
                                                                       use_cache=False), max_prompts=3),
        Method("hf generate", lambda c, p, n: hf_generate(c, p, n)),
        Method("hf assisted (draft)", hf_assisted, needs=D),
        Method("hf prompt lookup (10 tokens, ngram <= 2)",
               lambda c, p, n: hf_generate(c, p, n, prompt_lookup_num_tokens=10)),
        Method("self-spec (early exit, gamma 4)", self_spec, needs=("target",)),
        Method("speculative, draft without copy prior (gamma 4)", without_copy_prior, needs=D),
    ]
    for method in methods.METHODS:
        out += preset_rows(method)
    out += [preset_row("speculative", "cpu", temperature=SAMPLING_T),
            preset_row("prompt_lookup", "cpu", temperature=SAMPLING_T),
            preset_row("medusa", "cpu", acceptance="typical", temperature=SAMPLING_T),
            preset_row("pard", "cpu", temperature=SAMPLING_T), preset_row("dflash", "cpu", temperature=SAMPLING_T)]
    out += [preset_row("eagle3", "cpu", total=t, depth=d) for t, d in EAGLE3_SIZES]
    return out


#: (W, N, G) points of the lookahead sweep: the repository's README and MT-bench settings, and smaller
#: windows, which matter on a CPU where every extra scored token costs time
LOOKAHEAD_GRID = [(7, 5, 7), (15, 5, 15), (5, 5, 5), (3, 5, 3), (3, 4, 3), (5, 4, 5), (3, 3, 3), (7, 3, 7), (1, 4, 3)]


def lookahead_sweep_rows() -> list[Method]:
    """AR plus lookahead at every :data:`LOOKAHEAD_GRID` point, with and without prompt n-grams
    (options on top of :data:`refimpl.lookahead.PRESETS`' ``"paper"``)."""
    return [decode_rows()[0]] + [preset_row("lookahead", "paper", window=w, ngram=n, guesses=g, pool_from_prompt=pr)
                                 for w, n, g in LOOKAHEAD_GRID for pr in (False, True)]
