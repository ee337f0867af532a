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
# # 05 · Token trees: many candidates, one target pass
#
# A chain of drafts (chapters 02-04) dies at its first wrong token: everything after it is
# wasted. A **token tree** gives the target second chances: at each level it offers several
# siblings, and the target only needs to like *one* of them. SpecInfer (Miao et al., arXiv
# 2305.09781) scores the whole tree in **one** forward pass: flatten the tree into a sequence,
# let every node attend only to the context and its own ancestors, and give it the position
# `root position + depth` (Medusa, arXiv 2401.10774, does the same).
#
# **After this chapter you can**
#
# 1. flatten a token tree into `(tokens, parents)`, and write its ancestor mask and depths;
# 2. score every node of a tree in one target forward and show it equals scoring each path alone;
# 3. walk the tree greedily and predict which path the target accepts, and why the output is exactly greedy decoding;
# 4. explain how the accepted path's keys and values are moved into place without a second forward;
# 5. state SpecInfer's rule for trying several children and show that it is lossless, even with a duplicate sibling;
# 6. compare tau of a tree with tau of a chain of the same depth;
# 7. grow EAGLE-2's dynamic tree by hand (expand the most confident nodes, re-rank to a node budget), predict when
#    its growth may stop, and explain why a 10-node dynamic tree can beat the chain draft in wall-clock on a CPU
#    where a static tree of the same size cannot.
#
# **Parameters.** `tiny` is the zoo's 4-layer Llama trained on the King James Bible, `tiny-draft` a smaller model
# distilled from it. `WIDTHS` is the branching per depth of the draft trees; `TOTAL, DEPTH, TOPK` shape the
# dynamic tree, `STATIC` is a static tree of the same node count, `SIZES` the node counts compared.

# %%
import torch
from refimpl.models import default_device

FAST = True                        # CI default: short generations, few samples
MODEL, DRAFT = "tiny", "tiny-draft"
DEVICE = default_device()          # a torch.device: CUDA when present, $REFIMPL_DEVICE overrides
NEW_TOKENS = 32 if FAST else 128
SAMPLES = 600 if FAST else 5000    # for the losslessness check
WIDTHS = (2, 2)                    # top-2 at depth 1, top-2 below each: 6 nodes
TOTAL, DEPTH, TOPK = 10, 6, 3      # dynamic tree: node budget, levels, children (and nodes expanded) per level
STATIC = (2, 2, 1)                 # a static top-k tree of TOTAL = 2 + 4 + 4 nodes
SIZES = (2, 4, 6, 10, 14)          # node counts for tau vs tree size
DEMO = 1                           # the prompt after which the dynamic tree is grown by hand and drawn
SEED = 0
SHOW_SOLUTIONS = False

# %% [markdown]
# ## Models and prompts
# Greedy autoregressive decoding is the ground truth: every tree decoder below must reproduce it.

# %%
import matplotlib.pyplot as plt
from refimpl import models, autoregressive, speculative
from refimpl.prompts import encode_prompt
from solutions import exercise, check, show

torch.set_grad_enabled(False)
lm, dr = models.load(MODEL, device=DEVICE), models.load(DRAFT, device=DEVICE)
texts = ["In the beginning God created the heaven and the earth. And the earth",
         "And the LORD spake unto Moses, saying",
         "Blessed are the meek: for they shall inherit the earth. Blessed are"]
prompts = [encode_prompt(lm, t) for t in texts]
ar = autoregressive.generate(lm, prompts, max_new_tokens=NEW_TOKENS, eos_token_id=[]).tokens
print("prompt lengths", [len(p) for p in prompts], "|", repr(lm.decode(ar[0])[:80]))

# %% [markdown]
# ## Why trees
# Take the first prompt and look at the draft's top-2 guesses after it, and the target's choice.
# A chain bets everything on the draft's first choice; a tree keeps the runner-up as a sibling,
# and if the target picks it, the step still advances.

# %%
ctx = prompts[0]
dprob = torch.softmax(dr.logits(torch.tensor([ctx], device=DEVICE))[0, -1], -1)
tprob = torch.softmax(lm.logits(torch.tensor([ctx], device=DEVICE))[0, -1], -1)
for t in dprob.topk(3).indices.tolist():
    print(f"{lm.decode([t])!r:12s} draft {dprob[t]:.2f}  target {tprob[t]:.2f}")
print("target's argmax:", repr(lm.decode([int(tprob.argmax())])))

# %% [markdown]
# ## Building a tree from the draft's top-k
# Grow the tree level by level: below every node of the current level, put the draft's `k` most
# likely next tokens (`k = widths[depth]`). Nodes are numbered in the order they are created,
# so a node's parent always comes before it (`parents[i] < i`); the root's children have parent
# `-1` (the *root* is the last committed token, not a node). One draft call per level scores the
# whole level (no draft cache: we simply rerun the draft on context + path, fine for a tiny model).

# %%
ROOT = -1


def grow(draft, ctx, widths):
    """-> (tokens, parents): the draft's top-widths[d] children below every node of depth d."""
    tokens, parents, paths, level = [], [], {ROOT: []}, [ROOT]
    for k in widths:
        batch = torch.tensor([ctx + paths[n] for n in level], device=draft.device)
        top = draft.logits(batch)[:, -1].topk(k).indices.tolist()
        prev, level = level, []
        for n, kids in zip(prev, top):
            for t in kids:
                paths[len(tokens)] = paths[n] + [t]
                level.append(len(tokens)); tokens.append(t); parents.append(n)
    return tokens, parents


tokens, parents = grow(dr, ctx, WIDTHS)
labels = [lm.decode([t]) for t in tokens]
print("tokens ", labels, "\nparents", parents)

# %% [markdown]
# ## Flattening: ancestor mask and depth
# The 6 nodes go into the target's input as one sequence, after the context. Node `i` may see the
# whole context and **its own ancestors** (and itself), nothing else: a sibling is an
# *alternative*, not a previous token. For our tree (`a, b` below the root; `aa, ab` below `a`;
# `ba, bb` below `b`) the mask, written out by hand, row = the node that looks, column = the node
# it may see. The depth of a node is the number of nodes on its path = its row sum.

# %%
from refimpl import tree

by_hand = torch.tensor([[1, 0, 0, 0, 0, 0],     # a
                        [0, 1, 0, 0, 0, 0],     # b
                        [1, 0, 1, 0, 0, 0],     # aa
                        [1, 0, 0, 1, 0, 0],     # ab
                        [0, 1, 0, 0, 1, 0],     # ba
                        [0, 1, 0, 0, 0, 1]],    # bb
                       dtype=torch.bool, device=DEVICE)  # where the target uses it
depth = by_hand.sum(-1)
assert parents == [-1, -1, 0, 0, 1, 1], "WIDTHS = (2, 2) gives this shape"
assert torch.equal(tree.ancestors(torch.tensor([parents], device=DEVICE))[0], by_hand)
assert torch.equal(tree.Tree(torch.tensor([parents], device=DEVICE)).depth[0], depth)
print("depth", depth.tolist(), "== refimpl.tree")

# %% [markdown]
# ## Picture: the tree and its attention mask
# Left: the tree with its tokens (the root is the prompt's last token). Right: which slot each
# node attends to. Every node also sees the whole context (the grey block); among the nodes it
# sees only its path.

# %%
from figures import draw_tree   # notebooks/figures.py: x = depth, leaves stacked, a parent at its children's mean

fig, (a0, a1) = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw=dict(width_ratios=[1.2, 1]))
draw_tree([repr(t) for t in labels], parents, a0, root=repr(lm.decode(ctx[-1:]))); a0.set_title("the draft's top-2 x top-2 tree", fontsize=9)
a1.imshow(torch.cat([torch.full((6, 3), 0.5, device=DEVICE), by_hand.float()], 1).tolist(), cmap="Greys", vmin=0, vmax=1)
a1.set_xticks(range(9), ["ctx", "...", "ctx"] + labels, rotation=60); a1.set_yticks(range(6), labels)
a1.set_title("attention mask: context + ancestors", fontsize=9)
plt.tight_layout(); plt.show()

# %% [markdown]
# ## One forward scores every node
# Put the context in a KV cache, then feed the 6 nodes in **one** `lm.forward` call with
#
# - position ids `root position + depth` (siblings share a position: they are alternatives);
# - a 4-D additive mask `(1, 1, m, L + m)`: 0 where allowed, `-inf` elsewhere.
#
# The logits after node `i` are the target's next-token distribution after the path to `i`.

# %%
def score_tree(lm, ctx, tokens, parents):
    """-> logits (1 + m, V): after the root, then after each node; and the cache (context + nodes)."""
    dev = lm.device                                                   # every tensor next to the model
    before, cache = lm.forward(torch.tensor([ctx], device=dev))      # the context, cached
    anc = tree.ancestors(torch.tensor([parents], device=dev))[0]      # (m, m), checked above
    L, m = len(ctx), len(tokens)
    allow = torch.cat([torch.ones(m, L, dtype=torch.bool, device=dev), anc], 1)  # (m, L + m)
    mask = torch.zeros(m, L + m, device=dev).masked_fill(~allow, float("-inf"))
    pos = L - 1 + anc.sum(-1)                                         # root position + depth
    out, cache = lm.forward(torch.tensor([tokens], device=dev), cache, position_ids=pos[None], attention_mask=mask[None, None])
    return torch.cat([before[0, -1:], out[0]]), cache

# %% [markdown]
# The check: every node's logits equal those of running its root-to-node path as a plain
# sequence (up to float rounding).

# %%
def path_to(i, parents):
    out = []
    while i != ROOT:
        out.insert(0, i); i = parents[i]
    return out


logits, cache = score_tree(lm, ctx, tokens, parents)
for i in range(len(tokens)):
    plain = lm.logits(torch.tensor([ctx + [tokens[j] for j in path_to(i, parents)]], device=DEVICE))[0, -1]
    assert torch.allclose(logits[i + 1], plain, atol=1e-3), f"node {i} differs"
print(f"{len(tokens)} nodes scored in one forward == {len(tokens)} separate forwards | cache length {lm.cache_length(cache)}")

# %% [markdown]
# ## Greedy verification by hand
# Walk down from the root: among the root's children keep the one whose token is the target's
# argmax after the root; from there, the child equal to the argmax after *that* node; stop when
# no child matches. The target's argmax after the last accepted node is the step's extra token
# (correction or bonus). Each accepted token is exactly what greedy decoding would have emitted.

# %%
best = logits.argmax(-1).tolist()                         # best[0]: after the root, best[i + 1]: after node i
print("target's argmax after root:", repr(lm.decode(best[:1])), "| after each node:", [lm.decode([b]) for b in best[1:]])
kids_of = {ROOT: [0, 1], 0: [2, 3], 1: [4, 5]}             # this tree's children, read off the picture
path, node = [], ROOT
for level in (1, 2):
    kid = next((c for c in kids_of[node] if tokens[c] == best[node + 1]), None)
    if kid is None:
        break
    path.append(kid); node = kid
nxt = best[node + 1]
print("accepted:", [labels[i] for i in path], "+ the target's", repr(lm.decode([nxt])))
on_dev = lambda rows: torch.tensor(rows, device=DEVICE)     # the verification's inputs sit next to the logits
n, t, p = tree.Tree(on_dev([parents])).verify(on_dev([tokens]), logits[None], on_dev([len(tokens)]), None, speculative.Sampling())
assert int(n[0]) == len(path) and p[0, : len(path)].tolist() == path and int(t[0]) == nxt
assert [tokens[i] for i in path] + [nxt] == ar[0][: len(path) + 1], "the walk emits greedy tokens"

# %% [markdown]
# ### Exercise 1: the ancestor mask of any tree
# Write `ancestor_mask(parents)`: `parents` a list (`parents[i] < i`, `-1` for the root's
# children) -> a bool tensor `(m, m)` on the CPU (made from a Python list) with `[i, j]` True when
# node `j` is node `i` or one of its ancestors. The check compares it with `refimpl.tree.ancestors`
# on random trees.

# %%
@exercise("05", "ancestor_mask")
def ancestor_mask(parents):
    # your code here
    raise NotImplementedError

# %% [markdown]
# The check (random trees of up to 12 nodes, including the empty one):

# %%
import random


def random_parents(rng, m):
    return [rng.randrange(-1, i) for i in range(m)]


def check_mask():
    rng = random.Random(SEED)
    for _ in range(200):
        par = random_parents(rng, rng.randrange(0, 13))
        got, want = ancestor_mask(par), tree.ancestors(torch.tensor([par], dtype=torch.long, device="cpu"))[0]   # your mask: a host tensor
        assert torch.is_tensor(got) and got.dtype == torch.bool, "return a bool tensor"
        assert torch.equal(got, want), f"parents {par}: got\n{got.int()}\nexpected\n{want.int()}"


check("Exercise 1", check_mask)
if SHOW_SOLUTIONS:
    show("05", "ancestor_mask")

# %% [markdown]
# ### Exercise 2: the greedy walk on any tree
# Write `greedy_path(tokens, parents, best)` -> `(path, next)`: `best[0]` is the target's argmax
# after the root, `best[i + 1]` after node `i`. Descend from the root; at each node take the child
# (lowest index if several) whose token equals the argmax after the current node; stop when none
# does. `path` lists the accepted node indices, `next` is the argmax after the last one. The check
# compares with `Tree.verify` on random trees over a 3-token vocabulary (duplicates happen).

# %%
@exercise("05", "greedy_path")
def greedy_path(tokens, parents, best):
    # your code here
    raise NotImplementedError

# %% [markdown]
# The check:

# %%
def check_walk():
    rng, gen = random.Random(SEED), torch.Generator(device=DEVICE).manual_seed(SEED)
    for _ in range(200):
        m = rng.randrange(1, 12)
        par, toks = random_parents(rng, m), [rng.randrange(3) for _ in range(m)]
        lg = torch.randn(1, m + 1, 3, generator=gen, device=DEVICE)
        n, t, p = tree.Tree(on_dev([par])).verify(on_dev([toks]), lg, on_dev([m]), None, speculative.Sampling())
        want = (p[0, : int(n[0])].tolist(), int(t[0]))
        got = greedy_path(toks, par, lg[0].argmax(-1).tolist())
        assert tuple(got) == want, f"tokens {toks}, parents {par}: got {got}, expected {want}"


check("Exercise 2", check_walk)
if SHOW_SOLUTIONS:
    show("05", "greedy_path")

# %% [markdown]
# ## KV compaction: keep the accepted path, no second forward
# After the tree forward the cache holds `context + all m nodes`, but only the accepted path is
# part of the text. Its keys and values are already computed, at the right positions (position =
# depth, exactly as on the path). So: **move** them into the slots right after the context
# (`LM.move_slots`), crop the rest, and continue. Below, take the path to the last node (any path
# works), compact, and check that the next step matches a fresh forward over context + path.

# %%
L, keep = len(ctx), path_to(len(tokens) - 1, parents)            # e.g. nodes [1, 5]: 'b' then 'bb'
_, cache = score_tree(lm, ctx, tokens, parents)
lm.move_slots(cache, L, on_dev([[L + i for i in keep]]))         # slot L + i -> L, L + 1, ...
lm.crop(cache, L + len(keep))
text = ctx + [tokens[i] for i in keep]
step, cache = lm.forward(on_dev([[ar[0][0]]]), cache)             # one more token on the compacted cache
fresh, fresh_cache = lm.forward(on_dev([text + [ar[0][0]]]))
assert torch.allclose(step[0, -1], fresh[0, -1], atol=1e-3)
assert torch.allclose(cache.layers[0].keys, fresh_cache.layers[0].keys, atol=1e-4)
print(f"kept nodes {keep} -> slots {L}..{L + len(keep) - 1}; next-token logits == a fresh forward")

# %% [markdown]
# ## A tree proposer for the verification core
# `speculative.decode` drives any `speculative.Proposer` with `start / propose / accept / select`
# (its docstring is the contract, with shapes); `start` returns what the proposer needs from the loop,
# here `speculative.Needs(trees=True)`. A tree proposer returns `tree.pack(rows, device)`: per row `(tokens, parents)`, padded into a
# `Proposal(tokens, valid, q=None, calls, tree=Tree(parents))` on the target's device (`start`
# reads it off the prompt ids); the core then does what we did by hand: `Tree.feed` (one forward
# with the ancestor mask), `Tree.verify` (the walk) and `Tree.compact` (move_slots). `accept` gets
# the accepted node indices in `verdict.path` and what each row committed in `verdict.committed` (the
# accepted nodes' tokens, then the target's own token).
# The tree's depth is capped by what a row still needs (`caps`).

# %%
class TopKTree(speculative.Proposer):
    def __init__(self, draft, widths=WIDTHS):
        self.draft, self.widths = draft, widths

    def start(self, ids, mask, settings):                  # left-padded prompts -> each row's real tokens
        real = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
        self.ctx = [row[k].tolist() for row, k in zip(ids, real)]
        self.device = ids.device                           # the target's: the proposal is built there
        return speculative.Needs(trees=True)               # what it needs from the loop: tree verification

    def propose(self, caps):
        rows = [grow(self.draft, c, self.widths[:cap]) for c, cap in zip(self.ctx, caps)]
        return tree.pack(rows, self.device, calls=min(len(self.widths), max(caps)))

    def accept(self, v):
        for ctx, new in zip(self.ctx, v.committed):
            ctx += new

    def select(self, rows):
        self.ctx = [self.ctx[i] for i in rows.tolist()]

# %% [markdown]
# Run it on the ragged batch of three prompts: the output must be exactly greedy decoding, and
# exactly what the library's version of this proposer (`tree.DraftTree`, run by `tree.generate`) does.

# %%
mine = speculative.decode(lm, TopKTree(dr), prompts, max_new_tokens=NEW_TOKENS, eos_token_id=[])
assert mine.tokens == ar, "a greedy tree walk must reproduce greedy decoding"
lib = tree.generate(lm, prompts, draft=dr, max_new_tokens=NEW_TOKENS, eos_token_id=[], widths=WIDTHS)  # refimpl's DraftTree
assert lib.tokens == mine.tokens and lib.stats.accepted == mine.stats.accepted
print(f"tree {WIDTHS}: tau {mine.stats.tau:.2f} | target calls {mine.stats.target_calls} | accepted per step (row 0):",
      [a[0] for a in mine.stats.accepted][:12])

# %% [markdown]
# ## Tree versus chain
# Compare tau (tokens per target call) of chains (`speculative.generate`, `gamma` drafts) with
# trees of the same depth. A tree of depth 2 can never accept more than 2 drafts, like a chain with
# `gamma = 2`, but it fails less often; it pays with more nodes per forward (cheap on a GPU while
# the forward is memory-bound) and with more draft work. Table, then bar chart.

# %%
taus = {}
for g in (2, 3):
    r = speculative.generate(lm, prompts, draft=dr, gamma=g, max_new_tokens=NEW_TOKENS, eos_token_id=[])
    assert r.tokens == ar
    taus[f"chain gamma={g}"] = r.stats.tau
for w in [(2, 2), (3, 2), (3, 2, 1)]:
    r = speculative.decode(lm, TopKTree(dr, w), prompts, max_new_tokens=NEW_TOKENS, eos_token_id=[])
    assert r.tokens == ar
    taus[f"tree {w}"] = r.stats.tau
print(" | ".join(f"{k}: tau {v:.2f}" for k, v in taus.items()))
assert taus["tree (2, 2)"] >= taus["chain gamma=2"] - 0.05, "siblings should not hurt a greedy walk"
fig, ax = plt.subplots(figsize=(7, 2.8))
ax.bar(list(taus), list(taus.values()), color=["#9bb7e0"] * 2 + ["#b7e4c7"] * 3)
ax.axhline(1, color="k", lw=0.8); ax.set_ylabel("tau (tokens / target call)")
plt.xticks(fontsize=8); plt.tight_layout(); plt.show()

# %% [markdown]
# ## The draft's dynamic tree: spend the nodes where the draft is sure
# A static top-k tree spends its nodes by shape: `STATIC = (2, 2, 1)` puts 2 nodes at depth 1, 4 at
# depth 2 and 4 at depth 3, whatever the draft thinks. Where the draft is sure, the siblings are
# wasted and the tree is too shallow; where it hesitates, one guess per level may be too few.
# EAGLE-2 (Li et al., arXiv 2406.16858, §4) observes that the draft's confidence tracks the
# acceptance rate. A node's **value** is its *cumulative* confidence, the product of the draft's
# probabilities along its path (here: the sum of log-probabilities), roughly the chance that the
# target accepts the whole path. The rule, in the paper's words "expand" then "rerank":
#
# - **expand**: at every level the `TOPK` nodes of highest value each get the draft's top-`TOPK`
#   children, for `DEPTH` levels (one draft call per level);
# - **re-rank**: of all grown nodes keep the `TOTAL` of highest value (`tree.keep_best`). A child is
#   never worth more than its parent, so the kept nodes form a tree.
#
# Chapter 06a runs this rule with EAGLE's feature draft; `refimpl.dynamic_tree` runs it with our
# ordinary chain draft `tiny-draft`. First by hand, for the first step after prompt `DEMO`
# ("And the LORD spake unto Moses, saying"), without a cache (the draft reruns context + path, as
# `grow` above did):

# %%
def grow_dynamic(draft, ctx, depth, topk):
    """Every node EAGLE-2's expand step grows after ctx -> (1, N) tokens, parents, values and (N,) depths."""
    T, P, S, D, paths, level = [], [], [], [], {ROOT: []}, [ROOT]
    value = lambda n: 0.0 if n == ROOT else S[n]                         # cumulative log-confidence
    for d in range(1, depth + 1):
        grow_from = sorted(level, key=value, reverse=True)[:topk]         # the topk most confident of the level
        batch = torch.tensor([ctx + paths[n] for n in grow_from], device=draft.device)
        lp, ch = torch.log_softmax(draft.logits(batch)[:, -1], -1).topk(topk)
        level = []
        for n, ls, ts in zip(grow_from, lp.tolist(), ch.tolist()):      # each gets its top-k children
            for l, t in zip(ls, ts):
                paths[len(T)] = paths[n] + [t]; level.append(len(T))
                T.append(t); P.append(n); S.append(value(n) + l); D.append(d)
    return tuple(torch.tensor(v, device=draft.device) for v in ([T], [P], [S], D))

# %% [markdown]
# Re-rank to `TOTAL` nodes and compare with the library. `DynamicDraftTree` is a proposer like
# `TopKTree`: `start` with the prompt, then `propose(caps)` (a cap = the tokens a row still needs).
# With `floor=0.0` it is EAGLE-2's rule exactly (its default `floor=0.1` also leaves a level
# ungrown when its best node's cumulative confidence is below 0.1). It may stop before `DEPTH`
# levels: once no node of a level can enter the kept tree, no deeper one can either (Exercise 3),
# so it makes fewer draft calls for the same tree.

# %%
from refimpl import dynamic_tree

dctx = prompts[DEMO]
gt, gp, gv, gd = grow_dynamic(dr, dctx, DEPTH, TOPK)
(kept,), (kept_v,) = tree.keep_best(gt, gp, gv, gd, [DEPTH], TOTAL)          # the TOTAL most confident of all
lib = dynamic_tree.DynamicDraftTree(dr, TOTAL, DEPTH, TOPK, floor=0.0)
lib.start(torch.tensor([dctx], device=DEVICE), None, None)
step1 = lib.propose([DEPTH])                                                  # its first step after the prompt
assert lib.rows[0] == kept, "the library's tree == the hand-grown one"
assert max(abs(a - b) for a, b in zip(lib.scores[0], kept_v)) < 1e-3
kept_depth = tree.Tree(on_dev([kept[1]])).depth[0].tolist()
print(f"grown {gt.shape[1]} nodes in {DEPTH} draft calls (per depth {[int((gd == d).sum()) for d in range(1, DEPTH + 1)]});",
      f"kept {len(kept[0])}, per depth {[kept_depth.count(d) for d in range(1, DEPTH + 1)]} == the library's,",
      f"which stopped after {step1.calls} calls")

# %% [markdown]
# ## Picture: the same 10 nodes, static and dynamic
# Left the static `STATIC` tree (the library's `tree.grow`), right the dynamic tree just built,
# both after prompt `DEMO`. Disc size and colour: each node's cumulative draft confidence (one
# draft forward over the tree with `score_tree`, log scale). The target scores each tree in one
# forward and walks it greedily (`Tree.verify`); green: the path it accepted.

# %%
from figures import draw_scored_tree   # discs sized and coloured by a confidence, an accepted path in green


def verified(toks, par):                                   # -> cumulative draft confidences, accepted path, next token
    lp = torch.log_softmax(score_tree(dr, dctx, toks, par)[0], -1)  # the draft's view of every node, one forward
    conf = []
    for t, p in zip(toks, par):
        conf.append((1.0 if p == ROOT else conf[p]) * float(lp[p + 1, t].exp()))
    n, nx, path = tree.Tree(on_dev([par])).verify(on_dev([toks]), score_tree(lm, dctx, toks, par)[0][None],
                                                   on_dev([len(toks)]), None, speculative.Sampling())
    return conf, path[0, : int(n[0])].tolist(), int(nx[0])


fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
for ax, (name, (toks, par)) in zip(axes, [(f"static {STATIC}", tree.grow(dr, dctx, STATIC)), ("dynamic", kept)]):
    conf, acc, nx = verified(toks, par)
    sc = draw_scored_tree([repr(lm.decode([t])) for t in toks], par, conf, ax, root=repr(lm.decode(dctx[-1:])), green=set(acc) | {ROOT})
    ax.set_ylim(ax.get_ylim()[0], ax.get_ylim()[1] + 0.5)                         # room for the top labels
    ax.set_title(f"{name}: {len(toks)} nodes, depth {max(tree.Tree(on_dev([par])).depth[0].tolist())}; accepted {len(acc)} + {lm.decode([nx])!r}", fontsize=9)
fig.colorbar(sc, ax=axes, fraction=0.02, label="cumulative draft confidence"); plt.show()

# %% [markdown]
# ### Exercise 3: when may the growth stop?
# `DynamicDraftTree.settled` stops growing below a level when either
#
# - **exact**: the level's best value is no higher than the `total`-th best value of all nodes grown
#   so far. Predict why no deeper node could then be kept (hint: a child's value is at most its
#   parent's, and a node grown later loses a tie in `keep_best`'s stable sort);
# - **economic**: the level's best cumulative confidence (`exp` of its value) is below `floor`: its
#   children would add less than `floor` expected tokens each, less than a draft call costs.
#
# Write `settled(values, level, total, floor)` for one row: `values` are the log-values of every
# node grown so far in grown order, `values[lo:hi]` with `(lo, hi) = level` the current (deepest)
# level; return True when growing may stop. The check replays levels recorded in a real decode (a
# subclass grows every level and logs what it saw) at several budgets and floors, against the
# library's `settled`.

# %%
@exercise("05", "settled")
def settled(values, level, total, floor):
    ...  # your code
    raise NotImplementedError

# %% [markdown]
# The check (the recording subclass overrides `settled` to log and never stop):

# %%
import math


class Levels(dynamic_tree.DynamicDraftTree):
    def settled(self, score, lvl, d, caps):                 # score: (B, grown so far); lvl: the level's (lo, hi)
        self.seen += [(row, lvl) for row in score.tolist()]
        return False


rec = Levels(dr, TOTAL, DEPTH, TOPK, floor=0.0); rec.seen = []
speculative.decode(lm, rec, prompts, max_new_tokens=16, eos_token_id=[])


def check_settled():
    for total, floor in ((2, 0.0), (4, 0.0), (TOTAL, 0.0), (TOTAL, 0.1), (4, 0.5), (40, 0.02)):
        lib = dynamic_tree.DynamicDraftTree(dr, total, DEPTH, TOPK, floor)
        for values, lvl in rec.seen:
            want, got = lib.settled(torch.tensor([values], device=DEVICE), lvl, 1, [DEPTH + 1]), settled(values, lvl, total, floor)
            best, kth = max(values[lvl[0]:lvl[1]]), sorted(values, reverse=True)[min(total, len(values)) - 1]
            assert bool(got) == want, (f"total {total}, floor {floor}: {len(values)} nodes grown, the level's best value {best:.3f} "
                                       f"(confidence {math.exp(best):.3f}; value ranked {min(total, len(values))} among all grown: "
                                       f"{kth:.3f}): the library says {want}, you say {got}")


check("Exercise 3", check_settled)
if SHOW_SOLUTIONS:
    show("05", "settled")

# %% [markdown]
# ## tau versus tree size: static, dynamic, chain
# The three prompts again, `NEW_TOKENS` greedy tokens, for each node count in `SIZES`: a static
# top-k tree of that many nodes (its widths written beside it), the dynamic tree with `total` =
# that count (`floor=0`: every step fills its budget) and the chain draft with `gamma` = that count.
# Every run must reproduce greedy decoding. Printed: tau and the draft calls per target call.

# %%
STATIC_OF = {2: (2,), 4: (2, 1), 6: (2, 2), 10: (2, 2, 1), 14: (2, 2, 2)}   # nodes -> a static top-k shape
kw = dict(max_new_tokens=NEW_TOKENS, eos_token_id=[])
curves = {"chain, gamma = nodes": [], "static top-k tree": [], "dynamic tree (EAGLE-2)": []}   # (tau, draft calls / step)
for n in SIZES:
    runs = (speculative.generate(lm, prompts, draft=dr, gamma=n, **kw), tree.generate(lm, prompts, draft=dr, widths=STATIC_OF[n], **kw),
            dynamic_tree.generate(lm, prompts, draft=dr, total=n, depth=DEPTH, topk=TOPK, floor=0.0, **kw))
    for curve, r in zip(curves.values(), runs):
        assert r.tokens == ar, "every greedy method must be greedy decoding"
        curve.append((r.stats.tau, r.stats.draft_calls / r.stats.target_calls))
    print(f"{n:2d} nodes:", " | ".join(f"{name.split(',')[0]}: tau {cv[-1][0]:.2f}, {cv[-1][1]:.1f} draft calls" for name, cv in curves.items()))

# %% [markdown]
# The picture. Left: tau against the draft tokens the target scores per step (what a step costs
# the target). Right: tau against the draft calls per step (what it costs the draft), one point
# per size, for the two proposers that keep the draft's KV cache: a chain call feeds 1 token, a
# dynamic-tree call at most `TOPK` (`tree.DraftTree` reruns the whole context for every node, its
# calls are not comparable).

# %%
fig, (a0, a1) = plt.subplots(1, 2, figsize=(11, 3.4), sharey=True)
for (name, pts), style, color in zip(curves.items(), ("s--", "o-", "D-"), ("C0", "C1", "C2")):
    a0.plot(SIZES, [t for t, _ in pts], style, color=color, label=name)
    if "static" not in name:
        a1.plot([c for _, c in pts], [t for t, _ in pts], style, color=color, label=name)
for n, (t, c) in zip(SIZES, curves["static top-k tree"]):
    a0.annotate(str(STATIC_OF[n]), (n, t), textcoords="offset points", xytext=(4, -11), fontsize=7)
a0.set_xlabel("draft tokens (nodes) the target scores per step"); a0.set_ylabel("tau (tokens / target call)"); a0.set_xticks(SIZES)
a0.legend(fontsize=8); a0.margins(y=0.12); a1.set_xlabel("draft calls per step")
fig.suptitle(f"tiny + tiny-draft, {len(prompts)} prompts, greedy", fontsize=9); plt.tight_layout(); plt.show()

# %% [markdown]
# ## What the sizes say, and the wall-clock on a CPU
# **On tiny** (the run above). At the same node count the dynamic tree beats the static tree at
# every size: it spends its nodes on the likely paths (the picture: four deep where the draft
# was sure, siblings where it hesitated). The chain does better still up to about 10
# nodes: `tiny-draft` was distilled from `tiny` on the same book, and its argmax agrees with the
# target's far more often than its probabilities say (the path accepted in the picture has a
# cumulative confidence of a few percent), so the values underrate deep first choices. The chain's tau
# stops growing at `gamma = 6` (its runs of agreement are rarely longer here) while its draft calls
# keep growing; the dynamic tree keeps gaining, passes it at 14 nodes, and from about 3 draft
# calls per step on it gets more tau per draft call (right panel: one call per level, not one per token).
#
# **Why the node count matters on a CPU.** On a GPU, scoring 10 tokens costs about what scoring
# one does (the forward is memory-bound). On this course's 2-core CPU it does not: the committed
# latency(k) table for SmolLM2-135M (`bench_results/latency_smollm2-135m.md`, chapter 04c) has a few
# tokens at little more than one, 16 at nearly twice, 64 at several times. So what counts is tau divided by the cost of a step (the
# target's k tokens plus the draft's calls, ~0.12 of a target call each on SmolLM2): a tree must
# earn every node, and a wide static tree does not.
#
# **The committed SmolLM2 run.** Nothing is timed in this notebook (CI runs it in Triton's
# interpreter). The cell reads the committed benchmark (`bench_results/dynamic_tree_smollm2-135m`),
# prints its command and, per method, the speed-up over AR in the same run, tau, the **step cost**
# = tau / speed-up (what one draft-and-verify step costs in AR steps) and the chat category.
# In that run (all 30 prompts, greedy, every output == AR, Hugging Face's forward) the draft's dynamic
# tree with the library's defaults (10 nodes, depth 6, top-3, `floor` 0.1) is faster than the chain draft
# of chapter 04 on the same draft: <!-- quote:dynamic_tree_smollm2-135m/decode_smollm2-135m|tree speculative (draft's dynamic tree 10 nodes, depth 6, top-3, floor 0.1, cached)|speedup -->1.35x<!-- /quote --> AR against <!-- quote:dynamic_tree_smollm2-135m/decode_smollm2-135m|speculative greedy (gamma=4)|speedup -->1.28x<!-- /quote -->, with tau
# <!-- quote:dynamic_tree_smollm2-135m/decode_smollm2-135m|tree speculative (draft's dynamic tree 10 nodes, depth 6, top-3, floor 0.1, cached)|tau -->3.38<!-- /quote --> against <!-- quote:dynamic_tree_smollm2-135m/decode_smollm2-135m|speculative greedy (gamma=4)|tau -->2.58<!-- /quote -->. Its step costs more (11 tokens to score instead of 5, and up
# to 6 draft calls; the cell prints the step costs) and there the tree earns it: where the draft is sure
# (math, copy: tau above 4) it goes deeper than the chain's 4, where it is not (chat) its siblings lift tau
# from <!-- quote:dynamic_tree_smollm2-135m/decode_smollm2-135m|speculative greedy (gamma=4)|per_category_tau.chat -->1.59<!-- /quote --> to <!-- quote:dynamic_tree_smollm2-135m/decode_smollm2-135m|tree speculative (draft's dynamic tree 10 nodes, depth 6, top-3, floor 0.1, cached)|per_category_tau.chat -->1.94<!-- /quote -->. The capstone (chapter 16) runs the same two on the lean forward, whose
# AR step is about 3x cheaper while the draft's calls are not: every step that drafts then costs more AR
# steps, the tree's extra tau no longer pays for its extra step cost, and the two are level
# (<!-- quote:capstone/capstone_smollm2-135m|dynamic_tree [cpu]|speedup -->1.04x<!-- /quote --> against <!-- quote:capstone/capstone_smollm2-135m|speculative [cpu]|speedup -->1.05x<!-- /quote --> AR, with the same taus). EAGLE's feature draft (chapter 06a) grows the same kind of
# tree but is held back by its draft.

# %%
import json
import os

import refimpl

path = os.path.join(os.path.dirname(refimpl.__file__), os.pardir, "bench_results", "dynamic_tree_smollm2-135m", "decode_smollm2-135m.json")
b = json.load(open(path)); a = b["args"]
print(f"python -m refimpl.bench --model {a['model']} --threads {a['threads']} --repeats {a['repeats']} --max-new-tokens "
      f"{a['max_new_tokens']} --methods \"{a['methods']}\"  ({b['hardware']['cpu_count']} cores, {b['rows'][0]['prompts']} prompts)")
ar_chat = next(r for r in b["rows"] if r["method"] == "ar (cache)")["per_category_tokens_per_s"]["chat"]
for r in b["rows"]:
    name = r["method"].replace("tree speculative (draft's dynamic tree ", "draft's dynamic tree (").replace(", cached", "")
    name = name.replace(" = EAGLE-2's rule", "")                           # floor 0 is EAGLE-2's rule
    print(f"  {name:58s} speed-up {r['speedup']:4.2f} | tau {r['tau']:4.2f} | step cost {r['tau'] / r['speedup']:4.2f} |",
          f"chat {r['per_category_tokens_per_s']['chat'] / ar_chat:4.2f}x | exact {r['exact']:.0%}")

# %% [markdown]
# ## Sampling: trying several children losslessly (SpecInfer)
# With temperature > 0 the walk cannot ask for "the argmax". SpecInfer's rule at a node with
# target distribution `p`: try the children in order. Our children are **deterministic** (top-k
# picks, `q` one-hot), so child `x` is accepted with probability `p(x)`; if rejected, remove `x`
# from `p` (set `p(x) = 0`, renormalise) and try the next child with that residual. If all are
# rejected, sample the token from the last residual. Why it is lossless, for two children `x, y`:
# `P(x) = p(x)`; `P(y) = (1 - p(x)) · p(y) / (1 - p(x)) = p(y)`; any other `z` likewise.
# And a **duplicate** sibling (`x` again) can never be accepted: its token has probability 0 in
# the residual. (That is why `tree.trie` merges equal paths: a duplicate is a wasted node.)
#
# First the exact output distribution of the rule, computed by hand, on the target's real `p`
# after the first prompt and children = the draft's top 3 plus a duplicate of the first:

# %%
p = torch.softmax(lm.logits(torch.tensor([ctx], device=DEVICE))[0, -1].double(), -1)
kids = dprob.topk(3).indices.tolist()
kids.append(kids[0])                                          # a duplicate sibling


def emit_probs(p, kids):                                      # exact P(first emitted token), the rule by hand
    out, r, alive = torch.zeros_like(p), p.clone(), 1.0       # alive: P(all children so far rejected)
    for x in kids:
        out[x] += alive * r[x]
        alive *= 1 - r[x]
        r[x] = 0
        r = r / r.sum()
    return out + alive * r


assert torch.allclose(emit_probs(p, kids), p), "the rule must give back p"
print("children", [lm.decode([x]) for x in kids], "| p:", [round(float(p[x]), 3) for x in kids[:3]])

# %% [markdown]
# Now `refimpl`'s sampler, `Tree.sample_walk`, `SAMPLES` times on that one node: how often is
# each child accepted, and is the emitted token distributed as `p`? The duplicate (child 3) must
# never be accepted; the frequency of each child must be `p(child)` within sampling noise.

# %%
settings = speculative.Sampling(temperature=1.0, generator=torch.Generator(device=DEVICE).manual_seed(SEED))   # draws next to p
star = tree.Tree(on_dev([[ROOT] * 4]))                         # four children of the root
P = p.float()[None].expand(5, -1)                             # only row 0 (after the root) matters here
counts = [0] * 5
for _ in range(SAMPLES):
    walk, _ = star.sample_walk([ROOT] * 4, 4, kids, P, None, settings)
    counts[walk[0] if walk else 4] += 1
assert counts[3] == 0, "a duplicate sibling can never be accepted"
for i, x in enumerate(kids[:3]):
    sd = (float(p[x]) * (1 - float(p[x])) / SAMPLES) ** 0.5
    assert abs(counts[i] / SAMPLES - float(p[x])) < 4 * sd + 1e-3, f"child {i}: {counts[i]} of {SAMPLES}"
print("accepted child 0..3 / none:", counts, "| expected", [round(SAMPLES * float(p[x])) for x in kids[:3]], "0")

# %% [markdown]
# ## Play: the shape of the tree
# Sliders for the branching at depth 1 and 2. Each redraw builds the draft's tree after the
# chosen prompt, scores it with one target forward, walks it greedily and highlights the
# accepted path.

# %%
import ipywidgets as widgets


def play(prompt=0, k1=2, k2=2):
    global shown
    c = prompts[prompt]
    toks, par = grow(dr, c, (k1, k2))
    lg, _ = score_tree(lm, c, toks, par)
    acc, nx = tree.Tree.walk(par, len(toks), lambda node, ch: next((i for i in ch if toks[i] == int(lg[node + 1].argmax())), None),
                             lambda node: int(lg[node + 1].argmax()))
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(toks) + 1))
    draw_tree([repr(lm.decode([t])) for t in toks], par, ax, root=repr(lm.decode(c[-1:])), green=set(acc) | {ROOT})
    shown = f"{len(toks)} nodes, accepted {len(acc)} + {lm.decode([nx])!r}"
    ax.set_title(shown, fontsize=9); plt.show()

# %% [markdown]
# The widget (move `k1` from 2 to 1 and the tree loses a branch):

# %%
ui = widgets.interact(play, prompt=widgets.IntSlider(continuous_update=False, value=0, min=0, max=len(prompts) - 1),
                      k1=widgets.IntSlider(continuous_update=False, value=2, min=1, max=4), k2=widgets.IntSlider(continuous_update=False, value=2, min=1, max=4)).widget

# %% jupyter={"source_hidden": true} tags=["ci-only", "remove-input"]
# CI's self-test of the widget above (collapsed in the lab): move a control as a person would,
# check that the output changed, then put the control back to its teaching default
default = ui.children[1].value
before = shown
ui.children[1].value = 1                                    # move the k1 slider, as a person would
assert shown != before, "moving a slider must change the output"
ui.children[1].value = default

# %% [markdown]
# ## Summary
# - A token tree is flattened into `(tokens, parents)`; the ancestor mask and `position = root +
#   depth` let **one** target forward score every node exactly as if each path ran alone.
# - Greedy verification walks from the root, keeping the child equal to the target's argmax: the
#   output is exactly greedy decoding, and a sibling rescues steps where a chain would stop.
# - The accepted path's keys and values are already computed: `LM.move_slots` moves them into
#   place; no second forward.
# - Sampling: try children in turn, accept `x` with `p(x)` (deterministic children), else remove
#   `x` from `p` and go on: lossless, and a duplicate sibling is never accepted.
# - EAGLE-2's dynamic tree (`dynamic_tree.DynamicDraftTree`): a node's value is its cumulative
#   draft confidence; expand the `TOPK` most valuable nodes of each level, then keep the `TOTAL`
#   most valuable of all (`tree.keep_best`). The same budget goes deep where the draft is sure and
#   wide where it hesitates; growth stops once no node of a level can be kept (the same tree, fewer
#   draft calls) or none reaches `floor`.
# - On tiny, at equal node count: dynamic tree > static tree in tau; the distilled chain draft leads
#   up to ~10 nodes (the draft's values underrate its deep guesses) and saturates after. On a CPU
#   the target's cost grows with the tokens it scores (the committed latency table: <!-- quote:latency_smollm2-135m|k=6|relative_to_k1 -->1.09x<!-- /quote --> one token
#   for 6, <!-- quote:latency_smollm2-135m|k=16|relative_to_k1 -->1.88x<!-- /quote --> for 16), so the budget must go where it is accepted. On SmolLM2 with Hugging Face's
#   forward the 10-node dynamic tree ran at <!-- quote:dynamic_tree_smollm2-135m/decode_smollm2-135m|tree speculative (draft's dynamic tree 10 nodes, depth 6, top-3, floor 0.1, cached)|speedup -->1.35x<!-- /quote --> AR against the chain's <!-- quote:dynamic_tree_smollm2-135m/decode_smollm2-135m|speculative greedy (gamma=4)|speedup -->1.28x<!-- /quote -->; on the lean forward of
#   the capstone the two are level (<!-- quote:capstone/capstone_smollm2-135m|dynamic_tree [cpu]|speedup -->1.04x<!-- /quote --> against <!-- quote:capstone/capstone_smollm2-135m|speculative [cpu]|speedup -->1.05x<!-- /quote -->): a cheaper AR step leaves the draft's calls
#   a larger share of every step.
# - Which tree shape is best (Sequoia, OPT-Tree, DySpec) depends on the draft's acceptance
#   profile and on how much a wider forward costs on the hardware.
# - Defaults: `tree.generate(target, prompts, draft=d)` runs `tree.PRESETS["cpu"]` (widths 2 x 2) and
#   `dynamic_tree.generate` runs `dynamic_tree.PRESETS["cpu"]` (10 nodes, depth 6, top-3, floor 0.1).
#   No size around it wins every committed run on SmolLM2: 16 nodes (top-4) measured <!-- quote:dynamic_tree_smollm2-135m/decode_smollm2-135m|tree speculative (draft's dynamic tree 16 nodes, depth 6, top-4, floor 0.1, cached)|speedup -->1.38x<!-- /quote --> against
#   its <!-- quote:dynamic_tree_smollm2-135m/decode_smollm2-135m|tree speculative (draft's dynamic tree 10 nodes, depth 6, top-3, floor 0.1, cached)|speedup -->1.35x<!-- /quote --> with Hugging Face's forward, and on the lean forward, idle, 6 nodes
#   <!-- quote:plain_calls/plain_calls_smollm2-135m_idle|dynamic_tree [cpu] total=6 depth=5 topk=2|speedup -->0.89x<!-- /quote -->, 10 nodes <!-- quote:plain_calls/plain_calls_smollm2-135m_idle|dynamic_tree [cpu]|speedup -->0.85x<!-- /quote --> and 16 nodes <!-- quote:plain_calls/plain_calls_smollm2-135m_idle|dynamic_tree [cpu] total=16 depth=6 topk=4|speedup -->0.72x<!-- /quote --> AR on 8 chat-heavy prompts
#   (`bench_results/plain_calls/`). Which size is fastest moves with the forward and the prompts;
#   the preset is a size in that range. `preset="paper"` is EAGLE-2's released 60-node tree, which pays where scoring 60 tokens
#   costs about one (a GPU).
