"""PARD for SmolLM2 adapted on the pool-wide corpus: does 5x the data lift the one-call chain?

Trains ``smollm2-135m-draft`` into a PARD draft on SmolLM2's bf16 answers to the whole pool
(``refimpl.train.smollm2_data.smollm2_corpus``: 4,672 prompts, none of the benchmark's) with the current trainer
(masks only where a loss is taken, the cosine annealed on the time budget), 25 minutes on 2 threads, into a
temporary folder (the zoo's draft is untouched). Then: the one-call chain's acceptance on the shared held-out
set (the benchmark's 30 prompts) against the zoo's draft's, and plain calls (``pard.generate``, the "cpu"
preset) of both drafts next to AR on the plain-call bench's 10 held-out prompts, greedy, 64 new tokens,
interleaved rounds, medians.

    env -u TRITON_INTERPRET python bench_results/experiments/2026-12-07_pard_corpus/run.py --seconds 1500 --rounds 2
"""
import argparse
import json
import os
import statistics
import tempfile

import torch


def main():
    from refimpl import autoregressive, models, pard
    from refimpl.bench.plain_calls import HELD_OUT
    from refimpl.models import drafters
    from refimpl.models.smollm2 import load_draft
    from refimpl.prompts import encode_prompt
    from refimpl.train.pard import row_accept_rates, train_smollm2_pard
    from refimpl.train.smollm2_data import smollm2_heldout_rows

    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=1500.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--new", type=int, default=64)
    args = p.parse_args()
    os.environ["REFIMPL_THREADS"] = "2"
    torch.set_num_threads(2)
    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as out:
        report = train_smollm2_pard(out, seconds=args.seconds, gen_seconds=0, data="corpus", progress=False)
        target = models.load("smollm2-135m")
        new = load_draft(device="cpu", path=out, copy_prior=False)
        zoo = drafters.zoo(target, "pard")
        held = smollm2_heldout_rows(progress=False)
        k = report["k"]
        mask_id = new.model.config.pard_token
        rates = {"zoo (fp32 answers, 832)": row_accept_rates(zoo.model, held, zoo.kept_ids.cpu(), mask_id, k),
                 "corpus": row_accept_rates(new.model, held, new.kept_ids.cpu(), mask_id, k)}
        prompts = [encode_prompt(target, text) for _, text in HELD_OUT]
        drafts = {"zoo (fp32 answers, 832)": zoo, "corpus": new}
        speed = {name: [[] for _ in prompts] for name in ("ar", *drafts)}
        taus = {name: [] for name in drafts}
        for r in range(args.rounds):
            for i, ids in enumerate(prompts):
                order = ["ar", *drafts] if (r + i) % 2 == 0 else [*drafts, "ar"]
                ar = None
                for name in order:
                    if name == "ar":
                        g = autoregressive.generate(target, [ids], max_new_tokens=args.new)
                        ar = g.tokens
                    else:
                        g = pard.generate(target, [ids], draft=drafts[name], max_new_tokens=args.new)
                        taus[name].append(g.stats.tau)
                        speed[name][i].append(("tokens", g.tokens))
                    speed[name][i].append(g.stats.new_tokens / g.stats.seconds)
                for name in drafts:
                    assert speed[name][i][-2][1] == ar, (name, i)  # greedy: AR's tokens
                    speed[name][i].pop(-2)
    rows = {}
    for name in drafts:
        ratios = [statistics.median(speed[name][i]) / statistics.median(speed["ar"][i]) for i in range(len(prompts))]
        rows[name] = {"heldout_accept_rate_per_depth": rates[name], "heldout_chain_tau": round(1 + sum(rates[name]), 3),
                      "plain_call_speedup_vs_ar": round(statistics.median(ratios), 3),
                      "plain_call_tau": round(statistics.median(taus[name]), 3)}
    result = {"train_report": report, "rows": rows, "threads": torch.get_num_threads(), "rounds": args.rounds,
              "prompts": len(prompts), "new_tokens": args.new}
    with open(os.path.join(here, "result.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
