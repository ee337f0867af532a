"""Reference answers for chapter 15 (models trained to decode in parallel)."""
import torch


def local_targets(states, j):
    """The local consistency target (CLLMs eq. 5): for each row b, the state one iteration after
    ``j[b]`` on its trajectory, the fixed point itself once ``j[b]`` is the last state.
    states (S, B, n), j (B,) -> (B, n)."""
    S = states.shape[0]
    nxt = torch.clamp(j + 1, max=S - 1)                              # (B,) never past the fixed point
    return states[nxt, torch.arange(states.shape[1], device=states.device)]


def certainty_mask(logits, state, final, mask_id):
    """Where dParallel's certainty term applies: masked positions whose argmax is already the
    trajectory's token. logits (B, b, V), state / final (B, b) -> (B, b) bool."""
    return (state == mask_id) & (logits.argmax(-1) == final)


def predicted_speedup(tokens_per_call, call_cost):
    """Speed-up over AR = tokens per call / (cost of one call in AR steps)."""
    return tokens_per_call / call_cost
