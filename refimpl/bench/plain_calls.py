"""Are the defaults the fast configuration? ``python -m refimpl.bench.plain_calls --model smollm2-135m``

For every method, its *plain call* (``module.generate(target, [ids])``, nothing but the drafter the
method takes as an argument) next to every preset of its module and a few sweeps around them, on
held-out prompts that no preset was tuned on (:data:`HELD_OUT`: not the benchmark's 30), greedy, in
one process, interleaved, medians (:func:`refimpl.bench.decode.run_decode`). Also the front door's
``method="fastest"``. Writes ``bench_results/plain_calls/plain_calls_<model>.{json,md}``: per method,
the plain call's speed-up and tau, the best row's, and their ratio.
"""
from __future__ import annotations

import argparse
import json
import os

import torch

from .. import generate, methods, models
from ..models import drafters
from ..prompts import encode_prompt
from .decode import Context, Method, hardware, markdown_table, run_decode
from .rows import preset_row, preset_rows

#: prompts no preset was tuned on: chat-heavy, with copy and summarisation (our own writing)
HELD_OUT = [
    ("chat", "What is a good way to start learning to cook at home?"),
    ("chat", "Why do cats like to sit in boxes?"),
    ("chat", "Write a short, friendly message inviting a neighbour to a garden party."),
    ("chat", "How can I keep my houseplants alive while I am away for two weeks?"),
    ("chat", "What are some tips for giving a short speech at a friend's wedding?"),
    ("copy", "Rewrite this sentence with 'river' in place of 'lake': We walked around the lake at dawn, "
             "and the lake was so still that the trees on the far side of the lake looked doubled."),
    ("copy", "Repeat this list in the same order, one item per line: apples, bread, candles, dates, eggs, "
             "flour, grapes, honey."),
    ("summarization", "Summarize in one sentence: The village library opened a repair cafe on Saturday "
                      "mornings. Volunteers fix lamps, toasters, bicycles and clothes for free, and visitors "
                      "learn to do the repairs themselves. In its first month the cafe fixed 140 items that "
                      "would otherwise have been thrown away."),
    ("summarization", "Summarize in two sentences: A small team of students built a weather station from "
                      "cheap sensors and a single-board computer. It records temperature, humidity and wind "
                      "every minute and posts the readings to a public web page. The school now uses the "
                      "data in its science lessons."),
    ("code", "Write a Python function that returns the largest even number in a list, or None."),
]

#: sweeps around each method's presets, so the best row is a real search: method -> [options]
SWEEPS = {
    "speculative": [{"gamma": 3}, {"gamma": 5}],
    "dynamic_tree": [{"total": 6, "depth": 5, "topk": 2}, {"total": 16, "depth": 6, "topk": 4}],
    "medusa": [{"tree_size": 8}, {"tree_size": 32}],
    "eagle": [{"total": 5, "depth": 5, "topk": 2, "floor": 0.1, "copy": 12.0}, {"total": 4, "depth": 4},
              {"total": 16, "depth": 5, "topk": 4}],
    "eagle3": [{"total": 3, "depth": 3}, {"total": 4, "depth": 4}, {"total": 6, "depth": 5}],
    "jacobi": [{"window": 4}],
    "lookahead": [{"window": 3, "ngram": 4, "guesses": 3}],
}


def plain_row(method: str) -> Method:
    """``module.generate(target, [ids])``: the call a user writes first (with the zoo's drafter passed where
    the method takes one, as a user must)."""
    module, kind, fixed = methods.METHODS[method]

    def run(ctx: Context, ids, n):
        extra = {drafters.KINDS[kind].arg: drafters.zoo(ctx.target, kind)} if kind else {}
        return module.generate(ctx.target, [ids], max_new_tokens=n, **fixed, **extra)
    return Method(f"{method} (plain call)", run, method=method)


def rows_for(method: str) -> list[Method]:
    base = "cpu" if "cpu" in getattr(methods.METHODS[method][0], "PRESETS", {}) else method
    return preset_rows(method) + [preset_row(method, base, **o) for o in SWEEPS.get(method, [])]


def summary(rows: list[dict], picked: list[str]) -> list[dict]:
    """Per method: the plain call next to its best row (by tokens/s) on the same prompts."""
    out = []
    for method in picked:
        plain = next(r for r in rows if r["method"] == f"{method} (plain call)")
        mine = [r for r in rows if r.get("key") and r["key"]["method"] == method]
        best = max(mine, key=lambda r: r["tokens_per_s"]) if mine else plain
        out.append({"method": method, "plain_speedup": plain["speedup"], "plain_tau": plain["tau"],
                    "best_row": best["method"], "best_speedup": best["speedup"], "best_tau": best["tau"],
                    "plain_over_best": plain["tokens_per_s"] / best["tokens_per_s"], "exact": plain["exact"]})
    return out


COLS = [("method", "method", ""), ("plain_speedup", "plain call vs AR", ".2f"), ("plain_tau", "tau", ".2f"),
        ("best_row", "best row", ""), ("best_speedup", "best row vs AR", ".2f"), ("best_tau", "tau", ".2f"),
        ("plain_over_best", "plain / best", ".2f"), ("exact", "exact", ".0%")]


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m refimpl.bench.plain_calls", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--methods", default=None, help="comma-separated front-door names (default: every one with a drafter)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--limit", type=int, default=None, help="first N held-out prompts only")
    p.add_argument("--out", default=os.path.join("bench_results", "plain_calls"))
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("TRITON_INTERPRET=1 is set: timings would be the interpreter's; unset it")
    os.environ["REFIMPL_THREADS"] = str(args.threads)  # exactly these threads, whatever else runs
    torch.set_num_threads(args.threads)
    lm = models.load(args.model, device="cpu")
    avail = methods.available(lm)
    picked = args.methods.split(",") if args.methods else [m for m in avail if m not in ("ar", "dllm_draft")]
    fastest = Method("fastest (front door)", lambda c, ids, n: generate(c.target, [ids], max_new_tokens=n))
    rows_in = [Method("ar (cache)", lambda c, ids, n: generate(c.target, [ids], "ar", max_new_tokens=n)),
               fastest]
    for m in picked:
        rows_in += [plain_row(m)] + rows_for(m)
    ctx = Context(target=lm, model_name=args.model)
    ctx.draft = drafters.zoo(lm, "draft") if drafters.has(lm, "draft") else None
    prompts = [(cat, encode_prompt(lm, text)) for cat, text in HELD_OUT[: args.limit]]
    for m in rows_in:  # warm up: drafters loaded and packed, kernels built, before anything is timed
        m.run(ctx, prompts[0][1], 8)
    rows = run_decode(ctx, rows_in, prompts, args.max_new_tokens, args.repeats)
    table = summary(rows, picked)
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, f"plain_calls_{args.model}")
    fast = next(r for r in rows if r["method"] == "fastest (front door)")
    result = {"suite": "plain_calls", "model": args.model, "hardware": hardware(), "args": vars(args),
              "fastest": {"method": methods.fastest(lm), "speedup": fast["speedup"], "tau": fast["tau"],
                          "exact": fast["exact"]}, "summary": table, "rows": rows}
    json.dump(result, open(base + ".json", "w"), indent=1, default=str)
    hw = result["hardware"]
    md = (f"## plain calls vs best rows: {args.model}\n\n{len(prompts)} held-out prompts, greedy, "
          f"{args.max_new_tokens} new tokens, {hw['cpu_count']} cores, torch threads {hw['torch_threads']}, "
          f"{args.repeats} interleaved repeats (medians)\n\n" + markdown_table(table, COLS) +
          f"\n\n`refimpl.generate(target, prompts)` (method=\"fastest\" -> {methods.fastest(lm)}): "
          f"{fast['speedup']:.2f}x AR, tau {fast['tau']:.2f}, exact {fast['exact']:.0%}\n\nEvery row:\n\n" +
          markdown_table(rows, [("method", "method", ""), ("configuration", "configuration", ""),
                                ("speedup", "vs AR", ".2f"), ("tau", "tau", ".2f"), ("exact", "exact", ".0%")]))
    open(base + ".md", "w").write(md + "\n")
    print(md)
    return result


if __name__ == "__main__":
    main()
