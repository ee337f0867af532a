"""Lookahead decoding (chapter 08): Jacobi trajectories feed an n-gram pool, verified as a tree.

Paper: Fu, Bailis, Stoica, Zhang, "Break the Sequential Dependency of LLM Inference Using
Lookahead Decoding", arXiv 2402.02057, §3 and Algorithm 1. Defaults from its repository
(hao-ai-lab/LookaheadDecoding README): window W = 7, n-gram size N = 5, guesses G = 7.

Every step is ONE target forward over three parts (all after the KV cache of the context):

- the root, the last committed token;
- the *lookahead branch*: a 2-D window of ``L <= N - 1`` levels x W columns of guesses. The
  token at (level l, column j) stands at position root + j + l + 1 and sees the level-0 tokens
  of columns 0..j and the tokens of levels 1..l in its own column -- a "staircase" that is one
  causal sequence (:func:`window_mask`). Its prediction is a Jacobi update for position
  root + j + l + 2: the top level's predictions become a new level. Once the window has N - 1
  levels, column j plus its new token is an N-gram [level 0, ..., level N-2, new] that goes into
  the pool, the oldest level is dropped, and the window slides;
- the *verification branch*: up to G pooled (N - 1)-grams whose key (the n-gram's first token)
  is the root token, merged into a trie (:func:`refimpl.tree.trie`) and verified as a token tree
  by the shared core: greedy output identical to greedy decoding; with sampling the guesses are
  deterministic (one-hot ``q``) and the core's multi-candidate rule keeps it lossless.

Lookahead nodes are *side* nodes of the tree (scored, never accepted); their keys and values are
dropped with the rejected guesses. The pool keeps, per key, the G most recent n-grams (a repeat
or a verified guess moves to the end). Batch > 1: every row has its own window and pool; the
window has the same shape in every row, so one forward serves the batch.
"""
from __future__ import annotations

import torch

from kernels.verify_greedy import argmax

from .generation import Generation, check_positive_int, preset_options
from .primitives import unpad
from .speculative import Needs, Proposal, Proposer, Sampling, Verdict, decode
from .tree import ROOT, SIDE, Tree, ancestors, trie


def window_mask(levels: int, width: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The lookahead branch's attention among itself and positions: (levels * W, levels * W) bool
    ``see[i, k]`` (node i = l * W + j attends to node k) and (levels * W,) depth j + l + 1."""
    lv = torch.arange(levels, device=device).repeat_interleave(width)  # (S,) level of each node
    col = torch.arange(width, device=device).repeat(levels)  # (S,) column
    first = (lv[None, :] == 0) & (col[None, :] <= col[:, None])  # level-0 tokens of columns <= j
    above = (col[None, :] == col[:, None]) & (lv[None, :] <= lv[:, None])  # own column, levels <= l
    return first | above, col + lv + 1


class NgramPool:
    """N-grams by their first token: ``pool.get(key)`` lists the (N - 1) tokens that followed ``key``,
    newest last, at most ``cap`` per key."""

    def __init__(self, cap: int):
        self.cap, self.grams = cap, {}

    def add(self, gram: list[int]) -> None:
        key, rest = gram[0], tuple(gram[1:])
        lst = self.grams.setdefault(key, [])
        if rest in lst:
            lst.remove(rest)
        lst.append(rest)
        del lst[: max(0, len(lst) - self.cap)]

    def get(self, key: int) -> list[tuple]:
        return list(self.grams.get(key, []))


class Lookahead(Proposer):
    """Proposer: lookahead window (side nodes) + verification trie of pooled n-grams."""


    def __init__(self, window: int, ngram: int, guesses: int, pool_from_prompt: bool,
                 seed: int = 0):
        self.W = check_positive_int("window", window)
        self.N = check_positive_int("ngram", ngram)
        if ngram < 2:
            raise ValueError(f"ngram must be at least 2 (an n-gram is a key plus a guess), got {ngram}")
        self.G = check_positive_int("guesses", guesses)
        self.pool_from_prompt, self.seed = pool_from_prompt, seed

    def start(self, ids: torch.Tensor, mask: torch.Tensor | None, settings: Sampling) -> Needs:
        self.context = unpad(ids, mask)
        self.pools = [NgramPool(self.G) for _ in self.context]
        self.device = ids.device  # the target's: proposals are built there
        gen = torch.Generator(device="cpu").manual_seed(self.seed)  # host: the same first window on any device
        self.levels = []  # per row: list of levels, each W tokens; every row has the same count
        for ctx, pool in zip(self.context, self.pools):
            picks = torch.randint(0, len(ctx), (self.W,), generator=gen, device="cpu").tolist()
            self.levels.append([[ctx[i] for i in picks]])
            if self.pool_from_prompt:
                for i in range(len(ctx) - self.N + 1):
                    pool.add(ctx[i: i + self.N])
        return Needs(trees=True)

    def propose(self, caps: list[int]) -> Proposal:
        L = len(self.levels[0])
        see_w, depth_w = window_mask(L, self.W, self.device)
        S = L * self.W
        rows = []
        for b, cap in enumerate(caps):
            paths = [list(g[:cap]) for g in self.pools[b].get(self.context[b][-1])] if cap else []
            toks, pars = trie([p for p in paths if p])
            side = [t for level in self.levels[b] for t in level]
            rows.append((side + toks, [SIDE] * S + [p + S if p >= 0 else ROOT for p in pars]))
        m = max(len(t) for t, _ in rows)
        dev = self.device
        x = torch.tensor([t + [0] * (m - len(t)) for t, _ in rows], dtype=torch.long, device=dev)  # (b, m)
        parents = torch.tensor([p + [ROOT] * (m - len(p)) for _, p in rows], dtype=torch.long, device=dev)
        anc = ancestors(torch.where(parents >= S, parents - S, torch.full_like(parents, ROOT))[:, S:])  # (b, m-S, m-S)
        see = torch.zeros((len(rows), m, m), dtype=torch.bool, device=dev)
        see[:, :S, :S] = see_w
        see[:, S:, S:] = anc
        depth = torch.cat([depth_w.expand(len(rows), S), anc.sum(-1)], 1)  # (b, m)
        return Proposal(x, torch.tensor([len(t) for t, _ in rows], device=dev), None, 0, Tree(parents, depth, see))

    def accept(self, v: Verdict) -> None:
        L, W = len(self.levels[0]), self.W
        S = L * W
        top = argmax(v.logits[:, 1 + (L - 1) * W: 1 + S]).tolist()  # (b, W) Jacobi update of the top level
        for b, new in enumerate(v.committed):
            acc, k = new[:-1], len(new) - 1
            if k:  # a verified guess: move its n-gram to the newest end of the pool
                hit = [g for g in self.pools[b].get(self.context[b][-1]) if list(g[:k]) == acc]
                if hit:
                    self.pools[b].add([self.context[b][-1], *hit[-1]])
            self.context[b].extend(new)
            levels = self.levels[b]
            levels.append(top[b])
            if len(levels) == self.N:  # a full window: each column is an N-gram; slide
                for j in range(W):
                    self.pools[b].add([lev[j] for lev in levels])
                levels.pop(0)

    def select(self, rows: torch.Tensor) -> None:
        keep = rows.tolist()
        self.context = [self.context[i] for i in keep]
        self.pools = [self.pools[i] for i in keep]
        self.levels = [self.levels[i] for i in keep]


#: named configurations (:func:`refimpl.generation.preset_options`): ``"cpu"``, the best point of the
#: (W, N, G) sweep on SmolLM2-135M (``bench_results/lookahead_sweep/``: on a CPU every scored token
#: costs, so one lookahead level and 3 guesses, the pool seeded with the prompt's n-grams);
#: ``"paper"``, the repository's README settings (hao-ai-lab/LookaheadDecoding: W=7, N=5, G=7)
PRESETS = {"cpu": {"window": 1, "ngram": 4, "guesses": 3, "pool_from_prompt": True},
           "paper": {"window": 7, "ngram": 5, "guesses": 7, "pool_from_prompt": False}}


def generate(target, prompts, max_new_tokens: int = 64, temperature: float = 0.0, top_k: int | None = None,
             top_p: float | None = None, generator: torch.Generator | None = None, eos_token_id=None,
             window: int | None = None, ngram: int | None = None, guesses: int | None = None,
             pool_from_prompt: bool | None = None, seed: int = 0, preset: str | None = None) -> Generation:
    """Lookahead decoding of a ragged batch (W = ``window``, N = ``ngram``, G = ``guesses``).

    Greedy output equals ``autoregressive.generate``'s token for token; sampling is distributed
    exactly as sampling from ``target`` (guesses are deterministic drafts). ``pool_from_prompt``
    also seeds each row's pool with its prompt's n-grams. ``stats.tau``: tokens per target call.
    Options left None come from ``preset`` (:data:`PRESETS`; None: the target's device's).
    """
    o = preset_options(PRESETS, preset, target, window=window, ngram=ngram, guesses=guesses,
                       pool_from_prompt=pool_from_prompt)
    window, ngram, guesses, pool_from_prompt = o["window"], o["ngram"], o["guesses"], o["pool_from_prompt"]
    return decode(target, Lookahead(window, ngram, guesses, pool_from_prompt, seed), prompts, max_new_tokens,
                  temperature, top_k, top_p, generator, eos_token_id)
