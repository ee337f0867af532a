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
# # 08 · Lookahead decoding
#
# Fu, Bailis, Stoica, Zhang, *Break the Sequential Dependency of LLM Inference Using Lookahead
# Decoding* (arXiv 2402.02057, §3, Algorithm 1). No draft model, no training: the target drafts
# for itself by running Jacobi iterations *on the side*, remembers the n-grams those iterations
# produce, and verifies the remembered n-grams that fit, all in **one** forward pass per step.
# The output is exactly the target's (greedy: token for token; sampling: in distribution).
#
# After this chapter you can:
#
# - place every token of the 2-D lookahead window (W columns x N - 1 levels) at its position and
#   write down its "staircase" attention mask;
# - draw the whole one-forward attention mask: root, lookahead branch, verification branch;
# - say which N-grams a step harvests into the pool, and which pooled guesses it verifies;
# - predict how many tokens one step scores from (W, N, G), and why that is cheap on a GPU and
#   not free on a CPU;
# - verify a trie of guesses greedily, and explain why the sampling rule stays lossless;
# - read tau off a real run, and see which tokens came from the pool.
#
# ## Parameters
# `W, N, G` are the paper repository's defaults: window 7, n-gram size 5, at most 7 guesses.
# `SMALL` is a toy setting for the pictures.

# %%
import torch
from refimpl.models import default_device

FAST = True                        # CI default: short runs, small samples
MODEL = "tiny"                     # the zoo's 4-layer Llama trained on the King James Bible
DEVICE = default_device()          # a torch.device: CUDA when present, $REFIMPL_DEVICE overrides
W, N, G = 7, 5, 7                  # window, n-gram size, guesses
SMALL = dict(window=4, ngram=4, guesses=3, pool_from_prompt=False)
NEW_TOKENS = 32 if FAST else 96
SAMPLES = 300 if FAST else 3000    # for the sampling check
SEED = 0
SHOW_SOLUTIONS = False

# %% [markdown]
# ## Model and prompts
# The chapter builds the mechanism by hand and checks it against `refimpl.lookahead` at each
# stage; the verification core (`refimpl.speculative.decode`) and token trees (`refimpl.tree`)
# come from chapters 02-05, Jacobi decoding from chapter 07.

# %%
import matplotlib.pyplot as plt
from refimpl import models, autoregressive, jacobi, speculative, tree
from refimpl.prompts import encode_prompt
from solutions import exercise, check, show

torch.set_grad_enabled(False)
lm = models.load(MODEL, device=DEVICE)
texts = ["And God said, Let there be light: and there was light. And God",
         "In the beginning God created the heaven and the earth.",
         "And the LORD spake unto Moses, saying"]
prompts = [encode_prompt(lm, t) for t in texts]
print(lm.name, "| prompt lengths", [len(p) for p in prompts])

# %% [markdown]
# ## From Jacobi to lookahead
# Jacobi decoding (chapter 07) guesses a block of future tokens and updates all of them at once
# with the target's argmax, `y_i <- argmax p(. | x, y_<i)`; whatever prefix stops changing is
# committed. Its problem: a guess is right only if everything before it is right, so the
# trajectories rarely converge more than one token at a time:

# %%
r_jac = jacobi.generate(lm, prompts[:1], max_new_tokens=NEW_TOKENS, window=8)
print(f"Jacobi, window 8: tau = {r_jac.stats.tau:.2f} tokens per forward")

# %% [markdown]
# Lookahead's fix: the trajectories are still useful. A Jacobi iteration often produces a
# *correct n-gram at the wrong position* (e.g. "the LORD said" three tokens too early). So
#
# 1. keep the recent Jacobi trajectories in a 2-D **window** (the *lookahead branch*);
# 2. **harvest** the n-grams they trace into a **pool**, keyed by their first token;
# 3. **verify** the pooled n-grams whose key is the last committed token (the *root*), as a
#    token tree (the *verification branch*).
#
# ## The 2-D window and its positions
# The window has `W` columns and up to `N - 1` levels. Level 0 holds `W` guesses for the
# positions right after the root; the token at (level `l`, column `j`) stands at position
# `root + j + l + 1`. Each anti-diagonal shares a position: several trajectories guess it.

# %%
Ws, Ls = SMALL["window"], SMALL["ngram"] - 1       # 4 columns, 3 levels
pos = [[j + l + 1 for j in range(Ws)] for l in range(Ls)]
for l in reversed(range(Ls)):
    print(f"level {l}: " + " ".join(f"root+{p}" for p in pos[l]))

# %% [markdown]
# ## The staircase mask, by hand
# Node `(l, j)` is flattened to index `l * W + j`. It attends to the level-0 tokens of columns
# `0..j` and to its own column's levels `0..l`. Those are exactly positions `root+1 ..
# root+j+l+1`, once each: every node sees **one causal sequence** (a Jacobi trajectory), which is
# why its prediction is a Jacobi update for position `root+j+l+2`. `refimpl.lookahead.window_mask`
# must agree.

# %%
from refimpl import lookahead

see = torch.zeros(Ls * Ws, Ls * Ws, dtype=torch.bool, device=DEVICE)   # on the target's device, as the proposer's
for l in range(Ls):
    for j in range(Ws):
        for jj in range(j + 1):
            see[l * Ws + j, 0 * Ws + jj] = True          # level 0, columns <= j
        for ll in range(l + 1):
            see[l * Ws + j, ll * Ws + j] = True          # own column, levels <= l
depth = torch.tensor([pos[l][j] for l in range(Ls) for j in range(Ws)], device=DEVICE)
for i in range(Ls * Ws):                                  # one position each, 1 .. depth[i]
    assert sorted(depth[see[i]].tolist()) == list(range(1, int(depth[i]) + 1))
ref_see, ref_depth = lookahead.window_mask(Ls, Ws, device=DEVICE)
assert torch.equal(see, ref_see) and torch.equal(depth, ref_depth)
print("hand-built staircase == lookahead.window_mask")

# %% [markdown]
# ## The pool and the harvest
# The pool maps a key token to the `(N - 1)`-token continuations seen after it, newest last, at
# most `G` per key; adding one already there moves it to the end (so a verified guess stays).
# One step's forward predicts a new top level: column `j`'s levels plus its new token are `N`
# consecutive tokens of one trajectory, an **N-gram**. Once the window holds `N - 1` levels each
# column is harvested, the oldest level is dropped and the window slides up. First the pool,
# checked against `lookahead.NgramPool` on random n-grams with many repeats and overflows:

# %%
class Pool:
    def __init__(self, cap):
        self.cap, self.grams = cap, {}

    def add(self, gram):
        lst = [g for g in self.grams.get(gram[0], []) if g != tuple(gram[1:])]
        self.grams[gram[0]] = (lst + [tuple(gram[1:])])[-self.cap:]


mine, ref = Pool(3), lookahead.NgramPool(3)
for gram in torch.randint(0, 4, (300, 3), generator=torch.Generator(device="cpu").manual_seed(SEED), device="cpu").tolist():   # Python n-grams
    mine.add(gram); ref.add(gram)
assert all(mine.grams.get(k, []) == ref.get(k) for k in range(4))
print("key 0 ->", ref.get(0))

# %% [markdown]
# ## Watching a real run
# To look inside, subclass the proposer and log what it holds before each step: the window, the
# root, the pooled guesses for the root, and the proposal; after each step, what was accepted and
# the new window and pool. (The proposer interface is the one from chapter 02.)

# %%
class Recorder(lookahead.Lookahead):
    def start(self, ids, mask, settings):
        self.log = []
        return super().start(ids, mask, settings)       # what the proposer needs from the loop, passed on

    def propose(self, caps):
        prop = super().propose(caps)
        root = self.context[0][-1]
        self.log.append(dict(levels=[list(lev) for lev in self.levels[0]], root=root, prop=prop,
                             guesses=[list(g[:caps[0]]) for g in self.pools[0].get(root)]))
        return prop

    def accept(self, v):
        super().accept(v)
        self.log[-1].update(k=v.n_list[0], next=int(v.next[0]), after=[list(lev) for lev in self.levels[0]],
                            pool={key: list(g) for key, g in self.pools[0].grams.items()})

# %% [markdown]
# Run it with the small setting. The harvest by hand: column `j` of the `N - 1` levels plus the new
# token `j`. At every step that had a full window it must be in the pool afterwards (unless more
# than `G` new n-grams share a key and pushed each other out).

# %%
def harvest(levels, new):                # levels: N - 1 lists of W tokens; new: the W new tokens
    return [[lev[j] for lev in levels] + [new[j]] for j in range(len(new))]


rec = Recorder(**SMALL)
r_small = speculative.decode(lm, rec, prompts[:1], max_new_tokens=NEW_TOKENS, eos_token_id=[])
full_steps = [s for s in rec.log if "after" in s and len(s["levels"]) == Ls]
for s in full_steps:
    for gram in harvest(s["levels"], s["after"][-1]):
        keep = s["pool"].get(gram[0], [])
        assert tuple(gram[1:]) in keep or len(keep) == SMALL["guesses"]
print(len(rec.log), "steps,", len(full_steps), "with a full window; tau", round(r_small.stats.tau, 2))
print("last harvest:", [lm.decode(g) for g in harvest(s["levels"], s["after"][-1])])

# %% [markdown]
# ## The whole forward pass, by hand
# One step feeds `1 + S + M` tokens after the cached prefix: the **root** (last committed token),
# the `S = W (N - 1)` lookahead nodes, and the `M` nodes of the trie of pooled guesses
# (`tree.trie`, chapter 05: shared prefixes merged). Everyone sees the prefix and the root; a
# lookahead node sees its staircase; a guess node sees its own ancestors in the trie (each guess
# is causal within itself) and nothing of the window or the other guesses. Take the logged step
# with the most guess nodes and rebuild its mask.

# %%
step = max(full_steps, key=lambda s: len(tree.trie(s["guesses"])[0]))
toks, pars = tree.trie(step["guesses"])
S, M = Ls * Ws, len(toks)
full = torch.zeros(1 + S + M, 1 + S + M, dtype=torch.bool, device=DEVICE)   # compared with the proposal's mask
full[:, 0] = True                                   # the root (and the prefix before it)
full[1:1 + S, 1:1 + S] = see                        # the staircase
for i in range(M):
    a = i
    while a != tree.ROOT:                           # a guess node: itself and its ancestors
        full[1 + S + i, 1 + S + a] = True; a = pars[a]
prop = step["prop"]
assert prop.tokens[0, S:].tolist() == toks and torch.equal(prop.tree.see[0], full[1:, 1:])
print(f"{1 + S + M} tokens in one forward: root + {S} lookahead + {M} verification")

# %% [markdown]
# ## The picture
# Row = query, column = key; a coloured cell means "attends". Grey: the cached prefix; black:
# the root; blue: lookahead branch (its staircases); orange: verification branch (one causal
# chain per guess, sharing merged prefixes).

# %%
labels = (["root " + repr(lm.decode([step["root"]]))] + [f"L{i // Ws} c{i % Ws}" for i in range(S)]
          + ["g " + repr(lm.decode([t])) for t in toks])
colour = torch.tensor([[.6, .6, .6], [0, 0, 0], [.2, .45, .85], [.95, .55, .1]], device=full.device)
branch = torch.tensor([0, 1] + [2] * S + [3] * M, device=full.device)   # prefix column, root, lookahead, verification
allow = torch.cat([torch.ones(1 + S + M, 1, dtype=torch.bool, device=full.device), full], 1)   # + a prefix column
img = torch.where(allow[..., None], colour[branch][None, :, :], torch.ones(3, device=full.device))
fig, ax = plt.subplots(figsize=(7.5, 6.5))
ax.imshow(img.tolist())                             # (rows, columns, RGB) as Python floats: any device
ax.set_xticks(range(2 + S + M), ["prefix"] + labels, rotation=90, fontsize=7)
ax.set_yticks(range(1 + S + M), labels, fontsize=7)
ax.set_title(f"one lookahead step: W={Ws}, N={Ls + 1}, {len(step['guesses'])} guesses")
plt.show()

# %% [markdown]
# ## The verification branch
# The target's forward returns a prediction after the root and after every node. Greedy
# verification walks down the trie from the root and keeps the child whose token equals the
# target's argmax, as deep as it goes: the accepted tokens are exactly what greedy decoding would
# have produced, plus the target's own next token. First the logged step; then, since every
# accepted token is the target's argmax given the committed text, lookahead must reproduce
# greedy decoding exactly, also on a ragged batch (rows of different lengths that accept
# different counts):

# %%
print("root", repr(lm.decode([step["root"]])), "| accepted", step["k"], "guess tokens, then",
      repr(lm.decode([step["next"]])), "| guesses:", [lm.decode(g) for g in step["guesses"]])
r_la = lookahead.generate(lm, prompts, max_new_tokens=NEW_TOKENS, window=W, ngram=N, guesses=G, eos_token_id=[])
r_ar = autoregressive.generate(lm, prompts, max_new_tokens=NEW_TOKENS, eos_token_id=[])
assert r_la.tokens == r_ar.tokens, "lookahead greedy must equal autoregressive greedy"
print(f"identical to greedy on {len(prompts)} prompts; tau {r_la.stats.tau:.2f} "
      f"(autoregressive: {r_ar.stats.tau:.2f}, Jacobi: {r_jac.stats.tau:.2f})")

# %% [markdown]
# ## tau for a few settings
# tau = tokens per forward pass (prefill included). A bigger window harvests more n-grams; a
# bigger N makes longer guesses; more guesses give more chances. On this small model and short
# runs the numbers are noisy; `FAST = False` runs longer. Left: tau; right: what each step paid.

# %%
settings = [(7, 5, 7), (1, 2, 1), (4, 3, 4), (7, 3, 7), (15, 5, 15)]
settings += [] if FAST else [(7, 7, 7), (15, 7, 15), (31, 5, 31)]
rows = []
for w, n, g in settings:
    r = lookahead.generate(lm, prompts[:2], max_new_tokens=NEW_TOKENS, window=w, ngram=n, guesses=g, eos_token_id=[])
    scored = 1 + sum(r.stats.extra["gammas"][1:]) / max(1, len(r.stats.extra["gammas"]) - 1)
    rows.append((f"W={w} N={n} G={g}", r.stats.tau, scored))
    print(f"{rows[-1][0]:16s} tau {r.stats.tau:4.2f}   tokens scored per step {scored:5.1f}")
assert all(tau >= 1.0 for _, tau, _ in rows)
fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3))
a1.bar([r[0] for r in rows], [r[1] for r in rows], color="tab:green"); a1.set_ylabel("tau (tokens / forward)")
a2.bar([r[0] for r in rows], [r[2] for r in rows], color="tab:gray"); a2.set_ylabel("tokens scored / forward")
[a.tick_params(axis="x", rotation=45, labelsize=8) for a in (a1, a2)]
plt.tight_layout(); plt.show()

# %% [markdown]
# ## What a step costs
# A step scores `1 + W (N - 1) + G (N - 1)` tokens instead of 1 (57 for the defaults). On a GPU a
# small model's forward is memory-bound and 57 tokens cost about as much as one; on a CPU compute
# grows with the token count, so tau must beat the cost ratio below for any speed-up. Timings
# are illustrative only: plain torch forwards (no Triton kernel, so `TRITON_INTERPRET` plays no
# part), on a shared machine, with a tiny model.

# %%
import time
sync = torch.cuda.synchronize if DEVICE.type == "cuda" else (lambda: None)

def forward_ms(k, reps=5):
    _, cache = lm.forward(torch.tensor([prompts[1]], device=DEVICE))
    x, times = torch.randint(0, lm.vocab_size, (1, k), device=DEVICE), []
    for _ in range(reps):
        sync(); t0 = time.perf_counter(); lm.forward(x, cache); sync(); times.append(time.perf_counter() - t0)
        lm.crop(cache, len(prompts[1]))
    return 1000 * sorted(times)[reps // 2]


k_full = 1 + W * (N - 1) + G * (N - 1)
t1, tk = forward_ms(1), forward_ms(k_full)
print(f"forward of 1 token {t1:.1f} ms, of {k_full} tokens {tk:.1f} ms")
print(f"cost ratio {tk / t1:.1f} vs tau {r_la.stats.tau:.2f} (default setting, above)")

# %% [markdown]
# ## Sampling: still lossless
# A pooled guess is a lookup, not a sample: its "draft distribution" `q` is one-hot. The trie's
# children are tried in turn with SpecInfer's multi-candidate rule (chapter 05): accept child `x`
# with probability `min(1, p(x)/q(x)) = p(x)`; on a rejection set `p(x) = 0`, renormalise, and try
# the next child; if none is accepted, sample from what is left. With children `x_1, x_2, ...`
# (distinct: the trie merged duplicates) and `P_i = p(x_1) + ... + p(x_{i-1})`, the walk reaches
# child `i` with probability `1 - P_i` and then holds `p(.) / (1 - P_i)` on the untried tokens, so
#
# $$P(\text{emit } x_i) = (1 - P_i)\,\frac{p(x_i)}{1 - P_i} = p(x_i), \qquad
#   P(\text{emit } y \notin \text{children}) = (1 - P_{\text{all}})\,\frac{p(y)}{1 - P_{\text{all}}} = p(y).$$
#
# Check it on the first token: prompt 0 ends in "And God", and with `pool_from_prompt=True` the
# pool already holds "said, Let there", "saw the light,", "divided the light from" for it (with
# two new tokens to go a step may accept one, so the trie holds their first tokens).

# %%
from scipy.stats import chisquare
from refimpl import sampling

K = 8                                                # top-k = 8 at temperature 1: a small support
p_first = sampling.probs(lm.logits(torch.tensor([prompts[0]], device=DEVICE))[0, -1], 1.0, top_k=K).double().cpu()  # scipy and matplotlib read host arrays
r_s = lookahead.generate(lm, [prompts[0]] * SAMPLES, max_new_tokens=2, temperature=1.0, top_k=K,
                         generator=torch.Generator(device=DEVICE).manual_seed(SEED), pool_from_prompt=True, eos_token_id=[])
counts = torch.bincount(torch.tensor([t[0] for t in r_s.tokens], device="cpu"), minlength=lm.vocab_size).double()   # host counts
support = p_first.nonzero()[:, 0]
assert counts[support].sum() == SAMPLES
pv = chisquare(counts[support], p_first[support] / p_first[support].sum() * SAMPLES).pvalue
hits = sum(1 for a in r_s.stats.accepted[0] if a)
print(f"the first step accepted a guess in {hits} of {SAMPLES} rows; chi-square p-value {pv:.3f}")
assert pv > 1e-3

# %% [markdown]
# The target's exact `p` (top-8, renormalised) against the sampled frequencies. A wrong rule that
# forgets to remove a rejected child (it falls back to plain `p`) would over-produce the
# children: `P(x_1) = p(x_1) + (1 - p(x_1)) p(x_1)` and so on, the dashed bars.

# %%
pool0 = lookahead.NgramPool(G)                      # the first step's pool, as pool_from_prompt builds it
for i in range(len(prompts[0]) - N + 1):
    pool0.add(prompts[0][i: i + N])
kids = list(dict.fromkeys(g[0] for g in pool0.get(prompts[0][-1])))   # the trie's children, in order
wrong, left = torch.zeros_like(p_first), 1.0
for x in kids:
    wrong[x] += left * p_first[x]; left *= 1 - float(p_first[x])
wrong += left * p_first
xs = torch.arange(len(support), device="cpu").float()   # bar positions for matplotlib
fig, ax = plt.subplots(figsize=(8, 3))
ax.bar(xs - 0.27, p_first[support], 0.27, label="target p (exact)")
ax.bar(xs, counts[support] / SAMPLES, 0.27, label=f"lookahead, {SAMPLES} samples")
ax.bar(xs + 0.27, wrong[support], 0.27, fill=False, ls="--", label="wrong rule (exact)")
ax.set_xticks(xs, [repr(lm.decode([int(i)])) for i in support], rotation=30); ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## Where the tokens came from
# Back to the default setting on one prompt. Per step: how many guesses the pool offered for the
# root, how many guess tokens were accepted, and the pool's size. Then the text: green tokens came
# from a pooled n-gram, the others are the target's own token at the end of each step.

# %%
rec = Recorder(W, N, G, pool_from_prompt=False)   # the paper's setting: the pool starts empty
r_rec = speculative.decode(lm, rec, prompts[2:], max_new_tokens=NEW_TOKENS, eos_token_id=[])
steps = range(len(rec.log))
fig, ax = plt.subplots(figsize=(9, 2.8))
ax.bar(steps, [len(s["guesses"]) for s in rec.log], color="tab:orange", alpha=.5, label="guesses for the root")
ax.bar(steps, [s.get("k", 0) for s in rec.log], color="tab:green", label="guess tokens accepted")
done = [i for i in steps if "pool" in rec.log[i]]                # the last step is never followed up
ax.plot(done, [sum(map(len, rec.log[i]["pool"].values())) / 10 for i in done], "k.-", label="pool size / 10")
ax.set_xlabel("step"); ax.legend(fontsize=8); plt.show()

# %% [markdown]
# The coloured text, built from `stats.accepted` (guess tokens accepted per step) alone, so the
# widget below can reuse it.

# %%
from IPython.display import HTML, display


def coloured(r, row=0):
    out, i, toks = [], 0, r.tokens[row]
    for acc in r.stats.accepted:
        for k in range(min(acc[row] + 1, len(toks) - i)):
            style = "background:#b7e4c7" if k < acc[row] else "color:#555"
            out.append(f'<span style="{style}">{lm.decode([toks[i]])}</span>'); i += 1
    return "<span style='font-family:monospace'>" + "".join(out) + "</span>"


display(HTML(f"<b>tau {r_rec.stats.tau:.2f}</b>: " + coloured(r_rec)))
assert r_rec.tokens == autoregressive.generate(lm, prompts[2:], max_new_tokens=NEW_TOKENS, eos_token_id=[]).tokens

# %% [markdown]
# ## Play: W, N, G
# Move the sliders (in a live notebook): each move re-runs lookahead on a short prompt and redraws
# tau, the tokens scored per step and the coloured text. The text never changes (it is always the
# greedy output); the green share and tau do. The calls below the widget render the default
# setting and a bigram-only one, and check that tau moved.

# %%
import ipywidgets as widgets


def play(window=W, ngram=N, guesses=G):
    global last
    last = r = lookahead.generate(lm, prompts[1:2], max_new_tokens=NEW_TOKENS, window=window, ngram=ngram,
                                  guesses=guesses, eos_token_id=[])
    head = f"<b>W={window} N={ngram} G={guesses}: tau {r.stats.tau:.2f}, {r.stats.target_calls} forwards, "
    head += f"up to {1 + (window + guesses) * (ngram - 1)} tokens scored per step</b><br>"
    display(HTML(head + coloured(r)))


widgets.interact(play, window=widgets.IntSlider(continuous_update=False, value=W, min=1, max=15, description="W"),
                 ngram=widgets.IntSlider(continuous_update=False, value=N, min=2, max=8, description="N"),
                 guesses=widgets.IntSlider(continuous_update=False, value=G, min=1, max=15, description="G"))
play(); tau_default = last.stats.tau
play(1, 2, 1)
assert last.stats.tau != tau_default and len(last.tokens[0]) == NEW_TOKENS

# %% [markdown]
# ## Exercises
# **Exercise 1.** Predict the exact size of a forward pass. `1 + (W + G)(N - 1)` is the most a
# step scores; the real count is smaller while the window is still filling up (fewer levels) and
# when pooled guesses share a prefix (the trie merges it). Write `tokens_scored(levels, width,
# guesses)`: the tokens one step feeds the target, root included, for a window of `levels` x
# `width` and the pooled `guesses` for the root (lists of tokens), without calling `tree.trie`.

# %%
@exercise("08", "tokens_scored")
def tokens_scored(levels, width, guesses):
    # your code here
    raise NotImplementedError

# %% [markdown]
# Check: a real `lookahead.Lookahead` is put in that state by hand (window levels and pool) and
# its proposal's nodes are counted; then every step of the default-setting run logged above.

# %%
def proposal_size(levels, width, guesses):           # a real proposer, put in that state by hand
    la = lookahead.Lookahead(width, levels + 1, max(1, len(guesses)), pool_from_prompt=False)
    la.start(torch.tensor([prompts[1]], device=DEVICE), None, speculative.Sampling())
    la.levels = [[[5 + j for j in range(width)] for _ in range(levels)]]
    [la.pools[0].add([prompts[1][-1], *g]) for g in guesses]
    return 1 + int(la.propose([1000]).valid[0])


def check_tokens_scored():
    cases = [(3, 4, [[1, 2, 3], [1, 2, 4], [5, 6, 7]]), (1, 7, []), (4, 7, [[i, 1, 2, 3] for i in range(7)]),
             (2, 3, [[9, 9], [9, 8], [9, 9]])] + [(len(s["levels"]), W, s["guesses"]) for s in rec.log]
    for lv, w, gs in cases:
        want, got = proposal_size(lv, w, gs), tokens_scored(lv, w, gs)
        assert got == want, f"{lv} levels x {w} columns, guesses {gs}: the forward scores {want}, you said {got}"


check("Exercise 1", check_tokens_scored)
if SHOW_SOLUTIONS: show("08", "tokens_scored")

# %% [markdown]
# **Exercise 2.** The greedy trie walk. Write `greedy_walk(tokens, parents, best)`: `tokens`,
# `parents` describe a trie as `tree.trie` returns it (`parents[i] == -1` for a child of the
# root); `best[0]` is the target's argmax after the root and `best[i + 1]` its argmax after node
# `i`. Return `(accepted, next_token)`: the tokens of the deepest path whose every token equals
# the target's argmax after its parent, and the target's argmax after that path.

# %%
@exercise("08", "greedy_walk")
def greedy_walk(tokens, parents, best):
    # your code here
    raise NotImplementedError

# %% [markdown]
# Check: 200 random tries over a 4-token vocabulary against `tree.Tree.verify` (chapter 05), fed
# one-hot logits so its argmax is `best`.

# %%
def check_greedy_walk():
    gw = torch.Generator(device=DEVICE).manual_seed(1)                             # made where a verifier runs
    for _ in range(200):
        toks_, pars_ = tree.trie(torch.randint(0, 4, (3, 3), generator=gw, device=DEVICE).tolist())
        best = torch.randint(0, 4, (len(toks_) + 1,), generator=gw, device=DEVICE)
        logits = torch.nn.functional.one_hot(best, 4).float()[None]
        n, nxt, path = tree.Tree(torch.tensor([pars_], device=DEVICE)).verify(
            torch.tensor([toks_], device=DEVICE), logits, torch.tensor([len(toks_)], device=DEVICE), None, speculative.Sampling())
        want = ([toks_[i] for i in path[0, : int(n[0])].tolist()], int(nxt[0]))
        got = greedy_walk(toks_, pars_, best.tolist())
        assert (list(got[0]), int(got[1])) == want, \
            f"trie tokens {toks_}, parents {pars_}, argmax {best.tolist()}: want {want}, got {got}"


check("Exercise 2", check_greedy_walk)
if SHOW_SOLUTIONS: show("08", "greedy_walk")

# %% [markdown]
# ## Summary
# - One lookahead step = one forward over the root, a `W x (N - 1)` window of Jacobi trajectories
#   (staircase mask) and a trie of at most `G` pooled `(N - 1)`-grams (ancestor mask).
# - The window's new top level harvests `W` N-grams into the pool; guesses keyed by the root are
#   verified like any token tree: greedy output is exactly greedy decoding, and with one-hot `q`
#   SpecInfer's rule keeps sampling exact.
# - tau depends on how repetitive the text is; the price is `1 + (W + G)(N - 1)` tokens per
#   forward, which a GPU hides and a CPU does not.
# - So the default differs by device: `lookahead.generate(target, prompts)` runs
#   `lookahead.PRESETS["cpu"]` on a CPU (W=1, N=4, G=3, the pool seeded with the prompt's n-grams:
#   the best point of `python -m refimpl.bench --suite lookahead-sweep`) and `"paper"` (the
#   repository's W=7, N=5, G=7) on a GPU.
