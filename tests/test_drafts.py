"""Draft constructions (refimpl.drafts): tiny-draft, early exit, vocabulary trimming.

Every draft must leave speculative greedy decoding exactly equal to AR greedy. The SmolLM2 draft
tests load a 135M model: they are marked ``slow`` and run only with ``RUN_SLOW=1``.
"""
import os

import pytest
import torch

from refimpl import autoregressive, drafts, models, speculative
from refimpl.copy_prior import ContextCopyLM
from refimpl.train import smol_draft
from refimpl.prompts import encode_prompt

slow = pytest.mark.skipif(os.environ.get("RUN_SLOW") != "1", reason="loads SmolLM2-135M: set RUN_SLOW=1")

PROMPTS = ["And God said", "In the beginning God created the heaven", "Jesus answered and said unto them,",
           "The LORD is my shepherd"]


@pytest.fixture(scope="module")
def tiny_draft():
    return models.load("tiny-draft", device="cpu")


@pytest.fixture(scope="module")
def kept(tiny):
    from refimpl import data

    return drafts.frequent_tokens(tiny, data.kjv_chapters()[:40], 600)


def test_tiny_draft_loads_with_the_same_tokenizer(tiny, tiny_draft):
    assert tiny_draft.tokenizer.get_vocab() == tiny.tokenizer.get_vocab()
    assert tiny_draft.vocab_size == tiny.vocab_size
    assert tiny_draft.eos_token_id == tiny.eos_token_id
    assert tiny_draft.num_layers < tiny.num_layers
    n_draft = sum(p.numel() for p in tiny_draft.model.parameters())
    assert n_draft < 0.6 * sum(p.numel() for p in tiny.model.parameters())
    speculative.check_same_tokenizer(tiny, tiny_draft)


def test_early_exit_shares_weights_and_computes_the_prefix(tiny):
    ee = drafts.early_exit(tiny, 2)
    assert ee.num_layers == 2 and ee.new_cache() is not None
    assert ee.model.model.layers[1].self_attn.q_proj.weight is tiny.model.model.layers[1].self_attn.q_proj.weight
    ids = torch.tensor([tiny.encode(PROMPTS[1])])
    h = tiny.model.model(input_ids=ids, output_hidden_states=True).hidden_states[2]  # after layer 2
    ref = tiny.model.lm_head(tiny.model.model.norm(h))
    torch.testing.assert_close(ee.logits(ids), ref.float())
    torch.testing.assert_close(drafts.early_exit(tiny, tiny.num_layers).logits(ids), tiny.logits(ids))
    # cached forward == uncached logits
    a, cache = ee.forward(ids[:, :3])
    b, cache = ee.forward(ids[:, 3:], cache)
    torch.testing.assert_close(torch.cat([a, b], 1), ee.logits(ids), atol=1e-4, rtol=1e-4)
    for bad in (0, tiny.num_layers + 1, 1.5, True):
        with pytest.raises(ValueError, match="k must"):
            drafts.early_exit(tiny, bad)


def test_exit_layer_agreement(tiny):
    a = drafts.exit_layer_agreement(tiny, [tiny.encode(p) for p in PROMPTS[:2]], max_new_tokens=8)
    assert len(a) == tiny.num_layers and a[-1] == 1.0
    assert all(0.0 <= x <= 1.0 for x in a)


def test_trimmed_vocab_is_minus_inf_outside_kept_tokens(tiny, kept):
    tr = drafts.trim_vocab(tiny, kept)
    ids = torch.tensor([tiny.encode(PROMPTS[0])])
    full = tiny.logits(ids)  # (1, T, V)
    got = tr.logits(ids)
    assert got.shape == full.shape and tr.vocab_size == tiny.vocab_size
    out = torch.ones(tiny.vocab_size, dtype=torch.bool)
    out[kept] = False
    assert torch.isneginf(got[..., out]).all()
    torch.testing.assert_close(got[..., kept], full[..., kept])
    step, _ = tr.forward(ids)
    torch.testing.assert_close(step, got)
    q = torch.softmax(step[0, -1], -1)
    assert q[out].sum() == 0 and torch.isclose(q.sum(), torch.tensor(1.0))
    with pytest.raises(ValueError, match="kept_ids"):
        drafts.trim_vocab(tiny, [tiny.vocab_size + 5])


@pytest.mark.parametrize("context_vocab", [False, True])
def test_trimmed_forward_keeps_the_last_logits(tiny, kept, context_vocab):
    """``logits_to_keep=k`` (what the verification core asks of a prefill): the last k positions of the
    full cached step, also where the context's own tokens are scored from the hidden states."""
    tr = drafts.trim_vocab(tiny, kept, context_vocab=context_vocab)
    ids = torch.tensor([tiny.encode(PROMPTS[1])])  # holds tokens outside ``kept``
    full, _ = tr.forward(ids)
    last, cache = tr.forward(ids, logits_to_keep=2)
    assert last.shape == (1, 2, tiny.vocab_size) and cache.get_seq_length() == ids.shape[1]
    scored, n_kept = int(torch.isfinite(last[0, -1]).sum()), len(torch.as_tensor(kept).unique())
    assert scored > n_kept if context_vocab else scored == n_kept  # + the context's other tokens with context_vocab
    torch.testing.assert_close(last, full[:, -2:])
    assert torch.equal(torch.isneginf(last), torch.isneginf(full[:, -2:]))


@pytest.mark.parametrize("which", ["tiny-draft", "exit1", "exit2", "trimmed"])
def test_speculative_greedy_equals_autoregressive(tiny, tiny_draft, kept, which):
    draft = {"tiny-draft": lambda: tiny_draft, "exit1": lambda: drafts.early_exit(tiny, 1),
             "exit2": lambda: drafts.early_exit(tiny, 2), "trimmed": lambda: drafts.trim_vocab(tiny_draft, kept)}[which]()
    prompts = [tiny.encode(t) for t in PROMPTS]
    comma = tiny.encode(",")[0]
    for n, eos, gamma in ((3, None, 4), (17, comma, 3), (30, comma, 6)):
        ref = autoregressive.generate(tiny, prompts, max_new_tokens=n, eos_token_id=eos).tokens
        got = speculative.generate(tiny, prompts, draft=draft, gamma=gamma, max_new_tokens=n, eos_token_id=eos)
        assert got.tokens == ref, (which, n, eos, gamma)


def test_acceptance_and_cost_helpers():
    assert drafts.expected_tau(0.0, 4) == 1.0
    assert drafts.expected_tau(1.0, 4) == 5.0
    assert abs(drafts.expected_tau(0.5, 2) - 1.75) < 1e-12
    assert abs(drafts.expected_speedup(0.5, 2, 0.25) - 1.75 / 1.5) < 1e-12


def test_distill_loss_is_zero_at_the_teacher():
    t = torch.randn(5, 11)
    assert drafts.distill_loss(t, t, ce_weight=0.0).abs() < 1e-6
    assert drafts.distill_loss(torch.zeros(5, 11), t, ce_weight=0.0) > 0.01


def test_bench_rows_of_the_draft_chapter_are_exact():
    from refimpl.bench.rows import decode_rows

    ms = [m for m in decode_rows() if "self-spec" in m.name or "without copy prior" in m.name]
    assert len(ms) == 2 and all(m.exact for m in ms)


# ---------------------------------------------------------------------------------------
# SmolLM2 (slow)
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smol():
    return models.load("smollm2-135m", device="cpu"), models.load("smollm2-135m-draft", device="cpu")


@slow
def test_smollm2_draft_trimmed_and_hf_views_agree(smol):
    target, wrapped = smol
    assert isinstance(wrapped, ContextCopyLM) and isinstance(wrapped.lm, drafts.TrimmedLM)
    draft = wrapped.lm  # the trimmed model without the copy prior: what HF assisted runs
    assert draft.vocab_size == target.vocab_size
    assert draft.kept_ids.numel() <= target.vocab_size // 6  # a head of at most 1/6 of the rows
    ids = torch.tensor([encode_prompt(target, "Name three colors.")])
    trimmed = draft.logits(ids)  # (1, T, V)
    hf = draft.to_hf()(input_ids=ids).logits.float()
    assert hf.shape == trimmed.shape
    torch.testing.assert_close(hf[..., draft.kept_ids], trimmed[..., draft.kept_ids], atol=1e-3, rtol=1e-4)
    out = torch.ones(target.vocab_size, dtype=torch.bool)
    out[draft.kept_ids] = False
    assert torch.isneginf(trimmed[..., out]).all() and (hf[..., out] < -1e8).all()
    assert (hf.argmax(-1) == trimmed.argmax(-1)).all()


@slow
def test_smollm2_speculative_and_hf_assisted(smol):
    target, draft = smol
    prompts = [encode_prompt(target, t) for t in ("What is 2 + 2?", "Write a haiku about rain.")]
    ref = autoregressive.generate(target, prompts, max_new_tokens=24).tokens
    assert speculative.generate(target, prompts, draft=draft, gamma=3, max_new_tokens=24).tokens == ref
    x = torch.tensor([prompts[0]])
    hf = target.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=12, do_sample=False,
                               assistant_model=draft.hf_model, pad_token_id=target.pad_token_id)
    plain = target.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=12, do_sample=False,
                                  pad_token_id=target.pad_token_id)
    assert hf.tolist() == plain.tolist()


@slow
def test_smollm2_copy_prior_raises_acceptance_on_a_copy_prompt(smol):
    """A prompt outside the benchmark and the training data: the answer repeats the passage."""
    target, draft = smol
    text = ("Repeat this note exactly.\n\nThe green ferry to Harlow Island leaves Pier 4 at 7:15 "
            "every weekday; on Sundays it leaves at 9:40 from Pier 2 instead.")
    p = [encode_prompt(target, text)]
    ref = autoregressive.generate(target, p, max_new_tokens=40).tokens
    with_prior = speculative.generate(target, p, draft=draft, gamma=4, max_new_tokens=40)
    without = speculative.generate(target, p, draft=draft.lm, gamma=4, max_new_tokens=40)
    assert with_prior.tokens == without.tokens == ref
    assert with_prior.stats.tau > without.stats.tau


@slow
def test_smollm2_draft_copies_like_its_target(smol):
    """The committed draft learned to copy (the induction drill): without it, it scored 0.0."""
    target, draft = smol
    kept = draft.kept_ids
    assert smol_draft.copy_accuracy(draft.model, kept) > 0.6
    on_kept = lambda input_ids: type("Out", (), {"logits": target.model(input_ids=input_ids).logits[..., kept]})()  # noqa: E731
    assert smol_draft.copy_accuracy(on_kept, kept) > 0.7  # the target copies too (~0.82): the drill asks what it does


def test_copy_drill_labels_are_the_second_showing():
    kept = torch.tensor([5, 9, 11, 20, 33, 40, 41])
    text = torch.tensor([5, 9, 99, 11, 20, 33, 40, 41, 5, 9] * 3)  # 99 is not a kept token
    x, labels = smol_draft.copy_drill(kept, text, batch=8, span=5, gen=torch.Generator().manual_seed(0))
    assert x.shape == labels.shape == (8, 15)
    second = x[:, 10:]
    index = {int(t): i for i, t in enumerate(kept)}
    offsets = set()
    for b in range(8):
        # the span appears earlier at a row-dependent distance (5..10 tokens back)
        hits = [o for o in range(5, 11) if torch.equal(x[b, 10 - o: 15 - o], second[b])]
        assert hits, b
        offsets.add(hits[0])
        for t in range(15):
            want = index.get(int(x[b, t + 1]), -100) if 10 <= t < 14 else -100
            assert labels[b, t] == want, (b, t)
    assert len(offsets) > 1  # no fixed look-back distance solves the drill
    assert set(x[:4].flatten().tolist()) <= set(kept.tolist())  # the random half uses kept tokens
    assert (labels[4:] == -100).sum() > 4 * 11  # the text half marks the out-of-vocabulary 99 as -100


class _Copier(torch.nn.Module):
    """A perfect induction head over kept indices: predicts the token after the previous occurrence."""

    def __init__(self, kept):
        super().__init__()
        self.index = {int(t): i for i, t in enumerate(kept)}
        self.K = len(kept)

    def forward(self, input_ids):
        B, T = input_ids.shape
        logits = torch.zeros(B, T, self.K)
        for b in range(B):
            for t in range(1, T - 1):  # the token after the latest earlier occurrence of input_ids[b, t]
                prev = [s for s in range(t) if input_ids[b, s] == input_ids[b, t]]
                if prev:
                    logits[b, t, self.index[int(input_ids[b, prev[-1] + 1])]] = 1.0
        return type("Out", (), {"logits": logits})()


def test_copy_accuracy_separates_a_copier_from_a_guesser():
    kept = torch.arange(3, 20000)  # large enough that noise rarely repeats a token
    assert smol_draft.copy_accuracy(_Copier(kept), kept, span=40) > 0.95
    guesser = lambda input_ids: type("Out", (), {"logits": torch.zeros(*input_ids.shape, len(kept))})()  # noqa: E731
    assert smol_draft.copy_accuracy(guesser, kept, span=40) < 0.05


def test_grow_layer_starts_from_the_same_predictions(tiny, tiny_draft):
    """A layer inserted with zeroed output projections changes nothing until it is trained."""
    ids = torch.tensor([tiny.encode(PROMPTS[2])])
    L = tiny_draft.num_layers
    for at in (0, L):
        big = smol_draft.grow_layer(tiny_draft.model, tiny.model.model.layers[1], at)
        assert big.config.num_hidden_layers == L + 1
        with torch.no_grad():
            torch.testing.assert_close(big(ids).logits, tiny_draft.model(ids).logits)
        assert big.model.embed_tokens.weight is tiny_draft.model.model.embed_tokens.weight
    with pytest.raises(ValueError, match="at must"):
        smol_draft.grow_layer(tiny_draft.model, tiny.model.model.layers[1], L + 2)


def test_student_config_is_the_target_with_fewer_layers(tiny):
    cfg = drafts.student_config(tiny.config, num_layers=1)
    assert cfg.num_hidden_layers == 1 and tiny.config.num_hidden_layers > 1  # a copy, the target's is intact
    assert cfg.hidden_size == tiny.config.hidden_size and cfg.vocab_size == tiny.config.vocab_size
    if getattr(cfg, "layer_types", None) is not None:
        assert len(cfg.layer_types) == 1
    with pytest.raises(ValueError, match="num_layers"):
        drafts.student_config(tiny.config, num_layers=0)


def test_chain_accept_rates_follow_the_drafts_own_tokens():
    """The chain draft's held-out acceptance per depth: a draft that always writes "last token + 1" (through a
    shuffled kept vocabulary) against answers whose runs of +1 are known, every anchor taken."""
    from types import SimpleNamespace

    V = 50
    kept = torch.randperm(V, generator=torch.Generator().manual_seed(0))
    col = torch.empty(V, dtype=torch.long)
    col[kept] = torch.arange(V)

    class PlusOne(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lm_head = torch.nn.Linear(1, V)

        def forward(self, input_ids):
            return SimpleNamespace(logits=torch.nn.functional.one_hot(col[(input_ids + 1) % V], V).float())

    ids = [7, 3, 10, 11, 12, 13, 20, 21, 30, 40, 41, 42, 43, 44, 1, 2]
    rows, n, depth = [(ids, 2, None, "t")], 2, 3
    runs = []  # for each anchor a: how many of ids[a+1..] continue its +1 run, at most depth
    for a in range(n - 1, len(ids) - depth - 1):
        r = 0
        while r < depth and ids[a + 1 + r] == ids[a + r] + 1:
            r += 1
        runs.append(r)
    want = [round(sum(r >= d for r in runs) / len(runs), 4) for d in range(1, depth + 1)]
    assert smol_draft.chain_accept_rates(PlusOne(), rows, kept, depth=depth, starts=100) == want
    assert want[0] > want[1] > want[2] > 0
