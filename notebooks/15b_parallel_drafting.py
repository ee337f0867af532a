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
# # 15b · Parallel drafters: PARD, DFlash, P-EAGLE
#
# Every drafter so far spends one forward per draft token: a chain of `gamma` drafts costs `gamma`
# draft calls, an EAGLE tree one call per level. The drafters deployed most widely in 2026 fill a
# whole block of draft slots in **one** forward:
#
# - **PARD** ("PARallel Draft", arXiv 2504.18583): an ordinary draft model, adapted to read `k - 1`
#   *mask* tokens after the context and predict the tokens 2, 3, ..., k ahead at the same time;
# - **DFlash** ("DFlash: Block Diffusion for Flash Speculative Decoding", arXiv 2602.06036): a small
#   block-diffusion drafter that reads the *target's own features* at every layer and denoises a block
#   `[root, MASK, ..., MASK]` in one step;
# - **P-EAGLE**: EAGLE-3 (chapter 06b) with parallel depths: mask inputs instead of its own outputs.
#
# The verification is chapter 02-05's, unchanged: greedy output stays AR's, sampling stays lossless.
#
# **After this chapter you can**
#
# 1. measure what a forward over `k` positions costs against one position on your machine, and say why a parallel drafter's cost per step stops growing with the block;
# 2. write the attention pattern of PARD's training copies and of a DFlash block call, and check them against the library;
# 3. explain why drafting each slot from its own distribution keeps speculative sampling lossless;
# 4. fill the cost model (tau, draft cost, verify cost) with measured numbers and predict which drafter wins where.

# %% [markdown]
# ## Parameters

# %%
import torch
from refimpl.models import default_device

FAST = True                        # CI default: few prompts, short generations
DEVICE = default_device()          # a torch.device: CUDA when present, $REFIMPL_DEVICE overrides
NEW_TOKENS = 32 if FAST else 64    # tokens generated per prompt
N_PROMPTS = 3 if FAST else 8
K = 4                              # PARD: drafts per call (the last real token + K - 1 masks)
BLOCK = 8                          # DFlash: the block (the root + BLOCK - 1 drafts)
SAMPLES = 600 if FAST else 3000    # for the losslessness check
SEED = 0
SHOW_SOLUTIONS = False

# %% [markdown]
# ## The models
# `tiny` is the target. `tiny-draft` is chapter 04a's 1-layer chain draft; `tiny-pard` is the same
# draft after a short PARD adaptation (`python -m refimpl.train tiny-pard`); `dflash-tiny` is a
# 1-layer DFlash drafter trained on `tiny`'s own answers (`python -m refimpl.train dflash-tiny`). The
# zoo attaches each to `tiny` by its weights (`refimpl.models.drafters`).

# %%
import time
import matplotlib.pyplot as plt
from refimpl import models, autoregressive, speculative, pard, dflash, primitives
from refimpl.models import drafters
from refimpl.data import kjv_prompts
from solutions import exercise, check, show

lm = models.load("tiny", device=DEVICE)
chain_draft, pard_draft = models.load("tiny-draft", device=DEVICE), models.load("tiny-pard", device=DEVICE)
flash = drafters.load(lm, "dflash")
MASK = pard_draft.config.pard_token            # the mask token PARD was trained with (tiny's MASK, id 2)
prompts = [p[:24] for p in kjv_prompts(lm.tokenizer, N_PROMPTS)]   # held-out King James openings
ar = autoregressive.generate(lm, prompts, max_new_tokens=NEW_TOKENS, eos_token_id=[])
print(f"{len(prompts)} prompts | PARD's mask token {MASK} ({lm.decode([MASK])!r}) | DFlash reads target layers "
      f"{flash.taps}, block {flash.block}, {len(flash.layers)} layer(s)")

# %% [markdown]
# ## One forward over k positions
# On a memory-bound machine a forward reads every weight once, whatever the number of positions it
# scores, until the arithmetic catches up (chapter 00). A chain draft pays one forward per draft
# token; a parallel drafter pays one. Time the chain draft's forward over `k` new positions after a
# 64-token context, here, now (medians of a few runs: the numbers are this machine's):

# %%
def forward_ms(model, k, context=64, repeats=5):
    ids = torch.arange(3, 3 + context, device=DEVICE)[None] % model.vocab_size
    _, cache = model.forward(ids)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        model.forward(ids[:, :k] * 0 + 5, cache)
        times.append(time.perf_counter() - t0)
        model.crop(cache, context)
    return 1e3 * sorted(times)[len(times) // 2]


ks = [1, 2, 4, 8, 16]
cost = {k: forward_ms(chain_draft, k) for k in ks}
print({k: f"{ms:.2f} ms" for k, ms in cost.items()})

# %% [markdown]
# The same numbers as a picture, against what `k` separate one-position calls would cost:

# %%
fig, ax = plt.subplots(figsize=(6, 3))
ax.plot(ks, [cost[k] / cost[1] for k in ks], "o-", label="one forward over k positions (parallel)")
ax.plot(ks, ks, "--", color="grey", label="k forwards of 1 position (a chain)")
ax.set_xlabel("draft tokens k"); ax.set_ylabel("cost / one position"); ax.set_xscale("log", base=2)
ax.legend(fontsize=8); ax.set_title("the draft's cost of k tokens on this machine", fontsize=10)
plt.show()

# %% [markdown]
# The gap between the two curves is what a parallel drafter saves per step: `k` sequential calls
# against one call over `k` positions. (On a GPU the solid line stays flat far longer; on a small CPU
# model each call also pays a fixed overhead, which only the one-call drafter avoids `k - 1` times.)
#
# ## PARD: mask tokens as slots for future tokens
# Feed the context, then `K - 1` mask tokens. The last real token's logits give the next token; the
# mask at position `last + j` gives the token `j + 1` ahead. By hand, one call:

# %%
ctx = prompts[0]
inp = torch.tensor([ctx + [MASK] * (K - 1)], device=DEVICE)
logits = pard_draft.logits(inp)[0, -K:]                          # (K, V): one forward, K distributions
by_hand = logits.argmax(-1).tolist()
print("PARD's block:", [lm.decode([t]) for t in by_hand], "| AR says:", [lm.decode([t]) for t in ar.tokens[0][:K]])

# %% [markdown]
# The library's proposer does exactly this, with a KV cache of the committed tokens (the masks' keys
# are dropped after each call) and a ragged batch. Its first proposal is our block:

# %%
prop = pard.PardProposer(pard_draft, mask_id=MASK, k=K, topk=1, total=K, target=lm)
prop.start(torch.tensor([ctx], device=DEVICE), None, speculative.Sampling())
assert prop.propose([NEW_TOKENS]).tokens[0].tolist() == by_hand
g = pard.generate(lm, prompts, draft=pard_draft, k=K, max_new_tokens=NEW_TOKENS, eos_token_id=[])
assert g.tokens == ar.tokens, "PARD must give exactly AR's tokens"
print(f"PARD: tau {g.stats.tau:.2f} tokens per target call, {g.stats.draft_calls} draft calls for "
      f"{g.stats.target_calls} target calls")

# %% [markdown]
# ## Training the slots: K copies of every sequence
# PARD adapts a draft by showing it `k` copies of each training sequence: copy 0 is the text (the usual
# next-token targets), copy `j` holds masks. The mask in copy `j` at position `p` must see what slot `j`
# sees while drafting: the real tokens up to its anchor `p - j`, the masks of its own chain before it,
# and itself. It predicts token `p + 1`. *Conditional drop-token* sampling keeps only a shrinking share
# of each deeper copy (a mask only if its chain predecessor was kept), about 3x cheaper training.
#
# ### Exercise 1: the copies' attention
# Write `pard_allow(T, k)` -> a bool tensor `(k T, k T)` over the items in copy order (copy 0's `T`
# positions, then copy 1's, ...), `True` = may attend, every position of every copy kept. The check
# compares it with `pard.training_layout`.

# %%
@exercise("15b", "pard_allow")
def pard_allow(T, k):
    # your code here
    raise NotImplementedError

# %% [markdown]
# The check:

# %%
def check_pard_allow():
    for T, k in [(6, 2), (9, 4), (5, 5)]:
        got = torch.as_tensor(pard_allow(T, k), dtype=torch.bool, device="cpu")
        slot, pos, allow = pard.training_layout(torch.zeros(1, T, dtype=torch.long, device="cpu"), k)
        keep = slot * T + pos                                         # the layout keeps the masks with an anchor
        assert tuple(got.shape) == (k * T, k * T), f"shape {tuple(got.shape)}, expected {(k * T, k * T)}"
        mine = got[keep][:, keep]
        item = lambda i: f"(copy {int(slot[i])}, position {int(pos[i])})"  # noqa: E731
        for wrong, what in ((mine & ~allow, "may see {} but must not: it would read what it predicts"),
                            (~mine & allow, "must see {} but does not: it would miss its context")):
            bad = wrong.nonzero()
            assert not len(bad), f"T={T}, k={k}: item {item(bad[0, 0])} " + what.format(item(bad[0, 1]))


check("Exercise 1", check_pard_allow)
if SHOW_SOLUTIONS:
    show("15b", "pard_allow")

# %% [markdown]
# ## Picture: what each copy sees
# Rows: the items (copy, position) of a 6-token sequence with 3 copies; columns: the items they may
# attend to. Copy 0 is the usual causal triangle; each mask sees the context up to its anchor (the
# staircase to the left) and its own chain of masks (the diagonals).

# %%
T6, k3 = 6, 3
slot, pos, allow = pard.training_layout(torch.zeros(1, T6, dtype=torch.long, device="cpu"), k3)
labels = [f"{'x' if s == 0 else 'm' + str(s)}@{p}" for s, p in zip(slot.tolist(), pos.tolist())]
fig, ax = plt.subplots(figsize=(5.5, 5.5))
ax.imshow(allow.float().tolist(), cmap="Greens")
ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=7); ax.set_yticks(range(len(labels)), labels, fontsize=7)
ax.set_title("PARD training: who attends to whom (x = real token, m j = mask of depth j)", fontsize=9)
plt.tight_layout(); plt.show()

# %% [markdown]
# ## DFlash: a block drafter that reads the target
# A chain draft sees only tokens. EAGLE (chapter 06) reads the target's features at the input. DFlash
# reads the residual streams of a few target layers at every committed token, fuses them
# (`ctx = norm(fc([h_1; ...; h_m]))`), and injects the result as extra **keys and values in every draft
# layer**. The block `[root, MASK, ..., MASK]` (the root is the next token the target will verify)
# attends to that context and to itself without a causal mask, and one forward denoises it: slot `i`
# predicts the token `i` after the root. The target's embedding and LM head are shared.
#
# The target's verification call returns the streams DFlash reads (`output_hidden_states=taps`), so
# the context costs no extra target pass. Here is one DFlash layer written out (Qwen3's layer, with the
# context as extra keys and values): the block's queries; keys and values over `[context; block]`, the
# context's fused features as they are and the block's stream normed; rotary positions for both; no mask.

# %%
from refimpl.primitives import rope_tables, rotate


def dflash_layer(layer, x, ctx_feats, cos, sin):   # x (1, Q, H) the block's stream, ctx_feats (1, C, H) the context
    Q, C, d, rep = x.shape[1], ctx_feats.shape[1], layer.d, layer.heads // layer.kv_heads
    h = layer.input_norm(x)
    q = layer.q_norm(layer.q_proj(h).view(1, Q, layer.heads, d)).transpose(1, 2)             # (1, heads, Q, d)
    kv = torch.cat([ctx_feats, h], 1)                                                         # (1, C + Q, H)
    k = layer.k_norm(layer.k_proj(kv).view(1, C + Q, layer.kv_heads, d)).transpose(1, 2)      # (1, kv heads, C + Q, d)
    v = layer.v_proj(kv).view(1, C + Q, layer.kv_heads, d).transpose(1, 2)
    q, k = rotate(q, cos[:, :, C:], sin[:, :, C:]), rotate(k, cos, sin)                       # the block after the context
    w = torch.softmax(q @ k.repeat_interleave(rep, 1).transpose(-1, -2) / d ** 0.5, -1)       # (1, heads, Q, C + Q): all see all
    x = x + layer.o_proj((w @ v.repeat_interleave(rep, 1)).transpose(1, 2).reshape(1, Q, -1))
    h = layer.post_norm(x)
    return x + layer.down(torch.nn.functional.silu(layer.gate(h)) * layer.up(h))

# %% [markdown]
# One drafter call by hand, from the prompt's features: fuse the tapped streams, embed the block with the
# target's embedding, run the layers, read the slots with the target's head. The library's
# `DFlashDraft.step` must give the same outputs:

# %%
_, _, feats = lm.forward(torch.tensor([ctx], device=DEVICE), output_hidden_states=flash.taps)  # (1, L, m H)
n = len(ctx) - 1                                                  # the root: the prompt's last token
blk = torch.tensor([[ctx[-1]] + [flash.mask_id] * (BLOCK - 1)], device=DEVICE)
positions = torch.arange(n + BLOCK, device=DEVICE)[None]          # context 0..n-1, then the block
with torch.no_grad():
    fused = flash.hidden_norm(flash.fc(feats[:, :n]))             # (1, n, H): ctx = norm(fc([h_1; ...; h_m]))
    cos, sin = rope_tables(positions, flash.head_dim, flash.rope_theta, torch.float32)
    x = flash.embed[blk]                                          # (1, BLOCK, H) the target's embedding
    for layer in flash.layers:
        x = dflash_layer(layer, x, fused, cos, sin)
    mine = flash.norm(x)
    lib, _ = flash.step(blk, flash.context(feats[:, :n]), positions, torch.ones(1, BLOCK, n + BLOCK, dtype=torch.bool, device=DEVICE))
assert torch.allclose(mine, lib, atol=1e-5), "the layer by hand must equal dflash.DFlashDraft.step"
drafts = flash.full(flash.logits(mine[0, 1:]).argmax(-1)).tolist()
print("DFlash's block, by hand == the library's:", [lm.decode([t]) for t in drafts])

# %% [markdown]
# ## Picture: one DFlash call
# Keys: the context's features (one per committed token, from the target) and the block; queries: the
# block. Every block slot sees the whole context and the whole block (no causal mask among the slots);
# nothing attends to the future context, because there is none at decode time. In training, every
# anchor's block sees only the context strictly before its anchor.

# %%
n_show = 10
grid = torch.zeros(BLOCK, n_show + BLOCK, device="cpu")
grid[:, :n_show], grid[:, n_show:] = 1.0, 2.0
fig, ax = plt.subplots(figsize=(8, 2.6))
ax.imshow(grid.tolist(), cmap="Blues", vmin=0, vmax=2.4, aspect="auto")
ax.axvline(n_show - 0.5, color="k", lw=1)
ax.set_xticks(range(n_show + BLOCK), [f"f{t}" for t in range(n_show)] + ["root"] + [f"m{i}" for i in range(1, BLOCK)],
              fontsize=7, rotation=90)
ax.set_yticks(range(BLOCK), ["root"] + [f"m{i}" for i in range(1, BLOCK)], fontsize=7)
ax.set_title("DFlash: the block (rows) attends to the target's context features and to itself", fontsize=9)
plt.tight_layout(); plt.show()

# %% [markdown]
# ### Exercise 2: the mask of a training batch
# In training, all anchors of a sequence are drafted in one forward. Write `dflash_allow(T, anchors, g)`
# -> bool `(N g, T + N g)` for `N = len(anchors)` blocks of `g` slots after a `T`-token context: block
# `n`'s slots see the context positions strictly before `anchors[n]` and the `g` slots of their own
# block, nothing else. The check reads your mask, then trains nothing but compares two losses on a
# King James sequence: `dflash.block_loss` and the same loss computed with your mask (the helper below).

# %%
@exercise("15b", "dflash_allow")
def dflash_allow(T, anchors, g):
    # your code here
    raise NotImplementedError

# %% [markdown]
# The helper: DFlash's training loss (module doc of `refimpl.dflash`) computed with a mask you give, for
# one sequence `tok` (1, T) with its target features `feats` and blocks of `g` positions at `anchors`:

# %%
def block_loss_with(allow, tok, feats, anchors, g, decay=7.0):
    T, N, a = tok.shape[1], len(anchors), torch.tensor(anchors, device=DEVICE)
    blk = torch.full((N, g), flash.mask_id, device=DEVICE)
    blk[:, 0] = tok[0, a]                                                  # each block's root: its anchor's token
    pos = torch.cat([torch.arange(T, device=DEVICE), (a[:, None] + torch.arange(g, device=DEVICE)).reshape(-1)])[None]
    out, _ = flash.step(blk.reshape(1, -1), flash.context(feats), pos, allow.to(DEVICE)[None])
    logits = flash.logits(out.view(N, g, -1)[:, 1:]).float()              # (N, g - 1, V) the mask slots
    at = a[:, None] + torch.arange(1, g, device=DEVICE)                   # (N, g - 1) the positions they predict
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tok[0, at.clamp(max=T - 1)].reshape(-1),
                                           reduction="none").view(N, g - 1)
    w = torch.exp(-torch.arange(g - 1, device=DEVICE) / decay) * (at < T)  # later slots weigh less; past T: no target
    return (ce * w).sum() / w.sum()

# %% [markdown]
# The check:

# %%
def check_dflash_allow():
    for T, anchors, g in [(12, [2, 7], 4), (9, [0, 3, 5], 3), (6, [4], 2)]:
        got = torch.as_tensor(dflash_allow(T, anchors, g), dtype=torch.bool, device="cpu")
        N = len(anchors)
        assert tuple(got.shape) == (N * g, T + N * g), f"shape {tuple(got.shape)}, expected {(N * g, T + N * g)}"
        for n, a in enumerate(anchors):
            rows = got[n * g:(n + 1) * g]
            assert rows[:, :a].all() and not rows[:, a:T].any(), f"block {n} (anchor {a}): the context it sees is wrong"
            own = rows[:, T + n * g:T + (n + 1) * g]
            others = torch.cat([rows[:, T:T + n * g], rows[:, T + (n + 1) * g:]], 1)
            assert own.all() and not others.any(), f"block {n}: it must see all of its own slots and no other block"
    assert flash.kept is None, "this drafter's head scores every token (the helper maps no kept subset)"
    tok, anchors = torch.tensor([ctx[:16]], device=DEVICE), [3, 9]
    with torch.no_grad():
        feats = lm.forward(tok, output_hidden_states=flash.taps)[2]
        yours = block_loss_with(torch.as_tensor(dflash_allow(16, anchors, BLOCK), dtype=torch.bool, device=DEVICE),
                                tok, feats, anchors, BLOCK)
        lib = dflash.block_loss(flash, tok, feats, torch.tensor([anchors], device=DEVICE))[0]
    assert torch.allclose(yours, lib, atol=1e-5), f"the loss with your mask is {yours:.4f}, dflash.block_loss's {lib:.4f}"


check("Exercise 2", check_dflash_allow)
if SHOW_SOLUTIONS:
    show("15b", "dflash_allow")

# %% [markdown]
# ## DFlash on the verification core
# The library's proposer keeps the context's keys and values in the drafter's cache (each step adds the
# features of the tokens just committed: the root and the accepted drafts), drafts one block a call,
# and works on a ragged batch. Greedy output must be AR's:

# %%
gf = dflash.generate(lm, prompts, draft=flash, block=BLOCK, max_new_tokens=NEW_TOKENS, eos_token_id=[])
assert gf.tokens == ar.tokens, "DFlash must give exactly AR's tokens"
print(f"DFlash: tau {gf.stats.tau:.2f}, {gf.stats.draft_calls} draft calls for {gf.stats.target_calls} target calls")

# %% [markdown]
# ## Sampling: every slot from its own distribution
# A parallel drafter's slot `j` does not see the tokens drafted at slots before it: it gives a
# distribution `q_j` over the token `j` ahead given the committed text alone. Draw `x_j ~ q_j`, verify
# with chapter 03's rule `min(1, p_j(x_j) / q_j(x_j))` and the residual: speculative sampling never
# needs `q` to depend on the earlier drafts, only that `x_j` was drawn from it, so the output is
# distributed exactly as the target's. The price is acceptance: a sequential draft draws token 2 after
# the token 1 it actually drew, while slot 2 is one distribution over every possible token 1, so once
# token 1 is drawn away from the most likely one, slot 2's draw rarely continues it. Sampling costs a
# parallel drafter more tau than it costs a sequential one (the capstone's T = 0.7 rows, chapter 16).
# A chi-square test on the first two tokens, and a wrong rule (the residual drawn from `p`) as its
# negative control:

# %%
import kernels
from collections import Counter
from scipy.stats import chisquare
from refimpl import sampling

prompt = lm.encode("And the LORD spake unto Moses, saying")
p1 = sampling.probs(lm.logits(torch.tensor([prompt], device=DEVICE))[0, -1], 1.0, 4)       # (V,) the first token
firsts = p1.nonzero()[:, 0].tolist()
p2 = sampling.probs(lm.logits(torch.tensor([prompt + [a] for a in firsts], device=DEVICE))[:, -1], 1.0, 4)
exact = {(a, b): float(p1[a] * p2[i, b]) for i, a in enumerate(firsts) for b in p2[i].nonzero()[:, 0].tolist()}


def pvalue(rows, rule=None):                                    # the first two tokens against the exact joint
    seen = Counter(tuple(t[:2]) for t in rows)
    if not set(seen) <= set(exact):
        return 0.0                                              # a pair the target never emits
    big = [k for k in exact if exact[k] * len(rows) >= 5]        # rare pairs pooled into one cell
    obs = [seen[k] for k in big] + [len(rows) - sum(seen[k] for k in big)]
    exp = [exact[k] * len(rows) for k in big] + [len(rows) * (1 - sum(exact[k] for k in big))]
    return chisquare(obs, [e * sum(obs) / sum(exp) for e in exp]).pvalue


def sample_run(rule=None):
    with kernels.references():                                  # the kernels' torch references on a CPU
        return speculative.decode(lm, dflash.DFlashProposer(flash, block=4, topk=1, total=3), [prompt] * SAMPLES, max_new_tokens=3,
                                  temperature=1.0, top_k=4, generator=torch.Generator("cpu").manual_seed(SEED),
                                  eos_token_id=[], rule=rule).tokens


def residual_from_p(x, p, q, u, valid):                         # WRONG: after a rejection, draw from p itself
    from kernels.rejection_sample import rejection_sample
    n, _ = rejection_sample(x, p, q, u, valid)
    rows = torch.arange(len(n), device=x.device)
    return n, rejection_sample(x[:, :0], p[rows, n][:, None], q[:, :0], u[:, -1:])[1]


right, wrong = pvalue(sample_run()), pvalue(sample_run(residual_from_p))
print(f"p-value {right:.3f} with the rule (large: the target's own distribution), {wrong:.2g} with the wrong residual")
assert right > 1e-3 and wrong < 1e-3

# %% [markdown]
# ## Play: the block size
# DFlash on one prompt with blocks of 2 to 16: the text (each step's accepted run in its own colour),
# tokens per target call, draft calls. A longer block offers more drafts for the same one call; the
# later slots are guessed from further away, so they are accepted less often.

# %%
import ipywidgets as widgets
from html import escape
from IPython.display import HTML, display

COLOURS = ["#b7e4c7", "#d7c6f5", "#ffe5b4", "#c6e2ff"]


def render(block=BLOCK, prompt_index=0):
    g = dflash.generate(lm, [prompts[prompt_index]], draft=flash, block=block, max_new_tokens=NEW_TOKENS, eos_token_id=[])
    toks, spans, i = g.tokens[0], [], 0
    for s, step in enumerate(g.stats.accepted):
        n = min(step[0] + 1, len(toks) - i)                       # the accepted drafts + the target's token
        spans.append(f'<span style="background:{COLOURS[s % 4]}">{escape(lm.decode(toks[i:i + n]))}</span>')
        i += n
    pooled = f" (all {len(prompts)} prompts together, the run above: tau {gf.stats.tau:.2f})" if block == BLOCK else ""
    return (f"<b>block {block}, prompt {prompt_index} alone: tau {g.stats.tau:.2f} tokens per target call, "
            f"{g.stats.draft_calls} draft calls</b>{pooled}<br>" + "".join(spans))


def play(block=BLOCK, prompt_index=0):
    global shown
    shown = render(block, prompt_index)
    display(HTML(shown))


ui = widgets.interact(play, block=widgets.IntSlider(continuous_update=False, value=BLOCK, min=2, max=16),
                      prompt_index=widgets.IntSlider(continuous_update=False, value=0, min=0, max=len(prompts) - 1,
                                                    description="prompt")).widget

# %% jupyter={"source_hidden": true} tags=["ci-only", "remove-input"]
# CI's self-test of the widget above (collapsed in the lab): move a control as a person would,
# check that the output changed, then put the control back to its teaching default
default = ui.children[0].value
before = shown
ui.children[0].value = 2                           # move the block slider, as a person would
assert shown != before, "moving a control must change the output"
ui.children[0].value = default

# %% [markdown]
# ## P-EAGLE: EAGLE-3 with parallel depths
# EAGLE-3's draft (chapter 06b) predicts depth `d + 1` from its own output at depth `d`: one draft call
# per level. P-EAGLE gives it mask inputs instead: from each anchor the draft reads the target's fused
# features, then `k - 1` mask slots, and predicts `k` future tokens in one forward, trained with PARD's
# conditional drop-token sampling. It is PARD's idea on EAGLE-3's feature-reading draft; vLLM serves it
# as `method="eagle3"` with `parallel_drafting`. (This course builds PARD and DFlash; P-EAGLE needs no
# new mechanism beyond their two.)
#
# ## The cost model, measured
# Speed-up over AR = tau / (step cost in AR steps), and a step costs one target verification of the
# drafts plus the drafter's calls. Measure both on these prompts: tau from the runs above, the step cost
# from wall time (medians of three interleaved rounds on this machine, now; `python -m refimpl.bench` is
# the benchmark).

# %%
def timed(runs, repeats=3):
    """{name: (its Generation, median seconds)}: every run once to warm up, then ``repeats`` rounds, the
    runs interleaved within a round (a slower moment of the machine hits them all)."""
    out = {name: (fn(), []) for name, fn in runs.items()}
    for _ in range(repeats):
        for name, fn in runs.items():
            t0 = time.perf_counter(); fn(); out[name][1].append(time.perf_counter() - t0)
    return {name: (g, sorted(ts)[len(ts) // 2]) for name, (g, ts) in out.items()}


runs = {"AR": lambda: autoregressive.generate(lm, prompts, max_new_tokens=NEW_TOKENS, eos_token_id=[]),
        f"chain draft (gamma {K})": lambda: speculative.generate(lm, prompts, draft=chain_draft, gamma=K,
                                                                 max_new_tokens=NEW_TOKENS, eos_token_id=[]),
        f"PARD (k {K})": lambda: pard.generate(lm, prompts, draft=pard_draft, k=K, max_new_tokens=NEW_TOKENS, eos_token_id=[]),
        f"DFlash (block {BLOCK})": lambda: dflash.generate(lm, prompts, draft=flash, block=BLOCK,
                                                           max_new_tokens=NEW_TOKENS, eos_token_id=[])}
with kernels.references():
    measured = timed(runs)
ar_step = measured["AR"][1] / measured["AR"][0].stats.target_calls
for name, (g, s) in measured.items():
    steps = g.stats.target_calls
    print(f"{name:22s} tau {g.stats.tau:4.2f} | draft calls / step {g.stats.draft_calls / steps:4.2f} | "
          f"step cost {s / steps / ar_step:4.2f} AR steps | speed-up {measured['AR'][1] / s:4.2f}x")

# %% [markdown]
# Read the table as `speed-up = tau / step cost`. The chain draft pays `gamma` draft calls a step; PARD
# and DFlash pay one. One call is not one AR step, though: read their step costs above, several AR steps
# each. A step is the target's verification of the whole block (the root and every draft, one forward
# over more positions than AR's one) plus the drafter's call, and the calls differ: PARD's is a small
# causal LM over the new tokens and its mask slots; DFlash's runs its layers over the context features
# committed since its last call and the block, then the target's full LM head over every slot, so its one
# call can cost more than PARD's. DFlash's drafts read the target's features, which is where its tau
# comes from. On SmolLM2 (`python -m refimpl.bench --suite capstone`) the verification of a longer block
# costs more still (chapter 04c), and the best block is shorter than on a GPU, where scoring 16 tokens
# costs about one. The zoo's SmolLM2 drafters were trained on a 2-core CPU: the DFlash drafter on SmolLM2's
# answers to 10,806 prompts (64 minutes to generate, about 46 to compute their features, 40 of training), the PARD
# draft adapted in 40 minutes on 5,627 of them. On 30 prompts neither saw, their greedy chains reach tau 1.67
# (DFlash) and 1.75 (PARD), against EAGLE-3's 2.14 and 2.63 for PARD's own start drafting one token a call:
# too few accepted drafts to pay for a long block here.
# DFlash's `"cpu"` preset therefore drafts only the slots whose held-out acceptance pays for verifying
# them (`dflash.cpu_block`: blocks of 3 for this drafter, 8 for `tiny`'s): its step falls from about 1.7
# AR steps at a block of 8 to about 1.3, and its speed to about AR's. The papers train on GPUs with far more data and report up to 6.2 times AR's speed
# for DFlash (Qwen3-8B) and 4.08 times for PARD (LLaMA3.1-8B); a step costs at least one AR step, so their
# tau there is at least as high. docs/models.md has each drafter's numbers and the recipe for a GPU.
#
# ### Exercise 3: predict the speed-up
# Write `predicted_speedup(accept, draft_cost, verify_cost)`: `accept[d]` is the probability that the
# first `d + 1` drafts of a chain are all accepted (so `tau = 1 + sum(accept)`), `draft_cost` the
# drafter's cost per step and `verify_cost` the verification's, both in AR steps. The check compares
# your prediction for DFlash with the measured row.

# %%
@exercise("15b", "predicted_speedup")
def predicted_speedup(accept, draft_cost, verify_cost):
    # your code here
    raise NotImplementedError

# %% [markdown]
# The check:

# %%
def check_predicted_speedup():
    assert abs(predicted_speedup([0.5, 0.25], 0.5, 1.0) - 1.75 / 1.5) < 1e-9, "tau = 1 + 0.5 + 0.25, cost = 0.5 + 1.0"
    assert abs(predicted_speedup([], 0.0, 1.0) - 1.0) < 1e-9, "no drafts, one verification: AR"
    g, s = measured[f"DFlash (block {BLOCK})"]
    n = [k for step in g.stats.accepted[1:] for k in step]         # accepted drafts per row and step (after the prefill)
    accept = [sum(k > d for k in n) / len(n) for d in range(BLOCK - 1)]  # P(the first d + 1 drafts all accepted)
    cost = s / g.stats.target_calls / ar_step                       # draft + verification, in AR steps
    got, want = predicted_speedup(accept, 0.0, cost), measured["AR"][1] / s
    assert abs(got - want) < 0.3 * want, f"predicted {got:.2f}x from the measured acceptance, measured {want:.2f}x"


check("Exercise 3", check_predicted_speedup)
if SHOW_SOLUTIONS:
    show("15b", "predicted_speedup")

# %% [markdown]
# ## Summary
# - On a memory-bound machine a forward over `k` positions costs about one over 1: a parallel drafter
#   fills a block in one call, so its cost per step stops growing with the block (measured above).
# - PARD: an ordinary draft reads `k - 1` mask tokens after the context; trained on `k` copies of each
#   sequence (each mask sees the context up to its anchor and its own chain), with conditional
#   drop-token sampling. `pard.generate(target, prompts, draft=...)` runs `pard.PRESETS["cpu"]`: a chain
#   of the drafts the draft's measured acceptance pays for (`pard.cpu_slots`, at most 4; 2 for both zoo
#   drafts).
# - DFlash: a block-diffusion drafter that reads the target's fused layer features as extra keys and
#   values in every layer and denoises `[root, MASK, ...]` in one step. `dflash.generate(target,
#   prompts, draft=...)` runs `dflash.PRESETS["cpu"]`: a chain over the block `dflash.cpu_block`
#   picks the same way (8 for `tiny`'s drafter, 3 for SmolLM2's; the paper's 16 is `"paper"`). A slot
#   is drafted while its held-out acceptance reaches `generation.SLOT_COST`, what verifying one more
#   position costs a CPU step.
# - Each slot's token drawn from its own distribution keeps speculative sampling lossless; greedy stays
#   AR's token for token.
# - vLLM serves both: `python -m refimpl.export tiny-pard --to DIR` (`method="draft_model"` with
#   `parallel_drafting`) and `dflash-smollm2-135m` (`method="dflash"`); chapter 16 compares every method.
