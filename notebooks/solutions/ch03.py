"""Reference answers for chapter 03 (speculative sampling). Shown only when the learner asks."""
import torch


def my_one_position(p, q, x, u0, u1):
    """Speculative sampling at one position: accept the draft x ~ q iff u0 * q(x) < p(x)
    (probability min(1, p(x)/q(x))); else draw from norm(max(0, p - q)) by inverse CDF with u1."""
    if u0 * q[x] < p[x]:
        return x
    w = (p - q).clamp(min=0)
    cum = w.cumsum(-1)
    hit = (cum > u1 * w.sum()) & (w > 0)
    return int(hit.nonzero()[0]) if hit.any() else int((w > 0).nonzero()[-1])


def acceptance(p, q):
    """beta = sum_x min(p(x), q(x)): the probability that a draft x ~ q is accepted."""
    return float(torch.minimum(p, q).sum())


def tau_formula(alpha, gamma):
    """Expected tokens per target call with i.i.d. acceptance alpha and gamma drafts (Leviathan eq. 1)."""
    if alpha >= 1:
        return gamma + 1.0
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)
