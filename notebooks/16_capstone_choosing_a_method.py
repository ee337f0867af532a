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
# # 16 · Capstone: choosing a method, and the road to production
#
# Fifteen chapters built a dozen ways to decode faster. This one puts them side by side and asks
# the two questions a user asks next: **which method should I use here?** and **how do I run what I
# trained in the engine I deploy?**
#
# One identity carries the whole chapter. A speculative step makes one target call (plus whatever
# drafting feeds it) and commits `tau` tokens on average; if that step costs `c` AR steps,
#
# $$\text{speed-up} = \frac{\tau}{c}.$$
#
# Every method trades the two terms: a bigger tree raises `tau` and `c`; a cheaper draft lowers `c`
# and `tau`. On a CPU `c` grows with every token the target scores; on a GPU it barely does -- so the
# best method depends on the machine as much as on the text.
#
# **After this chapter you can**
#
# 1. read a method's speed-up off its tau and its measured step cost, and predict one from the other;
# 2. pick the method for a workload (chat, summarisation, code, ...) from measured numbers, and say why it wins there;
# 3. place the dLLM samplers on a calls-vs-quality Pareto front;
# 4. explain, with a latency model, why the ranking changes on a GPU;
# 5. export a drafter trained here and run it in vLLM, and explain a difference in tokens/s between the engines by tau and step cost.

# %% [markdown]
# ## Parameters

# %%
import torch
from refimpl.models import default_device

FAST = True                      # CI default: the live benchmark on 2 prompts, 16 tokens
DEVICE = default_device()        # a torch.device: CUDA when present, $REFIMPL_DEVICE overrides
LIVE_PROMPTS = 2 if FAST else 6  # prompts of the live subset (one per category when 6)
NEW = 16 if FAST else 48         # new tokens per prompt in the live subset
SHOW_SOLUTIONS = False

# %% [markdown]
# ## The capstone table
# `python -m refimpl.bench --suite capstone --model smollm2-135m` (and `--model tiny`) runs every
# chapter's method at its default settings on the same prompts, interleaved, medians
# (`refimpl/bench/capstone.py`; `make bench` runs it). The committed results:

# %%
import json
import os
import matplotlib.pyplot as plt
import numpy as np
from refimpl import models
from solutions import exercise, check, show

RESULTS = os.path.join(models.MODELS_DIR, "..", "bench_results")


def load(*parts):
    path = os.path.join(RESULTS, *parts)
    return json.load(open(path)) if os.path.exists(path) else None


cap = {m: load("capstone", f"capstone_{m}.json") for m in ("smollm2-135m", "tiny")}
for m, r in cap.items():
    if r is None:
        print(f"{m}: no committed results (run the benchmark)")
        continue
    hw = r["hardware"]
    print(f"{m}: {len(r['rows'])} rows, {r['rows'][0]['prompts']} prompts, {hw['cpu_count']} cores, "
          f"torch threads {hw['torch_threads']}")
    print(open(os.path.join(RESULTS, "capstone", f"capstone_{m}.md")).read().split("Per category")[0])

# %% [markdown]
# ## Speed-up = tau / step cost, checked on the table
# Each row records `tau` (tokens per target call, **averaged over prompts**), `target_nfe_per_token`
# (target calls per token, summed over prompts), `step_cost` (seconds per target call relative to AR's)
# and the measured speed-up (tokens/s relative to AR). Build the prediction by hand twice: with the
# table's mean tau, and with the pooled tau = tokens / calls = 1 / NFE-per-token. Only one of them
# lies on the diagonal. Why: time is spent where tau is *low* (a chat prompt at tau 1.2 takes far longer
# than a copy prompt at 3.9), so the mean over prompts overstates what the whole run gets.
#
# With the pooled tau the identity is exact bookkeeping: tokens/s = (tokens / calls) / (seconds / call),
# and the step cost *is* seconds per call over AR's. Its value is the split: it tells you whether a
# method is slow because it commits few tokens per call (tau) or because its calls are dear (cost),
# and the two terms move independently when you change the machine (the GPU section below).

# %%
def pooled_tau(x):
    """Tokens per target call over the whole run (what the wall clock sees)."""
    return 1.0 / x["target_nfe_per_token"]


rows = [r for r in (cap["smollm2-135m"] or cap["tiny"] or {"rows": []})["rows"] if r.get("tau") and r.get("step_cost")]
meas = np.array([r["speedup"] for r in rows])
pred_mean = np.array([r["tau"] / r["step_cost"] for r in rows])
pred_pooled = np.array([pooled_tau(r) / r["step_cost"] for r in rows])
fig, ax = plt.subplots(figsize=(5.5, 5))
ax.scatter(pred_mean, meas, label="mean tau over prompts / step cost", marker="x")
ax.scatter(pred_pooled, meas, label="pooled tau (tokens / calls) / step cost")
lim = [0, max(pred_mean.max(), meas.max()) * 1.1] if len(rows) else [0, 2]
ax.plot(lim, lim, "k--", lw=0.8)
ax.set_xlabel("predicted speed-up")
ax.set_ylabel("measured speed-up vs AR")
ax.set_title("speed-up = tau / step cost")
ax.legend(fontsize=8)
plt.show()
if len(rows):
    for name, pred in (("mean tau", pred_mean), ("pooled tau", pred_pooled)):
        print(f"{name:10s}: median |predicted - measured| / measured = {np.median(np.abs(pred - meas) / meas):.1%}")

# %% [markdown]
# ### Exercise 1: predict a speed-up
# Write `predict_speedup(tau, step_cost)`. The check feeds it the pooled tau and the step cost of every
# row of the committed table and compares with the measured speed-up: within 10% for at least 90% of them.
# Being bookkeeping, the right formula lands on every row; `tau * step_cost`, or the mean tau in place
# of the pooled one, misses (the first figure shows the mean tau off the diagonal).

# %%
@exercise("16", "predict_speedup")
def predict_speedup(tau, step_cost):
    """Speed-up over AR of a method committing ``tau`` tokens per step at ``step_cost`` AR steps per step."""
    raise NotImplementedError


# %%
def check_predict():
    if not rows:
        return ...                                 # no committed table to check against
    close = [abs(predict_speedup(pooled_tau(r), r["step_cost"]) - r["speedup"]) / r["speedup"] < 0.10 for r in rows]
    assert sum(close) >= 0.9 * len(close), f"only {sum(close)} of {len(close)} rows within 10%"


check("Exercise 1", check_predict)
if SHOW_SOLUTIONS:
    show("16", "predict_speedup")

# %% [markdown]
# ## Live: a FAST subset on `tiny`, computed here
# The same suite, a few rows, `LIVE_PROMPTS` prompts. Build-then-compare: tau is tokens per target
# call; recompute it from one `Generation`'s stats and compare with the row.

# %%
from refimpl import prompts as P, speculative
from refimpl.bench import capstone
from refimpl.bench.decode import Context, category_speedups, markdown_table

tiny = models.load("tiny", device=DEVICE)
ctx = Context(target=tiny, draft=models.load("tiny-draft", device=DEVICE), model_name="tiny")
want = ("ar (cache)", "speculative [cpu]", "prompt_lookup [cpu]", "jacobi [cpu]", "medusa [cpu]")
live_methods = [m for m, _ in capstone.capstone_rows("tiny") if m.name in want]
live_prompts = [(c, P.encode_prompt(tiny, t)) for c, t in P.prompt_set(1)[:LIVE_PROMPTS]]
live = capstone.run(ctx, live_methods, live_prompts, NEW, repeats=1)
print(markdown_table(live, capstone.COLS))

g = speculative.generate(tiny, [live_prompts[0][1]], draft=ctx.draft, gamma=4, max_new_tokens=NEW)
by_hand = len(g.tokens[0]) / g.stats.target_calls
print(f"tau by hand {by_hand:.3f}   stats.tau {g.stats.tau:.3f}")
assert abs(by_hand - g.stats.tau) < 1e-9
assert all(r["exact"] == 1.0 for r in live if r["exact"] is not None), "every greedy row equals AR greedy"

# %% [markdown]
# ## Speed-up by method and category
# The committed SmolLM2 table per prompt category. Copy-heavy categories (summarisation, copy, QA)
# reward retrieval; chat, where nothing repeats, rewards only a good draft.

# %%
#: short labels for the figures: (substring of the row name, label), first match wins
SHORT = [("on tiny-cllm", "CLLM Jacobi (ch 15)"), ("speculative [cpu] T=", "chain draft T=0.7"),
         ("without copy prior", "chain draft, no copy prior"), ("speculative [", "chain draft"),
         ("self-spec", "self-spec (early exit)"), ("adaptive [", "adaptive gamma"),
         ("dynamic_tree [", "dynamic tree"), ("tree [", "static tree"),
         ("acceptance=typical", "Medusa typical (LOSSY)"), ("medusa [", "Medusa"),
         ("eagle3 [", "EAGLE-3 + copy prior"), ("eagle [", "EAGLE"),
         ("hf prompt lookup", "HF prompt lookup"), ("prompt_lookup [cpu] T=", "prompt lookup T=0.7"),
         ("prompt_lookup [", "prompt lookup"), ("sam+recycling [", "SAM + recycling"), ("sam [", "SAM"),
         ("recycling [", "token recycling"), ("jacobi [", "Jacobi"), ("lookahead [", "lookahead"),
         ("dllm_draft [", "dLLM drafter"), ("hf assisted", "HF assisted"), ("hf generate", "HF generate"),
         ("ar (cache)", "AR")]


def short(name):
    """A figure label for a capstone row name."""
    return next((lab for sub, lab in SHORT if sub in name), name[:24])


def heatmap(r, ax):
    base = next(x for x in r["rows"] if x["method"] == "ar (cache)")
    cats = list(base["per_category_tokens_per_s"])
    rs = [x for x in r["rows"] if x["per_category_tokens_per_s"]]
    M = np.array([[category_speedups(x, base).get(c, np.nan) for c in cats] for x in rs])  # each against its run's AR
    im = ax.imshow(M, cmap="RdYlGn", vmin=0.4, vmax=1.6, aspect="auto")
    ax.set_xticks(range(len(cats)), cats, rotation=30)
    ax.set_yticks(range(len(rs)), [short(x["method"]) for x in rs], fontsize=8)
    for i in range(M.shape[0]):
        for j in range(M.shape[1]):
            ax.text(j, i, f"{M[i, j]:.2f}", ha="center", va="center", fontsize=6)
    plt.colorbar(im, ax=ax, label="speed-up vs AR")
    return M, cats, rs


main = cap["smollm2-135m"] or cap["tiny"]
if main:
    fig, ax = plt.subplots(figsize=(9, 7))
    M, cats, heat_rows = heatmap(main, ax)
    ax.set_title(f"speed-up by method x category ({main['model']})")
    plt.tight_layout()
    plt.show()

# %% [markdown]
# ### Exercise 2: pick the method for a workload
# Write `pick_method(rows, category)`: the name of the fastest **lossless** method for that category
# (speed-up per category: `category_speedups(row, ar_row)`, each row's `per_category_tokens_per_s` over
# the AR of the run that measured it, since rows added from a later run were timed against that run's AR;
# skip LOSSY rows and the sampling rows, whose speed is not comparable with greedy decoding). The check
# compares your pick with the measured winner in every category.

# %%
@exercise("16", "pick_method")
def pick_method(rows, category):
    """rows: the capstone table's rows; -> the method name with the highest speed-up in ``category``."""
    raise NotImplementedError


# %%
def check_pick():
    if main is None:
        return ...
    base = next(x for x in main["rows"] if x["method"] == "ar (cache)")
    ok = [x for x in main["rows"] if x["exact"] == 1.0 and "T=0.7" not in x["method"]]
    for c in base["per_category_tokens_per_s"]:
        got = pick_method(main["rows"], c)
        best = max(ok, key=lambda x: category_speedups(x, base).get(c, 0))
        assert got == best["method"], f"{c}: measured winner is {best['method']!r}, not {got!r}"


check("Exercise 2", check_pick)
if SHOW_SOLUTIONS:
    show("16", "pick_method")

# %% [markdown]
# ## Where each method sits: tau vs step cost, with iso-speed-up lines
# A method is a point `(step cost, tau)`; the lines `tau = s * cost` are where speed-up `s` lies.
# Above the `s = 1` line a method pays on this machine.

# %%
from figures import column_labels, place_labels, stacked


def iso_plot(r, ax, cost_of=lambda x: x["step_cost"], title=""):
    """Each method at (step cost, pooled tau); grey lines: tau = s * cost, where speed-up s lies."""
    pts = [x for x in r["rows"] if x.get("tau") and x.get("step_cost") and x["method"] != "ar (cache)"]
    cmax = max([cost_of(x) for x in pts] + [2.0]) * 1.1
    ymax = max([pooled_tau(x) for x in pts] + [2.0]) * 1.15
    c = np.linspace(0.0, cmax, 50)
    for s in (0.5, 1.0, 1.5, 2.0, 3.0):
        ax.plot(c, s * c, lw=0.7, ls="--" if s != 1 else "-", color="grey")
        xl = min(cmax, ymax / s) * 0.97
        ax.text(xl, s * xl, f"{s}x", fontsize=7, ha="right", va="bottom", color="grey")
    dots = [ax.scatter(cost_of(x), pooled_tau(x), s=18) for x in pts]
    ax.set_xlim(0, cmax)
    ax.set_ylim(0, ymax)
    ax.set_xlabel("step cost (AR steps)")
    ax.set_ylabel("tau (tokens per target call, pooled)")
    ax.set_title(title)
    # labels last, each in its point's colour: nearly all points stacked at one cost (the GPU model at
    # c_draft = 0), with none to their right, get a column there in the order of their heights; every other
    # label goes where none overlaps another (a leader line where a label sits away from its point)
    xy, colors = [(cost_of(x), pooled_tau(x)) for x in pts], [d.get_facecolor()[0] for d in dots]
    stack = stacked(xy, width=0.005 * cmax, min_points=max(4, (3 * len(xy)) // 4))
    right = max((xy[i][0] for i in stack), default=0.0)
    if any(x > right for x, _ in xy):
        stack = []
    if stack:
        column_labels(ax, [xy[i] for i in stack], [short(pts[i]["method"]) for i in stack], x_text=right + 0.1 * cmax,
                      colors=[colors[i] for i in stack])
    rest = [i for i in range(len(pts)) if i not in stack]
    place_labels(ax, [xy[i] for i in rest], [short(pts[i]["method"]) for i in rest], colors=[colors[i] for i in rest],
                 rings=16)


if main:
    fig, ax = plt.subplots(figsize=(8, 5))
    iso_plot(main, ax, title=f"measured on this CPU ({main['model']})")
    plt.show()

# %% [markdown]
# ## What changes on a GPU (a model, not a measurement)
# On a GPU a decode step is memory-bound: scoring `k` tokens costs about what scoring one does until
# `k` reaches tens. Model it in two rules: a target step costs one AR step whatever it scores, and
# each draft call costs a fraction `c_draft` of a target step (the draft's share of the bytes read).
# The CPU's step cost also contains the extra tokens scored, which the GPU model drops: tree methods
# and lookahead should move right-to-left, toward their tau. Write the model first.

# %% [markdown]
# ### Exercise 3: the modelled GPU step cost
# Write `gpu_step_cost(draft_calls_per_step, c_draft)`: a step's cost in AR steps under the two rules
# above. The check: on the committed table, the modelled GPU speed-up of a tree
# method is at least its CPU speed-up.

# %%
@exercise("16", "gpu_step_cost")
def gpu_step_cost(draft_calls_per_step, c_draft):
    """AR steps per speculative step on a GPU-like machine (latency(k) flat)."""
    raise NotImplementedError


# %%
def check_gpu():
    if main is None:
        return ...
    assert abs(gpu_step_cost(0.0, 0.1) - 1.0) < 1e-9, "a step with no draft calls costs one target call"
    assert abs(gpu_step_cost(4.0, 0.1) - 1.4) < 1e-9, "4 draft calls at 0.1 each add 0.4"
    for x in main["rows"]:
        if "tree" in x["method"] and x.get("tau") and x.get("step_cost"):
            gpu = pooled_tau(x) / gpu_step_cost(x["draft_calls_per_step"] or 0.0, 0.1)
            assert gpu >= x["speedup"] * 0.95, f"{x['method']}: GPU model {gpu:.2f} below CPU {x['speedup']:.2f}"


check("Exercise 3", check_gpu)
if SHOW_SOLUTIONS:
    show("16", "gpu_step_cost")

# %% [markdown]
# The table redrawn under your model (left: as measured on this CPU; right: the modelled GPU). Until
# Exercise 3 is solved the right-hand picture uses the library's model (`capstone.gpu_step_cost`),
# and its title says so.

# %%
def gpu_model():
    """(the GPU step-cost model a picture uses, whose it is), asked at every drawing, so that the widget below
    switches to your `gpu_step_cost` as soon as it returns a number; the library's until then."""
    try:
        float(gpu_step_cost(1.0, 0.1))
        return gpu_step_cost, "your gpu_step_cost"
    except Exception:   # noqa: BLE001 -- unsolved, or no number yet: Exercise 3's check says which
        return capstone.gpu_step_cost, "the library's model: Exercise 3 unsolved"


def gpu_cost(x, c_draft=0.1):
    """Modelled GPU step cost of a table row: your `gpu_step_cost`, the library's until you write it."""
    return gpu_model()[0](x.get("draft_calls_per_step") or 0.0, c_draft)


if gpu_model()[0] is capstone.gpu_step_cost:
    print("Exercise 3 is unsolved: the GPU pictures below use the library's model, capstone.gpu_step_cost")
if main:
    fig, axs = plt.subplots(1, 2, figsize=(13, 5))
    iso_plot(main, axs[0], title="measured, this CPU")
    iso_plot(main, axs[1], cost_of=gpu_cost, title=f"modelled GPU: flat latency(k), c_draft = 0.1 ({gpu_model()[1]})")
    plt.show()

# %% [markdown]
# ## dLLMs: calls vs quality
# A dLLM sampler's cost is its number of denoiser calls (NFE) and its quality moves with it. The
# Pareto front: no other point is both cheaper and better. (`tiny-bdlm` rows of the dLLM suite,
# perplexity of the text under AR `tiny`; chapter 15's distilled model and Learn2PD's filters add theirs.)

# %%
dl = (cap["tiny"] or {}).get("dllm_rows") or (load("dllm_bdlm", "dllm_tiny.json") or {}).get("rows", [])
learned = (load("learned", "learned_tiny.json") or {}).get("rows", [])
pts = [(x["nfe_per_row"], x["perplexity"], x["method"]) for x in dl if x["task"] == "kjv-bdlm" and x.get("perplexity")]
pts += [(32 / x["tokens_per_call"], x["perplexity"],                  # chapter 15: dParallel, Learn2PD's filters
         ("dParallel " if x["model"] == "tiny-bdlm-dparallel" else "tiny-bdlm ") + x["method"]) for x in learned
        if x.get("task") == "dparallel" and (x.get("model") == "tiny-bdlm-dparallel" or "learn2pd" in x.get("method", ""))
        and x.get("tokens_per_call") and x.get("perplexity")]


def pareto(points):
    """The points no other point beats on both cost and quality (lower is better on both)."""
    return sorted(p for p in points if not any(q[0] <= p[0] and q[1] <= p[1] and q[:2] != p[:2] for q in points))


front = pareto(pts)
fig, ax = plt.subplots(figsize=(7, 4))
at = {}                                   # front points that share a place get one label
for n, ppl, name in pts:
    ax.scatter(n, ppl, color="C1" if (n, ppl, name) in front else "C0")
    if (n, ppl, name) in front:           # the rest are listed below the picture
        at.setdefault((round(n, 1), round(ppl, 1)), []).append((n, ppl, name))
if front:
    ax.plot([p[0] for p in front], [p[1] for p in front], "C1--", lw=0.8)
ax.set_xlabel("denoiser calls for 32 tokens")
ax.set_ylabel("perplexity under tiny (lower is better)")
ax.set_yscale("log")
ax.set_title("dLLM samplers: calls vs quality (orange: the Pareto front)")
fig.tight_layout()
place_labels(ax, [group[0][:2] for group in at.values()],   # last: where no label overlaps another
             [group[0][2][:30] + (f" (+{len(group) - 1} more here)" if len(group) > 1 else "") for group in at.values()])
plt.show()
print("Pareto front:", [(round(n, 1), round(p, 2), name) for n, p, name in front])
print("behind it (blue):", [(round(n, 1), round(p, 2), name) for n, p, name in sorted(pts) if (n, p, name) not in front])

# %% [markdown]
# ## The road to production: our drafters in vLLM
# `python -m refimpl.export NAME --to DIR` writes a trained drafter in the layout vLLM loads;
# `make production` builds vLLM's CPU build in its own environment (`.venv-vllm`) and runs it next to
# our decoders on the same prompts, the same algorithm on both sides (`refimpl/bench/production.py`).
# The export's one trap: our heads score only the tokens their training answers used; vLLM's heads score
# all 49,152. `export.full_head` makes a full head whose extra rows can never win an argmax:

# %%
from refimpl import export

rows_ = torch.tensor([[1.0], [2.0], [3.0]], device="cpu")   # a toy head (V = 3 tokens, H = 1) on the host
kept_ = torch.tensor([0, 1], device="cpu")                    # 2 kept tokens
full = export.full_head(rows_, kept_, 3)
print(full.T, "-> token 2 copies token 0's row: it ties token 0, and argmax takes the first index")
for f in (1.0, -1.0):
    h = torch.tensor([f], device="cpu")
    logits = full @ h
    print(f"feature {f:+}: logits {logits.tolist()}, argmax {int(logits.argmax())} (kept argmax "
          f"{int(kept_[(rows_[kept_] @ h).argmax()])})")

prod = load("production", "production.json")
if prod:
    print(open(os.path.join(RESULTS, "production", "production.md")).read())
else:
    print("(run `make production` for the side-by-side table)")

# %% [markdown]
# Read the table with the identity: for each method both engines have, the tau columns agree (same
# algorithm, same drafter), so a difference in tokens/s is a difference in **step cost**. vLLM's CPU
# backend pays more for a multi-token verification step than for a one-token step (it does not
# prepack weights for a few rows, chapter 04c), ours pays little more than for one token.

# %% [markdown]
# ## Widget: move to a GPU
# Pick the machine. On the **GPU model**, slide the draft's cost per call `c_draft`: the points of
# the methods that call a draft move, the iso-lines stay, and the fastest lossless method is printed.
# On the **measured CPU** the step costs are measurements, not a model, so `c_draft` has nothing to
# change: the slider is greyed out there. (Until Exercise 3 is solved, the GPU model is the library's; once your
# `gpu_step_cost` returns a number, the next move draws with yours, and the title says whose model it is.)

# %%
import ipywidgets as widgets

shown = None
c_slider = widgets.FloatSlider(continuous_update=False, value=0.1, min=0.0, max=0.5, step=0.05, description="c_draft")


def play(machine="measured CPU", c_draft=0.1):
    global shown
    measured = machine == "measured CPU"
    c_slider.disabled = measured                   # the measured CPU has no c_draft to slide
    if main is None:
        print("no committed capstone results")
        return
    cost = (lambda x: x["step_cost"]) if measured else (lambda x: gpu_cost(x, c_draft))
    fig, ax = plt.subplots(figsize=(8, 5))
    iso_plot(main, ax, cost_of=cost, title="measured CPU (step costs measured: c_draft not used)" if measured
             else f"GPU model, c_draft = {c_draft:.2f} ({gpu_model()[1]})")
    plt.show()
    ok = [x for x in main["rows"] if x.get("tau") and x.get("step_cost") and x["exact"] == 1.0]
    best = max(ok, key=lambda x: pooled_tau(x) / cost(x))
    shown = (machine, tuple(round(cost(x), 3) for x in ok), best["method"])
    print("fastest lossless method:", best["method"], f"{pooled_tau(best) / cost(best):.2f}x")


ui = widgets.interact(play, machine=widgets.Dropdown(options=["measured CPU", "GPU model"], value="measured CPU"),
                      c_draft=c_slider).widget

# %% jupyter={"source_hidden": true} tags=["ci-only", "remove-input"]
# CI's self-test of the widget above (collapsed in the lab): move a control as a person would,
# check that the output changed, then put the control back to its teaching default
assert main is not None and shown is not None, "the widget drew nothing (no committed capstone table?)"
assert ui.children[1].disabled, "on the measured CPU the c_draft slider is greyed out"
default = ui.children[0].value
before = shown
ui.children[0].value = "GPU model"                 # switch the machine, as a person would
assert shown != before, "switching the machine must change the picture"
assert not ui.children[1].disabled, "on the GPU model the c_draft slider acts"
slid = ui.children[1].value
for c in (ui.children[1].min, ui.children[1].max):  # the slider's ends: the crowded pictures stay readable
    ui.children[1].value = c
    assert shown[0] == "GPU model", "the GPU model stays on while c_draft moves"
ui.children[1].value = slid
ui.children[0].value = default

# %% jupyter={"source_hidden": true} tags=["ci-only", "remove-input"]
# CI's self-test of the c_draft slider: on the measured CPU (the default) it changes nothing, which is
# why it is greyed out there; the GPU model's costs, which it drives there, move with it
ok = [x for x in main["rows"] if x.get("tau") and x.get("step_cost") and x["exact"] == 1.0]
assert [gpu_cost(x, 0.3) for x in ok] != [gpu_cost(x, 0.1) for x in ok], "c_draft must move the GPU model's points"
default = ui.children[1].value
before = shown
ui.children[1].value = 0.3
assert shown == before, "on the measured CPU c_draft changes nothing"
ui.children[1].value = default

# %% [markdown]
# ## One front door: the table picks the default
# The table's winners are what the library does by default. `refimpl.generate(target, prompts,
# method=...)` runs any method by name at its module's preset for the target (`PRESETS["cpu"]` on a
# CPU), loading the zoo's drafter itself; `method="fastest"` reads the committed order above
# (`refimpl.methods.FASTEST`, which a test keeps equal to the capstone JSON) and takes the first
# method the zoo has a drafter for. Changing the method is one word, and every method is still exact.

# %%
import refimpl
from refimpl import methods

ids = [live_prompts[0][1]]
fastest = methods.fastest(tiny)
print(f"fastest on tiny by the committed table (its whole prompt set): {fastest}   order: {methods.FASTEST['tiny']}")
print("fastest on SmolLM2-135M:", methods.FASTEST["smollm2-135m"][0])
ar_tokens = refimpl.generate(tiny, ids, method="ar", max_new_tokens=NEW).tokens
taus = {}
for name in ("fastest", "speculative", "dynamic_tree", "eagle3", "prompt_lookup"):
    g = refimpl.generate(tiny, ids, method=name, max_new_tokens=NEW)
    label = f"fastest = {fastest}" if name == "fastest" else name
    print(f"{label:24s} tau {g.stats.tau:.2f}  target calls {g.stats.target_calls:2d}  == AR: {g.tokens == ar_tokens}")
    assert g.tokens == ar_tokens
    taus[name] = g.stats.tau
top = max(taus, key=taus.get)
print(f"on this one prompt ({live_prompts[0][0]}) the highest tau is {top}'s, {taus[top]:.2f}"
      + (f"; {fastest} accepted no draft here (tau 1.00)" if taus["fastest"] == 1.0 else "")
      + ": the table ranks by speed over its whole prompt set, not on one prompt")

# %% [markdown]
# ## The production map
# For every method of the course, what runs it in each engine; *verified here* only where
# `make production` ran it on this machine (vLLM 0.32 CPU build). docs/production.md carries the same table.

# %%
from refimpl.bench import production

print(production.production_map(prod))

# %% [markdown]
# ## Summary
# - Every method is a point (step cost, tau); speed-up = tau / step cost. On this CPU the step cost
#   grows with every scored token, so small trees, cheap drafts and retrieval win; on a GPU it barely
#   does, so bigger trees and heads move up.
# - The winner depends on the workload: retrieval wins where the answer copies the prompt at length
#   (summaries); a draft that reads the target's features (EAGLE-3, with a copy prior) wins the rest
#   of the committed SmolLM2 table, chat included, and a weak draft wins nowhere (EAGLE-1, Medusa).
# - The library's defaults follow the table: each method's `generate` runs its measured best preset
#   for the target's device, and `refimpl.generate(target, prompts)` runs the fastest lossless method
#   the zoo has a drafter for (EAGLE-3's `"cpu"` preset on SmolLM2).
# - A dLLM sampler is chosen on a calls-vs-quality front, not on speed alone.
# - What we train runs in vLLM once exported to its layout; the same algorithm gives the same tau in
#   both engines, and a difference in tokens/s is a difference in step cost.
