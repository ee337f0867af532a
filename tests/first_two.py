"""The statistical check every lossless sampler's tests share: the first two sampled tokens against
the target's exact joint distribution, by a chi-square test (rare cells pooled into one)."""
import torch

from refimpl import sampling


def exact_first_two(lm, prompt, temperature, top_k) -> dict:
    """{(a, b): probability} of the target's first two tokens after ``prompt`` under the sampling settings."""
    p1 = sampling.probs(lm.logits(torch.tensor([prompt]))[0, -1], temperature, top_k)
    firsts = p1.nonzero()[:, 0].tolist()
    p2 = sampling.probs(lm.logits(torch.tensor([prompt + [a] for a in firsts]))[:, -1], temperature, top_k)
    return {(a, b): float(p1[a] * p2[i, b]) for i, a in enumerate(firsts) for b in p2[i].nonzero()[:, 0].tolist()}


def first_two_pvalue(rows, exact: dict) -> float:
    """Chi-square p-value of the first two tokens of each row of ``rows`` against ``exact``; 0 when a
    row starts with a pair the target never emits (an infinite statistic)."""
    from scipy.stats import chisquare

    n = len(rows)
    counts: dict = {}
    for t in rows:
        counts[tuple(t[:2])] = counts.get(tuple(t[:2]), 0) + 1
    if not set(counts) <= set(exact):
        return 0.0
    big = [k for k in exact if exact[k] * n >= 5]  # pool the rare cells into one
    obs = [counts.get(k, 0) for k in big] + [n - sum(counts.get(k, 0) for k in big)]
    exp = [exact[k] * n for k in big] + [n * (1 - sum(exact[k] for k in big))]
    if exp[-1] < 1e-9 and obs[-1] == 0:  # no rare cells at all: drop the empty pooled cell
        obs, exp = obs[:-1], exp[:-1]
    exp = [e * sum(obs) / sum(exp) for e in exp]  # exact float normalisation for scipy
    return chisquare(obs, exp).pvalue
