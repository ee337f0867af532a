"""A/B of the capstone rows between two checkouts of the repository (the shared verification core's
refactor: the verdict's committed tokens, one slot-proposal helper, one drafter registry).

    env -u TRITON_INTERPRET python bench_results/experiments/2026-12-07_core_ab/run.py --a OLD_CHECKOUT --b . \\
        --model tiny --rounds 2

Each round runs ``python -m refimpl.bench --suite capstone`` once from checkout A and once from B (the order
alternating), every run with the same methods, prompts and threads; the table gives each row's median
tokens/s over the rounds for A and B, their ratio, and whether both runs' greedy tokens equal their AR's
(``exact``). Writes ``ab_<model>.json`` and ``ab_<model>.md`` beside this file."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def run(checkout: str, model: str, methods: str, per_category: int, threads: int) -> dict:
    with tempfile.TemporaryDirectory() as out:
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["PYTHONPATH"] = os.path.abspath(checkout)
        subprocess.run([sys.executable, "-m", "refimpl.bench", "--suite", "capstone", "--model", model, "--methods", methods,
                        "--per-category", str(per_category), "--repeats", "1", "--threads", str(threads), "--out", out],
                       cwd=os.path.abspath(checkout), env=env, check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(out, f"capstone_{model}.json")) as f:
            return {r["method"]: r for r in json.load(f)["rows"]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--a", required=True, help="checkout A (before)")
    p.add_argument("--b", required=True, help="checkout B (after)")
    p.add_argument("--model", default="tiny")
    p.add_argument("--methods", default="speculative [cpu];dynamic_tree [cpu];eagle3 [cpu];pard [cpu];dflash [cpu];"
                                        "prompt_lookup [cpu];lookahead [cpu]")
    p.add_argument("--per-category", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    runs = {"a": [], "b": []}
    for r in range(args.rounds):
        for side in ("ab" if r % 2 == 0 else "ba"):
            runs[side].append(run(getattr(args, side), args.model, args.methods, args.per_category, args.threads))
            print(f"round {r + 1}: {side} done", flush=True)
    rows = []
    for name in runs["a"][0]:
        a = statistics.median(x[name]["tokens_per_s"] for x in runs["a"])
        b = statistics.median(x[name]["tokens_per_s"] for x in runs["b"] if name in x)
        exact = [x[name]["exact"] for side in "ab" for x in runs[side] if name in x]
        rows.append({"method": name, "a_tokens_per_s": a, "b_tokens_per_s": b, "b_over_a": b / a,
                     "exact_both": all(e in (1.0, None) for e in exact)})
    with open(os.path.join(HERE, f"ab_{args.model}.json"), "w") as f:
        json.dump({"model": args.model, "rounds": args.rounds, "threads": args.threads, "per_category": args.per_category,
                   "rows": rows}, f, indent=1)
    md = ["| row | A tok/s | B tok/s | B / A | greedy == AR in every run |", "|---|---|---|---|---|"]
    md += [f"| {r['method']} | {r['a_tokens_per_s']:.1f} | {r['b_tokens_per_s']:.1f} | {r['b_over_a']:.2f} | "
           f"{'yes' if r['exact_both'] else 'NO'} |" for r in rows]
    with open(os.path.join(HERE, f"ab_{args.model}.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
