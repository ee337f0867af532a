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
# # 14 · Beyond: block diffusion from an AR model, a dLLM as drafter, lossless dLLM decoding
#
# Chapters 10-13 trained a masked diffusion LM from scratch. On King James text it stayed weak and
# unsure: threshold decoding committed about one token per step, so chapter 12's central promise
# (far fewer denoiser calls) only showed on the digit-reversal toy. This chapter takes three ideas
# from recent papers:
#
# - **adapt an AR model into a block-diffusion LM** ("Fast-dLLM v2", arXiv 2509.26328; the
#   block-causal layout of "Block Diffusion", BD3-LM, arXiv 2503.09573): attention is causal across
#   blocks and bidirectional inside the block being denoised, the AR model's shifted prediction is
#   kept, and the committed text is processed exactly like an AR model processes it. So the block
#   KV cache is **exact**;
# - **use the dLLM as the drafter of an AR target** ("Speculative Diffusion Decoding", arXiv
#   2408.05636; "DiffuSpec", arXiv 2510.02358): one denoising call drafts a whole block, the AR
#   target verifies it with chapter 02's core;
# - **make dLLM decoding itself faster without changing its output** ("Free Draft-and-Verification",
#   FreeDave): guess the next few denoising steps from the current predictions, check them all in
#   one batched call, keep the longest run of correct guesses.
#
# **After this chapter you can**
#
# 1. draw the block-causal training row of an AR → block-diffusion adaptation and say why its KV cache is exact;
# 2. write the attention mask of one block-decoding call and check it against the library's forward;
# 3. measure how many denoiser calls a confidence threshold saves on text and what it costs in quality (perplexity, repetition);
# 4. predict the acceptance rate of a dLLM draft from `p` and `q`, and explain why drafting from marginals is lossless;
# 5. build FreeDave's guesses of future steps and show that draft-and-verify reproduces step-by-step decoding with fewer calls.

# %% [markdown]
# ## Parameters

# %%
import torch
from refimpl.models import default_device

FAST = True                        # CI default: short generations, few prompts and samples
DEVICE = default_device()          # a torch.device: CUDA when present, $REFIMPL_DEVICE overrides
GEN, BLOCK = 32, 8                 # tokens to generate, block length
N_PROMPTS = 3 if FAST else 12
SAMPLES = 600 if FAST else 4000    # for the losslessness check
SEED = 0
SHOW_SOLUTIONS = False

# %% [markdown]
# ## The models
# `tiny` is chapter 01's 4-layer AR model. `tiny-bdlm` is `tiny` after a short adaptation
# (`python -m refimpl.train tiny-bdlm`): same weights to start, same tokenizer (its MASK id was
# reserved from the start), trained on the same King James text. Its training report:

# %%
import json
import os
import kernels
import matplotlib.pyplot as plt
from refimpl import models, autoregressive, block_diffusion as bd, dllm_draft, diffusion, speculative, retrieval
from refimpl.bench import dllm as dllm_bench
from solutions import exercise, check, show

ar = models.load("tiny", device=DEVICE)
bdlm = models.load("tiny-bdlm", device=DEVICE)
MASK = bdlm.mask_token_id
report = json.load(open(os.path.join(models.MODELS_DIR, "tiny-bdlm", "train_report.json")))
print({k: report[k] for k in ("steps", "minutes", "valid_masked_ce", "valid_ar_perplexity", "valid_ar_perplexity_before")})
prompts = dllm_bench.kjv_prompts(ar.tokenizer, N_PROMPTS, length=32)
print(repr(ar.decode(prompts[0])))

# %% [markdown]
# ## The training row: two noisy copies and the clean text
# Fast-dLLM v2 trains on rows `[x_t ; x_t' ; x0]`, all three with positions `0..T-1`:
#
# - `x0`, the clean text, attends **causally**: it is exactly the AR model, trained with the AR loss;
# - `x_t` and `x_t'` are noisy copies with **complementary masks** (every token is masked in exactly
#   one of them, so every token is a target once). A noisy token attends to the clean tokens of
#   **earlier blocks** and to its own copy's tokens of **its own block**, in both directions.
#
# The shift: slot `j - 1` predicts token `j`, as in the AR model. Inside a block the first token is
# predicted by the clean token just before the block. First the mask by its definition, pair by
# pair, then the library's vectorised one.

# %%
T, b = 12, 4
blk = bd.block_ids(T, torch.tensor([b], device=DEVICE), torch.tensor([0], device=DEVICE))[0]   # (T,) block index per position
by_hand = torch.zeros(3 * T, 3 * T, dtype=torch.bool, device=DEVICE)     # where training uses the mask
for i in range(3 * T):
    ci, pi = divmod(i, T)                                                  # copy (0, 1 noisy; 2 clean), position
    for j in range(3 * T):
        cj, pj = divmod(j, T)
        if ci == 2:
            by_hand[i, j] = cj == 2 and pj <= pi                           # clean: causal
        elif cj == 2:
            by_hand[i, j] = blk[pj] < blk[pi]                              # noisy -> clean, earlier blocks
        else:
            by_hand[i, j] = cj == ci and blk[pj] == blk[pi]                # noisy -> its own block
assert torch.equal(by_hand, bd.training_allow(blk[None])[0])
print("hand-built mask == block_diffusion.training_allow")

# %% [markdown]
# Drawn: a dark cell means the row (query) may attend to the column (key). The clean stream (bottom
# right) is a plain causal triangle; each noisy copy sees full squares on its own blocks and the
# clean "staircase" of everything before them.

# %%
fig, ax = plt.subplots(figsize=(6.2, 6.2))
ax.imshow(by_hand.tolist(), cmap="Greens", vmin=0, vmax=1.3)
for k in (T, 2 * T):
    ax.axhline(k - 0.5, color="k", lw=1.2); ax.axvline(k - 0.5, color="k", lw=1.2)
names = ["noisy x_t", "noisy x_t'", "clean x0"]
ax.set_xticks([T / 2 - 0.5 + k * T for k in range(3)], names); ax.set_yticks([T / 2 - 0.5 + k * T for k in range(3)], names)
ax.set_xlabel("key"); ax.set_ylabel("query")
ax.set_title(f"training row, T = {T}, blocks of {b}: who attends to whom", fontsize=9)
plt.show()

# %% [markdown]
# ## What the adaptation kept
# The clean stream is still an AR model: the adapted model's perplexity on held-out text as a plain
# causal LM (`valid_ar_perplexity` above) stays close to `tiny`'s. And because slot `j - 1`
# predicts token `j`, the first token of every block is the AR prediction of the clean text before it.

# %%
g = bd.generate(bdlm, prompts[:1], gen_length=BLOCK, block_length=BLOCK, eos_token_id=[])
clean = bdlm.logits(torch.tensor(prompts[:1], device=DEVICE))[0, -1]
clean[MASK] = float("-inf")
assert g.tokens[0][0] == int(clean.argmax())
print("first token of the block:", repr(ar.decode(g.tokens[0][:1])), "= the clean stream's next-token argmax")

# %% [markdown]
# ## One decoding call
# Decoding goes block by block. One call of `bd.block_step` feeds, on top of the KV cache of every
# committed token, the **pending** tokens (the block just finished, not yet in the cache) and the
# current **block** (committed tokens and MASKs). Pending tokens attend causally (they are final text,
# processed exactly as in training's clean stream) and their keys/values stay in the cache; the block
# attends to everything, and its keys/values are dropped (they change at the next step).
#
# ### Exercise 1: the mask of one call
# Write `decode_allow(n_cache, n_pending, b)` -> a bool tensor `(n_pending + b, n_cache + n_pending + b)`:
# rows are the pending tokens then the block's slots; columns the cached tokens, the pending
# tokens, the block's slots. `True` = may attend. The check compares your mask entry by entry with
# the one `bd.block_step` gives the model (a wrong entry is named by its row and column), then runs
# the model with yours and compares its logits with `bd.block_step`'s.

# %%
@exercise("14", "decode_allow")
def decode_allow(n_cache, n_pending, b):
    # your code here
    raise NotImplementedError

# %% [markdown]
# The check:

# %%
def part(i, n_pending, n_cache=0):
    """A row (``n_cache`` 0) or a column of the mask, named by its part: cached, pending or block."""
    if i < n_cache:
        return f"cached token {i}"
    i -= n_cache
    return f"pending token {i}" if i < n_pending else f"block slot {i - n_pending}"


def block_step_run(ctx, P, b):
    """``bd.block_step``'s logits for cache ``ctx[:P]``, pending ``ctx[P:]`` and a block of ``b``
    MASKs, and the mask it gives the model (it wraps the model's ``forward`` for the call)."""
    block = torch.full((1, b), MASK, device=DEVICE)
    sc = speculative.SlotCache(bdlm, 1, bdlm.device)
    sc.feed(torch.tensor([ctx[:P]], device=DEVICE))
    seen, forward = [], bdlm.forward
    def spy(*args, **kw):
        seen.append(kw["attention_mask"][0, 0])
        return forward(*args, **kw)
    bdlm.forward = spy
    try:
        logits = torch.cat(bd.block_step(sc, torch.tensor([ctx[P:]], device=DEVICE), None, block), 1)
    finally:
        del bdlm.forward                                   # back to the class's method
    m = seen[0]
    return logits, (m if m.dtype == torch.bool else m == 0)   # additive: 0 = may attend


def check_decode_allow():
    ctx = bdlm.encode("And God said, Let there be light: and there was light.")
    for P, b in [(5, 1), (4, 3), (7, 6)]:
        Fn = len(ctx) - P
        a = decode_allow(P, Fn, b)
        assert tuple(a.shape) == (Fn + b, P + Fn + b), f"shape {tuple(a.shape)}, expected {(Fn + b, P + Fn + b)}"
        a = torch.as_tensor(a, dtype=torch.bool, device=DEVICE)
        want, lib = block_step_run(ctx, P, b)
        bad = (a != lib).nonzero().tolist()
        r, c = bad[0] if bad else (0, 0)
        assert not bad, (f"cache {P}, pending {Fn}, block {b}: row {r} ({part(r, Fn)}) / column {c} "
                         f"({part(c, Fn, P)}): you say {bool(a[r, c])}, block_step's mask says {bool(lib[r, c])}")
        _, cache = bdlm.forward(torch.tensor([ctx[:P]], device=DEVICE))
        block = torch.full((1, b), MASK, device=DEVICE)
        got, _ = bdlm.forward(torch.cat([torch.tensor([ctx[P:]], device=DEVICE), block], 1), cache,
                              position_ids=torch.arange(P, P + Fn + b, device=DEVICE)[None],
                              attention_mask=bd.additive(a[None]))
        err = (got - want).abs().max().item()
        assert err < 1e-3, f"cache {P}, pending {Fn}, block {b}: logits differ from block_step's by {err:.3g}"


check("Exercise 1", check_decode_allow)
if SHOW_SOLUTIONS:
    show("14", "decode_allow")

# %% [markdown]
# ## Block decoding by hand, then the library
# Inside a block we reuse chapter 12's rules (`diffusion.select_threshold`). A block starts fully
# masked; each call predicts every slot (the shift: the first slot's prediction comes from the
# pending text), the confident ones are committed, until none is masked. We record which positions
# each call committed.

# %%
def decode_by_hand(prompt, threshold, gen=GEN, block=BLOCK):
    sc, pending = speculative.SlotCache(bdlm, 1, bdlm.device), torch.tensor([prompt], device=DEVICE)
    out, steps = [], []                                           # steps: list of committed positions per call
    for start in range(0, gen, block):
        x = torch.full((1, block), MASK, device=DEVICE)
        while bool((x == MASK).any()):
            lp, lb = bd.block_step(sc, pending, None, x)
            if pending.shape[1]:
                first = lp[:, -1]                                  # the clean token before the block
            pending = pending[:, :0]
            logits = bd.block_predictions(first, lb)               # slot j - 1 predicts token j
            logits[..., MASK] = float("-inf")
            masked = x == MASK
            x0, conf = diffusion.predict(logits, masked)
            sel = diffusion.select_threshold(conf, threshold) & masked
            x = torch.where(sel, x0, x)
            steps.append([start + j for j in sel[0].nonzero()[:, 0].tolist()])
        out += x[0].tolist()
        pending = x                                                # the finished block: fed causally next call
    return out, steps


DEMO_T = 0.1                                                       # low on purpose: see the sweep below
mine, steps = decode_by_hand(prompts[0], DEMO_T)
lib = bd.generate(bdlm, prompts[:1], gen_length=GEN, block_length=BLOCK, threshold=DEMO_T, eos_token_id=[])
assert mine == lib.tokens[0] and len(steps) == lib.stats.nfe
nocache = bd.generate(bdlm, prompts[:1], gen_length=GEN, block_length=BLOCK, threshold=DEMO_T, cache=False, eos_token_id=[])
assert nocache.tokens == lib.tokens                                # the block cache is exact
print(f"{GEN} tokens in {lib.stats.nfe} calls (one token per step would need {GEN}); cache == no cache")
print(repr(ar.decode(mine)))

# %% [markdown]
# The picture: one row per denoiser call, one column per generated position; a token is written in
# the call that committed it. Blocks (vertical lines) finish left to right; inside a block the
# confident tokens go first, several per call. The threshold is low on purpose (0.1: commit
# anything the model gives 10%): the garbled text above is the price, measured in the next section.

# %%
def draw_steps(tokens, steps, ax, title):
    grid = torch.full((len(steps), len(tokens)), float("nan"), device="cpu")   # a picture: host data for matplotlib
    for r, pos in enumerate(steps):
        for p in pos:
            grid[r, p] = r
            ax.text(p, r, ar.decode([tokens[p]]).strip()[:4], ha="center", va="center", fontsize=7)
    ax.imshow(grid, cmap="viridis", aspect="auto", alpha=0.55)
    for k in range(BLOCK, len(tokens), BLOCK):
        ax.axvline(k - 0.5, color="k", lw=0.8)
    ax.set_xlabel("generated position"); ax.set_ylabel("denoiser call"); ax.set_title(title, fontsize=9)


fig, ax = plt.subplots(figsize=(10, 0.28 * len(steps) + 1.5))
draw_steps(mine, steps, ax, f"threshold {DEMO_T}: {len(steps)} calls for {GEN} tokens")
plt.show()

# %% [markdown]
# ## How many calls does parallel decoding save, and at what cost?
# Two ways to commit more than one token per call: a confidence **threshold** (chapter 12) and
# LLaDA's fixed **k per step** (`steps = GEN / k`, chapter 11). Quality is measured two
# ways, because perplexity alone rewards repeating a likely phrase: the perplexity of the generated
# text under `tiny`, and the fraction of 3-grams that repeat an earlier 3-gram of the same output.
# Chapter 10's `tiny-dllm`, trained from scratch, runs the same settings (`diffusion.generate`).
# Predict before you run: how many calls will threshold 0.9 need?

# %%
dlm = models.load("tiny-dllm", device=DEVICE)
SETTINGS = {"1 per step": {}, "threshold 0.9": dict(threshold=0.9), "threshold 0.3": dict(threshold=0.3),
            "threshold 0.1": dict(threshold=0.1), "k = 2": dict(steps=GEN // 2), "k = 4": dict(steps=GEN // 4)}
curve = {}
for name, run in [("tiny-bdlm", lambda kw: bd.generate(bdlm, prompts, gen_length=GEN, block_length=BLOCK, eos_token_id=[], **kw)),
                  ("tiny-dllm", lambda kw: diffusion.generate(dlm, prompts, gen_length=GEN, block_length=BLOCK,
                                                              eos_token_id=[], **{"steps": GEN, **kw}))]:
    for label, kw in SETTINGS.items():
        with kernels.references():  # torch references on a CPU: 12 runs through Triton's interpreter take minutes
            r = run(kw)
        curve[name, label] = (r.stats.nfe, dllm_bench.ar_perplexity(ar, prompts, r.tokens), dllm_bench.repetition(r.tokens))
print(f"{'model':10s} {'setting':>14s} {'calls':>6s} {'ppl@tiny':>9s} {'rep. 3-grams':>12s}")
for (name, label), (nfe, ppl, rep) in curve.items():
    print(f"{name:10s} {label:>14s} {nfe:6d} {ppl:9.1f} {rep:12.1%}")
assert curve["tiny-bdlm", "1 per step"][1] < curve["tiny-dllm", "1 per step"][1]

# %% [markdown]
# Plotted: calls against quality, one point per setting. Further left costs fewer calls; lower is
# better on both quality axes. At every number of calls the adapted model writes text `tiny` finds
# far more likely than the model trained from scratch does. But threshold 0.9 saves **nothing**: every
# call commits exactly one token. Cutting the calls in half costs a large jump in perplexity.

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
for ax, k, ylabel in [(axes[0], 1, "perplexity under tiny (log)"), (axes[1], 2, "repeated 3-grams")]:
    for name, marker in [("tiny-bdlm", "o"), ("tiny-dllm", "s")]:
        at = {}                                              # settings that land on the same point share a label
        for label in SETTINGS:
            at.setdefault((curve[name, label][0], curve[name, label][k]), []).append(label)
        ax.scatter([x for x, _ in at], [y for _, y in at], marker=marker, s=40, label=name)
        for (x, y), labels in at.items():
            ax.annotate(" = ".join(labels), (x, y), xytext=(5, 3), textcoords="offset points", fontsize=7)
    ax.set_xlabel(f"denoiser calls ({len(prompts)} prompts x {GEN} tokens, batched)"); ax.set_ylabel(ylabel)
    ax.set_xlim(0, GEN * 1.45)
axes[0].set_yscale("log"); axes[0].legend(fontsize=8)
plt.tight_layout(); plt.show()

# %% [markdown]
# ## What limits it: confidence at a distance
# A call can commit token `j + d` early only if the model is sure of it *without* knowing the
# `d - 1` tokens before it. Measure it on held-out text: commit 40 real tokens, append a block of 8
# MASKs, and read the top-1 probability at each distance `d`. For comparison, the AR model's own
# confidence in the very next token on the same text.

# %%
from refimpl import data
from refimpl.train import encode_docs

_, valid_docs = data.kjv_split()
stream = encode_docs(ar.tokenizer, valid_docs[:40], ar.eos_token_id)
windows = torch.stack([stream[i: i + 48] for i in range(0, min(len(stream) - 48, (60 if FAST else 400) * 97), 97)])
by_d = dllm_bench.confidence_by_distance(bdlm, windows, 40, 8)
top_ar = torch.softmax(ar.logits(windows[:, :41].to(DEVICE))[:, 39].double(), -1).max(-1).values
print(f"AR tiny, next token: mean top-1 {top_ar.mean():.2f}, above 0.9 in {(top_ar > 0.9).double().mean():.1%} of positions")
fig, ax = plt.subplots(figsize=(7, 2.8))
d = [r["distance"] for r in by_d]
ax.bar([x - 0.2 for x in d], [r["mean_top1"] for r in by_d], 0.4, label="mean top-1 probability")
ax.bar([x + 0.2 for x in d], [r["top1_correct"] for r in by_d], 0.4, label="top-1 is the true token")
ax.axhline(float(top_ar.mean()), color="k", ls="--", lw=0.8, label="AR tiny, next token")
ax.set_xlabel("distance d from the committed text"); ax.legend(fontsize=8); ax.set_ylim(0, 1)
plt.show()

# %% [markdown]
# The model is unsure even of the next token (it is a 4-M-parameter model of 17th-century English),
# and far more unsure two or more tokens ahead. A block-diffusion model cannot be surer of token
# `j + 2` than an AR model is of token `j + 1`, and `tiny` itself is above 0.9 on well under 1% of
# positions, so a 0.9 threshold almost never fires. Chapter 12's digit-reversal model fires at once
# because its answers are nearly certain. Large adapted models (Fast-dLLM v2 starts from 1.5-7B
# Qwen2.5 models) are confident on long stretches of ordinary text; that is where thresholds pay.

# %% [markdown]
# ## The dLLM as a drafter
# Now the AR model `tiny` is the target and `tiny-bdlm` drafts for it: after the committed text it
# sees a block of `gamma` MASKs, and one call gives a distribution `q_i` for every draft position
# (`q_1` from the clean text: nearly the AR model itself; `q_2, q_3, ...` from MASK slots, knowing only
# the prefix). Drafts are drawn from these marginals; chapter 02's core verifies. Greedy output must
# be exactly AR greedy.

# %%
ar_out = autoregressive.generate(ar, prompts, max_new_tokens=GEN, eos_token_id=[]).tokens
spec = dllm_draft.generate(ar, prompts, dlm=bdlm, gamma=4, max_new_tokens=GEN, eos_token_id=[])
assert spec.tokens == ar_out
print(f"dLLM drafter, gamma 4: == AR greedy | tau {spec.stats.tau:.2f} | target calls {spec.stats.target_calls}"
      f" | drafter calls {spec.stats.draft_calls}")

# %% [markdown]
# Which tokens came from the drafter? In a step that accepted `n` drafts, the first `n` tokens are the
# dLLM's (green, darker the deeper in the block), the last one the target's own (grey).

# %%
from html import escape
from IPython.display import HTML, display

SHADES = ["#d8f3dc", "#b7e4c7", "#95d5b2", "#74c69d", "#52b788", "#40916c", "#2d6a4f", "#1b4332"]


def coloured(gen, row=0):
    html, pos = [], 0
    for step in gen.stats.accepted:
        k = step[row]
        for j in range(k + 1):
            if pos >= len(gen.tokens[row]):
                break
            bg = SHADES[min(j, len(SHADES) - 1)] if j < k else "#eeeeee"
            fg = "white" if j >= 4 and j < k else "black"
            html.append(f'<span style="background:{bg};color:{fg}">{escape(ar.decode([gen.tokens[row][pos]]))}</span>')
            pos += 1
    return "".join(html)


display(HTML(coloured(spec)))

# %% [markdown]
# tau for several block lengths `gamma`, next to chapter 04a's distilled draft `tiny-draft` (an AR
# model, one call per draft token) and chapter 09's prompt lookup (no model at all). The dLLM spends
# **one** call per proposal whatever `gamma` is; a chain draft spends `gamma`. Predict from the
# confidence-at-a-distance chart which draft positions get accepted: the first (nearly the AR
# model's own guess) often, the later ones (marginals that do not know the tokens before them) rarely.

# %%
draft = models.load("tiny-draft", device=DEVICE)
rows = []
for gamma in (2, 4, 8):
    r = dllm_draft.generate(ar, prompts, dlm=bdlm, gamma=gamma, max_new_tokens=GEN, eos_token_id=[])
    rows.append((f"dLLM gamma {gamma}", r.stats.tau, r.stats.draft_calls / r.stats.target_calls))
    assert r.tokens == ar_out
r = speculative.generate(ar, prompts, draft=draft, gamma=4, max_new_tokens=GEN, eos_token_id=[])
rows.append(("tiny-draft gamma 4", r.stats.tau, r.stats.draft_calls / r.stats.target_calls))
r = retrieval.generate(ar, prompts, max_new_tokens=GEN, method="prompt_lookup", eos_token_id=[])
rows.append(("prompt lookup", r.stats.tau, 0.0))
for name, tau, calls in rows:
    print(f"{name:20s} tau {tau:5.2f}   draft calls per target call {calls:4.2f}")
fig, ax = plt.subplots(figsize=(7, 2.6))
ax.barh([n for n, _, _ in rows], [t for _, t, _ in rows], color=["#52b788"] * 3 + ["#8d99ae", "#f4a261"])
ax.set_xlabel("tau (tokens per target call)"); ax.invert_yaxis()
plt.show()

# %% [markdown]
# ## Sampling: drafting from marginals is lossless
# Speculative sampling needs, for each draft token, the distribution `q_i` it was drawn from, and
# `q_i` may depend on anything *before* position `i`. The dLLM's marginal given the prefix is such a
# distribution (it ignores the earlier drafts, which is allowed), so `min(1, p/q)` with the residual
# `norm(max(0, p - q))` gives exactly the target's distribution. What would break it: committing the
# block in confidence order, as a dLLM sampler does, so that a token's `q` depends on a *later* one.
#
# ### Exercise 2: predict the first draft's acceptance
# Write `first_draft_acceptance(p, q)`: the probability that a draft `x ~ q` is accepted under target
# `p` (two `(V,)` probability vectors). The check runs small cases and then compares your prediction
# for the real `p` (the target at temperature 1) and `q` (the drafter's first marginal) with the
# acceptance rate measured over many runs.

# %%
@exercise("14", "first_draft_acceptance")
def first_draft_acceptance(p, q):
    # your code here
    raise NotImplementedError

# %% [markdown]
# The check:

# %%
from refimpl import sampling

prompt = prompts[0]
p_real = sampling.probs(ar.logits(torch.tensor([prompt], device=DEVICE))[0, -1], 1.0)
q_logits = bdlm.logits(torch.tensor([prompt], device=DEVICE))[0, -1]
q_logits[MASK] = float("-inf")
q_real = sampling.probs(q_logits, 1.0)


def check_acceptance():
    e = torch.eye(3, device=DEVICE)                    # distributions where the models' live
    assert abs(first_draft_acceptance(e[0], e[0]) - 1) < 1e-6, "p == q: every draft is accepted"
    assert abs(first_draft_acceptance(e[0], e[1])) < 1e-6, "disjoint p and q: no draft is accepted"
    got = first_draft_acceptance(torch.tensor([0.5, 0.5, 0.0], device=DEVICE), torch.tensor([0.0, 0.5, 0.5], device=DEVICE))
    assert abs(got - 0.5) < 1e-6, f"p = (.5, .5, 0), q = (0, .5, .5): got {got}, expected 0.5"
    pred = first_draft_acceptance(p_real, q_real)
    with kernels.references():                          # (torch references on a CPU: see chapter 06a)
        g = dllm_draft.generate(ar, [prompt] * SAMPLES, dlm=bdlm, gamma=1, max_new_tokens=2, temperature=1.0,
                                generator=torch.Generator(device=DEVICE).manual_seed(SEED), eos_token_id=[])
    rate = sum(g.stats.accepted[0]) / SAMPLES            # drafts accepted at the first step, over the rows
    sd = (pred * (1 - pred) / SAMPLES) ** 0.5
    assert abs(rate - pred) < 4 * sd + 1e-3, f"you predicted {pred:.3f}, {SAMPLES} runs accepted {rate:.3f}"
    print(f"predicted {pred:.3f}, measured {rate:.3f} over {SAMPLES} runs")


check("Exercise 2", check_acceptance)
if SHOW_SOLUTIONS:
    show("14", "first_draft_acceptance")

# %% [markdown]
# And the full check, as in chapter 03: the first two sampled tokens (top-3, temperature 1, so 9
# possible pairs) against the target's exact joint distribution, with gamma 2 so the second token
# is usually a dLLM draft. A rule that accepts every draft is the negative control.

# %%
from scipy.stats import chisquare

TOPK = 3
p1 = sampling.probs(ar.logits(torch.tensor([prompt], device=DEVICE))[0, -1], 1.0, TOPK)
firsts = p1.nonzero()[:, 0].tolist()
p2 = sampling.probs(ar.logits(torch.tensor([prompt + [a] for a in firsts], device=DEVICE))[:, -1], 1.0, TOPK)
exact = {(a, c): float(p1[a] * p2[i, c]) for i, a in enumerate(firsts) for c in p2[i].nonzero()[:, 0].tolist()}


def accept_all(x, p, q, u, valid):                          # WRONG on purpose: keep every draft
    return valid.clone(), sampling.sample_from_probs(p[torch.arange(len(valid), device=valid.device), valid])


def pair_pvalue(rule=None):
    g = speculative.decode(ar, dllm_draft.DiffusionDraft(bdlm, 2, 1, ar), [prompt] * SAMPLES, max_new_tokens=2,
                           temperature=1.0, top_k=TOPK, generator=torch.Generator(device=DEVICE).manual_seed(SEED + 1),
                           eos_token_id=[], rule=rule)
    pairs = [tuple(t[:2]) for t in g.tokens]
    if not set(pairs) <= set(exact):
        return 0.0                                          # a pair the target can never emit
    obs = [pairs.count(k) for k in exact]
    total = sum(exact.values())                             # 1 up to float rounding
    return chisquare(obs, [exact[k] * SAMPLES / total for k in exact]).pvalue


with kernels.references():   # the kernels' torch references on a CPU: the interpreter is slow for 600 rows
    pv_good, pv_bad = pair_pvalue(), pair_pvalue(accept_all)
print(f"lossless rule: p-value {pv_good:.3f} | accept every draft: p-value {pv_bad:.1e}")
assert pv_good > 1e-3 and pv_bad < 1e-3

# %% [markdown]
# ## Lossless dLLM decoding: draft the next steps, verify them at once
# Back to the dLLM alone, decoding one token per step (chapter 11's greedy low-confidence schedule).
# Each step costs a call, and the call's predictions usually barely change when one more token is
# committed. FreeDave exploits that: from the current state `S` and its predictions `L(S)`,
#
# 1. `D_1 = step(S, L(S))` is the true next state; **guess** `D_2, ..., D_K` by applying the same step
#    again and again with the *same* predictions `L(S)`;
# 2. score `D_1..D_K` in **one batched call**, giving `L(D_1), ..., L(D_K)`;
# 3. `D_{i+1}` was a correct guess when `step(D_i, L(D_i)) == D_{i+1}`; keep the deepest `D_m` reached
#    by correct guesses only. Its predictions `L(D_m)` are already in hand for the next round.
#
# Every accepted state is one the step-by-step sampler would have reached, so the output is
# identical; a round costs one (batched) call and advances `m` steps.
#
# ### Exercise 3: the guesses
# Write `guesses(x, logits, k, K, mask_id)`: `x` (T,) the current tokens (MASK where undecided),
# `logits` (T, V) the predictions for them. Return the list `[D_1, ..., D_K]` (stop early when no
# MASK is left): each `D` commits, among the positions still masked, the `k` with the highest
# probability of their argmax token (MASK itself is never predicted; ties go to the earlier
# position), always from the same `logits`.

# %%
@exercise("14", "guesses")
def guesses(x, logits, k, K, mask_id):
    # your code here
    raise NotImplementedError

# %% [markdown]
# The check compares `D_1` with one step of the library's sampler and the chain with a sampler run
# whose predictions are frozen (a model that always returns the same logits).

# %%
rev = models.load("tiny-dllm-rev", device=DEVICE)


class Frozen:                                      # a "model" whose predictions never change
    mask_token_id, eos_token_id, pad_token_id, max_length = MASK, None, 1, 512

    def __init__(self, logits):
        self.fixed, self.device = logits, logits.device     # generate builds its ids on the model's device

    def logits(self, ids):
        return self.fixed[None].expand(ids.shape[0], -1, -1).clone()


def check_guesses():
    prompt = prompts[1][:12]
    x = torch.tensor(prompt + [MASK] * 8, device=DEVICE)
    lg = dlm.logits(x[None])[0]
    for k in (1, 2, 3):
        got = guesses(x, lg, k, 20, MASK)
        assert len(got) == -(-8 // k), f"k = {k}: {len(got)} guesses, expected {-(-8 // k)} (stop when nothing is masked)"
        for i, D in enumerate(got, 1):
            n = int((D[12:] != MASK).sum())
            assert n == min(i * k, 8), f"k = {k}: D_{i} has {n} tokens, expected {min(i * k, 8)}"
            assert torch.equal(D[:12], x[:12]), "the prompt must not change"
        frozen = diffusion.generate(Frozen(lg), [prompt], gen_length=8, steps=-(-8 // k), block_length=8,
                                    eos_token_id=[], use_kernel=False)
        assert got[-1][12:].tolist() == frozen.tokens[0], f"k = {k}: the last guess differs from the frozen sampler's output"


check("Exercise 3", check_guesses)
if SHOW_SOLUTIONS:
    show("14", "guesses")

# %% [markdown]
# Now the whole loop by hand, on digit reversal (confident, so guesses survive) and on King James
# text, against the library's `diffusion.generate(..., draft_steps=K)` and against plain step-by-step
# decoding. The tokens must be identical; the calls drop. (Until Exercise 3 is solved, the library's
# run alone is shown.)

# %%
from refimpl import digit_reversal


def freedave_by_hand(model, prompt, gen, K):
    x = torch.tensor(prompt + [MASK] * gen, device=DEVICE)
    lg, calls, advanced = model.logits(x[None])[0], 1, []
    while bool((x == MASK).any()):
        drafts = guesses(x, lg, 1, K, MASK)                 # D_1 is exact, D_2.. are guesses
        scored = model.logits(torch.stack(drafts))          # ONE batched call
        calls += 1
        m = 1
        while m < len(drafts) and torch.equal(guesses(drafts[m - 1], scored[m - 1], 1, 1, MASK)[0], drafts[m]):
            m += 1                                          # D_{m+1} is what the true step from D_m gives
        x, lg = drafts[m - 1], scored[m - 1]
        advanced.append(m)
    return x[len(prompt):].tolist(), calls, advanced


K = 4
have_guesses = True                                # False once the stub says it is unsolved
for name, model, prompt, gen in [("digit reversal", rev, rev.tokenizer.encode(digit_reversal.synthetic_problem("314159")[0]), 8),
                                 ("King James", dlm, prompts[0][:24], 16)]:
    kw = dict(gen_length=gen, steps=gen, block_length=gen, eos_token_id=[], use_kernel=False)  # float64 selection, like ours
    base = diffusion.generate(model, [prompt], **kw)
    lib = diffusion.generate(model, [prompt], draft_steps=K, **kw)
    assert base.tokens[0] == lib.tokens[0], name
    by_hand = "by hand: write guesses (Exercise 3) first"
    if have_guesses:
        try:
            toks, calls, advanced = freedave_by_hand(model, prompt, gen, K)
            assert toks == base.tokens[0], name
            by_hand = f"{calls} calls by hand, steps advanced per call: {advanced}"
        except NotImplementedError:
            have_guesses = False
    print(f"{name:15s} step by step: {base.stats.nfe} calls | draft-and-verify (K={K}): {lib.stats.nfe} calls in "
          f"the library, {by_hand}")

# %% [markdown]
# The saving depends on how stable the predictions are: on digit reversal every position is
# predicted with near certainty from the start, so guesses survive and a call advances up to `K`
# steps; on text, committing a token changes its neighbours' predictions and guesses die sooner.
# The batched call is not free: it scores `K` sequences (on a GPU almost free, on this CPU roughly
# `K` times the work); `python -m refimpl.bench --suite dllm` measures both the calls and the time.
#
# ## Play: threshold and block length
# Block-diffusion decoding of one prompt; each token is coloured by the call that committed it and
# carries its number (tokens sharing a colour were committed together; every call has its own colour). Move the threshold down and watch the number
# of calls fall and, at some point, the text degrade.

# %%
import ipywidgets as widgets
from figures import tokens_by_call


def render(prompt_index=0, threshold=0.9, block=BLOCK):
    toks, steps = decode_by_hand(prompts[prompt_index], threshold, GEN, block)
    call_of = {p: r for r, pos in enumerate(steps) for p in pos}
    spans = tokens_by_call([ar.decode([t]) for t in toks], [call_of[p] for p in range(len(toks))])
    return f"<b>{len(steps)} calls for {GEN} tokens</b> (threshold {threshold:.2f}, blocks of {block})<br>" + spans


def play(prompt_index=0, threshold=0.9, block=BLOCK):
    global shown
    shown = render(prompt_index, threshold, block)
    display(HTML(shown))


ui = widgets.interact(play, prompt_index=widgets.IntSlider(continuous_update=False, value=0, min=0, max=len(prompts) - 1),
                      threshold=widgets.FloatSlider(continuous_update=False, value=0.9, min=0.05, max=1.0, step=0.05),
                      block=widgets.Dropdown(options=[4, 8, 16, 32], value=BLOCK)).widget

# %% jupyter={"source_hidden": true} tags=["ci-only", "remove-input"]
# CI's self-test of the widget above (collapsed in the lab): move a control as a person would,
# check that the output changed, then put the control back to its teaching default
default = ui.children[1].value
before = shown
ui.children[1].value = 0.05                        # move the threshold slider, as a person would
assert shown != before, "moving a control must change the output"
ui.children[1].value = default

# %% [markdown]
# ## Summary
# - An AR model becomes a block-diffusion LM with a short fine-tune: blocks attend causally to the
#   past and bidirectionally inside, the AR shift stays, the clean stream stays an AR model. Committed
#   blocks are processed causally, so their keys/values are final and the block cache is exact.
# - Adapted from a real AR model, the dLLM writes far better text than chapter 10's model trained
#   from scratch at every number of calls. But a threshold only saves calls where the model is sure
#   of tokens it cannot see yet; ours is not (confidence at a distance), so on this text the saving
#   has to be bought with quality (k per step, low thresholds).
# - A dLLM is a natural drafter: one call proposes a whole block, and drafting each token from its
#   marginal given the prefix keeps speculative sampling exactly lossless.
#   `dllm_draft.generate(target, prompts, dlm=...)` runs `dllm_draft.PRESETS["cpu"]` (4 drafts from
#   one denoising step).
# - Draft-and-verify makes dLLM decoding itself faster at zero quality cost: guess the next steps
#   from the current predictions, check them in one batched call, keep the correct run.
# - The benchmark (`python -m refimpl.bench --suite dllm`, and the decode suite on `tiny`) has the
#   calls, tokens per second and quality of each (docs/benchmarks.md).
