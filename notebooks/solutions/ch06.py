"""Reference answers for chapter 06 (Medusa heads). Shown only when the learner asks."""
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
