# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 07 · Jacobi decoding: the model drafts for itself
#
# Chapters 02-06 needed a second model, a cut-down copy or extra heads to guess the next tokens.
# Jacobi decoding needs nothing but the target: guess a whole window of future tokens, let **one**
# forward pass correct all of them at once, keep what has stopped changing, repeat. Santilli et al.,
# *Accelerating Transformer Inference for Translation via Parallel Decoding* (arXiv 2305.10427, §3)
# showed that this is the classical Jacobi iteration applied to greedy decoding; Teng et al.,
# *Speculative Jacobi Decoding* (SJD, arXiv 2410.01699, §3.2) made it work with sampling by
# borrowing the acceptance rule of chapter 03.
#
# After this chapter:
#
# - you can write greedy decoding as a triangular system of equations and say why autoregressive
#   decoding is its Gauss–Seidel solve and Jacobi decoding its Jacobi solve;
# - you can explain why a Jacobi iteration fixes at least one token, and why its fixed point is
#   exactly the greedy output, whatever the initial guesses;
# - you can read a Jacobi trajectory and predict the fewest and the most target calls for `T`
#   tokens with a window of `n`;
# - you can explain why a small model rarely gets more than ~1.05–1.2 tokens per call from Jacobi,
#   and what consistency training (CLLMs) changes;
# - you can predict when speculative Jacobi decoding accepts a guess, how often it does on average,
#   and prove that its output is distributed exactly as the model's own samples.
#
# ## Parameters

# %%
import torch
from refimpl.models import default_device

FAST = True                        # CI default: few tokens, few samples
MODEL = "tiny"                     # any zoo name or local Hugging Face folder
DEVICE = default_device()          # a torch.device: CUDA when present, $REFIMPL_DEVICE overrides
PROMPTS = ["Blessed are the poor in spirit", "And God said, Let there be light",
           "The LORD is my shepherd; I shall not want. He maketh me", "In the beginning God created the heaven and the earth."]
WINDOW = 6                         # Jacobi window: guesses per iteration
NEW_TOKENS = 16 if FAST else 64
PICTURE_TOKENS = 16                # tokens in the trajectory pictures
WINDOWS = [1, 4, 12] if FAST else [1, 2, 4, 6, 8, 12, 16]
STAT_PROMPT = "Blessed are the"    # for speculative Jacobi: an uncertain next token
TEMPERATURE, TOP_K = 1.0, 4        # top-k keeps the statistical test small
SAMPLES = 400 if FAST else 5000
SEED = 0
SHOW_SOLUTIONS = False             # True prints the reference answer after each exercise check

# %% [markdown]
# ## Model and the answer we must reproduce
# The zoo's `tiny` (a 4-layer Llama trained on the King James Bible). Jacobi decoding is greedy
# decoding computed differently, so its output must equal `autoregressive.generate`'s token for
# token. `eos_token_id=[]` everywhere: never stop early, so lengths match.

# %%
import matplotlib.pyplot as plt
from refimpl import models, autoregressive, sampling
from refimpl.prompts import encode_prompt   # a user turn for a chat model, plain tokens otherwise
from solutions import exercise, check, show

lm = models.load(MODEL, device=DEVICE)
prompts = [encode_prompt(lm, t) for t in PROMPTS]
prompt = prompts[0]
greedy = autoregressive.generate(lm, [prompt], max_new_tokens=NEW_TOKENS, eos_token_id=[]).tokens[0]
print(lm.name, "|", len(prompt), "prompt tokens |", repr(PROMPTS[0] + lm.decode(greedy)))

# %% [markdown]
# ## Greedy decoding is a system of equations
# For a prompt `x`, the greedy continuation `y_1 .. y_n` is the solution of `n` equations
#
# $$y_i = f_i(y_1, \dots, y_{i-1}) := \arg\max_v \; p(v \mid x, y_1, \dots, y_{i-1}), \qquad i = 1, \dots, n.$$
#
# The system is **triangular**: `f_i` depends only on the unknowns before `i`. Two classical ways
# to solve it (Santilli et al., eq. 3-4):
#
# - **Gauss–Seidel**: sweep `i = 1 .. n`, each update using the values already updated in this
#   sweep. For a triangular system one sweep is exact: that is autoregressive decoding, `n` calls
#   of the model, each adding one position.
# - **Jacobi**: start from any guesses `y^(0)` and update **every** position from the previous
#   iterate, `y_i^(t+1) = f_i(y_1^(t), .., y_{i-1}^(t))`. A causal transformer computes all `n`
#   of these in **one** forward pass over `x, y_1^(t), .., y_n^(t)`: the logits after position
#   `i - 1` only see the tokens up to `i - 1`.
#
# Why at least one token per iteration: `f_1` has no unknowns, so `y_1` is right after iteration 1.
# If `y_1 .. y_t` are right after iteration `t`, then `y_{t+1}` is computed from right inputs in
# iteration `t + 1`. So after `t` iterations at least `t` positions are final, the iteration
# reaches a fixed point after at most `n` calls (never more calls than autoregressive decoding),
# and the fixed point is unique: forward substitution leaves only one solution, the greedy one.

# %% [markdown]
# ### Exercise 1: one parallel update
# Before reading on, write the update yourself: `jacobi_update(lm, prefix_ids, guesses)` returns
# `[argmax p(. | prefix, guesses[:i]) for i in range(len(guesses))]`, computed with **one** call of
# `lm.logits` over `prefix + guesses` (`lm.logits` maps a (1, L) tensor of ids to (1, L, V)
# logits). Mind the off-by-one: which logits row predicts guess `i`?

# %%
@exercise("07", "jacobi_update")
def jacobi_update(lm, prefix_ids, guesses):
    """One parallel Jacobi update: n guesses in, n updated guesses out, ONE call of lm.logits."""
    raise NotImplementedError  # your code here

# %% [markdown]
# The check compares your update with a brute-force loop (one model call per position), counts
# your forward passes, and tests that the greedy continuation is a fixed point of your update.

# %%
def check_update(fn):
    host = torch.Generator(device="cpu").manual_seed(SEED + 1)                     # random guesses, as a Python list
    guesses = torch.randint(0, lm.vocab_size, (5,), generator=host, device="cpu").tolist()
    calls, hook = [], lm.model.register_forward_hook(lambda *args: calls.append(1))   # counts forward passes
    try:
        new = [int(t) for t in fn(lm, prompt, guesses)]
    finally:
        hook.remove()
    brute = [int(lm.logits(torch.tensor([prompt + guesses[:i]], device=DEVICE))[0, -1].argmax()) for i in range(5)]
    assert len(new) == 5, f"one update per guess: 5 guesses in, 5 out (got {len(new)})"
    assert new[0] == greedy[0], "the first position sees only the prefix: its update is the greedy next token"
    assert new == brute, f"new[i] must be argmax p(. | prefix, guesses[:i]): expected {brute}, got {new}"
    assert len(calls) <= 1, f"a Jacobi update is ONE forward pass over prefix + guesses, you made {len(calls)}"
    assert [int(t) for t in fn(lm, prompt, greedy[:5])] == greedy[:5], "the greedy continuation must be a fixed point"

check("Exercise 1", lambda: check_update(jacobi_update))
if SHOW_SOLUTIONS: show("07", "jacobi_update")

# %% [markdown]
# ## The Jacobi iteration, by hand
# Our own update (the rest of the notebook uses this one, not the exercise) also keeps the logits
# after the **last** guess: the same call predicts one token past the window for free, so it
# returns `n + 1` values. First the pure iteration on a fixed window of `n = WINDOW` positions,
# from random tokens: the greedy output is a fixed point, and after `t` iterations at least `t`
# positions are final.

# %%
def parallel_argmax(prefix, guesses):
    """ONE causal call: argmax p(. | prefix, guesses[:i]) for i = 0 .. n  (n + 1 values)."""
    logits = lm.logits(torch.tensor([list(prefix) + list(guesses)], device=DEVICE))[0, len(prefix) - 1:]
    return logits.argmax(-1).tolist()


n = WINDOW
assert parallel_argmax(prompt, greedy[:n])[:n] == greedy[:n], "the greedy output is a fixed point"
y = torch.randint(0, lm.vocab_size, (n,), generator=torch.Generator(device="cpu").manual_seed(SEED), device="cpu").tolist()
for t in range(1, n + 1):
    y = parallel_argmax(prompt, y)[:n]                            # update ALL positions at once
    final = next((i for i in range(n) if y[i] != greedy[i]), n)   # leading positions already right
    print(f"iteration {t}: {final} of {n} final | {lm.decode(y)!r}")
    assert final >= t, "after t Jacobi iterations at least t positions are final"
assert y == greedy[:n]

# %% [markdown]
# ## A sliding window: commit the converged prefix
# Iterating a fixed block until *all* of it converges wastes calls; instead (as `refimpl.jacobi`
# does) keep a window of `n` guesses after the committed text and, after each call with updates
# `new[0..n]`:
#
# 1. let `k` = the number of leading guesses equal to their update (`guess[j] == new[j]` for
#    `j < k`): their contexts are all confirmed, so they are final;
# 2. `new[k]` is final as well (its context is the committed text plus `k` confirmed guesses):
#    **commit `new[:k + 1]`**, at least one token;
# 3. the rest, `new[k + 1:]`, are the next iteration's guesses (the Jacobi update), and fresh
#    guesses refill the end of the window: here tokens drawn uniformly from the context, as
#    `refimpl.jacobi` draws them. Any rule gives the same output; only the speed changes.
#
# No KV cache here: every call re-runs the whole text through `lm.logits`. `refimpl` keeps the
# cache and rolls it back past the rejected guesses, exactly as in chapter 02.

# %%
def random_context_tokens(ctx, have, k, gen):
    """k fresh guesses for the window's end: tokens drawn uniformly from the context."""
    return [ctx[i] for i in torch.randint(0, len(ctx), (k,), generator=gen, device="cpu").tolist()]

def jacobi_by_hand(prompt, n, max_new, seed=SEED, fresh=random_context_tokens):
    gen = torch.Generator(device="cpu").manual_seed(seed)     # on the host, as refimpl.jacobi: the same guesses on any device
    ctx, out, guess, trace = list(prompt), [], [], []
    while len(out) < max_new:
        w = min(n, max_new - len(out) - 1)                     # never guess past max_new
        keep = guess[:w]
        guess = keep + fresh(ctx, len(keep), w - len(keep), gen)
        new = parallel_argmax(ctx, guess)                      # one call: w + 1 updated values
        k = next((j for j in range(w) if guess[j] != new[j]), w)   # the converged prefix: guess == update
        trace.append((len(out), guess, new, k))
        ctx, out, guess = ctx + new[:k + 1], out + new[:k + 1], new[k + 1:]
    return out, trace

# %% [markdown]
# Run it: the output is the greedy output, and the call count tells the speed.

# %%
out, trace = jacobi_by_hand(prompt, WINDOW, NEW_TOKENS)
assert out == greedy, "the fixed point is the greedy output"
print(f"{NEW_TOKENS} tokens in {len(trace)} calls ({NEW_TOKENS / len(trace):.2f} tokens per call)")
print("tokens committed per call:", [k + 1 for *_, k in trace])

# %% [markdown]
# ## A Jacobi trajectory
# One row per iteration (= one target call), one column per generated position. Each row shows
# the window **after** the call: green cells are committed by this call, blue cells already agree
# with their previous guess but are not final yet (something before them changed), salmon cells
# changed (or are the free prediction one past the window), grey is text committed earlier.
# Below, the real run on the first prompt: where the green step is wider than one cell, a call
# committed guesses made one or more iterations earlier.

# %%
from matplotlib.patches import Patch, Rectangle

COLOURS = {"committed now": "#74c69d", "unchanged, not final": "#a0c4ff", "changed / new": "#ffb4a2", "committed before": "#dee2e6"}

def draw_trajectory(trace, ax):
    for t, (start, guess, new, k) in enumerate(trace):
        ax.add_patch(Rectangle((0, t), start, 1, color=COLOURS["committed before"]))
        for j, tok in enumerate(new):
            kind = "committed now" if j <= k else "unchanged, not final" if j < len(guess) and guess[j] == tok else "changed / new"
            ax.add_patch(Rectangle((start + j, t), 1, 1, facecolor=COLOURS[kind], edgecolor="white"))
            ax.text(start + j + 0.5, t + 0.5, lm.decode([tok]).strip()[:7], ha="center", va="center", fontsize=6)
    ax.set(xlim=(0, max(s + len(nw) for s, _, nw, _ in trace)), ylim=(len(trace), 0), xlabel="generated position", ylabel="iteration (target call)")
    ax.legend(handles=[Patch(color=c, label=l) for l, c in COLOURS.items()], fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))

_, pic = jacobi_by_hand(prompt, WINDOW, PICTURE_TOKENS)
fig, ax = plt.subplots(figsize=(11, 4.8))
draw_trajectory(pic, ax); ax.set_title(f"greedy Jacobi, window {WINDOW}: {PROMPTS[0]!r}")
plt.tight_layout(); plt.show()

# %% [markdown]
# ### Exercise 2: a prediction
# With a window of `n` guesses, what are the **fewest** and the **most** target calls greedy Jacobi
# (the sliding window above) can need for `T` new tokens? Write `jacobi_call_bounds(T, n)` returning
# `(fewest, most)`. Hint: how many tokens can one call commit at most, and at least?

# %%
@exercise("07", "jacobi_call_bounds")
def jacobi_call_bounds(new_tokens, window):
    """-> (fewest, most) target calls for new_tokens tokens with window guesses per call."""
    raise NotImplementedError  # your prediction here

# %% [markdown]
# The check runs the hand-built loop with **perfect** guesses (the greedy answer itself, the best
# case) and with the usual random ones, and holds your bounds against both.

# %%
def check_bounds(fn):
    perfect = lambda ctx, have, k, gen: greedy[len(ctx) - len(prompt) + have:][:k]   # the answer itself
    for T, n in [(NEW_TOKENS, WINDOW), (NEW_TOKENS, 1), (10, 3)]:
        lo, hi = fn(T, n)
        best = len(jacobi_by_hand(prompt, n, T, fresh=perfect)[1])
        real = len(jacobi_by_hand(prompt, n, T)[1])
        assert lo == best, f"T={T}, n={n}: perfect guesses take {best} calls, not {lo}"
        assert lo <= real <= hi, f"T={T}, n={n}: a real run took {real} calls, outside ({lo}, {hi})"
        assert hi == T, f"T={T}, n={n}: one call commits at least one token, so the most is T = {T}, not {hi}"


check("Exercise 2", lambda: check_bounds(jacobi_call_bounds))
if SHOW_SOLUTIONS: show("07", "jacobi_call_bounds")

# %% [markdown]
# ## The guesses change the speed, never the output
# Three refill rules: random context tokens, a constant token, and the answer itself (an oracle,
# the best any drafter could do). All three give the greedy output; only the call count differs.
# Perfect guesses commit `n + 1` tokens per call (the `n` guesses and the token after them).

# %%
rules = {"random context tokens": random_context_tokens,
         "always the first prompt token": lambda ctx, have, k, gen: [prompt[0]] * k,
         "perfect (the answer itself)": lambda ctx, have, k, gen: greedy[len(ctx) - len(prompt) + have:][:k]}
for name, rule in rules.items():
    o, tr = jacobi_by_hand(prompt, WINDOW, NEW_TOKENS, fresh=rule)
    assert o == greedy, name
    print(f"{name:30s} {len(tr):3d} calls for {NEW_TOKENS} tokens")
assert len(tr) == -(-NEW_TOKENS // (WINDOW + 1)), "perfect guesses: n + 1 tokens per call"

# %% [markdown]
# ## `refimpl.jacobi`
# The library's version is a *proposer* on the verification core of chapter 02
# (`speculative.decode`): each call scores `[last committed token, guesses]` with the KV cache,
# the core accepts the converged prefix plus the next token, and the proposer turns the same call's
# logits (`Verdict.logits`) past the accepted ones into the next guesses. Same initial guesses
# (uniform context tokens from a generator seeded with `seed`) means the very same run as ours.

# %%
from refimpl import jacobi

r = jacobi.generate(lm, [prompt], max_new_tokens=NEW_TOKENS, window=WINDOW, seed=SEED, eos_token_id=[])
assert r.tokens[0] == out == greedy, "refimpl.jacobi == by hand == autoregressive greedy"
assert r.stats.target_calls == len(trace), "same guesses, same commits, same number of calls"
assert [a[0] for a in r.stats.accepted] == [k for *_, k in trace], "the same guesses accepted at every call"
print(f"tau = {r.stats.tau:.3f} tokens per call = {1 / r.stats.tau:.3f} iterations per token")

# %% [markdown]
# ## Iterations per token against the window
# `stats.tau` is tokens per target call, so `1 / tau` is Jacobi iterations per token: 1 for
# autoregressive decoding, `1 / (n + 1)` with perfect guesses. A batch of prompts, one run per window.

# %%
batch = prompts[:2] if FAST else prompts
per_token = []
for w in WINDOWS:
    res = jacobi.generate(lm, batch, max_new_tokens=NEW_TOKENS, window=w, seed=SEED, eos_token_id=[])
    per_token.append(1 / res.stats.tau)
    print(f"window {w:2d}: {1 / res.stats.tau:.3f} iterations per token ({res.stats.tau:.3f} tokens per call)")
assert all(1 / (w + 1) - 1e-9 <= v <= 1 + 1e-9 for w, v in zip(WINDOWS, per_token))
fig, ax = plt.subplots(figsize=(5.5, 3))
ax.plot(WINDOWS, per_token, "o-", label=f"Jacobi on {lm.name}")
ax.plot(WINDOWS, [1 / (w + 1) for w in WINDOWS], "s--", label="perfect guesses: 1 / (n + 1)")
ax.axhline(1, color="gray", lw=0.8, label="autoregressive")
ax.set(xlabel="window n", ylabel="iterations per token", ylim=(0, 1.05)); ax.legend(fontsize=8)
plt.tight_layout(); plt.show()

# %% [markdown]
# ## Why so little, and what CLLMs change
# Honestly: on a small, weak model Jacobi decoding rarely gets more than ~1.05–1.2 tokens per call,
# and a bigger window barely helps. A guess `j` positions past the committed text was computed from
# a context holding the previous iteration's guesses, which were themselves mostly wrong. For it to
# be right anyway, the model must predict the same token **despite** a wrong token before it; a
# small model leans heavily on the previous token, so one wrong early guess poisons every later
# one, and the extra guesses of a wider window are the most poisoned.
#
# Santilli et al. report up to 38% on machine translation, where the source sentence pins the
# output down. The papers that go further change the **model** or what is done with
# the trajectory, not the iteration:
#
# - **CLLMs** (*Consistency Large Language Models*, Kou et al.) fine-tune the model so that any
#   state on a Jacobi trajectory maps straight to the fixed point (a consistency loss, plus the
#   usual AR loss to keep quality): many tokens converge per call, 2.4×–3.4×. *Jacobi Forcing*
#   reports 3.8×.
# - **Lookahead decoding** (chapter 08) keeps several Jacobi trajectories in the same forward pass,
#   harvests the n-grams they produce into a pool, and verifies pooled n-grams: exact, 1.8× on
#   MT-bench.
#
# Below, the poisoning measured: how often the greedy token survives when only the token just
# before it is replaced by the model's runner-up there (a *plausible* mistake; the stale guesses of
# a real run are usually worse). About one in four: a guess two positions out is usually lost.

# %%
survived, total = 0, 0
for p_ids in prompts:
    g_ids = autoregressive.generate(lm, [p_ids], max_new_tokens=NEW_TOKENS, eos_token_id=[]).tokens[0]
    L, T = len(p_ids), len(g_ids)
    seq = torch.tensor([p_ids + g_ids], device=DEVICE)
    runner_up = lm.logits(seq)[0, L - 1: L + T - 2].topk(2).indices[:, 1]      # at generated positions 0 .. T-2
    rows, pos = torch.arange(T - 1, device=DEVICE), L + torch.arange(T - 1, device=DEVICE)
    wrong = seq.repeat(T - 1, 1)
    wrong[rows, pos] = runner_up                                               # row i: token i made wrong
    after = lm.logits(wrong).argmax(-1)[rows, pos]                             # prediction for token i + 1
    survived += int((after == torch.tensor(g_ids[1:], device=after.device)).sum()); total += T - 1
print(f"the next greedy token survives a wrong token before it in {survived / total:.0%} of {total} positions")

# %% [markdown]
# ## Speculative Jacobi decoding: Jacobi for sampling
# With sampling there is no "converged" guess to test: a fresh sample rarely equals the previous
# one even when nothing changed. SJD (Teng et al., §3.2; the rule as in their code):
#
# - each guess `x` at window position `i` was **drawn** at the last iteration from
#   `p_old = p(. | committed, old guesses before i)`, and `p_old` is remembered;
# - this iteration gives `p_new = p(. | committed, current guesses before i)`; left to right,
#   accept `x` with probability `min(1, p_new(x) / p_old(x))`;
# - at the first rejection, draw from the residual `norm(max(0, p_new - p_old))` and stop; if every
#   guess was accepted, draw a bonus token from the next `p_new`;
# - the next guesses are **sampled** from this call's `p_new` past the accepted ones (and their
#   `p_new` becomes their `p_old`); random initial tokens count as one-hot drafts: `p_old = 1` at
#   `x`, so `x` is accepted with probability `p_new(x)`.
#
# ### Exercise 3: when is a guess accepted?
# A guess is drawn from `p_old`, then tested against `p_new`. Write `sjd_accept_prob(p_new, p_old)`:
# the probability (before `x` is drawn) that SJD accepts it, as a float. Then predict, without
# running anything: what is it for a random initial token `x` (one-hot `p_old`), and for
# `p_old == p_new`?

# %%
@exercise("07", "sjd_accept_prob")
def sjd_accept_prob(p_new, p_old):
    """P(the guess x ~ p_old is accepted under min(1, p_new(x) / p_old(x)))."""
    raise NotImplementedError  # your code here

# %% [markdown]
# The check simulates the rule on a real pair of distributions from `tiny`: the next-next token
# after `STAT_PROMPT` + its likeliest next token (`p_new`), and after the runner-up (`p_old`, as if
# the last iteration had guessed the runner-up).

# %%
def check_accept(fn):
    ctx = encode_prompt(lm, STAT_PROMPT)
    top2 = lm.logits(torch.tensor([ctx], device=DEVICE))[0, -1].topk(2).indices.tolist()
    p_new, p_old = sampling.probs(lm.logits(torch.tensor([ctx + [t] for t in top2], device=DEVICE))[:, -1], TEMPERATURE)
    gen = torch.Generator(device=DEVICE).manual_seed(SEED)                            # draws next to p_old
    x = torch.multinomial(p_old, 20000, replacement=True, generator=gen)              # guesses ~ p_old
    sim = (torch.rand(20000, generator=gen, device=DEVICE) * p_old[x] < p_new[x]).float().mean().item()   # u < p_new / p_old
    got = float(fn(p_new, p_old))
    assert abs(got - sim) < 0.02, f"simulating the rule accepts {sim:.3f} of the guesses, you say {got:.3f}"
    one_hot = torch.nn.functional.one_hot(torch.tensor(top2[1], device=DEVICE), p_new.numel()).float()
    assert abs(float(fn(p_new, one_hot)) - float(p_new[top2[1]])) < 1e-5, "a one-hot guess x is accepted with p_new(x)"
    assert abs(float(fn(p_new, p_new)) - 1) < 1e-5, "when nothing changed (p_old == p_new) every guess is accepted"

check("Exercise 3", lambda: check_accept(sjd_accept_prob))
if SHOW_SOLUTIONS: show("07", "sjd_accept_prob")

# %% [markdown]
# ## Why SJD is lossless
# Fix a position `i` whose earlier guesses were all accepted, so its context is exactly the
# committed text `c` and `p := p_new = p(. | c)` is the model's true next-token distribution. Its
# guess `x` was drawn from `q := p_old`, independently of everything the tests at positions `< i`
# looked at (a causal model's `p_new` before `i` never sees `x`), so given `c`, `x ~ q` still. That
# is **speculative sampling with draft `q = p_old`** (chapter 03): with `beta = sum_y min(p(y), q(y))`,
#
# $$P(\text{emit } y) = q(y)\min\!\Big(1, \tfrac{p(y)}{q(y)}\Big) + (1-\beta)\,\frac{\max(0, p(y)-q(y))}{\sum_z \max(0, p(z)-q(z))} = \min(p(y), q(y)) + \max(0, p(y) - q(y)) = p(y),$$
#
# because `sum_z max(0, p(z) - q(z)) = 1 - beta`. It holds for **every** `q`, so it does not matter
# that `p_old` came from a stale, partly wrong context; induction over positions gives the whole
# sequence. In particular a one-hot `q` (a random initial token, or any fixed guess) is lossless
# too: `P(accept) = p(x)`, and the residual is `p` with `x` removed. Remembering `p_old` only buys
# speed: the acceptance becomes `sum min(p_new, p_old)` instead of `sum p_old(x) p_new(x)`.
#
# Exactly, on the pair of distributions of exercise 3: the emitted distribution of the SJD rule,
# of a fixed (one-hot) guess, and of a tempting mistake, "after a rejection, sample from `p_new`".

# %%
ctx = encode_prompt(lm, STAT_PROMPT)
top2 = lm.logits(torch.tensor([ctx], device=DEVICE))[0, -1].topk(2).indices.tolist()
p_new, p_old = sampling.probs(lm.logits(torch.tensor([ctx + [t] for t in top2], device=DEVICE))[:, -1], TEMPERATURE).double()

def emitted(p, q, after_rejection="residual"):      # exact P(emit y) when the guess x ~ q
    accept = torch.where(q > 0, (p / q).clamp(max=1), torch.zeros_like(p))       # P(accept | x)
    after = (p - q).clamp(min=0) if after_rejection == "residual" else p
    return q * accept + (q * (1 - accept)).sum() * after / after.sum()

fixed = torch.nn.functional.one_hot(torch.tensor(top2[1], device=DEVICE), p_new.numel()).double()
cases = {"SJD, q = p_old": emitted(p_new, p_old), "a fixed guess, one-hot q": emitted(p_new, fixed),
         "WRONG: resample from p_new": emitted(p_new, p_old, "p_new")}
for name, e in cases.items():
    print(f"{name:28s} total variation to p_new = {0.5 * float((e - p_new).abs().sum()):.1e}")
print(f"P(accept) remembering p_old {float(torch.minimum(p_new, p_old).sum()):.3f}, one-hot {float((p_old * p_new).sum()):.3f}")
tv = [0.5 * float((e - p_new).abs().sum()) for e in cases.values()]
assert tv[0] < 1e-6 and tv[1] < 1e-6 and tv[2] > 0.01, "SJD and fixed guesses are exact, the mistake is not"

# %% [markdown]
# ## A statistical check of `refimpl.jacobi` sampling
# Now the implementation. With `top_k = TOP_K` every token has at most `TOP_K` possible values, so
# the exact joint distribution of the **first two** tokens after `STAT_PROMPT` has at most
# `TOP_K²` cells: `p(t1) p(t2 | t1)`, from two model calls.

# %%
stat_ids = encode_prompt(lm, STAT_PROMPT)
p1 = sampling.probs(lm.logits(torch.tensor([stat_ids], device=DEVICE))[0, -1], TEMPERATURE, top_k=TOP_K)
firsts = p1.nonzero()[:, 0].tolist()
p2 = sampling.probs(lm.logits(torch.tensor([stat_ids + [t] for t in firsts], device=DEVICE))[:, -1], TEMPERATURE, top_k=TOP_K)
exact = {(a, b): float(p1[a] * p2[i, b]) for i, a in enumerate(firsts) for b in p2[i].nonzero()[:, 0].tolist()}
likeliest = sorted(exact, key=exact.get, reverse=True)[:4]
print(len(exact), "possible pairs; likeliest:", [(lm.decode(list(c)), round(exact[c], 3)) for c in likeliest])

# %% [markdown]
# Sample `SAMPLES` continuations of `WINDOW` tokens as one batch (every row has its own
# randomness). `jacobi.generate` is `speculative.decode` with a `jacobi.Jacobi` proposer; on a CPU
# we pass the rejection kernel's torch reference as the rule, which makes the same draws as the
# kernel (chapter 03) without the slow Triton interpreter. First: that is the same run, draw for draw.

# %%
from refimpl import speculative
from kernels.rejection_sample import rejection_sample_reference

opts = dict(max_new_tokens=WINDOW, temperature=TEMPERATURE, top_k=TOP_K, eos_token_id=[])
rule = None if DEVICE.type == "cuda" else rejection_sample_reference
seeded = lambda s: torch.Generator(device=DEVICE).manual_seed(s)   # SJD draws where the model's probabilities are
few = jacobi.generate(lm, [stat_ids] * 8, window=WINDOW, seed=SEED, generator=seeded(SEED), **opts)
same = speculative.decode(lm, jacobi.Jacobi(WINDOW, SEED), [stat_ids] * 8, generator=seeded(SEED), rule=rule, **opts)
assert few.tokens == same.tokens, "jacobi.generate runs speculative.decode with the Jacobi proposer"
sjd = speculative.decode(lm, jacobi.Jacobi(WINDOW, SEED), [stat_ids] * SAMPLES, generator=seeded(SEED + 1), rule=rule, **opts)
acc = sjd.stats.accepted                      # acc[call][row]: guesses accepted
via_p_old = sum(acc[0][b] == 0 and acc[1][b] >= 1 for b in range(SAMPLES)) / SAMPLES
print(f"tau {sjd.stats.tau:.3f}; second token = an accepted guess drawn from p_old in {via_p_old:.0%} of rows")

# %% [markdown]
# A chi-square test of the pair counts against `exact` (cells expected to get fewer than 5 samples
# are pooled into one, as in chapter 03). A sample outside the top-k support would fail at once.

# %%
from scipy.stats import chisquare

cells = list(exact)
pairs = [tuple(t[:2]) for t in sjd.tokens]
assert all(pr in exact for pr in pairs), "a pair the top-k model cannot produce"
counts = torch.tensor([pairs.count(c) for c in cells], dtype=torch.float64, device="cpu")            # host counts for scipy
expect = torch.tensor([exact[c] for c in cells], dtype=torch.float64, device="cpu") * SAMPLES
big = expect >= 5
obs = torch.cat([counts[big], counts[~big].sum()[None]])
exp_ = torch.cat([expect[big], expect[~big].sum()[None]])
pvalue = chisquare(obs[exp_ > 0], exp_[exp_ > 0] / exp_[exp_ > 0].sum() * obs.sum()).pvalue
print(f"chi-square over {len(cells)} pairs ({int(big.sum())} unpooled): p-value {pvalue:.3f}")
assert pvalue > 1e-3, "speculative Jacobi samples must follow the model's own distribution"

# %% [markdown]
# ## Play: window, prompt and seed
# The trajectory picture for any setting: `window` guesses per call, `prompt` an index into
# `PROMPTS`, `seed` the random initial guesses. The committed tokens never change (greedy output);
# which call commits which token does. Move the sliders in a live notebook; the cell then checks
# that moving two of them changes the picture.

# %%
import ipywidgets as widgets

def trajectory(window=WINDOW, prompt=0, seed=SEED):
    global shown
    _, shown = jacobi_by_hand(prompts[prompt], window, PICTURE_TOKENS, seed=seed)
    fig, ax = plt.subplots(figsize=(11, 4.5))
    draw_trajectory(shown, ax)
    ax.set_title(f"window {window}, seed {seed}, {PROMPTS[prompt]!r}: {PICTURE_TOKENS / len(shown):.2f} tokens per call")
    plt.tight_layout(); plt.show()

widgets.interact(trajectory, window=widgets.IntSlider(continuous_update=False, value=WINDOW, min=1, max=12),
                 prompt=widgets.IntSlider(continuous_update=False, value=0, min=0, max=len(PROMPTS) - 1), seed=widgets.IntSlider(continuous_update=False, value=SEED, min=0, max=20))
before = shown
trajectory(window=2, prompt=1)
assert shown != before, "moving the sliders changes the trajectory"

# %% [markdown]
# ## What to remember
# - Greedy decoding solves a triangular system; autoregressive decoding is its Gauss–Seidel sweep,
#   Jacobi decoding updates every position in one causal forward pass. At least one token is final
#   per call, the fixed point is the greedy output, the guesses only change the speed: between
#   `ceil(T / (n + 1))` and `T` calls.
# - On a model that was not trained for it, a wrong early guess poisons the later ones and Jacobi
#   gains a few percent; CLLMs train the model to jump to the fixed point, lookahead decoding
#   (chapter 08) harvests n-grams from the trajectories instead.
# - Speculative Jacobi decoding is speculative sampling with the model's own previous iteration as
#   the draft: accept with `min(1, p_new / p_old)`, residual at the first rejection, lossless for
#   any `p_old`; remembering `p_old` raises the acceptance to `sum min(p_new, p_old)`.
# - `jacobi.generate(target, prompts)` runs `jacobi.PRESETS["cpu"]` (a window of 8): on a model not
#   trained for it a wider window only makes each call dearer.
