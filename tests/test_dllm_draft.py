"""dllm_draft (the block-diffusion tiny-bdlm drafting gamma tokens per step for the AR tiny, on the
shared verification core): greedy == AR greedy token for token (several gammas and draft_steps,
ragged batches, EOS inside a draft, max_new_tokens inside a draft); sampling is lossless: chi-square on
the first two tokens, whose second is a dLLM draft drawn from its marginal, with an accept-everything
rule and a proposer that reports the wrong q as negative controls."""
import pytest
import torch

from refimpl import dllm_draft, models, sampling
from refimpl import speculative as sp
from decoding import first_accepted_draft  # tests/decoding.py
from first_two import exact_first_two, first_two_pvalue  # tests/first_two.py

pytestmark = pytest.mark.usefixtures("torch_kernels")

N = 20  # = spec_ar_free's length


@pytest.fixture(scope="module")
def bdlm():
    return models.load("tiny-bdlm", device="cpu")


@pytest.mark.parametrize("gamma,steps", [(1, 1), (4, 1), (6, 1), (6, 3), (8, 2)])
def test_greedy_equals_ar(tiny, bdlm, spec_prompts, spec_ar_free, gamma, steps):
    g = dllm_draft.generate(tiny, spec_prompts, dlm=bdlm, gamma=gamma, draft_steps=steps, max_new_tokens=N, eos_token_id=[])
    assert g.tokens == spec_ar_free
    assert g.stats.draft_calls > 0 and g.stats.tau > 1.0
    for p, want in zip(spec_prompts[:2], spec_ar_free):  # rows alone
        one = dllm_draft.generate(tiny, [p], dlm=bdlm, gamma=gamma, draft_steps=steps, max_new_tokens=N, eos_token_id=[])
        assert one.tokens[0] == want


@pytest.mark.parametrize("n", [1, 2, 5, 7])
def test_max_new_tokens_inside_a_draft(tiny, bdlm, spec_prompts, spec_ar_free, n):
    g = dllm_draft.generate(tiny, spec_prompts, dlm=bdlm, gamma=6, max_new_tokens=n, eos_token_id=[])
    assert g.tokens == [t[:n] for t in spec_ar_free]


def test_eos_inside_an_accepted_draft(tiny, bdlm, spec_prompts, spec_ar_free):
    free = dllm_draft.generate(tiny, spec_prompts, dlm=bdlm, gamma=6, max_new_tokens=N, eos_token_id=[])
    found = first_accepted_draft(free, N - 2)
    assert found is not None, "the test needs an accepted draft token to turn into EOS"
    row, eos, pos = found
    g = dllm_draft.generate(tiny, spec_prompts, dlm=bdlm, gamma=6, max_new_tokens=N, eos_token_id=eos)
    assert g.tokens[row] == spec_ar_free[row][: pos + 1]
    assert g.tokens == [t[: t.index(eos) + 1] if eos in t else t for t in spec_ar_free]


@pytest.mark.parametrize("kw,name", [(dict(gamma=0), "gamma"), (dict(gamma=2.5), "gamma"),
                                     (dict(draft_steps=0), "draft_steps"), (dict(gamma=2, draft_steps=3), "draft_steps")])
def test_bad_arguments(tiny, bdlm, spec_prompts, kw, name):
    with pytest.raises(ValueError, match=name):
        dllm_draft.generate(tiny, spec_prompts, dlm=bdlm, **kw)


def test_a_drafter_without_mask_is_refused(tiny, spec_prompts):
    import copy

    no_mask = copy.copy(tiny)
    no_mask.mask_token_id = None
    with pytest.raises(ValueError, match="dlm"):
        dllm_draft.generate(tiny, spec_prompts, dlm=no_mask)


def accept_all(draft, p, q, u, valid):
    """Negative control: keep every draft (the output then follows the dLLM's marginals)."""
    rows = torch.arange(len(valid))
    return valid.clone(), sampling.sample_from_probs(p[rows, valid])


class WrongQ(dllm_draft.DiffusionDraft):
    """Negative control (a proposer bug): every draft reports the first position's q, not its own."""

    def propose(self, caps):
        prop = super().propose(caps)
        if prop.q is not None and prop.q.shape[1] > 1:
            prop = prop._replace(q=prop.q[:, :1].expand_as(prop.q).contiguous())
        return prop


TOP_K, TEMP, SAMPLES = 5, 1.0, 1500


def pvalue(tiny, bdlm, prompt, exact, seed, rule=None, cls=dllm_draft.DiffusionDraft):
    g = sp.decode(tiny, cls(bdlm, 2, 1, tiny), [prompt] * SAMPLES, max_new_tokens=3, temperature=TEMP, top_k=TOP_K,
                  generator=torch.Generator().manual_seed(seed), eos_token_id=[], rule=rule)
    return first_two_pvalue(g.tokens, exact), g


@pytest.mark.parametrize("text,seed", [("And the", 3), ("And he said", 4)])
def test_sampling_is_lossless_and_wrong_rules_are_caught(tiny, bdlm, text, seed):
    """gamma = 2, one denoising step: token 2's draft is drawn from the dLLM's marginal given the
    prompt alone, independent of token 1; the rule min(1, p/q) with the residual still gives the
    target's joint distribution. Measured (seeds 3-5): correct rule p = 0.16-0.88, both drafts accepted
    in 26-40% of the rows; accept-all p = 0; wrong q p < 1e-20 (on "Then" the drafter's two marginals are
    close and the wrong q only reaches p ~ 1e-5, so that prompt is not used)."""
    prompt = tiny.encode(text)
    exact = exact_first_two(tiny, prompt, TEMP, TOP_K)
    good, g = pvalue(tiny, bdlm, prompt, exact, seed)
    both = sum(k == 2 for k in g.stats.accepted[0]) / SAMPLES
    assert 0.05 < both < 0.95, "the second draft must be accepted sometimes and rejected sometimes"
    assert good > 1e-3
    assert pvalue(tiny, bdlm, prompt, exact, seed, rule=accept_all)[0] < 1e-6
    assert pvalue(tiny, bdlm, prompt, exact, seed, cls=WrongQ)[0] < 1e-6
