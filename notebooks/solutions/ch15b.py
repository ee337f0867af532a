"""Reference answers for chapter 15b (parallel drafters: PARD, DFlash)."""
import torch


def pard_allow(T, k):
    """PARD's k copies of a T-token sequence, every position kept: item (j, p) = copy j, position p,
    at index j * T + p. A real token (copy 0) sees the real tokens up to itself; the mask of depth j at
    position p sees the real tokens up to its anchor p - j and its chain: masks (i, p - j + i), 1 <= i <= j."""
    allow = torch.zeros(k * T, k * T, dtype=torch.bool, device="cpu")   # from sizes only: a host tensor
    for j in range(k):
        for p in range(T):
            row, anchor = j * T + p, p - j
            if anchor < 0:                                               # no real token before it: never used
                allow[row, row] = True
                continue
            allow[row, :anchor + 1] = True                               # the context up to the anchor
            for i in range(1, j + 1):
                allow[row, i * T + anchor + i] = True                    # its chain of masks, itself last
    return allow


def dflash_allow(T, anchors, g):
    """DFlash's training mask: block n (g slots, rows n g .. n g + g - 1) sees the context before its
    anchor (columns 0 .. anchors[n] - 1) and its own g slots (columns T + n g ..), nothing else."""
    N = len(anchors)
    allow = torch.zeros(N * g, T + N * g, dtype=torch.bool, device="cpu")
    for n, a in enumerate(anchors):
        allow[n * g:(n + 1) * g, :a] = True
        allow[n * g:(n + 1) * g, T + n * g:T + (n + 1) * g] = True
    return allow


def predicted_speedup(accept, draft_cost, verify_cost):
    """Speed-up over AR = tau / step cost: tau = 1 + sum(accept) tokens a step, at draft_cost +
    verify_cost AR steps a step."""
    return (1 + sum(accept)) / (draft_cost + verify_cost)
