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
# # 10 · A masked diffusion LM from scratch
#
# Every chapter so far decoded left to right. A **masked diffusion language model** (dLLM)
# such as LLaDA ("Large Language Diffusion Models", Nie et al., arXiv 2502.09992) instead
# starts from a sequence of `MASK` tokens and *unmasks* them, many positions per step, in any
# order. This chapter builds the model side:
#
# 1. the forward (masking) process `q(x_t | x_0)`;
# 2. the bidirectional denoiser (a transformer without a causal mask);
# 3. the training loss (LLaDA Eq. 3): cross-entropy on masked tokens weighted by `1/t`;
# 4. a few seconds of live training, then the committed `tiny-dllm` weights and samples.
#
# Chapters 11–13 build the samplers (`refimpl.diffusion`).

# %% [markdown]
# ## Parameters

# %%
import torch

FAST = True                      # CI default: seconds of training, small evaluations
MODEL = "tiny-dllm"              # King James masked diffusion LM (python -m refimpl.train tiny-dllm)
SYNTH = "tiny-dllm-rev"          # digit reversal, exact answers
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TRAIN_STEPS = 15 if FAST else 300
SHOW_SOLUTIONS = False

# %% [markdown]
# ## Imports
# `refimpl.diffusion_lm` holds the model, the masking process, the loss and the trainers.

# %%
import math
import time
import matplotlib.pyplot as plt
from refimpl import diffusion_lm, diffusion, digit_reversal, models, data

tok = models.load("tiny", device="cpu").tokenizer   # the AR model's tokenizer, with a MASK token
MASK, EOS = tok.mask_token_id, tok.eos_token_id
print("vocab", len(tok), "| MASK id", MASK, repr(tok.mask_token), "| EOS id", EOS)

# %% [markdown]
# ## The forward process, by hand
# Pick a mask ratio `t ∈ (0, 1)`. Each token independently becomes `MASK` with probability `t`.
# At `t = 0` the text is clean; at `t = 1` everything is masked (the sampler's start state).

# %%
def forward_mask_by_hand(x0, t, mask_id, gen):
    u = torch.rand(x0.shape, generator=gen)           # (B, T) one uniform per token
    masked = u < t[:, None]                           # (B, T)
    return torch.where(masked, torch.full_like(x0, mask_id), x0), masked

verse = "In the beginning God created the heaven and the earth."
x0 = torch.tensor([tok.encode(verse)])
for t in (0.25, 0.5, 0.9):
    xt, _ = forward_mask_by_hand(x0, torch.tensor([t]), MASK, torch.Generator().manual_seed(0))
    print(f"t={t:.2f}:", tok.decode(xt[0]).replace("<|mask|>", "▢"))

# %% [markdown]
# The library version draws the same uniforms, so with the same seed it masks the same tokens.

# %%
g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
t = torch.tensor([0.6])
mine = forward_mask_by_hand(x0, t, MASK, g1)
lib = diffusion_lm.forward_mask(x0, t, MASK, generator=g2)
assert torch.equal(mine[0], lib[0]) and torch.equal(mine[1], lib[1])
print("hand-built forward process == refimpl.diffusion_lm.forward_mask")

# %% [markdown]
# The fraction of masked tokens concentrates around `t` (a plot over a long stream).

# %%
stream = torch.randint(3, len(tok), (1, 4000))
ts = torch.linspace(0.05, 0.95, 19)
frac = [diffusion_lm.forward_mask(stream, t[None], MASK)[1].float().mean().item() for t in ts]
plt.figure(figsize=(4, 3)); plt.plot(ts, frac, "o-"); plt.plot([0, 1], [0, 1], "k:")
plt.xlabel("t"); plt.ylabel("masked fraction"); plt.title("forward process"); plt.show()

# %% [markdown]
# ## The denoiser: a transformer without a causal mask
# `DiffusionLM` is a small Llama-style stack (RMSNorm, RoPE, SwiGLU, tied embeddings). The
# only real change from an AR model: attention is **bidirectional**, so position 0 can look
# at position 9. We build a small random one and check that.

# %%
cfg = diffusion_lm.DLMConfig(vocab_size=len(tok), hidden_size=64, num_layers=2, num_heads=2,
                             intermediate_size=128, max_length=256, mask_token_id=MASK)
torch.manual_seed(0)
net = diffusion_lm.DiffusionLM(cfg, tok).to(DEVICE)
x = torch.tensor([tok.encode("And God said, Let there be light")], device=DEVICE)
y = x.clone(); y[0, -1] = MASK                                   # change the LAST token
changed = (net.logits(x)[0, 0] - net.logits(y)[0, 0]).abs().max().item()
print(f"first position's logits moved by {changed:.4f} when the last token changed")
assert changed > 0

# %% [markdown]
# ## The loss, by hand
# LLaDA Eq. (3): with `t ~ U(0, 1)` per sequence,
# `L = E[ (1/t) · Σ_i 1[x_t^i = MASK] · (−log p(x_0^i | x_t)) ] / T`.
# The `1/t` weight makes `L` an upper bound on the negative log-likelihood per token.

# %%
def loss_by_hand(model, x0, t, gen):
    xt, masked = forward_mask_by_hand(x0, t, model.mask_token_id, gen)
    ce = torch.nn.functional.cross_entropy(model(xt).logits.transpose(1, 2), x0, reduction="none")  # (B, T)
    return (ce * masked / t[:, None]).sum() / x0.numel()

xb = torch.randint(3, len(tok), (4, 32), device=DEVICE)
t = torch.tensor([0.1, 0.4, 0.7, 1.0], device=DEVICE)
a = loss_by_hand(net, xb, t, torch.Generator(device=DEVICE).manual_seed(3))
b = diffusion_lm.masked_diffusion_loss(net, xb, t=t, generator=torch.Generator(device=DEVICE).manual_seed(3))
assert torch.allclose(a, b)
print(f"loss by hand {a.item():.4f} == refimpl {b.item():.4f}")

# %% [markdown]
# A sanity anchor: a model that knows nothing (all logits equal) pays `log V` per masked token,
# and with the `1/t` weight the expected loss is `log V` at every `t`.

# %%
blank = diffusion_lm.DiffusionLM(cfg, tok)
for p in blank.parameters():
    p.data.zero_()
vals = [diffusion_lm.masked_diffusion_loss(blank, xb.cpu(), t=torch.full((4,), tt)).item() for tt in (0.3, 1.0)]
print([round(v, 3) for v in vals], "≈ log V =", round(math.log(len(tok)), 3))

# %% [markdown]
# ## Training live (a few seconds)
# The real trainer is `python -m refimpl.train tiny-dllm` (random 128-token windows of the
# King James text, AdamW, cosine schedule). Here we run `TRAIN_STEPS` steps of the same loss on
# our small random network, just to watch the loss fall.

# %%
train_docs, valid_docs = data.kjv_split()
from refimpl.train import encode_docs, random_windows
stream = encode_docs(tok, train_docs[:200], EOS)
opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
gen, losses, t0 = torch.Generator().manual_seed(0), [], time.time()
net.train()
for step in range(TRAIN_STEPS):
    loss = diffusion_lm.masked_diffusion_loss(net, random_windows(stream, 8, 64, gen).to(DEVICE))
    loss.backward(); opt.step(); opt.zero_grad()
    losses.append(loss.item())
net.eval()
print(f"{TRAIN_STEPS} steps in {time.time() - t0:.1f} s: loss {losses[0]:.2f} -> {losses[-1]:.2f}")

# %% [markdown]
# The loss is noisy: each step draws one `t` per sequence, and small `t` gets a large `1/t` weight.

# %%
plt.figure(figsize=(4, 3)); plt.plot(losses); plt.xlabel("step"); plt.ylabel("loss (Eq. 3)")
plt.title("live training"); plt.show()

# %% [markdown]
# ## The committed model
# `models.load("tiny-dllm")` returns the trained denoiser with the fields every sampler reads.
# Its training report holds the validation numbers (masked-token CE at fixed ratios, and the
# bound `exp(NELBO)` on perplexity).

# %%
dlm = models.load(MODEL, device=DEVICE)
import json, os
report = json.load(open(os.path.join(models.MODELS_DIR, MODEL, "train_report.json")))
print({k: dlm.__getattribute__(k) for k in ("mask_token_id", "eos_token_id", "pad_token_id", "max_length")})
print(report["valid"], "| params", report["params"])

# %% [markdown]
# ## Filling in blanks
# The denoiser predicts every masked position at once. Mask a few words of a held-out verse and
# read its guesses (argmax per position, independently).

# %%
text = "And the LORD spake unto Moses, saying, Speak unto the children of Israel"
x0 = torch.tensor([tok.encode(text)], device=DEVICE)
xt = x0.clone(); hide = [3, 4, 9, 12]
xt[0, hide] = MASK
pred = dlm.logits(xt)[0].argmax(-1)
print("masked :", tok.decode(xt[0]).replace("<|mask|>", "▢"))
print("guesses:", [tok.decode([int(pred[i])]) for i in hide], "| truth:", [tok.decode([int(x0[0, i])]) for i in hide])

# %% [markdown]
# ## How hard is denoising at each mask ratio?
# Masked-token cross-entropy on held-out windows: the more is masked, the less context, the
# higher the loss. At `t → 1` the model is an unconditional unigram-ish guesser.

# %%
valid_stream = encode_docs(tok, valid_docs[:20], EOS)
n = 8 if FAST else 32
xs = valid_stream[: n * 128].view(n, 128).to(DEVICE)
ratios = (0.1, 0.3, 0.5, 0.7, 0.9)
ev = diffusion_lm.masked_token_eval(dlm, xs, ratios=ratios, batch=8)
plt.figure(figsize=(4, 3)); plt.plot(ratios, [ev[f"masked_ce@{r}"] for r in ratios], "o-")
plt.xlabel("mask ratio t"); plt.ylabel("CE on masked tokens (nats)"); plt.show()

# %% [markdown]
# ## Samples
# A preview of chapter 11: start with 32 masks after a prompt and let the LLaDA sampler unmask
# them, one token per step, in blocks of 8 decoded left to right.

# %%
prompt = tok.encode("And God said")
g = diffusion.generate(dlm, [prompt], gen_length=32, steps=32, block_length=8, eos_token_id=[])
print("And God said" + tok.decode(g.tokens[0]))
print("NFE:", g.stats.nfe)

# %% [markdown]
# ## A task with exact answers
# Quality of free text is hard to measure, so the course also trains a tiny model on a
# synthetic task: reverse 6 digits (`"314159="` → `"951413"` + EOS), character vocabulary, trained
# SFT-style (only the answer is ever masked: LLaDA Eq. 5). `synthetic_accuracy` decodes with the
# default sampler (one token per step).

# %%
rev = models.load(SYNTH, device=DEVICE)
problems = digit_reversal.synthetic_split()[: 100 if FAST else 500]
acc, g = digit_reversal.synthetic_accuracy(rev, problems, return_generation=True)
for d, t in list(zip(problems, g.tokens))[:3]:
    print(d, "->", rev.tokenizer.decode(t))
print(f"exact match on {len(problems)} held-out problems: {acc:.1%}")
assert acc >= 0.9

# %% [markdown]
# ## Exercises
# **1. Answer-only masking (SFT).** For supervised fine-tuning LLaDA never masks the prompt.
# Write `sft_forward_mask(x0, prompt_len, t, mask_id, gen)` that masks each *answer* token with
# probability `t` (draw one uniform per token of the whole row, like `forward_mask`).

# %%
def sft_forward_mask(x0, prompt_len, t, mask_id, gen):     # your answer here
    u = torch.rand(x0.shape, generator=gen)
    masked = (u < t[:, None]) & (torch.arange(x0.size(1)) >= prompt_len)[None]
    return torch.where(masked, torch.full_like(x0, mask_id), x0), masked

def check_sft(fn):
    x = torch.randint(3, 50, (3, 20)); t = torch.tensor([0.2, 0.6, 1.0])
    keep = torch.zeros(3, 20, dtype=torch.bool); keep[:, 7:] = True
    a = fn(x, 7, t, MASK, torch.Generator().manual_seed(0))
    b = diffusion_lm.forward_mask(x, t, MASK, keep, torch.Generator().manual_seed(0))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), "mask answers only, same draws"
    return "correct"

print(check_sft(sft_forward_mask))

# %% [markdown]
# **2. Lower-variance `t`.** Drawing `t` independently per row makes the loss noisy. Stratified
# ("low-discrepancy") sampling uses `t_i = (i + u) / B` for one shared `u ~ U(0,1)`, so every
# stratum of `(0, 1)` is covered once per batch. Write `stratified_t(B, gen)`.

# %%
def stratified_t(B, gen):                                # your answer here
    u = torch.rand((), generator=gen)
    return (torch.arange(B) + u) / B

def check_stratified(fn):
    for B in (1, 4, 16):
        t = fn(B, torch.Generator().manual_seed(B)).sort().values
        assert t.shape == (B,) and bool(((t >= torch.arange(B) / B) & (t < (torch.arange(B) + 1) / B)).all())
        assert torch.allclose(t - t[0], torch.arange(B) / B, atol=1e-6), "one shared offset"
    return "correct"

print(check_stratified(stratified_t))

# %% [markdown]
# ## Summary
# - A dLLM is a bidirectional transformer with a `MASK` token, trained to predict masked tokens.
# - Forward process: mask each token with probability `t`; loss: masked CE weighted by `1/t`
#   (an upper bound on NLL), or answer-only masking for SFT.
# - `models.load("tiny-dllm")` gives the denoiser that chapters 11–13 decode from.
