"""Token trees: many candidate continuations scored by ONE target forward (chapter 05).

Papers:
- Miao et al., "SpecInfer: Accelerating Large Language Model Serving with Tree-based Speculative
  Inference and Verification", arXiv 2305.09781: tree attention (§4, a topology-aware causal
  mask over the flattened tree) and multi-step speculative sampling (§5, Algorithm 2): try a
  node's children in turn, accept child x with ``min(1, p(x) / q(x))``, on a rejection replace
  ``p`` by ``norm(max(0, p - q))``; Theorem 4.2: the output is distributed as the target's.
- Cai et al., "Medusa: Simple LLM Inference Acceleration Framework with Multiple Decoding
  Heads", arXiv 2401.10774, §2.1.2: the position id of a tree node is its depth.

The flattening. A tree of m nodes hangs below the *root*, the last committed token. Nodes are
listed parents first (``parents[i] < i``); ``parents[i] == ROOT`` (-1) for the root's children.
The m nodes go into the target's input after the tokens it has not processed yet, with

- position id = root position + depth (siblings share a position: they are alternatives);
- attention: every node sees the whole context and its own ancestors (``see``), nothing else.

So one forward returns ``p`` after the root and after every node: the target's opinion of every
path at once. A proposer may also add *side* nodes (``parents == SIDE``): scored in the same
forward with an attention pattern of its own (``see``), never accepted -- lookahead decoding's
Jacobi window (:mod:`refimpl.lookahead`) rides along this way.

Verification walks down from the root: greedy keeps the child whose token is the target's argmax
(output identical to greedy decoding); sampling uses SpecInfer's rule above. Children drawn
*with* replacement from one ``q`` share that ``q``; children drawn *without* replacement (top-k,
sampling without replacement) must carry ``q`` renormalised over the untried tokens, and
deterministic children (``q = None``, one-hot) lose their token from ``p`` when rejected, so a
duplicate of a rejected sibling can never be accepted. Finally the accepted path's keys and
values move into place in the cache (:meth:`refimpl.lm.LM.move_slots`): no second forward.

A proposer returns ``Proposal(tokens, valid, q, calls, tree=Tree(parents))`` to
:func:`refimpl.speculative.decode`; the loop calls :meth:`Tree.feed`, :meth:`Tree.verify` and
:meth:`Tree.compact` instead of the chain's three steps. :class:`DraftTree` is the proposer for a
draft LM (its top-k children below every node, SpecInfer's static trees), :func:`generate` runs it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.verify_greedy import argmax

from . import sampling
from .generation import Generation, preset_options, required
from .primitives import additive, unpad
from .slot_cache import Scored
from .speculative import Needs, Proposal, Proposer, check_same_tokenizer, decode

ROOT, SIDE = -1, -2


def ancestors(parents: torch.Tensor) -> torch.Tensor:
    """(b, m) parent indices -> (b, m, m) bool, ``[b, i, j]``: node j is node i or one of its ancestors.

    Side nodes (``SIDE``) and the root's children have no ancestors among the nodes."""
    b, m = parents.shape
    out = bytearray()  # (b, m, m) bytes: a node's row is a copy of its parent's plus itself
    for row in parents.tolist():
        if any(p >= i for i, p in enumerate(row)):
            raise ValueError("parents must list a node's parent before the node (parents[i] < i)")
        anc = []
        for i, p in enumerate(row):
            a = bytearray(anc[p]) if p >= 0 else bytearray(m)
            a[i] = 1
            anc.append(a)
        out += b"".join(anc)
    if not out:
        return torch.zeros((b, m, m), dtype=torch.bool, device=parents.device)
    return torch.frombuffer(out, dtype=torch.uint8).view(b, m, m).to(device=parents.device, dtype=torch.bool)


@dataclass
class Tree:
    """The shape of a proposal: ``parents`` (b, m); ``depth`` (b, m) (root's children: 1) and
    ``see`` (b, m, m) bool (node i attends to node j) default to what the parents imply."""

    parents: torch.Tensor
    depth: torch.Tensor | None = None
    see: torch.Tensor | None = None

    def __post_init__(self):
        if self.parents.dim() != 2 or bool((self.parents < SIDE).any()):
            raise ValueError("parents must be (b, m) with entries >= -2 (SIDE), -1 (ROOT) or a node index")
        b, m = self.parents.shape
        if self.depth is not None and tuple(self.depth.shape) != (b, m):
            raise ValueError(f"depth must have the parents' shape {(b, m)}, got {tuple(self.depth.shape)}")
        if self.see is not None and tuple(self.see.shape) != (b, m, m):
            raise ValueError(f"see must be (b, m, m) = {(b, m, m)}, got {tuple(self.see.shape)}")
        if self.depth is None or self.see is None:
            anc = ancestors(self.parents)
            self.depth = anc.sum(-1) if self.depth is None else self.depth
            self.see = anc if self.see is None else self.see

    def candidates(self, valid: torch.Tensor) -> torch.Tensor:
        """(b,) nodes that could be accepted (side nodes are scored, never drafts): for ``stats.drafted``."""
        counts = [sum(p != SIDE for p in row[:v]) for row, v in zip(self.parents.tolist(), valid.tolist())]
        return torch.tensor(counts, dtype=torch.long, device=valid.device)

    # -- 1. one forward over the unprocessed tokens + every node ---------------------------
    def feed(self, slots, feed: torch.Tensor, fmask: torch.Tensor | None, x: torch.Tensor,
             valid: torch.Tensor, hidden=False, keep: int = 0) -> Scored:
        """Append ``feed`` (b, F) (``fmask`` marks real tokens) and the nodes ``x`` (b, m) to the
        :class:`~refimpl.slot_cache.SlotCache` ``slots`` -> :class:`~refimpl.slot_cache.Scored`: logits
        (b, F + m, V) after every fed token, then after each node, and with ``hidden`` the target's last hidden
        states (b, F + m, H) alongside (a tuple of layer ids: those layers' streams side by side, as
        :meth:`refimpl.lm.LM.forward`). ``keep`` > 0: logits for the last ``keep`` positions only (the
        model's ``logits_to_keep``), the hidden states still (b, F + m, H)."""
        b, F = feed.shape
        m, dev = x.shape[1], feed.device
        P = slots.length
        # every slot, fed token and node real (one row, say): the slots stay dense, nothing to mask out
        dense = slots.dense and fmask is None and all(v == m for v in valid.tolist())
        root = slots.count + (F if fmask is None else fmask.sum(-1)) - 1  # (b,) the root's position: the last fed
        pos = torch.cat([slots.next_positions(fmask, F).expand(b, F), root[:, None] + self.depth.to(dev)], 1)  # (b, F + m)
        allow = torch.zeros((b, F + m, P + F + m), dtype=torch.bool, device=dev)
        allow[:, :, :P] = True
        allow[:, :F, P:P + F] = torch.ones((F, F), dtype=torch.bool, device=dev).tril()
        allow[:, F:, P:P + F] = True
        allow[:, F:, P + F:] = self.see.to(dev)
        valid_slots = None
        if not dense:
            node_ok = (torch.arange(m, device=dev)[None, :] < valid.to(dev)[:, None]).long()  # (b, m)
            valid_slots = torch.cat([torch.ones_like(feed) if fmask is None else fmask, node_ok], 1)  # (b, F + m)
            allow &= torch.cat([slots.mask, valid_slots], 1).bool()[:, None, :]
            diag = torch.arange(F + m, device=dev)
            allow[:, diag, P + diag] = True  # a pad or padding node sees itself: no empty softmax rows
        slots.append(F + m, valid_slots, holes=fmask is not None)  # (padding nodes never outlive compact)
        extra = {"output_hidden_states": hidden} if hidden else {}
        if keep:
            extra["logits_to_keep"] = keep
        out = slots.lm.forward(torch.cat([feed, x], 1), slots.cache, position_ids=pos,
                               attention_mask=additive(allow), **extra)
        slots.cache = out[1]
        return Scored(out[0], out[2] if hidden else None)

    # -- 2. walk down from the root ---------------------------------------------------------
    def verify(self, x: torch.Tensor, logits: torch.Tensor, valid: torch.Tensor, q: torch.Tensor | None,
               settings, rule=None):
        """-> ``(n (b,), next (b,), path (b, max n))``: accepted depth, the target's token after the
        accepted path, and the path's node indices (-1 past a row's ``n``). ``q`` (b, m, V) or None
        (deterministic nodes); ``settings`` a :class:`~refimpl.speculative.Sampling`."""
        if rule is not None:
            raise ValueError("rule= replaces the chain's acceptance rule; a Tree is verified by SpecInfer's rule")
        b, m = x.shape
        parents, xs, vs = self.parents.tolist(), x.tolist(), valid.tolist()
        if settings.greedy:
            best = argmax(logits).tolist()  # (b, 1 + m)
            walks = [self.walk(parents[r], vs[r], lambda node, kids, r=r: next(
                (c for c in kids if xs[r][c] == best[r][node + 1]), None), lambda node, r=r: best[r][node + 1])
                for r in range(b)]
        else:
            p = settings.probs(logits)  # (b, 1 + m, V)
            walks = [self.sample_walk(parents[r], vs[r], xs[r], p[r], None if q is None else q[r].to(p.device),
                                      settings) for r in range(b)]
        return self.outcome(walks, logits.device)

    @staticmethod
    def outcome(walks, device):
        """Per-row walks ``(path, token)`` -> ``(n (b,), next (b,), path (b, max n))``, -1 past a row's n."""
        n = [len(w[0]) for w in walks]
        path = torch.tensor([w + [-1] * (max(n) - len(w)) for w, _ in walks], dtype=torch.long, device=device)
        return (torch.tensor(n, device=device), torch.tensor([w[1] for w in walks], device=device),
                path.view(len(walks), max(n)))

    @staticmethod
    def walk(parents: list, valid: int, choose, final):
        """Descend from the root: ``choose(node, children)`` -> accepted child or None; ``final(node)``
        -> the token after the last accepted node. Returns (path, token)."""
        kids: dict[int, list[int]] = {}
        for i in range(valid):
            kids.setdefault(parents[i], []).append(i)
        node, path = ROOT, []
        while True:
            child = choose(node, kids.get(node, []))
            if child is None:
                return path, final(node)
            path.append(child)
            node = child

    def sample_walk(self, parents, valid, xs, p, q, settings):
        """SpecInfer's multi-step speculative sampling on one row (see the module doc)."""
        state = {}

        def choose(node, kids):
            r = p[node + 1]  # (V,) the target's distribution after ``node``
            for c in kids:
                t = xs[c]
                qx = 1.0 if q is None else float(q[c, t])
                if float(settings.uniforms((1,), p.device)[0]) * qx < float(r[t]):
                    return c
                resid = r.clone() if q is None else (r - q[c]).clamp(min=0)
                if q is None:
                    resid[t] = 0
                if float(resid.sum()) > 0:  # (== 0 only if p == q: then the child is always accepted)
                    r = resid / resid.sum()
            state["r"] = r
            return None

        def final(node):
            r = state.get("r", p[node + 1])
            return int(sampling.sample_from_probs(r[None], settings.generator)[0])

        return self.walk(parents, valid, choose, final)

    # -- 3. keep the accepted path's cache entries ------------------------------------------
    def compact(self, slots, m: int, path: torch.Tensor, n: torch.Tensor, n_list: list) -> None:
        """Move each row's accepted nodes' keys / values to the first slots after the feed, drop the rest."""
        start = slots.length - m
        if max(n_list):
            slots.lm.move_slots(slots.cache, start, start + path.clamp(min=0))
        slots.keep_accepted(m, n, n_list)


# ---------------------------------------------------------------------------------------
# building trees
# ---------------------------------------------------------------------------------------
def trie(paths: list[list[int]]) -> tuple[list[int], list[int]]:
    """Merge token sequences that all start below the root into one tree (shared prefixes once).

    -> ``(tokens, parents)`` in insertion order (parents first). Merging matters for sampling:
    two siblings with the same deterministic token waste the second (see the module doc)."""
    tokens, parents, index = [], [], {}
    for path in paths:
        node = ROOT
        for t in path:
            key = (node, t)
            if key not in index:
                index[key] = len(tokens)
                tokens.append(t)
                parents.append(node)
            node = index[key]
    return tokens, parents


def pack(rows: list[tuple[list[int], list[int]]], device, q=None, calls: int = 0, as_tree: bool = True):
    """Per-row ``(tokens, parents)`` -> a :class:`~refimpl.speculative.Proposal` with a :class:`Tree`
    on ``device`` (the target's: rows padded to the widest; ``valid`` = each row's node count). No nodes
    at all, or ``as_tree=False`` (every row a chain: the core's cheaper chain path) -> a chain proposal."""
    width = max((len(t) for t, _ in rows), default=0)
    x = torch.tensor([t + [0] * (width - len(t)) for t, _ in rows], dtype=torch.long, device=device).view(len(rows), width)
    valid = torch.tensor([len(t) for t, _ in rows], device=device)
    if width == 0 or not as_tree:
        return Proposal(x, valid, None, calls)
    parents = torch.tensor([p + [ROOT] * (width - len(p)) for _, p in rows], dtype=torch.long, device=device)
    return Proposal(x, valid, q, calls, Tree(parents))


def keep_best(tokens: torch.Tensor, parents: torch.Tensor, score: torch.Tensor, depth: torch.Tensor,
              caps: list[int], total: int):
    """EAGLE-2's re-ranking (arXiv 2406.16858, §4.2): of the N grown nodes of each row, keep the
    ``total`` with the highest cumulative confidence that are no deeper than the row's cap.

    ``tokens``, ``parents`` (global node ids, ``ROOT`` below the root; parents listed first),
    ``score`` (B, N) and ``depth`` (N,), tensors or nested lists. A child's score is at most its
    parent's (a sum of log probabilities), so the kept set is a tree; a stable sort keeps the parent
    first on a tie. -> ``(rows, scores)``: per row ``(tokens, parents)`` re-indexed for :func:`pack`,
    and the kept nodes' scores. (A tree has a handful of nodes: plain lists, a Python sort.)"""
    T, P, S, D = (x.tolist() if isinstance(x, torch.Tensor) else x for x in (tokens, parents, score, depth))
    rows, scores = [], []
    for r, cap in enumerate(caps):
        ok = [g for g, d in enumerate(D) if d <= cap]  # no deeper than the row's cap
        keep = sorted(sorted(ok, key=lambda g: -S[r][g])[:total])  # the most confident (stable: parents first)
        local = {g: i for i, g in enumerate(keep)}
        rows.append(([T[r][g] for g in keep], [ROOT if P[r][g] == ROOT else local[P[r][g]] for g in keep]))
        scores.append([S[r][g] for g in keep])
    return rows, scores


def slot_tree(lp, ids, caps: list[int], total: int) -> list[tuple[list[int], list[int]]]:
    """A tree over a parallel drafter's block: slot d's top-k (``ids`` (B, g, k) with log-probabilities
    ``lp`` (B, g, k)) are the candidates at depth d + 1 below *every* node of depth d (a parallel drafter's
    slots do not see the path above them). Best-first, the ``total`` nodes of highest cumulative
    log-probability no deeper than ``caps[b]``: a child is never worth more than its parent, so each node
    comes after its parent. -> per row ``(tokens, parents)`` for :func:`pack` (top-1 everywhere: a chain)."""
    import heapq

    L, T = (x.tolist() if isinstance(x, torch.Tensor) else x for x in (lp, ids))
    rows = []
    for r, cap in enumerate(caps):
        depth = min(cap, len(T[r]))
        tokens, parents, heap = [], [], [(-L[r][0][j], 0, ROOT, j) for j in range(len(T[r][0]))] if depth else []
        heapq.heapify(heap)
        while heap and len(tokens) < total:
            neg, d, parent, j = heapq.heappop(heap)
            tokens.append(T[r][d][j])
            parents.append(parent)
            if d + 1 < depth:
                node = len(tokens) - 1
                for c in range(len(T[r][d + 1])):
                    heapq.heappush(heap, (neg - L[r][d + 1][c], d + 1, node, c))
        rows.append((tokens, parents))
    return rows



def slot_proposal(logits: torch.Tensor, caps: list[int], settings, topk: int, total: int, device,
                  kept: torch.Tensor | None = None, vocab: int | None = None):
    """The proposal of a parallel drafter's one call (PARD, DFlash) from its slots' logits ``logits`` (B, g, V'),
    slot ``j`` scoring the token ``j + 1`` ahead; at most ``caps[b]`` drafts for row b; ``kept`` (V',) the
    token ids of the logits' columns (a head over a kept subset of a ``vocab``-token vocabulary; None: all).
    ``topk`` > 1: a ``total``-node tree over the slots' top-k (:func:`slot_tree`, deterministic children).
    Otherwise a chain: each slot's argmax (greedy), or a token drawn from the slot's own distribution
    ``q_j`` (``settings.probs``, returned as ``q`` (B, g, V) over the whole vocabulary ``V``): the slots do
    not see each other's draws, so ``x_j ~ q_j`` and the lossless rule applies. One draft call."""
    if kept is not None and vocab is None:
        raise ValueError("vocab is required with kept: the size of the vocabulary the kept ids index")
    caps_g = [min(c, logits.shape[1]) for c in caps]
    ids = (lambda i: i) if kept is None else (lambda i: kept[i])  # column -> token id
    if topk > 1:
        lp, top = torch.log_softmax(logits.float(), -1).topk(topk, -1)  # (B, g, topk)
        return pack(slot_tree(lp, ids(top), caps_g, total), device, calls=1)
    valid = torch.tensor(caps_g, device=device)
    if settings.greedy:
        return Proposal(ids(argmax(logits)).to(device), valid, None, calls=1)  # (B, g)
    q = settings.probs(logits)  # (B, g, V') each slot's own distribution
    x = ids(sampling.sample_from_probs(q, settings.generator))  # (B, g)
    if kept is not None:  # q over the whole vocabulary, 0 outside the kept tokens
        q = q.new_zeros((*q.shape[:-1], vocab)).index_copy_(-1, kept, q)
    return Proposal(x.to(device), valid, q.to(device), calls=1)


# ---------------------------------------------------------------------------------------
# a proposer: the draft model's top-k tree
# ---------------------------------------------------------------------------------------
def grow(draft, ctx: list[int], widths) -> tuple[list[int], list[int]]:
    """-> ``(tokens, parents)``: the draft's top-``widths[d]`` tokens below every node of depth ``d``
    (a full top-k tree: ``prod(widths[:d + 1])`` nodes at depth ``d + 1``). One draft forward per
    level, batched over the level's nodes (each recomputes the context: simple, not fast)."""
    tokens, parents, paths, level = [], [], {ROOT: []}, [ROOT]
    for k in widths:
        batch = torch.tensor([ctx + paths[n] for n in level], device=draft.device)  # (nodes, L + d)
        top = draft.logits(batch)[:, -1].topk(k).indices.tolist()  # (nodes, k) distinct children
        prev, level = level, []
        for n, kids in zip(prev, top):
            for t in kids:
                paths[len(tokens)] = paths[n] + [t]
                level.append(len(tokens))
                tokens.append(t)
                parents.append(n)
    return tokens, parents


class DraftTree(Proposer):
    """Proposer: below the last committed token, the draft's top-``widths[0]`` tokens, below each of
    them its top-``widths[1]``, and so on (depth ``len(widths)``, capped by what a row still needs).
    The children are deterministic (``q = None``): the greedy walk takes the argmax child, sampling
    uses SpecInfer's rule with one-hot children (a rejected child's token leaves ``p``), lossless."""

    def __init__(self, draft, widths, target=None):
        if not isinstance(widths, (tuple, list)) or not widths or not all(
                isinstance(w, int) and not isinstance(w, bool) and w >= 1 for w in widths):
            raise ValueError(f"widths must be a non-empty sequence of positive ints, got {widths!r}")
        if target is not None:
            check_same_tokenizer(target, draft)
        self.draft, self.widths, self.max_length = draft, tuple(widths), draft.max_length

    def start(self, ids, mask, settings) -> Needs:
        self.ctx = unpad(ids, mask)
        self.device = ids.device
        return Needs(trees=True, max_length=self.max_length)

    def propose(self, caps: list[int]) -> Proposal:
        rows = [grow(self.draft, c, self.widths[:cap]) for c, cap in zip(self.ctx, caps)]
        return pack(rows, self.device, calls=min(len(self.widths), max(caps)))

    def accept(self, v) -> None:
        for ctx, new in zip(self.ctx, v.committed):
            ctx += new

    def select(self, rows: torch.Tensor) -> None:
        self.ctx = [self.ctx[i] for i in rows.tolist()]


#: named configurations (:func:`refimpl.generation.preset_options`): ``"cpu"`` is the narrowest
#: tree, the fastest static shape measured on SmolLM2-135M (every static tree costs its draft one
#: uncached call a node level: ``bench_results/capstone/``); ``"wide"`` is chapter 05's three-level tree
PRESETS = {"cpu": {"widths": (2, 2)}, "wide": {"widths": (3, 2, 1)}}


def generate(target, prompts, draft=None, max_new_tokens: int = 64, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, generator: torch.Generator | None = None,
             eos_token_id=None, widths=None, preset: str | None = None) -> Generation:
    """Tree speculative decoding with ``draft``'s top-k tree (:class:`DraftTree`, ``widths`` per
    level; None: ``preset``'s, :data:`PRESETS`). Greedy: exactly ``autoregressive.generate``'s
    tokens; sampling: distributed exactly as sampling from ``target`` with the same settings
    (SpecInfer, arXiv 2305.09781, Algorithm 2)."""
    required(draft, "draft", "tree")
    widths = preset_options(PRESETS, preset, target, widths=widths)["widths"]
    return decode(target, DraftTree(draft, widths, target), prompts, max_new_tokens, temperature, top_k, top_p,
                  generator, eos_token_id)
