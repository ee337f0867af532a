"""Decode attention: a few query tokens attend over a long KV cache (flash-decoding style).

During decoding a step scores Q new tokens (Q = 1 for plain AR, gamma + 1 for speculative
verification, a token tree for tree decoding) against K cached keys, K >> Q. A kernel that
parallelises over queries alone would leave a GPU idle, so the cache length is split into
``num_splits`` chunks (split-K): each program computes a *partial* softmax-attention over
its chunk (running max ``m``, normaliser ``l``, unnormalised output ``acc``), and a second
kernel merges the partials exactly:

    m = max_s m_s,   l = sum_s l_s * exp(m_s - m),   out = sum_s acc_s * exp(m_s - m) / l

Grouped-query attention is handled by packing the G = Hq / Hkv query heads that share one KV
head into the rows of a tile, so each K/V tile is loaded once for all of them.

Semantics (shared by the kernel and the reference):
``out[b, h, i] = sum_j softmax_j(scale * q[b,h,i] . k[b,h//G,j] + mask[b,h,i,j]) v[b,h//G,j]``
where with ``mask=None`` and ``causal=True`` query i (of Q) sees keys j <= K - Q + i. A row whose
every key is blocked (-inf) returns zeros; masks use large negative numbers or -inf.

Precision: fp32 inputs use ``tf32x3`` dots (fp32-accurate on tensor cores, where a plain dot would
round to TF32), fp16/bf16 their own; softmax statistics and the accumulator are fp32. Triton 3.7's
CPU interpreter gets bf16 ``tl.dot`` wrong (it multiplies the bit patterns), so there, and only
there, bf16 operands are upcast first.

Triad: ``decode_attention_triton`` (kernels + host wrapper),
``decode_attention_reference`` (torch), ``decode_attention`` (dispatcher). Only torch and
triton are imported: copy this file into your project as it is.
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

NEG_INIT_PY = -1.0e30  # running-max floor: keeps exp() finite for fully masked rows
NEG_INIT = NEG_INIT_PY if tl is None else tl.constexpr(NEG_INIT_PY)


@jit
def _decode_attention_partial(
    Q, K, V, Mask, Opart, Mpart, Lpart,
    sqb, sqh, sqm, sqd,
    skb, skh, skn, skd,
    svb, svh, svn, svd,
    smb, smh, smq, smk,
    Hkv, G, NQ, NK, D, split_len, scale,
    HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DOT_F32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid_bh = tl.program_id(0)  # (batch, kv head)
    pid_m = tl.program_id(1)   # tile of packed (query head in group, query index) rows
    pid_s = tl.program_id(2)   # split of the cache
    n_splits = tl.num_programs(2)
    b = pid_bh // Hkv
    hk = pid_bh % Hkv
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (M,)
    R = G * NQ
    row_ok = rows < R
    g = rows // NQ
    qi = rows % NQ
    hq = hk * G + g
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D

    q = tl.load(Q + b * sqb + hq[:, None] * sqh + qi[:, None] * sqm + d[None, :] * sqd,
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # (M, D)
    if DOT_F32:  # the CPU interpreter's tl.dot multiplies bf16 bit patterns
        q = q.to(tl.float32)
    m_i = tl.full((BLOCK_M,), NEG_INIT, tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)

    start = pid_s * split_len
    end = tl.minimum(start + split_len, NK)
    for n0 in range(start, end, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)  # (N,)
        col_ok = cols < end
        k = tl.load(K + b * skb + hk * skh + cols[None, :] * skn + d[:, None] * skd,
                    mask=col_ok[None, :] & d_ok[:, None], other=0.0)  # (D, N)
        if DOT_F32:
            k = k.to(tl.float32)
        s = tl.dot(q, k, input_precision=DOT_PRECISION) * scale  # (M, N)
        valid = row_ok[:, None] & col_ok[None, :]
        if HAS_MASK:
            s += tl.load(Mask + b * smb + hq[:, None] * smh + qi[:, None] * smq + cols[None, :] * smk,
                         mask=valid, other=0.0).to(tl.float32)
        if CAUSAL:
            valid = valid & (cols[None, :] <= (NK - NQ + qi)[:, None])
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])  # (M, N)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + b * svb + hk * svh + cols[:, None] * svn + d[None, :] * svd,
                    mask=col_ok[:, None] & d_ok[None, :], other=0.0)  # (N, D)
        if DOT_F32:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    base = (pid_bh * n_splits + pid_s) * R
    tl.store(Mpart + base + rows, m_i, mask=row_ok)
    tl.store(Lpart + base + rows, l_i, mask=row_ok)
    tl.store(Opart + (base + rows[:, None]) * D + d[None, :], acc, mask=row_ok[:, None] & d_ok[None, :])


@jit
def _decode_attention_combine(
    Opart, Mpart, Lpart, Out,
    sob, soh, som, sod,
    Hkv, G, NQ, D, n_splits,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    pid_m = tl.program_id(1)
    b = pid_bh // Hkv
    hk = pid_bh % Hkv
    R = G * NQ
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < R
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    m = tl.full((BLOCK_M,), NEG_INIT, tl.float32)
    l = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    for s in range(0, n_splits):
        base = (pid_bh * n_splits + s) * R
        ms = tl.load(Mpart + base + rows, mask=row_ok, other=NEG_INIT)
        ls = tl.load(Lpart + base + rows, mask=row_ok, other=0.0)
        os_ = tl.load(Opart + (base + rows[:, None]) * D + d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        m_new = tl.maximum(m, ms)
        a = tl.exp(m - m_new)
        c = tl.exp(ms - m_new)
        l = l * a + ls * c
        acc = acc * a[:, None] + os_ * c[:, None]
        m = m_new
    out = tl.where(l[:, None] > 0, acc / tl.where(l > 0, l, 1.0)[:, None], 0.0)
    g = rows // NQ
    qi = rows % NQ
    hq = hk * G + g
    tl.store(Out + b * sob + hq[:, None] * soh + qi[:, None] * som + d[None, :] * sod,
             out.to(Out.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


def _check(q, k, v, mask):
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q, k, v must be 4-D: q (B, Hq, Q, D), k and v (B, Hkv, K, D)")
    B, Hq, NQ, D = q.shape
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k and v must be (B, Hkv, K, D) matching q {tuple(q.shape)}; got {tuple(k.shape)}, {tuple(v.shape)}")
    if Hq % k.shape[1] != 0:
        raise ValueError(f"query heads ({Hq}) must be a multiple of kv heads ({k.shape[1]})")
    if NQ > k.shape[2]:
        raise ValueError(f"more queries ({NQ}) than keys ({k.shape[2]}): the keys must include the new tokens")
    if mask is not None:
        if mask.dim() != 4 or mask.shape[-2:] != (NQ, k.shape[2]):
            raise ValueError(f"mask must be (B or 1, Hq or 1, Q, K) = (.., .., {NQ}, {k.shape[2]}); got {tuple(mask.shape)}")
    return B, Hq, NQ, D


def _as_float_mask(mask, dtype):
    if mask is not None and mask.dtype == torch.bool:  # True = attend
        mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))
    return mask


def decode_attention_reference(q, k, v, mask=None, scale=None, causal=True):
    """Torch reference. q (B, Hq, Q, D); k, v (B, Hkv, K, D); mask additive (B|1, Hq|1, Q, K) or bool."""
    B, Hq, NQ, D = _check(q, k, v, mask)
    G = Hq // k.shape[1]
    NK = k.shape[2]
    scale = D ** -0.5 if scale is None else scale
    kk = k.float().repeat_interleave(G, dim=1)  # (B, Hq, K, D)
    vv = v.float().repeat_interleave(G, dim=1)
    s = torch.einsum("bhqd,bhkd->bhqk", q.float(), kk) * scale  # (B, Hq, Q, K)
    mask = _as_float_mask(mask, torch.float32)
    if mask is not None:
        s = s + mask.float()
    elif causal:
        j = torch.arange(NK, device=q.device)
        i = torch.arange(NQ, device=q.device)
        s = s.masked_fill(j[None, :] > (NK - NQ + i)[:, None], float("-inf"))
    m = s.amax(-1, keepdim=True).clamp(min=NEG_INIT_PY)
    p = torch.exp(s - m)
    l = p.sum(-1, keepdim=True)
    out = torch.einsum("bhqk,bhkd->bhqd", p, vv) / torch.where(l > 0, l, torch.ones_like(l))
    return out.to(q.dtype)


def _pick_splits(n_tiles_other: int, NK: int, block_n: int) -> int:
    on_gpu_parallelism = 132  # enough programs to fill a large GPU
    want = max(1, on_gpu_parallelism // max(1, n_tiles_other))
    return max(1, min(want, triton.cdiv(NK, block_n), 64))


def decode_attention_triton(q, k, v, mask=None, scale=None, causal=True, num_splits=None,
                            block_m=16, block_n=32):
    """Split-K Triton decode attention; same semantics as :func:`decode_attention_reference`."""
    B, Hq, NQ, D = _check(q, k, v, mask)
    Hkv, NK = k.shape[1], k.shape[2]
    G = Hq // Hkv
    R = G * NQ
    scale = D ** -0.5 if scale is None else float(scale)
    m_tiles = triton.cdiv(R, block_m)
    if num_splits is None:
        num_splits = 1 if INTERPRET and not q.is_cuda else _pick_splits(B * Hkv * m_tiles, NK, block_n)
    split_len = triton.cdiv(triton.cdiv(NK, num_splits), block_n) * block_n
    num_splits = triton.cdiv(NK, split_len)
    block_d = max(16, triton.next_power_of_2(D))
    dev = q.device
    opart = torch.empty((B * Hkv, num_splits, R, D), device=dev, dtype=torch.float32)
    mpart = torch.empty((B * Hkv, num_splits, R), device=dev, dtype=torch.float32)
    lpart = torch.empty_like(mpart)
    out = torch.empty_like(q)
    mask = _as_float_mask(mask, q.dtype)
    if mask is not None:
        mask = mask.expand(B, Hq, NQ, NK)
        mstr = mask.stride()
        mptr = mask
    else:
        mstr = (0, 0, 0, 0)
        mptr = q  # unused
    _decode_attention_partial[(B * Hkv, m_tiles, num_splits)](
        q, k, v, mptr, opart, mpart, lpart,
        *q.stride(), *k.stride(), *v.stride(), *mstr,
        Hkv, G, NQ, NK, D, split_len, scale,
        HAS_MASK=mask is not None, CAUSAL=(mask is None and causal),
        DOT_PRECISION="tf32x3" if q.dtype == torch.float32 else "tf32",
        DOT_F32=q.dtype == torch.bfloat16 and not q.is_cuda,  # only the interpreter runs on CPU tensors
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
    )
    _decode_attention_combine[(B * Hkv, m_tiles)](
        opart, mpart, lpart, out, *out.stride(), Hkv, G, NQ, D, num_splits,
        BLOCK_M=block_m, BLOCK_D=block_d,
    )
    return out



def decode_attention(q, k, v, mask=None, scale=None, causal=True):
    """Dispatcher: Triton on CUDA tensors or under ``TRITON_INTERPRET=1``, else the torch reference.

    q (B, Hq, Q, D), k and v (B, Hkv, K, D) with the Q new tokens last in k/v; mask an additive
    float (or boolean, True = attend) mask broadcastable to (B, Hq, Q, K). Returns (B, Hq, Q, D).
    """
    if use_triton(q):
        return decode_attention_triton(q, k, v, mask, scale, causal)
    return decode_attention_reference(q, k, v, mask, scale, causal)


def aot_specs():
    """(kernel, signature, constexprs) for ahead-of-time compilation (fp16 and fp32 inputs)."""
    specs = []
    for dt in ("fp16", "bf16", "fp32"):
        for has_mask in (False, True):
            sig = {"Q": f"*{dt}", "K": f"*{dt}", "V": f"*{dt}", "Mask": f"*{dt}", "Opart": "*fp32",
                   "Mpart": "*fp32", "Lpart": "*fp32"}
            sig.update({n: "i32" for n in ["sqb", "sqh", "sqm", "sqd", "skb", "skh", "skn", "skd", "svb", "svh",
                                            "svn", "svd", "smb", "smh", "smq", "smk", "Hkv", "G", "NQ", "NK", "D",
                                            "split_len"]})
            sig["scale"] = "fp32"
            cx = {"HAS_MASK": has_mask, "CAUSAL": not has_mask,
                  "DOT_PRECISION": "tf32x3" if dt == "fp32" else "tf32", "DOT_F32": False, "BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_D": 64}
            sig.update({n: "constexpr" for n in cx})
            specs.append((_decode_attention_partial, sig, cx))
        sig = {"Opart": "*fp32", "Mpart": "*fp32", "Lpart": "*fp32", "Out": f"*{dt}"}
        sig.update({n: "i32" for n in ["sob", "soh", "som", "sod", "Hkv", "G", "NQ", "D", "n_splits"]})
        cx = {"BLOCK_M": 16, "BLOCK_D": 64}
        sig.update({n: "constexpr" for n in cx})
        specs.append((_decode_attention_combine, sig, cx))
    return specs


def bench(B=1, Hq=32, Hkv=8, D=128, K=4096, Q=1, dtype=torch.float16):
    """Microseconds per call of the Triton kernel vs torch SDPA on CUDA (None without CUDA)."""
    if not torch.cuda.is_available():
        return None
    from triton.testing import do_bench

    q = torch.randn(B, Hq, Q, D, device="cuda", dtype=dtype)
    k = torch.randn(B, Hkv, K, D, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    t_triton = do_bench(lambda: decode_attention_triton(q, k, v)) * 1e3
    kk, vv = k.repeat_interleave(Hq // Hkv, 1), v.repeat_interleave(Hq // Hkv, 1)
    t_sdpa = do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, kk, vv)) * 1e3
    return {"triton_us": t_triton, "sdpa_us": t_sdpa, "shape": dict(B=B, Hq=Hq, Hkv=Hkv, D=D, K=K, Q=Q)}
