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
# # 04 · Drafts: distillation, self-speculation, adaptive gamma
#
# Chapters 02-03 took a draft model as given. Here we ask where a good draft comes from and how
# many tokens it should propose. Speculative decoding (Leviathan et al., arXiv 2211.17192) pays
# `1 + gamma·c` target-forward units per step and emits `tau = (1 − alpha^(gamma+1)) / (1 − alpha)`
# tokens, so a draft is good when its acceptance rate `alpha` is high **and** its cost ratio `c`
# is low. You will build, by hand, then check against `refimpl`:
#
# 1. a distilled draft: a 1-layer student trained on the target's softened distribution (`refimpl.drafts`);
# 2. self-speculation: the target's own first `k` layers as a draft (early exit), acceptance per layer;
# 3. the cost / acceptance trade-off: speedup over `gamma` for measured `alpha` and `c`;
# 4. vocabulary trimming (VocabTrim): a draft head over the frequent tokens only;
# 5. adaptive gamma: stop drafting when the draft is unsure (`refimpl.adaptive`), vs the best fixed gamma.
#
# **Parameters** (next cell): `FAST = True` keeps every step small enough for CI on a CPU.

# %%
import torch

FAST = True                    # CI default: a few live training steps, short generations
TARGET = "tiny"                # the target model (zoo name)
DRAFT = "tiny-draft"           # its distilled draft (committed weights)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NEW_TOKENS = 32 if FAST else 128
LIVE_STEPS = 4 if FAST else 150
SHOW_SOLUTIONS = False

# %% [markdown]
# ## Imports, the target and a few prompts
# `tiny` continues King James text. A chat model (a tokenizer with a chat template, such as
# SmolLM2-Instruct) gets the benchmark's requests as user turns instead: its draft was distilled
# on the answers such requests get, not on Bible verses.

# %%
import time
import matplotlib.pyplot as plt
from refimpl import models, drafts, speculative, adaptive, autoregressive
from refimpl.copy_prior import ContextCopyLM, copy_candidates
from refimpl.prompts import encode_prompt, prompt_set

target = models.load(TARGET, device=DEVICE)
if getattr(target.tokenizer, "chat_template", None):
    texts = [text for _, text in prompt_set(per_category=1)]
else:
    texts = ["And God said", "In the beginning God created the heaven", "Jesus answered and said unto them,",
             "The LORD is my shepherd", "And it came to pass, when"]
prompts = [encode_prompt(target, t) for t in (texts[:3] if FAST else texts)]
print(TARGET, "layers:", target.num_layers, "vocab:", target.vocab_size)

# %% [markdown]
# ## The speedup formula, by hand
# With i.i.d. acceptance `alpha`, a step emits `tau(alpha, gamma)` tokens and costs `1 + gamma·c`
# target calls' worth of time. Its ratio is the expected wall-clock speedup over plain decoding.

# %%
def tau_by_hand(alpha, gamma):
    return sum(alpha ** i for i in range(gamma + 1))   # 1 + alpha + ... + alpha^gamma

def speedup_by_hand(alpha, gamma, c):
    return tau_by_hand(alpha, gamma) / (1 + gamma * c)

for a, g, c in [(0.5, 2, 0.25), (0.8, 4, 0.1), (0.9, 8, 0.05)]:
    assert abs(tau_by_hand(a, g) - drafts.expected_tau(a, g)) < 1e-9
    assert abs(speedup_by_hand(a, g, c) - drafts.expected_speedup(a, g, c)) < 1e-9
print("alpha=0.8, c=0.1: speedup by gamma", [round(speedup_by_hand(0.8, g, 0.1), 2) for g in range(1, 9)])

# %% [markdown]
# ## Part 1 · Distilling a draft
# A draft is accepted when it agrees with the target, so we train it to *imitate the target*,
# not the data: knowledge distillation (Hinton et al., arXiv 1503.02531; for drafts "DistillSpec",
# arXiv 2310.08461). The loss is `T²·KL(softmax(p_logits/T) ‖ softmax(q_logits/T))`, plus a little
# cross-entropy on the real next token. First the loss by hand:

# %%
def distill_by_hand(s_logits, t_logits, labels, T=2.0, ce_weight=0.1):
    log_q = torch.log_softmax(s_logits / T, -1)
    log_p = torch.log_softmax(t_logits / T, -1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1) * T * T
    ce = torch.nn.functional.cross_entropy(s_logits, labels, reduction="none")
    return (kl + ce_weight * ce).mean()

s, t, y = torch.randn(6, 50), torch.randn(6, 50), torch.randint(0, 50, (6,))
assert torch.allclose(distill_by_hand(s, t, y), drafts.distill_loss(s, t, y, temperature=2.0, ce_weight=0.1))
print("loss at random:", round(float(distill_by_hand(s, t, y)), 3), "| at the teacher:", float(drafts.distill_loss(t, t, ce_weight=0)))

# %% [markdown]
# ## A student that starts as an early exit
# The student is the target's architecture with 1 layer (`drafts.student_config`). We copy the
# target's embeddings, layer 0 and final norm into it: at step 0 it *is* the target's exit after
# layer 1, a reasonable start.

# %%
from transformers import AutoModelForCausalLM

student = AutoModelForCausalLM.from_config(drafts.student_config(target.config, num_layers=1)).to(DEVICE)
drafts.init_from_target(student, target.model, layers=(0,))
n_student = sum(p.numel() for p in student.parameters())
n_target = sum(p.numel() for p in target.model.parameters())
print(f"student {n_student/1e6:.2f}M params vs target {n_target/1e6:.2f}M")
student_lm = models.LM(student, target.tokenizer, name="student")
print("greedy agreement before training:", round(drafts.greedy_agreement(target, student_lm, prompts, 24), 3))

# %% [markdown]
# ## A few training steps, live
# Random windows of the King James Bible; the teacher's logits come from one no-grad forward.
# (`python -m refimpl.train tiny-draft` runs the same loop for ~180 steps.)

# %%
from refimpl import data
from refimpl.train import encode_docs, random_windows

stream = encode_docs(target.tokenizer, data.kjv_chapters()[:200], target.eos_token_id)
opt = torch.optim.AdamW(student.parameters(), lr=1e-3)
gen = torch.Generator().manual_seed(0)
student.train()
for step in range(LIVE_STEPS):
    x = random_windows(stream, 8, 64, gen).to(DEVICE)   # (B, T)
    with torch.no_grad():
        t_logits = target.model(input_ids=x).logits     # (B, T, V)
    s_logits = student(input_ids=x).logits
    V = s_logits.size(-1)
    loss = distill_by_hand(s_logits[:, :-1].reshape(-1, V), t_logits[:, :-1].reshape(-1, V), x[:, 1:].reshape(-1))
    loss.backward(); opt.step(); opt.zero_grad()
    print(step, round(loss.item(), 3))
student.eval();

# %% [markdown]
# ## The committed draft
# Now load the weights trained offline. `greedy_agreement` measures, along the target's own
# greedy text, how often the draft's argmax equals the target's: the greedy `alpha`. Then
# speculative decoding with it, exact first: it must reproduce autoregressive greedy decoding.

# %%
draft = models.load(DRAFT, device=DEVICE)
speculative.check_same_tokenizer(target, draft)
alpha_draft = drafts.greedy_agreement(target, draft, prompts, NEW_TOKENS)
print(DRAFT, "layers:", draft.num_layers, "| greedy alpha vs", TARGET, "=", round(alpha_draft, 3))
ref = autoregressive.generate(target, prompts, max_new_tokens=NEW_TOKENS)
for gamma in (2, 4, 6):
    g = speculative.generate(target, draft, prompts, gamma=gamma, max_new_tokens=NEW_TOKENS)
    assert g.tokens == ref.tokens
    print(f"gamma={gamma}: alpha={g.stats.alpha:.2f} tau={g.stats.tau:.2f} target calls={g.stats.target_calls}")
print(repr(target.decode(ref.tokens[0])))

# %% [markdown]
# ## Part 2 · Self-speculation: an early exit, by hand
# No second model at all: run the target's first `k` layers, then its final norm and LM head.
# Here is that computation with the target's own modules:

# %%
def exit_logits_by_hand(lm, ids, k):
    inner = lm.model.model
    h = inner.embed_tokens(ids)                                     # (B, T, H)
    pos = torch.arange(ids.size(1), device=ids.device)[None]
    cos_sin = inner.rotary_emb(h, pos)
    mask = torch.full((ids.size(1), ids.size(1)), float("-inf"), device=ids.device).triu(1)[None, None]
    for layer in inner.layers[:k]:
        h = layer(h, attention_mask=mask, position_embeddings=cos_sin, position_ids=pos)
        h = h[0] if isinstance(h, tuple) else h
    return lm.model.lm_head(inner.norm(h)).float()                  # (B, T, V)

ids = torch.tensor([prompts[1]], device=DEVICE)
for k in range(1, target.num_layers + 1):
    ee = drafts.early_exit(target, k)       # shares every weight, has its own k-layer KV cache
    assert torch.allclose(exit_logits_by_hand(target, ids, k), ee.logits(ids), atol=1e-4)
print("early_exit(k) == first k layers + norm + head, for k = 1 ..", target.num_layers)

# %% [markdown]
# ## Acceptance per exit layer
# `exit_layer_agreement` decodes greedily with the full target and, along that text, checks the
# argmax of every exit at once (one forward with all hidden states). Shallow exits are cheap but
# disagree more.

# %%
agree = drafts.exit_layer_agreement(target, prompts, NEW_TOKENS)
ks = list(range(1, target.num_layers + 1))
plt.figure(figsize=(5, 3))
plt.bar(ks, agree, color="tab:blue")
plt.axhline(alpha_draft, color="tab:red", ls="--", label=f"{DRAFT} (1 layer, distilled)")
plt.xlabel("exit after layer k"); plt.ylabel("greedy alpha"); plt.legend(); plt.title(TARGET)
plt.show()
print({k: round(a, 3) for k, a in zip(ks, agree)})

# %% [markdown]
# ## Self-speculation end to end
# The exit draft verifies with the full model, so the output is exact; the counters show how
# `tau` grows with `k`.

# %%
for k in range(1, target.num_layers):
    g = speculative.generate(target, drafts.early_exit(target, k), prompts, gamma=4, max_new_tokens=NEW_TOKENS)
    assert g.tokens == ref.tokens
    print(f"exit k={k}: alpha={g.stats.alpha:.2f} tau={g.stats.tau:.2f}")

# %% [markdown]
# ## Part 3 · What a draft costs
# `c` = (draft step time) / (target step time), one cached token at batch 1. On a CPU, small models
# are dominated by per-layer overheads, so `c` follows the number of layers more than the FLOPs.

# %%
reps = 1 if FAST else 3
t_target = drafts.step_seconds(target, repeats=reps)
costs = {DRAFT: drafts.step_seconds(draft, repeats=reps) / t_target}
for k in range(1, target.num_layers):
    costs[f"exit{k}"] = drafts.step_seconds(drafts.early_exit(target, k), repeats=reps) / t_target
alphas = {DRAFT: alpha_draft, **{f"exit{k}": agree[k - 1] for k in range(1, target.num_layers)}}
print(f"target step: {t_target*1e3:.2f} ms"); print({n: round(c, 2) for n, c in costs.items()})

# %% [markdown]
# ## The trade-off: speedup over gamma
# `speedup(gamma) = tau(alpha, gamma) / (1 + gamma·c)` for each draft's measured `alpha` and `c`.
# A cheap-but-weak draft peaks early; a draft with `c` near 1 can never win.

# %%
gammas = list(range(1, 11))
plt.figure(figsize=(6, 3.5))
for name in costs:
    plt.plot(gammas, [drafts.expected_speedup(alphas[name], g, costs[name]) for g in gammas], marker="o",
             label=f"{name}: alpha={alphas[name]:.2f}, c={costs[name]:.2f}")
plt.axhline(1.0, color="gray", lw=0.8); plt.xlabel("gamma"); plt.ylabel("predicted speedup")
plt.legend(fontsize=7); plt.show()
best = {n: max(gammas, key=lambda g: drafts.expected_speedup(alphas[n], g, costs[n])) for n in costs}
print("best gamma per draft:", best)

# %% [markdown]
# ## Predicted vs measured
# Wall-clock on this machine, same prompts, the distilled draft at its best predicted gamma.
# (Timings on a shared CPU are noisy; the prediction assumes i.i.d. acceptance.) With models this
# small, a CPU spends most of a step in per-call overheads, so `c` is large and the margin slim:
# on a GPU, or with a bigger target, `c` falls and the same `alpha` buys much more.

# %%
def timed(fn):
    t0 = time.perf_counter(); out = fn(); return out, time.perf_counter() - t0

gb = best[DRAFT]
ar_out, t_ar = timed(lambda: autoregressive.generate(target, prompts[:1], max_new_tokens=NEW_TOKENS))
sp_out, t_sp = timed(lambda: speculative.generate(target, draft, prompts[:1], gamma=gb, max_new_tokens=NEW_TOKENS))
assert sp_out.tokens == ar_out.tokens
print(f"gamma={gb}: predicted {drafts.expected_speedup(alpha_draft, gb, costs[DRAFT]):.2f}x, measured {t_ar / t_sp:.2f}x")

# %% [markdown]
# ## Part 4 · VocabTrim: a smaller head
# For a real vocabulary (SmolLM2: 49,152 tokens) the output layer is the largest matrix a small
# draft multiplies. VocabTrim (arXiv 2506.22694) keeps only the K most frequent tokens in the
# draft's head. The draft's `q` is then zero elsewhere; rejection sampling stays lossless for *any*
# `q`, so the decoder only needs full-vocabulary logits with `-inf` outside. By hand:

# %%
full = draft.lm if isinstance(draft, ContextCopyLM) else draft
if isinstance(full, drafts.TrimmedLM):        # smollm2-135m-draft is trimmed already: trim an early exit
    full = drafts.early_exit(target, 2)
K = 1024
kept = drafts.frequent_tokens(target, data.kjv_chapters()[:100], K)          # (K,) sorted ids
h = full.model.model(input_ids=ids).last_hidden_state                      # (1, T, H)
small = h @ full.model.lm_head.weight[kept].T                               # (1, T, K): K rows only
full_by_hand = torch.full((1, ids.size(1), full.vocab_size), float("-inf")).index_copy(-1, kept, small.float())
trimmed = drafts.trim_vocab(full, kept)
assert torch.allclose(trimmed.logits(ids), full_by_hand, atol=1e-5)
print(f"head rows {full.vocab_size} -> {K}; -inf outside:", bool(torch.isneginf(full_by_hand).sum() == ids.size(1) * (full.vocab_size - K)))

# %% [markdown]
# The trimmed draft is still exact under greedy verification, and loses little acceptance
# because the dropped tokens are rare. (`smollm2-135m-draft` is built this way: a few layers, a
# head of the 8,192 tokens SmolLM2 generated most, sharing the target's embedding matrix; it is
# distilled on ~10,800 of SmolLM2's own greedy answers next to the induction drill below,
# see `refimpl/train/distill_data.py`.)

# %%
g = speculative.generate(target, trimmed, prompts, gamma=4, max_new_tokens=NEW_TOKENS)
g_full = speculative.generate(target, full, prompts, gamma=4, max_new_tokens=NEW_TOKENS)
assert g.tokens == ref.tokens == g_full.tokens
print(f"gamma=4: alpha with the head trimmed to {K} = {g.stats.alpha:.2f}, full head = {g_full.stats.alpha:.2f}")

# %% [markdown]
# A trimmed head cannot propose a rare word the prompt asks it to copy -- a name, a number. The
# fix costs almost nothing: also score the tokens already in the context, with their embedding
# rows (`context_vocab=True`; `smollm2-135m-draft` does this, which lifts its agreement on the
# benchmark's summary and copy prompts by ~0.05). Still lossless: verification checks whatever
# the draft proposes.

# %%
ctx_draft = drafts.trim_vocab(full, kept, context_vocab=True)
g_ctx = speculative.generate(target, ctx_draft, prompts, gamma=4, max_new_tokens=NEW_TOKENS)
assert g_ctx.tokens == g.tokens
print(f"alpha: kept tokens only {g.stats.alpha:.2f}, kept + context tokens {g_ctx.stats.alpha:.2f}")

# %% [markdown]
# ## Two costs the formula leaves out
# `tau / (1 + gamma·c)` assumes that the target scores `gamma + 1` tokens in the time of one. Call
# the real ratio `v`: speedup = `tau / (v + gamma·c)`. On a GPU at batch 1, `v ≈ 1`. On a CPU in
# fp32 it need not be: MKL repacks every weight matrix once a product has 4 or more rows, and for
# SmolLM2-135M on a 2-core machine `v(5) ≈ 1.5` -- enough to eat most of the gain. Packing the
# weights once for oneDNN (`models.load(..., prepack=True)`, `refimpl/models/cpu_linear.py`) brings it to
# `≈ 1.1`. Measure both on your target (set `TARGET = "smollm2-135m"` to see the jump):

# %%
from refimpl.models import cpu_linear

rows = cpu_linear.matmul_cost(target.model, rows=(1, 2, 3, 4, 5, 6), repeats=3 if FAST else 15)
plt.figure(figsize=(5, 3))
plt.plot([r["rows"] for r in rows], [r["mkl_ms"] for r in rows], marker="o", label="MKL F.linear")
plt.plot([r["rows"] for r in rows], [r["prepacked_ms"] for r in rows], marker="o", label="prepacked (oneDNN)")
plt.xlabel("rows (tokens scored at once)"); plt.ylabel("ms, all matrices"); plt.legend(); plt.show()
v_mkl, v_packed = (rows[4][k] / rows[0][k] for k in ("mkl_ms", "prepacked_ms"))
print(f"v(5) from the matrix products: MKL {v_mkl:.2f}, prepacked {v_packed:.2f}")
print("predicted speedup at gamma=4:", {v: round(drafts.expected_speedup(alpha_draft, 4, costs[DRAFT], v), 2)
                                       for v in (1.0, round(v_mkl, 2), round(v_packed, 2))})

# %% [markdown]
# The second cost hides inside `c`. A 3-layer draft does little arithmetic, so a Hugging Face
# forward of it is mostly per-call machinery: mask builders, the rotary module, output objects,
# and a cache that reallocates every layer's keys and values at every step. `refimpl/models/lean_llama.py`
# runs the same math from the same weights with a preallocated cache (`LeanTrimmedLM`); the logits
# are equal, so the accepted tokens are too, and only `c` moves.

# %%
from refimpl.models.lean_llama import LeanTrimmedLM
lean = LeanTrimmedLM.of(trimmed)
t_plain, t_lean = (drafts.step_seconds(d, repeats=reps) for d in (trimmed, lean))
g_lean = speculative.generate(target, lean, prompts, gamma=4, max_new_tokens=NEW_TOKENS)
assert g_lean.tokens == g.tokens and g_lean.stats.accepted == g.stats.accepted
print(f"trimmed draft step: Hugging Face {t_plain*1e3:.2f} ms, lean {t_lean*1e3:.2f} ms -> "
      f"c {t_plain / t_target:.3f} -> {t_lean / t_target:.3f}")

# %% [markdown]
# ## Can the draft copy? The induction drill
# Summaries, edits and answers about a passage repeat long stretches of the prompt. A model copies
# with *induction heads*: one head marks each token with the token before it, a later head finds
# the earlier occurrence of the current token and predicts what followed it. Distillation on
# the target's answers did not teach the SmolLM2 draft this (it copied 0% of repeated random
# spans while the target copies ~82%). `smol_draft.copy_drill` builds batches where each span is shown
# twice at a row-dependent distance, so only copying by content scores; `smol_draft.copy_accuracy`
# measures top-1 accuracy on the second showing. (With one fixed distance a draft learned "look
# 47 tokens back" instead: it scored 0.96 at that distance and 0.0 at any other.)

# %%
from refimpl.train import smol_draft
x, labels = smol_draft.copy_drill(torch.arange(target.vocab_size), torch.arange(target.vocab_size), batch=2, span=8,
                              gen=torch.Generator().manual_seed(0))
print("a drill row:", x[0].tolist())
print("scored at :", [int(t) for t in (labels[0] >= 0).nonzero().flatten()])
everything = torch.arange(target.vocab_size)  # full-vocabulary models: kept index == token id
for name, lm in [(TARGET, target), (DRAFT, draft)]:
    print(f"{name}: copies {smol_draft.copy_accuracy(lm.model, everything, span=24):.0%} of repeated random spans")

# %% [markdown]
# Neither `tiny` nor its draft copies: `tiny` was trained for minutes on the King James Bible and
# never formed induction heads, so on this pair copying buys nothing. SmolLM2-135M, trained on
# trillions of tokens, copies ~82% of such spans (scored on its draft's 8,192 tokens), and its
# draft has to match that.
#
# The committed SmolLM2 draft was trained with the drill next to distillation (phase 3 and 4 of
# `refimpl.train.smol_draft.train_smollm2_draft_recipe`); its training report records the copy accuracy it reached,
# and its agreement with the target on the benchmark's summary / copy / question prompts rose
# with it (see the README's benchmark section).

# %%
import json, os
report = os.path.join(models.MODELS_DIR, "smollm2-135m-draft", "train_report.json")
if os.path.exists(report):
    r = json.load(open(report))
    print({k: r.get(k) for k in ("layers", "drill_batch", "copy_accuracy", "heldout_agreement")})

# %% [markdown]
# ### When the drill is not enough: a copy prior
# Copying a span shown twice is not the same as copying a fact out of a passage. Scored
# teacher-forced on SmolLM2's own answers to the benchmark prompts, the committed draft still
# guesses where its target copies: "Martha **Water**" for the keeper "Martha Lowe", "1**8**78"
# for "1938". Prompt lookup (chapter 09) does only this: find the latest earlier occurrence of
# the context's last `n` tokens and propose the token that followed. A draft can have both:
# `ContextCopyLM` adds `bias` to the draft's logit for that token (longest `n` from 3
# down to 2). Any draft distribution is verified exactly, so this is lossless too. The lookup,
# by hand:

# %%
def lookup_by_hand(history, max_n=3, min_n=2):
    t = len(history) - 1
    for n in range(max_n, min_n - 1, -1):
        suffix = history[t - n + 1:]
        for j in range(t - 1, n - 2, -1):          # latest earlier occurrence first
            if history[j - n + 1: j + 1] == suffix:
                return history[j + 1]              # what followed it
    return None

ctx = target.encode("And God said, Let there be light: and there was light. And God said, Let there")
mine = lookup_by_hand(ctx)
ours = copy_candidates(torch.tensor(ctx), torch.tensor([len(ctx) - 1]), 3, 2).item()
assert mine == ours
print("context ends", repr(target.decode(ctx[-3:])), "-> copy", repr(target.decode([mine])))

# %% [markdown]
# With the prior on the same prompts: tokens unchanged, acceptance moved. `tiny` never learned to
# copy, so here the prior can as easily cost acceptance as win it. On SmolLM2 (`smollm2-135m-draft`
# loads with the prior) the benchmark records tau per prompt category with and without it
# (`python -m refimpl.bench --model smollm2-135m --per-category 5 --methods "speculative greedy"`,
# results committed in `bench_results/`, plotted below): the prior pays where answers repeat
# their prompt -- summaries, rewrites, answers quoted from a passage -- and cannot help chat,
# where nothing repeats.

# %%
plain = draft.lm if isinstance(draft, ContextCopyLM) else draft   # smollm2-135m-draft comes wrapped
copier = ContextCopyLM(plain)
g_copy = speculative.generate(target, copier, prompts, gamma=4, max_new_tokens=NEW_TOKENS)
g_plain = speculative.generate(target, plain, prompts, gamma=4, max_new_tokens=NEW_TOKENS)
assert g_copy.tokens == g_plain.tokens == ref.tokens
print(f"{TARGET}, gamma=4: tau without the prior {g_plain.stats.tau:.2f}, with it {g_copy.stats.tau:.2f}")

results = os.path.join(os.path.dirname(models.MODELS_DIR), "bench_results")
path = next((p for p in (os.path.join(results, "decode_smollm2-135m_30prompts", "decode_smollm2-135m.json"),
                         os.path.join(results, "decode_smollm2-135m.json")) if os.path.exists(p)), None)
rows = {r["method"]: r for r in json.load(open(path))["rows"]} if path else {}
pair = ("speculative greedy, draft without copy prior (gamma=4)", "speculative greedy (gamma=4)")
if all(k in rows and "per_category_tau" in rows[k] for k in pair):
    cats = list(rows[pair[1]]["per_category_tau"])
    fig, ax = plt.subplots(figsize=(7, 3))
    for i, (key, label) in enumerate(zip(pair, ("draft alone", "draft + copy prior"))):
        ax.bar([c + i * 0.4 for c in range(len(cats))], [rows[key]["per_category_tau"][c] for c in cats],
               width=0.4, label=label)
    ax.set_xticks([c + 0.2 for c in range(len(cats))], cats)
    ax.set_ylabel("tau (gamma = 4)")
    ax.set_title(f"smollm2-135m benchmark, {rows[pair[1]]['prompts']} prompts")
    ax.set_ylim(0, 1.3 * max(max(rows[k]["per_category_tau"].values()) for k in pair))
    ax.legend(ncol=2, loc="upper left")
    plt.show()
else:
    print("no SmolLM2 benchmark results with per-category tau yet: run the command above")

# %% [markdown]
# ## Part 5 · Adaptive gamma: stop when the draft is unsure
# A fixed `gamma` keeps drafting where the draft is guessing. SpecDec++ (arXiv 2405.19715) stops
# once the chance that *some* draft of the round is rejected gets high. Training-free versions use
# the draft's own top-1 probability `max q`: stop after a token with `max q < threshold`
# (`"threshold"`), or once the product of the round's `max q` (an estimate of P(all accepted))
# falls below `threshold` (`"cumulative"`). One drafting round by hand:

# %%
def draft_round_by_hand(draft, context, threshold, max_gamma, cumulative=False):
    out, cache, feed, reach = [], None, torch.tensor([context], device=DEVICE), 1.0
    for _ in range(max_gamma):
        logits, cache = draft.forward(feed, cache)
        q = torch.softmax(logits[0, -1], -1)
        out.append(int(q.argmax()))
        reach *= float(q.max())                    # estimated P(every draft so far accepted)
        if (reach if cumulative else float(q.max())) < threshold:
            break                                  # unsure: this token is proposed, then stop
        feed = torch.tensor([[out[-1]]], device=DEVICE)
    return out

for th in (0.05, 0.2, 0.5):
    print(th, [len(draft_round_by_hand(draft, p, th, 8, cumulative=True)) for p in prompts])

# %% [markdown]
# ## `refimpl.adaptive`: the same rules inside speculative decoding
# Exact like every greedy method; `stats.extra["gammas"]` lists the draft length of each step.
# The first step's length must match our hand-built round.

# %%
for policy, th in (("threshold", 0.3), ("cumulative", 0.05), ("cumulative", 0.2)):
    g = adaptive.generate(target, draft, prompts, max_gamma=8, threshold=th, max_new_tokens=NEW_TOKENS, policy=policy)
    assert g.tokens == ref.tokens
    first = adaptive.generate(target, draft, prompts[0], max_gamma=8, threshold=th, max_new_tokens=NEW_TOKENS, policy=policy)
    assert first.stats.extra["gammas"][0] == len(draft_round_by_hand(draft, prompts[0], th, 8, policy == "cumulative"))
    print(f"{policy} {th}: mean gamma={g.stats.extra['mean_gamma']:.2f} alpha={g.stats.alpha:.2f} tau={g.stats.tau:.2f}")

# %% [markdown]
# ## Adaptive vs the best fixed gamma
# We decode each prompt alone (batch 1) and count calls. Cost per token in target-call units is
# `(target calls + c·draft calls) / tokens`: deterministic, no timing noise, and we can read it
# for any `c` (ours on this CPU, or a GPU-like one) from the same runs.

# %%
def counts(fn):
    gs = [fn(p).stats for p in prompts]
    return [sum(s.target_calls for s in gs), sum(s.draft_calls for s in gs), sum(s.new_tokens for s in gs)]

fixed = {gm: counts(lambda p: speculative.generate(target, draft, p, gamma=gm, max_new_tokens=NEW_TOKENS))
         for gm in range(1, 9)}
adapt = {(pol, th): counts(lambda p: adaptive.generate(target, draft, p, max_gamma=8, threshold=th, policy=pol,
                                                       max_new_tokens=NEW_TOKENS))
         for pol, th in [("cumulative", 0.02), ("cumulative", 0.05), ("cumulative", 0.1), ("cumulative", 0.2),
                         ("threshold", 0.3), ("threshold", 0.6)]}
cost = lambda n, c: (n[0] + c * n[1]) / n[2]

# %% [markdown]
# ## Which wins, and when?
# For each `c`, the best fixed gamma against the best adaptive setting (lower cost is better).
# A cheap draft (small `c`) wants long rounds; an expensive one wants short rounds. On this CPU
# `c` of a 1-layer draft is large (per-call overheads), which leaves little to win.

# %%
cs = [0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.6, 0.8]
ratio = [min(cost(n, c) for n in fixed.values()) / min(cost(n, c) for n in adapt.values()) for c in cs]
plt.figure(figsize=(5.5, 3)); plt.plot(cs, ratio, "o-"); plt.axhline(1, color="gray", lw=0.8)
plt.axvline(costs[DRAFT], color="tab:red", ls="--", label=f"measured c = {costs[DRAFT]:.2f}")
plt.xlabel("c"); plt.ylabel("best fixed cost / best adaptive cost"); plt.legend(); plt.show()
for c in (costs[DRAFT], 0.2):
    bf, ba = min(fixed, key=lambda k: cost(fixed[k], c)), min(adapt, key=lambda k: cost(adapt[k], c))
    print(f"c={c:.2f}: best fixed gamma={bf} {cost(fixed[bf], c):.3f} | best adaptive {ba} {cost(adapt[ba], c):.3f}")

# %% [markdown]
# ## A bandit over gamma
# BanditSpec (arXiv 2505.15141) needs no confidence at all: UCB1 picks each step's `gamma` from
# {1, 2, 4, 6, 8}, rewarding tokens per unit of cost `(n + 1) / (1 + gamma·c)`. Passing one
# `UCB` object across calls lets it keep learning.

# %%
c = costs[DRAFT]
bandit = adaptive.UCB(gammas=(1, 2, 4, 6, 8), cost_ratio=c)
for rep in range(1 if FAST else 3):
    g = adaptive.generate(target, draft, prompts, max_new_tokens=NEW_TOKENS, policy="ucb", bandit=bandit)
    assert g.tokens == ref.tokens
print("mean reward per arm:", {k: round(v, 3) for k, v in bandit.means().items()}, "pulls:", bandit.n)
print(f"bandit: {g.stats.target_calls} target calls, {g.stats.draft_calls} draft calls for {g.stats.new_tokens} tokens")

# %% [markdown]
# ## Exercises
# **1. The best fixed gamma.** For `alpha = 0.8` and `c = 0.1`, which integer `gamma` in 1..20
# maximises the predicted speedup? Write `best_gamma(alpha, c)`.

# %%
def best_gamma(alpha, c):               # your answer here
    return max(range(1, 21), key=lambda g: drafts.expected_speedup(alpha, g, c))

def check_best_gamma(fn):
    for a, cc in [(0.8, 0.1), (0.5, 0.3), (0.95, 0.02), (0.3, 0.5)]:
        want = max(range(1, 21), key=lambda g: (1 - a ** (g + 1)) / (1 - a) / (1 + g * cc))
        assert fn(a, cc) == want, f"alpha={a}, c={cc}: expected {want}"
    return "correct"

print(check_best_gamma(best_gamma), "| alpha=0.8, c=0.1 ->", best_gamma(0.8, 0.1))

# %% [markdown]
# **2. Which exit?** Exiting after layer `k` of `L` costs about `c_k = k / L`. Given the measured
# `agree` list above, return the `k` in 1..L−1 with the best predicted speedup at `gamma = 4`.

# %%
def best_exit(agree, L, gamma=4):       # your answer here
    return max(range(1, L), key=lambda k: drafts.expected_speedup(agree[k - 1], gamma, k / L))

def check_best_exit(fn):
    L = target.num_layers
    want = max(range(1, L), key=lambda k: (1 - agree[k - 1] ** 5) / (1 - min(agree[k - 1], 0.999999)) / (1 + 4 * k / L))
    assert fn(agree, L) == want
    assert fn([0.0, 0.0, 0.99, 1.0], 4) == 3
    return "correct"

print(check_best_exit(best_exit), "| best exit:", best_exit(agree, target.num_layers))

# %% [markdown]
# ## Summary
# - A draft is worth `tau / (1 + gamma·c)`: acceptance *and* cost. Distillation raises `alpha`;
#   fewer layers and a trimmed head lower `c`.
# - Early exit is a free draft (no training, no extra weights); without training its acceptance
#   falls fast with depth removed (for SmolLM2-135M, `alpha` stays below 0.1 until layer ~20 of 30).
# - A trimmed vocabulary keeps verification exact: `q = 0` outside the kept tokens is allowed.
# - Adaptive gamma decides the draft length from the draft side (confidence, or a bandit over
#   past steps) before the target is called, which keeps greedy exact and sampling lossless
#   (tests/test_adaptive.py checks the sampled distribution by exact enumeration).
