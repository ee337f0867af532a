"""Retrieval drafting: propose tokens found in the context itself, no draft model (chapter 09).

Prompt lookup decoding ("Prompt lookup decoding", Saxena 2023; the same idea as "LLMA", Yang et
al., arXiv 2304.04487): find the most recent earlier occurrence of the context's last n tokens
(n = ``max_ngram`` down to ``min_ngram``; :class:`refimpl.primitives.NgramIndex`, one dict query a
step, gives :func:`refimpl.primitives.lookup_positions`' answer) and propose
the ``num_tokens`` tokens that followed it. A lookup is deterministic, so the proposal has no
``q``: the verification core treats it as one-hot, which keeps greedy decoding exact and
rejection sampling lossless (accept x with probability ``p(x)``, else resample from ``p`` with x
removed). Summaries, rewrites and answers about a passage copy long spans, so tau is high
there; open chat rarely repeats itself.

SAM decoding (Hu et al., "SAM Decoding: Speculative Decoding via Suffix Automaton", arXiv
2411.10666, §3.2-3.3): an online suffix automaton (Blumer et al., 1985) over prompt + output
finds the longest suffix of the text that occurred before, in O(1) amortised per new token
(:class:`SuffixAutomaton`), and proposes what followed that earlier occurrence. Below a
minimum match length it falls back to another drafter -- here token recycling.

Token recycling (Luo et al., "Turning Trash into Treasure: Accelerating Inference of Large
Language Models with Token Recycling", arXiv 2408.08696, §3): every verification scores many
candidate positions; keep each token's latest top-k successors in a (V, k) table
(:class:`RecyclingTable`) and draft a tree from it by following a static template of ranks
(:func:`recycling_template`, 80 nodes, k = 8 in the paper), verified as a token tree
(:mod:`refimpl.tree`). The table starts from the prefill's scores of the prompt (the paper keeps
it across requests instead) and is rewritten after every verification from the scores the target
just computed: no extra model, no extra forward.
"""
from __future__ import annotations

import heapq

import torch

from .generation import Generation, check_positive_int, preset_options
from .primitives import NgramIndex, check_ngrams, unpad
from .speculative import Needs, Proposal, Proposer, Sampling, Verdict, decode
from .tree import ROOT, pack

METHODS = ("prompt_lookup", "sam", "recycling", "sam+recycling")


class PromptLookup(Proposer):
    """Proposer (:mod:`refimpl.speculative`): the continuation of the latest earlier n-gram match."""

    def __init__(self, num_tokens: int, max_ngram: int, min_ngram: int):
        self.num_tokens = check_positive_int("num_tokens", num_tokens)
        check_ngrams(max_ngram, min_ngram)
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def start(self, ids: torch.Tensor, mask: torch.Tensor | None, settings: Sampling) -> Needs:
        # the committed tokens of each row, on the host, with an index of their n-grams: a lookup is then
        # one dict query a step (lookup_positions over the whole history gives the same positions)
        self.index = [NgramIndex(row, self.max_ngram, self.min_ngram) for row in unpad(ids, mask)]
        self.device = ids.device  # the target's: proposals are built there
        return Needs()

    def propose(self, caps: list[int]) -> Proposal:
        at = [ix.find() for ix in self.index]  # (b,) where the continuation starts, -1 = no match
        props = [ix.history[a: a + min(self.num_tokens, c)] if a >= 0 else [] for ix, a, c in zip(self.index, at, caps)]
        g = max(len(p) for p in props)
        x = [p + [0] * (g - len(p)) for p in props]
        return Proposal(torch.tensor(x, dtype=torch.long, device=self.device).view(len(props), g),
                        torch.tensor([len(p) for p in props], device=self.device))

    def accept(self, v: Verdict) -> None:
        for ix, new in zip(self.index, v.committed):
            ix.extend(new)

    def select(self, rows: torch.Tensor) -> None:
        self.index = [self.index[i] for i in rows.tolist()]


class SuffixAutomaton:
    """The suffix automaton of a growing token list, plus the longest suffix match in what came before.

    ``extend(t)`` appends one token: first it moves the *match* -- the longest suffix of the text
    (including ``t``) that also occurs in the text before ``t`` -- by following suffix links
    (amortised O(1)), then it adds ``t`` to the automaton (amortised O(1), Blumer et al.).
    ``match_len`` is that suffix's length; ``continuation(n)`` the n tokens after its first
    occurrence (states remember their first end position)."""

    def __init__(self, tokens=()):
        self.next: list[dict] = [{}]
        self.link, self.length, self.end = [-1], [0], [-1]
        self.last, self.text = 0, []
        self.state, self.match_len = 0, 0
        for t in tokens:
            self.extend(t)

    def extend(self, t: int) -> None:
        s, n = self.state, self.match_len
        while s and t not in self.next[s]:
            s = self.link[s]
            n = self.length[s]
        s, n = (self.next[s][t], n + 1) if t in self.next[s] else (0, 0)
        self.add(t)
        while s and self.length[self.link[s]] >= n:  # a split may have moved our string to a clone
            s = self.link[s]
        self.state, self.match_len = s, n

    def new_state(self, length: int, end: int, link: int = -1, nxt=None) -> int:
        self.next.append({} if nxt is None else dict(nxt))
        self.link.append(link)
        self.length.append(length)
        self.end.append(end)
        return len(self.length) - 1

    def add(self, t: int) -> None:
        pos = len(self.text)
        self.text.append(t)
        cur = self.new_state(self.length[self.last] + 1, pos)
        p = self.last
        while p != -1 and t not in self.next[p]:
            self.next[p][t] = cur
            p = self.link[p]
        if p == -1:
            self.link[cur] = 0
        else:
            q = self.next[p][t]
            if self.length[p] + 1 == self.length[q]:
                self.link[cur] = q
            else:  # split q: the clone holds the shorter strings, which now also end at pos
                clone = self.new_state(self.length[p] + 1, self.end[q], self.link[q], self.next[q])
                while p != -1 and self.next[p].get(t) == q:
                    self.next[p][t] = clone
                    p = self.link[p]
                self.link[q] = self.link[cur] = clone
        self.last = cur

    def continuation(self, n: int) -> list[int]:
        if self.match_len == 0:
            return []
        start = self.end[self.state] + 1
        return self.text[start: start + n]


def recycling_template(nodes: int = 80, k: int = 8, decay: float = 0.8) -> list[tuple[int, ...]]:
    """A static draft tree as rank paths (``(0, 2)`` = the 3rd successor of the 1st successor), parents
    first. Best-first by the score ``prod decay / (rank + 1)``: wide near the root, deep along rank 0."""
    check_positive_int("nodes", nodes)
    check_positive_int("k", k)
    heap, out = [(-decay / (r + 1), (r,)) for r in range(k)], []
    heapq.heapify(heap)
    while heap and len(out) < nodes:
        score, path = heapq.heappop(heap)
        out.append(path)
        for r in range(k):
            heapq.heappush(heap, (score * decay / (r + 1), path + (r,)))
    return sorted(out, key=lambda p: (len(p), p))


class RecyclingTable:
    """One row's (V, k) successor table, stored sparsely (tokens never scored have no entry)."""

    def __init__(self, template):
        self.template, self.succ = template, {}

    def draft(self, root: int, cap: int) -> tuple[list[int], list[int]]:
        tokens, parents, node_of = [], [], {(): ROOT}
        for path in self.template:
            if len(path) > cap or path[:-1] not in node_of:
                continue
            parent = node_of[path[:-1]]
            row = self.succ.get(root if parent == ROOT else tokens[parent])
            if row is None or path[-1] >= len(row):
                continue
            node_of[path] = len(tokens)
            tokens.append(row[path[-1]])
            parents.append(parent)
        return tokens, parents

    def update(self, tokens: list[int], top: list[list[int]]) -> None:
        for t, succ in zip(tokens, top):
            self.succ[t] = succ


class SuffixAndRecycling(Proposer):
    """Proposer for ``sam``, ``recycling`` and ``sam+recycling`` (see the module doc)."""

    def __init__(self, sam: bool, recycling: bool, num_tokens: int, min_match: int | None, k: int, nodes: int):
        """``min_match``: the SAM match length (tokens) that drafts a chain; None (recycling alone): unused."""
        self.sam, self.recycling = sam, recycling
        self.num_tokens = check_positive_int("num_tokens", num_tokens)
        self.min_match = check_positive_int("min_match", min_match) if sam else None
        self.k, self.template = k, recycling_template(nodes, k) if recycling else None

    def start(self, ids: torch.Tensor, mask: torch.Tensor | None, settings: Sampling) -> Needs:
        rows = unpad(ids, mask)
        self.last = [r[-1] for r in rows]
        self.device = ids.device  # the target's: proposals are built there
        self.prompts = rows  # the recycling table starts from the prompt's own scores (first verdict)
        self.automata = [SuffixAutomaton(r) for r in rows] if self.sam else None
        self.tables = [RecyclingTable(self.template) for _ in rows] if self.recycling else None
        return Needs(fed=self.recycling, trees=self.recycling)  # (recycling seeds its table with the prompt's logits)

    def propose(self, caps: list[int]) -> Proposal:
        rows = []
        for b, cap in enumerate(caps):
            chain = []
            if self.sam and self.automata[b].match_len >= self.min_match:
                chain = self.automata[b].continuation(min(self.num_tokens, cap))
            if chain or not self.recycling:
                rows.append((chain, list(range(-1, len(chain) - 1))))
            else:
                rows.append(self.tables[b].draft(self.last[b], cap))
        self.prop = pack(rows, self.device, as_tree=self.recycling)  # SAM alone: chains only, the core's chain path
        return self.prop

    def accept(self, v: Verdict) -> None:
        xs, valid = self.prop.tokens.tolist(), self.prop.valid.tolist()  # every scored draft (recycling's table)
        top = v.logits.topk(self.k, dim=-1).indices.tolist() if self.recycling else None  # (b, 1 + g, k)
        if self.recycling and self.prompts is not None and v.fed is not None and v.fed.shape[1]:
            fed = v.fed.topk(self.k, dim=-1).indices.tolist()  # (b, F - 1, k): the prefill scored the prompt
            for b, r in enumerate(self.prompts):  # left padding: row b's tokens are the last len(r) columns
                self.tables[b].update(r[:-1], fed[b][len(fed[b]) - (len(r) - 1):] if len(r) > 1 else [])
        self.prompts = None
        for b, new in enumerate(v.committed):
            if self.recycling:  # every scored position rewrites its token's successors
                self.tables[b].update([self.last[b]] + xs[b][: valid[b]], top[b][: 1 + valid[b]])
            if self.sam:
                for tok in new:
                    self.automata[b].extend(tok)
            self.last[b] = new[-1]

    def select(self, rows: torch.Tensor) -> None:
        keep = rows.tolist()
        self.last = [self.last[i] for i in keep]
        self.prompts = None
        self.automata = [self.automata[i] for i in keep] if self.sam else None
        self.tables = [self.tables[i] for i in keep] if self.recycling else None


def retrieval_preset(method: str, num_tokens: int, min_match: int | None = None) -> dict:
    return {"method": method, "num_tokens": num_tokens, "max_ngram": 3, "min_ngram": 1, "min_match": min_match,
            "recycle_k": 8, "tree_nodes": 80}


#: named configurations (:func:`refimpl.generation.preset_options`): ``"cpu"``, prompt lookup, the fastest
#: retrieval rule measured on SmolLM2-135M (``bench_results/capstone/``) and the original prompt-lookup
#: script's settings too (n-grams of 3 down to 1, 10 tokens); then one per other rule: SAM decoding's 16
#: tokens (a chain from a match of 1+ tokens; 5+ beside recycling); Token Recycling's 80-node tree of each
#: token's 8 latest successors
PRESETS = {"cpu": retrieval_preset("prompt_lookup", 10), "sam": retrieval_preset("sam", 16, 1),
           "recycling": retrieval_preset("recycling", 16), "sam+recycling": retrieval_preset("sam+recycling", 16, 5)}


def make_proposer(target, method: str | None = None, num_tokens: int | None = None, max_ngram: int | None = None,
                  min_ngram: int | None = None, min_match: int | None = None, recycle_k: int | None = None,
                  tree_nodes: int | None = None, preset: str | None = None) -> Proposer:
    """The proposer :func:`generate` decodes with for these options (resolved as there): decoding
    with it, or with a wrapper that delegates its four methods to it, gives ``generate``'s output."""
    if method is not None and method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    name = preset if preset is not None or method not in PRESETS else method
    o = preset_options(PRESETS, name, target, method=method, num_tokens=num_tokens, max_ngram=max_ngram,
                       min_ngram=min_ngram, min_match=min_match, recycle_k=recycle_k, tree_nodes=tree_nodes)
    method, num_tokens, max_ngram, min_ngram = o["method"], o["num_tokens"], o["max_ngram"], o["min_ngram"]
    min_match, recycle_k, tree_nodes = o["min_match"], o["recycle_k"], o["tree_nodes"]
    check_positive_int("recycle_k", recycle_k)
    check_positive_int("tree_nodes", tree_nodes)
    if recycle_k > target.vocab_size:
        raise ValueError(f"recycle_k must be at most the vocabulary size {target.vocab_size}, got {recycle_k}")
    if method == "prompt_lookup":
        return PromptLookup(num_tokens, max_ngram, min_ngram)
    return SuffixAndRecycling("sam" in method, "recycling" in method, num_tokens, min_match, recycle_k, tree_nodes)


def generate(target, prompts, max_new_tokens: int = 64, temperature: float = 0.0, top_k: int | None = None,
             top_p: float | None = None, generator: torch.Generator | None = None, eos_token_id=None,
             method: str | None = None, num_tokens: int | None = None, max_ngram: int | None = None,
             min_ngram: int | None = None, min_match: int | None = None, recycle_k: int | None = None,
             tree_nodes: int | None = None, preset: str | None = None) -> Generation:
    """Speculative decoding of a ragged batch with drafts retrieved from each row's own context.

    - ``"prompt_lookup"``: :class:`PromptLookup` (``num_tokens`` default 10, ``max_ngram``, ``min_ngram``);
    - ``"sam"``: the suffix automaton's continuation (``num_tokens`` default 16) when the match is
      at least ``min_match`` tokens long (default 1);
    - ``"recycling"``: a token tree of ``tree_nodes`` nodes from each token's ``recycle_k`` latest
      successors;
    - ``"sam+recycling"``: SAM when its match has ``min_match`` (default 5) tokens, else recycling.

    Greedy output equals ``autoregressive.generate``'s; sampling is lossless (deterministic
    drafts: one-hot ``q``). Options left None come from ``preset`` (:data:`PRESETS`; None: the
    preset named by ``method`` when there is one, else the target's device's).
    """
    proposer = make_proposer(target, method, num_tokens, max_ngram, min_ngram, min_match, recycle_k, tree_nodes, preset)
    return decode(target, proposer, prompts, max_new_tokens, temperature, top_k, top_p, generator, eos_token_id)
