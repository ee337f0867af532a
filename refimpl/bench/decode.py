"""The decode suite: every row of :mod:`refimpl.bench.rows` on the fixed prompt set.

Greedy unless the row says otherwise. Per method: tokens/s, speedup vs our cached AR baseline
(measured in the same process, interleaved), tau (tokens per target call), target NFE per token,
and exact match vs AR greedy; per prompt category too. Also :func:`latency_curve` (chapter 00: the
cost of scoring k tokens vs 1) and :func:`markdown_table`, which every suite prints with.
"""
from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from .. import autoregressive
from ..generation import Generation, Stats


@dataclass
class Method:
    """A benchmark row. ``run(ctx, prompt_ids, max_new_tokens) -> Generation`` decodes one prompt."""

    name: str
    run: Callable
    needs: tuple = ("target",)
    exact: bool = True  # greedy: must equal AR greedy token for token
    max_prompts: int | None = None  # cap for slow teaching baselines
    method: str = ""  # the front door's name for it (``refimpl.methods.METHODS``), "" for outside rows
    preset: str = ""  # the module's preset it runs (``PRESETS`` of the method's module)
    options: dict = field(default_factory=dict)  # what it sets on top of the preset
    config: str = ""  # the options it runs with, for the tables ("gamma 4", "total 5, depth 5, ...")


@dataclass
class Context:
    target: object
    draft: object = None
    generator: torch.Generator = field(default_factory=lambda: torch.Generator(device="cpu").manual_seed(0))
    model_name: str = ""
    memo: dict = field(default_factory=dict)  # what a row builds once per run (an early-exit draft, ...)


def hf_generate(ctx: Context, ids: list[int], n: int, **kw) -> Generation:
    """Hugging Face ``generate`` (greedy), stopping at EOS like ours."""
    lm = ctx.target
    x = torch.tensor([ids], device=lm.device)
    stats = Stats()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = lm.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                                eos_token_id=lm.eos_token_id, pad_token_id=lm.pad_token_id, **kw)
    stats.seconds = time.perf_counter() - t0
    toks = out[0, len(ids):].tolist()
    if lm.eos_token_id in toks:
        toks = toks[: toks.index(lm.eos_token_id) + 1]
    stats.new_tokens = len(toks)
    return Generation([toks], stats)


def hf_assisted(ctx: Context, ids, n):
    """Hugging Face assisted generation with the zoo's draft (its plain HF model: no copy prior)."""
    assistant = getattr(ctx.draft, "hf_model", None) or ctx.draft.model
    return hf_generate(ctx, ids, n, assistant_model=assistant)


def hardware() -> dict:
    info = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
    }
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover
        pass
    return info


def run_decode(ctx: Context, methods: list[Method], prompts: list[tuple[str, list[int]]], max_new_tokens: int,
               repeats: int, progress: bool = True) -> list[dict]:
    """Rows of the decode table. AR greedy (cached) is the reference for speed and exactness.

    Runs are interleaved -- for each prompt, ``repeats`` rounds of every method in turn -- so a
    shared machine that speeds up or slows down during the benchmark shifts all methods alike
    and the speed-up ratios stay comparable; each (method, prompt) time is the median of its runs.
    """
    from tqdm.auto import tqdm

    reference = {i: autoregressive.generate(ctx.target, ids, max_new_tokens=max_new_tokens).tokens[0]
                 for i, (_, ids) in enumerate(prompts)}
    runs: dict[tuple[int, int], list] = {}  # (method index, prompt index) -> Generations
    for i, (_, ids) in enumerate(tqdm(prompts, desc="prompts", disable=not progress, leave=False)):
        for _ in range(repeats):
            for j, m in enumerate(methods):
                if not m.max_prompts or i < m.max_prompts:
                    runs.setdefault((j, i), []).append(m.run(ctx, ids, max_new_tokens))
    rows = []
    for j, m in enumerate(methods):
        todo = prompts[: m.max_prompts] if m.max_prompts else prompts
        times, toks, calls, dcalls, taus, exact, per_cat, cat_taus = [], 0, 0, 0, [], [], {}, {}
        for i, (cat, ids) in enumerate(todo):
            secs = statistics.median(r.stats.seconds for r in runs[(j, i)])
            g = runs[(j, i)][0]
            n = len(g.tokens[0])
            times.append(secs)
            toks += n
            calls += g.stats.target_calls
            dcalls += g.stats.draft_calls
            if g.stats.target_calls:
                taus.append(g.stats.tau)
                cat_taus.setdefault(cat, []).append(g.stats.tau)
            if m.exact:
                exact.append(g.tokens[0] == reference[i])
            c = per_cat.setdefault(cat, [0.0, 0])
            c[0] += secs
            c[1] += n
        rows.append({
            "method": m.name,
            "key": {"method": m.method, "preset": m.preset, "options": m.options} if m.method else None,
            "configuration": m.config,
            "prompts": len(todo),
            "tokens": toks,
            "seconds": sum(times),
            "tokens_per_s": toks / sum(times),
            "tau": statistics.mean(taus) if taus else None,
            "target_nfe_per_token": calls / toks if calls else None,
            "draft_calls_per_step": dcalls / calls if calls else None,
            "step_ms": 1000 * sum(times) / calls if calls else None,
            "exact": (sum(exact) / len(exact)) if exact else None,
            "per_category_tokens_per_s": {k: v[1] / v[0] for k, v in per_cat.items()},
            "per_category_tau": {k: statistics.mean(v) for k, v in cat_taus.items()},
        })
    base = next((r for r in rows if r["method"] == "ar (cache)"), None)
    for r in rows:
        r["speedup"] = r["tokens_per_s"] / base["tokens_per_s"] if base else None
        # what one step (target call + its drafting) costs, in AR steps: speed-up = tau / step cost
        r["step_cost"] = r["step_ms"] / base["step_ms"] if base and r["step_ms"] and base["step_ms"] else None
    return rows


def timer(device):
    """``timed(fn)``: seconds one call of ``fn()`` takes on ``device`` (a GPU is synchronised
    before and after, since its calls return before they finish)."""
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)

    def timed(fn) -> float:
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - t0
    return timed


@torch.no_grad()
def latency_curve(lm, context: int = 128, ks=None, repeats: int = 5) -> list[dict]:
    """Median seconds to score k new tokens on top of a cached ``context``-token prefix."""
    ks = ks or [1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64]
    g = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(3, lm.vocab_size, (1, context + max(ks)), generator=g, device="cpu").to(lm.device)
    _, cache = lm.forward(ids[:, :context])
    timed = timer(lm.device)
    rows = []
    for k in ks:
        ts = []
        for _ in range(repeats + 1):
            ts.append(timed(lambda: lm.forward(ids[:, context: context + k], cache)))
            lm.crop(cache, context)
        rows.append({"k": k, "seconds": statistics.median(ts[1:])})
    base = rows[0]["seconds"]
    for r in rows:
        r["relative_to_k1"] = r["seconds"] / base
    return rows


def markdown_table(rows: list[dict], cols: list[tuple[str, str, str]]) -> str:
    """``cols`` = [(key, header, format)]; None values print as '-'."""
    head = "| " + " | ".join(h for _, h, _ in cols) + " |"
    sep = "|" + "|".join("---" for _ in cols) + "|"
    lines = [head, sep]
    for r in rows:
        cells = []
        for key, _, fmt in cols:
            v = r.get(key)
            cells.append("-" if v is None else format(v, fmt) if fmt else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def category_speedups(row: dict, ar: dict) -> dict:
    """``row``'s speed-up over AR per prompt category, against the AR of the run that measured it: the
    per-category AR speeds :func:`refimpl.bench.capstone.add_rows` records with a row added from a later run,
    else ``ar``'s (the result's AR row) scaled by that run's AR speed over ``ar``'s (``tokens_per_s /
    speedup``: exactly ``ar``'s for the result's own rows). Machine speed drifts between runs, so a row
    divided by another run's AR would be off by the drift."""
    ref = row.get("per_category_ar_tokens_per_s")
    if ref is None:
        scale = row["tokens_per_s"] / row["speedup"] / ar["tokens_per_s"] if row.get("speedup") else 1.0
        ref = {c: v * scale for c, v in ar["per_category_tokens_per_s"].items()}
    return {c: row["per_category_tokens_per_s"].get(c, 0.0) / ref[c] for c in ref}


def category_table(rows: list[dict]) -> str:
    """Per prompt category: ``speed-up vs AR / tau`` of every row (tau '-' where a method has none)."""
    base = next((r for r in rows if r["method"] == "ar (cache)"), None)
    cats = list(rows[0]["per_category_tokens_per_s"]) if rows else []
    table = []
    for r in rows:
        out = {"method": r["method"]}
        speedups = category_speedups(r, base) if base else {}
        for c in cats:
            sp = speedups.get(c)
            tau = r["per_category_tau"].get(c)
            out[c] = ("-" if sp is None else f"{sp:.2f}x") + " / " + ("-" if tau is None else f"{tau:.2f}")
        table.append(out)
    return markdown_table(table, [("method", "method (speed-up / tau)", "")] + [(c, c, "") for c in cats])


DECODE_COLS = [("method", "method", ""), ("configuration", "configuration", ""), ("tokens_per_s", "tokens/s", ".1f"), ("speedup", "speedup vs AR", ".2f"),
               ("tau", "tau", ".2f"), ("target_nfe_per_token", "target NFE/token", ".2f"),
               ("exact", "exact vs AR greedy", ".0%"), ("prompts", "prompts", "")]
