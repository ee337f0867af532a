"""Speculative decoding: one verification core that every drafting method plugs into.

Papers:
- Leviathan, Kalman, Matias, "Fast Inference from Transformers via Speculative Decoding",
  arXiv 2211.17192: Algorithm 1 (speculative sampling) and §3.1, the expected number of tokens
  per target call, ``E[tau] = (1 - alpha^(gamma+1)) / (1 - alpha)`` (their eq. 1).
- Chen et al., "Accelerating Large Language Model Decoding with Speculative Sampling",
  arXiv 2302.01318: Algorithm 2 and Theorem 1 (the modified rejection sampling is lossless).
- Stern, Shazeer, Uszkoreit, "Blockwise Parallel Decoding for Deep Autoregressive Models",
  arXiv 1811.03115: the greedy case (accept the longest prefix that equals the target argmax).

The seam. A *proposer* drafts; :func:`decode` verifies. One step, for each row of the batch:

1. the proposer returns a :class:`Proposal`: draft tokens ``x_1..x_g`` (each row may propose
   fewer, ``valid``) and the distributions ``q_i`` they were drawn from, or ``q = None`` for a
   deterministic draft (a lookup): ``q`` is then one-hot and the same rule stays lossless;
2. ONE target call scores what the target has not processed (the last committed token, or the
   prompt) followed by the drafts: ``p_1..p_{g+1}``;
3. greedy (temperature 0): keep the longest prefix with ``x_i == argmax p_i`` and append the
   target's argmax after it (:func:`kernels.verify_greedy`); sampling: accept ``x_i`` with
   probability ``min(1, p_i(x_i) / q_i(x_i))``, at the first rejection draw from
   ``norm(max(0, p_i - q_i))``, and if every draft was accepted draw a bonus token from
   ``p_{g+1}`` (:func:`kernels.rejection_sample`). ``p`` and ``q`` get the same temperature /
   top-k / top-p processing (:func:`refimpl.sampling.probs`), so the output is distributed
   exactly as plain sampling from the target with those settings;
4. the target's KV cache is rolled back past the rejected drafts, and the proposer is told what
   was accepted (:meth:`Proposer.accept`) so it can roll back its own state.

A proposer is any object with four methods (:class:`DraftModel` is the one for a draft LM;
adaptive lengths, early exit and the copy prior are draft LMs or length policies on it; prompt
lookup lives in :mod:`refimpl.retrieval`)::

    start(ids (B, L), mask (B, L) or None, sampling)   # the left-padded prompts
    propose(caps: list[int]) -> Proposal                 # at most caps[b] drafts for row b
    accept(verdict: Verdict) -> None                     # n accepted + the next token, per row
    select(rows: LongTensor) -> None                     # finished rows leave the batch

A proposer that reads the logits over the fed tokens before the root (``Verdict.fed``: the prompt's,
at the first step; token recycling seeds its table with them) sets ``wants_fed = True``. Otherwise
the target computes logits from the root on only (``logits_to_keep``): a prefill skips the output
projection over the prompt (~57 ms of a 100-token prompt's 294 on SmolLM2-135M, 2 CPU cores).

A proposer with ``wants_hidden = True`` (Medusa's heads, :mod:`refimpl.medusa`) also receives the
target's last hidden states at the root and every draft (``Verdict.hidden``): its features. A tuple
of layer ids instead (EAGLE-3, :mod:`refimpl.eagle3`) gets those layers' streams side by side.

Ragged batches (rows accept different counts). The target's cache keeps one *physical* length
for the whole batch, and a 2-D slot mask (B, slots) marks which slots hold a row's real tokens
(:class:`SlotCache`). After a verification it is cropped to the longest row; in the other rows
the slots of rejected drafts stay behind as *holes* (mask 0) that are never attended to. Position
ids count only a row's valid slots, so every row computes exactly what it would compute alone.
At batch 1 there are never holes and no mask is passed at all.

Trees. A proposal with ``tree=`` (a :class:`refimpl.tree.Tree`) holds the nodes of a token tree
instead of a chain; the loop then lets the tree feed itself (ancestor mask, position = depth),
walk itself (greedy or SpecInfer's multi-candidate rule) and compact the cache to the accepted
path. Every verdict also returns the target's logits at every scored position (``Verdict.logits``,
``Verdict.fed``): self-drafting proposers (Jacobi, lookahead, token recycling) draft from them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

import kernels

from . import sampling
from .generation import (Generation, Stats, Timer, check_generate_args, check_positive_int, draft_as_keyword,
                         eos_set, normalize_prompts, preset_options, required, truncate_at_eos)
from .lm import check_rollback
from .primitives import left_pad
from .slot_cache import SlotCache  # noqa: F401  (re-exported: ``speculative.SlotCache`` is public)


SAME_VOCAB: dict = {}  # (id(target tokenizer), id(draft tokenizer)) pairs already compared


def check_same_tokenizer(target, draft) -> None:
    """Raise ``ValueError`` naming ``draft`` when its vocabulary differs from the target's."""
    if draft.vocab_size != target.vocab_size:
        raise ValueError(f"draft has {draft.vocab_size} output tokens but the target has {target.vocab_size}: "
                         "speculative decoding needs a draft with the target's tokenizer")
    key = (id(target.tokenizer), id(draft.tokenizer))
    if key in SAME_VOCAB or target.tokenizer is draft.tokenizer:
        return
    tv = target.tokenizer.get_vocab() if hasattr(target.tokenizer, "get_vocab") else None
    dv = draft.tokenizer.get_vocab() if hasattr(draft.tokenizer, "get_vocab") else None
    if tv != dv:
        raise ValueError("draft tokenizer differs from the target tokenizer (different vocabularies): "
                         "speculative decoding needs a draft with the target's tokenizer")
    SAME_VOCAB[key] = True


# ---------------------------------------------------------------------------------------
# what passes between a proposer and the verifier
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
    emitted: float  # mean tokens emitted per row this step (for length policies)
    logits: torch.Tensor | None = None  # (b, g + 1, V) the target's logits after the root and each draft
    path: torch.Tensor | None = None  # (b, max n) accepted node indices of a tree proposal (-1 = none)
    fed: torch.Tensor | None = None  # (b, F - 1, V) logits after the fed tokens before the root (the prompt, at first);
    # (b, 0, V) unless the proposer sets ``wants_fed = True``
    hidden: torch.Tensor | None = None  # (b, g + 1, H or taps x H) the target's features there (``wants_hidden``)
    fed_hidden: torch.Tensor | None = None  # (b, F - 1, H) and after the fed tokens before the root (as ``fed``)


# ---------------------------------------------------------------------------------------
# the verification core
# ---------------------------------------------------------------------------------------
def verify(x, logits, valid, q, settings: Sampling, rule=None):
    """Accepted counts and next tokens (b,), (b,) for drafts ``x`` (b, g) under target ``logits``
    (b, g + 1, V). ``q`` None = deterministic drafts (one-hot). ``rule`` replaces the lossless
    sampling rule (:func:`kernels.rejection_sample`), e.g. to study a lossy or a wrong one."""
    if settings.greedy:
        return kernels.verify_greedy(x, logits, valid)
    p = settings.probs(logits)  # (b, g + 1, V)
    if q is None:
        q = torch.nn.functional.one_hot(x, p.size(-1)).to(p.dtype)  # (b, g, V)
    u = settings.uniforms((x.size(0), x.size(1) + 1), logits.device)  # (b, g + 1)
    return (rule or kernels.rejection_sample)(x, p, q.to(p.device), u, valid)


@torch.no_grad()
def decode(target, proposer, prompts, max_new_tokens: int = 64, temperature: float = 0.0,
           top_k: int | None = None, top_p: float | None = None, generator: torch.Generator | None = None,
           eos_token_id=None, rule=None) -> Generation:
    """The draft / verify / roll-back loop shared by every proposer (see the module doc).

    Greedy (``temperature=0``) returns exactly ``autoregressive.generate``'s tokens; otherwise the
    tokens are distributed exactly as sampling from ``target`` with the same settings (seeded by
    ``generator``). ``rule(x, p, q, u, valid) -> (n, next)`` replaces the sampling rule
    ``kernels.rejection_sample`` (lossless) by another, e.g. a lossy or a deliberately wrong one.
    ``stats.accepted[step][row]``: drafts row ``row`` accepted at that step (0 once finished);
    ``stats.extra["gammas"][step]``: the step's draft length; ``extra["mean_gamma"]``: the mean
    number of drafts per row and step.
    """
    check_generate_args(max_new_tokens, temperature, top_k, top_p)
    check_rollback(target, f"speculative decoding ({type(proposer).__name__})")
    if rule is not None and getattr(proposer, "tree_proposals", False):
        raise ValueError("rule= replaces the chain's acceptance rule; this proposer drafts token trees")
    prompts = normalize_prompts(prompts, min(target.max_length, getattr(proposer, "max_length", target.max_length)),
                                max_new_tokens, target.vocab_size)
    eos = eos_set(eos_token_id, target.eos_token_id)
    settings = Sampling(temperature, top_k, top_p, generator)
    device, B = target.device, len(prompts)
    want_h = getattr(proposer, "wants_hidden", False) or False  # True / layer ids: the drafter reads features
    want_fed = getattr(proposer, "wants_fed", False)  # logits before the root too (else a prefill skips them)
    stats = Stats(rows=B)
    out: list[list[int]] = [[] for _ in prompts]
    step_gammas, row_lengths = [], []
    with Timer(stats):
        ids, pmask = left_pad(prompts, target.pad_token_id, device)  # (B, L)
        padded = bool((pmask == 0).any())
        tgt = SlotCache(target, B, device)
        proposer.start(ids, pmask if padded else None, settings)
        feed, fmask = ids, (pmask if padded else None)  # what the target has not processed yet
        rows = list(range(B))  # current batch index -> original row
        while rows:
            remaining = [max_new_tokens - len(out[r]) for r in rows]
            # 1. draft: never past what a row still needs (the target adds one token itself)
            prop = proposer.propose([m - 1 for m in remaining])
            x, valid = prop.tokens.to(device), prop.valid.to(device)  # (b, g), (b,)
            g = x.shape[1]
            stats.draft_calls += prop.calls
            step_gammas.append(g)
            # 2. one target call over the unprocessed tokens + the drafts
            F = feed.shape[1]
            keep = 0 if want_fed or F == 1 else g + 1  # logits from the root on only (0 = all F + g)
            if prop.tree is None:
                fm = None if fmask is None else torch.cat([fmask, torch.ones_like(x)], 1)
                # (b, F + g or g + 1, V) [, (b, F + g, H)]
                res = tgt.feed(torch.cat([feed, x], 1), fm, hidden=want_h, keep=keep)
                logits, h = res if want_h else (res, None)
                cut = logits.shape[1] - g - 1
                fed, logits = logits[:, :cut], logits[:, cut:]  # before the root (or none); (b, g + 1, V)
                n, nxt = verify(x, logits, valid, prop.q, settings, rule)  # 3. accept / reject
                path, acc = None, x
            else:  # a token tree (refimpl.tree): ancestor mask, position = depth, walk from the root
                res = prop.tree.feed(tgt, feed, fmask, x, valid, full=True, hidden=want_h, keep=keep)  # as above
                logits, h = res if want_h else (res, None)
                cut = logits.shape[1] - g - 1
                fed, logits = logits[:, :cut], logits[:, cut:]
                n, nxt, path = prop.tree.verify(x, logits, valid, prop.q, settings, rule)
                acc = x.gather(1, path.clamp(min=0))  # (b, max n) the accepted path's tokens
                valid = prop.tree.candidates(valid)  # drafts = nodes that could be accepted
            stats.target_calls += 1
            stats.row_steps += len(rows)
            if device.type == "cpu":  # nothing to sync with: four host copies (~1 us each), no concatenation
                host = [[k, t, v] + a for k, t, v, a in zip(n.tolist(), nxt.tolist(), valid.tolist(), acc.tolist())]
            else:
                host = torch.cat([n[:, None], nxt[:, None], valid[:, None], acc], 1).tolist()  # one sync per step
            # 4. emit, stop rows at EOS / max_new_tokens
            step_acc, finished, emitted = [0] * B, [], []
            for i, r in enumerate(rows):
                k, t, v, xs = host[i][0], host[i][1], host[i][2], host[i][3:]
                step_acc[r] = k
                stats.drafted += v
                row_lengths.append(v)
                new, done = truncate_at_eos(xs[:k] + [t], eos, remaining[i])
                out[r].extend(new)
                emitted.append(len(new))
                if done or len(out[r]) >= max_new_tokens:
                    finished.append(i)
            stats.accepted.append(step_acc)
            if len(finished) == len(rows):
                break
            # 5. roll back past the rejected drafts; the proposer does the same for its state
            n_list = [h[0] for h in host]
            if g and prop.tree is not None:
                prop.tree.compact(tgt, g, path, n, n_list)
            elif g:
                tgt.keep_accepted(g, n, n_list)
            proposer.accept(Verdict(n, nxt, n_list, sum(emitted) / len(emitted), logits, path, fed,
                                    None if h is None else h[:, F - 1:], None if h is None else h[:, : F - 1]))
            feed, fmask = nxt[:, None], None
            if finished:
                keep = [i for i in range(len(rows)) if i not in finished]
                sel = torch.tensor(keep, device=device)
                tgt.select(sel)
                proposer.select(sel)
                feed = feed[sel]
                rows = [rows[i] for i in keep]
    stats.nfe = stats.target_calls + stats.draft_calls
    stats.new_tokens = sum(len(o) for o in out)
    stats.extra["gammas"] = step_gammas
    stats.extra["mean_gamma"] = sum(row_lengths) / len(row_lengths) if row_lengths else 0.0
    return Generation(out, stats)


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


class DraftModel:
    """Proposer: a draft LM drafts autoregressively (one cached call per token), ``policy`` decides
    how many. The draft is never run twice on a token: its cache keeps the accepted drafts it has
    already processed, and the next round first feeds what it has not seen: the correction/bonus
    token, preceded by the last draft token when all ``g`` were accepted (proposed, never processed).
    """

    def __init__(self, draft, policy, target=None):
        if target is not None:
            check_same_tokenizer(target, draft)
        self.draft, self.policy, self.max_length = draft, policy, draft.max_length

    def start(self, ids, mask, settings: Sampling) -> None:
        dev = self.draft.device
        self.settings, self.cache = settings, SlotCache(self.draft, ids.shape[0], dev)
        self.feed, self.fmask = ids.to(dev), None if mask is None else mask.to(dev)

    def propose(self, caps: list[int]) -> Proposal:
        cap = min(self.policy.cap(), max(caps))
        stop = torch.tensor([min(cap, c) for c in caps], device=self.draft.device)  # (b,) per-row lengths
        limit, drafts, qs, s = int(stop.max()), [], [], self.settings
        while len(drafts) < limit:
            dl = self.cache.feed(self.feed, self.fmask)[:, -1]  # (b, V)
            if s.greedy:
                x = kernels.argmax(dl)  # (b,)
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


#: named configurations (:func:`refimpl.generation.preset_options`): ``"cpu"`` is the zoo draft's
#: best fixed length on SmolLM2-135M with the lean forward (``bench_results/capstone/``); ``"paper"``
#: is Chen et al.'s K = 4 (arXiv 2302.01318, §4), the same length
PRESETS = {"cpu": {"gamma": 4}, "paper": {"gamma": 4}}


def generate(target, prompts, draft=None, gamma: int | None = None, max_new_tokens: int = 64,
             temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
             generator: torch.Generator | None = None, eos_token_id=None, preset: str | None = None) -> Generation:
    """Speculative decoding of a ragged batch with ``draft`` proposing ``gamma`` tokens per step.

    ``temperature=0`` is greedy and returns exactly ``autoregressive.generate``'s tokens; otherwise
    the tokens are distributed exactly as sampling from ``target`` with the same temperature /
    top_k / top_p (seeded by ``generator``). ``eos_token_id=None`` uses the target's EOS.
    ``gamma=None`` takes it from ``preset`` (:data:`PRESETS`; None: the target's device's).
    ``draft`` is required (``refimpl.generate(target, prompts, method="speculative")`` loads the
    zoo's draft for the target); the old order ``generate(target, draft, prompts)`` still works.
    """
    prompts, draft = draft_as_keyword(prompts, draft)
    required(draft, "draft", "speculative")
    gamma = preset_options(PRESETS, preset, target, gamma=gamma)["gamma"]
    return decode(target, DraftModel(draft, FixedGamma(gamma), target), prompts, max_new_tokens, temperature,
                  top_k, top_p, generator, eos_token_id)


def expected_tau(alpha: float, gamma: int) -> float:
    """Expected tokens per target call with i.i.d. acceptance ``alpha`` (Leviathan et al., eq. 1)."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)
