"""DFlash's products on the lean kernel with int8 panels against the plain fp32 drafter, SmolLM2-135M.

Plain calls (``dflash.generate(target, [ids], draft=...)``, the ``"cpu"`` preset) with the zoo's drafter as
loaded (fp32 ``nn.Linear``) and as the front door now runs it (``lean_draft.lean(d, int8=True)``), next to AR,
on the plain-call bench's held-out prompts (``refimpl.bench.plain_calls.HELD_OUT``), greedy, 64 new tokens,
2 threads, the three interleaved in every round; medians over rounds of each prompt's tokens/s, then the
median over prompts of the ratio to AR in the same round. The draft's share of a call: seconds inside its
``context``, ``step`` and ``logits`` over the call's seconds.

    env -u TRITON_INTERPRET python bench_results/experiments/2026-12-07_dflash_lean_int8/run.py --rounds 3
"""
import argparse
import copy
import json
import os
import statistics
import time

import torch


def timed(draft, clock):
    """Wrap the drafter's three entry points so that ``clock[0]`` accumulates their seconds."""
    for name in ("context", "step", "logits"):
        fn = getattr(draft, name)

        def wrapped(*a, _fn=fn, **kw):
            t = time.perf_counter()
            try:
                return _fn(*a, **kw)
            finally:
                clock[0] += time.perf_counter() - t
        setattr(draft, name, wrapped)
    return draft


def main():
    from refimpl import autoregressive, dflash, models
    from refimpl.bench.plain_calls import HELD_OUT
    from refimpl.models import drafters, lean_draft
    from refimpl.prompts import encode_prompt

    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--limit", type=int, default=10)
    p.add_argument("--new", type=int, default=64)
    args = p.parse_args()
    torch.set_num_threads(2)
    target = models.load("smollm2-135m")
    plain = drafters.load(target, "dflash")
    lean = lean_draft.lean(copy.deepcopy(plain), int8=True)
    clocks = {"plain fp32": [0.0], "lean int8": [0.0]}
    drafts = {"plain fp32": timed(plain, clocks["plain fp32"]), "lean int8": timed(lean, clocks["lean int8"])}
    prompts = [(cat, encode_prompt(target, text)) for cat, text in HELD_OUT[: args.limit]]
    runs = {name: [[] for _ in prompts] for name in ("ar", *drafts)}
    stats = {name: {"tau": [], "share": []} for name in drafts}
    for r in range(args.rounds):
        for i, (_, ids) in enumerate(prompts):
            order = ["ar", *drafts] if (r + i) % 2 == 0 else [*drafts, "ar"]
            ar_tokens = None
            for name in order:
                if name == "ar":
                    g = autoregressive.generate(target, [ids], max_new_tokens=args.new)
                    ar_tokens = g.tokens
                else:
                    clocks[name][0] = 0.0
                    g = dflash.generate(target, [ids], draft=drafts[name], max_new_tokens=args.new)
                    stats[name]["tau"].append(g.stats.tau)
                    stats[name]["share"].append(clocks[name][0] / g.stats.seconds)
                    runs[name][i].append(("tokens", g.tokens))
                runs[name][i].append(g.stats.new_tokens / g.stats.seconds)
            for name in drafts:  # greedy: every run's tokens equal AR's
                assert runs[name][i][-2][1] == ar_tokens, (name, i)
                runs[name][i].pop(-2)
    out = {"model": "smollm2-135m", "prompts": len(prompts), "rounds": args.rounds, "new_tokens": args.new,
           "threads": torch.get_num_threads(), "cpu": os.cpu_count(), "rows": {}}
    for name in drafts:
        ratios = [statistics.median(runs[name][i]) / statistics.median(runs["ar"][i]) for i in range(len(prompts))]
        out["rows"][name] = {"speedup_vs_ar": round(statistics.median(ratios), 3),
                             "tau": round(statistics.median(stats[name]["tau"]), 3),
                             "draft_share_of_call": round(statistics.median(stats[name]["share"]), 3)}
    out["ar_tokens_per_s"] = round(statistics.median(statistics.median(x) for x in runs["ar"]), 1)
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "result.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
