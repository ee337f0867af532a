"""Turning logits into the next token: temperature, top-k, top-p (nucleus) and seeded sampling.

``probs(logits, temperature, top_k, top_p)`` gives the distribution a decoder samples from;
temperature 0 means greedy (argmax). Speculative methods apply the *same* processing to the
target ``p`` and the draft ``q`` so that the rejection rule targets the distribution plain
sampling would draw from.
"""
from __future__ import annotations

import torch


def check_sampling_args(temperature: float, top_k: int | None = None, top_p: float | None = None) -> None:
    """Raise ``ValueError`` naming the argument for temperature < 0, top_k < 1 or top_p not in (0, 1]."""
    if not isinstance(temperature, (int, float)) or temperature != temperature or temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 means greedy), got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be an integer >= 1 or None, got {top_k!r}")
    if top_p is not None and (not isinstance(top_p, (int, float)) or not (0.0 < top_p <= 1.0)):
        raise ValueError(f"top_p must be in (0, 1] or None, got {top_p!r}")


def apply_top_k(logits: torch.Tensor, top_k: int | None) -> torch.Tensor:
    """Keep the ``top_k`` largest logits of the last dim (ties at the threshold kept), -inf elsewhere."""
    if top_k is None or top_k >= logits.size(-1):
        return logits
    kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # (..., 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def apply_top_p(logits: torch.Tensor, top_p: float | None) -> torch.Tensor:
    """Nucleus: keep the smallest set of most likely tokens whose probability reaches ``top_p``.

    The token that crosses ``top_p`` is kept (so at least one token always survives).
    """
    if top_p is None or top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
    # remove a token when the mass strictly before it already reaches top_p
    remove_sorted = (cum - torch.softmax(sorted_logits, dim=-1)) >= top_p
    remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


def process_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                   top_p: float | None = None) -> torch.Tensor:
    """Warped logits: divide by temperature, then top-k, then top-p (the order HF uses)."""
    logits = logits.float()
    if temperature > 0:
        logits = logits / temperature
    return apply_top_p(apply_top_k(logits, top_k), top_p)


def probs(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
          top_p: float | None = None) -> torch.Tensor:
    """The sampling distribution (..., V). Temperature 0 gives the one-hot argmax distribution."""
    check_sampling_args(temperature, top_k, top_p)
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.size(-1)).float()
    return torch.softmax(process_logits(logits, temperature, top_k, top_p), dim=-1)


def sample_from_probs(p: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One draw per row of ``p`` (..., V) -> (...), by the inverse CDF: one uniform ``u`` per row from
    ``generator`` (on the generator's device, so a seed gives the same draws on any device), and the first
    token whose cumulative probability exceeds ``u`` times the row's total. Token ``i`` is drawn with
    probability ``p_i / sum(p)``; a zero-probability token never is. (``torch.multinomial`` draws the same
    distribution by an exponential race over all V tokens: V random numbers a draw instead of one, 1.6 ms
    instead of ~0.05 ms on a 49,152-token vocabulary.)"""
    flat = p.reshape(-1, p.size(-1)).float()  # (N, V)
    gdev = generator.device if generator is not None else flat.device
    u = torch.rand((flat.shape[0], 1), generator=generator, device=gdev).to(flat.device)  # (N, 1)
    cdf = flat.cumsum(-1)  # (N, V), non-decreasing
    idx = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)  # first i with cdf_i > u * total
    return idx.clamp_(max=p.size(-1) - 1).view(p.shape[:-1])


def sample(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
           top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Next token ids (...) from logits (..., V): argmax at temperature 0, else a seeded draw."""
    check_sampling_args(temperature, top_k, top_p)
    if temperature == 0:
        return logits.argmax(-1)
    return sample_from_probs(probs(logits, temperature, top_k, top_p), generator)
