"""The draft model's dynamic token tree, with the draft's KV cache kept across steps (chapter 05).

Papers:
- Li, Wei, Zhang, Zhang, "EAGLE-2: Faster Inference of Language Models with Dynamic Draft Trees",
  arXiv 2406.16858, §4: a draft's confidence tracks its acceptance rate, so grow the tree where
  the *cumulative* confidence (the product of draft probabilities along the path) is highest:
  at every level expand the ``topk`` most confident nodes (each gets its top-``topk`` children),
  to depth ``depth``, then keep the ``total`` most confident nodes of all (:func:`tree.keep_best`).
- Miao et al., "SpecInfer", arXiv 2305.09781: the flattened tree is verified in one target
  forward (:class:`refimpl.tree.Tree`), greedy exactly, sampling losslessly.

EAGLE-2 grows its tree with a feature draft (:mod:`refimpl.eagle`); here the same rule runs on an
ordinary draft LM (the chain draft of chapter 04, so the two compare at equal draft quality).
What :class:`refimpl.tree.DraftTree` does simply, this does without recomputation:

- the draft keeps a :class:`~refimpl.slot_cache.SlotCache` of the committed tokens; each step first
  feeds what it has not seen (the accepted path and the target's token after it: one call, which
  also gives the root's distribution), then ``depth - 1`` calls, one per level, each feeding only
  the level's expanded nodes with a 4-D mask (the committed slots, the node's ancestors among the
  nodes already fed, itself) at position root + depth; afterwards the cache is cropped back to the
  committed tokens. So a step costs ``depth`` draft calls of at most ``topk`` tokens each, and
  nothing is run twice except the accepted path (fed again as committed tokens, in the call that
  had to happen anyway for the target's token after it).
- a draft with a copy prior (:class:`refimpl.copy_prior.ContextCopyLM`, the zoo's SmolLM2 draft)
  cannot take a tree mask (its history is indexed by position, and siblings share one), so it hands
  over its inner LM and the prior (:meth:`refimpl.lm.LM.tree_form`), applied here per node instead:
  each node's own history is the committed tokens plus its path, and its copy candidate gets the
  prior's ``bias`` (:func:`boost_columns`, which EAGLE's trees use too).

Our addition to EAGLE-2's rule is ``floor``: a level whose best node has cumulative confidence
below it is not grown (its children could add at most that many expected tokens, less than the
draft call costs). The exact early stop (:meth:`DynamicDraftTree.settled`) changes no tree.

Children are the draft's top-k: deterministic (``q = None``), so greedy is exact and sampling
lossless through SpecInfer's walk whatever the draft says.
"""
from __future__ import annotations

import math

import torch

from .generation import Generation, check_positive_int, preset_options, required
from .primitives import additive, candidate_lists, left_pad, unpad
from .slot_cache import SlotCache
from .speculative import Needs, Proposer, check_same_tokenizer, decode
from .tree import ROOT, keep_best, pack


def boost_columns(logits: torch.Tensor, histories: list[list[list[int]]], columns: list[int] | None,
                  bias: float, max_ngram: int = 3, min_ngram: int = 2) -> tuple[torch.Tensor, list[list[int]]]:
    """The copy prior per tree node (chapters 04b-06): ``logits`` (B, e, V') of ``e`` nodes per row;
    ``histories[b][i]`` the tokens up to and including node i of row b (the committed tokens, then its
    path from the root); each node's prompt-lookup candidate (:func:`refimpl.primitives.candidate_lists`)
    gets ``+bias``. ``columns[t]``: token id -> its column of ``logits`` (-1: not scored, a draft over a
    kept vocabulary; None: the column is the id). A candidate outside the kept columns has no logit of
    the draft's: it gets one more column, at the node's best logit + ``bias``, so the prior ranks it
    first as it ranks a kept candidate the draft already likes. -> ``(logits (B, e, V') or (B, e, V' + 1),
    candidates)``, the candidates as B lists of e token ids (-1 = none): column V' (when present) is
    each node's candidate. In place where no column is added."""
    cand = candidate_lists(histories, max_ngram, min_ngram)  # B lists of e
    (B, e, V), at, outside = logits.shape, [], []  # (b, i, column) of every candidate; (b, i) outside the kept
    for b, row in enumerate(cand):
        for i, t in enumerate(row):
            if t >= 0:
                col = t if columns is None else columns[t]
                if col < 0:
                    outside.append((b, i))
                at.append((b, i, V if col < 0 else col))
    if outside:
        bo, io = zip(*outside)
        extra = torch.full((B, e, 1), float("-inf"), device=logits.device)
        extra[bo, io, 0] = logits[bo, io].amax(-1)
        logits = torch.cat([logits, extra], -1)  # (B, e, V' + 1)
    if at:
        b, i, col = zip(*at)
        logits[b, i, col] += bias
    return logits, cand


class Growth:
    """EAGLE-2's dynamic tree while it grows, for any draft (this module's draft LM, the feature draft
    of :mod:`refimpl.eagle`): every grown node's token, global parent id, cumulative log-confidence
    and depth, in grown order (parents first); the current level; the nodes expanded so far (run
    through the draft, in the order they were). Starts from the root's children: ``score`` and
    ``toks`` (B, k). A step's tree has a handful of nodes, so they live in plain lists, one per row
    (``scores``, ``tokens``, ``parents``; :func:`refimpl.tree.keep_best` reads lists too: a few Python
    operations where tensors of a few elements would each cost a torch call); the draft's inputs come out
    as tensors."""

    def __init__(self, score: torch.Tensor, toks: torch.Tensor):
        B, k = toks.shape
        self.k, self.device = k, toks.device
        self.scores, self.tokens = score.tolist(), toks.tolist()  # per row, per node (N of them)
        self.parents = [[ROOT] * k for _ in range(B)]  # global parent ids
        self.depth, self.lvl = [1] * k, (0, k)  # (N,) depths; the current level's global id range
        self.fed = [[] for _ in range(B)]  # per row, the expanded nodes' ids in expansion order

    def tokens_at(self, nodes: torch.Tensor) -> torch.Tensor:
        """The tokens of ``nodes`` (B, e) global ids -> (B, e)."""
        return torch.tensor([[t[g] for g in row] for t, row in zip(self.tokens, nodes.tolist())],
                            dtype=torch.long, device=self.device).view(nodes.shape)

    def expand(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Take the level's ``k`` most confident nodes -> ``(top (B, e) their global ids, anc (B, e, F)
        bool: which nodes expanded before are their ancestors)``; they count as expanded from now on."""
        lo, hi = self.lvl
        e, F = min(self.k, hi - lo), len(self.fed[0])
        tops, ancs = [], []
        for score, par, fed in zip(self.scores, self.parents, self.fed):
            top = sorted(range(lo, hi), key=lambda g: -score[g])[:e]  # most confident first (stable on a tie)
            for g in top:
                line, a = set(), par[g]
                while a != ROOT:  # the node's ancestors
                    line.add(a)
                    a = par[a]
                ancs.append([f in line for f in fed])
            tops.append(top)
            fed += top
        top = torch.tensor(tops, dtype=torch.long, device=self.device).view(len(tops), e)
        return top, torch.tensor(ancs, dtype=torch.bool, device=self.device).view(len(tops), e, F)

    def add(self, top: torch.Tensor, lp: torch.Tensor, ch: torch.Tensor) -> None:
        """The children ``ch`` (B, e, k) of the expanded nodes ``top`` (B, e), with the draft's log
        probabilities ``lp`` (B, e, k); they become the current level."""
        B, e, k = ch.shape
        start, d = len(self.tokens[0]), self.depth[self.lvl[0]]
        tops = top.tolist()
        above = torch.tensor([[s[g] for g in row] for s, row in zip(self.scores, tops)], device=lp.device)  # (B, e)
        new = (above.view(B, e)[..., None] + lp).flatten(1).tolist()  # the children's scores: in float32, as lp
        for b, (row, kids) in enumerate(zip(tops, ch.flatten(1).tolist())):
            self.tokens[b] += kids
            self.scores[b] += new[b]
            self.parents[b] += [g for g in row for _ in range(k)]
        self.depth += [d + 1] * (e * k)
        self.lvl = (start, len(self.tokens[0]))

    def paths(self, nodes: torch.Tensor) -> list[list[list[int]]]:
        """Per row, the tokens from the root's child down to each of ``nodes`` (B, e) global ids (a walk
        up the parents): a node's path, which the copy prior appends to the committed tokens."""
        out = []
        for toks, par, row in zip(self.tokens, self.parents, nodes.tolist()):
            out.append([])
            for g in row:
                path = []
                while g != ROOT:
                    path.append(toks[g])
                    g = par[g]
                out[-1].append(path[::-1])
        return out

    def keep(self, caps: list[int], total: int):
        """EAGLE-2's re-rank of everything grown: :func:`refimpl.tree.keep_best`."""
        return keep_best(self.tokens, self.parents, self.scores, self.depth, caps, total)


def check_floor(floor) -> float:
    """A tree's confidence ``floor`` (:func:`settled`) -> float; ``ValueError`` unless in [0, 1)."""
    if not (isinstance(floor, (int, float)) and not isinstance(floor, bool) and 0.0 <= floor < 1.0):
        raise ValueError(f"floor must be a confidence in [0, 1), got {floor!r}")
    return float(floor)


def settled(score: torch.Tensor, lvl: tuple[int, int], d: int, caps: list[int], total: int, floor: float) -> bool:
    """Stop growing a dynamic tree below level ``d``? ``score`` (B, N) every grown node's cumulative
    log-confidence (a tensor or nested lists), ``lvl`` the level's (lo, hi) node range. Two reasons,
    checked for every row:

    - exact: a child's score is at most its parent's and it ranks after every node grown before
      it, so once no node of the level beats the row's ``total``-th best score so far (or the
      row's cap is reached), the re-rank would drop all their descendants: same tree, fewer calls;
    - economic: no node of the level has a cumulative confidence of at least ``floor``: their
      children would add at most that many expected tokens each, less than one draft call costs
      when ``floor`` is about the draft's cost ratio c (chapter 04a; SmolLM2's draft: c ~ 0.12)."""
    if all(c <= d for c in caps):
        return True
    rows = score.tolist() if isinstance(score, torch.Tensor) else score  # plain floats: a few nodes a row
    for row, cap in zip(rows, caps):
        best = max(row[lvl[0]:lvl[1]])  # the level's most confident node
        if cap > d and math.exp(best) >= floor and (len(row) < total or best > sorted(row)[-total]):
            return False  # this row may still grow
    return True


class DynamicDraftTree(Proposer):
    """Proposer: EAGLE-2's dynamic tree grown by a draft LM with its KV cache (see the module doc).

    ``total`` nodes at most, ``depth`` levels, ``topk`` children per expanded node and ``topk``
    nodes expanded per level; growth stops early when deeper nodes could not be kept or no node of
    the level reaches cumulative confidence ``floor`` (:meth:`settled`; ``floor=0``: EAGLE-2's tree).
    The defaults (10 nodes, depth 6, top-3, floor 0.1) suit a CPU, where the target's cost grows
    with the tree (bench_results/latency_smollm2-135m.md: 16 tokens cost well over one token's step on SmolLM2) and a draft call costs
    ~0.12 of one. After :meth:`propose`, ``rows`` holds each row's ``(tokens, parents)`` and
    ``scores`` the kept nodes' cumulative log-confidence."""

    prune = True  # stop growing once deeper nodes cannot enter the kept tree, or are too unlikely (:meth:`settled`)

    def __init__(self, draft, total: int, depth: int, topk: int, floor: float, target=None):
        self.total, self.depth = check_positive_int("total", total), check_positive_int("depth", depth)
        self.topk = check_positive_int("topk", topk)
        self.floor = check_floor(floor)
        if target is not None:
            check_same_tokenizer(target, draft)
        self.draft, self.copy = draft.tree_form()  # the LM that runs (tree masks), its copy prior or None
        self.max_length = draft.max_length

    def start(self, ids, mask, settings) -> Needs:
        self.history = unpad(ids, mask)  # committed tokens
        self.device = ids.device  # the target's: proposals are built there
        self.pending = [list(h) for h in self.history]  # committed but not yet fed to the draft
        self.slots = SlotCache(self.draft, ids.shape[0], self.draft.device)
        return Needs(trees=True, max_length=self.max_length)

    def boost(self, logits: torch.Tensor, paths: list[list[list[int]]]) -> torch.Tensor:
        """The copy prior on ``logits`` (B, e, V): node (b, i)'s history is row b's committed tokens
        + ``paths[b][i]``; its copy candidate gets ``bias``. No copy prior: ``logits`` unchanged."""
        if self.copy is None:
            return logits
        hist = [[self.history[b] + p for p in paths[b]] for b in range(len(paths))]
        bias, max_ngram, min_ngram = self.copy
        return boost_columns(logits, hist, None, bias, max_ngram, min_ngram)[0]

    def settled(self, score: torch.Tensor, lvl: tuple[int, int], d: int, caps: list[int]) -> bool:
        """Stop growing below level ``d``? :func:`settled` with this tree's ``total`` and ``floor``."""
        return settled(score, lvl, d, caps, self.total, self.floor)

    @torch.no_grad()
    def propose(self, caps: list[int]):
        B, D, k = len(caps), min(self.depth, max(caps)), self.topk
        if D <= 0:
            self.rows = [([], [])] * B
            return pack(self.rows, self.device)
        dev = self.draft.device
        feed, fmask = left_pad(self.pending, 0, dev)  # (B, L) each
        fmask = None if bool(fmask.all()) else fmask  # (a feed mask means holes to SlotCache)
        root = self.slots.feed(feed, fmask).logits[:, -1:]  # (B, 1, V) the draft's logits after the root
        self.pending = [[] for _ in range(B)]
        P0, pos0 = self.slots.length, self.slots.count - 1  # committed slots; the root's position (B,)
        lp, ch = torch.log_softmax(self.boost(root, [[[]] for _ in range(B)]), -1)[:, 0].topk(k, -1)  # (B, k)
        grown = Growth(lp, ch)
        for d in range(1, D):  # expand the ``topk`` most confident nodes of level d
            if self.prune and self.settled(torch.tensor(grown.scores, device=dev), grown.lvl, d, caps):  # (B, N)
                D = d  # calls made
                break
            top, anc = grown.expand()  # (B, e), (B, e, fed before)
            e = top.shape[1]
            allow = torch.cat([self.slots.mask[:, None, :P0].bool().expand(B, e, P0), anc,
                               torch.eye(e, dtype=torch.bool, device=dev).expand(B, e, e)], -1)  # (B, e, P + e)
            logits, self.slots.cache = self.draft.forward(
                grown.tokens_at(top), self.slots.cache, position_ids=pos0[:, None] + d + torch.zeros_like(top),
                attention_mask=additive(allow))[:2]  # (B, e, V)
            node_paths = grown.paths(top) if self.copy is not None else None  # (only the copy prior reads them)
            lp, ch = torch.log_softmax(self.boost(logits, node_paths), -1).topk(k, -1)  # (B, e, k)
            grown.add(top, lp, ch)
        self.draft.crop(self.slots.cache, P0)  # forget the tree: only committed tokens stay cached
        self.rows, self.scores = grown.keep(caps, self.total)
        return pack(self.rows, self.device, calls=D)

    def accept(self, v) -> None:
        for r, new in enumerate(v.committed):
            self.pending[r] += new
            self.history[r] += new

    def select(self, rows: torch.Tensor) -> None:
        keep = rows.tolist()
        self.slots.select(rows.to(self.slots.device))
        self.history = [self.history[i] for i in keep]
        self.pending = [self.pending[i] for i in keep]


#: named configurations (:func:`refimpl.generation.preset_options`): ``"cpu"``, the zoo draft's
#: fastest tree on SmolLM2-135M with the lean forward (``bench_results/capstone/``: a small tree, since
#: each extra node costs a CPU target a little); ``"paper"``, EAGLE-2's released defaults (Li et al.,
#: arXiv 2406.16858; SafeAILab/EAGLE's ``EaModel.from_pretrained``: 60 nodes, depth 5, top-10, no floor)
PRESETS = {"cpu": {"total": 10, "depth": 6, "topk": 3, "floor": 0.1},
           "paper": {"total": 60, "depth": 5, "topk": 10, "floor": 0.0}}


def generate(target, prompts, draft=None, max_new_tokens: int = 64, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, generator: torch.Generator | None = None,
             eos_token_id=None, total: int | None = None, depth: int | None = None, topk: int | None = None,
             floor: float | None = None, preset: str | None = None) -> Generation:
    """Tree speculative decoding with ``draft``'s dynamic tree (:class:`DynamicDraftTree`: ``total``
    nodes, ``depth`` levels, ``topk`` children, no level grown below cumulative confidence
    ``floor``; 0 = EAGLE-2's rule exactly; each None: ``preset``'s, :data:`PRESETS`). Greedy: exactly
    ``autoregressive.generate``'s tokens; sampling: distributed exactly as sampling from ``target``
    (SpecInfer's walk)."""
    required(draft, "draft", "dynamic_tree")
    o = preset_options(PRESETS, preset, target, total=total, depth=depth, topk=topk, floor=floor)
    return decode(target, DynamicDraftTree(draft, o["total"], o["depth"], o["topk"], o["floor"], target), prompts, max_new_tokens, temperature,
                  top_k, top_p, generator, eos_token_id)
