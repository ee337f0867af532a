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
# # 13 · dLLM caching and windows
#
# An autoregressive model caches keys/values because a token's K/V never change once written.
# In a dLLM attention is **bidirectional**: every token's K/V depend on every other token,
# including masks that will change. So an exact KV cache does not exist. Fast-dLLM
# (arXiv 2505.22618, Sec. 3.2) observes that K/V change little *within* a block and caches anyway:
#
# - **prefix cache**: at a block's first step run everything and keep the K/V of the tokens
#   before the block; later steps of the block feed only the block and what follows it;
# - **dual cache**: also keep the K/V of the (still masked) suffix; feed only the block.
#
# The cache is refreshed at every block start. We measure what it approximates, build it by
# hand, check `refimpl.diffusion` against it, and trade speed for quality. Finally, **windows**:
# drop far-away masked positions from the input altogether.

# %% [markdown]
# ## Parameters

# %%
import torch

FAST = True
MODEL = "tiny-dllm"
AR_MODEL = "tiny"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PROMPT_LEN = 64 if FAST else 128
GEN, BLOCK = 32 if FAST else 64, 8 if FAST else 16
SHOW_SOLUTIONS = False

# %% [markdown]
# ## Imports and models

# %%
import time
import matplotlib.pyplot as plt
from refimpl import diffusion, models
from refimpl.bench import dllm as diffusion_bench

torch.set_grad_enabled(False)                                    # inference only
dlm, ar = models.load(MODEL, device=DEVICE), models.load(AR_MODEL, device=DEVICE)
tok, MASK = dlm.tokenizer, dlm.mask_token_id
prompts = diffusion_bench.kjv_prompts(tok, 2 if FAST else 8, length=PROMPT_LEN)
print(len(prompts), "prompts of", PROMPT_LEN, "tokens; answer", GEN, "in blocks of", BLOCK)

# %% [markdown]
# ## The cache contract
# The calls Fast-dLLM's samplers make: `dlm(ids, use_cache=True)` returns `.logits` and
# `.past_key_values`, a per-layer tuple of `(k, v)` (B, H, T, D) (RoPE already applied);
# `dlm(later_ids, past_key_values=context)` feeds only the later tokens, which attend to the
# cached *context* and to themselves (positions continue after the cache). With fresh K/V the
# split is exact:

# %%
x = torch.tensor([prompts[0] + [MASK] * GEN], device=DEVICE)
full = dlm(x, use_cache=True)                                    # .logits (1, T, V), K/V per layer
kv = full.past_key_values
P = len(prompts[0])
prefix = [(k[:, :, :P], v[:, :, :P]) for k, v in kv]
part = dlm(x[:, P:], past_key_values=prefix).logits               # the answer, prompt from the cache
print("max |difference|:", (part - full.logits[:, P:]).abs().max().item())
assert torch.allclose(part, full.logits[:, P:], atol=1e-4)

# %% [markdown]
# ## What goes stale
# Commit a few answer tokens and recompute: the prompt's K/V move, because the prompt attends
# to the answer. Relative change per layer (the first layer's K/V depend only on the token and
# its position, so they never change):

# %%
y = x.clone(); y[0, P: P + BLOCK // 2] = full.logits[0, P: P + BLOCK // 2].argmax(-1)
kv2 = dlm(y, use_cache=True).past_key_values
for layer, ((k1, _), (k2, _)) in enumerate(zip(kv, kv2)):
    rel = ((k1[:, :, :P] - k2[:, :, :P]).norm() / k1[:, :, :P].norm()).item()
    print(f"layer {layer}: prompt keys changed by {rel:.2%}")

# %% [markdown]
# ## A prefix-cache step, by hand
# At the block start: one full forward, keep the prefix K/V. Later steps: feed `x[:, s:]` only.
# The logits are *approximately* the full-forward logits on the new state:

# %%
s = P                                                            # first block starts after the prompt
kv_blockstart = dlm(x, use_cache=True).past_key_values
cache = [(k[:, :, :s], v[:, :, :s]) for k, v in kv_blockstart]
approx = dlm(y[:, s:], past_key_values=cache).logits               # after committing some tokens
exact = dlm(y).logits[:, s:]
agree = (approx.argmax(-1) == exact.argmax(-1)).float().mean().item()
print(f"argmax agreement with the exact forward: {agree:.1%}")

# %% [markdown]
# ## The prefix-cache sampler, by hand (greedy, one token per step)
# The cache is rebuilt at each block start (the full forward also gives that step's logits).

# %%
def prefix_cache_sampler(model, prompt, gen_length, block_length):
    P, x = len(prompt), torch.tensor([prompt + [MASK] * gen_length], device=DEVICE)
    for s in range(P, P + gen_length, block_length):
        for step in range(block_length):
            if step == 0:
                out = model(x, use_cache=True); lg = out.logits[:, s:]
                cache = [(k[:, :, :s], v[:, :, :s]) for k, v in out.past_key_values]
            else:
                lg = model(x[:, s:], past_key_values=cache).logits
            lg = lg[0, :block_length]; lg[:, MASK] = float("-inf")
            c, pred = torch.softmax(lg.double(), -1).max(-1)
            c[x[0, s: s + block_length] != MASK] = -float("inf")
            i = int(c.argmax()); x[0, s + i] = pred[i]
    return x[0, P:].tolist()

# %% [markdown]
# It equals `refimpl.diffusion.generate(cache="prefix")`:

# %%
mine = prefix_cache_sampler(dlm, prompts[0], GEN, BLOCK)
lib = diffusion.generate(dlm, [prompts[0]], gen_length=GEN, steps=GEN, block_length=BLOCK,
                         cache="prefix", eos_token_id=[])
assert mine == lib.tokens[0]
print("hand-built prefix cache == refimpl (cache='prefix')")

# %% [markdown]
# ## Refreshing every step makes it exact
# `cache_refresh="step"` rebuilds the cache before every step and then uses
# the *cached* forward: the output equals the uncached sampler, which shows the only error of
# the cache is staleness.

# %%
kw = dict(gen_length=GEN, steps=GEN, block_length=BLOCK, eos_token_id=[])
ref = diffusion.generate(dlm, prompts, **kw)
for cache in ("prefix", "dual"):
    fresh = diffusion.generate(dlm, prompts, cache=cache, cache_refresh="step", **kw)
    assert fresh.tokens == ref.tokens
print("fresh caches reproduce the uncached sampler exactly")

# %% [markdown]
# ## Speed vs quality
# For each sampler: wall time, NFE, tokens that match the uncached run, and perplexity under
# the AR `tiny` model. Token-forwards per step shrink from `P + G` (no cache) to `G − s` (prefix)
# to `block` (dual).

# %%
rows = []
for thr in (None, 0.9):
    for cache in (None, "prefix", "dual"):
        base = diffusion.generate(dlm, prompts, threshold=thr, **kw)
        t0 = time.perf_counter()
        g = diffusion.generate(dlm, prompts, threshold=thr, cache=cache, **kw)
        dt = time.perf_counter() - t0
        same = sum(a == b for ra, rb in zip(g.tokens, base.tokens) for a, b in zip(ra, rb)) / (len(prompts) * GEN)
        rows.append((f"thr={thr} cache={cache}", dt, g.stats.nfe, same,
                     diffusion_bench.ar_perplexity(ar, prompts, g.tokens)))
for r in rows:
    print(f"{r[0]:24s} {r[1]:6.2f}s  NFE {r[2]:3d}  same tokens {r[3]:6.1%}  ppl {r[4]:7.1f}")

# %% [markdown]
# The wall-clock picture (on a GPU the gap between the bars grows with prompt length):

# %%
plt.figure(figsize=(6, 3))
plt.barh([r[0] for r in rows], [r[1] for r in rows])
plt.xlabel("seconds"); plt.gca().invert_yaxis(); plt.title("cache speed"); plt.show()

# %% [markdown]
# ## Windows: drop the far-field masks
# Window-style methods (e.g. "Window-Diffusion", "Deferred Commitment Decoding") note that
# masked positions far to the right carry little information for the current block. Here: at
# each step feed only the prompt, the decoded part, the block and `w` masks after it.

# %%
def window_sampler(model, prompt, gen_length, block_length, w):
    P = len(prompt)
    x = torch.tensor([prompt + [MASK] * gen_length], device=DEVICE)
    for s in range(P, P + gen_length, block_length):
        e = s + block_length
        for _ in range(block_length):
            lg = model.logits(x[:, : e + w])[0, s:e]; lg[:, MASK] = float("-inf")
            c, pred = torch.softmax(lg.double(), -1).max(-1)
            c[x[0, s:e] != MASK] = -float("inf")
            i = int(c.argmax()); x[0, s + i] = pred[i]
    return x[0, P:].tolist()

# %% [markdown]
# With `w` large enough to cover the whole answer it *is* the LLaDA sampler; smaller windows
# feed fewer tokens per step.

# %%
assert window_sampler(dlm, prompts[0], GEN, BLOCK, GEN) == ref.tokens[0]
for w in (0, BLOCK, GEN):
    t0 = time.perf_counter()
    outs = [window_sampler(dlm, p, GEN, BLOCK, w) for p in prompts]
    dt = time.perf_counter() - t0
    same = sum(a == b for o, r in zip(outs, ref.tokens) for a, b in zip(o, r)) / (len(prompts) * GEN)
    print(f"w={w:3d}: {dt:5.2f}s, same tokens as full {same:.1%}, ppl {diffusion_bench.ar_perplexity(ar, prompts, outs):.1f}")

# %% [markdown]
# ## Exercises
# **1. Token-forwards per step.** A prompt of `P` tokens, answer `G`, blocks of `b`, during block
# `j` (0-based), at a step that is *not* the block's first: how many tokens does each variant feed
# the model? Write `tokens_fed(P, G, b, j, cache)` for cache in `None`, `"prefix"`, `"dual"`.

# %%
def tokens_fed(P, G, b, j, cache):                       # your answer here
    if cache is None:
        return P + G
    return G - j * b if cache == "prefix" else b

def check_tokens_fed(fn):
    for P, G, b in [(10, 32, 8), (64, 64, 16)]:
        for j in range(G // b):
            assert fn(P, G, b, j, None) == P + G
            assert fn(P, G, b, j, "prefix") == G - j * b, "the block and everything after it"
            assert fn(P, G, b, j, "dual") == b, "only the block"
    return "correct"

print(check_tokens_fed(tokens_fed))

# %% [markdown]
# **2. Total work.** Sum your `tokens_fed` over a whole one-token-per-step run (the block's first
# step always feeds `P + G`). Write `total_tokens(P, G, b, cache)`; the check compares prefix and
# dual with the uncached `(P + G) · G`.

# %%
def total_tokens(P, G, b, cache):                        # your answer here
    return sum(P + G if step == 0 else tokens_fed(P, G, b, j, cache)
               for j in range(G // b) for step in range(b))

def check_total(fn):
    P, G, b = 64, 64, 16
    assert fn(P, G, b, None) == (P + G) * G
    assert fn(P, G, b, "dual") == 4 * (P + G) + 4 * 15 * 16
    assert fn(P, G, b, "prefix") == 4 * (P + G) + 15 * (64 + 48 + 32 + 16)
    return "correct"

print(check_total(total_tokens))

# %% [markdown]
# ## Summary
# - Bidirectional attention means no exact KV cache; Fast-dLLM's block cache is stale only
#   within a block and exact when refreshed every step.
# - Prefix cache feeds the block and its suffix; dual cache feeds only the block.
# - Windows cut the far-field masks from the input; both trade a little quality for speed.
