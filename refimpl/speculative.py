"""Speculative decoding: one verification core that every drafting method plugs into.

Papers:
- Leviathan, Kalman, Matias, "Fast Inference from Transformers via Speculative Decoding",
  arXiv 2211.17192: Algorithm 1 (speculative sampling) and §3.1, the expected number of tokens
  per target call, ``E[tau] = (1 - alpha^(gamma+1)) / (1 - alpha)`` (their eq. 1).
- Chen et al., "Accelerating Large Language Model Decoding with Speculative Sampling",
  arXiv 2302.01318: Algorithm 2 and Theorem 1 (the modified rejection sampling is lossless).
- Stern, Shazeer, Uszkoreit, "Blockwise Parallel Decoding for Deep Autoregressive Models",
  arXiv 1811.03115: the greedy case (accept the longest prefix that equals the target argmax).

The seam. A *proposer* (:class:`Proposer`) drafts; :func:`decode` verifies. One step, for each row:

1. the proposer returns a :class:`Proposal`: draft tokens ``x_1..x_g`` (each row may propose
   fewer, ``valid``) and the distributions ``q_i`` they were drawn from, or ``q = None`` for a
   deterministic draft (a lookup): ``q`` is then one-hot and the same rule stays lossless;
2. ONE target call scores what the target has not processed (the last committed token, or the
   prompt) followed by the drafts: ``p_1..p_{g+1}``;
3. greedy (temperature 0): keep the longest prefix with ``x_i == argmax p_i`` and append the
   target's argmax after it (:func:`kernels.verify_greedy.verify_greedy`); sampling: accept ``x_i``
   with probability ``min(1, p_i(x_i) / q_i(x_i))``, at the first rejection draw from
   ``norm(max(0, p_i - q_i))``, and if every draft was accepted draw a bonus token from ``p_{g+1}``
   (:func:`kernels.rejection_sample.rejection_sample`). ``p`` and ``q`` get the same temperature /
   top-k / top-p processing (:func:`refimpl.sampling.probs`), so the output is distributed exactly as
   plain sampling from the target with those settings;
4. the target's KV cache is rolled back past the rejected drafts, and the proposer is told what
   was accepted (:meth:`Proposer.accept`) so it can roll back its own state.

A proposal is a chain or a token tree (``Proposal.tree``, chapter 05): its *shape* (:class:`Chain`, or
:class:`refimpl.tree.Tree`) does steps 2-4 its own way (a tree: ancestor mask, position = depth,
SpecInfer's walk, compaction of the accepted path), so the loop reads the same for both.

Ragged batches (rows accept different counts). The target's cache keeps one *physical* length
for the whole batch, and a 2-D slot mask (B, slots) marks which slots hold a row's real tokens
(:class:`~refimpl.slot_cache.SlotCache`). After a verification it is cropped to the longest row; in the
other rows the slots of rejected drafts stay behind as *holes* (mask 0) that are never attended to.
Position ids count only a row's valid slots, so every row computes exactly what it would compute
alone. At batch 1 there are never holes and no mask is passed at all.

Every verdict also hands the proposer the target's logits at every scored position
(``Verdict.logits``): self-drafting proposers (Jacobi, lookahead, token recycling) draft from them.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import NamedTuple

import torch

from kernels.rejection_sample import rejection_sample
from kernels.verify_greedy import argmax, verify_greedy

from . import sampling
from .generation import (Generation, Outputs, Timer, check_fits, check_generate_args, check_positive_int, eos_set,
                         normalize_prompts, preset_options, required)
from .primitives import left_pad
from .slot_cache import Scored, SlotCache  # noqa: F401  (re-exported: ``speculative.SlotCache`` is public)

#: (id(target tokenizer), id(draft tokenizer)) -> weak references to both, for pairs already compared
SAME_VOCAB: dict = {}


def check_same_tokenizer(target, draft) -> None:
    """Raise ``ValueError`` naming ``draft`` when its vocabulary differs from the target's."""
    if draft.vocab_size != target.vocab_size:
        raise ValueError(f"draft has {draft.vocab_size} output tokens but the target has {target.vocab_size}: "
                         "speculative decoding needs a draft with the target's tokenizer")
    a, b = target.tokenizer, draft.tokenizer
    seen = SAME_VOCAB.get((id(a), id(b)))
    if a is b or (seen is not None and seen[0]() is a and seen[1]() is b):  # (an id can be reused: check who)
        return
    tv = a.get_vocab() if hasattr(a, "get_vocab") else None
    dv = b.get_vocab() if hasattr(b, "get_vocab") else None
    if tv != dv:
        raise ValueError("draft tokenizer differs from the target tokenizer (different vocabularies): "
                         "speculative decoding needs a draft with the target's tokenizer")
    try:
        SAME_VOCAB[(id(a), id(b))] = (weakref.ref(a), weakref.ref(b))
    except TypeError:  # an object without weak references: compared again next time
        pass


# ---------------------------------------------------------------------------------------
# the contract: what passes between a proposer and the verifier
# ---------------------------------------------------------------------------------------
@dataclass
class Sampling:
    """The decoding settings, shared by verifier and proposer (``p`` and ``q`` get the same warp)."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    generator: torch.Generator | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return sampling.probs(logits, self.temperature, self.top_k, self.top_p)

    def uniforms(self, shape, device) -> torch.Tensor:
        gdev = self.generator.device if self.generator is not None else device
        return torch.rand(shape, generator=self.generator, device=gdev).to(device)


class Needs(NamedTuple):
    """What a proposer needs from the loop, returned by its :meth:`Proposer.start`."""

    hidden: bool | tuple = False  # the target's features at the root and every draft (Verdict.hidden): True =
    # the last layer's (normed), a tuple of layer ids = those layers' residual streams side by side (EAGLE-3)
    fed: bool = False  # the logits over the fed tokens before the root too (Verdict.fed: the prompt's, at first);
    # otherwise a prefill asks the target for the logits from the root on only (``logits_to_keep``)
    trees: bool = False  # it proposes token trees (``rule=`` replaces only the chain's acceptance rule)
    max_length: int | None = None  # its own context limit, when it has one (a draft model's)


class Proposal(NamedTuple):
    tokens: torch.Tensor  # (b, g) draft tokens (columns past a row's ``valid`` are ignored)
    valid: torch.Tensor  # (b,) drafts each row proposes, <= g
    q: torch.Tensor | None = None  # (b, g, V) what each was drawn from; None: deterministic (one-hot)
    calls: int = 0  # draft-model forward passes spent (0 for lookups)
    tree: object = None  # a refimpl.tree.Tree: the tokens are nodes of a tree; None: a chain


class Verdict(NamedTuple):
    n: torch.Tensor  # (b,) drafts accepted per row
    next: torch.Tensor  # (b,) the target's token after them (correction or bonus)
    n_list: list  # n on the host
    committed: list  # per row, on the host: the accepted drafts' tokens, then next (what the row committed)
    emitted: float  # mean tokens emitted per row this step (for length policies)
    logits: torch.Tensor | None = None  # (b, g + 1, V) the target's logits after the root and each draft
    path: torch.Tensor | None = None  # (b, max n) accepted node indices of a tree proposal (-1 = none)
    fed: torch.Tensor | None = None  # (b, F - 1, V) logits after the fed tokens before the root (Needs.fed),
    # else (b, 0, V)
    hidden: torch.Tensor | None = None  # (b, g + 1, H or taps x H) the target's features there (Needs.hidden)
    fed_hidden: torch.Tensor | None = None  # (b, F - 1, H) and after the fed tokens before the root


class Proposer:
    """The contract every drafter implements (a draft model, trees, Medusa, EAGLE, Jacobi, lookahead,
    retrieval, a diffusion drafter); :func:`decode` calls these four methods and nothing else. Rows are
    the batch's rows still decoding, in order; ``b`` is their number.

    - ``start(ids (B, L), mask (B, L) or None, sampling: Sampling) -> Needs``: the left-padded prompts
      (``mask`` 1 = real token; None = no padding) on the target's device, and the decoding settings
      (a sampling drafter draws ``q`` with ``sampling.probs``). Returns what it needs from the loop
      (:class:`Needs`); a wrapper that delegates ``start`` passes its inner proposer's needs on.
    - ``propose(caps: list[int]) -> Proposal``: at most ``caps[r]`` drafts for row r (a row that needs
      ``k`` more tokens gets ``caps = k - 1``: the target adds one itself), on the target's device.
    - ``accept(verdict: Verdict)``: row r accepted ``verdict.n_list[r]`` drafts (a tree: the nodes in
      ``verdict.path[r]``), then the target's ``verdict.next[r]``: it committed the tokens
      ``verdict.committed[r]``; roll back whatever the proposer keeps.
    - ``select(rows: LongTensor)``: only these rows go on (the others finished).
    """

    def start(self, ids: torch.Tensor, mask: torch.Tensor | None, settings: Sampling) -> Needs:
        raise NotImplementedError

    def propose(self, caps: list[int]) -> Proposal:
        raise NotImplementedError

    def accept(self, verdict: Verdict) -> None:
        raise NotImplementedError

    def select(self, rows: torch.Tensor) -> None:
        raise NotImplementedError


# ---------------------------------------------------------------------------------------
# the verification core
# ---------------------------------------------------------------------------------------
def verify(x, logits, valid, q, settings: Sampling, rule=None):
    """Accepted counts and next tokens (b,), (b,) for drafts ``x`` (b, g) under target ``logits``
    (b, g + 1, V): greedy, or the lossless rule (:func:`kernels.rejection_sample.rejection_sample`), or
    ``rule(x, p, q, u, valid) -> (n, next)`` in its place. ``q`` None = deterministic drafts (one-hot)."""
    if settings.greedy:
        return verify_greedy(x, logits, valid)
    p = settings.probs(logits)  # (b, g + 1, V)
    if q is None:
        q = torch.nn.functional.one_hot(x, p.size(-1)).to(p.dtype)  # (b, g, V)
    u = settings.uniforms((x.size(0), x.size(1) + 1), logits.device)  # (b, g + 1)
    return (rule or rejection_sample)(x, p, q.to(p.device), u, valid)


class Chain:
    """The shape of a chain proposal, with a :class:`refimpl.tree.Tree`'s three steps: ``feed`` the
    unprocessed tokens and the drafts in one target call, ``verify`` the longest accepted prefix,
    ``compact`` (roll back) the rejected drafts' slots."""

    @staticmethod
    def feed(slots, feed, fmask, x, valid, hidden=False, keep=0) -> Scored:
        """(``valid``: the shapes' common signature; a chain scores every column, the verifier stops at
        ``valid``.)"""
        fm = None if fmask is None else torch.cat([fmask, torch.ones_like(x)], 1)
        return slots.feed(torch.cat([feed, x], 1), fm, hidden=hidden, keep=keep)  # (b, F + g or keep, V)

    @staticmethod
    def verify(x, logits, valid, q, settings, rule=None):
        return (*verify(x, logits, valid, q, settings, rule), None)  # (n, next, no path)

    @staticmethod
    def candidates(valid):
        return valid

    @staticmethod
    def compact(slots, g, path, n, n_list) -> None:
        slots.keep_accepted(g, n, n_list)


@torch.no_grad()
def decode(target, proposer: Proposer, prompts, max_new_tokens: int = 64, temperature: float = 0.0,
           top_k: int | None = None, top_p: float | None = None, generator: torch.Generator | None = None,
           eos_token_id=None, rule=None) -> Generation:
    """The draft / verify / roll-back loop shared by every proposer (see the module doc).

    Greedy (``temperature=0``) returns exactly ``autoregressive.generate``'s tokens; otherwise the
    tokens are distributed exactly as sampling from ``target`` with the same settings (seeded by
    ``generator``). ``rule(x, p, q, u, valid) -> (n, next)`` replaces a chain's acceptance rule
    (:func:`kernels.rejection_sample.rejection_sample`, lossless): the chapters plug in lossy and wrong
    rules to watch the chi-square test tell them apart; a token tree keeps its own rule (refused).
    ``stats.accepted[step][row]``: drafts row ``row`` accepted at that step (0 once finished);
    ``stats.extra["gammas"][step]``: the step's draft length; ``extra["mean_gamma"]``: the mean
    number of drafts per row and step."""
    check_generate_args(max_new_tokens, temperature, top_k, top_p)
    prompts = normalize_prompts(prompts, target.max_length, max_new_tokens, target.vocab_size)
    settings, run = Sampling(temperature, top_k, top_p, generator), Outputs(prompts, max_new_tokens, eos_set(
        eos_token_id, target.eos_token_id))
    with Timer(run.stats):
        ids, pmask = left_pad(prompts, target.pad_token_id, target.device)  # (B, L)
        feed, fmask = ids, (pmask if bool((pmask == 0).any()) else None)  # what the target has not processed yet
        tgt = SlotCache(target, len(prompts), target.device, f"speculative decoding ({type(proposer).__name__})", "target")
        needs = check_needs(proposer, proposer.start(ids, fmask, settings), prompts, max_new_tokens, rule)
        while True:
            prop = proposer.propose(run.caps())  # 1. draft
            shape, x, valid = prop.tree or Chain, prop.tokens.to(target.device), prop.valid.to(target.device)
            F, g = feed.shape[1], x.shape[1]
            keep = 0 if needs.fed or F == 1 else g + 1  # logits from the root on only (0 = all F + g)
            scored = shape.feed(tgt, feed, fmask, x, valid, hidden=needs.hidden, keep=keep)  # 2. score
            fed, logits = scored.logits[:, :-g - 1], scored.logits[:, -g - 1:]  # before the root; (b, g + 1, V)
            n, nxt, path = shape.verify(x, logits, valid, prop.q, settings, rule)  # 3. accept / reject
            accepted = x if path is None else x.gather(1, path.clamp(min=0))  # (b, max n) the accepted tokens
            n_list, committed, finished, emitted = run.emit(target, prop, n, nxt, shape.candidates(valid), accepted)
            if len(finished) == len(run.rows):
                break
            if g:  # 4. roll back past the rejected drafts; the proposer does the same for its state
                shape.compact(tgt, g, path, n, n_list)
            h = scored.hidden
            proposer.accept(Verdict(n=n, next=nxt, n_list=n_list, committed=committed, emitted=emitted,
                                    logits=logits, path=path, fed=fed, hidden=None if h is None else h[:, F - 1:],
                                    fed_hidden=None if h is None else h[:, : F - 1]))
            feed, fmask = nxt[:, None], None
            if finished:
                rows = torch.tensor(run.drop(finished), device=target.device)
                tgt.select(rows)
                proposer.select(rows)
                feed = feed[rows]
    return run.result()


def check_needs(proposer, needs, prompts, max_new_tokens: int, rule) -> Needs:
    """``needs`` as :meth:`Proposer.start` returned it, checked: a :class:`Needs`, a proposer context that
    fits every prompt, and ``rule=`` only for chains. ``ValueError`` otherwise, before any forward."""
    if not isinstance(needs, Needs):
        raise ValueError(f"{type(proposer).__name__}.start must return speculative.Needs (got {needs!r}): a "
                         "proposer that wraps or extends another returns the inner start's result")
    if rule is not None and needs.trees:
        raise ValueError("rule= replaces the chain's acceptance rule; this proposer drafts token trees")
    if needs.max_length is not None:
        check_fits(prompts, needs.max_length, max_new_tokens)  # a draft with a shorter context
    return needs


# ---------------------------------------------------------------------------------------
# the draft-model proposer and its draft-length policy
# ---------------------------------------------------------------------------------------
class FixedGamma:
    """Draft ``gamma`` tokens every step (fewer where a row needs fewer tokens).

    The interface of every draft-length policy (see :mod:`refimpl.adaptive`): ``cap()`` the most
    drafts this step; when ``confidence`` is True, ``stop(g, conf, stop)`` is called after the
    g-th draft token with the draft's top-1 probabilities ``conf`` (b,) and returns the per-row
    draft lengths ``stop`` (b,) updated; ``update(emitted, g)`` sees the mean tokens emitted per
    row after each step.
    """

    confidence = False

    def __init__(self, gamma: int):
        self.gamma = check_positive_int("gamma", gamma)

    def cap(self) -> int:
        return self.gamma

    def stop(self, g: int, conf: torch.Tensor, stop: torch.Tensor) -> torch.Tensor:
        return stop

    def update(self, emitted: float, g: int) -> None:
        pass


class DraftModel(Proposer):
    """Proposer: a draft LM drafts autoregressively (one cached call per token), ``policy`` decides
    how many. The draft is never run twice on a token: its cache keeps the accepted drafts it has
    already processed, and the next round first feeds what it has not seen: the correction/bonus
    token, preceded by the last draft token when all ``g`` were accepted (proposed, never processed).
    """

    def __init__(self, draft, policy, target=None):
        if target is not None:
            check_same_tokenizer(target, draft)
        self.draft, self.policy, self.max_length = draft, policy, draft.max_length

    def start(self, ids, mask, settings: Sampling) -> Needs:
        dev = self.draft.device
        self.settings, self.cache = settings, SlotCache(self.draft, ids.shape[0], dev)
        self.feed, self.fmask = ids.to(dev), None if mask is None else mask.to(dev)
        return Needs(max_length=self.max_length)

    def propose(self, caps: list[int]) -> Proposal:
        cap = min(self.policy.cap(), max(caps))
        stop = torch.tensor([min(cap, c) for c in caps], device=self.draft.device)  # (b,) per-row lengths
        limit, drafts, qs, s = int(stop.max()), [], [], self.settings
        while len(drafts) < limit:
            dl = self.cache.feed(self.feed, self.fmask).logits[:, -1]  # (b, V)
            if s.greedy:
                x = argmax(dl)  # (b,)
                conf = torch.softmax(dl.float(), -1).amax(-1) if self.policy.confidence else None
            else:
                qs.append(s.probs(dl))  # (b, V)
                x = sampling.sample_from_probs(qs[-1], s.generator)
                conf = qs[-1].amax(-1)
            drafts.append(x)
            if self.policy.confidence:  # the draft's top-1 probability may stop rows early
                stop = self.policy.stop(len(drafts), conf, stop)
                limit = int(stop.max())
            self.feed, self.fmask = x[:, None], None
        g = self.g = len(drafts)
        self.x = torch.stack(drafts, 1) if g else self.feed.new_zeros((len(caps), 0))  # (b, g)
        return Proposal(self.x, stop.clamp(max=g), torch.stack(qs, 1) if qs else None, calls=g)

    def accept(self, v: Verdict) -> None:
        g, dev = self.g, self.draft.device
        self.policy.update(v.emitted, g)
        nxt = v.next.to(dev)
        if g == 0:  # nothing drafted: the pending tokens are still unprocessed
            fm = self.fmask if self.fmask is not None else torch.ones_like(self.feed)
            self.feed, self.fmask = torch.cat([self.feed, nxt[:, None]], 1), torch.cat([fm, torch.ones_like(fm[:, :1])], 1)
            return
        if g > 1:  # the draft processed x_1 .. x_{g-1}; keep the accepted ones
            self.cache.keep_accepted(g - 1, v.n.clamp(max=g - 1).to(dev), [min(k, g - 1) for k in v.n_list])
        if max(v.n_list) == g:  # some row accepted everything: it must still process x_g
            all_acc = v.n.to(dev) == g  # (b,)
            self.feed = torch.stack([torch.where(all_acc, self.x[:, -1], nxt), nxt], 1)
            self.fmask = None if all(k == g for k in v.n_list) else torch.stack(
                [all_acc.long(), torch.ones_like(nxt)], 1)
        else:
            self.feed, self.fmask = nxt[:, None], None

    def select(self, rows: torch.Tensor) -> None:
        rows = rows.to(self.draft.device)
        self.cache.select(rows)
        self.feed = self.feed[rows]
        self.fmask = None if self.fmask is None else self.fmask[rows]


#: named configurations (:func:`refimpl.generation.preset_options`): ``"cpu"``, the zoo draft's best fixed
#: length on SmolLM2-135M with the lean forward (``bench_results/capstone/``), which is Chen et al.'s K = 4
#: too (arXiv 2302.01318, §4): one preset
PRESETS = {"cpu": {"gamma": 4}}


def generate(target, prompts, draft=None, gamma: int | None = None, max_new_tokens: int = 64,
             temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
             generator: torch.Generator | None = None, eos_token_id=None, preset: str | None = None) -> Generation:
    """Speculative decoding of a ragged batch with ``draft`` proposing ``gamma`` tokens per step.

    ``temperature=0`` is greedy and returns exactly ``autoregressive.generate``'s tokens; otherwise
    the tokens are distributed exactly as sampling from ``target`` with the same temperature /
    top_k / top_p (seeded by ``generator``). ``eos_token_id=None`` uses the target's EOS.
    ``gamma=None`` takes it from ``preset`` (:data:`PRESETS`; None: the target's device's).
    ``draft`` is required (``refimpl.generate(target, prompts, method="speculative")`` loads the
    zoo's draft for the target).
    """
    required(draft, "draft", "speculative")
    gamma = preset_options(PRESETS, preset, target, gamma=gamma)["gamma"]
    return decode(target, DraftModel(draft, FixedGamma(gamma), target), prompts, max_new_tokens, temperature,
                  top_k, top_p, generator, eos_token_id)


def expected_tau(alpha: float, gamma: int) -> float:
    """Expected tokens per target call with i.i.d. acceptance ``alpha`` (Leviathan et al., eq. 1)."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)
