"""Certainty-forcing distillation (chapter 15): a block-diffusion LM taught to be sure early.

Paper: Chen et al., "dParallel: Learnable Parallel Decoding for dLLMs", arXiv 2509.26488, §3.

Why threshold decoding (Fast-dLLM's rule, :mod:`refimpl.block_diffusion`) rarely fires on
``tiny-bdlm``: a masked token's confidence only rises once its neighbours are committed, one by
one (the paper's *sequential certainty convergence*). dParallel distils the model on its own
one-token-per-step trajectories so that it is confident about *every* masked token of a state at
once, while following the same trajectory (so its text stays the teacher's):

- **trajectories** (:func:`record`): the teacher decodes blocks one token per step, committing
  the most confident masked position (low-confidence remasking, greedy); we keep each block's
  final tokens ``y*`` and the step ``order[i]`` at which position ``i`` was committed. The state
  after ``s`` steps shows the positions with ``order < s`` and MASK elsewhere.
- **the loss** (:func:`certainty_forcing_loss`, eq. 3-5): on a state ``y^s`` of a trajectory,
  ``L = CE(p_theta(. | x, y^s), y*)`` over the masked positions (the teacher's committed tokens as
  targets for *every* masked position, not just the next one to be committed) ``+ beta * H``,
  where ``H`` is the mean entropy ``-sum_v p log p`` of the student's distribution (at temperature
  ``tau``) on the masked positions it already predicts correctly (argmax == ``y*``): certainty is
  forced only where it would be right, so a confident wrong token is never encouraged.

**Where the release differs** (czg1225/dParallel ``LLaDA/llada_train.py``, ``Dream/dream_train.py``;
measured in ``bench_results/learned/upstream_variants/``). Upstream trains on the teacher's final
responses, one random block per sequence (LLaDA: 32 tokens; Dream: the whole response) with each token
masked independently at p = 0.5, plus a second pass on the complementary mask (every masked token shown
and every shown token masked), ``CE + CE_rev + w * (H + H_rev)`` with ``w`` 2 (LLaDA) or 1 (Dream)
(:func:`random_states`, :func:`complementary_loss`, the trainer's ``states="upstream"``). Our states are
the *prefixes of the teacher's commit order* (:meth:`Trajectories.sample`): the positions the teacher
committed first are the ones shown, so every state is one the teacher's own sampler passes through, which
is the path threshold decoding of the student follows too; the final tokens are the same teacher output.
``rounds`` > 1 (re-recording with the student) is ours as well. On ``tiny-bdlm`` (one round, 300 steps,
the same recorded blocks) the two tie: 24.5 (ours) and 25.0 (upstream) calls per 32 tokens at threshold
0.9, the text's perplexity under ``tiny`` 6.79 and 6.09, at 1.7x the CPU per step for upstream's two passes.

The row layout is the block-diffusion model's (shifted predictions, exact block cache): a context
of ``L`` committed tokens attends causally; the block's ``b`` slots see the whole context and the
whole block. Output ``L - 1`` predicts the block's first token, block slot ``i`` predicts token
``i + 1``. The distilled model decodes with :func:`refimpl.block_diffusion.generate` unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .diffusion_steps import denoise_step
from .generation import check_positive_int
from .primitives import additive


def block_allow(L: int, b: int, device) -> torch.Tensor:
    """(L + b, L + b) bool: the context causal, every block slot sees the context and the block."""
    n = L + b
    allow = torch.ones(n, n, dtype=torch.bool, device=device).tril()
    allow[L:, L:] = True
    return allow


def block_logits(model, context: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
    """(B, b, V) predictions of the block's tokens from ``[context ; block]`` in one call (the shift:
    output ``L - 1`` predicts token 0, slot ``i`` predicts token ``i + 1``). context (B, L), block
    (B, b) with MASK where undecided; ``model`` a Hugging Face causal LM taking 4-D masks."""
    if context.dim() != 2 or block.dim() != 2 or context.shape[0] != block.shape[0] or not context.shape[1] \
            or not block.shape[1]:
        raise ValueError(f"context (B, L) and block (B, b) must be non-empty 2-D with the same rows; "
                         f"got {tuple(context.shape)} and {tuple(block.shape)}")
    (B, L), b = context.shape, block.shape[1]
    allow = block_allow(L, b, context.device).expand(B, L + b, L + b)
    logits = model(input_ids=torch.cat([context, block], 1),
                   attention_mask=additive(allow, next(model.parameters()).dtype)).logits  # (B, L + b, V)
    return logits[:, L - 1: L - 1 + b]


@dataclass
class Trajectories:
    """One-token-per-step trajectories: for block ``k``, ``contexts[k]`` (B, L_k), ``final[k]`` (B, b)
    the committed tokens, ``order[k]`` (B, b) the step at which each was committed (0..b-1)."""

    contexts: list[torch.Tensor]
    final: list[torch.Tensor]
    order: list[torch.Tensor]

    def state(self, k: int, step: torch.Tensor, mask_id: int) -> torch.Tensor:
        """(B, b) the state of block ``k`` after ``step`` (B,) steps: committed tokens, MASK elsewhere."""
        shown = self.order[k] < step[:, None]
        return torch.where(shown, self.final[k], torch.full_like(self.final[k], mask_id))

    def sample(self, generator: torch.Generator, mask_id: int):
        """A training batch: a random block, a random step per row -> (context, state, final)."""
        k = int(torch.randint(0, len(self.final), (1,), generator=generator, device="cpu"))
        B, b = self.final[k].shape
        step = torch.randint(0, b, (B,), generator=generator, device="cpu").to(self.final[k].device)
        return self.contexts[k], self.state(k, step, mask_id), self.final[k]

    def sample_random(self, generator: torch.Generator, mask_id: int, p: float = 0.5):
        """Upstream's states: a random block, each of its tokens masked with probability ``p`` (the
        commit order unused), and the complementary state -> (context, state, complement, final)."""
        k = int(torch.randint(0, len(self.final), (1,), generator=generator, device="cpu"))
        state, comp = random_states(self.final[k], mask_id, generator, p)
        return self.contexts[k], state, comp, self.final[k]


def random_states(final: torch.Tensor, mask_id: int, generator: torch.Generator, p: float = 0.5):
    """(B, b) final tokens -> ``(state, complement)``: each position MASK with probability ``p`` in
    ``state`` (drawn on the host) and MASK exactly where ``state`` shows it in ``complement``
    (dParallel's release, ``forward_process_semi_ar``: ``p`` = 0.5 and the complementary pass)."""
    if not 0 < p < 1:
        raise ValueError(f"p must be in (0, 1), got {p!r}")
    hide = (torch.rand(final.shape, generator=generator, device="cpu") < p).to(final.device)  # (B, b)
    fill = torch.full_like(final, mask_id)
    return torch.where(hide, fill, final), torch.where(hide, final, fill)


@torch.no_grad()
def record(model, contexts: torch.Tensor, mask_id: int, block_length: int, blocks: int) -> Trajectories:
    """Decode ``blocks`` blocks after each context (B, L) one token per step (greedy, most confident
    masked position first, as :func:`refimpl.block_diffusion.generate` with ``steps = gen_length``)
    and record every block's final tokens and commit order."""
    check_positive_int("block_length", block_length)
    check_positive_int("blocks", blocks)
    B, dev = contexts.shape[0], contexts.device
    ctxs, finals, orders = [], [], []
    ctx = contexts
    one = torch.ones(B, dtype=torch.long, device=dev)
    for _ in range(blocks):
        x = torch.full((B, block_length), mask_id, dtype=torch.long, device=dev)  # (B, b)
        order = torch.full_like(x, -1)
        for s in range(block_length):
            masked = x == mask_id
            x0, sel = denoise_step(block_logits(model, ctx, x), masked, mask_id, k=one)  # one commit per row
            x = torch.where(sel, x0, x)
            order[sel] = s
        ctxs.append(ctx)
        finals.append(x)
        orders.append(order)
        ctx = torch.cat([ctx, x], 1)
    return Trajectories(ctxs, finals, orders)


def certainty_forcing_loss(model, context: torch.Tensor, state: torch.Tensor, final: torch.Tensor, mask_id: int,
                           beta: float = 1.0, temperature: float = 0.5) -> tuple[torch.Tensor, dict]:
    """dParallel's loss on states ``state`` (B, b) of trajectories ending at ``final`` (B, b):
    mean cross-entropy of ``final`` on the masked positions ``+ beta *`` mean entropy (at
    ``temperature``) on the masked positions whose argmax is already ``final``. Returns
    ``(loss, {"ce", "entropy", "correct"})``; ``correct`` is the fraction of masked positions right."""
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if state.shape != final.shape:
        raise ValueError(f"state and final must have the same shape; got {tuple(state.shape)} and {tuple(final.shape)}")
    masked = state == mask_id  # (B, b)
    if not bool(masked.any()):
        raise ValueError("state has no masked position to learn from")
    logits = block_logits(model, context, state).float()  # (B, b, V)
    ce = F.cross_entropy(logits[masked], final[masked])
    right = masked & (logits.argmax(-1) == final)  # (B, b)
    logp = F.log_softmax(logits[right] / temperature, -1)  # (R, V)
    ent = -(logp.exp() * logp).sum(-1).mean() if bool(right.any()) else logits.new_zeros(())
    return ce + beta * ent, {"ce": float(ce.detach()), "entropy": float(ent.detach()),
                             "correct": float(right.sum()) / float(masked.sum())}


def complementary_loss(model, context: torch.Tensor, state: torch.Tensor, complement: torch.Tensor,
                       final: torch.Tensor, mask_id: int, beta: float = 1.0,
                       temperature: float = 0.5) -> tuple[torch.Tensor, dict]:
    """Upstream's loss on a :func:`random_states` pair: :func:`certainty_forcing_loss` on ``state`` plus
    the same on ``complement`` (``ce + ce_rev + beta * (H + H_rev)``, each a mean over its own masked
    positions, as dParallel's ``DLMTrainer.compute_loss``)."""
    a, ia = certainty_forcing_loss(model, context, state, final, mask_id, beta, temperature)
    b, ib = certainty_forcing_loss(model, context, complement, final, mask_id, beta, temperature)
    return a + b, {k: (ia[k] + ib[k]) / 2 for k in ia}
