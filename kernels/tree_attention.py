"""Tree attention: the m nodes of a flattened token tree attend over the KV cache and their ancestors.

Tree decoding (SpecInfer, Miao et al., arXiv 2305.09781, §4 "tree-based parallel decoding";
Medusa, Cai et al., arXiv 2401.10774, §2.1.2 "tree attention") scores every node of a candidate
tree in one target forward: the nodes are appended to the sequence parents first, and node i may
see the cache and the nodes on its own root-to-node path, nothing else. A model's generic 4-D
mask path does this with a dense additive float mask of (B, 1, m, P + m) entries, almost all of
them the same per row. This kernel takes the mask in its compact form instead:

- ``slot_ok`` (B, P): which cache slots the row may attend (0 at the holes of a ragged batch);
- ``anc`` (B, m, m) bool: ``anc[b, i, j]`` -- node j is node i or one of its ancestors.

Semantics (shared by the kernel and the reference), with k, v = (cache's P slots, then the m nodes):

    allowed[b, i, j] = slot_ok[b, j]           for j < P
                       anc[b, i, j - P]        for P <= j < P + m
    out[b, h, i] = sum_j softmax_j(scale * q[b,h,i] . k[b,h//G,j], over allowed j) v[b,h//G,j]

A row with nothing allowed returns zeros. Grouped-query attention: the G = Hq / Hkv query heads
sharing a KV head are packed into the rows of one tile, so each K/V tile is loaded once for all.

Like flash-decoding the key axis (P + m) is split into ``num_splits`` chunks: each program keeps
a running max ``m``, normaliser ``l`` and unnormalised output ``acc`` over its chunk (reading the
slot bits and the ancestor bits of that tile only), and a second kernel merges the partials:

    m = max_s m_s,   l = sum_s l_s * exp(m_s - m),   out = sum_s acc_s * exp(m_s - m) / l

Precision: fp32 inputs use ``tf32x3`` dots (fp32-accurate on tensor cores), fp16/bf16 their own;
softmax statistics and the accumulator are fp32. The CPU interpreter gets bf16 ``tl.dot`` wrong
(it multiplies the bit patterns), so there, and only there, bf16 operands are upcast first.

Triad: ``tree_attention_triton`` (kernels + host wrapper), ``tree_attention_reference`` (torch,
building the dense mask), ``tree_attention`` (dispatcher). ``tree_mask`` turns the compact mask
into the dense additive one. Only torch and triton are imported: copy this file as it is.
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
def _tree_attention_partial(
    Q, K, V, Slot, Anc, Opart, Mpart, Lpart,
    sqb, sqh, sqm, sqd,      # q (B, Hq, m, D) strides
    skb, skh, skn, skd,      # k (B, Hkv, P + m, D)
    svb, svh, svn, svd,      # v (B, Hkv, P + m, D)
    ssb, ssp,                # slot_ok (B, P), uint8
    sab, sai, saj,           # anc (B, m, m), uint8
    Hkv, G, NM, P, D, split_len, scale,
    DOT_PRECISION: tl.constexpr, DOT_F32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid_bh = tl.program_id(0)  # (batch, kv head)
    pid_m = tl.program_id(1)   # tile of packed (query head in group, node) rows
    pid_s = tl.program_id(2)   # split of the key axis
    n_splits = tl.num_programs(2)
    b = pid_bh // Hkv
    hk = pid_bh % Hkv
    NK = P + NM
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (M,)
    R = G * NM
    row_ok = rows < R
    g = rows // NM
    node = rows % NM                                 # the query's node index i
    hq = hk * G + g
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D

    q = tl.load(Q + b * sqb + hq[:, None] * sqh + node[:, None] * sqm + d[None, :] * sqd,
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # (M, D)
    if DOT_F32:  # the CPU interpreter's tl.dot multiplies bf16 bit patterns (triton-lang/triton#11584)
        q = q.to(tl.float32)
    m_i = tl.full((BLOCK_M,), NEG_INIT, tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)

    start = pid_s * split_len
    end = tl.minimum(start + split_len, NK)
    for n0 in range(start, end, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)  # (N,) key index: cache slot j < P, node j - P after
        col_ok = cols < end
        k = tl.load(K + b * skb + hk * skh + cols[None, :] * skn + d[:, None] * skd,
                    mask=col_ok[None, :] & d_ok[:, None], other=0.0)  # (D, N)
        if DOT_F32:
            k = k.to(tl.float32)
        s = tl.dot(q, k, input_precision=DOT_PRECISION) * scale  # (M, N)
        allowed = tl.zeros((BLOCK_M, BLOCK_N), tl.int1)
        if n0 < P:  # the tile reaches into the cache: one bit per slot, shared by every row
            in_cache = col_ok & (cols < P)
            slot = tl.load(Slot + b * ssb + cols * ssp, mask=in_cache, other=0)  # (N,)
            allowed = allowed | ((slot != 0)[None, :] & row_ok[:, None])
        if n0 + BLOCK_N > P:  # the tile reaches into the tree: row i's ancestor bits
            j = tl.maximum(cols - P, 0)
            in_tree = col_ok & (cols >= P)
            a = tl.load(Anc + b * sab + node[:, None] * sai + j[None, :] * saj,
                        mask=row_ok[:, None] & in_tree[None, :], other=0)  # (M, N)
            allowed = allowed | (a != 0)
        s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])  # (M, N); exactly 0 where not allowed
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
def _tree_attention_merge(
    Opart, Mpart, Lpart, Out,
    sob, soh, som, sod,
    Hkv, G, NM, D, n_splits,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    pid_m = tl.program_id(1)
    b = pid_bh // Hkv
    hk = pid_bh % Hkv
    R = G * NM
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < R
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    tile_ok = row_ok[:, None] & d_ok[None, :]
    m = tl.full((BLOCK_M,), NEG_INIT, tl.float32)
    l = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    for sp in range(0, n_splits):
        base = (pid_bh * n_splits + sp) * R
        m_s = tl.load(Mpart + base + rows, mask=row_ok, other=NEG_INIT)
        l_s = tl.load(Lpart + base + rows, mask=row_ok, other=0.0)
        o_s = tl.load(Opart + (base + rows[:, None]) * D + d[None, :], mask=tile_ok, other=0.0)
        m_new = tl.maximum(m, m_s)
        old = tl.exp(m - m_new)
        new = tl.exp(m_s - m_new)
        l = l * old + l_s * new
        acc = acc * old[:, None] + o_s * new[:, None]
        m = m_new
    out = tl.where(l[:, None] > 0, acc / tl.where(l > 0, l, 1.0)[:, None], 0.0)  # nothing allowed: 0
    hq = hk * G + rows // NM
    node = rows % NM
    tl.store(Out + b * sob + hq[:, None] * soh + node[:, None] * som + d[None, :] * sod,
             out.to(Out.dtype.element_ty), mask=tile_ok)


def _check(q, k, v, slot_ok, anc):
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q, k, v must be 4-D: q (B, Hq, m, D), k and v (B, Hkv, P + m, D)")
    B, Hq, m, D = q.shape
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k and v must be (B, Hkv, P + m, D) matching q {tuple(q.shape)}; "
                         f"got {tuple(k.shape)}, {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if Hq % k.shape[1] != 0:
        raise ValueError(f"query heads ({Hq}) must be a multiple of kv heads ({k.shape[1]})")
    P = k.shape[2] - m
    if P < 0:
        raise ValueError(f"k has {k.shape[2]} keys, fewer than the m = {m} tree nodes it must end with")
    if slot_ok.dim() != 2 or slot_ok.shape[0] not in (1, B) or slot_ok.shape[1] != P:
        raise ValueError(f"slot_ok must be (B or 1, P) = (.., {P}); got {tuple(slot_ok.shape)}")
    if anc.dim() != 3 or anc.shape[0] not in (1, B) or anc.shape[1:] != (m, m):
        raise ValueError(f"anc must be (B or 1, m, m) = (.., {m}, {m}); got {tuple(anc.shape)}")
    return B, Hq, m, D, P


def tree_mask(slot_ok, anc, dtype=torch.float32):
    """The dense additive mask (B, 1, m, P + m) a model's 4-D mask path takes: 0 allowed, -inf not."""
    B = max(slot_ok.shape[0], anc.shape[0])
    m, P = anc.shape[1], slot_ok.shape[1]
    allow = torch.cat([slot_ok.bool()[:, None, :].expand(B, m, P), anc.bool().expand(B, m, m)], -1)
    return torch.zeros(allow.shape, dtype=dtype, device=allow.device).masked_fill(~allow, float("-inf"))[:, None]


def tree_attention_reference(q, k, v, slot_ok, anc, scale=None):
    """Torch reference: the dense mask, then a plain masked softmax (fp32 inside, q's dtype out)."""
    B, Hq, m, D, P = _check(q, k, v, slot_ok, anc)
    G = Hq // k.shape[1]
    scale = D ** -0.5 if scale is None else scale
    kk = k.float().repeat_interleave(G, dim=1)  # (B, Hq, P + m, D)
    vv = v.float().repeat_interleave(G, dim=1)
    s = torch.einsum("bhid,bhjd->bhij", q.float(), kk) * scale + tree_mask(slot_ok, anc)  # (B, Hq, m, P + m)
    mx = s.amax(-1, keepdim=True).clamp(min=NEG_INIT_PY)
    p = torch.exp(s - mx)
    l = p.sum(-1, keepdim=True)
    out = torch.einsum("bhij,bhjd->bhid", p, vv) / torch.where(l > 0, l, torch.ones_like(l))
    return out.to(q.dtype)


def _bits(mask: torch.Tensor, B: int) -> torch.Tensor:
    """bool / int mask -> uint8 view (no copy for bool), batch dim broadcast to B by a zero stride."""
    m = mask if mask.dtype == torch.bool else mask != 0
    m = m.view(torch.uint8)
    return m.expand(B, *m.shape[1:])


def _pick_splits(n_tiles_other: int, NK: int, block_n: int) -> int:
    on_gpu_parallelism = 132  # enough programs to fill a large GPU
    want = max(1, on_gpu_parallelism // max(1, n_tiles_other))
    return max(1, min(want, triton.cdiv(NK, block_n), 64))


def tree_attention_triton(q, k, v, slot_ok, anc, scale=None, num_splits=None, block_m=None, block_n=32):
    """Split-K Triton tree attention; same semantics as :func:`tree_attention_reference`."""
    B, Hq, NM, D, P = _check(q, k, v, slot_ok, anc)
    Hkv, NK = k.shape[1], k.shape[2]
    G = Hq // Hkv
    R = G * NM
    out = torch.empty_like(q)
    if out.numel() == 0:
        return out
    scale = D ** -0.5 if scale is None else float(scale)
    if block_m is None:  # bigger row tiles for big trees: each K/V tile is read once per row tile
        block_m = min(64, max(16, triton.next_power_of_2(R)))
    m_tiles = triton.cdiv(R, block_m)
    if num_splits is None:
        interpret = INTERPRET and not q.is_cuda
        num_splits = 1 if interpret else _pick_splits(B * Hkv * m_tiles, NK, block_n)
    split_len = triton.cdiv(triton.cdiv(NK, num_splits), block_n) * block_n
    num_splits = triton.cdiv(NK, split_len)
    block_d = max(16, triton.next_power_of_2(D))
    dev = q.device
    opart = torch.empty((B * Hkv, num_splits, R, D), device=dev, dtype=torch.float32)
    mpart = torch.empty((B * Hkv, num_splits, R), device=dev, dtype=torch.float32)
    lpart = torch.empty_like(mpart)
    slot, tree = _bits(slot_ok, B), _bits(anc, B)
    if P == 0:
        slot = torch.zeros((B, 1), dtype=torch.uint8, device=dev)  # never read; a real pointer
    _tree_attention_partial[(B * Hkv, m_tiles, num_splits)](
        q, k, v, slot, tree, opart, mpart, lpart,
        *q.stride(), *k.stride(), *v.stride(), *slot.stride(), *tree.stride(),
        Hkv, G, NM, P, D, split_len, scale,
        DOT_PRECISION="tf32x3" if q.dtype == torch.float32 else "tf32",
        DOT_F32=q.dtype == torch.bfloat16 and not q.is_cuda,  # only the interpreter runs on CPU tensors
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
    )
    _tree_attention_merge[(B * Hkv, m_tiles)](
        opart, mpart, lpart, out, *out.stride(), Hkv, G, NM, D, num_splits,
        BLOCK_M=block_m, BLOCK_D=block_d,
    )
    return out


def tree_attention(q, k, v, slot_ok, anc, scale=None):
    """Dispatcher: Triton on CUDA tensors or under ``TRITON_INTERPRET=1``, else the torch reference.

    q (B, Hq, m, D) for the m tree nodes; k, v (B, Hkv, P + m, D): the cache's P slots, then the
    nodes; slot_ok (B or 1, P) bool/int; anc (B or 1, m, m) bool. Returns (B, Hq, m, D).
    """
    if use_triton(q):
        return tree_attention_triton(q, k, v, slot_ok, anc, scale)
    return tree_attention_reference(q, k, v, slot_ok, anc, scale)


def aot_specs():
    """(kernel, signature, constexprs) for ahead-of-time compilation: each dtype, small and big row tiles."""
    specs = []
    for dt in ("fp16", "bf16", "fp32"):
        for block_m in (16, 64):
            sig = {"Q": f"*{dt}", "K": f"*{dt}", "V": f"*{dt}", "Slot": "*u8", "Anc": "*u8",
                   "Opart": "*fp32", "Mpart": "*fp32", "Lpart": "*fp32"}
            sig.update({n: "i32" for n in ["sqb", "sqh", "sqm", "sqd", "skb", "skh", "skn", "skd", "svb", "svh",
                                            "svn", "svd", "ssb", "ssp", "sab", "sai", "saj", "Hkv", "G", "NM",
                                            "P", "D", "split_len"]})
            sig["scale"] = "fp32"
            cx = {"DOT_PRECISION": "tf32x3" if dt == "fp32" else "tf32", "DOT_F32": False,
                  "BLOCK_M": block_m, "BLOCK_N": 32, "BLOCK_D": 64}
            sig.update({n: "constexpr" for n in cx})
            specs.append((_tree_attention_partial, sig, cx))
        sig = {"Opart": "*fp32", "Mpart": "*fp32", "Lpart": "*fp32", "Out": f"*{dt}"}
        sig.update({n: "i32" for n in ["sob", "soh", "som", "sod", "Hkv", "G", "NM", "D", "n_splits"]})
        cx = {"BLOCK_M": 64, "BLOCK_D": 64}
        sig.update({n: "constexpr" for n in cx})
        specs.append((_tree_attention_merge, sig, cx))
    return specs


def bench(B=1, Hq=32, Hkv=8, D=128, P=4096, m=64, dtype=torch.float16):
    """Microseconds per call: the Triton kernel vs torch SDPA with the dense mask, on CUDA (None without)."""
    if not torch.cuda.is_available():
        return None
    from triton.testing import do_bench

    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, Hq, m, D, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(B, Hkv, P + m, D, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(B, Hkv, P + m, D, device="cuda", dtype=dtype, generator=g)
    slot_ok = torch.ones(B, P, dtype=torch.bool, device="cuda")
    parents = [i // 2 - 1 for i in range(m)]  # a binary tree, parents first (-1: the root's children)
    anc = torch.eye(m, dtype=torch.bool, device="cuda")
    for i, p in enumerate(parents):
        if p >= 0:
            anc[i] |= anc[p]
    anc = anc.expand(B, m, m)
    t_triton = do_bench(lambda: tree_attention_triton(q, k, v, slot_ok, anc)) * 1e3
    kk, vv = k.repeat_interleave(Hq // Hkv, 1), v.repeat_interleave(Hq // Hkv, 1)
    dense = tree_mask(slot_ok, anc, dtype)
    t_sdpa = do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, kk, vv, attn_mask=dense)) * 1e3
    return {"triton_us": t_triton, "sdpa_us": t_sdpa}
