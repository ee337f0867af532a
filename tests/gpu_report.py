"""The table ``make test-gpu`` prints at its end: what ran natively on the GPU, in one paste.

    python tests/gpu_report.py bench_results/gpu/checks.xml bench_results/gpu/notebooks.xml

Reads the JUnit XML files pytest wrote (``--junitxml``) for ``tests/test_gpu.py`` and for the
notebooks under nbval, and prints a Markdown table: each kernel check, each decoding method, each
notebook (cells passed / run, the failing cells), with the machine it ran on. Exit status 0; the
make target's own status says whether anything failed.
"""
from __future__ import annotations

import os
import platform
import re
import sys
import xml.etree.ElementTree as ET


def outcome(case: ET.Element) -> str:
    for tag, word in (("failure", "FAILED"), ("error", "ERROR"), ("skipped", "skipped")):
        if case.find(tag) is not None:
            return word
    return "passed"


def cases(path: str) -> list[dict]:
    """Every ``<testcase>`` of one JUnit file as {file, name, outcome, seconds, why}."""
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        bad = next((case.find(t) for t in ("failure", "error", "skipped") if case.find(t) is not None), None)
        why = "" if bad is None else (bad.get("message") or "").splitlines()[0][:80] if bad.get("message") else ""
        out.append({"file": case.get("file") or case.get("classname", ""), "name": case.get("name", ""),
                    "outcome": outcome(case), "seconds": float(case.get("time") or 0.0), "why": why})
    return out


def section(name: str) -> str:
    """``kernels`` for the native kernel checks, ``decoding`` for the rest of tests/test_gpu.py."""
    return "kernels" if ("native" in name or "kernel" in name) else "decoding"


def label(name: str) -> str:
    m = re.match(r"test_\w+\[(.+)\]$", name)  # a parametrized decoding method: its name
    if m:
        return m.group(1)
    return name.removeprefix("test_").replace("_", " ")


def notebook_rows(rows: list[dict]) -> list[tuple[str, str, str, float]]:
    """One row per notebook: (name, outcome, 'cells passed / run' and the failing cells, seconds)."""
    books: dict[str, list[dict]] = {}
    for r in rows:
        key = os.path.basename(r["file"].replace(".", "/").replace("/ipynb", ".ipynb")) if ".ipynb" in r["file"] else r["file"]
        books.setdefault(key, []).append(r)
    out = []
    for book, rs in sorted(books.items()):
        bad = [r["name"] for r in rs if r["outcome"] in ("FAILED", "ERROR")]
        ran = [r for r in rs if r["outcome"] != "skipped"]
        ok = sum(r["outcome"] == "passed" for r in rs)
        note = f"{ok}/{len(ran)} cells" + (f"; failed: {', '.join(bad)}" if bad else "")
        out.append((book, "FAILED" if bad else "passed", note, sum(r["seconds"] for r in rs)))
    return out


def machine() -> str:
    try:
        import torch
        import triton

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
        cuda = torch.version.cuda or "-"
        return (f"{gpu} · torch {torch.__version__} · CUDA {cuda} · triton {triton.__version__} · "
                f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', 'unset')} · {platform.node()}")
    except ImportError as e:  # the table still prints
        return f"unknown machine ({e})"


def table(paths: list[str]) -> str:
    lines = ["", f"## make test-gpu: what ran natively — {machine()}", "",
             "| section | check | result | seconds | note |", "|---|---|---|---:|---|"]
    tests, books = [], []
    for p in paths:
        if not os.path.exists(p):
            lines.append(f"| - | {p} | MISSING | | pytest wrote no report |")
            continue
        for r in cases(p):
            (books if ".ipynb" in r["file"] or ".ipynb" in r["name"] else tests).append(r)
    for sec in ("kernels", "decoding"):
        for r in tests:
            if section(r["name"]) == sec:
                lines.append(f"| {sec} | {label(r['name'])} | {r['outcome']} | {r['seconds']:.1f} | {r['why']} |")
    for book, result, note, secs in notebook_rows(books):
        lines.append(f"| notebooks | {book} | {result} | {secs:.1f} | {note} |")
    counts = {}
    for r in tests:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    nb = notebook_rows(books)
    lines += ["", f"checks: {counts or 'none'}; notebooks: {sum(r[1] == 'passed' for r in nb)}/{len(nb)} passed", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit("usage: python tests/gpu_report.py JUNIT.xml [JUNIT.xml ...]")
    print(table(sys.argv[1:]))
