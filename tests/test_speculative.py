"""speculative.generate: greedy == AR greedy token for token; sampling is lossless (chi-square with a
negative control); ragged batches, EOS inside a draft, max_new_tokens inside a block, cache
rollback, stats and bad input.

Draft: until the zoo has "tiny-draft", the draft is tiny's first two layers (plus its final
norm and tied LM head): same tokenizer, a *different* distribution that often agrees.
"""
import copy
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

import pytest  # noqa: E402
import torch  # noqa: E402

from kernels.rejection_sample import rejection_sample
from refimpl import autoregressive as ar  # noqa: E402
from refimpl import models  # noqa: E402
from refimpl import speculative as sp  # noqa: E402
from first_two import exact_first_two, first_two_pvalue  # noqa: E402  (tests/first_two.py)

TEXTS = [
    "And God said",
    "In the beginning",
    "The LORD is my shepherd; I shall not want. He maketh me",
    "Blessed are the poor in spirit: for theirs is the kingdom of heaven. Blessed are they that",
    "And",
]
N = 24  # new tokens per greedy test


def early_exit(lm, layers):
    """A draft made of the first ``layers`` layers of ``lm`` (shares its tokenizer)."""
    from transformers import AutoModelForCausalLM

    cfg = copy.deepcopy(lm.model.config)
    cfg.num_hidden_layers = layers
    m = AutoModelForCausalLM.from_config(cfg)
    m.load_state_dict(lm.model.state_dict(), strict=False)
    return models.LM(m.to(lm.device), lm.tokenizer, name=f"{lm.name}-exit{layers}")


# the kernels' torch references here; test_triton_path_gives_the_same_tokens runs the Triton path
pytestmark = pytest.mark.usefixtures("torch_kernels")


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    return models.load("tiny", device="cpu")


@pytest.fixture(scope="module")
def draft(target):
    return early_exit(target, 2)


@pytest.fixture(scope="module")
def prompts(target):
    return [target.encode(t) for t in TEXTS]


@pytest.fixture(scope="module")
def ar_free(target, prompts):
    """AR greedy references, never stopping at EOS."""
    return [ar.generate(target, p, max_new_tokens=N, eos_token_id=[]).tokens[0] for p in prompts]


# ---- greedy exactness -----------------------------------------------------------------
@pytest.mark.parametrize("gamma", [1, 4, 8])
def test_greedy_rows_equal_ar(target, draft, prompts, ar_free, gamma):
    for p, ref in zip(prompts, ar_free):
        assert sp.generate(target, p, draft=draft, gamma=gamma, max_new_tokens=N, eos_token_id=[]).tokens[0] == ref


@pytest.mark.parametrize("gamma", [1, 2, 3, 4, 5, 6, 7, 8])
def test_ragged_batch_equals_rows(target, draft, prompts, ar_free, gamma):
    g = sp.generate(target, prompts, draft=draft, gamma=gamma, max_new_tokens=N, eos_token_id=[])
    assert g.tokens == ar_free
    acc = [tuple(a) for a in g.stats.accepted]
    assert any(len(set(a)) > 1 for a in acc), "rows should accept different counts (ragged)"


def test_self_draft_accepts_everything(target, prompts):
    """Draft == target: every draft is accepted, so each target call emits gamma + 1 tokens
    (exercises the all-accepted path, where the draft must catch up on its last draft)."""
    g = sp.generate(target, prompts[:2], draft=target, gamma=4, max_new_tokens=20, eos_token_id=[])
    assert g.stats.target_calls == 4 and g.stats.alpha == 1.0
    assert g.stats.tau == pytest.approx(5.0)
    assert g.tokens == [ar.generate(target, p, max_new_tokens=20, eos_token_id=[]).tokens[0] for p in prompts[:2]]


def frequent_token(target, ar_free):
    """A token that the greedy outputs emit mid-sequence in several rows (',' when it is)."""
    comma = target.encode(",")[0]
    if sum(comma in r[1:-1] for r in ar_free) >= 2:
        return comma
    from collections import Counter

    return Counter(t for r in ar_free for t in set(r[1:-1])).most_common(1)[0][0]


@pytest.mark.parametrize("gamma", [3, 6])
def test_eos_inside_a_draft_stops_inclusive(target, draft, prompts, ar_free, gamma):
    eos = frequent_token(target, ar_free)
    g = sp.generate(target, prompts, draft=draft, gamma=gamma, max_new_tokens=N, eos_token_id=eos)
    stopped = 0
    for toks, ref in zip(g.tokens, ar_free):
        if eos in ref:
            assert toks == ref[: ref.index(eos) + 1]
            stopped += 1
        else:
            assert toks == ref
    assert stopped >= 2, "the test needs rows that hit EOS"
    # the case matters: EOS arrives as an accepted draft, so the block has tokens after it to drop
    free = sp.generate(target, prompts, draft=draft, gamma=gamma, max_new_tokens=N, eos_token_id=[])
    inside = 0
    for r, ref in enumerate(ar_free):
        if eos in ref:
            start, cut = 0, ref.index(eos)
            for step in free.stats.accepted:  # each step emits accepted + 1 tokens
                if start + step[r] + 1 > cut:
                    inside += cut - start < step[r]  # an accepted draft, not the target's token
                    break
                start += step[r] + 1
    assert inside >= 1, "EOS should fall inside an accepted block at least once"
    # a list of EOS ids works too, and the batch answer equals single-row answers
    assert sp.generate(target, prompts[2], draft=draft, gamma=gamma, max_new_tokens=N,
                       eos_token_id=[eos, 10**6]).tokens[0] == g.tokens[2]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6, 11])
def test_max_new_tokens_inside_a_block(target, draft, prompts, ar_free, n):
    g = sp.generate(target, prompts, draft=draft, gamma=4, max_new_tokens=n, eos_token_id=[])
    assert g.tokens == [r[:n] for r in ar_free]
    assert all(len(t) == n for t in g.tokens)


def test_stats(target, draft, prompts):
    g = sp.generate(target, prompts, draft=draft, gamma=4, max_new_tokens=N, eos_token_id=[])
    s = g.stats
    assert s.nfe == s.target_calls + s.draft_calls and s.rows == len(prompts)
    assert s.new_tokens == sum(map(len, g.tokens)) == len(prompts) * N
    assert len(s.accepted) == s.target_calls and all(len(a) == len(prompts) for a in s.accepted)
    assert 0 <= s.alpha <= 1 and s.drafted >= sum(map(sum, s.accepted))
    assert s.target_calls < N  # fewer target calls than AR needs
    # tau counts each row only in the passes it took part in: the per-row runs' passes, summed
    alone = [sp.generate(target, [p], draft=draft, gamma=4, max_new_tokens=N, eos_token_id=[]).stats for p in prompts]
    assert s.row_steps == sum(a.target_calls for a in alone) <= len(prompts) * s.target_calls
    assert s.tau == pytest.approx(s.new_tokens / s.row_steps)
    assert s.seconds > 0


# ---- sampling -------------------------------------------------------------------------
def test_sampling_is_seeded(target, draft, prompts):
    def run(seed):
        return sp.generate(target, prompts, draft=draft, gamma=3, max_new_tokens=12, temperature=0.8, top_p=0.95,
                           generator=torch.Generator().manual_seed(seed)).tokens

    a = run(1)
    assert a == run(1) and a != run(2)
    assert all(len(t) == 12 for t in a)


@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_sampling_with_top_k_1_equals_greedy(target, draft, prompts, ar_free, gamma):
    """top_k=1 makes p and q one-hot: the accept test, the residual draw (the target's argmax) and
    both cache rollbacks of the sampling path must then reproduce AR greedy exactly."""
    g = sp.generate(target, prompts, draft=draft, gamma=gamma, max_new_tokens=N, temperature=1.3, top_k=1,
                    generator=torch.Generator().manual_seed(0), eos_token_id=[])
    assert g.tokens == ar_free
    assert 0 < g.stats.alpha < 1


def wrong_accept_all(draft, p, q, u, valid):
    """Negative control: accept every draft token (the output then follows q, not p)."""
    import kernels

    n = valid.clone()
    rows = torch.arange(len(n))
    return n, rejection_sample(draft[:, :0], p[rows, n][:, None], q[:, :0], u[:, -1:])[1]


def wrong_residual_is_p(draft, p, q, u, valid):
    """Negative control: after a rejection resample from p instead of norm(max(0, p - q))."""
    import kernels

    n, _ = rejection_sample(draft, p, q, u, valid)
    rows = torch.arange(len(n))
    return n, rejection_sample(draft[:, :0], p[rows, n][:, None], q[:, :0], u[:, -1:])[1]


SAMPLES, TOP_K, TEMP = 1200, 4, 1.0


def chi_square_pvalue(target, draft, prompt, rule, seed=1234):
    """p-value of the chi-square test: first two tokens of speculative sampling vs the target's joint.

    gamma = 2 and max_new_tokens = 3: the first token comes from the accept test at position 1,
    the second from the test at position 2 or (after a rejection) from the next step, so the
    accept test, the residual and the bonus all feed the statistic.
    """
    exact = exact_first_two(target, prompt, TEMP, TOP_K)
    g = sp.decode(target, sp.DraftModel(draft, sp.FixedGamma(2), target), [prompt] * SAMPLES, max_new_tokens=3,
                  temperature=TEMP, top_k=TOP_K, generator=torch.Generator().manual_seed(seed), eos_token_id=[],
                  rule=rule)
    return first_two_pvalue(g.tokens, exact), g.stats.alpha


@pytest.fixture(scope="module")
def chi_prompt(target):
    return target.encode("And the LORD spake unto Moses, saying")


def test_sampling_is_lossless_chi_square(target, draft, chi_prompt):
    """Fixed seed. Power, measured with seeds 1234..1238 (1,200 samples, 16 pairs, 8 cells of
    expected count >= 5 plus one pooled cell, draft alpha ~0.67): correct rule p = 0.17-0.73;
    accept-all p = 0 (it emits pairs the target never does); residual-from-p p < 1e-29."""
    pvalue, alpha = chi_square_pvalue(target, draft, chi_prompt, None)
    assert 0.05 < alpha < 0.95, "the draft must differ from the target for the test to have power"
    assert pvalue > 1e-3


@pytest.mark.parametrize("rule", [wrong_accept_all, wrong_residual_is_p])
def test_chi_square_rejects_wrong_rules(target, draft, chi_prompt, rule):
    pvalue, _ = chi_square_pvalue(target, draft, chi_prompt, rule)
    assert pvalue < 1e-6


def test_triton_path_gives_the_same_tokens(target, draft, prompts, monkeypatch):
    """The dispatchers' Triton path (interpreter on CPU) and the torch path agree inside generate."""
    kw = dict(gamma=3, max_new_tokens=6, eos_token_id=[])
    ref_greedy = sp.generate(target, prompts[:2], draft=draft, **kw).tokens
    ref_sample = sp.generate(target, prompts[:2], draft=draft, temperature=0.9, top_k=20,
                             generator=torch.Generator().manual_seed(3), **kw).tokens
    import kernels.rejection_sample
    import kernels.verify_greedy

    for kernel in (kernels.verify_greedy, kernels.rejection_sample):
        monkeypatch.setattr(kernel, "INTERPRET", True)
    assert sp.generate(target, prompts[:2], draft=draft, **kw).tokens == ref_greedy
    assert sp.generate(target, prompts[:2], draft=draft, temperature=0.9, top_k=20,
                       generator=torch.Generator().manual_seed(3), **kw).tokens == ref_sample


def test_roll_back_without_holes_equals_the_general_one(target, prompts):
    """SlotCache.keep_accepted's shortcut (no holes, every row keeps the same count: a crop) leaves the
    cache exactly as the general masked roll-back does: same mask, counts, length and next logits."""
    from refimpl.slot_cache import SlotCache

    ids = torch.tensor([prompts[2], prompts[2][::-1]])  # two rows, no padding
    drafts = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    for n in (0, 2, 4):
        a, b = SlotCache(target, 2, "cpu"), SlotCache(target, 2, "cpu")
        for sc in (a, b):
            sc.feed(ids)
            sc.feed(drafts)
        a.keep_accepted(4, torch.tensor([n, n]), [n, n])  # the shortcut
        b.keep(4, (torch.arange(4)[None, :] < n).long().expand(2, 4), b.mask.shape[1] - 4 + n, new_holes=False)
        assert a.dense and not b.dense  # a keeps only its length; b's mask and counts are tensors
        assert torch.equal(a.mask, b.mask) and torch.equal(a.count, b.count) and a.holes == b.holes is False
        assert a.cache.get_seq_length() == b.cache.get_seq_length() == ids.shape[1] + n
        assert torch.equal(a.feed(torch.tensor([[3], [4]])).logits, b.feed(torch.tensor([[3], [4]])).logits)
    a = SlotCache(target, 2, "cpu")
    a.feed(ids)
    a.feed(drafts)
    a.keep_accepted(4, torch.tensor([1, 3]), [1, 3])  # different counts: holes, the general path
    assert a.holes and a.count.tolist() == [ids.shape[1] + 1, ids.shape[1] + 3] and a.mask.shape[1] == ids.shape[1] + 3


def test_dense_slot_cache_equals_an_explicit_one(target, prompts):
    """While every slot is valid a SlotCache keeps only its length; its mask, counts and logits equal
    those of a cache whose mask is a tensor from the start, through a roll-back, a padded feed (which
    makes holes) and a row leaving the batch."""
    from refimpl.slot_cache import SlotCache

    ids = torch.tensor([prompts[2], prompts[2][::-1]])
    a, b = SlotCache(target, 2, "cpu"), SlotCache(target, 2, "cpu")
    b.mask = b.mask  # (2, 0): an explicit mask from the start
    assert a.dense and not b.dense
    steps = [lambda sc: sc.feed(ids), lambda sc: sc.feed(torch.tensor([[5, 6, 7], [8, 9, 10]])),
             lambda sc: sc.keep_accepted(3, torch.tensor([1, 1]), [1, 1]),
             lambda sc: sc.feed(torch.tensor([[3, 4], [4, 3]]), torch.tensor([[0, 1], [1, 1]])),
             lambda sc: sc.select(torch.tensor([1])), lambda sc: sc.feed(torch.tensor([[7]]))]
    for i, step in enumerate(steps):
        out_a, out_b = step(a), step(b)
        assert (out_a is None) == (out_b is None) and (out_a is None or torch.equal(out_a.logits, out_b.logits)), i
        assert torch.equal(a.mask, b.mask) and torch.equal(a.count, b.count) and a.length == b.length, i
        assert a.dense == (i < 3), i  # the padded feed ends the dense state
    assert a.holes and a.count.tolist() == [ids.shape[1] + 1 + 2 + 1]


class KeepLog:
    """A target that logs each call's (tokens fed, logits_to_keep) and otherwise forwards to ``lm``."""

    def __init__(self, lm):
        self.lm, self.log = lm, []

    def __getattr__(self, name):
        return getattr(self.lm, name)

    def forward(self, input_ids, cache=None, **kw):
        self.log.append((input_ids.shape[1], kw.get("logits_to_keep", 0)))
        return self.lm.forward(input_ids, cache, **kw)


class VerdictLog(sp.DraftModel):
    """The draft-model proposer, keeping every verdict it is shown; it asks for the prompt's logits
    (``Needs.fed``) when ``wants_fed``."""

    def __init__(self, draft, wants_fed):
        super().__init__(draft, sp.FixedGamma(3))
        self.wants_fed, self.verdicts = wants_fed, []

    def start(self, ids, mask, settings):
        return super().start(ids, mask, settings)._replace(fed=self.wants_fed)

    def accept(self, v):
        self.verdicts.append(v)
        super().accept(v)


@pytest.mark.parametrize("wants_fed", [False, True])
def test_prefill_scores_the_prompt_only_when_the_proposer_reads_it(target, draft, prompts, ar_free, wants_fed):
    """The first call feeds the prompt + the drafts; unless the proposer sets ``wants_fed`` it asks for
    the logits from the root on only (``logits_to_keep = g + 1``) and ``Verdict.fed`` is empty;
    with it, ``fed`` holds the prompt's own logits (== an uncached forward of the prompt). Same tokens."""
    t, prop = KeepLog(target), VerdictLog(draft, wants_fed)
    p = prompts[3]
    g = sp.decode(t, prop, [p], max_new_tokens=N, eos_token_id=[])
    assert g.tokens[0] == ar_free[3]
    assert t.log[0] == (len(p) + 3, 0 if wants_fed else 4)  # prompt + 3 drafts; keep the root's + the drafts'
    assert all(keep == 0 for _, keep in t.log[1:])  # later calls feed one token + drafts: all their logits count
    fed = prop.verdicts[0].fed
    assert fed.shape == ((1, len(p) - 1, target.vocab_size) if wants_fed else (1, 0, target.vocab_size))
    if wants_fed:
        torch.testing.assert_close(fed, target.logits(torch.tensor([p]))[:, :-1], rtol=1e-4, atol=1e-4)
    assert prop.verdicts[0].logits.shape == (1, 4, target.vocab_size)


def test_slot_cache_keep_returns_the_last_logits(target, prompts):
    """SlotCache.feed(keep=k): the last k positions' logits of a full feed, the hidden states of all."""
    from refimpl.slot_cache import SlotCache

    ids = torch.tensor([prompts[2]])
    a, b = SlotCache(target, 1, "cpu"), SlotCache(target, 1, "cpu")
    la, ha = a.feed(ids, hidden=True)
    lb, hb = b.feed(ids, hidden=True, keep=3)
    assert lb.shape == (1, 3, target.vocab_size) and torch.equal(ha, hb) and a.length == b.length == ids.shape[1]
    torch.testing.assert_close(lb, la[:, -3:], rtol=1e-5, atol=1e-5)


# ---- bad input ------------------------------------------------------------------------
@pytest.mark.parametrize("kw,name", [
    (dict(gamma=0), "gamma"),
    (dict(gamma=-2), "gamma"),
    (dict(gamma=1.5), "gamma"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(temperature=-0.5), "temperature"),
    (dict(temperature=1.0, top_p=0.0), "top_p"),
    (dict(temperature=1.0, top_k=0), "top_k"),
])
def test_bad_arguments_name_the_argument(target, draft, kw, name):
    with pytest.raises(ValueError, match=name):
        sp.generate(target, [[5, 6]], draft=draft, **kw)


@pytest.mark.parametrize("bad", [[[]], [], [[1] * 600], [[1, 4096]], [[-1, 2]], "And God"])
def test_bad_prompts(target, draft, bad):
    with pytest.raises(ValueError, match="prompts"):
        sp.generate(target, bad, draft=draft)


def test_mismatched_tokenizer_names_draft(target, draft):
    tok = copy.deepcopy(target.tokenizer)
    tok.add_tokens(["<|not-in-the-target|>"])  # a different vocabulary, same model
    other = models.LM(draft.model, tok, name="other")
    with pytest.raises(ValueError, match="draft"):
        sp.generate(target, [[5, 6]], draft=other)
    small = early_exit(target, 1)  # same tokenizer, but a head of a different size
    small.vocab_size = target.vocab_size + 1
    with pytest.raises(ValueError, match="draft"):
        sp.generate(target, [[5, 6]], draft=small)


def test_expected_tau_formula():
    assert sp.expected_tau(0.0, 4) == 1.0
    assert sp.expected_tau(1.0, 4) == 5.0
    assert sp.expected_tau(0.5, 2) == pytest.approx(1.75)


def test_bench_methods(target, draft, prompts):
    from refimpl.bench import Context
    from refimpl.bench.rows import decode_rows

    greedy, sampled = "speculative [cpu]", "speculative [cpu] T=0.7"
    methods = {m.name: m for m in decode_rows() if m.name in (greedy, sampled)}
    assert set(methods) == {greedy, sampled}
    assert all(m.needs == ("target", "draft") for m in methods.values())
    assert methods[greedy].exact and not methods[sampled].exact
    ctx = Context(target=target, draft=draft)
    out = methods[greedy].run(ctx, prompts[0], 10)
    assert out.tokens[0] == ar.generate(target, prompts[0], max_new_tokens=10).tokens[0]
    assert out.stats.draft_calls == sp.generate(target, [prompts[0]], draft=draft, max_new_tokens=10).stats.draft_calls
    assert len(methods[sampled].run(ctx, prompts[0], 10).tokens[0]) <= 10
