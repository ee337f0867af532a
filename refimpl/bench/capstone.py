"""The capstone benchmark (chapter 16): ``python -m refimpl.bench --suite capstone --model smollm2-135m|tiny``.

Every method of chapters 01-15 at its chapter's default settings, on the same prompts, in one process,
interleaved, medians (:func:`refimpl.bench.decode.run_decode`), with the two terms that explain a
speed-up: ``speed-up = tau / step cost``, where the step cost is what one step (a target call plus
the drafting that feeds it) costs in AR steps, measured. Columns: tokens/s, speed-up vs our AR, tau,
target NFE per token, draft calls per step, step cost, exact vs AR greedy, and per category. Greedy
rows plus the T = 0.7 rows (lossless sampling; Medusa's typical acceptance labelled LOSSY). On ``tiny``
also the dLLM drafter (chapter 14) and Jacobi on ``tiny-cllm`` (chapter 15: a different model, so
its "exact" is against its own AR), and the dLLM suite (:mod:`refimpl.bench.dllm`: NFE vs quality).
Results: ``bench_results/capstone/``.
"""
from __future__ import annotations

from .. import autoregressive, jacobi, models
from .decode import Context, Method, run_decode
from .rows import SAMPLING_T, decode_rows, preset_row

def preset_key(method: str, preset: str = "cpu", **options) -> str:
    """The name of :func:`refimpl.bench.rows.preset_row`'s row for this method, preset and options."""
    return preset_row(method, preset, **options).name


#: (row name in :func:`refimpl.bench.rows.decode_rows`, chapter): each chapter's method at the preset
#: its ``generate`` uses on a CPU (``"cpu"``), with Hugging Face's rows and the chapters' ablations
CHAPTER_DEFAULTS = [
    ("ar (cache)", "01"),
    ("hf generate", "01"),
    (preset_key("speculative"), "02"),
    (preset_key("speculative", temperature=SAMPLING_T), "03"),
    ("hf assisted (draft)", "04a"),
    ("self-spec (early exit, gamma 4)", "04a"),
    ("speculative, draft without copy prior (gamma 4)", "04b"),
    (preset_key("adaptive"), "04b"),
    (preset_key("tree"), "05"),
    (preset_key("dynamic_tree"), "05"),
    (preset_key("medusa"), "06a"),
    (preset_key("medusa", acceptance="typical", temperature=SAMPLING_T), "06a"),
    (preset_key("eagle"), "06a"),
    (preset_key("eagle3"), "06b"),
    (preset_key("jacobi"), "07"),
    (preset_key("lookahead"), "08"),
    ("hf prompt lookup (10 tokens, ngram <= 2)", "09"),
    (preset_key("prompt_lookup"), "09"),
    (preset_key("prompt_lookup", temperature=SAMPLING_T), "09"),
    (preset_key("sam", "sam"), "09"),
    (preset_key("recycling", "recycling"), "09"),
    (preset_key("sam+recycling", "sam+recycling"), "09"),
    (preset_key("dllm_draft"), "14"),
    (preset_key("pard"), "15b"),
    (preset_key("pard", temperature=SAMPLING_T), "15b"),
    (preset_key("dflash"), "15b"),
    (preset_key("dflash", temperature=SAMPLING_T), "15b"),
]

#: the learned model of chapter 15 for a target
CLLM_FOR = {"tiny": "tiny-cllm"}


def cllm_row(name: str) -> Method:
    """Jacobi decoding (window 16) on the consistency-trained model: a different model, so the row's
    "exact" is checked against that model's own AR greedy, not the target's."""
    def run(ctx: Context, ids, n):
        key = ("cllm", name)
        if key not in ctx.memo:
            ctx.memo[key] = models.load(name, device=ctx.target.device)
            ctx.memo[("cllm-ar", name)] = {}
        g = jacobi.generate(ctx.memo[key], [ids], max_new_tokens=n, window=16)
        own = ctx.memo[("cllm-ar", name)]
        if tuple(ids) not in own:
            own[tuple(ids)] = autoregressive.generate(ctx.memo[key], [ids], max_new_tokens=n).tokens[0]
        ctx.memo.setdefault(("cllm-exact", name), []).append(g.tokens[0] == own[tuple(ids)])
        return g
    return Method(f"jacobi (window 16) on {name} (ch 15: a different model, == its own AR)", run, exact=False)


def capstone_rows(model_name: str) -> list[tuple[Method, str]]:
    """(row, chapter) for ``model_name``, in chapter order."""
    by_name = {m.name: m for m in decode_rows()}
    out = [(by_name[name], ch) for name, ch in CHAPTER_DEFAULTS if name in by_name]
    if model_name in CLLM_FOR:
        out.append((cllm_row(CLLM_FOR[model_name]), "15"))
    return out


def run(ctx: Context, methods: list[Method], prompts, max_new_tokens: int, repeats: int) -> list[dict]:
    """:func:`run_decode` over the capstone rows; each row also names its chapter."""
    chapters = dict(CHAPTER_DEFAULTS) | {cllm_row(name).name: "15" for name in CLLM_FOR.values()}
    rows = run_decode(ctx, methods, prompts, max_new_tokens, repeats)
    for r in rows:
        r["chapter"] = chapters.get(r["method"], "")
        r["lossy"] = "LOSSY" in r["method"]
        for name in CLLM_FOR.values():
            own = ctx.memo.get(("cllm-exact", name))
            if own and name in r["method"]:
                r["exact"] = sum(own) / len(own)  # against its own AR greedy
    return rows


COLS = [("chapter", "ch", ""), ("method", "method", ""), ("configuration", "configuration", ""), ("tokens_per_s", "tokens/s", ".1f"),
        ("speedup", "speed-up vs AR", ".2f"), ("tau", "tau", ".2f"), ("target_nfe_per_token", "target NFE/token", ".2f"),
        ("draft_calls_per_step", "draft calls / step", ".2f"), ("step_cost", "step cost (AR steps)", ".2f"),
        ("exact", "exact vs AR greedy", ".0%")]


def gpu_step_cost(draft_calls_per_step: float, c_draft: float) -> float:
    """A speculative step's cost in AR steps on a GPU-like machine, modelled (chapter 16): scoring
    ``k`` tokens costs what scoring one does (latency(k) flat), so the target call costs one AR step
    whatever it scores, and each draft call costs ``c_draft`` of one."""
    if draft_calls_per_step < 0:
        raise ValueError(f"draft_calls_per_step must be >= 0, got {draft_calls_per_step!r}")
    if c_draft < 0:
        raise ValueError(f"c_draft must be >= 0, got {c_draft!r}")
    return 1.0 + draft_calls_per_step * c_draft


def add_rows(path: str, new: dict) -> dict:
    """Put a capstone run's rows (all but its AR row) into the committed capstone result ``path`` (JSON),
    replacing rows of the same name, in chapter order; each added row keeps its speed-up and step cost
    against the AR of its own run (per category too: ``per_category_ar_tokens_per_s``), and ``added_runs``
    records that run (rows, arguments, hardware, its AR's tokens/s) and takes the replaced rows off the
    earlier runs that had them. -> the merged result. For rows a new chapter adds, where re-running every
    row is not needed."""
    import json

    with open(path) as f:
        old = json.load(f)
    names = [r["method"] for r in new["rows"] if r["method"] != "ar (cache)"]
    if not names:
        raise ValueError("new: the run has no rows besides AR to add")
    ar = next(r for r in new["rows"] if r["method"] == "ar (cache)")
    order = {name: i for i, (name, _) in enumerate(CHAPTER_DEFAULTS)}
    per_cat = ({"per_category_ar_tokens_per_s": ar["per_category_tokens_per_s"]}
               if "per_category_tokens_per_s" in ar else {})  # categories: against this run's AR too
    added = [{**r, **per_cat} for r in new["rows"] if r["method"] in names]
    rows = [r for r in old["rows"] if r["method"] not in names] + added
    rows.sort(key=lambda r: order.get(r["method"], len(order)))
    old["rows"] = rows
    runs = [{**a, "rows": [n for n in a["rows"] if n not in names]} for a in old.get("added_runs", [])]
    old["added_runs"] = [a for a in runs if a["rows"]]  # an earlier run keeps only the rows still its own
    old["added_runs"].append({"rows": names, "args": new["args"], "hardware": new["hardware"],
                                             "ar_tokens_per_s": ar["tokens_per_s"]})
    return old
