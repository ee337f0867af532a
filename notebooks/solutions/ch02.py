"""Reference answers for chapter 02 (draft, then verify). Shown only when the learner asks."""
import torch


def my_verify_greedy(draft, logits):
    """draft (B, gamma), logits (B, gamma + 1, V) -> (n, next) (B,): the all-match prefix length
    (cumprod of the matches stops counting at the first mismatch) and the argmax after it."""
    top = logits.argmax(-1)                                  # (B, gamma + 1)
    match = (draft == top[:, : draft.shape[1]]).long()       # (B, gamma)
    n = match.cumprod(-1).sum(-1)                            # (B,)
    return n, top.gather(1, n[:, None])[:, 0]


def self_draft_calls(new_tokens, gamma):
    """Every step emits min(gamma + 1, remaining) tokens, so ceil(N / (gamma + 1)) target calls;
    a step with g drafts costs g draft forwards and emits g + 1 tokens, so draft calls = N - target calls."""
    calls = -(-new_tokens // (gamma + 1))
    return calls, new_tokens - calls


def simulate_tau(alpha, gamma, steps, gen):
    """Mean tokens per step: accepted drafts (Bernoulli(alpha) left to right until the first
    failure) plus the target's own token."""
    ok = torch.rand(steps, gamma, generator=gen, device=gen.device) < alpha   # (steps, gamma)
    accepted = ok.long().cumprod(-1).sum(-1)                           # (steps,)
    return (accepted + 1).float().mean().item()
