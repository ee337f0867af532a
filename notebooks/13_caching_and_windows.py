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
# The cache is refreshed at every block start. Finally, **windows**: drop far-away masked positions
# from the input altogether.
#
# **After this chapter you can**
#
# 1. say why a dLLM has no exact KV cache, and measure how much the cached keys move within a block;
# 2. compute a prefix-cache step and a dual-cache step by hand and reproduce
#    `diffusion.generate(cache="prefix")` and `cache="dual"` token for token;
# 3. predict how many tokens each variant feeds the model per call (`P + G`, `G − j·b`, `b` in block `j`)
#    and check the prediction against a recorded run;
# 4. read from a positions × calls picture what each variant computes afresh, reads from the cache, or
#    leaves out;
# 5. weigh token-forwards against agreement with the uncached sampler, and say why wall-clock numbers
#    from this notebook are only illustrative.

# %% [markdown]
# ## Parameters

# %%
import torch
from refimpl.models import default_device

FAST = True                        # CI default: short prompts and answers
MODEL = "tiny-dllm"
AR_MODEL = "tiny"
DEVICE = default_device()          # a torch.device: CUDA when present, $REFIMPL_DEVICE overrides
PROMPT_LEN = 64 if FAST else 128
GEN, BLOCK = 32 if FAST else 64, 8 if FAST else 16
SHOW_SOLUTIONS = False

# %% [markdown]
# ## Imports and models

# %%
import matplotlib.pyplot as plt
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch
from refimpl import diffusion, models
from refimpl.bench import dllm as diffusion_bench
from solutions import exercise, check, show

torch.set_grad_enabled(False)                                    # inference only
dlm, ar = models.load(MODEL, device=DEVICE), models.load(AR_MODEL, device=DEVICE)
tok, MASK = dlm.tokenizer, dlm.mask_token_id
prompts = diffusion_bench.kjv_prompts(tok, 2 if FAST else 8, length=PROMPT_LEN)
P = PROMPT_LEN
print(len(prompts), "prompts of", P, "tokens; answer", GEN, "in blocks of", BLOCK)

# %% [markdown]
# ## The cache contract
# The calls Fast-dLLM's samplers make: `dlm(ids, use_cache=True)` returns `.logits` and
# `.past_key_values`, a per-layer tuple of `(k, v)` (B, H, T, D) (RoPE already applied);
# `dlm(later_ids, past_key_values=context)` feeds only the later tokens, which attend to the
# cached *context* and to themselves (their positions continue after the context unless
# `position_ids=` says otherwise). With fresh K/V the split is exact:

# %%
x = torch.tensor([prompts[0] + [MASK] * GEN], device=DEVICE)
full = dlm(x, use_cache=True)                                    # .logits (1, T, V), K/V per layer
kv = full.past_key_values
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
cache = [(k[:, :, :s], v[:, :, :s]) for k, v in kv]              # from the block-start forward above
approx = dlm(y[:, s:], past_key_values=cache).logits             # after committing some tokens
exact = dlm(y).logits[:, s:]
agree = (approx.argmax(-1) == exact.argmax(-1)).float().mean().item()
print(f"argmax agreement with the exact forward: {agree:.1%}, max |logit difference| {(approx - exact).abs().max():.3f}")

# %% [markdown]
# ## A cached sampler, by hand (greedy, one token per step)
# At each block start, a full forward gives that step's logits and every position's K/V; the other
# steps of the block call `cached_call(model, x, kv, s, e)`, which returns logits whose first
# `e − s` rows are the block's. The prefix cache is one such call:

# %%
def prefix_call(model, x, kv, s, e):                             # the block and everything after it
    return model(x[:, s:], past_key_values=[(k[:, :, :s], v[:, :, :s]) for k, v in kv]).logits

# %% [markdown]
# The sampler, with the block's step as an argument:

# %%
def cached_sampler(model, prompt, gen_length, block_length, cached_call):
    P, x = len(prompt), torch.tensor([prompt + [MASK] * gen_length], device=DEVICE)
    for s in range(P, P + gen_length, block_length):
        e = s + block_length
        for step in range(block_length):
            if step == 0:                                        # block start: full pass, keep all K/V
                out = model(x, use_cache=True); kv, lg = out.past_key_values, out.logits[0, s:e]
            else:
                lg = cached_call(model, x, kv, s, e)[0, :block_length]
            lg[:, MASK] = float("-inf")
            c, pred = torch.softmax(lg.double(), -1).max(-1)
            c[x[0, s:e] != MASK] = -float("inf")
            i = int(c.argmax()); x[0, s + i] = pred[i]
    return x[0, P:].tolist()

# %% [markdown]
# It equals `refimpl.diffusion.generate(cache="prefix")`. (The library selects in torch here,
# `use_kernel=False`: chapter 12 checked that the fused selection kernel picks the same tokens, and
# under `TRITON_INTERPRET=1`, as CI runs the notebooks, the kernel runs in a Python interpreter and is slow.)

# %%
kw = dict(gen_length=GEN, steps=GEN, block_length=BLOCK, eos_token_id=[], use_kernel=False)
lib_prefix = diffusion.generate(dlm, prompts, cache="prefix", **kw)
for row, p in enumerate(prompts):
    assert cached_sampler(dlm, p, GEN, BLOCK, prefix_call) == lib_prefix.tokens[row]
print("hand-built prefix cache == refimpl (cache='prefix') on", len(prompts), "prompts")

# %% [markdown]
# ## Exercise 1: one dual-cache step
# The dual cache feeds **only the block** `x[:, s:e]`. Everything else, the prefix *and* the masked
# suffix, comes from the block-start cache `kv` (per layer `(k, v)`, each (B, H, T, D) over all
# `T = P + G` positions). The block's own cached K/V are stale (the block has changed since): the
# block's fresh K/V, computed in this call, take their place.
#
# Write `dual_cache_logits(model, x, kv, s, e)` -> the block's logits (B, e − s, V), using only the
# public call `model(ids, past_key_values=context, position_ids=pos)`: `context` is per layer
# `(k, v)` of the tokens to attend to besides the queries (their order does not matter: attention
# is bidirectional and the keys carry their positions); `pos` (B, Q) the queries' positions.

# %%
@exercise("13", "dual_cache_logits")
def dual_cache_logits(model, x, kv, s, e):
    # your code here
    raise NotImplementedError

# %% [markdown]
# The check needs a state a few steps into the second block: the first block finished, the cache
# taken at the second block's start, three of its tokens committed since.

# %%
def second_block_state():
    s, e = P + BLOCK, P + 2 * BLOCK                              # the second block
    x = torch.tensor([p + [MASK] * GEN for p in prompts], device=DEVICE)
    x[:, P:s] = dlm.logits(x)[:, P:s].argmax(-1)                 # a finished first block
    kv = dlm(x, use_cache=True).past_key_values                  # the block-start cache
    x[:, s: s + 3] = dlm.logits(x)[:, s: s + 3].argmax(-1)       # three tokens committed since
    return x, kv, s, e

# %% [markdown]
# The check compares your logits there with the call the library makes (`replace_position=`,
# Fast-dLLM's interface: the block's K/V overwrite their slots of the cache), then runs the sampler
# above with your step against `diffusion.generate(cache="dual")`.

# %%
def check_dual():
    x, kv, s, e = second_block_state()
    rp = torch.zeros_like(x, dtype=torch.bool); rp[:, s:e] = True
    want = dlm(x[:, s:e], past_key_values=kv, replace_position=rp).logits
    got = dual_cache_logits(dlm, x, kv, s, e)
    assert tuple(got.shape) == tuple(want.shape), f"shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    err = (got - want).abs().max().item()
    assert err < 1e-4, f"your logits differ from the library's dual-cache call by {err:.3g}"
    lib = diffusion.generate(dlm, prompts, cache="dual", **kw)
    for row, p in enumerate(prompts):
        assert cached_sampler(dlm, p, GEN, BLOCK, dual_cache_logits) == lib.tokens[row], "tokens differ from cache='dual'"


check("Exercise 1", check_dual)
if SHOW_SOLUTIONS:
    show("13", "dual_cache_logits")

# %% [markdown]
# ## Refreshing every step makes it exact
# `cache_refresh="step"` rebuilds the cache before every step and then uses
# the *cached* forward: the output equals the uncached sampler, which shows the only error of
# the cache is staleness.

# %%
ref = diffusion.generate(dlm, prompts, **kw)
for cache in ("prefix", "dual"):
    fresh = diffusion.generate(dlm, prompts, cache=cache, cache_refresh="step", **kw)
    assert fresh.tokens == ref.tokens
print("fresh caches reproduce the uncached sampler exactly")

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
# With `w` large enough to cover the whole answer it *is* the LLaDA sampler:

# %%
assert window_sampler(dlm, prompts[0], GEN, BLOCK, GEN) == ref.tokens[0]
print("window sampler with w = GEN == refimpl (no cache)")

# %% [markdown]
# ## What each variant feeds the model
# A wrapper around the model records, at every call, which positions the model computes afresh
# (queries), which it reads from the cache, and which it never sees. It answers the same calls as the
# model, so the library's samplers run through it unchanged.

# %%
class Recorder:
    def __init__(self, model, length):
        self.model, self.length, self.rows = model, length, []   # rows: per call, 2 fed / 1 cached / 0 unseen

    def __getattr__(self, name):                                 # mask_token_id, device, ... from the model
        return getattr(self.model, name)

    def note(self, fed, cached=()):
        row = torch.zeros(self.length, dtype=torch.long, device="cpu")   # host bookkeeping for the picture
        row[list(cached)] = 1; row[list(fed)] = 2
        self.rows.append(row)

    def logits(self, ids, attention_mask=None):
        self.note(range(ids.size(1)))
        return self.model.logits(ids, attention_mask=attention_mask)

# %% [markdown]
# The cached calls: with `replace_position` (dual) the queries are the marked slots and every other
# slot is read from the cache; otherwise the queries follow the cached context.

# %%
def recorded_forward(self, input_ids, attention_mask=None, past_key_values=None, use_cache=None,
                     replace_position=None):
    S = 0 if past_key_values is None else past_key_values[0][0].size(2)
    fed = (replace_position[0].nonzero().flatten().tolist() if replace_position is not None
           else range(S, S + input_ids.size(1)))
    self.note(fed, range(S))
    return self.model(input_ids, attention_mask=attention_mask, past_key_values=past_key_values,
                      use_cache=use_cache, replace_position=replace_position)


Recorder.forward = Recorder.__call__ = recorded_forward

# %% [markdown]
# Record one prompt through each variant: the library with no cache, the prefix cache and the dual
# cache, and our window sampler with `w = BLOCK`.

# %%
T = P + GEN
recs = {name: Recorder(dlm, T) for name in ("no cache", "prefix", "dual", f"window w={BLOCK}")}
for name, cache in (("no cache", None), ("prefix", "prefix"), ("dual", "dual")):
    g = diffusion.generate(recs[name], [prompts[0]], cache=cache, **kw)
    assert len(recs[name].rows) == g.stats.nfe                   # one row per denoiser call
window_sampler(recs[f"window w={BLOCK}"], prompts[0], GEN, BLOCK, BLOCK)
print({name: len(r.rows) for name, r in recs.items()}, "calls")

# %% [markdown]
# The picture: one row per call, one column per position (prompt, then the answer's blocks). Dark =
# computed in this call, light = read from the cache, white = not seen at all. No cache recomputes
# everything every call; the prefix cache's fed region shrinks block by block (`G − j·b`); the dual
# cache computes one block-wide strip per call; the window never sees the far masks.

# %%
def draw_feed(ax, rec, title, block=BLOCK):
    ax.imshow(torch.stack(rec.rows), aspect="auto", interpolation="nearest",
              cmap=ListedColormap(["white", "#a6cee3", "#1f4e79"]), vmin=0, vmax=2)
    for k in range(P, T, block):
        ax.axvline(k - 0.5, color="tab:red" if k == P else "0.6", lw=1)
    ax.set_title(title, fontsize=9); ax.set_xlabel("position (red line: answer starts)")


fig, axes = plt.subplots(1, 4, figsize=(14, 3.6), sharey=True)
for ax, (name, rec) in zip(axes, recs.items()):
    draw_feed(ax, rec, f"{name}: {int(sum((r == 2).sum() for r in rec.rows))} token-forwards")
axes[0].set_ylabel("denoiser call")
fig.legend(handles=[Patch(facecolor=c, edgecolor="0.5", label=l) for c, l in [("#1f4e79", "computed in this call"),
           ("#a6cee3", "read from the cache"), ("white", "not seen")]], loc="lower center", ncol=3, fontsize=8,
           edgecolor="0.5")
plt.tight_layout(rect=(0, 0.07, 1, 1)); plt.show()

# %% [markdown]
# ## Exercise 2: tokens fed per call
# A prompt of `P` tokens, answer `G`, blocks of `b`, one token per step. During block `j` (0-based), at
# a step that is *not* the block's first (that one is always a full pass of `P + G`), how many tokens
# does each variant feed the model (queries computed)? Write `tokens_fed(P, G, b, j, cache)` for
# `cache` in `None`, `"prefix"`, `"dual"`. (Attention still reads the cached keys too: the saving is in
# the projections and MLPs, which is most of a call's work.)

# %%
@exercise("13", "tokens_fed")
def tokens_fed(P, G, b, j, cache):
    # your code here
    raise NotImplementedError

# %% [markdown]
# The check records the library's calls (as above) for two shapes and compares, call by call.

# %%
def check_tokens_fed():
    for Pc, G, b in [(P, GEN, BLOCK), (20, 24, 6)]:
        for cache in (None, "prefix", "dual"):
            rec = Recorder(dlm, Pc + G)
            diffusion.generate(rec, [prompts[1][:Pc]], gen_length=G, steps=G, block_length=b, cache=cache,
                               eos_token_id=[], use_kernel=False)
            for call, row in enumerate(rec.rows):
                j, step = divmod(call, b)
                want = int((row == 2).sum())
                got = Pc + G if step == 0 else tokens_fed(Pc, G, b, j, cache)
                assert got == want, f"P={Pc}, G={G}, b={b}, cache={cache!r}, block {j}: you say {got}, the run fed {want}"


check("Exercise 2", check_tokens_fed)
if SHOW_SOLUTIONS:
    show("13", "tokens_fed")

# %% [markdown]
# ## Work against agreement
# Six runs on all prompts: no cache, prefix, dual, each with one token per step and with a threshold
# (0.1, low so that this unsure model commits several tokens per call; chapter 12). We record the
# tokens each run feeds the model.

# %%
runs = {}
for thr in (None, 0.1):
    for cache in (None, "prefix", "dual"):
        rec = Recorder(dlm, T)
        g = diffusion.generate(rec, prompts, threshold=thr, cache=cache, **kw)
        runs[thr, cache] = dict(gen=g, fed=int(sum((r == 2).sum() for r in rec.rows)))
print({k: (v["gen"].stats.nfe, v["fed"]) for k, v in runs.items()}, "(calls, token-forwards per row)")

# %% [markdown]
# Agreement: the fraction of answer tokens equal to the uncached run with the same commit rule.

# %%
for (thr, cache), r in runs.items():
    base = runs[thr, None]["gen"].tokens
    same = sum(a == b for ra, rb in zip(r["gen"].tokens, base) for a, b in zip(ra, rb)) / (len(prompts) * GEN)
    r["same"] = same
    print(f"threshold {thr}, cache {cache!s:6s}: {same:6.1%} of tokens as without a cache")
assert runs[None, None]["same"] == 1.0

# %% [markdown]
# Quality: perplexity of each run's text under the AR `tiny` model (lower is better). A different
# token is not necessarily a worse one.

# %%
for (thr, cache), r in runs.items():
    r["ppl"] = diffusion_bench.ar_perplexity(ar, prompts, r["gen"].tokens)
    print(f"threshold {thr}, cache {cache!s:6s}: perplexity {r['ppl']:7.1f}")

# %% [markdown]
# The work, drawn: token-forwards per row (the bars) against agreement (the labels).

# %%
fig, ax = plt.subplots(figsize=(7, 2.8))
names = [f"thr={t} cache={c}" for t, c in runs]
ax.barh(names, [r["fed"] for r in runs.values()], color=["0.6", "#a6cee3", "#1f4e79"] * 2)
for i, r in enumerate(runs.values()):
    ax.text(r["fed"], i, f"  {r['same']:.0%} same", va="center", fontsize=8)
ax.set_xlabel("token-forwards per row"); ax.invert_yaxis(); ax.set_xlim(0, 1.25 * max(r["fed"] for r in runs.values()))
plt.show()

# %% [markdown]
# ## Time (illustrative only)
# `stats.seconds` of each run. These numbers are **illustrative, never a result**: this is a shared
# CPU, the model is tiny (the cache bookkeeping can cost as much as it saves), and when CI runs this
# notebook under `TRITON_INTERPRET=1` nothing here is representative. On a GPU with long prompts the
# token-forwards above are what turns into time; `python -m refimpl.bench --suite dllm` measures it
# properly. No assert depends on these numbers.

# %%
for (thr, cache), r in runs.items():
    print(f"threshold {thr}, cache {cache!s:6s}: {r['gen'].stats.seconds:.2f} s (illustrative)")

# %% [markdown]
# ## Play: cache variant and block length
# The positions × calls picture for one prompt; choose the cache and the block length.

# %%
import ipywidgets as widgets


def play(cache="dual", block=BLOCK):
    global shown
    rec = Recorder(dlm, T)
    g = diffusion.generate(rec, [prompts[0]], gen_length=GEN, steps=GEN, block_length=block, cache=cache,
                           eos_token_id=[], use_kernel=False)
    fed = int(sum((r == 2).sum() for r in rec.rows))
    shown = f"cache={cache}, blocks of {block}: {g.stats.nfe} calls, {fed} token-forwards"
    fig, ax = plt.subplots(figsize=(7, 3)); draw_feed(ax, rec, shown, block); plt.show()

# %% [markdown]
# The widget:

# %%
ui = widgets.interact(play, cache=widgets.Dropdown(options=[None, "prefix", "dual"], value="dual"),
                      block=widgets.Dropdown(options=[4, 8, 16, 32], value=BLOCK)).widget

# %% jupyter={"source_hidden": true} tags=["ci-only", "remove-input"]
# CI's self-test of the widget above (collapsed in the lab): move a control as a person would,
# check that the output changed, then put the control back to its teaching default
default = ui.children[0].value
before = shown
ui.children[0].value = "prefix"                      # pick another cache variant
assert shown != before, "changing the cache must change the output"
ui.children[0].value = default

# %% [markdown]
# ## Summary
# - Bidirectional attention means no exact KV cache; Fast-dLLM's block cache is stale only
#   within a block and exact when refreshed every step.
# - Prefix cache: feed the block and everything after it (`G − j·b` tokens in block `j`); dual cache:
#   feed only the block (`b`), its neighbours' K/V from the block-start pass.
# - Windows cut the far-field masks from the input; every variant trades a little agreement with
#   the uncached sampler for fewer token-forwards. Time it on real hardware, not here.
