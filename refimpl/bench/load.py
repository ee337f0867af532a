"""Decoding speed on a CPU that is doing something else: each thread policy, idle and next to
competing CPU-bound processes.

``python -m refimpl.bench.load --model smollm2-135m --out bench_results/load`` runs, for every
policy in :data:`POLICIES`, our greedy AR (:func:`refimpl.autoregressive.generate`) and Hugging
Face's ``generate`` on the same prompt, first on an idle machine and then with ``--competitors``
processes spinning (``python -c 'while True: pass'``, started and stopped here). Each
measurement runs in a fresh interpreter, because OpenMP reads its settings (``OMP_NUM_THREADS``,
``OMP_WAIT_POLICY``) when torch starts its thread pool. Writes ``load_<model>.json`` and ``.md``.

Run it with the Triton interpreter off (``env -u TRITON_INTERPRET``) and nothing else heavy on
the machine, or the "idle" rows are not idle.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

#: name -> environment for the measuring interpreter. "torch default" is what a plain
#: ``import torch`` gives (one thread per core, libgomp's spin-then-sleep wait); "fit to load" is
#: the library's default (:func:`refimpl.models.threads.fit_to_load`); "passive" makes waiting
#: threads sleep at once (``OMP_WAIT_POLICY=PASSIVE``) instead of spinning.
POLICIES = {
    "torch default": {"REFIMPL_THREADS": "off"},
    "1 thread": {"REFIMPL_THREADS": "1"},
    "passive wait": {"REFIMPL_THREADS": "off", "OMP_WAIT_POLICY": "PASSIVE"},
    "fit to load": {"REFIMPL_THREADS": "auto"},
    "fit to load + passive": {"REFIMPL_THREADS": "auto", "OMP_WAIT_POLICY": "PASSIVE"},
}
PROMPT = "Explain in a few sentences why the sky is blue."
SPIN = "while True: pass"


#: engine -> its label in the table: our AR, Hugging Face ``generate``, and the front door's
#: ``method="fastest"`` (the fastest lossless method the zoo has a drafter for, at its preset)
ENGINES = {"ours": "our AR", "hf": "HF generate", "best": "fastest method"}


def measure(model: str, engine: str, tokens: int, repeats: int) -> dict:
    """Tokens per second of ``engine`` (a key of :data:`ENGINES`) on ``model``, the best of
    ``repeats`` runs after a warm-up, in this interpreter."""
    import torch

    import refimpl
    from refimpl import autoregressive, models
    from refimpl.prompts import encode_prompt

    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {sorted(ENGINES)}, got {engine!r}")
    # our engines on the zoo's default path (prepacked, lean forward); HF generate on the plain model
    lm = models.load(model, prepack=False, fast=False) if engine == "hf" else models.load(model)
    ids = encode_prompt(lm, PROMPT)

    def run(n):
        if engine == "ours":
            return autoregressive.generate(lm, [ids], max_new_tokens=n, eos_token_id=[])
        if engine == "best":
            return refimpl.generate(lm, [ids], method="fastest", max_new_tokens=n, eos_token_id=[])
        x = torch.tensor([ids], device=lm.device)
        with torch.inference_mode():
            return lm.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                                     do_sample=False, pad_token_id=lm.tokenizer.eos_token_id)
    run(4)
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        run(tokens)
        best = max(best, tokens / (time.perf_counter() - t0))
    return {"tok_s": round(best, 2), "threads": torch.get_num_threads()}


def one(model: str, engine: str, policy: str, tokens: int, repeats: int) -> dict:
    """:func:`measure` in a fresh interpreter under ``policy``'s environment."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "TRITON_INTERPRET")}
    env.update(POLICIES[policy], HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    out = subprocess.run([sys.executable, "-m", "refimpl.bench.load", "--worker", engine, "--model", model,
                          "--tokens", str(tokens), "--repeats", str(repeats)],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def sweep(model: str, competitors: int, tokens: int, repeats: int, policies=None,
          engines=("ours", "hf")) -> list[dict]:
    """Every policy x engine, idle and with ``competitors`` spinning processes."""
    rows = []
    for policy in policies or POLICIES:
        for load in (0, competitors):
            spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(load)]
            try:
                time.sleep(1.0 if load else 0.0)
                for engine in engines:
                    r = one(model, engine, policy, tokens, repeats)
                    rows.append(dict(policy=policy, competitors=load, engine=engine, **r))
                    print(rows[-1], flush=True)
            finally:
                for p in spinners:
                    p.kill()
                    p.wait()
    return rows


def table(rows: list[dict]) -> str:
    """Markdown: one line per policy and engine, idle vs loaded tok/s and their ratio."""
    lines = ["| policy | engine | idle tok/s (threads) | loaded tok/s (threads) | loaded / idle |",
             "|---|---|---|---|---|"]
    for policy in dict.fromkeys(r["policy"] for r in rows):
        for engine in [e for e in ENGINES if any(r["engine"] == e for r in rows)]:
            idle = next(r for r in rows if (r["policy"], r["engine"], r["competitors"]) == (policy, engine, 0))
            busy = next(r for r in rows if (r["policy"], r["engine"]) == (policy, engine) and r["competitors"])
            lines.append(f"| {policy} | {ENGINES[engine]} | {idle['tok_s']:.1f} "
                         f"({idle['threads']}) | {busy['tok_s']:.1f} ({busy['threads']}) | "
                         f"{busy['tok_s'] / idle['tok_s']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--competitors", type=int, default=1, help="CPU-bound processes in the loaded runs")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--policies", nargs="*", choices=list(POLICIES), default=None)
    ap.add_argument("--out", default=None, help="folder for load_<model>.json and .md")
    ap.add_argument("--engines", nargs="*", choices=list(ENGINES), default=["ours", "hf"])
    ap.add_argument("--worker", choices=list(ENGINES), default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.tokens < 1 or a.repeats < 1 or a.competitors < 1:
        raise ValueError("--tokens, --repeats and --competitors must be >= 1")
    if a.worker:
        print(json.dumps(measure(a.model, a.worker, a.tokens, a.repeats)))
        return
    rows = sweep(a.model, a.competitors, a.tokens, a.repeats, a.policies, a.engines)
    md = table(rows)
    print(md)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        meta = dict(model=a.model, competitors=a.competitors, tokens=a.tokens, repeats=a.repeats,
                    cores=len(os.sched_getaffinity(0)), rows=rows)
        name = f"load_{a.model}" + ("" if a.engines == ["ours", "hf"] else "_" + "_".join(a.engines))
        with open(os.path.join(a.out, f"{name}.json"), "w") as f:
            json.dump(meta, f, indent=1)
        with open(os.path.join(a.out, f"{name}.md"), "w") as f:
            f.write(md + "\n")


if __name__ == "__main__":
    main()
