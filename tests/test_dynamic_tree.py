"""dynamic_tree.generate / DynamicDraftTree (EAGLE-2's dynamic tree grown by a draft LM with its KV
cache): greedy == AR greedy for several tree budgets, ragged batches and rows alone, with and without
the copy prior, EOS inside an accepted path, max_new_tokens inside a path; every kept node's score is
the draft's own cumulative log-probability recomputed from scratch (uncached, the copy prior's full-
sequence logits) at every step of a run -- so the cache, the tree mask, the positions and the per-node
copy prior are right -- and a wrong position or a missing copy prior is caught; sampling is lossless
(chi-square on the first two tokens, a wrong walk as the negative control)."""
import pytest
import torch

from refimpl import dynamic_tree, models
from refimpl import speculative as sp
from refimpl.copy_prior import ContextCopyLM
from decoding import first_accepted_draft  # tests/decoding.py
from first_two import exact_first_two, first_two_pvalue  # tests/first_two.py
from test_tree import keeping_rejected_tokens  # a wrong SpecInfer walk (tests/test_tree.py)

pytestmark = pytest.mark.usefixtures("torch_kernels")

N = 20  # = spec_ar_free's length


@pytest.fixture(scope="module")
def draft():
    return models.load("tiny-draft", device="cpu")


@pytest.fixture(scope="module")
def copy_draft(draft):
    return ContextCopyLM(draft)


@pytest.mark.parametrize("opts", [dict(total=16, depth=6, topk=4, floor=0.0), dict(total=1, depth=1, topk=1),
                                  dict(total=10, depth=6, topk=3, floor=0.6),
                                  dict(total=4, depth=4, topk=1), dict(total=24, depth=3, topk=5),
                                  dict(total=8, depth=8, topk=2)])
def test_greedy_equals_ar(tiny, draft, copy_draft, spec_prompts, spec_ar_free, opts):
    for d in (draft, copy_draft):
        g = dynamic_tree.generate(tiny, spec_prompts, draft=d, max_new_tokens=N, eos_token_id=[], **opts)
        assert g.tokens == spec_ar_free
        assert g.stats.tau > 1.0
    one = dynamic_tree.generate(tiny, [spec_prompts[2]], draft=draft, max_new_tokens=N, eos_token_id=[], **opts)
    assert one.tokens[0] == spec_ar_free[2]


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_max_new_tokens_inside_a_path(tiny, copy_draft, spec_prompts, spec_ar_free, n):
    g = dynamic_tree.generate(tiny, spec_prompts, draft=copy_draft, max_new_tokens=n, eos_token_id=[])
    assert g.tokens == [t[:n] for t in spec_ar_free]


def test_eos_inside_an_accepted_path(tiny, draft, spec_prompts, spec_ar_free):
    free = dynamic_tree.generate(tiny, spec_prompts, draft=draft, max_new_tokens=N, eos_token_id=[])
    found = first_accepted_draft(free, None)
    assert found is not None
    row, eos, pos = found
    g = dynamic_tree.generate(tiny, spec_prompts, draft=draft, max_new_tokens=N, eos_token_id=eos)
    assert g.tokens[row] == spec_ar_free[row][: pos + 1]
    assert g.tokens == [t[: t.index(eos) + 1] if eos in t else t for t in spec_ar_free]


class Recording(dynamic_tree.DynamicDraftTree):
    """Keeps, at every step, each row's committed tokens and the proposed tree with its scores."""

    def propose(self, caps):
        before = [list(h) for h in self.history]
        prop = super().propose(caps)
        self.log.append((before, self.rows, self.scores))
        return prop


def path_scores(lm, committed, tokens, parents):
    """Each node's cumulative log-probability under ``lm``, recomputed without a cache: one
    full-sequence call per node on committed + the node's path."""
    out = []
    for i in range(len(tokens)):
        path, j = [], i
        while j != -1:
            path.append(tokens[j])
            j = parents[j]
        path = path[::-1]
        logp = torch.log_softmax(lm.logits(torch.tensor([committed + path]))[0, len(committed) - 1:], -1)
        out.append(sum(float(logp[d, t]) for d, t in enumerate(path)))
    return out


def recorded_run(tiny, proposer, prompts):
    proposer.log = []
    sp.decode(tiny, proposer, prompts, max_new_tokens=12, eos_token_id=[])
    return proposer.log


def worst_error(lm, log):
    err = 0.0
    for committed, rows, scores in log:
        for c, (toks, pars), s in zip(committed, rows, scores):
            ref = path_scores(lm, c, toks, pars)
            err = max([err] + [abs(a - b) for a, b in zip(ref, s)])
    return err


def test_every_score_is_the_drafts_own_recomputed(tiny, copy_draft, spec_prompts):
    """Ragged batch, several steps, copy prior on: the cached tree equals an uncached recomputation."""
    prompts = [spec_prompts[0], spec_prompts[3]]
    log = recorded_run(tiny, Recording(copy_draft, total=10, depth=4, topk=3, floor=0.1, target=tiny), prompts)
    assert len(log) >= 3 and all(len(r[0]) >= 4 for r in log[0][1])
    assert worst_error(copy_draft, log) < 1e-3


class NodesOneTooEarly:
    """A draft LM that puts tree nodes (4-D mask calls) one position too early, as if depth started at 0."""

    def __init__(self, lm):
        self.lm = lm

    def __getattr__(self, name):
        return getattr(self.lm, name)

    def forward(self, input_ids, cache=None, position_ids=None, attention_mask=None, **kw):
        if attention_mask is not None and attention_mask.dim() == 4:
            position_ids = position_ids - 1
        return self.lm.forward(input_ids, cache, position_ids=position_ids, attention_mask=attention_mask, **kw)


class WrongPosition(Recording):
    """Negative control: every tree node one position too early."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.draft = NodesOneTooEarly(self.draft)


class NoCopyPrior(Recording):
    """Negative control: the per-node copy prior forgotten."""

    def boost(self, logits, paths):
        return logits


@pytest.mark.parametrize("wrong", [WrongPosition, NoCopyPrior])
def test_a_wrong_tree_draft_is_caught(tiny, copy_draft, spec_prompts, wrong):
    prompts = [spec_prompts[0], spec_prompts[3]]
    log = recorded_run(tiny, wrong(copy_draft, total=10, depth=4, topk=3, floor=0.1, target=tiny), prompts)
    assert worst_error(copy_draft, log) > 1e-2


@pytest.mark.parametrize("kw,name", [(dict(total=0), "total"), (dict(depth=-1), "depth"), (dict(topk=1.5), "topk"),
                                     (dict(floor=1.0), "floor"), (dict(floor=-0.1), "floor"), (dict(floor="0.1"), "floor")])
def test_bad_arguments(tiny, draft, spec_prompts, kw, name):
    with pytest.raises(ValueError, match=name):
        dynamic_tree.generate(tiny, spec_prompts, draft=draft, **kw)


WrongWalk = keeping_rejected_tokens(dynamic_tree.DynamicDraftTree)


TOP_K, TEMP, SAMPLES = 5, 1.0, 1500


def test_sampling_is_lossless_and_a_wrong_walk_is_caught(tiny, draft):
    prompt = tiny.encode("And the")
    exact = exact_first_two(tiny, prompt, TEMP, TOP_K)

    def pvalue(cls):
        g = sp.decode(tiny, cls(draft, total=8, depth=2, topk=3, floor=0.1, target=tiny), [prompt] * SAMPLES, max_new_tokens=3,
                      temperature=TEMP, top_k=TOP_K, generator=torch.Generator().manual_seed(5), eos_token_id=[])
        return first_two_pvalue(g.tokens, exact), g

    good, g = pvalue(dynamic_tree.DynamicDraftTree)
    assert good > 1e-3
    assert pvalue(WrongWalk)[0] < 1e-6


class Unpruned(Recording):
    prune = False


@pytest.mark.parametrize("opts,saves", [(dict(total=6, depth=6, topk=2, floor=0.0), True),
                                        (dict(total=10, depth=5, topk=3, floor=0.0), False)])
def test_pruning_keeps_the_same_trees_with_fewer_draft_calls(tiny, copy_draft, spec_prompts, opts, saves):
    runs = []
    for cls in (Recording, Unpruned):
        p = cls(copy_draft, target=tiny, **opts)
        p.log = []
        g = sp.decode(tiny, p, spec_prompts, max_new_tokens=N, eos_token_id=[])
        runs.append((p.log, g.stats.draft_calls, g.tokens))
    (pruned, fewer, a), (full, more, b) = runs
    assert a == b
    assert fewer < more if saves else fewer <= more
    assert [rows for _, rows, _ in pruned] == [rows for _, rows, _ in full]
    assert all(x == pytest.approx(y, abs=1e-5) for (_, _, s1), (_, _, s2) in zip(pruned, full)
               for r1, r2 in zip(s1, s2) for x, y in zip(r1, r2))


def test_a_floor_grows_fewer_levels(tiny, copy_draft, spec_prompts, spec_ar_free):
    """A level whose best node is below ``floor`` is not grown: fewer draft calls, the same tokens."""
    calls = []
    for floor in (0.0, 0.3, 0.9):
        g = dynamic_tree.generate(tiny, spec_prompts, draft=copy_draft, max_new_tokens=N, eos_token_id=[], floor=floor)
        assert g.tokens == spec_ar_free
        calls.append(g.stats.draft_calls)
    assert calls[0] > calls[1] > calls[2]
