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
# # 06a · Medusa heads and EAGLE: the target drafts for itself
#
# Chapters 02-05 needed a second model to draft. Medusa (Cai et al., "Medusa: Simple LLM
# Inference Acceleration Framework with Multiple Decoding Heads", arXiv 2401.10774) asks the
# target itself: a few small **heads** on its last hidden state guess the tokens 2, 3, 4, 5
# positions ahead, their top candidates form a **token tree** (chapter 05), and one target pass
# verifies it. The heads cost almost nothing to run, and they are trained in minutes on the
# target's own answers while the target stays frozen ("Medusa-1"). EAGLE (Li et al., arXiv
# 2401.15077) keeps the target's features but drafts *autoregressively*: one decoder layer reads
# the features **and** the tokens guessed so far, and EAGLE-2 (arXiv 2406.16858) grows its tree
# where the draft is confident. Chapter 06b goes on to EAGLE-3 and to what makes a feature draft
# pay in wall-clock on a CPU.

# %% [markdown]
# **After this chapter you can**
#
# 1. write a Medusa head from its weights, and say why an untrained head predicts exactly the target's next token;
# 2. state the self-distillation loss and see it fall in a few seconds of training;
# 3. read per-head top-1 / top-5 accuracy and predict from it which candidate tree is best, and its expected tau;
# 4. turn the heads' top-k into a tree, verify it in one forward pass and show the output is exactly greedy decoding;
# 5. tell which hidden state the heads must read after a step, for any accepted path;
# 6. quantify what Medusa's *typical acceptance* gives up against lossless sampling, and what it gains in tau;
# 7. compute one EAGLE draft step from its weights (`fc` of token embedding and feature, one decoder layer, the target's LM head) and say why it keeps accepting deeper than Medusa's heads;
# 8. grow EAGLE-2's dynamic tree by cumulative confidence, re-rank it to a node budget, and read the accepted path off it.
#
# **Parameters.** `tiny` is the zoo's 4-layer Llama trained on the King James Bible; its Medusa
# heads were trained by `python -m refimpl.train medusa-tiny` and live in `models/medusa-tiny`,
# its EAGLE draft by `python -m refimpl.train eagle-tiny` (`models/eagle-tiny`).

# %%
import torch
from refimpl.models import default_device

FAST = True                          # CI default: seconds of training, few samples
MODEL = "tiny"                       # the target
DEVICE = default_device()            # a torch.device: CUDA when present, $REFIMPL_DEVICE overrides
HEADS = None                         # None: the zoo's trained heads (models/medusa-tiny); or a folder
EAGLE_DRAFT = None                   # None: the zoo's EAGLE draft (models/eagle-tiny); or a folder
NEW_TOKENS = 48 if FAST else 128
ANSWERS, ANSWER_LEN = (48, 32) if FAST else (400, 64)    # tiny's own answers for the live training
STEPS, BATCH, LR = (40, 64, 3e-3) if FAST else (400, 256, 3e-3)
EAGLE_STEPS = 40 if FAST else 600    # live EAGLE training steps (16 answers each)
TOTAL, DEPTH, TOPK = 16, 5, 4        # EAGLE-2's dynamic tree: node budget, levels, children / expanded nodes
DEMO = 2                             # the prompt whose EAGLE tree is drawn
TREE_SIZE = 16                       # nodes of the candidate tree chosen from measured accuracies
SAMPLES = 400 if FAST else 4000      # rows for the sampling comparison
TEMPERATURE, TOP_K = 1.0, 10
SEED = 0
SHOW_SOLUTIONS = False

# %% [markdown]
# ## Models and prompts
# Greedy autoregressive decoding is the ground truth again: Medusa with lossless acceptance must
# reproduce it token for token. `K` is the number of heads.

# %%
import json
import os
import random
import matplotlib.pyplot as plt
from refimpl import models, autoregressive, speculative, tree, sampling
from refimpl.models import drafters                              # trained drafters' files, by the target they belong to
from refimpl.prompts import encode_prompt
from solutions import exercise, check, show

torch.set_grad_enabled(False)
lm = models.load(MODEL, device=DEVICE)
texts = ["In the beginning God created the heaven and the earth. And the earth",
         "And the LORD spake unto Moses, saying",
         "Blessed are the meek: for they shall inherit the earth. Blessed are"]
prompts = [encode_prompt(lm, t) for t in texts]
ar = autoregressive.generate(lm, prompts, max_new_tokens=NEW_TOKENS, eos_token_id=[]).tokens
K = 4
print("prompt lengths", [len(p) for p in prompts], "|", repr(lm.decode(ar[0])[:80]))

# %% [markdown]
# ## What a head is
# Medusa §2.1.1: from the target's last (normed) hidden state `h_t` at position `t` (the vector
# its LM head turns into `p(token t+1)`), head `k` guesses token `t+k+1`:
#
# `p_t^(k) = softmax(W2^(k) · (SiLU(W1^(k) h_t + b1^(k)) + h_t))`
#
# a residual block (`H x H`) followed by an LM head. The paper initialises `W2^(k)` to the
# target's LM head and `W1^(k)` to zero. On a CPU, K extra LM heads would cost as much as a
# small model, so here every head **shares the target's frozen LM head** (`W2^(k) = W_lm`, never
# trained) and only the residual block trains. With `W1 = 0, b1 = 0` the block returns `h_t`
# itself (`SiLU(0) = 0`): an untrained head predicts what the target predicts for `t+1`. Check it:

# %%
from refimpl import medusa

ids = torch.tensor([prompts[0]], device=DEVICE)
logits, _, hid = lm.forward(ids, output_hidden_states=True)    # (1, L, V), (1, L, H): last layer, normed
h = hid[0, -1]                                                 # (H,) the state that predicts the next token
W = lm.model.get_output_embeddings().weight.detach().float()   # (V, H) the LM head, shared by every head
fresh = medusa.MedusaHeads(W, num_heads=K).to(DEVICE)          # residual blocks start at zero
assert torch.allclose(h @ W.T, logits[0, -1], atol=1e-4), "the LM head on h gives the target's logits"
assert all(torch.allclose(fresh(h)[k], logits[0, -1], atol=1e-4) for k in range(K))
print(f"all {K} untrained heads guess {lm.decode([int(fresh(h)[0].argmax())])!r} = the target's next token;",
      f"{sum(p.numel() for p in fresh.blocks[0].parameters()):,} trainable parameters per head, LM head {tuple(W.shape)} shared")

# %% [markdown]
# ### Exercise 1: one head from its weights
# Write `head_logits(weight, bias, lm_head, h)`: `weight` (H, H) and `bias` (H,) are one head's
# residual block (`nn.Linear` convention: `y = h @ weight.T + bias`), `lm_head` (V, H), `h` of
# shape (..., H) -> the head's logits (..., V), the formula above. The check compares with
# `MedusaHeads.forward` on heads with random (non-zero) blocks, for a batch and for a single `h`.

# %%
@exercise("06a", "head_logits")
def head_logits(weight, bias, lm_head, h):
    ...  # your code
    raise NotImplementedError


# %%
def check_head():
    gen = torch.Generator(device=DEVICE).manual_seed(SEED)
    rnd = medusa.MedusaHeads(W, K).to(DEVICE)                  # random heads, next to the target's states
    for b in rnd.blocks:
        b.weight.copy_(0.1 * torch.randn(b.weight.shape, generator=gen, device=DEVICE))
        b.bias.copy_(torch.randn(b.bias.shape, generator=gen, device=DEVICE))
    hs = hid[0]                                                 # (L, H) real hidden states of prompt 0
    for k, b in enumerate(rnd.blocks):
        for x in (hs, hs[-1]):
            got = head_logits(b.weight, b.bias, W, x)
            assert got.shape == x.shape[:-1] + (W.shape[0],), f"shape {tuple(got.shape)}, expected {x.shape[:-1] + (W.shape[0],)}"
            want = rnd(x)[k]
            if torch.allclose(got, want, atol=1e-3):
                continue
            block = x @ b.weight.T + b.bias                    # the block's pre-activation
            hints = [(torch.nn.functional.silu(block) @ W.T, "the residual is missing: the head adds SiLU(W h + b) to h itself"),
                     ((x + block) @ W.T, "the SiLU is missing: h + SiLU(W h + b), not h + (W h + b)"),
                     ((x + torch.nn.functional.silu(x @ b.weight.T)) @ W.T, "the bias b is missing inside the SiLU")]
            hint = next((why for form, why in hints if torch.allclose(got, form, atol=1e-3)), None)
            raise AssertionError(f"head {k + 1}: logits differ by {float((got - want).abs().max()):.3g}" + (f": {hint}" if hint else ""))


check("Exercise 1", check_head)
if SHOW_SOLUTIONS:
    show("06a", "head_logits")

# %% [markdown]
# ## Training data: the target's own answers
# Medusa-1 keeps the backbone frozen and trains only the heads. §2.3.2 trains them by
# **self-distillation**: on text the target itself wrote, against the target's own
# distribution (no human data needed, and no mismatch with what the target will say when
# served). We ask `tiny` to continue short King James passages (greedy) and keep, at every
# answer position `i`, its final hidden state `hidden[i]` (the one that predicts answer token
# `i`): these are the heads' features, so the backbone never runs during training.

# %%
from refimpl.data import kjv_split
from refimpl.train.distill_data import generate_answers

rng, docs, passages = random.Random(SEED), kjv_split()[0], []
for _ in range(ANSWERS):
    words = rng.choice(docs).split()
    a = rng.randrange(max(1, len(words) - 40))
    passages.append(" ".join(words[a:a + rng.randint(8, 30)]))
rows = generate_answers(lm, passages, ANSWER_LEN, batch=ANSWERS, progress=False, min_answer=K + 2)  # (ids, n_prompt, hidden, text)
train_rows, held_rows = rows[: len(rows) * 5 // 6], rows[len(rows) * 5 // 6:]


def sources(rows, k):                                          # flat positions i with i + k in the same answer
    out, start = [], 0
    for _, _, hs, _ in rows:
        out += range(start, start + hs.shape[0] - k); start += hs.shape[0]
    return torch.tensor(out, device=DEVICE)


print(f"{len(rows)} answers, {sum(r[2].shape[0] for r in rows)} positions (hidden {tuple(rows[0][2].shape)} each);",
      f"held out {len(held_rows)} | e.g. {lm.decode(rows[0][0][rows[0][1]:])[:70]!r}")

# %% [markdown]
# ## The loss, and a few seconds of training
# Head `k` at answer position `i` guesses answer token `i + k`. Its teacher is the target's own
# distribution there, `p_{i+k} = softmax(hidden[i+k] · W_lm^T)`: one matmul on a stored hidden
# state. The loss is `KL(p_{i+k} || p_i^(k))`, averaged over positions and heads (the paper
# also weights head `k` by `lambda_k`, e.g. `0.8^k`; here, as in the library, all weigh the same). Positions `i`
# need `K` more tokens in the same answer (`sources` above; the library's `pairs` agrees).
# `STEPS` AdamW steps on batches of `BATCH` positions; gradients are switched on just here, and
# the LM head is a frozen buffer of the heads, so only the residual blocks learn.

# %%
from refimpl.train.medusa import pairs

Htr, src = torch.cat([r[2] for r in train_rows]).float(), sources(train_rows, K)   # (N, H) features, sources
assert torch.stack([src, src + K], 1).tolist() == pairs(train_rows, K).tolist()   # pairs() indexes on the host


def kl_loss(heads, i):                                         # (K,) KL(target at i + k || head k at i)
    student = torch.log_softmax(heads(Htr[i]), -1)             # (K, b, V)
    teacher = torch.stack([torch.softmax(Htr[i + k] @ W.T, -1) for k in range(1, K + 1)])   # (K, b, V)
    return (teacher * (teacher.clamp_min(1e-12).log() - student)).sum(-1).mean(-1)


fast, curve = medusa.MedusaHeads(W, K).to(DEVICE), []        # curve: (STEPS, K) loss per head
opt, gen = torch.optim.AdamW(fast.blocks.parameters(), lr=LR, weight_decay=0.0), torch.Generator(DEVICE).manual_seed(SEED)
with torch.enable_grad():
    for step in range(STEPS):
        loss = kl_loss(fast, src[torch.randint(len(src), (BATCH,), generator=gen, device=DEVICE)])
        opt.zero_grad(); loss.mean().backward(); opt.step(); curve.append(loss.tolist())
print("KL per head, first step:", [round(x, 2) for x in curve[0]], "-> last:", [round(x, 2) for x in curve[-1]])
assert sum(curve[-1]) < 0.8 * sum(curve[0]), "a few steps should already lower the loss"

# %% [markdown]
# ## Per-head accuracy
# `refimpl.train.medusa.train_heads` (run by `python -m refimpl.train medusa-tiny`) trains the
# same way with more data and steps (every head its own batch, a cosine schedule); its heads
# ship in `models/medusa-tiny` together with `accuracy[k][r]`: how often head `k+1`'s rank-`r`
# token was the right one on held-out answers. Top-1 is rank 0; top-5 the sum of ranks 0-4
# (a token sits at one rank only). We measure all three sets of heads on *our* held-out
# answers by hand, and check the library's `rank_accuracy` counts the same.

# %%
import copy
from refimpl.train.medusa import rank_accuracy, answer_tokens

zoo = drafters.load(lm, "medusa", HEADS)                              # on lm's device
Hh, toks = torch.cat([r[2] for r in held_rows]).float(), answer_tokens(held_rows).to(DEVICE)


def hits(heads, k, r):                                         # P(answer token i + k in head k's top r)
    i = sources(held_rows, k)
    return (heads(Hh[i])[k - 1].topk(r).indices == toks[i + k, None]).any(-1).float().mean().item()


sets = {"untrained": fresh, "FAST (ours)": fast, "zoo": zoo}
acc = {n: rank_accuracy(hd, Hh, toks, held_rows) for n, hd in sets.items()}    # on the same device as hits() below
for n, hd in sets.items():
    for k in range(1, K + 1):
        assert abs(hits(hd, k, 1) - acc[n][k - 1][0]) < 1e-6 and abs(hits(hd, k, 5) - sum(acc[n][k - 1][:5])) < 1e-6
print({n: [round(a[0], 2) for a in v] for n, v in acc.items()}, "top-1 per head")

# %% [markdown]
# ## Picture: the loss falls, accuracy drops with distance
# Left: the live training's loss per head. Right: top-1 (solid) and top-5 (light) accuracy per
# head on our held-out answers, and the zoo heads' own report (black ticks, thousands of held-out
# positions). Head 1 guesses one token further than the target does; every further head guesses
# one more token blind, so accuracy falls with `k`. An untrained head scores near zero: it repeats
# the target's *next* token, rarely the one after.

# %%
fig, (a0, a1) = plt.subplots(1, 2, figsize=(11, 3.4), gridspec_kw=dict(width_ratios=[1, 1.4]))
a0.plot(curve); a0.legend([f"head {k}" for k in range(1, K + 1)], fontsize=7)
a0.set_xlabel("step"); a0.set_ylabel("KL(target || head)"); a0.set_title(f"{STEPS} steps, {BATCH} positions each", fontsize=9)
colors = {"untrained": "0.6", "FAST (ours)": "#f4a261", "zoo": "#2a9d8f"}
for j, (n, v) in enumerate(acc.items()):
    xs = [k + (j - 1) * 0.27 for k in range(1, K + 1)]
    a1.bar(xs, [sum(a[:5]) for a in v], 0.25, color=colors[n], alpha=0.35)
    a1.bar(xs, [a[0] for a in v], 0.25, color=colors[n], label=n)
a1.scatter([k + 0.27 for k in range(1, K + 1)], [a[0] for a in zoo.accuracy], marker="_", s=300, color="k", label="zoo, its report (top-1)")
a1.set_xticks(range(1, K + 1), [f"head {k}\n(token t+{k + 1})" for k in range(1, K + 1)]); a1.set_ylabel("accuracy")
a1.legend(fontsize=7); a1.set_title("top-1 (solid) and top-5 (light) on held-out answers", fontsize=9)
plt.tight_layout(); plt.show()

# %% [markdown]
# ## The candidate tree, and one Medusa step by hand
# Medusa §2.1.2: take each head's top candidates and combine them into a tree. A node is
# written as a tuple of **ranks** (Medusa's `medusa_choices` format): `(1,)` is head 1's
# second-best token at depth 1, `(0, 2)` head 2's third-best below head 1's best, and so on. The
# full Cartesian product (top-10 of 4 heads: 11,110 nodes) is far too big, so a *sparse* tree
# keeps only some paths. Note that head 2 never sees head 1's token: `(0, 0)` and `(1, 0)` carry
# the *same* token. Where the tree hangs: the heads read the state `h` that the target just used
# to pick its own next token `t`, so the tree hangs **below `t`** (the root), and head 1 guesses
# the token after `t`. One step, for one row, greedy:
#
# 1. prefill: the target reads the prompt, picks `t`, and hands over `h` (the state that chose `t`);
# 2. the heads' top-k -> the tree's `(tokens, parents)`, parents first (checked against `medusa.tree_rows`);
# 3. **one** forward of `t` plus every node on top of the cache, with the ancestor mask and
#    position = depth (chapter 05's `Tree.feed`; it also returns the hidden states);
# 4. the greedy walk: keep the child equal to the target's argmax, as deep as it goes.
#
# The step emits `t`, the accepted path and the target's token after it.

# %%
def medusa_step(prompt, heads, choices):
    """Prefill + one greedy Medusa step -> (emitted tokens, hidden (1 + m, H) after t and each node, path, tree)."""
    slots = speculative.SlotCache(lm, 1, DEVICE)
    lg, hd = slots.feed(torch.tensor([prompt], device=DEVICE), hidden=True)           # 1. (1, L, V), (1, L, H)
    t, hstate = lg[0, -1].argmax(), hd[0, -1]
    nodes = sorted(choices, key=lambda c: (len(c), c))                                 # 2. parents first
    top = heads.top(hstate[None], 1 + max(max(c) for c in nodes))[0].tolist()         # (K, width) token ids
    toks, pars = [top[len(c) - 1][c[-1]] for c in nodes], [nodes.index(c[:-1]) if len(c) > 1 else -1 for c in nodes]
    assert medusa.tree_rows(nodes, torch.tensor([top], device=DEVICE), [K]) == [(toks, pars)]
    x, m = torch.tensor([toks], device=DEVICE), torch.tensor([len(toks)], device=DEVICE)
    lg, hd = tree.Tree(torch.tensor([pars], device=DEVICE)).feed(slots, t.view(1, 1), None, x, m, hidden=True)  # 3.
    best = lg[0].argmax(-1).tolist()                                                   # best[i + 1]: after node i
    path, nxt = tree.Tree.walk(pars, len(toks), lambda node, kids: next((c for c in kids if toks[c] == best[node + 1]), None),
                               lambda node: best[node + 1])                          # 4.
    return [int(t)] + [toks[i] for i in path] + [nxt], hd[0], path, (nodes, toks, pars)


# %% [markdown]
# Run it with a hand-picked binary-ish tree on every prompt and compare with `medusa.generate`
# (the same tree as `choices=`): its first two target calls (prefill, then the step) must emit
# the same tokens and accept the same number of drafts, and the whole generation must be greedy
# decoding.

# %%
CHOICES = [(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1), (0, 0, 0), (0, 0, 1)]   # hand-picked, 8 nodes
steps = [medusa_step(p, zoo, CHOICES) for p in prompts]
lib = medusa.generate(lm, prompts, heads=zoo, choices=CHOICES, max_new_tokens=NEW_TOKENS, eos_token_id=[])
for r, (emitted, _, path, _) in enumerate(steps):
    assert lib.tokens[r][: len(emitted)] == emitted and lib.stats.accepted[1][r] == len(path), f"prompt {r}"
    print(f"prompt {r}: t = {lm.decode(emitted[:1])!r}, accepted {[lm.decode([x]) for x in emitted[1:-1]]},",
          f"then {lm.decode(emitted[-1:])!r}")
assert lib.tokens == ar, "lossless Medusa emits exactly greedy decoding"
print(f"whole run == greedy decoding | tau {lib.stats.tau:.2f}, target calls {lib.stats.target_calls} for {NEW_TOKENS} tokens per row")

# %% [markdown]
# ## Picture: the tree and its attention mask
# Left: the tree the heads proposed for the prompt whose step accepted the most, each node
# labelled with its token and (head, rank); the accepted path is green, the root `t` is the
# target's own token. Right: which node each node attends to (besides the context and `t`):
# its ancestors and itself.

# %%
from figures import draw_tree   # notebooks/figures.py: x = depth, leaves stacked

demo = max(range(len(prompts)), key=lambda r: len(steps[r][2]))
emitted, _, path, (nodes, toks, pars) = steps[demo]
fig, (a0, a1) = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw=dict(width_ratios=[1.4, 1]))
draw_tree([f"{lm.decode([t])!r} h{len(c)}#{c[-1]}" for c, t in zip(nodes, toks)], pars, a0,
          root=f"t = {lm.decode(emitted[:1])!r}", green=set(path) | {-1}, fontsize=8)
a0.set_title(f"prompt {demo}: accepted {len(path)} + the target's {lm.decode(emitted[-1:])!r}", fontsize=9)
a1.imshow(tree.ancestors(torch.tensor([pars], device=DEVICE))[0].float().tolist(), cmap="Greys", vmin=0, vmax=1)
short = [lm.decode([t]) for t in toks]
a1.set_xticks(range(len(toks)), short, rotation=60, fontsize=8); a1.set_yticks(range(len(toks)), short, fontsize=8)
a1.set_title("node attends to node (ancestors + itself)", fontsize=9)
plt.tight_layout(); plt.show()

# %% [markdown]
# ### Exercise 2: which hidden state do the heads read next?
# After the step, the heads must draft from the state that predicted the step's *last* token
# (the target's correction or bonus). The tree forward returned `hidden` (1 + m, H): row 0 after
# `t`, row `i + 1` after node `i`. Write `next_hidden(hidden, path)` -> that state (H,), for any
# accepted `path` (a list of node indices, maybe empty). The check compares it with a *fresh*
# forward over the prompt and the emitted tokens, on trees where several depths get accepted and
# on one where nothing does.

# %%
@exercise("06a", "next_hidden")
def next_hidden(hidden, path):
    ...  # your code
    raise NotImplementedError


# %%
def check_next_hidden():
    seen = set()
    for choices in (CHOICES, [(0,) * d for d in range(1, K + 1)], [(9,)]):
        for p in prompts:
            emitted, hidden, path, _ = medusa_step(p, zoo, choices)
            _, _, fresh_h = lm.forward(torch.tensor([p + emitted[:-1]], device=DEVICE), output_hidden_states=True)
            got = next_hidden(hidden, path)
            assert got.shape == hidden[0].shape, f"return one state of shape {tuple(hidden[0].shape)}"
            assert torch.allclose(got, fresh_h[0, -1], atol=1e-3), \
                f"tree {choices}, accepted path {path}: not the state that predicted {lm.decode(emitted[-1:])!r}"
            seen.add(len(path))
    assert 0 in seen and max(seen) >= 2, f"(the check needs an empty and a deep path, saw {sorted(seen)})"


check("Exercise 2", check_next_hidden)
if SHOW_SOLUTIONS:
    show("06a", "next_hidden")

# %% [markdown]
# ## Which tree? Expected tau from the accuracies
# A node `(r1, ..., rd)` is on the accepted path when head 1's rank-`r1` token is right, and head
# 2's rank-`r2`, and so on. Medusa (§2.3.3, the optimized tree) estimates that probability as if the heads were
# independent, `P(node) = prod_d accuracy[d][r_d]`; at most one node per depth can be accepted,
# so the expected accepted length is the sum of `P(node)` over the tree and **expected tau =
# 1 + sum_nodes P(node)**. A child is never likelier than its parent, so the best tree of any size
# grows best-first: start from the root's children, repeatedly add the likeliest node not yet in
# the tree, and offer its children. Both by hand, checked against `medusa.expected_length` and
# `medusa.choose_tree`:

# %%
import math

accuracy = zoo.accuracy                                        # (K, 10) measured per head and rank


def expected_tau(acc, choices):
    return 1 + sum(math.prod(acc[d][r] for d, r in enumerate(c)) for c in choices)


def grow_tree(acc, size):
    chosen, frontier = [], [((r,), acc[0][r]) for r in range(len(acc[0]))]
    while frontier and len(chosen) < size:
        best = max(frontier, key=lambda f: f[1]); frontier.remove(best); chosen.append(best[0])
        if len(best[0]) < len(acc):
            frontier += [(best[0] + (r,), best[1] * acc[len(best[0])][r]) for r in range(len(acc[len(best[0])]))]
    return sorted(chosen, key=lambda c: (len(c), c))



for size in (1, 4, 8, 16, 32):
    assert grow_tree(accuracy, size) == medusa.choose_tree(accuracy, size)
    assert math.isclose(expected_tau(accuracy, grow_tree(accuracy, size)), medusa.expected_length(accuracy, grow_tree(accuracy, size)))
print("best 8-node tree:", grow_tree(accuracy, 8), f"expected tau {expected_tau(accuracy, grow_tree(accuracy, 8)):.2f}",
      f"| hand-picked: {expected_tau(accuracy, CHOICES):.2f}")

# %% [markdown]
# ## Expected vs measured tau
# Now decode: the chosen trees of growing size, the hand-picked tree, a chain (`(0,), (0, 0),
# ...`: each head's best guess only) and a flat top-8 of head 1. Every run must be greedy decoding;
# we compare its measured tau with the estimate. (The estimate ignores that heads are right
# *together*: text the target finds easy is easy for every head. And with three prompts, two
# trees whose estimates are close may swap places.)

# %%
shapes = {f"chosen {s}": medusa.choose_tree(accuracy, s) for s in (1, 2, 4, 8, 16, 32, 64)}
shapes.update({"hand-picked 8": CHOICES, "chain 4": [(0,) * d for d in range(1, K + 1)], "flat 8": [(r,) for r in range(8)]})
measured = {}
for name, ch in shapes.items():
    g = medusa.generate(lm, prompts, heads=zoo, choices=ch, max_new_tokens=NEW_TOKENS, eos_token_id=[])
    assert g.tokens == ar, name
    measured[name] = g.stats.tau
fig, ax = plt.subplots(figsize=(7, 3.6))
chosen = [n for n in shapes if n.startswith("chosen")]
sizes = [len(shapes[n]) for n in chosen]
ax.plot(sizes, [measured[n] for n in chosen], "o-", color="#2a9d8f", label="chosen tree, measured")
ax.plot(sizes, [expected_tau(accuracy, shapes[n]) for n in chosen], "x--", color="#2a9d8f", label="chosen tree, expected")
for (n, ch), mk in zip([(n, shapes[n]) for n in shapes if n not in chosen], "s^v"):
    ax.scatter(len(ch), measured[n], marker=mk, color="#e76f51", label=f"{n}, measured", zorder=3)
    ax.scatter(len(ch), expected_tau(accuracy, ch), marker=mk, facecolors="none", edgecolors="#e76f51", label=f"{n}, expected", zorder=3)
ax.set_xscale("log", base=2); ax.set_xlabel("tree nodes"); ax.set_ylabel("tau"); ax.legend(fontsize=7, ncol=2)
plt.tight_layout(); plt.show()
print(" | ".join(f"{n}: {measured[n]:.2f} ({expected_tau(accuracy, shapes[n]):.2f})" for n in shapes))

# %% [markdown]
# ## Play: tree size
# The slider sets the number of nodes of the chosen tree; the picture shows that tree below the
# target's token for the chosen prompt, with its real tokens, the accepted path in green, and
# the expected tau in the title.

# %%
import ipywidgets as widgets


def play(prompt=demo, size=8):
    global shown
    ch = medusa.choose_tree(accuracy, size)
    emitted, _, path, (_, toks, pars) = medusa_step(prompts[prompt], zoo, ch)
    fig, ax = plt.subplots(figsize=(8, 0.32 * len(toks) + 1.2))
    draw_tree([repr(lm.decode([t])) for t in toks], pars, ax, root=repr(lm.decode(emitted[:1])), green=set(path) | {-1}, fontsize=8)
    shown = f"{size} nodes, expected tau {expected_tau(accuracy, ch):.2f}; this step accepted {len(path)} + {lm.decode(emitted[-1:])!r}"
    ax.set_title(shown, fontsize=9); plt.show()


ui = widgets.interact(play, prompt=widgets.IntSlider(continuous_update=False, value=demo, min=0, max=len(prompts) - 1),
                      size=widgets.IntSlider(continuous_update=False, value=8, min=1, max=24)).widget

# %% jupyter={"source_hidden": true} tags=["ci-only", "remove-input"]
# CI's self-test of the widget above (collapsed in the lab): move a control as a person would,
# check that the output changed, then put the control back to its teaching default
default = ui.children[1].value
before = shown
ui.children[1].value = 3                                       # move the size slider, as a person would
assert shown != before, "moving the slider must change the output"
ui.children[1].value = default

# %% [markdown]
# ## Sampling: lossless vs typical acceptance
# With temperature > 0, the tree's children are deterministic guesses (one-hot `q`), so chapter
# 05's lossless rule accepts child `x` with probability `p(x)` only: even a right guess is
# rejected whenever the target's sample differs. Medusa §2.3.1 proposes **typical acceptance**
# instead: accept the first child `x` with
#
# `p(x) > min(eps, delta · exp(-H(p)))`        (Medusa's defaults: `eps = 0.09`, `delta = 0.3`)
#
# where `H(p)` is the entropy of the target's (temperature-scaled) distribution; after the last
# accepted node the next token is sampled from `p`. A confident `p` (small `H`) demands a likely
# token; a flat one accepts almost anything plausible. It is **lossy**: the output is no longer
# distributed as the target's samples. At temperature 0 it is greedy acceptance.
#
# The library's verifier, `medusa.TypicalTree`, asked about a one-child tree (the root and a
# child `x`) with the target's distribution `p` at the root, is the referee of the exercise below:

# %%
def library_accepts(p, x, eps, delta):                         # the check's referee (not for you to edit)
    dev = p.device                                             # the verifier's inputs sit next to p
    t = medusa.TypicalTree(torch.tensor([[-1]], device=dev))  # the root and one child, token x
    t.eps, t.delta = eps, delta
    n, _, _ = t.verify(torch.tensor([[x]], device=dev), p.log().expand(1, 2, -1), torch.tensor([1], device=dev), None,
                       speculative.Sampling(temperature=1.0, generator=torch.Generator(device=dev).manual_seed(0)))
    return bool(n[0] == 1)


# %% [markdown]
# ### Exercise 3: the typical-acceptance test
# Write `typical_accept(p, x, eps, delta)` -> bool, for a probability vector `p` (V,) and a token
# `x`. The check builds one-child trees and asks `medusa.TypicalTree` (the library's verifier)
# whether it accepts; among the cases, one where typical acceptance takes a token that the
# lossless rule would reject 95% of the time.

# %%
@exercise("06a", "typical_accept")
def typical_accept(p, x, eps=0.09, delta=0.3):
    ...  # your code
    raise NotImplementedError


# %%
def check_typical():                                           # a flat and a peaked p, both bounds binding, tokens near the bar
    gen, dev = torch.Generator(device=DEVICE).manual_seed(SEED), DEVICE   # distributions as the target's would be
    uniform = torch.full((20,), 0.05, device=dev)
    peaked = torch.cat([torch.tensor([0.9], device=dev), torch.full((19,), 0.1 / 19, device=dev)])
    assert library_accepts(uniform, 7, 0.09, 0.3), "(the planted case: typical takes a token of probability 0.05)"
    cases = [(uniform, 7, 0.09, 0.3), (peaked, 0, 0.09, 0.3), (peaked, 5, 0.09, 0.3)]
    for i in range(90):                                        # flat to peaked p, three (eps, delta) pairs
        p = torch.softmax(torch.randn(12, generator=gen, device=dev) * (0.5, 2.0, 5.0)[i % 3], -1)
        cases.append((p, int(torch.randint(12, (1,), generator=gen, device=dev)), *[(0.09, 0.3), (0.3, 0.9), (0.02, 0.3)][i // 30]))
    for p, x, eps, delta in cases:
        want = library_accepts(p, x, eps, delta)
        assert bool(typical_accept(p, x, eps, delta)) == want, f"p(x) = {float(p[x]):.4f}, eps={eps}, delta={delta}: the library says {want}"


check("Exercise 3", check_typical)
if SHOW_SOLUTIONS:
    show("06a", "typical_accept")

# %% [markdown]
# ## What typical acceptance gives up, exactly
# Prompt 1, the chosen tree of `TREE_SIZE` nodes, sampling at temperature `TEMPERATURE` with
# top-`TOP_K`. Look at the first two sampled tokens. The first, `t1`, comes from the prefill
# (exact: there is no tree yet). The second is where the tree's depth-1 children (head 1's
# guesses) meet the rule. Lossless: `t2 ~ p(. | t1)`; a child `c` is accepted with probability
# `p(c | t1)`. Typical: if some child `c` passes the bar under `p(. | t1)`, then `t2 = c` **with
# certainty**, else `t2 ~ p(. | t1)`. With top-`TOP_K` sampling there are only `TOP_K` possible
# `t1`, so both joint distributions can be written down exactly (one row per `t1` below); their
# total variation distance is what typical acceptance gives up on these two tokens.

# %%
sp, tree_ch = prompts[1], medusa.choose_tree(accuracy, TREE_SIZE)
lg, _, hs = lm.forward(torch.tensor([sp], device=DEVICE), output_hidden_states=True)
depth1 = [int(zoo.top(hs[0, -1:], 1 + max(max(c) for c in tree_ch))[0, 0, c[0]]) for c in tree_ch if len(c) == 1]
p1 = sampling.probs(lg[0, -1], TEMPERATURE, TOP_K)                                   # (V,)
firsts = p1.nonzero()[:, 0].tolist()
p2 = sampling.probs(lm.logits(torch.tensor([sp + [a] for a in firsts], device=DEVICE))[:, -1], TEMPERATURE, TOP_K)  # (n1, V)
exact, typ = p1[firsts, None] * p2, torch.zeros_like(p2)                            # joint P(t1, t2)
for i, a in enumerate(firsts):
    r = p2[i]
    H = float(-(r * r.clamp_min(1e-30).log()).sum())                                 # entropy of p(. | t1)
    bar = min(medusa.TYPICAL_EPS, medusa.TYPICAL_DELTA * math.exp(-H))
    c = next((c for c in depth1 if float(r[c]) > bar), None)
    typ[i] = p1[a] * (r if c is None else torch.nn.functional.one_hot(torch.tensor(c, device=r.device), r.shape[0]).to(r))
    print(f"t1 = {lm.decode([a])!r:10s} P {float(p1[a]):.3f} | H {H:.2f}, bar {bar:.3f} | typical t2 = "
          + ("sampled from p" if c is None else f"{lm.decode([c])!r} always (p = {float(r[c]):.2f})"))
tv, ent = lambda a, b: 0.5 * float((a - b).abs().sum()), lambda j: float(-(j[j > 0] * j[j > 0].log()).sum())
print(f"head 1 guessed {[lm.decode([x]) for x in depth1]} | TV(typical, exact) = {tv(typ, exact):.3f}",
      f"| entropy of (t1, t2): exact {ent(exact):.2f}, typical {ent(typ):.2f} nats")

# %% [markdown]
# ## Measured: the library's samplers
# `SAMPLES` copies of prompt 1 through `medusa.generate` with each acceptance rule, and plain
# autoregressive sampling as the yardstick of sampling noise. A chi-square test against the exact
# joint: lossless must pass, typical must fail (and match *its own* exact joint instead).
#
# A practical note: under `TRITON_INTERPRET=1` (as CI runs the notebooks) the prefill's sampling
# kernel runs in Triton's Python interpreter, about 0.3 s per batch row. The kernels' dispatchers
# read the variable at every call, so `kernels.references()` sets it to `"0"` for a cell: on a CPU
# they then take their torch reference (chapter 03 checked kernel == reference); on CUDA the
# native kernel runs either way.

# %%
import kernels
from scipy.stats import chisquare


def joint(run):                                                # empirical P(t1, t2)
    out, idx = torch.zeros_like(exact), {a: i for i, a in enumerate(firsts)}
    for t12 in run.tokens:
        out[idx[t12[0]], t12[1]] += 1 / len(run.tokens)
    return out


def pvalue(emp, ref):                                          # chi-square, cells with < 5 expected pooled
    o, e = (emp * SAMPLES).flatten().cpu(), (ref * SAMPLES).flatten().cpu()   # scipy reads CPU arrays
    big = e >= 5
    o, e = torch.cat([o[big], o[~big].sum()[None]]), torch.cat([e[big], e[~big].sum()[None]])
    return float(chisquare(o, e * o.sum() / e.sum()).pvalue)


# %% [markdown]
# The runs: three batched calls of `SAMPLES` rows, three tokens each, and the verdicts.

# %%
kw = dict(max_new_tokens=3, temperature=TEMPERATURE, top_k=TOP_K, eos_token_id=[])
with kernels.references():
    runs = {"AR sampling": autoregressive.generate(lm, [sp] * SAMPLES, generator=torch.Generator(DEVICE).manual_seed(SEED), **kw)}
    for rule in ("lossless", "typical"):
        runs[rule] = medusa.generate(lm, [sp] * SAMPLES, heads=zoo, choices=tree_ch, acceptance=rule,
                                     generator=torch.Generator(DEVICE).manual_seed(SEED), **kw)
emp = {n: joint(r) for n, r in runs.items()}
for n, e in emp.items():
    print(f"{n:12s} TV to exact {tv(e, exact):.3f}, to typical's exact {tv(e, typ):.3f}",
          f"| chi-square p-value vs exact {pvalue(e, exact):.2g}")
assert pvalue(emp["AR sampling"], exact) > 1e-3 and pvalue(emp["lossless"], exact) > 1e-3, "lossless = the target's samples"
assert pvalue(emp["typical"], exact) < 1e-6, "typical acceptance changes the distribution"
assert tv(emp["typical"], typ) < tv(emp["AR sampling"], exact) + 0.05, "typical matches the exact typical joint"

# %% [markdown]
# ## Picture: where the probability goes
# The most likely (t1, t2) pairs under the target: the exact probability (grey), typical
# acceptance's exact probability (orange), and what the two Medusa samplers produced (markers).
# Typical acceptance piles the mass of every second token onto the heads' guess.

# %%
order = exact.flatten().argsort(descending=True)[:12].tolist()
V2 = exact.shape[1]
names = [f"{lm.decode([firsts[i // V2]])!r} {lm.decode([i % V2])!r}" for i in order]
fig, ax = plt.subplots(figsize=(10, 3.2))
xs = torch.arange(len(order), device="cpu")                    # bar positions for matplotlib
cells = lambda j: j.flatten()[order].tolist()                  # the plotted cells, as Python floats
ax.bar(xs - 0.2, cells(exact), 0.4, color="0.7", label="exact (target)")
ax.bar(xs + 0.2, cells(typ), 0.4, color="#f4a261", label="typical, exact")
ax.scatter(xs - 0.2, cells(emp["lossless"]), color="#2a9d8f", zorder=3, label=f"lossless, {SAMPLES} samples")
ax.scatter(xs + 0.2, cells(emp["typical"]), color="#e76f51", marker="x", zorder=3, label=f"typical, {SAMPLES} samples")
ax.set_xticks(xs, names, rotation=45, fontsize=7); ax.set_ylabel("P(t1, t2)"); ax.legend(fontsize=7)
ax.set_title(f"first two tokens after prompt 1 (T = {TEMPERATURE}, top-{TOP_K}): TV(typical, exact) = {tv(typ, exact):.2f}", fontsize=9)
plt.tight_layout(); plt.show()

# %% [markdown]
# ## EAGLE: draft the next *feature*, one position at a time
# A Medusa head guesses token `t+k+1` from `h_t` alone: head 3 never learns what heads 1 and 2
# guessed. EAGLE (Li et al., arXiv 2401.15077) drafts autoregressively at the level of
# **features** `f` (here the target's last, normed hidden state: the vector its LM head reads).
# At position `t` the draft reads `f_t` **and the token `x_{t+1}` that was emitted after it** (the
# paper's "token sequence advanced by one time step": a feature alone cannot say which of its
# likely tokens was sampled) and predicts the next feature:
#
# `f̂_{t+1} = Layer(fc([embed(x_{t+1}) ; f_t]))`,   `q(x_{t+2}) = softmax(W_lm · f̂_{t+1})`
#
# `fc` maps 2H -> H; `Layer` is one Llama decoder layer (RMSNorm, rotary causal attention over
# the earlier inputs, SiLU-gated MLP, residuals); the target's frozen embedding and LM head do the
# rest. Deeper guesses feed `f̂` back where the true feature would be. One step by hand from the
# zoo draft's weights, on prompt 0 followed by the target's own next token `t` (the newest input):
# it must equal `EagleDraft.forward`. The pieces of the layer are chapter 04c's (RMSNorm modules,
# `primitives.rope` for RoPE); the inputs are the pairs `(x_{t+1}, f_t)` of the prompt and `t`, the
# features from one target forward. The last output predicts the feature the target computes
# after `t`: compare the vectors (cosine) and the tokens the LM head reads off them.

# %%
from refimpl import eagle
from refimpl.primitives import rope                              # rotary positions, shared by every model here

draft = drafters.load(lm, "eagle", EAGLE_DRAFT)                      # on lm's device


def draft_by_hand(tok, feat):                                  # (T,) x_{t+1}, (T, H) f_t -> (T, H) predicted f_{t+1}
    T, x = len(tok), draft.fc(torch.cat([draft.embed[tok], feat], -1))                      # (T, H)
    q, k, v = draft.qkv(draft.norm1(x)).view(T, 3, draft.num_heads, -1).permute(1, 2, 0, 3)  # (heads, T, d) each
    q, k = (rope(z[None], torch.arange(T, device=x.device)[None], draft.rope_theta)[0] for z in (q, k))
    s = (q @ k.mT / q.shape[-1] ** 0.5).masked_fill(~torch.ones(T, T, dtype=torch.bool, device=x.device).tril(), -torch.inf)
    x = x + draft.o((s.softmax(-1) @ v).transpose(0, 1).reshape(T, -1))                      # causal attention + residual
    g, u = draft.gate_up(draft.norm2(x)).chunk(2, -1)
    return x + draft.down(torch.nn.functional.silu(g) * u)                                   # gated MLP + residual



ids = torch.tensor([prompts[0] + ar[0][:1]], device=DEVICE)   # the prompt, then the target's token t
_, _, f = lm.forward(ids, output_hidden_states=True)           # (1, L + 1, H): f[0, i] = feature after token i
tok, feat = ids[0, 1:], f[0, :-1]                              # inputs (x_{t+1}, f_t): the newest x is t
mine = draft_by_hand(tok, feat)                                # (L, H)
assert torch.allclose(mine, draft(tok[None], feat[None])[0], atol=1e-4), "the hand-built layer == EagleDraft"
guess, cos = int(draft.full(draft.logits(mine[-1]).argmax())), torch.cosine_similarity(mine[-1], f[0, -1], dim=0)
print(f"after t = {lm.decode(ar[0][:1])!r} the draft guesses {lm.decode([guess])!r}, the target says {lm.decode(ar[0][1:2])!r};",
      f"cos(predicted, true feature) = {float(cos):.3f}; {sum(p.numel() for p in draft.parameters()):,} trained parameters")

# %% [markdown]
# ## Training the draft, a few seconds of it
# EAGLE trains the layer with teacher forcing on the target's own features: at input
# `(x_{t+1}, f_t)` it predicts `f_{t+1}`, with the loss `SmoothL1(f̂_{t+1}, f_{t+1}) + 0.1 · CE`
# (the LM head on `f̂_{t+1}` against the target's own distribution there), and uniform noise
# U(-0.1, 0.1) on the input features so that the draft tolerates its own errors when it reads
# `f̂` at depth > 1 (EAGLE's own trainer widens it by 512 / T on a row of T tokens; ours stays 0.1 on
# our short rows: `refimpl.train.eagle`'s docstring says why). `refimpl.train.eagle.train_draft` is that loop (`python -m refimpl.train
# eagle-tiny` ran it for 600 steps on 1,576 answers, about 4 minutes); `features` recomputes every
# position's feature with one target forward per row (our answer rows store only the answers').
# Here `EAGLE_STEPS` steps on the answers the Medusa heads trained on (on the CPU, where the
# trainer builds its batches); the held-out Smooth-L1 of an untrained, our FAST and the zoo's draft:

# %%
from refimpl.train.eagle import features, train_draft, accept_rates, batch_of

train_seqs, held_seqs = features(lm, train_rows, progress=False), features(lm, held_rows, progress=False)  # (ids, f, n_prompt)
torch.manual_seed(SEED)                                        # the fresh layer's initialisation
with torch.enable_grad():
    fast_draft, _ = train_draft(eagle.new_draft(lm).cpu(), train_seqs, steps=EAGLE_STEPS, batch=16, progress=False)  # train_draft batches on the host
drafts = {"untrained": eagle.new_draft(lm).cpu(), "FAST (ours)": fast_draft, "zoo": copy.deepcopy(draft).cpu()}  # host copies: features() keeps the rows there
tk, ft, tgt, msk, at = batch_of(held_seqs, 0.0, None)          # teacher forcing, no noise; at: answer positions (a host batch)
held_l1 = {n: float(torch.nn.functional.smooth_l1_loss(d(tk, ft, msk)[at], tgt[at])) for n, d in drafts.items()}
print("held-out Smooth-L1:", {n: round(v, 4) for n, v in held_l1.items()})
assert held_l1["FAST (ours)"] < held_l1["untrained"] and held_l1["zoo"] < held_l1["FAST (ours)"]

# %% [markdown]
# ## Picture: how deep does each draft get accepted?
# On our held-out answers: the probability that a draft's first `d` guesses beyond the target's
# next token are **all** right (the chain a greedy verifier would accept; for EAGLE the trainer's
# own `accept_rates`, the draft reading its own predicted features), for our FAST and the zoo's
# EAGLE draft and, from the same positions' features, for Medusa's zoo heads 1..d. Dashed: each
# Medusa head's top-1 accuracy on its own. Black ticks: the zoo draft's report (more held-out data).
# Medusa's head `d` guesses blind; EAGLE's depth `d` has read its guesses `1..d-1`, so once the first
# guesses are right the next is nearly as easy: its curve falls far more slowly.

# %%
import json

eagle_acc = {n: accept_rates(drafts[n], held_seqs, DEPTH, starts=30) for n in ("FAST (ours)", "zoo")}
i = sources(held_rows, K)                                      # answer positions with K more tokens
ans = answer_tokens(held_rows).to(DEVICE)                      # (n,) the held-out answer tokens, as Hh's rows
right = torch.stack([zoo(Hh[i])[k - 1].argmax(-1) == ans[i + k] for k in range(1, K + 1)]).float()  # (K, n)
folder = EAGLE_DRAFT or drafters.folder(lm, "eagle")
report = json.load(open(os.path.join(folder, "config.json")))["report"]["accept_rate_per_depth"]
fig, ax = plt.subplots(figsize=(9, 3.4))
for (n, v), c in zip(eagle_acc.items(), ("#f4a261", "#2a9d8f")):
    ax.plot(range(1, DEPTH + 1), v, "o-", color=c, label=f"EAGLE {n}: guesses 1..d all right")
ax.plot(range(1, K + 1), right.cumprod(0).mean(1).tolist(), "s-", color="#e76f51", label="Medusa zoo: heads 1..d all right")
ax.plot(range(1, K + 1), right.mean(1).tolist(), "s--", color="#e76f51", alpha=0.45, label="Medusa zoo: head d alone")
ax.scatter(range(1, len(report) + 1), report, marker="_", s=300, color="k", label="EAGLE zoo, its report")
ax.set_xlabel("distance d beyond the target's next token"); ax.set_ylabel("accuracy"); ax.set_ylim(0, 1)
ax.set_xticks(range(1, DEPTH + 1)); ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
ax.set_title(f"{len(held_rows)} held-out answers of tiny", fontsize=9); plt.tight_layout(); plt.show()

# %% [markdown]
# ## EAGLE-2's dynamic tree
# EAGLE-1 used one fixed tree shape. EAGLE-2 (arXiv 2406.16858) finds that the draft's confidence
# tracks the acceptance rate, and grows the tree where the draft is sure. A node's **value** is
# its cumulative confidence, the product of the draft's probabilities along its path (here a sum
# of log-probabilities). **Expand**: at each level the `TOPK` nodes of highest value get their
# top-`TOPK` children, for `DEPTH` levels (one draft call per level, the expanded nodes attending
# to the context and their ancestors: chapter 05's mask on the draft's own attention). **Re-rank**:
# of all grown nodes keep the `TOTAL` of highest value. A child is never worth more than its
# parent, so what is kept is a tree. `eagle.EagleProposer(draft, TOTAL, DEPTH, TOPK, floor, copy)` is a
# proposer on the verification core; a small subclass below logs every step of a real greedy
# decode of prompt `DEMO` (the refrain "Blessed are ..."): the tree, its values and the path the
# target accepted. The picture is the step (of the first half) that accepted the most; disc size
# and colour: the value (log scale: the draft's raw distribution is flat, values are small).

# %%
from figures import draw_scored_tree


class Recorder(eagle.EagleProposer):                           # the library's proposer, plus a log
    def accept(self, v):                                       # v: the verifier's verdict on the last proposal
        if self.rows is not None:                              # (the prefill proposes nothing)
            self.log.append((*self.rows[0], self.scores[0], v.path[0, : v.n_list[0]].tolist()))
        super().accept(v)


rec = Recorder(draft, TOTAL, DEPTH, TOPK, floor=0.0, copy=0.0); rec.log = []   # EAGLE-2's rule, no copy prior
run = speculative.decode(lm, rec, prompts[DEMO:DEMO + 1], max_new_tokens=NEW_TOKENS, eos_token_id=[])
assert run.tokens[0] == ar[DEMO], "EAGLE emits exactly greedy decoding"
j = max(range(len(rec.log) // 2), key=lambda s: len(rec.log[s][3]))          # log[j] = decode step j + 1
etoks, epars, evals, epath = rec.log[j]
done = sum(a[0] + 1 for a in run.stats.accepted[: j + 1])      # tokens emitted before that step; the root is the last
fig, ax = plt.subplots(figsize=(10, 0.3 * len(etoks) + 1.5))
sc = draw_scored_tree([f"{lm.decode([t])!r} {math.exp(v):.2f}" for t, v in zip(etoks, evals)], epars,
                      [math.exp(v) for v in evals], ax, root=f"t = {lm.decode(ar[DEMO][done - 1:done])!r}", green=set(epath) | {tree.ROOT})
fig.colorbar(sc, ax=ax, fraction=0.03, label="value (cumulative confidence, log scale)")
ax.set_title(f"step {j + 1}: {len(etoks)} nodes kept of {TOPK} + {TOPK * TOPK} x {DEPTH - 1} grown; the target accepted {len(epath)} (green)", fontsize=9)
plt.tight_layout(); plt.show()

# %% [markdown]
# ## The same tree, grown by hand
# Now without the library's tree attention: at that step's context (the prompt and the `done` tokens
# emitted before it, the features from one fresh target forward), run the draft (`forward`,
# teacher-forced) once per expanded node on the context plus the node's path, each predicted
# feature fed back as the next input's feature; expand the `TOPK` best of each level; then the
# re-rank, `tree.keep_best` (the library's shared step; Exercise 4 writes it). The kept tokens and
# parents must equal the recorded tree, the values agree to float precision.

# %%
def grow_by_hand(tok, feat):                                   # -> (1, N) tokens, parents, values, depths: every grown node
    nodes, ctx, level = [], {tree.ROOT: (tok, feat)}, [tree.ROOT]   # nodes[i] = (token, parent, value, depth)
    value = lambda n: 0.0 if n == tree.ROOT else nodes[n][2]
    for d in range(1, DEPTH + 1):
        new = []
        for n in sorted(level, key=value, reverse=True)[:TOPK]:               # expand the TOPK most confident
            fh = draft(ctx[n][0][None], ctx[n][1][None])[0, -1]               # predicted feature after node n
            lp, ch = torch.log_softmax(draft.logits(fh), -1).topk(TOPK)
            for l, c in zip(lp.tolist(), draft.full(ch).tolist()):
                ctx[len(nodes)] = (torch.cat([ctx[n][0], torch.tensor([c], device=DEVICE)]), torch.cat([ctx[n][1], fh[None]]))
                new.append(len(nodes)); nodes.append((c, n, value(n) + l, d))
        level = new
    return [torch.tensor([list(x)], device=DEVICE) for x in zip(*nodes)]


# %% [markdown]
# At that step's context, grow by hand, re-rank with `tree.keep_best` and compare with the log:

# %%
ids = torch.tensor([prompts[DEMO] + ar[DEMO][:done]], device=DEVICE)
_, _, f = lm.forward(ids, output_hidden_states=True)
gt, gp, gv, gd = grow_by_hand(ids[0, 1:], f[0, :-1])
(kept, kept_vals) = tree.keep_best(gt, gp, gv, gd[0], [DEPTH], TOTAL)
assert kept[0] == (etoks, epars) and max(abs(a - b) for a, b in zip(kept_vals[0], evals)) < 1e-3
print(f"{gt.shape[1]} nodes grown by hand ({1 + TOPK * (DEPTH - 1)} draft runs, per depth {[int((gd[0] == d).sum()) for d in range(1, DEPTH + 1)]});",
      f"the {len(etoks)} kept == the library's tree, values within {max(abs(a - b) for a, b in zip(kept_vals[0], evals)):.1e}")

# %% [markdown]
# ### Exercise 4: EAGLE-2's re-rank
# Write `rerank(tokens, parents, values, depth, cap, total)` for one row of grown nodes (lists,
# parents first, `-1` below the root; `values` the cumulative log-confidences): keep the `total`
# nodes of highest value among those no deeper than `cap` (the tokens left to generate), a tie
# going to the node grown first (so a parent before its child); return them **in grown order** as
# `(kept tokens, kept parents)`, each parent re-indexed to its position in the kept list (`-1`
# stays). The check compares with `tree.keep_best` on the tree grown above, at several budgets and
# caps, and on a small tree where a child is exactly as sure as its parent.

# %%
@exercise("06a", "rerank")
def rerank(tokens, parents, values, depth, cap, total):
    ...  # your code
    raise NotImplementedError


# %%
def check_rerank():
    grown = (gt[0].tolist(), gp[0].tolist(), gv[0].tolist(), gd[0].tolist())
    tie = ([5, 6, 7, 8], [-1, 0, -1, 1], [-1.0, -1.0, -0.5, -2.0], [1, 2, 1, 3])       # node 1 as sure as node 0
    for t, p, v, dep in (grown, tie):
        for cap, total in ((DEPTH, TOTAL), (2, TOTAL), (DEPTH, 2), (DEPTH, 5), (1, 3), (DEPTH, 500)):
            want = tree.keep_best(*(torch.tensor(z, device=DEVICE) for z in ([t], [p], [v], dep)), [cap], total)[0][0]
            got = tuple([int(x) for x in part] for part in rerank(t, p, v, dep, cap, total))
            case = f"{len(t)} nodes, cap {cap}, total {total}"
            assert got[0] == want[0], f"{case}: you keep the tokens {got[0]}, EAGLE-2 keeps {want[0]} (in grown order)"
            assert got[1] == want[1], f"{case}: right tokens, but parents {got[1]}: want {want[1]} (positions in the kept list)"


check("Exercise 4", check_rerank)
if SHOW_SOLUTIONS:
    show("06a", "rerank")


# %% [markdown]
# ## Summary
# - A Medusa head is a residual block `h + SiLU(W h + b)` followed by the (here shared, frozen)
#   LM head; head `k` guesses token `t+k+1` from the state `h_t` alone. An untrained head is the
#   identity, i.e. the target's own next-token prediction.
# - Self-distillation trains the heads on the target's own answers against its own
#   distributions, `KL(p_{i+k} || p_i^(k))`; the backbone never runs during training.
# - Accuracy falls with the head's distance; the per-rank accuracies predict the best tree of
#   any size (grown best-first) and its expected tau, an estimate that assumes independent heads.
# - One step: heads -> tree below the target's token -> one forward with the ancestor mask ->
#   greedy walk; the heads then read the hidden state of the last accepted node. Lossless
#   Medusa emits exactly greedy decoding, and under sampling exactly the target's distribution.
# - Typical acceptance (§2.3.1) accepts more under sampling, but it is lossy: where a guess
#   passes the bar, the next token is no longer random at all.
# - EAGLE's draft is `fc([embed(x_{t+1}); f_t])` and one decoder layer predicting the next feature,
#   read by the target's LM head; it is trained on the target's features (Smooth-L1 + 0.1 CE) and,
#   reading its own guesses, keeps being right at depth 3-5 where Medusa's blind heads fade.
# - EAGLE-2's dynamic tree: expand the most confident nodes by cumulative confidence, re-rank,
#   keep a fixed budget; verified like any tree, it is exact under greedy decoding.

# %% [markdown]
# **Next: EAGLE-3 and the CPU fast path.** Three target layers in and a draft trained the way it
# decodes; then tau against wall-clock for every draft of chapters 04a-06a, and what a feature
# draft needs to pay on a CPU (chapter 06b).
