"""Reference answers for chapter 07 (Jacobi decoding). Shown only on request (SHOW_SOLUTIONS or
COURSE_ANSWERS=1); the notebook's checks run against them in CI."""
from __future__ import annotations

import torch


def jacobi_update(lm, prefix_ids, guesses):
    """One parallel Jacobi update: [argmax p(. | prefix, guesses[:i]) for i in range(len(guesses))]."""
    prefix, guesses = list(prefix_ids), list(guesses)
    if not guesses:
        return []
    ids = torch.tensor([prefix + guesses], device=lm.device)
    logits = lm.logits(ids)[0]  # ONE causal call: position j sees prefix + guesses up to j
    # the logits after the last prefix token predict guess 0; those after guess i - 1 predict guess i
    return logits[len(prefix) - 1: len(prefix) - 1 + len(guesses)].argmax(-1).tolist()


def jacobi_call_bounds(new_tokens, window):
    """(fewest, most) target calls of greedy Jacobi for ``new_tokens`` tokens with ``window`` guesses.

    Fewest: every guess right, so a call commits its ``window`` guesses plus the token after them.
    Most: one token per call (only the first position's context is sure to be final), like AR.
    """
    return -(-new_tokens // (window + 1)), new_tokens


def sjd_accept_prob(p_new, p_old):
    """P(accept) of a guess x ~ p_old under min(1, p_new(x) / p_old(x)):
    sum_x p_old(x) min(1, p_new(x) / p_old(x)) = sum_x min(p_old(x), p_new(x)) = 1 - TV(p_new, p_old)."""
    return float(torch.minimum(p_new, p_old).sum())
