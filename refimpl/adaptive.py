"""Adaptive draft length: choose ``gamma`` per step instead of fixing it.

A fixed ``gamma`` wastes draft calls where the draft is unsure (they will be rejected) and stops
too early where the text is easy (a copied name, a closing bracket). Two training-free policies:

- ``policy="threshold"`` (confidence stopping, the training-free form of "SpecDec++: Boosting
  Speculative Decoding via Adaptive Candidate Lengths", Huang et al., arXiv 2405.19715, which
  stops once a trained head predicts P(a rejection) above a threshold): after drafting token i,
  stop when the draft's own top-1 probability ``max_v q_i(v) < threshold`` (token i is still
  proposed: it has been paid for), or when ``max_gamma`` tokens are drafted. In a batch each row
  stops on its own; the batch drafts while any row goes on and rows verify only their own drafts.
- ``policy="cumulative"`` (the same idea as SpecDec++'s stopping rule, which bounds the chance
  that *some* draft of the round is rejected): use the product of the top-1 probabilities of the
  round's drafts as the estimate of P(all accepted), and stop once it falls below ``threshold``.
  Drafting token i + 1 only pays off when the round is likely to reach it, so a good threshold is
  near the cost ratio ``c``.
- ``policy="ucb"`` ("BanditSpec: Adaptive Speculative Decoding via Bandit Algorithms", Hou et al.,
  arXiv 2505.15141): UCB1 over the arms ``gammas`` (default 1, 2, 4, 6, 8). The reward of a step is
  the tokens emitted per unit of cost, ``(n + 1) / (1 + gamma * c)`` with ``c = cost_ratio``,
  scaled into [0, 1] by its best possible value ``(gamma + 1) / (1 + gamma * c)`` over the arms.

Both stay exact: the draft length is decided from the draft's side (and from past steps) before
the target is called, and verification is the one of :mod:`refimpl.speculative`: greedy gives
the autoregressive greedy tokens, sampling gives the target's distribution.

The decoding loop is :func:`refimpl.speculative.decode` with a :class:`refimpl.speculative.DraftModel`
proposer (slot caches, verification kernels whose ``valid`` argument holds each row's draft
length, roll-back); this module only supplies the draft-length policies.
"""
from __future__ import annotations

import math

import torch

from .generation import Generation, check_positive_int, preset_options, required
from .speculative import DraftModel, decode

POLICIES = ("threshold", "cumulative", "ucb")


class UCB:
    """UCB1 over draft lengths: play each arm once, then the arm maximising mean + sqrt(2 ln t / n).

    A draft-length policy of :class:`refimpl.speculative.DraftModel` (``cap`` = the chosen arm)."""

    confidence = False

    def __init__(self, gammas=(1, 2, 4, 6, 8), cost_ratio: float = 0.2, explore: float = 1.0):
        if not gammas or any(isinstance(g, bool) or not isinstance(g, int) or g < 1 for g in gammas):
            raise ValueError(f"gammas must be a non-empty list of integers >= 1, got {gammas!r}")
        if not isinstance(cost_ratio, (int, float)) or cost_ratio < 0:
            raise ValueError(f"cost_ratio must be >= 0, got {cost_ratio!r}")
        self.gammas, self.c, self.explore = list(gammas), float(cost_ratio), explore
        self.best = max((g + 1) / (1 + g * self.c) for g in self.gammas)
        self.n = [0] * len(self.gammas)
        self.total = [0.0] * len(self.gammas)
        self.arm = 0

    def choose(self) -> int:
        for i, n in enumerate(self.n):
            if n == 0:
                self.arm = i
                return self.gammas[i]
        t = sum(self.n)
        ucb = [s / n + self.explore * math.sqrt(2 * math.log(t) / n) for s, n in zip(self.total, self.n)]
        self.arm = max(range(len(ucb)), key=ucb.__getitem__)
        return self.gammas[self.arm]

    def update(self, emitted: float, gamma: int) -> None:
        """Reward the last chosen arm with ``emitted`` tokens (mean over rows) for a ``gamma`` step."""
        self.n[self.arm] += 1
        self.total[self.arm] += emitted / (1 + gamma * self.c) / self.best

    def cap(self) -> int:
        return self.choose()

    def stop(self, g: int, conf: torch.Tensor, stop: torch.Tensor) -> torch.Tensor:
        return stop

    def means(self) -> dict:
        return {g: (s / n if n else float("nan")) for g, s, n in zip(self.gammas, self.total, self.n)}


class Confidence:
    """Stop a row's drafting once the draft is unsure (``policy`` "threshold" or "cumulative")."""

    confidence = True

    def __init__(self, policy: str, threshold: float, max_gamma: int):
        self.policy, self.threshold, self.max_gamma = policy, threshold, max_gamma
        self.cum = None

    def cap(self) -> int:
        return self.max_gamma

    def stop(self, g: int, conf: torch.Tensor, stop: torch.Tensor) -> torch.Tensor:
        """After draft token ``g``: rows still drafting whose draft is unsure stop at ``g``."""
        self.cum = conf if g == 1 else self.cum * conf  # (b,) estimated P(every draft so far accepted)
        score = conf if self.policy == "threshold" else self.cum
        unsure = (score < self.threshold) & (stop > g)
        return torch.where(unsure, torch.full_like(stop, g), stop)

    def update(self, emitted: float, g: int) -> None:
        pass


#: named configurations (:func:`refimpl.generation.preset_options`): ``"cpu"``, the policy measured
#: fastest with the zoo's SmolLM2 draft (``bench_results/capstone/``): stop once the estimated chance
#: that every draft so far is accepted falls below 5%; ``"confidence"``, the per-token rule of
#: chapter 04b (stop at a draft token whose top-1 probability is below 0.6)
PRESETS = {"cpu": {"policy": "cumulative", "threshold": 0.05, "max_gamma": 8},
           "confidence": {"policy": "threshold", "threshold": 0.6, "max_gamma": 8}}


def generate(target, prompts, draft=None, max_gamma: int | None = None, threshold: float | None = None,
             max_new_tokens: int = 64, temperature: float = 0.0, top_k: int | None = None,
             top_p: float | None = None, generator: torch.Generator | None = None, eos_token_id=None,
             policy: str | None = None, gammas=(1, 2, 4, 6, 8), cost_ratio: float = 0.2, bandit: UCB | None = None,
             preset: str | None = None) -> Generation:
    """Speculative decoding of a ragged batch with an adaptive number of drafts per step.

    ``policy="threshold"``: draft until the draft's top-1 probability falls below ``threshold``
    (the low-confidence token is still proposed), at most ``max_gamma`` tokens.
    ``policy="cumulative"``: draft until the product of the round's top-1 probabilities falls below
    ``threshold``.
    ``policy="ucb"``: a :class:`UCB` bandit over ``gammas`` picks each step's length (pass
    ``bandit`` to keep its statistics across calls). Other arguments as
    :func:`refimpl.speculative.generate`. ``stats.extra["gammas"]`` lists each step's draft calls,
    ``stats.extra["mean_gamma"]`` the mean draft length per row and step. ``policy``, ``threshold``
    and ``max_gamma`` left None come from ``preset`` (:data:`PRESETS`).
    """
    required(draft, "draft", "adaptive")
    o = preset_options(PRESETS, preset, target, policy=policy, threshold=threshold, max_gamma=max_gamma)
    policy, threshold, max_gamma = o["policy"], o["threshold"], o["max_gamma"]
    check_positive_int("max_gamma", max_gamma)
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    if not isinstance(threshold, (int, float)) or not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold must be in [0, 1], got {threshold!r}")
    if policy == "ucb":
        rule = bandit if bandit is not None else UCB(gammas, cost_ratio)
    else:
        rule = Confidence(policy, threshold, max_gamma)
    g = decode(target, DraftModel(draft, rule, target), prompts, max_new_tokens, temperature, top_k, top_p,
               generator, eos_token_id)
    if policy == "ucb":
        g.stats.extra["bandit_means"] = rule.means()
    return g
