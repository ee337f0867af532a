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
# You will build, by hand, then check against `refimpl.speculative`:
# 1. drafting `gamma` tokens with the draft's KV cache;
# 2. verifying them with one target pass (longest agreeing prefix + correction/bonus token);
# 3. rolling both caches back after a rejection;
# 4. tau (tokens per target call) as a function of `gamma`;
# 5. the `kernels.verify_greedy` Triton kernel.

# %% [markdown]
# ## Parameters

# %%
import torch

FAST = True                       # CI default: short generations
TARGET = "tiny"                   # any zoo name or local Hugging Face folder
DRAFT = "tiny-draft"              # falls back to the target's first layers if absent
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NEW_TOKENS = 32 if FAST else 128
GAMMAS = [1, 2, 3, 4, 6, 8] if FAST else list(range(1, 13))
PROMPT = "And it came to pass, when the king heard"
SHOW_SOLUTIONS = False

# %% [markdown]
# ## The target and the draft
# The draft must share the target's tokenizer. The zoo's `tiny-draft` is a small model distilled
# from `tiny` (chapter 04). If it is not there, we fall back to an **early-exit** draft: the
# target's first two layers, its final norm and its LM head (a "self-speculative" draft, also in
# chapter 04). Everything below works with either.

# %%
import copy
from transformers import AutoModelForCausalLM
from refimpl import models, autoregressive, speculative
from refimpl.models import LM
from refimpl.prompts import encode_prompt   # a user turn for a chat model, plain tokens otherwise
import kernels


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
# Near the end we draft fewer tokens: never more than the number still needed minus one.

# %%
def blockwise_greedy(target, draft, prompt, gamma, max_new):
    out, t_cache, d_cache, t_feed, d_feed, calls = [], None, None, list(prompt), list(prompt), 0
    while len(out) < max_new:
        g = min(gamma, max_new - len(out) - 1)
        xs, d_cache = draft_tokens(draft, d_cache, d_feed, g) if g else ([], d_cache)
        n, nxt, t_cache = verify(target, t_cache, t_feed, xs)
        calls += 1
        out += xs[:n] + [nxt]
        t_feed, d_feed = rollback(t_cache, d_cache, prompt + out)
    return out[:max_new], calls


mine, calls = blockwise_greedy(target, draft, prompt, 4, NEW_TOKENS)
assert mine == ref_tokens, "blockwise greedy must equal AR greedy"
print(f"identical to AR greedy, with {calls} target calls instead of {ref.stats.target_calls}")

# %% [markdown]
# ## The same with `refimpl.speculative`
# `speculative.generate(target, draft, prompts, gamma, ...)` is the tested version: batches,
# EOS, sampling (chapter 03) and counters. It must agree with our loop, token for token and in
# the number of target calls.

# %%
g = speculative.generate(target, draft, prompt, gamma=4, max_new_tokens=NEW_TOKENS, eos_token_id=[])
assert g.tokens[0] == mine == ref_tokens
assert g.stats.target_calls == calls
s = g.stats
print(f"target calls {s.target_calls}, draft calls {s.draft_calls}, alpha {s.alpha:.2f}, tau {s.tau:.2f}")
print("accepted per step:", [a[0] for a in s.accepted])

# %% [markdown]
# ## Seeing the blocks
# Green: accepted draft tokens; orange: the target's correction; blue: a bonus token (all drafts
# accepted). Each coloured run is one target forward pass.

# %%
from IPython.display import HTML, display


def colour_blocks(lm, tokens, accepted, gammas):
    html, i = [], 0
    for n, g in zip(accepted, gammas):
        for k in range(n + 1):
            if i >= len(tokens):
                break
            colour = "#b7e4c7" if k < n else ("#a0c4ff" if n == g else "#ffd6a5")
            html.append(f'<span style="background:{colour}">{lm.decode([tokens[i]])}</span>')
            i += 1
    return "<div style='font-family:monospace;line-height:1.8'>" + "".join(html) + "</div>"


display(HTML(colour_blocks(target, g.tokens[0], [a[0] for a in s.accepted], s.extra["gammas"])))

# %% [markdown]
# ## tau versus gamma
# `tau` = tokens emitted per target call. A longer draft can only help tau, but each extra draft
# token costs a draft forward and is less likely to be accepted. For each `gamma` we measure tau,
# the draft calls spent, and the per-token acceptance rate `alpha`, estimated as accepted drafts
# over drafts actually *tested* (a step stops testing at the first mismatch).

# %%
def alpha_tested(stats):
    steps = [(a[0], g) for a, g in zip(stats.accepted, stats.extra["gammas"]) if g > 0]
    return sum(n for n, _ in steps) / sum(min(n + 1, g) for n, g in steps)


rows = []
for gm in GAMMAS:
    r = speculative.generate(target, draft, prompt, gamma=gm, max_new_tokens=NEW_TOKENS, eos_token_id=[])
    assert r.tokens[0] == ref_tokens
    rows.append((gm, r.stats.tau, alpha_tested(r.stats), r.stats.draft_calls, r.stats.target_calls))
    print("gamma %2d  tau %.2f  alpha %.2f  draft calls %3d  target calls %3d" % rows[-1])

# %% [markdown]
# Plot tau and, for comparison, the i.i.d. model of Leviathan et al.,
# `E[tau] = (1 - alpha^(gamma+1)) / (1 - alpha)` with the measured alpha (chapter 03 derives it).

# %%
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(GAMMAS, [r[1] for r in rows], "o-", label="measured tau")
ax.plot(GAMMAS, [speculative.expected_tau(r[2], r[0]) for r in rows], "s--", label="(1-a^(g+1))/(1-a), measured a")
ax.plot(GAMMAS, [r[0] + 1 for r in rows], ":", color="gray", label="gamma + 1 (every draft accepted)")
ax.set_xlabel("gamma"); ax.set_ylabel("tokens per target call"); ax.legend(); ax.grid(alpha=0.3)
plt.show()

# %% [markdown]
# Measured tau counts the prefill call and the truncated last block, so it sits a little below
# the model. Note how quickly the curve flattens: with acceptance `alpha` it can never exceed
# `1 / (1 - alpha)`.

# %% [markdown]
# ## Wall-clock
# Fewer target calls only pay off if the draft is cheap: the speedup is about
# `tau / (gamma * c + 1)` with `c` = draft cost / target cost (chapter 00). On a tiny CPU model the
# per-call Python overhead is a large, fixed part of every forward, so `c` is far from small (the
# early-exit fallback still has half the layers and the whole LM head) and this can even be a
# slowdown; chapter 15 measures a real model and its distilled draft on a GPU. Time both
# (median of three runs).

# %%
import statistics, time


def seconds(fn, reps=3):
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


t_ar = seconds(lambda: autoregressive.generate(target, prompt, max_new_tokens=NEW_TOKENS, eos_token_id=[]))
t_sd = seconds(lambda: speculative.generate(target, draft, prompt, gamma=4, max_new_tokens=NEW_TOKENS, eos_token_id=[]))
print(f"AR {NEW_TOKENS / t_ar:.0f} tok/s, speculative (gamma=4) {NEW_TOKENS / t_sd:.0f} tok/s, ratio {t_ar / t_sd:.2f}x")

# %% [markdown]
# ## Batches with ragged acceptance
# In a batch each row accepts its own number of drafts. `refimpl.speculative` keeps one cache
# length per batch: rejected slots of a row become *holes* that a 2-D attention mask hides, and
# position ids count only real tokens. The result must equal running each row alone.

# %%
texts = [PROMPT, "Blessed are the meek", "In the beginning God", "And Jesus answered"]
batch = [encode_prompt(target, t) for t in texts]
gb = speculative.generate(target, draft, batch, gamma=4, max_new_tokens=16, eos_token_id=[])
for p, toks in zip(batch, gb.tokens):
    assert toks == autoregressive.generate(target, p, max_new_tokens=16, eos_token_id=[]).tokens[0]
print("accepted per step (rows):", gb.stats.accepted[:4], "...")

# %% [markdown]
# ## The verification kernel
# `kernels.verify_greedy` does step 2's bookkeeping on the GPU: per row, the number of accepted
# drafts and the next token, from the draft tokens (B, gamma) and the target logits
# (B, gamma + 1, V), with an argmax computed over vocabulary tiles. On CPU the dispatcher uses
# its torch reference (or Triton's interpreter when `TRITON_INTERPRET=1`).

# %%
logits, _ = target.forward(torch.tensor([prompt + xs], device=DEVICE))
block = logits[:, -(len(xs) + 1):]                            # (1, gamma + 1, V)
n_k, nxt_k = kernels.verify_greedy(torch.tensor([xs], device=DEVICE), block)
n_h, nxt_h, _ = verify(target, None, prompt, xs)
assert (n_k.item(), nxt_k.item()) == (n_h, nxt_h)
print("kernel:", n_k.item(), nxt_k.item(), "| by hand:", n_h, nxt_h)

# %% [markdown]
# ## Exercises
# **1.** Write `accepted_prefix(xs, top)`: the number of leading drafts equal to the target's
# argmaxes `top` (length `len(xs) + 1`) and the token the target adds.

# %%
def accepted_prefix(xs, top):
    n = 0                                      # reference answer (CI runs it)
    while n < len(xs) and xs[n] == top[n]:
        n += 1
    return n, top[n]


def check_accepted_prefix(fn):
    assert fn([5, 6, 7], [5, 6, 7, 8]) == (3, 8)       # bonus
    assert fn([5, 9, 7], [5, 6, 7, 8]) == (1, 6)       # correction after one
    assert fn([], [4]) == (0, 4)                       # nothing drafted
    assert fn([1, 2], [3, 2, 1]) == (0, 3)             # later matches do not count
    return "correct"


print(check_accepted_prefix(accepted_prefix))

# %% [markdown]
# **2.** A generation of `N` tokens with greedy blockwise decoding accepted `a_1, ..., a_s` drafts
# at its `s` steps. How many target calls did it make and how many tokens did it emit, ignoring
# truncation at the end? Write `calls_and_tokens(accepted)`.

# %%
def calls_and_tokens(accepted):
    return len(accepted), sum(a + 1 for a in accepted)   # reference answer


def check_calls_and_tokens(fn):
    assert fn([0, 0, 0]) == (3, 3)
    assert fn([4, 2]) == (2, 8)
    acc = [a[0] for a in g.stats.accepted]
    calls, toks = fn(acc)
    assert calls == g.stats.target_calls and toks >= NEW_TOKENS
    return "correct"


print(check_calls_and_tokens(calls_and_tokens))

# %% [markdown]
# **3.** With a draft that always agrees (use the target itself as its own draft), how many target
# calls does `speculative.generate` need for `NEW_TOKENS` tokens at `gamma = 4`? Predict, then
# check by running it. (Hint: each call emits `gamma + 1` tokens, the first one included.)

# %%
predicted = -(-NEW_TOKENS // 5)                              # reference answer: ceil(N / 5)
selfdraft = speculative.generate(target, target, prompt, gamma=4, max_new_tokens=NEW_TOKENS, eos_token_id=[])
assert selfdraft.stats.target_calls == predicted and selfdraft.stats.alpha == 1.0
print("correct:", predicted, "target calls")
if SHOW_SOLUTIONS:
    print("Each call verifies 4 drafts that are all accepted, plus 1 bonus token: 5 tokens per call.")
