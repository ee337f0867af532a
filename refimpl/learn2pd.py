"""Learn2PD (chapter 15): a small learned filter decides which of a dLLM step's predictions are final.

Paper: Bao et al., "Learning to Parallel: Accelerating Diffusion Large Language Models via Adaptive
Parallel Decoding", arXiv 2509.25188 (the method section: the oracle "extremely greedy parallel"
decoding, the filter model trained to imitate it, and End-of-Text Prediction).

Fast-dLLM's threshold (:mod:`refimpl.block_diffusion`) commits a masked position when the model's
confidence in its current prediction passes a fixed value. Confidence is a poor proxy for the
question that matters: *will this prediction still be the token the model ends up writing here?*
The oracle that commits exactly the positions whose current prediction equals the final text
would need the final text; Learn2PD trains a tiny filter ``f`` to predict it from what the step
already knows:

- **data** (:func:`collect`): replay the one-token-per-step trajectories of
  :func:`refimpl.dparallel.record` state by state; at each state, the block's per-position
  :func:`features` and the label ``argmax == final`` (the teacher's committed token) on every
  masked position.
- **the filter** (:class:`Filter`): an MLP over the whole block's features (so a position sees
  its neighbours' certainty), one logit per position, trained with binary cross-entropy on the
  masked positions (:func:`filter_loss`). For a block of 8 it has 1,064 parameters; training takes
  seconds once the states are collected, and the dLLM stays frozen.
- **decoding** (:class:`FilterRule`, passed as ``rule=`` to :func:`refimpl.block_diffusion.generate`):
  commit the masked positions with ``sigmoid(f) > cutoff`` plus the most confident one (every step
  commits at least one token, as the threshold rule does). The exact block cache is unchanged.

What follows the paper's text and what is ours (its code is not public to compare with). From the
text: the oracle (commit a masked position as soon as its prediction equals the final output), the
filter as a small MLP trained post hoc to predict that per position with binary cross-entropy while the
dLLM stays frozen, confidences as its input, a committed token never remasked, and End-of-Text
Prediction (stop once the end-of-text token is decoded). Ours: the two extra features below, the rule's
"plus the most confident one" (so a step never commits nothing), labels only on masked positions, the
training states (replays of :func:`refimpl.dparallel.record`'s one-token-per-step trajectories, whose
final tokens are the labels' "final output"), the width (``hidden`` 32) and the cutoff 0.5, and EoTP as the
sampler's ``eos_token_id`` stop.

Features per position (the paper feeds the confidences; we add two cheap signals measured to help
on ``tiny-bdlm-dparallel``): confidence ``p_top1``, the gap ``p_top1 - p_top2`` (Prophet's), and
whether the argmax equals the previous step's argmax at the same position (0 at a block's first
step). Committed positions read 1 in every feature. EoTP (stop after the end-of-text token) is the
``eos_token_id`` early stop the sampler already has.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .diffusion_steps import most_confident, never_mask, predict
from .dparallel import Trajectories, block_logits
from .generation import check_positive_int

NUM_FEATURES = 3  # confidence, top-1 - top-2 gap, same argmax as the previous step


def features(predictions: torch.Tensor, masked: torch.Tensor, previous: torch.Tensor | None = None):
    """(B, b, V) block predictions (MASK already at -inf), (B, b) masked, (B, b) previous step's
    argmax or None -> ``(x0 (B, b), conf (B, b) float64, feats (B, 3 b) float32)``; ``conf`` is -inf on
    committed positions (as :func:`refimpl.diffusion_steps.predict`), ``feats`` = [conf | gap | same],
    1 on committed positions."""
    p = torch.softmax(predictions.double(), dim=-1)  # (B, b, V)
    top = p.topk(2, dim=-1)
    x0, conf = top.indices[..., 0], top.values[..., 0]  # (B, b)
    gap = top.values[..., 0] - top.values[..., 1]
    same = (x0 == previous).double() if previous is not None else torch.zeros_like(conf)
    one = torch.ones_like(conf)
    feats = torch.cat([torch.where(masked, f, one) for f in (conf, gap, same)], dim=-1).float()  # (B, 3 b)
    return x0, conf.masked_fill(~masked, float("-inf")), feats


class Filter(nn.Module):
    """Learn2PD's filter: (B, 3 b) block features -> (B, b) logits of "this prediction is final"."""

    def __init__(self, block_length: int, hidden: int = 32):
        super().__init__()
        check_positive_int("block_length", block_length)
        check_positive_int("hidden", hidden)
        self.block_length, self.hidden = block_length, hidden
        self.net = nn.Sequential(nn.Linear(NUM_FEATURES * block_length, hidden), nn.ReLU(),
                                 nn.Linear(hidden, block_length))

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        if feats.shape[-1] != NUM_FEATURES * self.block_length:
            raise ValueError(f"feats must have {NUM_FEATURES} x {self.block_length} columns (this filter's "
                             f"block_length), got {tuple(feats.shape)}")
        return self.net(feats)


@dataclass
class FilterData:
    """Training rows, one per (trajectory row, block, step): ``feats`` (N, 3 b), ``labels`` (N, b)
    (1 where the current argmax is the trajectory's final token), ``masked`` (N, b)."""

    feats: torch.Tensor
    labels: torch.Tensor
    masked: torch.Tensor

    def batch(self, size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        idx = torch.randint(0, self.feats.shape[0], (size,), generator=generator, device="cpu")
        return self.feats[idx], self.labels[idx], self.masked[idx]


@torch.no_grad()
def collect(model, traj: Trajectories, mask_id: int) -> FilterData:
    """Replay every block of ``traj`` one state at a time (the state after 0..b-1 commits) through
    ``model`` and record each state's :func:`features` and labels ``argmax == final``."""
    feats, labels, masked = [], [], []
    for k in range(len(traj.final)):
        B, b = traj.final[k].shape
        previous = None
        for s in range(b):
            state = traj.state(k, torch.full((B,), s, device=traj.final[k].device), mask_id)  # (B, b)
            m = state == mask_id
            pred = never_mask(block_logits(model, traj.contexts[k], state), mask_id)  # (B, b, V)
            x0, _, f = features(pred, m, previous)
            previous = x0
            feats.append(f.cpu())
            labels.append((x0 == traj.final[k]).float().cpu())
            masked.append(m.cpu())
    return FilterData(torch.cat(feats), torch.cat(labels), torch.cat(masked))


def filter_loss(filt: Filter, feats: torch.Tensor, labels: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """Mean binary cross-entropy of ``filt(feats)`` against ``labels`` over the masked positions."""
    if not bool(masked.any()):
        raise ValueError("masked has no position to learn from")
    return F.binary_cross_entropy_with_logits(filt(feats)[masked], labels[masked])


class FilterRule:
    """The commit rule for :func:`refimpl.block_diffusion.generate` (``rule=FilterRule(filt, cutoff)``):
    the masked positions whose filter probability exceeds ``cutoff``, plus the most confident masked one.
    (The cutoff is on the filter's probability; Fast-dLLM's ``threshold`` is on the model's confidence.)"""

    def __init__(self, filt: Filter, cutoff: float = 0.5):
        if not isinstance(filt, Filter):
            raise ValueError(f"filt must be a learn2pd.Filter, got {type(filt).__name__}")
        if not isinstance(cutoff, (int, float)) or not 0 < cutoff < 1:
            raise ValueError(f"cutoff must be in (0, 1), got {cutoff!r}")
        self.filt, self.cutoff, self.previous = filt.eval(), float(cutoff), None

    @torch.no_grad()
    def __call__(self, predictions: torch.Tensor, masked: torch.Tensor, step: int):
        if predictions.shape[1] != self.filt.block_length:
            raise ValueError(f"block_length must be the filter's ({self.filt.block_length}), "
                             f"got blocks of {predictions.shape[1]}")
        x0, conf, feats = features(predictions, masked, None if step == 0 else self.previous)
        self.previous = x0
        prob = torch.sigmoid(self.filt(feats.to(next(self.filt.parameters()).device))).to(masked.device)  # (B, b)
        return x0, ((prob > self.cutoff) | most_confident(conf)) & masked


class OracleRule:
    """The oracle Learn2PD's filter imitates (the paper's "extremely greedy parallel" decoding), as a
    commit rule: commit every masked position whose current argmax already equals ``final``, the text
    the same model writes one token per step, plus the most confident one. It needs the answer, so it
    is not a decoder; it measures how few calls this dLLM allows when every commit that keeps its
    one-token-per-step text is taken as soon as it appears (:func:`oracle_generate`). ``final``
    (B, gen_length): one row per prompt, in order."""

    def __init__(self, final):
        final = torch.as_tensor(final, dtype=torch.long, device="cpu")
        if final.dim() != 2 or not final.shape[1]:
            raise ValueError(f"final must be (rows, gen_length) tokens, got shape {tuple(final.shape)}")
        self.final, self.block = final, -1

    @torch.no_grad()
    def __call__(self, predictions: torch.Tensor, masked: torch.Tensor, step: int):
        B, b = masked.shape
        self.block += int(step == 0)  # the sampler restarts ``step`` at every block
        lo = self.block * b
        if B != self.final.shape[0] or lo + b > self.final.shape[1]:
            raise ValueError(f"final has shape {tuple(self.final.shape)}; it must hold {B} rows and a token for "
                             f"every block position (block {lo}:{lo + b})")
        x0, conf = predict(predictions, masked)  # (B, b) each; conf -inf where committed
        right = x0 == self.final[:, lo: lo + b].to(x0.device)
        return x0, (right | most_confident(conf)) & masked


def oracle_generate(decode, dllm, prompts, gen_length: int = 32, block_length: int = 8):
    """Decode ``prompts`` one token per step with the block sampler ``decode``
    (:func:`refimpl.block_diffusion.generate`), then again with :class:`OracleRule` on that text; returns
    the second :class:`refimpl.generation.Generation` (its calls: the oracle's). The filter and the oracle
    are commit rules any such sampler takes (``rule=``)."""
    final = decode(dllm, prompts, gen_length=gen_length, block_length=block_length, eos_token_id=[]).tokens
    return decode(dllm, prompts, gen_length=gen_length, block_length=block_length, eos_token_id=[],
                  rule=OracleRule(final))
