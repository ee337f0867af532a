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
