"""A diffusion LM as the drafter of an autoregressive target, on the shared verification core.

Papers: "Speculative Diffusion Decoding: Accelerating Language Generation through Diffusion"
(Christopher et al., arXiv 2408.05636) and "DiffuSpec: Unlocking Diffusion Language Models for
Speculative Decoding" (arXiv 2510.02358): a dLLM proposes a whole block of gamma tokens in one
(or a few) denoising steps; the AR target verifies them with the usual rule
(:mod:`refimpl.speculative`, Leviathan et al. arXiv 2211.17192 Algorithm 1).

The drafter is ``tiny-bdlm`` (:mod:`refimpl.block_diffusion`): after the committed prefix it
sees a block of gamma MASKs; one forward gives, for every draft position ``i``, the dLLM's
*marginal* ``q_i`` given the prefix (the first from the clean last token, the others from the
block's slots). With ``draft_steps=1`` every draft token is drawn from its marginal, independently.
That is a legitimate draft distribution for speculative sampling: token ``i`` is drawn from a
``q_i`` that depends only on what precedes it (here: only on the prefix), and the rule
``min(1, p_i / q_i)`` with the residual ``norm(max(0, p_i - q_i))`` needs exactly that ``q_i``,
so the output is distributed exactly as the target's own sampling. ``draft_steps=s > 1``
commits the block left to right in ``s`` chunks, each chunk drawn from marginals that also
condition on the chunks before it: still only on what precedes each token, still lossless.
(Committing by confidence in any order, as a dLLM sampler would, is *not*: a token would then
be drawn from a q that depends on a later token.)

The drafter keeps its own exact KV cache of the committed tokens (a :class:`SlotCache`); each
proposal feeds what it has not seen (the tokens accepted last step and the correction) together
with the block of MASKs in one call, and keeps only the committed tokens' keys/values.
"""
from __future__ import annotations

import torch

from kernels.verify_greedy import argmax

from . import sampling
from .block_diffusion import block_predictions, block_step
from .diffusion_steps import num_transfer_tokens
from .generation import Generation, check_positive_int, preset_options, required
from .primitives import left_pad
from .speculative import Needs, Proposal, Proposer, Sampling, SlotCache, Verdict, check_same_tokenizer, decode


class DiffusionDraft(Proposer):
    """Proposer: ``dlm`` (a block-diffusion LM) drafts ``gamma`` tokens in ``draft_steps`` forwards."""

    def __init__(self, dlm, gamma: int, draft_steps: int, target=None):
        self.gamma = check_positive_int("gamma", gamma)
        self.draft_steps = check_positive_int("draft_steps", draft_steps)
        if draft_steps > gamma:
            raise ValueError(f"draft_steps ({draft_steps}) must be at most gamma ({gamma})")
        if not isinstance(getattr(dlm, "mask_token_id", None), int):
            raise ValueError("dlm must be a block-diffusion LM with a mask_token_id (e.g. models.load('tiny-bdlm'))")
        if target is not None:
            check_same_tokenizer(target, dlm)
        self.dlm, self.max_length = dlm, dlm.max_length

    def start(self, ids, mask, settings: Sampling) -> Needs:
        dev = self.dlm.device
        self.settings, self.sc = settings, SlotCache(self.dlm, ids.shape[0], dev)
        self.pending, self.pmask = ids.to(dev), None if mask is None else mask.to(dev)  # left-padded
        return Needs(max_length=self.max_length)

    def propose(self, caps: list[int]) -> Proposal:
        dev, s, mask_id = self.dlm.device, self.settings, self.dlm.mask_token_id
        b = len(caps)
        g = self.g = min(self.gamma, max(caps))
        valid = torch.tensor([min(g, c) for c in caps], device=dev)  # (b,)
        if g == 0:
            return Proposal(self.pending.new_zeros((b, 0)), valid, None, calls=0)
        x = torch.full((b, g), mask_id, dtype=torch.long, device=dev)  # (b, g) the block, all MASK
        q = None if s.greedy else torch.zeros(b, g, self.dlm.vocab_size, device=dev)  # (b, g, V)
        chunks = num_transfer_tokens(torch.tensor([g], device=dev), min(self.draft_steps, g))[0].tolist()
        lo, calls, first = 0, 0, None
        for k in chunks:  # left to right: chunk i conditions only on the prefix and chunks < i
            lp, lb = block_step(self.sc, self.pending, self.pmask, x)
            calls += 1
            if self.pending.shape[1]:
                first = lp[:, -1]  # (b, V) left padding: the last column is every row's last real token
                self.pending, self.pmask = self.pending[:, :0], None
            logits = block_predictions(first, lb)[:, lo:lo + k]  # (b, k, V)
            logits[..., mask_id] = float("-inf")
            if s.greedy:
                x[:, lo:lo + k] = argmax(logits)
            else:
                q[:, lo:lo + k] = s.probs(logits)
                x[:, lo:lo + k] = sampling.sample_from_probs(q[:, lo:lo + k], s.generator)
            lo += k
        return Proposal(x, valid, q, calls=calls)

    def accept(self, v: Verdict) -> None:
        nxt = v.next.to(self.dlm.device)
        if self.g == 0:  # nothing was fed: the old pending tokens are still unprocessed
            fm = self.pmask if self.pmask is not None else torch.ones_like(self.pending)
            self.pending = torch.cat([self.pending, nxt[:, None]], 1)
            self.pmask = torch.cat([fm, torch.ones_like(fm[:, :1])], 1)
            return
        self.pending, pm = left_pad(v.committed, self.dlm.pad_token_id, self.dlm.device)  # (b, max n + 1)
        self.pmask = None if len(set(v.n_list)) == 1 else pm

    def select(self, rows: torch.Tensor) -> None:
        rows = rows.to(self.dlm.device)
        self.sc.select(rows)
        self.pending = self.pending[rows]
        self.pmask = None if self.pmask is None else self.pmask[rows]


#: named configurations (:func:`refimpl.generation.preset_options`): ``"cpu"``, one denoising step
#: for 4 drafts (the faster row on ``tiny`` in ``bench_results/capstone/``); ``"two_steps"``, 8 drafts
#: in 2 steps (more tokens a call, more draft work)
PRESETS = {"cpu": {"gamma": 4, "draft_steps": 1}, "two_steps": {"gamma": 8, "draft_steps": 2}}


def generate(target, prompts, dlm=None, gamma: int | None = None, max_new_tokens: int = 64, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, generator: torch.Generator | None = None,
             eos_token_id=None, draft_steps: int | None = None, preset: str | None = None) -> Generation:
    """Speculative decoding of ``target`` with the block-diffusion ``dlm`` drafting ``gamma`` tokens
    per step in ``draft_steps`` forwards (each None: ``preset``'s, :data:`PRESETS`). Greedy: exactly
    ``autoregressive.generate``'s tokens; sampling: distributed exactly as sampling from ``target``
    (see the module doc)."""
    required(dlm, "dlm", "dllm_draft")
    o = preset_options(PRESETS, preset, target, gamma=gamma, draft_steps=draft_steps)
    gamma, draft_steps = o["gamma"], o["draft_steps"]
    return decode(target, DiffusionDraft(dlm, gamma, draft_steps, target), prompts, max_new_tokens, temperature,
                  top_k, top_p, generator, eos_token_id)
