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
# # 01 · The autoregressive baseline: sampling and the KV cache
#
# The baseline every other chapter must beat *and reproduce*: one forward pass per token.
# You will build, by hand, then check against `refimpl`:
#
# 1. the sampling rules: greedy, temperature, top-k, top-p, seeded draws (`refimpl.sampling`);
# 2. decoding without a cache (O(T²) work) and with a KV cache (`refimpl.autoregressive`);
# 3. cache crop and rollback, which every speculative method needs;
# 4. ragged batches with left padding;
# 5. the decode-attention Triton kernel (`kernels.decode_attention`) against torch.

# %% [markdown]
# ## Parameters

# %%
import torch

FAST = True                    # CI default
MODEL = "tiny"                 # any zoo name or local Hugging Face folder
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NEW_TOKENS = 24 if FAST else 128
PROMPT = "And God said unto Moses,"
SHOW_SOLUTIONS = False

# %% [markdown]
# ## Imports and the model

# %%
import time
import matplotlib.pyplot as plt
from refimpl import models, sampling, autoregressive
import kernels

lm = models.load(MODEL, device=DEVICE)
prompt = lm.encode(PROMPT)
print(MODEL, "| prompt:", len(prompt), "tokens | threads:", torch.get_num_threads())

# %% [markdown]
# ## The next-token distribution
# The last row of the logits is a score for every vocabulary entry; softmax turns it into `p`.

# %%
logits = lm.logits(torch.tensor([prompt], device=DEVICE))[0, -1]   # (V,)
p = torch.softmax(logits, -1)
top = p.topk(8)
for prob, i in zip(top.values.tolist(), top.indices.tolist()):
    print(f"{lm.tokenizer.decode([i])!r:12} {prob:.3f}")

# %% [markdown]
# ## Greedy and temperature, by hand
# Greedy takes the argmax. Temperature `T` divides the logits: `T < 1` sharpens, `T > 1`
# flattens, `T → 0` tends to greedy. We compare with `refimpl.sampling.probs`.

# %%
def probs_temperature(logits, T):
    return torch.softmax(logits / T, -1)

for T in (0.5, 1.0, 1.5):
    assert torch.allclose(probs_temperature(logits, T), sampling.probs(logits, T), atol=1e-6)
greedy_id = int(logits.argmax())
assert sampling.probs(logits, 0.0)[greedy_id] == 1.0
print("greedy next token:", repr(lm.tokenizer.decode([greedy_id])))

# %% [markdown]
# ## Top-k, by hand
# Keep the `k` largest logits, set the rest to `-inf`, renormalise.

# %%
def probs_top_k(logits, k, T=1.0):
    kth = logits.topk(k).values[-1]
    return torch.softmax(torch.where(logits >= kth, logits, torch.tensor(float("-inf"))) / T, -1)

for k in (1, 5, 50):
    assert torch.allclose(probs_top_k(logits, k), sampling.probs(logits, 1.0, top_k=k), atol=1e-6)
print("top-5 keeps", int((probs_top_k(logits, 5) > 0).sum()), "tokens")

# %% [markdown]
# ## Top-p (nucleus), by hand
# Sort by probability and keep the smallest prefix whose mass reaches `top_p` (the token that
# crosses the threshold is kept, so at least one token survives).

# %%
def probs_top_p(logits, top_p):
    pr = torch.softmax(logits, -1)
    sorted_p, order = pr.sort(descending=True)
    keep_sorted = (sorted_p.cumsum(-1) - sorted_p) < top_p      # mass *before* this token < top_p
    keep = torch.zeros_like(keep_sorted).scatter(0, order, keep_sorted)
    q = torch.where(keep, pr, torch.zeros_like(pr))
    return q / q.sum()

for tp in (0.1, 0.5, 0.9, 1.0):
    assert torch.allclose(probs_top_p(logits, tp), sampling.probs(logits, 1.0, top_p=tp), atol=1e-6)
print("top-p 0.9 keeps", int((probs_top_p(logits, 0.9) > 0).sum()), "of", logits.numel(), "tokens")

# %% [markdown]
# ## See it: temperature and top-p on the distribution
# The sliders reshape the next-token distribution live (with a running kernel); the static
# figure shows three settings side by side.

# %%
import ipywidgets as widgets

def show(T=1.0, top_p=1.0, n=15):
    q = sampling.probs(logits, T, top_p=top_p)
    v, i = q.topk(n)
    plt.figure(figsize=(6, 2.6)); plt.bar(range(n), v.tolist())
    plt.xticks(range(n), [lm.tokenizer.decode([t]) for t in i.tolist()], rotation=60, fontsize=8)
    plt.title(f"T={T}, top_p={top_p}: {(q > 0).sum().item()} tokens kept"); plt.tight_layout(); plt.show()

widgets.interact(show, T=widgets.FloatSlider(value=1.0, min=0.1, max=2.0, step=0.1),
                 top_p=widgets.FloatSlider(value=1.0, min=0.05, max=1.0, step=0.05), n=widgets.fixed(15));

# %% [markdown]
# Three fixed settings, drawn even without a live kernel: sharper (T=0.5), plain, and nucleus 0.5.

# %%
for T, tp in [(0.5, 1.0), (1.0, 1.0), (1.0, 0.5)]:
    show(T, tp)

# %% [markdown]
# ## Seeded sampling
# A `torch.Generator` makes sampling reproducible: the same seed gives the same draws. Every
# `generate` in `refimpl` takes `generator=`.

# %%
g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
a = sampling.sample(logits.expand(10, -1), 0.9, generator=g1)
b = sampling.sample(logits.expand(10, -1), 0.9, generator=g2)
print([lm.tokenizer.decode([t]) for t in a.tolist()])
assert torch.equal(a, b)

# %% [markdown]
# ## Decoding without a cache, by hand
# The simplest decoder re-runs the whole sequence every step. Step `t` processes `len(prompt) + t`
# tokens, so generating `n` tokens costs O(n²) token-forwards.

# %%
def greedy_no_cache(lm, prompt, n):
    seq = list(prompt)
    for _ in range(n):
        nxt = int(lm.logits(torch.tensor([seq], device=lm.device))[0, -1].argmax())
        seq.append(nxt)
    return seq[len(prompt):]

t0 = time.perf_counter(); hand = greedy_no_cache(lm, prompt, NEW_TOKENS); t_nocache = time.perf_counter() - t0
print(repr(lm.decode(hand)))

# %% [markdown]
# ## Decoding with a KV cache, by hand
# Prefill the prompt once, then feed only the newest token: each step is one token-forward that
# attends to the cached keys and values.

# %%
def greedy_cache(lm, prompt, n):
    logits, cache = lm.forward(torch.tensor([prompt], device=lm.device))
    out = []
    for _ in range(n):
        nxt = logits[:, -1].argmax(-1, keepdim=True)     # (1, 1)
        out.append(int(nxt))
        logits, cache = lm.forward(nxt, cache)
    return out

t0 = time.perf_counter(); hand_cache = greedy_cache(lm, prompt, NEW_TOKENS); t_cache = time.perf_counter() - t0
assert hand_cache == hand
print(f"no cache {t_nocache:.2f}s, cache {t_cache:.2f}s -> {t_nocache / t_cache:.1f}x")

# %% [markdown]
# ## Compare with `refimpl.autoregressive`
# The tested decoder must give the same tokens with and without its cache, and the same tokens
# as Hugging Face's own `generate`. We disable EOS stopping (`eos_token_id=[]`) to compare all tokens.

# %%
g_cache = autoregressive.generate(lm, prompt, max_new_tokens=NEW_TOKENS, eos_token_id=[])
g_nocache = autoregressive.generate(lm, prompt, max_new_tokens=NEW_TOKENS, eos_token_id=[], use_cache=False)
hf = lm.model.generate(torch.tensor([prompt], device=DEVICE), max_new_tokens=NEW_TOKENS, do_sample=False,
                       eos_token_id=None, pad_token_id=lm.pad_token_id)[0, len(prompt):].tolist()
assert g_cache.tokens[0] == g_nocache.tokens[0] == hand == hf
print(g_cache.stats.as_dict())

# %% [markdown]
# ## Cost: cache vs no cache as the output grows
# Time per token stays flat with a cache and grows linearly without one.

# %%
lengths = [8, 16, 32] if FAST else [16, 32, 64, 128, 256]
tc, tn = [], []
for n in lengths:
    tc.append(autoregressive.generate(lm, prompt, max_new_tokens=n, eos_token_id=[]).stats.seconds / n)
    tn.append(autoregressive.generate(lm, prompt, max_new_tokens=n, eos_token_id=[], use_cache=False).stats.seconds / n)
plt.figure(figsize=(5, 3)); plt.plot(lengths, [t * 1e3 for t in tn], "o-", label="no cache")
plt.plot(lengths, [t * 1e3 for t in tc], "o-", label="KV cache"); plt.xlabel("new tokens"); plt.ylabel("ms / token")
plt.legend(); plt.show()

# %% [markdown]
# ## Cache crop and rollback
# Speculative methods score guesses and then *take back* the rejected ones. `LM.crop(cache, n)`
# keeps the first `n` positions. After a rollback the cache must behave exactly as if the
# rejected tokens had never been fed.

# %%
_, cache = lm.forward(torch.tensor([prompt], device=DEVICE))
guesses = torch.tensor([[5, 6, 7, 8]], device=DEVICE)          # 4 wrong guesses
lm.forward(guesses, cache)
lm.crop(cache, len(prompt))                                      # roll back all 4
after, _ = lm.forward(torch.tensor([[hand[0]]], device=DEVICE), cache)
fresh = lm.logits(torch.tensor([prompt + [hand[0]]], device=DEVICE))[:, -1:]
assert lm.cache_length(cache) == len(prompt) + 1
assert torch.allclose(after, fresh, atol=1e-4)
print("cache length after rollback and one new token:", lm.cache_length(cache))

# %% [markdown]
# ## Ragged batches: left padding, by hand
# Prompts of different lengths are padded on the **left**, so every row's next token sits in the
# last column. A padding mask hides the pads and `position_ids` count only real tokens, so each row
# sees exactly what it would see alone.

# %%
batch = [prompt, lm.encode("In the beginning"), lm.encode("Blessed are the meek: for they shall")]
L = max(map(len, batch))
ids = torch.tensor([[lm.pad_token_id] * (L - len(r)) + r for r in batch], device=DEVICE)
mask = torch.tensor([[0] * (L - len(r)) + [1] * len(r) for r in batch], device=DEVICE)
pos = (mask.cumsum(-1) - 1).clamp(min=0)
last = lm.logits(ids, attention_mask=mask, position_ids=pos)[:, -1]          # (3, V)
alone = torch.stack([lm.logits(torch.tensor([r], device=DEVICE))[0, -1] for r in batch])
assert torch.allclose(last, alone, atol=1e-4)
print("padded batch == rows alone; pads per row:", (mask == 0).sum(-1).tolist())

# %% [markdown]
# `refimpl.autoregressive.generate` takes a ragged batch (a list of token lists) and does the
# same bookkeeping with the cache. Each row stops at its own EOS.

# %%
gb = autoregressive.generate(lm, batch, max_new_tokens=NEW_TOKENS)
for r, toks in zip(batch, gb.tokens):
    assert toks == autoregressive.generate(lm, r, max_new_tokens=NEW_TOKENS).tokens[0]
    print(repr(lm.decode(r)), "->", repr(lm.decode(toks)))

# %% [markdown]
# ## The decode-attention kernel
# At each step a few queries attend over a long cache. `kernels.decode_attention` splits the
# cache into chunks processed in parallel and merges the partial softmaxes (flash-decoding).
# On CPU it runs in Triton's interpreter when `TRITON_INTERPRET=1` (as in CI), else the torch
# reference. Compare it with a plain torch computation:

# %%
torch.manual_seed(0)
q = torch.randn(1, 4, 1, 64); k = torch.randn(1, 2, 300, 64); v = torch.randn(1, 2, 300, 64)   # GQA: 4 q heads, 2 kv heads
ours = kernels.decode_attention(q, k, v)
kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
torch_ref = torch.softmax(q @ kk.transpose(-1, -2) / 64 ** 0.5, -1) @ vv
print("max |difference|:", (ours - torch_ref).abs().max().item())
assert torch.allclose(ours, torch_ref, atol=1e-5)

# %% [markdown]
# The kernel is registered with transformers' attention interface, so the whole model can run
# through it: `models.load(MODEL, attn="triton")`.

# %%
lm_tri = models.load(MODEL, device=DEVICE, attn="triton")
short = prompt[:6]
assert torch.allclose(lm_tri.logits(torch.tensor([short])), lm.logits(torch.tensor([short])), atol=1e-4)
print("tiny model through the Triton kernel: logits match")

# %% [markdown]
# ## Exercises
# **1. min-p sampling.** Keep the tokens whose probability is at least `min_p` times the top
# token's probability, renormalise. Write `probs_min_p(logits, min_p)`.

# %%
def probs_min_p(logits, min_p):          # your answer here
    pr = torch.softmax(logits, -1)
    keep = pr >= min_p * pr.max()
    return torch.where(keep, pr, torch.zeros_like(pr)) / (pr * keep).sum()

def check_min_p(fn):
    for mp in (0.05, 0.2, 0.9):
        pr = torch.softmax(logits, -1)
        want = pr * (pr >= mp * pr.max()); want = want / want.sum()
        assert torch.allclose(fn(logits, mp), want, atol=1e-6), f"min_p={mp}"
    return "correct"

print(check_min_p(probs_min_p))

# %% [markdown]
# **2. Counting work.** Without a cache, how many token-forwards does decoding `n` tokens after a
# prompt of length `L` take (prefill included)? With a cache? Give both as functions of `L, n`.

# %%
def nocache_work(L, n): return sum(L + t for t in range(n))   # your answer here
def cache_work(L, n): return L + n - 1                         # your answer here

def check_work(f_nocache, f_cache):
    for L, n in [(5, 1), (10, 7), (100, 64)]:
        assert f_nocache(L, n) == n * L + n * (n - 1) // 2, "each step re-reads the whole sequence"
        assert f_cache(L, n) == L + (n - 1), "prefill L, then one token per later step"
    return "correct"

print(check_work(nocache_work, cache_work))

# %% [markdown]
# **3. Rollback.** Feed three guesses after the prompt, keep only the first, and show the logits
# after the kept guess equal a fresh run on `prompt + [g0]`.

# %%
def rollback_keep_first(lm, prompt, guesses):   # your answer here
    _, cache = lm.forward(torch.tensor([prompt], device=lm.device))
    lg, cache = lm.forward(torch.tensor([guesses], device=lm.device), cache)
    lm.crop(cache, len(prompt) + 1)
    return lg[:, :1], cache

lg, c = rollback_keep_first(lm, prompt, [11, 12, 13])
assert lm.cache_length(c) == len(prompt) + 1
assert torch.allclose(lg, lm.logits(torch.tensor([prompt + [11]]))[:, -1:], atol=1e-4)
print("correct" if not SHOW_SOLUTIONS else "see rollback_keep_first above")

# %% [markdown]
# ## Summary
# - Sampling = warp the logits (temperature, top-k, top-p), then draw with a seeded generator.
# - The KV cache turns O(n²) decoding into O(n); `crop` undoes tokens, which speculative methods rely on.
# - Ragged batches use left padding, a padding mask and real-token position ids.
# - Every later chapter must reproduce `autoregressive.generate`'s greedy tokens exactly.
