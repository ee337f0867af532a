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
# Each idea is built by hand, then checked against `refimpl`. After this notebook you can
#
# 1. turn logits into the distribution a decoder samples from (greedy, temperature, top-k, top-p)
#    and draw from it reproducibly with a seeded generator, matching `refimpl.sampling`;
# 2. say what a KV cache holds at every step and count the forward calls and token positions a
#    decoder spends with and without one (`refimpl.autoregressive`);
# 3. roll a cache back with `crop` so that rejected tokens leave no trace (every speculative method needs it);
# 4. batch prompts of different lengths with left padding, a padding mask and position ids;
# 5. check the decode-attention Triton kernel (`kernels.decode_attention`) against plain torch.

# %% [markdown]
# ## Parameters

# %%
import torch
from refimpl.models import default_device

FAST = True                    # CI default
MODEL = "tiny"                 # any zoo name or local Hugging Face folder
DEVICE = default_device()      # a torch.device: CUDA when present, $REFIMPL_DEVICE overrides
NEW_TOKENS = 24 if FAST else 128
PROMPT = "And God said unto Moses,"
SHOW_SOLUTIONS = False

# %% [markdown]
# ## Imports and the model

# %%
import time
import matplotlib.pyplot as plt
from refimpl import models, sampling, autoregressive
from kernels.decode_attention import decode_attention

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
    return torch.softmax(torch.where(logits >= kth, logits, torch.tensor(float("-inf"), device=logits.device)) / T, -1)

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
# The sliders reshape the next-token distribution (the 15 most likely tokens). Lower `T` sharpens
# it, lower `top_p` cuts its tail.

# %%
import ipywidgets as widgets

def plot_probs(T=1.0, top_p=1.0, n=15):
    global shown
    q = sampling.probs(logits, T, top_p=top_p)
    v, i = q.topk(n)
    shown = f"T={T:.1f}, top_p={top_p:.2f}: {(q > 0).sum().item()} tokens kept, top one {v[0]:.3f}"
    plt.figure(figsize=(6, 2.6)); plt.bar(range(n), v.tolist())
    plt.xticks(range(n), [lm.tokenizer.decode([t]) for t in i.tolist()], rotation=60, fontsize=8)
    plt.title(shown, fontsize=9); plt.tight_layout(); plt.show()

ui = widgets.interact(plot_probs, T=widgets.FloatSlider(continuous_update=False, value=1.0, min=0.1, max=2.0, step=0.1),
                      top_p=widgets.FloatSlider(continuous_update=False, value=1.0, min=0.05, max=1.0, step=0.05), n=widgets.fixed(15)).widget

# %% jupyter={"source_hidden": true} tags=["ci-only", "remove-input"]
# CI's self-test of the widget above (collapsed in the lab): move a control as a person would,
# check that the output changed, then put the control back to its teaching default
default = ui.children[1].value
before = shown
ui.children[1].value = 0.5                        # move the top_p slider
assert shown != before, "moving a slider must change the picture"
ui.children[1].value = default

# %% [markdown]
# ## Seeded sampling
# A `torch.Generator` makes sampling reproducible: the same seed gives the same draws. Every
# `generate` in `refimpl` takes `generator=`.

# %%
g1, g2 = torch.Generator(device=DEVICE).manual_seed(7), torch.Generator(device=DEVICE).manual_seed(7)   # on the logits' device
a = sampling.sample(logits.expand(10, -1), 0.9, generator=g1)
b = sampling.sample(logits.expand(10, -1), 0.9, generator=g2)
print([lm.tokenizer.decode([t]) for t in a.tolist()])
assert torch.equal(a, b)

# %% [markdown]
# ## The seeded draw, by hand
# How does one random number generator become a token? `torch.multinomial` (for one sample per
# row) runs an **exponential race**: give token `i` an alarm that rings after `E_i / p_i` seconds,
# with `E_i ~ Exp(1)` drawn from the generator, and return the first to ring, `argmax_i p_i / E_i`.
# `E_i / p_i` is exponential with rate `p_i`, and the first of independent exponential alarms is
# alarm `i` with probability `rate_i / sum(rates) = p_i`. Built by hand with the same generator, it
# reproduces `torch.multinomial`'s draws exactly. (The generator lives on the device of the
# probabilities, `DEVICE`, and the race is drawn there: a CUDA generator gives a different stream
# than a CPU one, so both sides use the same device.) The race draws one random number per token:
# 49,152 of them a draw on SmolLM2's vocabulary. `refimpl.sampling` draws one per row instead, by the
# inverse CDF of Exercise 2 below: the same distribution, a different stream.

# %%
def draw_by_hand(pr, gen):                                 # pr (..., V) -> (...)
    pr = pr.float()
    e = torch.empty(pr.shape, device=pr.device).exponential_(1.0, generator=gen)   # one Exp(1) per token, from the generator
    return (pr / e).argmax(-1)

pr9 = sampling.probs(logits, 0.9).expand(10, -1)
mine = draw_by_hand(pr9, torch.Generator(device=DEVICE).manual_seed(7))
race = torch.multinomial(pr9, 1, generator=torch.Generator(device=DEVICE).manual_seed(7))[:, 0]
assert torch.equal(mine, race), "the race must reproduce torch.multinomial's seeded draws"
print("by hand == torch.multinomial, draw for draw:", mine.tolist())

# %% [markdown]
# ## Decoding without a cache, by hand
# The simplest decoder re-runs the whole sequence every step. Step `t` (from 0) processes
# `len(prompt) + t` token positions, so generating `n` tokens costs O(n²) position-forwards.

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
# Prefill the prompt once (one call over `L` positions, which already predicts the first new
# token), then feed only the newest token: each later step is one call over one position that
# attends to the cached keys and values. The loop stops as soon as it has `n` tokens: the last
# token is never fed, since nothing needs its logits.

# %%
def greedy_cache(lm, prompt, n):
    logits, cache = lm.forward(torch.tensor([prompt], device=lm.device))   # prefill
    out = []
    while True:
        nxt = logits[:, -1].argmax(-1, keepdim=True)     # (1, 1)
        out.append(int(nxt))
        if len(out) == n:
            return out
        logits, cache = lm.forward(nxt, cache)          # decode step

t0 = time.perf_counter(); hand_cache = greedy_cache(lm, prompt, NEW_TOKENS); t_cache = time.perf_counter() - t0
assert hand_cache == hand
print(f"no cache {t_nocache:.2f}s, cache {t_cache:.2f}s -> {t_nocache / t_cache:.1f}x")

# %% [markdown]
# ## What the cache holds at each call
# Wrap the model in a small recorder that logs, for every forward call, how many positions were
# already cached and how many were fed, then run both hand-built loops through it.

# %%
class Recorder:
    """Forwards to `lm` and logs (cached positions, fed positions) for every call."""
    def __init__(self, lm):
        self.lm, self.device, self.log = lm, lm.device, []
    def forward(self, ids, cache=None):
        self.log.append((0 if cache is None else self.lm.cache_length(cache), ids.shape[1]))
        return self.lm.forward(ids, cache)
    def logits(self, ids):
        self.log.append((0, ids.shape[1]))
        return self.lm.logits(ids)

rec_nc, rec_c, n_pic = Recorder(lm), Recorder(lm), 8
assert greedy_no_cache(rec_nc, prompt, n_pic) == greedy_cache(rec_c, prompt, n_pic) == hand[:n_pic]
print("no cache:", rec_nc.log, "\nKV cache:", rec_c.log)

# %% [markdown]
# Drawn: one row per forward call, one column per sequence position. Grey positions are read from
# the cache, blue ones are computed in this call; the orange dot is the token the call predicts.
# Without a cache every call recomputes the whole prefix; with one, the prefill computes the
# prompt once and each decode step computes a single position.

# %%
import numpy as np

fig, axes = plt.subplots(1, 2, figsize=(10, 3.2), sharey=True)
for ax, rec, title in [(axes[0], rec_nc, "no cache"), (axes[1], rec_c, "KV cache")]:
    grid = np.zeros((len(rec.log), len(prompt) + n_pic))
    for r, (cached, fed) in enumerate(rec.log):
        grid[r, :cached], grid[r, cached:cached + fed] = 1, 2
        ax.plot(cached + fed, r, "o", color="tab:orange", ms=5)
    ax.imshow(grid, cmap=plt.matplotlib.colors.ListedColormap(["white", "0.8", "tab:blue"]), vmin=0, vmax=2, aspect="auto")
    work = sum(f for _, f in rec.log)
    ax.set_title(f"{title}: {len(rec.log)} calls, {work} positions computed", fontsize=9)
    ax.set_xlabel("sequence position (prompt, then new tokens)")
from matplotlib.patches import Patch
fig.legend(handles=[Patch(color="0.8", label="read from the cache"), Patch(color="tab:blue", label="computed in this call"),
                    plt.Line2D([], [], color="tab:orange", marker="o", ls="", label="token it predicts")], loc="lower center", ncol=3, fontsize=8)
axes[0].set_ylabel("forward call"); plt.tight_layout(rect=(0, 0.08, 1, 1)); plt.show()

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
# What holds on any machine is the **work** per token, the positions each call computes (the picture
# above): with a cache, the prefill computes the prompt once and every later call one position, so the
# work per token stays flat; without one, call `t` recomputes the prompt and all `t` tokens so far, so
# the work per token grows linearly with the output. Time follows work only where work is most of what
# a call costs. On `tiny` (4 M parameters) with `FAST`'s 8-32 tokens a call's fixed cost (Python,
# dispatch, the first call's warm-up) is a large part of it, and each point is one run of a few
# milliseconds that anything else on the machine can move: the measured curves below change shape from
# run to run, and the cached one can come out slower at some length. The cell prints the positions
# computed per token next to the measured time; `FAST = False` (up to 256 tokens) lets the recomputed
# prefix grow until the no-cache curve rises clearly above the cached one.

# %%
lengths = [8, 16, 32] if FAST else [16, 32, 64, 128, 256]
tc, tn = [], []
for n in lengths:
    tc.append(autoregressive.generate(lm, prompt, max_new_tokens=n, eos_token_id=[]).stats.seconds / n)
    tn.append(autoregressive.generate(lm, prompt, max_new_tokens=n, eos_token_id=[], use_cache=False).stats.seconds / n)
for n, a, b in zip(lengths, tc, tn):       # positions computed: (P + n - 1) with a cache, sum of (P + t) without
    work_c, work_n = (len(prompt) + n - 1) / n, (n * len(prompt) + n * (n - 1) / 2) / n
    print(f"{n:4d} tokens: positions per token {work_c:5.1f} cached, {work_n:5.1f} not | ms per token {a * 1e3:5.2f} cached, {b * 1e3:5.2f} not")
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
# **Which caches can roll back.** Every speculative method in this course rests on this crop. A
# full-attention layer's cache crops as above. A **sliding-window** layer (Mistral 7B v0.1, Phi-3, the
# local layers of Gemma 2 / 3 and gpt-oss) normally keeps only its last `W` keys, so the keys a rejected
# draft pushed out would be lost. For such a model `refimpl` keeps every position and measures each
# window in positions (`refimpl.lm.WindowCache`), so every method stays exact. A layer that nothing can
# roll back (a recurrent or linear-attention state, chunked attention) is refused before decoding with a
# `ValueError` that names the layer. Such a model runs with `method="ar"`, and `methods.available(model)`
# lists what it can run (docs/models.md, "A model you bring").

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
q, k, v = (torch.randn(1, h, t, 64, device=DEVICE) for h, t in [(4, 1), (2, 300), (2, 300)])   # GQA: 4 q heads, 2 kv heads
ours = decode_attention(q, k, v)
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
x = torch.tensor([short], device=DEVICE)
assert torch.allclose(lm_tri.logits(x), lm.logits(x), atol=1e-4)
print("tiny model through the Triton kernel: logits match")

# %% [markdown]
# ## Exercises
# Each exercise is a stub for you to fill in, followed by a check that answers "not attempted
# yet", "wrong, because ..." or "correct". The reference answers are hidden in
# `solutions/ch01.py`; set `SHOW_SOLUTIONS = True` in the parameters to print them.
#
# **1. min-p sampling.** Keep the tokens whose probability is at least `min_p` times the top
# token's probability, renormalise. Write `probs_min_p(logits, min_p)` for logits `(..., V)`.

# %%
from solutions import answers_on, exercise, check, show


@exercise("01", "probs_min_p")
def probs_min_p(logits, min_p):
    ...  # your code
    raise NotImplementedError

# %% [markdown]
# The check uses two facts that any correct min-p must satisfy, on this chapter's real logits:
# with `min_p = 0` nothing is cut (plain softmax), and with `min_p` just above the second-largest
# probability ratio only the argmax survives (greedy); in between it must keep exactly the tokens
# at or above the cut and keep their relative probabilities.

# %%
def check_min_p():
    pr = sampling.probs(logits, 1.0)
    assert torch.allclose(probs_min_p(logits, 0.0), pr, atol=1e-6), "min_p = 0 must be plain softmax"
    second = (pr.topk(2).values[1] / pr.max()).item()
    assert torch.allclose(probs_min_p(logits, second + 1e-3), sampling.probs(logits, 0.0), atol=1e-6), "above the runner-up ratio only the argmax may remain"
    for mp in (0.05, 0.2):
        out = probs_min_p(logits[None].expand(3, -1), mp)[1]
        kept = out > 0
        assert abs(out.sum().item() - 1) < 1e-5, f"min_p={mp}: the kept probabilities must sum to 1"
        assert torch.equal(kept, pr >= mp * pr.max()), f"min_p={mp}: you keep {int(kept.sum())} tokens, {int((pr >= mp * pr.max()).sum())} reach the cut"
        assert torch.allclose(out[kept] / out[kept].max(), pr[kept] / pr[kept].max(), atol=1e-5), "kept tokens must keep their ratios"


check("Exercise 1", check_min_p)
if SHOW_SOLUTIONS:
    show("01", "probs_min_p")

# %% [markdown]
# **2. The seeded draw by inverse CDF.** The exponential race above is one way to draw; the
# classic one, and the one `refimpl.sampling` uses, is the inverse CDF: draw one uniform `u` per row from the generator and return the
# first token whose cumulative probability exceeds `u`. Write `my_sample(pr, gen)` for
# probabilities `pr` of shape `(B, V)`, returning `(B,)` token ids, with every random number taken
# from `gen` (a `torch.Generator` on the device of `pr`: make your uniforms there). It will not
# reproduce the race's draws one by one, but it must draw from the same distribution and be just
# as reproducible.

# %%
@exercise("01", "my_sample")
def my_sample(pr, gen):
    ...  # your code
    raise NotImplementedError

# %% [markdown]
# The check draws from the real model's top-k distribution (8 tokens) and tests the draws with a
# chi-square against `refimpl.sampling.probs`. First its negative control: an off-by-one inverse
# CDF must fail the test.

# %%
from scipy.stats import chisquare

pr8 = sampling.probs(logits, 0.8, top_k=8)                                # (V,) eight tokens > 0
keep = pr8.nonzero()[:, 0]
small = pr8[keep][None].expand(20000, -1).contiguous()                    # (20000, 8)

def pvalue(draws):                                                        # draws: indices into `keep`
    e = pr8[keep].double().cpu()                                          # scipy reads CPU arrays
    return chisquare(torch.bincount(draws, minlength=8).double().cpu(), e / e.sum() * len(draws)).pvalue  # scipy reads CPU arrays

u = torch.rand(20000, 1, device=DEVICE, generator=torch.Generator(device=DEVICE).manual_seed(5))
off_by_one = ((small.cumsum(-1) <= u).sum(-1) + 1).clamp(max=7)          # WRONG on purpose
assert pvalue(off_by_one) < 1e-3, "the test must reject a wrong sampler"
print(f"negative control (off-by-one inverse CDF): p-value {pvalue(off_by_one):.1e}")

# %% [markdown]
# The check: the same seed gives the same draws, a token of probability 0 is never drawn, and
# 20,000 draws pass the chi-square test.

# %%
def check_my_sample():
    gen = lambda seed: torch.Generator(device=DEVICE).manual_seed(seed)   # on the device of the probabilities
    first = my_sample(small[:50], gen(1))
    assert torch.equal(first, my_sample(small[:50], gen(1))), "same seed, same draws"
    full = my_sample(pr8[None].expand(200, -1), gen(3))
    assert bool((full[:, None] == keep).any(1).all()), "drew a token of probability 0"
    pv = pvalue(my_sample(small, gen(4)))
    assert pv > 1e-3, f"20,000 draws are not distributed as sampling.probs (chi-square p-value {pv:.1e})"


check("Exercise 2", check_my_sample)
if SHOW_SOLUTIONS:
    show("01", "my_sample")

# %% [markdown]
# **3. Counting work.** Write `forward_work(L, n, use_cache)`: for a prompt of `L` tokens and `n`
# new tokens, the number of forward **calls** and the number of token **positions computed**
# (summed over calls) that this chapter's hand-built loops spend, `greedy_no_cache` when
# `use_cache` is False and `greedy_cache` when it is True. Return `(calls, positions)`.

# %%
@exercise("01", "forward_work")
def forward_work(L, n, use_cache):
    ...  # your code
    raise NotImplementedError

# %% [markdown]
# The check runs both loops through the `Recorder` above for a few prompt and output lengths and
# counts; it also asks `refimpl.autoregressive` how many target calls it made.

# %%
def check_forward_work():
    for L, n in [(3, 1), (5, 4), (len(prompt), 6)]:
        for use_cache, loop in [(False, greedy_no_cache), (True, greedy_cache)]:
            rec = Recorder(lm)
            loop(rec, prompt[:L], n)
            truth = (len(rec.log), sum(f for _, f in rec.log))
            got = tuple(forward_work(L, n, use_cache))
            assert got == truth, f"L={L}, n={n}, use_cache={use_cache}: you say (calls, positions) = {got}, the loop spent {truth}"
        calls = autoregressive.generate(lm, prompt[:L], max_new_tokens=n, eos_token_id=[]).stats.target_calls
        assert forward_work(L, n, True)[0] == calls, f"refimpl made {calls} calls for n={n}"


check("Exercise 3", check_forward_work)
if SHOW_SOLUTIONS:
    show("01", "forward_work")

# %% [markdown]
# ## Summary
# - Sampling = warp the logits (temperature, top-k, top-p, min-p), then draw with a seeded
#   generator (an exponential race in `torch.multinomial`, or an inverse CDF: same distribution).
# - Without a cache, `n` tokens cost `n` calls over `nL + n(n−1)/2` positions; with a KV cache,
#   `n` calls over `L + n − 1` positions: one prefill over the prompt, then one position per token.
# - `crop` undoes tokens in the cache, which speculative methods rely on.
# - Ragged batches use left padding, a padding mask and real-token position ids.
# - Every later chapter must reproduce `autoregressive.generate`'s greedy tokens exactly.
