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
# # 11 · dLLM decoding: LLaDA low-confidence remasking
#
# Chapter 10 trained a denoiser that predicts every masked position at once. Decoding
# (LLaDA, arXiv 2502.09992, Algorithm 5 and Appendix B.2) turns it into a generator:
#
# 1. the answer region of `gen_length` positions starts fully masked after the prompt;
# 2. it is split into blocks of `block_length`, decoded left to right (semi-autoregressive);
# 3. each block gets `steps · block_length / gen_length` steps; the number of tokens committed
#    per step follows a **linear schedule** (remainder to the earliest steps);
# 4. at each step the most **confident** masked positions of the block are committed, where
#    confidence = softmax probability of the predicted token ("low-confidence remasking":
#    the unconfident ones stay masked).
#
# We build it by hand, check it equals `refimpl.diffusion.generate`, watch the unmasking order,
# and measure quality against the number of steps.

# %% [markdown]
# ## Parameters

# %%
import torch

FAST = True
MODEL = "tiny-dllm"              # King James dLLM
SYNTH = "tiny-dllm-rev"          # digit reversal (exact answers)
AR_MODEL = "tiny"                # judges text quality (perplexity)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GEN = 32                         # answer length for the King James model
SHOW_SOLUTIONS = False

# %% [markdown]
# ## Imports and models

# %%
import matplotlib.pyplot as plt
from refimpl import diffusion, diffusion_lm, digit_reversal, models
from refimpl.bench import dllm as diffusion_bench

dlm = models.load(MODEL, device=DEVICE)
tok, MASK = dlm.tokenizer, dlm.mask_token_id
prompt = tok.encode("And God said unto Noah,")
print(len(prompt), "prompt tokens; MASK id", MASK)

# %% [markdown]
# ## The start state and one denoiser call
# Prompt + `GEN` masks. One forward pass gives logits for every position; for each masked one
# we keep the argmax `x0` and its probability (the confidence).

# %%
x = torch.tensor([prompt + [MASK] * GEN], device=DEVICE)
logits = dlm.logits(x)[0, len(prompt):]                 # (GEN, V)
logits[:, MASK] = float("-inf")                          # a denoiser never predicts MASK
conf, x0 = torch.softmax(logits.double(), -1).max(-1)    # (GEN,), (GEN,)
for i in range(6):
    print(f"position {i}: {tok.decode([int(x0[i])])!r:12} confidence {conf[i]:.3f}")

# %% [markdown]
# ## The linear schedule
# A block with `m` masked positions and `s` steps commits `m // s` tokens per step, plus one for
# the first `m % s` steps (LLaDA's `get_num_transfer_tokens`).

# %%
def schedule_by_hand(m, s):
    return [m // s + (1 if i < m % s else 0) for i in range(s)]

for m, s in [(8, 8), (10, 4), (32, 6), (3, 5)]:
    assert schedule_by_hand(m, s) == diffusion.num_transfer_tokens(torch.tensor([m]), s)[0].tolist()
    print(m, "tokens in", s, "steps:", schedule_by_hand(m, s))

# %% [markdown]
# ## The sampler, by hand (greedy, one row)
# Blocks left to right; in each step: predict, score, commit the top-`k` masked positions of the
# current block. We also record the state after each step, for the animation below.

# %%
def llada_by_hand(model, prompt, gen_length, steps, block_length):
    P, mask = len(prompt), model.mask_token_id
    x = torch.tensor([prompt + [mask] * gen_length], device=DEVICE)
    history = [x[0, P:].clone()]
    for s in range(P, P + gen_length, block_length):
        for k in schedule_by_hand(block_length, steps * block_length // gen_length):
            if k == 0:
                continue
            lg = model.logits(x)[0, s: s + block_length]; lg[:, mask] = float("-inf")
            c, pred = torch.softmax(lg.double(), -1).max(-1)
            c[x[0, s: s + block_length] != mask] = -float("inf")
            idx = c.topk(k).indices
            x[0, s + idx] = pred[idx]
            history.append(x[0, P:].clone())
    return x[0, P:].tolist(), history

# %% [markdown]
# It must agree with `refimpl.diffusion.generate` token for token (`eos_token_id=[]` so neither
# stops at EOS).

# %%
for steps, bl in [(GEN, GEN), (GEN, 8), (GEN // 2, 8), (GEN // 4, 16)]:
    mine, _ = llada_by_hand(dlm, prompt, GEN, steps, bl)
    lib = diffusion.generate(dlm, [prompt], gen_length=GEN, steps=steps, block_length=bl, eos_token_id=[])
    assert mine == lib.tokens[0], (steps, bl)
    print(f"steps={steps:2d} block={bl:2d}: identical, NFE {lib.stats.nfe}")

# %% [markdown]
# ## Watching the unmasking order
# One token per step, one block: the model picks where to write next. Drag the slider (in
# JupyterLab) to see the partially unmasked text at each step; `▢` is a mask.

# %%
_, history = llada_by_hand(dlm, prompt, GEN, GEN, GEN)

def show(step=0):
    ids = history[step].tolist()
    print(f"step {step:2d}:", "".join("▢" if t == MASK else tok.decode([t]) for t in ids))

try:
    import ipywidgets as w
    w.interact(show, step=w.IntSlider(min=0, max=len(history) - 1, value=len(history) // 2))
except ImportError:
    show(len(history) // 2)

# %% [markdown]
# The same information as a picture: for each answer position, the step at which it was
# committed. With one block the order jumps around (easy tokens first); with blocks of 8 it is
# forced left to right block by block.

# %%
def commit_steps(history):
    first = torch.zeros(GEN)
    for step, (a, b) in enumerate(zip(history, history[1:]), start=1):
        first[(a == MASK) & (b != MASK)] = step
    return first

_, h8 = llada_by_hand(dlm, prompt, GEN, GEN, 8)
plt.figure(figsize=(7, 2.5))
plt.plot(commit_steps(history), "o-", label="one block")
plt.plot(commit_steps(h8), "s-", label="blocks of 8")
plt.xlabel("answer position"); plt.ylabel("step committed"); plt.legend(); plt.show()

# %% [markdown]
# ## Steps vs quality (King James)
# Fewer steps = more tokens committed per step from the *same* forward pass. We judge the text
# by its perplexity under the autoregressive `tiny` model (lower = more natural), over a few
# held-out prompts.

# %%
ar = models.load(AR_MODEL, device=DEVICE)
prompts = diffusion_bench.kjv_prompts(tok, 3 if FAST else 12, length=32)
steps_grid = [GEN, GEN // 2, GEN // 4, GEN // 8]
ppl = []
for steps in steps_grid:
    g = diffusion.generate(dlm, prompts, gen_length=GEN, steps=steps, block_length=8, eos_token_id=[])
    ppl.append(diffusion_bench.ar_perplexity(ar, prompts, g.tokens))
print(dict(zip(steps_grid, [round(p, 1) for p in ppl])))

# %% [markdown]
# Plot it: quality degrades as steps shrink (several tokens are taken from independent
# per-position guesses, chapter 12 says why).

# %%
plt.figure(figsize=(4, 3)); plt.plot([GEN / s for s in steps_grid], ppl, "o-")
plt.xlabel("tokens per step"); plt.ylabel("perplexity under tiny (AR)"); plt.xscale("log", base=2)
plt.title("LLaDA: quality vs steps"); plt.show()

# %% [markdown]
# ## Steps vs accuracy (digit reversal)
# The synthetic model is so sure of its answers that even committing everything at once works.

# %%
rev = models.load(SYNTH, device=DEVICE)
problems = digit_reversal.synthetic_split()[: 100 if FAST else 500]
for steps in (8, 4, 2, 1):
    acc = digit_reversal.synthetic_accuracy(rev, problems, steps=steps, use_kernel=False)
    print(f"steps={steps}: {8 // steps} tokens/step, accuracy {acc:.1%}")

# %% [markdown]
# ## Remasking policies
# `remasking="random"` commits random masked positions instead of the most confident ones
# (seeded). It ignores what the model knows, so at the same number of steps it is worse.

# %%
for policy in ("low_confidence", "random"):
    g = diffusion.generate(dlm, prompts, gen_length=GEN, steps=GEN // 2, block_length=8, eos_token_id=[],
                           remasking=policy, generator=torch.Generator(device=DEVICE).manual_seed(0))
    print(f"{policy:15s} perplexity {diffusion_bench.ar_perplexity(ar, prompts, g.tokens):8.1f}")

# %% [markdown]
# ## Temperature > 0: Gumbel-max in float64
# LLaDA samples `x0` by adding Gumbel noise to `logits / T` in float64 and taking the argmax,
# which is an exact sample of `softmax(logits / T)`. The confidence stays the *un-noised*
# probability of the sampled token. By hand, with the same generator:

# %%
lg = torch.randn(4, 50, dtype=torch.float64)
u = torch.rand(lg.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
mine = (lg / 0.8 - torch.log(-torch.log(u))).argmax(-1)
lib = diffusion.gumbel_argmax(lg, 0.8, torch.Generator().manual_seed(7))
assert torch.equal(mine, lib)
g1 = diffusion.generate(dlm, [prompt], gen_length=16, steps=16, block_length=8, temperature=0.8,
                        generator=torch.Generator(device=DEVICE).manual_seed(1), eos_token_id=[])
print("And God said unto Noah," + tok.decode(g1.tokens[0]))

# %% [markdown]
# Seeded sampling is reproducible: the same generator seed gives the same text.

# %%
g2 = diffusion.generate(dlm, [prompt], gen_length=16, steps=16, block_length=8, temperature=0.8,
                        generator=torch.Generator(device=DEVICE).manual_seed(1), eos_token_id=[])
assert g1.tokens == g2.tokens
print("reproducible")

# %% [markdown]
# ## Exercises
# **1. Count the forward passes.** Write `llada_nfe(gen_length, steps, block_length)`: the number
# of denoiser calls `generate` makes on a fully masked answer (steps whose schedule commits 0
# tokens are skipped).

# %%
def llada_nfe(gen_length, steps, block_length):         # your answer here
    per_block = steps * block_length // gen_length
    return (gen_length // block_length) * min(per_block, block_length)

def check_nfe(fn):
    for G, s, b in [(16, 16, 16), (16, 8, 4), (16, 32, 8), (12, 6, 4), (8, 2, 8)]:
        g = diffusion.generate(rev, [[3, 4]], gen_length=G, steps=s, block_length=b, eos_token_id=[])
        assert fn(G, s, b) == g.stats.nfe, (G, s, b)
    return "correct"

print(check_nfe(llada_nfe))

# %% [markdown]
# **2. Margin confidence.** A popular alternative score is the *margin* `p_top1 − p_top2`
# (how much the best guess beats the runner-up). Write `margin(logits)` for logits (N, V).

# %%
def margin(logits):                                       # your answer here
    top = torch.softmax(logits.double(), -1).topk(2, -1).values
    return top[..., 0] - top[..., 1]

def check_margin(fn):
    lg = torch.randn(3, 5, 40)
    assert torch.allclose(fn(lg), diffusion.top2_gap(lg)), "p_top1 - p_top2 of the softmax"
    return "correct"

print(check_margin(margin))

# %% [markdown]
# ## Summary
# - LLaDA decoding = start fully masked, commit the most confident masked positions of the
#   current block per a linear schedule; blocks go left to right.
# - NFE = steps; fewer steps means several tokens per forward pass and lower quality.
# - Random remasking is worse than low-confidence; temperature uses float64 Gumbel-max.
