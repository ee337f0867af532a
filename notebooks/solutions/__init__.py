"""Exercise plumbing for the notebooks: stubs the learner fills in, checks, hidden reference answers.

In a notebook::

    from solutions import exercise, check

    @exercise("07", "jacobi_update")      # the reference answer replaces the stub only when asked
    def jacobi_update(...):
        ...                               # the learner's code
        raise NotImplementedError

    check("Exercise 1", lambda: ...)      # prints "not attempted yet" / "wrong, because ..." / "correct"

The reference answers live in ``solutions/chNN.py`` (one module per chapter) and are used when the
environment variable ``COURSE_ANSWERS=1`` is set (CI runs every check against them this way) or
when the notebook's ``SHOW_SOLUTIONS`` switch calls :func:`show`. A check raises in CI mode unless
the answer is correct, so a wrong reference answer fails the build.
"""
from __future__ import annotations

import importlib
import inspect
import os

NOT_ATTEMPTED, CORRECT = "not attempted yet", "correct"


def answers_on() -> bool:
    """True when the reference answers replace the stubs (``COURSE_ANSWERS=1``)."""
    return os.environ.get("COURSE_ANSWERS") == "1"


def reference(chapter: str, name: str):
    return getattr(importlib.import_module(f"solutions.ch{chapter}"), name)


def exercise(chapter: str, name: str):
    """Decorator on a stub: returns the stub, or the chapter's reference answer when answers are on."""
    def wrap(stub):
        return reference(chapter, name) if answers_on() else stub
    return wrap


def show(chapter: str, name: str) -> None:
    """Print the reference answer ``name`` of chapter ``chapter`` (for the SHOW_SOLUTIONS switch)."""
    print(inspect.getsource(reference(chapter, name)))


def check(title: str, test) -> str:
    """Run ``test()``: a stub raising NotImplementedError (or returning ``...``) is "not attempted
    yet", a failed ``assert cond, reason`` is "wrong, because <reason>", anything else "correct"."""
    try:
        out = test()
        status = NOT_ATTEMPTED if out is Ellipsis else CORRECT
    except NotImplementedError:
        status = NOT_ATTEMPTED
    except AssertionError as e:
        status = f"wrong, because {e}" if str(e) else "wrong (the check's assertion failed)"
    print(f"{title}: {status}")
    if answers_on() and status != CORRECT:
        raise AssertionError(f"{title}: the reference answer is {status}")
    return status
