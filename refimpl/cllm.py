"""Consistency LLMs (chapter 15): fine-tune an AR model so that Jacobi decoding jumps to the fixed point.

Paper: Kou et al., "CLLMs: Consistency Large Language Models", arXiv 2403.00835.

- §3.1, trajectory collection: for a context ``x`` and an ``n``-token block ``y^(0)`` of initial
  guesses, greedy Jacobi iterates ``y^(j+1)_i = argmax p(. | x, y^(j)_<i)`` for every ``i`` at
  once until nothing changes. The states ``y^(0), y^(1), ..., y*`` are the *Jacobi trajectory*;
  the fixed point ``y*`` is the greedy continuation of ``x``, and the paper appends it to ``x``
  and collects the next block the same way.
- §3.2, eq. 4, the *global consistency* loss: for a random state ``y`` of a trajectory,
  ``L_GC = sum_i D( q_{theta^-}(. | x, y*_<i) || q_theta(. | x, y_<i) )``: the model reading the
  (partly wrong) state should predict what it predicts reading the fixed point. ``theta^-`` is
  the model itself with the gradient stopped; ``D`` a forward KL per position, summed over the
  block. Eq. 5, the *local* variant, puts the next state ``y^(j+1)`` where ``y*`` is.
- §3.2, the AR loss ``L_AR = -sum_i log q_theta(l_i | x, l_<i)`` keeps the model's text where it
  was; here ``l`` is the original model's own greedy text ``y*`` (self-distillation: the fine-tuned
  model's greedy output should stay close to the original's). Total ``L = L_GC + w * L_AR``.

Where the authors' release (hao-ai-lab/Consistency_LLM, ``cllm/cllm_trainer_global.py`` and
``data/generate_trajectory.py``) differs from ours, each kept as ours and named here (``recipe="upstream"``
of :func:`cllm_loss` is theirs for the loss; measured in ``bench_results/learned/upstream_variants/``):

- *Which positions the consistency loss counts.* Upstream masks every prediction before the first
  token where the state differs from the fixed point (the converged prefix, :func:`unconverged_mask`);
  we sum over the whole block, as eq. 4 is written. With ``theta^-`` as the teacher the prefix terms are
  zero anyway; with the frozen original (the zoo's teacher) they are a KL to the original on the fixed
  point's context, a distillation term that holds the text near the original's.
- *Averaging and weights.* Upstream's consistency loss is a per-token mean over the counted positions
  and its AR loss a per-token mean weighted 10, so an AR token weighs ~10 consistency tokens; ours sums
  the KL over the block's 16 positions and weighs a per-token AR mean by 8, i.e. 0.5 per token. We keep
  ours because it measured better on ``tiny`` (the whole upstream recipe against ours, 400 steps on the
  same trajectories: 1.41 against 2.50 Jacobi tokens per call, held-out perplexity 121 against 99).
- *The AR loss.* Upstream: label-smoothed (0.1) NLL of the whole sequence (prompt and every block so
  far, the teacher's output), ``x 10`` (:func:`sequence_ar_loss`); ours: the plain NLL of this block's
  fixed point given its context (:func:`ar_loss`), the part of the text the consistency loss moves.
- *Trajectories.* Upstream inserts augmented states (a wrong token of an intermediate state replaced
  by the fixed point's) and drops low-quality (repetitive) generations before training, and the
  stored version of its collection script draws each Jacobi update from the top-2 tokens; ours are
  plain greedy trajectories, neither augmented nor filtered: the King James contexts give no
  degenerate answers to filter, and greedy is the decoding the model is then measured with.

A fine-tuned model is a *different* model: Jacobi and lookahead decoding of it are still exact
(the verification core checks every guess), exact with respect to its own greedy output. How far
that output moved from the original's is measured, not assumed (``refimpl.bench``'s CLLM rows:
perplexity under the original, :func:`agreement` with its greedy text, repeated n-grams).

:func:`interpolate` walks the line between the two models without training: the weights
``theta_0 + alpha (theta_1 - theta_0)`` (WiSE-FT: Wortsman et al., "Robust fine-tuning of zero-shot
models", arXiv 2109.01903, §2, eq. 1), a model whose text and whose Jacobi speed both lie between
the original's and the fine-tune's (measured in docs/learned-parallel.md: the speed-quality front).
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .generation import check_positive_int
from .lm import LM


def check_block(context: torch.Tensor, block: torch.Tensor, name: str = "block") -> None:
    if context.dim() != 2 or block.dim() != 2 or context.shape[0] != block.shape[0]:
        raise ValueError(f"context (B, L) and {name} (B, n) must be 2-D with the same rows; "
                         f"got {tuple(context.shape)} and {tuple(block.shape)}")
    if context.shape[1] == 0 or block.shape[1] == 0:
        raise ValueError(f"context and {name} must be non-empty; got {tuple(context.shape)} and {tuple(block.shape)}")


def block_logits(model, context: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
    """(B, n, V): position ``i`` of the block predicted from ``[context, block_<i]`` in one call.

    ``model(input_ids) -> object with .logits`` (a Hugging Face causal LM); context (B, L) and
    block (B, n) are token ids on the model's device, every row the same length (no padding).
    """
    check_block(context, block)
    L, n = context.shape[1], block.shape[1]
    ids = torch.cat([context, block[:, :-1]], 1)  # (B, L + n - 1): the last block token predicts nothing here
    return model(input_ids=ids).logits[:, L - 1: L - 1 + n]  # (B, n, V)


@torch.no_grad()
def jacobi_trajectory(model, context: torch.Tensor, init: torch.Tensor) -> torch.Tensor:
    """Greedy Jacobi on a fixed block (§3.1): the states ``y^(0) = init, y^(1), ..., y*``, (S, B, n).

    Every row reaches its fixed point within ``n`` iterations (position ``j`` is final after
    ``j + 1``: its context is then all final); the loop stops once no row changes, so the last
    state is every row's fixed point = its greedy continuation of ``context``.
    """
    check_block(context, init, "init")
    states = [init]
    for _ in range(init.shape[1]):
        new = block_logits(model, context, states[-1]).argmax(-1)  # (B, n): every position updated at once
        if torch.equal(new, states[-1]):
            break
        states.append(new)
    return torch.stack(states)  # (S, B, n)


def context_guesses(context: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
    """(B, n) initial guesses: tokens drawn uniformly from each row's context, as
    :class:`refimpl.jacobi.Jacobi` draws its fresh guesses (draws on the host, rows on ``context``'s device)."""
    B, L = context.shape
    picks = torch.randint(0, L, (B, n), generator=generator, device="cpu").to(context.device)
    return context.gather(1, picks)


@dataclass
class Trajectories:
    """Collected Jacobi trajectories: for block ``b``, ``contexts[b]`` (B, L_b) and ``states[b]``
    (S_b, B, n) whose last state is the fixed point (``contexts[b + 1]`` = context + fixed point)."""

    contexts: list[torch.Tensor]
    states: list[torch.Tensor]

    def sample(self, generator: torch.Generator, local: bool = False):
        """One training batch: a random block, for each row a random non-final state ``y`` and its
        target (the fixed point, or with ``local`` the next state) -> (context, y, target, fixed)."""
        b = int(torch.randint(0, len(self.states), (1,), generator=generator, device="cpu"))
        st, ctx = self.states[b], self.contexts[b]
        S, B = st.shape[0], st.shape[1]
        j = torch.randint(0, max(S - 1, 1), (B,), generator=generator, device="cpu").to(st.device)  # (B,)
        rows = torch.arange(B, device=st.device)
        nxt = torch.clamp(j + 1, max=S - 1)
        return ctx, st[j, rows], (st[nxt, rows] if local else st[-1]), st[-1]


@torch.no_grad()
def collect(model, contexts: torch.Tensor, n: int, blocks: int, generator: torch.Generator,
            student=None) -> Trajectories:
    """§3.1: ``blocks`` consecutive n-token blocks after each context (B, L), each block's
    trajectory (``model``'s) from :func:`context_guesses`, the fixed point appended before the next block.

    ``student``: a second model (``model(input_ids) -> .logits``) whose *own* greedy block is appended
    instead, so the later blocks' contexts are the text the student writes while the trajectories and
    fixed points stay ``model``'s: on-policy contexts (ours for CLLMs; the idea of DAgger, Ross et al.,
    arXiv 1011.0686, §3, and of on-policy distillation, GKD, Agarwal et al., arXiv 2306.13649, §3). A
    student trained only on the teacher's text never sees its own drift; here it learns the teacher's
    next tokens and jumps from there (chapter 15 measures what it buys)."""
    check_positive_int("n", n)
    check_positive_int("blocks", blocks)
    ctxs, states = [], []
    ctx = contexts
    for _ in range(blocks):
        st = jacobi_trajectory(model, ctx, context_guesses(ctx, n, generator))
        ctxs.append(ctx)
        states.append(st)
        # the student's greedy block = its Jacobi fixed point, started from the teacher's (fewer iterations)
        own = st[-1] if student is None else jacobi_trajectory(student, ctx, st[-1])[-1]  # (B, n)
        ctx = torch.cat([ctx, own], 1)
    return Trajectories(ctxs, states)


def frontier_mask(state: torch.Tensor, target: torch.Tensor, horizon: int | None) -> torch.Tensor:
    """(B, n) bool: the block positions whose prediction reads at most ``horizon`` state tokens from
    the first wrong one on, ``i <= f + horizon`` with ``f`` = the first ``i`` where
    ``state_i != target_i`` (``n`` when none). ``None`` keeps every position (the paper's loss).

    The idea (ours, not the paper's): Jacobi decoding cashes the predictions just past the converged
    prefix first, and deep in a state of random guesses the fixed point looks out of reach. Measured
    on ``tiny`` (docs/learned-parallel.md, chapter 15) it does not pay: the text stays put but the tokens per call stop
    at ~1.7 (2.6 with every position), so the jumps are learned from the deep positions too.
    """
    B, n = state.shape
    if horizon is None:
        return torch.ones(B, n, dtype=torch.bool, device=state.device)
    if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 0:
        raise ValueError(f"horizon must be None or an integer >= 0, got {horizon!r}")
    wrong = state != target  # (B, n)
    first = torch.where(wrong.any(1), wrong.int().argmax(1), torch.full((B,), n, device=state.device))  # (B,)
    return torch.arange(n, device=state.device)[None, :] <= first[:, None] + horizon  # (B, n)


def consistency_loss(model, context: torch.Tensor, state: torch.Tensor, target: torch.Tensor,
                     teacher=None, horizon: int | None = None) -> torch.Tensor:
    """Eq. 4 (``target`` = the fixed point) or eq. 5 (``target`` = the next state): the forward KL
    ``D(q_teacher(. | x, target_<i) || q_theta(. | x, state_<i))`` summed over the block's ``n``
    positions, averaged over rows. ``teacher`` None = the model itself with the gradient stopped
    (``theta^-``, as in the paper); a frozen model may be passed instead. ``horizon``: sum only over
    the positions of :func:`frontier_mask` (ours, measured in chapter 15; None = every position)."""
    check_block(context, state, "state")
    if target.shape != state.shape:
        raise ValueError(f"target must have state's shape {tuple(state.shape)}; got {tuple(target.shape)}")
    keep = frontier_mask(state, target, horizon)  # (B, n)
    with torch.no_grad():
        t = F.log_softmax(block_logits(model if teacher is None else teacher, context, target).float(), -1)  # (B, n, V)
    s = F.log_softmax(block_logits(model, context, state).float(), -1)  # (B, n, V)
    return ((t.exp() * (t - s)).sum(-1) * keep).sum(-1).mean()


def ar_loss(model, context: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
    """§3.2's AR loss: mean NLL of ``text`` (B, n) given ``context`` (B, L), token by token."""
    logits = block_logits(model, context, text).float()  # (B, n, V)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), text.reshape(-1))


def unconverged_mask(state: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(B, n) bool: the block positions from the first one where ``state`` differs from ``target`` on
    (none when they are equal): upstream's consistency mask (``cllm_trainer_global.py`` masks every
    prediction of a token before the first wrong one: the converged prefix)."""
    B, n = state.shape
    wrong = state != target  # (B, n)
    first = torch.where(wrong.any(1), wrong.int().argmax(1), torch.full((B,), n, device=state.device))  # (B,)
    return torch.arange(n, device=state.device)[None, :] >= first[:, None]


def upstream_consistency_loss(model, context: torch.Tensor, state: torch.Tensor, target: torch.Tensor,
                              teacher=None) -> torch.Tensor:
    """hao-ai-lab/Consistency_LLM's global consistency loss: the forward KL of eq. 4 (the same gradient
    as its soft cross-entropy) on the :func:`unconverged_mask` positions only, averaged over those
    positions of the whole batch (a per-token mean; 0 when every row has converged)."""
    check_block(context, state, "state")
    if target.shape != state.shape:
        raise ValueError(f"target must have state's shape {tuple(state.shape)}; got {tuple(target.shape)}")
    keep = unconverged_mask(state, target)  # (B, n)
    with torch.no_grad():
        t = F.log_softmax(block_logits(model if teacher is None else teacher, context, target).float(), -1)
    s = F.log_softmax(block_logits(model, context, state).float(), -1)  # (B, n, V)
    return ((t.exp() * (t - s)).sum(-1) * keep).sum() / keep.sum().clamp(min=1)


def sequence_ar_loss(model, context: torch.Tensor, text: torch.Tensor, smoothing: float = 0.1) -> torch.Tensor:
    """Upstream's AR loss: the label-smoothed (``smoothing``, Hugging Face's ``LabelSmoother``, the
    same as torch's ``label_smoothing``) mean NLL of every token of ``[context ; text]`` after the first."""
    seq = torch.cat([context, text], 1)  # (B, L + n)
    logits = model(input_ids=seq).logits[:, :-1].float()  # (B, L + n - 1, V)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), seq[:, 1:].reshape(-1), label_smoothing=smoothing)


def cllm_loss(model, batch, ar_weight: float = 1.0, teacher=None, horizon: int | None = None,
              recipe: str = "ours") -> tuple[torch.Tensor, dict]:
    """``L = L_consistency + ar_weight * L_AR`` on one :meth:`Trajectories.sample` batch. ``recipe``
    ``"ours"``: :func:`consistency_loss` (summed over the block) and :func:`ar_loss` (the block's fixed
    point); ``"upstream"``: :func:`upstream_consistency_loss` and :func:`sequence_ar_loss` (the module
    doc: what differs and why)."""
    if ar_weight < 0:
        raise ValueError(f"ar_weight must be >= 0, got {ar_weight}")
    if recipe not in ("ours", "upstream"):
        raise ValueError(f"recipe must be 'ours' or 'upstream', got {recipe!r}")
    context, state, target, fixed = batch
    if recipe == "upstream":
        if horizon is not None:
            raise ValueError("horizon applies to recipe='ours' only")
        lc = upstream_consistency_loss(model, context, state, target, teacher)
        la = sequence_ar_loss(model, context, fixed)
    else:
        lc = consistency_loss(model, context, state, target, teacher, horizon)
        la = ar_loss(model, context, fixed)
    return lc + ar_weight * la, {"consistency": float(lc.detach()), "ar": float(la.detach())}


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Fraction of positions where two generations of the same prompts hold the same token (how far a
    fine-tuned model's text moved from the original's; positions past the shorter row count as different)."""
    same = sum(sum(x == y for x, y in zip(r, s)) for r, s in zip(a, b))
    return same / max(sum(max(len(r), len(s)) for r, s in zip(a, b)), 1)


def interpolate(base: LM, tuned: LM, alpha: float) -> LM:
    """A new :class:`LM` with the weights ``base + alpha (tuned - base)`` (WiSE-FT, arXiv 2109.01903,
    eq. 1): ``alpha = 0`` is ``base``, ``1`` is ``tuned``. Both must be the same architecture (same
    parameter names and shapes, e.g. ``tiny`` and ``tiny-cllm``), loaded as plain :class:`LM` s
    (``models.load(name, prepack=False)``); pass the result to ``models.accelerate`` for the fast paths."""
    for arg, lm in (("base", base), ("tuned", tuned)):
        if type(lm) is not LM:
            raise ValueError(f"{arg} must be a plain refimpl.lm.LM (models.load(name, prepack=False)), "
                             f"got {type(lm).__name__}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be a number in [0, 1], got {alpha!r}")
    b, t = base.model.state_dict(), tuned.model.state_dict()
    if b.keys() != t.keys() or any(b[k].shape != t[k].shape for k in t):
        raise ValueError(f"base ({base.name}) and tuned ({tuned.name}) must have the same parameter names and shapes")
    model = copy.deepcopy(tuned.model)
    model.load_state_dict({k: torch.lerp(b[k].to(t[k]), t[k], float(alpha)) if t[k].is_floating_point() else t[k]
                           for k in t})
    return LM(model, tuned.tokenizer, name=f"{tuned.name} x{alpha:g} + {base.name}")
