"""Hooks for every pytest run in this repository, whatever it collects (tests/, notebooks/): each IPython
kernel the run starts checks that no figure prints text over text (tests/figure_check.py)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "tests"))

from figure_check import pytest_configure, pytest_unconfigure  # noqa: E402,F401
