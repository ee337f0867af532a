"""The site builder (notebooks/build_site.py, a script) as a module for the tests, and test chapters.

``builder`` is the script loaded once by file name (``notebooks/`` is not a package);
:func:`write_notebook` writes a chapter-shaped notebook (a title, then code cells) for a negative control."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "notebooks" / "build_site.py"


def load_builder():
    if "build_site" in sys.modules:
        return sys.modules["build_site"]
    spec = importlib.util.spec_from_file_location("build_site", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


builder = load_builder()


def write_notebook(folder: Path, name: str, cells: list[str]) -> Path:
    """``folder/name``: a markdown title ("NN · a test chapter") and one code cell per item of ``cells``."""
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(f"# {name[:2]} · a test chapter")]
                                  + [nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / name)
    return folder / name
