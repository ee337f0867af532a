"""jacobi.generate (Jacobi decoding as a proposer on the verification core): greedy == AR greedy token
for token (windows 1, 3, 8; ragged batches and single rows; EOS inside an accepted run;
max_new_tokens cutting the window); speculative Jacobi decoding (SJD) is lossless: chi-square on the
first two tokens, where the second is decided by an SJD guess (q = p_old), with wrong rules and a
proposer whose q is taken from the wrong position as negative controls."""
import pytest
import torch

from kernels.rejection_sample import rejection_sample
from refimpl import jacobi, sampling
from refimpl import speculative as sp
from decoding import first_accepted_draft  # tests/decoding.py
from first_two import exact_first_two, first_two_pvalue  # tests/first_two.py

pytestmark = pytest.mark.usefixtures("torch_kernels")  # the kernels' torch references (fast on CPU)

N = 20  # = spec_ar_free's length


# ---- greedy Jacobi ----------------------------------------------------------------------
@pytest.mark.parametrize("init", jacobi.INITS)
@pytest.mark.parametrize("window", [1, 3, 8])
def test_greedy_equals_ar_ragged_and_row_by_row(tiny, spec_prompts, spec_ar_free, window, init):
    g = jacobi.generate(tiny, spec_prompts, max_new_tokens=N, eos_token_id=[], window=window, init=init)
    assert g.tokens == spec_ar_free
    assert g.stats.draft_calls == 0 and g.stats.tau >= 1.0
    assert g.stats.nfe == g.stats.target_calls <= N
    assert sum(map(sum, g.stats.accepted)) > 0, "some Jacobi guesses should converge early"
    for p, ref in zip(spec_prompts, spec_ar_free):
        one = jacobi.generate(tiny, [p], max_new_tokens=N, eos_token_id=[], window=window, seed=window, init=init)
        assert one.tokens[0] == ref and one.stats.tau >= 1.0


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 11])
def test_max_new_tokens_cuts_the_window(tiny, spec_prompts, spec_ar_free, n):
    """The last steps' windows are cut to what a row still needs; rows finish at different steps."""
    g = jacobi.generate(tiny, spec_prompts, max_new_tokens=n, eos_token_id=[], window=4)
    assert g.tokens == [r[:n] for r in spec_ar_free]
    assert max(g.stats.extra["gammas"]) <= min(4, n - 1)


@pytest.mark.parametrize("window", [3, 8])
def test_eos_inside_an_accepted_run(tiny, spec_prompts, spec_ar_free, window):
    free = jacobi.generate(tiny, spec_prompts, max_new_tokens=N, eos_token_id=[], window=window)
    found = first_accepted_draft(free)
    assert found is not None, "the test needs a row where an accepted guess can be EOS"
    row, eos, pos = found
    g = jacobi.generate(tiny, spec_prompts, max_new_tokens=N, eos_token_id=eos, window=window)
    assert g.tokens[row] == spec_ar_free[row][: pos + 1]
    assert g.tokens == [r[: r.index(eos) + 1] if eos in r else r for r in spec_ar_free]
    one = jacobi.generate(tiny, [spec_prompts[row]], max_new_tokens=N, eos_token_id=[eos, 10**6], window=window)
    assert one.tokens[0] == spec_ar_free[row][: pos + 1]


@pytest.mark.parametrize("window", [0, -1, 2.5, True, "8"])
def test_bad_window_names_window(tiny, spec_prompts, window):
    with pytest.raises(ValueError, match="window"):
        jacobi.generate(tiny, spec_prompts[:1], window=window)


def test_lookup_init_guesses_what_followed_the_last_ngram(tiny):
    """init="lookup": a new slot j's first guess is ctx[at + j], where ctx[at] followed the latest earlier
    occurrence of the context's last n-gram (n = 3..1); random draws where the text runs out."""
    ctx = [5, 1, 2, 3, 9, 8, 7, 1, 2, 3]  # "1 2 3" occurred at 1..3, followed by 9 8 7 1 2 3
    j = jacobi.Jacobi(window=4, init="lookup")
    j.start(torch.tensor([ctx, [4, 4, 4, 6, 4, 4, 4, 0, 0, 0]]), torch.tensor([[1] * 10, [1] * 7 + [0] * 3]),
            sp.Sampling(0.0))
    prop = j.propose([10, 10])
    assert prop.tokens.tolist() == [[9, 8, 7, 1], [6, 4, 4, 4]]  # row 2: "4 4 4" at 0..2 was followed by 6 4 4 4
    j.guess[0] = [9, 8]  # two guesses kept: the fresh ones continue the same occurrence at offsets 2, 3
    assert j.fresh(0, 2) == [7, 1]
    j.context[0], j.guess[0] = ctx + [9, 8, 7, 1, 2, 3], []  # latest "1 2 3" at 7..9: 6 tokens follow it
    at_end = j.fresh(0, 8)
    assert at_end[:6] == [9, 8, 7, 1, 2, 3] and len(at_end) == 8  # 2 random draws complete the window
    with pytest.raises(ValueError, match="init"):
        jacobi.Jacobi(4, init="ngram")
    with pytest.raises(ValueError, match="init"):
        jacobi.generate(tiny, [[1, 2]], init=None)


@pytest.mark.parametrize("init", jacobi.INITS)
@pytest.mark.parametrize("window,min_window", [(4, 1), (4, 3), (8, 2)])
def test_min_window_stays_exact_and_fills_random_guesses_only_that_far(tiny, spec_prompts, spec_ar_free, window,
                                                                       min_window, init):
    """Random guesses fill the window to ``min_window`` slots only; an n-gram continuation (with the
    random draws after it) may fill it to ``window``. Greedy output stays AR greedy's, ragged and alone."""
    g = jacobi.generate(tiny, spec_prompts, max_new_tokens=N, eos_token_id=[], window=window, init=init,
                        min_window=min_window)
    assert g.tokens == spec_ar_free
    one = jacobi.generate(tiny, [spec_prompts[2]], max_new_tokens=N, eos_token_id=[], window=window, init=init,
                          min_window=min_window)
    assert one.tokens[0] == spec_ar_free[2]
    j = jacobi.Jacobi(window, init=init, min_window=min_window)
    j.start(torch.tensor([[5, 6, 7, 8, 9]]), None, sp.Sampling(0.0))  # no token repeats: no n-gram continuation
    assert j.propose([10]).valid.tolist() == [min_window]
    j.guess[0] = [1] * (min_window + 1)  # more carried-over guesses than min_window: no random ones added
    assert j.fresh(0, window - min_window - 1) == []


def test_min_window_keeps_an_ngram_continuation_whole():
    ctx = [5, 1, 2, 3, 9, 8, 7, 1, 2, 3]  # "1 2 3" occurred at 1..3, followed by 9 8 7 1 2 3
    j = jacobi.Jacobi(window=4, init="lookup", min_window=1)
    j.start(torch.tensor([ctx]), None, sp.Sampling(0.0))
    assert j.propose([10]).tokens.tolist() == [[9, 8, 7, 1]]


@pytest.mark.parametrize("min_window,match", [(0, "min_window"), (2.5, "min_window"), (True, "min_window"),
                                               (5, "min_window must be <= window")])
def test_bad_min_window_names_it(tiny, spec_prompts, min_window, match):
    with pytest.raises(ValueError, match=match):
        jacobi.generate(tiny, spec_prompts[:1], window=4, min_window=min_window)


def test_lookup_init_sjd_top_k_1_equals_greedy(tiny, spec_prompts, spec_ar_free):
    """The lookup guesses are deterministic drafts (one-hot q), as random ones are: SJD stays exact at top_k=1."""
    g = jacobi.generate(tiny, spec_prompts, max_new_tokens=12, temperature=1.3, top_k=1, init="lookup",
                        generator=torch.Generator().manual_seed(0), eos_token_id=[], window=4)
    assert g.tokens == [r[:12] for r in spec_ar_free]


# ---- speculative Jacobi decoding ----------------------------------------------------------
def test_sjd_top_k_1_equals_greedy_and_is_seeded(tiny, spec_prompts, spec_ar_free):
    """top_k=1: p and p_old are one-hot, so SJD's accept test and residual must reproduce AR greedy."""
    g = jacobi.generate(tiny, spec_prompts, max_new_tokens=12, temperature=1.3, top_k=1,
                        generator=torch.Generator().manual_seed(0), eos_token_id=[], window=4)
    assert g.tokens == [r[:12] for r in spec_ar_free]

    def run(seed):
        return jacobi.generate(tiny, spec_prompts, max_new_tokens=8, temperature=0.9, top_p=0.95,
                               generator=torch.Generator().manual_seed(seed), window=3).tokens

    a = run(1)
    assert a == run(1) and a != run(2)


def accept_all(draft, p, q, u, valid):
    """Negative control: keep every guess (the output then copies the random initial guesses)."""
    rows = torch.arange(len(valid))
    return valid.clone(), sampling.sample_from_probs(p[rows, valid])


def trust_sjd_guesses(draft, p, q, u, valid):
    """Negative control, SJD guesses only: accept a guess drawn from p_old whenever p(x) > 0 (the ratio
    p / p_old is ignored); the random initial guesses (one-hot q) get the correct rule."""
    g = draft.shape[1]
    soft = q.amax(-1) < 1  # (b, g) guesses with a real p_old
    u = u.clone()
    u[:, :g] = torch.where(soft, torch.zeros_like(u[:, :g]), u[:, :g])
    return rejection_sample(draft, p, q, u, valid)


def residual_ignores_p_old(draft, p, q, u, valid):
    """Negative control, SJD guesses only: the correct accept test, but after a rejection draw from
    p without the rejected token (right for a one-hot q) instead of norm(max(0, p - p_old))."""
    n, nxt = rejection_sample(draft, p, q, u, valid)
    b, g = draft.shape
    rej = n < valid
    if g == 0 or not bool(rej.any()):
        return n, nxt
    rows = torch.arange(b)
    w = p[rows, n].clone()
    w[rows[rej], draft[rows, n.clamp(max=g - 1)][rej]] = 0
    w = w / w.sum(-1, keepdim=True)
    alt = (w.cumsum(-1) > u[:, g:g + 1]).long().argmax(-1)
    return n, torch.where(rej, alt, nxt)


class ShiftedPOld(jacobi.Jacobi):
    """Negative control (a proposer bug): each SJD guess carries the p_old of the position after it, so
    q is not the distribution the guess was drawn from."""

    def accept(self, v):
        super().accept(v)
        self.p_old = [qs[1:] + qs[-1:] for qs in self.p_old]


TOP_K, TEMP, SAMPLES, WINDOW = 5, 1.0, 1500, 4


def sjd_pvalue(tiny, prompt, exact, seed, rule=None, proposer=jacobi.Jacobi):
    g = sp.decode(tiny, proposer(WINDOW), [prompt] * SAMPLES, max_new_tokens=3, temperature=TEMP, top_k=TOP_K,
                  generator=torch.Generator().manual_seed(seed), eos_token_id=[], rule=rule)
    return first_two_pvalue(g.tokens, exact), g


@pytest.mark.parametrize("text,seed,controls", [
    ("Then", 8, [(accept_all, jacobi.Jacobi), (trust_sjd_guesses, jacobi.Jacobi),
                 (residual_ignores_p_old, jacobi.Jacobi)]),
    ("Then the", 9, [(trust_sjd_guesses, jacobi.Jacobi), (None, ShiftedPOld)]),
])
def test_sjd_is_lossless_and_wrong_rules_are_caught(tiny, text, seed, controls):
    """Chi-square on the first two tokens (top-5, T = 1; fixed seeds, 1,500 samples).

    The initial guesses (tokens of the context) are never in the top-5 here, so the first step always
    rejects and draws token 1, and the same call's prediction after the rejected guess, p_old, supplies
    the guess for token 2: the next step accepts it with min(1, p / p_old) or draws from the residual
    norm(max(0, p - p_old)). "Then": p_old(. | Then Then) is the first-token distribution, far from
    p(. | Then t), so the residual matters; "Then the": the two guesses' p_old differ, so a q taken from
    the wrong position shows. Measured, seeds 7-11: correct rule p = 0.005-0.49; accept-all p = 0;
    trust-the-guess p < 1e-35; residual-ignores-p_old ("Then") p < 2e-7; shifted p_old ("Then the")
    p < 5e-6 (2e-11 at seed 9)."""
    prompt = tiny.encode(text)
    exact = exact_first_two(tiny, prompt, TEMP, TOP_K)
    pvalue, g = sjd_pvalue(tiny, prompt, exact, seed)
    first, second = g.stats.accepted[0], g.stats.accepted[1]
    assert all(k == 0 for k in first), "step 1 rejects the initial guesses: token 2 is decided by an SJD guess"
    took = sum(k >= 1 for k in second) / SAMPLES  # SJD guesses accepted at step 2
    assert 0.05 < took < 0.95, "both branches of the SJD rule (accept p_old's draw, residual) must run"
    assert pvalue > 1e-3
    for rule, proposer in controls:
        bad, _ = sjd_pvalue(tiny, prompt, exact, seed, rule, proposer)
        assert bad < 1e-6, (rule or proposer).__name__
