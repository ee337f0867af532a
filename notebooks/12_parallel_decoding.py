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
# # 12 · dLLM parallel decoding: thresholds, early commit, and where it breaks
#
# LLaDA's schedule commits a *fixed* number of tokens per step. Fast-dLLM ("Fast-dLLM:
# Training-free Acceleration of Diffusion LLM…", arXiv 2505.22618) makes it adaptive:
#
# - **threshold** `t`: commit every masked position of the block whose confidence exceeds `t`,
#   and always at least the single most confident one;
# - **factor** `f`: commit the top `n` positions while `(n + 1)(1 − c_(n)) < f`.
#
# Prophet ("Diffusion Language Models Know the Answer Before Decoding") adds **early commit**:
# once the top-1/top-2 gap is large everywhere, commit everything left. We build each rule by
# hand, measure NFE vs quality, and then construct a task where parallel decoding *must* fail
# (ParallelBench: positions decoded from independent marginals).

# %% [markdown]
# ## Parameters

# %%
import torch

FAST = True
MODEL = "tiny-dllm"
SYNTH = "tiny-dllm-rev"
AR_MODEL = "tiny"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GEN, BLOCK = 32, 8
SHOW_SOLUTIONS = False

# %% [markdown]
# ## Imports and models

# %%
import math
import matplotlib.pyplot as plt
import kernels
from refimpl import diffusion, diffusion_lm, digit_reversal, models
from refimpl.bench import dllm as diffusion_bench

dlm, ar, rev = (models.load(n, device=DEVICE) for n in (MODEL, AR_MODEL, SYNTH))
tok, MASK = dlm.tokenizer, dlm.mask_token_id
prompts = diffusion_bench.kjv_prompts(tok, 3 if FAST else 12, length=32)

# %% [markdown]
# ## The threshold rule, by hand
# Confidences of a block's positions (`-inf` = already committed). Commit those above `t`;
# if none is, commit the best one anyway, so every step makes progress.

# %%
def threshold_by_hand(conf, t):                      # conf (N,)
    sel = conf > t
    if not sel.any() and torch.isfinite(conf).any():
        sel[conf.argmax()] = True
    return sel

conf = torch.tensor([0.97, 0.42, float("-inf"), 0.93, 0.88], dtype=torch.float64)
for t in (0.9, 0.99):
    assert torch.equal(threshold_by_hand(conf.clone(), t), diffusion.select_threshold(conf[None], t)[0])
    print(f"t={t}: commit", threshold_by_hand(conf.clone(), t).nonzero().flatten().tolist())

# %% [markdown]
# ## The factor rule, by hand
# Sort the confidences `c_(1) ≥ c_(2) ≥ …`; commit the largest `n` such that
# `(i + 1)(1 − c_(i)) < f` for every `i ≤ n` (at least one). Intuition (Fast-dLLM's Theorem 1):
# if each committed guess is wrong with probability `ε_i = 1 − c_(i)`, the joint guess is close
# to the greedy joint when `(n + 1) ε` stays small.

# %%
def factor_by_hand(conf, f):
    order = conf.argsort(descending=True)
    n = 0
    while n < len(conf) and torch.isfinite(conf[order[n]]) and (n + 2) * (1 - conf[order[n]]) < f:
        n += 1
    sel = torch.zeros_like(conf, dtype=torch.bool); sel[order[: max(n, 1)]] = True
    return sel

for f in (0.2, 0.5, 1.0):
    assert torch.equal(factor_by_hand(conf, f), diffusion.select_factor(conf[None], f)[0])
    print(f"f={f}: commit", factor_by_hand(conf, f).nonzero().flatten().tolist())

# %% [markdown]
# ## A threshold sampler, by hand (greedy, one row)
# Same blocks as LLaDA, but each block loops until it has no mask left.

# %%
def threshold_sampler(model, prompt, gen_length, block_length, t):
    P, mask = len(prompt), model.mask_token_id
    x, nfe = torch.tensor([prompt + [mask] * gen_length], device=DEVICE), 0
    for s in range(P, P + gen_length, block_length):
        while (x[0, s: s + block_length] == mask).any():
            lg = model.logits(x)[0, s: s + block_length]; nfe += 1
            lg[:, mask] = float("-inf")
            c, pred = torch.softmax(lg.double(), -1).max(-1)
            c[x[0, s: s + block_length] != mask] = -float("inf")
            sel = threshold_by_hand(c, t)
            x[0, s: s + block_length][sel] = pred[sel]
    return x[0, P:].tolist(), nfe

# %% [markdown]
# Check against `refimpl.diffusion.generate(threshold=...)` (which selects with the fused kernel).

# %%
for t in (0.9, 0.5, 0.2):
    mine, nfe = threshold_sampler(dlm, prompts[0], GEN, BLOCK, t)
    lib = diffusion.generate(dlm, [prompts[0]], gen_length=GEN, steps=GEN, block_length=BLOCK,
                             threshold=t, eos_token_id=[])
    assert mine == lib.tokens[0] and nfe == lib.stats.nfe
    print(f"threshold {t}: identical, NFE {nfe} for {GEN} tokens")

# %% [markdown]
# ## The kernel behind the selection
# `kernels.confidence_select` fuses argmax, softmax probability (online max/sum over vocab
# tiles) and top-k / threshold selection. On CPU without `TRITON_INTERPRET=1` the dispatcher
# runs the torch reference; on a GPU, the Triton kernel. Both compute the same thing:

# %%
lg = torch.randn(2, BLOCK, len(tok)) * 4
masked = torch.rand(2, BLOCK) < 0.7
a = kernels.confidence_select(lg, masked, threshold=0.5)
b = kernels.confidence_select_reference(lg, masked, threshold=0.5)
assert torch.equal(a[0], b[0]) and torch.equal(a[2], b[2]) and torch.allclose(a[1], b[1])
print("selected per row:", a[2].sum(-1).tolist())

# %% [markdown]
# ## NFE vs quality (King James)
# LLaDA with fewer steps vs threshold decoding: which spends its forward passes better?
# Quality = perplexity of the continuation under the AR `tiny` model.

# %%
def point(**kw):
    g = diffusion.generate(dlm, prompts, gen_length=GEN, block_length=BLOCK, eos_token_id=[], **kw)
    return diffusion_bench.nfe_per_row(g), diffusion_bench.ar_perplexity(ar, prompts, g.tokens)

llada = [point(steps=s) for s in (GEN, GEN // 2, GEN // 4)]
thresh = [point(steps=GEN, threshold=t) for t in (0.9, 0.5, 0.2, 0.1, 0.05)]
print("LLaDA:", [(round(n, 1), round(p, 1)) for n, p in llada])
print("threshold:", [(round(n, 1), round(p, 1)) for n, p in thresh])

# %% [markdown]
# On the plot, down-left is better. The tiny model is unsure of most tokens, so high
# thresholds save little; lower thresholds trade quality for fewer passes. A stronger text model
# does not change that here: chapter 14 adapts the AR `tiny` itself into a block-diffusion LM
# (`tiny-bdlm`), whose text is far more likely under `tiny` at every NFE, and a 0.9 threshold still
# commits one token per call, because even the AR model is 90% sure of the next King James token
# at well under 1% of positions (chapter 14 measures the confidence at each distance). The
# digit-reversal task below is where thresholds pay.

# %%
plt.figure(figsize=(4.5, 3))
plt.plot(*zip(*llada), "o-", label="LLaDA (fixed k per step)")
plt.plot(*zip(*thresh), "s-", label="threshold (Fast-dLLM)")
plt.xlabel("NFE per row"); plt.ylabel("perplexity under tiny"); plt.legend(); plt.show()

# %% [markdown]
# ## NFE vs accuracy (digit reversal)
# A confident model is where thresholds shine: one forward pass decodes the whole answer.

# %%
problems = digit_reversal.synthetic_split()[: 100 if FAST else 500]
for kw in (dict(), dict(steps=4), dict(threshold=0.9), dict(threshold=0.99), dict(factor=1.0)):
    acc, g = digit_reversal.synthetic_accuracy(rev, problems, return_generation=True, use_kernel=False, **kw)
    print(f"{str(kw):22s} NFE/row {diffusion_bench.nfe_per_row(g):.2f}  accuracy {acc:.1%}")

# %% [markdown]
# ## Early commit (Prophet)
# After each forward pass, look at the mean top-1/top-2 probability gap over all remaining masked
# answer positions. If it exceeds `gap`, commit them all now.

# %%
for gap in (None, 0.9, 0.5, 0.2, 0.05):
    g = diffusion.generate(dlm, prompts, gen_length=GEN, steps=GEN, block_length=BLOCK, eos_token_id=[],
                           early_commit=gap)
    print(f"gap {gap}: NFE/row {diffusion_bench.nfe_per_row(g):5.1f}, early commits "
          f"{g.stats.extra['early_commits']}, ppl {diffusion_bench.ar_perplexity(ar, prompts, g.tokens):.1f}")

# %% [markdown]
# ## Play with the threshold
# A slider over `t`: the committed count per step and the text.

# %%
def play(t=0.9):
    g = diffusion.generate(dlm, [prompts[0]], gen_length=GEN, steps=GEN, block_length=BLOCK,
                           threshold=t, eos_token_id=[])
    print("NFE", g.stats.nfe, "| per step:", [c[0] for c in g.stats.extra["committed"]])
    print(tok.decode(g.tokens[0]))

try:
    import ipywidgets as w
    w.interact(play, t=w.FloatSlider(min=0.05, max=1.0, step=0.05, value=0.9))
except ImportError:
    play(0.9)

# %% [markdown]
# ## Where parallel decoding breaks
# Take a task with **several valid answers**: "list the items 1..n in any order" (every
# permutation is right). An ideal denoiser gives each masked position the *conditional*
# distribution: uniform over the items not yet used by committed positions. The toy below is
# exactly that model (no training), with items as tokens 3..n+2.

# %%
class PermutationModel:
    """Exact conditionals of the uniform distribution over permutations of n items."""
    mask_token_id, eos_token_id, pad_token_id = 2, 0, 1

    def __init__(self, n):
        self.n = n

    def logits(self, ids):                                   # (B, T) -> (B, T, V)
        out = torch.full((*ids.shape, self.n + 3), float("-inf"))
        ans = ids[:, -self.n:]                               # the answer region
        for b in range(ids.size(0)):
            used = set(ans[b].tolist())
            free = [i for i in range(3, self.n + 3) if i not in used]
            out[b, -self.n:, free] = 0.0                     # uniform over unused items
        return out

# %% [markdown]
# One token per step samples from the true joint: always a permutation. Committing all positions
# in one step samples each from its *marginal* independently: duplicates appear. Greedy is worse
# still: every position has the same argmax, so the answer is never valid.

# %%
def valid_rate(n, **kw):
    g = diffusion.generate(PermutationModel(n), [[5]] * 400, gen_length=n, block_length=n, eos_token_id=[],
                           generator=torch.Generator().manual_seed(0), use_kernel=False, **kw)
    return sum(len(set(t)) == n for t in g.tokens) / len(g.tokens)

n = 3
for name, kw in [("one per step, T=1", dict(steps=n, temperature=1.0)),
                 ("all at once, T=1", dict(steps=1, temperature=1.0)),
                 ("all at once, greedy", dict(steps=1)),
                 ("threshold 0.9, greedy", dict(steps=n, threshold=0.9))]:
    print(f"{name:22s} valid {valid_rate(n, **kw):.0%}")

# %% [markdown]
# Why the threshold saves us here: every marginal confidence is `1/n < 0.9`, so the rule falls
# back to one token per step, and each commit conditions the next. A confidence threshold only
# protects you when low confidence *signals* the dependency; ParallelBench shows tasks where models
# are confidently wrong in parallel (e.g. a marginal of 0.95 on two slots that must differ).

# %%
print("threshold 0.3 (= below 1/n):", f"{valid_rate(n, steps=n, threshold=0.3):.0%} valid")
assert valid_rate(n, steps=n, temperature=1.0) == 1.0 and valid_rate(n, steps=1) == 0.0

# %% [markdown]
# ## Exercises
# **1. How often do independent marginals give a valid permutation?** Each of `n` positions
# picks uniformly from `n` items, independently. Write `p_valid(n)`; the check compares with
# the formula and with the sampler (all at once, T = 1).

# %%
def p_valid(n):                                            # your answer here
    return math.factorial(n) / n ** n

def check_p_valid(fn):
    for n in (1, 2, 3, 4, 6):
        assert abs(fn(n) - math.factorial(n) / n ** n) < 1e-12, n
    assert abs(fn(3) - valid_rate(3, steps=1, temperature=1.0)) < 0.08, "agrees with sampling"
    return "correct"

print(check_p_valid(p_valid))

# %% [markdown]
# **2. The factor rule's count.** Write `factor_count(conf, f)`: for a 1-D tensor of
# confidences of masked positions, how many the factor rule commits.

# %%
def factor_count(conf, f):                                 # your answer here
    c = conf.sort(descending=True).values
    ok = (torch.arange(2, len(c) + 2) * (1 - c) < f).long().cumprod(0)
    return max(1, int(ok.sum()))

def check_factor_count(fn):
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        c = torch.rand(7, generator=g, dtype=torch.float64) ** 0.2
        for f in (0.1, 0.5, 1.0, 3.0):
            assert fn(c, f) == int(diffusion.select_factor(c[None], f).sum()), (c, f)
    return "correct"

print(check_factor_count(factor_count))

# %% [markdown]
# ## Summary
# - Threshold / factor decoding adapt the tokens per step to the model's confidence: a sure
#   model (digit reversal) decodes in one pass; an unsure one falls back toward one per step.
# - Early commit stops as soon as the remaining answer looks settled.
# - Parallel commits sample from a product of marginals: tasks with several valid joint answers
#   break unless the confidence signal forces sequential steps.
