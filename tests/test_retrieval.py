"""retrieval.generate (prompt lookup on the verification core): greedy == AR greedy token for token
(ragged batches, EOS inside a proposal, max_new_tokens inside a proposal); sampling is lossless
(chi-square on the first two tokens, with an accept-everything rule as the negative control)."""
import pytest
import torch

from refimpl import autoregressive as ar
from refimpl import retrieval, sampling
from refimpl import speculative as sp
from refimpl.copy_prior import lookup_positions

REPEAT = "And God said, Let there be light: and there was light. And God said, Let there be"
TEXTS = [REPEAT, "In the beginning God created the heaven and the earth. In the beginning God",
         "The LORD is my shepherd; I shall not want.", "And"]


@pytest.fixture(scope="module")
def prompts(tiny):
    return [tiny.encode(t) for t in TEXTS]


def test_lookup_positions_match_brute_force():
    g = torch.Generator().manual_seed(0)
    for _ in range(30):
        h = torch.randint(0, 4, (int(torch.randint(2, 30, (1,), generator=g)),), generator=g).tolist()
        t = len(h) - 1
        want = -1
        for n in (3, 2, 1):
            starts = [i for i in range(t - n + 1) if i + n - 1 < t and h[i:i + n] == h[t - n + 1:t + 1]]
            if t >= n and starts:
                want = max(starts) + n
                break
        assert lookup_positions(torch.tensor(h), torch.tensor([t]), 3, 1).item() == want, h


@pytest.mark.parametrize("num_tokens", [1, 3, 10])
def test_greedy_equals_ar_row_by_row_and_ragged(tiny, prompts, num_tokens):
    ref = ar.generate(tiny, prompts, max_new_tokens=24, eos_token_id=[])
    got = retrieval.generate(tiny, prompts, max_new_tokens=24, eos_token_id=[], num_tokens=num_tokens)
    assert got.tokens == ref.tokens
    one = [retrieval.generate(tiny, [p], max_new_tokens=24, eos_token_id=[], num_tokens=num_tokens).tokens[0]
           for p in prompts]
    assert one == ref.tokens
    assert got.stats.draft_calls == 0 and got.stats.tau > 1.0  # the repeated prompts are copied


@pytest.mark.parametrize("n", [1, 2, 5, 7])
def test_max_new_tokens_and_eos_inside_a_proposal(tiny, prompts, n):
    free = ar.generate(tiny, [prompts[0]], max_new_tokens=12, eos_token_id=[]).tokens[0]
    assert retrieval.generate(tiny, [prompts[0]], max_new_tokens=n, eos_token_id=[]).tokens[0] == free[:n]
    eos = free[3]  # a token the copy proposes: decoding must stop right after it, inclusive
    got = retrieval.generate(tiny, [prompts[0]], max_new_tokens=12, eos_token_id=eos).tokens[0]
    assert got == free[: free.index(eos) + 1]


def test_bad_arguments_name_the_argument(tiny, prompts):
    for kw, name in [({"method": "suffix"}, "method"), ({"num_tokens": 0}, "num_tokens"),
                     ({"min_ngram": 3, "max_ngram": 2}, "min_ngram"), ({"temperature": -1.0}, "temperature"),
                     ({"max_new_tokens": 0}, "max_new_tokens")]:
        with pytest.raises(ValueError, match=name):
            retrieval.generate(tiny, prompts[:1], **kw)
    with pytest.raises(ValueError, match="prompts"):
        retrieval.generate(tiny, [[]])


TOP_K, TEMP, SAMPLES = 4, 1.0, 1500


def accept_all(draft, p, q, u, valid):
    """Negative control: keep every proposed token (the output then copies, whatever p says)."""
    rows = torch.arange(len(valid))
    return valid.clone(), sampling.sample_from_probs(p[rows, valid])


def first_two_pvalue(tiny, prompt, rule):
    from scipy.stats import chisquare

    p1 = sampling.probs(tiny.logits(torch.tensor([prompt]))[0, -1], TEMP, TOP_K)
    firsts = p1.nonzero()[:, 0].tolist()
    p2 = sampling.probs(tiny.logits(torch.tensor([prompt + [a] for a in firsts]))[:, -1], TEMP, TOP_K)
    exact = {(a, b): float(p1[a] * p2[i, b]) for i, a in enumerate(firsts) for b in p2[i].nonzero()[:, 0].tolist()}
    g = sp.decode(tiny, retrieval.PromptLookup(num_tokens=3), [prompt] * SAMPLES, max_new_tokens=3, temperature=TEMP,
                  top_k=TOP_K, generator=torch.Generator().manual_seed(7), eos_token_id=[], rule=rule)
    counts: dict = {}
    for t in g.tokens:
        counts[tuple(t[:2])] = counts.get(tuple(t[:2]), 0) + 1
    if not set(counts) <= set(exact):
        return 0.0, g
    big = [k for k in exact if exact[k] * SAMPLES >= 5]
    obs = [counts.get(k, 0) for k in big] + [SAMPLES - sum(counts.get(k, 0) for k in big)]
    exp = [exact[k] * SAMPLES for k in big] + [SAMPLES * (1 - sum(exact[k] for k in big))]
    return chisquare(obs, exp).pvalue, g


@pytest.mark.usefixtures("torch_kernels")
def test_sampling_is_lossless_and_the_wrong_rule_is_caught(tiny):
    """The lookup proposes " Moses" after the second "And the LORD spake unto" (p = 0.56 under
    top-4): a one-hot q is accepted with probability p(x), else the residual (p without x) is sampled."""
    prompt = tiny.encode("And the LORD spake unto Moses, saying, Speak unto the children of Israel. "
                         "And the LORD spake unto")
    pvalue, g = first_two_pvalue(tiny, prompt, None)
    assert g.stats.drafted > 0 and 0.05 < g.stats.alpha < 0.95  # both branches of the rule run
    assert pvalue > 1e-3
    bad, _ = first_two_pvalue(tiny, prompt, accept_all)
    assert bad < 1e-6
