"""What each step of a drafter's training pipeline costs here: ``python -m refimpl.bench.pipeline --model smollm2-135m``.

Measured before any training is sized (:mod:`refimpl.train.own`, the zoo's SmolLM2 trainers), on prompts of the
course's pool (:func:`refimpl.train.distill_prompts.general_pool`), in one process:

1. **answers**: the target's greedy answers (:func:`refimpl.train.distill_data.generate_answers`, a finished
   row leaves its batch) in fp32, the numbers decoding gives, and in bf16; answer tokens per minute and per
   CPU-minute (minutes x threads), and the share of decoded slots a batch would spend on rows that had already
   finished if it kept them (the batch's longest answer x its rows, against the answers' tokens);
2. **features**: the target's tapped streams over those rows (:func:`refimpl.train.eagle3.target_features`),
   tokens per minute;
3. **training**: a few steps of each trainer at its CPU recipe (:data:`refimpl.train.own.RECIPES`) on those
   rows: seconds per step and the answer tokens a step reads.

Writes ``bench_results/pipeline/pipeline_<model>.{json,md}``.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch


def wasted_share(rows, batch: int) -> float:
    """The share of decoded slots that rows already finished would take if a batch kept decoding them: per
    batch of ``batch`` rows in generation order, its rows x its longest answer against its answers' tokens."""
    lengths = [len(r[0]) - r[1] for r in rows]
    kept = sum(len(lengths[i:i + batch]) * max(lengths[i:i + batch]) for i in range(0, len(lengths), batch))
    return round(1 - sum(lengths) / kept, 3) if kept else 0.0


def answers_step(model: str, prompts: list[str], dtype: torch.dtype, batch: int, new: int, threads: int):
    from ..models import load
    from ..train.distill_data import generate_answers

    target = load(model, device="cpu", dtype=dtype, prepack=False, fast=False)
    generate_answers(target, prompts[:batch], 2, batch, progress=False)  # warm up at the batch's shapes
    t0 = time.perf_counter()
    rows = generate_answers(target, prompts, new, batch, progress=False)
    s = time.perf_counter() - t0
    tokens = sum(len(r[0]) - r[1] for r in rows)
    return rows, {"dtype": str(dtype).replace("torch.", ""), "rows": len(rows), "answer_tokens": tokens,
                  "seconds": round(s, 1), "tokens_per_minute": round(60 * tokens / s),
                  "tokens_per_cpu_minute": round(60 * tokens / s / threads),
                  "slots_a_full_batch_would_waste": wasted_share(rows, batch)}


def training_steps(kind: str, target, rows, steps: int) -> dict:
    """``steps`` steps of ``kind``'s trainer at its CPU recipe on ``rows`` -> seconds per step, tokens a step reads."""
    from .. import dflash, eagle3
    from ..train import dflash as t_dflash, eagle3 as t_eagle3, own

    import tempfile

    o = {**own.RECIPES["cpu"], **own.RECIPES["cpu"][kind]}
    train, held = own.split(rows)
    held = (held or train)[:1]  # the reports' held-out pass: one row, so that the steps dominate the time
    if kind == "pard":
        with tempfile.TemporaryDirectory() as out:
            rep = own.train_pard(target, train, held, out, steps, 1e9, o["batch"], o["lr"], o["k"], o["keep"],
                                 o["min_keep"], max(1, target.num_layers // 8), own.mask_token(target, rows),
                                 progress=False)
        per = rep["train_seconds"] / rep["steps"]
    else:
        L = target.num_layers
        if kind == "eagle3":
            d = eagle3.new_draft(target, taps=own.servable(eagle3.default_taps(L), L, False))
        else:
            d = dflash.new_draft(target, num_layers=o["layers"], block=o["block"], mask_id=own.mask_token(target, rows),
                                 taps=own.servable(dflash.default_taps(L, o["layers"]), L, True))
        seqs = t_eagle3.target_features(target, train + held, d.taps, progress=False)
        if kind == "eagle3":
            W = target.model.get_output_embeddings().weight.detach()
            _, rep = t_eagle3.train_draft(d, seqs, W, steps=steps, batch=o["batch"], lr=o["lr"], ttt=o["ttt"],
                                          train_head=o["train_head"], prompt_loss=True,
                                          texts=[r[3] for r in train + held], progress=False)
            per = rep["seconds"] / rep["steps"]
        else:
            t0 = time.perf_counter()
            t_dflash.train_draft(d, seqs, steps=steps, batch=o["batch"], lr=o["lr"], progress=False,
                                 held=seqs[len(train):])
            per = (time.perf_counter() - t0) / steps  # (with the one-row held-out pass: a slight upper bound)
    batch, mean_tokens = o["batch"], sum(len(r[0]) for r in train) / len(train)
    return {"kind": kind, "steps": steps, "seconds_per_step": round(per, 2), "rows_per_step": batch,
            "tokens_per_step": round(batch * mean_tokens), "tokens_per_minute": round(60 * batch * mean_tokens / per)}


def main(argv=None):
    from ..models import load
    from ..train.distill_prompts import general_pool
    from ..train.eagle3 import target_features
    from .decode import hardware

    p = argparse.ArgumentParser(prog="python -m refimpl.bench.pipeline", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--prompts", type=int, default=96, help="prompts answered in each dtype")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--steps", type=int, default=6, help="training steps timed per kind")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=os.path.join("bench_results", "pipeline"))
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("TRITON_INTERPRET=1 is set: timings would be the interpreter's; unset it")
    os.environ["REFIMPL_THREADS"] = str(args.threads)
    torch.set_num_threads(args.threads)
    prompts = general_pool(0)[:args.prompts]
    rows, fp32 = answers_step(args.model, prompts, torch.float32, args.batch, args.max_new_tokens, args.threads)
    _, bf16 = answers_step(args.model, prompts, torch.bfloat16, args.batch, args.max_new_tokens, args.threads)
    target = load(args.model, device="cpu", prepack=False, fast=False)
    t0 = time.perf_counter()
    target_features(target, rows, (2, target.num_layers // 2, target.num_layers - 3), progress=False)
    s = time.perf_counter() - t0
    tokens = sum(len(r[0]) for r in rows)
    features = {"rows": len(rows), "tokens": tokens, "seconds": round(s, 1), "tokens_per_minute": round(60 * tokens / s)}
    train = [training_steps(k, target, rows, args.steps) for k in ("eagle3", "dflash", "pard")]
    result = {"suite": "pipeline", "model": args.model, "hardware": hardware(), "args": vars(args),
              "answers": [fp32, bf16], "features": features, "training": train}
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, f"pipeline_{args.model}")
    json.dump(result, open(base + ".json", "w"), indent=1)
    lines = [f"## what each pipeline step costs: {args.model}", "",
             f"{len(prompts)} pool prompts, answers of at most {args.max_new_tokens} tokens in batches of {args.batch}, "
             f"{args.threads} threads", "", "| step | what | tokens / minute | tokens / CPU-minute | notes |", "|---|---|---|---|---|"]
    for a in (fp32, bf16):
        lines.append(f"| answers | {a['dtype']}, {a['rows']} rows, {a['answer_tokens']} tokens, {a['seconds']} s | "
                     f"{a['tokens_per_minute']} | {a['tokens_per_cpu_minute']} | a batch keeping finished rows would "
                     f"spend {a['slots_a_full_batch_would_waste']:.0%} of its slots on them |")
    lines.append(f"| features | fp32, {features['rows']} rows, {features['tokens']} tokens, {features['seconds']} s | "
                 f"{features['tokens_per_minute']} | {round(features['tokens_per_minute'] / args.threads)} | prompt and answer |")
    for t in train:
        lines.append(f"| training | {t['kind']}, {t['rows_per_step']} rows a step, {t['seconds_per_step']} s a step | "
                     f"{t['tokens_per_minute']} | {round(t['tokens_per_minute'] / args.threads)} | "
                     f"{t['tokens_per_step']} tokens a step |")
    md = "\n".join(lines) + "\n"
    open(base + ".md", "w").write(md)
    print(md)
    return result


if __name__ == "__main__":
    main()
