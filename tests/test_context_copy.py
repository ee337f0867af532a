"""copy_prior.ContextCopyLM: a draft plus a prompt-lookup copy prior.

The lookup equals a brute-force search; cached steps (with rollback and batch selection) give the
uncached logits; speculative decoding with it stays exact (greedy == AR) and lossless (chi-square),
and the prior really changes what the draft proposes.
"""
import random

import pytest
import torch

from refimpl import autoregressive as ar
from refimpl import copy_prior, drafts, primitives, sampling
from refimpl.models.lean_llama import LeanTrimmedLM
from refimpl import speculative as sp
from first_two import exact_first_two, first_two_pvalue  # tests/first_two.py

pytestmark = pytest.mark.usefixtures("torch_kernels")  # the kernels' torch references

#: prompts whose endings repeat an earlier n-gram, so the copy prior fires from the first step
TEXTS = [
    "And God said, Let there be light: and there was light. And God said, Let there",
    "The LORD is my shepherd; I shall not want. The LORD is my",
    "In the beginning God created the heaven and the earth. In the beginning",
    "And",
]


def brute_force(h, t, max_n, min_n):
    for n in range(max_n, min_n - 1, -1):
        if t - n + 1 < 0:
            continue
        pattern = h[t - n + 1: t + 1]
        for j in range(t - 1, n - 2, -1):  # occurrences ending at j < t, latest first
            if h[j - n + 1: j + 1] == pattern:
                return h[j + 1]
    return -1


@pytest.fixture(scope="module")
def target(tiny):
    return tiny


@pytest.fixture(scope="module")
def draft(target):
    return drafts.early_exit(target, 1)


@pytest.fixture(scope="module")
def copier(draft):
    return copy_prior.ContextCopyLM(draft, max_ngram=3, min_ngram=1, bias=4.0)


@pytest.fixture(scope="module")
def prompts(target):
    return [target.encode(t) for t in TEXTS]


# ---- the lookup -----------------------------------------------------------------------
def test_copy_candidates_match_brute_force():
    rng = random.Random(0)
    for _ in range(300):
        L, V = rng.randint(1, 40), rng.randint(2, 6)
        h = [rng.randrange(V) for _ in range(L)]
        max_n = rng.randint(1, 4)
        min_n = rng.randint(1, max_n)
        ends = sorted(rng.sample(range(L), rng.randint(1, L)))
        got = primitives.copy_candidates(torch.tensor(h), torch.tensor(ends), max_n, min_n).tolist()
        assert got == [brute_force(h, t, max_n, min_n) for t in ends], (h, ends, max_n, min_n)


def test_the_scan_and_the_vectorised_lookup_agree():
    """``method="scan"`` (what a draft step's one end per row takes) == ``"vectorised"`` (batches):
    random rows with unknown tokens (-1), padding ends (-1), every n-gram range."""
    rng = random.Random(2)
    for _ in range(400):
        B, L, V = rng.randint(1, 3), rng.randint(1, 40), rng.randint(2, 6)
        hist = torch.tensor([[rng.randrange(V) if rng.random() > 0.1 else -1 for _ in range(L)] for _ in range(B)])
        ends = torch.tensor([[rng.randrange(-1, L) for _ in range(rng.randint(1, 5))]] * B)
        max_n = rng.randint(1, 4)
        min_n = rng.randint(1, max_n)
        want = primitives.lookup_positions(hist, ends, max_n, min_n, method="vectorised")
        assert torch.equal(primitives.lookup_positions(hist, ends, max_n, min_n, method="scan"), want)
        assert torch.equal(primitives.lookup_positions(hist, ends, max_n, min_n), want)  # auto


def test_node_candidate_lists_match_the_batched_lookup():
    """Each node's candidate, scanned over its own list, == :func:`copy_candidates` over the padded
    batch (the tensor round trip it replaced): ragged histories, unknown tokens, empty ones, and a
    candidate that must be the *latest* occurrence's follower."""
    rng = random.Random(3)
    for _ in range(300):
        B, e, V = rng.randint(1, 3), rng.randint(1, 4), rng.randint(2, 6)
        hist = [[[rng.randrange(V) if rng.random() > 0.1 else -1 for _ in range(rng.randint(0, 30))]
                 for _ in range(e)] for _ in range(B)]
        max_n = rng.randint(1, 4)
        min_n = rng.randint(1, max_n)
        flat = [h for row in hist for h in row]
        L = max(1, max(len(h) for h in flat))
        pad = torch.tensor([h + [-1] * (L - len(h)) for h in flat])
        ends = torch.tensor([[len(h) - 1] for h in flat])
        want = primitives.copy_candidates(pad, ends, max_n, min_n).view(B, e)
        assert primitives.candidate_lists(hist, max_n, min_n) == want.tolist(), (hist, max_n, min_n)
    assert primitives.candidate_lists([[[5, 1, 2, 7, 1, 2, 9, 1, 2]]], 2, 2) == [[9]]
    with pytest.raises(ValueError, match="min_ngram"):
        primitives.candidate_lists([[[1, 2]]], 2, 3)


def test_lookup_bad_method_or_end_raises():
    h = torch.tensor([1, 2, 1, 2])
    with pytest.raises(ValueError, match="method"):
        primitives.lookup_positions(h, torch.tensor([3]), method="fast")
    with pytest.raises(ValueError, match="method='scan' needs every end"):
        primitives.lookup_positions(h, torch.tensor([4]), method="scan")


def test_copy_candidates_batched_rows_are_independent():
    rng = random.Random(1)
    hist = [[rng.randrange(4) for _ in range(30)] for _ in range(5)]
    ends = [sorted(rng.sample(range(30), 6)) for _ in range(5)]
    ends[2][0] = -1  # skipped (a padding position)
    got = primitives.copy_candidates(torch.tensor(hist), torch.tensor(ends), 3, 1).tolist()
    want = [[brute_force(h, t, 3, 1) if t >= 0 else -1 for t in e] for h, e in zip(hist, ends)]
    assert got == want


def test_copy_candidates_examples():
    h = torch.tensor([5, 6, 7, 8, 5, 6, 9, 5, 6])
    # ... 5 6 | latest earlier "5 6" ends at 5 -> 9; with bigrams only, position 5's "5 6" -> 7
    assert primitives.copy_candidates(h, torch.tensor([8, 5]), 2, 2).tolist() == [9, 7]
    # the longest match wins: "8 5 6" occurred once (-> 9 is not it: 3-gram "9 5 6" is new)
    h2 = torch.tensor([1, 2, 3, 4, 9, 2, 3, 7, 1, 2, 3])
    assert primitives.copy_candidates(h2, torch.tensor([10]), 3, 2).tolist() == [4]  # "1 2 3" -> 4
    assert primitives.copy_candidates(h2, torch.tensor([10]), 2, 2).tolist() == [7]  # latest "2 3" -> 7
    assert primitives.copy_candidates(h2, torch.tensor([0, 3]), 2, 1).tolist() == [-1, -1]  # nothing earlier
    unknown = torch.tensor([1, 2, -1, 1, 2])  # -1: a position not written yet never matches
    assert primitives.copy_candidates(unknown, torch.tensor([4]), 2, 2).tolist() == [-1]


# ---- the wrapped draft ----------------------------------------------------------------
def test_cached_steps_equal_uncached_logits_after_rollback(target, copier, prompts):
    p = prompts[1]
    cache = copier.new_cache()
    copier.forward(torch.tensor([p]), cache)
    copier.forward(torch.tensor([[11, 12, 13]]), cache)  # three drafts, then all rejected but one
    copier.crop(cache, len(p) + 1)
    tail = torch.tensor([[p[-3], p[-2], p[-1]]])  # repeats the prompt's ending: the prior fires
    got, _ = copier.forward(tail, cache)
    seq = torch.tensor([p + [11] + tail[0].tolist()])
    want = copier.logits(seq)[:, -3:]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    plain = copier.lm.logits(seq)[:, -3:]
    assert (got - plain).abs().amax() > 1.0  # the prior moved the logits (not a pass-through)


def test_left_padded_batch_and_batch_select(target, copier, prompts):
    a, b = prompts[0], prompts[1]
    L = max(len(a), len(b))
    ids = torch.tensor([[0] * (L - len(a)) + a, [0] * (L - len(b)) + b])
    mask = torch.tensor([[0] * (L - len(a)) + [1] * len(a), [0] * (L - len(b)) + [1] * len(b)])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = copier.new_cache()
    copier.forward(ids, cache, position_ids=pos, attention_mask=mask)
    cache.batch_select_indices(torch.tensor([1]))  # row 0 leaves the batch
    step = torch.tensor([[b[-2]]])
    got, _ = copier.forward(step, cache, position_ids=torch.tensor([[len(b)]]),
                            attention_mask=torch.cat([mask[1:], torch.ones(1, 1, dtype=torch.long)], 1))
    want = copier.logits(torch.tensor([b + [b[-2]]]))[:, -1:]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_greedy_equals_ar_and_the_prior_acts(target, draft, copier, prompts, gamma):
    ref = [ar.generate(target, p, max_new_tokens=20, eos_token_id=[]).tokens[0] for p in prompts]
    g = sp.generate(target, prompts, draft=copier, gamma=gamma, max_new_tokens=20, eos_token_id=[])
    assert g.tokens == ref
    rows = [sp.generate(target, [p], draft=copier, gamma=gamma, max_new_tokens=20, eos_token_id=[]) for p in prompts]
    assert [r.tokens[0] for r in rows] == ref  # ragged batch == one row at a time
    plain = sp.generate(target, prompts, draft=draft, gamma=gamma, max_new_tokens=20, eos_token_id=[])
    assert plain.tokens == ref
    assert g.stats.accepted != plain.stats.accepted  # the copy prior changed the proposals


def test_sampling_stays_lossless_chi_square(target, copier, prompts):
    """The first two sampled tokens (gamma 2) against the target's exact joint. The prompt ends in a
    repeated n-gram, so the biased q proposes the copy (" land": q 0.03 -> 0.65, target p 0.22);
    verifying with the inner draft's q instead (as if the prior were not part of the draft) is
    the negative control: its first token is 0.5 away in total variation. Power at seed 1234
    (1,200 samples): correct rule p = 0.86, inner q p = 0.0."""
    temp, top_k, samples = 1.0, 8, 1200
    prompt = target.encode("I will give thee the land of Egypt. I will give thee the")
    cand = primitives.copy_candidates(torch.tensor(prompt), torch.tensor([len(prompt) - 1]), 3, 1).item()  # " land"
    q_copy = sampling.probs(copier.logits(torch.tensor([prompt]))[0, -1], temp, top_k)
    q_inner = sampling.probs(copier.lm.logits(torch.tensor([prompt]))[0, -1], temp, top_k)
    assert q_copy[cand] > q_inner[cand] + 0.3  # the prior reshapes q: the control below has power
    exact = exact_first_two(target, prompt, temp, top_k)

    def pvalue(rule=None):
        g = sp.decode(target, sp.DraftModel(copier, sp.FixedGamma(2), target), [prompt] * samples, max_new_tokens=3,
                      temperature=temp, top_k=top_k, generator=torch.Generator().manual_seed(1234), eos_token_id=[],
                      rule=rule)
        return first_two_pvalue(g.tokens, exact)

    def inner_q(x, p, q, u, valid):
        """Wrong: verify the first step's drafts (sampled from the biased q) against the inner
        draft's own q, as if the copy prior were not part of the draft's distribution."""
        from kernels.rejection_sample import rejection_sample

        if x.shape[0] == samples and x.shape[1] == 2:  # the first step: every row has the bare prompt
            plain = copier.lm
            q1 = sampling.probs(plain.logits(torch.tensor([prompt]))[0, -1], temp, top_k)  # (V,)
            ctx = torch.cat([torch.tensor([prompt]).expand(len(x), -1), x[:, :1]], 1)  # (B, L + 1)
            q2 = sampling.probs(plain.logits(ctx)[:, -1], temp, top_k)  # (B, V)
            q = torch.stack([q1.expand_as(q2), q2], 1)  # (B, 2, V)
        return rejection_sample(x, p, q, u, valid)

    good, bad = pvalue(), pvalue(inner_q)
    assert good > 1e-3
    assert bad < 1e-6


def test_is_an_lm_reading_through_to_its_draft(target, draft, copier):
    from refimpl import models

    assert isinstance(copier, models.LM) and copier.lm is draft
    assert copier.model is draft.model and copier.tokenizer is draft.tokenizer
    assert copier.vocab_size == draft.vocab_size == target.vocab_size
    assert copier.num_layers == draft.num_layers and copier.encode("And God") == draft.encode("And God")
    with pytest.raises(AttributeError):
        copier.no_such_attribute


def test_bad_arguments(draft, copier):
    with pytest.raises(ValueError, match="min_ngram"):
        copy_prior.ContextCopyLM(draft, max_ngram=2, min_ngram=3)
    with pytest.raises(ValueError, match="bias"):
        copy_prior.ContextCopyLM(draft, bias=float("inf"))
    with pytest.raises(ValueError, match="bias"):
        copy_prior.ContextCopyLM(draft, bias=0.0)
    with pytest.raises(ValueError, match="cache"):
        copier.forward(torch.tensor([[1, 2]]), draft.new_cache())
    with pytest.raises(ValueError, match="attention_mask"):
        copier.forward(torch.tensor([[1, 2]]), copier.new_cache(), attention_mask=torch.zeros(1, 1, 2, 2))


def test_bench_row_without_the_prior_unwraps_the_draft(target, copier, prompts):
    from refimpl import bench
    from refimpl.bench.rows import decode_rows

    row = {m.name: m for m in decode_rows()}["speculative, draft without copy prior (gamma 4)"]
    ctx = bench.Context(target=target, model_name="tiny", draft=copier)
    g = row.run(ctx, prompts[0], 12)
    plain = sp.generate(target, [prompts[0]], draft=copier.lm, gamma=4, max_new_tokens=12)
    assert g.tokens == plain.tokens and g.stats.accepted == plain.stats.accepted


@pytest.mark.parametrize("gamma", [2, 5])
def test_on_a_lean_trimmed_draft_like_the_smollm2_one(target, gamma):
    """The zoo's SmolLM2 draft in miniature: a trimmed head + the context's tokens, the lean
    forward and its preallocated cache, wrapped with the copy prior; ragged batch, adaptive gamma."""
    from refimpl import adaptive, data, models

    kept = drafts.frequent_tokens(target, data.kjv_chapters()[:40], 300)
    base = models.load("tiny-draft", device="cpu")
    inner = LeanTrimmedLM.of(drafts.trim_vocab(base, kept, context_vocab=True))
    copier = copy_prior.ContextCopyLM(inner)
    texts = ["And the king Nebuchadnezzar came to Babylon, and the king", "And", TEXTS[0]]
    prompts = [target.encode(t) for t in texts]
    ref = [ar.generate(target, p, max_new_tokens=20, eos_token_id=[]).tokens[0] for p in prompts]
    assert sp.generate(target, prompts, draft=copier, gamma=gamma, max_new_tokens=20, eos_token_id=[]).tokens == ref
    g = adaptive.generate(target, prompts, draft=copier, max_gamma=gamma + 2, threshold=0.2, max_new_tokens=20,
                          policy="cumulative", eos_token_id=[])
    assert g.tokens == ref
    # the copy is a token outside the kept head: scored (context vocab) and raised by the prior
    ids = torch.tensor([prompts[0]])
    cand = primitives.copy_candidates(ids[0], torch.tensor([ids.shape[1] - 1]), 3, 2).item()
    assert cand >= 0 and cand not in set(kept.tolist())
    with_prior, _ = copier.forward(ids)
    without, _ = inner.forward(ids)
    assert not with_prior.requires_grad and not without.requires_grad  # decoding builds no autograd graph
    assert float(with_prior[0, -1, cand]) == pytest.approx(float(without[0, -1, cand]) + copier.bias, abs=1e-4)
    # without the context's tokens in the head the copy stays impossible (-inf), never NaN
    head_only = copy_prior.ContextCopyLM(LeanTrimmedLM.of(drafts.trim_vocab(base, kept)))
    assert torch.isneginf(head_only.forward(ids)[0][0, -1, cand])
