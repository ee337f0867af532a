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
# # 12 · dLLM parallel decoding: thresholds, early commit, and where it breaks
#
# LLaDA's schedule (chapter 11) commits a *fixed* number of tokens per denoiser call. Fast-dLLM
# ("Fast-dLLM: Training-free Acceleration of Diffusion LLM by Enabling KV Cache and Parallel
# Decoding", arXiv 2505.22618) lets the model's confidence decide how many:
#
# - **threshold** `t`: commit every masked position of the block whose confidence exceeds `t`,
#   and always at least the single most confident one;
# - **factor** `f`: commit the top `n` positions while `(n + 1)(1 − c_(n)) < f`.
#
# Prophet ("Diffusion Language Models Know the Answer Before Decoding", arXiv 2508.19982) adds
# **early commit**: once the model's top-1 / top-2 gap is large, commit everything left in one call.
# We build each rule by hand, check it against `refimpl.diffusion`, measure calls against quality,
# and end with a task on which parallel decoding *must* fail (ParallelBench: positions decoded from
# independent marginals).
#
# **After this chapter you can**
#
# 1. apply the threshold and factor rules to a vector of confidences, and say what the factor rule
#    with `f = 1` guarantees (the committed tokens are the most likely *joint* answer) and show it by brute force;
# 2. read from a confidence trace how many denoiser calls a threshold will need, on a sure model and an unsure one;
# 3. write an early-commit test and reproduce `diffusion.generate(early_commit=...)` token for token and call for call,
#    and say how our rule simplifies Prophet's;
# 4. tell a batch's calls (`stats.nfe`) from the calls one prompt needs;
# 5. predict how often independent marginals give a valid answer, and name the tasks where a threshold cannot save you.

# %% [markdown]
# ## Parameters

# %%
import torch
from refimpl.models import default_device

FAST = True                        # CI default: few prompts, short answers
MODEL = "tiny-dllm"                # chapter 10's King James dLLM (unsure of most tokens)
SYNTH = "tiny-dllm-rev"            # digit reversal (sure of almost every token)
AR_MODEL = "tiny"                  # judges the King James text (perplexity)
DEVICE = default_device()          # a torch.device: CUDA when present, $REFIMPL_DEVICE overrides
GEN, BLOCK = 32, 8
N_PROMPTS = 3 if FAST else 12
SHOW_SOLUTIONS = False

# %% [markdown]
# ## Imports and models

# %%
import itertools
import math
import matplotlib.pyplot as plt
from kernels.confidence_select import confidence_select, confidence_select_reference
from refimpl import diffusion, digit_reversal, models
from refimpl.bench import dllm as diffusion_bench
from solutions import exercise, check, show

dlm, ar, rev = (models.load(n, device=DEVICE) for n in (MODEL, AR_MODEL, SYNTH))
tok, MASK = dlm.tokenizer, dlm.mask_token_id
prompts = diffusion_bench.kjv_prompts(tok, N_PROMPTS, length=32)
rev_prompt = rev.tokenizer.encode(digit_reversal.synthetic_problem("314159")[0])   # "314159="


def calls(n):
    """The count of model calls in words: "1 call", "2 calls"."""
    return f"{n} call" + ("" if n == 1 else "s")

# %% [markdown]
# ## The threshold rule, by hand
# Confidences of a block's positions (`-inf` = already committed). Commit those above `t`;
# if none is, commit the best one anyway, so every call makes progress.

# %%
def threshold_by_hand(conf, t):                      # conf (N,)
    sel = conf > t
    if not sel.any() and torch.isfinite(conf).any():
        sel[conf.argmax()] = True
    return sel

conf = torch.tensor([0.97, 0.42, float("-inf"), 0.93, 0.88], dtype=torch.float64, device=DEVICE)
for t in (0.9, 0.99):
    assert torch.equal(threshold_by_hand(conf.clone(), t), diffusion.select_threshold(conf[None], t)[0])
    print(f"t={t}: commit", threshold_by_hand(conf.clone(), t).nonzero().flatten().tolist())

# %% [markdown]
# ## The factor rule and what `f = 1` guarantees
# Fast-dLLM's factor rule: sort the masked confidences `c_(1) ≥ c_(2) ≥ …` and commit the top `n`,
# `n` the largest with `(n + 1)(1 − c_(n)) < f` (at least one). It comes from the paper's Theorem 1.
# Write `ε = 1 − c_(n)`, the largest chance that one of the `n` committed guesses is wrong. Then
#
# - the tuple of guesses is all right with probability at least `1 − nε` (union bound), while
# - any other tuple differs from it somewhere, so its probability is at most `ε`.
#
# So with **`f = 1`**, i.e. `(n + 1)ε < 1`, the guesses taken one position at a time (from the
# marginals) are exactly the most likely **joint** answer for those `n` positions: committing them
# in one call loses nothing against greedy joint decoding. `f > 1` commits more and gives up that
# guarantee; `f < 1` is more cautious.
#
# ### Exercise 1: the factor rule
# Write `factor_select(conf, f)`: `conf` a 1-D float tensor of confidences (`-inf` for positions
# already committed), returns a bool tensor of the same shape, `True` where the rule commits.

# %%
@exercise("12", "factor_select")
def factor_select(conf, f):
    # your code here
    raise NotImplementedError

# %% [markdown]
# The check compares your selection with the library's `diffusion.select_factor` on random blocks,
# on blocks where every masked position is confident, and on a block where nothing is masked.

# %%
def check_factor_select():
    g = torch.Generator(device=DEVICE).manual_seed(0)                      # confidences live next to the logits
    for trial in range(30):
        c = torch.rand(7, generator=g, dtype=torch.float64, device=DEVICE) ** 0.15   # mostly confident
        c[torch.rand(7, generator=g, device=DEVICE) < 0.3] = float("-inf")           # some already committed
        for f in (0.1, 0.5, 1.0, 2.0):
            got, want = factor_select(c.clone(), f), diffusion.select_factor(c[None], f)[0]
            assert got.dtype == torch.bool and got.shape == c.shape, "return a bool tensor shaped like conf"
            assert torch.equal(got, want), f"f={f}, conf={c.tolist()}: you commit {got.nonzero().flatten().tolist()}, " \
                                          f"the rule commits {want.nonzero().flatten().tolist()}"
    sure = torch.full((6,), 0.999, dtype=torch.float64, device=DEVICE)  # every position passes the rule
    for c in (sure, torch.where(torch.arange(6, device=DEVICE) % 2 == 0, sure, float("-inf"))):
        got, want = factor_select(c.clone(), 1.0), diffusion.select_factor(c[None], 1.0)[0]
        assert torch.equal(got, want), (f"conf={c.tolist()} (every masked position confident): you commit "
                                        f"{got.nonzero().flatten().tolist()}, the rule commits all of them")
    got = factor_select(torch.full((6,), float("-inf"), dtype=torch.float64, device=DEVICE), 1.0)
    assert not got.any(), f"nothing is masked (every conf is -inf): commit nothing, you commit {got.nonzero().flatten().tolist()}"


check("Exercise 1", check_factor_select)
if SHOW_SOLUTIONS:
    show("12", "factor_select")

# %% [markdown]
# ## The `f = 1` guarantee, by brute force
# Random joint distributions over 3 positions with 3 possible tokens each (peaked, like a model
# that is fairly sure). For each: the marginals give confidences and guesses, the factor rule picks
# the positions to commit, and we compare the guesses with the argmax of the exact joint of the
# committed positions. With `f = 1` they never differ; with larger `f` they sometimes do.

# %%
def factor_vs_joint(f, trials=1000, n=3, V=3, seed=0):
    g, multi, differ = torch.Generator(device=DEVICE).manual_seed(seed), 0, 0
    for _ in range(trials):
        J = torch.rand((V,) * n, generator=g, dtype=torch.float64, device=DEVICE) ** 16
        J /= J.sum()                                                      # the joint, (V, V, V)
        marg = torch.stack([J.sum(dim=[d for d in range(n) if d != i]) for i in range(n)])  # (n, V)
        conf, guess = marg.max(-1)
        keep = diffusion.select_factor(conf[None], f)[0].nonzero().flatten().tolist()
        sub = J.sum(dim=[d for d in range(n) if d not in keep]) if len(keep) < n else J
        best = [int(i) for i in torch.unravel_index(sub.argmax(), sub.shape)]
        multi, differ = multi + (len(keep) > 1), differ + (best != guess[keep].tolist())
    return multi, differ

# %% [markdown]
# The counts, for `f = 1` and two larger factors:

# %%
results = {f: factor_vs_joint(f) for f in (1.0, 1.5, 3.0)}
for f, (multi, differ) in results.items():
    print(f"f = {f}: committed 2+ positions in {multi} of 1000 cases; guesses != joint argmax in {differ}")
assert results[1.0][1] == 0 and results[1.5][1] > 0

# %% [markdown]
# ## A threshold sampler, by hand (greedy, one row)
# Same blocks as LLaDA, but each block loops until it has no mask left, so the number of calls is
# decided by the confidences (the `steps` argument of the library is not used in this mode). We
# keep a trace: per call, the confidences of the block and what was committed.

# %%
def threshold_sampler(model, prompt, gen_length, block_length, t):
    P, mask = len(prompt), model.mask_token_id
    x, trace = torch.tensor([prompt + [mask] * gen_length], device=DEVICE), []
    for s in range(P, P + gen_length, block_length):
        while (x[0, s: s + block_length] == mask).any():
            lg = model.logits(x)[0, s: s + block_length]
            lg[:, mask] = float("-inf")                                  # MASK is never a prediction
            c, pred = torch.softmax(lg.double(), -1).max(-1)
            c[x[0, s: s + block_length] != mask] = -float("inf")
            sel = threshold_by_hand(c, t)
            x[0, s: s + block_length][sel] = pred[sel]
            trace.append((s - P, c, sel))                                # one entry per denoiser call
    return x[0, P:].tolist(), trace

# %% [markdown]
# Check against `refimpl.diffusion.generate(threshold=...)` (which selects with the fused kernel)
# on both models: the same tokens, and as many calls as our trace has entries.

# %%
for name, model, prompt, G, b, ts in [("tiny-dllm", dlm, prompts[0], GEN, BLOCK, (0.9, 0.1, 0.05)),
                                      ("tiny-dllm-rev", rev, rev_prompt, 8, 8, (0.9, 0.5))]:
    for t in ts:
        mine, trace = threshold_sampler(model, prompt, G, b, t)
        lib = diffusion.generate(model, [prompt], gen_length=G, block_length=b, threshold=t, eos_token_id=[])
        assert mine == lib.tokens[0] and len(trace) == lib.stats.nfe
        print(f"{name:14s} threshold {t}: identical, {calls(lib.stats.nfe)} for {G} tokens")

# %% [markdown]
# ## Confidence against the threshold
# Each dot is one still-masked position of the current block at one call; filled dots are the
# ones committed by that call. The digit-reversal model gives all 8 positions a confidence of about
# 1.0 at the first call (the dots overlap), so one call decodes the whole answer. The King James model
# rarely clears even `t = 0.1`: most calls commit only their single best position, often below the
# line (the "at least one" fallback).

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.2), gridspec_kw=dict(width_ratios=[3, 1]))
for ax, (name, model, prompt, G, b, t) in zip(axes, [("tiny-dllm", dlm, prompts[0], GEN, BLOCK, 0.1),
                                                     ("tiny-dllm-rev", rev, rev_prompt, 8, 8, 0.9)]):
    _, trace = threshold_sampler(model, prompt, G, b, t)
    for call, (_, c, sel) in enumerate(trace):
        m = torch.isfinite(c)
        ax.scatter([call] * int((m & ~sel).sum()), c[m & ~sel].tolist(), s=12, facecolors="none", edgecolors="0.5")
        ax.scatter([call] * int(sel.sum()), c[sel].tolist(), s=16, color="tab:green")
    ax.axhline(t, color="tab:red", ls="--", lw=1, label=f"threshold t = {t}")
    ax.set_xlabel("denoiser call"); ax.set_ylabel("confidence"); ax.set_ylim(0, 1.05); ax.legend(fontsize=8)
    ax.set_xticks(range(0, len(trace), max(1, len(trace) // 10)))
    ax.set_title(f"{name}: {calls(len(trace))} for {G} tokens (filled = committed)", fontsize=9)
plt.tight_layout(); plt.show()

# %% [markdown]
# ## Calls against tokens per call
# The same story as counts: how many tokens each call committed (`stats.extra["committed"]`), for
# three thresholds on one King James prompt. Lowering the threshold makes the steps taller and the
# run shorter; on this model a useful saving needs a threshold far below Fast-dLLM's default 0.9.
# From here on the library selects in torch (`use_kernel=False`): the same tokens as the kernel
# (checked above), but under `TRITON_INTERPRET=1`, as CI runs the notebooks, the Triton kernel runs
# in a Python interpreter and is slow.

# %%
fig, ax = plt.subplots(figsize=(8, 2.8))
for t, colour in [(0.9, "tab:blue"), (0.1, "tab:orange"), (0.05, "tab:green")]:
    g = diffusion.generate(dlm, [prompts[0]], gen_length=GEN, block_length=BLOCK, threshold=t, eos_token_id=[],
                           use_kernel=False)
    per_call = [c[0] for c in g.stats.extra["committed"]]
    assert sum(per_call) == GEN and len(per_call) == g.stats.nfe
    ax.step(range(1, len(per_call) + 1), per_call, where="mid", color=colour, label=f"t = {t}: {calls(g.stats.nfe)}")
ax.set_xlabel("denoiser call"); ax.set_ylabel("tokens committed"); ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## The kernel behind the selection
# `kernels.confidence_select` fuses argmax, softmax probability (online max/sum over vocab
# tiles) and top-k / threshold selection. On CPU without `TRITON_INTERPRET=1` the dispatcher
# runs the torch reference; on a GPU, the Triton kernel. Both compute the same thing:

# %%
lg = torch.randn(2, BLOCK, len(tok), device=DEVICE) * 4
masked = torch.rand(2, BLOCK, device=DEVICE) < 0.7
a = confidence_select(lg, masked, threshold=0.5)
b = confidence_select_reference(lg, masked, threshold=0.5)
assert torch.equal(a[0], b[0]) and torch.equal(a[2], b[2]) and torch.allclose(a[1], b[1])
print("selected per row:", a[2].sum(-1).tolist())

# %% [markdown]
# ## Early commit
# Prophet's observation: long before the last step, the model's answer often stops changing. Its
# rule, after each call: look at the gap between the top-1 and top-2 candidates; if it is large,
# stop refining and commit **every** remaining masked position at once (its argmax).
#
# **Ours is a simplification of Prophet's.** `diffusion.generate(early_commit=g)` commits everything
# when the *mean*, over all still-masked answer positions (the current block and every later one), of
# the *probability* gap `p_top1 − p_top2` is at least `g`, one fixed `g` for the whole run. Prophet's
# code differs in three ways: it measures the gap between the top-2 *logits*; it watches only a few
# positions where the final answer goes (its evaluation forces the text "The answer is" at a fixed
# place and watches the 5 tokens after it); and its threshold falls as decoding progresses (7.5, 5.0,
# 2.5 in the first, second and last third of the steps). Our text has no "answer" span, so we watch
# everything that is left.
#
# ### Exercise 2: the early-commit test
# Write `commit_all_now(tail_logits, tail_masked, gap)`: `tail_logits` (N, V) are this call's logits
# for the answer positions from the current block's start to the end (MASK already set to `-inf`),
# `tail_masked` (N,) marks the ones still masked. Return `True` when our rule commits them all.

# %%
@exercise("12", "commit_all_now")
def commit_all_now(tail_logits, tail_masked, gap):
    # your code here
    raise NotImplementedError

# %% [markdown]
# The sampler that uses it: chapter 11's LLaDA loop (greedy, low-confidence remasking, the linear
# schedule), plus your test after every call. The `decide` argument lets us reuse it below.

# %%
def llada_early_commit(model, prompt, G, steps, b, gap, decide):
    P, mask = len(prompt), model.mask_token_id
    x, calls = torch.tensor([prompt + [mask] * G], device=DEVICE), 0
    for s in range(P, P + G, b):
        for k in diffusion.num_transfer_tokens((x[:, s: s + b] == mask).sum(-1), steps // (G // b))[0].tolist():
            if k == 0 or not (x[0, s: s + b] == mask).any():
                continue                                                 # nothing to commit: no call
            lg = model.logits(x)[0]; calls += 1; lg[:, mask] = float("-inf")
            tail = x[0, s:] == mask
            if decide(lg[s:], tail, gap):                                # commit everything left
                x[0, s:][tail] = lg[s:].argmax(-1)[tail]
                continue
            c, pred = torch.softmax(lg[s: s + b].double(), -1).max(-1)
            c[x[0, s: s + b] != mask] = -float("inf")
            top = torch.sort(c, descending=True, stable=True).indices[:k]
            x[0, s + top] = pred[top]
    return x[0, P:].tolist(), calls

# %% [markdown]
# The check: your sampler against `diffusion.generate(..., early_commit=gap)` on King James prompts
# (gaps at which the rule fires mid-run, and one at which it never fires) and on digit reversal:
# the same tokens and the same number of calls.

# %%
def check_early_commit():
    cases = [(dlm, p, GEN, BLOCK, gap) for p in prompts[:2] for gap in (0.06, 0.1, 0.5)]
    cases += [(rev, rev.tokenizer.encode(digit_reversal.synthetic_problem(d)[0]), 8, 8, 0.99999)
              for d in ("314159", "271828", "161803", "141421")]
    fired = 0
    for model, prompt, G, b, gap in cases:
        lib = diffusion.generate(model, [prompt], gen_length=G, steps=G, block_length=b, early_commit=gap,
                                 eos_token_id=[], use_kernel=False)
        mine, calls = llada_early_commit(model, prompt, G, G, b, gap, commit_all_now)
        fired += lib.stats.extra["early_commits"]
        assert mine == lib.tokens[0], f"gap {gap}: your tokens differ from early_commit={gap}'s"
        assert calls == lib.stats.nfe, f"gap {gap}: {calls} calls, the library needed {lib.stats.nfe}"
    assert fired > 0, "(the check itself: no case committed early)"


check("Exercise 2", check_early_commit)
if SHOW_SOLUTIONS:
    show("12", "commit_all_now")

# %% [markdown]
# ## When does it fire? The gap along a run
# Run the plain LLaDA sampler (`decide` records the mean gap and never commits) and plot the mean
# top-1/top-2 gap of the remaining positions after each call. Early commit with threshold `g` fires
# at the first call where the curve reaches `g`; the library's call count must agree.

# %%
gaps = []
def record_gap(tail_logits, tail_masked, gap):
    gaps.append(float(diffusion.top2_gap(tail_logits[None])[0][tail_masked].mean()))
    return False

llada_early_commit(dlm, prompts[0], GEN, GEN, BLOCK, None, record_gap)
for g_ in (0.2, 0.1, 0.06):
    fires = next((i + 1 for i, v in enumerate(gaps) if v >= g_), len(gaps))
    lib = diffusion.generate(dlm, [prompts[0]], gen_length=GEN, steps=GEN, block_length=BLOCK, early_commit=g_,
                             eos_token_id=[], use_kernel=False)
    assert lib.stats.nfe == fires, (g_, lib.stats.nfe, fires)
    print(f"early_commit={g_}: {calls(fires)} instead of {len(gaps)}")

# %% [markdown]
# The picture: the model is unsure almost everywhere, so the mean gap stays low; it gets noisy near
# the end, when few masks remain and one confident position moves the mean. A crossing (marked)
# commits every remaining position from that call's predictions at once: the sooner it fires, the
# more tokens are guessed without seeing each other (the perplexity below shows the price).

# %%
fig, ax = plt.subplots(figsize=(8, 2.8))
ax.plot(range(1, len(gaps) + 1), gaps, "o-", ms=3, label="mean top-1/top-2 gap of the remaining masks")
for g_, colour in [(0.2, "tab:red"), (0.1, "tab:orange"), (0.06, "tab:green")]:
    ax.axhline(g_, color=colour, ls="--", lw=1, label=f"early_commit = {g_}")
    hit = next((i for i, v in enumerate(gaps) if v >= g_), None)
    if hit is not None:
        ax.plot(hit + 1, gaps[hit], "*", ms=14, color=colour)
for k in range(BLOCK, GEN, BLOCK):
    ax.axvline(k + 0.5, color="0.8", lw=0.8)
ax.set_xlabel("denoiser call (one token per call)"); ax.set_ylabel("mean gap"); ax.set_ylim(0, 0.3)
ax.legend(fontsize=7, loc="upper left", ncol=2)
plt.show()

# %% [markdown]
# ## Counting calls: a batch, or one prompt
# `stats.nfe` counts denoiser **calls**, and one call serves every row of a batch. With a threshold
# each row needs its own number of calls, but the batch keeps calling until its slowest row has
# filled the block, so the batch's `stats.nfe` is at least each row's count. To compare settings per
# prompt we decode each prompt on its own, where `stats.nfe` is that prompt's calls.

# %%
kw = dict(gen_length=GEN, block_length=BLOCK, threshold=0.1, eos_token_id=[], use_kernel=False)
batch = diffusion.generate(dlm, prompts, **kw)
alone = [diffusion.generate(dlm, [p], **kw).stats.nfe for p in prompts]
print(f"threshold 0.1: the batch of {len(prompts)} made {calls(batch.stats.nfe)}; alone, the prompts need {alone}")
assert batch.stats.nfe >= max(alone)

# %% [markdown]
# ## Calls against quality (King James)
# Three ways to spend fewer calls: LLaDA with fewer steps (fixed `k` per call), a threshold, early
# commit. Quality = perplexity of the continuation under the AR `tiny` model (lower is better).

# %%
def calls_and_ppl(**kw):
    gens = [diffusion.generate(dlm, [p], gen_length=GEN, block_length=BLOCK, eos_token_id=[], use_kernel=False, **kw)
            for p in prompts]
    calls = sum(g.stats.nfe for g in gens) / len(gens)                   # per prompt, decoded alone
    return calls, diffusion_bench.ar_perplexity(ar, prompts, [g.tokens[0] for g in gens])

llada = [calls_and_ppl(steps=s) for s in (GEN, GEN // 2, GEN // 4)]
thresh = [calls_and_ppl(threshold=t) for t in (0.9, 0.2, 0.1, 0.05)]
early = [calls_and_ppl(steps=GEN, early_commit=g_) for g_ in (0.2, 0.1, 0.08, 0.06)]
for name, pts in [("LLaDA", llada), ("threshold", thresh), ("early commit", early)]:
    print(f"{name:13s}", "; ".join(f"{n:.1f} calls, perplexity {p:.1f}" for n, p in pts))

# %% [markdown]
# On the plot, down-left is better. The tiny model is unsure of most tokens, so high
# thresholds save little; lower thresholds trade quality for fewer calls. A stronger text model
# does not change that here: chapter 14 adapts the AR `tiny` itself into a block-diffusion LM
# (`tiny-bdlm`), whose text is far more likely under `tiny` at every number of calls, and a 0.9
# threshold still commits one token per call, because even the AR model is 90% sure of the next King
# James token at well under 1% of positions (chapter 14 measures the confidence at each distance).
# The digit-reversal task below is where thresholds pay.

# %%
plt.figure(figsize=(5, 3.2))
plt.plot(*zip(*llada), "o-", label="LLaDA (fixed k per call)")
plt.plot(*zip(*thresh), "s-", label="threshold (Fast-dLLM)")
plt.plot(*zip(*early), "^-", label="early commit (Prophet-style)")
plt.xlabel("denoiser calls per prompt"); plt.ylabel("perplexity under tiny"); plt.legend(fontsize=8); plt.show()

# %% [markdown]
# ## Calls against accuracy (digit reversal)
# A confident model is where the adaptive rules shine: one call decodes the whole answer. Here the
# problems go as one batch, so the calls are the batch's (every row's answer is 8 tokens).

# %%
problems = digit_reversal.synthetic_split()[: 100 if FAST else 500]
RULES = {"LLaDA, 8 steps (one token a call)": dict(), "LLaDA, 4 steps": dict(steps=4),
         "threshold 0.9": dict(threshold=0.9), "threshold 0.99": dict(threshold=0.99), "factor f = 1": dict(factor=1.0)}
for rule, kw in RULES.items():
    acc, g = digit_reversal.synthetic_accuracy(rev, problems, return_generation=True, use_kernel=False, **kw)
    print(f"{rule:34s} {calls(g.stats.nfe)} for the batch of {len(problems)}, accuracy {acc:.1%}")

# %% [markdown]
# ## Play with the threshold
# One King James prompt decoded with threshold `t`; each token is coloured by the call that
# committed it and carries that call's number (tokens sharing a colour went in the same call: every
# call gets its own colour, successive calls contrasting ones).

# %%
import ipywidgets as widgets
from IPython.display import HTML, display
from figures import tokens_by_call


def render(t=0.9, prompt_index=0):
    toks, trace = threshold_sampler(dlm, prompts[prompt_index], GEN, BLOCK, t)   # == the library (checked above)
    call_of = {start + int(i): r for r, (start, _, sel) in enumerate(trace) for i in sel.nonzero().flatten()}
    spans = tokens_by_call([tok.decode([x]) for x in toks], [call_of[p] for p in range(len(toks))])
    return f"<b>{calls(len(trace))} for {GEN} tokens</b> (threshold {t:.2f})<br>" + spans

# %% [markdown]
# The widget:

# %%
def play(t=0.9, prompt_index=0):
    global shown
    shown = render(t, prompt_index)
    display(HTML(shown))


ui = widgets.interact(play, t=widgets.FloatSlider(continuous_update=False, value=0.9, min=0.02, max=1.0, step=0.02),
                      prompt_index=widgets.IntSlider(continuous_update=False, value=0, min=0, max=len(prompts) - 1,
                                                    description="prompt")).widget

# %% jupyter={"source_hidden": true} tags=["ci-only", "remove-input"]
# CI's self-test of the widget above (collapsed in the lab): move a control as a person would,
# check that the output changed, then put the control back to its teaching default
default = ui.children[0].value
before = shown
ui.children[0].value = 0.04                        # move the threshold slider
assert shown != before, "moving the slider must change the output"
ui.children[0].value = default

# %% [markdown]
# ## Where parallel decoding breaks
# Take a task with **several valid answers**: "list the items 1..n in any order" (every
# permutation is right). An ideal denoiser gives each masked position the *conditional*
# distribution: uniform over the items not yet used by committed positions. The toy below is
# exactly that model (no training), with items as tokens 3..n+2.

# %%
class PermutationModel:
    """Exact conditionals of the uniform distribution over permutations of n items."""
    mask_token_id, eos_token_id, pad_token_id = 2, 0, 1
    device = DEVICE                                          # generate puts the ids here, as for a real model

    def __init__(self, n):
        self.n = n

    def logits(self, ids):                                   # (B, T) -> (B, T, V)
        out = torch.full((*ids.shape, self.n + 3), float("-inf"), device=ids.device)
        ans = ids[:, -self.n:]                               # the answer region
        for b in range(ids.size(0)):
            used = set(ans[b].tolist())
            free = [i for i in range(3, self.n + 3) if i not in used]
            out[b, -self.n:, free] = 0.0                     # uniform over unused items
        return out

# %% [markdown]
# One token per call samples from the true joint: always a permutation. Committing all positions
# in one call samples each from its *marginal* independently: duplicates appear. Greedy is worse
# still: every position has the same argmax, so the answer is never valid.

# %%
def valid_rate(n, **kw):
    g = diffusion.generate(PermutationModel(n), [[5]] * 400, gen_length=n, block_length=n, eos_token_id=[],
                           generator=torch.Generator(device=DEVICE).manual_seed(0), use_kernel=False, **kw)
    return sum(len(set(t)) == n for t in g.tokens) / len(g.tokens)

n = 3
for name, kw in [("one per call, T=1", dict(steps=n, temperature=1.0)),
                 ("all at once, T=1", dict(steps=1, temperature=1.0)),
                 ("all at once, greedy", dict(steps=1)),
                 ("threshold 0.9, greedy", dict(threshold=0.9))]:
    print(f"{name:22s} valid {valid_rate(n, **kw):.0%}")

# %% [markdown]
# Why the threshold saves us here: every marginal confidence is `1/n < 0.9`, so the rule falls
# back to one token per call, and each commit conditions the next. A confidence threshold only
# protects you when low confidence *signals* the dependency; ParallelBench shows tasks where models
# are confidently wrong in parallel (e.g. a marginal of 0.95 on two slots that must differ).

# %%
print("threshold 0.3 (= below 1/n):", f"{valid_rate(n, threshold=0.3):.0%} valid")
assert valid_rate(n, steps=n, temperature=1.0) == 1.0 and valid_rate(n, steps=1) == 0.0

# %% [markdown]
# ### Exercise 3: how often do independent marginals give a valid answer?
# Each of `n` positions picks uniformly from `n` items, independently (all at once, `T = 1`).
# Predict `p_valid(n)`, the probability that the result is a permutation, as a formula.

# %%
@exercise("12", "p_valid")
def p_valid(n):
    # your code here
    raise NotImplementedError

# %% [markdown]
# The check counts the valid outcomes among all `n^n` equally likely ones (brute force) and compares
# with the sampler above (all at once, `T = 1`).

# %%
def check_p_valid():
    for n in (1, 2, 3, 4, 5):
        brute = sum(len(set(o)) == n for o in itertools.product(range(n), repeat=n)) / n ** n
        assert abs(p_valid(n) - brute) < 1e-12, f"n = {n}: you say {p_valid(n)}, counting gives {brute}"
    sampled = valid_rate(3, steps=1, temperature=1.0)
    assert abs(p_valid(3) - sampled) < 0.08, f"n = 3: you say {p_valid(3):.3f}, 400 samples gave {sampled:.3f}"


check("Exercise 3", check_p_valid)
if SHOW_SOLUTIONS:
    show("12", "p_valid")

# %% [markdown]
# ## Summary
# - Threshold and factor decoding adapt the tokens per call to the model's confidence: a sure
#   model (digit reversal) decodes in one call; an unsure one falls back toward one per call.
# - The factor rule with `f = 1` is Fast-dLLM's Theorem 1: the committed guesses are the most likely
#   joint answer for those positions; larger `f` trades that guarantee for fewer calls.
# - Early commit (ours: a mean probability gap with one threshold; Prophet: a logit gap on the
#   answer span with a falling threshold) stops refining once the rest looks settled.
# - A batch's `stats.nfe` counts calls shared by all rows; per prompt, decode alone.
# - Parallel commits sample from a product of marginals: tasks with several valid joint answers
#   break unless the confidence signal forces sequential steps.
# - Next, chapter 13 makes each call cheaper (block KV caches); chapter 14 adapts a real AR model into
#   a block-diffusion LM and decodes without changing the output (draft-and-verify).
