"""The data SmolLM2's drafters share: the rows they train on and the one held-out set their taus compare on.

:func:`smollm2_rows`: SmolLM2's own fp32 greedy answers to the distillation prompts that need no model (the
EAGLE-3 CPU recipe, DFlash and PARD train on them); :func:`smollm2_heldout_rows`: its answers to the
benchmark's prompts, which no training pool holds; :func:`shared_heldout`: the report entry each drafter's
``heldout_report()`` writes from them.
"""
from __future__ import annotations

import random

import torch

from .common import answer_vocabulary


def smollm2_pool() -> list[str]:
    """The prompts :func:`smollm2_rows` answers, in the order it answers them: stage 1's pool and stage 3's
    copy / edit tasks on human text (:mod:`refimpl.train.distill_prompts`), shuffled with seed 0."""
    from .distill_prompts import human_copy_prompts, prompt_pool

    texts = prompt_pool(0) + human_copy_prompts(0)
    random.Random(0).shuffle(texts)
    return texts


def smollm2_rows(vocab_keep: int, gen_seconds: float, progress: bool = True):
    """-> ``(rows, target, kept)``: SmolLM2's own fp32 greedy answers (the target as decoding runs it)
    to the distillation prompts that need no model (stage 1's pool and stage 3's copy / edit tasks on
    human text, :mod:`refimpl.train.distill_prompts`), cached in ``smollm2-eagle3-rows.pt`` and
    continued for at most ``gen_seconds``; the ``vocab_keep`` most frequent answer tokens."""
    import os

    from ..models import load
    from ..models.hf import cache_dir
    from .distill_data import generate_answers

    target = load("smollm2-135m", device="cpu", fast=False)  # (prepacked: the same logits as decoding's LeanLM)
    path = os.path.join(cache_dir(), "smollm2-eagle3-rows.pt")
    rows = torch.load(path) if os.path.exists(path) else []
    if gen_seconds > 0:
        rows = generate_answers(target, smollm2_pool(), 96, 64, seconds=gen_seconds, path=path, progress=progress,
                                start=rows)
    if not rows:
        raise FileNotFoundError(f"no answers cached at {path}: run with gen_seconds > 0")
    return rows, target, answer_vocabulary(target.tokenizer, rows, vocab_keep)


def smollm2_heldout_rows(progress: bool = True) -> list:
    """SmolLM2's fp32 greedy answers (96 tokens at most) to the benchmark's prompts (:func:`refimpl.prompts.prompt_set`:
    chat, summary, code, math, copy, QA): the one held-out set of every SmolLM2 drafter, so that their taus
    compare. No drafter trained on them: every distillation pool, the base draft's included, leaves the
    benchmark's prompts out (:func:`refimpl.train.distill_prompts.bench_texts`), checked here against the pools
    built without a model. Cached in ``smollm2-heldout-rows.pt``; rows as
    :func:`refimpl.train.distill_data.generate_answers`'."""
    import os

    from ..models import load
    from ..models.hf import cache_dir
    from ..prompts import prompt_set
    from .distill_data import generate_answers
    from .distill_prompts import general_pool

    texts = [t for _, t in prompt_set()]
    if set(texts) & set(general_pool(0)):
        raise AssertionError("a benchmark prompt is in a training pool: it cannot be held out")
    path = os.path.join(cache_dir(), "smollm2-heldout-rows.pt")
    rows = torch.load(path) if os.path.exists(path) else []
    if sorted(r[3] for r in rows) != sorted(texts):
        target = load("smollm2-135m", device="cpu", fast=False)
        rows = generate_answers(target, texts, 96, 16, path=path, progress=progress)
    order = {t: i for i, t in enumerate(texts)}
    return sorted(rows, key=lambda r: order[r[3]])


def record_shared_heldout(name: str, rows, rates: list, anchors: str, **extra) -> dict:
    """Write the ``shared_heldout`` entry into the zoo's ``models/NAME/train_report.json``: the drafter's chain
    acceptance on :func:`smollm2_heldout_rows` (``rows``), the tau it implies, and ``extra`` fields. -> the report."""
    import json
    import os

    from ..models import MODELS_DIR
    from .common import write_report

    folder = os.path.join(MODELS_DIR, name)
    with open(os.path.join(folder, "train_report.json")) as f:
        report = json.load(f)
    report["shared_heldout"] = {"prompts": "the benchmark's (refimpl.prompts), which no training pool holds",
                                "rows": len(rows), "anchors": anchors, "accept_rate_per_depth": rates,
                                "chain_tau": round(1 + sum(rates), 3), **extra}
    return write_report(folder, report)


def smollm2_corpus(seconds: float = 1e9, batch: int = 64, progress: bool = True) -> list:
    """SmolLM2's greedy answers (at most 96 tokens) to every prompt of the course's pool
    (:func:`refimpl.train.distill_prompts.general_pool`: 10,813 prompts, none of the benchmark's) from the fast
    batched generator: the target in bf16 (76% more answer tokens per CPU-minute than fp32 here,
    ``bench_results/pipeline/``), finished rows dropped. The answers are bf16 SmolLM2's, which may leave fp32's
    at a near-tie; the drafters learn the distribution, the target verifies every token. Cached in
    ``smollm2-corpus-bf16.pt``, continued for at most ``seconds`` by each call."""
    import os

    from ..models import load
    from ..models.hf import cache_dir
    from .distill_data import generate_answers
    from .distill_prompts import general_pool

    path = os.path.join(cache_dir(), "smollm2-corpus-bf16.pt")
    rows = torch.load(path) if os.path.exists(path) else []
    pool = general_pool(0)
    if len(rows) < len(pool) and seconds > 0:
        target = load("smollm2-135m", device="cpu", dtype=torch.bfloat16, prepack=False, fast=False)
        rows = generate_answers(target, pool, 96, batch, seconds=seconds, path=path, progress=progress, start=rows)
    return rows
