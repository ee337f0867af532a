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
# # 02 · Draft, then verify (greedy blockwise decoding)
#
# Chapter 00 showed that scoring `gamma + 1` tokens costs about as much as scoring one: a decode
# step reads every weight once, whatever the (small) number of tokens. So if a cheap **draft**
# model guesses the next `gamma` tokens, the **target** can check all of them in *one* forward
# pass and keep the longest prefix it agrees with, plus one token of its own.
# Under greedy decoding the output is *identical* to the target's own greedy output.
#
# Papers: Stern et al., *Blockwise Parallel Decoding for Deep Autoregressive Models*
# (arXiv 1811.03115); Leviathan et al., *Fast Inference from Transformers via Speculative
# Decoding* (arXiv 2211.17192), greedy case.
#
# Each piece is built by hand, then checked against `refimpl.speculative`. After this notebook you can
# 1. draft `gamma` tokens with the draft's KV cache and verify them with **one** target pass
#    (longest prefix equal to the target's argmaxes + the target's own next token);
# 2. say which cache entries each step keeps and which it rolls back, and read a draft / verify /
#    roll-back timeline of a real run;
# 3. explain why the output is identical to greedy decoding of the target, for any draft;
# 4. measure tau (tokens per target call) against `gamma`, and tell the per-token acceptance
#    probability `alpha` (chapter 00) from the acceptance rate `accepted / proposed`;
# 5. check the `kernels.verify_greedy` Triton kernel against a verification you write yourself.

# %% [markdown]
# ## Parameters

# %%
import torch
from refimpl.models import default_device

FAST = True                       # CI default: short generations
TARGET = "tiny"                   # any zoo name or local Hugging Face folder
DRAFT = "tiny-draft"              # falls back to the target's first layers if absent
DEVICE = default_device()         # a torch.device: CUDA when present, $REFIMPL_DEVICE overrides
NEW_TOKENS = 32 if FAST else 128
GAMMAS = [1, 2, 3, 4, 6, 8] if FAST else list(range(1, 13))
PROMPT = "And it came to pass, when the king heard"
SHOW_SOLUTIONS = False            # True prints the reference answers of the exercises

# %% [markdown]
# ## The target and the draft
# The draft must share the target's tokenizer. The zoo's `tiny-draft` is a small model distilled
# from `tiny` (chapter 04a). If it is not there, we fall back to an **early-exit** draft: the
# target's first two layers, its final norm and its LM head (a "self-speculative" draft, also in
# chapter 04a). Everything below works with either.
#
# `encode_prompt(lm, text)` turns the prompt text into token ids: for a chat model (one whose
# tokenizer has a chat template, like an instruct SmolLM2) it wraps the text as a user turn, so
# the model answers it; for `tiny` it is plain `lm.encode(text)`.

# %%
import copy
from transformers import AutoModelForCausalLM
from refimpl import models, autoregressive, speculative
from refimpl.models import LM
from refimpl.prompts import encode_prompt   # a user turn for a chat model, plain tokens otherwise
from kernels.verify_greedy import verify_greedy


def early_exit_draft(lm, layers=2):
    cfg = copy.deepcopy(lm.model.config)
    cfg.num_hidden_layers = layers
    m = AutoModelForCausalLM.from_config(cfg)
    m.load_state_dict(lm.model.state_dict(), strict=False)  # layers >= `layers` are dropped
    return LM(m.to(lm.device), lm.tokenizer, name=f"{lm.name}-exit{layers}")


# %% [markdown]
# Load both; report which draft we got and how much smaller it is.

# %%
target = models.load(TARGET, device=DEVICE)
try:
    draft = models.load(DRAFT, device=DEVICE)
except (FileNotFoundError, ValueError, OSError) as e:
    print(f"no {DRAFT!r} ({type(e).__name__}): using the early-exit fallback")
    draft = early_exit_draft(target, 2)
n_params = lambda lm: sum(p.numel() for p in lm.model.parameters())
print(f"target {target.name}: {n_params(target)/1e6:.2f}M params, draft {draft.name}: {n_params(draft)/1e6:.2f}M")
prompt = encode_prompt(target, PROMPT)

# %% [markdown]
# ## The reference: autoregressive greedy
# Whatever we build must reproduce these tokens exactly.

# %%
ref = autoregressive.generate(target, prompt, max_new_tokens=NEW_TOKENS, eos_token_id=[])
ref_tokens = ref.tokens[0]
print(ref.stats.target_calls, "target calls:", repr(target.decode(ref_tokens)))

# %% [markdown]
# ## Step 1: draft `gamma` tokens
# The draft runs autoregressively with its own KV cache. `feed` holds the tokens the draft has
# not processed yet (the whole prompt at first, later one or two tokens). Each call returns the
# logits of the last fed token; its argmax is the next draft token.

# %%
def draft_tokens(draft, cache, feed, gamma):
    xs = []
    for _ in range(gamma):
        logits, cache = draft.forward(torch.tensor([feed], device=draft.device), cache)
        xs.append(int(logits[0, -1].argmax()))
        feed = [xs[-1]]
    return xs, cache


xs, _ = draft_tokens(draft, None, prompt, 4)
print("draft proposes:", xs, repr(target.decode(xs)), "| AR says:", ref_tokens[:4])

# %% [markdown]
# ## Step 2: verify with one target pass
# Feed the target the tokens it has not processed (the last committed token, or the prompt at
# first) **followed by the drafts**. The logits at the last `gamma + 1` positions are the target's
# predictions *after* each prefix: position `i` checks draft `i`, and the final one predicts the
# token after the whole block.

# %%
def verify(target, cache, feed, xs):
    logits, cache = target.forward(torch.tensor([feed + xs], device=target.device), cache)
    top = logits[0, -(len(xs) + 1):].argmax(-1).tolist()   # gamma + 1 target argmaxes
    n = 0
    while n < len(xs) and xs[n] == top[n]:                  # longest agreeing prefix
        n += 1
    return n, top[n], cache                                 # top[n]: correction or bonus


n, nxt, _ = verify(target, None, prompt, xs)
print(f"accepted {n} of {len(xs)}; the target adds {nxt} -> emitted {xs[:n] + [nxt]}")

# %% [markdown]
# Every step emits `n + 1` tokens: `n` accepted drafts and one target token. If `n < gamma` the
# target token *corrects* the first wrong draft; if `n == gamma` it is a free *bonus* token.
# Either way it is exactly what greedy AR would have produced next.

# %% [markdown]
# ## Step 3: roll the caches back
# After the step both caches hold entries for rejected drafts. Both must be cut back
# (`LM.crop`) to the committed sequence:
# - the target keeps everything except the last committed token (that one is fed next step);
# - the draft processed its feed and the first `gamma - 1` drafts (it never processed the last
#   one). It keeps the committed part; whatever committed tokens it has not seen are fed next
#   time (one token, or two when every draft was accepted).

# %%
def rollback(t_cache, d_cache, committed):
    LM.crop(t_cache, len(committed) - 1)
    d_len = 0 if d_cache is None else min(LM.cache_length(d_cache), len(committed) - 1)
    if d_cache is not None:
        LM.crop(d_cache, d_len)
    return committed[-1:], committed[d_len:]   # what target and draft must process next

# %% [markdown]
# ## The whole loop
# Near the end we draft fewer tokens: never more than the number still needed minus one (the
# target adds one itself). There is no separate prefill: the first target call processes the
# prompt *and* the first drafts, so it is already a verification step. The loop keeps a log of
# every step (where it started, the drafts, how many were accepted, the target's token) for the
# picture below.

# %%
def blockwise_greedy(target, draft, prompt, gamma, max_new):
    out, t_cache, d_cache, t_feed, d_feed, log = [], None, None, list(prompt), list(prompt), []
    while len(out) < max_new:
        g = min(gamma, max_new - len(out) - 1)
        xs, d_cache = draft_tokens(draft, d_cache, d_feed, g) if g else ([], d_cache)
        n, nxt, t_cache = verify(target, t_cache, t_feed, xs)
        log.append((len(out), xs, n, nxt))
        out += xs[:n] + [nxt]
        t_feed, d_feed = rollback(t_cache, d_cache, prompt + out)
    return out[:max_new], log


mine, log = blockwise_greedy(target, draft, prompt, 4, NEW_TOKENS)
calls = len(log)                                  # one target call per step
assert mine == ref_tokens, "blockwise greedy must equal AR greedy"
print(f"identical to AR greedy, with {calls} target calls instead of {ref.stats.target_calls}")

# %% [markdown]
# ## The timeline of a real run
# One row per step: on top, what the draft proposed; below, what the target's single pass
# committed. Green drafts were accepted; red, hatched drafts were rejected and rolled back out of
# both caches (the red bar marks the cut). The target's own token is orange where it corrects the
# first rejected draft and blue where every draft was accepted (a bonus).

# %%
from matplotlib.patches import Patch, Rectangle
import matplotlib.pyplot as plt

GREEN, RED, ORANGE, BLUE = "#b7e4c7", "#f4a6a6", "#ffd6a5", "#a0c4ff"


def box(ax, x, y, text, colour, hatch=None):
    ax.add_patch(Rectangle((x - 0.48, y - 0.2), 0.96, 0.4, fc=colour, ec="0.5", hatch=hatch))
    ax.text(x, y, text.strip()[:6] or "␣", ha="center", va="center", fontsize=7)

# %% [markdown]
# Draw the steps of the run above (`gamma = 4`; at most the first 14).

# %%
def plot_timeline(lm, log, steps=14):
    S = min(steps, len(log))
    fig, ax = plt.subplots(figsize=(12, 0.6 * S + 1))
    for s, (start, xs, n, nxt) in enumerate(log[:S]):
        for i, x in enumerate(xs):                                    # the draft's proposal
            box(ax, start + i, -s + 0.22, lm.decode([x]), GREEN if i < n else RED, None if i < n else "///")
        for i, t in enumerate(xs[:n] + [nxt]):                        # what the target commits
            box(ax, start + i, -s - 0.22, lm.decode([t]), GREEN if i < n else (BLUE if n == len(xs) else ORANGE))
        if n < len(xs):                                               # roll back both caches here
            ax.plot([start + n - 0.5] * 2, [-s - 0.45, -s + 0.45], color="red", lw=2)
    ax.set_xlim(-0.6, log[S - 1][0] + len(log[S - 1][1]) + 0.6); ax.set_ylim(-S + 0.4, 0.6)
    ax.set_yticks(range(0, -S, -1), [f"step {s + 1}: draft / target" for s in range(S)]); ax.set_xlabel("position in the output")
    kinds = [(GREEN, None, "accepted draft"), (RED, "///", "rejected, rolled back"), (ORANGE, None, "correction"), (BLUE, None, "bonus")]
    ax.legend(handles=[Patch(fc=c, ec="0.5", hatch=h, label=l) for c, h, l in kinds], loc="upper right", fontsize=7, ncol=2)
    plt.tight_layout(); plt.show()


plot_timeline(target, log)

# %% [markdown]
# ## The same with `refimpl.speculative`
# `speculative.generate(target, prompts, draft=draft, gamma=4, ...)` is the tested version: batches,
# EOS, sampling (chapter 03) and counters. It must agree with our loop, token for token and in
# the number of target calls. Its stats record, per step, the accepted drafts of each row
# (`stats.accepted`) and the draft length it used (`stats.extra["gammas"]`: `gamma`, or fewer near
# the end, as in our loop). `stats.alpha` is the **acceptance rate**, accepted drafts / proposed
# drafts; it is not the `alpha` of the tau formula (see below).

# %%
g = speculative.generate(target, prompt, draft=draft, gamma=4, max_new_tokens=NEW_TOKENS, eos_token_id=[])
assert g.tokens[0] == mine == ref_tokens
assert g.stats.target_calls == calls
assert [a[0] for a in g.stats.accepted] == [n for _, _, n, _ in log]
assert g.stats.extra["gammas"] == [len(xs) for _, xs, _, _ in log]
s = g.stats
print(f"target calls {s.target_calls}, draft calls {s.draft_calls}, tau {s.tau:.2f}, acceptance rate {s.alpha:.2f}")
print("accepted per step:", [a[0] for a in s.accepted], "| drafts per step:", s.extra["gammas"])

# %% [markdown]
# ## tau versus gamma
# `tau` = tokens emitted per target call. A longer draft can only help tau, but each extra draft
# token costs a draft forward and is less likely to be accepted. The tau formula of chapter 00
# takes `alpha`, the probability that a draft is accepted *given that the ones before it were*.
# The acceptance rate `stats.alpha` = accepted / proposed is smaller: a step stops testing at its
# first rejection, so the drafts after it count as proposed though they were never tested. To
# estimate `alpha`, divide the accepted drafts by the drafts actually **tested**: in a step that
# accepted `n` of `g`, that is `n + 1` (the accepted ones and the first rejected one), or `g`
# when all were accepted.

# %%
def alpha_tested(stats):
    steps = [(a[0], g) for a, g in zip(stats.accepted, stats.extra["gammas"]) if g > 0]
    return sum(n for n, _ in steps) / sum(min(n + 1, g) for n, g in steps)


rows = []
for gm in GAMMAS:
    r = speculative.generate(target, prompt, draft=draft, gamma=gm, max_new_tokens=NEW_TOKENS, eos_token_id=[])
    assert r.tokens[0] == ref_tokens
    rows.append((gm, r.stats.tau, alpha_tested(r.stats), r.stats.alpha, r.stats.target_calls))
    print("gamma %2d  tau %.2f  alpha (accepted/tested) %.2f  acceptance rate (accepted/proposed) %.2f  target calls %3d" % rows[-1])

# %% [markdown]
# Plot tau and, for comparison, the i.i.d. model of Leviathan et al.,
# `E[tau] = (1 - alpha^(gamma+1)) / (1 - alpha)` with the estimated `alpha` (chapter 03 derives
# it), and the same formula fed the acceptance rate instead, to see what the mix-up costs.

# %%
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(GAMMAS, [r[1] for r in rows], "o-", label="measured tau")
ax.plot(GAMMAS, [speculative.expected_tau(r[2], r[0]) for r in rows], "s--", label="formula, alpha = accepted / tested")
ax.plot(GAMMAS, [speculative.expected_tau(r[3], r[0]) for r in rows], "x:", label="formula fed the acceptance rate (wrong input)")
ax.plot(GAMMAS, [r[0] + 1 for r in rows], ":", color="gray", label="gamma + 1 (every draft accepted)")
ax.set_xlabel("gamma"); ax.set_ylabel("tokens per target call"); ax.legend(fontsize=8); ax.grid(alpha=0.3)
plt.show()

# %% [markdown]
# Every target call is a verification step (the prompt rides along in the first one), so measured
# tau = tokens / steps, the quantity the formula predicts. Where the two differ, it is because the
# last step drafts fewer tokens (it stops at `NEW_TOKENS`) and because acceptances in real text are
# not independent (easy stretches accept whole blocks, hard ones reject early), which the formula
# ignores. Fed the acceptance rate, the formula underestimates tau more and more as `gamma` grows.
# Note how quickly the curve flattens: with acceptance `alpha` it can never exceed `1 / (1 - alpha)`.

# %% [markdown]
# ## Wall-clock
# Fewer target calls only pay off if the draft is cheap: the speedup is about
# `tau / (gamma * c + 1)` with `c` = draft cost / target cost (chapter 00). On a tiny CPU model the
# per-call Python overhead is a large, fixed part of every forward, so `c` is far from small (the
# early-exit fallback still has half the layers and the whole LM head) and this can even be a
# slowdown; the benchmark (`python -m refimpl.bench`, docs/benchmarks.md) measures SmolLM2-135M with
# its distilled draft. Under `TRITON_INTERPRET=1` (as in CI) the verification kernel also runs in
# Triton's slow interpreter. Time both (median of three runs).

# %%
import statistics, time


def seconds(fn, reps=3):
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


t_ar = seconds(lambda: autoregressive.generate(target, prompt, max_new_tokens=NEW_TOKENS, eos_token_id=[]))
t_sd = seconds(lambda: speculative.generate(target, prompt, draft=draft, gamma=4, max_new_tokens=NEW_TOKENS, eos_token_id=[]))
print(f"AR {NEW_TOKENS / t_ar:.0f} tok/s, speculative (gamma=4) {NEW_TOKENS / t_sd:.0f} tok/s, ratio {t_ar / t_sd:.2f}x")

# %% [markdown]
# ## Batches with ragged acceptance
# In a batch each row accepts its own number of drafts, but the target's KV cache is one tensor
# with one length for all rows. `refimpl.speculative` therefore crops the cache to the longest
# row; in a row that accepted fewer drafts, the slots of its rejected drafts stay in the tensor as
# **holes**: a 2-D attention mask marks them 0 so no later token attends to them, and position ids
# count only a row's real tokens. (At batch 1 there are never holes.) The result must equal
# running each row alone.

# %%
texts = [PROMPT, "Blessed are the meek", "In the beginning God", "And Jesus answered"]
batch = [encode_prompt(target, t) for t in texts]
gb = speculative.generate(target, batch, draft=draft, gamma=4, max_new_tokens=16, eos_token_id=[])
for p, toks in zip(batch, gb.tokens):
    assert toks == autoregressive.generate(target, p, max_new_tokens=16, eos_token_id=[]).tokens[0]
print("accepted per step (one entry per row):", gb.stats.accepted[:4], "...")

# %% [markdown]
# ## The verification kernel
# `kernels.verify_greedy` does step 2's bookkeeping on the GPU: per row, the number of accepted
# drafts and the next token, from the draft tokens (B, gamma) and the target logits
# (B, gamma + 1, V), with an argmax computed over vocabulary tiles. On CPU the dispatcher uses
# its torch reference (or Triton's interpreter when `TRITON_INTERPRET=1`).

# %%
logits, _ = target.forward(torch.tensor([prompt + xs], device=DEVICE))
block = logits[:, -(len(xs) + 1):]                            # (1, gamma + 1, V)
n_k, nxt_k = verify_greedy(torch.tensor([xs], device=DEVICE), block)
n_h, nxt_h, _ = verify(target, None, prompt, xs)
assert (n_k.item(), nxt_k.item()) == (n_h, nxt_h)
print("kernel:", n_k.item(), nxt_k.item(), "| by hand:", n_h, nxt_h)

# %% [markdown]
# ## Play: gamma
# The generated text, coloured by what produced each token: green accepted drafts, orange the
# target's corrections, blue bonus tokens. Each run of colour ending in orange or blue is one
# target call.

# %%
import ipywidgets as widgets
from html import escape
from IPython.display import HTML, display

LEGEND = " ".join(f'<span style="background:{c}">{t}</span>' for c, t in
                  [(GREEN, "accepted draft"), (ORANGE, "target's correction"), (BLUE, "bonus token")])


def play(gamma=4):
    global shown
    r = speculative.generate(target, prompt, draft=draft, gamma=gamma, max_new_tokens=NEW_TOKENS, eos_token_id=[])
    spans, i, toks = [], 0, r.tokens[0]
    for (n,), g_ in zip(r.stats.accepted, r.stats.extra["gammas"]):
        for k in range(min(n + 1, len(toks) - i)):
            c = GREEN if k < n else (BLUE if n == g_ else ORANGE)
            spans.append(f'<span style="background:{c}">{escape(target.decode([toks[i]]))}</span>'); i += 1
    shown = f"<b>gamma {gamma}: {r.stats.target_calls} target calls, tau {r.stats.tau:.2f}</b>"
    display(HTML(f"{shown} &nbsp; {LEGEND}<br><span style='font-family:monospace'>{''.join(spans)}</span>"))

# %% [markdown]
# The widget (move `gamma` from 4 to 1: every call then emits at most two tokens):

# %%
ui = widgets.interact(play, gamma=widgets.IntSlider(continuous_update=False, value=4, min=1, max=10)).widget

# %% tags=["ci-only", "remove-input"] jupyter={"source_hidden": true}
# CI's self-test of the widget above (collapsed in the lab): move a control as a person would,
# check that the output changed, then put the control back to its teaching default
default = ui.children[0].value
before = shown
ui.children[0].value = 1                          # move the gamma slider
assert shown != before, "moving the slider must change the output"
ui.children[0].value = default

# %% [markdown]
# ## Exercises
# Each exercise is a stub for you to fill in, followed by a check that answers "not attempted
# yet", "wrong, because ..." or "correct". The reference answers are hidden in
# `solutions/ch02.py`; set `SHOW_SOLUTIONS = True` in the parameters to print them.
#
# **1. Greedy verification for a batch, without Python loops.** Write
# `my_verify_greedy(draft, logits)`: `draft` (B, gamma) token ids, `logits` (B, gamma + 1, V);
# return `(n, nxt)`, both (B,) int64: per row the length of the longest prefix of drafts equal to
# the target's argmaxes, and the target's argmax right after that prefix (its correction, or the
# bonus token when `n == gamma`). Hint: a match that comes after a mismatch must not count.

# %%
from solutions import answers_on, exercise, check, show


@exercise("02", "my_verify_greedy")
def my_verify_greedy(draft, logits):
    ...  # your code
    raise NotImplementedError

# %% [markdown]
# The check compares with `kernels.verify_greedy` on 200 random rows whose drafts agree with the
# argmaxes for a random number of positions, then disagree once, then sometimes agree again; on
# `gamma = 0`; and on the real target's logits for the drafts above. First the random rows:

# %%
def planted(B=200, gamma=5, V=50, seed=0):
    gg = torch.Generator(device=DEVICE).manual_seed(seed)                             # made where the kernel runs
    logits = torch.randn(B, gamma + 1, V, generator=gg, device=DEVICE)
    top = logits.argmax(-1)[:, :gamma]
    m = torch.randint(0, gamma + 1, (B, 1), generator=gg, device=DEVICE)              # planted prefix length
    pos = torch.arange(gamma, device=DEVICE)[None]
    wrong = (top + torch.randint(1, V, top.shape, generator=gg, device=DEVICE)) % V   # never the argmax
    later = torch.rand(B, gamma, generator=gg, device=DEVICE) < 0.5                   # agree again after the mismatch?
    draft = torch.where((pos < m) | ((pos > m) & later), top, wrong)
    return draft, logits

# %% [markdown]
# The check:

# %%
def check_verify_greedy():
    cases = [planted(), planted(B=3, gamma=0, seed=1), (torch.tensor([xs], device=DEVICE), block)]
    for k, (d, lg) in enumerate(cases):
        n, nxt = my_verify_greedy(d, lg)
        kn, knxt = verify_greedy(d, lg)
        assert n.shape == kn.shape and torch.equal(n.long(), kn), f"case {k}: accepted lengths differ from the kernel's, e.g. rows {(n.long() != kn).nonzero()[:3, 0].tolist()}"
        assert torch.equal(nxt.long(), knxt), f"case {k}: the accepted lengths match but the next tokens do not"


check("Exercise 1", check_verify_greedy)
if SHOW_SOLUTIONS:
    show("02", "my_verify_greedy")

# %% [markdown]
# **2. A prediction.** Use the target as its own draft: every draft is then accepted. Write
# `self_draft_calls(new_tokens, gamma)` returning `(target_calls, draft_calls)` that
# `speculative.generate(target, target, ...)` makes for `new_tokens` tokens. Reason it out: how
# many tokens does one step emit, what happens in the last step, and how many draft forwards does a
# step with `g` drafts cost? The check runs it.

# %%
@exercise("02", "self_draft_calls")
def self_draft_calls(new_tokens, gamma):
    ...  # your code
    raise NotImplementedError

# %% [markdown]
# The check:

# %%
def check_self_draft():
    for N, gm in [(NEW_TOKENS, 4), (10, 3), (7, 6), (5, 1), (1, 4)]:
        r = speculative.generate(target, prompt, draft=target, gamma=gm, max_new_tokens=N, eos_token_id=[])
        got, truth = tuple(self_draft_calls(N, gm)), (r.stats.target_calls, r.stats.draft_calls)
        assert got == truth, f"{N} tokens at gamma={gm}: you predict (target, draft) calls = {got}, the run made {truth}"


check("Exercise 2", check_self_draft)
if SHOW_SOLUTIONS:
    show("02", "self_draft_calls")

# %% [markdown]
# **3. tau from alpha and gamma, by simulation.** Under the i.i.d. model each draft of a step is
# accepted with probability `alpha`, left to right, until the first rejection; the step emits the
# accepted drafts plus the target's own token. Write `simulate_tau(alpha, gamma, steps, gen)`:
# simulate `steps` steps with random numbers from `gen` (a `torch.Generator`: draw on its device,
# `gen.device`) and return the mean tokens per step. The check compares with the closed form
# `speculative.expected_tau`.

# %%
@exercise("02", "simulate_tau")
def simulate_tau(alpha, gamma, steps, gen):
    ...  # your code
    raise NotImplementedError

# %% [markdown]
# The check allows four standard errors of the simulation (each step emits between 1 and
# `gamma + 1` tokens).

# %%
def check_simulate_tau():
    for alpha, gm in [(0.8, 4), (0.5, 2), (0.95, 8), (0.3, 1), (0.0, 3)]:
        sim = float(simulate_tau(alpha, gm, 20000, torch.Generator(device="cpu").manual_seed(gm)))   # a host-side simulation
        want = speculative.expected_tau(alpha, gm)
        tol = 4 * gm / 2 / 20000 ** 0.5 + 1e-9
        assert abs(sim - want) <= tol, f"alpha={alpha}, gamma={gm}: your simulation gives {sim:.3f}, the formula {want:.3f}"


check("Exercise 3", check_simulate_tau)
if SHOW_SOLUTIONS:
    show("02", "simulate_tau")

# %% [markdown]
# ## Summary
# - A draft proposes `gamma` tokens; **one** target pass scores them all and keeps the longest
#   prefix equal to its own argmaxes plus one token of its own (a correction or a bonus). The
#   output is exactly the target's greedy output, whatever the draft.
# - After a rejection both caches are cropped back to the committed tokens; in a batch the
#   rejected slots stay behind as masked holes.
# - tau grows with `gamma` but saturates at `1 / (1 - alpha)`; `alpha` (accepted / tested) is what
#   the formula takes, the acceptance rate (accepted / proposed) is smaller.
# - Whether fewer target calls mean less time depends on the draft's cost `c` (chapter 04a).
# - The library's call is `speculative.generate(target, prompts, draft=d)`; with no `gamma` it runs
#   `speculative.PRESETS["cpu"]` (gamma 4). `refimpl.generate(target, prompts, method="speculative")`
#   does the same and loads the zoo's draft for the target.
