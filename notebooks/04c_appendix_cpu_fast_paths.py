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
# # 04c · Appendix: CPU fast paths
#
# The speedup formula of chapter 04a, `tau / (1 + gamma·c)`, makes two promises about the
# hardware: the target scores `gamma + 1` tokens in the time of one, and a draft step costs what
# its arithmetic costs. A GPU at batch 1 keeps both. A laptop CPU can break both, and then
# speculative decoding loses on a CPU what it wins on paper. This appendix builds the two fixes
# the model zoo uses on a CPU, `refimpl/models/cpu_linear.py` and `refimpl/models/lean_llama.py`,
# and checks that each gives the plain path's outputs. Skip it if you only run on a GPU.
#
# **After this appendix you can**
#
# 1. say what `v` (the cost of scoring `gamma + 1` tokens over the cost of one) does to the
#    speedup, and compute the largest `v` at which a draft still pays;
# 2. pack a linear layer's weight once for oneDNN and show that it computes what `F.linear` does,
#    row for row;
# 3. say where a small draft's step time goes, and write the preallocated KV cache that removes
#    one of the overheads;
# 4. measure how far a target's step is from the memory floor (bytes / bandwidth), say which
#    stages keep it there, and fuse products that share an input without changing a bit.
#
# **Parameters.** The prepacking part always runs on the CPU (that is what it is for); the lean
# forward runs on `DEVICE`. Set `TARGET = "smollm2-135m"` to see the effects on a real model.

# %%
import torch
from refimpl.models import default_device

FAST = True                      # CI default: few timing repeats
TARGET, DRAFT = "tiny", "tiny-draft"
DEVICE = default_device()        # a torch.device: CUDA when present, $REFIMPL_DEVICE overrides
REPEATS = 9 if FAST else 25      # timing repeats (medians: a shared machine is noisy)
NEW_TOKENS = 24 if FAST else 96
SHOW_SOLUTIONS = False

# %% [markdown]
# ## Imports and models
# Everything here is about *speed* with the *same outputs*, so every cell compares against the
# plain Hugging Face path. `agree` is the draft's greedy agreement with the target, our `alpha`
# estimate (chapter 04a). `on_cpu` holds CPU copies of both models for the CPU measurements.

# %%
import copy
import matplotlib.pyplot as plt
import torch.nn.functional as F
from refimpl import models, drafts, speculative, autoregressive
from refimpl.models import cpu_linear, lean_llama
from refimpl.prompts import encode_prompt
from solutions import exercise, check, show

torch.set_grad_enabled(False)
target, draft = models.load(TARGET, device=DEVICE), models.load(DRAFT, device=DEVICE)
on_cpu = {lm.name: lm if DEVICE.type == "cpu" else models.load(lm.name, device="cpu") for lm in (target, draft)}
prompts = [encode_prompt(target, t) for t in ("And God said", "The LORD is my shepherd")]
ref = autoregressive.generate(target, prompts, max_new_tokens=NEW_TOKENS)
agree = drafts.greedy_agreement(target, draft, prompts, NEW_TOKENS)
print(f"{TARGET} / {DRAFT}: agreement {agree:.2f}")

# %% [markdown]
# ## The cost the formula leaves out: `v`
# Call the real cost of one target pass over `gamma + 1` tokens, in units of a one-token pass,
# `v`: the speedup is `tau / (v + gamma·c)` (Leviathan et al. assume `v = 1`). By hand, against
# `drafts.expected_speedup(..., v)`:

# %%
def speedup_v(alpha, gamma, c, v):
    return drafts.expected_tau(alpha, gamma) / (v + gamma * c)


for v in (1.0, 1.1, 1.5):
    assert abs(speedup_v(0.8, 4, 0.1, v) - drafts.expected_speedup(0.8, 4, 0.1, v)) < 1e-12
    print(f"alpha 0.8, gamma 4, c 0.1, v {v}: speedup {speedup_v(0.8, 4, 0.1, v):.2f}")

# %% [markdown]
# **Exercise 1.** Write `break_even_v(alpha, gamma, c)`: the largest `v` at which speculative
# decoding is still no slower than plain decoding (speedup = 1). The check finds it by bisection on
# `drafts.expected_speedup`.

# %%
@exercise("04c", "break_even_v")
def break_even_v(alpha, gamma, c):
    # your code here
    raise NotImplementedError

# %% [markdown]
# The check:

# %%
def bisect_v(alpha, gamma, c, lo=0.0, hi=50.0):
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if drafts.expected_speedup(alpha, gamma, c, mid) >= 1 else (lo, mid)
    return lo


def check_break_even():
    for a, g, c in [(0.8, 4, 0.1), (0.5, 2, 0.3), (0.9, 8, 0.05)]:
        want = bisect_v(a, g, c)
        assert abs(break_even_v(a, g, c) - want) < 1e-6, f"alpha={a}, gamma={g}, c={c}: you say {break_even_v(a, g, c):.4f}, bisection {want:.4f}"


check("Exercise 1", check_break_even)
if SHOW_SOLUTIONS:
    show("04c", "break_even_v")

# %% [markdown]
# ## Part 1 · Why `v` can be 1.5 on a CPU
# In fp32 `F.linear` goes through MKL's matrix multiply, which repacks the weight matrix into its
# blocked layout on *every call* once the input has 4 or more rows. Verifying 5 tokens then costs
# much more than verifying 1. `cpu_linear.matmul_cost` times every linear layer of a model at
# 1..6 rows, with MKL and with weights packed once (below). (Timings on a shared machine are
# noisy. On SmolLM2-135M on a 2-core CPU, `v(5)` is ~1.5 with MKL and ~1.1 prepacked: set
# `TARGET = "smollm2-135m"` to measure yours.)

# %%
rows = cpu_linear.matmul_cost(on_cpu[target.name].model, rows=(1, 2, 3, 4, 5, 6), repeats=REPEATS)
fig, ax = plt.subplots(figsize=(5, 3))
ax.plot([r["rows"] for r in rows], [r["mkl_ms"] for r in rows], marker="o", label="MKL F.linear")
ax.plot([r["rows"] for r in rows], [r["prepacked_ms"] for r in rows], marker="o", label="prepacked (oneDNN)")
ax.set_xlabel("rows (tokens scored at once)"); ax.set_ylabel("ms, all matrices"); ax.legend(); plt.show()
v_mkl, v_packed = (rows[4][k] / rows[0][k] for k in ("mkl_ms", "prepacked_ms"))
print(f"v(5) from the matrix products: MKL {v_mkl:.2f}, prepacked {v_packed:.2f}")

# %% [markdown]
# ## Packing a weight once, by hand
# oneDNN can reorder a weight matrix into its blocked layout once (`_reorder_linear_weight`) and
# then multiply with the packed copy (`_linear_pointwise`). These are torch's own (underscored)
# operators; `cpu_linear.PrepackedLinear` wraps them. One layer of the target, on the CPU:

# %%
lin = copy.deepcopy(target.model.model.layers[0].mlp.up_proj).cpu()     # (out, in) weight; oneDNN packing is a CPU path
if cpu_linear.available():
    packed = torch.ops.mkldnn._reorder_linear_weight(lin.weight.contiguous(), batch_size=None)
    x = torch.randn(5, lin.in_features, device="cpu")                    # (rows, in), next to the CPU copy
    y_hand = torch.ops.mkldnn._linear_pointwise(x, packed, lin.bias, "none", [], "")
    assert torch.allclose(y_hand, F.linear(x, lin.weight, lin.bias), atol=1e-5)
    assert torch.equal(y_hand, cpu_linear.PrepackedLinear(lin)(x))
    print("packed by hand == F.linear (to 1e-5) == cpu_linear.PrepackedLinear (bit for bit)")
else:
    print("this torch build has no oneDNN: the prepacked path is not available here")

# %% [markdown]
# A second gain: oneDNN gives every row the same bits whatever the number of rows, so a token
# scored inside a block of 5 gets exactly the logits it gets alone. MKL may differ in the last
# bits, which can flip a near-tie argmax between speculative and plain greedy decoding.

# %%
if cpu_linear.available():
    packed_rows = lambda x_: torch.ops.mkldnn._linear_pointwise(x_, packed, lin.bias, "none", [], "")
    mkl_rows = lambda x_: F.linear(x_, lin.weight, lin.bias)
    assert torch.equal(packed_rows(x[:1]), packed_rows(x)[:1])
    print("prepacked: row 0 alone == row 0 in a block of 5, bit for bit")
    print(f"MKL: max |row 0 alone - row 0 in a block of 5| = {(mkl_rows(x[:1]) - mkl_rows(x)[:1]).abs().max():.1e}")

# %% [markdown]
# ## The whole model
# `cpu_linear.prepack_linears` swaps every `nn.Linear` of a model for a `PrepackedLinear` (the
# parameters stay the same objects). On a CPU copy of the target: the logits and the greedy
# tokens must be those of the plain path. (`models.load` does this by default for targets of
# 50 M parameters or more on a CPU.)

# %%
plain_cpu = on_cpu[target.name]
packed_lm = models.LM(copy.deepcopy(plain_cpu.model), plain_cpu.tokenizer, name=f"{TARGET}-prepacked")
print("linear layers swapped:", cpu_linear.prepack_linears(packed_lm.model))
ids = torch.tensor([prompts[0] + ref.tokens[0]], device=plain_cpu.device)   # the CPU copies
assert torch.allclose(packed_lm.logits(ids), plain_cpu.logits(ids), atol=1e-4)
greedy = lambda lm: autoregressive.generate(lm, prompts, max_new_tokens=NEW_TOKENS).tokens
assert greedy(packed_lm) == greedy(plain_cpu)
print("prepacked target: same logits (to 1e-4), same greedy tokens")

# %% [markdown]
# ## Play: what `v` does to the speedup
# The predicted speedup over `gamma` for our draft's `alpha` and a cost ratio `c`, at the `v`
# you choose; the dashed lines mark the `v(5)` measured above.

# %%
import ipywidgets as widgets


def play(v=1.0, c=0.3):
    global shown
    gs = list(range(1, 11))
    sp = [drafts.expected_speedup(agree, g, c, v) for g in gs]
    fig, ax = plt.subplots(figsize=(5.5, 3))
    ax.plot(gs, sp, "o-", label=f"v = {v:.2f}")
    for vv, name in ((v_mkl, "MKL"), (v_packed, "prepacked")):
        ax.plot(gs, [drafts.expected_speedup(agree, g, c, vv) for g in gs], "--", lw=0.8, label=f"{name}: v = {vv:.2f}")
    ax.axhline(1, color="gray", lw=0.8); ax.set_xlabel("gamma"); ax.set_ylabel("predicted speedup"); ax.legend(fontsize=7)
    plt.show()
    shown = f"best gamma {gs[max(range(10), key=sp.__getitem__)]}, speedup {max(sp):.2f}"
    print(shown)

# %% [markdown]
# Move the sliders (in a live notebook):

# %%
ui = widgets.interact(play, v=widgets.FloatSlider(continuous_update=False, value=1.0, min=0.5, max=3.0, step=0.1),
                      c=widgets.FloatSlider(continuous_update=False, value=0.3, min=0.0, max=1.0, step=0.05)).widget

# %% jupyter={"source_hidden": true} tags=["ci-only", "remove-input"]
# CI's self-test of the widget above (collapsed in the lab): move a control as a person would,
# check that the output changed, then put the control back to its teaching default
default = ui.children[0].value
before = shown
ui.children[0].value = 2.0                         # move the v slider, as a person would
assert shown != before, "moving a slider must change the output"
ui.children[0].value = default

# %% [markdown]
# ## Part 2 · Where a small draft's step goes
# A 1-layer draft does little arithmetic, so most of a Hugging Face forward is per-call
# machinery: mask builders, the rotary module, output objects, and a `DynamicCache` that
# concatenates (so reallocates) every layer's keys and values at every step. Compare one
# cached step on the CPU with the time of its matrix products alone (one row each, MKL):

# %%
step_ms = {name: 1e3 * drafts.step_seconds(lm, repeats=REPEATS) for name, lm in on_cpu.items()}
mm_ms = {name: cpu_linear.matmul_cost(lm.model, rows=(1,), repeats=REPEATS)[0]["mkl_ms"] for name, lm in on_cpu.items()}
fig, ax = plt.subplots(figsize=(5, 2.6))
ax.barh(list(step_ms), list(step_ms.values()), color="0.75", label="whole cached step")
ax.barh(list(mm_ms), list(mm_ms.values()), color="tab:blue", label="its matrix products")
ax.set_xlabel("ms per token"); ax.legend(fontsize=7); plt.tight_layout(); plt.show()
print({k: f"{mm_ms[k] / step_ms[k]:.0%} of the step is matrix products" for k in step_ms})

# %% [markdown]
# ## A lean step, by hand
# The same math as `LlamaForCausalLM`, straight from its parameters: RMSNorm, rotary position
# embedding (Su et al., arXiv 2104.09864; the half-split form Llama uses), grouped-query attention
# and the SwiGLU MLP. First the two small pieces:

# %%
def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x, pos, theta):                           # x (B, H, Q, D), pos (B, Q)
    D = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, D, 2, device=x.device).float() / D)   # (D/2,)
    ang = pos[:, None, :, None].float() * inv                                    # (B, 1, Q, D/2)
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)

# %% [markdown]
# One attention block with a plain cache (a list of `(keys, values)` per layer, grown by
# concatenation, as `DynamicCache` does), `Q` new tokens after `P` cached ones:

# %%
def attend(layer, h, pos, cache, i, cfg):
    a, (B, Q, _) = layer.self_attn, h.shape
    H, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, a.head_dim
    theta = cfg.rope_parameters["rope_theta"]
    q = rope(a.q_proj(h).view(B, Q, H, D).transpose(1, 2), pos, theta)            # (B, H, Q, D)
    k = rope(a.k_proj(h).view(B, Q, Hkv, D).transpose(1, 2), pos, theta)          # (B, Hkv, Q, D)
    v = a.v_proj(h).view(B, Q, Hkv, D).transpose(1, 2)
    if i < len(cache):
        k, v = torch.cat([cache[i][0], k], 2), torch.cat([cache[i][1], v], 2)      # (B, Hkv, P+Q, D)
    cache[i:i + 1] = [(k, v)]
    P = k.shape[2] - Q
    mask = torch.arange(P + Q, device=h.device)[None] <= torch.arange(Q, device=h.device)[:, None] + P   # (Q, P+Q)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=H != Hkv)
    return a.o_proj(o.transpose(1, 2).reshape(B, Q, H * D))

# %% [markdown]
# The whole step: embeddings, each layer (attention, then the MLP, each with its residual),
# the final norm and the head.

# %%
def lean_step(model, ids, cache):
    cfg, inner = model.config, model.model
    P = cache[0][0].shape[2] if cache else 0
    pos = torch.arange(P, P + ids.shape[1], device=ids.device)[None].expand(ids.shape[0], -1)   # (B, Q)
    x = inner.embed_tokens(ids)                                                    # (B, Q, hidden)
    for i, layer in enumerate(inner.layers):
        x = x + attend(layer, rms(x, layer.input_layernorm.weight, cfg.rms_norm_eps), pos, cache, i, cfg)
        h, mlp = rms(x, layer.post_attention_layernorm.weight, cfg.rms_norm_eps), layer.mlp
        x = x + mlp.down_proj(F.silu(mlp.gate_proj(h)) * mlp.up_proj(h))
    return model.lm_head(rms(x, inner.norm.weight, cfg.rms_norm_eps)).float()   # (B, Q, V)

# %% [markdown]
# A prefill and three one-token steps, against the Hugging Face forward with its own cache and
# against the library's `lean_llama.forward` (the same step with a preallocated `KVCache`):

# %%
ids = torch.tensor([prompts[0] + ref.tokens[0][:4]], device=DEVICE)
mine, hf, lib = [], target.new_cache(), lean_llama.KVCache(target.num_layers)
for a, b in [(0, ids.shape[1] - 3), (-3, -2), (-2, -1), (-1, None)]:
    chunk = ids[:, a:b] if a else ids[:, :b]
    mine_logits = lean_step(target.model, chunk, mine)
    hf_logits, hf = target.forward(chunk, hf)
    lib_logits = lean_llama.forward(target.model, chunk, lib)[0].float()
    assert torch.allclose(mine_logits, hf_logits, atol=1e-4) and torch.allclose(mine_logits, lib_logits, atol=1e-4)
print("lean step by hand == Hugging Face forward == lean_llama.forward, prefill and 3 cached steps")

# %% [markdown]
# **Exercise 2.** `torch.cat` allocates a new tensor at every step and copies the whole cache into
# it. Write `write_kv(buf, length, new)`: store `new` (B, H, Q, D) after the first `length`
# positions of the buffer `buf` (B, H, capacity, D) along dim 2, allocating a new buffer of twice
# the needed size (at least 64) only when it does not fit (and copying the `length` old positions
# over). Return `(buf, view)` with `view` = positions `0 .. length + Q` of the buffer; `buf` may be
# `None` at first. The check compares with `lean_llama.KVCache` and counts allocations.

# %%
@exercise("04c", "write_kv")
def write_kv(buf, length, new):
    # your code here
    raise NotImplementedError

# %% [markdown]
# The check: 100 steps of 1-3 new positions each.

# %%
def check_write_kv():
    gen, buf, length, lib, ptrs = torch.Generator(device=DEVICE).manual_seed(0), None, 0, lean_llama.KVCache(1), set()
    for step in range(100):
        new = torch.randn(1, 2, 1 + step % 3, 8, generator=gen, device=DEVICE)   # where the draft's cache lives
        buf, view = write_kv(buf, length, new)
        want, _ = lib.write(0, new, new)
        lib.length = length = length + new.shape[2]
        assert view.shape == want.shape and torch.equal(view, want), f"step {step}: the view differs from KVCache's"
        ptrs.add(buf.data_ptr())
    assert len(ptrs) <= 4, f"{len(ptrs)} buffers allocated for 200 positions: grow by doubling, not every step"


check("Exercise 2", check_write_kv)
if SHOW_SOLUTIONS:
    show("04c", "write_kv")

# %% [markdown]
# ## The preallocated cache in a real decode
# `lean_llama.LeanTrimmedLM` is a VocabTrim draft (chapter 04a) whose cached steps run through
# `lean_llama.forward` with a `KVCache`. We keep all tokens (a "trim" to the full vocabulary) and
# decode speculatively with both forms of the same draft: same tokens, same accepted lengths;
# only the time per draft step moves.

# %%
trim = drafts.trim_vocab(draft, torch.arange(draft.vocab_size, device=draft.device))
lean = lean_llama.LeanTrimmedLM.of(trim)
g_hf = speculative.generate(target, prompts, draft=trim, gamma=4, max_new_tokens=NEW_TOKENS)
g_lean = speculative.generate(target, prompts, draft=lean, gamma=4, max_new_tokens=NEW_TOKENS)
assert g_lean.tokens == g_hf.tokens == ref.tokens and g_lean.stats.accepted == g_hf.stats.accepted
t_hf, t_lean, t_target = (1e3 * drafts.step_seconds(d, repeats=REPEATS) for d in (trim, lean, target))
print(f"draft step on {DEVICE}: Hugging Face {t_hf:.2f} ms, lean {t_lean:.2f} ms "
      f"(c {t_hf / t_target:.2f} -> {t_lean / t_target:.2f})")

# %% [markdown]
# What the buffer does during one draft's decode: its length grows a token at a time, its
# capacity doubles now and then, and a roll-back (after a rejected draft) only moves the length
# back. A concatenating cache would allocate at every step.

# %%
cache, lengths, caps, steps = lean.new_cache(), [], [], 200
_, cache = lean.forward(torch.tensor([prompts[0]], device=DEVICE), cache)
for step in range(steps):
    _, cache = lean.forward(torch.tensor([[ref.tokens[0][step % NEW_TOKENS]]], device=DEVICE), cache)
    if step % 10 == 9:
        cache.crop(-2)                              # as after a rejection: drop the last 2 positions
    lengths.append(cache.get_seq_length()); caps.append(cache.keys[0].shape[2])
fig, ax = plt.subplots(figsize=(6, 2.8))
ax.step(range(steps), caps, where="post", label="buffer capacity"); ax.plot(lengths, label="cached length")
ax.set_xlabel("draft step"); ax.set_ylabel("positions"); ax.legend(); plt.show()
print(f"buffers allocated in {steps} steps: {len(set(caps))} (a concatenating cache: {steps})")

# %% [markdown]
# ## Part 3 · The target's step against the memory roofline
# Chapter 00 drew the roofline: at batch 1 a decode step must read every weight once, so it cannot
# take less than **weight bytes / read bandwidth** (the *floor*). How close does the target come,
# and where does the rest of its step go? `refimpl.bench.roofline` measures the three numbers on
# your machine: the read bandwidth (a sum over a buffer too big for any cache), the bytes a step
# reads (every matrix, the head included), and a step's time per stage.
#
# `models.load` gives a prepacked target a `LeanLM`: its cached steps run through
# `lean_llama.forward` with the products *fused* and, on an AVX2 CPU, computed by a kernel written
# for decoding (below). (`fast=False` gives the plain Hugging Face forward back.) With `TARGET = "tiny"` the weights
# fit in the CPU's cache, so the floor means little; the committed SmolLM2 run below is the real
# picture.

# %%
from refimpl.bench import roofline

fast_target = models.load(TARGET, device="cpu", prepack=True)        # CPU: what the roofline is about
plain_target = models.load(TARGET, device="cpu", prepack=True, fast=False)
nbytes = roofline.weight_bytes(fast_target.model)
bandwidth = roofline.read_bandwidth(64 << 20 if FAST else 512 << 20, repeats=3 if FAST else 7)
print(f"{type(fast_target).__name__} vs {type(plain_target).__name__}; {TARGET}: {nbytes / 1e6:.1f} MB of weights, "
      f"this machine reads {bandwidth / 1e9:.1f} GB/s -> floor {1e3 * nbytes / bandwidth:.2f} ms a step")

# %% [markdown]
# ### Fusing the products that read the same input
# q, k and v all multiply the same normed hidden state; so do the MLP's gate and up. Stack their
# weight rows into one matrix and one product computes them all: one oneDNN call, one thread
# fork/join and one stream through memory instead of three (or two). Each output element is still
# the same dot product, so not a bit moves. The residual additions after `o_proj` and `down_proj`
# go *inside* the product too (oneDNN's binary `add`): four calls per layer instead of nine.

# %%
att = fast_target.model.model.layers[0].self_attn
w_qkv = cpu_linear.pack_weight(torch.cat([att.q_proj.weight, att.k_proj.weight, att.v_proj.weight]))
h = torch.randn(5, fast_target.config.hidden_size, device="cpu")
fused = cpu_linear.packed_linear(h, w_qkv)                           # (5, (H + 2 Hkv) D)
apart = torch.cat([att.q_proj(h), att.k_proj(h), att.v_proj(h)], -1) # three prepacked products
assert torch.equal(fused, apart)
print("fused q/k/v == three products, bit for bit")

# %% [markdown]
# ### A product written for decoding
# oneDNN is tuned for larger batches than a decoder's 1-16 rows. `refimpl/models/cpu_gemv.cpp`
# (~150 lines of AVX2 for the products, compiled on first use) does only this job. It packs each
# weight matrix once into *panels*: 8 output rows stored k-major, so that one k step of a panel is
# one 8-lane vector `W[n:n+8, k]`. Multiplied by a broadcast `x[r, k]` it updates the 8 outputs'
# accumulator for row r: no horizontal sums at the end, and a panel read once serves every row of x
# (the register-blocked kernel of GotoBLAS and BLIS). Each thread cuts its share of the panels into
# far-apart slabs and reads a panel from each at once -- 4 sequential streams for 1-2 rows, 2 for more
# -- because the hardware prefetcher follows a few long streams better than many short ones, and
# enough independent accumulator chains hide the 4-cycle FMA latency. On a CPU with AVX-512 it is
# built with `-mavx512f` too (`cpu_gemv.build_flags()`): 3 rows and more then put two panels in one
# 16-lane vector, half the multiply-add instructions and up to 16 rows a tile; a long prompt's prefill
# gets ~22% faster, one token's step does not (it waits on memory, not on arithmetic).
# Every output is the same sequence of float operations (one FMA chain over k)
# whatever the number of rows, so a token scored in a block of 5 gets the bits it gets alone --
# the property greedy verification needs. It is not oneDNN's or MKL's order of summing, so the
# logits move by ~1e-6 relative; the greedy text does not (checked here and on every benchmark prompt).
# Measured on SmolLM2's 121 matrices and the LM head in a row (2 threads, cold caches): 1 row 18-21 ms,
# 5 rows 20-22 (oneDNN: 47 and 59; our earlier row-major kernel 19-22 and 25-27). `REFIMPL_GEMV=0`
# switches it off.

# %%
from refimpl.models import cpu_gemv

ids = torch.tensor([prompts[0] + ref.tokens[0]], device="cpu")
if cpu_gemv.available():
    w = cpu_gemv.pack(torch.cat([att.q_proj.weight, att.k_proj.weight, att.v_proj.weight]))  # (N, hidden), packed once
    alone = torch.cat([cpu_gemv.linear(h[i:i + 1], w) for i in range(5)])
    assert torch.equal(cpu_gemv.linear(h, w), alone)                 # a block of 5 == its rows alone
    dense = torch.cat([att.q_proj.weight, att.k_proj.weight, att.v_proj.weight]).detach()
    print("max |cpu_gemv - F.linear|:", (alone - torch.nn.functional.linear(h, dense)).abs().max().item())
diff = (fast_target.logits(ids) - plain_target.logits(ids)).abs().max().item()
same = autoregressive.generate(fast_target, prompts[:2], max_new_tokens=32).tokens == \
    autoregressive.generate(plain_target, prompts[:2], max_new_tokens=32).tokens
assert diff < 1e-4 and same
print(f"LeanLM vs Hugging Face's forward: logits within {diff:.1e}, greedy text identical: {same}")

# %% [markdown]
# Where one step goes, stage by stage (`lean_llama.forward(..., probe=...)` times each stage;
# `python` is the wall time no stage accounts for). The GB/s of a matrix stage is its bytes over
# its time: compare with the bandwidth above.

# %%
br = [roofline.breakdown(fast_target, k=k, repeats=REPEATS) for k in (1, 5)]
fig, ax = plt.subplots(figsize=(7, 2.4))
roofline.stages_bar(ax, br)                                          # one stacked bar per k
plt.tight_layout(); plt.show()
print({s: f"{g:.1f} GB/s" for s, g in br[0]["read_gbs"].items()})

# %% [markdown]
# **Exercise 3.** What would a step cost if every matrix product read its weights at the full
# measured bandwidth and every other stage kept its time? Write
# `predicted_step_ms(stages_ms, matrix_mb, bandwidth_gbs)`: `stages_ms` is a breakdown's
# `{stage: ms}` (matrix stages and the rest, `python` included), `matrix_mb` the megabytes each
# matrix stage reads (`roofline.matrix_bytes` / 1e6), `bandwidth_gbs` the read bandwidth. The check
# uses two made-up machines and then the breakdown above.

# %%
@exercise("04c", "predicted_step_ms")
def predicted_step_ms(stages_ms, matrix_mb, bandwidth_gbs):
    # your code here
    raise NotImplementedError

# %% [markdown]
# The check:

# %%
def check_predicted_step():
    got = predicted_step_ms({"qkv": 5.0, "down": 5.0, "norm": 2.0, "python": 1.0}, {"qkv": 50.0, "down": 50.0}, 20.0)
    assert abs(got - 8.0) < 1e-9, f"100 MB at 20 GB/s is 5 ms, plus 3 ms of the rest: 8 ms, you say {got}"
    got = predicted_step_ms({"lm_head": 4.0, "attention": 0.5}, {"lm_head": 40.0}, 10.0)
    assert abs(got - 4.5) < 1e-9, f"40 MB at 10 GB/s is 4 ms, plus 0.5 ms: 4.5 ms, you say {got}"
    mb = {s: v / 1e6 for s, v in roofline.matrix_bytes(fast_target.model).items()}
    p = predicted_step_ms(br[0]["stages"], mb, bandwidth / 1e9)
    assert 0 < p <= sum(br[0]["stages"].values()) * 1.5
    print(f"{TARGET}: measured {br[0]['wall_ms']:.2f} ms, with every matrix at {bandwidth / 1e9:.1f} GB/s {p:.2f} ms")


check("Exercise 3", check_predicted_step)
if SHOW_SOLUTIONS:
    show("04c", "predicted_step_ms")

# %% [markdown]
# ### The whole layer in one call
# The breakdown has a second cost besides reading: ~15 tensor operations per layer that read no
# weights (norms, rotary, the cache write, attention, SwiGLU), each a dispatch of a few
# microseconds, and a fork and join of the threads around every product. `cpu_gemv.LayerStep`
# runs whole decoder layers -- all of a step's layers in one kernel call: the threads enter one
# OpenMP region, meet at a barrier between stages and between layers, and the stages that read no
# weights are plain loops over the step's rows. Each keeps the
# batch-invariance of the products (a query's scores, softmax and weighted sum in one fixed
# order), so a block of 5 tokens still gets, bit for bit, the logits of 5 one-token steps. It is
# `lean_llama.forward`'s default where `cpu_gemv` builds; a `probe` gets the stage-by-stage path.

# %%
import statistics, time


def step_ms(probe, k=1):
    """Median ms of a k-token step after the rest of ``ids``, through the default or a probed forward."""
    cache = fast_target.new_cache()
    lean_llama.forward(fast_target.model, ids[:, :-k], cache)
    times = []
    for _ in range(max(REPEATS, 5)):
        t0 = time.perf_counter()
        lean_llama.forward(fast_target.model, ids[:, -k:], cache, probe=probe)
        times.append(1e3 * (time.perf_counter() - t0))
        cache.crop(-k)
    return statistics.median(times)


if cpu_gemv.available():
    n, c1, c2 = ids.shape[1], fast_target.new_cache(), fast_target.new_cache()
    fast_target.forward(ids[:, :n - 5], c1)
    fast_target.forward(ids[:, :n - 5], c2)
    block = fast_target.forward(ids[:, n - 5:], c1)[0]                  # one step of 5 tokens
    steps = torch.cat([fast_target.forward(ids[:, i:i + 1], c2)[0] for i in range(n - 5, n)], 1)
    assert torch.equal(block, steps)
    staged = lambda name: lean_llama.NO_PROBE                         # a probe that times nothing
    print(f"a block of 5 == 5 one-token steps, bit for bit; one-token step: whole layers "
          f"{step_ms(None):.2f} ms, stage by stage {step_ms(staged):.2f} ms")

# %% [markdown]
# ### SmolLM2-135M on the machine that built this course
# `python -m refimpl.bench --suite latency --model smollm2-135m --threads 2` measures the floor,
# latency(k) and the same weights through Hugging Face's forward, interleaved in one loop, and
# commits them to `bench_results/`. Left: each k against the floor (red). Right: where a step goes.

# %%
import json, os

saved = json.load(open(os.path.join(models.MODELS_DIR, "..", "bench_results", "latency_smollm2-135m.json")))
roofline.figure(saved, saved["rows"]); plt.show()
one = saved["rows"][0]
rest = sum(v for s, v in saved["breakdown"][0]["stages"].items() if s not in roofline.MATRIX_STAGES)
print(f"one-token step {one['ms']:.1f} ms = {one['x_floor']:.2f}x the floor {saved['floor_ms']:.1f} ms; "
      f"stages that read no weights: {rest:.1f} ms; Hugging Face's forward {saved['hf_step_ms']['1']:.1f} ms")

# %% [markdown]
# What the picture says. The bars time the step stage by stage: the matrix products read at
# 13-23 GB/s where a plain sum reads at ~19-28 (the machine drifts), and the tensor operations
# between them (norms, rotary, attention: ~15 per layer, each a few microseconds of dispatch) add
# ~10 ms that read no weights. The black tick is the default step, all layers in one kernel call: those
# ~10 ms and a thread fork/join per product are gone, and it lands near 1.1x the floor. The price
# shows in the k > 1 rows: at 5 tokens the step does 5x the multiply-adds, and they must run while
# the weights stream, or the step grows. A loop of FMAs on registers runs at ~195 GFLOP/s on these two
# cores; our first tiles, reading the weights row-major with a horizontal sum per output, reached
# 60-90 in cache and a 5-token verification cost ~1.3x a one-token step. The panels above reach ~85
# for 17 rows of `tiny`'s products (2 threads, weights in cache, against ~48), and with 2 streams a
# thread at 4-6 rows a 5-token verification costs ~1.1x a one-token step.
# Reading fewer bytes would move the floor itself: SmolLM2's weights came to us as a
# 4.5-bit GGUF, so an int4 kernel could read 7x less -- but torch's CPU int4 product
# (`_weight_int4pack_mm_for_cpu`) with fp32 activations ran 8x *slower* here than the fp32 one.

# %% [markdown]
# ## Summary
# - On a CPU in fp32, scoring 5 tokens can cost ~1.5x one (`v`), which eats most of the gain of
#   speculative decoding; packing each weight once for oneDNN brings it to ~1.1x and makes every
#   row's output independent of the block size (`cpu_linear`, used by `models.load` for targets).
# - A small draft's step is mostly per-call overhead; a lean forward with a preallocated cache runs
#   the same math with the same logits in less time (`lean_llama`, used by the zoo's SmolLM2 draft).
# - A target's step is paced by reading its weights: fusing the products that share an input (q/k/v,
#   gate/up) and folding the residual adds into them cuts the calls per layer from 9 to 4 without
#   moving a bit, products written for 1-16 rows (`cpu_gemv`, batch-invariant) read the
#   weights faster than oneDNN, and a whole layer in one kernel call drops the ~15 small operations
#   per layer between them (`lean_llama.LeanLM`, `models.load`'s default
#   for prepacked targets). The floor is bytes / bandwidth; `--suite latency` shows how far a step
#   is from it and which stage is why.
# - None of this changes a single output token: they only move `v` and `c` in `tau / (v + gamma·c)`.
