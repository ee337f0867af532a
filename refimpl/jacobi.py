"""Jacobi decoding and speculative Jacobi decoding (chapter 07): the target drafts for itself.

Papers:
- Santilli et al., "Accelerating Transformer Inference for Translation via Parallel Decoding",
  arXiv 2305.10427, §3 (eq. 3-4): guess a window of n tokens ``y_1..y_n`` and update every
  position at once, ``y_i <- argmax p(. | x, y_<i)`` (a Jacobi iteration; autoregressive
  decoding is the Gauss-Seidel order of the same fixed-point system, one position at a time).
  The fixed point is the greedy output, and each iteration fixes at least one more token: the
  first position's context is all committed, so its argmax is final.
- Teng et al., "Accelerating Auto-regressive Text-to-Image Generation with Training-free
  Speculative Jacobi Decoding", arXiv 2410.01699, §3.2 (eq. 4-6): with sampling, a token drawn at
  the last iteration from ``p_old`` is accepted with ``min(1, p_new(x) / p_old(x))``; at the first
  rejection draw from ``norm(max(0, p_new - p_old))`` and stop. Random initial tokens are
  deterministic drafts (one-hot ``p_old``).

Both are a proposer on the verification core (:func:`refimpl.speculative.decode`): one
iteration = one target call over [last committed token, y_1..y_n]. The core accepts the
converged prefix (greedy: ``y_i == argmax``; sampling: the rule above, which is speculative
sampling with ``q = p_old``) plus the target's token after it. The same call's predictions at
the positions after the accepted ones become the next iteration's guesses -- the Jacobi update
-- and fresh initial tokens refill the window's end.

Where the fresh tokens come from changes only the speed. CLLMs (arXiv 2403.00835, §3.1) draw them
at random from the prompt (``init="random"``, the default). ``init="lookup"`` takes what followed
the latest earlier occurrence of the context's last n-gram (n = 3..1), at the same offset: prompt
lookup ("Prompt lookup decoding", Saxena 2023; :mod:`refimpl.retrieval`) used as a *starting
point*. A model that jumps towards the fixed point from a good start (a consistency-trained one,
chapter 15) gains from it; a plain model overwrites the guesses with its own predictions before
they reach the front of the window, so nothing changes. ``min_window`` (ours): where no n-gram
continuation is found, random guesses fill the window only up to ``min_window`` slots (a random
token is almost never right; the slots it leaves empty are not scored). On ``tiny-cllm``, window
4, n-gram start, ``min_window=3``: 2.64 tokens per call against 2.53 on chapter 15's 8 benchmark
prompts, at about the same cost per call, but 2.28 against 2.25 on 16 other held-out prompts and
2.22 against 2.21 on 48 mid-chapter ones: most of the gain is those 8 prompts'.
"""
from __future__ import annotations

import torch

from kernels.verify_greedy import argmax

from . import sampling
from .generation import Generation, check_positive_int, int_tensor, preset_options
from .primitives import NgramIndex, unpad
from .speculative import Needs, Proposal, Proposer, Sampling, Verdict, decode

#: where a new slot's first guess comes from (:class:`Jacobi`)
INITS = ("random", "lookup")


class Jacobi(Proposer):
    """Proposer: the window of guesses, updated by the target's own predictions after every call.

    ``window`` guesses per iteration; initial guesses are tokens drawn uniformly from the row's
    context (seeded by ``seed``) or, with ``init="lookup"``, the continuation of the context's last
    n-gram where it occurred before (drawn where there is none). Random draws fill the window up to
    ``min_window`` slots only (default: ``window``). Any guesses give the same output; only the
    speed changes.
    """

    def __init__(self, window: int, seed: int = 0, init: str = "random", min_window: int | None = None):
        self.window = check_positive_int("window", window)
        if init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {init!r}")
        self.min_window = self.window if min_window is None else check_positive_int("min_window", min_window)
        if self.min_window > self.window:
            raise ValueError(f"min_window must be <= window = {self.window}, got {min_window}")
        self.seed, self.init_from = seed, init

    def start(self, ids: torch.Tensor, mask: torch.Tensor | None, settings: Sampling) -> Needs:
        self.context = unpad(ids, mask)
        # with init="lookup": each row's n-gram index (it grows the row's context list itself)
        self.index = [NgramIndex(ctx, 3, 1) for ctx in self.context] if self.init_from == "lookup" else None
        if self.index is not None:
            self.context = [ix.history for ix in self.index]
        self.settings, self.vocab, self.device = settings, None, ids.device
        # a host generator: the same initial guesses on every run, whatever the device
        self.init = torch.Generator(device="cpu").manual_seed(self.seed)
        self.guess: list[list[int]] = [[] for _ in self.context]  # y_1..y_k per row
        self.p_old: list[list[torch.Tensor | None]] = [[] for _ in self.context]  # q of each guess; None = one-hot
        return Needs()

    def fresh(self, row: int, k: int) -> list[int]:
        """First guesses for (at most) the ``k`` slots after the row's ``len(self.guess[row])`` current
        ones: an n-gram continuation and random draws after it, or random draws only up to ``min_window``
        slots in all."""
        ctx, got, have = self.context[row], [], len(self.guess[row])
        if self.init_from == "lookup" and k:
            at = self.index[row].find()  # ctx[at] followed the context's last n-gram (3..1) earlier
            if at >= 0:  # slot j guesses position len(ctx) + j: ctx[at + j] followed at that offset
                got = ctx[at + have: at + have + k]
        if not got:
            k = min(k, max(self.min_window - have, 0))
        if len(got) == k:
            return got
        picks = torch.randint(0, len(ctx), (k - len(got),), generator=self.init, device="cpu").tolist()
        return got + [ctx[i] for i in picks]

    def propose(self, caps: list[int]) -> Proposal:
        for b, cap in enumerate(caps):
            w = min(self.window, cap)
            g, q = self.guess[b][:w], self.p_old[b][:w]
            fill = self.fresh(b, w - len(g))
            self.guess[b], self.p_old[b] = g + fill, q + [None] * len(fill)
        valid = [len(g) for g in self.guess]
        width = max(valid)
        x = int_tensor([g + [0] * (width - len(g)) for g in self.guess], self.device).view(len(valid), width)
        q = None
        if not self.settings.greedy and width and self.vocab is not None:
            q = torch.nn.functional.one_hot(x, self.vocab).float()  # (b, g, V) random guesses: one-hot
            for b, qs in enumerate(self.p_old):
                for i, qi in enumerate(qs):
                    if qi is not None:
                        q[b, i] = qi.to(q.device)
        return Proposal(x, int_tensor(valid, self.device), q)

    def accept(self, v: Verdict) -> None:
        logits, s = v.logits, self.settings
        self.vocab = logits.shape[-1]
        top = argmax(logits).tolist() if s.greedy else None  # (b, g + 1) the target's predictions
        for b, k in enumerate(v.n_list):
            (self.context[b] if self.index is None else self.index[b]).extend(v.committed[b])
            if s.greedy:  # the predictions past the new token become the next guesses
                self.guess[b] = top[b][k + 1: len(self.guess[b]) + 1]
                self.p_old[b] = [None] * len(self.guess[b])
            else:  # SJD: draw the next guesses from p_old and remember p_old as their q
                ahead = logits[b, k + 1: len(self.guess[b]) + 1]  # (g - k, V)
                p = s.probs(ahead)  # (g - k, V)
                x = sampling.sample_from_probs(p, s.generator) if len(p) else p.new_zeros(0, dtype=torch.long)
                self.guess[b], self.p_old[b] = x.tolist(), list(p.unbind(0))

    def select(self, rows: torch.Tensor) -> None:
        keep = rows.tolist()
        self.context = [self.context[i] for i in keep]
        self.index = None if self.index is None else [self.index[i] for i in keep]
        self.guess = [self.guess[i] for i in keep]
        self.p_old = [self.p_old[i] for i in keep]


#: named configurations (:func:`refimpl.generation.preset_options`): ``"cpu"``, an 8-token window
#: (``bench_results/capstone/``; a plain AR model fixes ~1 token a call whatever the window, so a
#: small window keeps each call cheap)
PRESETS = {"cpu": {"window": 8}}


def generate(target, prompts, max_new_tokens: int = 64, temperature: float = 0.0, top_k: int | None = None,
             top_p: float | None = None, generator: torch.Generator | None = None, eos_token_id=None,
             window: int | None = None, seed: int = 0, init: str = "random", min_window: int | None = None,
             preset: str | None = None) -> Generation:
    """Jacobi decoding (greedy) or speculative Jacobi decoding (sampling) of a ragged batch.

    Greedy output equals ``autoregressive.generate``'s token for token; sampling is distributed
    exactly as sampling from ``target`` with the same temperature / top-k / top-p.
    ``stats.tau`` = tokens per target call = 1 / (Jacobi iterations per token). ``init``: where new
    slots' first guesses come from and ``min_window`` how far random ones fill the window (:class:`Jacobi`).
    ``window=None``: ``preset``'s (:data:`PRESETS`).
    """
    window = preset_options(PRESETS, preset, target, window=window)["window"]
    return decode(target, Jacobi(window, seed, init, min_window), prompts, max_new_tokens, temperature, top_k, top_p,
                  generator, eos_token_id)
