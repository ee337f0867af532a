import pytest
import torch

from refimpl import sampling


def test_greedy_is_argmax():
    logits = torch.randn(3, 7, 50)
    assert torch.equal(sampling.sample(logits, temperature=0.0), logits.argmax(-1))
    p = sampling.probs(logits, temperature=0.0)
    assert torch.equal(p.argmax(-1), logits.argmax(-1)) and torch.allclose(p.sum(-1), torch.ones(3, 7))


def test_temperature_matches_softmax():
    logits = torch.randn(4, 30)
    for t in (0.3, 1.0, 2.5):
        assert torch.allclose(sampling.probs(logits, t), torch.softmax(logits / t, -1), atol=1e-6)


def test_top_k_keeps_k_largest():
    logits = torch.tensor([[0.1, 3.0, 2.0, -1.0, 0.5]])
    p = sampling.probs(logits, 1.0, top_k=2)
    assert (p > 0).sum().item() == 2 and p[0, 1] > p[0, 2] > 0
    assert torch.allclose(p[0, [1, 2]], torch.softmax(torch.tensor([3.0, 2.0]), -1))


def test_top_p_smallest_nucleus():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    # 0.5 < 0.7 -> need the 0.3 token too; 0.8 >= 0.7 -> stop
    p = sampling.probs(logits, 1.0, top_p=0.7)
    assert torch.allclose(p, torch.tensor([[0.625, 0.375, 0.0, 0.0]]), atol=1e-6)
    # top_p tiny -> only the most likely token
    assert torch.allclose(sampling.probs(logits, 1.0, top_p=1e-6), torch.tensor([[1.0, 0, 0, 0]]))
    # top_p = 1 keeps everything
    assert torch.allclose(sampling.probs(logits, 1.0, top_p=1.0), probs, atol=1e-6)


def test_top_p_agrees_with_transformers():
    from transformers.generation.logits_process import TopPLogitsWarper

    torch.manual_seed(0)
    logits = torch.randn(8, 100) * 3
    for top_p in (0.3, 0.9):
        ours = sampling.apply_top_p(logits, top_p)
        hf = TopPLogitsWarper(top_p)(None, logits.clone())
        assert torch.equal(torch.isinf(ours), torch.isinf(hf))


def test_seeded_sampling_reproducible_and_distributed():
    logits = torch.tensor([0.0, 1.0, 2.0])
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    a = sampling.sample(logits.expand(4000, 3), 1.0, generator=g1)
    b = sampling.sample(logits.expand(4000, 3), 1.0, generator=g2)
    assert torch.equal(a, b)
    freq = torch.bincount(a, minlength=3).float() / 4000
    assert torch.allclose(freq, torch.softmax(logits, -1), atol=0.03)


@pytest.mark.parametrize("kw,name", [
    (dict(temperature=-0.1), "temperature"), (dict(temperature=1.0, top_k=0), "top_k"),
    (dict(temperature=1.0, top_p=0.0), "top_p"), (dict(temperature=1.0, top_p=1.5), "top_p"),
])
def test_bad_sampling_args(kw, name):
    with pytest.raises(ValueError, match=name):
        sampling.sample(torch.randn(2, 5), **kw)
