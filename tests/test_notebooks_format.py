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


def test_a_check_cell_needs_no_markdown_only_after_its_stub():
    from nbformat.v4 import new_code_cell, new_markdown_cell

    stub = new_code_cell('@exercise("01", "f")\ndef f():\n    raise NotImplementedError')
    check = new_code_cell('check("Exercise 1", f)')
    assert is_check_after_stub(stub, check)
    assert not is_check_after_stub(new_code_cell("x = 1"), check)
    assert not is_check_after_stub(new_markdown_cell("The check:"), check)
    assert not is_check_after_stub(stub, new_code_cell("y = 2"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_course_shape(path):
    nb = jupytext.read(path)
    cells = nb.cells
    # an exercise's check sits in its own cell right after the stub (tests/test_exercises.py): the
    # markdown before the stub states both, and the split adds no content to the chapter's length
    checks = sum(is_check_after_stub(prev, cell) for prev, cell in zip(cells, cells[1:]))
    assert 20 <= len(cells) - checks <= 60, f"{len(cells)} cells ({checks} exercise checks after their stubs)"
    src = "\n".join(c.source for c in cells)
    assert "FAST" in src, "a parameter cell with a FAST default"
    assert "!pip" not in src and "%pip" not in src
    for prev, cell in zip(cells, cells[1:]):
        if cell.cell_type == "code" and not is_check_after_stub(prev, cell):
            assert prev.cell_type == "markdown", f"code cell without a markdown cell before it:\n{cell.source[:200]}"
    assert "import refimpl" in src or "from refimpl" in src
