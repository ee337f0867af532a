"""kernels/confidence_select: Triton (interpreter) vs torch reference, and AOT compile for sm80/sm90."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from kernels.confidence_select import (confidence_select, confidence_select_reference,
                                       confidence_select_triton)


def _case(B, N, V, seed, p_mask=0.6, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, N, V, generator=g) * scale
    masked = torch.rand(B, N, generator=g) < p_mask
    return logits, masked, g


@pytest.mark.parametrize("B,N,V", [(1, 1, 7), (2, 5, 1000), (3, 17, 4099), (4, 32, 130), (2, 64, 257)])
def test_topk_matches_reference(B, N, V):
    logits, masked, g = _case(B, N, V, seed=B * 1000 + N + V)
    k = torch.randint(0, N + 2, (B,), generator=g)  # ragged, some 0, some above the masked count
    x0, conf, sel = confidence_select_triton(logits, masked, k=k)
    rx0, rconf, rsel = confidence_select_reference(logits, masked, k=k)
    assert torch.equal(x0, rx0)
    assert torch.allclose(conf, rconf, rtol=1e-5, atol=1e-6)
    assert torch.equal(sel, rsel)
    assert torch.equal(sel.sum(-1), torch.minimum(k, masked.sum(-1)))
    assert not bool((sel & ~masked).any())


@pytest.mark.parametrize("B,N,V,thr", [(2, 5, 1000, 0.05), (3, 17, 4099, 0.5), (4, 32, 130, 0.999999),
                                       (2, 9, 33, 1.0)])
def test_threshold_matches_reference(B, N, V, thr):
    logits, masked, _ = _case(B, N, V, seed=N + V, scale=6.0)
    masked[0] = False  # a finished row selects nothing
    x0, conf, sel = confidence_select_triton(logits, masked, threshold=thr)
    rx0, rconf, rsel = confidence_select_reference(logits, masked, threshold=thr)
    assert torch.equal(x0, rx0) and torch.equal(sel, rsel)
    assert torch.allclose(conf, rconf, rtol=1e-5, atol=1e-6)
    assert int(sel[0].sum()) == 0
    for b in range(1, B):  # at least one per row that still has a masked position
        assert int(sel[b].sum()) >= (1 if masked[b].any() else 0)


def test_online_softmax_over_tiles_is_exact_probability():
    # the argmax sits in the last, partial tile: the online max/sum must rescale correctly
    V = 1000
    logits = torch.zeros(1, 3, V)
    logits[0, :, V - 1] = torch.tensor([1.0, 5.0, 20.0])
    masked = torch.ones(1, 3, dtype=torch.bool)
    x0, conf, _ = confidence_select_triton(logits, masked, k=torch.tensor([1]))
    assert x0.tolist() == [[V - 1] * 3]
    want = torch.softmax(logits, -1)[0, :, V - 1]
    assert torch.allclose(conf[0], want, rtol=1e-5)


def test_ties_pick_lowest_index():
    logits = torch.zeros(1, 4, 50)
    logits[0, :, 3] = 2.0
    logits[0, :, 7] = 2.0  # tie inside a row -> argmax 3; equal confidences -> lowest position first
    masked = torch.ones(1, 4, dtype=torch.bool)
    x0, _, sel = confidence_select_triton(logits, masked, k=torch.tensor([2]))
    assert x0.tolist() == [[3, 3, 3, 3]] and sel.tolist() == [[True, True, False, False]]


def test_dispatcher_and_bad_input():
    logits, masked, _ = _case(2, 4, 99, seed=0)
    a = confidence_select(logits, masked, k=1)
    b = confidence_select_reference(logits, masked, k=1)
    assert all(torch.equal(x, y) if x.dtype != torch.float32 else torch.allclose(x, y) for x, y in zip(a, b))
    with pytest.raises(ValueError, match="exactly one"):
        confidence_select(logits, masked)
    with pytest.raises(ValueError, match="threshold"):
        confidence_select(logits, masked, threshold=1.5)
    with pytest.raises(ValueError, match="masked"):
        confidence_select(logits, masked[:, :2], k=1)
    assert callable(confidence_select)


# The sm80/sm90 ahead-of-time compile of this kernel is in tests/test_kernels_aot.py (all kernels).
