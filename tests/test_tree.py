"""refimpl.tree (token trees on the verification core): ``ancestors`` == a brute force; greedy decoding
with an oracle tree proposer (the true continuation hidden among random siblings, side nodes,
random depths) == AR greedy token for token (ragged batch and batch 1, EOS inside an accepted path,
max_new_tokens reached inside a path; sampling at top_k=1); SpecInfer's walk is lossless (chi-square
on the first two tokens for deterministic nodes with a duplicate, on the first token for children
drawn i.i.d. from a q; wrong walks as negative controls); ``LM.move_slots`` on both cache types."""
import pytest
import torch

from refimpl import autoregressive as ar
from refimpl import sampling
from refimpl import speculative as sp
from refimpl.tree import ROOT, SIDE, Tree, ancestors
from first_two import first_two_pvalue  # tests/first_two.py

TEXTS = ["And God said", "In the beginning",
         "The LORD is my shepherd; I shall not want. He maketh me", "And"]
N = 16  # new tokens per greedy test


@pytest.fixture(scope="module")
def prompts(tiny):
    return [tiny.encode(t) for t in TEXTS]


@pytest.fixture(scope="module")
def ar_free(tiny, prompts):
    """AR greedy references (never stopping at EOS), longer than any test asks for."""
    return ar.generate(tiny, prompts, max_new_tokens=N + 4, eos_token_id=[]).tokens


# ---- ancestors ------------------------------------------------------------------------
def brute_ancestors(parents):
    m = len(parents)
    anc = [[False] * m for _ in range(m)]
    for i in range(m):
        j = i
        while j >= 0:  # ROOT (-1) and SIDE (-2) end the chain
            anc[i][j] = True
            j = parents[j]
    return anc


def test_ancestors_match_brute_force():
    g = torch.Generator().manual_seed(0)
    for _ in range(40):
        b, m = int(torch.randint(1, 4, (1,), generator=g)), int(torch.randint(0, 13, (1,), generator=g))
        par = torch.tensor([[int(torch.randint(SIDE, i, (1,), generator=g)) for i in range(m)] for _ in range(b)],
                           dtype=torch.long).view(b, m)
        got = ancestors(par)
        assert got.shape == (b, m, m) and got.dtype == torch.bool
        for r in range(b):
            assert got[r].tolist() == brute_ancestors(par[r].tolist()), par[r].tolist()
        tree = Tree(par)  # the defaults: depth = ancestors counted with the node itself, see = ancestors
        assert tree.depth.tolist() == [[sum(a) for a in brute_ancestors(p)] for p in par.tolist()]
        assert torch.equal(tree.see, got)
    chain = ancestors(torch.tensor([[ROOT, 0, 1, 2]]))[0]
    assert torch.equal(chain, torch.ones(4, 4, dtype=torch.bool).tril())


@pytest.mark.parametrize("bad", [[[ROOT, 1]], [[ROOT, 2, 0]], [[ROOT, 0, 1], [ROOT, 0, 2]], [[0]]])
def test_ancestors_reject_a_child_before_its_parent(bad):
    with pytest.raises(ValueError, match="parents"):
        ancestors(torch.tensor(bad))


# ---- greedy: an oracle proposer ---------------------------------------------------------
class Oracle:
    """Proposes the true AR-greedy continuation as one path of a random tree.

    At each level of the true path, random sibling tokens come before and after the true node
    (some with random subtrees of their own), plus a few side nodes; the nodes are listed in a
    random parents-first order. The true path's depth is random in [0, cap] per row and step
    (``full``: always cap), and no path is deeper than the row's cap."""

    def __init__(self, refs, vocab, seed=0, full=False):
        self.refs, self.vocab, self.full = refs, vocab, full
        self.g = torch.Generator().manual_seed(seed)
        self.depths = []  # (row, true depth) per proposal, for the tests

    def rand(self, lo, hi):  # an int in [lo, hi]
        return int(torch.randint(lo, hi + 1, (1,), generator=self.g))

    def start(self, ids, mask, settings):
        self.rows = list(range(ids.shape[0]))
        self.done = [0] * ids.shape[0]
        return sp.Needs(trees=True)

    def subtree(self, nodes, parent, levels):
        """A random chain of at most ``levels`` random tokens below ``parent``."""
        for _ in range(self.rand(0, levels)):
            nodes.append((parent, self.rand(0, self.vocab - 1)))
            parent = len(nodes) - 1

    def tree(self, truth, cap):
        nodes = []  # (parent build index or ROOT / SIDE, token)
        parent = ROOT
        for level, tok in enumerate(truth):
            for before in (True, False):
                for _ in range(self.rand(0, 2)):
                    nodes.append((parent, self.rand(0, self.vocab - 1)))
                    self.subtree(nodes, len(nodes) - 1, cap - level - 1)
                if before:
                    nodes.append((parent, tok))
                    true_node = len(nodes) - 1
            parent = true_node
        if len(truth) < cap:  # wrong children below the last true node (or the root): depth still <= cap
            for _ in range(self.rand(0, 2)):
                nodes.append((parent, self.rand(0, self.vocab - 1)))
        for _ in range(self.rand(0, 2)):
            nodes.append((SIDE, self.rand(0, self.vocab - 1)))
        # a random parents-first order
        order, placed, left = [], {}, list(range(len(nodes)))
        while left:
            ready = [i for i in left if nodes[i][0] < 0 or nodes[i][0] in placed]
            i = ready[self.rand(0, len(ready) - 1)]
            placed[i] = len(order)
            order.append(i)
            left.remove(i)
        parents = [nodes[i][0] if nodes[i][0] < 0 else placed[nodes[i][0]] for i in order]
        return parents, [nodes[i][1] for i in order]

    def propose(self, caps):
        trees = []
        for b, cap in enumerate(caps):
            r = self.rows[b]
            d = cap if self.full else self.rand(0, cap)
            truth = self.refs[r][self.done[r]: self.done[r] + d]
            assert len(truth) == d, "the reference must be long enough"
            self.depths.append((r, d))
            trees.append(self.tree(truth, cap))
        m = max(len(t[0]) for t in trees)
        parents = torch.tensor([p + [ROOT] * (m - len(p)) for p, _ in trees], dtype=torch.long).view(len(caps), m)
        x = torch.tensor([t + [0] * (m - len(t)) for _, t in trees], dtype=torch.long).view(len(caps), m)
        return sp.Proposal(x, torch.tensor([len(p) for p, _ in trees]), None, 0, tree=Tree(parents))

    def accept(self, v):
        assert v.path is not None and v.path.shape[0] == len(self.rows)
        for b, k in enumerate(v.n_list):
            self.done[self.rows[b]] += k + 1

    def select(self, rows):
        self.rows = [self.rows[i] for i in rows.tolist()]


def test_dense_slots_feed_like_masked_ones(tiny):
    """Tree.feed on slots with every position real (one row: no mask to build, the slots stay dense)
    gives the bits of the same feed through the explicit mask, and leaves the same slots behind."""
    from refimpl.slot_cache import SlotCache

    g = torch.Generator().manual_seed(3)
    tree = Tree(torch.tensor([[ROOT, 0, ROOT, 1, SIDE]]))
    x = torch.randint(0, tiny.vocab_size, (1, 5), generator=g)
    outs = []
    for dense in (True, False):
        slots = SlotCache(tiny, 1, tiny.device)
        slots.feed(torch.randint(0, tiny.vocab_size, (1, 7), generator=torch.Generator().manual_seed(4)))
        if not dense:
            slots.mask = slots.mask  # the same all-ones mask, now explicit: the general path
        assert slots.dense == dense
        for F in (2, 1):  # two feeds: the second one after the first one's tree slots
            logits, h = tree.feed(slots, torch.tensor([[11, 12]])[:, :F], None, x, torch.tensor([5]),
                                  hidden=True)
            outs.append((logits, h, slots.length, slots.count.tolist(), slots.mask.tolist()))
        assert slots.dense == dense
    for a, b in zip(outs[:2], outs[2:]):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[2:] == b[2:]


def test_greedy_tree_equals_ar_ragged_and_batch_1(tiny, prompts, ar_free):
    ref = [r[:N] for r in ar_free]
    oracle = Oracle(ar_free, tiny.vocab_size, seed=1)
    g = sp.decode(tiny, oracle, prompts, max_new_tokens=N, eos_token_id=[])
    assert g.tokens == ref
    assert g.stats.draft_calls == 0 and g.stats.tau > 1.5
    acc = [tuple(a) for a in g.stats.accepted]
    assert any(len(set(a)) > 1 for a in acc), "rows should accept different depths (ragged)"
    assert any(d >= 3 for _, d in oracle.depths)
    for i, p in enumerate(prompts):
        one = sp.decode(tiny, Oracle([ar_free[i]], tiny.vocab_size, seed=10 + i), [p], max_new_tokens=N,
                        eos_token_id=[])
        assert one.tokens[0] == ref[i]
        assert one.stats.tau > 1.0


@pytest.mark.parametrize("n", [1, 2, 5, 7])
def test_max_new_tokens_inside_a_path(tiny, prompts, ar_free, n):
    """Full-depth trees: the last step's accepted path ends exactly at max_new_tokens."""
    g = sp.decode(tiny, Oracle(ar_free, tiny.vocab_size, seed=n, full=True), prompts, max_new_tokens=n,
                  eos_token_id=[])
    assert g.tokens == [r[:n] for r in ar_free]
    assert g.stats.target_calls == 1  # one call: the whole continuation was one accepted path


def test_eos_inside_an_accepted_path(tiny, prompts, ar_free):
    free = ar_free[0][:12]
    eos = free[3]
    cut = free.index(eos)
    oracle = Oracle([free + [0]], tiny.vocab_size, seed=3, full=True)
    g = sp.decode(tiny, oracle, [prompts[0]], max_new_tokens=12, eos_token_id=eos)
    assert g.tokens[0] == free[: cut + 1]
    assert g.stats.accepted[0][0] > cut, "EOS must be an accepted node, with more accepted nodes after it"
    # a ragged batch with random depths: each row stops at its own first EOS (or runs to the end)
    g = sp.decode(tiny, Oracle(ar_free, tiny.vocab_size, seed=4), prompts, max_new_tokens=N, eos_token_id=eos)
    want = [r[:N][: r.index(eos) + 1] if eos in r[:N] else r[:N] for r in ar_free]
    assert g.tokens == want


# ---- sampling: SpecInfer's walk is lossless --------------------------------------------
def test_sampling_with_top_k_1_equals_greedy(tiny, prompts, ar_free):
    """top_k=1 makes p one-hot: SpecInfer's walk over the oracle's random trees (deterministic nodes,
    q = None) must then accept exactly the greedy path and reproduce AR greedy."""
    g = sp.decode(tiny, Oracle(ar_free, tiny.vocab_size, seed=6), prompts, max_new_tokens=N, temperature=1.3,
                  top_k=1, generator=torch.Generator().manual_seed(0), eos_token_id=[])
    assert g.tokens == [r[:N] for r in ar_free]
    assert g.stats.tau > 1.5


class AcceptFirstChild(Tree):
    """Negative control: always accept a node's first child."""

    def sample_walk(self, parents, valid, xs, p, q, settings):
        return self.walk(parents, valid, lambda node, kids: kids[0] if kids else None,
                         lambda node: int(sampling.sample_from_probs(p[node + 1][None], settings.generator)[0]))


class KeepRejectedToken(Tree):
    """Negative control (subtle): after rejecting a deterministic child, keep its token in the residual
    (the one-hot q is ignored), so a duplicate sibling gets a second chance."""

    def sample_walk(self, parents, valid, xs, p, q, settings):
        state = {}

        def choose(node, kids):
            r = p[node + 1]
            for c in kids:
                if float(settings.uniforms((1,), p.device)[0]) < float(r[xs[c]]):
                    return c
            state["r"] = r
            return None

        def final(node):
            return int(sampling.sample_from_probs(state.get("r", p[node + 1])[None], settings.generator)[0])

        return self.walk(parents, valid, choose, final)


def keeping_rejected_tokens(proposer_cls):
    """A subclass of a tree proposer whose trees are verified by :class:`KeepRejectedToken` (the
    same trees, a wrong walk): the negative control of every tree sampler's chi-square test."""

    class WrongWalk(proposer_cls):
        def propose(self, caps):
            prop = super().propose(caps)
            return prop if prop.tree is None else prop._replace(tree=KeepRejectedToken(prop.tree.parents))

    return WrongWalk


class FixedTree:
    """Proposes the same deterministic tree (q = None) to every row at the first step, then nothing."""

    def __init__(self, parents, tokens, cls=Tree):
        self.parents, self.tokens, self.cls = parents, tokens, cls

    def start(self, ids, mask, settings):
        self.b, self.first = ids.shape[0], True
        return sp.Needs(trees=True)

    def propose(self, caps):
        assert all(c >= 2 for c in caps) or not self.first
        m = len(self.tokens) if self.first else 0
        x = torch.tensor([self.tokens[:m]] * self.b, dtype=torch.long).view(self.b, m)
        par = torch.tensor([self.parents[:m]] * self.b, dtype=torch.long).view(self.b, m)
        self.first = False
        return sp.Proposal(x, torch.full((self.b,), m), None, 0, tree=self.cls(par))

    def accept(self, v):
        pass

    def select(self, rows):
        self.b = len(rows)


TOP_K, TEMP, SAMPLES = 5, 1.0, 2000


@pytest.fixture(scope="module")
def chi_setup(tiny):
    """Prompt "And the": the first token is uncertain (top-5 probabilities 0.11-0.40).

    Tree: root -> [A, B, A (duplicate), C, Z], A -> [D, E], B -> [F], where A, B, C are the 1st,
    2nd and 4th most likely first tokens, Z a token outside the top-k (p = 0), D, E the two most
    likely after A and F the most likely after B."""
    prompt = tiny.encode("And the")
    p1 = sampling.probs(tiny.logits(torch.tensor([prompt]))[0, -1], TEMP, TOP_K)
    firsts = p1.nonzero()[:, 0].tolist()
    p2 = sampling.probs(tiny.logits(torch.tensor([prompt + [a] for a in firsts]))[:, -1], TEMP, TOP_K)
    exact = {(a, b): float(p1[a] * p2[i, b]) for i, a in enumerate(firsts) for b in p2[i].nonzero()[:, 0].tolist()}
    rank = p1.argsort(descending=True).tolist()
    A, B, C, Z = rank[0], rank[1], rank[3], rank[TOP_K + 3]
    after = {a: p2[i].argsort(descending=True).tolist() for i, a in enumerate(firsts)}
    D, E, F = after[A][0], after[A][1], after[B][0]
    parents = [ROOT, ROOT, 0, 0, ROOT, ROOT, 1, ROOT]
    tokens = [A, B, D, E, A, C, F, Z]
    return prompt, exact, parents, tokens


def tree_pvalue(tiny, chi_setup, cls, seed=11):
    prompt, exact, parents, tokens = chi_setup
    g = sp.decode(tiny, FixedTree(parents, tokens, cls), [prompt] * SAMPLES, max_new_tokens=3, temperature=TEMP,
                  top_k=TOP_K, generator=torch.Generator().manual_seed(seed), eos_token_id=[])
    return first_two_pvalue(g.tokens, exact), g


def test_specinfer_walk_is_lossless_and_wrong_walks_are_caught(tiny, chi_setup):
    """Chi-square on the first two tokens (top-5, T = 1, 2,000 samples, fixed seed): the walk stops at
    the root, at depth 1 and at depth 2, so residuals at both levels, the skipped duplicate, the p = 0
    child and the next step's plain draw all feed the statistic. Measured, seeds 11-15: SpecInfer
    p = 0.12-0.73; accept-first-child p = 0; keep-the-rejected-token p < 1e-188."""
    pvalue, g = tree_pvalue(tiny, chi_setup, Tree)
    assert {0, 1, 2} <= set(g.stats.accepted[0]), "the walk should stop at the root, at depth 1 and at depth 2"
    assert pvalue > 1e-3
    _, _, _, tokens = chi_setup
    assert sum(t[0] == tokens[0] for t in g.tokens) < SAMPLES * 0.5  # A is likely, never forced
    for wrong in (AcceptFirstChild, KeepRejectedToken):
        bad, _ = tree_pvalue(tiny, chi_setup, wrong)
        assert bad < 1e-6, wrong.__name__


def test_a_rule_is_refused_for_a_tree(tiny):
    tree = Tree(torch.tensor([[ROOT]]))
    settings = sp.Sampling(1.0)
    with pytest.raises(ValueError, match="rule"):
        tree.verify(torch.tensor([[5]]), torch.zeros(1, 2, tiny.vocab_size), torch.tensor([1]), None, settings,
                    rule=lambda *a: None)


# ---- sampling with q: children drawn i.i.d. from a draft distribution -----------------------
class DropResidual(Tree):
    """Negative control: a rejected child leaves p unchanged (no residual norm(max(0, p - q)))."""

    def sample_walk(self, parents, valid, xs, p, q, settings):
        def choose(node, kids):
            r = p[node + 1]
            for c in kids:
                if float(settings.uniforms((1,), p.device)[0]) * float(q[c, xs[c]]) < float(r[xs[c]]):
                    return c
            return None

        return self.walk(parents, valid, choose,
                         lambda node: int(sampling.sample_from_probs(p[node + 1][None], settings.generator)[0]))


class IidChildren:
    """At the first step, ``k`` children of the root drawn i.i.d. from ``q`` (V,), which they carry."""

    def __init__(self, q, k, cls=Tree, seed=0):
        self.qv, self.k, self.cls = q, k, cls
        self.g = torch.Generator().manual_seed(seed)

    def start(self, ids, mask, settings):
        self.b, self.first = ids.shape[0], True
        return sp.Needs(trees=True)

    def propose(self, caps):
        m = self.k if self.first else 0
        x = (torch.multinomial(self.qv, self.b * m, replacement=True, generator=self.g) if m
             else torch.zeros(0, dtype=torch.long)).view(self.b, m)
        q = self.qv.expand(self.b, m, -1)
        self.first = False
        return sp.Proposal(x, torch.full((self.b,), m), q, 0, tree=self.cls(torch.full((self.b, m), ROOT)))

    def accept(self, v):
        pass

    def select(self, rows):
        self.b = len(rows)


def test_specinfer_with_iid_children_is_lossless(tiny, chi_setup):
    """Three root children drawn with replacement from a flatter q (T = 2, top-8) share that q: accept
    child x with min(1, r(x) / q(x)), else r <- norm(max(0, r - q)); chi-square on the first token.
    Dropping the residual (r stays p) must be caught."""
    from scipy.stats import chisquare

    prompt = chi_setup[0]
    logits = tiny.logits(torch.tensor([prompt]))[0, -1]
    p1 = sampling.probs(logits, TEMP, TOP_K)
    q = sampling.probs(logits, 2.0, 8)

    def pvalue(cls):
        g = sp.decode(tiny, IidChildren(q, 3, cls), [prompt] * SAMPLES, max_new_tokens=2, temperature=TEMP,
                      top_k=TOP_K, generator=torch.Generator().manual_seed(21), eos_token_id=[])
        firsts = [t[0] for t in g.tokens]
        support = p1.nonzero()[:, 0].tolist()
        if not set(firsts) <= set(support):
            return 0.0, g
        obs = [firsts.count(a) for a in support]
        exp = [float(p1[a]) * SAMPLES for a in support]
        return chisquare(obs, [e * SAMPLES / sum(exp) for e in exp]).pvalue, g

    good, g = pvalue(Tree)
    assert 0.05 < g.stats.alpha < 0.95 and g.stats.accepted[0].count(0) > SAMPLES * 0.05
    assert good > 1e-3
    bad, _ = pvalue(DropResidual)
    assert bad < 1e-6


# ---- LM.move_slots ---------------------------------------------------------------------
SRC = torch.tensor([[6, 8, 9], [4, 7, 5]])  # row 1 overlaps: slot 5 is read after slot 5 is written
DST = 4


def layer_tensors(cache):
    """Per layer, views of the cached (B, H, length, D) keys and values (the lean cache's buffers are
    longer, and uninitialised past ``length``)."""
    L = cache.get_seq_length()
    if hasattr(cache, "layers"):
        return [(lay.keys[:, :, :L], lay.values[:, :, :L]) for lay in cache.layers]
    return [(k[:, :, :L], v[:, :, :L]) for k, v in zip(cache.keys, cache.values)]


def check_moved(before, after, length):
    for (k0, v0), (k1, v1) in zip(before, after):
        for old, new in ((k0, k1), (v0, v1)):
            assert torch.equal(new[:, :, :DST], old[:, :, :DST])
            assert torch.equal(new[:, :, DST + SRC.shape[1]: length], old[:, :, DST + SRC.shape[1]: length])
            for b in range(SRC.shape[0]):
                for j, s in enumerate(SRC[b].tolist()):
                    assert torch.equal(new[b, :, DST + j], old[b, :, s]), (b, j, s)
            assert not torch.equal(new, old)


@pytest.mark.parametrize("kind", ["dynamic", "lean", "lean, layer by layer"])
def test_move_slots(tiny, kind, monkeypatch):
    from refimpl.models import cpu_gemv, lean_llama

    ids = torch.randint(0, tiny.vocab_size, (2, 10), generator=torch.Generator().manual_seed(5))
    if kind == "dynamic":
        _, cache = tiny.forward(ids)
    else:
        cache = lean_llama.KVCache(tiny.num_layers)
        lean_llama.forward(tiny.model, ids, cache)
    calls = []
    if kind == "lean" and cpu_gemv.available():  # the lean cache moves every layer in one kernel call
        monkeypatch.setattr(cpu_gemv, "move_slots", lambda *a, f=cpu_gemv.move_slots: calls.append(1) or f(*a))
    elif kind == "lean, layer by layer":  # the torch path the kernel replaces (no kernel on this machine)
        monkeypatch.setattr(cpu_gemv, "available", lambda: False)
    before = [(k.clone(), v.clone()) for k, v in layer_tensors(cache)]
    assert len(before) == tiny.num_layers
    tiny.move_slots(cache, DST, SRC)
    assert len(calls) == (kind == "lean" and cpu_gemv.available())
    check_moved(before, layer_tensors(cache), 10)
    assert cache.get_seq_length() == 10  # moving does not crop
    snap = [(k.clone(), v.clone()) for k, v in layer_tensors(cache)]
    tiny.move_slots(cache, DST, SRC[:, :0])  # nothing to move
    assert all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(snap, layer_tensors(cache)))


def test_lean_cache_move_refuses_positions_outside_its_buffers(tiny):
    from refimpl.models import cpu_gemv, lean_llama

    if not cpu_gemv.available():
        pytest.skip("the kernel does not build here: the lean cache moves layer by layer")
    cache = lean_llama.KVCache(tiny.num_layers)
    lean_llama.forward(tiny.model, torch.zeros((2, 10), dtype=torch.long), cache)
    cap = cache.keys[0].shape[2]
    for dst, src in ((4, torch.tensor([[cap, 5], [5, 6]])), (4, torch.tensor([[-1, 5], [5, 6]])),
                     (cap - 1, torch.tensor([[5, 6], [5, 6]])), (4, torch.tensor([[5, 6]]))):
        with pytest.raises(ValueError, match="src"):
            cache.move(dst, src)


def test_move_slots_skips_only_when_every_row_is_in_place(tiny):
    """A path already in its slots (its first node at every depth) moves nothing; one row in place and
    one not still moves the other row (a skip decided on row 0 alone would leave row 1's slots stale)."""
    ids = torch.randint(0, tiny.vocab_size, (2, 10), generator=torch.Generator().manual_seed(6))
    _, cache = tiny.forward(ids)
    before = [(k.clone(), v.clone()) for k, v in layer_tensors(cache)]
    tiny.move_slots(cache, DST, torch.tensor([[4, 5, 6], [4, 5, 6]]))
    assert all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(before, layer_tensors(cache)))
    tiny.move_slots(cache, DST, torch.tensor([[4, 5, 6], [4, 9, 6]]))
    for (k0, _), (k1, _) in zip(before, layer_tensors(cache)):
        assert torch.equal(k1[0], k0[0]) and torch.equal(k1[1, :, 5], k0[1, :, 9])
        assert not torch.equal(k1[1, :, 5], k0[1, :, 5])
