"""``solutions.check`` turns every error in a learner's answer into one line naming the learner's own
line, never a traceback through the course's plumbing (notebooks/solutions/__init__.py)."""
import functools
import linecache
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "notebooks"))

import solutions  # noqa: E402

# a notebook cell as ipykernel >= 6 compiles it: a pseudo-file in /tmp/ipykernel_<pid>/ whose
# source IPython registers in linecache, so tracebacks (and check) can quote its lines
CELL = "/tmp/ipykernel_4242/2718281828.py"
CELL_SOURCE = """\
def mean_gap(xs):
    total = sum(xs)
    return total / (len(xs) - len(xs))

def last_token(ids):
    return ids[len(ids)]

def project(h, w):
    return h @ w

def add_prefix(n):
    return "tok" + n


@exercise("00", "count_params")
def count_params(cfg):
    raise NotImplementedError
"""
# a course cell of the same notebook: a helper the exercise calls (chapter 03's inverse_cdf), and a
# check whose own code raises on a bad answer (chapter 00's prediction, a str where an int belongs)
COURSE_CELL = "/tmp/ipykernel_4242/3141592653.py"
COURSE_SOURCE = """\
def inverse_cdf(w, u):
    hit = [i for i, x in enumerate(w) if x > u]
    return hit[0]

def expected_tau(alpha, gamma):
    return gamma + 1 if alpha == 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)

def check_guess(guess):
    return expected_tau(0.7, guess)
"""


@pytest.fixture()
def cell(monkeypatch):
    monkeypatch.delenv("COURSE_ANSWERS", raising=False)
    linecache.cache[CELL] = (len(CELL_SOURCE), None, CELL_SOURCE.splitlines(True), CELL)
    ns = {"exercise": solutions.exercise}
    exec(compile(CELL_SOURCE, CELL, "exec"), ns)     # its @exercise stub makes it the learner's cell
    yield ns
    linecache.cache.pop(CELL, None)
    solutions.EXERCISE_FILES.discard(CELL)


def course_cell(src=COURSE_SOURCE, name=COURSE_CELL, ns=None):
    """Run ``src`` as a cell of the course (its code one of the chapter's cells); -> its namespace."""
    solutions.COURSE_CELLS.add(src.strip())
    linecache.cache[name] = (len(src), None, src.splitlines(True), name)
    ns = {} if ns is None else ns
    exec(compile(src, name, "exec"), ns)
    return ns


@pytest.mark.parametrize("call, kind, line", [
    (lambda ns: ns["mean_gap"]([1, 2]), "ZeroDivisionError: division by zero", "line 3 of your cell: "
     "return total / (len(xs) - len(xs))"),
    (lambda ns: ns["last_token"]([5, 6, 7]), "IndexError: list index out of range",
     "line 6 of your cell: return ids[len(ids)]"),
    (lambda ns: ns["project"](torch.ones(2, 3), torch.ones(4, 5)), "RuntimeError: mat1 and mat2 shapes",
     "line 9 of your cell: return h @ w"),
    (lambda ns: ns["add_prefix"](3), "TypeError: can only concatenate str", "line 12 of your cell: "
     'return "tok" + n'),
], ids=["zero-division", "index", "shape-mismatch", "type"])
def test_an_error_in_the_learners_cell_is_a_verdict_naming_its_line(cell, capsys, call, kind, line):
    status = solutions.check("Exercise 1", lambda: call(cell))
    assert status.startswith("wrong: your code raised " + kind), status
    assert status.endswith(f"({line})"), status
    out = capsys.readouterr()
    assert out.out == f"Exercise 1: {status}\n" and out.err == ""
    assert "Traceback" not in out.out and "solutions" not in status


def test_the_line_is_the_learners_even_when_the_error_surfaces_in_a_library(cell, capsys):
    """The innermost frame is inside torch (site-packages); the verdict names the learner's call."""
    src = "def probs(logits):\n    return torch.softmax(logits, dim=3)\n"
    linecache.cache[CELL] = (len(src), None, src.splitlines(True), CELL)
    ns = {"torch": torch}
    exec(compile(src, CELL, "exec"), ns)
    status = solutions.check("Exercise 2", lambda: ns["probs"](torch.zeros(2, 4)))
    assert status.startswith("wrong: your code raised IndexError: Dimension out of range"), status
    assert status.endswith("(line 2 of your cell: return torch.softmax(logits, dim=3))"), status


def test_a_learners_file_outside_a_cell_is_named_by_its_basename(monkeypatch):
    monkeypatch.delenv("COURSE_ANSWERS", raising=False)

    def broken():
        return {}["missing"]
    status = solutions.check("Exercise 3", broken)
    assert status.startswith("wrong: your code raised KeyError: 'missing' (line "), status
    assert status.endswith("of test_check.py: return {}[\"missing\"])"), status


def test_long_messages_are_cut_and_kept_on_one_line(monkeypatch):
    monkeypatch.delenv("COURSE_ANSWERS", raising=False)

    def noisy():
        raise ValueError("first line\n" + "x" * 1000)
    status = solutions.check("Exercise 4", noisy)
    assert "\n" not in status and status.startswith("wrong: your code raised ValueError: first line x")
    assert "x" * (solutions.MAX_MESSAGE - 20) in status and "x" * (solutions.MAX_MESSAGE + 1) not in status


def test_asserts_and_stubs_keep_their_verdicts(cell):
    def wrong():
        raise AssertionError("the residual must sum to 1")
    assert solutions.check("a", wrong) == "wrong, because the residual must sum to 1"

    def stub():
        raise NotImplementedError
    assert solutions.check("b", stub) == solutions.NOT_ATTEMPTED
    assert solutions.check("c", lambda: ...) == solutions.NOT_ATTEMPTED
    assert solutions.check("d", lambda: 1) == solutions.CORRECT


def test_in_ci_mode_an_error_still_fails_with_the_original_chained(cell, monkeypatch):
    """COURSE_ANSWERS=1: a reference answer that raises must fail the build, traceback kept."""
    monkeypatch.setenv("COURSE_ANSWERS", "1")
    with pytest.raises(AssertionError, match="reference answer is wrong: your code raised ZeroDivision") as e:
        solutions.check("Exercise 1", lambda: cell["mean_gap"]([1]))
    assert isinstance(e.value.__cause__, ZeroDivisionError)
    assert solutions.check("Exercise 2", lambda: 1) == solutions.CORRECT


def test_errors_inside_the_course_plumbing_are_not_the_learners_line(monkeypatch):
    """Frames in notebooks/solutions and the standard library are never quoted as the learner's."""
    monkeypatch.delenv("COURSE_ANSWERS", raising=False)

    def ask_for_a_missing_answer():
        return solutions.reference("99", "no_such_answer")
    status = solutions.check("x", ask_for_a_missing_answer)
    assert status.startswith("wrong: your code raised ModuleNotFoundError: No module named 'solutions.ch99'")
    assert status.endswith('of test_check.py: return solutions.reference("99", "no_such_answer"))'), status


def test_the_verdict_is_a_str_that_jupyter_does_not_echo_twice(cell):
    status = solutions.check("Exercise 1", lambda: 1)
    assert isinstance(status, str) and status == solutions.CORRECT
    assert status._ipython_display_() is None   # IPython calls this instead of showing Out[n]


def test_the_chapters_drawing_helpers_are_plumbing_too(monkeypatch):
    monkeypatch.delenv("COURSE_ANSWERS", raising=False)
    import figures

    def draw_nothing():
        return figures.draw_tree(None, None, None)
    status = solutions.check("Exercise 5", draw_nothing)
    assert status.startswith("wrong: your code raised "), status
    assert "figures.py" not in status and status.endswith("of test_check.py: return figures.draw_tree(None, None, None))")


def test_an_error_in_a_course_helper_is_not_called_your_cell(cell):
    """The learner's stub calls a helper of another cell (chapter 03's ``inverse_cdf``), which raises:
    the verdict names the helper as another cell's and quotes the learner's line that called it.
    Negative control: the same helper defined in the exercise's own cell is quoted as "your cell"."""
    course = course_cell()
    src = "def my_one_position(p, u):\n    return inverse_cdf(p, u)\n"
    mine = "/tmp/ipykernel_4242/1618033988.py"
    linecache.cache[mine] = (len(src), None, src.splitlines(True), mine)
    ns = {"inverse_cdf": course["inverse_cdf"]}
    exec(compile(src, mine, "exec"), ns)
    solutions.EXERCISE_FILES.add(mine)
    try:
        status = solutions.check("Exercise 1", lambda: ns["my_one_position"]([0.1, 0.2], 0.5))
    finally:
        solutions.EXERCISE_FILES.discard(mine)
    assert status == ("wrong: your code raised IndexError: list index out of range (raised in `inverse_cdf` of "
                      "a cell of the course, called from line 2 of your cell: return inverse_cdf(p, u))"), status
    assert "hit[0]" not in status
    # the negative control: the helper in the exercise's cell is the learner's own line
    both = COURSE_SOURCE + "\n@exercise('03', 'my_one_position')\ndef my_one_position(p, u):\n    return inverse_cdf(p, u)\n"
    ns = course_cell(both, mine, {"exercise": solutions.exercise})
    try:
        status = solutions.check("Exercise 1", lambda: ns["inverse_cdf"]([0.1, 0.2], 0.5))
    finally:
        solutions.EXERCISE_FILES.discard(mine)
    assert status.endswith("(line 3 of your cell: return hit[0])"), status


def test_a_check_that_raises_on_a_value_answer_blames_no_cell_of_the_learner(cell):
    """A value exercise (chapter 00's ``MY_BEST_GAMMA``) has no stub: when the check's own code raises
    on the answer, no line of a course cell is called "your cell", nor the error "your code"."""
    course = course_cell()
    status = solutions.check("Exercise 3", functools.partial(course["check_guess"], "5"))   # no frame here
    assert status.startswith("wrong: checking your answer raised TypeError: "), status
    assert status.endswith("(raised in `expected_tau` of a cell of the course, not in a cell of yours)"), status
    assert "your cell" not in status and "gamma + 1" not in status


def learner_cell(src, name="/tmp/ipykernel_4242/1414213562.py", ns=None):
    """Run ``src`` as a cell the learner wrote (its code none of the chapter's); -> its namespace."""
    linecache.cache[name] = (len(src), None, src.splitlines(True), name)
    ns = {"exercise": solutions.exercise} if ns is None else ns
    exec(compile(src, name, "exec"), ns)
    return ns


def test_a_function_with_no_return_is_told_so(cell):
    """The learner forgot ``return``: the check trips over None; the verdict says the function returned None
    (negative control: a function that returns its value but a wrong one keeps the check's own verdict)."""
    ns = learner_cell("@exercise('00', 'scale')\ndef scale(x):\n    y = x * 2\n")
    status = solutions.check("Exercise 1", lambda: ns["scale"](torch.ones(2)).dtype)
    assert status == "wrong: your function `scale` returned None: it has no `return <value>` (a missing return?)", status
    ns = learner_cell("@exercise('00', 'scale')\ndef scale(x):\n    return x * 3\n")

    def twice():
        assert torch.equal(ns["scale"](torch.ones(2)), torch.full((2,), 2.0)), "scale must double"
    assert solutions.check("Exercise 1", twice).startswith("wrong, because scale must double")  # (pytest adds its own lines)


def test_a_helper_the_learner_wrote_in_a_new_cell_is_theirs(cell):
    """A cell the learner added (a helper their answer calls) is "your cell", not the course's; a cell of the
    course, unchanged, stays the course's (test_an_error_in_a_course_helper_is_not_called_your_cell)."""
    course_cell()   # the chapter's cells are known
    helper = learner_cell("def my_helper(w):\n    return w[len(w)]\n", "/tmp/ipykernel_4242/1732050807.py", {})
    status = solutions.check("Exercise 1", lambda: helper["my_helper"]([1, 2]))
    assert status == "wrong: your code raised IndexError: list index out of range (line 2 of your cell: return w[len(w)])", status


def test_an_answer_that_runs_forever_is_stopped_with_a_one_line_verdict(cell, monkeypatch, capsys):
    monkeypatch.setattr(solutions, "TIME_LIMIT_S", 1)
    ns = learner_cell("@exercise('00', 'spin')\ndef spin():\n    while True:\n        pass\n")
    status = solutions.check("Exercise 2", ns["spin"])
    assert status == "wrong: your code ran past 1 s (an endless loop?) (line 3 of your cell: while True:)" or \
        status == "wrong: your code ran past 1 s (an endless loop?) (line 4 of your cell: pass)", status
    assert "Traceback" not in capsys.readouterr().out

    def interrupted():
        raise KeyboardInterrupt
    assert solutions.check("Exercise 2", interrupted).startswith("stopped: you interrupted the check")



def test_the_quoted_line_leaves_out_its_comment(monkeypatch):
    """A learner's line with a comment after padding is quoted as its code alone; a '#' inside a string stays."""
    monkeypatch.delenv("COURSE_ANSWERS", raising=False)
    assert solutions._code('    for path in templatee:          # parents come first\n') == "for path in templatee:"
    assert solutions._code('    return "#" + x   # the tag\n') == 'return "#" + x'
    assert solutions._code("    return x\n") == "return x"

    def broken():
        return {}["missing"]                     # a comment the verdict leaves out
    status = solutions.check("Exercise 5", broken)
    assert status.endswith("of test_check.py: return {}[\"missing\"])"), status
