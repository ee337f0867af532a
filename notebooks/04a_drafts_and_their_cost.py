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
# # 04a · Drafts and their cost
#
# Chapters 02-03 took a draft model as given. Here we ask where a good draft comes from and what
# it costs. Speculative decoding (Leviathan et al., arXiv 2211.17192) pays `1 + gamma·c`
# target-forward units per step, where `c` = (draft step cost) / (target step cost), and emits
# `tau = (1 − alpha^(gamma+1)) / (1 − alpha)` tokens per step, where `alpha` is the probability
# that one draft token is accepted. A draft is good when `alpha` is high **and** `c` is low.
# (Chapter 04b chooses `gamma` step by step and adds a copy prior; appendix 04c makes the CPU
# paths cheap.)
#
# **After this chapter you can**
#
# 1. predict a draft's speedup from `alpha`, `gamma` and `c`, and tell `alpha` (a probability the
#    formula takes) from the measured *acceptance rate* (accepted / proposed drafts);
# 2. write the distillation loss a draft is trained with, and say why it imitates the target rather than the data;
# 3. turn the target's own first `k` layers into a draft (early exit) and predict its cost from
#    parameter counts, LM head included;
# 4. trim a draft's vocabulary (VocabTrim) and explain why verification stays exact.
#
# **Parameters** (next cell): `FAST = True` keeps every step small enough for CI on a CPU.

# %%
import torch
from refimpl.models import default_device

FAST = True                    # CI default: a few live training steps, short generations
TARGET = "tiny"                # the target model (zoo name)
DRAFT = "tiny-draft"           # its distilled draft (committed weights)
DEVICE = default_device()      # a torch.device: CUDA when present, $REFIMPL_DEVICE overrides
NEW_TOKENS = 32 if FAST else 128
LIVE_STEPS = 4 if FAST else 150
SHOW_SOLUTIONS = False

# %% [markdown]
# ## Imports, the target and a few prompts
# `tiny` continues King James text. A chat model (a tokenizer with a chat template, such as
# SmolLM2-Instruct) gets the benchmark's requests as user turns instead. Greedy autoregressive
# decoding (`ref`) is the ground truth every greedy speculative run below must reproduce.

# %%
import time
import matplotlib.pyplot as plt
from refimpl import models, drafts, speculative, autoregressive
from refimpl.prompts import encode_prompt, prompt_set
from solutions import exercise, check, show, answers_on
from figures import draw_rounds, rounds_legend

target = models.load(TARGET, device=DEVICE)
if getattr(target.tokenizer, "chat_template", None):
    texts = [text for _, text in prompt_set(per_category=1)]
else:
    texts = ["And God said", "In the beginning God created the heaven", "Jesus answered and said unto them,",
             "The LORD is my shepherd", "And it came to pass, when"]
prompts = [encode_prompt(target, t) for t in (texts[:3] if FAST else texts)]
ref = autoregressive.generate(target, prompts, max_new_tokens=NEW_TOKENS)
print(TARGET, "layers:", target.num_layers, "vocab:", target.vocab_size)

# %% [markdown]
# ## Two numbers, two names, and the speedup formula
# The formula takes `alpha`, the probability that a draft token is accepted given that the ones
# before it were, assumed the same at every position. What a run *measures* is different: the
# **acceptance rate** = accepted drafts / proposed drafts. After a rejection the rest of the
# round is proposed but never tested, so the acceptance rate is below `alpha` (exercise 2 says by
# how much). `refimpl` stores the acceptance rate as `stats.alpha`; this chapter prints it under
# its own name. With i.i.d. acceptance a step emits `tau(alpha, gamma)` tokens and costs
# `1 + gamma·c` target calls' worth of time; their ratio is the expected speedup over plain decoding.

# %%
def acceptance_rate(stats):                    # measured: accepted / proposed drafts, over a whole run
    return sum(sum(a) for a in stats.accepted) / stats.drafted

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
    log_q = torch.log_softmax(s_logits / T, -1)                       # (N, V) student
    log_p = torch.log_softmax(t_logits / T, -1)                       # (N, V) teacher
    kl = (log_p.exp() * (log_p - log_q)).sum(-1) * T * T
    ce = torch.nn.functional.cross_entropy(s_logits, labels, reduction="none")
    return (kl + ce_weight * ce).mean()


s, t, y = torch.randn(6, 50, device=DEVICE), torch.randn(6, 50, device=DEVICE), torch.randint(0, 50, (6,), device=DEVICE)
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

# %% [markdown]
# ## A few training steps, live
# Random windows of the King James Bible; the teacher's logits come from one no-grad forward.
# (`python -m refimpl.train tiny-draft` runs the same loop for ~180 steps.)

# %%
from refimpl import data
from refimpl.train import encode_docs, random_windows

stream = encode_docs(target.tokenizer, data.kjv_chapters()[:200], target.eos_token_id)
opt, gen = torch.optim.AdamW(student.parameters(), lr=1e-3), torch.Generator(device="cpu").manual_seed(0)   # picks offsets in the host-side stream
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
# ## Measuring a draft without decoding: greedy agreement
# Along the target's own greedy continuation of a prompt, how often is the draft's argmax the
# target's next token? In greedy speculative decoding a draft token is tested exactly when every
# token before it is the target's, so this teacher-forced agreement estimates `alpha` directly,
# from one draft forward per prompt.
#
# **Exercise 1.** Write `agreement(target, draft, prompts, n)`: decode each prompt greedily with
# the target for `n` tokens (`autoregressive.generate`), run the draft once on prompt +
# continuation, and count the positions where its argmax is the target's next token. Return
# hits / positions over all prompts. The check compares with `drafts.greedy_agreement`.

# %%
@exercise("04a", "agreement")
def agreement(target, draft, prompts, n):
    # your code here
    raise NotImplementedError

# %% [markdown]
# The check runs it on the committed draft and on the half-trained student (two different
# drafts, so a constant answer is caught).

# %%
draft = models.load(DRAFT, device=DEVICE)
speculative.check_same_tokenizer(target, draft)


def check_agreement():
    for d in (draft, student_lm):
        mine, lib = agreement(target, d, prompts, 16), drafts.greedy_agreement(target, d, prompts, 16)
        assert abs(mine - lib) < 1e-9, f"{d.name}: you measured {mine:.4f}, drafts.greedy_agreement says {lib:.4f}"


check("Exercise 1", check_agreement)
if SHOW_SOLUTIONS:
    show("04a", "agreement")

# %% [markdown]
# ## The committed draft
# The zoo's `tiny-draft` was distilled offline for longer than the live loop above; its agreement
# is our estimate of `alpha` (the student after a few steps is far behind). Speculative decoding
# with it must reproduce greedy decoding; next to the measured `tau` and acceptance rate stands
# the formula's `tau` at that `alpha`.

# %%
alpha_draft = drafts.greedy_agreement(target, draft, prompts, NEW_TOKENS)
alpha_student = drafts.greedy_agreement(target, student_lm, prompts, NEW_TOKENS)
print(f"{DRAFT}: {draft.num_layers} layer(s), alpha ~ {alpha_draft:.3f} | student after {LIVE_STEPS} steps: {alpha_student:.3f}")
for gamma in (2, 4, 6):
    g = speculative.generate(target, prompts, draft=draft, gamma=gamma, max_new_tokens=NEW_TOKENS)
    assert g.tokens == ref.tokens
    print(f"gamma={gamma}: acceptance rate {acceptance_rate(g.stats):.2f}, tau measured {g.stats.tau:.2f}, "
          f"formula at alpha={alpha_draft:.2f}: {drafts.expected_tau(alpha_draft, gamma):.2f}")
print(repr(target.decode(ref.tokens[0])))

# %% [markdown]
# **Exercise 2.** Predict the acceptance rate from `alpha`. With i.i.d. acceptance, a round of
# `gamma` drafts accepts `i` of them with probability `alpha^i (1 − alpha)` (and all `gamma` with
# `alpha^gamma`). Write `rate_from_alpha(alpha, gamma)` = expected accepted / `gamma`. The check
# compares it with 200,000 simulated rounds, then puts it next to the measured rates above.

# %%
@exercise("04a", "rate_from_alpha")
def rate_from_alpha(alpha, gamma):
    # your code here
    raise NotImplementedError

# %% [markdown]
# The check: a simulation of i.i.d. rounds (accept draft `i` only if drafts `1..i-1` were).

# %%
def simulated_rate(alpha, gamma, rounds=200_000, seed=0):
    gen = torch.Generator(device="cpu").manual_seed(seed)                                    # a host-side simulation
    ok = torch.rand(rounds, gamma, generator=gen, device="cpu") < alpha                      # (R, gamma)
    accepted = ok.long().cumprod(1).sum(1)                                                   # leading run
    return accepted.sum().item() / (rounds * gamma)


def check_rate():
    for a, gm in [(0.5, 4), (0.8, 1), (0.8, 6), (0.95, 8)]:
        sim = simulated_rate(a, gm)
        assert abs(rate_from_alpha(a, gm) - sim) < 0.005, f"alpha={a}, gamma={gm}: you say {rate_from_alpha(a, gm):.3f}, simulated {sim:.3f}"
    g4 = speculative.generate(target, prompts, draft=draft, gamma=4, max_new_tokens=NEW_TOKENS)
    print(f"{DRAFT}, gamma=4: alpha ~ {alpha_draft:.2f}, predicted rate {rate_from_alpha(alpha_draft, 4):.2f}, measured {acceptance_rate(g4.stats):.2f}")


check("Exercise 2", check_rate)
if SHOW_SOLUTIONS:
    show("04a", "rate_from_alpha")

# %% [markdown]
# ## Part 2 · Self-speculation: an early exit, by hand
# No second model at all: run the target's first `k` layers, then its final norm and LM head
# ("Draft & Verify", arXiv 2309.08168; "LayerSkip", arXiv 2404.16710). Here is that computation
# with the target's own modules, checked against `drafts.early_exit(target, k)`, which builds the
# same thing as a model of its own: it shares every weight with the target (nothing is copied)
# and has its own `k`-layer KV cache.

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
for k in range(1, target.num_layers + 1):   # drafts.early_exit: the same modules (shared), its own KV cache
    assert torch.allclose(exit_logits_by_hand(target, ids, k), drafts.early_exit(target, k).logits(ids), atol=1e-4)
print("early_exit(k) == first k layers + norm + head, for k = 1 ..", target.num_layers)

# %% [markdown]
# ## Agreement per exit layer
# `exit_layer_agreement` measures the agreement of every exit at once (one forward with all
# hidden states). Shallow exits are cheap but disagree more.

# %%
agree = drafts.exit_layer_agreement(target, prompts, NEW_TOKENS)
ks = list(range(1, target.num_layers + 1))
plt.figure(figsize=(5, 3))
plt.bar(ks, agree, color="tab:blue")
plt.axhline(alpha_draft, color="tab:red", ls="--", label=f"{DRAFT} ({draft.num_layers} layer, distilled)")
plt.xlabel("exit after layer k"); plt.ylabel("agreement (alpha estimate)"); plt.legend(); plt.title(TARGET)
plt.show()
print({k: round(a, 3) for k, a in zip(ks, agree)})

# %% [markdown]
# ## Self-speculation end to end: what each exit buys
# Each exit drafts `gamma = 4` tokens per round and the full target verifies, so the output is
# exact. Every bar below is one target call: green drafts were accepted, red ones were drafted and
# thrown away, and the target adds one token of its own on top.

# %%
def rounds_of(stats):
    return [(a[0], g) for a, g in zip(stats.accepted, stats.extra["gammas"])]


runs = {}
for k in range(1, target.num_layers):
    g = speculative.generate(target, prompts[:1], draft=drafts.early_exit(target, k), gamma=4, max_new_tokens=NEW_TOKENS)
    assert g.tokens == ref.tokens[:1]
    runs[k] = g.stats
    print(f"exit k={k}: acceptance rate {acceptance_rate(g.stats):.2f}, tau {g.stats.tau:.2f}, "
          f"{g.stats.target_calls} target calls for {g.stats.new_tokens} tokens")

# %% [markdown]
# The rounds of those runs, side by side (prompt 0):

# %%
fig, axes = plt.subplots(1, len(runs), figsize=(4 * len(runs), 2.8), sharey=True)
for ax, (k, st) in zip(axes if len(runs) > 1 else [axes], runs.items()):
    draw_rounds(ax, rounds_of(st), title=f"exit after layer {k}", ymax=5)
rounds_legend(ax)
plt.tight_layout(); plt.show()

# %% [markdown]
# ## Part 3 · What a draft costs
# `c_k = k / L` is tempting for the exit after `k` of `L` layers, but every exit also runs the
# final norm and the **LM head**, a `(V, H)` matrix, and so does the target. On a memory-bound
# GPU at batch 1 a step costs about the bytes of weight it reads, i.e. the multiply-accumulates
# of its matrix products. Here are the matrices one token goes through:

# %%
layer0 = target.model.model.layers[0]
for name, mod in layer0.named_modules():
    if isinstance(mod, torch.nn.Linear):
        print(f"layer 0 {name:18s} {tuple(mod.weight.shape)}")
print(f"lm_head {'':17s} {tuple(target.model.lm_head.weight.shape)}   x {target.num_layers} layers + 1 head")

# %% [markdown]
# **Exercise 3.** Write `exit_cost(lm, k)`: the cost ratio of the exit after `k` layers to the
# full target, counting one multiply-accumulate per weight of every `nn.Linear` a token passes
# through (the first `k` layers' matrices plus the LM head). The check counts the real FLOPs of
# one-token forwards with `torch.utils.flop_counter.FlopCounterMode`.

# %%
@exercise("04a", "exit_cost")
def exit_cost(lm, k):
    # your code here
    raise NotImplementedError

# %% [markdown]
# The check (its negative control: `k / L` must be caught by the same tolerance):

# %%
from torch.utils.flop_counter import FlopCounterMode


def flops(lm):
    with FlopCounterMode(display=False) as fc:
        lm.logits(torch.tensor([[prompts[0][0]]], device=DEVICE))
    return fc.get_total_flops()


def check_exit_cost():
    L, full = target.num_layers, flops(target)
    counted = {k: flops(drafts.early_exit(target, k)) / full for k in range(1, L + 1)}
    assert abs(1 / L - counted[1]) > 0.02, "negative control: k / L should be off"
    for k, want in counted.items():
        assert abs(exit_cost(target, k) - want) < 0.01, f"k={k}: you say {exit_cost(target, k):.3f}, counted FLOPs say {want:.3f}"


check("Exercise 3", check_exit_cost)
if SHOW_SOLUTIONS:
    show("04a", "exit_cost")

# %% [markdown]
# ## Measured cost on this machine
# `c` = (draft step time) / (target step time), one cached token at batch 1. On a CPU, models
# this small spend much of a step in per-call overheads (per forward and per layer), so the
# measured `c` follows neither `k / L` nor the FLOP count closely; appendix 04c looks at where
# that time goes.

# %%
reps = 3 if FAST else 9
t_target = drafts.step_seconds(target, repeats=reps)
costs = {DRAFT: drafts.step_seconds(draft, repeats=reps) / t_target}
for k in range(1, target.num_layers):
    costs[f"exit{k}"] = drafts.step_seconds(drafts.early_exit(target, k), repeats=reps) / t_target
alphas = {DRAFT: alpha_draft, **{f"exit{k}": agree[k - 1] for k in range(1, target.num_layers)}}
print(f"target step: {t_target*1e3:.2f} ms"); print({n: round(c, 2) for n, c in costs.items()})

# %% [markdown]
# ## The trade-off: speedup over gamma
# `speedup(gamma) = tau(alpha, gamma) / (1 + gamma·c)` for each draft's measured agreement and
# `c`. A cheap-but-weak draft peaks early; a draft with `c` near 1 can never win.

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
# Wall-clock on this machine, same prompt, the distilled draft at its best predicted gamma.
# (Timings on a shared CPU are noisy; the prediction assumes i.i.d. acceptance. Under
# `TRITON_INTERPRET=1`, as in CI, the verification kernel runs in Triton's *interpreter* and the
# measured number means nothing.) With models this small a CPU spends most of a step in per-call
# overheads, so `c` is large and the margin slim: on a GPU, or with a bigger target, `c` falls
# and the same `alpha` buys much more.

# %%
import os


def timed(fn):
    t0 = time.perf_counter(); out = fn(); return out, time.perf_counter() - t0


gb = best[DRAFT]
ar_out, t_ar = timed(lambda: autoregressive.generate(target, prompts[:1], max_new_tokens=NEW_TOKENS))
sp_out, t_sp = timed(lambda: speculative.generate(target, prompts[:1], draft=draft, gamma=gb, max_new_tokens=NEW_TOKENS))
assert sp_out.tokens == ar_out.tokens
note = " (Triton interpreter: ignore)" if os.environ.get("TRITON_INTERPRET") == "1" else ""
print(f"gamma={gb}: predicted {drafts.expected_speedup(alpha_draft, gb, costs[DRAFT]):.2f}x, measured {t_ar / t_sp:.2f}x{note}")

# %% [markdown]
# ## Part 4 · VocabTrim: a smaller head
# For a real vocabulary (SmolLM2: 49,152 tokens) the LM head is the largest matrix a small draft
# multiplies (exercise 3 counted it). VocabTrim (arXiv 2506.22694) keeps only the K most frequent
# tokens in the draft's head. The draft's `q` is then zero elsewhere; rejection sampling stays
# lossless for *any* `q`, so the decoder only needs full-vocabulary logits with `-inf` outside.
# We trim an early exit (2 layers) by hand:

# %%
base = drafts.early_exit(target, 2)
K = 1024
kept = drafts.frequent_tokens(target, data.kjv_chapters()[:100], K).to(DEVICE)      # (K,) sorted ids
h = base.model.model(input_ids=ids).last_hidden_state                                 # (1, T, H)
small = h @ base.model.lm_head.weight[kept].T                                          # (1, T, K): K rows only
full_by_hand = torch.full((1, ids.size(1), base.vocab_size), float("-inf"), device=DEVICE)
full_by_hand = full_by_hand.index_copy(-1, kept, small.float())                       # (1, T, V)
trimmed = drafts.trim_vocab(base, kept)
assert torch.allclose(trimmed.logits(ids), full_by_hand, atol=1e-5)
print(f"head rows {base.vocab_size} -> {K}; -inf outside the kept tokens:",
      int(torch.isneginf(full_by_hand).sum()) == ids.size(1) * (base.vocab_size - K))

# %% [markdown]
# The trimmed draft is still exact under verification, and loses little acceptance because the
# dropped tokens are rare -- even with a head of 64 rows here. (`smollm2-135m-draft` is built this
# way: 3 layers, a head of the 8,192 tokens SmolLM2 generated most, sharing the target's embedding
# matrix.) A trimmed head cannot propose a rare word the prompt asks it to copy -- a name, a
# number -- so the zoo's SmolLM2 draft also scores the tokens already in the context, with their
# embedding rows (`context_vocab=True`). Still lossless: verification checks whatever it proposes.

# %%
heads = {"full head": base, f"{K} kept": trimmed}
for k_ in (256, 64):
    few = drafts.frequent_tokens(target, data.kjv_chapters()[:100], k_).to(DEVICE)
    heads[f"{k_} kept"] = drafts.trim_vocab(base, few)
heads["64 kept + context"] = drafts.trim_vocab(base, few, context_vocab=True)
for name, d in heads.items():
    g = speculative.generate(target, prompts, draft=d, gamma=4, max_new_tokens=NEW_TOKENS)
    assert g.tokens == ref.tokens
    print(f"{name:18s} head MACs {d.model.lm_head.weight.numel():>9,}  acceptance rate {acceptance_rate(g.stats):.3f}")

# %% [markdown]
# ## Play: exit depth and gamma
# The rounds of self-speculation for one prompt. Deeper exits get more green (and cost more per
# draft, exercise 3); longer rounds waste more red where the draft is weak.

# %%
import ipywidgets as widgets


def play(k=1, gamma=4, prompt_index=0):
    global shown
    g = speculative.generate(target, prompts[prompt_index:prompt_index + 1], draft=drafts.early_exit(target, k),
                             gamma=gamma, max_new_tokens=NEW_TOKENS)
    fig, ax = plt.subplots(figsize=(7, 2.6))
    draw_rounds(ax, rounds_of(g.stats), title=f"exit k={k}, gamma={gamma}", ymax=9)
    rounds_legend(ax); plt.show()
    shown = (f"acceptance rate {acceptance_rate(g.stats):.2f}, tau {g.stats.tau:.2f}, predicted speedup at "
             f"the measured c: {drafts.expected_speedup(agree[k - 1], gamma, costs[f'exit{k}']):.2f}")
    print(shown)

# %% [markdown]
# Move the sliders (in a live notebook):

# %%
ui = widgets.interact(play, k=widgets.IntSlider(continuous_update=False, value=1, min=1, max=target.num_layers - 1),
                      gamma=widgets.IntSlider(continuous_update=False, value=4, min=1, max=8),
                      prompt_index=widgets.IntSlider(continuous_update=False, value=0, min=0, max=len(prompts) - 1)).widget

# %% jupyter={"source_hidden": true} tags=["ci-only", "remove-input"]
# CI's self-test of the widget above (collapsed in the lab): move a control as a person would,
# check that the output changed, then put the control back to its teaching default
default = ui.children[0].value
before = shown
ui.children[0].value = target.num_layers - 1           # move the exit slider, as a person would
assert shown != before, "moving a slider must change the output"
ui.children[0].value = default

# %% [markdown]
# ## Summary
# - A draft is worth `tau / (1 + gamma·c)`: acceptance *and* cost. Distillation raises `alpha`;
#   fewer layers and a trimmed head lower `c`.
# - `alpha` is a per-token probability (estimated by teacher-forced agreement); the acceptance
#   rate a run measures is lower, `alpha (1 − alpha^gamma) / ((1 − alpha) gamma)` under i.i.d.
#   acceptance, because drafts after a rejection are never tested.
# - Early exit is a free draft (no training, no extra weights), but it still pays for the LM
#   head: its cost is `(k·layer + head) / (L·layer + head)`, not `k / L`. Without training its
#   acceptance falls fast with depth removed (for SmolLM2-135M, agreement stays below 0.1 until
#   layer ~20 of 30).
# - A trimmed vocabulary keeps verification exact: `q = 0` outside the kept tokens is allowed.
# - Next: chapter 04b chooses `gamma` per step and teaches a draft to copy; appendix 04c makes
#   the target's verification and the draft's steps cheap on a CPU.
