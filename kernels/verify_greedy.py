"""Greedy verification of a block of draft tokens (blockwise parallel decoding, greedy case).

Given ``gamma`` draft tokens per row and the target's logits at the ``gamma + 1`` positions
that score them (the last accepted token followed by the drafts), greedy verification keeps the
longest prefix of drafts that equal the target's argmax and then emits the target's own argmax
at the first mismatch (the *correction*), or after the last draft when all match (the *bonus*):

    n[b]    = max { k <= valid[b] : draft[b, i] == argmax_v logits[b, i, v] for all i < k }
    next[b] = argmax_v logits[b, n[b], v]

(Stern et al., "Blockwise Parallel Decoding for Deep Autoregressive Models", arXiv 1811.03115,
§3; the greedy case of Leviathan et al., arXiv 2211.17192, §2.3.) ``valid[b] <= gamma`` makes the
batch ragged: row ``b`` only proposes its first ``valid[b]`` drafts.

The kernel runs one program per row and never loads a whole vocabulary row at once: each
argmax is a running (max, index) over vocabulary tiles of ``BLOCK_V``. Ties go to the smallest
index, like ``torch.argmax``.

Triad: ``verify_greedy_triton`` (kernel + host wrapper), ``verify_greedy_reference``
(torch), ``verify_greedy`` (dispatcher); on a CPU the dispatcher takes ``verify_greedy_host``, the
reference's results computed on the host (see it for why). Only torch, triton and NumPy are imported.
"""
from __future__ import annotations

import os

import numpy as np
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
def _verify_greedy_kernel(
    Draft, Logits, Valid, NOut, NextOut,
    sdb, sdg,          # strides of draft (B, gamma)
    slb, slg, slv,     # strides of logits (B, gamma + 1, V)
    gamma, V,
    BLOCK_V: tl.constexpr,
):
    b = tl.program_id(0)
    valid = tl.load(Valid + b)
    offs = tl.arange(0, BLOCK_V)
    n = 0          # drafts accepted so far
    nxt = 0        # argmax at position n (set when position n is reached with n == i)
    for i in range(0, gamma + 1):
        # running argmax over vocabulary tiles; ties -> smallest index
        best = tl.full((), float("-inf"), tl.float32)
        best_idx = tl.full((), 0, tl.int32)
        for v0 in range(0, V, BLOCK_V):
            cols = v0 + offs
            x = tl.load(Logits + b * slb + i * slg + cols * slv, mask=cols < V, other=float("-inf")).to(tl.float32)
            m = tl.max(x, 0)
            # first column of this tile that reaches the tile max
            idx = tl.min(tl.where(x == m, cols, V), 0)
            better = m > best
            best_idx = tl.where(better, idx, best_idx)
            best = tl.where(better, m, best)
        reached = n == i                     # every draft before i was accepted
        nxt = tl.where(reached, best_idx, nxt)
        if i < gamma:
            d = tl.load(Draft + b * sdb + i * sdg)
            ok = reached & (i < valid) & (d == best_idx)
            n = tl.where(ok, n + 1, n)
    tl.store(NOut + b, n)
    tl.store(NextOut + b, nxt)


def _check(draft, logits, valid):
    if draft.dim() != 2 or logits.dim() != 3:
        raise ValueError("draft must be (B, gamma) and logits (B, gamma + 1, V)")
    B, gamma = draft.shape
    if logits.shape[0] != B or logits.shape[1] != gamma + 1:
        raise ValueError(f"logits must be (B, gamma + 1, V) = ({B}, {gamma + 1}, V); got {tuple(logits.shape)}")
    if valid is None:
        valid = torch.full((B,), gamma, dtype=torch.long, device=draft.device)
    elif not isinstance(valid, torch.Tensor):
        valid = torch.as_tensor(valid, dtype=torch.long, device=draft.device)
    if valid.shape != (B,):
        raise ValueError(f"valid must be (B,) = ({B},); got {tuple(valid.shape)}")
    return B, gamma, valid.to(draft.device)


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(-1)`` (int64, the first maximum on ties), taken by NumPy on a CPU.

    torch's CPU argmax is a scalar loop, several times slower than NumPy's vectorised one on a
    verification's few rows of a vocabulary, a few percent of a small model's step. Same index on every input
    (NaN counts as the maximum in both). Off the CPU, for dtypes NumPy lacks (bf16) or under
    autograd it is torch's own."""
    if logits.device.type != "cpu" or logits.dtype not in (torch.float32, torch.float64) or logits.requires_grad:
        return logits.argmax(-1)
    return torch.from_numpy(np.asarray(logits.numpy().argmax(-1), dtype=np.int64))  # (a 0-d array for 1-D logits)


def verify_greedy_reference(draft: torch.Tensor, logits: torch.Tensor, valid: torch.Tensor | None = None):
    """Torch reference. draft (B, gamma) ids, logits (B, gamma + 1, V), valid (B,) draft lengths
    (default gamma). Returns ``(n (B,) accepted drafts, next (B,) correction/bonus token)``, int64."""
    B, gamma, valid = _check(draft, logits, valid)
    top = logits.argmax(-1)  # (B, gamma + 1)
    pos = torch.arange(gamma, device=draft.device)  # (gamma,)
    match = (draft == top[:, :gamma]) & (pos[None, :] < valid[:, None])  # (B, gamma)
    n = match.long().cumprod(-1).sum(-1)  # (B,) length of the all-match prefix
    nxt = top.gather(1, n[:, None])[:, 0]  # (B,)
    return n, nxt


def verify_greedy_triton(draft: torch.Tensor, logits: torch.Tensor, valid: torch.Tensor | None = None,
                         block_v: int = 1024):
    """Triton version of :func:`verify_greedy_reference` (one program per row, vocab tiles)."""
    B, gamma, valid = _check(draft, logits, valid)
    V = logits.shape[-1]
    block_v = min(block_v, triton.next_power_of_2(V))
    n = torch.empty(B, dtype=torch.int32, device=draft.device)
    nxt = torch.empty(B, dtype=torch.int32, device=draft.device)
    valid32 = valid.to(torch.int32).contiguous()
    _verify_greedy_kernel[(B,)](
        draft, logits, valid32, n, nxt,
        draft.stride(0), draft.stride(1) if gamma > 0 else 1,
        logits.stride(0), logits.stride(1), logits.stride(2),
        gamma, V, BLOCK_V=block_v,
    )
    return n.long(), nxt.long()



def verify_greedy_host(draft: torch.Tensor, logits: torch.Tensor, valid: torch.Tensor | None = None):
    """:func:`verify_greedy_reference` for CPU tensors, on the host: one :func:`argmax`, then each
    row's walk along its drafts in Python. On a CPU every torch operation on a tensor of a few
    elements costs a fixed overhead, and the reference takes eight of them, where the walk over
    <= gamma ints costs about one. Same results."""
    B, gamma, valid = _check(draft, logits, valid)
    top, xs, vs = argmax(logits).tolist(), draft.tolist(), valid.tolist()  # (B, gamma + 1), (B, gamma), (B,)
    n = []
    for t, x, v in zip(top, xs, vs):
        k = 0
        while k < v and x[k] == t[k]:
            k += 1
        n.append(k)
    nxt = [t[k] for t, k in zip(top, n)]
    # CPU tensors from NumPy arrays: ~1 us each, where torch.tensor(list) takes ~6
    return torch.from_numpy(np.array(n, dtype=np.int64)), torch.from_numpy(np.array(nxt, dtype=np.int64))


def verify_greedy(draft: torch.Tensor, logits: torch.Tensor, valid: torch.Tensor | None = None):
    """Dispatcher: Triton on CUDA tensors or under ``TRITON_INTERPRET=1``; otherwise, on the CPU,
    :func:`verify_greedy_host` (the reference's results, without its small-tensor overheads), and
    the torch reference anywhere else.

    draft (B, gamma) token ids, logits (B, gamma + 1, V) target logits, valid (B,) number of real
    drafts per row (default gamma). Returns ``(n, next)``: accepted drafts and the next token (B,).
    """
    if use_triton(logits):
        return verify_greedy_triton(draft, logits, valid)
    if logits.device.type == "cpu":
        return verify_greedy_host(draft, logits, valid)
    return verify_greedy_reference(draft, logits, valid)


def aot_specs():
    """(kernel, signature, constexprs) for ahead-of-time compilation (fp32, fp16 and bf16 logits)."""
    specs = []
    for dt in ("fp32", "fp16", "bf16"):
        sig = {"Draft": "*i64", "Logits": f"*{dt}", "Valid": "*i32", "NOut": "*i32", "NextOut": "*i32",
               "sdb": "i32", "sdg": "i32", "slb": "i32", "slg": "i32", "slv": "i32", "gamma": "i32", "V": "i32",
               "BLOCK_V": "constexpr"}
        specs.append((_verify_greedy_kernel, sig, {"BLOCK_V": 1024}))
    return specs


def bench(B=1, gamma=4, V=49152, dtype=torch.float32):
    """Microseconds per call, Triton vs the torch reference, on CUDA (None without CUDA)."""
    if not torch.cuda.is_available():
        return None
    from triton.testing import do_bench

    logits = torch.randn(B, gamma + 1, V, device="cuda", dtype=dtype)
    draft = logits[:, :gamma].argmax(-1)
    t_triton = do_bench(lambda: verify_greedy_triton(draft, logits)) * 1e3
    t_torch = do_bench(lambda: verify_greedy_reference(draft, logits)) * 1e3
    return {"triton_us": t_triton, "torch_us": t_torch, "shape": dict(B=B, gamma=gamma, V=V)}
