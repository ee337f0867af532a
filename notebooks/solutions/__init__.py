"""Exercise plumbing for the notebooks: stubs the learner fills in, checks, hidden reference answers.

In a notebook::

    from solutions import exercise, check

    @exercise("07", "jacobi_update")      # the reference answer replaces the stub only when asked
    def jacobi_update(...):
        ...                               # the learner's code
        raise NotImplementedError

    check("Exercise 1", lambda: ...)      # "not attempted yet" / "wrong, because ..." /
                                          # "wrong: your code raised ..." / "correct"

The reference answers live in ``solutions/chNN.py`` (one module per chapter) and are used when the
environment variable ``COURSE_ANSWERS=1`` is set (CI runs every check against them this way) or
when the notebook's ``SHOW_SOLUTIONS`` switch calls :func:`show`. A check raises in CI mode unless
the answer is correct, so a wrong reference answer fails the build.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import linecache
import os
import sysconfig
import traceback

NOT_ATTEMPTED, CORRECT = "not attempted yet", "correct"
#: longest error message quoted in a verdict (torch's can run to pages)
MAX_MESSAGE = 300


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


class Verdict(str):
    """The verdict :func:`check` returns: a plain ``str`` that Jupyter does not echo as the cell's
    value (``check`` has printed it already, so a cell ending in ``check(...)`` shows it once)."""

    def _ipython_display_(self):
        pass


def _plumbing_dirs() -> tuple:
    """Folders whose frames are the course's or a library's, never the learner's: this package,
    ``refimpl`` and ``kernels`` (wherever they are imported from), the standard library and
    site-packages."""
    dirs = [os.path.dirname(os.path.abspath(__file__))]
    for name in ("refimpl", "kernels"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            dirs += [os.path.abspath(p) for p in spec.submodule_search_locations]
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        with contextlib.suppress(KeyError):
            dirs.append(os.path.abspath(sysconfig.get_paths()[key]))
    return tuple(d.rstrip(os.sep) + os.sep for d in dirs)


def _plumbing(filename: str, dirs: tuple) -> bool:
    """Is ``filename`` the course's plumbing or a library: under one of ``dirs`` (see
    :func:`_plumbing_dirs`), or ``figures.py``, the chapters' drawing helpers next to this package?"""
    path = os.path.abspath(filename)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return path.startswith(dirs) or path == os.path.join(here, "figures.py")


def _is_cell(filename: str) -> bool:
    """A Jupyter cell's pseudo-file: ``/tmp/ipykernel_<pid>/<hash>.py`` (ipykernel >= 6) or
    ``<ipython-input-N-...>`` (older IPython)."""
    return "ipykernel_" in filename or filename.startswith(("<ipython-input-", "<cell"))


def _learner_frame(err: BaseException):
    """The innermost traceback frame in the learner's code (a notebook cell, or any file that is
    not the course's plumbing or a library), or None when every frame is plumbing."""
    plumbing, found = _plumbing_dirs(), None
    for frame, lineno in traceback.walk_tb(err.__traceback__):
        name = frame.f_code.co_filename
        if _is_cell(name) or not (name.startswith("<") or _plumbing(name, plumbing)):
            found = (name, lineno)
    return found


def _where(err: BaseException) -> str:
    """`` (line N of your cell: <source>)`` for the learner's innermost frame, or ``""``."""
    found = _learner_frame(err)
    if found is None:
        return ""
    name, lineno = found
    line = linecache.getline(name, lineno).strip()
    place = "your cell" if _is_cell(name) else os.path.basename(name)
    return f" (line {lineno} of {place}: {line})" if line else f" (line {lineno} of {place})"


def _raised(err: Exception) -> str:
    """"wrong: your code raised <Type>: <message> (line N of your cell: <source>)", on one line."""
    msg = " ".join(str(err).split())
    msg = msg if len(msg) <= MAX_MESSAGE else msg[:MAX_MESSAGE - 3] + "..."
    return f"wrong: your code raised {type(err).__name__}{': ' + msg if msg else ''}{_where(err)}"


def check(title: str, test) -> str:
    """Run ``test()`` and print one verdict, never a traceback:

    - a stub raising NotImplementedError (or returning ``...``): "not attempted yet";
    - a failed ``assert cond, reason``: "wrong, because <reason>";
    - any other exception (a ZeroDivisionError, an IndexError, a shape mismatch in ``@``...):
      "wrong: your code raised <Type>: <message> (line N of your cell: <source>)", the line being
      the innermost frame of the learner's own code, so the learner looks there and not here;
    - else "correct".

    With ``COURSE_ANSWERS=1`` (CI) any verdict but "correct" raises AssertionError chained to the
    original exception, so a broken reference answer fails the build with its traceback."""
    err = None
    try:
        out = test()
        status = NOT_ATTEMPTED if out is Ellipsis else CORRECT
    except NotImplementedError as e:
        status, err = NOT_ATTEMPTED, e
    except AssertionError as e:
        status, err = (f"wrong, because {e}" if str(e) else "wrong (the check's assertion failed)"), e
    except Exception as e:  # noqa: BLE001 -- every error in a learner's answer is a verdict
        status, err = _raised(e), e
    print(f"{title}: {status}")
    if answers_on() and status != CORRECT:
        raise AssertionError(f"{title}: the reference answer is {status}") from err
    return Verdict(status)
