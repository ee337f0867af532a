"""refimpl.eagle: an EAGLE-style feature draft growing EAGLE-2's dynamic tree, on the verification core.

Greedy == AR greedy (trained and random drafts, several tree shapes, ragged batches, batch 1, EOS
and max_new_tokens inside an accepted path); the (token, feature) pairs the draft reads equal a
fresh target forward's (a shifted hidden-state index fails the same check); lossless sampling
passes the chi-square on the first two tokens while a walk that never moves p to the residual
fails it; the tree is ancestor-closed and holds the most confident nodes; bad arguments raise
ValueError naming them. The draft's KV cache across steps proposes the same trees and scores as
re-running the layer over the whole context, at every step of a ragged batch whose rows finish at
different times (a cache that keeps the tree's keys, a select() that leaves the cache's rows alone,
positions restarting at 0 each step: each fails that comparison). A draft scoring a kept subset of
the vocabulary (SmolLM2's head) is exact too and proposes token ids, not head indices; the zoo's
SmolLM2 draft decodes exactly (RUN_SLOW=1)."""
import copy
import os

import pytest
import torch

from refimpl import eagle, sampling, speculative, tree
from refimpl.models import drafters
from refimpl.primitives import rope
from decoding import first_accepted_draft  # tests/decoding.py
from first_two import exact_first_two, first_two_pvalue  # tests/first_two.py

pytestmark = pytest.mark.usefixtures("torch_kernels")

N = 20  # = spec_ar_free's length
#: the proposer's tree when a test names none: 16 nodes, depth 5, top-4, EAGLE-2's rule (no floor), no copy prior
TREE = {"total": 16, "depth": 5, "topk": 4, "floor": 0.0, "copy": 0.0}
SHAPES = [{}, {"total": 1, "depth": 1, "topk": 1}, {"total": 8, "depth": 3, "topk": 2},
          {"total": 5, "depth": 5, "topk": 1}]  # default 16/5/4, one node, a small tree, a chain


@pytest.fixture(scope="module")
def draft(tiny):
    return drafters.load(tiny, "eagle")


@pytest.fixture(scope="module")
def random_draft(tiny):
    torch.manual_seed(0)
    return eagle.new_draft(tiny).eval()


@pytest.mark.parametrize("shape", SHAPES)
def test_greedy_equals_ar(tiny, draft, random_draft, spec_prompts, spec_ar_free, shape):
    for d in (draft, random_draft):
        g = eagle.generate(tiny, spec_prompts, draft=d, max_new_tokens=N, eos_token_id=[], **shape)
        assert g.tokens == spec_ar_free
    one = eagle.generate(tiny, [spec_prompts[0]], draft=draft, max_new_tokens=N, eos_token_id=[], **shape)
    assert one.tokens[0] == spec_ar_free[0]
    assert one.stats.tau > 1.0  # the trained draft gets drafts accepted on the refrain


def test_the_front_door_takes_the_zoo_draft(tiny, spec_prompts, spec_ar_free):
    import refimpl

    g = refimpl.generate(tiny, spec_prompts, method="eagle", max_new_tokens=N, eos_token_id=[])  # models/eagle-tiny
    assert g.tokens == spec_ar_free and g.stats.tau > 1.5


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_max_new_tokens_inside_a_path(tiny, draft, spec_prompts, spec_ar_free, n):
    g = eagle.generate(tiny, spec_prompts, draft=draft, max_new_tokens=n, eos_token_id=[])
    assert g.tokens == [t[:n] for t in spec_ar_free]


def test_eos_inside_an_accepted_path(tiny, draft, spec_prompts, spec_ar_free):
    free = eagle.generate(tiny, spec_prompts, draft=draft, max_new_tokens=N, eos_token_id=[])
    found = first_accepted_draft(free, None)
    assert found is not None
    row, eos, pos = found
    g = eagle.generate(tiny, spec_prompts, draft=draft, max_new_tokens=N, eos_token_id=eos)
    assert g.tokens[row] == spec_ar_free[row][: pos + 1]
    assert g.tokens == [t[: t.index(eos) + 1] if eos in t else t for t in spec_ar_free]


class Spy(eagle.EagleProposer):
    """Records the draft's inputs (tokens x_{t+1}, features f_t, mask) at every step, with the
    original row of each batch row (finished rows leave the batch)."""

    def start(self, ids, mask, settings):
        self.alive, self.seen = list(range(ids.shape[0])), []
        return super().start(ids, mask, settings)

    def propose(self, caps):
        if self.feats is not None:  # every committed input, whether the draft's cache holds it or not
            self.seen.append((list(self.alive),) + tuple(x.clone() for x in self.context()))
        return super().propose(caps)

    def select(self, rows):
        super().select(rows)
        self.alive = [self.alive[i] for i in rows.tolist()]


def ragged_eos(ar):
    """A token that ends row 0 early while some other row never emits it: rows finish at different times."""
    return next(t for t in ar[0][2:] if any(t not in row for row in ar[1:]))


@pytest.fixture(scope="module")
def ragged(tiny, spec_prompts, spec_ar_free):
    from refimpl import autoregressive

    eos = ragged_eos(spec_ar_free)
    return eos, autoregressive.generate(tiny, spec_prompts, max_new_tokens=2 * N, eos_token_id=eos).tokens


class Checked(eagle.EagleProposer):
    """At every step also proposes from scratch (``cache=False``: the layer re-run over the whole
    context) from the same committed inputs, and records whether the trees and scores agree; records
    the inputs the cached layer ran on and every select()."""

    def start(self, ids, mask, settings):
        self.steps, self.widths, self.selects = [], [], []
        return super().start(ids, mask, settings)

    def propose(self, caps):
        ref = copy.copy(self)
        ref.kv, ref.reference = None, True  # the reference: the layer re-run over the whole context
        eagle.EagleProposer.propose(ref, caps)
        widths = []
        hook = self.draft.qkv.register_forward_hook(lambda m, i, o: widths.append(i[0].shape[1]))
        try:
            out = super().propose(caps)
        finally:
            hook.remove()
        if self.rows is not None:
            same = self.rows == ref.rows
            err = max(abs(a - b) for x, y in zip(self.scores, ref.scores) for a, b in zip(x, y)) if same else 1.0
            self.steps.append((same, err))
            self.widths.append(widths[0])  # the first draft call: the context's new inputs
        return out

    def select(self, rows):
        self.selects.append((len(self.toks), rows.tolist()))
        super().select(rows)


def cached_run(tiny, draft, prompts, eos, kind=Checked, compact_at=0.25, **shape):
    prop = kind(draft, **{**TREE, **shape})
    prop.compact_at = compact_at
    return prop, speculative.decode(tiny, prop, prompts, max_new_tokens=2 * N, eos_token_id=eos)


@pytest.mark.parametrize("shape", [{}, {"total": 8, "depth": 3, "topk": 2}])
@pytest.mark.parametrize("compact_at", [0.0, 0.25, float("inf")])  # always, sometimes, never compacted
def test_draft_cache_proposes_the_recomputed_trees(tiny, draft, spec_prompts, ragged, shape, compact_at):
    eos, ar = ragged
    prop, g = cached_run(tiny, draft, spec_prompts, eos, compact_at=compact_at, **shape)
    assert g.tokens == ar  # greedy exact while rows finish at different times
    dropped = [i for i, (b, rows) in enumerate(prop.selects) if rows != list(range(len(rows))) and rows]
    assert dropped, "a row other than the last must finish while others go on (select() moves cache rows)"
    assert len(prop.steps) >= 6 and len(prop.steps) > len(prop.selects)
    assert all(same for same, _ in prop.steps)  # the same tokens and parents at every step
    assert max(err for _, err in prop.steps) < 1e-4  # and the same cumulative confidences
    assert prop.widths[0] == max(map(len, spec_prompts))  # first: the prompt's pairs, then the root's
    assert max(prop.widths[1:]) <= prop.depth + 1  # then only the accepted path's and the root's
    if compact_at == 0.0 and len(prop.done):
        assert prop.kmask.shape[1] == max(prop.done)  # no column is padding in every row


class KeepsTree(Checked):
    """WRONG: the tree's keys / values stay in the cache (the rejected nodes' too)."""

    def grow(self, *args):
        if getattr(self, "reference", False):  # (the reference run grows right)
            return super().grow(*args)
        step = self.draft.step

        def keep(tok, feat, pos, allow, past=None):
            out, (k, v) = step(tok, feat, pos, allow, past)
            self.kv = (torch.cat([self.kv[0], k], 2), torch.cat([self.kv[1], v], 2))
            real = torch.ones(k.shape[0], k.shape[2], dtype=torch.bool, device=k.device)
            self.kmask = torch.cat([self.kmask, real], 1)
            return out, (k, v)

        self.draft.step = keep
        try:
            return super().grow(*args)
        finally:
            del self.draft.step


class StaleRows(Checked):
    """WRONG: select() keeps the cache's first rows instead of the surviving ones."""

    def select(self, rows):
        kv, kmask = self.kv, self.kmask
        super().select(rows)
        if kv is not None:
            self.kv, self.kmask = tuple(t[: len(rows)] for t in kv), kmask[: len(rows)]


@pytest.mark.parametrize("wrong", ["keeps the tree", "select ignores the cache", "positions restart"])
def test_a_wrong_draft_cache_is_caught(tiny, draft, spec_prompts, ragged, monkeypatch, wrong):
    kind = {"keeps the tree": KeepsTree, "select ignores the cache": StaleRows}.get(wrong, Checked)
    if wrong == "positions restart":  # the new inputs placed at 0, 1, ... instead of after the cached ones
        right = eagle.positions_from_mask
        monkeypatch.setattr(eagle, "positions_from_mask", lambda mask, start=None: right(mask))
    prop, g = cached_run(tiny, draft, spec_prompts, ragged[0], kind)
    assert g.tokens == ragged[1]  # still exact (the target verifies) ...
    assert not all(same and err < 1e-4 for same, err in prop.steps)  # ... but test 1's comparison fails


class ShiftedSpy(Spy):
    """A wrong index: the features of the root and the accepted nodes taken one slot off."""

    def accept(self, v):
        super().accept(v._replace(hidden=v.hidden.roll(1, dims=1)))


def worst_feature_error(tiny, draft, prompts, kind):
    spy = kind(draft, **TREE)
    g = speculative.decode(tiny, spy, prompts, max_new_tokens=N, eos_token_id=[])
    assert len(spy.seen) >= 3 and sum(sum(a) for a in g.stats.accepted) > 0
    worst = 0.0
    for r, prompt in enumerate(prompts):
        seq = prompt + g.tokens[r]
        _, _, hid = tiny.forward(torch.tensor([seq]), output_hidden_states=True)  # (1, len, H) fresh
        for alive, tok, feat, mask in spy.seen:
            if r not in alive:
                continue
            i = alive.index(r)
            real = mask[i].bool()
            n = int(real.sum())
            assert tok[i, real].tolist() == seq[1:n + 1]  # x_{t+1}: the committed tokens, then the root
            worst = max(worst, float((feat[i, real] - hid[0, :n]).abs().max()))
    return worst


def test_rope_is_the_rotate_half_rope_bit_for_bit():
    """``primitives.rope`` (``x cos2 + roll(x) sin2``) == Llama's rotate-half form written out (Hugging
    Face's ``inv_freq = 1 / theta^(2i/d)``), bit for bit,
    and q and k stacked on a leading dim rotate as each alone (the draft steps rotate them in one call);
    a roll the wrong way (a sign slip in ``sin2``) fails."""
    def written_out(x, pos, theta):
        d = x.shape[-1]
        ang = pos.float()[:, None, :, None] * (1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
        return x * cos + torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1) * sin

    g = torch.Generator().manual_seed(0)
    for T in (1, 4):
        x, pos = torch.randn(2, 3, 5, T, 16, generator=g), torch.randint(0, 5000, (3, T), generator=g)
        got = rope(x, pos, 10000.0)
        assert torch.equal(got[0], written_out(x[0], pos, 10000.0))
        assert torch.equal(got[1], rope(x[1], pos, 10000.0))
        assert not torch.equal(got[0], written_out(x[0].flip(-1), pos, 10000.0).flip(-1))


def test_draft_reads_the_targets_features(tiny, draft, spec_prompts):
    assert worst_feature_error(tiny, draft, spec_prompts, Spy) < 1e-4  # ragged: left padding dropped
    assert worst_feature_error(tiny, draft, spec_prompts, ShiftedSpy) > 1e-2  # the check can fail


@torch.no_grad()
def test_tree_holds_the_most_confident_nodes(tiny, draft, spec_prompts):
    prop = eagle.EagleProposer(draft, **{**TREE, "total": 6, "depth": 3, "topk": 3})
    g = speculative.decode(tiny, prop, [spec_prompts[0]], max_new_tokens=2, eos_token_id=[])  # fills the context
    assert len(g.tokens[0]) == 2
    p = prop.propose([5])
    tokens, parents = prop.rows[0]
    assert len(tokens) == 6 and all(q < i for i, q in enumerate(parents)) and p.calls == 3  # parents first
    ctx_tok, ctx_feat, _ = prop.context()

    def logconf(i):  # brute force: run the draft on the whole path without the tree's mask and cache
        path = []
        while i != tree.ROOT:
            path.insert(0, i)
            i = parents[i]
        tok, feat, total = ctx_tok[0], ctx_feat[0], 0.0
        for node in path:
            f = draft(tok[None], feat[None])[0, -1]
            total += float(torch.log_softmax(draft.logits(f), -1)[tokens[node]])
            tok, feat = torch.cat([tok, torch.tensor([tokens[node]])]), torch.cat([feat, f[None]])
        return total

    conf = [logconf(i) for i in range(len(tokens))]
    assert conf == pytest.approx(prop.scores[0], abs=1e-4)  # the tree attention computes the same features
    first = torch.log_softmax(draft.logits(draft(ctx_tok, ctx_feat)[0, -1]), -1).topk(3)
    for lp, t in zip(first.values.tolist(), first.indices.tolist()):  # a root child left out is less confident
        assert (t in [x for x, q in zip(tokens, parents) if q == tree.ROOT]) or lp <= min(conf) + 1e-5


class NoResidualTree(tree.Tree):
    """WRONG: accepts child x with probability p(x) but never moves p to the residual."""

    def sample_walk(self, parents, valid, xs, p, q, settings):
        def choose(node, kids):
            return next((c for c in kids if float(settings.uniforms((1,), p.device)[0]) < float(p[node + 1, xs[c]])),
                        None)

        return self.walk(parents, valid, choose,
                         lambda node: int(sampling.sample_from_probs(p[node + 1][None], settings.generator)[0]))


TOP_K, TEMP, SAMPLES = 5, 1.0, 1500


def walked_by(walk):
    """:class:`eagle.EagleProposer` whose trees are verified by ``walk`` (a :class:`tree.Tree` subclass):
    the same trees, another walk (a wrong one is the sampling tests' negative control)."""
    class Walked(eagle.EagleProposer):
        def propose(self, caps):
            prop = super().propose(caps)
            return prop if prop.tree is None else prop._replace(tree=walk(prop.tree.parents, prop.tree.depth,
                                                                          prop.tree.see))
    return Walked


def sampling_pvalues(tiny, draft, **tree_options):
    """-> (p-value of the first two sampled tokens with SpecInfer's walk, tau, p-value with the walk
    that forgets the residual): EAGLE's and EAGLE-3's drafts run the same proposer (``tree_options``:
    its tree, default 8 nodes, depth 3, top-4)."""
    tree_options = tree_options or {"total": 8, "depth": 3, "topk": 4}
    prompt = tiny.encode("And the")
    exact = exact_first_two(tiny, prompt, TEMP, TOP_K)

    def pvalue(walk):
        prop = walked_by(walk)(draft, **{**TREE, **tree_options})
        g = speculative.decode(tiny, prop, [prompt] * SAMPLES, max_new_tokens=3, temperature=TEMP, top_k=TOP_K,
                               generator=torch.Generator().manual_seed(3), eos_token_id=[])
        return first_two_pvalue(g.tokens, exact), g.stats.tau

    good, tau = pvalue(tree.Tree)
    return good, tau, pvalue(NoResidualTree)[0]


def test_lossless_sampling_passes_and_a_wrong_walk_fails(tiny, draft):
    good, tau, bad = sampling_pvalues(tiny, draft)
    assert tau > 1.0
    assert good > 1e-3
    assert bad < 1e-6  # the negative control


def test_save_and_load_round_trip(tiny, draft, tmp_path):
    drafters.save(draft, str(tmp_path), tiny)
    again = drafters.load(tiny, "eagle", str(tmp_path))
    tok, feat = torch.randint(0, tiny.vocab_size, (2, 7)), torch.randn(2, 7, tiny.config.hidden_size)
    assert torch.allclose(again(tok, feat), draft(tok, feat), atol=1e-2)  # (stored in fp16)


def test_missing_draft_names_its_trainer(tiny, tmp_path):
    with pytest.raises(FileNotFoundError, match="refimpl.train eagle-tiny"):
        drafters.load(tiny, "eagle", str(tmp_path))


@pytest.mark.parametrize("kw,name", [({"total": 0}, "total"), ({"depth": 0}, "depth"), ({"topk": 0}, "topk"),
                                     ({"depth": 1.5}, "depth"), ({"max_new_tokens": 0}, "max_new_tokens")])
def test_bad_arguments(tiny, draft, spec_prompts, kw, name):
    with pytest.raises(ValueError, match=name):
        eagle.generate(tiny, spec_prompts, draft=draft, **kw)


def test_draft_of_another_hidden_size(tiny, spec_prompts):
    other = eagle.EagleDraft(torch.zeros(tiny.vocab_size, 8), torch.zeros(tiny.vocab_size, 8), num_heads=2)
    with pytest.raises(ValueError, match="hidden size"):
        eagle.generate(tiny, spec_prompts, draft=other)


class Proposed(eagle.EagleProposer):
    """Records every token the tree proposes."""

    proposed: set = set()

    def propose(self, caps):
        out = super().propose(caps)
        self.proposed = self.proposed | {t for toks, _ in self.rows or [] for t in toks}
        return out


@pytest.mark.parametrize("with_answer", [True, False])
def test_kept_vocabulary_is_exact_and_proposes_token_ids(tiny, draft, spec_prompts, spec_ar_free, with_answer,
                                                         tmp_path):
    g = torch.Generator().manual_seed(1)
    answer = sorted({t for row in spec_ar_free for t in row})
    rest = [t for t in torch.randperm(tiny.vocab_size, generator=g).tolist() if t not in answer]
    kept = torch.tensor(sorted(rest[:300] + (answer if with_answer else [])))
    small = eagle.new_draft(tiny, kept=kept)
    small.load_state_dict(draft.state_dict())  # the trained layer, the head restricted to ``kept``
    small.eval()
    assert small.logits(torch.zeros(2, tiny.config.hidden_size)).shape == (2, len(kept))
    prop = Proposed(small, **TREE)
    out = speculative.decode(tiny, prop, spec_prompts, max_new_tokens=N, eos_token_id=[])
    assert out.tokens == spec_ar_free
    assert prop.proposed and prop.proposed <= set(kept.tolist())  # head indices mapped back to ids
    if with_answer:  # the trained layer still gets drafts accepted (head indices as ids would not)
        assert out.stats.tau > 1.5
    drafters.save(small, str(tmp_path), tiny)
    again = drafters.load(tiny, "eagle", str(tmp_path))
    assert torch.equal(again.kept, kept)
    assert eagle.generate(tiny, spec_prompts, draft=again, max_new_tokens=N, eos_token_id=[]).tokens == spec_ar_free


@pytest.mark.skipif(os.environ.get("RUN_SLOW") != "1", reason="loads SmolLM2-135M: set RUN_SLOW=1")
def test_smollm2_draft_decodes_exactly():
    from refimpl import autoregressive, models
    from refimpl.prompts import encode_prompt, prompt_set

    lm = models.load("smollm2-135m", device="cpu")
    prompts = [encode_prompt(lm, t) for _, t in prompt_set(1)[:3]]
    ar = autoregressive.generate(lm, prompts, max_new_tokens=24)
    g = eagle.generate(lm, prompts, max_new_tokens=24)  # draft=None: models/eagle-smollm2-135m (kept vocabulary)
    assert g.tokens == ar.tokens and g.stats.tau > 1.2
