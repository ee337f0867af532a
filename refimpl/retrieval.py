"""Retrieval drafting: propose tokens found in the context itself, no draft model (chapter 09).

Prompt lookup decoding ("Prompt lookup decoding", Saxena 2023; the same idea as "LLMA", Yang et
al., arXiv 2304.04487): find the most recent earlier occurrence of the context's last n tokens
(n = ``max_ngram`` down to ``min_ngram``, :func:`refimpl.copy_prior.lookup_positions`) and propose
the ``num_tokens`` tokens that followed it. A lookup is deterministic, so the proposal has no
``q``: the verification core treats it as one-hot, which keeps greedy decoding exact and
rejection sampling lossless (accept x with probability ``p(x)``, else resample from ``p`` with x
removed). Summaries, rewrites and answers about a passage copy long spans, so tau is high
there; open chat rarely repeats itself.
"""
from __future__ import annotations

import torch

from .copy_prior import lookup_positions
from .generation import Generation, check_positive_int
from .speculative import Proposal, Sampling, Verdict, decode

METHODS = ("prompt_lookup",)


class PromptLookup:
    """Proposer (:mod:`refimpl.speculative`): the continuation of the latest earlier n-gram match."""

    def __init__(self, num_tokens: int = 10, max_ngram: int = 3, min_ngram: int = 1):
        self.num_tokens = check_positive_int("num_tokens", num_tokens)
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def start(self, ids: torch.Tensor, mask: torch.Tensor | None, settings: Sampling) -> None:
        real = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
        self.rows = [row[keep].tolist() for row, keep in zip(ids.cpu(), real.cpu())]  # committed tokens

    def propose(self, caps: list[int]) -> Proposal:
        lens = torch.tensor([len(r) for r in self.rows])
        hist = torch.full((len(self.rows), int(lens.max())), -1, dtype=torch.long)  # (b, S), -1 = none
        for b, r in enumerate(self.rows):
            hist[b, : len(r)] = torch.tensor(r)
        at = lookup_positions(hist, (lens - 1)[:, None], self.max_ngram, self.min_ngram)[:, 0].tolist()  # (b,)
        props = [r[a: a + min(self.num_tokens, c)] if a >= 0 else [] for r, a, c in zip(self.rows, at, caps)]
        g = max(len(p) for p in props)
        self.x = [p + [0] * (g - len(p)) for p in props]
        return Proposal(torch.tensor(self.x, dtype=torch.long).view(len(props), g),
                        torch.tensor([len(p) for p in props]))

    def accept(self, v: Verdict) -> None:
        for r, x, n, t in zip(self.rows, self.x, v.n_list, v.next.tolist()):
            r.extend(x[:n] + [t])

    def select(self, rows: torch.Tensor) -> None:
        self.rows = [self.rows[i] for i in rows.tolist()]


def generate(target, prompts, max_new_tokens: int = 64, temperature: float = 0.0, top_k: int | None = None,
             top_p: float | None = None, generator: torch.Generator | None = None, eos_token_id=None,
             method: str = "prompt_lookup", num_tokens: int = 10, max_ngram: int = 3,
             min_ngram: int = 1) -> Generation:
    """Speculative decoding of a ragged batch with drafts retrieved from each row's own context.

    ``method="prompt_lookup"``: :class:`PromptLookup` with ``num_tokens``, ``max_ngram`` and
    ``min_ngram``. Greedy output equals ``autoregressive.generate``'s; sampling is lossless.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    return decode(target, PromptLookup(num_tokens, max_ngram, min_ngram), prompts, max_new_tokens, temperature,
                  top_k, top_p, generator, eos_token_id)
