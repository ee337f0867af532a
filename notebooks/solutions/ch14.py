"""Reference answers for chapter 14 (block diffusion, a dLLM as drafter, lossless dLLM decoding)."""
import torch


def decode_allow(n_cache, n_pending, b):
    """Who sees whom in one block-diffusion call: rows = pending tokens then block slots, columns =
    cached tokens, pending tokens, block slots. Pending: everything cached + pending up to itself
    (causal); block: everything (cache, pending, the whole block)."""
    q = n_pending + b
    allow = torch.zeros(q, n_cache + q, dtype=torch.bool, device="cpu")   # from sizes only: a host tensor
    allow[:, :n_cache] = True                                        # the cache is all committed text
    for i in range(n_pending):
        allow[i, n_cache: n_cache + i + 1] = True                    # causal among the pending tokens
    allow[n_pending:, n_cache:] = True                               # the block sees pending + block
    return allow


def first_draft_acceptance(p, q):
    """Probability that speculative sampling accepts a draft x ~ q under target p: sum_x min(p, q)."""
    return float(torch.minimum(p, q).sum())


def guesses(x, logits, k, K, mask_id):
    """FreeDave's drafts: apply the greedy low-confidence step (commit the k most confident masked
    positions) K times, always with the same predictions ``logits`` (T, V). -> [D_1, ..., D_K]."""
    lg = logits.clone()
    lg[:, mask_id] = float("-inf")
    x0 = lg.argmax(-1)                                               # (T,) predictions, fixed
    conf = torch.softmax(lg.double(), -1).gather(-1, x0[:, None])[:, 0]  # (T,)
    out = []
    for _ in range(K):
        masked = x == mask_id
        if not bool(masked.any()):
            break
        c = conf.masked_fill(~masked, float("-inf"))
        top = torch.sort(c, descending=True, stable=True).indices[: min(k, int(masked.sum()))]
        x = x.clone()
        x[top] = x0[top]
        out.append(x)
    return out
