"""Speculative-sampling verification: accept test and residual sample in one kernel per row.

Leviathan et al., "Fast Inference from Transformers via Speculative Decoding", arXiv 2211.17192,
Algorithm 1; Chen et al., "Accelerating Large Language Model Decoding with Speculative
Sampling", arXiv 2302.01318, Algorithm 2. For row ``b`` with drafts ``x_i ~ q_i`` (i < valid[b]):

    accept x_i   iff   u_i * q_i(x_i) < p_i(x_i)          (i.e. with probability min(1, p_i/q_i))
    n            = number of leading accepted drafts
    next         ~ norm(max(0, p_n - q_n))   if n < valid[b]   (the residual, after a rejection)
                 ~ p_n                       if n == valid[b]  (the bonus token)

All randomness comes in as ``u`` (B, gamma + 1) uniforms in [0, 1): ``u[:, :gamma]`` for the
accept tests and ``u[:, gamma]`` for the final draw, which is an inverse-CDF sample: the first
token ``v`` whose cumulative weight exceeds ``u * Z`` (``Z`` = total weight). So the kernel and
the torch reference consume identical randomness and agree draw for draw (up to float rounding
of the cumulative sum exactly at a boundary). The vocabulary is never loaded in one block: two
passes over ``BLOCK_V`` tiles (the total ``Z``, then the running cumulative sum).
If the residual has no mass (p == q up to rounding) the draw falls back to ``p_n``.

Triad: ``rejection_sample_triton`` (kernel + host wrapper),
``rejection_sample_reference`` (torch), ``rejection_sample`` (dispatcher). Only torch and triton
are imported.
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
def _rejection_sample_kernel(
    Draft, P, Q, U, Valid, NOut, NextOut,
    sdb, sdg,          # draft (B, gamma)
    spb, spg, spv,     # p (B, gamma + 1, V)
    sqb, sqg, sqv,     # q (B, gamma, V)
    sub, sug,          # u (B, gamma + 1)
    gamma, V,
    BLOCK_V: tl.constexpr,
):
    b = tl.program_id(0)
    valid = tl.load(Valid + b)
    # 1. accept tests, left to right; `still` stays true while every draft so far was accepted
    n = 0
    still = valid > 0
    for i in range(0, gamma):
        d = tl.load(Draft + b * sdb + i * sdg)
        px = tl.load(P + b * spb + i * spg + d * spv).to(tl.float32)
        qx = tl.load(Q + b * sqb + i * sqg + d * sqv).to(tl.float32)
        ui = tl.load(U + b * sub + i * sug)
        ok = still & (i < valid) & (ui * qx < px)
        n = tl.where(ok, n + 1, n)
        still = ok
    # 2. the distribution of the next token: residual after a rejection, else p (bonus)
    rejected = n < valid
    offs = tl.arange(0, BLOCK_V)
    p_row = P + b * spb + n * spg
    q_row = Q + b * sqb + tl.minimum(n, gamma - 1) * sqg  # only read when rejected (n < gamma)
    z_res = 0.0
    z_p = 0.0
    last_res = -1
    last_p = -1
    for v0 in range(0, V, BLOCK_V):  # pass 1: total masses and last positive index
        cols = v0 + offs
        inb = cols < V
        pv = tl.load(p_row + cols * spv, mask=inb, other=0.0).to(tl.float32)
        qv = tl.load(q_row + cols * sqv, mask=inb & rejected, other=0.0).to(tl.float32)
        w = tl.maximum(pv - qv, 0.0)
        z_res += tl.sum(w, 0)
        z_p += tl.sum(pv, 0)
        last_res = tl.maximum(last_res, tl.max(tl.where(w > 0, cols, -1), 0))
        last_p = tl.maximum(last_p, tl.max(tl.where(pv > 0, cols, -1), 0))
    use_q = rejected & (z_res > 0)
    z = tl.where(use_q, z_res, z_p)
    last = tl.where(use_q, last_res, last_p)
    target = tl.load(U + b * sub + gamma * sug) * z
    run = 0.0
    pick = V
    for v0 in range(0, V, BLOCK_V):  # pass 2: inverse CDF over tiles
        cols = v0 + offs
        inb = cols < V
        pv = tl.load(p_row + cols * spv, mask=inb, other=0.0).to(tl.float32)
        qv = tl.load(q_row + cols * sqv, mask=inb & use_q, other=0.0).to(tl.float32)
        w = tl.maximum(pv - qv, 0.0)
        cum = tl.cumsum(w, 0) + run
        hit = (cum > target) & (w > 0) & inb
        pick = tl.minimum(pick, tl.min(tl.where(hit, cols, V), 0))
        run += tl.sum(w, 0)
    pick = tl.where(pick == V, last, pick)  # rounding: u * Z reached the very end
    tl.store(NOut + b, n)
    tl.store(NextOut + b, pick)


def _check(draft, p, q, u, valid):
    if draft.dim() != 2 or p.dim() != 3 or q.dim() != 3 or u.dim() != 2:
        raise ValueError("draft must be (B, gamma), p (B, gamma + 1, V), q (B, gamma, V), u (B, gamma + 1)")
    B, gamma = draft.shape
    V = p.shape[-1]
    if p.shape[:2] != (B, gamma + 1):
        raise ValueError(f"p must be (B, gamma + 1, V) = ({B}, {gamma + 1}, V); got {tuple(p.shape)}")
    if q.shape != (B, gamma, V):
        raise ValueError(f"q must be (B, gamma, V) = ({B}, {gamma}, {V}); got {tuple(q.shape)}")
    if u.shape != (B, gamma + 1):
        raise ValueError(f"u must be (B, gamma + 1) = ({B}, {gamma + 1}); got {tuple(u.shape)}")
    if valid is None:
        valid = torch.full((B,), gamma, dtype=torch.long, device=draft.device)
    elif not isinstance(valid, torch.Tensor):
        valid = torch.as_tensor(valid, dtype=torch.long, device=draft.device)
    if valid.shape != (B,):
        raise ValueError(f"valid must be (B,) = ({B},); got {tuple(valid.shape)}")
    return B, gamma, V, valid.to(draft.device)


def rejection_sample_reference(draft, p, q, u, valid=None):
    """Torch reference. draft (B, gamma) ids sampled from q; p (B, gamma + 1, V) target probs;
    q (B, gamma, V) draft probs; u (B, gamma + 1) uniforms in [0, 1); valid (B,) draft lengths
    (default gamma). Returns ``(n (B,) accepted drafts, next (B,) residual/bonus token)``, int64."""
    B, gamma, V, valid = _check(draft, p, q, u, valid)
    p, q, u = p.float(), q.float(), u.float()
    rows = torch.arange(B, device=p.device)
    pos = torch.arange(gamma, device=p.device)
    px = p[:, :gamma].gather(2, draft[..., None])[..., 0]  # (B, gamma)
    qx = q.gather(2, draft[..., None])[..., 0]  # (B, gamma)
    ok = (u[:, :gamma] * qx < px) & (pos[None, :] < valid[:, None])  # (B, gamma)
    n = ok.long().cumprod(-1).sum(-1)  # (B,)
    p_n = p[rows, n]  # (B, V)
    rejected = n < valid  # (B,)
    if gamma > 0:
        q_n = q[rows, n.clamp(max=gamma - 1)] * rejected[:, None]  # (B, V)
    else:
        q_n = torch.zeros_like(p_n)
    w = (p_n - q_n).clamp(min=0)  # (B, V) residual (== p_n when nothing was rejected)
    empty = w.sum(-1) <= 0
    w = torch.where(empty[:, None], p_n, w)  # no residual mass: fall back to p_n
    cum = w.cumsum(-1)  # (B, V)
    target = u[:, gamma] * w.sum(-1)  # (B,)
    cols = torch.arange(V, device=p.device)
    hit = (cum > target[:, None]) & (w > 0)
    first = torch.where(hit, cols, V).amin(-1)
    last = torch.where(w > 0, cols, -1).amax(-1)
    nxt = torch.where(first == V, last, first)
    return n, nxt


def rejection_sample_triton(draft, p, q, u, valid=None, block_v: int = 1024):
    """Triton version of :func:`rejection_sample_reference` (one program per row, vocab tiles)."""
    B, gamma, V, valid = _check(draft, p, q, u, valid)
    block_v = min(block_v, triton.next_power_of_2(V))
    n = torch.empty(B, dtype=torch.int32, device=p.device)
    nxt = torch.empty(B, dtype=torch.int32, device=p.device)
    u = u.float()
    qq = q if gamma > 0 else p  # a valid pointer when there is no draft (never read)
    _rejection_sample_kernel[(B,)](
        draft, p, qq, u, valid.to(torch.int32).contiguous(), n, nxt,
        draft.stride(0), draft.stride(1) if gamma > 0 else 1,
        p.stride(0), p.stride(1), p.stride(2),
        qq.stride(0), qq.stride(1), qq.stride(2),
        u.stride(0), u.stride(1),
        gamma, V, BLOCK_V=block_v,
    )
    return n.long(), nxt.long()



def rejection_sample(draft, p, q, u, valid=None):
    """Dispatcher: Triton on CUDA tensors or under ``TRITON_INTERPRET=1``, else the torch reference.

    draft (B, gamma) ids drawn from q; p (B, gamma + 1, V), q (B, gamma, V) probabilities;
    u (B, gamma + 1) uniforms in [0, 1); valid (B,) drafts per row (default gamma).
    Returns ``(n, next)`` (B,) each: accepted drafts and the residual (or bonus) token.
    """
    if use_triton(p):
        return rejection_sample_triton(draft, p, q, u, valid)
    return rejection_sample_reference(draft, p, q, u, valid)


def aot_specs():
    """(kernel, signature, constexprs) for ahead-of-time compilation (fp32, fp16 and bf16 probs)."""
    specs = []
    for dt in ("fp32", "fp16", "bf16"):
        sig = {"Draft": "*i64", "P": f"*{dt}", "Q": f"*{dt}", "U": "*fp32", "Valid": "*i32",
               "NOut": "*i32", "NextOut": "*i32"}
        sig.update({n: "i32" for n in ["sdb", "sdg", "spb", "spg", "spv", "sqb", "sqg", "sqv", "sub", "sug",
                                        "gamma", "V"]})
        sig["BLOCK_V"] = "constexpr"
        specs.append((_rejection_sample_kernel, sig, {"BLOCK_V": 1024}))
    return specs


def bench(B=1, gamma=4, V=49152, dtype=torch.float32):
    """Microseconds per call, Triton vs the torch reference, on CUDA (None without CUDA)."""
    if not torch.cuda.is_available():
        return None
    from triton.testing import do_bench

    p = torch.softmax(torch.randn(B, gamma + 1, V, device="cuda"), -1).to(dtype)
    q = torch.softmax(torch.randn(B, gamma, V, device="cuda"), -1).to(dtype)
    draft = torch.multinomial(q.float().view(-1, V), 1).view(B, gamma)
    u = torch.rand(B, gamma + 1, device="cuda")
    t_triton = do_bench(lambda: rejection_sample_triton(draft, p, q, u)) * 1e3
    t_torch = do_bench(lambda: rejection_sample_reference(draft, p, q, u)) * 1e3
    return {"triton_us": t_triton, "torch_us": t_torch, "shape": dict(B=B, gamma=gamma, V=V)}
