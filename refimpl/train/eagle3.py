"""Train an EAGLE-3 draft on a frozen target: ``python -m refimpl.train eagle3-<target>``.

Paper: Li, Wei, Zhang, Zhang, "EAGLE-3", arXiv 2503.01840, §3.1 (training-time test) and §3.2
(multi-layer features); the model is :mod:`refimpl.eagle3`.

Data (what decoding sees): each row is a whole conversation, prompt *and* answer, with the
target's features at every position: :func:`target_features` runs ONE target forward per row
(batched) with ``output_hidden_states=taps + (L,)``, so it returns the three tapped residual
streams and the final normed state, from which the target's next-token distribution follows.
Answers: the target's own greedy answers (SmolLM2: all four distillation stages for the zoo's
draft, :func:`train_eagle3_smollm2`; the distillation prompts that need no model for the CPU
recipe, :func:`refimpl.train.smollm2_data.smollm2_rows`; ``tiny``: :func:`refimpl.train.medusa.tiny_rows`).

Loss: training-time test (:func:`refimpl.eagle3.unroll`) over ``steps`` draft steps; step j's
loss is the cross-entropy of the draft's distribution against the target's (renormalised on the
kept vocabulary) at every answer position it predicts (SmolLM2: at prompt positions too,
``prompt_loss``: the target's distribution is a label wherever it reads, and 1,500 answers are
little data), weighted ``decay ** j`` (EAGLE-3's public recipe: 7 steps, 0.8). No feature regression.
On a CPU the budget decides: SmolLM2's CPU recipe (:func:`train_eagle3_smollm2_cpu`) unrolls 3
steps and keeps the head frozen at the target's kept rows (7 min each on 2 threads: held-out
acceptance 0.32 / 0.10 / 0.04 at depth 1-3, where 7 steps with a trained head reached 0.21 / 0.03 /
0.00: 2.7x the steps in the same time).

Where SafeAILab/EAGLE's trainer (``eagle/traineagle3/cnets.py``, ``main.py``) differs, each named and
available as ``train_draft(recipe="upstream")``; A/B in ``bench_results/learned/upstream_variants/``:

- *Position mask.* Upstream drops from the loss every position whose target argmax lies outside the
  kept vocabulary (``position_mask = t2d[argmax] * loss_mask``, :func:`kept_argmax`); we train on them
  too, against the target's distribution renormalised on the kept tokens, so the draft still learns
  the best kept guess where it cannot be right, and the label stays the target's whole distribution.
- *Averaging.* Upstream's step loss is a mean over all B x T slots of the batch (masked slots count as
  zeros); ours is a mean over the step's own loss positions (:func:`ttt_loss`), so a deep step, which
  has fewer positions, is not down-weighted on top of ``decay ** j``.
- *Head.* Upstream's LM head starts at random; ours starts at (and on the CPU recipe stays at) the
  target's kept rows, which already score the target's top tokens before any training.

Measured on ``tiny`` (200 steps, one seed, a kept vocabulary holding every answer token, so the mask
drops nothing there): upstream's averaging and random head reached held-out tau 4.75 against our 4.59
(depth-1 acceptance 0.815 against 0.808). With 128 kept tokens, where the mask does drop positions:
4.81 against 4.76 (0.824 against 0.816), within one seed's noise. The zoo's drafts keep ours: they
were trained with it, and SmolLM2's CPU recipe freezes the head at the target's rows, which a random
head cannot do; a full-length A/B decides whether the default changes.

Report: held-out acceptance per depth of the draft's own greedy chain, ``accept_rate[d]`` =
P(the draft's first d greedy tokens all equal the target's), from every answer position, on the
unroll (which equals decoding's chain: tested), plus per-step top-1 agreement. The target's token
there is its argmax over the kept rows unless ``full_head`` is given (then a target token outside the
kept vocabulary is a miss, as in decoding).
"""
from __future__ import annotations

import random
import time
import zlib

import torch

from ..eagle3 import Eagle3Draft, new_draft, unroll
from ..models import drafters
from ..primitives import left_pad
from .common import answer_vocabulary, budget_step, cosine_lr, write_report


@torch.no_grad()
def target_features(target, rows, taps, batch: int = 16, progress: bool = True, device="cpu"):
    """Per row ``(ids (N,), feats (N, len(taps) H) fp16, final (N, H) fp16, n_prompt)``: the target's
    tapped streams and final normed state after every token, one batched forward per ``batch`` rows,
    kept on ``device`` (a GPU trainer keeps them where it trains)."""
    from tqdm.auto import tqdm

    L, out = target.num_layers, []
    order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]))  # similar lengths together: less padding
    done = {}
    for j in tqdm(range(0, len(order), batch), desc="target features", disable=not progress):
        chunk = [rows[i] for i in order[j:j + batch]]
        ids, mask = left_pad([list(r[0]) for r in chunk], target.pad_token_id, target.device)  # (b, T)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        _, _, h = target.forward(ids, position_ids=pos, attention_mask=mask, output_hidden_states=tuple(taps) + (L,))
        H = h.shape[-1] // (len(taps) + 1)
        for r, i in enumerate(order[j:j + batch]):
            f = h[r, mask[r].bool()].to(device)  # (N, (len(taps) + 1) H)
            done[i] = (torch.tensor(list(rows[i][0]), device=device), f[:, :-H].half(), f[:, -H:].half(), rows[i][1])
    return [done[i] for i in range(len(rows))]


def batch_of(seqs, steps: int, device="cpu", prompt_loss: bool = False):
    """Right-padded TTT batch: tokens x_{t+1} (B, T), tapped features (B, T, 3H), the target's final
    state after each token (B, T + steps, H) (``final[:, 1 + j + t]`` labels step j at t), mask (B, T)
    and ``answer`` (B, T + steps) True where the token after that position is an answer token (with
    ``prompt_loss``: any token, the prompt's too: the target's distribution there is as good a label)."""
    T = max(len(s[0]) for s in seqs) - 1
    B, H3, H = len(seqs), seqs[0][1].shape[1], seqs[0][2].shape[1]
    tok = torch.zeros((B, T), dtype=torch.long, device=device)
    feats = torch.zeros((B, T, H3), device=device)
    final = torch.zeros((B, T + 1 + steps, H), device=device)
    mask = torch.zeros((B, T), dtype=torch.long, device=device)
    answer = torch.zeros((B, T + 1 + steps), dtype=torch.bool, device=device)
    for r, (ids, f, fin, n_prompt) in enumerate(seqs):
        n = len(ids) - 1
        tok[r, :n], feats[r, :n], mask[r, :n] = ids[1:], f[:-1].float(), 1
        final[r, :n + 1] = fin.float()
        answer[r, 0 if prompt_loss else max(n_prompt - 1, 0):n] = True  # the token after position i: an answer's
    return tok, feats, final, mask, answer


@torch.no_grad()
def kept_argmax(final: torch.Tensor, full_head: torch.Tensor, kept: torch.Tensor | None) -> torch.Tensor:
    """(B, T', H) the target's final states, (V, H) its whole LM head, the draft's ``kept`` token ids ->
    (B, T') bool: the target's greedy token after that position is in the kept vocabulary (EAGLE-3's
    ``t2d[argmax]``; every position when ``kept`` is None)."""
    if kept is None:
        return torch.ones(final.shape[:2], dtype=torch.bool, device=final.device)
    t2d = torch.zeros(full_head.shape[0], dtype=torch.bool, device=final.device)
    t2d[kept.to(final.device)] = True
    return t2d[(final @ full_head.to(final.device, final.dtype).T).argmax(-1)]


def step_losses(draft: Eagle3Draft, tok, feats, final, mask, answer, steps: int, target_head: torch.Tensor,
                in_kept: torch.Tensor | None = None):
    """-> per step j: (cross-entropy summed over its loss positions, count, top-1 agreements). The
    label at (j, t) is the target's distribution after token t + 1 + j; a loss position is one whose
    token exists (``t + 1 + j`` inside the row) and whose predicted token is an answer token.
    ``in_kept`` (B, T + 1 + steps) bool, upstream's position mask (:func:`kept_argmax`): a label
    position whose target argmax is outside the kept vocabulary is no loss position either."""
    T = tok.shape[1]
    outs = unroll(draft, tok, draft.fuse(feats), mask, steps)
    if in_kept is not None:
        answer = answer & in_kept
    label = answer.clone()
    label[:, 0] = False  # (B, T + 1 + steps) positions some step reads its label from
    probs = torch.zeros((*label.shape, target_head.shape[0]), device=final.device)  # (B, T + 1 + steps, V')
    with torch.no_grad():  # the target's distributions, once per batch: steps j and j + 1 share them, shifted
        probs[label] = torch.softmax(final[label] @ target_head.T, -1)
    res = []
    for j, o in enumerate(outs):
        inside = torch.cat([mask[:, j:], torch.zeros_like(mask[:, :j])], 1).bool()  # t + j < n: token exists
        at = inside & answer[:, 1 + j:1 + j + T]  # (B, T)
        teacher = probs[:, 1 + j:1 + j + T][at]  # (n, V')
        logq = torch.log_softmax(draft.logits(o[at]), -1)  # (n, V')
        res.append((-(teacher * logq).sum(), int(at.sum()), int((logq.argmax(-1) == teacher.argmax(-1)).sum())))
    return res


@torch.no_grad()
def accept_rates(draft: Eagle3Draft, seqs, target_head: torch.Tensor, depth: int = 6, batch: int = 8,
                 device="cpu", full_head: torch.Tensor | None = None) -> dict:
    """Held-out: ``chain[d]`` = P(the draft's first d + 1 greedy tokens all equal the target's) from
    every answer position; ``top1[j]`` = P(step j's argmax = the target's) given a true prefix. The
    target's token is its argmax over ``target_head`` (the kept rows), or over ``full_head`` (its
    whole LM head: a target token outside the kept vocabulary is then a miss, as in decoding)."""
    hits, count, agree, seen = [0] * depth, 0, [0] * depth, [0] * depth
    for i in range(0, len(seqs), batch):
        tok, feats, final, mask, answer = batch_of(seqs[i:i + batch], depth, device)
        T = tok.shape[1]
        outs = unroll(draft, tok, draft.fuse(feats), mask, depth)
        alive = mask.bool() & answer[:, 1:1 + T]  # chains that start at an answer position
        count += int(alive.sum())
        for j, o in enumerate(outs):
            inside = torch.cat([mask[:, j:], torch.zeros_like(mask[:, :j])], 1).bool() & answer[:, 1 + j:1 + j + T]
            if full_head is None:
                ok = draft.logits(o).argmax(-1) == (final[:, 1 + j:1 + j + T] @ target_head.T).argmax(-1)  # (B, T)
            else:
                ok = draft.full(draft.logits(o).argmax(-1)) == (final[:, 1 + j:1 + j + T] @ full_head.T).argmax(-1)
            agree[j] += int((ok & inside).sum())
            seen[j] += int(inside.sum())
            alive = alive & ok & inside
            hits[j] += int(alive.sum())
    return {"chain": [round(h / max(count, 1), 4) for h in hits],
            "top1": [round(a / max(s, 1), 4) for a, s in zip(agree, seen)]}


def ttt_loss(res, decay: float, slots: int | None = None) -> torch.Tensor:
    """The training-time-test loss from :func:`step_losses`' ``res``: ``sum_j decay ** j * CE_j / n_j``,
    each step's mean over its own loss positions (ours); with ``slots`` (the batch's B x T inputs),
    ``sum_j decay ** j * CE_j / slots`` (upstream's ``.mean()`` over every slot, masked ones included)."""
    return sum(decay ** j * ce / max(n if slots is None else slots, 1) for j, (ce, n, _) in enumerate(res))


def train_draft(draft: Eagle3Draft, seqs, target_head: torch.Tensor, steps: int = 1000, ttt: int = 7,
                decay: float = 0.8, batch: int = 4, lr: float = 1e-3, seconds: float = 1e9, holdout: int = 20,
                seed: int = 0, progress: bool = True, texts=None, max_len: int = 512, prompt_loss: bool = False,
                train_head: bool = True, device="cpu", recipe: str = "ours", full_head: torch.Tensor | None = None):
    """Train ``draft`` with training-time test (``ttt`` steps, weights ``decay ** j``) on ``seqs``
    (:func:`target_features`, rows longer than ``max_len`` tokens cut; ``prompt_loss``: prompt
    positions are loss positions too, :func:`batch_of`); every ``holdout``-th row (by a hash of its
    ``texts`` entry) held out for :func:`accept_rates` (answer positions only). ``train_head`` False:
    the LM head stays the target's kept rows (a third less work per step, and the target's prior
    is kept while the layer is still poor). ``device``: where the draft trains (``seqs`` may live
    there already). ``recipe="upstream"``: SafeAILab/EAGLE's ``traineagle3`` in three points, each
    named in the module doc: the position mask (needs ``full_head``, the target's whole LM head, when
    the draft keeps a subset), every step's loss averaged over all B x T slots (:func:`ttt_loss`),
    and a randomly initialised head (``nn.Linear``'s default). -> (draft, report)."""
    import math

    from tqdm.auto import tqdm

    if recipe not in ("ours", "upstream"):
        raise ValueError(f"recipe must be 'ours' or 'upstream', got {recipe!r}")
    if recipe == "upstream" and not train_head:
        raise ValueError("recipe='upstream' starts the head at random: it needs train_head=True")
    if recipe == "upstream" and draft.kept is not None and full_head is None:
        raise ValueError("full_head (the target's whole LM head) is needed for recipe='upstream' with a kept vocabulary")
    torch.manual_seed(seed)
    if recipe == "upstream":
        with torch.no_grad():
            torch.nn.init.kaiming_uniform_(draft.lm_head, a=math.sqrt(5))  # nn.Linear's own initialisation
    seqs = [(s[0][:max_len], s[1][:max_len], s[2][:max_len], s[3]) for s in seqs]
    keys = texts if texts is not None else [str(i) for i in range(len(seqs))]
    held = [s for s, k in zip(seqs, keys) if zlib.crc32(str(k).encode()) % holdout == 0]
    train = [s for s, k in zip(seqs, keys) if zlib.crc32(str(k).encode()) % holdout != 0]
    rng = random.Random(seed)
    head = target_head.float().to(device)
    draft.to(device)
    draft.lm_head.requires_grad_(train_head)  # frozen: the target's kept rows stay the draft's head
    opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    t0, hist = time.time(), []
    bar = tqdm(range(steps), desc="eagle-3 draft", disable=not progress)
    draft.train()
    for step in bar:
        at = budget_step(step, steps, time.time() - t0, seconds)   # a time budget ends the cosine too
        for g in opt.param_groups:
            g["lr"] = cosine_lr(at, steps, lr, warmup=min(30, steps // 10))
        b = batch_of(rng.sample(train, min(batch, len(train))), ttt, device, prompt_loss)
        in_kept = kept_argmax(b[2], full_head, draft.kept) if recipe == "upstream" and draft.kept is not None else None
        res = step_losses(draft, *b, ttt, head, in_kept)
        loss = ttt_loss(res, decay, b[0].numel() if recipe == "upstream" else None)
        opt.zero_grad()
        loss.backward()
        opt.step()
        hist.append([float(ce.detach()) / max(n, 1) for ce, n, _ in res] + [a / max(n, 1) for _, n, a in res])
        last = hist[-20:]
        bar.set_postfix(ce0=f"{sum(h[0] for h in last) / len(last):.3f}",
                        acc0=f"{sum(h[ttt] for h in last) / len(last):.3f}",
                        acc_last=f"{sum(h[-1] for h in last) / len(last):.3f}")
        if time.time() - t0 > seconds:
            break
    draft.eval()
    train_s = time.time() - t0
    # (decoding grows deeper than training unrolls)
    rates = accept_rates(draft, held, head, depth=max(ttt, 6), device=device,
                         full_head=None if full_head is None else full_head.float().to(device))
    tail = hist[-50:]
    report = {"steps": len(hist), "seconds": round(train_s, 1), "train_rows": len(train), "heldout_rows": len(held),
              "ttt_steps": ttt, "decay": decay, "lr": lr, "batch": batch, "taps": list(draft.taps), "recipe": recipe,
              "head": "trained" if train_head else "frozen (the target's kept rows)",
              "loss_positions": "prompt and answer" if prompt_loss else "answer",
              "first_ce_per_step": [round(hist[0][j], 4) for j in range(ttt)],
              "final_ce_per_step": [round(sum(h[j] for h in tail) / len(tail), 4) for j in range(ttt)],
              "heldout_accept_rate_per_depth": rates["chain"], "heldout_top1_per_step": rates["top1"],
              "expected_chain_tau": round(1 + sum(rates["chain"]), 3)}
    return draft, report


def train_eagle3_tiny(out_dir: str, steps: int = 1200, seconds: float = 1e9, progress: bool = True) -> dict:
    from ..models import load
    from .medusa import tiny_rows

    target = load("tiny", device="cpu")
    t0 = time.time()
    rows = tiny_rows(target, progress=progress)
    draft = new_draft(target)
    seqs = target_features(target, rows, draft.taps, progress=progress)
    data_s = time.time() - t0
    draft, report = train_draft(draft, seqs, target.model.get_output_embeddings().weight.detach(), steps=steps,
                                seconds=seconds, batch=8, lr=2e-3, progress=progress, texts=[r[3] for r in rows])
    report.update(data_rows=len(rows), data_seconds=round(data_s, 1), threads=torch.get_num_threads())
    drafters.save(draft, out_dir, target, report)
    return write_report(out_dir, report)


def heldout_report(progress: bool = True) -> dict:
    """Measure the zoo's SmolLM2 EAGLE-3 draft on the shared held-out rows (:func:`refimpl.train.smollm2_data.smollm2_heldout_rows`) into its
    ``train_report.json`` (``shared_heldout``): ``python -c "from refimpl.train.eagle3 import heldout_report;
    heldout_report()"``. The chain's target token is the argmax of the target's whole head, as in decoding."""
    from ..models import load
    from .smollm2_data import record_shared_heldout, smollm2_heldout_rows

    target = load("smollm2-135m", device="cpu", fast=False)
    draft = drafters.load(target, "eagle3")
    held = target_features(target, smollm2_heldout_rows(progress), draft.taps, progress=progress)
    W = target.model.get_output_embeddings().weight.detach().float()
    rates = accept_rates(draft, held, W[draft.kept], depth=7, full_head=W)["chain"]
    return record_shared_heldout("eagle3-smollm2-135m", held, rates, "every answer position")


def train_eagle3_smollm2(out_dir: str, device=None, steps: int = 2089, batch: int = 64, ttt: int = 7,
                         lr: float = 1e-3, n_questions: int = 4000, vocab_keep: int = 8192,
                         progress: bool = True) -> dict:
    """The zoo's ``eagle3-smollm2-135m``: EAGLE-3's recipe at the scale it needs, on ``device`` (None:
    a GPU when there is one). Data: SmolLM2's fp32 greedy answers to all four distillation stages
    (:func:`refimpl.train.distill_data.all_stages`: ~10,400 conversations, self-instruct chat
    included), prompt and answer features; ``vocab_keep`` answer tokens. Training: ``ttt`` = 7
    unrolled steps (the paper's), a trained head, batches of ``batch`` rows, ``steps`` steps
    (~14 passes over the data). Measured on one H200: answers 2.4 min, features 16 s, training
    3.5 min (TF32 products). This CPU needs far longer (docs/models.md)."""
    from ..lm import default_device
    from ..models import load
    from .distill_data import all_stages

    device = torch.device(device) if device is not None else default_device()
    target = load("smollm2-135m", device=device, fast=False)
    t0 = time.time()
    rows, stage = all_stages(target, n_questions, progress=progress)
    gen_s, t0 = time.time() - t0, time.time()
    kept = answer_vocabulary(target.tokenizer, rows, vocab_keep)
    draft = new_draft(target, kept=kept)
    seqs = target_features(target, rows, draft.taps, batch=64, progress=progress, device=device)
    data_s = time.time() - t0
    W = target.model.get_output_embeddings().weight.detach()[kept.to(target.device)]
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True  # (the draft's products only: the target's features are fp32)
    try:
        draft, report = train_draft(draft, seqs, W, steps=steps, ttt=ttt, batch=batch, lr=lr, progress=progress,
                                    texts=[r[3] for r in rows], prompt_loss=True, train_head=True, device=device,
                                    max_len=512)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    report.update(data_rows=len(rows), stage_rows=[stage.count(k) for k in (1, 2, 3, 4)],
                  answer_seconds=round(gen_s, 1), feature_seconds=round(data_s, 1), vocab_keep=int(kept.numel()),
                  device=str(device), threads=torch.get_num_threads(),
                  gpu=torch.cuda.get_device_name(device) if device.type == "cuda" else None,
                  context="prompt and answer features (one target forward per row)")
    drafters.save(draft.to("cpu"), out_dir, target, report)
    return write_report(out_dir, report)


def train_eagle3_smollm2_cpu(out_dir: str, steps: int = 6000, seconds: float = 3300.0, gen_seconds: float = 1800.0,
                             vocab_keep: int = 8192, batch: int = 4, lr: float = 2e-3, prompt_loss: bool = True,
                             ttt: int = 3, train_head: bool = False, progress: bool = True) -> dict:
    """The recipe that fits a CPU's budget (``python -m refimpl.train eagle3-smollm2-135m-cpu``, about
    95 minutes on 2 threads: held-out acceptance 0.50 / 0.24 / 0.14 at depth 1-3; the zoo's draft
    is :func:`train_eagle3_smollm2`'s). SmolLM2's fp32 answers (:func:`refimpl.train.smollm2_data.smollm2_rows`, ``gen_seconds``
    more of them first), prompt and answer features recomputed (cached next to the answers),
    ``vocab_keep`` tokens, at most ``seconds`` of training; ``prompt_loss``, ``ttt``, ``train_head``:
    :func:`train_draft`'s."""
    import os

    from ..models.hf import cache_dir

    t0 = time.time()
    from .smollm2_data import smollm2_rows

    rows, target, kept = smollm2_rows(vocab_keep, gen_seconds, progress)
    gen_s = time.time() - t0
    t0 = time.time()
    draft = new_draft(target, kept=kept)
    path = os.path.join(cache_dir(), f"smollm2-eagle3-features-{len(rows)}-{'-'.join(map(str, draft.taps))}.pt")
    if os.path.exists(path):
        seqs = torch.load(path)
    else:
        seqs = target_features(target, rows, draft.taps, progress=progress)
        torch.save(seqs, path)
    data_s = time.time() - t0
    W = target.model.get_output_embeddings().weight.detach()[kept]
    draft, report = train_draft(draft, seqs, W, steps=steps, batch=batch, lr=lr, seconds=seconds, progress=progress,
                                texts=[r[3] for r in rows], prompt_loss=prompt_loss, ttt=ttt, train_head=train_head)
    report.update(data_rows=len(rows), answer_seconds=round(gen_s, 1), feature_seconds=round(data_s, 1),
                  vocab_keep=int(kept.numel()), threads=torch.get_num_threads(),
                  context="prompt and answer features (one target forward per row)")
    drafters.save(draft, out_dir, target, report)
    return write_report(out_dir, report)
