"""retrieval.generate (prompt lookup, SAM, token recycling, SAM + recycling on the verification core):
the suffix automaton against a brute-force longest earlier suffix match; greedy == AR greedy token
for token (ragged batches, EOS inside a proposal, max_new_tokens inside a proposal); sampling is
lossless (chi-square on the first two tokens, with an accept-everything rule as the negative control)."""
import random

import pytest
import torch

from refimpl import autoregressive as ar
from refimpl import retrieval, sampling, tree
from refimpl import speculative as sp
from refimpl.primitives import NgramIndex, lookup_positions, scan_positions
from first_two import exact_first_two, first_two_pvalue  # tests/first_two.py

REPEAT = "And God said, Let there be light: and there was light. And God said, Let there be"
pytestmark = pytest.mark.usefixtures("torch_kernels")  # the kernels have their own tests; torch references here

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


def test_ngram_index_equals_the_scan_as_the_history_grows():
    """The dict index (prompt lookup's and Jacobi's) answers as a rescan of the whole history would,
    after every appended token, for each n-gram range; unknown tokens (-1) never match."""
    rng = random.Random(0)
    for trial in range(200):
        vocab, lo = rng.choice([2, 3, 5, 20]), -1 if trial % 5 == 0 else 0
        toks = [rng.randrange(lo, vocab) for _ in range(rng.randint(1, 50))]
        hi = rng.randint(1, 4)
        mn = rng.randint(1, hi)
        index = NgramIndex(toks[:1], hi, mn)
        for i in range(1, len(toks) + 1):
            if i > 1:
                index.extend([])  # an empty extension changes nothing
                index.extend([toks[i - 1]])
            assert index.history == toks[:i]
            assert index.find() == scan_positions(toks[:i], i - 1, hi, mn), (toks[:i], hi, mn)
        whole = NgramIndex(toks[:2], hi, mn)
        whole.extend(toks[2:])  # many tokens at once == one at a time
        assert whole.after == index.after and whole.find() == index.find()
    assert NgramIndex([]).find() == -1
    with pytest.raises(ValueError, match="min_ngram"):
        NgramIndex([1, 2], max_ngram=1, min_ngram=2)


def longest_earlier_suffix(s):
    """Brute force: the longest suffix of s that also occurs inside s[:-1] (0 if none)."""
    best = 0
    for n in range(1, len(s)):
        if any(s[j:j + n] == s[-n:] for j in range(len(s) - n)):
            best = n
    return best


def test_suffix_automaton_matches_brute_force():
    rnd = random.Random(0)
    for _ in range(200):
        sam, s = retrieval.SuffixAutomaton(), []
        for _ in range(rnd.randint(1, 40)):
            s.append(rnd.randint(0, rnd.choice([1, 2, 3, 6])))
            sam.extend(s[-1])
            n = longest_earlier_suffix(s)
            assert sam.match_len == n, s
            if n:  # the continuation starts right after an earlier occurrence of the suffix
                end = sam.end[sam.state]
                assert end < len(s) - 1 and s[end - n + 1: end + 1] == s[-n:], s
                assert sam.continuation(3) == s[end + 1: end + 4]
    assert len(retrieval.SuffixAutomaton(list(range(50))).length) <= 2 * 50  # linear size


def test_recycling_template_and_draft_tree():
    tpl = retrieval.recycling_template(nodes=80, k=8)
    assert len(tpl) == 80 and len(set(tpl)) == 80
    assert all(p[:-1] in set(tpl) or len(p) == 1 for p in tpl), "every node's parent is in the tree, listed first"
    assert [len(p) for p in tpl] == sorted(len(p) for p in tpl)
    for path in tpl:  # a node with rank r > 0 comes with its better-ranked siblings
        assert path[-1] == 0 or path[:-1] + (path[-1] - 1,) in set(tpl)
    assert max(len(p) for p in tpl) >= 6 and sum(len(p) == 1 for p in tpl) >= 6  # deep and wide
    small = retrieval.recycling_template(nodes=6, k=2)
    table = retrieval.RecyclingTable(small)
    assert table.draft(5, 10) == ([], [])  # nothing known about token 5 yet
    succ = {5: [7, 8], 7: [9, 10], 9: [5, 7]}
    table.update(list(succ), list(succ.values()))
    tokens, parents = table.draft(5, 10)
    want = []  # brute force: follow each template path through the table; unknown rows end a branch
    for path in small:
        tok, ok = 5, True
        for r in path:
            ok = ok and tok in succ
            tok = succ[tok][r] if ok else None
        if ok:
            want.append((path, tok))
    assert len(tokens) == len(want) and [t for _, t in want] == tokens
    for i, (path, _) in enumerate(want):
        par = parents[i]
        assert (par == tree.ROOT) == (len(path) == 1) and (par == tree.ROOT or want[par][0] == path[:-1])
    assert all(len(p) == 1 for p, _ in want[: len(table.draft(5, 1)[0])])  # cap = 1: depth-1 nodes only


@pytest.mark.parametrize("method", ["sam", "recycling", "sam+recycling"])
def test_new_methods_greedy_equal_ar(tiny, prompts, method):
    ref = ar.generate(tiny, prompts, max_new_tokens=30, eos_token_id=[])
    got = retrieval.generate(tiny, prompts, max_new_tokens=30, eos_token_id=[], method=method)
    assert got.tokens == ref.tokens
    assert [retrieval.generate(tiny, [p], max_new_tokens=30, eos_token_id=[], method=method).tokens[0]
            for p in prompts] == ref.tokens
    assert got.stats.draft_calls == 0 and got.stats.tau > 1.2


@pytest.mark.parametrize("method", ["sam", "recycling", "sam+recycling"])
@pytest.mark.parametrize("n", [1, 2, 7])
def test_new_methods_stop_inside_a_proposal(tiny, prompts, method, n):
    free = ar.generate(tiny, [prompts[0]], max_new_tokens=16, eos_token_id=[]).tokens[0]
    assert retrieval.generate(tiny, [prompts[0]], max_new_tokens=n, eos_token_id=[], method=method).tokens[0] \
        == free[:n]
    eos = free[5]
    got = retrieval.generate(tiny, [prompts[0]], max_new_tokens=16, eos_token_id=eos, method=method).tokens[0]
    assert got == free[: free.index(eos) + 1]


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
                     ({"max_new_tokens": 0}, "max_new_tokens"), ({"method": "recycling", "recycle_k": 0}, "recycle_k"),
                     ({"method": "recycling", "recycle_k": 10 ** 9}, "recycle_k"),
                     ({"method": "sam+recycling", "tree_nodes": 0}, "tree_nodes"),
                     ({"method": "sam", "min_match": 0}, "min_match")]:
        with pytest.raises(ValueError, match=name):
            retrieval.generate(tiny, prompts[:1], **kw)
    with pytest.raises(ValueError, match="prompts"):
        retrieval.generate(tiny, [[]])


TOP_K, TEMP, SAMPLES = 4, 1.0, 1500


def accept_all(draft, p, q, u, valid):
    """Negative control: keep every proposed token (the output then copies, whatever p says)."""
    rows = torch.arange(len(valid))
    return valid.clone(), sampling.sample_from_probs(p[rows, valid])


def sampled_pvalue(tiny, prompt, rule, method="prompt_lookup"):
    exact = exact_first_two(tiny, prompt, TEMP, TOP_K)
    proposer = retrieval.PromptLookup(3, 3, 1) if method == "prompt_lookup" else \
        retrieval.SuffixAndRecycling("sam" in method, "recycling" in method, 3, 5 if "sam" in method else None, 8, 80)
    g = sp.decode(tiny, proposer, [prompt] * SAMPLES, max_new_tokens=3, temperature=TEMP,
                  top_k=TOP_K, generator=torch.Generator().manual_seed(7), eos_token_id=[], rule=rule)
    return first_two_pvalue(g.tokens, exact), g


@pytest.mark.usefixtures("torch_kernels")
def test_sampling_is_lossless_and_the_wrong_rule_is_caught(tiny):
    """The lookup proposes " Moses" after the second "And the LORD spake unto" (p = 0.56 under
    top-4): a one-hot q is accepted with probability p(x), else the residual (p without x) is sampled."""
    prompt = tiny.encode("And the LORD spake unto Moses, saying, Speak unto the children of Israel. "
                         "And the LORD spake unto")
    pvalue, g = sampled_pvalue(tiny, prompt, None)
    assert g.stats.drafted > 0 and 0.05 < g.stats.alpha < 0.95  # both branches of the rule run
    assert pvalue > 1e-3
    bad, _ = sampled_pvalue(tiny, prompt, accept_all)
    assert bad < 1e-6


def first_child_always(self, parents, valid, xs, p, q, settings):
    """Negative control for trees: accept the first child at every node, whatever p says."""
    return self.walk(parents, valid, lambda node, kids: kids[0] if kids else None,
                     lambda node: int(sampling.sample_from_probs(p[node + 1][None])[0]))


@pytest.mark.usefixtures("torch_kernels")
def test_sam_sampling_is_lossless(tiny):
    prompt = tiny.encode("And the LORD spake unto Moses, saying, Speak unto the children of Israel. "
                         "And the LORD spake unto")
    pvalue, g = sampled_pvalue(tiny, prompt, None, method="sam")
    assert g.stats.drafted > 0 and 0.05 < g.stats.alpha < 0.95
    assert pvalue > 1e-3


def test_sam_with_recycling_samples_through_the_tree_losslessly(tiny, monkeypatch):
    """SAM's 5-token match proposes a chain packed as a tree: the tree's walk must keep p exact."""
    prompt = tiny.encode("And the LORD spake unto Moses, saying, Speak unto the children of Israel. "
                         "And the LORD spake unto")
    pvalue, g = sampled_pvalue(tiny, prompt, None, method="sam+recycling")
    assert g.stats.drafted > 0 and 0.05 < g.stats.alpha < 0.95
    assert pvalue > 1e-3
    monkeypatch.setattr(tree.Tree, "sample_walk", first_child_always)
    bad, _ = sampled_pvalue(tiny, prompt, None, method="sam+recycling")
    assert bad < 1e-6


class Delegating(sp.Proposer):
    """A wrapper that records each proposal and delegates the four methods of the contract, ``start``
    (and so its :class:`speculative.Needs`) included, as chapter 09's ``Recorder`` does."""

    def __init__(self, inner):
        self.inner, self.sizes = inner, []

    def start(self, ids, mask, settings):
        return self.inner.start(ids, mask, settings)

    def propose(self, caps):
        prop = self.inner.propose(caps)
        self.sizes.append(prop.valid.tolist())
        return prop

    def accept(self, verdict):
        self.inner.accept(verdict)

    def select(self, rows):
        self.inner.select(rows)


class DroppingNeeds(Delegating):
    """WRONG on purpose: starts the inner proposer but hands the loop no needs of its own."""

    def start(self, ids, mask, settings):
        self.inner.start(ids, mask, settings)
        return sp.Needs()


@pytest.mark.parametrize("method", retrieval.METHODS)
def test_a_delegating_wrapper_decodes_as_generate_does(tiny, prompts, method):
    """retrieval.make_proposer is what generate decodes with, and a wrapper that delegates start /
    propose / accept / select gives generate's tokens and stats exactly, for every method."""
    want = retrieval.generate(tiny, prompts, max_new_tokens=24, method=method, eos_token_id=[])
    for prop in (retrieval.make_proposer(tiny, method), Delegating(retrieval.make_proposer(tiny, method))):
        got = sp.decode(tiny, prop, prompts, max_new_tokens=24, eos_token_id=[])
        assert got.tokens == want.tokens
        assert (got.stats.tau, got.stats.target_calls, got.stats.accepted) == \
               (want.stats.tau, want.stats.target_calls, want.stats.accepted), method


def test_a_wrapper_that_drops_the_needs_is_caught(tiny, prompts):
    """Negative control: recycling seeds its table with the target's logits over the prompt
    (Needs.fed); a wrapper that drops its needs decodes the same tokens with other stats."""
    want = retrieval.generate(tiny, prompts, max_new_tokens=24, method="recycling", eos_token_id=[])
    got = sp.decode(tiny, DroppingNeeds(retrieval.make_proposer(tiny, "recycling")), prompts, max_new_tokens=24,
                    eos_token_id=[])
    assert got.tokens == want.tokens
    assert got.stats.accepted != want.stats.accepted
