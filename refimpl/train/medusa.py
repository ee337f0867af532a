"""Train Medusa-1 heads on a frozen target by self-distillation: ``python -m refimpl.train medusa-<target>``.

Data: the target's own greedy answers with its final hidden state at every answer position
(:func:`refimpl.train.distill_data.generate_answers`): for ``smollm2-135m`` the cached distillation
rows of stages 1, 2 and 4 (the chat-like self-instruct questions), for ``tiny`` answers to King
James passages and the distillation prompt pool (tiny answers in King James English whatever it
is asked, as it does on the benchmark). The backbone never runs during training: the hidden states
are the features.

Loss (Medusa, arXiv 2401.10774, §2.3.2, self-distillation): head k at answer position i learns
the target's own distribution for the token k positions later, ``KL(p_{i+k} || p_i^(k))`` with
``p_{i+k} = softmax(h_{i+k} W^T)`` (the teacher, free: one matmul on a cached hidden state),
both over the heads' vocabulary (``kept`` rows of the LM head: all of tiny's 4,096; SmolLM2's
8,192 most frequent answer tokens). Only the residual blocks train (the LM head is shared and
frozen, see :mod:`refimpl.medusa`). Report: per-head top-1 / top-5 accuracy against the target's
actual next tokens on held-out answers, and the per-rank accuracies that pick the decoding tree.
"""
from __future__ import annotations

import random
import time
import zlib

import torch

from ..medusa import MedusaHeads, choose_tree, expected_length
from ..models import drafters
from .common import answer_vocabulary, budget_step, cosine_lr, write_report


def pairs(rows, k: int) -> torch.Tensor:
    """(N, 2) flat indices (i, i + k) of answer positions k apart inside one answer."""
    out, start = [], 0
    for ids, n_prompt, hidden, *_ in rows:
        n = hidden.shape[0]
        if n > k:
            i = torch.arange(start, start + n - k, device="cpu")  # flat indices: host bookkeeping
            out.append(torch.stack([i, i + k], 1))
        start += n
    return torch.cat(out) if out else torch.zeros((0, 2), dtype=torch.long, device="cpu")


def answer_tokens(rows) -> torch.Tensor:
    """(N,) the answer token at each flat answer position (hidden[i] predicts answer token i)."""
    return torch.cat([torch.tensor(ids[n_prompt:n_prompt + hidden.shape[0]], device=hidden.device) for ids, n_prompt, hidden, *_ in rows])


@torch.no_grad()
def rank_accuracy(heads: MedusaHeads, H: torch.Tensor, tokens: torch.Tensor, rows, ranks: int = 10) -> list:
    """``acc[k][r]``: how often head k+1's rank-r token equals the answer token k+1 positions on."""
    acc = []
    for k in range(heads.num_heads):
        pr = pairs(rows, k + 1)
        hits = torch.zeros(ranks, device=H.device)
        for j in range(0, len(pr), 4096):
            src, dst = pr[j:j + 4096, 0], pr[j:j + 4096, 1]
            logits = heads.forward(H[src].float())[k]  # (n, V')
            top = logits.topk(ranks, -1).indices
            top = top if heads.kept is None else heads.kept[top]
            hits += (top == tokens.to(H.device)[dst][:, None]).float().sum(0)
        acc.append((hits / max(len(pr), 1)).cpu().tolist())
    return acc


@torch.no_grad()
def chain_rates(heads: MedusaHeads, rows) -> list:
    """P(heads 1 .. d's top-1 tokens all equal the d answer tokens after the target's own next one), d = 1 ..
    K, at every answer position with K tokens after it: the acceptance per depth of a chain of one path
    (rank 0 at every depth), the shape every drafter's held-out report shares."""
    K, hits, count = heads.num_heads, [0] * heads.num_heads, 0
    for ids, n_prompt, hidden, *_ in rows:
        n = hidden.shape[0]
        if n <= K:
            continue
        tok = torch.tensor(ids[n_prompt:n_prompt + n], device=hidden.device)  # (n,) hidden[i] predicts tok[i]
        guess = [lg.argmax(-1) for lg in heads.forward(hidden[:n - K].float())]  # K x (n - K,)
        guess = [g if heads.kept is None else heads.kept[g] for g in guess]
        right = torch.stack([guess[k] == tok[k + 1:n - K + k + 1] for k in range(K)], 1)  # (n - K, K)
        chain = right.long().cumprod(1)  # (n - K, K) heads 1 .. d all right
        hits = [h + int(c) for h, c in zip(hits, chain.sum(0))]
        count += n - K
    return [round(h / max(count, 1), 4) for h in hits]


def train_heads(rows, lm_head: torch.Tensor, kept: torch.Tensor | None, num_heads: int = 4, steps: int = 600,
                batch: int = 512, lr: float = 1e-3, seconds: float = 1e9, holdout: int = 20, seed: int = 0,
                progress: bool = True):
    """Heads trained on ``rows`` (ids, n_prompt, hidden (n, H), text); every ``holdout``-th answer (by a
    hash of its text) held out for the accuracies. -> (heads, report)."""
    from tqdm.auto import tqdm

    torch.manual_seed(seed)
    held = [r for r in rows if zlib.crc32(str(r[3]).encode()) % holdout == 0]
    train = [r for r in rows if zlib.crc32(str(r[3]).encode()) % holdout != 0]
    random.Random(seed).shuffle(train)
    H = torch.cat([r[2] for r in train]).float()  # (N, H) features
    P = [pairs(train, k + 1) for k in range(num_heads)]
    heads = MedusaHeads(lm_head.float(), num_heads, kept)
    W = heads.lm_head  # (V', H) frozen
    opt = torch.optim.AdamW(heads.blocks.parameters(), lr=lr, weight_decay=0.0)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    t0, losses = time.time(), []
    bar = tqdm(range(steps), desc="medusa heads", disable=not progress)
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = cosine_lr(budget_step(step, steps, time.time() - t0, seconds), steps, lr, warmup=min(30, steps // 10))
        loss = 0.0
        for k in range(num_heads):
            pick = P[k][torch.randint(len(P[k]), (batch,), generator=gen, device="cpu")]
            h_src, h_dst = H[pick[:, 0]], H[pick[:, 1]]
            teacher = torch.softmax(h_dst @ W.T, -1)  # (batch, V') the target's distribution k on
            block = heads.blocks[k]
            student = torch.log_softmax((h_src + torch.nn.functional.silu(block(h_src))) @ W.T, -1)
            loss = loss + (teacher * (teacher.clamp_min(1e-12).log() - student)).sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss) / num_heads)
        bar.set_postfix(kl=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}")
        if time.time() - t0 > seconds:
            break
    heads.eval()
    Hh, toks = torch.cat([r[2] for r in held]).float(), answer_tokens(held)
    acc = rank_accuracy(heads, Hh, toks, held)
    report = {"steps": len(losses), "seconds": round(time.time() - t0, 1), "train_positions": int(H.shape[0]),
              "heldout_positions": int(Hh.shape[0]), "final_kl_per_head": round(sum(losses[-50:]) / len(losses[-50:]), 4),
              "top1": [round(a[0], 4) for a in acc], "top5": [round(sum(a[:5]), 4) for a in acc]}
    heads.accuracy = [[round(x, 4) for x in a] for a in acc]
    for size in (8, 16, 32):
        report[f"expected_tau_tree{size}"] = round(expected_length(heads.accuracy, choose_tree(heads.accuracy, size)), 3)
    return heads, report


def tiny_rows(target, n_kjv: int = 1200, n_pool: int = 600, max_new_tokens: int = 64, seed: int = 0, progress=True):
    """tiny's greedy answers (with hidden states) to King James passages and distillation prompts."""
    from ..data import kjv_split
    from .distill_data import generate_answers
    from .distill_prompts import prompt_pool

    rng = random.Random(seed)
    train_docs, _ = kjv_split()
    texts = []
    for _ in range(n_kjv):
        words = rng.choice(train_docs).split()
        a = rng.randrange(max(1, len(words) - 40))
        texts.append(" ".join(words[a:a + rng.randint(8, 30)]))
    pool = prompt_pool(seed)
    texts += rng.sample(pool, min(n_pool, len(pool)))
    return generate_answers(target, texts, max_new_tokens, batch=64, progress=progress, min_answer=8)


def train_medusa_tiny(out_dir: str, steps: int = 400, progress: bool = True) -> dict:
    from ..models import load

    target = load("tiny", device="cpu")
    t0 = time.time()
    rows = tiny_rows(target, progress=progress)
    gen_s = time.time() - t0
    heads, report = train_heads(rows, target.model.get_output_embeddings().weight.detach(), None, steps=steps,
                                progress=progress)
    report.update(data_rows=len(rows), data_seconds=round(gen_s, 1), threads=torch.get_num_threads())
    drafters.save(heads, out_dir, target, report)
    return write_report(out_dir, report)


def smollm2_rows(vocab_keep: int, gen_seconds: float = 0.0, progress: bool = True):
    """-> ``(rows, target, kept)``: SmolLM2's cached distillation answers (``gen_seconds > 0`` generates
    more first, see distill_data.build), the target on the CPU, and the ``vocab_keep`` most frequent
    answer tokens (+ specials): what the Medusa and EAGLE trainers for SmolLM2 start from."""
    from ..models import load
    from ..models.hf import cache_dir
    from . import distill_data

    rows = distill_data.build(cache_dir(), seconds=gen_seconds, stages=(1, 2, 4), progress=progress)
    if not rows:
        raise FileNotFoundError("no distillation rows cached: build them with refimpl.train.distill_data.build "
                                "(or gen_seconds > 0 here; about 40 min for all stages)")
    target = load("smollm2-135m", device="cpu", prepack=False)
    return rows, target, answer_vocabulary(target.tokenizer, rows, vocab_keep)


def train_medusa_smollm2(out_dir: str, steps: int = 1500, lr: float = 2e-3, vocab_keep: int = 8192,
                         gen_seconds: float = 0.0, progress: bool = True) -> dict:
    """On the cached distillation rows (``gen_seconds > 0`` generates more first, see distill_data.build)."""
    rows, target, kept = smollm2_rows(vocab_keep, gen_seconds, progress)
    W = target.model.get_output_embeddings().weight.detach()[kept]
    heads, report = train_heads(rows, W, kept, steps=steps, lr=lr, progress=progress)
    report.update(data_rows=len(rows), threads=torch.get_num_threads(), vocab_keep=vocab_keep, lr=lr)
    drafters.save(heads, out_dir, target, report)
    return write_report(out_dir, report)


def heldout_report(progress: bool = True) -> dict:
    """Measure the zoo's SmolLM2 Medusa heads on the shared held-out rows
    (:func:`refimpl.train.smollm2_data.smollm2_heldout_rows`) into its ``train_report.json``
    (``shared_heldout``: :func:`chain_rates`): ``python -c "from refimpl.train.medusa import heldout_report;
    heldout_report()"``."""
    from ..models import load
    from .smollm2_data import record_shared_heldout, smollm2_heldout_rows

    heads = drafters.load(load("smollm2-135m", device="cpu", fast=False), "medusa")
    held = smollm2_heldout_rows(progress)
    return record_shared_heldout("medusa-smollm2-135m", held, chain_rates(heads, held), "every answer position")
