"""Reference answers for chapter 06a (Medusa heads and EAGLE). Shown only when the learner asks."""
import math

import torch


def head_logits(weight, bias, lm_head, h):
    """One Medusa head (arXiv 2401.10774, §2.1.1): the residual block h + SiLU(W h + b), then the LM head."""
    z = h + torch.nn.functional.silu(h @ weight.T + bias)   # (..., H)
    return z @ lm_head.T                                     # (..., V)


def next_hidden(hidden, path):
    """The state after the last accepted node (row i + 1 for node i), or after the root t (row 0)."""
    return hidden[path[-1] + 1] if path else hidden[0]


def typical_accept(p, x, eps=0.09, delta=0.3):
    """Medusa's typical acceptance (§2.3.1): p(x) > min(eps, delta * exp(-H(p)))."""
    entropy = float(-(p * p.clamp_min(1e-30).log()).sum())
    return float(p[x]) > min(eps, delta * math.exp(-entropy))


def rerank(tokens, parents, values, depth, cap, total):
    """EAGLE-2's re-rank (arXiv 2406.16858, §4.2): of the grown nodes no deeper than ``cap``, the
    ``total`` of highest cumulative confidence (a stable sort: on a tie the node grown first, so a
    parent before its child), in grown order, parents re-indexed into the kept list."""
    allowed = [i for i in range(len(tokens)) if depth[i] <= cap]
    keep = sorted(sorted(allowed, key=lambda i: -values[i])[:total])
    where = {g: i for i, g in enumerate(keep)}
    return [tokens[g] for g in keep], [-1 if parents[g] == -1 else where[parents[g]] for g in keep]
