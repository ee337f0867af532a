"""The notebooks' exercise plumbing (notebooks/solutions): the three verdicts, answers only on request."""
import glob
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "notebooks"))

import solutions  # noqa: E402


def stub():
    raise NotImplementedError


def test_three_verdicts(monkeypatch, capsys):
    monkeypatch.delenv("COURSE_ANSWERS", raising=False)
    assert solutions.check("a", stub) == solutions.NOT_ATTEMPTED
    assert solutions.check("b", lambda: ...) == solutions.NOT_ATTEMPTED

    def wrong():  # (a plain raise: pytest rewrites asserts in test files and appends to the message)
        raise AssertionError("1 is not 2")
    assert solutions.check("c", wrong) == "wrong, because 1 is not 2"
    assert solutions.check("d", lambda: 3) == solutions.CORRECT
    assert "c: wrong, because 1 is not 2" in capsys.readouterr().out


def test_answers_replace_stubs_only_when_asked(monkeypatch):
    monkeypatch.delenv("COURSE_ANSWERS", raising=False)
    assert solutions.exercise("07", "jacobi_update")(stub) is stub
    monkeypatch.setenv("COURSE_ANSWERS", "1")
    assert solutions.exercise("07", "jacobi_update")(stub) is solutions.reference("07", "jacobi_update")
    with pytest.raises(AssertionError, match="not attempted"):  # in CI mode an unanswered check fails
        solutions.check("e", stub)


CHAPTERS = sorted(os.path.basename(p)[2:-3] for p in glob.glob(os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "notebooks", "solutions", "ch*.py")))


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_chapter_has_reference_answers(chapter):
    import importlib

    mod = importlib.import_module(f"solutions.ch{chapter}")
    names = [n for n in dir(mod) if not n.startswith("_") and callable(getattr(mod, n))
             and getattr(getattr(mod, n), "__module__", "") == mod.__name__]
    assert len(names) >= 2, f"chapter {chapter} needs at least two exercises, has {names}"


# ---------------------------------------------------------------------------------------
# every chapter notebook: stubs the learner writes, checks, hidden answers (COURSE.md §8)
# ---------------------------------------------------------------------------------------
import ast  # noqa: E402

NOTEBOOK_PYS = sorted(glob.glob(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                             "notebooks", "[0-9][0-9]*_*.py")))
#: appendix notebooks (no chapter of their own) may have fewer exercises
APPENDIX = "appendix"


def decorated_exercises(tree):
    """[(chapter, name, FunctionDef)] of every ``@exercise("NN", "name")`` stub in a notebook."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for d in node.decorator_list:
                if isinstance(d, ast.Call) and getattr(d.func, "id", "") == "exercise":
                    out.append((d.args[0].value, d.args[1].value, node))
    return out


def is_stub(fn) -> bool:
    """The body holds ``raise NotImplementedError`` or a bare ``...``: something is left to write."""
    for node in ast.walk(fn):
        if isinstance(node, ast.Raise) and "NotImplementedError" in ast.unparse(node):
            return True
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and node.value.value is Ellipsis:
            return True
    return False


@pytest.mark.parametrize("path", NOTEBOOK_PYS, ids=os.path.basename)
def test_notebook_exercises_are_stubs_with_checks_and_hidden_answers(path):
    import importlib

    src = open(path).read()
    tree = ast.parse(src)
    chapter = os.path.basename(path).split("_")[0]
    found = decorated_exercises(tree)
    need = 1 if APPENDIX in os.path.basename(path) else 2
    assert len(found) >= need, f"{path}: {len(found)} exercises (@exercise stubs), need >= {need}"
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "check"]
    assert len(calls) >= len(found), f"{path}: {len(found)} exercises but {len(calls)} check(...) calls"
    assert "SHOW_SOLUTIONS" in src, f"{path}: answers are shown only on request (a SHOW_SOLUTIONS switch)"
    assert "interact" in src or "widgets." in src, f"{path}: at least one widget (ipywidgets)"
    assert "plt." in src or "figures." in src, f"{path}: at least one picture of the mechanism (matplotlib)"
    for ch, name, fn in found:
        assert ch == chapter, f"{path}: @exercise({ch!r}, {name!r}) names another chapter than {chapter!r}"
        assert is_stub(fn), f"{path}: the stub {fn.name} holds code, not a NotImplementedError / ... to fill in"
        ref = getattr(importlib.import_module(f"solutions.ch{ch}"), name, None)
        assert callable(ref), f"{path}: no reference answer {name} in notebooks/solutions/ch{ch}.py"
        assert ast.dump(fn.body[-1]) != ast.dump(ast.parse(inspect_source(ref)).body[0].body[-1]), \
            f"{path}: the stub {fn.name} ends like its reference answer: the answer is not hidden"


def inspect_source(fn) -> str:
    import inspect
    import textwrap

    return textwrap.dedent(inspect.getsource(fn))


def test_the_shape_check_tells_a_stub_from_an_inline_answer():
    stub = ast.parse('@exercise("01", "f")\ndef f(x):\n    ...  # your code\n    raise NotImplementedError\n')
    inline = ast.parse('@exercise("01", "f")\ndef f(x):\n    return x + 1  # reference answer\n')
    assert [(c, n) for c, n, _ in decorated_exercises(stub)] == [("01", "f")]
    assert is_stub(decorated_exercises(stub)[0][2])
    assert not is_stub(decorated_exercises(inline)[0][2])
