"""refimpl.eagle3 (EAGLE-3: multi-layer features, training-time test) and its trainer.

The target returns the tapped layers' streams from the verification call itself (== Hugging Face's
``hidden_states``, for the plain and the lean forward; bad layer ids raise). Greedy == AR greedy
(trained and random drafts, several tree shapes, ragged batch, single rows, EOS and max_new_tokens
inside an accepted path); lossless sampling passes the chi-square on the first two tokens while a walk
that never moves p to the residual fails it; the cached draft proposes the trees of a from-scratch
recomputation at every step of a ragged batch. The training-time-test unroll equals decoding's own
draft steps on the same inputs (the chain's log-confidences), and a non-causal step-0 mask or an
index off by one fails that comparison; the trainer's per-step losses equal a brute-force loop."""
import copy
import math

import pytest
import torch

from refimpl import autoregressive, eagle, eagle3, models, primitives, speculative, tree
from refimpl.models import drafters
from refimpl.train import eagle3 as train3
from decoding import first_accepted_draft  # tests/decoding.py
from first_two import exact_first_two, first_two_pvalue  # tests/first_two.py
from test_eagle import ragged_eos, sampling_pvalues

pytestmark = pytest.mark.usefixtures("torch_kernels")

N = 20  # = spec_ar_free's length
SHAPES = [{}, {"total": 1, "depth": 1, "topk": 1}, {"total": 8, "depth": 3, "topk": 2, "floor": 0.0},
          {"total": 5, "depth": 5, "topk": 1, "floor": 0.0},  # default 10/6/3/0.1, one node, a small tree, a chain
          {"copy": 6.0}, {"total": 8, "depth": 3, "topk": 2, "floor": 0.0, "copy": 50.0}]  # + the copy prior per node


@pytest.fixture(scope="module")
def draft(tiny):
    return drafters.load(tiny, "eagle3")


@pytest.fixture(scope="module")
def random_draft(tiny):
    torch.manual_seed(0)
    return eagle3.new_draft(tiny).eval()


@pytest.mark.parametrize("fast", [False, True])
def test_taps_are_the_targets_hidden_states(fast, tiny_prompts):
    lm = models.load("tiny", device="cpu", fast=fast)
    ids = torch.tensor([tiny_prompts[0]])
    taps = eagle3.default_taps(lm.num_layers)
    _, _, h = lm.forward(ids, output_hidden_states=taps + (lm.num_layers,))
    ref = lm.model(input_ids=ids, output_hidden_states=True).hidden_states
    want = torch.cat([ref[i] for i in taps + (lm.num_layers,)], -1)
    assert h.shape == want.shape and torch.allclose(h, want, atol=1e-5)
    _, _, last = lm.forward(ids, output_hidden_states=True)
    assert torch.allclose(last, ref[-1], atol=1e-5)
    for bad in [(lm.num_layers + 1,), (-1,), (), (1.0,), "2"]:
        with pytest.raises(ValueError, match="output_hidden_states"):
            lm.forward(ids, output_hidden_states=bad)


def test_default_taps():
    assert eagle3.default_taps(30) == (2, 15, 27)  # SmolLM2-135M: vLLM's (2, L // 2, L - 3)
    assert eagle3.default_taps(4) == (1, 2, 4)


@pytest.mark.parametrize("shape", SHAPES)
def test_greedy_equals_ar(tiny, draft, random_draft, spec_prompts, spec_ar_free, shape):
    for d in (draft, random_draft):
        g = eagle3.generate(tiny, spec_prompts, draft=d, max_new_tokens=N, eos_token_id=[], **shape)
        assert g.tokens == spec_ar_free
    for r in range(2):
        one = eagle3.generate(tiny, [spec_prompts[r]], draft=draft, max_new_tokens=N, eos_token_id=[], **shape)
        assert one.tokens[0] == spec_ar_free[r]
    assert one.stats.tau > 1.0  # the trained draft gets drafts accepted


def test_the_front_door_takes_the_zoo_draft(tiny, spec_prompts, spec_ar_free):
    import refimpl

    g = refimpl.generate(tiny, spec_prompts, method="eagle3", max_new_tokens=N, eos_token_id=[])  # models/eagle3-tiny
    assert g.tokens == spec_ar_free and g.stats.tau > 1.5
    with pytest.raises(ValueError, match="draft is required"):
        eagle3.generate(tiny, spec_prompts, max_new_tokens=N)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_max_new_tokens_inside_a_path(tiny, draft, spec_prompts, spec_ar_free, n):
    g = eagle3.generate(tiny, spec_prompts, draft=draft, max_new_tokens=n, eos_token_id=[])
    assert g.tokens == [t[:n] for t in spec_ar_free]


def test_eos_inside_an_accepted_path(tiny, draft, spec_prompts, spec_ar_free):
    free = eagle3.generate(tiny, spec_prompts, draft=draft, max_new_tokens=N, eos_token_id=[])
    found = first_accepted_draft(free, None)
    assert found is not None
    row, eos, pos = found
    g = eagle3.generate(tiny, spec_prompts, draft=draft, max_new_tokens=N, eos_token_id=eos)
    assert g.tokens[row] == spec_ar_free[row][: pos + 1]
    assert g.tokens == [t[: t.index(eos) + 1] if eos in t else t for t in spec_ar_free]


class Checked(eagle.EagleProposer):
    """Also proposes from scratch (``cache=False``) at every step; records whether trees and scores agree."""

    def start(self, ids, mask, settings):
        self.steps = []
        return super().start(ids, mask, settings)

    def propose(self, caps):
        ref = copy.copy(self)
        ref.kv = None  # the reference: the layer re-run over the whole context
        eagle.EagleProposer.propose(ref, caps)
        out = super().propose(caps)
        if self.rows is not None:
            same = self.rows == ref.rows
            err = max(abs(a - b) for x, y in zip(self.scores, ref.scores) for a, b in zip(x, y)) if same else 1.0
            self.steps.append((same, err))
        return out


@pytest.mark.parametrize("copy_bias", [0.0, 6.0])
@pytest.mark.parametrize("panels", [None, "fp16", "int8"])  # the plain draft; lean_draft's kernel layer
def test_cached_draft_proposes_the_recomputed_trees(tiny, draft, spec_prompts, spec_ar_free, copy_bias, panels):
    from refimpl.models import cpu_gemv, lean_draft

    if panels:
        if not cpu_gemv.available():
            pytest.skip("the cpu_gemv kernel does not build here")
        draft = lean_draft.lean(copy.deepcopy(draft), int8=panels == "int8")
    eos = ragged_eos(spec_ar_free)
    ar = autoregressive.generate(tiny, spec_prompts, max_new_tokens=2 * N, eos_token_id=eos).tokens
    prop = Checked(draft, total=8, depth=4, topk=2, floor=0.0, copy=copy_bias)
    g = speculative.decode(tiny, prop, spec_prompts, max_new_tokens=2 * N, eos_token_id=eos)
    assert g.tokens == ar and len({len(t) for t in ar}) > 1  # rows finish at different times
    assert prop.steps and all(same and err < 1e-4 for same, err in prop.steps)


class MaskChecked(Checked):
    """Also proposes with the explicit attention mask at every step (``unmasked`` refused: the encode of
    padded batches) from the same state; records whether trees and scores agree."""

    def propose(self, caps):
        ref = copy.copy(self)
        ref.unmasked = lambda first, new: False
        eagle.EagleProposer.propose(ref, caps)
        out = eagle.EagleProposer.propose(self, caps)
        if self.rows is not None:
            self.steps.append((self.rows == ref.rows, self.scores == ref.scores))
        return out


@pytest.mark.parametrize("panels", [None, "int8"])  # the plain draft; lean_draft's kernel layer (its causal rule)
def test_unpadded_inputs_attend_causally_without_a_mask(tiny, draft, spec_prompts, panels):
    """One row at a time (no padding: the fast path at every step): the same trees and the same scores,
    bit for bit, as the explicit mask; greedy output stays AR's."""
    from refimpl.models import cpu_gemv, lean_draft

    if panels:
        if not cpu_gemv.available():
            pytest.skip("the cpu_gemv kernel does not build here")
        draft = lean_draft.lean(copy.deepcopy(draft), int8=True)
    for p in spec_prompts[:3]:
        prop = MaskChecked(draft, total=6, depth=4, topk=2, floor=0.0, copy=6.0)
        g = speculative.decode(tiny, prop, [p], max_new_tokens=N, eos_token_id=[])
        assert g.tokens == autoregressive.generate(tiny, [p], max_new_tokens=N, eos_token_id=[]).tokens
        assert len(prop.steps) > 3 and all(same_rows and same_scores for same_rows, same_scores in prop.steps)
        assert prop.dense


def test_causal_after_is_the_explicit_causal_mask():
    """``allow=None`` in the drafts' step means this mask: every cached key, then the new ones up to each query."""
    from refimpl.primitives import causal_after

    got = causal_after(2, 3, 4, "cpu")
    cached = torch.ones(2, 3, 4, dtype=torch.bool, device="cpu")  # every cached key, for every query
    want = torch.cat([cached, primitives.causal(torch.ones(2, 3, device="cpu"))], -1)
    assert torch.equal(got, want) and got.shape == (2, 3, 7)


class Chains(eagle.EagleProposer):
    """Records, at every step with features, each row's committed tokens, fused features, proposed
    chain and its cumulative log-confidences."""

    def start(self, ids, mask, settings):
        self.log = []
        return super().start(ids, mask, settings)

    def propose(self, caps):
        ctx = None if self.feats is None else ([list(t) for t in self.toks], [f.clone() for f in self.feats])
        out = super().propose(caps)
        if ctx is not None and self.rows is not None:  # (no room left to draft: nothing proposed)
            self.log.append((*ctx, [r[0] for r in self.rows], [list(s) for s in self.scores]))
        return out


class FirstChild(eagle.EagleProposer):
    """Records, at every step with features, the proposed chain and every node's prompt-lookup
    candidate (the 3..2-gram continuation of the committed tokens + the node's path)."""

    def start(self, ids, mask, settings):
        self.log = []
        return super().start(ids, mask, settings)

    def propose(self, caps):
        hist = None if self.feats is None else [list(t) for t in self.toks]
        out = super().propose(caps)
        if hist is not None and self.rows is not None:
            for h, (chain, _) in zip(hist, self.rows):
                for d, tok in enumerate(chain):
                    full = torch.tensor(h + chain[:d])
                    self.log.append((int(primitives.copy_candidates(full, torch.tensor([len(full) - 1]))[0]), tok))
        return out


class RootHistory(FirstChild):
    """A wrong copy prior (the negative control): every node looks up the committed tokens alone,
    forgetting its own path."""

    def children(self, o, hist):
        return super().children(o, None if hist is None else [[row[0][:len(t)]] * len(row)
                                                               for row, t in zip(hist, self.toks)])


class KeptOnly(FirstChild):
    """A copy prior that drops a candidate outside the draft's kept vocabulary, never proposing it
    (the negative control)."""

    def children(self, o, hist):
        if not self.copy:
            return super().children(o, hist)
        logits = self.draft.logits(o)  # (B, e, V')
        for b, row in enumerate(primitives.candidate_lists(hist, 3, 2)):
            for i, t in enumerate(row):
                col = -1 if t < 0 else t if self.columns is None else self.columns[t]
                if col >= 0:  # a candidate outside the kept columns is dropped
                    logits[b, i, col] += self.copy
        lp, idx = torch.log_softmax(logits, -1).topk(self.topk, -1)
        return lp, self.draft.full(idx)


def test_the_copy_prior_puts_each_nodes_copy_candidate_first(tiny, random_draft, spec_prompts):
    """A chain (1 child per node) from a random draft, with a bias no draft logit outweighs: every node
    whose history (committed tokens + its path) has a 3..2-gram match proposes that match's
    continuation; a prior that forgets the path does not. Either way the output is AR greedy."""
    prompts = [p + p[len(p) // 2:] for p in spec_prompts]  # a repeated half: copy candidates exist
    ar = autoregressive.generate(tiny, prompts, max_new_tokens=N, eos_token_id=[]).tokens
    seen = {}
    for kind in (FirstChild, RootHistory):
        prop = kind(random_draft, total=4, depth=4, topk=1, floor=0.0, copy=1e4)
        assert speculative.decode(tiny, prop, prompts, max_new_tokens=N, eos_token_id=[]).tokens == ar
        pairs = [(c, t) for c, t in prop.log if c >= 0]
        assert len(pairs) >= 10
        seen[kind.__name__] = sum(c == t for c, t in pairs) / len(pairs)
    assert seen["FirstChild"] == 1.0 and seen["RootHistory"] < 0.9, seen


def test_a_copy_candidate_outside_the_kept_vocabulary_is_proposed(tiny, spec_prompts):
    """A draft over a kept vocabulary that leaves out half of the prompts' tokens: with the copy
    prior, a node whose candidate is not kept still proposes it first (an extra column at the node's
    best logit + the bias), where a prior that drops such candidates never can.
    Greedy output stays AR's either way."""
    prompts = [p + p[len(p) // 2:] for p in spec_prompts]
    ar = autoregressive.generate(tiny, prompts, max_new_tokens=N, eos_token_id=[]).tokens
    used = sorted({t for p in prompts for t in p})
    left_out = set(used[::2])
    kept = torch.tensor([t for t in range(tiny.config.vocab_size) if t not in left_out], device="cpu")
    torch.manual_seed(0)
    trimmed = eagle3.new_draft(tiny, kept=kept).eval()
    seen = {}
    for kind in (FirstChild, KeptOnly):
        prop = kind(trimmed, total=4, depth=4, topk=1, floor=0.0, copy=1e4)
        assert speculative.decode(tiny, prop, prompts, max_new_tokens=N, eos_token_id=[]).tokens == ar
        outside = [(c, t) for c, t in prop.log if c in left_out]
        assert len(outside) >= 5
        seen[kind.__name__] = sum(c == t for c, t in outside) / len(outside)
        assert all(c == t for c, t in prop.log if c >= 0 and c not in left_out)  # kept candidates: first
    assert seen == {"FirstChild": 1.0, "KeptOnly": 0.0}, seen
    for copy_bias in (0.0, 6.0):  # the bias does not change exactness; the full tree too
        g = eagle3.generate(tiny, prompts, draft=trimmed, max_new_tokens=N, eos_token_id=[], copy=copy_bias,
                            total=8, depth=3, topk=2, floor=0.0)
        assert g.tokens == ar


def test_an_eagle1_draft_takes_the_copy_prior_too(tiny, spec_prompts, spec_ar_free):
    g = eagle.generate(tiny, spec_prompts, draft=drafters.load(tiny, "eagle"), max_new_tokens=N, eos_token_id=[], copy=6.0)
    assert g.tokens == spec_ar_free


def unrolled_chain(draft, toks, feats, chain, at_offset=0):
    """The unroll over ``toks[1:] + chain[:-1]`` with the fused ``feats``; the chain's cumulative
    log-confidences read at the last context index (``at_offset`` moves that index)."""
    n, D = feats.shape[0], len(chain)
    tok = torch.tensor([toks[1:] + chain[:-1]])  # (1, n + D - 1): x_{t+1}
    g = torch.cat([feats, torch.zeros(D - 1, feats.shape[1])])[None]  # (1, n + D - 1, H)
    outs = eagle3.unroll(draft, tok, g, torch.ones_like(tok), D)
    ids = draft.kept.tolist().index if draft.kept is not None else (lambda t: t)
    total, out = 0.0, []
    for j, o in enumerate(outs):
        total += float(torch.log_softmax(draft.logits(o[0, n - 1 + at_offset]), -1)[ids(chain[j])])
        out.append(total)
    return out


def test_training_time_test_equals_decodings_draft_steps(tiny, draft, spec_prompts, monkeypatch):
    prop = Chains(draft, total=5, depth=5, topk=1, floor=0.0, copy=0.0)  # a chain: each level's one node
    speculative.decode(tiny, prop, spec_prompts, max_new_tokens=N, eos_token_id=[])
    checked = 0
    with torch.no_grad():
        for toks, feats, chains, scores in prop.log[:4]:
            for r in range(len(toks)):
                if len(chains[r]) < 3:
                    continue
                assert unrolled_chain(draft, toks[r], feats[r], chains[r]) == pytest.approx(scores[r], abs=1e-4)
                assert unrolled_chain(draft, toks[r], feats[r], chains[r], at_offset=-1) != \
                    pytest.approx(scores[r], abs=1e-2)  # an index off by one
                checked += 1
        assert checked >= 4
        toks, feats, chains, scores = next((t, f, c, s) for t, f, c, s in prop.log if len(c[0]) >= 3)
        monkeypatch.setattr(eagle3, "causal", lambda m: torch.ones(*m.shape, m.shape[1], dtype=torch.bool))
        assert unrolled_chain(draft, toks[0], feats[0], chains[0]) != pytest.approx(scores[0], abs=1e-2)  # sees the future


@pytest.mark.parametrize("prompt_loss", [False, True])
def test_step_losses_equal_a_brute_force_loop(tiny, random_draft, prompt_loss):
    ar = autoregressive.generate(tiny, [tiny.encode("And God said")], max_new_tokens=12, eos_token_id=[]).tokens[0]
    prompt = tiny.encode("And God said")
    rows = [(prompt + ar, len(prompt), None, "a"), (prompt + ar[:7], len(prompt), None, "b")]
    seqs = train3.target_features(tiny, rows, random_draft.taps, progress=False)
    W = tiny.model.get_output_embeddings().weight.detach()
    steps = 3
    with torch.no_grad():
        res = train3.step_losses(random_draft, *train3.batch_of(seqs, steps, prompt_loss=prompt_loss), steps, W)
        for j in range(steps):
            ce, n = 0.0, 0
            for ids, f, fin, n_prompt in seqs:
                N_ = len(ids)
                tok = ids[1:][None]
                outs = eagle3.unroll(random_draft, tok, random_draft.fuse(f[:-1].float())[None], torch.ones_like(tok),
                                     steps)
                for t in range(N_ - 1):
                    i = t + 1 + j  # the label: the target's distribution after token i
                    if i <= N_ - 2 and (prompt_loss or i + 1 >= n_prompt):  # token i + 1 exists (and answers)
                        p = torch.softmax(fin[i].float() @ W.T, -1)
                        ce -= float((p * torch.log_softmax(random_draft.logits(outs[j][0, t]), -1)).sum())
                        n += 1
            assert res[j][1] == n
            assert float(res[j][0]) == pytest.approx(ce, rel=1e-4)


def test_the_upstream_position_mask_and_slot_average_equal_a_brute_force_loop(tiny):
    """SafeAILab/EAGLE's traineagle3: a label position whose target argmax (over the whole vocabulary)
    is outside the kept one is dropped, and each step's loss is averaged over all B x T slots."""
    prompt = tiny.encode("And God said")
    ar = autoregressive.generate(tiny, [prompt], max_new_tokens=12, eos_token_id=[]).tokens[0]
    W = tiny.model.get_output_embeddings().weight.detach()
    kept = torch.tensor(sorted(set(range(0, 4096, 3)) | set(ar[::2])))  # some of the answer's tokens, not all
    torch.manual_seed(0)
    d = eagle3.new_draft(tiny, kept=kept).eval()
    rows = [(prompt + ar, len(prompt), None, "a"), (prompt + ar[:7], len(prompt), None, "b")]
    seqs = train3.target_features(tiny, rows, d.taps, progress=False)
    steps = 3
    b = train3.batch_of(seqs, steps)
    in_kept = train3.kept_argmax(b[2], W, kept)
    with torch.no_grad():
        res = train3.step_losses(d, *b, steps, W[kept], in_kept)
        plain = train3.step_losses(d, *b, steps, W[kept])
        dropped = 0
        for j in range(steps):
            ce, n = 0.0, 0
            for ids, f, fin, n_prompt in seqs:
                tok = ids[1:][None]
                outs = eagle3.unroll(d, tok, d.fuse(f[:-1].float())[None], torch.ones_like(tok), steps)
                for t in range(len(ids) - 1):
                    i = t + 1 + j
                    if i <= len(ids) - 2 and i + 1 >= n_prompt:
                        if int((fin[i].float() @ W.T).argmax()) not in kept.tolist():
                            dropped += 1
                            continue
                        p = torch.softmax(fin[i].float() @ W[kept].T, -1)
                        ce -= float((p * torch.log_softmax(d.logits(outs[j][0, t]), -1)).sum())
                        n += 1
            assert res[j][1] == n and float(res[j][0]) == pytest.approx(ce, rel=1e-4)
        assert dropped > 0 and all(r[1] < q[1] for r, q in zip(res, plain))  # the mask drops some positions
        slots = b[0].numel()
        want = sum(0.8 ** j * float(ce) / slots for j, (ce, _, _) in enumerate(res))
        assert float(train3.ttt_loss(res, 0.8, slots)) == pytest.approx(want, rel=1e-6)
        assert float(train3.ttt_loss(res, 0.8)) == pytest.approx(sum(0.8 ** j * float(ce) / n for j, (ce, n, _)
                                                                     in enumerate(res)), rel=1e-6)
    assert train3.kept_argmax(b[2], W, None).all()
    with pytest.raises(ValueError, match="full_head"):
        train3.train_draft(d, seqs, W[kept], steps=1, recipe="upstream", progress=False)
    with pytest.raises(ValueError, match="recipe"):
        train3.train_draft(d, seqs, W[kept], steps=1, recipe="paper", progress=False)
    with pytest.raises(ValueError, match="train_head"):
        train3.train_draft(d, seqs, W[kept], steps=1, recipe="upstream", full_head=W, train_head=False, progress=False)


def test_lossless_sampling_passes_and_a_wrong_walk_fails(tiny, draft):
    good, tau, bad = sampling_pvalues(tiny, draft)  # EAGLE's proposer, fed by the EAGLE-3 draft
    assert tau > 1.0
    assert good > 1e-3
    assert bad < 1e-6  # the negative control


def test_lossless_sampling_under_the_default_preset(tiny, draft):
    """The tree ``eagle3.generate`` grows by default on a CPU (a strong copy prior, a floor, top-2)
    still samples exactly the target's distribution; the walk that forgets the residual still fails."""
    options = {k: v for k, v in eagle3.PRESETS["cpu"].items() if k != "int8"}  # int8: the draft's panels
    good, tau, bad = sampling_pvalues(tiny, draft, **options)
    assert tau > 1.0 and good > 1e-3
    assert bad < 1e-6  # the negative control


def test_save_and_load_round_trip(tiny, draft, tmp_path):
    drafters.save(draft, str(tmp_path), tiny)
    again = drafters.load(tiny, "eagle3", str(tmp_path))
    assert again.taps == draft.taps
    tok, g = torch.randint(0, tiny.vocab_size, (1, 7)), torch.randn(1, 7, tiny.config.hidden_size)
    with torch.no_grad():
        a, b = eagle3.unroll(again, tok, g, torch.ones_like(tok), 2), eagle3.unroll(draft, tok, g, torch.ones_like(tok), 2)
    assert all(torch.allclose(x, y, atol=2e-2) for x, y in zip(a, b))  # (stored in fp16)


def test_missing_draft_names_its_trainer(tiny, tmp_path):
    with pytest.raises(FileNotFoundError, match="refimpl.train eagle3-tiny"):
        drafters.load(tiny, "eagle3", str(tmp_path))


@pytest.mark.parametrize("kw,name", [({"total": 0}, "total"), ({"depth": 0}, "depth"), ({"topk": 0}, "topk"),
                                     ({"floor": 1.0}, "floor"), ({"max_new_tokens": 0}, "max_new_tokens"),
                                     ({"copy": -1.0}, "copy"), ({"copy": float("inf")}, "copy"),
                                     ({"copy": "6"}, "copy"), ({"copy": True}, "copy")])
def test_bad_arguments(tiny, draft, spec_prompts, kw, name):
    with pytest.raises(ValueError, match=name):
        eagle3.generate(tiny, spec_prompts, draft=draft, **kw)


def test_an_eagle1_draft_is_refused(tiny, spec_prompts):
    with pytest.raises(ValueError, match="Eagle3Draft"):
        eagle3.generate(tiny, spec_prompts, draft=eagle.new_draft(tiny))


def test_training_lowers_the_loss_and_reports_acceptance(tiny):
    torch.manual_seed(0)
    d = eagle3.new_draft(tiny)
    prompts = [tiny.encode(t) for t in ("And God said", "In the beginning", "And the LORD spake unto Moses")]
    ar = autoregressive.generate(tiny, prompts, max_new_tokens=16, eos_token_id=[]).tokens
    rows = [(p + a, len(p), None, str(i)) for i, (p, a) in enumerate(zip(prompts, ar))]
    seqs = train3.target_features(tiny, rows, d.taps, progress=False)
    W = tiny.model.get_output_embeddings().weight.detach()
    before = train3.accept_rates(d, seqs, W, depth=3)
    d, rep = train3.train_draft(d, seqs * 4, W, steps=40, ttt=3, batch=4, lr=3e-3, progress=False, holdout=10 ** 9)
    after = train3.accept_rates(d, seqs, W, depth=3)
    assert rep["final_ce_per_step"][0] < math.log(tiny.vocab_size)
    assert after["top1"][0] > before["top1"][0] and after["chain"][0] >= after["chain"][1] >= after["chain"][2]


def test_the_trainer_cli_passes_a_device_only_to_a_trainer_that_takes_one(capsys):
    import inspect

    from refimpl.train import TRAINERS
    from refimpl.train.__main__ import main

    with pytest.raises(SystemExit):
        main(["tiny", "--device", "cuda"])
    assert "--device: tiny trains on the CPU only" in capsys.readouterr().err
    assert "device" in inspect.signature(train3.train_eagle3_smollm2).parameters
    assert TRAINERS["eagle3-smollm2-135m-cpu"].endswith(":train_eagle3_smollm2_cpu")
