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
# # 04b · Adaptive gamma and the copy prior
#
# Chapter 04a fixed the number of drafts per step, `gamma`. But a draft is sure of some tokens
# (the end of a common phrase) and guessing at others, and a fixed `gamma` keeps drafting either
# way. This chapter lets the draft length change from step to step, first from the draft's own
# confidence, then from a bandit that learns which `gamma` pays. Then it looks at the one thing
# small drafts are bad at and targets are good at: copying from the context.
#
# Notation as in 04a: `alpha` is the probability that one draft token is accepted (what the
# `tau` formula takes); the **acceptance rate** is what a run measures, accepted / proposed drafts.
#
# **After this chapter you can**
#
# 1. predict where a confidence rule stops drafting, and write the cumulative rule yourself;
# 2. write the UCB1 update that picks `gamma` from the tokens-per-cost of past steps;
# 3. tell from counted calls and the cost ratio `c` when adaptive `gamma` beats the best fixed one;
# 4. explain what an induction head does, measure whether a model copies, and add a copy prior to any
#    draft without changing the output.
#
# **Parameters** (next cell): `FAST = True` keeps every step small enough for CI on a CPU.

# %%
import torch
from refimpl.models import default_device

FAST = True                            # CI default: short generations, one prompt per category
TARGET, DRAFT = "tiny", "tiny-draft"   # the adaptive-gamma part
COPY_TARGET, COPY_DRAFT = "smollm2-135m", "smollm2-135m-draft"   # the copy part: a target that copies
DEVICE = default_device()              # a torch.device: CUDA when present, $REFIMPL_DEVICE overrides
NEW_TOKENS = 32 if FAST else 128
COPY_TOKENS = 16 if FAST else 64
SHOW_SOLUTIONS = False

# %% [markdown]
# ## Imports, models, prompts
# Greedy autoregressive decoding (`ref`) is the ground truth every greedy run below reproduces.
# `c` is the draft's cost ratio measured on this machine (chapter 04a).

# %%
import matplotlib.pyplot as plt
from refimpl import models, drafts, speculative, adaptive, autoregressive
from refimpl.prompts import encode_prompt, prompt_set
from solutions import exercise, check, show, answers_on
from figures import draw_rounds, rounds_legend
import kernels

torch.set_grad_enabled(False)
target, draft = models.load(TARGET, device=DEVICE), models.load(DRAFT, device=DEVICE)
texts = ["And God said", "In the beginning God created the heaven", "Jesus answered and said unto them,",
         "The LORD is my shepherd", "And it came to pass, when"]
prompts = [encode_prompt(target, t) for t in (texts[:3] if FAST else texts)]
ref = autoregressive.generate(target, prompts, max_new_tokens=NEW_TOKENS)
c = drafts.cost_ratio(target, draft, repeats=1 if FAST else 3)
print(f"{DRAFT} on {TARGET}: c = {c:.2f}")

# %% [markdown]
# ## Part 1 · Does the draft know when it is guessing?
# Along the target's greedy text, for every position: the draft's top-1 probability `max q` and
# whether its argmax is the target's token. If high `max q` goes with agreement, `max q` is a
# free signal to stop drafting on.

# %%
ids = torch.tensor([prompts[0] + ref.tokens[0]], device=DEVICE)                  # (1, T)
q = torch.softmax(draft.logits(ids)[0, len(prompts[0]) - 1:-1], -1)             # (N, V) predicts each new token
conf = q.amax(-1).cpu()                                                           # (N,) max q; matplotlib plots host arrays
agrees = (q.argmax(-1) == torch.tensor(ref.tokens[0], device=q.device)).tolist()
fig, ax = plt.subplots(figsize=(8, 2.8))
ax.bar(range(len(conf)), conf, color=["#52b788" if a else "#e76f51" for a in agrees])
ax.axhline(0.3, color="k", ls="--", lw=0.8, label="a threshold")
ax.set_xticks(range(len(conf)), [target.decode([t]) for t in ref.tokens[0]], rotation=90, fontsize=7)
ax.set_ylabel("draft's max q"); ax.set_title("green: draft's argmax = target's token, red: not", fontsize=9)
ax.legend(fontsize=7); plt.tight_layout(); plt.show()

# %% [markdown]
# ## Stopping when unsure, by hand
# SpecDec++ (arXiv 2405.19715) stops drafting once the chance that *some* draft of the round is
# rejected gets high; it trains a head for that chance. The training-free version uses `max q`:
# draft a token, and stop after it when `max q < threshold` (it is still proposed: it has been
# paid for), or after `max_gamma` tokens. One round, by hand:

# %%
def draft_round_by_hand(draft, context, threshold, max_gamma):
    out, confs, cache, feed = [], [], None, torch.tensor([context], device=DEVICE)
    for _ in range(max_gamma):
        logits, cache = draft.forward(feed, cache)
        q = torch.softmax(logits[0, -1], -1)
        out.append(int(q.argmax())); confs.append(float(q.max()))
        if confs[-1] < threshold:
            break                                  # unsure: this token is proposed, then stop
        feed = torch.tensor([[out[-1]]], device=DEVICE)
    return out, confs


for th in (0.05, 0.3, 0.6):
    print(f"threshold {th}: round lengths", [len(draft_round_by_hand(draft, p, th, 8)[0]) for p in prompts])

# %% [markdown]
# ## `refimpl.adaptive`: the same rule inside speculative decoding
# `adaptive.generate(..., policy="threshold")` runs this rule on the shared verification loop;
# greedy output is still exactly the target's. `stats.extra["gammas"]` lists each step's draft
# length; the first must equal our round's.

# %%
for th in (0.05, 0.3, 0.6):
    g = adaptive.generate(target, prompts, draft=draft, policy="threshold", max_gamma=8, threshold=th,
                          max_new_tokens=NEW_TOKENS)
    assert g.tokens == ref.tokens
    for p in prompts:
        one = adaptive.generate(target, [p], draft=draft, policy="threshold", max_gamma=8, threshold=th,
                                max_new_tokens=9)  # one round
        assert one.stats.extra["gammas"][0] == len(draft_round_by_hand(draft, p, th, 8)[0])
    print(f"threshold {th}: mean gamma {g.stats.extra['mean_gamma']:.2f}, "
          f"acceptance rate {g.stats.alpha:.2f}, tau {g.stats.tau:.2f}")

# %% [markdown]
# **Exercise 1.** The rule above looks at one token. SpecDec++ bounds the chance that the *round*
# fails: with `max q` as the chance each draft is accepted, the product of the round's `max q` so
# far estimates P(every draft so far accepted). Write `cumulative_round(draft, context,
# threshold, max_gamma)`: draft like `draft_round_by_hand`, but stop after the token at which that
# product falls below `threshold`. Return the drafted tokens. The check compares the length with
# the first step of `adaptive.generate(..., policy="cumulative")`.

# %%
@exercise("04b", "cumulative_round")
def cumulative_round(draft, context, threshold, max_gamma):
    # your code here
    raise NotImplementedError

# %% [markdown]
# The check (its negative control: the one-token rule above gives other lengths somewhere):

# %%
def check_cumulative():
    cases, differs = [(p, th) for p in prompts for th in (0.05, 0.2, 0.5)], False
    for p, th in cases:
        lib = adaptive.generate(target, [p], draft=draft, max_gamma=8, threshold=th, policy="cumulative",
                                max_new_tokens=9).stats.extra["gammas"][0]   # 9: room for one round of 8
        mine = cumulative_round(draft, p, th, 8)
        assert len(mine) == lib, f"threshold {th}: you drafted {len(mine)} tokens, policy='cumulative' drafts {lib}"
        assert mine == draft_round_by_hand(draft, p, 0.0, lib)[0], "the drafted tokens should be the draft's argmax"
        differs |= len(draft_round_by_hand(draft, p, th, 8)[0]) != lib
    assert differs, "negative control: the one-token rule should differ from the cumulative one"


check("Exercise 1", check_cumulative)
if SHOW_SOLUTIONS:
    show("04b", "cumulative_round")

# %% [markdown]
# ## Adaptive vs the best fixed gamma
# We decode each prompt alone (batch 1) and count calls. Cost per token in target-call units is
# `(target calls + c·draft calls) / tokens`: deterministic, no timing noise, and we can read it
# for any `c` (ours on this CPU, or a GPU-like one) from the same runs.

# %%
def counts(fn):
    with kernels.references():          # counts, not timings: the kernels' torch references on a CPU, same calls
        gs = [fn(p).stats for p in prompts]
    return [sum(s.target_calls for s in gs), sum(s.draft_calls for s in gs), sum(s.new_tokens for s in gs)]


fixed = {gm: counts(lambda p: speculative.generate(target, [p], draft=draft, gamma=gm, max_new_tokens=NEW_TOKENS))
         for gm in (1, 2, 3, 4, 6, 8)}
adapt = {(pol, th): counts(lambda p: adaptive.generate(target, [p], draft=draft, max_gamma=8, threshold=th, policy=pol,
                                                       max_new_tokens=NEW_TOKENS))
         for pol, th in [("cumulative", 0.02), ("cumulative", 0.05), ("cumulative", 0.1), ("cumulative", 0.2),
                         ("threshold", 0.3)]}
cost = lambda n, c_: (n[0] + c_ * n[1]) / n[2]

# %% [markdown]
# ## Which wins, and when?
# For each `c`, the best fixed gamma against the best adaptive setting (lower cost is better).
# A cheap draft (small `c`) wants long rounds; an expensive one wants short rounds. On this CPU
# `c` of a 1-layer draft is large (per-call overheads), which leaves little to win.

# %%
cs = [0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.6, 0.8]
ratio = [min(cost(n, c_) for n in fixed.values()) / min(cost(n, c_) for n in adapt.values()) for c_ in cs]
plt.figure(figsize=(5.5, 3)); plt.plot(cs, ratio, "o-"); plt.axhline(1, color="gray", lw=0.8)
plt.axvline(c, color="tab:red", ls="--", label=f"measured c = {c:.2f}")
plt.xlabel("c"); plt.ylabel("best fixed / best adaptive cost"); plt.title("above 1: adaptive wins", fontsize=9)
plt.legend(); plt.show()
for c_ in (c, 0.05):
    bf, ba = min(fixed, key=lambda k: cost(fixed[k], c_)), min(adapt, key=lambda k: cost(adapt[k], c_))
    print(f"c={c_:.2f}: best fixed gamma={bf} {cost(fixed[bf], c_):.3f} | best adaptive {ba} {cost(adapt[ba], c_):.3f}")

# %% [markdown]
# What the rounds look like, on one prompt, for the best fixed `gamma` and the best adaptive
# setting at the `c` where adaptive gains most in the plot above. Each bar is one target call:
# accepted drafts (green), drafted and thrown away (red), the target's own token on top. The
# adaptive rounds are long where the draft is sure and short where it is not; at a very small
# `c` red costs almost nothing and long fixed rounds win.

# %%
def rounds_of(stats):
    return [(a[0], g) for a, g in zip(stats.accepted, stats.extra["gammas"])]


c_show = cs[max(range(len(cs)), key=ratio.__getitem__)]                 # where adaptive gains most
bf, (pol, th) = min(fixed, key=lambda k: cost(fixed[k], c_show)), min(adapt, key=lambda k: cost(adapt[k], c_show))
g_fix = speculative.generate(target, prompts[:1], draft=draft, gamma=bf, max_new_tokens=NEW_TOKENS)
g_ad = adaptive.generate(target, prompts[:1], draft=draft, max_gamma=8, threshold=th, policy=pol, max_new_tokens=NEW_TOKENS)
fig, axes = plt.subplots(1, 2, figsize=(11, 2.8), sharey=True)
for ax, g_, name in ((axes[0], g_fix, f"fixed gamma = {bf}"), (axes[1], g_ad, f"{pol}, threshold {th}")):
    n_ = [g_.stats.target_calls, g_.stats.draft_calls, g_.stats.new_tokens]
    draw_rounds(ax, rounds_of(g_.stats), f"{name}: cost/token {cost(n_, c_show):.2f} at c = {c_show}", ymax=9)
rounds_legend(axes[1]); plt.tight_layout(); plt.show()

# %% [markdown]
# ## Part 2 · A bandit over gamma
# A confidence rule needs a calibrated draft. BanditSpec (arXiv 2505.15141) needs none: it treats
# each `gamma` in {1, 2, 4, 6, 8} as an arm of a bandit and learns from past steps which pays.
# After a step that drafted `gamma` tokens and emitted `n + 1`, the reward is tokens per unit of
# cost, `(n + 1) / (1 + gamma·c)`, divided by its best possible value `max over arms of
# (g + 1) / (1 + g·c)` so that it lies in [0, 1]. UCB1 (Auer et al., 2002) first plays every arm
# once, then plays the arm with the highest `mean reward + sqrt(2 ln t / n_arm)` (`t` = steps so
# far, `n_arm` = times this arm was played): the second term is large for arms tried rarely.
# The expected reward of each arm in a world of i.i.d. acceptance, for our `c`, and a simulation
# of that world that drives any bandit for a number of steps (the check below uses it):

# %%
def expected_reward(alpha, gamma, c_, gammas=(1, 2, 4, 6, 8)):
    best = max((g + 1) / (1 + g * c_) for g in gammas)
    return drafts.expected_tau(alpha, gamma) / (1 + gamma * c_) / best

def simulate(bandit, steps=300, alpha=0.7, seed=0):
    gen, chosen = torch.Generator(device="cpu").manual_seed(seed), []              # a host-side simulation
    for _ in range(steps):
        gm = bandit.cap()
        n = int((torch.rand(gm, generator=gen, device="cpu") < alpha).long().cumprod(0).sum())   # accepted drafts
        bandit.update(n + 1, gm); chosen.append(gm)
    return chosen


for a in (0.5, 0.7, 0.9):
    print(f"alpha={a}:", {gm: round(expected_reward(a, gm, c), 3) for gm in (1, 2, 4, 6, 8)})

# %% [markdown]
# **Exercise 2.** Write UCB1's two pieces. `ucb_reward(emitted, gamma, c, gammas)`: the reward of
# a step that drafted `gamma` tokens and emitted `emitted` (tokens per unit of cost, scaled by the
# best possible value over `gammas`). `ucb_choose(total, n)`: the index of the arm to play next,
# given each arm's summed reward `total` and play count `n` (every arm once, in order; then the
# highest `mean + sqrt(2 ln t / n)` with `t = sum(n)`; ties go to the first arm).

# %%
@exercise("04b", "ucb_reward")
def ucb_reward(emitted, gamma, c, gammas):
    # your code here
    raise NotImplementedError


@exercise("04b", "ucb_choose")
def ucb_choose(total, n):
    # your code here
    raise NotImplementedError

# %% [markdown]
# The plumbing that makes a draft-length policy of your two functions: the decode loop calls
# `cap()` before each step (how many drafts) and `update(emitted, gamma)` after it (`emitted` =
# tokens the step emitted, averaged over the batch's rows); `adaptive.generate` takes it as `bandit=`.

# %%
class HandUCB:
    confidence = False                                   # the loop needs no draft confidence

    def __init__(self, gammas=(1, 2, 4, 6, 8), cost_ratio=0.2):
        self.gammas, self.c = list(gammas), cost_ratio
        self.n, self.total, self.arm = [0] * len(self.gammas), [0.0] * len(self.gammas), 0

    def cap(self):
        self.arm = ucb_choose(self.total, self.n)
        return self.gammas[self.arm]

    def update(self, emitted, gamma):
        self.n[self.arm] += 1
        self.total[self.arm] += ucb_reward(emitted, gamma, self.c, self.gammas)

    def stop(self, g, conf, stop): return stop           # never stop a round early
    def means(self): return {g: s / max(k, 1) for g, s, k in zip(self.gammas, self.total, self.n)}

# %% [markdown]
# The check: 300 simulated steps with i.i.d. acceptance (`alpha` = 0.7) must choose what
# `adaptive.UCB` chooses (its negative control: UCB without the exploration term chooses
# otherwise), then a real decode with your bandit must play the library's `gamma`s.

# %%
def check_ucb():
    lib = simulate(adaptive.UCB(cost_ratio=0.3))
    assert simulate(adaptive.UCB(cost_ratio=0.3, explore=0.0)) != lib, "negative control should differ"
    one = adaptive.UCB(gammas=(1, 2, 4), cost_ratio=0.5); one.cap(); one.update(2.0, 1)       # one step of gamma 1
    assert abs(ucb_reward(2.0, 1, 0.5, [1, 2, 4]) - one.means()[1]) < 1e-9, f"reward {ucb_reward(2.0, 1, 0.5, [1, 2, 4]):.4f}, UCB's {one.means()[1]:.4f}"
    mine = simulate(HandUCB(cost_ratio=0.3))
    first = next((i for i, (a, b) in enumerate(zip(mine, lib)) if a != b), None)
    assert first is None, f"step {first}: you chose gamma={mine[first]}, UCB1 chooses {lib[first]}"
    g_mine = adaptive.generate(target, prompts, draft=draft, policy="ucb", bandit=HandUCB(cost_ratio=c), max_new_tokens=NEW_TOKENS)
    g_lib = adaptive.generate(target, prompts, draft=draft, policy="ucb", bandit=adaptive.UCB(cost_ratio=c), max_new_tokens=NEW_TOKENS)
    assert g_mine.tokens == ref.tokens and g_mine.stats.extra["gammas"] == g_lib.stats.extra["gammas"], "decoding: other gammas"


check("Exercise 2", check_ucb)
if SHOW_SOLUTIONS:
    show("04b", "ucb_reward"); show("04b", "ucb_choose")

# %% [markdown]
# ## The library's bandit on real prompts
# `adaptive.generate(..., policy="ucb")` with one `UCB` object passed across calls keeps learning.
# Below: which arm it played at each step of a few runs, and the mean reward it learned per arm.

# %%
bandit = adaptive.UCB(gammas=(1, 2, 4, 6, 8), cost_ratio=c)
played = []
for rep in range(2 if FAST else 6):
    g = adaptive.generate(target, prompts, draft=draft, max_new_tokens=NEW_TOKENS, policy="ucb", bandit=bandit)
    assert g.tokens == ref.tokens
    played += g.stats.extra["gammas"]
fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 2.8), gridspec_kw={"width_ratios": [3, 1]})
a1.plot(played, "o", ms=3); a1.set_xlabel("step"); a1.set_ylabel("gamma played")
a2.bar([str(k) for k in bandit.means()], bandit.means().values()); a2.set_xlabel("gamma"); a2.set_ylabel("mean reward")
plt.tight_layout(); plt.show()
print("pulls per arm:", dict(zip(bandit.gammas, bandit.n)))

# %% [markdown]
# ## Play: threshold and policy
# The rounds of adaptive decoding for one prompt. Lower thresholds draft longer rounds (more
# green where the draft is right, more red where it is not).

# %%
import ipywidgets as widgets


counts_of = lambda s: [s.target_calls, s.draft_calls, s.new_tokens]


def play(threshold=0.1, policy="cumulative", prompt_index=0):
    global shown
    g = adaptive.generate(target, prompts[prompt_index:prompt_index + 1], draft=draft, max_gamma=8, threshold=threshold,
                          policy=policy, max_new_tokens=NEW_TOKENS)
    fig, ax = plt.subplots(figsize=(7, 2.6))
    draw_rounds(ax, rounds_of(g.stats), f"{policy}, threshold {threshold:.2f}", ymax=9)
    rounds_legend(ax); plt.show()
    shown = f"rounds {rounds_of(g.stats)}: tau {g.stats.tau:.2f}, cost/token at c: {cost(counts_of(g.stats), c):.3f}"
    print(shown[shown.index("tau"):])

# %% [markdown]
# Move the sliders (in a live notebook):

# %%
ui = widgets.interact(play, threshold=widgets.FloatSlider(continuous_update=False, value=0.1, min=0.0, max=1.0, step=0.05),
                      policy=widgets.Dropdown(options=["cumulative", "threshold"], value="cumulative"),
                      prompt_index=widgets.IntSlider(continuous_update=False, value=0, min=0, max=len(prompts) - 1)).widget

# %% jupyter={"source_hidden": true} tags=["ci-only", "remove-input"]
# CI's self-test of the widget above (collapsed in the lab): move a control as a person would,
# check that the output changed, then put the control back to its teaching default
default = ui.children[0].value
before = shown
ui.children[0].value = 0.9                         # move the threshold slider, as a person would
assert shown != before, "moving a slider must change the output"
ui.children[0].value = default

# %% [markdown]
# ## Part 3 · Can the draft copy? Induction heads
# Summaries, edits and answers about a passage repeat long stretches of the prompt. A transformer
# copies with *induction heads* (Olsson et al., 2022): one head marks each token with the token
# before it, a later head finds the earlier occurrence of the current token and predicts what
# followed it. We test for it with a drill: a random span shown twice, with noise around it.
# First the models that can copy: SmolLM2-135M and its 3-layer draft (if they are installed).

# %%
try:
    big, small = models.load(COPY_TARGET, device=DEVICE), models.load(COPY_DRAFT, device=DEVICE)
except (FileNotFoundError, OSError, ValueError, ImportError) as e:
    print(f"{COPY_TARGET} not available ({type(e).__name__}): the copy part uses {TARGET} instead")
    big, small = target, draft
small_plain = getattr(small, "lm", small)          # smollm2-135m-draft loads with the copy prior: unwrap it
print(big.name, "|", small_plain.name)

# %% [markdown]
# The drill by hand: `noise(span − gap) + S + noise(gap) + S`, with its own `gap` per row, so the
# distance between the two showings varies and only copying *by content* scores (with one fixed
# distance a draft once learned "look 47 tokens back" instead). The score is top-1 accuracy on
# the second showing, from its second token on (its first cannot be known). Tokens come from the
# draft's head (all tokens for a full-vocabulary draft).

# %%
def drill(vocab, span, gap, gen):
    pick = lambda n: vocab[torch.randint(0, len(vocab), (n,), generator=gen, device=vocab.device)]
    S = pick(span)
    return torch.cat([pick(span - gap), S, pick(gap), S])                       # (3·span,)


def copy_accuracy_by_hand(lm, rows, span):
    x = torch.stack(rows).to(lm.device)                                         # (B, 3·span)
    pred = lm.logits(x)[:, 2 * span:-1].argmax(-1)                              # predicts x[:, 2·span+1:]
    return float((pred == x[:, 2 * span + 1:]).float().mean())

# %% [markdown]
# Each pair on drill rows from its draft's head. `tiny` was trained for minutes on the King
# James Bible and never formed induction heads, and neither did its draft. SmolLM2-135M, trained on
# trillions of tokens, did; its 3-layer draft was trained with this very drill next to
# distillation (`refimpl.train.smol_draft`), because distillation alone left it copying nothing:
# a draft that cannot copy loses every token its target copies.

# %%
span, gaps = 24, (0, 7, 15, 24)
for t_, d_ in ((target, draft), (big, small_plain)):
    vocab = getattr(d_, "kept_ids", torch.arange(d_.vocab_size, device=d_.device))  # the draft's head, on its device
    gen = torch.Generator(device=vocab.device).manual_seed(0)
    rows = [drill(vocab, span, gap, gen) for gap in gaps]
    for lm in (t_, d_):
        print(f"{lm.name:24s} copies {copy_accuracy_by_hand(lm, rows, span):.0%} of the second showing")

# %% [markdown]
# ## Prompt lookup: copying without a model
# A drill of random tokens is the easy case; copying a fact out of a passage is harder, and even
# a draft that passes the drill still guesses there. Prompt lookup (chapter 09) copies mechanically: find the latest earlier occurrence of the
# context's last `n` tokens and propose the token that followed -- what an induction head does,
# as a lookup. By hand, for one position (`n` from 3 down to 2), checked on every position of a
# drill row against `refimpl.primitives.copy_candidates` (all positions of a batch at once):

# %%
from refimpl.copy_prior import ContextCopyLM
from refimpl.primitives import copy_candidates, lookup_positions


def lookup_by_hand(history, max_n=3, min_n=2):
    t = len(history) - 1
    for n in range(max_n, min_n - 1, -1):
        suffix = history[t - n + 1:]
        for j in range(t - 1, n - 2, -1):          # latest earlier occurrence first
            if history[j - n + 1: j + 1] == suffix:
                return history[j + 1]              # what followed it
    return None


row = rows[1].tolist()
mine = [lookup_by_hand(row[: t + 1]) for t in range(len(row))]
lib = copy_candidates(torch.tensor(row, device=DEVICE), torch.arange(len(row), device=DEVICE)).tolist()
assert [-1 if m is None else m for m in mine] == lib
second = range(2 * span, len(row) - 1)
print(f"lookup candidate = next token on the second showing: {sum(lib[t] == row[t + 1] for t in second) / len(second):.0%}")

# %% [markdown]
# The picture of that lookup: for each position of the row (x), the earlier position it copies
# from (y). On the second showing every position looks back into the first by the same
# distance, whatever the gap; in the noise, chance matches of two tokens are rare.

# %%
src = lookup_positions(torch.tensor(row, device=DEVICE), torch.arange(len(row) - 1, device=DEVICE))   # (T - 1,) -1 = no match
fig, ax = plt.subplots(figsize=(7, 3.2))
ax.axhspan(span - gaps[1] - 0.5, 2 * span - gaps[1] - 0.5, color="0.9", label="first showing (y)")
ax.axvspan(2 * span - 0.5, 3 * span - 0.5, color="#e0f0ff", label="second showing (x)")
for t, s_ in enumerate(src.tolist()):
    if s_ >= 0:
        ax.plot(t, s_, "o", ms=4, color="#52b788" if lib[t] == row[t + 1] else "#e76f51")
ax.set_xlim(-1, len(row)); ax.set_ylim(-1, len(row))
ax.set_xlabel("position t (the token to predict is t + 1)"); ax.set_ylabel("copied from position")
ax.set_title("prompt lookup on a drill row (green: the copied token is the next token)", fontsize=9)
ax.legend(fontsize=7, loc="upper left"); plt.show()

# %% [markdown]
# ## The copy prior, by hand
# A draft can have both: `ContextCopyLM` adds `bias` to the draft's logit of the lookup's
# candidate (`bias = 6` overrides the draft unless it is ~400 times surer of another token).
# Any draft distribution is verified exactly, so this is lossless too. By hand, on a text that
# repeats itself, against the library. (A token outside a trimmed head stays impossible: the
# zoo's SmolLM2 draft also scores the context's tokens in its cached steps, chapter 04a.)

# %%
ctx = big.encode("The lamp was electrified in 1938, and the last keeper left in 1961. The last keeper left in 19")
x = torch.tensor([ctx], device=DEVICE)
by_hand = small_plain.logits(x).clone()                                            # (1, T, V)
for t in range(len(ctx)):
    cand = lookup_by_hand(ctx[: t + 1])
    if cand is not None:
        by_hand[0, t, cand] += 6.0
assert torch.allclose(ContextCopyLM(small_plain, bias=6.0).logits(x), by_hand)
alone, prior = (int(z[0, -1].argmax()) for z in (small_plain.logits(x), by_hand))
print(repr(big.decode(ctx[-4:])), "-> draft alone:", repr(big.decode([alone])), "| with the prior:", repr(big.decode([prior])))

# %% [markdown]
# ## Where the prior pays
# Speculative decoding of the benchmark's prompts (one per category in `FAST` mode) with the
# draft alone and with the prior. The tokens must be identical (both are the target's greedy
# output); only `tau` may move.
#
# **Exercise 3 (a prediction).** Before running the next cell: in which category will the prior
# change `tau` the least? Put one of the category names in `MY_CATEGORY`.

# %%
cats = ["chat", "summarization", "copy"] if FAST else ["chat", "summarization", "code", "math", "copy", "qa"]
MY_CATEGORY = None                                   # your prediction, e.g. "math"

# %% [markdown]
# The runs (a few seconds per category on a CPU):

# %%
tau = {"draft alone": {}, "draft + copy prior": {}}
for cat, text in prompt_set(per_category=1 if FAST else 2):
    if cat not in cats:
        continue
    p = encode_prompt(big, text)
    with kernels.references():          # the kernels' torch references on a CPU: the same tokens and calls
        a = speculative.generate(big, [p], draft=small_plain, gamma=4, max_new_tokens=COPY_TOKENS)
        b = speculative.generate(big, [p], draft=ContextCopyLM(small_plain), gamma=4, max_new_tokens=COPY_TOKENS)
    assert a.tokens == b.tokens
    tau["draft alone"].setdefault(cat, []).append(a.stats.tau)
    tau["draft + copy prior"].setdefault(cat, []).append(b.stats.tau)
mean_tau = {k: {cat: sum(v) / len(v) for cat, v in d.items()} for k, d in tau.items()}

# %% [markdown]
# The picture:

# %%
fig, ax = plt.subplots(figsize=(7, 3))
for i, (label, d) in enumerate(mean_tau.items()):
    ax.bar([j + 0.4 * i for j in range(len(cats))], [d[cat] for cat in cats], width=0.4, label=label)
ax.set_xticks([j + 0.2 for j in range(len(cats))], cats); ax.set_ylabel("tau (gamma = 4)")
ax.set_title(f"{big.name} + {small_plain.name}, {COPY_TOKENS} new tokens per prompt", fontsize=9)
ax.legend(ncol=2, loc="upper left"); ax.set_ylim(0, 1.3 * max(max(d.values()) for d in mean_tau.values())); plt.show()
gain = {cat: round(mean_tau["draft + copy prior"][cat] - mean_tau["draft alone"][cat], 3) for cat in cats}
print("tau gained with the prior:", gain)

# %% [markdown]
# The check of your prediction:

# %%
def check_prediction():
    least = min(gain, key=lambda k: abs(gain[k]))
    guess = least if answers_on() else MY_CATEGORY
    if guess is None:
        return ...
    assert guess == least, f"you predicted {guess!r}; the runs say {least!r} (tau gains {gain})"


check("Exercise 3", check_prediction)
if SHOW_SOLUTIONS:
    print("chat: its answers do not repeat the prompt, so the lookup rarely finds a candidate")

# %% [markdown]
# The prior pays where answers repeat their prompt -- summaries, rewrites, answers quoted from a
# passage -- and cannot help chat, where nothing repeats. It helps only where the *target* copies:
# with `tiny`, which never learned to, it can as easily cost acceptance as win it.
#
# ## Summary
# - Adaptive `gamma` decides the draft length from the draft side (its confidence, or a bandit
#   over past steps' tokens per cost) before the target is called, which keeps greedy exact and
#   sampling lossless (tests/test_adaptive.py checks the sampled distribution by exact enumeration).
# - Whether it beats the best fixed `gamma` depends on `c`: counting calls gives the answer for
#   any `c` from the same runs.
# - A small draft cannot copy unless it was taught to (the induction drill); prompt lookup copies
#   mechanically, and as a prior on the draft's logits it adds that skill to any draft, losslessly.
# - `adaptive.generate(target, prompts, draft=d)` runs `adaptive.PRESETS["cpu"]` by default: the
#   cumulative rule at 0.05, at most 8 drafts: the faster of the two presets with the zoo's SmolLM2
#   draft on held-out prompts (<!-- quote:plain_calls/plain_calls_smollm2-135m|adaptive [cpu]|speedup -->0.82x<!-- /quote --> AR against <!-- quote:plain_calls/plain_calls_smollm2-135m|adaptive [confidence]|speedup -->0.73x<!-- /quote -->, `bench_results/plain_calls/`, a
#   shared machine); in the capstone it runs at <!-- quote:capstone/capstone_smollm2-135m|adaptive [cpu]|speedup -->0.98x<!-- /quote --> AR, near the fixed chain's <!-- quote:capstone/capstone_smollm2-135m|speculative [cpu]|speedup -->1.05x<!-- /quote -->, with a
#   higher tau (<!-- quote:capstone/capstone_smollm2-135m|adaptive [cpu]|tau -->3.04<!-- /quote --> against <!-- quote:capstone/capstone_smollm2-135m|speculative [cpu]|tau -->2.58<!-- /quote -->) bought with more draft calls. `preset="confidence"` is this chapter's
#   per-token rule.
