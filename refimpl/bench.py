"""One benchmark for every method: ``python -m refimpl.bench``.

Suites (``--suite``):

- ``decode`` (default): every registered :class:`Method` on the fixed prompt set
  (:mod:`refimpl.prompts`, Spec-Bench-like categories), greedy unless the method says
  otherwise. Per method: tokens/s, speedup vs our cached AR baseline (measured in the same
  process), tau (tokens per target call), target NFE per token, and exact match vs AR greedy.
  Timings are medians over ``--repeats`` runs of each prompt.
- ``latency``: latency(k), the time to score k new tokens on top of a cached context, k = 1..64
  (chapter 00: why scoring gamma + 1 tokens costs about as much as scoring 1).
- ``dllm``: the diffusion-LM samplers (:mod:`refimpl.diffusion_bench`, when present).
- ``kernels``: each kernel's ``bench()`` (``triton.testing.do_bench``; skipped without CUDA).

Results are printed as a markdown table and written as JSON + markdown under ``--out``,
together with the hardware, torch threads and versions.

Methods come from ``bench_methods()`` of each algorithm module (see :data:`METHOD_MODULES`);
a method needs the roles it lists (``"target"``, ``"draft"``: the zoo's ``<target>-draft``).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from . import autoregressive, models
from .generation import Generation, Stats
from .prompts import encode_prompt, prompt_set

#: modules whose ``bench_methods()`` contribute rows (missing modules are skipped)
METHOD_MODULES = ["refimpl.speculative", "refimpl.drafts", "refimpl.adaptive", "refimpl.tree",
                  "refimpl.medusa", "refimpl.jacobi", "refimpl.lookahead", "refimpl.retrieval"]

#: the draft model paired with each target in the zoo
DRAFT_FOR = {"tiny": "tiny-draft", "smollm2-135m": "smollm2-135m-draft"}


@dataclass
class Method:
    """A benchmark row. ``run(ctx, prompt_ids, max_new_tokens) -> Generation`` decodes one prompt."""

    name: str
    run: Callable
    needs: tuple = ("target",)
    exact: bool = True  # greedy: must equal AR greedy token for token
    max_prompts: int | None = None  # cap for slow teaching baselines


@dataclass
class Context:
    target: object
    draft: object = None
    generator: torch.Generator = field(default_factory=lambda: torch.Generator().manual_seed(0))
    model_name: str = ""


def _hf_generate(ctx: Context, ids: list[int], n: int, **kw) -> Generation:
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


def _hf_assisted(ctx: Context, ids, n):
    assistant = getattr(ctx.draft, "hf_model", None) or ctx.draft.model
    return _hf_generate(ctx, ids, n, assistant_model=assistant)


def builtin_methods() -> list[Method]:
    return [
        Method("ar (cache)", lambda c, p, n: autoregressive.generate(c.target, p, max_new_tokens=n)),
        Method("ar (no cache)", lambda c, p, n: autoregressive.generate(c.target, p, max_new_tokens=n,
                                                                       use_cache=False), max_prompts=3),
        Method("hf generate", lambda c, p, n: _hf_generate(c, p, n)),
        Method("hf prompt lookup", lambda c, p, n: _hf_generate(c, p, n, prompt_lookup_num_tokens=10)),
        Method("hf assisted (draft)", _hf_assisted, needs=("target", "draft")),
    ]


def all_methods() -> list[Method]:
    methods = builtin_methods()
    for mod_name in METHOD_MODULES:
        try:
            mod = importlib.import_module(mod_name)
        except ModuleNotFoundError as e:
            if e.name == mod_name:
                continue
            raise
        if hasattr(mod, "bench_methods"):
            methods.extend(mod.bench_methods())
    return methods


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
        times, toks, calls, taus, exact, per_cat, cat_taus = [], 0, 0, [], [], {}, {}
        for i, (cat, ids) in enumerate(todo):
            secs = statistics.median(r.stats.seconds for r in runs[(j, i)])
            g = runs[(j, i)][0]
            n = len(g.tokens[0])
            times.append(secs)
            toks += n
            calls += g.stats.target_calls
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
            "prompts": len(todo),
            "tokens": toks,
            "seconds": sum(times),
            "tokens_per_s": toks / sum(times),
            "tau": statistics.mean(taus) if taus else None,
            "target_nfe_per_token": calls / toks if calls else None,
            "exact": (sum(exact) / len(exact)) if exact else None,
            "per_category_tokens_per_s": {k: v[1] / v[0] for k, v in per_cat.items()},
            "per_category_tau": {k: statistics.mean(v) for k, v in cat_taus.items()},
        })
    base = next((r for r in rows if r["method"] == "ar (cache)"), None)
    for r in rows:
        r["speedup"] = r["tokens_per_s"] / base["tokens_per_s"] if base else None
    return rows


@torch.no_grad()
def latency_curve(lm, context: int = 128, ks=None, repeats: int = 5) -> list[dict]:
    """Median seconds to score k new tokens on top of a cached ``context``-token prefix."""
    ks = ks or [1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, lm.vocab_size, (1, context + max(ks)), generator=g).to(lm.device)
    _, cache = lm.forward(ids[:, :context])
    sync = torch.cuda.synchronize if lm.device.type == "cuda" else (lambda: None)
    rows = []
    for k in ks:
        ts = []
        for _ in range(repeats + 1):
            sync()
            t0 = time.perf_counter()
            lm.forward(ids[:, context: context + k], cache)
            sync()
            ts.append(time.perf_counter() - t0)
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


DECODE_COLS = [("method", "method", ""), ("tokens_per_s", "tokens/s", ".1f"), ("speedup", "speedup vs AR", ".2f"),
               ("tau", "tau", ".2f"), ("target_nfe_per_token", "target NFE/token", ".2f"),
               ("exact", "exact vs AR greedy", ".0%"), ("prompts", "prompts", "")]


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m refimpl.bench", description="Benchmark every decoding method.")
    p.add_argument("--suite", choices=["decode", "latency", "dllm", "kernels"], default="decode")
    p.add_argument("--model", default="tiny", help="target model (zoo name, folder or HF id)")
    p.add_argument("--methods", default=None, help="comma-separated substrings of method names to run")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--per-category", type=int, default=None, help="prompts per category (default: all 5)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--device", default=None)
    p.add_argument("--out", default="bench_results")
    p.add_argument("--fast", action="store_true", help="a quick smoke run (1 prompt per category, 1 repeat)")
    p.add_argument("--prepack", choices=["auto", "on", "off"], default="auto",
                   help="pack linear weights once for oneDNN (refimpl.cpu_linear); auto = on for CPU fp32")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from . import cpu_linear

    on_cpu = torch.device(args.device or models.default_device()).type == "cpu"
    prepack = args.prepack == "on" or (args.prepack == "auto" and on_cpu and cpu_linear.available())
    os.makedirs(args.out, exist_ok=True)
    result = {"suite": args.suite, "model": args.model, "hardware": hardware(), "args": vars(args)}

    if args.suite == "kernels":
        import kernels

        rows = []
        for name in kernels.MODULES:
            r = importlib.import_module(f"kernels.{name}").bench()
            rows.append({"kernel": name, **(r or {"result": "skipped: no CUDA device"})})
        md = "\n".join(json.dumps(r, default=str) for r in rows)
    elif args.suite == "dllm":
        mod = importlib.import_module("refimpl.diffusion_bench")
        rows = mod.run(fast=args.fast)
        md = mod.to_markdown(rows) if hasattr(mod, "to_markdown") else json.dumps(rows, indent=1)
    elif args.suite == "latency":
        lm = models.load(args.model, device=args.device, prepack=prepack)
        rows = latency_curve(lm, repeats=2 if args.fast else 7)
        md = markdown_table(rows, [("k", "k new tokens", ""), ("seconds", "seconds", ".5f"),
                                   ("relative_to_k1", "cost vs k=1", ".2f")])
    else:
        lm = models.load(args.model, device=args.device, prepack=prepack)
        methods = all_methods()
        if args.methods:
            want = [w.strip() for w in args.methods.split(",")]
            methods = [m for m in methods if any(w in m.name for w in want) or m.name == "ar (cache)"]
        ctx = Context(target=lm, model_name=args.model)
        if any("draft" in m.needs for m in methods):
            draft_name = DRAFT_FOR.get(args.model)
            try:
                # the draft scores 1-2 rows a call, where MKL beats the prepacked path: not packed
                ctx.draft = models.load(draft_name, device=args.device) if draft_name else None
            except (FileNotFoundError, ValueError) as e:
                print(f"(no draft for {args.model}: {e})")
            if ctx.draft is None:
                methods = [m for m in methods if "draft" not in m.needs]
        per_cat = 1 if args.fast else args.per_category
        prompts = [(cat, encode_prompt(lm, text)) for cat, text in prompt_set(per_cat)]
        rows = run_decode(ctx, methods, prompts, args.max_new_tokens, 1 if args.fast else args.repeats)
        md = markdown_table(rows, DECODE_COLS)
    result["rows"] = rows
    result["prepacked_linears"] = prepack
    hw = result["hardware"]
    header = (f"## {args.suite} benchmark: {args.model}\n\n{hw['device']} ({hw['processor']}, "
              f"{hw['cpu_count']} cores, torch threads {hw['torch_threads']}), torch {hw['torch']}"
              f"{', linear weights prepacked for oneDNN' if prepack else ''}\n\n")
    md = header + md + "\n"
    stem = os.path.join(args.out, f"{args.suite}_{args.model.replace('/', '_')}")
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=2, default=str)
    with open(stem + ".md", "w") as f:
        f.write(md)
    print(md)
    return result


if __name__ == "__main__":
    main()
