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
# # 09 · Retrieval drafting: prompt lookup, suffix automata, token recycling
#
# Chapters 02-04 drafted with a second, smaller model. Text often repeats itself: a refrain, a
# formula, a passage being summarised or rewritten, the model's own loops. Then the draft can
# simply be **looked up** in the context: no draft model, no draft forward passes, and the
# verification core of chapter 02 keeps the output exactly the target's.
#
# Three ways to look it up:
#
# - **prompt lookup** (Saxena 2023; LLMA, arXiv 2304.04487): find the latest earlier occurrence
#   of the last `n` tokens (`n = 3, 2, 1`) and propose the tokens that followed it;
# - **SAM decoding** (Hu et al., arXiv 2411.10666): a suffix automaton over prompt + output finds
#   the *longest* suffix that occurred before, in O(1) amortised time per token;
# - **token recycling** (Luo et al., arXiv 2408.08696): remember each token's latest top-k
#   successors (which every verification computes anyway) and draft a whole token tree from them.
#
# **After this chapter you can**
#
# 1. write prompt lookup as a proposer for `speculative.decode` and show that it reproduces greedy decoding;
# 2. say what a state and a suffix link of a suffix automaton are, and check its longest-match answer against brute force;
# 3. read a token-recycling draft tree off a successor table and a static template, and verify it with the tree core;
# 4. predict on which prompts each method has a high tau, and see which tokens were copied;
# 5. explain why a deterministic draft (one-hot `q`) keeps sampling lossless, and test it.

# %%
import torch
from refimpl.models import default_device

FAST = True                        # CI default: short generations, few samples
MODEL = "tiny"                     # the zoo's 4-layer Llama trained on the King James Bible
DEVICE = default_device()          # a torch.device: CUDA when present, $REFIMPL_DEVICE overrides
NEW_TOKENS = 32 if FAST else 160
SAMPLES = 300 if FAST else 3000    # for the losslessness check
SEED = 0
SHOW_SOLUTIONS = False

# %% [markdown]
# ## The model, the prompts and the ground truth
# Three prompts that repeat themselves (a refrain, a genealogy formula, the beatitudes) and one
# that does not. Greedy autoregressive decoding is the ground truth every method must reproduce.

# %%
from refimpl import models, autoregressive, speculative
from solutions import exercise, check, show

lm = models.load(MODEL, device=DEVICE)
PROMPTS = {
    "psalm 136": "O give thanks unto the LORD; for he is good: for his mercy endureth for ever. O give thanks unto the God of gods: for his mercy endureth for ever. O give thanks to the Lord of lords: for his mercy endureth for ever. To him who alone doeth great wonders: for his mercy",
    "genealogy": "And Adam lived an hundred and thirty years, and begat a son; and all the days that Adam lived were nine hundred and thirty years: and he died. And Seth lived an hundred and five years, and begat Enos: and all the days that Seth lived were nine hundred and twelve years: and he died. And Enos lived",
    "beatitudes": "Blessed are the poor in spirit: for theirs is the kingdom of heaven. Blessed are they that mourn: for they shall be comforted. Blessed are the meek: for they shall inherit the earth. Blessed are they which do hunger and thirst after righteousness: for they shall",
    "lilies (no repeats)": "Consider the lilies of the field, how they grow",
}
ids = {k: lm.encode(v) for k, v in PROMPTS.items()}
ar = {k: autoregressive.generate(lm, [v], max_new_tokens=NEW_TOKENS, eos_token_id=[]).tokens[0] for k, v in ids.items()}
for k in PROMPTS:
    print(f"{k:20s} {len(ids[k]):3d} prompt tokens -> {lm.decode(ar[k])[:90]!r}")

# %% [markdown]
# ## Prompt lookup by hand
# The rule: with `t` the last position, try `n = max_ngram, ..., min_ngram`; for the first `n`
# whose last-`n`-token suffix occurred **earlier** (ending before `t`), take the *latest* such
# occurrence and propose what followed it. Scanning the whole text every step is quadratic, so
# keep an index instead: for every n-gram, the position just after its latest occurrence. An
# n-gram ending at `i` enters the index when token `i + 1` arrives, so the suffix never finds itself.

# %%
class NgramIndex:
    def __init__(self, max_ngram=3, tokens=()):
        self.max_ngram, self.text, self.after = max_ngram, [], {}   # n-gram -> position after it
        self.extend(tokens)

    def extend(self, tokens):
        for t in tokens:
            self.text.append(t)
            i = len(self.text) - 2                                 # n-grams ending at i now have a successor
            for n in range(1, min(self.max_ngram, i + 1) + 1):
                self.after[tuple(self.text[i - n + 1: i + 1])] = i + 1  # later occurrences overwrite

    def lookup(self, min_ngram=1):                                 # -> position after the match, or -1
        for n in range(self.max_ngram, min_ngram - 1, -1):
            at = self.after.get(tuple(self.text[-n:]), -1) if len(self.text) > n else -1
            if at >= 0:
                return at
        return -1

# %% [markdown]
# ## A proposer for the verification core
# `speculative.decode` drives any `speculative.Proposer`, four methods: `start` gets the
# left-padded prompts and returns what the proposer needs from the loop (`speculative.Needs()`:
# nothing here), `propose(caps)` returns a `Proposal` of at most `caps[b]` tokens per row,
# `accept(verdict)` learns what each row committed (`verdict.committed[b]`: the accepted drafts, then
# the target's own token), and `select(rows)` drops finished rows. A lookup is deterministic, so there is no `q` (the core treats it as one-hot).

# %%
class HandLookup(speculative.Proposer):
    def __init__(self, num_tokens=10, max_ngram=3, min_ngram=1):
        self.num_tokens, self.max_ngram, self.min_ngram = num_tokens, max_ngram, min_ngram

    def start(self, ids, mask, settings):                 # the prompts, left-padded (mask None: no padding)
        real = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
        self.rows = [NgramIndex(self.max_ngram, row[keep].tolist()) for row, keep in zip(ids, real)]
        self.device = ids.device                          # the target's: proposals are built there
        return speculative.Needs()                        # no features, no prompt logits, chains

    def propose(self, caps):
        xs = [ix.text[a: a + min(self.num_tokens, c)] if (a := ix.lookup(self.min_ngram)) >= 0 else []
              for ix, c in zip(self.rows, caps)]
        g = max(map(len, xs))
        tokens = torch.tensor([x + [0] * (g - len(x)) for x in xs], dtype=torch.long, device=self.device).view(len(caps), g)
        return speculative.Proposal(tokens, torch.tensor([len(x) for x in xs], device=self.device))

    def accept(self, v):                                  # accepted drafts + the target's token
        for ix, new in zip(self.rows, v.committed):
            ix.extend(new)

    def select(self, rows):
        self.rows = [self.rows[i] for i in rows.tolist()]

# %% [markdown]
# On the psalm the last three tokens occurred before, and what followed them is the refrain. Then
# run the proposer on the psalm and the lilies as one ragged batch: it must give exactly the greedy
# tokens, and exactly what `refimpl.retrieval` gives (same lookup rule, so the same steps too).

# %%
from refimpl import retrieval

psalm = NgramIndex(3, ids["psalm 136"])
at = psalm.lookup()
print("psalm: suffix", repr(lm.decode(psalm.text[-3:])), "-> proposal", repr(lm.decode(psalm.text[at: at + 10])))
pair = ["psalm 136", "lilies (no repeats)"]                     # a ragged batch: 62 and 14 prompt tokens
mine = speculative.decode(lm, HandLookup(), [ids[k] for k in pair], max_new_tokens=NEW_TOKENS, eos_token_id=[])
ref = retrieval.generate(lm, [ids[k] for k in pair], max_new_tokens=NEW_TOKENS, method="prompt_lookup", eos_token_id=[])
assert mine.tokens == [ar[k] for k in pair], "prompt lookup must reproduce greedy decoding"
assert mine.tokens == ref.tokens and mine.stats.accepted == ref.stats.accepted
print("hand-built == refimpl == greedy | accepted drafts per step (psalm, lilies):", mine.stats.accepted)
print(f"tau {mine.stats.tau:.2f} | target calls {mine.stats.target_calls} | draft calls {mine.stats.draft_calls}")

# %% [markdown]
# ### Exercise 1: the lookup as a plain scan
# Write `lookup(tokens, max_ngram, min_ngram)`: for `n = max_ngram` down to `min_ngram`, find the
# **latest** `i` with `tokens[i : i + n] == tokens[-n:]` whose occurrence ends before the last
# position (`i + n - 1 < len(tokens) - 1`); return `i + n` (the position after it) for the first
# `n` that has one, else `-1`. An `n` with `len(tokens) <= n` has no earlier occurrence. No index,
# no automaton: two loops. The check compares it with `refimpl.primitives.lookup_positions`, the
# vectorised version, on random token strings. (A scan costs a pass over the history at every step;
# the library's `PromptLookup` keeps `primitives.NgramIndex` instead, a dict from each n-gram to the
# position after its latest occurrence, updated as tokens arrive: one dict query a step, the same answers.)

# %%
@exercise("09", "lookup")
def lookup(tokens, max_ngram=3, min_ngram=1):
    # your code here
    raise NotImplementedError

# %% [markdown]
# The check (random strings over 3 symbols, so matches of every length occur):

# %%
import random
from refimpl import primitives


def check_lookup():
    rng = random.Random(SEED)
    for _ in range(300):
        toks, hi = [rng.randrange(3) for _ in range(rng.randrange(1, 25))], rng.randint(1, 4)
        lo = rng.randint(1, hi)
        want = int(primitives.lookup_positions(torch.tensor(toks, device=DEVICE), torch.tensor([len(toks) - 1], device=DEVICE), hi, lo)[0])
        assert lookup(toks, hi, lo) == want, f"lookup({toks}, {hi}, {lo}) returned {lookup(toks, hi, lo)}, expected {want}"


check("Exercise 1", check_lookup)
if SHOW_SOLUTIONS:
    show("09", "lookup")

# %% [markdown]
# ## SAM decoding: the longest earlier suffix
# Prompt lookup caps the match at 3 tokens. SAM decoding asks for the **longest** suffix of the
# text that also occurred earlier, however long, and proposes what followed its first occurrence.
# Brute force needs O(L²) work per token. A **suffix automaton** answers in O(1) amortised:
#
# - every substring `w` has an *endpos* set: where its occurrences end. Substrings with the same
#   endpos form one **state**; a state's strings are suffixes of each other with consecutive
#   lengths (`len(link) + 1 .. len`). A text of `L` tokens needs at most `2L - 1` states;
# - a **transition** `s --t--> s'` appends token `t`; the **suffix link** of `s` points to the state
#   of the longest suffix that is *not* in `s` (its endpos is strictly larger);
# - appending a token (Blumer et al., 1985) adds one state, sometimes clones one, and walks suffix
#   links: amortised O(1). The *match* moves the same way: from the previous match, follow suffix
#   links until the new token has a transition, then take it (`SuffixAutomaton.extend`).
#
# First the definition by brute force, then `retrieval.SuffixAutomaton` against it on random strings.

# %%
def longest_earlier_suffix(text):   # -> (n, after): longest suffix also ending before the end; after its 1st occurrence
    L = len(text)
    for n in range(L - 1, 0, -1):
        for i in range(L - n):                                   # text[i:i+n] ends at i+n-1 < L-1
            if text[i:i + n] == text[L - n:]:
                return n, i + n
    return 0, -1


rng = random.Random(SEED)
for _ in range(150):
    text, sam = [rng.randrange(3) for _ in range(rng.randrange(1, 40))], retrieval.SuffixAutomaton()
    for j, t in enumerate(text):
        sam.extend(t)                                            # one token at a time, as in decoding
        n, after = longest_earlier_suffix(text[:j + 1])
        assert sam.match_len == n and (n == 0 or sam.end[sam.state] + 1 == after)
    assert len(sam.length) <= max(2 * len(text) - 1, 2)           # at most 2L - 1 states (+ the root)
print("SuffixAutomaton == brute force on 150 random strings")

# %% [markdown]
# ## What is inside: states are endpos classes
# The automaton of `a b c b c`. A state's strings are the paths from the root to it; by brute force
# we compute each string's endpos and check that a state is exactly one endpos class, that its
# lengths run from `len(link) + 1` to `len`, and that `end` (used for the continuation) is the first end position.

# %%
def strings_of(sam, s=0, w=(), out=None):             # every path from the root, by the state it reaches
    out = {} if out is None else out
    out.setdefault(s, []).append(w)
    for t, d in sam.next[s].items():
        strings_of(sam, d, w + (t,), out)
    return out


def endpos(w, text):
    return tuple(i + len(w) - 1 for i in range(len(text) - len(w) + 1) if tuple(text[i:i + len(w)]) == w)


small = retrieval.SuffixAutomaton(list("abcbc"))
strs = strings_of(small)
print("state len link endpos     strings")
for s in range(1, len(small.length)):
    ends = {endpos(w, small.text) for w in strs[s]}
    assert len(ends) == 1 and min(next(iter(ends))) == small.end[s]          # one endpos class, first end
    assert sorted(map(len, strs[s])) == list(range(small.length[small.link[s]] + 1, small.length[s] + 1))
    print(f"{s:5d} {small.length[s]:3d} {small.link[s]:4d} {str(ends.pop()):10s} {sorted(''.join(w) for w in strs[s])}")

# %% [markdown]
# The same object drawn: transitions on top (the real `next` dictionaries), suffix links below
# (the real `link` array). States sit at x = their longest string's length; states 5 and 7 are
# **clones**, created when `b` and then `bc` turned out to end in two places. The yellow state is `last`.

# %%
import matplotlib.pyplot as plt


def draw_automaton(sam, ax, links):
    xy = {}                                            # x = longest length; states of equal length stacked
    for s in sorted(range(len(sam.length)), key=lambda s: (sam.length[s], s)):
        xy[s] = (2.0 * sam.length[s], -1.5 * sum(sam.length[r] == sam.length[s] for r in xy))
    style = dict(arrowstyle="-|>", shrinkA=13, shrinkB=13)
    for s, (x, y) in xy.items():
        for t, d in ([] if links else sam.next[s].items()):
            ax.annotate("", xy=xy[d], xytext=(x, y), arrowprops=dict(color="k", **style))
            ax.text(x + 0.45 * (xy[d][0] - x), y + 0.45 * (xy[d][1] - y), t, color="navy", ha="center", va="center", bbox=dict(fc="w", ec="none", pad=0.5))
        if links and sam.link[s] >= 0:
            ax.annotate("", xy=xy[sam.link[s]], xytext=(x, y), arrowprops=dict(color="crimson", ls="--", connectionstyle="arc3,rad=0.3", **style))
        ax.add_patch(plt.Circle((x, y), 0.42, fc="#ffe8a3" if s == sam.last else "#dde8ff", ec="k"))
        ax.text(x, y, str(s), ha="center", va="center")
    ax.set_title("suffix links" if links else "transitions (append one token)", fontsize=9)
    ax.set_aspect("equal"); ax.axis("off"); ax.autoscale_view()


fig, axes = plt.subplots(2, 1, figsize=(9, 5))
draw_automaton(small, axes[0], links=False); draw_automaton(small, axes[1], links=True)
plt.show()

# %% [markdown]
# ## Token recycling: a successor table and a static tree
# Every verification computes the target's distribution after the root and after every draft
# token. Its top-k tokens are candidates the target itself likes *after that token*; token
# recycling keeps, for every token, the latest top-k list (a `(V, k)` table, `k = 8`), overwriting
# the row each time the token is scored again. To draft, it follows a **static template** of rank
# paths from the last token: `(0, 2)` = "the 3rd successor of the 1st successor". The template
# (`recycling_template`, 80 nodes) is best-first by `prod 0.8 / (rank + 1)`: wide near the root,
# deep along rank 0.

# %%
from refimpl.tree import ROOT
from figures import draw_tree                            # notebooks/figures.py (chapter 05 draws trees the same way)

template = retrieval.recycling_template()                 # 80 rank paths, parents first
node = {path: i for i, path in enumerate(template)}
fig, ax = plt.subplots(figsize=(10, 7))
draw_tree([str(p[-1]) for p in template], [node.get(p[:-1], ROOT) for p in template], ax, fontsize=7)
ax.set_title(f"the static template: {len(template)} nodes, depth <= {max(map(len, template))}", fontsize=9)
plt.show()

# %% [markdown]
# ## A real table after a few steps
# Run recycling alone on the psalm (the proposer of `retrieval.generate(method="recycling")`) and
# look at its table. The table starts empty, so the first steps draft nothing; once the output
# revisits tokens the target has already scored, drafts appear.

# %%
recycler = retrieval.SuffixAndRecycling(sam=False, recycling=True, num_tokens=16, min_match=None, k=8, nodes=80)
run = speculative.decode(lm, recycler, [ids["psalm 136"]], max_new_tokens=NEW_TOKENS - 8, eos_token_id=[])
table = recycler.tables[0]                                # a RecyclingTable: token -> its latest top-8 successors
context = ids["psalm 136"] + run.tokens[0]
root = context[-1]
print("accepted per step:", [a[0] for a in run.stats.accepted])
print(f"{len(table.succ)} tokens have a row; the row of {lm.decode([root])!r}:", [lm.decode([t]) for t in table.succ[root]])
draft_tokens, draft_parents = table.draft(root, cap=NEW_TOKENS)
print(len(draft_tokens), "draft nodes from the template")

# %% [markdown]
# ## Verified by the tree core
# The draft tree goes through `refimpl.tree` (chapter 05): one target forward over the context plus
# all nodes (each node sees its ancestors only, position = depth), then a greedy walk from the root.
# The accepted path plus the target's next token must be exactly what greedy decoding continues with.
# Below, the draft tree with its tokens, the accepted path in green. Most nodes are wasted, but on a
# memory-bound accelerator scoring 70 tokens in one pass costs about as much as scoring one, and
# their top-k lists refill the table for free.

# %%
from refimpl import tree

prop = tree.pack([(draft_tokens, draft_parents)], DEVICE)            # on the target's device
slots = speculative.SlotCache(lm, 1, lm.device)
m = prop.tokens.shape[1]                                             # nodes; keep the logits after the root and each
logits = prop.tree.feed(slots, torch.tensor([context], device=DEVICE), None, prop.tokens, prop.valid, keep=m + 1).logits
n, nxt, path = prop.tree.verify(prop.tokens, logits, prop.valid, None, speculative.Sampling(0.0))
accepted = [draft_tokens[i] for i in path[0].tolist()]
greedy = autoregressive.generate(lm, [context], max_new_tokens=len(accepted) + 1, eos_token_id=[]).tokens[0]
assert accepted + [int(nxt[0])] == greedy
print(f"one target call accepted {int(n[0])} of {len(draft_tokens)} nodes: {lm.decode(accepted)!r} + {lm.decode([int(nxt[0])])!r}")
fig, ax = plt.subplots(figsize=(11, 8))
draw_tree([lm.decode([t]).strip() or repr(lm.decode([t])) for t in draft_tokens], draft_parents, ax,
          root=lm.decode([root]).strip(), green=set(path[0].tolist()), fontsize=7)
ax.set_title(f"draft tree below {lm.decode([root])!r}; accepted path in green", fontsize=9)
plt.show()

# %% [markdown]
# ### Exercise 2: the draft tree from a table and a template
# Write `draft_tree(succ, template, root, cap)` -> `(tokens, parents)`: `succ` maps a token to its
# list of successors by rank, `template` is a list of rank paths with parents first. Walk the
# template in order; the path `(r_1, ..., r_d)` becomes a node when `d <= cap`, its parent path
# `(r_1, ..., r_{d-1})` became a node (the empty path is the root, `parents` entry `-1`), and the
# parent's token (`root` for the empty path) has a row in `succ` with more than `r_d` entries; its
# token is that row's entry `r_d`. Return the nodes in the order they were made.

# %%
@exercise("09", "draft_tree")
def draft_tree(succ, template, root, cap):
    # your code here
    raise NotImplementedError

# %% [markdown]
# The check: against `RecyclingTable.draft` on the real table (every root it knows, depth caps 1 to
# 12) and on small random tables with short rows and missing tokens.

# %%
def check_draft_tree():
    rng = random.Random(SEED)
    for r, cap in [(r, rng.randint(1, 12)) for r in list(table.succ)[:20]]:
        got, want = draft_tree(table.succ, template, r, cap), table.draft(r, cap)
        assert tuple(got) == want, f"root {r}, cap {cap}: {len(got[0])} nodes, expected {len(want[0])}"
    for _ in range(50):
        toy = retrieval.RecyclingTable(retrieval.recycling_template(rng.randint(1, 30), 3))
        toy.succ = {t: [rng.randrange(6) for _ in range(rng.randint(1, 3))] for t in range(6) if rng.random() < 0.7}
        got, want = draft_tree(toy.succ, toy.template, 0, 4), toy.draft(0, 4)
        assert tuple(got) == want, f"table {toy.succ}, template {toy.template}: got {got}, expected {want}"


check("Exercise 2", check_draft_tree)
if SHOW_SOLUTIONS:
    show("09", "draft_tree")

# %% [markdown]
# ## Four methods, one answer: greedy equality and tau
# `retrieval.generate(method=...)` for prompt lookup, SAM, recycling, and SAM with recycling as the
# fallback when the suffix match is shorter than 5 tokens. All must return the greedy tokens;
# what differs is tau, the tokens emitted per target call (table and chart).
#
# Lookups (prompt lookup, SAM) live on exact repeats: they do best on the refrain and the genealogy
# and worst on the prompt that does not repeat, where all they find is the model's own loops.
# Recycling needs no exact repeat, only tokens the target has scored before, so it helps everywhere.
# The tiny model loops a lot, which every method exploits (larger models loop less; the benchmark,
# `refimpl.bench`, measures these methods per task category on SmolLM2).

# %%
taus = {}
for name, prompt in ids.items():
    for method in retrieval.METHODS:
        r = retrieval.generate(lm, [prompt], max_new_tokens=NEW_TOKENS, method=method, eos_token_id=[])
        assert r.tokens[0] == ar[name], f"{method} on {name} differs from greedy"
        taus[name, method] = r.stats.tau
print(f"{'tau':20s}" + "".join(f"{m:>15s}" for m in retrieval.METHODS))
for name in ids:
    print(f"{name:20s}" + "".join(f"{taus[name, m]:15.2f}" for m in retrieval.METHODS))
assert sum(taus[k, "prompt_lookup"] for k in list(ids)[:3]) / 3 > taus["lilies (no repeats)", "prompt_lookup"]
fig, ax = plt.subplots(figsize=(9, 3.2))
for j, method in enumerate(retrieval.METHODS):
    ax.bar([i + (j - 1.5) * 0.2 for i in range(len(ids))], [taus[k, method] for k in ids], 0.2, label=method)
ax.axhline(1, color="k", lw=0.8)
ax.set_xticks(range(len(ids)), list(ids)); ax.set_ylabel("tau (tokens / target call)"); ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## Where did each token come from?
# Wrap a proposer to record, at every step, whether the draft was a copied chain (prompt lookup, or SAM
# with a long enough match) or a recycled tree. In a step that accepted `n` drafts the first `n`
# tokens came from the context and the last one is the target's own. `retrieval.make_proposer` builds
# the proposer `retrieval.generate` decodes with, and the wrapper hands on everything the proposer
# contract asks for, `start`'s `Needs` included (recycling needs the target's logits over the
# prompt): so the tau printed above the colours is the table's.

# %%
from html import escape
from IPython.display import HTML, display

COLOURS = {"copied": "#b7e4c7", "recycled": "#d7c6f5", "target": "#f1f1f1"}


def make_proposer(method, num_tokens=None, min_match=None):
    """`retrieval.generate`'s proposer; `min_match` is prompt lookup's shortest n-gram, SAM's shortest match."""
    if method == "prompt_lookup" and min_match is not None:
        return retrieval.make_proposer(lm, method, num_tokens, max_ngram=max(3, min_match), min_ngram=min_match)
    return retrieval.make_proposer(lm, method, num_tokens, min_match=min_match if "sam" in method else None)


class Recorder:                                        # passes everything through, remembers the draft's source
    def __init__(self, inner):                         # start is the inner's: its Needs reach the loop unchanged
        self.inner, self.kinds, self.start, self.accept, self.select = inner, [], inner.start, inner.accept, inner.select

    def propose(self, caps):
        sam = getattr(self.inner, "automata", None)     # SAM drafts a chain when its match is long enough
        chain = isinstance(self.inner, retrieval.PromptLookup) or (sam is not None and sam[0].match_len >= self.inner.min_match)
        self.kinds.append("copied" if chain else "recycled")
        return self.inner.propose(caps)

# %% [markdown]
# Colour the text step by step, with a legend, and show the psalm and the lilies under SAM + recycling.

# %%
def coloured(prompt_name, method, num_tokens=None, min_match=None):
    rec = Recorder(make_proposer(method, num_tokens, min_match))
    r = speculative.decode(lm, rec, [ids[prompt_name]], max_new_tokens=NEW_TOKENS, eos_token_id=[])
    assert r.tokens[0] == ar[prompt_name]                            # still the greedy text
    if num_tokens is None and min_match is None:                     # the table's settings: the table's tau
        assert r.stats.tau == taus[prompt_name, method], f"{r.stats.tau} != {taus[prompt_name, method]}"
    toks, spans, i = r.tokens[0], [], 0
    for (n,), kind in zip(r.stats.accepted, rec.kinds):
        for k in range(min(n + 1, len(toks) - i)):
            spans.append(f'<span style="background:{COLOURS[kind if k < n else "target"]}">{escape(lm.decode([toks[i]]))}</span>')
            i += 1
    legend = " ".join(f'<span style="background:{c}">&nbsp;{k}&nbsp;</span>' for k, c in COLOURS.items())
    return (f"<b>{prompt_name} · {method}: tau {r.stats.tau:.2f}, {r.stats.target_calls} target calls for {len(toks)} tokens</b> "
            f"{legend}<br><span style='font-family:monospace'>{''.join(spans)}</span>")


for name in ("psalm 136", "lilies (no repeats)"):
    display(HTML(coloured(name, "sam+recycling")))

# %% [markdown]
# ## Sampling: a deterministic draft is a one-hot `q`
# A lookup proposes `x` with certainty: `q = onehot(x)`. The rule of chapter 03 becomes: accept with
# probability `min(1, p(x)/1) = p(x)`; after a rejection sample from `norm(max(0, p - onehot(x)))`,
# i.e. `p` with `x` removed. Then `P(emit x) = p(x)` and, for `y != x`,
# `P(emit y) = (1 - p(x)) · p(y) / (1 - p(x)) = p(y)`: lossless, whatever was retrieved.
#
# A small empirical check: `SAMPLES` copies of a refrain prompt whose lookup proposes `" endureth"`
# (the target gives it about one half), temperature 1, three tokens each; the first two tokens go
# through the rule. Their joint frequencies are compared with the exact `p(y1) p(y2 | y1)` by a
# chi-square test (cells expected below 5 pooled). On a CPU the verification uses the torch reference
# of the rejection kernel (same draws as the Triton kernel, chapter 03; the interpreter is slow).

# %%
from collections import Counter
from scipy.stats import chisquare
from kernels.rejection_sample import rejection_sample, rejection_sample_reference

RULE = rejection_sample if DEVICE.type == "cuda" else rejection_sample_reference
refrain = lm.encode("for his mercy endureth for ever. O give thanks unto the LORD: for his mercy")


def pair_pvalue(rule):
    r = speculative.decode(lm, retrieval.PromptLookup(10, 3, 1), [refrain] * SAMPLES, max_new_tokens=3, temperature=1.0,
                           generator=torch.Generator(device=DEVICE).manual_seed(SEED), eos_token_id=[], rule=rule)
    pairs = Counter(tuple(t[:2]) for t in r.tokens)
    firsts = sorted({a for a, _ in pairs})
    p = torch.softmax(lm.logits(torch.tensor([refrain + [a] for a in firsts], device=DEVICE))[:, -2:].float(), -1)
    exp = {(a, b): SAMPLES * float(p[0, 0, a] * p[firsts.index(a), 1, b]) for a, b in pairs}
    big = [k for k in pairs if exp[k] >= 5]
    obs, e = [pairs[k] for k in big], [exp[k] for k in big]
    return chisquare(obs + [SAMPLES - sum(obs)], e + [SAMPLES - sum(e)]).pvalue, pairs.most_common(3)

# %% [markdown]
# The right rule, and a plausible wrong one as a negative control: after rejecting `x`, resample from
# the full `p` (forgetting to remove `x`). That emits `x` with probability `p(x) + (1 - p(x)) p(x)`.

# %%
def resample_from_full_p(x, p, q, u, valid):           # WRONG on purpose
    n, nxt = RULE(x, p, q, u, valid)
    cdf = p[torch.arange(len(n), device=p.device), n].cumsum(-1)          # (b, V) at the first rejection
    redo = (cdf < u[:, -1:] * cdf[:, -1:]).sum(-1).clamp(max=p.size(-1) - 1)
    return n, torch.where(n < valid, redo, nxt)


pv_good, top = pair_pvalue(RULE)
pv_bad, _ = pair_pvalue(resample_from_full_p)
print("most frequent pairs:", [(lm.decode(list(k)), c) for k, c in top])
print(f"lossless rule: p-value {pv_good:.3f} | wrong rule: p-value {pv_bad:.1e}")
assert pv_good > 1e-3 and pv_bad < 1e-3

# %% [markdown]
# ## Play: method, draft length, minimum match
# Pick a prompt and a method; `num_tokens` caps the copied chain (prompt lookup, SAM), `min_match`
# is the shortest n-gram prompt lookup accepts and the shortest suffix match SAM uses (below it,
# SAM + recycling falls back to the table). Recycling alone ignores both. Picking a method puts the
# sliders at its preset, the table's settings; the line above the text says when they differ. The text
# never changes (it is always the greedy text); the colours and tau do.

# %%
import ipywidgets as widgets


def preset_of(method):                                  # (num_tokens, min_match) of the method's preset: the table's
    o = retrieval.PRESETS["cpu" if method == "prompt_lookup" else method]
    return o["num_tokens"], o["min_match"] if "sam" in method else (o["min_ngram"] if method == "prompt_lookup" else None)


def play(prompt="psalm 136", method="prompt_lookup", num_tokens=10, min_match=1):
    global shown
    table = preset_of(method)
    same = method == "recycling" or (num_tokens, min_match) == table   # recycling alone reads neither slider
    shown = coloured(prompt, method, *((None, None) if same else (num_tokens, min_match)))
    note = "the table's settings" if same else f"the table above uses num_tokens {table[0]}, min_match {table[1]}"
    display(HTML(f"<i>num_tokens {num_tokens}, min_match {min_match}: {note}</i><br>{shown}"))


ui = widgets.interact(play, prompt=widgets.Dropdown(options=list(ids)), method=widgets.Dropdown(options=retrieval.METHODS),
                      num_tokens=widgets.IntSlider(continuous_update=False, value=10, min=1, max=24), min_match=widgets.IntSlider(continuous_update=False, value=1, min=1, max=8)).widget


def to_preset(change):                                  # a new method: its sliders at the table's settings
    n, m = preset_of(change["new"])
    ui.children[2].value = n
    ui.children[3].value = m if m is not None else ui.children[3].value


ui.children[1].observe(to_preset, names="value")

# %% jupyter={"source_hidden": true} tags=["ci-only", "remove-input"]
# CI's self-test of the widget above (collapsed in the lab): move a control as a person would,
# check that the output changed, then put the control back to its teaching default
default = ui.children[2].value
before = shown
ui.children[2].value = 1                               # move the num_tokens slider, as a person would
assert shown != before, "moving a control must change the output"
ui.children[2].value = default

# %% jupyter={"source_hidden": true} tags=["ci-only", "remove-input"]
# CI's self-test: another method puts the sliders at its preset, so the widget shows the table's tau
default = ui.children[1].value
ui.children[1].value = "sam+recycling"
assert (ui.children[2].value, ui.children[3].value) == preset_of("sam+recycling") and f"tau {taus['psalm 136', 'sam+recycling']:.2f}" in shown
ui.children[1].value = default

# %% [markdown]
# ## Summary
# - Retrieval drafts cost no draft model and no draft forward: prompt lookup is a hash lookup, SAM an
#   O(1) amortised automaton step, recycling a table read. All three are deterministic, verified as
#   one-hot `q`, so greedy output is the target's and sampling stays lossless.
# - They pay off exactly where text repeats: copy, edit, summarise, answer from a passage, code,
#   and a model's own loops. On free text a lookup rarely fires; recycling still finds something,
#   because it remembers what the target itself ranked highly after each token.
# - SAM and prompt lookup differ in match length and in which occurrence they copy (the first vs
#   the latest); SAM + recycling combines a long exact copy when there is one with a tree otherwise.
# - `retrieval.generate(target, prompts)` runs `retrieval.PRESETS["cpu"]`: prompt lookup, 10 tokens,
#   n-grams 3 down to 1 (also the original script's settings); `method="sam"` or `"recycling"` takes
#   that rule's preset. `refimpl.generate(target, prompts, method="prompt_lookup")` is the same call.
# - Next: the benchmark (`refimpl.bench`) measures tau and wall time of these methods per task
#   category on SmolLM2.
