"""Medusa-1 heads: K small heads on the target's last hidden state draft a token tree (chapter 06a).

Paper: Cai et al., "Medusa: Simple LLM Inference Acceleration Framework with Multiple Decoding
Heads", arXiv 2401.10774.

- §2.1.1, the heads: from the target's last (normed) hidden state ``h_t`` at position t, head k
  (k = 1..K) predicts the token at t + k + 1 (the target's own LM head already gives t + 1):
  ``p_t^(k) = softmax(W2^(k) (SiLU(W1^(k) h_t + b1^(k)) + h_t))``, a SiLU residual block then an
  LM head. ``W1`` starts at zero, so an untrained head predicts what the target predicts for t + 1.
- §2.1.2, the candidate tree: the Cartesian product of the heads' top-s_k tokens, pruned to a
  *sparse* tree of the paths most likely to be accepted. A path is written as a tuple of ranks
  ``(i, j, ...)``: rank i in head 1's top-k at depth 1, rank j in head 2's at depth 2 (Medusa's
  public ``medusa_choices`` format). :func:`choose_tree` builds the tree from measured per-head,
  per-rank accuracies as §2.3.3 ("searching for the optimized tree construction") does: greedily
  add the node whose path is most likely correct, estimated as the product of its ranks' accuracies.
- §2.3.1, typical acceptance (lossy): accept a candidate x if
  ``p(x) > min(eps, delta * exp(-H(p)))`` (defaults eps = 0.09, delta = 0.3); the token after the
  accepted path is sampled from p. It trades exactness for longer accepted paths; labelled lossy.
- §2.3.2, training on the model's own answers (self-distillation); Medusa-1 keeps the backbone frozen.

Our layout, and how it maps to Medusa's. On a CPU the K extra LM heads would cost as much as the
whole 135 M target (4 x 576 x 49152 multiply-adds per token), so every head *shares the target's
frozen LM head* (``W2^(k) = W_lm``, Medusa's initialisation, never updated) and only the residual
blocks train; a head may score only a kept subset of the vocabulary (``kept``, rows of ``W_lm``).
Saved as safetensors (:func:`refimpl.models.drafters.save`) under Medusa's own key names
``medusa_head.{k}.0.linear.weight`` / ``.bias`` (k from 0); the LM-head key
``medusa_head.{k}.1.weight`` is *not* stored: an exporter copies the base model's ``lm_head.weight``
into it. vLLM's Medusa model names the same tensors ``blocks.{k}.layers.0.weight`` / ``.bias`` and
``lm_heads.{k}.weight``; its config takes ``num_heads`` = K, ``num_hidden_layers`` = 1,
``medusa_fc_bias`` = true and ``original_lm_head`` = true (every head uses the base LM head, as
ours do); ``config.json`` spells the mapping out under ``"vllm"``.

Decoding is a proposer on the shared verification core (:func:`refimpl.speculative.decode`): the
core hands it the target's hidden state at the last accepted node (``wants_hidden``), it returns
a :class:`refimpl.tree.Tree` below the next token; greedy verification is exact, sampling uses
SpecInfer's multi-candidate rule (lossless, deterministic children), ``acceptance="typical"``
Medusa's typical acceptance (lossy).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from . import sampling
from .generation import Generation, check_positive_int, preset_options, required
from .lm import check_vocab, check_width
from .speculative import Needs, Proposer, decode
from .tree import ROOT, Tree, pack

#: Medusa's typical-acceptance defaults (posterior_threshold, posterior_alpha)
TYPICAL_EPS, TYPICAL_DELTA = 0.09, 0.3


class MedusaHeads(nn.Module):
    """K residual blocks ``h + SiLU(W_k h + b_k)`` sharing one frozen LM head ``lm_head`` (V', H).

    ``kept`` (V',) maps the head's rows to token ids (None: the full vocabulary, V' = V).
    ``accuracy[k][i]``: measured probability that head k's rank-i token is the target's (for
    :func:`choose_tree`), saved with the heads."""

    def __init__(self, lm_head: torch.Tensor, num_heads: int = 4, kept: torch.Tensor | None = None,
                 accuracy: list | None = None):
        super().__init__()
        check_positive_int("num_heads", num_heads)
        H = lm_head.shape[1]
        self.blocks = nn.ModuleList(nn.Linear(H, H) for _ in range(num_heads))
        for b in self.blocks:  # Medusa's init: the residual block starts as the identity
            nn.init.zeros_(b.weight)
            nn.init.zeros_(b.bias)
        self.register_buffer("lm_head", lm_head.detach().clone(), persistent=False)  # (V', H) frozen
        self.register_buffer("kept", None if kept is None else kept.long().clone(), persistent=False)
        self.accuracy = accuracy

    @property
    def num_heads(self) -> int:
        return len(self.blocks)

    def features(self, h: torch.Tensor) -> torch.Tensor:
        """(..., H) target hidden states -> (K, ..., H) each head's residual-block output."""
        h = h.to(self.lm_head.dtype)
        return torch.stack([h + nn.functional.silu(b(h)) for b in self.blocks])

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (K, ..., V') logits of each head over the kept vocabulary."""
        return self.features(h) @ self.lm_head.T

    def top(self, h: torch.Tensor, k: int) -> torch.Tensor:
        """(b, H) -> (b, K, k) each head's top-k token ids (full-vocabulary ids)."""
        idx = self.forward(h).topk(k, dim=-1).indices.permute(1, 0, 2)  # (b, K, k)
        return idx if self.kept is None else self.kept[idx]


# ---------------------------------------------------------------------------------------
# candidate trees
# ---------------------------------------------------------------------------------------
def check_choices(choices, num_heads: int) -> list[tuple]:
    """Validate a Medusa path list -> tuples sorted parents first; ``ValueError`` naming ``choices``."""
    try:
        out = sorted({tuple(int(r) for r in c) for c in choices}, key=lambda c: (len(c), c))
    except (TypeError, ValueError):
        raise ValueError(f"choices must be a list of rank tuples such as [(0,), (1,), (0, 0)], got {choices!r}")
    if not out or any(len(c) == 0 or len(c) > num_heads or min(c) < 0 for c in out):
        raise ValueError(f"choices must be non-empty tuples of ranks >= 0, at most {num_heads} long (one rank per head)")
    have = set(out)
    missing = [c for c in out if len(c) > 1 and c[:-1] not in have]
    if missing:
        raise ValueError(f"choices must contain every path's parent: {missing[0][:-1]} missing for {missing[0]}")
    return out


def choose_tree(accuracy, size: int) -> list[tuple]:
    """The ``size`` paths with the highest estimated acceptance ``prod_d accuracy[d][rank_d]``, grown
    best-first from the root (Medusa §2.1.2): every chosen path's parent is chosen before it, so the
    expected accepted length ``sum`` of those probabilities is the largest any tree of that size gets."""
    check_positive_int("size", size)
    chosen, frontier = [], [(accuracy[0][i], (i,)) for i in range(len(accuracy[0]))]
    while frontier and len(chosen) < size:
        frontier.sort(key=lambda f: -f[0])
        prob, path = frontier.pop(0)
        chosen.append(path)
        if len(path) < len(accuracy):
            frontier += [(prob * accuracy[len(path)][i], path + (i,)) for i in range(len(accuracy[len(path)]))]
    return sorted(chosen, key=lambda c: (len(c), c))


def tree_rows(choices: list[tuple], top: torch.Tensor, caps: list[int]):
    """Per row, the nodes of ``choices`` no deeper than ``caps[r]``: ``(tokens, parents)`` with node
    ``c`` = head ``len(c)``'s rank-``c[-1]`` token. ``top`` (b, K, k) the heads' top-k ids."""
    rows = []
    for r, cap in enumerate(caps):
        keep = [c for c in choices if len(c) <= cap]
        pos = {c: i for i, c in enumerate(keep)}
        t = top[r].tolist()
        rows.append(([t[len(c) - 1][c[-1]] for c in keep], [pos[c[:-1]] if len(c) > 1 else ROOT for c in keep]))
    return rows


# ---------------------------------------------------------------------------------------
# typical acceptance (lossy) as a tree walk
# ---------------------------------------------------------------------------------------
class TypicalTree(Tree):
    """A :class:`~refimpl.tree.Tree` verified by Medusa's typical acceptance (§2.3.1): below each
    node take the first child x with ``p(x) > min(eps, delta * exp(-H(p)))``; after the last
    accepted node sample from p. LOSSY: the output is not distributed as the target's samples."""

    eps: float = TYPICAL_EPS
    delta: float = TYPICAL_DELTA

    def verify(self, x, logits, valid, q, settings, rule=None):
        if settings.greedy:  # at temperature 0 typical acceptance is greedy acceptance
            return super().verify(x, logits, valid, q, settings, rule)
        p = settings.probs(logits)  # (b, 1 + m, V)
        ent = -(p * p.clamp_min(1e-30).log()).sum(-1)  # (b, 1 + m)
        bar = torch.minimum(torch.full_like(ent, self.eps), self.delta * torch.exp(-ent))
        xs, parents, vs = x.tolist(), self.parents.tolist(), valid.tolist()
        walks = []
        for r in range(x.shape[0]):
            ok = lambda node, c, r=r: float(p[r, node + 1, xs[r][c]]) > float(bar[r, node + 1])  # noqa: E731
            walks.append(self.walk(parents[r], vs[r], lambda node, kids, r=r: next((c for c in kids if ok(node, c)), None),
                                   lambda node, r=r: int(sampling.sample_from_probs(p[r, node + 1][None],
                                                                                    settings.generator)[0])))
        return self.outcome(walks, logits.device)


# ---------------------------------------------------------------------------------------
# the proposer
# ---------------------------------------------------------------------------------------
class MedusaDraft(Proposer):
    """Proposer: the heads read the target's hidden state at the last accepted node and propose the
    ``choices`` tree below the next token (deterministic children, ``q = None``). The first call
    (the prefill) proposes nothing: there is no hidden state yet."""


    def __init__(self, heads: MedusaHeads, choices, tree_size: int, acceptance: str):
        if acceptance not in ("lossless", "typical"):
            raise ValueError(f"acceptance must be 'lossless' or 'typical', got {acceptance!r}")
        if choices is None:
            if not heads.accuracy:
                raise ValueError("choices=None needs heads trained with measured accuracies (heads.accuracy)")
            choices = choose_tree(heads.accuracy, tree_size)
        self.heads, self.choices = heads, check_choices(choices, heads.num_heads)
        self.width = 1 + max(max(c) for c in self.choices)  # top-k needed from every head
        self.kind = TypicalTree if acceptance == "typical" else Tree

    def start(self, ids, mask, settings) -> Needs:
        self.h, self.device = None, ids.device
        return Needs(hidden=True, trees=True)

    def propose(self, caps: list[int]) -> object:
        if self.h is None or max(caps) <= 0:
            return pack([([], [])] * len(caps), self.device)
        top = self.heads.top(self.h, self.width)  # (b, K, width)
        rows = tree_rows(self.choices, top.cpu(), caps)
        prop = pack(rows, self.device)
        if prop.tree is not None and self.kind is not Tree:
            prop = prop._replace(tree=self.kind(prop.tree.parents, prop.tree.depth, prop.tree.see))
        return prop

    def accept(self, v) -> None:
        n = v.n.to(v.hidden.device)
        last = torch.zeros_like(n)  # index into (root, node 0, node 1, ...)
        if v.path is not None and v.path.shape[1]:
            deep = v.path.to(n.device).gather(1, (n - 1).clamp(min=0)[:, None])[:, 0] + 1
            last = torch.where(n > 0, deep, last)
        elif v.path is None:
            last = n  # a chain: the n-th draft
        self.h = v.hidden[torch.arange(n.shape[0], device=n.device), last]  # (b, H)

    def select(self, rows: torch.Tensor) -> None:
        self.h = None if self.h is None else self.h[rows.to(self.h.device)]


#: named configurations (:func:`refimpl.generation.preset_options`): ``"cpu"``, the tree size
#: measured fastest with the zoo's heads on SmolLM2-135M (``bench_results/plain_calls/``: 8 of 8, 16,
#: 32, 63 nodes; each node costs a CPU target more than it adds to tau); ``"paper"``,
#: Medusa's 63-node default tree size (FasterDecoding/Medusa ``mc_sim_7b_63``; ours is chosen by
#: the same accuracy-greedy rule from our heads' accuracies). Both verify losslessly.
PRESETS = {"cpu": {"tree_size": 8, "acceptance": "lossless"},
           "paper": {"tree_size": 63, "acceptance": "lossless"}}


def generate(target, prompts, heads: MedusaHeads | None = None, acceptance: str | None = None, choices=None,
             tree_size: int | None = None, max_new_tokens: int = 64, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, generator: torch.Generator | None = None,
             eos_token_id=None, preset: str | None = None) -> Generation:
    """Medusa decoding: ``heads`` (required: ``refimpl.generate(target, prompts, method="medusa")`` takes
    the zoo's for the target) propose the ``choices`` tree (None: :func:`choose_tree` of ``tree_size`` nodes from the heads'
    measured accuracies; ``tree_size`` and ``acceptance`` left None come from ``preset``, :data:`PRESETS`).

    ``acceptance="lossless"``: greedy output identical to ``autoregressive.generate``; sampling
    distributed exactly as the target's (SpecInfer's rule). ``"typical"``: Medusa's typical
    acceptance, LOSSY under sampling (identical to greedy at temperature 0)."""
    o = preset_options(PRESETS, preset, target, tree_size=tree_size, acceptance=acceptance)
    tree_size, acceptance = o["tree_size"], o["acceptance"]
    required(heads, "heads", "medusa")
    check_width("heads", heads.lm_head.shape[1], target)
    check_vocab("heads", heads.lm_head.shape[0] if heads.kept is None else int(heads.kept.max()) + 1, target,
                exact=heads.kept is None)
    return decode(target, MedusaDraft(heads, choices, tree_size, acceptance), prompts, max_new_tokens, temperature,
                  top_k, top_p, generator, eos_token_id)


def expected_length(accuracy, choices) -> float:
    """Expected tokens per target call of a tree under the independence estimate: 1 + sum over
    paths of prod_d accuracy[d][rank_d] (the quantity :func:`choose_tree` maximises)."""
    return 1.0 + sum(math.prod(accuracy[d][r] for d, r in enumerate(c)) for c in choices)
