"""Does a second 40-minute DFlash run from the zoo drafter's weights (a warm restart) pay in a plain call?

Plain calls (``dflash.generate(target, [ids], draft=..., block=b)``, a chain) with the zoo's drafter and the
continued one (``--continued DIR``, the folder ``python -m refimpl.train dflash-smollm2-135m --init
models/dflash-smollm2-135m --out DIR`` wrote), both in the front door's form (int8 panels beside the lean
target), at blocks of 3 and 4, next to AR, on the plain-call bench's 10 held-out prompts, greedy, 64 new
tokens, 2 threads, interleaved rounds; per configuration the median over prompts of each prompt's speed ratio
to AR (medians over rounds), tau, and the step cost in AR steps (tau / speed-up).

    env -u TRITON_INTERPRET python bench_results/experiments/2026-12-07_dflash_warm_restart/run.py --continued DIR
"""
import argparse
import json
import os
import statistics

import torch

BLOCKS = (3, 4)


def main():
    from refimpl import autoregressive, dflash, models
    from refimpl.bench.plain_calls import HELD_OUT
    from refimpl.models import drafters
    from refimpl.prompts import encode_prompt

    p = argparse.ArgumentParser()
    p.add_argument("--continued", required=True)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--new", type=int, default=64)
    args = p.parse_args()
    torch.set_num_threads(2)
    target = models.load("smollm2-135m")
    drafts = {"zoo": drafters.zoo(target, "dflash"), "continued": drafters.from_folder(target, "dflash", args.continued)}
    prompts = [encode_prompt(target, text) for _, text in HELD_OUT]
    configs = [(d, b) for d in drafts for b in BLOCKS]
    names = ["ar"] + [f"{d}, block {b}" for d, b in configs]
    speed = {n: [[] for _ in prompts] for n in names}
    taus = {n: [] for n in names[1:]}
    for r in range(args.rounds):
        for i, ids in enumerate(prompts):
            order = names if (r + i) % 2 == 0 else names[::-1]
            toks = {}
            for name in order:
                if name == "ar":
                    g = autoregressive.generate(target, [ids], max_new_tokens=args.new)
                else:
                    d, b = configs[names.index(name) - 1]
                    g = dflash.generate(target, [ids], draft=drafts[d], max_new_tokens=args.new, block=b, topk=1, total=b - 1)
                    taus[name].append(g.stats.tau)
                toks[name] = g.tokens
                speed[name][i].append(g.stats.new_tokens / g.stats.seconds)
            assert all(toks[n] == toks["ar"] for n in names), i  # greedy: AR's tokens
    rows = {}
    for name in names[1:]:
        ratio = statistics.median(statistics.median(speed[name][i]) / statistics.median(speed["ar"][i])
                                  for i in range(len(prompts)))
        tau = statistics.median(taus[name])
        rows[name] = {"speedup_vs_ar": round(ratio, 3), "tau": round(tau, 3), "step_cost_ar_steps": round(tau / ratio, 2)}
    out = {"rows": rows, "prompts": len(prompts), "rounds": args.rounds, "new_tokens": args.new,
           "threads": torch.get_num_threads(),
           "ar_tokens_per_s": round(statistics.median(statistics.median(x) for x in speed["ar"]), 1)}
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "result.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
