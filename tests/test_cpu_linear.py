"""refimpl.models.cpu_linear: prepacked oneDNN linears give F.linear's results (row for row the same bits
whatever the number of rows), fall back where they cannot apply, and keep greedy speculative
decoding equal to AR greedy."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from refimpl import autoregressive as ar
from refimpl import models
from refimpl.models import cpu_linear
from refimpl import speculative as sp

pytestmark = pytest.mark.skipif(not cpu_linear.available(), reason="torch built without oneDNN")


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 37), (5, 37), (2, 3, 37), (1, 9, 37)])
def test_prepacked_equals_f_linear(bias, shape):
    g = torch.Generator().manual_seed(0)
    lin = nn.Linear(37, 1000, bias=bias)
    x = torch.randn(*shape, generator=g)
    ref = F.linear(x, lin.weight, lin.bias)
    with torch.no_grad():
        out = cpu_linear.PrepackedLinear(lin)(x)
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_rows_scored_together_equal_rows_scored_alone():
    """The property verification relies on: a token's logits do not depend on its block size."""
    g = torch.Generator().manual_seed(1)
    lin = cpu_linear.PrepackedLinear(nn.Linear(576, 1536))
    x = torch.randn(9, 576, generator=g)
    with torch.no_grad():
        alone = torch.cat([lin(x[i:i + 1]) for i in range(9)])
        for k in (2, 3, 5, 9):
            together = lin(x[:k])
            assert (together - alone[:k]).abs().max().item() <= 1e-6 * alone.abs().max().item()


def test_falls_back_for_autograd_and_repacks_after_in_place_edits():
    lin = nn.Linear(8, 4)
    p = cpu_linear.PrepackedLinear(lin)
    x = torch.randn(3, 8, requires_grad=True)
    p(x).sum().backward()  # grad mode: plain F.linear, gradients reach the shared parameters
    assert lin.weight.grad is not None and x.grad is not None
    with torch.no_grad():
        lin.weight.mul_(2.0)
        torch.testing.assert_close(p(x), F.linear(x, lin.weight, lin.bias))
    with pytest.raises(ValueError, match="linear"):
        cpu_linear.PrepackedLinear(nn.Conv1d(2, 2, 1))


def test_prepack_linears_swaps_every_linear_and_keeps_state_dict(tiny):
    import copy

    lm = models.LM(copy.deepcopy(tiny.model), tiny.tokenizer, name="tiny-copy")
    keys = set(lm.model.state_dict())
    n_linear = sum(type(m) is nn.Linear for m in lm.model.modules())
    ids = torch.tensor([tiny.encode("And God said unto Moses")])
    before = lm.logits(ids)
    assert cpu_linear.prepack_linears(lm.model) == n_linear > 0
    assert cpu_linear.prepack_linears(lm.model) == 0  # already swapped
    assert not any(type(m) is nn.Linear for m in lm.model.modules())
    assert set(lm.model.state_dict()) == keys
    torch.testing.assert_close(lm.logits(ids), before, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="model"):
        cpu_linear.prepack_linears("not a model")


def test_load_prepack_argument(tiny):
    lm = models.load("tiny", device="cpu", prepack=True)
    assert any(isinstance(m, cpu_linear.PrepackedLinear) for m in lm.model.modules())
    assert lm.vocab_size == tiny.vocab_size
    # the default (None) packs only models worth it: SmolLM2's target and draft, not the tiny ones
    for name in ("tiny", "tiny-draft"):
        assert not any(isinstance(m, cpu_linear.PrepackedLinear) for m in models.load(name, device="cpu").model.modules())
    assert models.ZOO["smollm2-135m"].prepack and models.ZOO["smollm2-135m-draft"].prepack
    with pytest.raises(ValueError, match="prepack"):
        models.load("tiny", device="cpu", prepack="yes")


def test_greedy_speculative_with_prepacked_models_equals_ar():
    target = models.load("tiny", device="cpu", prepack=True)
    draft = models.load("tiny-draft", device="cpu", prepack=True)
    for text in ["And God said", "The LORD is my shepherd; I shall not want. He maketh me"]:
        p = target.encode(text)
        ref = ar.generate(target, p, max_new_tokens=20, eos_token_id=[]).tokens[0]
        for gamma in (2, 4):
            got = sp.generate(target, p, draft=draft, gamma=gamma, max_new_tokens=20, eos_token_id=[]).tokens[0]
            assert got == ref


def test_matmul_cost_reports_both_paths():
    rows = cpu_linear.matmul_cost(nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 8)), rows=(1, 5),
                                  repeats=2)
    assert [r["rows"] for r in rows] == [1, 5]
    assert all(r["mkl_ms"] > 0 and r["prepacked_ms"] > 0 for r in rows)
