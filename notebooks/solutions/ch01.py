"""Reference answers for chapter 01 (the autoregressive baseline). Shown only when the learner asks."""
import torch


def probs_min_p(logits, min_p):
    """Keep tokens with p >= min_p * max(p) (per row), renormalise."""
    pr = torch.softmax(logits.float(), -1)
    keep = pr >= min_p * pr.max(-1, keepdim=True).values
    kept = torch.where(keep, pr, torch.zeros_like(pr))
    return kept / kept.sum(-1, keepdim=True)


def my_sample(pr, gen):
    """Inverse CDF: one uniform per row from ``gen``; the first token whose cumulative mass exceeds it."""
    pr = pr.float()
    cum = pr.cumsum(-1)                                             # (B, V)
    u = torch.rand(pr.shape[0], 1, generator=gen, device=pr.device) * cum[:, -1:]   # (B, 1), scaled to the row's total
    idx = (cum <= u).sum(-1)                                        # first index with cum > u
    last = pr.shape[-1] - 1 - (pr.flip(-1) > 0).long().argmax(-1)  # last token with p > 0 (rounding guard)
    return torch.minimum(idx, last)


def forward_work(L, n, use_cache):
    """(calls, positions): n calls either way; L + t positions at step t without a cache, or a
    prefill of L positions then one position per later token with one (the last token is never fed)."""
    if use_cache:
        return n, L + n - 1
    return n, n * L + n * (n - 1) // 2
