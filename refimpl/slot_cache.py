"""A KV cache with per-row valid slots: what lets a batch of rows accept different numbers of drafts.

The verification core (:mod:`refimpl.speculative`) keeps one *physical* length for the whole batch;
after a verification a row that accepted fewer drafts than the longest one keeps *holes* (slots of
rejected drafts, mask 0) that are never attended to, and its position ids count only its valid slots,
so every row computes exactly what it would compute alone. Token trees (:mod:`refimpl.tree`), the
dLLM drafter and block diffusion use the same cache.

While every slot of every row is valid (one row, or rows that always accept the same counts), the
mask is all ones and each row's count is the physical length: the cache then keeps only that
length and builds ``mask`` / ``count`` when someone reads them (a chain step then runs a few small
tensor operations fewer, which a small model's step on a CPU notices).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .lm import check_rollback


class Scored(NamedTuple):
    """What one forward over new tokens returns: ``logits`` (B, Q or keep, V) and ``hidden`` (B, Q, H or
    taps x H) when it was asked for, else None."""

    logits: torch.Tensor
    hidden: torch.Tensor | None = None


class SlotCache:
    """One model's KV cache plus a (B, slots) mask of valid slots and per-row valid counts.

    ``mask`` (B, length) long and ``count`` (B,) long read and assign like tensors; ``length`` is
    the physical number of slots, ``holes`` says whether any row has a 0 in ``mask``. A model whose cache
    cannot be rolled back is refused (:func:`refimpl.lm.check_rollback`), the message naming ``user``
    (what decodes with it) and ``role`` (the model's part there)."""

    def __init__(self, lm, batch: int, device, user: str = "a decoder that rolls its cache back", role: str = "model"):
        check_rollback(lm, user, role)
        self.lm = lm
        self.cache = None
        self.rows, self.length, self.device = batch, 0, torch.device(device)
        self.explicit_mask = self.explicit_count = None  # the tensors, once not :attr:`dense`
        self.holes = False  # does any row have a 0 in ``mask``?

    @property
    def dense(self) -> bool:
        """Every slot of every row valid, mask and count implied by ``length`` (until one is assigned)."""
        return self.explicit_mask is None

    @property
    def mask(self) -> torch.Tensor:  # (B, length)
        if self.dense:
            return torch.ones((self.rows, self.length), dtype=torch.long, device=self.device)
        return self.explicit_mask

    @mask.setter
    def mask(self, value: torch.Tensor) -> None:
        if self.dense:  # leaving the dense state: the count must be kept from now on
            self.explicit_count = self.count
        self.explicit_mask, (self.rows, self.length) = value, value.shape

    @property
    def count(self) -> torch.Tensor:  # (B,)
        if self.dense:
            return torch.full((self.rows,), self.length, dtype=torch.long, device=self.device)
        return self.explicit_count

    @count.setter
    def count(self, value: torch.Tensor) -> None:
        if self.dense:
            self.explicit_mask = self.mask
        self.explicit_count = value

    def next_positions(self, fmask: torch.Tensor | None, Q: int) -> torch.Tensor:
        """Position ids (B or 1, Q) of ``Q`` tokens appended next (``fmask`` (B, Q) marks real ones; None =
        all): each row counts only its valid slots, so pads and holes take no position."""
        if fmask is None and self.dense:  # positions length .. length + Q - 1 in every row
            pos = torch.arange(self.length, self.length + Q, device=self.device)[None]  # (1, Q)
            return pos if self.rows == 1 else pos.expand(self.rows, Q)
        if fmask is None:
            return self.count[:, None] + torch.arange(Q, device=self.device)  # (B, Q)
        return self.count[:, None] + (fmask.cumsum(-1) - 1).clamp(min=0)

    def append(self, Q: int, valid: torch.Tensor | None = None, holes: bool = False) -> None:
        """Record ``Q`` new slots, ``valid`` (B, Q) marking the real ones (None: all); ``holes``: some of
        them stay invalid (pads), so every later call passes the slot mask."""
        if valid is None and self.dense:
            self.length += Q
            return
        valid = torch.ones((self.rows, Q), dtype=torch.long, device=self.device) if valid is None else valid
        self.mask = torch.cat([self.mask, valid.long()], dim=1)
        self.count = self.mask.sum(-1)
        self.holes = self.holes or holes

    def feed(self, tokens: torch.Tensor, fmask: torch.Tensor | None = None, hidden=False, keep: int = 0) -> Scored:
        """Append ``tokens`` (B, Q) (``fmask`` (B, Q) marks real ones; None = all) -> :class:`Scored`: the
        logits (B, Q, V), and the last layer's (normed) hidden states (B, Q, H) when ``hidden`` (a tuple of
        layer ids: those layers' residual streams side by side, :meth:`refimpl.lm.LM.forward`). ``keep`` > 0:
        logits for the last ``keep`` positions only (B, keep, V) (the model's ``logits_to_keep``; the
        hidden states stay (B, Q, H))."""
        pos = self.next_positions(fmask, tokens.shape[1])
        self.append(tokens.shape[1], fmask, holes=fmask is not None)  # (callers pass a feed mask only for pads)
        extra = {"output_hidden_states": hidden} if hidden else {}  # (any LM-like object works without these)
        if keep:
            extra["logits_to_keep"] = keep
        out = self.lm.forward(tokens, self.cache, position_ids=pos, attention_mask=self.mask if self.holes else None,
                              **extra)
        self.cache = out[1]
        return Scored(out[0], out[2] if hidden else None)

    def keep(self, block: int, keep: torch.Tensor, length: int, new_holes: bool) -> None:
        """Of the last ``block`` slots, keep those where ``keep`` (B, block) is 1; crop to ``length`` slots."""
        P, mask = self.length, self.mask
        self.mask = torch.cat([mask[:, : P - block], mask[:, P - block:] * keep], dim=1)[:, :length]
        self.lm.crop(self.cache, length)
        self.count = self.mask.sum(-1)
        self.holes = self.holes or new_holes

    def keep_accepted(self, block: int, n: torch.Tensor, n_list: list) -> None:
        """Of the last ``block`` slots keep each row's first ``n[b]``: the roll-back after a verification."""
        if not self.holes and len(set(n_list)) == 1:  # every row keeps the same slots: a crop, no new holes
            drop = block - n_list[0]
            if self.dense:
                self.length -= drop
            else:
                self.mask, self.count = self.mask[:, : self.length - drop], self.count - drop
            self.lm.crop(self.cache, self.length)
            return
        slot = torch.arange(block, device=n.device)
        self.keep(block, (slot[None, :] < n[:, None]).long(), self.length - block + max(n_list),
                  new_holes=len(set(n_list)) > 1)

    def select(self, rows: torch.Tensor) -> None:
        """Keep only the batch rows ``rows`` (finished rows leave the batch)."""
        if self.cache is not None:  # (nothing fed yet: no cache to select from)
            self.cache.batch_select_indices(rows)
        if self.dense:
            self.rows = rows.numel()
        else:
            self.mask, self.count = self.mask[rows], self.count[rows]
