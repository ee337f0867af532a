"""Chapter 15's benchmark: models trained to decode in parallel, ``python -m refimpl.bench --suite learned``.

The workloads, on the dLLM suite's King James held-out prompts (:func:`refimpl.data.kjv_prompts`),
one prompt at a time (batch 1, as a chat user would), rows interleaved per prompt and repeat,
median time per prompt:

- ``cllm``: AR, Jacobi (random and n-gram initial guesses, one row with ``min_window=3``,
  :class:`refimpl.jacobi.Jacobi`), lookahead
  and prompt lookup (the training-free baseline on text that repeats itself) on ``tiny`` and ``tiny-cllm``;
  AR, three Jacobi rows and prompt lookup on ``tiny-cllm-onpolicy`` and on two weight mixes with ``tiny``
  (:data:`MIX_ALPHA`, :data:`MIX_ALPHA_ONPOLICY`) (64 new tokens). Tokens per
  target call, tokens/s, speed-up vs AR *of the same model*, and exact = the row's tokens equal that
  model's own AR greedy tokens (the verification core's guarantee).
- ``dparallel`` (32 new tokens, as the dLLM suite's ``kjv-bdlm``) and ``dparallel-64`` (64, as ``cllm``):
  ``tiny-bdlm`` and ``tiny-bdlm-dparallel`` in blocks of 8, one token
  per step, Fast-dLLM thresholds and Learn2PD's trained filter (:mod:`refimpl.learn2pd`) at three
  cutoffs, each with the exact block cache; speed-up vs AR ``tiny`` (the model ``tiny-bdlm`` was
  adapted from).

Quality, because a fine-tuned model is a different model: perplexity of the generated tokens under
``tiny`` (lower = more natural to the original), the fraction of repeated 3-grams (perplexity alone
rewards repetition) and agreement = the fraction of positions equal to the original's reference
text (``tiny``'s AR greedy; ``tiny-bdlm``'s one-token-per-step text). Each workload adds an untimed
quality pass over more held-out prompts (``*-quality`` rows, :func:`held_out_quality`): it counts the
prompts whose text is off, not only the mean.
"""
from __future__ import annotations

import math
import statistics
import time

import torch

from .. import autoregressive, block_diffusion, jacobi, learn2pd, lookahead, models, retrieval
from ..cllm import agreement, interpolate
from ..data import kjv_prompts
from ..models import drafters
from .dllm import ar_perplexity, repetition

COLS = [("task", "task", ""), ("model", "model", ""), ("method", "method", ""),
        ("tokens_per_call", "tokens / call", ".2f"), ("calls_per_row", "calls / row", ".1f"),
        ("tokens_per_s", "tokens/s", ".0f"), ("speedup", "speed-up vs AR", ".2f"),
        ("exact", "= own AR greedy", ""), ("perplexity", "ppl under tiny", ".2f"),
        ("repetition", "repeated 3-grams", ".1%"), ("agreement", "agreement with original", ".1%"),
        ("collapsed", "prompts off (ppl > 2x the reference's)", "")]

#: the ``cllm`` workload also runs ``tiny`` + MIX_ALPHA (``tiny-cllm`` - ``tiny``) (:func:`refimpl.cllm.interpolate`,
#: no training): a point between the two on the speed-quality front. 0.85 was picked on the 24 quality
#: prompts below (0.5 / 0.7 / 0.85 / 0.92 / 0.96 tried) and checked on 48 mid-chapter prompts
MIX_ALPHA = 0.85

#: and ``tiny`` + MIX_ALPHA_ONPOLICY (``tiny-cllm-onpolicy`` - ``tiny``): picked among 0.8 / 0.9 on the same 24 and
#: 48 prompts, then checked on 40 fresh ones (tokens 300-347 of held-out chapters; docs/learned-parallel.md)
MIX_ALPHA_ONPOLICY = 0.9

#: prompts for the untimed quality pass (CLLM and dLLM rows): the timed 8 and 16 more held-out chapters
QUALITY_PROMPTS = 24


def timed(rows: list[tuple[str, str, object]], prompts, repeats: int) -> dict:
    """Run every (model, method, fn(prompt) -> Generation) row on every prompt, rows interleaved,
    ``repeats`` times after one warm-up; -> {(model, method): (median seconds per prompt, generations)}."""
    times = {(m, n): [[] for _ in prompts] for m, n, _ in rows}
    outs = {(m, n): [None] * len(prompts) for m, n, _ in rows}
    for m, n, fn in rows:
        fn(prompts[0])  # warm-up
    for _ in range(repeats):
        for i, p in enumerate(prompts):
            for m, n, fn in rows:
                t0 = time.perf_counter()
                g = fn(p)
                times[m, n][i].append(time.perf_counter() - t0)
                outs[m, n][i] = g
    return {k: ([statistics.median(t) for t in times[k]], outs[k]) for k in times}


def summarise(task, results, prompts, tiny, reference, ar_of) -> list[dict]:
    """One row per (model, method); ``ar_of[model]`` = the results key of the AR row its speed-up and
    exactness are measured against (exactness only when that row is the model's own AR)."""
    rows = []
    for (model, method), (secs, gens) in results.items():
        toks = [g.tokens[0] for g in gens]
        base = ar_of[model]
        ar_secs, ar_gens = results[base]
        calls = sum(g.stats.target_calls for g in gens)
        n = sum(len(t) for t in toks)
        rows.append(dict(task=task, model=model, method=method, tokens_per_call=n / calls, calls_per_row=calls / len(toks),
                         tokens_per_s=n / sum(secs), speedup=sum(ar_secs) / sum(secs),
                         exact=toks == [g.tokens[0] for g in ar_gens] if base[0] == model else None,
                         perplexity=ar_perplexity(tiny, prompts, toks), repetition=repetition(toks),
                         agreement=agreement(toks, reference)))
    return rows


def run_cllm(fast: bool = False, repeats: int = 3, new: int = 64, prepack: bool | None = None) -> list[dict]:
    # each model loaded once, plain; the mixes are made from the plain weights, then all get load's fast paths
    base, tuned, onpolicy = (models.load(name, prepack=False) for name in ("tiny", "tiny-cllm", "tiny-cllm-onpolicy"))
    mixes = [models.accelerate(interpolate(base, lm, alpha), prepack=prepack)
             for lm, alpha in ((tuned, MIX_ALPHA), (onpolicy, MIX_ALPHA_ONPOLICY))]
    tiny, cllm, onp = (models.accelerate(lm, prepack, default=models.ZOO[lm.name].prepack)
                       for lm in (base, tuned, onpolicy))
    prompts = kjv_prompts(tiny.tokenizer, 2 if fast else 8)
    methods = [("AR (cache)", lambda lm, p: autoregressive.generate(lm, [p], max_new_tokens=new, eos_token_id=[])),
               *[(f"jacobi (window {w}{', n-gram init' if init == 'lookup' else ''}{f', min window {m}' if m else ''})",
                  lambda lm, p, w=w, init=init, m=m: jacobi.generate(lm, [p], max_new_tokens=new, window=w, init=init,
                                                                     min_window=m, eos_token_id=[]))
                 for w, init, m in ((4, "random", None), (8, "random", None), (16, "random", None), (4, "lookup", None),
                                    (4, "lookup", 3), (8, "lookup", None))],
               ("lookahead (W=7, N=5, G=7)", lambda lm, p: lookahead.generate(lm, [p], max_new_tokens=new, eos_token_id=[])),
               ("prompt lookup (4 tokens, no training needed)",
                lambda lm, p: retrieval.generate(lm, [p], max_new_tokens=new, num_tokens=4, eos_token_id=[]))]
    fewer = {"AR (cache)", "jacobi (window 16)", "jacobi (window 4, n-gram init)",
             "jacobi (window 4, n-gram init, min window 3)", "prompt lookup (4 tokens, no training needed)"}
    run = (tiny, cllm, onp, *mixes)  # tiny and tiny-cllm run every method, the others the `fewer` ones
    rows = [(lm.name, method, lambda p, lm=lm, fn=fn: fn(lm, p))
            for lm in run for method, fn in methods if lm.name in ("tiny", "tiny-cllm") or method in fewer]
    res = timed(rows, prompts, 1 if fast else repeats)
    reference = [g.tokens[0] for g in res["tiny", "AR (cache)"][1]]
    out = summarise("cllm", res, prompts, tiny, reference, {lm.name: (lm.name, "AR (cache)") for lm in run})
    ar = [r for r in rows if r[1] == "AR (cache)"]  # every exact row of a model writes its AR text
    return out + held_out_quality("cllm-quality", tiny, ar, ("tiny", "AR (cache)"), 4 if fast else QUALITY_PROMPTS)


def held_out_quality(task: str, tiny, rows, reference: tuple[str, str], n: int) -> list[dict]:
    """Quality only (untimed), on ``n`` held-out prompts, the timed ones first: for each (model,
    method, fn) row of ``rows``, tokens per call, perplexity under ``tiny`` over all the prompts,
    agreement with the ``reference`` row's text and ``collapsed`` = how many prompts get a text with
    more than twice the perplexity of the reference's text for that prompt (a fine-tune can hold on
    average and break on a few)."""
    prompts = kjv_prompts(tiny.tokenizer, n)
    gens = {(m, k): [fn(p) for p in prompts] for m, k, fn in rows}
    texts = {key: [g.tokens[0] for g in gs] for key, gs in gens.items()}
    each = {key: [ar_perplexity(tiny, [p], [t]) for p, t in zip(prompts, toks)] for key, toks in texts.items()}
    ref, own = texts[reference], each[reference]
    out = []
    for (model, method), toks in texts.items():
        calls = sum(g.stats.target_calls for g in gens[model, method])
        lengths = [len(t) for t in toks]
        # the perplexity over all prompts from the per-prompt ones: exp(sum of NLLs / tokens), no second pass
        nll = sum(k * math.log(x) for k, x in zip(lengths, each[model, method]))
        out.append(dict(task=task, model=model, method=f"{method}, {len(prompts)} held-out prompts (untimed)",
                        tokens_per_call=sum(lengths) / calls, calls_per_row=calls / len(prompts),
                        perplexity=math.exp(nll / max(sum(lengths), 1)), repetition=repetition(toks),
                        agreement=agreement(toks, ref), collapsed=sum(e > 2 * o for e, o in zip(each[model, method], own))))
    return out


def run_dparallel(fast: bool = False, repeats: int = 3, new: int = 32, block: int = 8,
                  prepack: bool | None = None) -> list[dict]:
    """The ``dparallel`` workload at ``new`` new tokens; its task is named ``dparallel`` at 32 (the dLLM
    suite's setting, which chapter 16 compares with) and ``dparallel-<new>`` otherwise."""
    task = "dparallel" if new == 32 else f"dparallel-{new}"
    tiny = models.load("tiny", prepack=prepack)
    prompts = kjv_prompts(tiny.tokenizer, 2 if fast else 8)
    rows = [("tiny", "AR (cache)", lambda p: autoregressive.generate(tiny, [p], max_new_tokens=new, eos_token_id=[]))]
    lms = {name: models.load(name, prepack=prepack) for name in ("tiny-bdlm", "tiny-bdlm-dparallel")}
    for name, lm in lms.items():
        rows.append((name, "one token per step", lambda p, lm=lm: block_diffusion.generate(
            lm, [p], gen_length=new, block_length=block, eos_token_id=[])))
        for t in (0.9, 0.7, 0.5):
            rows.append((name, f"threshold {t}", lambda p, lm=lm, t=t: block_diffusion.generate(
                lm, [p], gen_length=new, block_length=block, threshold=t, eos_token_id=[])))
        filt = drafters.load(lm, "learn2pd")
        for t in (0.7, 0.6, 0.5):
            rows.append((name, f"learn2pd filter {t}", lambda p, lm=lm, r=learn2pd.FilterRule(filt, t):
                         block_diffusion.generate(lm, [p], gen_length=new, block_length=block, eos_token_id=[], rule=r)))
    res = timed(rows, prompts, 1 if fast else repeats)
    reference = [g.tokens[0] for g in res["tiny-bdlm", "one token per step"][1]]
    # a dLLM's speed-up is against AR tiny, the model it was adapted from; exactness does not apply
    out = summarise(task, res, prompts, tiny, reference, dict.fromkeys(("tiny", "tiny-bdlm", "tiny-bdlm-dparallel"),
                                                                              ("tiny", "AR (cache)")))
    kept = [r for r in rows if r[0] != "tiny" and r[1] in ("one token per step", "threshold 0.9", "threshold 0.5",
                                                          "learn2pd filter 0.7", "learn2pd filter 0.5")]
    kept += [(name, "learn2pd oracle (knows the one-token-per-step text; not a decoder)",
              lambda p, lm=lm: learn2pd.oracle_generate(block_diffusion.generate, lm, [p], new, block))
             for name, lm in lms.items()]
    return out + held_out_quality(f"{task}-quality", tiny, kept, ("tiny-bdlm", "one token per step"),
                                  4 if fast else QUALITY_PROMPTS)


def run(fast: bool = False, prepack: bool | None = None) -> list[dict]:
    """Every workload; ``prepack`` as :func:`refimpl.models.load` takes it, the same for every model
    (True: packed linears and the lean forward, the fastest AR path for ``tiny`` on a 2-core CPU)."""
    torch.manual_seed(0)
    return (run_cllm(fast, prepack=prepack) + run_dparallel(fast, prepack=prepack)
            + run_dparallel(fast, new=64, prepack=prepack))
