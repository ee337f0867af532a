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
# # 03 · Speculative sampling, and why it is lossless
#
# Chapter 02 verified drafts greedily: keep a draft token iff it is the target's argmax. With
# sampling there is no single "right" token, so we need a rule that keeps as many drafts as
# possible while the emitted tokens stay distributed **exactly** as the target's own samples.
#
# Leviathan et al., *Fast Inference from Transformers via Speculative Decoding* (arXiv 2211.17192,
# Algorithm 1) and Chen et al., *Accelerating Large Language Model Decoding with Speculative
# Sampling* (arXiv 2302.01318, Theorem 1): with `p` the target's and `q` the draft's distribution,
#
# - accept a draft token `x ~ q` with probability `min(1, p(x) / q(x))`;
# - at the first rejection, sample from the **residual** `norm(max(0, p - q))` and stop;
# - if every draft was accepted, sample a **bonus** token from the target's next `p`.
#
# After this notebook you can
# 1. apply the rule at one position by hand (accept, or draw from the residual) and write it yourself;
# 2. prove that the emitted tokens are distributed exactly as `p`, and test it: exactly on a small
#    vocabulary, statistically (chi-square, with a negative control that must fail) on a real model;
# 3. reproduce `refimpl.speculative`'s sampled tokens draw for draw with a hand-built loop;
# 4. predict tokens per step from `alpha = E[sum min(p, q)]` and `gamma`, and compare with a measurement;
# 5. check the `kernels.rejection_sample` kernel against its torch reference.

# %% [markdown]
# ## Parameters

# %%
import torch
from refimpl.models import default_device

FAST = True                       # CI default: small sample sizes
TARGET = "tiny"                   # any zoo name or local Hugging Face folder
DRAFT = "tiny-draft"              # falls back to the target's first layers if absent
DEVICE = default_device()         # a torch.device: CUDA when present, $REFIMPL_DEVICE overrides
TEMPERATURE, TOP_K, TOP_P = 0.8, None, None
GAMMA = 4
NEW_TOKENS = 40 if FAST else 128
SAMPLES = 1000 if FAST else 20000  # for the statistical test
SEED = 0
SHOW_SOLUTIONS = False            # True prints the reference answers of the exercises

# %% [markdown]
# ## Models
# As in chapter 02: the zoo's `tiny-draft` if present, else an early-exit draft made of the
# target's first two layers (same tokenizer, a different and cheaper distribution).

# %%
import copy
from transformers import AutoModelForCausalLM
from refimpl import models, sampling, speculative, autoregressive
from refimpl.models import LM
from refimpl.prompts import encode_prompt   # a user turn for a chat model, plain tokens otherwise
import kernels
from kernels.rejection_sample import rejection_sample


def early_exit_draft(lm, layers=2):
    cfg = copy.deepcopy(lm.model.config)
    cfg.num_hidden_layers = layers
    m = AutoModelForCausalLM.from_config(cfg)
    m.load_state_dict(lm.model.state_dict(), strict=False)
    return LM(m.to(lm.device), lm.tokenizer, name=f"{lm.name}-exit{layers}")


# %% [markdown]
# Load them and a prompt.

# %%
target = models.load(TARGET, device=DEVICE)
try:
    draft = models.load(DRAFT, device=DEVICE)
except (FileNotFoundError, ValueError, OSError) as e:
    print(f"no {DRAFT!r} ({type(e).__name__}): using the early-exit fallback")
    draft = early_exit_draft(target, 2)
prompt = encode_prompt(target, "And the LORD spake unto Moses, saying")
print("target", target.name, "| draft", draft.name, "| prompt", len(prompt), "tokens")

# %% [markdown]
# ## The rule at one position
# Given `p`, `q` (vectors over the vocabulary), a draft token `x ~ q` and two uniforms: accept
# iff `u0 * q(x) < p(x)` (probability `min(1, p(x)/q(x))`); otherwise draw from the residual
# `norm(max(0, p - q))` by inverse CDF with `u1`. Two helpers: `inverse_cdf(w, u)` returns the
# first token whose cumulative weight exceeds `u * sum(w)` (the kernel does exactly this, tile by
# tile), and `residual(p, q)` is the normalised residual. You will write the rule itself in
# exercise 1, after the proof.

# %%
def inverse_cdf(w, u):
    cum = w.cumsum(-1)
    hit = (cum > u * w.sum()) & (w > 0)
    return int(hit.nonzero()[0]) if hit.any() else int((w > 0).nonzero()[-1])


def residual(p, q):
    w = (p - q).clamp(min=0)
    return w / w.sum() if w.sum() > 0 else p   # p == q: a rejection never happens

# %% [markdown]
# ## Why the output is distributed as `p`
# Let `beta = sum_y min(p(y), q(y))` be the probability that a draft is accepted. Token `x` is
# emitted either because the draft proposed it and it was accepted, or after a rejection:
#
# $$P(x) = q(x)\,\min\!\Big(1, \tfrac{p(x)}{q(x)}\Big) + (1-\beta)\,\frac{\max(0, p(x)-q(x))}{\sum_y \max(0, p(y)-q(y))}.$$
#
# The first term is `min(p(x), q(x))`. For the second, `sum_y max(0, p - q) = sum_y (p - min(p, q))
# = 1 - beta`, so it equals `max(0, p(x) - q(x))`. Hence
#
# $$P(x) = \min(p(x), q(x)) + \max(0, p(x) - q(x)) = p(x). \quad\blacksquare$$
#
# For a block of `gamma` drafts apply this position by position: given the accepted prefix, the
# next emitted token is distributed as `p(. | prefix)`, whether it is an accepted draft, a residual
# draw (which ends the block) or the bonus token drawn from `p` itself. By induction the whole
# sequence is distributed as the target's. Nothing about `q` matters except that it is used
# consistently: a bad draft costs speed, never correctness.
#
# ## An exact check on a small vocabulary
# Compute `P(x)` from the formula above for random `p`, `q` over 6 tokens, for the correct rule
# and two wrong ones: "accept every draft" and "after a rejection resample from `p`".

# %%
def emitted(p, q, rule="correct"):
    acc = torch.minimum(torch.ones_like(p), p / q)                # P(accept | x)
    if rule == "accept-all":
        acc = torch.ones_like(p)
    after_reject = residual(p, q) if rule == "correct" else p
    return q * acc + (q * (1 - acc)).sum() * after_reject


g = torch.Generator(device=DEVICE).manual_seed(SEED)   # p6 and q6 meet the kernel below: made on its device
p6, q6 = (torch.softmax(torch.randn(6, generator=g, dtype=torch.float64, device=DEVICE) * 1.5, 0) for _ in range(2))
for rule in ("correct", "accept-all", "resample-from-p"):
    err = (emitted(p6, q6, rule) - p6).abs().max().item()
    print(f"{rule:16s} max |P - p| = {err:.2e}")
assert (emitted(p6, q6) - p6).abs().max() < 1e-12

# %% [markdown]
# ## Exercise 1: the rule, yourself
# Each exercise is a stub for you to fill in, followed by a check that answers "not attempted yet",
# "wrong, because ..." or "correct". The reference answers are hidden in `solutions/ch03.py`; set
# `SHOW_SOLUTIONS = True` in the parameters to print them.
#
# Write `my_one_position(p, q, x, u0, u1)`: the token emitted for a draft `x ~ q` and two uniforms
# (accept when `u0 * q(x) < p(x)`, else draw from the residual with `inverse_cdf` and `u1`). The
# check runs it 20,000 times on random 6-token `p`, `q` and applies a chi-square test: your output
# must be distributed as `p`. The proof above says why it will be.

# %%
from solutions import answers_on, exercise, check, show


@exercise("03", "my_one_position")
def my_one_position(p, q, x, u0, u1):
    ...  # your code
    raise NotImplementedError

# %% [markdown]
# The check's tools, and its negative control: a rule that, after a rejection, draws from `p`
# instead of the residual must fail the same test.

# %%
from scipy.stats import chisquare

gg = torch.Generator(device="cpu").manual_seed(5)   # a host-side simulation: 20,000 Python calls, counted for scipy
p_ex, q_ex = (torch.rand(6, generator=gg, dtype=torch.float64, device="cpu") for _ in range(2))
p_ex, q_ex = p_ex / p_ex.sum(), q_ex / q_ex.sum()


def emitted_pvalue(rule, n=20000, seed=3):
    g_ = torch.Generator(device="cpu").manual_seed(seed)
    xs_ = torch.multinomial(q_ex.float(), n, replacement=True, generator=g_).tolist()
    us = torch.rand(n, 2, generator=g_, dtype=torch.float64, device="cpu").tolist()
    out = [rule(p_ex, q_ex, x, u0, u1) for x, (u0, u1) in zip(xs_, us)]
    return chisquare([out.count(t) for t in range(6)], (p_ex * n).tolist()).pvalue


forgetful = lambda p, q, x, u0, u1: x if u0 * q[x] < p[x] else inverse_cdf(p, u1)   # WRONG on purpose
pv_forgetful = emitted_pvalue(forgetful)
assert pv_forgetful < 1e-3, "the negative control must fail"
print(f"negative control (resample from p): p-value {pv_forgetful:.1e}")

# %% [markdown]
# The check:

# %%
def check_one_position():
    assert my_one_position(p_ex, p_ex, 2, 0.99, 0.5) == 2, "when p == q every draft must be accepted"
    pv = emitted_pvalue(my_one_position)
    assert pv > 1e-3, f"20,000 emitted tokens are not distributed as p (chi-square p-value {pv:.1e})"


check("Exercise 1", check_one_position)
if SHOW_SOLUTIONS:
    show("03", "my_one_position")

# %% [markdown]
# The formula is right (and, if exercise 1 passed, so is your rule); now check the library's
# **implementation**. Run the rejection sampler (one draft
# position, `gamma = 1`) on many independent rows with fresh uniforms and compare the first
# emitted token's frequencies with `p`. On a GPU this is the Triton kernel; on CPU we use its
# torch reference (the section "Under the hood" below shows both make identical draws from
# identical uniforms; the Triton *interpreter* would need minutes for 200,000 rows).

# %%
import os
from kernels.rejection_sample import rejection_sample_reference, rejection_sample_triton

mc_sampler = rejection_sample if DEVICE.type == "cuda" else rejection_sample_reference
n_rows = 200_000 if FAST else 2_000_000
P = torch.stack([p6, p6]).float()[None].expand(n_rows, 2, 6).contiguous()   # (R, gamma + 1, V)
Q = q6.float()[None, None].expand(n_rows, 1, 6).contiguous()                # (R, gamma, V)
x = torch.multinomial(q6.float(), n_rows, replacement=True, generator=g)[:, None]
u = torch.rand(n_rows, 2, generator=g, device=DEVICE)
n_acc, nxt = mc_sampler(x, P, Q, u)
first = torch.where(n_acc == 1, x[:, 0], nxt)
freq = torch.bincount(first, minlength=6).double() / n_rows
print("p    ", [round(v, 4) for v in p6.tolist()], "\nfreq ", [round(v, 4) for v in freq.tolist()])
assert (freq - p6).abs().max() < 0.005

# %% [markdown]
# ## The whole algorithm by hand
# Drafting now *samples* from `q` (and keeps each `q` vector); the target scores the block once;
# then the rule runs left to right. The randomness is drawn in the same order as
# `refimpl.speculative` (draft samples, then `gamma + 1` uniforms per step), so with the same
# seed both produce the same tokens. We also record `beta = sum min(p, q)` at every tested position.

# %%
def draft_samples(draft, cache, feed, g, gen):
    xs, qs = [], []
    for _ in range(g):
        logits, cache = draft.forward(torch.tensor([feed], device=DEVICE), cache)
        qs.append(sampling.probs(logits[0, -1], TEMPERATURE, TOP_K, TOP_P))     # (V,)
        xs.append(int(sampling.sample_from_probs(qs[-1][None], gen)[0]))
        feed = [xs[-1]]
    return xs, qs, cache

# %% [markdown]
# The accept/resample step for a block, returning the accepted count, the next token and the
# `beta` of each tested position.

# %%
def verify_block(xs, qs, ps, u, betas):
    for i, x in enumerate(xs):
        betas.append(float(torch.minimum(ps[i], qs[i]).sum()))
        if not u[i] * qs[i][x] < ps[i][x]:                       # rejected
            w = (ps[i] - qs[i]).clamp(min=0)
            return i, inverse_cdf(w if w.sum() > 0 else ps[i], u[-1])
    return len(xs), inverse_cdf(ps[len(xs)], u[-1])             # all accepted: bonus from p


# %% [markdown]
# The loop: draft, one target call, verify, roll both caches back (exactly as in chapter 02).

# %%
def speculative_sampling(target, draft, prompt, gamma, max_new, gen):
    out, tc, dc, t_feed, d_feed, steps, betas = [], None, None, list(prompt), list(prompt), [], []
    while len(out) < max_new:
        g = min(gamma, max_new - len(out) - 1)
        xs, qs, dc = draft_samples(draft, dc, d_feed, g, gen) if g else ([], [], dc)
        logits, tc = target.forward(torch.tensor([t_feed + xs], device=DEVICE), tc)
        ps = sampling.probs(logits[0, -(g + 1):], TEMPERATURE, TOP_K, TOP_P)   # (g + 1, V)
        u = torch.rand((1, g + 1), generator=gen, device=DEVICE)[0]
        n, nxt = verify_block(xs, qs, ps, u, betas)
        out += xs[:n] + [nxt]; steps.append((n, g))
        LM.crop(tc, len(prompt) + len(out) - 1); t_feed = out[-1:]
        d_len = 0 if dc is None else min(LM.cache_length(dc), len(prompt) + len(out) - 1)
        dc = dc if dc is None else LM.crop(dc, d_len); d_feed = (prompt + out)[d_len:]
    return out, steps, betas

# %% [markdown]
# Same seed, same tokens as `refimpl.speculative.generate`:

# %%
mine, steps, betas = speculative_sampling(target, draft, prompt, GAMMA, NEW_TOKENS, torch.Generator(device=DEVICE).manual_seed(SEED))
ref = speculative.generate(target, prompt, draft=draft, gamma=GAMMA, max_new_tokens=NEW_TOKENS, temperature=TEMPERATURE,
                           top_k=TOP_K, top_p=TOP_P, generator=torch.Generator(device=DEVICE).manual_seed(SEED), eos_token_id=[])
assert mine == ref.tokens[0], "hand-built and refimpl must agree draw for draw"
assert [n for n, _ in steps] == [a[0] for a in ref.stats.accepted]
print(repr(target.decode(mine)))
print(f"tau = {ref.stats.tau:.2f} tokens per target call (gamma {GAMMA}, seed {SEED})")

# %% [markdown]
# ## A statistical check on the real model
# Run speculative sampling on `SAMPLES` copies of a prompt whose next token is uncertain (a
# batch: every row has its own randomness) and compare the first token's frequencies with the
# target's exact `p`, restricted to the top 8 tokens. Cells expected to get fewer than 5 samples
# are pooled into one (the chi-square approximation needs it). The negative control swaps in the
# wrong "accept every draft" rule through the verification core's `rule` argument; it must fail.

# %%
K, stat_prompt = 8, encode_prompt(target, "Blessed are the")
p_first = sampling.probs(target.logits(torch.tensor([stat_prompt], device=DEVICE))[0, -1], 1.0, top_k=K).cpu()  # scipy and matplotlib read host arrays
q_first = sampling.probs(draft.logits(torch.tensor([stat_prompt], device=DEVICE))[0, -1], 1.0, top_k=K).cpu()   # scipy and matplotlib read host arrays
support = p_first.nonzero()[:, 0]
exp = p_first[support].double() * SAMPLES                   # expected counts


def pvalue(counts):                                         # a sample outside the support: p = 0
    if counts.sum() > counts[support].sum():
        return 0.0
    big = exp >= 5
    obs, e = torch.cat([counts[support][big], counts[support][~big].sum()[None]]), torch.cat([exp[big], exp[~big].sum()[None]])
    return chisquare(obs[e > 0], e[e > 0] / e.sum() * obs.sum()).pvalue

# %% [markdown]
# Sample with the correct rule and with the wrong one (`gamma = 1`, two new tokens: the first
# token goes through the rule), then test. `kernels.references()` makes the kernels' dispatchers
# use their torch references on a CPU for this cell (Triton's interpreter would take minutes for
# 1000 rows; the kernel == reference check comes later in this chapter); CUDA runs the kernel.

# %%
def accept_all(x, p, q, u, valid):   # WRONG on purpose: the output then follows q
    rows = torch.arange(len(valid), device=valid.device)
    return valid, rejection_sample(x[:, :0], p[rows, valid][:, None], q[:, :0], u[:, -1:])[1]


def first_token_counts(rule):
    proposer = speculative.DraftModel(draft, speculative.FixedGamma(1))   # what speculative.generate builds
    r = speculative.decode(target, proposer, [stat_prompt] * SAMPLES, max_new_tokens=2, temperature=1.0,
                           top_k=K, generator=torch.Generator(device=DEVICE).manual_seed(SEED), eos_token_id=[], rule=rule)
    return torch.bincount(torch.tensor([t[0] for t in r.tokens], device="cpu"), minlength=p_first.numel()).double()   # counted on the host


with kernels.references():   # the torch references on a CPU (the interpreter is slow for 1000 rows)
    good, bad = first_token_counts(None), first_token_counts(accept_all)
pv_good, pv_bad = pvalue(good), pvalue(bad)
print(f"correct rule: p-value {pv_good:.3f} | accept-all: p-value {pv_bad:.2e}")
assert pv_good > 1e-3 and pv_bad < 1e-3

# %% [markdown]
# Side by side: the target `p`, the draft `q`, and what each rule emitted.

# %%
import matplotlib.pyplot as plt

labels = [repr(target.decode([int(i)])) for i in support]
w = 0.2
xs_ = torch.arange(len(support), device="cpu").float()   # bar positions for matplotlib
fig, ax = plt.subplots(figsize=(8, 3.2))
ax.bar(xs_ - 1.5 * w, p_first[support], w, label="target p (exact)")
ax.bar(xs_ - 0.5 * w, q_first[support], w, label="draft q (exact)")
ax.bar(xs_ + 0.5 * w, good[support] / SAMPLES, w, label="speculative sampling")
ax.bar(xs_ + 1.5 * w, bad[support] / SAMPLES, w, label="wrong rule: accept all")
ax.set_xticks(xs_, labels, rotation=30); ax.set_ylabel("probability"); ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## Expected tokens per step
# If each draft is accepted independently with probability `alpha`, a step emits
# `1 + alpha + alpha^2 + ... + alpha^gamma = (1 - alpha^(gamma+1)) / (1 - alpha)` tokens
# (Leviathan et al., eq. 1), where `alpha = E[beta] = E[sum min(p, q)]` (one minus the total
# variation distance between `p` and `q`). One run per `gamma`, with the seed of the run above:
# the hand-built loop gives the `beta`s (the mean is `alpha`), the library's run of the same draws
# gives `tau`, tokens per target call (`stats.tau`). That is the one `tau` of this chapter: the run
# above and the widget below at its defaults print the same number as the row `gamma = GAMMA`. With one
# prompt and a few dozen tokens the measurement is noisy (set `FAST = False` for more; the last call
# of a run may draft fewer than `gamma` tokens); the formula also assumes acceptances are
# independent, which real text is not. Neither side of the formula is the rule, because the two
# departures pull opposite ways. `1 + a + ... + a^gamma` is convex in `a`, so where `beta` varies from
# stretch to stretch, easy stretches (whole blocks accepted) gain more than hard ones lose: measured
# above. But `alpha` here is the mean `beta` of the positions the run reached, and a draft stops at
# its first rejection, so easy stretches contribute more positions than hard ones and the mean
# overstates `alpha`; and the run's last call drafts fewer than `gamma` tokens, a larger share of a run
# of a few dozen tokens at larger `gamma`: measured below. Which wins depends on the text, the seed
# and the length; the cell prints both numbers for each `gamma`. (The widget also prints the
# acceptance rate, accepted / proposed: a different number from the formula's `alpha`.)

# %%
gammas, measured, predicted = sorted({1, 2, GAMMA, 6} if FAST else set(range(1, 11)) | {GAMMA}), [], []
for gm in gammas:
    mine, _, bs = speculative_sampling(target, draft, prompt, gm, NEW_TOKENS, torch.Generator(device=DEVICE).manual_seed(SEED))
    run = speculative.generate(target, prompt, draft=draft, gamma=gm, max_new_tokens=NEW_TOKENS, temperature=TEMPERATURE,
                               top_k=TOP_K, top_p=TOP_P, generator=torch.Generator(device=DEVICE).manual_seed(SEED),
                               eos_token_id=[])
    assert mine == run.tokens[0], "one run, two views: the same draws"
    measured.append(run.stats.tau)
    predicted.append(speculative.expected_tau((sum(bs) / len(bs)), gm))
    print(f"gamma {gm}: alpha {sum(bs)/len(bs):.2f}  tau measured {measured[-1]:.2f}  formula {predicted[-1]:.2f}")
assert measured[gammas.index(GAMMA)] == ref.stats.tau

fig, ax = plt.subplots(figsize=(5.5, 3.2))
ax.plot(gammas, measured, "o-", label="measured tokens / step")
ax.plot(gammas, predicted, "s--", label="(1 - a^(g+1)) / (1 - a)")
ax.set_xlabel("gamma"); ax.set_ylabel("tau"); ax.grid(alpha=0.3); ax.legend()
plt.show()

# %% [markdown]
# ## Under the hood: the rejection-sampling kernel
# With the algorithm built and tested: the kernel that runs its accept/resample step in
# `refimpl.speculative` on a GPU. It takes the uniforms as an input tensor, so the torch reference
# and the Triton kernel consume identical randomness and must agree draw for draw. With CUDA (or
# `TRITON_INTERPRET=1`, as in CI) the Triton kernel runs: accept tests left to right, then two
# passes over vocabulary tiles (total residual mass, then the inverse CDF).

# %%
B, gm, V = 8, 4, target.vocab_size
pp = torch.softmax(torch.randn(B, gm + 1, V, generator=g, device=DEVICE) * 3, -1)
qq = torch.softmax(pp[:, :gm].log() + torch.randn(B, gm, V, generator=g, device=DEVICE), -1)
xx = torch.multinomial(qq.view(-1, V), 1, generator=g).view(B, gm)
uu = torch.rand(B, gm + 1, generator=g, device=DEVICE)
ref_n, ref_t = rejection_sample_reference(xx, pp, qq, uu)
if DEVICE.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1":   # a real kernel run
    tri = rejection_sample_triton(xx, pp, qq, uu)
    assert torch.equal(tri[0], ref_n) and torch.equal(tri[1], ref_t)
    print("Triton kernel == torch reference, draw for draw")
print("accepted per row:", ref_n.tolist(), "| next tokens:", ref_t.tolist())

# %% [markdown]
# The same draws by hand: after a rejection at position `n` the residual of `p_n` and `q_n`,
# else the bonus token from `p_gamma`, both through `inverse_cdf` with the last uniform. (The
# kernel tests in `tests/test_kernel_rejection_sample.py` fuzz Triton against the reference on
# odd vocabulary sizes and ragged rows.)

# %%
def by_hand(b):
    n = int(ref_n[b])
    w = (pp[b, n] - qq[b, n]).clamp(min=0) if n < gm else pp[b, gm]   # residual, or bonus from p
    return inverse_cdf(w, uu[b, -1])


assert [by_hand(b) for b in range(B)] == ref_t.tolist()
print("the by-hand residual / bonus draws agree with the kernel")

# %% [markdown]
# ## Play: gamma and temperature
# Each token of a real run is coloured by how it was emitted (the legend is above the text).
# Lower temperatures make `p` and `q` peakier: they agree more often when they share the argmax,
# and less when they do not. The header prints tau and the acceptance rate (accepted / proposed,
# `stats.alpha`), which is not the `alpha` of the formula (chapter 02).

# %%
import ipywidgets as widgets
from html import escape
from IPython.display import HTML, display

COLOURS = {"accepted draft": "#b7e4c7", "residual draw after a rejection": "#ffd6a5", "bonus token from p": "#a0c4ff"}
LEGEND = " ".join(f'<span style="background:{c}">{k}</span>' for k, c in COLOURS.items())


def play(gamma=GAMMA, temperature=TEMPERATURE, seed=SEED):
    global shown
    r = speculative.generate(target, prompt, draft=draft, gamma=gamma, max_new_tokens=NEW_TOKENS, temperature=temperature,
                             top_k=TOP_K, top_p=TOP_P, generator=torch.Generator(device=DEVICE).manual_seed(seed),
                             eos_token_id=[])
    spans, i, toks = [], 0, r.tokens[0]
    for (n,), g_ in zip(r.stats.accepted, r.stats.extra["gammas"]):
        for k in range(min(n + 1, len(toks) - i)):
            c = list(COLOURS.values())[0 if k < n else (2 if n == g_ else 1)]
            spans.append(f'<span style="background:{c}">{escape(target.decode([toks[i]]))}</span>'); i += 1
    shown = f"<b>tau {r.stats.tau:.2f}, acceptance rate {r.stats.alpha:.2f}, target calls {r.stats.target_calls}</b>"
    display(HTML(f"{shown} &nbsp; {LEGEND}<br><span style='font-family:monospace'>{''.join(spans)}</span>"))

# %% [markdown]
# The widget renders once, below the sliders.

# %%
ui = widgets.interact(play, gamma=widgets.IntSlider(continuous_update=False, value=GAMMA, min=1, max=10),
                      temperature=widgets.FloatSlider(continuous_update=False, value=TEMPERATURE, min=0.0, max=2.0, step=0.1),
                      seed=widgets.IntSlider(continuous_update=False, value=SEED, min=0, max=20)).widget

# %% jupyter={"source_hidden": true} tags=["ci-only", "remove-input"]
# CI's self-test of the widget above (collapsed in the lab): move a control as a person would,
# check that the output changed, then put the control back to its teaching default
default = ui.children[1].value
before = shown
assert f"tau {ref.stats.tau:.2f}," in before, "at its defaults the widget shows the chapter's run"
ui.children[1].value = 0.0                          # greedy: p and q become one-hot
assert shown != before, "moving a slider must change the output"
ui.children[1].value = default

# %% [markdown]
# ## Exercises
# Exercise 1 came with the proof above; two more, in the same format (set `SHOW_SOLUTIONS = True`
# to print the reference answers).
#
# **2.** The probability that one draft token is accepted is `beta = sum_x min(p(x), q(x))`.
# Write `acceptance(p, q)`; the check compares it with a simulation of the accept test.

# %%
@exercise("03", "acceptance")
def acceptance(p, q):
    # your code here
    raise NotImplementedError


# %%
def check_acceptance():
    gg = torch.Generator(device=DEVICE).manual_seed(1)                     # on the device of p6 and q6
    xs_ = torch.multinomial(q6.float(), 20000, replacement=True, generator=gg)
    u0 = torch.rand(20000, generator=gg, dtype=torch.float64, device=DEVICE)
    sim = (u0 * q6[xs_] < p6[xs_]).double().mean().item()
    assert abs(acceptance(p6, p6) - 1) < 1e-9, "p == q: every draft is accepted"
    assert abs(acceptance(p6, q6) - sim) < 0.02, f"you say {acceptance(p6, q6):.3f}, 20,000 simulated drafts say {sim:.3f}"


check("Exercise 2", check_acceptance)
if SHOW_SOLUTIONS:
    show("03", "acceptance")

# %% [markdown]
# **3.** Write `tau_formula(alpha, gamma)`, the expected tokens per target call with i.i.d.
# acceptance `alpha` and `gamma` drafts. Then predict: the smallest `gamma` whose expected tau
# reaches 90% of the limit `1 / (1 - alpha)` for `alpha = 0.8`; put your prediction in `MY_GAMMA`.

# %%
@exercise("03", "tau_formula")
def tau_formula(alpha, gamma):
    # your code here
    raise NotImplementedError


MY_GAMMA = None                                       # your prediction (an int)


# %%
def check_tau():
    assert abs(tau_formula(0.8, 4) - speculative.expected_tau(0.8, 4)) < 1e-12, "tau_formula(0.8, 4) is off"
    assert tau_formula(0.5, 0) == 1, "with no drafts each call emits exactly one token"
    smallest = next(gm for gm in range(1, 100) if tau_formula(0.8, gm) >= 0.9 / (1 - 0.8))
    guess = smallest if answers_on() else MY_GAMMA
    if guess is None:
        return ...                                    # "not attempted yet": put your prediction in MY_GAMMA
    assert isinstance(guess, int) and not isinstance(guess, bool) and guess >= 1, \
        f"MY_GAMMA must be an int of at least 1, got {guess!r}"
    assert guess == smallest, (f"you predicted gamma = {guess}; tau_formula(0.8, gamma) first reaches 90% of the "
                               f"limit at a {'larger' if guess < smallest else 'smaller'} gamma")


check("Exercise 3", check_tau)
if SHOW_SOLUTIONS:
    show("03", "tau_formula")
    print("tau / limit = 1 - alpha^(gamma+1) >= 0.9  <=>  gamma + 1 >= log(0.1) / log(0.8) = 10.3, so gamma = 10")
