"""Plain calls of AR, EAGLE-3, PARD and DFlash on held-out prompts, greedy and sampled (T = 0.7), with each
step's draft share: ``env -u TRITON_INTERPRET python bench_results/experiments/2026-12-06_parallel_drafters/run.py
--model smollm2-135m`` (or ``--model tiny``). One process, 2 threads, the rows interleaved prompt by prompt,
``--repeats`` rounds, medians of per-prompt tokens/s ratios to AR's call on the same prompt and temperature.

Prompts: ``refimpl.bench.plain_calls.HELD_OUT`` without its code prompt (5 chat, 2 copy, 2 summaries: none of
the benchmark's 30) for SmolLM2; for tiny, 6 King James openings from the held-out chapters
(``refimpl.data.kjv_split()[1]``). The draft share is the time inside the proposer's ``propose`` over the
call's time (the proposer wrapped by delegation: start's ``Needs`` pass through unchanged).
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

import refimpl
from refimpl import dflash, eagle3, methods, models, pard
from refimpl.bench.plain_calls import HELD_OUT
from refimpl.prompts import encode_prompt

SPENT = {"propose": 0.0}


class Timed:
    """Delegates every attribute to ``inner``; adds up the seconds spent in ``propose``."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, caps):
        t0 = time.perf_counter()
        out = self.inner.propose(caps)
        SPENT["propose"] += time.perf_counter() - t0
        return out


def timed_decode(original):
    def run(target, proposer, *a, **k):
        return original(target, Timed(proposer), *a, **k)
    return run


for mod in (dflash, eagle3, pard):
    mod.decode = timed_decode(mod.decode)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    args = p.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("unset TRITON_INTERPRET: timings would be the interpreter's")
    torch.set_num_threads(2)
    lm = models.load(args.model)
    if args.model == "tiny":
        from refimpl.data import kjv_split
        texts = [("kjv", " ".join(doc.split()[:40])) for doc in kjv_split()[1][:6]]
        prompts = [(c, lm.tokenizer.encode(t, add_special_tokens=False)) for c, t in texts]
    else:
        prompts = [(c, encode_prompt(lm, t)) for c, t in HELD_OUT if c != "code"]
    names = ["ar", "eagle3", "pard", "dflash"]
    rows = [(m, T) for T in (0.0, 0.7) for m in names]
    for m, T in rows:  # warm up: drafters loaded, products packed
        refimpl.generate(lm, [prompts[0][1]], method=m, max_new_tokens=8, temperature=T,
                         generator=torch.Generator().manual_seed(0) if T else None)
    res = {f"{m} T={T}": [] for m, T in rows}
    for rep in range(args.repeats):
        for i, (cat, ids) in enumerate(prompts):
            for m, T in rows:
                SPENT["propose"] = 0.0
                g = refimpl.generate(lm, [ids], method=m, max_new_tokens=args.new, temperature=T,
                                     generator=torch.Generator().manual_seed(100 * rep + i) if T else None)
                res[f"{m} T={T}"].append({"prompt": i, "cat": cat, "rep": rep, "tokens": g.tokens[0],
                                          "seconds": g.stats.seconds, "new": g.stats.new_tokens,
                                          "tau": g.stats.tau, "target_calls": g.stats.target_calls,
                                          "draft_calls": g.stats.draft_calls, "propose_s": SPENT["propose"]})
    summary = []
    for key, runs in res.items():
        m, T = key.split(" T=")
        ar = res[f"ar T={T}"]
        for cat in sorted({c for c, _ in prompts}) + ["all"]:
            mine = [r for r in runs if cat in ("all", r["cat"])]
            base = [r for r in ar if cat in ("all", r["cat"])]
            ratio = [(r["new"] / r["seconds"]) / (b["new"] / b["seconds"]) for r, b in zip(mine, base)]
            exact = None if float(T) else all(r["tokens"] == b["tokens"] for r, b in zip(mine, base))
            summary.append({"row": key, "category": cat, "speedup": statistics.median(ratio),
                            "tau": sum(r["new"] for r in mine) / sum(r["target_calls"] for r in mine),
                            "draft_calls_per_step": sum(r["draft_calls"] for r in mine) / sum(r["target_calls"] for r in mine),
                            "draft_share": sum(r["propose_s"] for r in mine) / sum(r["seconds"] for r in mine),
                            "tokens_per_s": statistics.median(r["new"] / r["seconds"] for r in mine),
                            "exact_vs_ar": exact})
    out = {"model": args.model, "threads": torch.get_num_threads(), "repeats": args.repeats, "new": args.new,
           "prompts": len(prompts), "summary": summary, "runs": res}
    with open(os.path.join(args.out, f"plain_calls_{args.model}.json"), "w") as f:
        json.dump(out, f, indent=1)
    lines = ["| row | category | speed-up vs AR (same T) | tau | draft calls / step | draft share of time | tokens/s | == AR |",
             "|---|---|---|---|---|---|---|---|"]
    for s in summary:
        lines.append(f"| {s['row']} | {s['category']} | {s['speedup']:.2f} | {s['tau']:.2f} | "
                     f"{s['draft_calls_per_step']:.2f} | {s['draft_share']:.0%} | {s['tokens_per_s']:.1f} | "
                     f"{'' if s['exact_vs_ar'] is None else s['exact_vs_ar']} |")
    text = "\n".join(lines)
    with open(os.path.join(args.out, f"plain_calls_{args.model}.md"), "w") as f:
        f.write(f"{args.model}: {len(prompts)} prompts, {args.new} new tokens, {args.repeats} interleaved rounds, "
                f"2 threads\n\n{text}\n")
    print(text)


if __name__ == "__main__":
    main()
