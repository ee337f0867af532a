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
# 6. compare tau of a tree with tau of a chain of the same depth.
#
# **Parameters.** `tiny` is the zoo's 4-layer Llama trained on the King James Bible, `tiny-draft` a smaller model
# distilled from it. `WIDTHS` is the branching per depth of the draft trees.

# %%
import torch

FAST = True                        # CI default: short generations, few samples
MODEL, DRAFT = "tiny", "tiny-draft"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NEW_TOKENS = 32 if FAST else 128
SAMPLES = 600 if FAST else 5000    # for the losslessness check
WIDTHS = (2, 2)                    # top-2 at depth 1, top-2 below each: 6 nodes
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
dprob = torch.softmax(dr.logits(torch.tensor([ctx]))[0, -1], -1)
tprob = torch.softmax(lm.logits(torch.tensor([ctx]))[0, -1], -1)
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
                       dtype=torch.bool)
depth = by_hand.sum(-1)
assert parents == [-1, -1, 0, 0, 1, 1], "WIDTHS = (2, 2) gives this shape"
assert torch.equal(tree.ancestors(torch.tensor([parents]))[0], by_hand)
assert torch.equal(tree.Tree(torch.tensor([parents])).depth[0], depth)
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
a1.imshow(torch.cat([torch.full((6, 3), 0.5), by_hand.float()], 1), cmap="Greys", vmin=0, vmax=1)
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
    before, cache = lm.forward(torch.tensor([ctx]))                  # the context, cached
    anc = tree.ancestors(torch.tensor([parents]))[0]                  # (m, m), checked above
    L, m = len(ctx), len(tokens)
    allow = torch.cat([torch.ones(m, L, dtype=torch.bool), anc], 1)  # (m, L + m)
    mask = torch.zeros(m, L + m).masked_fill(~allow, float("-inf"))
    pos = L - 1 + anc.sum(-1)                                         # root position + depth
    out, cache = lm.forward(torch.tensor([tokens]), cache, position_ids=pos[None], attention_mask=mask[None, None])
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
    plain = lm.logits(torch.tensor([ctx + [tokens[j] for j in path_to(i, parents)]]))[0, -1]
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
n, t, p = tree.Tree(torch.tensor([parents])).verify(torch.tensor([tokens]), logits[None], torch.tensor([len(tokens)]), None, speculative.Sampling())
assert int(n[0]) == len(path) and p[0, : len(path)].tolist() == path and int(t[0]) == nxt
assert [tokens[i] for i in path] + [nxt] == ar[0][: len(path) + 1], "the walk emits greedy tokens"

# %% [markdown]
# ### Exercise 1: the ancestor mask of any tree
# Write `ancestor_mask(parents)`: `parents` a list (`parents[i] < i`, `-1` for the root's
# children) -> a bool tensor `(m, m)` with `[i, j]` True when node `j` is node `i` or one of its
# ancestors. The check compares it with `refimpl.tree.ancestors` on random trees.

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
        got, want = ancestor_mask(par), tree.ancestors(torch.tensor([par], dtype=torch.long))[0]
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
    rng, gen = random.Random(SEED), torch.Generator().manual_seed(SEED)
    for _ in range(200):
        m = rng.randrange(1, 12)
        par, toks = random_parents(rng, m), [rng.randrange(3) for _ in range(m)]
        lg = torch.randn(1, m + 1, 3, generator=gen)
        n, t, p = tree.Tree(torch.tensor([par])).verify(torch.tensor([toks]), lg, torch.tensor([m]), None, speculative.Sampling())
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
lm.move_slots(cache, L, torch.tensor([[L + i for i in keep]]))   # slot L + i -> L, L + 1, ...
lm.crop(cache, L + len(keep))
text = ctx + [tokens[i] for i in keep]
step, cache = lm.forward(torch.tensor([[ar[0][0]]]), cache)       # one more token on the compacted cache
fresh, fresh_cache = lm.forward(torch.tensor([text + [ar[0][0]]]))
assert torch.allclose(step[0, -1], fresh[0, -1], atol=1e-3)
assert torch.allclose(cache.layers[0].keys, fresh_cache.layers[0].keys, atol=1e-4)
print(f"kept nodes {keep} -> slots {L}..{L + len(keep) - 1}; next-token logits == a fresh forward")

# %% [markdown]
# ## A tree proposer for the verification core
# `speculative.decode` drives any proposer with `start / propose / accept / select` (chapter 02).
# A tree proposer returns `tree.pack(rows)`: per row `(tokens, parents)`, padded into a
# `Proposal(tokens, valid, q=None, calls, tree=Tree(parents))`; the core then does what we did
# by hand: `Tree.feed` (one forward with the ancestor mask), `Tree.verify` (the walk) and
# `Tree.compact` (move_slots). `accept` gets the accepted node indices in `verdict.path`.
# The tree's depth is capped by what a row still needs (`caps`).

# %%
class TopKTree:
    def __init__(self, draft, widths=WIDTHS):
        self.draft, self.widths = draft, widths

    def start(self, ids, mask, settings):                  # left-padded prompts -> each row's real tokens
        real = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
        self.ctx = [row[k].tolist() for row, k in zip(ids.cpu(), real.cpu())]

    def propose(self, caps):
        self.rows = [grow(self.draft, c, self.widths[:cap]) for c, cap in zip(self.ctx, caps)]
        return tree.pack(self.rows, calls=min(len(self.widths), max(caps)))

    def accept(self, v):
        for r, (n, t) in enumerate(zip(v.n_list, v.next.tolist())):
            self.ctx[r] += [self.rows[r][0][i] for i in v.path[r, :n].tolist()] + [t]

    def select(self, rows):
        self.ctx = [self.ctx[i] for i in rows.tolist()]

# %% [markdown]
# Run it on the ragged batch of three prompts: the output must be exactly greedy decoding, and
# exactly what the library's version of this proposer (`tree.DraftTree`, run by `tree.generate`) does.

# %%
mine = speculative.decode(lm, TopKTree(dr), prompts, max_new_tokens=NEW_TOKENS, eos_token_id=[])
assert mine.tokens == ar, "a greedy tree walk must reproduce greedy decoding"
lib = tree.generate(lm, dr, prompts, max_new_tokens=NEW_TOKENS, eos_token_id=[], widths=WIDTHS)  # refimpl's DraftTree
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
    r = speculative.generate(lm, dr, prompts, gamma=g, max_new_tokens=NEW_TOKENS, eos_token_id=[])
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
p = torch.softmax(lm.logits(torch.tensor([ctx]))[0, -1].double(), -1)
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
settings = speculative.Sampling(temperature=1.0, generator=torch.Generator().manual_seed(SEED))
star = tree.Tree(torch.tensor([[ROOT] * 4]))                   # four children of the root
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
# accepted path. The last lines move a slider from code and check that the picture changed.

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
ui = widgets.interact(play, prompt=widgets.IntSlider(value=0, min=0, max=len(prompts) - 1),
                      k1=widgets.IntSlider(value=2, min=1, max=4), k2=widgets.IntSlider(value=2, min=1, max=4)).widget
before = shown
ui.children[1].value = 1                                    # move the k1 slider, as a person would
assert shown != before, "moving a slider must change the output"
print(before, "->", shown)

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
# - Which tree shape is best (Sequoia, OPT-Tree, DySpec) depends on the draft's acceptance
#   profile and on how much a wider forward costs on the hardware.
