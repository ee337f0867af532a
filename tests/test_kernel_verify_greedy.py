"""verify_greedy: Triton (interpreter) == torch reference on odd vocabularies and ragged rows; AOT build."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel module is imported

import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from kernels.verify_greedy import (argmax, verify_greedy, verify_greedy_host,  # noqa: E402
                                   verify_greedy_reference, verify_greedy_triton)

CASES = [  # B, gamma, V
    (1, 4, 1000),
    (3, 1, 4099),
    (5, 8, 37),
    (2, 0, 100),   # nothing drafted: only the next token
    (4, 3, 1),     # a one-token vocabulary
    (6, 5, 2049),  # vocab one past a tile boundary
]


def make_case(B, gamma, V, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, gamma + 1, V, generator=g).to(dtype)
    draft = logits[:, :gamma].float().argmax(-1)  # (B, gamma) all correct ...
    cut = torch.randint(0, gamma + 1, (B,), generator=g)  # ... until a random position
    for b in range(B):
        if cut[b] < gamma and V > 1:
            draft[b, cut[b]] = (draft[b, cut[b]] + 1 + torch.randint(0, V - 1, (1,), generator=g)) % V
    valid = torch.randint(0, gamma + 1, (B,), generator=g)
    return draft, logits, valid


@pytest.mark.parametrize("impl", ["triton", "host"])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("ragged", [False, True])
def test_triton_and_host_match_reference(case, ragged, impl):
    """The Triton kernel (vocabulary tiles of 256) and the CPU dispatch (NumPy argmax + a walk in
    Python) return the reference's int64 tensors."""
    for seed in range(3):
        draft, logits, valid = make_case(*case, seed=seed)
        valid = valid if ragged else None
        ref = verify_greedy_reference(draft, logits, valid)
        got = (verify_greedy_triton(draft, logits, valid, block_v=256) if impl == "triton"
               else verify_greedy_host(draft, logits, valid))
        assert all(torch.equal(a, b) and b.dtype == torch.long for a, b in zip(ref, got))


def test_argmax_equals_torch_on_ties_nan_strides_and_dtypes():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 5000, generator=g)
    x[0, 0, [11, 4000]] = 9.0  # a tie: the first index
    x[1, 1, :] = 0.0  # all equal
    x[2, 2, [5, 17]] = float("nan")  # NaN counts as the maximum, first one wins
    x[3, 0, 4999] = float("inf")
    for t in (x, x[:, :, ::3], x.transpose(0, 1), x[0, 0], x.double(), torch.randn(2, 0, 7)[:, :, 0:0 + 7]):
        assert torch.equal(argmax(t), t.argmax(-1)) and argmax(t).dtype == torch.long
    for t in (x.half(), x.bfloat16(), x.clone().requires_grad_()):  # torch's own path
        assert torch.equal(argmax(t), t.argmax(-1))


def test_reference_semantics_by_hand():
    V = 10
    logits = torch.full((2, 4, V), -1.0)
    for i, t in enumerate([3, 5, 7, 9]):  # target argmax per position: 3, 5, 7, 9
        logits[:, i, t] = 1.0
    draft = torch.tensor([[3, 5, 2], [3, 5, 7]])
    for f in (verify_greedy, verify_greedy_reference, verify_greedy_host):
        n, nxt = f(draft, logits)
        assert n.tolist() == [2, 3] and nxt.tolist() == [7, 9]  # correction 7; bonus 9
        n, nxt = f(draft, logits, torch.tensor([1, 0]))  # ragged: fewer real drafts
        assert n.tolist() == [1, 0] and nxt.tolist() == [5, 3]


def test_ties_pick_the_smallest_index_like_torch():
    logits = torch.zeros(1, 2, 3000)
    logits[0, :, [7, 1500, 2999]] = 5.0  # ties across vocabulary tiles
    n, nxt = verify_greedy_triton(torch.tensor([[7]]), logits, block_v=512)
    assert n.item() == 1 and nxt.item() == 7 == logits[0, 1].argmax().item()


def test_half_precision_and_strided_logits():
    draft, logits, valid = make_case(3, 4, 1001, seed=5, dtype=torch.float16)
    wide = torch.randn(3, 9, 1001).half()
    wide[:, 2:7] = logits  # a non-contiguous slice, as speculative.generate passes it
    sl = wide[:, 2:7]
    assert [t.tolist() for t in verify_greedy_triton(draft, sl, valid)] == \
           [t.tolist() for t in verify_greedy_reference(draft, logits, valid)]


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="logits"):
        verify_greedy_reference(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3, 10))
    with pytest.raises(ValueError, match="valid"):
        verify_greedy_reference(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 4, 10), torch.zeros(3))


# The sm80/sm90 ahead-of-time compile of this kernel is in tests/test_kernels_aot.py (all kernels).


def test_bench_skips_without_cuda():
    from kernels.verify_greedy import bench

    assert bench() is None or torch.cuda.is_available()
