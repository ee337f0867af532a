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
# every chapter notebook: stubs the learner writes, checks, hidden answers
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


# ---------------------------------------------------------------------------------------
# every exercise: the stub alone in its cell, its check in a later cell (before the next stub), so
# a learner re-runs the check without re-running (and resetting) the stub, and a stub that raises
# while being defined does not hide the check
# ---------------------------------------------------------------------------------------
def code_cells(src: str) -> list:
    """The code cells of a py:percent notebook, in order (markdown cells dropped)."""
    cells, cur = [], None
    for line in src.splitlines():
        if line.startswith("# %%"):
            if cur is not None:
                cells.append("\n".join(cur))
            cur = None if "[markdown]" in line or "[md]" in line else []
        elif cur is not None:
            cur.append(line)
    if cur is not None:
        cells.append("\n".join(cur))
    return cells


def calls_check(cell: str) -> bool:
    """A ``check(...)`` call in the cell (``@exercise`` stubs and ``def check_x`` do not count)."""
    return any(isinstance(n, ast.Call) and getattr(n.func, "id", "") == "check"
               for n in ast.walk(ast.parse(cell)))


def stub_layout_problems(src: str) -> list:
    """One line per exercise whose stub shares a cell with a check, or that no later cell checks
    before the next stub (cells in between may prepare the check)."""
    cells, problems = code_cells(src), []
    stubs = [[name for _, name, _ in decorated_exercises(ast.parse(c))] for c in cells]
    for i, cell in enumerate(cells):
        for name in stubs[i]:
            if calls_check(cell):
                problems.append(f"{name}: the stub and a check(...) call share a cell")
                continue
            later = []
            for j in range(i + 1, len(cells)):
                if stubs[j]:
                    break
                later.append(calls_check(cells[j]))
            if not any(later):
                problems.append(f"{name}: no check(...) call follows before the next stub")
    return problems


@pytest.mark.parametrize("path", NOTEBOOK_PYS, ids=os.path.basename)
def test_every_stub_has_its_own_cell_and_a_check_in_a_later_one(path):
    assert stub_layout_problems(open(path).read()) == [], path


def test_the_layout_check_can_fail():
    stub = '@exercise("01", "f")\ndef f(x):\n    raise NotImplementedError\n'
    together = "# %%\n" + stub + "\n\ncheck('Exercise 1', lambda: f(1))\n"
    apart = "# %%\n" + stub + "\n# %% [markdown]\n# The check:\n\n# %%\ncheck('Exercise 1', lambda: f(1))\n"
    helper = "# %%\n" + stub + "\n# %%\nx = 1\n\n# %%\ncheck('Exercise 1', lambda: f(1))\n"
    unchecked = "# %%\n" + stub + "\n# %%\nx = 1\n\n# %%\n" + stub.replace('"f")\ndef f', '"g")\ndef g') + "\n# %%\ncheck('', g)\n"
    assert stub_layout_problems(together) == ["f: the stub and a check(...) call share a cell"]
    assert stub_layout_problems(apart) == [] and stub_layout_problems(helper) == []
    assert stub_layout_problems(unchecked) == ["f: no check(...) call follows before the next stub"]
