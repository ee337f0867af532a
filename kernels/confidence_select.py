"""Fused dLLM step selection: argmax, its softmax probability, and which masked positions to commit.

Used by the LLaDA / Fast-dLLM samplers (LLaDA, arXiv 2502.09992, Algorithm 5 low-confidence
remasking; Fast-dLLM, arXiv 2505.22618, Sec. 3.3 threshold decoding). For a block of N positions
of each row, with logits (B, N, V):

    x0[b, n]   = argmax_v logits[b, n, v]
    conf[b, n] = softmax(logits[b, n])[x0] = 1 / sum_v exp(logits[b, n, v] - max_v logits[b, n, v])
                 (-inf where the position is not masked)
    select     = the k[b] most confident positions of row b          (top-k mode), or
                 conf > threshold, plus the row's most confident one  (threshold mode; rows with
                 no masked position select nothing)

The kernel runs one program per row and walks the vocabulary in tiles of BLOCK_V with an online
max / sum (the whole vocabulary is never one block), keeping the running argmax; then it does
the top-k (k repeated argmax passes over the N confidences) or threshold selection in registers.

Triad: ``confidence_select_triton`` (kernel + host wrapper),
``confidence_select_reference`` (torch), ``confidence_select`` (dispatcher: Triton on CUDA or
under ``TRITON_INTERPRET=1``, else the reference). Imports only torch, triton and the stdlib.
"""
from __future__ import annotations

import os

import torch
try:  # Triton publishes no wheel for macOS or Windows: there the dispatcher runs the torch reference
    import triton
    import triton.language as tl
except ImportError:
    triton = tl = None

#: launch the Triton kernel on CPU tensors too, in Triton's interpreter: ``TRITON_INTERPRET=1`` when this
#: file is imported (how the tests check kernel == reference without a GPU; Triton reads the same variable
#: when it builds the kernel). ``kernels.references()`` turns it off for a block.
INTERPRET = triton is not None and os.environ.get("TRITON_INTERPRET") == "1"


def jit(fn):
    """``triton.jit`` where Triton is installed; else the function as written (never launched)."""
    return fn if triton is None else triton.jit(fn)


def use_triton(t: torch.Tensor) -> bool:
    """Launch the kernel for ``t``: Triton is installed and ``t`` is on a GPU, or :data:`INTERPRET` is on."""
    return triton is not None and (t.is_cuda or INTERPRET)


@jit
def _confidence_select_kernel(logits_ptr, masked_ptr, k_ptr, x0_ptr, conf_ptr, sel_ptr, N, V, threshold,
                              MODE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr):
    b = tl.program_id(0)
    offs_n = tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    valid_n = offs_n < N
    row = logits_ptr + b.to(tl.int64) * N * V + offs_n.to(tl.int64)[:, None] * V  # (BLOCK_N, 1)
    m = tl.full((BLOCK_N,), float("-inf"), tl.float32)  # running max
    s = tl.zeros((BLOCK_N,), tl.float32)  # running sum of exp(x - m)
    arg = tl.zeros((BLOCK_N,), tl.int32)  # running argmax
    for v0 in range(0, V, BLOCK_V):
        offs_v = v0 + tl.arange(0, BLOCK_V)  # (BLOCK_V,)
        x = tl.load(row + offs_v[None, :], mask=valid_n[:, None] & (offs_v[None, :] < V), other=float("-inf"))
        x = tl.where(valid_n[:, None], x.to(tl.float32), 0.0)  # (BLOCK_N, BLOCK_V)
        t_max = tl.max(x, axis=1)
        t_arg = tl.argmax(x, axis=1).to(tl.int32) + v0
        new_m = tl.maximum(m, t_max)
        arg = tl.where(t_max > m, t_arg, arg)  # strict: the first maximum wins, like torch.argmax
        s = s * tl.exp(m - new_m) + tl.sum(tl.exp(x - new_m[:, None]), axis=1)
        m = new_m
    is_masked = tl.load(masked_ptr + b * N + offs_n, mask=valid_n, other=0) != 0
    conf = tl.where(is_masked & valid_n, 1.0 / s, float("-inf"))  # (BLOCK_N,)
    tl.store(x0_ptr + b * N + offs_n, arg.to(tl.int64), mask=valid_n)
    tl.store(conf_ptr + b * N + offs_n, conf, mask=valid_n)
    any_masked = tl.max(tl.where(is_masked & valid_n, 1, 0), axis=0) > 0
    if MODE == 0:  # top-k: k repeated argmax passes
        kb = tl.load(k_ptr + b)
        sel = offs_n < 0  # all False
        work = conf
        for _ in range(0, kb):
            j = tl.argmax(work, axis=0)
            sel = sel | (offs_n == j)
            work = tl.where(offs_n == j, float("-inf"), work)
        sel = sel & is_masked & valid_n
    else:  # threshold, with at least the single most confident masked position
        j = tl.argmax(conf, axis=0)
        sel = ((conf > threshold) | ((offs_n == j) & any_masked)) & is_masked & valid_n
    tl.store(sel_ptr + b * N + offs_n, sel.to(tl.int8), mask=valid_n)


def _check(logits, masked, k, threshold):
    if logits.dim() != 3:
        raise ValueError(f"logits must be (B, N, V), got shape {tuple(logits.shape)}")
    if masked.shape != logits.shape[:2]:
        raise ValueError(f"masked must be (B, N) = {tuple(logits.shape[:2])}, got {tuple(masked.shape)}")
    if (k is None) == (threshold is None):
        raise ValueError("pass exactly one of k (per-row counts) or threshold")
    if k is not None:
        k = torch.as_tensor(k, device=logits.device).reshape(-1)
        if k.numel() == 1:
            k = k.expand(logits.size(0))
        if k.numel() != logits.size(0) or bool((k < 0).any()):
            raise ValueError("k must be one non-negative count per row")
    if threshold is not None and not 0 < float(threshold) <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold!r}")
    return k


def confidence_select_triton(logits: torch.Tensor, masked: torch.Tensor, k=None, threshold=None,
                             BLOCK_V: int = 128):
    """Triton path. Returns (x0 (B, N) int64, conf (B, N) float32, select (B, N) bool)."""
    k = _check(logits, masked, k, threshold)
    B, N, V = logits.shape
    logits = logits.float().contiguous()
    masked8 = masked.to(torch.int8).contiguous()
    kk = (k if k is not None else torch.zeros(B, device=logits.device)).to(torch.int32).contiguous()
    x0 = torch.empty((B, N), dtype=torch.int64, device=logits.device)
    conf = torch.empty((B, N), dtype=torch.float32, device=logits.device)
    sel = torch.empty((B, N), dtype=torch.int8, device=logits.device)
    BLOCK_N = max(16, triton.next_power_of_2(N))
    _confidence_select_kernel[(B,)](logits, masked8, kk, x0, conf, sel, N, V,
                                    float(threshold) if threshold is not None else 2.0,
                                    MODE=0 if k is not None else 1, BLOCK_N=BLOCK_N, BLOCK_V=BLOCK_V)
    return x0, conf, sel.bool()


def confidence_select_reference(logits: torch.Tensor, masked: torch.Tensor, k=None, threshold=None):
    """Torch reference of the same function (ties: the lowest index first, like the kernel)."""
    k = _check(logits, masked, k, threshold)
    lf = logits.float()
    x0 = lf.argmax(-1)  # (B, N)
    conf = torch.softmax(lf, dim=-1).gather(-1, x0[..., None])[..., 0]  # (B, N)
    conf = conf.masked_fill(~masked.bool(), float("-inf"))
    if k is not None:
        order = torch.sort(conf, dim=-1, descending=True, stable=True).indices
        rank = torch.empty_like(order).scatter_(-1, order, torch.arange(conf.size(-1), device=conf.device)
                                                .expand_as(order))
        sel = rank < k[:, None]
    else:
        best = torch.zeros_like(masked, dtype=torch.bool).scatter_(-1, conf.argmax(-1, keepdim=True), True)
        sel = (conf > threshold) | (best & masked.bool().any(-1, keepdim=True))
    return x0, conf, sel & masked.bool()


def confidence_select(logits: torch.Tensor, masked: torch.Tensor, k=None, threshold=None):
    """Dispatcher: Triton on CUDA tensors or when ``TRITON_INTERPRET=1``, else the torch reference."""
    if use_triton(logits):
        return confidence_select_triton(logits, masked, k=k, threshold=threshold)
    return confidence_select_reference(logits, masked, k=k, threshold=threshold)


def aot_specs():
    """(kernel, signature, constexprs) for ahead-of-time compilation (both modes, block of 64)."""
    sig = {"logits_ptr": "*fp32", "masked_ptr": "*i8", "k_ptr": "*i32", "x0_ptr": "*i64", "conf_ptr": "*fp32",
           "sel_ptr": "*i8", "N": "i32", "V": "i32", "threshold": "fp32",
           "MODE": "constexpr", "BLOCK_N": "constexpr", "BLOCK_V": "constexpr"}
    return [(_confidence_select_kernel, dict(sig), {"MODE": mode, "BLOCK_N": 64, "BLOCK_V": 128})
            for mode in (0, 1)]


def bench(B: int = 8, N: int = 32, V: int = 32000):
    """Median milliseconds of Triton vs the torch reference on CUDA (None without CUDA)."""
    if not torch.cuda.is_available():
        return None
    logits = torch.randn(B, N, V, device="cuda")
    masked = torch.rand(B, N, device="cuda") < 0.7
    k = torch.full((B,), 2, device="cuda")
    return {
        "triton_ms": triton.testing.do_bench(lambda: confidence_select_triton(logits, masked, k=k)),
        "torch_ms": triton.testing.do_bench(lambda: confidence_select_reference(logits, masked, k=k)),
    }
