"""Train an EAGLE-style draft on a frozen target: ``python -m refimpl.train eagle-<target>``.

Data: the target's own greedy answers (``(ids, n_prompt, hidden, text)`` rows of
:func:`refimpl.train.distill_data.generate_answers`; for ``tiny`` :func:`refimpl.train.medusa.tiny_rows`).
Those rows keep the features of the answer positions only; the draft reads the prompt's features
too when it decodes, so :func:`features` recomputes every position's feature with ONE target
forward per row (checked against the stored answer features) and the draft is trained on the
whole sequence as context, with the loss on the answer positions only (the target's own tokens).

Loss (EAGLE, arXiv 2401.15077, training objective): teacher forcing with the true features; at
input t = (x_{t+1}, f_t) the draft predicts f_{t+1}:
``L = SmoothL1(f_hat_{t+1}, f_{t+1}) + 0.1 * CE(p_{t+2}, softmax(LM(f_hat_{t+1})))`` with the
target's own distribution ``p_{t+2} = softmax(LM(f_{t+1}))`` as the soft label (its argmax is the
target's greedy token on these answers). EAGLE also perturbs the input features with uniform
noise for robustness to its own feature errors at depth > 1. Upstream (SafeAILab/EAGLE
``eagle/train/main.py``, ``AddUniformNoise`` with ``std`` 0.2) scales it by the row's length T:
``(U(0, 1) - 0.5) * 0.2 * 512 / T``, i.e. U(-0.1, 0.1) at T = 512 and U(-0.8, 0.8) at T = 64; ours
is a fixed U(-``noise``, ``noise``) (0.1: upstream's width on its 512-token rows). Why: our rows are
short (tiny's ~110 tokens), where the length rule gives about U(-0.47, 0.47), 40% of the features'
own spread (std ~1.1 on ``tiny``), a regime upstream's long rows never see; the two are not measured
against each other here.
Report: held-out acceptance per depth of the chain the draft would propose on its own features:
``accept_rate[d]`` = P(the draft's first d greedy tokens all equal the target's), started at
answer positions with the true features before them.

SmolLM2-135M (``eagle-smollm2-135m``): the cached distillation rows of :mod:`refimpl.train.distill_data`
(stages 1, 2, 4), whose answer features are stored; recomputing the prompts' features would cost
about 20-30 min of this CPU, so :func:`answer_seqs` trains on the ANSWER positions only: each row's
context starts at the last prompt token (its feature is the first stored one). A train/test
mismatch: when decoding, the draft also reads the prompt's features (``Verdict.fed_hidden``), a
longer context than it was trained on. The head keeps the (at most 8,192) most frequent answer
tokens (``kept``: all 5,951 distinct ones here, rows of the LM head, as Medusa's); the soft label
is the target's distribution renormalised on them. The learning rate follows a cosine over ``steps`` or ``seconds``, whichever
is nearer its end.
"""
from __future__ import annotations

import random
import time
import zlib

import torch

from ..eagle import EagleDraft, new_draft
from ..models import drafters
from ..primitives import left_pad
from .common import budget_step, cosine_lr, write_report


@torch.no_grad()
def features(target, rows, batch: int = 32, progress: bool = True):
    """Per row ``(ids (N,), f (N, H) float32, n_prompt)``: the target's feature after every token
    (one forward per row, batched, left-padded). Checked against the rows' answer features."""
    from tqdm.auto import tqdm

    out = []
    for j in tqdm(range(0, len(rows), batch), desc="target features", disable=not progress):
        chunk = rows[j:j + batch]
        ids, mask = left_pad([list(r[0]) for r in chunk], target.pad_token_id, target.device)  # (b, L)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        _, _, h = target.forward(ids, position_ids=pos, attention_mask=mask, output_hidden_states=True)  # (b, L, H)
        for r, (row_ids, n_prompt, hid, *_) in enumerate(chunk):
            f = h[r, mask[r].bool()].float().cpu()  # (N, H)
            a = f[n_prompt - 1:n_prompt - 1 + hid.shape[0]]
            if not torch.allclose(a, hid.float(), atol=3e-2, rtol=1e-2):
                raise AssertionError("recomputed features disagree with the rows' answer features")
            out.append((torch.tensor(list(row_ids), device="cpu"), f, n_prompt))  # host rows, like f
    return out


def batch_of(seqs, noise: float, gen, device="cpu"):
    """Right-padded teacher-forcing batch on ``device``: inputs (x_{t+1}, f_t), targets f_{t+1}, loss
    mask (answers)."""
    L = max(len(s[0]) for s in seqs) - 1
    H = seqs[0][1].shape[1]
    B, dev = len(seqs), device
    tok = torch.zeros((B, L), dtype=torch.long, device=dev)  # (B, L)
    feat, tgt = torch.zeros(B, L, H, device=dev), torch.zeros(B, L, H, device=dev)  # (B, L, H)
    mask, loss_at = torch.zeros((B, L), dtype=torch.long, device=dev), torch.zeros((B, L), dtype=torch.bool, device=dev)
    for r, (ids, f, n_prompt) in enumerate(seqs):
        n = len(ids) - 1
        tok[r, :n], feat[r, :n], tgt[r, :n], mask[r, :n] = ids[1:], f[:-1], f[1:], 1
        loss_at[r, max(n_prompt - 2, 0):n] = True  # predicted f_{t+1} with t + 1 >= n_prompt - 1: answer logits
    if noise:
        feat = feat + (torch.rand(feat.shape, generator=gen, device=gen.device).to(dev) * 2 - 1) * noise
    return tok, feat, tgt, mask, loss_at


@torch.no_grad()
def accept_rates(draft: EagleDraft, seqs, depth: int = 5, starts: int = 6, seed: int = 0) -> list:
    """P(the draft's first d greedy tokens all equal the target's), d = 1..depth (see the module doc)."""
    rng, hits, count = random.Random(seed), [0] * depth, 0
    for ids, f, n_prompt in seqs:
        lo, hi = max(n_prompt - 1, 1), len(ids) - 1 - depth
        for s in sorted(rng.sample(range(lo, hi), min(starts, max(hi - lo, 0)))):
            tok, feat = ids[1:s + 1].clone(), f[:s].clone()  # context: (x_{t+1}, f_t), t < s; ids[s] = the root
            count += 1
            for d in range(depth):
                fh = draft(tok[None], feat[None])[0, -1]  # predicted feature after the newest token
                if int(draft.full(draft.logits(fh).argmax())) != int(ids[s + 1 + d]):
                    break
                hits[d] += 1
                tok, feat = torch.cat([tok, ids[s + 1 + d:s + 2 + d]]), torch.cat([feat, fh[None]])
    return [round(h / max(count, 1), 4) for h in hits]


def train_draft(draft: EagleDraft, seqs, steps: int = 600, batch: int = 16, lr: float = 2e-3, w_cls: float = 0.1,
                noise: float = 0.1, seconds: float = 1e9, holdout: int = 20, seed: int = 0, progress: bool = True,
                texts=None):
    """Train ``draft`` on ``seqs`` (from :func:`features`); every ``holdout``-th row (by a hash of its
    ``texts`` entry, else its index) held out for the acceptance rates. -> (draft, report)."""
    from tqdm.auto import tqdm

    torch.manual_seed(seed)
    keys = texts if texts is not None else [str(i) for i in range(len(seqs))]
    held = [s for s, k in zip(seqs, keys) if zlib.crc32(str(k).encode()) % holdout == 0]
    train = [s for s, k in zip(seqs, keys) if zlib.crc32(str(k).encode()) % holdout != 0]
    gen, rng = torch.Generator(device="cpu").manual_seed(seed), random.Random(seed)
    opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    t0, hist = time.time(), []
    bar = tqdm(range(steps), desc="eagle draft", disable=not progress)
    for step in bar:
        at = budget_step(step, steps, time.time() - t0, seconds)   # a time budget ends the cosine too
        for g in opt.param_groups:
            g["lr"] = cosine_lr(at, steps, lr, warmup=min(30, steps // 10))
        tok, feat, tgt, mask, at = batch_of(rng.sample(train, batch), noise, gen)
        pred = draft(tok, feat, mask)[at]  # (n, H) predicted features at the answer positions
        true = tgt[at]
        reg = torch.nn.functional.smooth_l1_loss(pred, true)
        teacher = torch.softmax(draft.logits(true), -1)  # (n, V) the target's own next-token distribution
        cls = -(teacher * torch.log_softmax(draft.logits(pred), -1)).sum(-1).mean()
        loss = reg + w_cls * cls
        opt.zero_grad()
        loss.backward()
        opt.step()
        hist.append((reg.item(), cls.item()))
        last = hist[-20:]
        bar.set_postfix(reg=f"{sum(h[0] for h in last) / len(last):.4f}",
                        ce=f"{sum(h[1] for h in last) / len(last):.3f}")
        if time.time() - t0 > seconds:
            break
    draft.eval()
    rates = accept_rates(draft, held)
    tail = hist[-50:]
    report = {"steps": len(hist), "seconds": round(time.time() - t0, 1), "train_rows": len(train),
              "heldout_rows": len(held), "final_smooth_l1": round(sum(h[0] for h in tail) / len(tail), 5),
              "final_ce": round(sum(h[1] for h in tail) / len(tail), 4), "w_cls": w_cls, "noise": noise, "lr": lr,
              "batch": batch, "accept_rate_per_depth": rates,
              "expected_chain_tau_depth5": round(1 + sum(rates), 3)}
    return draft, report


def train_eagle_tiny(out_dir: str, steps: int = 600, seconds: float = 1e9, progress: bool = True) -> dict:
    from ..models import load
    from .medusa import tiny_rows

    target = load("tiny", device="cpu")
    t0 = time.time()
    rows = tiny_rows(target, progress=progress)
    seqs = features(target, rows, progress=progress)
    data_s = time.time() - t0
    draft, report = train_draft(new_draft(target), seqs, steps=steps, seconds=seconds, progress=progress,
                                texts=[r[3] for r in rows])
    report.update(data_rows=len(rows), data_seconds=round(data_s, 1), threads=torch.get_num_threads())
    drafters.save(draft, out_dir, target, report)
    return write_report(out_dir, report)


def answer_seqs(rows):
    """Distillation rows ``(ids, n_prompt, hidden (n_answer, H), text)`` -> :func:`features`-shaped
    ``(ids, f, 1)`` over the answer only: ``ids`` from the last prompt token, ``f[i]`` = ``hidden[i]``,
    the feature after ``ids[i]``; (the row's last answer token has no stored feature: dropped)."""
    out = []
    for ids, n_prompt, hid, *_ in rows:
        n = hid.shape[0]
        if n >= 3:
            out.append((torch.tensor(list(ids[n_prompt - 1:n_prompt - 1 + n]), device=hid.device), hid.float(), 1))
    return out


def train_eagle_smollm2(out_dir: str, steps: int = 1200, seconds: float = 960.0, vocab_keep: int = 8192,
                        batch: int = 8, lr: float = 1e-3, progress: bool = True) -> dict:
    """On the cached distillation rows (answer positions only, see the module doc), ``vocab_keep`` tokens."""
    from .medusa import smollm2_rows

    rows, target, kept = smollm2_rows(vocab_keep, progress=progress)
    draft, report = train_draft(new_draft(target, kept=kept), answer_seqs(rows), steps=steps, batch=batch, lr=lr,
                                seconds=seconds, progress=progress, texts=[r[3] for r in rows if r[2].shape[0] >= 3])
    report.update(data_rows=len(rows), vocab_keep=int(kept.numel()), threads=torch.get_num_threads(),
                  context="answer positions only (from the last prompt token); no prompt features")
    drafters.save(draft, out_dir, target, report)
    return write_report(out_dir, report)


def heldout_report(progress: bool = True) -> dict:
    """Measure the zoo's SmolLM2 EAGLE draft on the shared held-out rows
    (:func:`refimpl.train.smollm2_data.smollm2_heldout_rows`, answer positions as it was trained:
    :func:`answer_seqs`) into its ``train_report.json`` (``shared_heldout``): ``python -c "from
    refimpl.train.eagle import heldout_report; heldout_report()"``."""
    from ..models import load
    from .smollm2_data import record_shared_heldout, smollm2_heldout_rows

    draft = drafters.load(load("smollm2-135m", device="cpu", fast=False), "eagle")
    held = smollm2_heldout_rows(progress)
    return record_shared_heldout("eagle-smollm2-135m", held, accept_rates(draft, answer_seqs(held)),
                                 "6 random answer positions a row")
