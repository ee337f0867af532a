"""A/B of our trainers' recipes against the upstream repositories' (README.md next to this file).

    python bench_results/learned/upstream_variants/ab.py {cllm,dparallel,eagle3} OUT_DIR [VOCAB_KEEP]

Each variant trains on the same data (same seed, same contexts) for the same number of steps; the
models go to OUT_DIR (scratch, outside the repository); the reports are printed as JSON lines.
"""
import json
import os
import sys
import time

import torch


def cllm(out, contexts=256, steps=400):
    from refimpl.train.cllm import train_tiny_cllm

    for recipe in ("ours", "upstream"):
        t0, c0 = time.time(), time.process_time()
        r = train_tiny_cllm(os.path.join(out, f"tiny-cllm-{recipe}"), steps=steps, contexts=contexts, recipe=recipe)
        r.update(wall_s=round(time.time() - t0), cpu_s=round(time.process_time() - c0))
        print(json.dumps(r), flush=True)


def dparallel(out, contexts=128, steps=300):
    from refimpl import data, models
    from refimpl.bench.dllm import ar_perplexity
    from refimpl.models import load_folder
    from refimpl.train.cllm import threshold_calls, train_tiny_bdlm_dparallel

    ar = models.load("tiny", device="cpu")
    for states in ("ours", "upstream"):
        t0, c0 = time.time(), time.process_time()
        folder = os.path.join(out, f"tiny-bdlm-dparallel-{states}")
        r = train_tiny_bdlm_dparallel(folder, steps=steps, contexts=contexts, rounds=1, states=states)
        lm = load_folder(folder, device="cpu")
        prompts = data.kjv_prompts(lm.tokenizer, 8)
        calls, text = threshold_calls(lm, prompts, 0.9)
        r.update(ar_perplexity_of_threshold_0_9_text=round(ar_perplexity(ar, prompts, text), 2),
                 wall_s=round(time.time() - t0), cpu_s=round(time.process_time() - c0))
        print(json.dumps(r), flush=True)
    base = models.load("tiny-bdlm", device="cpu")
    prompts = data.kjv_prompts(base.tokenizer, 8)
    calls, text = threshold_calls(base, prompts, 0.9)
    print(json.dumps({"base": "tiny-bdlm", "threshold_0.9_calls_per_32_tokens": round(calls, 2),
                      "ar_perplexity_of_threshold_0_9_text": round(ar_perplexity(ar, prompts, text), 2)}), flush=True)


def eagle3(out, steps=200, vocab_keep=1024):
    from refimpl import models
    from refimpl.eagle3 import new_draft, save_draft
    from refimpl.train.common import answer_vocabulary
    from refimpl.train.eagle3 import target_features, train_draft
    from refimpl.train.medusa import tiny_rows

    target = models.load("tiny", device="cpu")
    rows = tiny_rows(target, progress=False)
    kept = answer_vocabulary(target.tokenizer, rows, vocab_keep)
    W = target.model.get_output_embeddings().weight.detach()
    for recipe in ("ours", "upstream"):
        t0, c0 = time.time(), time.process_time()
        torch.manual_seed(0)
        draft = new_draft(target, kept=kept)
        seqs = target_features(target, rows, draft.taps, progress=False)
        draft, r = train_draft(draft, seqs, W[kept], steps=steps, batch=8, lr=2e-3, progress=False,
                               texts=[x[3] for x in rows], recipe=recipe, full_head=W)
        r.update(vocab_keep=int(kept.numel()), wall_s=round(time.time() - t0), cpu_s=round(time.process_time() - c0))
        save_draft(draft, os.path.join(out, f"eagle3-tiny-kept{vocab_keep}-{recipe}"), "tiny", r)
        print(json.dumps(r), flush=True)


if __name__ == "__main__":
    torch.set_num_threads(2)
    extra = {"vocab_keep": int(sys.argv[3])} if len(sys.argv) > 3 else {}  # eagle3: the kept vocabulary's size
    {"cllm": cllm, "dparallel": dparallel, "eagle3": eagle3}[sys.argv[1]](sys.argv[2], **extra)
