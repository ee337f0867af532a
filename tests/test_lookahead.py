"""lookahead.generate: the staircase mask against a brute force, greedy == AR greedy (ragged batch,
EOS and max_new_tokens inside an accepted guess), sampling lossless with a wrong tree rule caught."""
import pytest
import torch

from refimpl import autoregressive as ar
from refimpl import lookahead, sampling, tree
from refimpl import speculative as sp
from first_two import exact_first_two, first_two_pvalue  # tests/first_two.py

pytestmark = pytest.mark.usefixtures("torch_kernels")  # the kernels have their own tests; torch references here

TEXTS = ["And God said, Let there be light: and there was light. And God said, Let there be",
         "In the beginning God created the heaven and the earth. In the beginning God",
         "The LORD is my shepherd; I shall not want.", "And"]


@pytest.fixture(scope="module")
def prompts(tiny):
    return [tiny.encode(t) for t in TEXTS]


def test_window_mask_matches_the_staircase_brute_force():
    for levels, width in [(1, 1), (1, 4), (3, 2), (4, 7)]:
        see, depth = lookahead.window_mask(levels, width)
        for i in range(levels * width):
            l, j = divmod(i, width)
            # the sequence node (l, j) reads: level 0 at columns 0..j, then levels 1..l of column j
            seq = [(0, c) for c in range(j + 1)] + [(k, j) for k in range(1, l + 1)]
            want = torch.zeros(levels * width, dtype=torch.bool)
            for (k, c) in seq:
                want[k * width + c] = True
            assert torch.equal(see[i], want), (levels, width, l, j)
            assert depth[i] == len(seq), "a node's position is its place in its own sequence"


def test_proposal_has_lookahead_side_nodes_and_a_trie_of_guesses(tiny, prompts):
    la = lookahead.Lookahead(window=3, ngram=3, guesses=2, pool_from_prompt=True)
    la.start(torch.tensor([prompts[0]]), None, sp.Sampling())
    prop = la.propose([10])
    S = 3 * 1  # one level at the start
    assert (prop.tree.parents[0, :S] == tree.SIDE).all()
    guesses = la.pools[0].get(prompts[0][-1])
    assert 1 <= len(guesses) <= 2 and all(len(g) == 2 for g in guesses)
    tokens, _ = tree.trie([list(g) for g in guesses])
    assert prop.tokens[0, S:].tolist() == tokens and int(prop.valid[0]) == S + len(tokens)
    assert not prop.tree.see[0, S:, :S].any() and not prop.tree.see[0, :S, S:].any()


@pytest.mark.parametrize("kw", [{}, {"window": 3, "ngram": 3, "guesses": 3}, {"ngram": 2, "window": 1},
                                {"pool_from_prompt": True}])
def test_greedy_equals_ar_ragged_and_per_row(tiny, prompts, kw):
    ref = ar.generate(tiny, prompts, max_new_tokens=30, eos_token_id=[])
    got = lookahead.generate(tiny, prompts, max_new_tokens=30, eos_token_id=[], **kw)
    assert got.tokens == ref.tokens
    assert [lookahead.generate(tiny, [p], max_new_tokens=30, eos_token_id=[], **kw).tokens[0]
            for p in prompts] == ref.tokens
    assert got.stats.draft_calls == 0


def test_guesses_are_accepted_on_repetitive_text(tiny, prompts):
    g = lookahead.generate(tiny, [prompts[0]], max_new_tokens=40, eos_token_id=[], pool_from_prompt=True)
    assert g.stats.tau > 1.2 and max(max(a) for a in g.stats.accepted) >= 2


@pytest.mark.parametrize("n", [1, 2, 5, 9])
def test_max_new_tokens_and_eos_inside_a_guess(tiny, prompts, n):
    free = ar.generate(tiny, [prompts[0]], max_new_tokens=16, eos_token_id=[]).tokens[0]
    kw = {"pool_from_prompt": True}
    assert lookahead.generate(tiny, [prompts[0]], max_new_tokens=n, eos_token_id=[], **kw).tokens[0] == free[:n]
    eos = free[4]
    got = lookahead.generate(tiny, [prompts[0]], max_new_tokens=16, eos_token_id=eos, **kw).tokens[0]
    assert got == free[: free.index(eos) + 1]


def test_bad_arguments_name_the_argument(tiny, prompts):
    for kw, name in [({"window": 0}, "window"), ({"ngram": 1}, "ngram"), ({"guesses": 0}, "guesses")]:
        with pytest.raises(ValueError, match=name):
            lookahead.generate(tiny, prompts[:1], **kw)
    with pytest.raises(ValueError, match="rule"):  # refused before any forward: trees have their own rule
        sp.decode(tiny, lookahead.Lookahead(7, 5, 7, False), prompts[:1], temperature=1.0, rule=lambda *a: None)
    with pytest.raises(ValueError, match="parents"):
        tree.Tree(torch.tensor([[-3, 0]]))


TOP_K, TEMP, SAMPLES = 4, 1.0, 1500
MOSES = "And the LORD spake unto Moses, saying, Speak unto the children of Israel. And the LORD spake unto"


def sampled_pvalue(tiny, prompt):
    exact = exact_first_two(tiny, prompt, TEMP, TOP_K)
    g = lookahead.generate(tiny, [prompt] * SAMPLES, max_new_tokens=3, temperature=TEMP, top_k=TOP_K,
                           generator=torch.Generator().manual_seed(3), eos_token_id=[], pool_from_prompt=True,
                           window=2, ngram=3)
    return first_two_pvalue(g.tokens, exact), g


def greedy_first_child(self, parents, valid, xs, p, q, settings):
    """Negative control: accept the first child at every node (the guesses win, whatever p says)."""
    def choose(node, kids):
        return kids[0] if kids else None
    return self.walk(parents, valid, choose, lambda node: int(sampling.sample_from_probs(p[node + 1][None])[0]))


def test_sampling_is_lossless_and_a_wrong_tree_rule_is_caught(tiny, monkeypatch):
    prompt = tiny.encode(MOSES)
    pvalue, g = sampled_pvalue(tiny, prompt)
    assert sum(map(sum, g.stats.accepted)) > SAMPLES // 10  # pooled guesses are accepted often
    assert pvalue > 1e-3
    monkeypatch.setattr(tree.Tree, "sample_walk", greedy_first_child)
    bad, _ = sampled_pvalue(tiny, prompt)
    assert bad < 1e-6
