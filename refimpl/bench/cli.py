"""``python -m refimpl.bench``: one command for every benchmark suite.

Suites (``--suite``): ``decode`` (default; every row of :mod:`refimpl.bench.rows` on the prompt
set of :mod:`refimpl.prompts`), ``latency`` (latency(k): the cost of scoring k tokens vs 1, next to the memory floor
bytes / bandwidth, and where a step's time goes: :mod:`refimpl.bench.roofline`),
``matmul`` (fp32 linear cost per number of rows, MKL vs prepacked oneDNN), ``dllm``
(:mod:`refimpl.bench.dllm`), ``learned`` (chapter 15, :mod:`refimpl.bench.learned`), ``capstone``
(chapter 16, :mod:`refimpl.bench.capstone`: every method at its chapter's defaults, with step cost and draft calls) and ``kernels`` (each kernel's ``bench()`` with
``triton.testing.do_bench``; skipped without CUDA). Tables are printed as markdown and written as
JSON + markdown under ``--out``, with the hardware, torch threads and versions.

A timing run refuses to start when ``TRITON_INTERPRET=1`` is set: the kernels would then run
in Triton's CPU interpreter (a speculative run fell to 0.10x AR that way), timing the interpreter.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os

import torch

from .. import models
from ..models import cpu_linear, lean_llama
from ..models import drafters
from ..prompts import encode_prompt, prompt_set
from . import capstone, dllm, learned, roofline
from .decode import DECODE_COLS, Context, category_table, hardware, markdown_table, run_decode
from .rows import decode_rows, lookahead_sweep_rows

INTERPRETER_REFUSAL = ("TRITON_INTERPRET=1 is set: Triton kernels would run in the CPU interpreter and the "
                       "timings would be the interpreter's. Unset it (env -u TRITON_INTERPRET ...) to benchmark.")


def prepacked(model) -> bool:
    return any(isinstance(m, cpu_linear.PrepackedLinear) for m in model.modules())


def products(lm) -> str:
    """Which kernel runs the target's matrix products: ``cpu_gemv`` (the lean forward's default on
    an AVX2 CPU), ``onednn`` (prepacked) or ``torch`` (``F.linear``)."""
    if isinstance(lm, lean_llama.LeanLM) and lean_llama.projections(lm.model)[0].gemv:
        return "cpu_gemv"
    return "onednn" if prepacked(lm.model) else "torch"


def spec_parts(spec: str) -> list[str]:
    """``--methods``'s substrings: comma-separated, or semicolon-separated when ``spec`` has a ``;``
    (names with commas: "10 nodes, depth 6; ar (cache)")."""
    return [w.strip() for w in spec.split(";" if ";" in spec else ",") if w.strip()]


def pick(methods: list, spec: str) -> list:
    """The rows whose names contain one of ``spec``'s substrings (:func:`spec_parts`), and AR's."""
    want = spec_parts(spec)
    return [m for m in methods if any(w in m.name for w in want) or m.name == "ar (cache)"]


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m refimpl.bench", description="Benchmark every decoding method.")
    p.add_argument("--suite", choices=["decode", "latency", "matmul", "dllm", "learned", "kernels", "lookahead-sweep", "capstone"], default="decode")
    p.add_argument("--model", default="tiny", help="target model (zoo name, folder or HF id)")
    p.add_argument("--methods", default=None,
                   help="substrings of method names to run, comma-separated (semicolons: names with commas)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--per-category", type=int, default=None, help="prompts per category (default: all 5)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--device", default=None)
    p.add_argument("--out", default="bench_results")
    p.add_argument("--fast", action="store_true", help="a quick smoke run (1 prompt per category, 1 repeat)")
    p.add_argument("--add-to", default=None, help="capstone: put this run's rows (not its AR) into a committed "
                   "capstone JSON (each against this run's AR) and rewrite it and its .md, instead of writing --out")
    p.add_argument("--prepack", choices=["auto", "on", "off"], default="auto",
                   help="pack the target's linear weights for oneDNN (refimpl.models.cpu_linear); "
                        "auto = models.load's default (on for the larger targets on a CPU in fp32)")
    p.add_argument("--forward", choices=["auto", "hf"], default="auto",
                   help="the target's cached steps: auto = models.load's default (the lean forward with fused "
                        "prepacked projections where it applies), hf = the plain Hugging Face forward")
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit(INTERPRETER_REFUSAL)
    if args.threads:  # exactly these threads: the zoo's loader would otherwise fit them to the load
        os.environ["REFIMPL_THREADS"] = str(args.threads)
        torch.set_num_threads(args.threads)
    prepack = {"auto": None, "on": True, "off": False}[args.prepack]
    fast = None if args.forward == "auto" else False
    os.makedirs(args.out, exist_ok=True)
    result = {"suite": args.suite, "model": args.model, "hardware": hardware(), "args": vars(args)}
    packed = False

    if args.suite == "kernels":
        import kernels

        rows = []
        for name in kernels.MODULES:
            r = importlib.import_module(f"kernels.{name}").bench()
            rows.append({"kernel": name, **(r or {"result": "skipped: no CUDA device"})})
        md = "\n".join(json.dumps(r, default=str) for r in rows)
    elif args.suite == "dllm":
        rows = dllm.run(fast=args.fast)
        md = markdown_table(rows, dllm.COLS)
    elif args.suite == "learned":
        rows = learned.run(fast=args.fast, prepack=prepack)
        md = markdown_table(rows, learned.COLS)
    elif args.suite == "matmul":
        lm = models.load(args.model, device="cpu", prepack=False)
        rows = cpu_linear.matmul_cost(lm.model)
        md = markdown_table(rows, [("rows", "rows", ""), ("mkl_ms", "MKL ms", ".1f"), ("prepacked_ms", "prepacked ms", ".1f")])
    elif args.suite == "latency":
        lm = models.load(args.model, device=args.device, prepack=prepack, fast=fast)
        packed = prepacked(lm.model)
        result["forward"] = type(lm).__name__  # LeanLM: the lean forward; LM: Hugging Face's
        result["products"] = products(lm)
        result.update(roofline.run(lm, fast=args.fast))
        rows = result.pop("rows")
        md = roofline.markdown(result, rows)
        roofline.figure(result, rows, f"{os.path.join(args.out, 'latency_' + args.model.replace('/', '_'))}.png")
    else:
        lm = models.load(args.model, device=args.device, prepack=prepack, fast=fast)
        packed = prepacked(lm.model)
        result["forward"] = type(lm).__name__  # LeanLM: the lean forward; LM: Hugging Face's
        result["products"] = products(lm)
        if args.suite == "capstone":
            methods = [m for m, _ in capstone.capstone_rows(args.model)]
        else:
            methods = decode_rows() if args.suite == "decode" else lookahead_sweep_rows()
        if args.methods:
            methods = pick(methods, args.methods)
        # the rows whose drafter the zoo holds for this target ("draft": loaded once below, for every row)
        methods = [m for m in methods if all(k == "draft" or drafters.has(lm, k) for k in m.needs if k in drafters.KINDS)]
        ctx = Context(target=lm, model_name=args.model)
        if any("draft" in m.needs for m in methods):
            chain_drafts = drafters.KINDS["draft"].models
            try:  # (the zoo's default packing: SmolLM2's draft prepacked, tiny's not)
                ctx.draft = (models.load(chain_drafts[args.model], device=args.device)
                             if args.model in chain_drafts else None)
            except (FileNotFoundError, ValueError) as e:
                print(f"(no draft for {args.model}: {e})")
            if ctx.draft is None:
                methods = [m for m in methods if "draft" not in m.needs]
        per_cat = 1 if args.fast else args.per_category
        prompts = [(cat, encode_prompt(lm, text)) for cat, text in prompt_set(per_cat)]
        reps = 1 if args.fast else args.repeats
        if args.suite == "capstone":
            rows, cols = capstone.run(ctx, methods, prompts, args.max_new_tokens, reps), capstone.COLS
        else:
            rows, cols = run_decode(ctx, methods, prompts, args.max_new_tokens, reps), DECODE_COLS
        md = markdown_table(rows, cols) + "\n\nPer category:\n\n" + category_table(rows)
        if args.suite == "capstone" and args.model in drafters.KINDS["dlm"].models and not args.methods:  # the dLLM suite: NFE vs quality
            result["dllm_rows"] = dllm.run(fast=args.fast)
            md += "\n\ndLLM suite (NFE vs quality):\n\n" + markdown_table(result["dllm_rows"], dllm.COLS)
    result["rows"] = rows
    result["prepacked_linears"] = packed
    if args.add_to:
        if args.suite != "capstone":
            p.error("--add-to: only with --suite capstone")
        result = capstone.add_rows(args.add_to, result)
        rows, packed = result["rows"], result["prepacked_linears"]
        md = (markdown_table(rows, capstone.COLS) + "\n\nPer category:\n\n" + category_table(rows) +
              "\n\nRows added by later runs (each against its own run's AR): " +
              "; ".join(", ".join(a["rows"]) for a in result["added_runs"]))
        if result.get("dllm_rows"):
            md += "\n\ndLLM suite (NFE vs quality):\n\n" + markdown_table(result["dllm_rows"], dllm.COLS)
    hw = result["hardware"]
    header = (f"## {args.suite} benchmark: {args.model}\n\n{hw['device']} ({hw['processor']}, "
              f"{hw['cpu_count']} cores, torch threads {hw['torch_threads']}), torch {hw['torch']}"
              f"{', linear weights prepacked for oneDNN' if packed else ''}"
              f"{', lean forward products by cpu_gemv' if result.get('products') == 'cpu_gemv' else ''}\n\n")
    md = header + md + "\n"
    stem = (os.path.splitext(args.add_to)[0] if args.add_to else
            os.path.join(args.out, f"{args.suite}_{args.model.replace('/', '_')}"))
    with open(stem + ".json", "w") as f:
        json.dump(result, f, indent=2, default=str)
    with open(stem + ".md", "w") as f:
        f.write(md)
    print(md)
    return result
