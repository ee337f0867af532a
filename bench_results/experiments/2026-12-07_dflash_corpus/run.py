"""DFlash for SmolLM2 on the pool-wide corpus: does 5.6x the data lift the held-out chain?

Trains a fresh SmolLM2 DFlash drafter (the zoo's shape: 2 layers, block 8, taps 2 and 28, the kept head) on
SmolLM2's bf16 answers to the whole pool (``refimpl.train.smollm2_data.smollm2_corpus``: 4,671 answers, none to
the benchmark's prompts) with the fp32 target's features, for ``--seconds`` on 2 threads, into ``--out`` (the
zoo's drafter is untouched). Then: the chain's acceptance on the shared held-out set (the benchmark's 30
prompts; the report's ``accept_rate_per_depth``) against the zoo drafter's, and plain calls
(``dflash.generate``, the ``"cpu"`` preset, each drafter in the front door's form: ``drafters.fast``, int8
panels beside the lean target) of both next to AR on the plain-call bench's 10 held-out prompts, greedy, 64
new tokens, interleaved rounds, medians of the per-prompt ratios.

    env -u TRITON_INTERPRET python bench_results/experiments/2026-12-07_dflash_corpus/run.py --seconds 2400 --rounds 2
"""
import argparse
import json
import os
import statistics

import torch


def main():
    from refimpl import autoregressive, dflash, models
    from refimpl.bench.plain_calls import HELD_OUT
    from refimpl.models import drafters
    from refimpl.prompts import encode_prompt
    from refimpl.train.dflash import train_dflash_smollm2

    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=2400.0)
    p.add_argument("--steps", type=int, default=8000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--out", default="/tmp/dflash-smollm2-corpus")
    args = p.parse_args()
    torch.set_num_threads(2)
    here = os.path.dirname(os.path.abspath(__file__))
    if os.path.exists(os.path.join(args.out, "train_report.json")):
        report = json.load(open(os.path.join(args.out, "train_report.json")))
    else:
        report = train_dflash_smollm2(args.out, steps=args.steps, seconds=args.seconds, gen_seconds=0.0,
                                      data="corpus", progress=True)
    target = models.load("smollm2-135m")
    zoo_report = json.load(open(os.path.join(models.MODELS_DIR, "dflash-smollm2-135m", "train_report.json")))
    drafts = {"zoo (fp32 answers, 832)": drafters.zoo(target, "dflash"),
              "corpus": drafters.fast(target, "dflash", drafters.load(target, "dflash", args.out))}
    rates = {"zoo (fp32 answers, 832)": zoo_report["shared_heldout"]["accept_rate_per_depth"],
             "corpus": report["accept_rate_per_depth"]}
    prompts = [encode_prompt(target, text) for _, text in HELD_OUT]
    speed = {name: [[] for _ in prompts] for name in ("ar", *drafts)}
    taus = {name: [] for name in drafts}
    for r in range(args.rounds):
        for i, ids in enumerate(prompts):
            order = ["ar", *drafts] if (r + i) % 2 == 0 else [*drafts, "ar"]
            toks = {}
            for name in order:
                if name == "ar":
                    g = autoregressive.generate(target, [ids], max_new_tokens=args.new)
                else:
                    g = dflash.generate(target, [ids], draft=drafts[name], max_new_tokens=args.new)
                    taus[name].append(g.stats.tau)
                toks[name] = g.tokens
                speed[name][i].append(g.stats.new_tokens / g.stats.seconds)
            for name in drafts:
                assert toks[name] == toks["ar"], (name, i)  # greedy: AR's tokens
    rows = {}
    for name in drafts:
        ratios = [statistics.median(speed[name][i]) / statistics.median(speed["ar"][i]) for i in range(len(prompts))]
        rows[name] = {"heldout_accept_rate_per_depth": rates[name], "heldout_chain_tau": round(1 + sum(rates[name]), 3),
                      "plain_call_speedup_vs_ar": round(statistics.median(ratios), 3),
                      "plain_call_tau": round(statistics.median(taus[name]), 3)}
    result = {"train_report": report, "rows": rows, "threads": torch.get_num_threads(), "rounds": args.rounds,
              "prompts": len(prompts), "new_tokens": args.new,
              "ar_tokens_per_s": round(statistics.median(statistics.median(x) for x in speed["ar"]), 1)}
    with open(os.path.join(here, "result.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
