"""The learner's own copy of the chapters, which ``make lab`` serves instead of ``notebooks/``.

``python notebooks/work_copy.py [DEST]`` (``make lab`` runs it; DEST defaults to ``work/`` at the
repository's root, which git ignores) copies every chapter notebook (``NN_*.ipynb``) that DEST does
not have yet; a notebook already there is never overwritten, so a learner's edits survive ``git
pull`` and a new chapter still arrives. ``make lab-reset`` deletes DEST and copies afresh.

Only the ``.ipynb`` files are copied, without their jupytext pairing (``metadata.jupytext``): in
``notebooks/`` each chapter is paired with a ``.py`` file that jupytext rewrites on every save,
so the lab would list every chapter twice and a learner's first save would change tracked files.
The plumbing the chapters import (``solutions``, ``figures``) stays in ``notebooks/``, found
through ``PYTHONPATH`` (``make lab`` sets it), so it follows ``git pull`` and stays out of the
learner's file browser; ``refimpl`` and ``kernels`` are installed packages, and the chapters find
``models/`` and ``bench_results/`` through ``refimpl``'s own location, so nothing else is needed.
"""
from __future__ import annotations

import glob
import json
import os
import sys

NOTEBOOKS = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DEST = os.path.join(os.path.dirname(NOTEBOOKS), "work")


def chapters(src: str = NOTEBOOKS) -> list[str]:
    """Paths of the chapter notebooks (``NN_*.ipynb``, appendices included), in order."""
    return sorted(glob.glob(os.path.join(src, "[0-9][0-9]*_*.ipynb")))


def unpaired(path: str) -> dict:
    """The notebook at ``path`` as JSON, without jupytext's pairing metadata."""
    with open(path, encoding="utf-8") as f:
        nb = json.load(f)
    nb.get("metadata", {}).pop("jupytext", None)
    return nb


def create(dest: str = DEFAULT_DEST, src: str = NOTEBOOKS) -> list[str]:
    """Copy into ``dest`` every chapter notebook of ``src`` that ``dest`` lacks; return the names
    copied (none when the copy is complete). Never overwrites a file."""
    if not os.path.isdir(src):
        raise ValueError(f"src must be a folder of chapter notebooks, got {src!r}")
    os.makedirs(dest, exist_ok=True)
    copied = []
    for path in chapters(src):
        target = os.path.join(dest, os.path.basename(path))
        if os.path.exists(target):
            continue
        nb = unpaired(path)
        with open(target, "x", encoding="utf-8") as f:   # "x": fails rather than overwrite
            json.dump(nb, f, indent=1, ensure_ascii=False)
            f.write("\n")
        copied.append(os.path.basename(path))
    return copied


if __name__ == "__main__":
    where = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_DEST
    new = create(where)
    print(f"{where}: {len(new)} notebook(s) copied" + (f" ({', '.join(new)})" if new else ", none missing"))
