"""DFlash for SmolLM2: our learning rate (2e-3) against upstream's (SpecForge ``train_dflash.py``: 6e-4).

Both arms train the zoo's drafter shape (2 layers, block 8, taps 2 and 28, the head over the 8,192 most frequent
answer tokens) from the same seed on the first ``--rows`` rows of SmolLM2's corpus
(``refimpl.train.smollm2_data.smollm2_corpus``; the fp32 target's features computed once, into the shards
``train_dflash_smollm2`` reads: ``corpus_features``),
the same ``--steps`` steps of 8 rows x 16 anchors on a cosine schedule sized to them, then measure the chain's
acceptance on the shared held-out set (the benchmark's 30 prompts, which no training pool holds).

    env -u TRITON_INTERPRET python bench_results/experiments/2026-12-07_dflash_lr/run.py --rows 1536 --steps 600
"""
import argparse
import json
import os
import time

import torch


def main():
    from refimpl import dflash, models
    from refimpl.train.common import answer_vocabulary
    from refimpl.train.dflash import corpus_features, smollm2_heldout, train_draft
    from refimpl.train.smollm2_data import smollm2_corpus

    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=1536)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--lrs", default="6e-4,2e-3")
    args = p.parse_args()
    torch.set_num_threads(2)
    here = os.path.dirname(os.path.abspath(__file__))
    t0 = time.time()
    corpus = smollm2_corpus(0.0, progress=False)
    rows = corpus[:args.rows]
    target = models.load("smollm2-135m", device="cpu", fast=False)
    kept = answer_vocabulary(target.tokenizer, corpus, 8192)
    mask_id = target.tokenizer.convert_tokens_to_ids("<gh_stars>")
    shape = dict(num_layers=2, block=8, mask_id=mask_id, kept=kept)
    taps = dflash.new_draft(target, **shape).taps
    seqs = corpus_features(target, rows, taps)
    held = smollm2_heldout(target, taps, True)
    feature_min = round((time.time() - t0) / 60, 1)
    arms = {}
    for lr in (float(x) for x in args.lrs.split(",")):
        torch.manual_seed(0)
        draft = dflash.new_draft(target, **shape)
        _, report = train_draft(draft, seqs, steps=args.steps, lr=lr, held=held, progress=True)
        arms[str(lr)] = {k: report[k] for k in ("steps", "first_loss", "final_loss", "train_slot_accuracy",
                                                "accept_rate_per_depth", "heldout_chain_tau", "minutes")}
        print(lr, arms[str(lr)], flush=True)
    result = {"rows": len(rows), "corpus_rows": len(corpus), "steps": args.steps, "batch": 8, "anchors": 16,
              "feature_minutes": feature_min, "threads": torch.get_num_threads(), "arms": arms}
    with open(os.path.join(here, "result.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
