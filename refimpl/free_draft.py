"""Lossless draft-and-verify for the masked diffusion sampler: ``diffusion.generate(..., draft_steps=K)``.

Paper: "Free Draft-and-Verification: Toward Lossless Parallel Decoding for Diffusion Large Language
Models" (FreeDave, Shutong Wu and Jiawei Zhang, arXiv 2510.00294): draft several future steps of
the static sampler from the predictions in hand, score all drafts in one batched forward, and keep
the deepest draft that the sampler itself would have reached; the output equals step-by-step
decoding with fewer forward calls.

Let ``step(S, L)`` be one step of :func:`refimpl.diffusion.generate` from state ``S`` with denoiser
logits ``L`` (:func:`refimpl.diffusion_steps.denoise_step` plus the sampler's bookkeeping: the
block, the step of its linear schedule with zero-k steps skipped, the move to the next block, the
stop once a completed block holds an EOS or the last block is complete). From a state ``S`` whose
logits ``L(S)`` are known:

1. Draft: ``D_1 = step(S, L(S))`` (the true next state) and ``D_i = step(D_{i-1}, L(S))`` for
   ``i = 2..K``: later steps guessed from the *same* predictions (crossing into the next block
   when a block completes).
2. Verify: one batched forward of every unfinished draft (K rows per prompt row, left-padded as
   the sampler pads) gives ``L(D_1..D_K)``; accept the deepest ``m`` with
   ``D_i == step(D_{i-1}, L(D_{i-1}))`` for all ``2 <= i <= m``. Each accepted ``D_i`` is then the
   true state after ``i`` steps, so the next round starts from ``D_m`` with ``L(D_m)`` in hand.

Each round costs one forward (``stats.nfe``) and advances ``1..K`` steps; ``K = 1`` is the plain
sampler. Rows are independent (the sampler's batch only shares forward calls), so each row keeps
its own block and step. Bit-exact when a row's logits do not depend on what else is in the batch
(true of our CPU models; batched GPU matmuls can differ in the last bits, as in speculative
decoding). Greedy only: low-confidence top-k schedule, ``threshold`` or ``factor``; no cache.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from .diffusion_steps import denoise_step, masked_answer, num_transfer_tokens, selection_kernel


class Cursor(NamedTuple):
    """Where each row stands in the sampler's bookkeeping (all (R,))."""

    block: torch.Tensor  # block being decoded
    j: torch.Tensor  # next step of that block's schedule
    count: torch.Tensor  # masked count of the block when it started (its linear schedule)
    done: torch.Tensor  # bool: finished (last block complete, or EOS in a complete block)

    def take(self, *idx) -> "Cursor":
        return Cursor(*(t[idx] for t in self))


@dataclass
class Stepper:
    """``step(S, L)`` of the module doc for rows that each keep their own :class:`Cursor`."""

    L: int  # padded prompt length: the answer starts at column L
    block_length: int
    num_blocks: int
    steps_per_block: int
    mask_id: int
    eos: torch.Tensor  # (E,) EOS ids (empty: never stop early)
    threshold: float | None = None
    factor: float | None = None
    kernel: object = None

    def start(self, x: torch.Tensor) -> Cursor:
        """Cursor of fresh rows (R, T): first block, first step."""
        z = torch.zeros(x.size(0), dtype=torch.long, device=x.device)
        count = (x[:, self.L: self.L + self.block_length] == self.mask_id).sum(-1)
        return Cursor(z, z.clone(), count, torch.zeros_like(z, dtype=torch.bool))

    def __call__(self, x: torch.Tensor, logits: torch.Tensor, cur: Cursor) -> tuple[torch.Tensor, Cursor]:
        """States x (R, T), their logits (R, T, V) -> the next states (R, T) and cursors (done rows unchanged)."""
        bl, n = self.block_length, self.steps_per_block
        live = ~cur.done  # (R,)
        cols = (self.L + cur.block * bl)[:, None] + torch.arange(bl, device=x.device)  # (R, bl): the block
        blk = x.gather(1, cols)  # (R, bl)
        masked = (blk == self.mask_id) & live[:, None]
        blk_logits = logits[torch.arange(x.size(0), device=x.device)[:, None], cols]  # (R, bl, V)
        j, k = cur.j, None
        if self.threshold is None and self.factor is None:  # LLaDA: k from the linear schedule
            ks = num_transfer_tokens(cur.count, n)  # (R, n)
            valid = (ks > 0) & (torch.arange(n, device=x.device) >= j[:, None])  # zero-k steps are skipped
            j = valid.long().argmax(-1)  # first step with something to commit
            k = ks.gather(1, j[:, None])[:, 0] * (valid.any(-1) & live)
        x0, sel = denoise_step(blk_logits, masked, self.mask_id, k, self.threshold, self.factor, kernel=self.kernel)
        blk = torch.where(sel, x0, blk)
        x = x.scatter(1, cols, blk)
        full = live & ~(blk == self.mask_id).any(-1)  # the block is complete
        t = torch.arange(x.size(1), device=x.device)
        answer = (t >= self.L) & (t[None] <= cols[:, -1:])  # (R, T): answer up to the block's end
        has_eos = (torch.isin(x, self.eos) & answer).any(-1)
        finish = full & ((cur.block == self.num_blocks - 1) | has_eos)
        move = full & ~finish  # on to the next block
        nxt = (cols + bl).clamp(max=x.size(1) - 1)
        count = torch.where(move, (x.gather(1, nxt) == self.mask_id).sum(-1), cur.count)
        return x, Cursor(cur.block + move.long(), torch.where(full, 0, j + 1), count, cur.done | finish)


def accept_depth(agree: torch.Tensor) -> torch.Tensor:
    """(B, K - 1) bool, ``agree[b, i]``: draft ``i + 2`` equals the exact step from draft ``i + 1``
    -> (B,) accepted depth ``m`` in 1..K (draft 1 is always exact; the chain stops at the first miss)."""
    return 1 + agree.long().cumprod(-1).sum(-1)


def check_draft_args(draft_steps, temperature, remasking, cache, early_commit) -> None:
    """``ValueError`` naming ``draft_steps`` for a bad K or a setting it cannot reproduce exactly."""
    if isinstance(draft_steps, bool) or not isinstance(draft_steps, int) or draft_steps < 1:
        raise ValueError(f"draft_steps must be an integer >= 1 or None, got {draft_steps!r}")
    if temperature != 0 or remasking != "low_confidence" or cache is not None or early_commit is not None:
        raise ValueError("draft_steps needs the deterministic sampler: temperature=0, remasking='low_confidence', "
                         "cache=None, early_commit=None")


@torch.no_grad()
def decode(model, prompts, mask_id, num_blocks, steps_per_block, eos, stats, *, gen_length, block_length,
           threshold, factor, draft_steps, use_kernel) -> torch.Tensor:
    """Draft-and-verify decoding of ragged ``prompts``; returns x (B, L + G) like the plain sampler."""
    x, attn, L, ragged = masked_answer(model, prompts, gen_length, mask_id, eos)  # (B, T) each
    B, K, device = x.size(0), draft_steps, x.device
    step = Stepper(L, block_length, num_blocks, steps_per_block, mask_id,
                   torch.tensor(sorted(eos), dtype=torch.long, device=device), threshold, factor,
                   selection_kernel(use_kernel, 0.0, "low_confidence", factor))

    def forward(states, rows):  # (R, T) states of prompt rows ``rows`` (R,) -> (R, T, V)
        stats.nfe += 1
        return model.logits(states, attention_mask=attn[rows]) if ragged else model.logits(states)

    rows = torch.arange(B, device=device)
    cur, logits = step.start(x), forward(x, rows)
    stats.extra.update(draft_steps=K, draft_rows=0, committed=[])
    while not bool(cur.done.all()):
        chain = [(x, cur)]  # D_0 = S, then D_1..D_K all stepped with L(S)
        for _ in range(K):
            chain.append(step(chain[-1][0], logits, chain[-1][1]))
        D = torch.stack([d for d, _ in chain[1:]], 1)  # (B, K, T)
        C = Cursor(*(torch.stack(ts, 1) for ts in zip(*[c for _, c in chain[1:]])))  # each (B, K)
        b, i = (~C.done).nonzero(as_tuple=True)  # the drafts that still have a step to take
        agree = torch.zeros(B, K, dtype=torch.bool, device=device)
        slot = torch.full((B, K), -1, dtype=torch.long, device=device)
        if len(b):
            scored = forward(D[b, i], b)  # (R, T, V): L(D_i), one batched call
            truth, _ = step(D[b, i], scored, C.take(b, i))  # the exact step from each draft
            agree[b, i] = (truth == D[b, (i + 1).clamp(max=K - 1)]).all(-1) & (i + 1 < K)
            slot[b, i] = torch.arange(len(b), device=device)
            stats.extra["draft_rows"] += len(b)
        m = accept_depth(agree[:, : K - 1])  # (B,)
        stats.accepted.append(torch.where(cur.done, 0, m).tolist())
        new = D[rows, m - 1]
        stats.extra["committed"].append(((x == mask_id).sum(-1) - (new == mask_id).sum(-1)).tolist())
        x, cur = new, C.take(rows, m - 1)
        if len(b):
            logits = scored[slot[rows, m - 1].clamp(min=0)]  # L(D_m); rows now done keep a stand-in
    return x
