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


#: the code files (notebook cells) that define an ``@exercise`` stub: the only cells :func:`check`
#: calls "your cell"; every other cell is the course's (a helper, a check)
EXERCISE_FILES: set = set()


def exercise(chapter: str, name: str):
    """Decorator on a stub: returns the stub, or the chapter's reference answer when answers are on.
    Either way the stub's cell joins :data:`EXERCISE_FILES`."""
    def wrap(stub):
        code = getattr(stub, "__code__", None)
        if code is not None:
            EXERCISE_FILES.add(code.co_filename)
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


def _frames(err: BaseException) -> list:
    """``(filename, lineno, function)`` of every traceback frame of ``err`` outside the course's
    plumbing and the libraries (see :func:`_plumbing`), outermost first."""
    plumbing, out = _plumbing_dirs(), []
    for frame, lineno in traceback.walk_tb(err.__traceback__):
        name = frame.f_code.co_filename
        if _is_cell(name) or not (name.startswith("<") or _plumbing(name, plumbing)):
            out.append((name, lineno, frame.f_code.co_name))
    return out


def _yours(filename: str) -> bool:
    """Is ``filename`` the learner's code: the cell of an ``@exercise`` stub (:data:`EXERCISE_FILES`),
    or a file outside the notebook that is not the course's plumbing? Any other cell is the course's."""
    return filename in EXERCISE_FILES or not _is_cell(filename)


def _line(name: str, lineno: int) -> str:
    """``line N of your cell: <source>`` (``of <file>.py`` outside a cell)."""
    place = "your cell" if _is_cell(name) else os.path.basename(name)
    src = linecache.getline(name, lineno).strip()
    return f"line {lineno} of {place}: {src}" if src else f"line {lineno} of {place}"


def _where(err: BaseException) -> tuple:
    """``(located, yours)``: where ``err`` was raised, as `` (...)`` or ``""``, and whether the
    learner's code is on the way there. The innermost non-plumbing frame is quoted when it is the
    learner's; when it is another cell's (a course helper such as ``inverse_cdf``, or the check
    itself), that function is named as another cell's, with the learner's innermost line that called it."""
    frames = _frames(err)
    if not frames:
        return "", False
    name, lineno, func = frames[-1]
    if _yours(name):
        return f" ({_line(name, lineno)})", True
    what = f"`{func}`" if not func.startswith("<") else "code"
    caller = next(((n, ln) for n, ln, _ in reversed(frames) if _yours(n)), None)
    if caller is None:
        return f" (raised in {what} of another cell of the notebook, not in your exercise's cell)", False
    return f" (raised in {what} of another cell of the notebook, called from {_line(*caller)})", True


def _raised(err: Exception) -> str:
    """"wrong: your code raised <Type>: <message> (line N of your cell: <source>)", on one line;
    "wrong: checking your answer raised ..." when no frame on the way is the learner's."""
    msg = " ".join(str(err).split())
    msg = msg if len(msg) <= MAX_MESSAGE else msg[:MAX_MESSAGE - 3] + "..."
    located, yours = _where(err)
    who = "your code" if yours else "checking your answer"
    return f"wrong: {who} raised {type(err).__name__}{': ' + msg if msg else ''}{located}"


def check(title: str, test) -> str:
    """Run ``test()`` and print one verdict, never a traceback:

    - a stub raising NotImplementedError (or returning ``...``): "not attempted yet";
    - a failed ``assert cond, reason``: "wrong, because <reason>";
    - any other exception (a ZeroDivisionError, an IndexError, a shape mismatch in ``@``...):
      "wrong: your code raised <Type>: <message> (line N of your cell: <source>)", the line being
      the innermost frame of the learner's own code (the cell of an ``@exercise`` stub), so the
      learner looks there and not here; raised in a function of another cell (a course helper),
      "(raised in `<function>` of another cell of the notebook, called from line N of your cell:
      <source>)"; with no learner frame on the way, "wrong: checking your answer raised ...";
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
