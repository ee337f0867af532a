"""The pieces several chapters share, written once: rotary positions, RMSNorm, attention masks, ragged
batches and the n-gram lookup.

- **Rotary position embedding** (Su et al., "RoFormer", arXiv 2104.09864, §3.4; Llama's half-split
  form): the pair ``(x_i, x_{i + d/2})`` of a head of size ``d`` at position ``m`` turns by the angle
  ``m theta^(-2i/d)``. :func:`rope_tables` gives ``cos2 = [cos, cos]`` and ``sin2 = [-sin, sin]``,
  so :func:`rotate` is ``x cos2 + roll(x, d/2) sin2`` = ``[x1 cos - x2 sin, x2 cos + x1 sin]``.
- **RMSNorm** (Zhang & Sennrich, arXiv 1910.07467): ``weight * x / sqrt(mean(x^2) + eps)``, in float32.
- **Masks** as bool tensors (True = may attend) and the additive float form models take (0 / -inf).
- **Ragged batches**: left padding, position ids that skip pads, and back to lists of real tokens.
- **Prompt lookup's n-gram match** ("Prompt lookup decoding", Saxena 2023; LLMA, Yang et al., arXiv
  2304.04487): the position after the latest earlier occurrence of the context's last ``n`` tokens,
  longest ``n`` first. Prompt lookup (chapter 09), Jacobi's n-gram first guesses (chapters 07 and 15)
  and the copy prior (chapters 04b-06) are all built on it.

Layer 1: torch only.
"""
from __future__ import annotations

import torch

# -- rotary position embedding ------------------------------------------------------------------


def rope_theta(config, default: float = 10000.0) -> float:
    """A Hugging Face config's rotary base (``rope_parameters["rope_theta"]`` in transformers 5, else
    ``rope_theta``)."""
    return (getattr(config, "rope_parameters", None) or {}).get("rope_theta", getattr(config, "rope_theta", default))


def inv_frequencies(d: int, theta: float, device=None) -> torch.Tensor:
    """The rotary frequencies ``theta^(-2i/d)`` (d/2,) for head size ``d``, float32."""
    return 1.0 / (theta ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d))


def rope_tables(pos: torch.Tensor, d: int, theta: float, dtype=torch.float32, inv: torch.Tensor | None = None):
    """``(cos2, sin2)``, each (B, 1, T, d), at positions ``pos`` (B, T): ``[cos, cos]`` and ``[-sin, sin]``
    (``inv``: :func:`inv_frequencies`, computed once by a caller that steps many times)."""
    inv = inv_frequencies(d, theta, pos.device) if inv is None else inv  # (d/2,)
    ang = pos.to(torch.float32)[:, None, :, None] * inv  # (B, 1, T, d/2)
    cos, sin = ang.cos(), ang.sin()
    return torch.cat([cos, cos], -1).to(dtype), torch.cat([-sin, sin], -1).to(dtype)


def rotate(x: torch.Tensor, cos2: torch.Tensor, sin2: torch.Tensor) -> torch.Tensor:
    """Rotate x (..., B, h, T, d) by :func:`rope_tables` (B, 1, T, d): ``[x1 cos - x2 sin, x2 cos + x1 sin]``
    in four calls (a negation is exact, a sum of two terms commutes: the bits of the eight-call form)."""
    return x * cos2 + x.roll(x.shape[-1] // 2, -1) * sin2


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary position embedding of x (..., B, h, T, d) at positions pos (B, T)."""
    return rotate(x, *rope_tables(pos, x.shape[-1], theta, x.dtype))


# -- RMSNorm ---------------------------------------------------------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last axis, computed in float32 as Llama does, back in x's dtype."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


class RMSNorm(torch.nn.Module):
    """:func:`rms_norm` with a learned ``weight`` (dim,), initialised to ones."""

    def __init__(self, dim: int, eps: float = 1e-6, device=None):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim, device=device))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


# -- attention masks -------------------------------------------------------------------------------


def causal(mask: torch.Tensor) -> torch.Tensor:
    """(B, T) 1 = real -> (B, T, T) bool: query i sees the real keys j <= i (a pad sees itself: no
    empty softmax rows)."""
    T = mask.shape[1]
    allow = torch.ones(T, T, dtype=torch.bool, device=mask.device).tril()[None] & mask.bool()[:, None, :]
    return allow | torch.eye(T, dtype=torch.bool, device=mask.device)[None]


def causal_after(B: int, T: int, P: int, device) -> torch.Tensor:
    """(B, T, P + T) bool: T new queries after P cached keys, none of them padding, see every cached
    key and the new ones up to themselves."""
    return torch.ones(T, P + T, dtype=torch.bool, device=device).tril(P)[None].expand(B, T, P + T)


def additive(allow: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """Bool (B, Q, K), True = may attend -> the 4-D additive float mask (B, 1, Q, K) the models take:
    0 where allowed, -inf elsewhere."""
    return torch.zeros(allow.shape, dtype=dtype, device=allow.device).masked_fill(~allow, float("-inf"))[:, None]


# -- ragged batches --------------------------------------------------------------------------------


def left_pad(prompts: list[list[int]], pad_id: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged prompts -> (ids (B, L), mask (B, L)) with pads on the left (mask 0 on pads)."""
    L = max(len(p) for p in prompts)
    rows = [[pad_id] * (L - len(p)) + list(p) for p in prompts]
    mask = [[0] * (L - len(p)) + [1] * len(p) for p in prompts]
    return (torch.tensor(rows, dtype=torch.long, device=device).view(len(prompts), L),
            torch.tensor(mask, dtype=torch.long, device=device).view(len(prompts), L))


def unpad(ids: torch.Tensor, mask: torch.Tensor | None) -> list[list[int]]:
    """Left-padded ids (B, L) and their mask (B, L) (None: no pads) -> each row's real tokens, as lists."""
    if mask is None:
        return ids.tolist()
    return [row[keep].tolist() for row, keep in zip(ids.cpu(), mask.bool().cpu())]


def positions_from_mask(mask: torch.Tensor, start: torch.Tensor | None = None) -> torch.Tensor:
    """Position ids (B, L) that count real tokens only: ``start`` (B,) (None: 0), then +1 per real token
    (pads: clamped, never used)."""
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return pos if start is None else pos + start[:, None]


# -- the n-gram lookup -----------------------------------------------------------------------------

#: up to this many end positions, :func:`lookup_positions` scans Python lists (``method="auto"``)
SCAN_AT_MOST = 16


def check_ngrams(max_ngram: int, min_ngram: int) -> None:
    """Raise ``ValueError`` naming both unless ``1 <= min_ngram <= max_ngram`` (every n-gram lookup's range)."""
    if not 1 <= min_ngram <= max_ngram:
        raise ValueError(f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}")


def scan_positions(history: list[int], t: int, max_ngram: int, min_ngram: int) -> int:
    """:func:`lookup_positions` for one end ``t`` of one row (``0 <= t < len(history)``), by a plain
    scan back from ``t``: for ``n = max_ngram .. min_ngram``, the latest earlier start ``s`` with
    ``history[s : s + n] == history[t - n + 1 : t + 1]`` gives ``s + n``; ``-1`` where none."""
    for n in range(max_ngram, min_ngram - 1, -1):
        if t < n:  # no earlier occurrence can end before t
            continue
        pattern = history[t - n + 1: t + 1]
        if min(pattern) < 0:  # an unknown token in the n-gram never matches
            continue
        for start in range(t - n, -1, -1):  # the occurrence ends at start + n - 1 < t
            if history[start] == pattern[0] and history[start: start + n] == pattern:
                return start + n
    return -1


class NgramIndex:
    """:func:`scan_positions` at the end of a growing history, in O(1) a query: a dict from every
    n-gram (``n <= max_ngram``) to the position just after its latest occurrence, kept up to date
    as tokens are appended (what a serving engine's n-gram proposer keeps instead of rescanning).

    ``history`` is the list the index grows (:meth:`extend` appends to it); :meth:`find` ==
    ``scan_positions(history, len(history) - 1, max_ngram, min_ngram)``. The n-grams ending at the
    last token are registered only once a token follows it, so a suffix never finds itself."""

    def __init__(self, tokens, max_ngram: int = 3, min_ngram: int = 1):
        check_ngrams(max_ngram, min_ngram)
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.history: list[int] = []
        self.after: dict[tuple, int] = {}  # n-gram -> position after its latest occurrence before the last token
        self.extend(tokens)

    def extend(self, tokens) -> None:
        h, after = self.history, self.after
        for tok in tokens:
            t = len(h) - 1  # the current last token becomes an earlier one: register the n-grams ending there
            for n in range(1, min(self.max_ngram, t + 1) + 1):
                after[tuple(h[t - n + 1: t + 1])] = t + 1
            h.append(tok)

    def find(self) -> int:
        """The position after the latest earlier occurrence of the history's last n-gram, longest
        ``n`` first; -1 where none (or where the n-gram holds an unknown token, < 0)."""
        h, t = self.history, len(self.history) - 1
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if t < n:  # no earlier occurrence can end before t
                continue
            pattern = tuple(h[t - n + 1:])
            if min(pattern) >= 0 and pattern in self.after:
                return self.after[pattern]
        return -1


def lookup_positions(history: torch.Tensor, ends: torch.Tensor, max_ngram: int = 3, min_ngram: int = 2,
                     method: str = "auto") -> torch.Tensor:
    """Prompt lookup: for each end position ``t`` in ``ends``, the position just after the most
    recent earlier occurrence of the context suffix ``history[t-n+1 : t+1]``, trying
    ``n = max_ngram .. min_ngram`` (longest match first); ``-1`` where none matches.

    ``history`` (L,) or (B, L) holds the tokens by position (``-1`` = unknown, never matches);
    ``ends`` (Q,) or (B, Q) the positions to score (``-1`` = skip). An occurrence is *earlier*
    when it ends before ``t``, so the returned position is at most ``t``: the lookup never peeks
    past the position it scores.

    ``method``: ``"vectorised"`` compares every window at once (a batch of rows and ends, a few tensor
    operations); ``"scan"`` runs :func:`scan_positions` per end (a draft step scores one end a row,
    where a Python scan is cheaper than the tensor operations); ``"auto"`` scans for at most
    :data:`SCAN_AT_MOST` ends inside the history. Both give the same positions.
    """
    if method not in ("auto", "scan", "vectorised"):
        raise ValueError(f"method must be 'auto', 'scan' or 'vectorised', got {method!r}")
    one = history.dim() == 1
    history, ends = (history[None], ends[None]) if one else (history, ends)
    ends = ends.long().to(history.device)
    B, Q = ends.shape
    last = int(ends.max()) if ends.numel() else -1  # the latest end (one device sync)
    inside = last < history.shape[1]
    if method == "scan" and not inside:
        raise ValueError(f"method='scan' needs every end < the history's length {history.shape[1]}")
    if method == "scan" or (method == "auto" and inside and ends.numel() <= SCAN_AT_MOST):
        rows, at = history.tolist(), ends.tolist()
        got = [[scan_positions(h, t, max_ngram, min_ngram) if t >= 0 else -1 for t in row] for h, row in zip(rows, at)]
        out = torch.tensor(got, dtype=torch.long, device=history.device).view(B, Q)
        return out[0] if one else out
    out = torch.full_like(ends, -1)  # (B, Q)
    L = min(history.shape[1], last + 1)  # 0 without ends
    for n in range(max_ngram, min_ngram - 1, -1):
        if L < n + 1:
            continue
        windows = history[:, :L].unfold(1, n, 1)  # (B, S, n): window i = history[b, i : i + n]
        S = windows.shape[1]
        start = torch.arange(S, device=history.device)  # (S,)
        at = (ends - n + 1).clamp(min=0, max=S - 1)  # (B, Q) where the suffix ending at t starts
        pattern = torch.gather(windows, 1, at[..., None].expand(B, Q, n))  # (B, Q, n)
        hit = (windows[:, None] == pattern[:, :, None]).all(-1)  # (B, Q, S)
        hit &= (start + n - 1 < ends[..., None]) & (pattern >= 0).all(-1, keepdim=True)
        last = torch.where(hit, start, -1).amax(-1)  # (B, Q) the latest match, -1 = none
        out = torch.where((out < 0) & (last >= 0) & (ends >= n), last + n, out)
    return out[0] if one else out


def copy_candidates(history: torch.Tensor, ends: torch.Tensor, max_ngram: int = 3, min_ngram: int = 2) -> torch.Tensor:
    """The prompt-lookup candidate token at each end position: ``history`` at
    :func:`lookup_positions` (``-1`` where nothing matches). Shapes as there."""
    at = lookup_positions(history, ends, max_ngram, min_ngram)
    h = history if history.dim() == 2 else history[None]
    a = at if at.dim() == 2 else at[None]
    tok = torch.where(a >= 0, torch.gather(h, 1, a.clamp(min=0)), -1)
    return tok if at.dim() == 2 else tok[0]


def candidate_lists(histories: list[list[list[int]]], max_ngram: int = 3, min_ngram: int = 2) -> list[list[int]]:
    """Each tree node's copy candidate: ``histories[b][i]`` the tokens up to and including node i of row
    b (the committed tokens, then its path from the root) -> B lists of token ids, -1 = none. A tree
    level has a handful of nodes, so each is a :func:`scan_positions` over its list (no tensor round trip)."""
    check_ngrams(max_ngram, min_ngram)
    out = []
    for row in histories:
        got = []
        for h in row:
            at = scan_positions(h, len(h) - 1, max_ngram, min_ngram) if h else -1
            got.append(h[at] if at >= 0 else -1)
        out.append(got)
    return out
