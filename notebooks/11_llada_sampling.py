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
# # 11 · dLLM decoding: LLaDA low-confidence remasking
#
# Chapter 10 trained a denoiser that predicts every masked position at once. Decoding
# (LLaDA, arXiv 2502.09992, Algorithm 5 and Appendix B.2) turns it into a generator:
#
# 1. the answer region of `gen_length` positions starts fully masked after the prompt;
# 2. it is split into blocks of `block_length`, decoded left to right (semi-autoregressive);
# 3. each block gets `steps · block_length / gen_length` steps; the number of tokens committed
#    per step follows a **linear schedule** (remainder to the earliest steps);
# 4. at each step the most **confident** masked positions of the block are committed, where
#    confidence = softmax probability of the predicted token ("low-confidence remasking":
#    the unconfident ones stay masked).
#
# After this chapter you can:
#
# - predict how many tokens each step commits and how many denoiser calls (NFE) a setting
#   costs, including the two cases where NFE is *not* `steps`;
# - write the sampler and random remasking yourself and match `refimpl.diffusion.generate`;
# - read a block × step unmasking grid and confidence heatmap, and say why blocks force a
#   left-to-right order;
# - say, from a measurement, when committing the most confident positions beats committing
#   random ones, and when it does not.

# %% [markdown]
# ## Parameters

# %%
import torch
from refimpl.models import default_device

FAST = True
MODEL = "tiny-dllm"              # King James dLLM
SYNTH = "tiny-dllm-rev"          # digit reversal (exact answers)
AR_MODEL = "tiny"                # judges text quality (perplexity)
DEVICE = default_device()        # a torch.device: CUDA when present, $REFIMPL_DEVICE overrides
GEN = 32                         # answer length for the King James model
N_PROMPTS = 8 if FAST else 24    # held-out prompts for the quality measurements
SEEDS = 2 if FAST else 5         # random-remasking seeds per setting
SHOW_SOLUTIONS = False           # True prints the reference answers below each exercise

# %% [markdown]
# ## Imports and models

# %%
import matplotlib.pyplot as plt
from html import escape
from refimpl import diffusion, digit_reversal, models
from refimpl.bench import dllm as diffusion_bench

dlm = models.load(MODEL, device=DEVICE)
tok, MASK = dlm.tokenizer, dlm.mask_token_id
prompt = tok.encode("And God said unto Noah,")
print(len(prompt), "prompt tokens; MASK id", MASK)

# %% [markdown]
# ## The start state and one denoiser call
# Prompt + `GEN` masks. One forward pass gives logits for every position; for each masked one
# we keep the argmax `x0` and its probability (the confidence).
#
# **A choice of ours: MASK is never a prediction.** We set the MASK logit to `-inf` before the
# argmax. LLaDA's released `generate.py` takes the argmax over the whole vocabulary; if it ever
# picks MASK, committing it leaves the position masked, that commit is wasted and the linear
# schedule cannot make it up (the answer can end with MASKs left). A trained model almost never
# puts mass on MASK (it is never a training target), so the two agree in practice; excluding it
# guarantees every commit writes a token and a half-trained model cannot stall. The cell measures
# how much mass our model puts on MASK.

# %%
x = torch.tensor([prompt + [MASK] * GEN], device=DEVICE)
logits = dlm.logits(x)[0, len(prompt):]                  # (GEN, V)
p_mask = torch.softmax(logits.double(), -1)[:, MASK]
print(f"p(MASK) at most {p_mask.max():.1e}; MASK is the argmax at {int((logits.argmax(-1) == MASK).sum())} positions")
logits[:, MASK] = float("-inf")                          # our choice (see above)
conf, x0 = torch.softmax(logits.double(), -1).max(-1)    # (GEN,), (GEN,)
for i in range(5):
    print(f"position {i}: {tok.decode([int(x0[i])])!r:12} confidence {conf[i]:.3f}")

# %% [markdown]
# ## The linear schedule
# A block with `m` masked positions and `s` steps commits `m // s` tokens per step, plus one for
# the first `m % s` steps (LLaDA's `get_num_transfer_tokens`). When `s > m`, the last `s - m`
# steps commit nothing.

# %%
def schedule_by_hand(m, s):
    return [m // s + (1 if i < m % s else 0) for i in range(s)]

for m, s in [(8, 8), (10, 4), (32, 6), (3, 5)]:
    assert schedule_by_hand(m, s) == diffusion.num_transfer_tokens(torch.tensor([m], device=DEVICE), s)[0].tolist()
    print(m, "tokens in", s, "steps:", schedule_by_hand(m, s))

# %% [markdown]
# ## The sampler, by hand (greedy, one row)
# Blocks left to right; in each step: predict, score, commit the top-`k` masked positions of the
# current block. We record the state after each step and, for the pictures, the confidence of
# every still-masked answer position (also those of later blocks, which may not be committed yet).

# %%
def llada_by_hand(model, prompt, gen_length, steps, block_length, exclude_mask=True):
    P, mask = len(prompt), model.mask_token_id
    x = torch.tensor([prompt + [mask] * gen_length], device=model.device)
    history, confs = [x[0, P:].clone()], []
    for b in range(0, gen_length, block_length):                      # block start, answer coordinates
        for k in filter(None, schedule_by_hand(block_length, steps * block_length // gen_length)):  # k = 0: no call
            lg = model.logits(x)[0, P:]                               # (G, V)
            lg[:, mask] = float("-inf") if exclude_mask else lg[:, mask]
            c, pred = torch.softmax(lg.double(), -1).max(-1)          # (G,), (G,)
            c = c.masked_fill(x[0, P:] != mask, float("-inf"))        # committed positions never again
            confs.append(c.clone())
            idx = b + c[b: b + block_length].topk(k).indices          # the k most confident of the block
            x[0, P + idx] = pred[idx]
            history.append(x[0, P:].clone())
    return x[0, P:].tolist(), history, torch.stack(confs)

# %% [markdown]
# It must agree with `refimpl.diffusion.generate` token for token (`eos_token_id=[]` so neither
# stops at EOS). The last line runs our sampler *without* excluding MASK, as LLaDA's code does:
# on this model it changes nothing.

# %%
for steps, bl in [(GEN, GEN), (GEN, 8), (GEN // 2, 8), (GEN // 4, 16)]:
    mine, _, _ = llada_by_hand(dlm, prompt, GEN, steps, bl)
    lib = diffusion.generate(dlm, [prompt], gen_length=GEN, steps=steps, block_length=bl, eos_token_id=[])
    assert mine == lib.tokens[0], (steps, bl)
    print(f"steps={steps:2d} block={bl:2d}: identical, NFE {lib.stats.nfe}")
_, h8, c8 = llada_by_hand(dlm, prompt, GEN, GEN, 8)                              # kept for the pictures
lax, _, _ = llada_by_hand(dlm, prompt, GEN, GEN, 8, exclude_mask=False)             # as LLaDA's generate.py
assert lax == h8[-1].tolist()
print("MASK allowed as a prediction: the same tokens on this model")

# %% [markdown]
# ## Picture: the block × step unmasking grid and its confidences
# One token per step (`steps = GEN`), once as a single block of 32 and once in blocks of 8. Row =
# step, column = answer position. Colour = the denoiser's confidence in its prediction for a
# still-masked position at that step (the scale stops at the largest one seen: this small model
# is rarely sure); grey = already committed; a black dot = committed at this step (the most
# confident masked position of the current block). With one block the order jumps around (easy
# tokens first, wherever they are); with blocks of 8 it is forced into a staircase, even when a
# later block holds more confident predictions (brighter cells right of the current block).

# %%
_, h32, c32 = llada_by_hand(dlm, prompt, GEN, GEN, GEN)
top = max(c[torch.isfinite(c)].max().item() for c in (c32, c8))
fig, axes = plt.subplots(1, 2, figsize=(10, 4.6), sharey=True)
for ax, hist, cf, bl in [(axes[0], h32, c32, GEN), (axes[1], h8, c8, 8)]:
    ax.set_facecolor("0.75")                                                     # NaN (committed) = grey
    im = ax.imshow(cf.masked_fill(~torch.isfinite(cf), float("nan")).tolist(), cmap="viridis", vmin=0, vmax=top, aspect="auto")
    for s, (a, b) in enumerate(zip(hist, hist[1:])):
        new = torch.where((a == MASK) & (b != MASK))[0].tolist()                # committed at step s
        ax.plot(new, [s] * len(new), "k.")
    for edge in range(bl, GEN, bl):
        ax.axvline(edge - 0.5, color="w", lw=1.5)
    ax.set_title("one block of 32" if bl == GEN else f"blocks of {bl}"); ax.set_xlabel("answer position")
axes[0].set_ylabel("step (one denoiser call)"); fig.colorbar(im, ax=axes, label="confidence of a masked position")
plt.show()

# %% [markdown]
# ## Play: step through the decoding
# Slide through the steps; `▢` is a mask, the highlighted token was committed at this step, `|`
# marks block boundaries. Switch the block length to see the same model write in a different
# order.

# %%
runs = {GEN: h32, 8: h8}                            # the two runs of the picture


def render(step=GEN // 2, block=8):
    hist = runs[block]
    now, prev = hist[step].tolist(), hist[max(step - 1, 0)].tolist()
    spans = []
    for i, (t, t0) in enumerate(zip(now, prev)):
        word = "▢" if t == MASK else escape(tok.decode([t]))
        spans.append(f'<span style="background:#ffd166">{word}</span>' if t != t0 else word)
        spans.append(" | " if (i + 1) % block == 0 and i + 1 < GEN else "")
    left = sum(t == MASK for t in now)
    return f"<b>step {step} of {len(hist) - 1}, blocks of {block}: {left} masks left</b><br>" + "".join(spans)

# %% [markdown]
# The widget:

# %%
import ipywidgets as widgets
from IPython.display import HTML, display


def play(step=GEN // 2, block=8):
    global shown
    shown = render(step, block)
    display(HTML(shown))


ui = widgets.interact(play, step=widgets.IntSlider(continuous_update=False, value=GEN // 2, min=0, max=GEN),
                      block=widgets.Dropdown(options=[8, GEN], value=8)).widget

# %% jupyter={"source_hidden": true} tags=["ci-only", "remove-input"]
# CI's self-test of the widget above (collapsed in the lab): move a control as a person would,
# check that the output changed, then put the control back to its teaching default
default = ui.children[0].value
before = shown
ui.children[0].value = 4                          # move the step slider, as a person would
assert shown != before, "moving a control must change the output"
ui.children[0].value = default

# %% [markdown]
# ## Counting denoiser calls (NFE)
# Each step that commits something costs one forward pass of the denoiser; a step whose schedule
# says 0 is skipped. So NFE equals `steps` exactly when every step commits at least one token
# (`steps ≤ gen_length`, i.e. at most `block_length` steps per block) **and** decoding is not cut
# short by EOS (below).
#
# ### Exercise 1: predict the number of calls
# Write `llada_nfe(gen_length, steps, block_length)`: the number of denoiser calls `generate`
# makes on a fully masked answer with `eos_token_id=[]` (no early stop). Mind `steps > gen_length`.

# %%
from solutions import exercise, check, show


@exercise("11", "llada_nfe")
def llada_nfe(gen_length, steps, block_length):
    # your code here
    raise NotImplementedError

# %% [markdown]
# The check compares with the calls the library counts (`stats.nfe`), on the small digit model:

# %%
rev = models.load(SYNTH, device=DEVICE)


def check_nfe():
    for G, s, b in [(16, 16, 16), (16, 8, 4), (16, 32, 8), (12, 6, 4), (8, 2, 8), (8, 24, 4)]:
        g = diffusion.generate(rev, [[3, 4]], gen_length=G, steps=s, block_length=b, eos_token_id=[])
        assert llada_nfe(G, s, b) == g.stats.nfe, f"gen {G}, steps {s}, block {b}: you say {llada_nfe(G, s, b)}, generate made {g.stats.nfe} calls"


check("Exercise 1", check_nfe)
if SHOW_SOLUTIONS:
    show("11", "llada_nfe")

# %% [markdown]
# The second exception: **EOS stops decoding early.** Once every row has committed an EOS in a
# finished block, later blocks cannot change the returned tokens, so `generate` skips them. The
# digit model answers 6 digits + EOS; give it 16 positions in blocks of 8 and it never decodes
# the second block:

# %%
digits = rev.tokenizer.encode(digit_reversal.synthetic_problem("314159")[0])
for eos in ([], None):                             # [] = never stop; None = the model's EOS
    g = diffusion.generate(rev, [digits], gen_length=16, steps=16, block_length=8, eos_token_id=eos)
    print(f"eos_token_id={eos!s:4}: NFE {g.stats.nfe:2d}, answer {rev.tokenizer.decode(g.tokens[0])!r}")
assert g.stats.nfe == 8

# %% [markdown]
# ## Low-confidence vs random remasking: a measurement
# `remasking="random"` commits random masked positions instead of the most confident ones
# (seeded). Is the model's confidence worth using? We generate from `N_PROMPTS` held-out prompts at
# 1, 2 and 4 tokens per step (blocks of 8), judge the text by its perplexity under the
# autoregressive `tiny` model (lower = more natural), and count adjacent repeated tokens
# ("LORD LORD"), the typical failure of committing several independent guesses at once.

# %%
ar = models.load(AR_MODEL, device=DEVICE)
prompts = diffusion_bench.kjv_prompts(tok, N_PROMPTS, length=32)
repeats = lambda gs: sum(a == b for g in gs for a, b in zip(g, g[1:])) / sum(len(g) - 1 for g in gs)
steps_grid, ppl, rep = [GEN, GEN // 2, GEN // 4], {}, {}
for steps in steps_grid:
    for policy, seeds in (("low_confidence", [0]), ("random", range(SEEDS))):
        for seed in seeds:
            g = diffusion.generate(dlm, prompts, gen_length=GEN, steps=steps, block_length=8, eos_token_id=[],
                                   remasking=policy, generator=torch.Generator(DEVICE).manual_seed(seed), use_kernel=False)
            ppl.setdefault(policy, {}).setdefault(steps, []).append(diffusion_bench.ar_perplexity(ar, prompts, g.tokens))
            rep.setdefault(policy, {}).setdefault(steps, []).append(repeats(g.tokens))
for policy in ppl:
    print(f"{policy:15s}", {GEN // s: [round(p, 1) for p in ppl[policy][s]] for s in steps_grid}, "(tokens/step: perplexities)")

# %% [markdown]
# Drawn (random: one dot per seed, the line through their mean):

# %%
fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
for policy, mk in (("low_confidence", "o-"), ("random", "s--")):
    for ax, d in ((axes[0], ppl), (axes[1], rep)):
        xs = [GEN // s for s in steps_grid]
        ax.plot(xs, [sum(d[policy][s]) / len(d[policy][s]) for s in steps_grid], mk, label=policy)
        for s in steps_grid:
            ax.scatter([GEN // s] * len(d[policy][s]), d[policy][s], s=10, c="0.4")
for ax, yl in zip(axes, ("perplexity under tiny (AR)", "adjacent repeated tokens")):
    ax.set_xlabel("tokens committed per step"); ax.set_ylabel(yl); ax.set_xticks([1, 2, 4]); ax.legend(fontsize=8)
plt.show()
assert max(ppl["low_confidence"][GEN]) < min(ppl["random"][GEN]), "at one token per step confidence should win"

# %% [markdown]
# What it shows, on this model: at one and two tokens per step, low-confidence remasking gives
# clearly more natural text than random (the model writes its sure tokens first and conditions the
# rest on them). At four tokens per step the picture flips here: the most confident positions are
# often neighbours predicting the same frequent token from independent marginals, so low-confidence
# commits "LORD LORD"-style repeats together, while random positions are spread out. Committing
# several independent guesses in one step is the problem of chapter 12. (Perplexity is a crude
# judge: it also rewards repetitive text; the repeat count keeps it honest.)
#
# ## Steps vs accuracy (digit reversal)
# On the exact-answer task neither fewer steps nor the order matters: each answer digit is fixed by
# the prompt alone, and the model is sure of all of them, so even committing everything at once works.

# %%
problems = digit_reversal.synthetic_split()[: 100 if FAST else 500]
for steps in (8, 4, 2, 1):
    acc = {pol: digit_reversal.synthetic_accuracy(rev, problems, steps=steps, use_kernel=False, remasking=pol,
                                                  generator=torch.Generator(DEVICE).manual_seed(0))
           for pol in ("low_confidence", "random")}
    print(f"steps={steps}: {8 // steps} tokens/step, accuracy", {k: f"{v:.0%}" for k, v in acc.items()})

# %% [markdown]
# ### Exercise 2: random remasking
# Write `random_remask(masked, k, gen)`: given the (N,) bool mask of which positions of the block
# are still masked and a count `k`, return an (N,) bool selection of `min(k, #masked)` masked
# positions chosen uniformly at random with `gen` (the predictions `x0` are the same as for
# low-confidence; only *which* positions get committed changes). The check calls it 2,000 times
# on a frozen state of the block and tests that every masked position is chosen equally often
# (chi-square; its negative control, low-confidence choice, must fail), and compares with the
# library's `remasking="random"` choice frequencies on the same state.

# %%
@exercise("11", "random_remask")
def random_remask(masked, k, gen):
    # your code here
    raise NotImplementedError

# %% [markdown]
# The check's setup, on a real block: the denoiser's predictions after 3 of the 8 positions of the
# second block are committed (from the blocks-of-8 run above), and its two controls: the library's
# random choice must pass the uniformity test, the low-confidence choice (always the same two
# positions) must fail it.

# %%
from scipy.stats import chisquare

state = h8[8 + 3]                                      # after step 11: block 2 holds 5 masks
blk_logits = dlm.logits(torch.tensor([prompt + state.tolist()], device=DEVICE))[:, len(prompt) + 8: len(prompt) + 16]
blk_masked = (state[8:16] == MASK)[None].to(DEVICE)  # (1, 8)
m = blk_masked[0]


def choice_counts(choose, n=2000, k=2):                 # times each masked position is chosen in n calls
    gg = torch.Generator(DEVICE).manual_seed(7)
    return torch.stack([choose(k, gg).long() for _ in range(n)]).sum(0)[m]

k_ = lambda k: torch.tensor([k], device=DEVICE)
lib = choice_counts(lambda k, g: diffusion.denoise_step(blk_logits, blk_masked, MASK, k_(k), remasking="random", generator=g)[1][0])
lowc = choice_counts(lambda k, g: diffusion.denoise_step(blk_logits, blk_masked, MASK, k_(k))[1][0])
assert chisquare(lowc.tolist()).pvalue < 1e-3 < chisquare(lib.tolist()).pvalue    # the check's controls

# %% [markdown]
# The check itself:

# %%
def check_random():
    sel = random_remask(m, 2, torch.Generator(DEVICE).manual_seed(0))
    assert sel.dtype == torch.bool and sel.shape == m.shape, f"return an ({len(m)},) bool tensor"
    assert not bool((sel & ~m).any()), "you chose a position that is already committed"
    assert int(sel.sum()) == 2 and int(random_remask(m, 9, torch.Generator(DEVICE)).sum()) == int(m.sum()), "choose min(k, #masked)"
    mine = choice_counts(lambda k, g: random_remask(m, k, g))
    assert chisquare(mine.tolist()).pvalue > 1e-3, f"masked positions chosen {mine.tolist()} times: not uniform"
    print("times chosen  yours:", mine.tolist(), " refimpl random:", lib.tolist(), " low-confidence:", lowc.tolist())


check("Exercise 2", check_random)
if SHOW_SOLUTIONS:
    show("11", "random_remask")

# %% [markdown]
# ## Temperature > 0: Gumbel-max in float64
# LLaDA samples `x0` by adding Gumbel noise to `logits / T` in float64 and taking the argmax,
# which is an exact sample of `softmax(logits / T)`. The confidence stays the *un-noised*
# probability of the sampled token. By hand, with the same generator:

# %%
lg = torch.randn(4, 50, dtype=torch.float64, device=DEVICE)
u = torch.rand(lg.shape, generator=torch.Generator(device=DEVICE).manual_seed(7), dtype=torch.float64, device=DEVICE)
mine = (lg / 0.8 - torch.log(-torch.log(u))).argmax(-1)
lib = diffusion.gumbel_argmax(lg, 0.8, torch.Generator(device=DEVICE).manual_seed(7))   # the same generator device: the same draws
assert torch.equal(mine, lib)
g1 = diffusion.generate(dlm, [prompt], gen_length=16, steps=16, block_length=8, temperature=0.8,
                        generator=torch.Generator(device=DEVICE).manual_seed(1), eos_token_id=[])
print("And God said unto Noah," + tok.decode(g1.tokens[0]))

# %% [markdown]
# Seeded sampling is reproducible: the same generator seed gives the same text.

# %%
g2 = diffusion.generate(dlm, [prompt], gen_length=16, steps=16, block_length=8, temperature=0.8,
                        generator=torch.Generator(device=DEVICE).manual_seed(1), eos_token_id=[])
assert g1.tokens == g2.tokens
print("reproducible")

# %% [markdown]
# ### Exercise 3: margin confidence
# A popular alternative score is the *margin* `p_top1 − p_top2` (how much the best guess beats the
# runner-up, in probability); chapter 12's early commit uses it. Write `margin(logits)` for logits
# (..., V) returning (...). The check compares with `refimpl.diffusion.top2_gap` on random logits
# and on the real block above.

# %%
@exercise("11", "margin")
def margin(logits):
    # your code here
    raise NotImplementedError

# %% [markdown]
# The check:

# %%
def check_margin():
    lg = torch.randn(3, 5, 40, generator=torch.Generator(device=DEVICE).manual_seed(0), device=DEVICE)
    assert torch.allclose(margin(lg).double(), diffusion.top2_gap(lg)), "p_top1 - p_top2 of the softmax, not of the logits"
    assert torch.allclose(margin(blk_logits).double(), diffusion.top2_gap(blk_logits)), "on the real block"
    assert bool((margin(lg) >= 0).all()) and bool((margin(lg) <= 1).all()), "a gap of probabilities lies in [0, 1]"


check("Exercise 3", check_margin)
if SHOW_SOLUTIONS:
    show("11", "margin")

# %% [markdown]
# ## Summary
# - LLaDA decoding = start fully masked, commit the most confident masked positions of the
#   current block per a linear schedule; blocks go left to right.
# - NFE = `steps` when `steps ≤ gen_length` and no early EOS stop; with more steps than
#   positions per block the empty steps are skipped, and once every row has an EOS in a finished
#   block the remaining blocks are skipped. Fewer steps means several tokens per call.
# - Measured here: low-confidence beats random remasking at one or two tokens per step; at four
#   per step its clustered choices repeat tokens and random does as well or better (chapter 12).
# - Excluding MASK from the predictions is our choice (LLaDA's code does not); temperature uses
#   float64 Gumbel-max.
