"""tree.generate / tree.DraftTree (the draft model's top-k tree on the verification core): greedy ==
AR greedy for several tree shapes, ragged batches and rows alone, EOS inside an accepted path,
max_new_tokens inside a path; sampling with deterministic top-k children is lossless (chi-square on
the first two tokens, with a walk that keeps a rejected child's token as the negative control); the
Triton attention kernel scores the trees exactly as the default attention does."""
import pytest
import torch

from refimpl import models, tree
from refimpl import speculative as sp
from decoding import first_accepted_draft  # tests/decoding.py
from first_two import exact_first_two, first_two_pvalue  # tests/first_two.py
from test_tree import keeping_rejected_tokens  # a wrong SpecInfer walk (tests/test_tree.py)

pytestmark = pytest.mark.usefixtures("torch_kernels")

N = 20  # = spec_ar_free's length


@pytest.fixture(scope="module")
def draft():
    return models.load("tiny-draft", device="cpu")


@pytest.mark.parametrize("widths", [(1,), (2, 2), (3, 2, 1), (4,), (1, 1, 1, 1)])
def test_greedy_equals_ar(tiny, draft, spec_prompts, spec_ar_free, widths):
    g = tree.generate(tiny, spec_prompts, draft=draft, max_new_tokens=N, eos_token_id=[], widths=widths)
    assert g.tokens == spec_ar_free
    assert g.stats.tau > 1.0
    one = tree.generate(tiny, [spec_prompts[2]], draft=draft, max_new_tokens=N, eos_token_id=[], widths=widths)
    assert one.tokens[0] == spec_ar_free[2]


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_max_new_tokens_inside_a_path(tiny, draft, spec_prompts, spec_ar_free, n):
    g = tree.generate(tiny, spec_prompts, draft=draft, max_new_tokens=n, eos_token_id=[], widths=(2, 2, 2))
    assert g.tokens == [t[:n] for t in spec_ar_free]


def test_eos_inside_an_accepted_path(tiny, draft, spec_prompts, spec_ar_free):
    free = tree.generate(tiny, spec_prompts, draft=draft, max_new_tokens=N, eos_token_id=[], widths=(2, 2, 2))
    found = first_accepted_draft(free, None)
    assert found is not None
    row, eos, pos = found
    g = tree.generate(tiny, spec_prompts, draft=draft, max_new_tokens=N, eos_token_id=eos, widths=(2, 2, 2))
    assert g.tokens[row] == spec_ar_free[row][: pos + 1]
    assert g.tokens == [t[: t.index(eos) + 1] if eos in t else t for t in spec_ar_free]


@pytest.mark.parametrize("widths", [(), (0,), (2, -1), "22", (1.5,), (True,)])
def test_bad_widths(tiny, draft, spec_prompts, widths):
    with pytest.raises(ValueError, match="widths"):
        tree.generate(tiny, spec_prompts, draft=draft, widths=widths)


WrongWalk = keeping_rejected_tokens(tree.DraftTree)


TOP_K, TEMP, SAMPLES = 5, 1.0, 1500


def test_sampling_is_lossless_and_a_wrong_walk_is_caught(tiny, draft):
    """widths (3, 2): three deterministic children at the root (often all tried), two below each."""
    prompt = tiny.encode("And the")
    exact = exact_first_two(tiny, prompt, TEMP, TOP_K)

    def pvalue(cls):
        g = sp.decode(tiny, cls(draft, (3, 2), tiny), [prompt] * SAMPLES, max_new_tokens=3, temperature=TEMP,
                      top_k=TOP_K, generator=torch.Generator().manual_seed(5), eos_token_id=[])
        return first_two_pvalue(g.tokens, exact), g

    good, g = pvalue(tree.DraftTree)
    assert {0, 1, 2} <= set(g.stats.accepted[0])
    assert good > 1e-3
    assert pvalue(WrongWalk)[0] < 1e-6


def test_triton_attention_scores_trees_like_the_default(tiny, draft, spec_prompts, spec_ar_free, monkeypatch):
    """The 4-D ancestor masks go through the Triton kernel of kernels.decode_attention (under the
    interpreter here; compiled for sm_80 / sm_90 by tests/test_kernels_aot.py): same tokens, same
    accepted counts as the default attention, and the kernel really ran with tree masks."""
    import importlib

    da = importlib.import_module("kernels.decode_attention")

    calls = []

    def spy(q, k, v, mask=None, scale=None, causal=True, **kw):
        calls.append(None if mask is None else tuple(mask.shape))
        return real(q, k, v, mask, scale, causal, **kw)

    real = da.decode_attention_triton
    monkeypatch.setattr(da, "decode_attention_triton", spy)
    monkeypatch.setattr(da, "INTERPRET", True)  # (the module fixture runs the torch references)
    tri = models.load("tiny", device="cpu", attn="triton")
    a = tree.generate(tri, spec_prompts[:2], draft=draft, max_new_tokens=6, eos_token_id=[], widths=(2, 2))
    monkeypatch.setattr(da, "INTERPRET", False)
    b = tree.generate(tiny, spec_prompts[:2], draft=draft, max_new_tokens=6, eos_token_id=[], widths=(2, 2))
    assert a.tokens == b.tokens == [t[:6] for t in spec_ar_free[:2]]
    assert a.stats.accepted == b.stats.accepted
    assert any(m is not None and m[2] > 1 for m in calls), "the kernel must have scored a tree (Q > 1, a mask)"
