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
# # 06b · EAGLE-3 and the CPU fast path
#
# Chapter 06a built Medusa's heads and EAGLE's feature draft, and grew EAGLE-2's dynamic tree.
# EAGLE-3 (Li et al., "EAGLE-3: Scaling up Inference Acceleration of Large Language Models via
# Training-Time Test", arXiv 2503.01840) changes what the draft reads (three of the target's
# layers, not its top feature) and how it is trained (on its own outputs, the way it decodes).
# Then the question every draft of chapters 04a-06a meets on a CPU: more tokens per target call
# is not yet more tokens per second. A feature draft pays here only when its own matrix products
# are cheap and its tree is small, and the front door (`refimpl.generate(target, prompts,
# method="eagle3")`) arranges both itself.

# %% [markdown]
# **After this chapter you can**
#
# 1. build EAGLE-3's draft step from its weights (three target layers fused, no feature loss) and say where it differs from EAGLE-1's;
# 2. write the attention mask of its *training-time test*, and read from acceptance per depth what training the draft on its own outputs buys, and on which target;
# 3. compare tau of chapter 04a's chain draft, Medusa, EAGLE and EAGLE-3 on the same prompts, and read from the committed benchmarks which pays in wall-clock on this CPU, and which term (tau or step cost) decides it;
# 4. say why a feature draft's products decide whether it pays on a CPU, run `eagle3.generate`'s `"cpu"` preset against the same tree with a plain draft, and show all of them emit exactly greedy decoding;
# 5. quantize a weight to int8 per output row and say what the draft's int8 panels compute.
#
# **Parameters.** `tiny` is the zoo's 4-layer Llama trained on the King James Bible; its EAGLE-3
# draft was trained by `python -m refimpl.train eagle3-tiny` (`models/eagle3-tiny`), its EAGLE draft
# and Medusa heads as in chapter 06a. `tiny-draft` is the chain draft of chapter 04a, for the
# comparison. `FAST_TARGET` is the model the CPU fast path runs on: `tiny` in CI, SmolLM2-135M
# (the course's real-size target) otherwise.

# %%
import torch
from refimpl.models import default_device

FAST = True                          # CI default: seconds of training, few samples
MODEL, DRAFT = "tiny", "tiny-draft"  # the target; chapter 04a's chain draft
DEVICE = default_device()            # a torch.device: CUDA when present, $REFIMPL_DEVICE overrides
EAGLE_DRAFT = None                   # None: the zoo's EAGLE draft (models/eagle-tiny); or a folder
EAGLE3_DRAFT = None                  # None: the zoo's EAGLE-3 draft (models/eagle3-tiny); or a folder
NEW_TOKENS = 48 if FAST else 128
ANSWERS, ANSWER_LEN = (48, 32) if FAST else (400, 64)    # tiny's own answers (chapter 06a's)
EAGLE3_STEPS = 30 if FAST else 300   # live EAGLE-3 training steps (8 answers each, DEPTH unrolled steps)
TOTAL, DEPTH, TOPK = 16, 5, 4        # EAGLE-2's dynamic tree: node budget, levels, children / expanded nodes
TREE_SIZE = 16                       # nodes of Medusa's candidate tree
TEMPERATURE, TOP_K = 1.0, 10
FAST_TARGET = "tiny" if FAST else "smollm2-135m"   # the lean CPU forward's target for the fast path
SEED = 0
SHOW_SOLUTIONS = False

# %% [markdown]
# ## Models, prompts, and the target's own answers
# Greedy autoregressive decoding is the ground truth, as in every chapter. The answers are chapter
# 06a's: `tiny` continuing short King James passages, five sixths to train on and the rest held
# out (the same seed, so the same rows).

# %%
import copy
import json
import os
import random
import matplotlib.pyplot as plt
from refimpl import models, autoregressive, speculative, medusa, eagle
from refimpl.models import drafters                      # the trained drafters' files, by the target they belong to
from refimpl.primitives import rope                      # rotary positions, shared by every model here
from refimpl.prompts import encode_prompt
from refimpl.data import kjv_split
from refimpl.train.distill_data import generate_answers
from solutions import exercise, check, show

torch.set_grad_enabled(False)
lm, dr = models.load(MODEL, device=DEVICE), models.load(DRAFT, device=DEVICE)
texts = ["In the beginning God created the heaven and the earth. And the earth",
         "And the LORD spake unto Moses, saying",
         "Blessed are the meek: for they shall inherit the earth. Blessed are"]
prompts = [encode_prompt(lm, t) for t in texts]
ar = autoregressive.generate(lm, prompts, max_new_tokens=NEW_TOKENS, eos_token_id=[]).tokens

# %% [markdown]
# The answers (`generate_answers` keeps each answer position's final hidden state as well):

# %%
rng, docs, passages = random.Random(SEED), kjv_split()[0], []
for _ in range(ANSWERS):
    words = rng.choice(docs).split()
    a = rng.randrange(max(1, len(words) - 40))
    passages.append(" ".join(words[a:a + rng.randint(8, 30)]))
rows = generate_answers(lm, passages, ANSWER_LEN, batch=ANSWERS, progress=False, min_answer=6)  # (ids, n_prompt, hidden, text)
train_rows, held_rows = rows[: len(rows) * 5 // 6], rows[len(rows) * 5 // 6:]
print(f"{len(rows)} answers, held out {len(held_rows)} | prompt lengths {[len(p) for p in prompts]}")

# %% [markdown]
# ## EAGLE-3: three layers in, trained the way it decodes
# EAGLE-3 changes what the draft reads and how it is trained:
#
# - **Multi-layer features (§3.2).** The top feature is shaped for the *next* token only. EAGLE-3
#   reads the residual streams entering three of the target's layers, low, middle and high
#   (`eagle3.default_taps`: vLLM's `(2, L//2, L-3)`; tiny has only 4 layers and its last one does
#   much of the work, so tiny's "high" is the final normed state: 1, 2, 4; vLLM's tap 4 would be the
#   state before that norm, so `refimpl.export` refuses to export tiny's draft), and fuses
#   them with one linear map `g_t = fc([l_t; m_t; h_t])` (3H -> H). The verification call returns
#   them: `lm.forward(ids, output_hidden_states=taps)`, no extra pass.
# - **One layer on (token, feature), its own head.** Attention reads
#   `[norm(embed(x_{t+1})) ; norm(g_t)]` (2H wide) and adds its output to `g_t`; a gated MLP follows.
#   The output `o_t` (before a final norm) is the draft's own feature for the next step, and the
#   draft's own LM head (the target's kept rows to start with, then trained) reads `norm(o_t)`.

# %% [markdown]
# - **Training-time test (§3.1).** No feature regression: the loss is only the cross-entropy
#   against the target's next-token distribution. And training *runs the draft on its own
#   outputs*: step 0 reads the target's `g`; step j reads step j-1's output at the same index, the
#   true token j further on, at position + j. What a tree node at depth j + 1 sees while decoding
#   (the context, its ancestors, itself) is exactly what step j sees in training.
#
# First the three streams, from the same forward that gives the target's logits, on prompt 0
# followed by the target's own next token `t` (the input of chapter 06a's EAGLE step):

# %%
from refimpl import eagle3
from refimpl.train import eagle3 as train3

draft3 = drafters.load(lm, "eagle3", EAGLE3_DRAFT)                   # on lm's device
ids3 = torch.tensor([prompts[0] + ar[0][:1]], device=DEVICE)   # the prompt, then the target's token t
_, _, streams = lm.forward(ids3, output_hidden_states=draft3.taps)  # (1, L + 1, 3H): three layers, one call
print(f"taps {draft3.taps}: streams {tuple(streams.shape)} from the same forward as the logits")

# %% [markdown]
# One step by hand from the zoo draft's weights: the fusion, the 2H-wide attention input with
# grouped-query heads (the target's head layout), the residual on `g` (not on the attention's
# input), the gated MLP.

# %%
def step3_by_hand(tok, streams):                               # (T,) x_{t+1}, (T, 3H) -> (T, H) outputs o_t
    T, h, kv, d = len(tok), draft3.num_heads, draft3.num_kv_heads, draft3.head_dim
    g = streams @ draft3.fc.weight.T                           # (T, H) the fusion of the three layers
    x = torch.cat([draft3.norm_in(draft3.embed[tok]), draft3.norm_hid(g)], -1)               # (T, 2H)
    q, k, v = draft3.qkv(x).view(T, h + 2 * kv, d).transpose(0, 1).split([h, kv, kv], 0)    # (heads, T, d)
    pos = torch.arange(T, device=x.device)[None]
    q, k = (rope(z[None], pos, draft3.rope_theta)[0] for z in (q, k))
    k, v = k.repeat_interleave(h // kv, 0), v.repeat_interleave(h // kv, 0)                  # grouped-query heads
    s = (q @ k.mT / d ** 0.5).masked_fill(~torch.ones(T, T, dtype=torch.bool, device=x.device).tril(), -torch.inf)
    r = g + draft3.o((s.softmax(-1) @ v).transpose(0, 1).reshape(T, -1))                    # residual: g, not x
    a, b = draft3.gate_up(draft3.norm_mid(r)).chunk(2, -1)
    return r + draft3.down(torch.nn.functional.silu(a) * b)


# %% [markdown]
# It must equal `eagle3.unroll`'s first step (step 0 of the training-time test reads the target's
# `g`, exactly as decoding's first draft call does); then the guess its head reads off the last output:

# %%
tok3 = ids3[0, 1:]
mine3 = step3_by_hand(tok3, streams[0, :-1])
lib3 = eagle3.unroll(draft3, tok3[None], draft3.fuse(streams[:, :-1]), torch.ones_like(tok3)[None], 1)[0][0]
assert torch.allclose(mine3, lib3, atol=1e-4), "the hand-built EAGLE-3 step == eagle3.unroll's step 0"
guess3 = int(draft3.full(draft3.logits(mine3[-1]).argmax()))
print(f"after t = {lm.decode(ar[0][:1])!r} EAGLE-3 guesses {lm.decode([guess3])!r}, the target says {lm.decode(ar[0][1:2])!r}")

# %% [markdown]
# ## The training-time test's attention mask
# `eagle3.unroll` runs step j over all T positions at once. Its keys are step 0's T keys, then the
# T keys of each step 1..j, side by side: `(j + 1) T` columns. Query `t` of step j stands for a
# tree node j levels below the context that ends at input `t`: it may see step 0's keys at
# positions `<= t` (the context, true features) and, of each later step, **only the key at index
# `t`** (its own ancestors, then itself). `library_masks` captures the masks the library passes to
# the draft layer during an unroll (it wraps the draft's `step` for the call): the referee of the
# exercise below and the picture after it.

# %%
def library_masks(T, steps):                                   # -> [step j's (T, (j + 1) T) bool mask]
    seen, step = [], draft3.step
    def spy(tok, feat, pos, allow, past=None):
        seen.append(allow[0].clone())
        return step(tok, feat, pos, allow, past)
    draft3.step = spy
    try:
        t = torch.zeros((1, T), dtype=torch.long, device=DEVICE)
        eagle3.unroll(draft3, t, torch.zeros((1, T, draft3.hidden_size), device=DEVICE), torch.ones_like(t), steps)
    finally:
        del draft3.step                                        # back to the class's method
    return seen


# %% [markdown]
# ### Exercise 1: the training-time test's mask
# Write `ttt_mask(T, j)` -> a (T, (j + 1) T) bool tensor (True = may attend) for a row without
# padding, the rule above. The check compares it with `library_masks` for several T and steps, and
# names the first query / key where you differ.

# %%
@exercise("06b", "ttt_mask")
def ttt_mask(T, j):
    ...  # your code
    raise NotImplementedError


# %%
def check_ttt_mask():
    for T, steps in ((5, 4), (9, 3), (1, 2)):
        for j, want in enumerate(library_masks(T, steps)):
            got = torch.as_tensor(ttt_mask(T, j), device=want.device).bool()
            assert got.shape == want.shape, f"T={T}, step {j}: shape {tuple(got.shape)}, want {tuple(want.shape)}"
            bad = (got != want).nonzero()
            assert len(bad) == 0, (f"T={T}, step {j}: query {int(bad[0, 0])} / key column {int(bad[0, 1])} (block "
                                   f"{int(bad[0, 1]) // T}, index {int(bad[0, 1]) % T}): you say {bool(got[tuple(bad[0])])}")


check("Exercise 1", check_ttt_mask)
if SHOW_SOLUTIONS:
    show("06b", "ttt_mask")

# %% [markdown]
# ## Play: the mask, step by step
# The library's mask for step `step` of an unroll over `T` positions (rows: queries; columns: the
# keys of steps 0..`step`). Block 0 is the ordinary causal triangle over the true features; every
# later block is a diagonal: position t's own chain. Move `step` and watch a diagonal join per step.

# %%
import ipywidgets as widgets


def play(T=8, step=3):
    global shown
    m = library_masks(T, step + 1)[step].cpu()                 # matplotlib draws host arrays
    fig, ax = plt.subplots(figsize=(8, 2.4))
    ax.imshow(m, cmap="Greens", aspect="equal")
    for b in range(1, step + 1):
        ax.axvline(b * T - 0.5, color="k", lw=1)
    ax.set_xticks([b * T + (T - 1) / 2 for b in range(step + 1)], ["step 0 keys (true g)"] + [f"step {b}" for b in range(1, step + 1)], fontsize=8)
    shown = f"step {step} over {T} positions: {int(m.sum())} of {m.numel()} query-key pairs allowed"
    ax.set_ylabel(f"query t of step {step}"); ax.set_title(f"green: may attend | {shown}", fontsize=9); plt.tight_layout(); plt.show()


ui = widgets.interact(play, T=widgets.IntSlider(continuous_update=False, value=8, min=2, max=12), step=widgets.IntSlider(continuous_update=False, value=3, min=0, max=5)).widget

# %% jupyter={"source_hidden": true} tags=["ci-only", "remove-input"]
# CI's self-test of the widget above (collapsed in the lab): move a control as a person would,
# check that the output changed, then put the control back to its teaching default
default = ui.children[1].value
before = shown
ui.children[1].value = 1                                       # move the step slider, as a person would
assert shown != before, "moving the slider must change the output"
ui.children[1].value = default

# %% [markdown]
# ## Training EAGLE-3 live
# `train3.target_features` recomputes the three streams and the target's final state over each
# whole answer row (one forward per row: prompt *and* answer positions, as decoding reads them);
# `train3.train_draft` unrolls `DEPTH` steps and weights step j's cross-entropy by 0.8^j (the
# paper's recipe uses 7 steps). The authors' trainer differs in three places: it drops positions whose
# target token is outside the draft's kept vocabulary, averages each step over all slots and starts
# the head at random; ours keeps those positions, averages per loss position and starts from the
# target's rows (`refimpl.train.eagle3`'s docstring says why; `recipe="upstream"` is theirs, measured
# in `bench_results/learned/upstream_variants/`).

# %%
W_head = lm.model.get_output_embeddings().weight.detach().cpu()  # the trainer batches on the host
seqs3 = train3.target_features(lm, train_rows, draft3.taps, progress=False)       # host rows
held3 = train3.target_features(lm, held_rows, draft3.taps, progress=False)
torch.manual_seed(SEED)
untrained3 = eagle3.new_draft(lm).cpu()                      # host copies, as the rows
with torch.enable_grad():
    fast3, rep3 = train3.train_draft(copy.deepcopy(untrained3), seqs3, W_head, steps=EAGLE3_STEPS, ttt=DEPTH, batch=8,
                                     lr=2e-3, progress=False, holdout=10 ** 9)
print(f"{EAGLE3_STEPS} steps on {len(seqs3)} answers")

# %% [markdown]
# ## What its training buys: acceptance per depth
# On the held-out answers, P(the first d guesses are all the target's): EAGLE-3 read off one unroll
# (which equals decoding's chain: tested in the library), for an untrained, our FAST and the zoo's
# draft; and chapter 06a's zoo EAGLE-1 draft reading its own predicted features
# (`refimpl.train.eagle.accept_rates`), on the same answers.

# %%
from refimpl.train.eagle import features, accept_rates

host3 = {"untrained": untrained3, "FAST (ours)": fast3, "zoo": copy.deepcopy(draft3).cpu()}  # host copies, as the rows
acc3 = {n: train3.accept_rates(d, held3, W_head, depth=DEPTH)["chain"] for n, d in host3.items()}
host1 = drafters.load(lm, "eagle", EAGLE_DRAFT).cpu()  # a host copy: features() keeps the rows there
eagle1 = accept_rates(host1, features(lm, held_rows, progress=False), DEPTH, starts=30)
print({n: [round(a, 2) for a in v] for n, v in acc3.items()}, "| EAGLE-1 zoo", [round(a, 2) for a in eagle1])
assert acc3["FAST (ours)"][0] > acc3["untrained"][0] and acc3["zoo"][0] > acc3["FAST (ours)"][0]
with open(os.path.join(EAGLE3_DRAFT or drafters.folder(lm, "eagle3"), "config.json")) as f:
    rep_zoo = json.load(f)["report"]                           # what the trainer measured, saved with the draft
print("zoo EAGLE-3, held-out top-1 of draft step 1..7 on a true prefix:", rep_zoo["heldout_top1_per_step"])

# %% [markdown]
# ## Picture: acceptance per depth, EAGLE-1 against EAGLE-3

# %%
fig, ax = plt.subplots(figsize=(9, 3.4))
ax.plot(range(1, DEPTH + 1), eagle1, "o--", color="#2a9d8f", label="EAGLE-1 zoo (top feature, feature loss)")
ax.plot(range(1, DEPTH + 1), acc3["FAST (ours)"], "D-", color="#f4a261", label=f"EAGLE-3 FAST ({EAGLE3_STEPS} steps)")
ax.plot(range(1, DEPTH + 1), acc3["zoo"], "D-", color="#264653", label="EAGLE-3 zoo (3 layers, training-time test)")
ax.set_xlabel("d"); ax.set_ylabel("P(guesses 1..d all right)"); ax.set_ylim(0, 1); ax.set_xticks(range(1, DEPTH + 1))
ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1)); ax.set_title(f"{len(held_rows)} held-out answers of tiny", fontsize=9)
plt.tight_layout(); plt.show()

# %% [markdown]
# **Read the plot.** The FAST draft is far below the zoo's: a draft trained by training-time test
# has to learn to read its *own* outputs as well as the target's features, and that takes steps
# (the zoo's: 1,200 steps of 8 answers, ~29 min on 1 thread; `models/eagle3-tiny/train_report.json`).
# On `tiny` the zoo's EAGLE-3 draft does **not** beat EAGLE-1's, and that is a finding, not a bug:
# tiny has 4 layers, so "low, middle, high" are layers 1, 2 and the final state that EAGLE-1
# already reads; there are only ~1,500 training answers; and EAGLE-3 learns its own LM head where
# EAGLE-1 borrows the target's. What the training-time test does buy is visible in the report's
# per-step top-1 (printed above): it is flat, because every step was trained on the inputs it will
# see. The paper's gains come from reading a deep target whose top layer is shaped for one token
# only, and from scaling the data (EAGLE-3 §4); the capstone (chapter 16) measures it on SmolLM2's
# 30 layers.

# %% [markdown]
# **On SmolLM2, scale decided it.** Trained on a CPU (1,471 answers, 3 unrolled steps) the SmolLM2
# draft accepted 0.50 at depth 1 and lost to AR; trained on a GPU (10,365 answers, 7 unrolled steps,
# 14 passes: `python -m refimpl.train eagle3-smollm2-135m --device cuda`) it accepts 0.63 and is the
# fastest lossless method there (`bench_results/capstone/capstone_smollm2-135m.json`; docs/eagle3.md
# reads it by tree size), on the CPU fast path of the end of this chapter. Its speed-up is a ratio:
# it falls when our AR gets faster, and rises on a machine whose multi-token verification is cheaper.
# Part of it is the copy prior reaching past the draft's trimmed head: 9.5% of SmolLM2's tokens on
# the benchmark prompts are outside the draft's 8,192 kept ones (names, rare words, mostly copied
# from the prompt), and a head without their rows can never propose them. The prior gives such a
# candidate a column of its own at the node's best logit + the bias (`EagleProposer.children`):
# tau 2.57 -> 2.90 on 10 nodes, summaries 2.28 -> 3.11, with no training at all.

# %% [markdown]
# ## Side by side with chapter 04a's chain draft
# The same three prompts, `NEW_TOKENS` tokens each. Greedy: autoregressive, the chain draft
# `tiny-draft` (`gamma = 4`, `speculative.generate`), Medusa with the chosen `TREE_SIZE`-node tree
# and EAGLE and EAGLE-3 with their dynamic trees of `TOTAL` nodes; every greedy run must be greedy
# decoding, token for token. Sampling (temperature `TEMPERATURE`, top-`TOP_K`): the same, plus
# Medusa typical (**lossy**); EAGLE's top-k children are deterministic guesses, verified losslessly
# by chapter 05's walk. tau (tokens per target call) and the calls are exact counts.

# %%
zoo, draft = drafters.load(lm, "medusa"), drafters.load(lm, "eagle", EAGLE_DRAFT)   # chapter 06a's heads and EAGLE draft
configs = {"AR": lambda kw: autoregressive.generate(lm, prompts, **kw),
           "chain (gamma 4)": lambda kw: speculative.generate(lm, prompts, draft=dr, gamma=4, **kw),
           f"Medusa ({TREE_SIZE} nodes)": lambda kw: medusa.generate(lm, prompts, heads=zoo, tree_size=TREE_SIZE, **kw),
           "Medusa typical": lambda kw: medusa.generate(lm, prompts, heads=zoo, tree_size=TREE_SIZE, acceptance="typical", **kw),
           f"EAGLE ({TOTAL} nodes)": lambda kw: eagle.generate(lm, prompts, draft=draft, total=TOTAL, depth=DEPTH, topk=TOPK, **kw),
           f"EAGLE-3 ({TOTAL} nodes)": lambda kw: eagle3.generate(lm, prompts, draft=draft3, total=TOTAL, depth=DEPTH,
                                                                  topk=TOPK, floor=0.0, **kw)}

# %% [markdown]
# The runs. Nothing is timed here (CI runs this notebook in Triton's interpreter, and
# `kernels.references()` sends the sampling kernels to their torch references on a CPU: chapter 06a
# says why): wall-clock comes from the committed benchmarks after this.

# %%
import kernels

table = {}
with kernels.references():
    for mode in ("greedy", "sampling"):
        for name, run in [(n, r) for n, r in configs.items() if mode == "sampling" or n != "Medusa typical"]:
            g = run(dict(max_new_tokens=NEW_TOKENS, eos_token_id=[], **({} if mode == "greedy" else dict(
                temperature=TEMPERATURE, top_k=TOP_K, generator=torch.Generator(DEVICE).manual_seed(SEED)))))
            assert mode == "sampling" or g.tokens == ar, name
            table[(mode, name)] = g.stats
            print(f"{mode:8s} {name:18s} tau {g.stats.tau:4.2f} | target calls {g.stats.target_calls:3d} | draft calls {g.stats.draft_calls:3d}")
assert table[("greedy", f"Medusa ({TREE_SIZE} nodes)")].tau > 1.5, "the trained heads get drafts accepted"
assert table[("greedy", f"EAGLE ({TOTAL} nodes)")].tau > table[("greedy", f"Medusa ({TREE_SIZE} nodes)")].tau, "EAGLE reads its own guesses"
assert table[("sampling", "Medusa typical")].tau > table[("sampling", f"Medusa ({TREE_SIZE} nodes)")].tau, "typical accepts more"

# %% [markdown]
# ## Wall-clock: the committed benchmarks
# tau counts target calls, not seconds. `python -m refimpl.bench` (30 prompts in six categories, 64
# new tokens, every row in the same process, medians of repeats) ran on this course's CPU (2 cores)
# and its results are committed in `bench_results/`; this cell reads the Medusa and EAGLE runs and
# prints the command of each. Speed-up is against AR in the same run. The last column, **step cost
# = tau / speed-up**, is what one draft-and-verify step costs in autoregressive steps: the price of
# the target scoring the tree (or chain) plus the draft's work.

# %%
import glob

bench, bars = os.path.join(models.MODELS_DIR, os.pardir, "bench_results"), []   # bars: (label, speed-up, tau)
for path in sorted(glob.glob(os.path.join(bench, "eagle_*", "*.json")) + glob.glob(os.path.join(bench, "medusa_*", "*.json"))):
    b, name = json.load(open(path)), os.path.basename(os.path.dirname(path))
    a = b["args"]
    print(f"\n{name}: python -m refimpl.bench --model {a['model']} --threads {a['threads']} --repeats {a['repeats']} "
          f"--max-new-tokens {a['max_new_tokens']} --methods \"{a['methods']}\"  ({b['hardware']['cpu_count']} cores)")
    for r in b["rows"]:
        print(f"  {r['method'][:54]:54s} speed-up {r['speedup']:4.2f} | tau {r['tau']:4.2f} | step cost {r['tau'] / r['speedup']:4.2f}")
        short = r["method"].replace("speculative greedy (gamma=4)", "chain draft, gamma 4").replace("lossless, ", "")
        bars += [] if r["method"] == "ar (cache)" else [(f"{name}: {short.replace('acceptance T=0.7 ', '')[:50]}", r["speedup"], r["tau"])]

# %% [markdown]
# ## Picture: speed-up against AR, with tau
# Every non-AR row of those runs; a bar right of the line is faster than AR in the same run.

# %%
fig, ax = plt.subplots(figsize=(9, 0.26 * len(bars) + 0.8))
ax.barh(range(len(bars)), [x for _, x, _ in bars], color=[{"eagle": "#2a9d8f", "medus": "#e76f51"}.get(n.split(": ")[1][:5], "0.6") for n, _, _ in bars])
for y, (_, x, t) in enumerate(bars):
    ax.text(x + 0.01, y, f"tau {t:.2f}", va="center", fontsize=7)
ax.axvline(1, color="k", lw=0.8); ax.set_yticks(range(len(bars)), [n for n, _, _ in bars], fontsize=7); ax.invert_yaxis()
ax.set_xlabel("wall-clock speed-up vs AR in the same run (committed benchmarks)"); plt.tight_layout(); plt.show()

# %% [markdown]
# ## Reading the tables
# Greedy, per target call, EAGLE accepts the most on `tiny`: its draft reads its own guesses, so
# deep nodes stay likely, and its tree is spent where the draft is sure. Medusa rivals the chain
# draft with no draft model at all (zero draft calls: four small matmuls per step). Under
# sampling, lossless Medusa and EAGLE fall behind the chain: their children are fixed guesses,
# accepted with probability `p(x)`, while the chain draft *samples* from a `q` close to `p` and is
# accepted with `min(1, p/q)`; typical acceptance wins much of that back, at the price chapter
# 06a measured.
#
# **Wall-clock, in these runs, the tree methods do not beat the chain draft on the real-size
# target.** In the committed runs the cell above reads (`bench_results/medusa_smollm2-135m/`,
# `bench_results/eagle_smollm2-135m/`, Hugging Face's forward) the chain (tau <!-- quote:medusa_smollm2-135m/decode_smollm2-135m|speculative greedy (gamma=4)|tau -->2.58<!-- /quote -->) is faster than AR
# on SmolLM2-135M (<!-- quote:medusa_smollm2-135m/decode_smollm2-135m|speculative greedy (gamma=4)|speedup -->1.28x<!-- /quote -->), Medusa's 16-node tree (tau <!-- quote:medusa_smollm2-135m/decode_smollm2-135m|medusa (lossless, 16-node tree)|tau -->1.73<!-- /quote -->) about level with AR
# (<!-- quote:medusa_smollm2-135m/decode_smollm2-135m|medusa (lossless, 16-node tree)|speedup -->1.05x<!-- /quote -->), and EAGLE's 16-node tree (tau <!-- quote:eagle_smollm2-135m/decode_smollm2-135m|eagle (dynamic tree 16 nodes, depth 5, top-4)|tau -->1.99<!-- /quote -->) slower (<!-- quote:eagle_smollm2-135m/decode_smollm2-135m|eagle (dynamic tree 16 nodes, depth 5, top-4)|speedup -->0.76x<!-- /quote -->).

# %% [markdown]
# **The step costs say why.** In those runs Medusa's heads are nearly free, so its ~1.7 AR steps per
# step is almost all the target scoring 17 tokens (the root and 16 nodes) instead of one: on a CPU a
# forward's time grows with the tokens it scores (chapter 04c measured it for 5), where a GPU scores
# them in about the time of one. EAGLE's step costs ~2.6: the same tree
# scoring plus `DEPTH` draft calls (the draft keeps its own KV cache of the committed inputs, so each
# call runs its layer on the new nodes only).
# The chain (~2.0) pays four small draft calls but verifies only 5 tokens, and its draft copies
# well on summaries and quotes. On `tiny` a forward is mostly fixed per-call overhead, so every
# method lands near AR and Medusa, with nothing to run but its heads, edges ahead of the chain (no
# EAGLE run on `tiny` is committed).
#
# **The capstone changes the order.** Chapter 16's run (`bench_results/capstone/`) puts each method's
# `"cpu"` preset on the lean forward: EAGLE-1 at <!-- quote:capstone/capstone_smollm2-135m|eagle [cpu]|speedup -->1.26x<!-- /quote --> AR, the chain at <!-- quote:capstone/capstone_smollm2-135m|speculative [cpu]|speedup -->1.05x<!-- /quote -->, Medusa at <!-- quote:capstone/capstone_smollm2-135m|medusa [cpu]|speedup -->0.85x<!-- /quote -->.
# EAGLE-1's preset is not the tree above: 5 nodes instead of 16, chapter 04b's copy prior
# (tau <!-- quote:capstone/capstone_smollm2-135m|eagle [cpu]|tau -->2.49<!-- /quote --> instead of 1.99) and the draft on int8 panels, so its step costs
# <!-- quote:capstone/capstone_smollm2-135m|eagle [cpu]|step_cost -->1.77<!-- /quote --> AR steps. Medusa's preset is the 8-node tree (tau <!-- quote:capstone/capstone_smollm2-135m|medusa [cpu]|tau -->1.62<!-- /quote -->), whose step cost
# <!-- quote:medusa_smollm2-135m/decode_smollm2-135m|medusa (lossless, 8-node tree)|tau/speedup -->1.45<!-- /quote --> AR steps on Hugging Face's forward (<!-- quote:medusa_smollm2-135m/decode_smollm2-135m|medusa (lossless, 8-node tree)|speedup -->1.12x<!-- /quote --> AR); next to the lean forward's AR step, about 3x
# cheaper, the work around the target (heads, tree, bookkeeping) weighs more and the step costs <!-- quote:capstone/capstone_smollm2-135m|medusa [cpu]|step_cost -->1.81<!-- /quote -->,
# more than its tau.

# %% [markdown]
# ## The CPU fast path: a feature draft's products
# A draft call's *products* decide whether a feature draft pays on a CPU at all: through `F.linear`
# an EAGLE draft's layer and head are MKL GEMMs that repack each weight at every call (5 ms for
# EAGLE-3's 8,192-row head on 3 rows), more than the tree saves. So on a target that runs the lean
# forward (`refimpl.models.lean_llama.LeanLM`, chapter 04c), the front door puts the zoo's draft on
# the same packed kernel itself (`models.drafters.zoo`: `refimpl.models.lean_draft.lean(draft,
# int8=True)`), the layer in one kernel call and every weight on int8
# panels, a quarter of fp32's bytes (a step from <!-- quote:experiments/2026-11-26_eagle3_cpu_draft/panel_kernel/decode_smollm2-135m|eagle-3 + copy prior (dynamic tree 10 nodes, depth 6, top-3, floor 0.1, bias 6)|step_cost -->2.99<!-- /quote --> to <!-- quote:experiments/2026-11-26_eagle3_cpu_draft/lean_draft_products/decode_smollm2-135m|eagle-3 + copy prior (dynamic tree 10 nodes, depth 6, top-3, floor 0.1, bias 6)|step_cost -->2.28<!-- /quote --> AR steps in
# `bench_results/experiments/2026-11-26_eagle3_cpu_draft/`). And they grow the small tree of their
# `"cpu"` preset, `eagle3.PRESETS["cpu"]`: 5 nodes, depth 5, top-2, floor 0.1, copy prior 12. That
# plain call is the fastest lossless method of the committed capstone table on SmolLM2
# (`bench_results/capstone/`); `preset="paper"` (the EAGLE repository's 60-node tree, fp32 draft)
# shows what a GPU's tree costs here (`bench_results/plain_calls/`).

# %% [markdown]
# Build it: `FAST_TARGET` on the lean CPU forward (`fast=True`; SmolLM2 gets it by default), and its
# greedy text as the ground truth.

# %%
fast_lm = models.load(FAST_TARGET, device="cpu", fast=True)    # a LeanLM: the lean forward on the CPU
fast_prompts = [encode_prompt(fast_lm, t) for t in texts]
fast_ar = autoregressive.generate(fast_lm, fast_prompts, max_new_tokens=NEW_TOKENS, eos_token_id=[]).tokens
print(type(fast_lm).__name__, FAST_TARGET, "| prompt lengths", [len(p) for p in fast_prompts])

# %% [markdown]
# A stopwatch on a draft's two calls (`step`: the layer; `logits`: the head), wrapped around one
# `generate` call the way `library_masks` wrapped `step` above. A draft step's time is the draft's
# seconds over the decode steps (the target calls after the prefill).

# %%
import time


def timed(d, run):                                             # -> (run()'s Generation, draft seconds per decode step)
    spent, calls = [0.0], {m: getattr(d, m) for m in ("step", "logits")}
    def clock(f):
        def wrapped(*args, **kw):
            t0 = time.perf_counter(); out = f(*args, **kw); spent[0] += time.perf_counter() - t0
            return out
        return wrapped
    for m, f in calls.items():
        setattr(d, m, clock(f))
    try:
        g = run()
    finally:
        del d.step, d.logits                                   # back to the class's methods
    return g, spent[0] / max(1, g.stats.target_calls - 1)

# %% [markdown]
# Compare three drafts under the same `"cpu"` tree: the front door's (`refimpl.generate(...,
# method="eagle3")`: the zoo's draft, which `models.drafters.zoo` puts on int8 panels beside a target on
# the lean forward, once per target), the same draft on fp16 panels (`lean_draft.lean(draft,
# int8=False)`: the zoo's weights are fp16 numbers) and a plain `Eagle3Draft` passed in (`draft=`: it
# runs as given, through `F.linear`). Each call runs once untimed first (the panels are packed on the
# first product). All three must be greedy decoding, token for token: the target verifies every token.

# %%
from refimpl.models import lean_draft

calls = {"front door (int8 panels)": drafters.zoo(fast_lm, "eagle3"),
         "fp16 panels": lean_draft.lean(drafters.load(fast_lm, "eagle3"), int8=False),
         "plain draft (F.linear)": drafters.load(fast_lm, "eagle3")}
fast_runs = {}
with kernels.references():
    for name, d in calls.items():
        run = lambda: eagle3.generate(fast_lm, fast_prompts, draft=d, max_new_tokens=NEW_TOKENS, eos_token_id=[],
                                      preset="cpu")
        run()                                                  # warm: packs the panels
        g, per_step = timed(d, run)
        assert g.tokens == fast_ar, f"{name}: not greedy decoding"
        fast_runs[name] = (type(d).__name__, g.stats, per_step)
        print(f"{name:26s} {type(d).__name__:16s} {g.stats.seconds * 1e3:6.0f} ms | tau {g.stats.tau:.2f} | draft {per_step * 1e3:5.2f} ms a step")
assert isinstance(calls["front door (int8 panels)"], lean_draft.LeanEagle3Draft) and fast_runs["plain draft (F.linear)"][0] == "Eagle3Draft"

# %% [markdown]
# **Read the numbers.** The three calls grow the same tree (tau equal up to a near-tie: the kernel
# sums in another order), so the differences are the draft's. On `tiny` (H = 256) every product is
# small and a draft step is mostly per-call overhead, which the one-call kernel layer removes; on
# SmolLM2 (`FAST = False`) the head's 8,192 x 576 product dominates, and the int8 panels read a
# quarter of fp32's bytes. These are wall-clock numbers of one run on a shared machine: run the
# cell again to see their noise. None of them is a benchmark; `python -m refimpl.bench` is.

# %% [markdown]
# ### Exercise 2: int8 panels, one row at a time
# Write `quantize_rows(weight)` for a weight (N, K): symmetric int8 per output row, -> `(q, scale)`
# with `q` (N, K) `torch.int8` in [-127, 127] and `scale` (N,) float32, `weight ~ scale[:, None] * q`;
# a row's scale is its largest magnitude / 127 (1 for an all-zero row), each `q` the nearest
# integer. The check compares with the library's `cpu_gemv.quantize` on random, zero and the draft's
# own weights, and then asks the int8 draft's head (where the kernel is built) whether it computes
# `norm(o) @ (scale * q).T`: the products of the quantized weight, not of the weight.

# %%
@exercise("06b", "quantize_rows")
def quantize_rows(weight):
    ...  # your code
    raise NotImplementedError


# %%
def check_quantize():
    from refimpl.models import cpu_gemv
    plain, lean8 = drafters.load(fast_lm, "eagle3"), calls["front door (int8 panels)"]
    gen = torch.Generator(device="cpu").manual_seed(SEED)  # the fast path is the CPU's: tensors on the host
    for w in (torch.randn(7, 5, generator=gen, device="cpu"), torch.zeros(2, 3, device="cpu"), plain.qkv.weight,
              plain.lm_head[:300]):
        q, s = quantize_rows(w)
        want_q, want_s = cpu_gemv.quantize(w)
        assert q.dtype == torch.int8 and q.shape == w.shape and s.shape == w.shape[:1], f"shapes/dtype: q {q.dtype} {tuple(q.shape)}, scale {tuple(s.shape)}"
        assert torch.allclose(s.float(), want_s), f"scale differs by {float((s.float() - want_s).abs().max()):.3g} (rows of {tuple(w.shape)})"
        assert (q.int() - want_q.int()).abs().max() <= 1 and (q != want_q).float().mean() < 1e-3, "q is not the nearest integer"
    if cpu_gemv.available():
        o = torch.randn(3, plain.hidden_size, generator=gen, device="cpu")
        q, s = quantize_rows(plain.lm_head)
        mine, fp32 = plain.norm(o) @ (s[:, None] * q.float()).T, plain.logits(o)
        assert torch.allclose(lean8.logits(o), mine, atol=1e-3), "the int8 head computes the quantized weight's products"
        print(f"int8 head vs (scale * q): {float((lean8.logits(o) - mine).abs().max()):.1e}; vs the fp32 weight: {float((lean8.logits(o) - fp32).abs().max()):.1e}")


check("Exercise 2", check_quantize)
if SHOW_SOLUTIONS:
    show("06b", "quantize_rows")

# %% [markdown]
# ## Summary
# - EAGLE-3 fuses three of the target's layers, `g = fc([l; m; h])`, runs one layer on
#   `[norm(embed(x)); norm(g)]` with the residual on `g`, and reads its own LM head over a kept
#   vocabulary; the streams come from the verification call itself.
# - The training-time test unrolls the draft on its own outputs with a mask that lets step j's query
#   `t` see the context causally and, of each later step, only its own chain: it trains each depth on
#   the inputs it will see while decoding. On `tiny` (4 layers, little data) that does not beat
#   EAGLE-1; on SmolLM2 with a GPU's training it is the fastest lossless method.
# - More tokens per target call is not yet more tokens per second: on a CPU the target's time
#   grows with the tree and the draft's calls add up (step cost = tau / speed-up). A feature draft
#   pays there only on the lean kernel and with a small tree: `refimpl.generate(target, prompts,
#   method="eagle3")` does both by itself (the `"cpu"` preset; the zoo's draft on int8 panels, `models.drafters.zoo`),
#   exactly greedy either way; `preset="paper"`'s 60-node trees pay off where scoring 60 tokens
#   costs about one (a GPU).
# - int8 panels hold `round(w / scale)` per output row: the draft computes with the quantized weight,
#   a quarter of the bytes; the target's verification keeps the output exact.

# %% [markdown]
# **Next: Jacobi decoding.** No draft at all: the target refines a guessed block in parallel
# until it stops changing (chapter 07).
