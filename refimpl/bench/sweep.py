"""Sweep one method's options against AR: ``python -m refimpl.bench.sweep --method eagle3 --config
total=5,depth=5 --config total=6,depth=5``.

For each prompt of the benchmark set, AR and every configuration run back to back (interleaved, so drift of the
machine hits them alike), through the front door :func:`refimpl.generate`; each configuration's greedy
tokens must equal AR's. Per configuration: tau (new tokens / target calls, the prefill's call included, so a
little below the decode suite's), draft calls per step, the step's time and its speed-up over AR, summed over
the repeats after the first (a warm-up). Options not given keep the method's preset for the target. The decode
suite (``python -m refimpl.bench``) measures the bench's registered rows; this tool is for choosing among a
method's settings before one becomes a row or a preset.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import time

import torch

from .. import autoregressive, generate, methods, models
from ..prompts import encode_prompt, prompt_set


def parse_config(text: str) -> dict:
    """``"total=5,depth=5,copy=12.0"`` -> ``{"total": 5, "depth": 5, "copy": 12.0}`` (values as Python literals;
    a bare word stays a string)."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in part:
            raise ValueError(f"config: expected key=value, got {part!r} in {text!r}")
        key, value = (s.strip() for s in part.split("=", 1))
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key] = value
    return out


def sweep(target, prompts: list[list[int]], method: str, configs: list[dict], max_new_tokens: int = 64,
          repeats: int = 2) -> list[dict]:
    """One row per configuration (and AR's first): tau, draft calls per step, ms per step, speed-up vs AR.
    Raises ``AssertionError`` if a configuration's greedy tokens differ from AR's on a prompt."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if not prompts or not configs:
        raise ValueError("prompts and configs must not be empty")
    keep = range(1 if repeats > 1 else 0, repeats)  # the first repeat warms up when there are several
    seconds = [0.0] * (len(configs) + 1)
    calls, drafts, tokens = [0] * (len(configs) + 1), [0] * (len(configs) + 1), [0] * (len(configs) + 1)
    for rep in range(repeats):
        for ids in prompts:
            t0 = time.perf_counter()
            ar = autoregressive.generate(target, [ids], max_new_tokens=max_new_tokens)
            runs = [(ar, time.perf_counter() - t0)]
            for cfg in configs:
                t0 = time.perf_counter()
                g = generate(target, [ids], method, max_new_tokens=max_new_tokens, **cfg)
                runs.append((g, time.perf_counter() - t0))
                assert g.tokens[0] == ar.tokens[0], f"{method} {cfg} differs from AR greedy on a prompt"
            if rep in keep:
                for i, (g, s) in enumerate(runs):
                    seconds[i] += s
                    calls[i] += g.stats.target_calls
                    drafts[i] += g.stats.draft_calls
                    tokens[i] += len(g.tokens[0])
    rows = []
    for i, cfg in enumerate([None] + configs):
        rows.append({"method": "ar" if cfg is None else method, "config": cfg or {},
                     "tau": tokens[i] / calls[i], "draft_calls_per_step": drafts[i] / calls[i],
                     "step_ms": seconds[i] / calls[i] * 1e3, "speedup": seconds[0] / seconds[i]})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m refimpl.bench.sweep", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--method", required=True, help=f"one of {sorted(methods.METHODS)}")
    ap.add_argument("--config", action="append", required=True, help="key=value,... (repeat for each configuration)")
    ap.add_argument("--prompts", type=int, default=None, help="the first N benchmark prompts (default: all 30)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("TRITON_INTERPRET=1 is set: unset it to time anything")
    torch.set_num_threads(args.threads)
    target = models.load(args.model)
    texts = [t for _, t in prompt_set()][: args.prompts]
    rows = sweep(target, [encode_prompt(target, t) for t in texts], args.method,
                 [parse_config(c) for c in args.config], args.max_new_tokens, args.repeats)
    for r in rows:
        print(f"{r['method']:14s} {json.dumps(r['config']):50s} tau {r['tau']:.3f}  draft calls/step "
              f"{r['draft_calls_per_step']:.2f}  step {r['step_ms']:.2f} ms  speed-up {r['speedup']:.3f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
