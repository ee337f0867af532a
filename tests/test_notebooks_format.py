"""Every notebook is paired with a jupytext .py file, in sync, stripped of outputs, and well formed."""
import glob
import json
import os

import jupytext
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "[0-9][0-9]*_*.ipynb")))


def _cells(nb):
    return [(c.cell_type, c.source.strip()) for c in nb.cells if c.source.strip()]


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 2


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_paired_in_sync_and_stripped(path):
    py = path[:-6] + ".py"
    assert os.path.exists(py), f"{py} missing: pair it with `jupytext --set-formats ipynb,py:percent`"
    raw = json.load(open(path))
    for c in raw["cells"]:
        if c["cell_type"] == "code":
            assert not c.get("outputs"), f"{path} carries outputs: strip them"
            assert c.get("execution_count") is None, f"{path} carries execution counts"
    assert _cells(jupytext.read(path)) == _cells(jupytext.read(py)), f"{path} and {py} differ: run make notebooks"


def is_check_after_stub(prev, cell) -> bool:
    """``cell`` is an exercise's check (it calls ``check(``) and ``prev`` is the exercise's stub."""
    return (prev.cell_type == cell.cell_type == "code" and "@exercise(" in prev.source
            and "check(" in cell.source and "@exercise(" not in cell.source)


def is_ci_only(cell) -> bool:
    """A code cell only CI needs: tagged ``ci-only`` and collapsed in the lab (source hidden)."""
    return (cell.cell_type == "code" and "ci-only" in cell.metadata.get("tags", [])
            and cell.metadata.get("jupyter", {}).get("source_hidden") is True)


def moved_controls(src: str) -> list:
    """``ui.children[i]`` for each assignment ``ui.children[i].value = ...`` that the cell itself runs (at
    any depth of its loops; not in a function it defines: an observer moves controls for the learner)."""
    import ast

    try:
        tree = ast.parse(src)
    except SyntaxError:   # a cell with IPython magics: none of these
        return []
    found = []

    def walk(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                continue
            if isinstance(child, ast.Assign):
                for t in child.targets:
                    text = ast.unparse(t)
                    if text.startswith("ui.children[") and text.endswith("].value"):
                        found.append((child.lineno, text[: -len(".value")]))
            walk(child)
    walk(tree)
    return [control for _, control in sorted(found)]


def widget_self_test_problems(nb) -> list:
    """A cell that moves a widget's control from code (``ui.children[i].value = ...``, at any indent) must
    be a CI-only cell, collapsed in the lab, that puts every control it moved back to the value it found
    (``NAME = ui.children[i].value`` before, ``ui.children[i].value = NAME`` among its last lines, the
    last moved back first), so a learner meets the widget at its teaching defaults; and prints nothing."""
    import re

    problems = []
    for cell in nb.cells:
        moved = moved_controls(cell.source) if cell.cell_type == "code" else []
        if not moved:
            continue
        head = cell.source.splitlines()[0][:60]
        if not is_ci_only(cell):
            problems.append(f"a widget self-test in the learner's view (tag it ci-only, source hidden): {head}")
        controls = list(dict.fromkeys(moved))                      # in the order first moved
        saved = {c: re.findall(rf"^(\w+) = {re.escape(c)}\.value$", cell.source, re.M) for c in controls}
        tail = cell.source.rstrip().splitlines()[-len(controls):]
        wanted = [f"{c}.value = {saved[c][0]}" for c in reversed(controls) if saved[c]]
        if len(wanted) != len(controls) or tail != wanted:
            problems.append(f"a widget self-test that does not restore its control at the end: {head}")
        if "print(" in cell.source:
            problems.append(f"a widget self-test that prints (its output shows under a collapsed cell): {head}")
    return problems


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_widget_self_tests_are_hidden_and_leave_the_teaching_defaults(path):
    assert widget_self_test_problems(jupytext.read(path)) == []


def test_the_widget_self_test_rule_can_fail():
    from nbformat.v4 import new_code_cell, new_notebook

    good = new_code_cell("default = ui.children[1].value\nbefore = shown\nui.children[1].value = 0.0\n"
                         "assert shown != before\nui.children[1].value = default",
                         metadata={"tags": ["ci-only"], "jupyter": {"source_hidden": True}})
    visible = new_code_cell(good.source)
    unrestored = new_code_cell("before = shown\nui.children[1].value = 0.0\nassert shown != before",
                               metadata=good.metadata)
    assert widget_self_test_problems(new_notebook(cells=[good])) == []
    assert len(widget_self_test_problems(new_notebook(cells=[visible]))) == 1
    assert "restore" in widget_self_test_problems(new_notebook(cells=[unrestored]))[0]
    two = new_code_cell("default = ui.children[0].value\nui.children[0].value = 'b'\nslid = ui.children[1].value\n"
                        "for c in (0.0, 1.0):\n    ui.children[1].value = c\nui.children[1].value = slid\n"
                        "ui.children[0].value = default", metadata=good.metadata)
    assert widget_self_test_problems(new_notebook(cells=[two])) == []
    one_left = new_code_cell(two.source.rsplit("\n", 1)[0], metadata=good.metadata)   # the first control stays moved
    assert "restore" in widget_self_test_problems(new_notebook(cells=[one_left]))[0]


def test_a_check_cell_needs_no_markdown_only_after_its_stub():
    from nbformat.v4 import new_code_cell, new_markdown_cell

    stub = new_code_cell('@exercise("01", "f")\ndef f():\n    raise NotImplementedError')
    check = new_code_cell('check("Exercise 1", f)')
    assert is_check_after_stub(stub, check)
    assert not is_check_after_stub(new_code_cell("x = 1"), check)
    assert not is_check_after_stub(new_markdown_cell("The check:"), check)
    assert not is_check_after_stub(stub, new_code_cell("y = 2"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_sliders_send_their_value_on_release(path):
    """Every slider redraws when released (``continuous_update=False``): a picture that takes a second to
    draw never trails a slider dragged across it, its readout and its picture showing different values."""
    import re

    src = open(path[:-6] + ".py").read()
    calls = re.findall(r"widgets\.\w*Slider\(([^)]*)", src)
    assert all("continuous_update=False" in c for c in calls), [c[:60] for c in calls if "continuous_update" not in c]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_course_shape(path):
    nb = jupytext.read(path)
    cells = nb.cells
    # an exercise's check sits in its own cell right after the stub (tests/test_exercises.py): the
    # markdown before the stub states both, and the split adds no content to the chapter's length
    # CI-only cells (a widget's self-test, collapsed in the lab) are not part of the lesson either
    checks = sum(is_check_after_stub(prev, cell) or is_ci_only(cell) for prev, cell in zip(cells, cells[1:]))
    assert 20 <= len(cells) - checks <= 60, f"{len(cells)} cells ({checks} exercise checks and CI-only cells)"
    src = "\n".join(c.source for c in cells)
    assert "FAST" in src, "a parameter cell with a FAST default"
    assert "!pip" not in src and "%pip" not in src
    for prev, cell in zip(cells, cells[1:]):
        if cell.cell_type == "code" and not is_check_after_stub(prev, cell) and not is_ci_only(cell):
            assert prev.cell_type == "markdown", f"code cell without a markdown cell before it:\n{cell.source[:200]}"
    assert "import refimpl" in src or "from refimpl" in src
