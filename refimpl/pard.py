"""PARD: a draft model that proposes a whole block in ONE forward pass (chapter 15b).

Paper: An et al., "PARD: Accelerating LLM Inference with Low-Cost PARallel Draft Model Adaptation",
arXiv 2504.18583 (code: AMD-AGI/PARD).

- **Parallel drafting (§3.1).** An autoregressive draft spends one forward per draft token. PARD
  appends ``k - 1`` *mask* tokens after the last real token and reads all ``k`` drafts from one
  forward: the last real token's logits give the next token, mask slot ``j`` (at position
  ``last + j``, attending causally to the context and to the masks before it) gives the token ``j + 1``
  ahead. On a memory-bound machine a forward over ``k`` positions costs about one over 1, so the
  draft's cost per step stops growing with ``k``.
- **Training (§3.2).** The draft is an ordinary causal LM adapted with ``K`` copies of every sequence:
  copy 0 is the text (the usual next-token targets), copy ``j`` holds mask tokens, and the mask at
  copy ``j``, position ``p`` sees the real tokens ``0 .. p - j`` and its chain of masks ``(i, p - j + i)``
  for ``i < j``: exactly what slot ``j`` sees while drafting. It predicts token ``p + 1``.
  *Conditional drop-token* (COD) sampling keeps every position of copy 0 and, of copy ``j``, a random
  ``max(r^j, r_min)`` fraction whose chain predecessor was kept (upstream's defaults: 8 copies,
  ``r`` = 0.7, ``r_min`` = 0.2), about 3x less training compute. :func:`training_layout` builds the
  rows; :mod:`refimpl.train.pard` trains ours from the zoo's chain drafts.

Drafting here is a :class:`~refimpl.speculative.Proposer` on the verification core: chains verified
by greedy or lossless speculative sampling (each slot's token drawn from its own distribution ``q_j``,
which does not depend on the other slots: still ``x_j ~ q_j``, so the rule stays lossless), or, with
``topk > 1``, a tree over the slots' top-k (:func:`refimpl.tree.slot_tree`, deterministic children,
SpecInfer's walk). ``stats.draft_calls`` counts one call a step.

Ours against upstream. Upstream draws the mask tokens' ids from unused vocabulary entries and trains
every weight; a zoo draft that shares its target's frozen embedding (SmolLM2's) keeps that embedding,
so the mask token's vector is the target's row for ``mask_id`` and the layers learn to read it.
Upstream trains on ground-truth text with cross-entropy; ours distils the target's distribution at
each predicted position (:mod:`refimpl.train.pard`). vLLM serves it as ``method="draft_model"`` with
``parallel_drafting``, the mask id as the draft config's ``pard_token`` (:mod:`refimpl.export`).
"""
from __future__ import annotations

import torch

from .generation import Generation, check_positive_int, paying_slots, preset_options, required
from .lm import check_vocab
from .primitives import left_pad, unpad
from .slot_cache import SlotCache
from .speculative import Needs, Proposal, Proposer, Sampling, check_same_tokenizer, decode
from .tree import pack, slot_proposal


class PardProposer(Proposer):
    """Proposer: ``draft`` (a causal LM trained for parallel drafting) proposes up to ``k`` tokens a step
    in one call over [the tokens it has not seen, ``mask_id`` x (k - 1)]. ``topk`` > 1: a tree of
    ``total`` nodes over the slots' top-``topk`` (:func:`refimpl.tree.slot_tree`). The draft's cache keeps
    the committed tokens only: the masks' keys are dropped after each call."""

    def __init__(self, draft, mask_id: int, k: int, topk: int, total: int, target=None):
        if target is not None:
            check_same_tokenizer(target, draft)
        if not (isinstance(mask_id, int) and 0 <= mask_id < draft.vocab_size):
            raise ValueError(f"mask_id must be a token id in [0, {draft.vocab_size}), got {mask_id!r}")
        self.draft, self.mask_id = draft, mask_id
        self.k, self.topk, self.total = (check_positive_int(n, v) for n, v in (("k", k), ("topk", topk), ("total", total)))

    def start(self, ids, mask, settings: Sampling) -> Needs:
        self.settings, self.device = settings, ids.device
        self.cache = SlotCache(self.draft, ids.shape[0], self.draft.device)
        self.pending = unpad(ids, mask)  # per row: committed tokens the draft has not processed yet
        return Needs(trees=self.topk > 1, max_length=self.draft.max_length)

    @torch.no_grad()
    def propose(self, caps: list[int]) -> Proposal:
        B, g, dev = len(caps), min(self.k, max(caps)), self.draft.device  # g drafts: the last token's + g - 1 masks
        if g <= 0:
            return pack([([], [])] * B, self.device)
        feed, fmask = left_pad(self.pending, self.draft.pad_token_id, dev)  # (B, F)
        fmask = None if bool(fmask.all()) else fmask
        masks = torch.full((B, g - 1), self.mask_id, dtype=torch.long, device=dev)  # (B, g - 1) the slots
        fm = None if fmask is None else torch.cat([fmask, torch.ones_like(masks)], 1)
        logits = self.cache.feed(torch.cat([feed, masks], 1), fm, keep=g).logits  # (B, g, V): one call
        self.cache.keep_accepted(g - 1, torch.zeros(B, dtype=torch.long, device=dev), [0] * B)  # drop the masks
        self.pending = [[] for _ in range(B)]
        return slot_proposal(logits, caps, self.settings, self.topk, self.total, self.device)

    def accept(self, v) -> None:
        for pending, new in zip(self.pending, v.committed):
            pending += new

    def select(self, rows: torch.Tensor) -> None:
        self.cache.select(rows.to(self.cache.device))
        self.pending = [self.pending[i] for i in rows.tolist()]


def training_layout(ids: torch.Tensor, k: int, keep: float = 1.0, min_keep: float = 0.0, generator=None,
                    first_anchor: int = 0):
    """PARD's ``k`` copies of each sequence ``ids`` (B, T) with conditional drop-token sampling (see the
    module doc) -> ``(slot (N,), pos (N,), allow (N, N) bool)`` over the N kept items, shared by the batch:
    item ``n`` is copy ``slot[n]`` (0 = the real token, ``j`` = the j-th mask) at position ``pos[n]``,
    it attends to the items ``allow[n]`` marks, and it predicts token ``pos[n] + 1`` (the items with
    ``pos + 1 < T`` carry a loss). ``keep`` = ``r``, ``min_keep`` = ``r_min``; 1.0 keeps everything.
    ``first_anchor``: masks only on chains whose last real token (``pos - slot``) is at or after it, so
    that no mask is spent where no loss is taken (a batch of chat rows: the last prompt token of its
    shortest prompt; decoding's chains never start earlier); copy ``j`` keeps ``max(r^j, r_min)`` of the
    ``T - first_anchor`` anchors."""
    T = ids.shape[1]
    if not (isinstance(first_anchor, int) and 0 <= first_anchor < T):
        raise ValueError(f"first_anchor must be a position in [0, {T}), got {first_anchor!r}")
    kept = [list(range(T))]  # copy 0: every position
    for j in range(1, k):
        prev = [p + 1 for p in kept[-1] if first_anchor + j <= p + 1 < T]  # a mask needs its chain predecessor
        n = int((T - first_anchor) * max(keep ** j, min_keep))
        order = torch.randperm(len(prev), generator=generator, device="cpu").tolist() if n < len(prev) else range(len(prev))
        kept.append(sorted(prev[i] for i in list(order)[:n]))
        if not kept[-1]:
            break
    slot = torch.tensor([j for j, ps in enumerate(kept) for _ in ps], dtype=torch.long, device=ids.device)
    pos = torch.tensor([p for ps in kept for p in ps], dtype=torch.long, device=ids.device)
    anchor = pos - slot  # the last real token each item's chain starts from
    real = slot[None, :] == 0
    allow = (real & (pos[None, :] <= anchor[:, None])) | (  # the context up to its anchor
        (slot[None, :] > 0) & (anchor[None, :] == anchor[:, None]) & (slot[None, :] <= slot[:, None]))  # its chain
    return slot, pos, allow


#: the most drafts the ``"cpu"`` preset proposes a step (measured on this repository's CPU targets:
#: ``bench_results/capstone/``)
CPU_SLOTS = 4


def cpu_slots(draft) -> int:
    """The drafts a step the ``"cpu"`` preset proposes with ``draft``: those its held-out acceptance pays
    for (its config's ``heldout_accept``, set by its trainer: :func:`refimpl.generation.paying_slots`), at
    most :data:`CPU_SLOTS`."""
    return paying_slots(getattr(draft.config, "heldout_accept", None), CPU_SLOTS)


#: named configurations (:func:`refimpl.generation.preset_options`): ``"cpu"``, a chain of
#: :func:`cpu_slots` drafts (None: that many); ``"paper"``, upstream's 8-token blocks (their training's
#: ``para_num`` 8), a chain
PRESETS = {"cpu": {"k": None, "topk": 1, "total": None}, "paper": {"k": 8, "topk": 1, "total": 8}}


def generate(target, prompts, draft=None, mask_id: int | None = None, max_new_tokens: int = 64,
             temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
             generator: torch.Generator | None = None, eos_token_id=None, k: int | None = None,
             topk: int | None = None, total: int | None = None, preset: str | None = None) -> Generation:
    """PARD decoding: ``draft`` fills ``k`` slots a step in one call (``topk`` > 1: a ``total``-node tree over
    the slots' top-k); ``mask_id``: its mask token (None: the draft's ``pard_token``, set by the trainer).
    Options left None: ``preset``'s (:data:`PRESETS`). ``draft`` is required
    (``refimpl.generate(target, prompts, method="pard")`` takes the zoo's). Greedy: exactly AR's tokens;
    sampling: distributed exactly as the target's."""
    required(draft, "draft", "pard")
    check_vocab("draft", draft.vocab_size, target)
    mask_id = getattr(draft.config, "pard_token", None) if mask_id is None else mask_id
    if mask_id is None:
        raise ValueError("mask_id is required: this draft's config names no pard_token (train it for PARD first)")
    o = preset_options(PRESETS, preset, target, k=k, topk=topk, total=total)
    k = cpu_slots(draft) if o["k"] is None else o["k"]
    total = k if o["total"] is None else o["total"]
    return decode(target, PardProposer(draft, mask_id, k, o["topk"], total, target), prompts, max_new_tokens,
                  temperature, top_k, top_p, generator, eos_token_id)
