"""Reference answers for chapter 05 (token trees). Shown only when the learner asks."""
import torch


def ancestor_mask(parents):
    """(m,) parent list -> (m, m) bool: [i, j] True when node j is node i or one of its ancestors."""
    m = len(parents)
    mask = torch.zeros((m, m), dtype=torch.bool, device="cpu")   # from a Python list: a host tensor
    for i, p in enumerate(parents):        # parents come first: row p is complete when we reach i
        if p >= 0:
            mask[i] = mask[p]
        mask[i, i] = True
    return mask


def greedy_path(tokens, parents, best):
    """Walk from the root keeping the (first) child whose token is the target's argmax."""
    path, node = [], -1
    while True:
        kid = next((c for c in range(len(tokens)) if parents[c] == node and tokens[c] == best[node + 1]), None)
        if kid is None:
            return path, best[node + 1]
        path.append(kid)
        node = kid


def settled(values, level, total, floor):
    """Stop growing below the level values[lo:hi]? Its best node cannot enter the kept tree (it is no
    better than the total-th best so far; its children are worth at most as much and lose ties, being
    grown later), or it is less likely than floor."""
    import math

    best = max(values[level[0]:level[1]])
    if math.exp(best) < floor:
        return True
    return len(values) >= total and best <= sorted(values, reverse=True)[total - 1]
