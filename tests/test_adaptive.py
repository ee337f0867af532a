"""Adaptive gamma (refimpl.adaptive): greedy equals AR greedy; sampling is distributed as the target.

Greedy runs on the zoo's ``tiny`` with two drafts (``tiny-draft`` and an early exit at k = 1) over
thresholds, policies, lengths and an EOS forced inside drafts (the id of ","). The sampling test
uses a toy pair of random 6-token Llamas, enumerates the target's exact distribution over the
first four tokens and checks pair marginals with a chi-square test; the negative control (accept
every draft) must fail the same test.
"""
import types

import pytest
import torch
from scipy import stats as sstats

from kernels.rejection_sample import rejection_sample_reference
from refimpl import adaptive, autoregressive, drafts, models, speculative
from refimpl.train import tiny_config


@pytest.fixture(scope="module")
def tiny():
    return models.load("tiny", device="cpu")


@pytest.fixture(scope="module")
def tiny_drafts(tiny):
    return {"tiny-draft": models.load("tiny-draft", device="cpu"), "exit1": drafts.early_exit(tiny, 1)}


PROMPTS = ["And God said", "In the beginning God created the heaven", "Jesus answered and said unto them,",
           "The LORD is my shepherd"]


@pytest.mark.parametrize("draft_name,policy,threshold,max_gamma", [
    ("tiny-draft", "threshold", 0.6, 8), ("tiny-draft", "threshold", 0.0, 5), ("tiny-draft", "ucb", 0.6, 8),
    ("exit1", "threshold", 0.9, 3), ("exit1", "cumulative", 0.1, 8)])
def test_greedy_equals_autoregressive(tiny, tiny_drafts, draft_name, policy, threshold, max_gamma):
    draft = tiny_drafts[draft_name]
    prompts = [tiny.encode(t) for t in PROMPTS]
    comma = tiny.encode(",")[0]
    for n, eos in ((1, None), (6, comma), (21, comma)):
        ref = autoregressive.generate(tiny, prompts, max_new_tokens=n, eos_token_id=eos).tokens
        got = adaptive.generate(tiny, prompts, draft=draft, max_gamma=max_gamma, threshold=threshold,
                                max_new_tokens=n, eos_token_id=eos, policy=policy)
        assert got.tokens == ref, (n, eos)
        one = adaptive.generate(tiny, prompts[1], draft=draft, max_gamma=max_gamma, threshold=threshold,
                                max_new_tokens=n, eos_token_id=eos, policy=policy)
        assert one.tokens[0] == ref[1]


def test_threshold_changes_draft_length(tiny, tiny_drafts):
    p = tiny.encode(PROMPTS[0])
    low = adaptive.generate(tiny, p, draft=tiny_drafts["tiny-draft"], max_gamma=8, threshold=0.0, max_new_tokens=24)
    high = adaptive.generate(tiny, p, draft=tiny_drafts["tiny-draft"], max_gamma=8, threshold=1.0, max_new_tokens=24)
    assert max(high.stats.extra["gammas"]) == 1  # every token is "unsure": one draft per step
    assert low.stats.extra["gammas"][0] == 8  # never unsure: max_gamma unless the budget ends
    assert low.tokens == high.tokens
    assert low.stats.target_calls < high.stats.target_calls


def test_bad_arguments(tiny, tiny_drafts):
    d = tiny_drafts["exit1"]
    p = tiny.encode(PROMPTS[0])
    for kw, name in ((dict(max_gamma=0), "max_gamma"), (dict(threshold=1.5), "threshold"),
                     (dict(policy="oracle"), "policy"), (dict(temperature=-1.0), "temperature"),
                     (dict(top_p=0.0), "top_p")):
        with pytest.raises(ValueError, match=name):
            adaptive.generate(tiny, p, draft=d, **kw)
    with pytest.raises(ValueError, match="prompts"):
        adaptive.generate(tiny, [[]], draft=d)
    with pytest.raises(ValueError, match="gammas"):
        adaptive.UCB(gammas=(0, 2))


# ---------------------------------------------------------------------------------------
# sampling: exact enumeration on a toy vocabulary
# ---------------------------------------------------------------------------------------
V, N_NEW, ROWS = 6, 4, 6000


def toy_lm(seed: int, layers: int, scale: float):
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_config(V, hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=False)
    m = LlamaForCausalLM(cfg)
    with torch.no_grad():
        m.lm_head.weight.mul_(scale)  # peaky distributions: the draft is sometimes sure, sometimes not
    tok = types.SimpleNamespace(eos_token_id=0, pad_token_id=1, mask_token_id=None)
    return models.LM(m, tok, name=f"toy{seed}")


@pytest.fixture(scope="module")
def toy():
    target = toy_lm(0, 2, 40.0)
    draft = toy_lm(1, 1, 40.0)
    draft.tokenizer = target.tokenizer  # the same tokenizer object
    return target, draft


def exact_joint(lm, prompt):
    """P(t1..t4) (V^4,) by enumeration: one batched forward over every 3-token prefix."""
    pre = torch.cartesian_prod(*[torch.arange(V)] * (N_NEW - 1))  # (V^3, 3)
    ids = torch.cat([torch.tensor(prompt).expand(pre.shape[0], -1), pre], 1)
    logp = torch.log_softmax(lm.logits(ids).double(), -1)[:, len(prompt) - 1:]  # (V^3, 4, V)
    lp = torch.zeros(pre.shape[0], dtype=torch.double)
    for i in range(N_NEW - 1):
        lp += logp[torch.arange(pre.shape[0]), i, pre[:, i]]
    return (lp[:, None] + logp[:, -1]).exp().reshape(-1)  # (V^4,) index = t1 t2 t3 t4 in base V


def pair_pvalues(samples, joint):
    j = joint.view(*[V] * N_NEW)
    out = []
    for a, b in ((0, 1), (1, 2), (2, 3)):
        others = tuple(d for d in range(N_NEW) if d not in (a, b))
        exp = j.sum(others).reshape(-1) * len(samples)
        obs = torch.zeros(V * V, dtype=torch.double)
        for s in samples:
            obs[s[a] * V + s[b]] += 1
        keep = exp > 5
        chi = (((obs - exp) ** 2)[keep] / exp[keep]).sum().item() + 0.0
        rest_o, rest_e = obs[~keep].sum().item(), exp[~keep].sum().item()
        dof = int(keep.sum()) - 1
        if rest_e > 0:
            chi += (rest_o - rest_e) ** 2 / rest_e
            dof += 1
        out.append(sstats.chi2.sf(chi, dof))
    return out


def accept_all(draft, p, q, u, valid):
    """A WRONG rule: accept every proposed draft and take the bonus token from p."""
    B = draft.shape[0]
    n = valid.clone()
    nxt = torch.multinomial(p[torch.arange(B), n], 1, generator=torch.Generator().manual_seed(3)).squeeze(-1)
    return n, nxt


@pytest.mark.parametrize("policy", ["threshold", "cumulative", "ucb"])
def test_sampling_matches_target_distribution(toy, policy, monkeypatch):
    monkeypatch.setattr(speculative, "rejection_sample", rejection_sample_reference)
    target, draft = toy
    prompt = [3, 4, 5]
    joint = exact_joint(target, prompt)
    g = adaptive.generate(target, [prompt] * ROWS, draft=draft, max_gamma=3, threshold=0.7, max_new_tokens=N_NEW,
                          temperature=1.0, generator=torch.Generator().manual_seed(0), eos_token_id=[],
                          policy=policy)
    assert all(len(t) == N_NEW for t in g.tokens)  # (the Triton kernel is checked against the reference in
    # tests/test_kernel_rejection_sample.py; the interpreter would be slow on 6000 rows)
    lengths = set(g.stats.extra["gammas"])
    assert 0.05 < g.stats.alpha < 0.95 and max(lengths) > 1  # the rule is exercised both ways
    assert min(pair_pvalues(g.tokens, joint)) > 1e-3


def test_negative_control_fails(toy, monkeypatch):
    monkeypatch.setattr(speculative, "rejection_sample", accept_all)
    target, draft = toy
    prompt = [3, 4, 5]
    joint = exact_joint(target, prompt)
    g = adaptive.generate(target, [prompt] * ROWS, draft=draft, max_gamma=3, threshold=0.7, max_new_tokens=N_NEW,
                          temperature=1.0, generator=torch.Generator().manual_seed(0), eos_token_id=[])
    assert min(pair_pvalues(g.tokens, joint)) < 1e-6
