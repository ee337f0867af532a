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

import ast
import contextlib
import functools
import glob
import importlib
import importlib.util
import inspect
import json
import linecache
import os
import signal
import sysconfig
import traceback

NOT_ATTEMPTED, CORRECT = "not attempted yet", "correct"
#: longest error message quoted in a verdict (torch's can run to pages)
MAX_MESSAGE = 300
#: seconds a check may run before its verdict says the answer ran too long (a FAST check takes seconds)
TIME_LIMIT_S = 120
NOTEBOOKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def answers_on() -> bool:
    """True when the reference answers replace the stubs (``COURSE_ANSWERS=1``)."""
    return os.environ.get("COURSE_ANSWERS") == "1"


def reference(chapter: str, name: str):
    return getattr(importlib.import_module(f"solutions.ch{chapter}"), name)


#: the code files (notebook cells) that define an ``@exercise`` stub: always the learner's cells
EXERCISE_FILES: set = set()
#: the code cells of the chapters whose exercises this kernel has met, as the course wrote them
#: (stripped sources): a cell whose code is not among them the learner wrote or changed
COURSE_CELLS: set = set()
#: the chapters whose cells :data:`COURSE_CELLS` holds
CHAPTERS_READ: set = set()
#: the ``@exercise`` functions called during the running check: (name, returned None, has ``return value``)
CALLS: list = []


def course_cells(chapter: str) -> set:
    """The stripped sources of chapter ``chapter``'s code cells, from ``notebooks/<chapter>_*.ipynb`` (empty
    when it is not there: then every cell without an ``@exercise`` stub counts as the course's)."""
    cells = set()
    for path in glob.glob(os.path.join(NOTEBOOKS, f"{chapter}_*.ipynb")):
        with open(path, encoding="utf-8") as f:
            nb = json.load(f)
        cells |= {"".join(c["source"]).strip() for c in nb["cells"] if c["cell_type"] == "code"}
    return cells


def _returns_a_value(fn) -> bool:
    """Does ``fn``'s source hold a ``return <value>`` (or ``yield``)? True when the source cannot be read."""
    try:
        tree = ast.parse(inspect.getsource(fn).lstrip())
    except (OSError, TypeError, SyntaxError):
        return True
    return any(isinstance(n, ast.Return) and n.value is not None or isinstance(n, (ast.Yield, ast.YieldFrom))
               for n in ast.walk(tree))


def exercise(chapter: str, name: str):
    """Decorator on a stub: returns the stub, or the chapter's reference answer when answers are on.
    Either way the stub's cell joins :data:`EXERCISE_FILES` and the chapter's cells :data:`COURSE_CELLS`;
    the learner's function is wrapped so that :func:`check` can tell "it returned None" from a wrong value."""
    def wrap(stub):
        code = getattr(stub, "__code__", None)
        if code is not None:
            EXERCISE_FILES.add(code.co_filename)
        if chapter not in CHAPTERS_READ:
            CHAPTERS_READ.add(chapter)
            COURSE_CELLS.update(course_cells(chapter))
        if answers_on():
            return reference(chapter, name)
        if not callable(stub):
            return stub
        valued = _returns_a_value(stub)

        @functools.wraps(stub)
        def learner(*args, **kwargs):
            out = stub(*args, **kwargs)
            CALLS.append((stub.__name__, out is None, valued))
            return out
        return learner
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
    """Is ``filename`` the learner's code: the cell of an ``@exercise`` stub (:data:`EXERCISE_FILES`), a cell
    the learner wrote or changed (its code is none of the chapter's, :data:`COURSE_CELLS`, when those are
    known), or a file outside the notebook that is not the course's plumbing?"""
    if filename in EXERCISE_FILES or not _is_cell(filename):
        return True
    return bool(COURSE_CELLS) and "".join(linecache.getlines(filename)).strip() not in COURSE_CELLS


def _code(line: str) -> str:
    """A source line as a verdict quotes it: its trailing comment and the padding before it dropped."""
    import io
    import tokenize

    try:
        for t in tokenize.generate_tokens(io.StringIO(line).readline):
            if t.type == tokenize.COMMENT:
                return line[:t.start[1]].strip()
    except (tokenize.TokenError, SyntaxError):   # an unfinished statement: the comment, if any, came first
        pass
    return line.strip()


def _line(name: str, lineno: int) -> str:
    """``line N of your cell: <source>`` (``of <file>.py`` outside a cell)."""
    place = "your cell" if _is_cell(name) else os.path.basename(name)
    src = _code(linecache.getline(name, lineno))
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
        return f" (raised in {what} of a cell of the course, not in a cell of yours)", False
    return f" (raised in {what} of a cell of the course, called from {_line(*caller)})", True


def _raised(err: Exception) -> str:
    """"wrong: your code raised <Type>: <message> (line N of your cell: <source>)", on one line;
    "wrong: checking your answer raised ..." when no frame on the way is the learner's."""
    msg = " ".join(str(err).split())
    msg = msg if len(msg) <= MAX_MESSAGE else msg[:MAX_MESSAGE - 3] + "..."
    located, yours = _where(err)
    who = "your code" if yours else "checking your answer"
    return f"wrong: {who} raised {type(err).__name__}{': ' + msg if msg else ''}{located}"


class TooLong(Exception):
    """Raised into a check that runs past :data:`TIME_LIMIT_S`."""


@contextlib.contextmanager
def _time_limit(seconds: float):
    """Raise :class:`TooLong` in this (the main) thread after ``seconds``; elsewhere (Windows, a thread) no limit."""
    if not hasattr(signal, "setitimer"):
        yield
        return
    def expire(signum, frame):
        raise TooLong
    try:
        old = signal.signal(signal.SIGALRM, expire)
    except ValueError:   # not the main thread
        yield
        return
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _returned_none() -> str | None:
    """"your function `f` returned None (no `return` in it)" when an ``@exercise`` function of this check
    returned None and has no ``return <value>``; else None."""
    for name, none, valued in CALLS:
        if none and not valued:
            return f"your function `{name}` returned None: it has no `return <value>` (a missing return?)"
    return None


def check(title: str, test) -> str:
    """Run ``test()`` and print one verdict, never a traceback:

    - a stub raising NotImplementedError (or returning ``...``): "not attempted yet";
    - a failed ``assert cond, reason``: "wrong, because <reason>";
    - any other exception (a ZeroDivisionError, an IndexError, a shape mismatch in ``@``...):
      "wrong: your code raised <Type>: <message> (line N of your cell: <source>)", the line being
      the innermost frame of the learner's own code (the cell of an ``@exercise`` stub), so the
      learner looks there and not here; raised in a function of another cell (a course helper),
      "(raised in `<function>` of a cell of the course, called from line N of your cell:
      <source>)"; with no learner frame on the way, "wrong: checking your answer raised ...";
      when the learner's ``@exercise`` function returned None and holds no ``return <value>``, the verdict
      says so instead ("wrong: your function `f` returned None ...");
    - an answer still running after :data:`TIME_LIMIT_S` seconds, or interrupted (Kernel > Interrupt):
      "wrong: your code ran past N s ..." / "stopped: you interrupted the check ...", with the line it was on;
    - else "correct".

    A line is "your cell" when it is in the cell of an ``@exercise`` stub, or in any cell the learner wrote
    or changed (its code is none of the chapter's cells); a function of an unchanged cell is the course's.

    With ``COURSE_ANSWERS=1`` (CI) any verdict but "correct" raises AssertionError chained to the
    original exception, so a broken reference answer fails the build with its traceback."""
    err = None
    CALLS.clear()
    try:
        with _time_limit(TIME_LIMIT_S):
            out = test()
        status = NOT_ATTEMPTED if out is Ellipsis else CORRECT
    except NotImplementedError as e:
        status, err = NOT_ATTEMPTED, e
    except (TooLong, KeyboardInterrupt) as e:
        located, _ = _where(e)
        status, err = ((f"wrong: your code ran past {TIME_LIMIT_S} s (an endless loop?){located}" if isinstance(e, TooLong)
                        else f"stopped: you interrupted the check{located}"), e)
    except AssertionError as e:
        none = _returned_none()
        status, err = (f"wrong: {none}" if none else f"wrong, because {e}" if str(e) else "wrong (the check's assertion failed)"), e
    except Exception as e:  # noqa: BLE001 -- every error in a learner's answer is a verdict
        none = _returned_none()
        status, err = (f"wrong: {none}" if none else _raised(e)), e
    print(f"{title}: {status}")
    if answers_on() and status != CORRECT:
        raise AssertionError(f"{title}: the reference answer is {status}") from err
    return Verdict(status)
