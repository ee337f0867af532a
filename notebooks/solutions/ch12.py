"""Reference answers for chapter 12 (dLLM parallel decoding). Shown only when the learner asks."""
import math

import torch


def factor_select(conf, f):
    """Fast-dLLM's factor rule on one block: conf (N,) confidences (-inf = not masked) -> (N,) bool.
    Sort c_(1) >= c_(2) >= ...; commit the top n, n the largest with (n + 1)(1 - c_(n)) < f
    (the left side grows with n, so checking every rank up to n is the same); at least one."""
    order = torch.sort(conf, descending=True).indices
    n = 0
    while n < len(conf) and torch.isfinite(conf[order[n]]) and (n + 2) * (1 - conf[order[n]]) < f:
        n += 1                                      # rank n + 1 passes: (rank + 1)(1 - c) < f
    n = max(n, 1) if torch.isfinite(conf).any() else 0
    sel = torch.zeros_like(conf, dtype=torch.bool)
    sel[order[:n]] = True
    return sel


def commit_all_now(tail_logits, tail_masked, gap):
    """Our early-commit test: the mean, over the still-masked answer positions, of p_top1 - p_top2
    (softmax probabilities) is at least ``gap``. tail_logits (N, V) with MASK already at -inf."""
    if not bool(tail_masked.any()):
        return False
    p = torch.softmax(tail_logits.double(), -1).topk(2, dim=-1).values   # (N, 2)
    return bool((p[:, 0] - p[:, 1])[tail_masked].mean() >= gap)


def p_valid(n):
    """n positions each uniform over n items, independently: all distinct with probability n! / n^n."""
    return math.factorial(n) / n ** n
