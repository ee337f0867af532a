"""A KV cache with per-row valid slots: what lets a batch of rows accept different numbers of drafts.

The verification core (:mod:`refimpl.speculative`) keeps one *physical* length for the whole batch;
after a verification a row that accepted fewer drafts than the longest one keeps *holes* (slots of
rejected drafts, mask 0) that are never attended to, and its position ids count only its valid slots,
so every row computes exactly what it would compute alone. Token trees (:mod:`refimpl.tree`), the
dLLM drafter and block diffusion use the same cache.
"""
from __future__ import annotations

import torch


class SlotCache:
    """One model's KV cache plus a (B, slots) mask of valid slots and per-row valid counts."""

    def __init__(self, lm, batch: int, device):
        self.lm = lm
        self.cache = None
        self.mask = torch.zeros((batch, 0), dtype=torch.long, device=device)  # (B, P)
        self.count = torch.zeros(batch, dtype=torch.long, device=device)  # (B,) valid slots
        self.holes = False  # does any row have a 0 in ``mask``?

    def feed(self, tokens: torch.Tensor, fmask: torch.Tensor | None = None, hidden=False):
        """Append ``tokens`` (B, Q) (``fmask`` (B, Q) marks real ones; None = all) -> logits (B, Q, V),
        or ``(logits, h)`` with the last layer's (normed) hidden states h (B, Q, H) when ``hidden``
        (a tuple of layer ids: those layers' residual streams side by side, :meth:`refimpl.lm.LM.forward`)."""
        B, Q = tokens.shape
        if fmask is None:
            pos = self.count[:, None] + torch.arange(Q, device=tokens.device)  # (B, Q)
            self.mask = torch.cat([self.mask, torch.ones_like(tokens)], dim=1)
            self.count = self.count + Q  # (set before the forward: the positions above are already taken)
        else:
            pos = self.count[:, None] + (fmask.cumsum(-1) - 1).clamp(min=0)
            self.holes = True  # callers pass a feed mask only when it has holes (pads)
            self.mask = torch.cat([self.mask, fmask], dim=1)
            self.count = self.count + fmask.sum(-1)
        extra = {"output_hidden_states": hidden} if hidden else {}  # (any LM-like object works without it)
        out = self.lm.forward(tokens, self.cache, position_ids=pos, attention_mask=self.mask if self.holes else None,
                              **extra)
        self.cache = out[1]
        return (out[0], out[2]) if hidden else out[0]

    def keep(self, block: int, keep: torch.Tensor, length: int, new_holes: bool) -> None:
        """Of the last ``block`` slots, keep those where ``keep`` (B, block) is 1; crop to ``length`` slots."""
        P = self.mask.shape[1]
        self.mask = torch.cat([self.mask[:, : P - block], self.mask[:, P - block:] * keep], dim=1)[:, :length]
        self.lm.crop(self.cache, length)
        self.count = self.mask.sum(-1)
        self.holes = self.holes or new_holes

    def keep_accepted(self, block: int, n: torch.Tensor, n_list: list) -> None:
        """Of the last ``block`` slots keep each row's first ``n[b]``: the roll-back after a verification."""
        if not self.holes and len(set(n_list)) == 1:  # every row keeps the same slots: a crop, no new holes
            length = self.mask.shape[1] - block + n_list[0]
            self.mask, self.count = self.mask[:, :length], self.count - (block - n_list[0])
            self.lm.crop(self.cache, length)
            return
        slot = torch.arange(block, device=n.device)
        self.keep(block, (slot[None, :] < n[:, None]).long(), self.mask.shape[1] - block + max(n_list),
                  new_holes=len(set(n_list)) > 1)

    def select(self, rows: torch.Tensor) -> None:
        """Keep only the batch rows ``rows`` (finished rows leave the batch)."""
        if self.cache is not None:  # (nothing fed yet: no cache to select from)
            self.cache.batch_select_indices(rows)
        self.mask, self.count = self.mask[rows], self.count[rows]
