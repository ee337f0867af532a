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
# order. This chapter is about the model side; chapters 11–13 build the samplers.
#
# After this chapter you can:
#
# 1. write the forward (masking) process `q(x_t | x_0)` and predict which tokens a larger `t` masks;
# 2. write the denoiser's forward pass from its weights and show where it differs from an AR model
#    (no causal mask: position 0 reads the last token);
# 3. write the training loss, say which part is LLaDA's Eq. (3) (the `1/t` weight) and which is an
#    implementation choice (the per-token average), and predict its value for a model that knows nothing;
# 4. read the trained model's loss-vs-mask-ratio curve and say why the `1/t` weight makes the loss noisy.

# %% [markdown]
# ## Parameters

# %%
import torch
from refimpl.models import default_device

FAST = True                      # CI default: seconds of training, small evaluations
MODEL = "tiny-dllm"              # King James masked diffusion LM (python -m refimpl.train tiny-dllm)
SYNTH = "tiny-dllm-rev"          # digit reversal, exact answers
DEVICE = default_device()        # a torch.device: CUDA when present, $REFIMPL_DEVICE overrides
TRAIN_STEPS = 15 if FAST else 300
WINDOWS = 16 if FAST else 64     # held-out 128-token windows for the loss pictures
SEED = 0
SHOW_SOLUTIONS = False           # True prints the reference answers below each exercise

# %% [markdown]
# ## Imports
# `refimpl.diffusion_lm` holds the model, the masking process, the loss and the evaluation. The
# King James models share the `tiny` AR model's tokenizer, which has a `MASK` token.

# %%
import math
import time
from html import escape
import matplotlib.pyplot as plt
import torch.nn.functional as F
from refimpl import diffusion_lm, diffusion, digit_reversal, models, data
from refimpl.primitives import rms_norm, rope             # the pieces every model of the course shares
from refimpl.train import encode_docs, random_windows

tok = models.load("tiny", device="cpu").tokenizer
MASK, EOS = tok.mask_token_id, tok.eos_token_id
print("vocab", len(tok), "| MASK id", MASK, repr(tok.mask_token), "| EOS id", EOS)

# %% [markdown]
# ## The forward process, by hand
# Pick a mask ratio `t ∈ (0, 1)`. Each token independently becomes `MASK` with probability `t`:
# draw one uniform `u_i` per token and mask where `u_i < t`. At `t = 0` the text is clean; at
# `t = 1` everything is masked (the sampler's start state). The uniforms are drawn on the device
# of `x0` with a generator of that same device.

# %%
def forward_mask_by_hand(x0, t, mask_id, gen):
    u = torch.rand(x0.shape, generator=gen, device=x0.device)   # (B, T) one uniform per token
    masked = u < t[:, None]                                     # (B, T)
    return torch.where(masked, torch.full_like(x0, mask_id), x0), masked

verse = "In the beginning God created the heaven and the earth."
x0 = torch.tensor([tok.encode(verse)], device=DEVICE)
for t in (0.25, 0.5, 0.9):
    xt, _ = forward_mask_by_hand(x0, torch.tensor([t], device=DEVICE), MASK, torch.Generator(DEVICE).manual_seed(0))
    print(f"t={t:.2f}:", tok.decode(xt[0]).replace(tok.mask_token, "▢"))

# %% [markdown]
# The library version draws the same uniforms, so with the same seed it masks the same tokens.

# %%
t = torch.tensor([0.6], device=DEVICE)
mine = forward_mask_by_hand(x0, t, MASK, torch.Generator(DEVICE).manual_seed(1))
lib = diffusion_lm.forward_mask(x0, t, MASK, generator=torch.Generator(DEVICE).manual_seed(1))
assert torch.equal(mine[0], lib[0]) and torch.equal(mine[1], lib[1])
print("hand-built forward process == refimpl.diffusion_lm.forward_mask")

# %% [markdown]
# ### Picture: one draw of the forward process at nine mask ratios
# With the *same* uniforms for every row, raising `t` only ever adds masks: the rows are nested.
# (Training draws fresh uniforms and a fresh `t` per sequence; nesting is what "a larger `t` is
# a noisier version of the same text" looks like.) Grey = `MASK`; the right column is the
# fraction actually masked, which only concentrates around `t` on long sequences.

# %%
ts = [0.1 * k for k in range(1, 10)]
grid = torch.cat([forward_mask_by_hand(x0, torch.tensor([tt], device=DEVICE), MASK,
                                       torch.Generator(DEVICE).manual_seed(SEED))[1] for tt in ts]).cpu()   # matplotlib plots host arrays
words = [tok.decode([i]) for i in x0[0].tolist()]
fig, ax = plt.subplots(figsize=(8, 3.2))
ax.imshow(grid, cmap="Greys", vmin=-0.3, vmax=1.6, aspect="auto")
for r, c in zip(*torch.where(~grid)):
    ax.text(c, r, words[c], ha="center", va="center", fontsize=8)
ax.set_xticks([]); ax.set_yticks(range(len(ts)), [f"t = {tt:.1f}" for tt in ts])
for r in range(len(ts)):
    ax.text(len(words) - 0.3, r, f"{grid[r].float().mean():.0%}", va="center", fontsize=8)
ax.set_title("forward process q(x_t | x_0): grey = MASK, right = fraction masked"); plt.show()

# %% [markdown]
# ## The denoiser, by hand: a transformer without a causal mask
# `DiffusionLM` is a small Llama-style stack: token embedding, then per layer
# `h += Attn(RMSNorm(h))` and `h += SwiGLU(RMSNorm(h))`, then a final RMSNorm and the embedding
# matrix again as the output head (tied). Attention uses RoPE on queries and keys. The one real
# change from an AR model is the attention pattern: **bidirectional**, every position reads every
# other. One layer, from the layer's own weights (`causal=True` adds the AR model's mask, to compare):

# %%
def block_by_hand(blk, h, pos, causal=False):
    B, T, H = h.shape
    nh, hs = blk.heads, H // blk.heads
    a = rms_norm(h, blk.attn_norm.weight, blk.attn_norm.eps)
    q, k, v = (a @ blk.qkv.weight.T).view(B, T, 3, nh, hs).permute(2, 0, 3, 1, 4)  # 3 x (B, nh, T, hs)
    q, k = rope(q, pos, blk.theta), rope(k, pos, blk.theta)
    s = q @ k.transpose(-1, -2) / math.sqrt(hs)                                     # (B, nh, T, T)
    if causal:
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=h.device).triu(1), float("-inf"))
    h = h + (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H) @ blk.o.weight.T
    g, u = (rms_norm(h, blk.mlp_norm.weight, blk.mlp_norm.eps) @ blk.gate_up.weight.T).chunk(2, -1)
    return h + (F.silu(g) * u) @ blk.down.weight.T                                  # SwiGLU

# %% [markdown]
# The whole network: embeddings (plus learned absolute positions when the config asks for them,
# as the digit-reversal model does), the layers, the final norm and the tied head.

# %%
@torch.no_grad()
def denoiser_by_hand(model, ids, causal=False):
    pos = torch.arange(ids.size(1), device=ids.device).expand_as(ids)              # (B, T)
    h = model.embed(ids)                                                           # (B, T, H)
    if model.pos_embed is not None:
        h = h + model.pos_embed(pos)
    for blk in model.blocks:
        h = block_by_hand(blk, h, pos, causal)
    return rms_norm(h, model.norm.weight, model.norm.eps) @ model.embed.weight.T  # (B, T, V)

# %% [markdown]
# Check it against the library on a small random network, built the way `refimpl.train` builds
# the real one (only smaller).

# %%
cfg = diffusion_lm.DLMConfig(vocab_size=len(tok), hidden_size=64, num_layers=2, num_heads=2,
                             intermediate_size=128, max_length=256, mask_token_id=MASK)
torch.manual_seed(SEED)
net = diffusion_lm.DiffusionLM(cfg, tok).to(DEVICE)
x = torch.tensor([tok.encode("And God said, Let there be light")], device=DEVICE)
err = (denoiser_by_hand(net, x) - net.logits(x)).abs().max().item()
assert err < 1e-4, err
print(f"hand-built denoiser == refimpl DiffusionLM (max |diff| {err:.1e})")

# %% [markdown]
# Bidirectional means the *first* position's prediction depends on the *last* token. Change the
# last token: the bidirectional denoiser's first row of logits moves, the causal version's cannot.

# %%
y = x.clone(); y[0, -1] = MASK
for causal in (False, True):
    moved = (denoiser_by_hand(net, x, causal)[0, 0] - denoiser_by_hand(net, y, causal)[0, 0]).abs().max().item()
    print(f"causal={causal!s:5}: position 0's logits moved by {moved:.2e}")
    assert (moved > 1e-4) != causal

# %% [markdown]
# Note what the denoiser is *not* given: the mask ratio `t`. LLaDA's mask predictor takes only
# `x_t` (the number of `MASK`s tells it how noisy the input is), so one network serves every step
# of the sampler.
#
# ## The loss
# LLaDA's training objective, Eq. (3) of the paper, with `t ~ U(0, 1)` per sequence and
# `x_t ~ q(x_t | x_0)`:
#
# `L(θ) = − E_{t, x_0, x_t} [ (1/t) · Σ_{i=1}^{L} 1[x_t^i = MASK] · log p_θ(x_0^i | x_t) ]`
#
# the cross-entropy on the masked positions, weighted by `1/t`; the paper shows it upper-bounds
# the negative log-likelihood `−log p_θ(x_0)` of the whole sequence. **Eq. (3) has no length
# normalisation**: it is a sum over the `L` positions. We, like the pre-training pseudo-code in
# LLaDA's repository, divide the batch's sum by the number of tokens `B · T`, so the number is a
# bound *per token*, comparable across lengths and batch sizes (a constant factor: the optimum is
# the same). `refimpl` draws `t ~ U(ε, 1)` with `ε = 10⁻³` to keep `1/t` finite.

# %% [markdown]
# ### Exercise 1: the loss
# Write `diffusion_loss(model, x0, t, gen)`: mask `x0` (B, T) at ratios `t` (B,) with
# `diffusion_lm.forward_mask(x0, t, model.mask_token_id, generator=gen)` (your forward process
# above, so the draws match), run `model(x_t).logits` (B, T, V), and return the 0-d tensor
# `Σ_masked CE / t` over the batch, divided by `B · T`. The check compares it with
# `refimpl.diffusion_lm.masked_diffusion_loss` on the same draws.

# %%
from solutions import exercise, check, show


@exercise("10", "diffusion_loss")
def diffusion_loss(model, x0, t, gen):
    # your code here
    raise NotImplementedError

# %% [markdown]
# The check (a small random network, four rows at four different mask ratios):

# %%
def check_loss():
    xb = torch.randint(3, len(tok), (4, 32), generator=torch.Generator(DEVICE).manual_seed(2), device=DEVICE)
    tb = torch.tensor([0.1, 0.4, 0.7, 1.0], device=DEVICE)
    with torch.no_grad():
        mine = diffusion_loss(net, xb, tb, torch.Generator(DEVICE).manual_seed(3))
        ref = diffusion_lm.masked_diffusion_loss(net, xb, t=tb, generator=torch.Generator(DEVICE).manual_seed(3))
    assert torch.is_tensor(mine) and mine.dim() == 0, "return one number, a 0-d tensor"
    assert torch.allclose(mine, ref, rtol=1e-4), (f"you get {mine.item():.4f}, refimpl {ref.item():.4f} "
                                                  "(the 1/t weight? divide by all B*T tokens, not the masked ones?)")


check("Exercise 1", check_loss)
if SHOW_SOLUTIONS:
    show("10", "diffusion_loss")

# %% [markdown]
# A sanity anchor to predict before you run it: a model that knows nothing (all logits equal)
# pays `log V` per masked token; a fraction `t` of tokens is masked and each is weighted `1/t`,
# so the expected loss is `log V` at *every* `t`.

# %%
blank = diffusion_lm.DiffusionLM(cfg, tok).to(DEVICE)
for p in blank.parameters():
    p.data.zero_()
xb = torch.randint(3, len(tok), (8, 64), generator=torch.Generator(DEVICE).manual_seed(SEED), device=DEVICE)
vals = [diffusion_lm.masked_diffusion_loss(blank, xb, t=torch.full((8,), tt, device=DEVICE)).item() for tt in (0.3, 1.0)]
print([round(v, 3) for v in vals], "≈ log V =", round(math.log(len(tok)), 3))
assert all(abs(v - math.log(len(tok))) < 0.15 * math.log(len(tok)) for v in vals)

# %% [markdown]
# ## Training live (a few seconds)
# The real trainer is `python -m refimpl.train tiny-dllm` (random 128-token windows of the
# King James text, AdamW, cosine schedule). Here we run `TRAIN_STEPS` steps of the same loss on
# our small random network, just to watch the loss fall.

# %%
train_docs, valid_docs = data.kjv_split()
stream = encode_docs(tok, train_docs[:200], EOS)
opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
gen, losses, t0 = torch.Generator(device="cpu").manual_seed(SEED), [], time.time()   # picks offsets in the host-side stream
net.train()
for step in range(TRAIN_STEPS):
    loss = diffusion_lm.masked_diffusion_loss(net, random_windows(stream, 8, 64, gen).to(DEVICE))
    loss.backward(); opt.step(); opt.zero_grad()
    losses.append(loss.item())
net.eval()
print(f"{TRAIN_STEPS} steps in {time.time() - t0:.1f} s: loss {losses[0]:.2f} -> {losses[-1]:.2f}")

# %% [markdown]
# The loss is noisy: each step draws one `t` per sequence, and a small `t` gets a large `1/t` weight.

# %%
plt.figure(figsize=(4, 3)); plt.plot(losses); plt.xlabel("step"); plt.ylabel("loss (per token)")
plt.title("live training"); plt.show()

# %% [markdown]
# ## The committed model
# `models.load("tiny-dllm")` returns the trained denoiser with the fields every sampler reads.
# Its training report holds the validation numbers (masked-token CE at fixed ratios, and the
# bound `exp(NELBO)` on perplexity). It is the same network as ours, only bigger, so the
# hand-built forward pass reproduces it too.

# %%
dlm = models.load(MODEL, device=DEVICE)
import json, os
report = json.load(open(os.path.join(models.MODELS_DIR, MODEL, "train_report.json")))
print({k: getattr(dlm, k) for k in ("mask_token_id", "eos_token_id", "pad_token_id", "max_length")})
print(report["valid"], "| params", report["params"])
assert (denoiser_by_hand(dlm, x) - dlm.logits(x)).abs().max() < 1e-3

# %% [markdown]
# ## Picture: where the loss comes from, mask ratio by mask ratio
# On held-out windows: the mean cross-entropy on masked tokens `CE(t)` (blue) rises with `t`, since
# the more is masked the less context is left. A single draw at ratio `t` masks about `t · T`
# tokens, so without the weight the loss per token would be `t · CE(t)` (dashed): high ratios
# would dominate. The `1/t` weight turns each ratio's contribution back into `CE(t)`, and the
# loss is its average over `t` (the shaded area is the NELBO bound). The price is the dots:
# single-sequence losses at random `t`, very noisy at small `t`, where few tokens get a big weight.

# %%
valid_stream = encode_docs(tok, valid_docs[:20], EOS)
xs = valid_stream[: WINDOWS * 128].view(WINDOWS, 128).to(DEVICE)
ratios = [0.05 + 0.1 * k for k in range(10)]
ev = diffusion_lm.masked_token_eval(dlm, xs, ratios=ratios, batch=8, seed=SEED)
ce = [ev[f"masked_ce@{r}"] for r in ratios]
g = torch.Generator(DEVICE).manual_seed(SEED)
t_draw = torch.rand(2 * WINDOWS, generator=g, device=DEVICE).clamp(min=0.02)
with torch.no_grad():
    single = [diffusion_lm.masked_diffusion_loss(dlm, xs[i % WINDOWS][None], t=t_draw[i:i + 1], generator=g).item()
              for i in range(2 * WINDOWS)]
print("CE(t):", [round(c, 2) for c in ce], "| NELBO/token", ev["nelbo_per_token"])

# %% [markdown]
# Drawn:

# %%
fig, ax = plt.subplots(figsize=(6, 3.4))
ax.fill_between(ratios, ce, alpha=0.15, label=f"area ≈ NELBO per token ({ev['nelbo_per_token']:.2f})")
ax.plot(ratios, ce, "o-", label="CE(t): 1/t-weighted, per token")
ax.plot(ratios, [r * c for r, c in zip(ratios, ce)], "s--", label="t · CE(t): unweighted, per token")
ax.scatter(t_draw.tolist(), single, s=12, c="0.4", label="one sequence, one draw (weighted)")
ax.set_xlabel("mask ratio t"); ax.set_ylabel("nats"); ax.set_ylim(0, max(max(single), max(ce)) * 1.1)
ax.legend(fontsize=7); ax.set_title("the 1/t weight, on the trained tiny-dllm"); plt.show()

# %% [markdown]
# ## Play: the denoiser filling in blanks
# Mask a held-out passage at ratio `t` and let the trained denoiser guess *every* mask in one call
# (argmax per position, independently). Green: guessed right; red: the guess (hover for the
# truth). Move `t` up and watch accuracy fall as context disappears: the `CE(t)` curve above, one
# passage at a time.

# %%
import ipywidgets as widgets
from IPython.display import HTML, display

passage = torch.tensor([tok.encode(valid_docs[1][:400])[:48]], device=DEVICE)   # 48 held-out tokens

# %% [markdown]
# One rendering: mask, one denoiser call, colour the guesses.

# %%
def render(t=0.3, seed=SEED):
    xt, m = diffusion_lm.forward_mask(passage, torch.tensor([t], device=DEVICE), MASK,
                                      generator=torch.Generator(DEVICE).manual_seed(seed))
    pred, spans = dlm.logits(xt)[0].argmax(-1), []
    for i, true in enumerate(passage[0].tolist()):
        word, guess = escape(tok.decode([true])), int(pred[i])
        if m[0, i]:
            c = "#b7e4c7" if guess == true else "#ffadad"
            word = f'<span style="background:{c}" title="truth: {word}">{escape(tok.decode([guess]))}</span>'
        spans.append(word)
    right = int(((pred == passage) & m).sum())
    return f"<b>t = {t:.2f}: {int(m.sum())} masked, {right} guessed right in one call</b><br>" + "".join(spans)

# %% [markdown]
# The widget:

# %%
def play(t=0.3, seed=SEED):
    global shown
    shown = render(t, seed)
    display(HTML(shown))


ui = widgets.interact(play, t=widgets.FloatSlider(continuous_update=False, value=0.3, min=0.05, max=1.0, step=0.05),
                      seed=widgets.IntSlider(continuous_update=False, value=SEED, min=0, max=20)).widget

# %% jupyter={"source_hidden": true} tags=["ci-only", "remove-input"]
# CI's self-test of the widget above (collapsed in the lab): move a control as a person would,
# check that the output changed, then put the control back to its teaching default
default = ui.children[0].value
before = shown
ui.children[0].value = 0.9                        # move the t slider, as a person would
assert shown != before, "moving a control must change the output"
ui.children[0].value = default

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
# ### Exercise 2: answer-only masking (SFT)
# For supervised fine-tuning LLaDA never masks the prompt (its Eq. 5). Write
# `sft_forward_mask(x0, prompt_len, t, mask_id, gen)` that masks each *answer* token (positions
# `>= prompt_len`) with probability `t`; draw one uniform per token of the *whole* row, as the
# forward process above does, so the draws line up. Return `(x_t, masked)`. The check compares
# with `forward_mask` given a `maskable` argument (which positions may be masked).

# %%
@exercise("10", "sft_forward_mask")
def sft_forward_mask(x0, prompt_len, t, mask_id, gen):
    # your code here
    raise NotImplementedError

# %% [markdown]
# The check:

# %%
def check_sft():
    xr = torch.randint(3, 50, (3, 20), generator=torch.Generator(DEVICE).manual_seed(4), device=DEVICE)
    tr = torch.tensor([0.2, 0.6, 1.0], device=DEVICE)
    keep = torch.zeros(3, 20, dtype=torch.bool, device=DEVICE); keep[:, 7:] = True
    a = sft_forward_mask(xr, 7, tr, MASK, torch.Generator(DEVICE).manual_seed(0))
    b = diffusion_lm.forward_mask(xr, tr, MASK, keep, torch.Generator(DEVICE).manual_seed(0))
    assert not a[1][:, :7].any(), "a prompt token was masked"
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), "answers masked differently from forward_mask (same draws?)"


check("Exercise 2", check_sft)
if SHOW_SOLUTIONS:
    show("10", "sft_forward_mask")

# %% [markdown]
# ### Exercise 3: lower-variance `t`
# The dots in the loss picture are the noise of drawing `t` independently per row. Stratified
# ("low-discrepancy") sampling uses `t_i = (i + u) / B` for one shared `u ~ U(0, 1)`, so every
# stratum `[i/B, (i+1)/B)` of `(0, 1)` holds exactly one `t` per batch. Write
# `stratified_t(B, gen)` returning a (B,) tensor on the generator's device (`gen.device`, where the
# training batches are). The check tests the strata and the shared offset, and that over 2,000
# batches each `t_i` is still uniform on its stratum (its mean and spread).

# %%
@exercise("10", "stratified_t")
def stratified_t(B, gen):
    # your code here
    raise NotImplementedError

# %% [markdown]
# The check:

# %%
def check_stratified():
    for B in (1, 4, 16):
        ts_ = stratified_t(B, torch.Generator(DEVICE).manual_seed(B)).sort().values
        lo = torch.arange(B, device=DEVICE) / B
        assert bool(((ts_ >= lo) & (ts_ < lo + 1 / B)).all()), f"B = {B}: one t per stratum [i/B, (i+1)/B)"
        assert torch.allclose(ts_ - ts_[0], lo, atol=1e-6), f"B = {B}: the strata must share one offset u"
    gg = torch.Generator(DEVICE).manual_seed(9)
    draws = torch.stack([stratified_t(4, gg).sort().values for _ in range(2000)])     # (2000, 4)
    mean, sd = draws.mean(0), draws.std(0)                                             # per stratum
    assert torch.allclose(mean, (torch.arange(4, device=DEVICE) + 0.5) / 4, atol=0.02), f"means {mean.tolist()}: not uniform"
    assert torch.allclose(sd, torch.full((4,), 0.25 / 12 ** 0.5, device=DEVICE), atol=0.01), f"spreads {sd.tolist()}: not uniform"


check("Exercise 3", check_stratified)
if SHOW_SOLUTIONS:
    show("10", "stratified_t")

# %% [markdown]
# ## Summary
# - A dLLM is a transformer with a `MASK` token and no causal mask, trained to predict the masked
#   tokens of `x_t` from everything that is left; it is not told `t`.
# - Forward process: mask each token independently with probability `t`.
# - Loss: masked cross-entropy weighted by `1/t` (LLaDA Eq. 3, an upper bound on the NLL); the
#   division by the number of tokens is our per-token normalisation, not part of Eq. (3). The
#   weight makes every ratio count as `CE(t)`, at the price of noisy small-`t` draws. For SFT only
#   the answer is masked (Eq. 5).
# - `models.load("tiny-dllm")` gives the denoiser that chapters 11–13 decode from.
