"""rejection_sample: Triton (interpreter) == torch reference draw for draw, and the rule is lossless.

The losslessness check is exact: for gamma = 1 on a small vocabulary the kernel's output is a
piecewise-constant function of the draft token x and the two uniforms (u0 for the accept test,
u1 for the inverse-CDF draw), with breakpoints at p(x)/q(x) and at the cumulative sums of the
residual and of p. Evaluating the kernel at the midpoint of every cell and weighting by the
cell's probability gives the exact distribution of the emitted token: it must equal p. The same
enumeration of two deliberately wrong rules must not.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel module is imported

import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from kernels.rejection_sample import (rejection_sample, rejection_sample_reference,  # noqa: E402
                                      rejection_sample_triton)

CASES = [  # B, gamma, V
    (1, 4, 1000),
    (3, 1, 4099),
    (5, 8, 37),
    (2, 0, 100),   # nothing drafted: a plain draw from p
    (4, 3, 1),     # one-token vocabulary
    (6, 5, 2049),  # vocab one past a tile boundary
]


def make_case(B, gamma, V, seed, sparse=False):
    g = torch.Generator().manual_seed(seed)
    lp = torch.randn(B, gamma + 1, V, generator=g) * 2
    lq = lp[:, :gamma] + torch.randn(B, gamma, V, generator=g)  # q close to p: many acceptances
    if sparse:  # top-k style zeros in both
        drop = torch.rand(lp.shape, generator=g) < 0.7
        drop[..., 0] = False
        lp = lp.masked_fill(drop, float("-inf"))
        drop_q = drop[:, :gamma] | (torch.rand(lq.shape, generator=g) < 0.1)  # q's support differs a little
        drop_q[..., 0] = False
        lq = lq.masked_fill(drop_q, float("-inf"))
    p, q = torch.softmax(lp, -1), torch.softmax(lq, -1)
    if gamma:
        draft = torch.multinomial(q.reshape(-1, V), 1, generator=g).view(B, gamma)
    else:
        draft = torch.zeros(B, 0, dtype=torch.long)
    u = torch.rand(B, gamma + 1, generator=g)
    valid = torch.randint(0, gamma + 1, (B,), generator=g)
    return draft, p, q, u, valid


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("ragged,sparse", [(False, False), (True, False), (True, True)])
def test_triton_matches_reference(case, ragged, sparse):
    accepted = 0
    for seed in range(3):
        draft, p, q, u, valid = make_case(*case, seed=seed, sparse=sparse)
        valid = valid if ragged else None
        n_ref, nxt_ref = rejection_sample_reference(draft, p, q, u, valid)
        n_tri, nxt_tri = rejection_sample_triton(draft, p, q, u, valid, block_v=256)
        assert torch.equal(n_ref, n_tri) and torch.equal(nxt_ref, nxt_tri)
        assert (p[torch.arange(len(n_ref)), n_ref].gather(1, nxt_ref[:, None]) > 0).all()
        accepted += int(n_ref.sum())
    if case[1] >= 3 and case[2] > 1:
        assert accepted > 0, "the fuzz case should exercise acceptances"


def test_p_equals_q_always_accepts_and_empty_residual_falls_back_to_p():
    p = torch.softmax(torch.randn(3, 3, 50, generator=torch.Generator().manual_seed(0)), -1)
    draft = p[:, :2].argmax(-1)
    u = torch.full((3, 3), 0.999)
    for fn in (rejection_sample_reference, rejection_sample_triton):
        n, nxt = fn(draft, p, p[:, :2].clone(), u)
        assert n.tolist() == [2, 2, 2]  # p/q = 1 > u: always accepted
    # the residual of p == q is empty: a forced rejection (u ignored via valid) must still draw from p
    q = p[:, :2].clone()
    q[:, 0] = p[:, 0] * 1.0  # identical
    for fn in (rejection_sample_reference, rejection_sample_triton):
        n, nxt = fn(draft, p, q, torch.zeros(3, 3), torch.tensor([0, 1, 2]))
        assert n.tolist() == [0, 1, 2]


# ---- exact enumeration: the emitted token is distributed as p --------------------------
def correct_rule(draft, p, q, u, valid=None):
    return rejection_sample(draft, p, q, u, valid)


def wrong_accept_all(draft, p, q, u, valid=None):
    """Negative control: accept every draft (the output follows q)."""
    B, gamma = draft.shape
    n = torch.full((B,), gamma) if valid is None else valid.clone()
    return n, rejection_sample_reference(draft[:, :0], p[:, -1:], q[:, :0], u[:, -1:])[1]


def wrong_residual_is_p(draft, p, q, u, valid=None):
    """Negative control: after a rejection resample from p instead of norm(max(0, p - q))."""
    n, _ = rejection_sample_reference(draft, p, q, u, valid)
    rows = torch.arange(len(n))
    nxt = rejection_sample_reference(draft[:, :0], p[rows, n][:, None], q[:, :0], u[:, -1:])[1]
    return n, nxt


def _cells(breaks):
    b = torch.unique(torch.cat([torch.tensor([0.0, 1.0], dtype=torch.float64), breaks.double().clamp(0, 1)]))
    return (b[:-1] + b[1:]) / 2, b[1:] - b[:-1]  # midpoints, widths


def emitted_distribution(rule, p1, p2, q1):
    """Exact P(first emitted token), and P(bonus | all accepted), for gamma = 1."""
    V = p1.numel()
    r = (p1 - q1).clamp(min=0)
    breaks1 = torch.cat([(r.cumsum(0) / r.sum()) if r.sum() > 0 else p1.cumsum(0), p1.cumsum(0), p2.cumsum(0)])
    u1_mid, u1_w = _cells(breaks1)
    rows, weights = [], []
    for x in range(V):
        if q1[x] == 0:
            continue
        u0_mid, u0_w = _cells(torch.stack([p1[x] / q1[x]]))
        for a, wa in zip(u0_mid.tolist(), u0_w.tolist()):
            for b, wb in zip(u1_mid.tolist(), u1_w.tolist()):
                rows.append((x, a, b))
                weights.append(float(q1[x]) * wa * wb)
    R = len(rows)
    draft = torch.tensor([[x for x, _, _ in rows]])
    u = torch.tensor([[a, b] for _, a, b in rows], dtype=torch.float32)
    P = torch.stack([p1, p2])[None].expand(R, 2, V).contiguous()
    Q = q1[None, None].expand(R, 1, V).contiguous()
    n, nxt = rule(draft.T.contiguous(), P, Q, u, None)
    w = torch.tensor(weights, dtype=torch.float64)
    first = torch.where(n == 1, draft[0], nxt)
    dist_first = torch.zeros(V, dtype=torch.float64).index_add_(0, first, w)
    acc = n == 1
    dist_bonus = torch.zeros(V, dtype=torch.float64).index_add_(0, nxt[acc], w[acc])
    return dist_first, dist_bonus / dist_bonus.sum()


def random_pq(V, seed, zeros=False):
    g = torch.Generator().manual_seed(seed)
    p1, p2, q1 = (torch.softmax(torch.randn(V, generator=g) * 1.5, 0) for _ in range(3))
    if zeros:  # supports that only partly overlap, as under top-k
        p1[0], q1[1] = 0.0, 0.0
        p1, q1 = p1 / p1.sum(), q1 / q1.sum()
    return p1, p2, q1


@pytest.mark.parametrize("seed,zeros", [(0, False), (1, False), (2, True)])
def test_exact_enumeration_is_lossless(seed, zeros):
    p1, p2, q1 = random_pq(6, seed, zeros)
    for rule in (rejection_sample_triton, rejection_sample_reference):
        first, bonus = emitted_distribution(rule, p1, p2, q1)
        torch.testing.assert_close(first, p1.double(), atol=1e-6, rtol=0)
        torch.testing.assert_close(bonus, p2.double(), atol=1e-6, rtol=0)


@pytest.mark.parametrize("wrong", [wrong_accept_all, wrong_residual_is_p])
def test_exact_enumeration_rejects_wrong_rules(wrong):
    """Negative control: the same enumeration detects a wrong rule (the check has power)."""
    for seed in range(2):
        p1, p2, q1 = random_pq(6, seed)
        first, _ = emitted_distribution(wrong, p1, p2, q1)
        assert (first - p1.double()).abs().max() > 0.01


def test_bad_shapes_raise():
    d = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="q must be"):
        rejection_sample_reference(d, torch.zeros(2, 4, 10), torch.zeros(2, 4, 10), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="u must be"):
        rejection_sample_reference(d, torch.zeros(2, 4, 10), torch.zeros(2, 3, 10), torch.zeros(2, 3))


# The sm80/sm90 ahead-of-time compile of this kernel is in tests/test_kernels_aot.py (all kernels).


def test_bench_skips_without_cuda():
    from kernels.rejection_sample import bench

    assert bench() is None or torch.cuda.is_available()


def test_references_block_switches_the_dispatchers_to_torch_and_restores(monkeypatch):
    """The interpreter switch is read once, at import; ``kernels.references()`` turns it off for a block
    and back on after, in every kernel file, and never touches the environment."""
    import importlib

    import kernels
    from kernels.rejection_sample import use_triton

    mods = [importlib.import_module(f"kernels.{m}") for m in kernels.MODULES]
    for m in mods:
        monkeypatch.setattr(m, "INTERPRET", True)
    env = dict(os.environ)
    t = torch.zeros(1)
    assert use_triton(t)
    with kernels.references():
        assert not use_triton(t) and not any(m.INTERPRET for m in mods)
    assert use_triton(t) and all(m.INTERPRET for m in mods) and dict(os.environ) == env
