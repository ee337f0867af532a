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


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_course_shape(path):
    nb = jupytext.read(path)
    cells = nb.cells
    assert 20 <= len(cells) <= 60, f"{len(cells)} cells"
    src = "\n".join(c.source for c in cells)
    assert "FAST" in src, "a parameter cell with a FAST default"
    assert "!pip" not in src and "%pip" not in src
    for prev, cell in zip(cells, cells[1:]):
        if cell.cell_type == "code":
            assert prev.cell_type == "markdown", f"code cell without a markdown cell before it:\n{cell.source[:200]}"
    assert "import refimpl" in src or "from refimpl" in src
