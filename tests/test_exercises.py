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
    mine = solutions.exercise("07", "jacobi_update")(stub)
    assert mine is stub or mine.__wrapped__ is stub   # the learner's own function (watched for a missing return)
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


# ---------------------------------------------------------------------------------------
# the checks themselves, run on wrong answers a learner writes: each must be judged wrong, and the
# reference answer right (the negative control of each)
# ---------------------------------------------------------------------------------------
NOTEBOOKS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "notebooks")


def notebook_function(notebook: str, name: str, namespace: dict):
    """The top-level function ``name`` of ``notebooks/<notebook>``, compiled alone (its own line
    numbers) into ``namespace``, which supplies what it reads from the chapter's other cells."""
    path = os.path.join(NOTEBOOKS_DIR, notebook)
    tree = ast.parse(open(path).read())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), namespace)
    return namespace[name]


def verdict(monkeypatch, check_fn) -> str:
    monkeypatch.delenv("COURSE_ANSWERS", raising=False)
    return solutions.check("Exercise", check_fn)


def _factor_select_unbounded(conf, f):
    """WRONG: the while loop has no length bound (IndexError once every position passes the rule)."""
    import torch

    order = torch.sort(conf, descending=True).indices
    n = 0
    while torch.isfinite(conf[order[n]]) and (n + 2) * (1 - conf[order[n]]) < f:
        n += 1
    sel = torch.zeros_like(conf, dtype=torch.bool)
    sel[order[:max(n, 1)]] = True
    return sel


def _factor_select_always_one(conf, f):
    """WRONG: commits at least one position even when nothing is masked (every conf is -inf)."""
    import torch

    order = torch.sort(conf, descending=True).indices
    n = 0
    while n < len(conf) and torch.isfinite(conf[order[n]]) and (n + 2) * (1 - conf[order[n]]) < f:
        n += 1
    sel = torch.zeros_like(conf, dtype=torch.bool)
    sel[order[:max(n, 1)]] = True
    return sel


def test_chapter_12_factor_select_check_catches_an_unbounded_loop_and_a_commit_of_nothing_masked(monkeypatch):
    import torch

    from refimpl import diffusion

    ns = {"torch": torch, "DEVICE": torch.device("cpu"), "diffusion": diffusion}
    check_fn = notebook_function("12_parallel_decoding.py", "check_factor_select", ns)
    ns["factor_select"] = solutions.reference("12", "factor_select")
    assert verdict(monkeypatch, check_fn) == solutions.CORRECT
    ns["factor_select"] = _factor_select_unbounded
    got = verdict(monkeypatch, check_fn)
    assert got.startswith("wrong: your code raised IndexError"), got
    ns["factor_select"] = _factor_select_always_one
    got = verdict(monkeypatch, check_fn)
    assert got.startswith("wrong, because nothing is masked"), got


def reveals(text: str, *answers) -> bool:
    """Does ``text`` print one of ``answers`` (a number, as a whole word or formatted to 2-3 decimals)?"""
    import re

    for a in answers:
        forms = {str(a)} if isinstance(a, int) else {f"{a:.2f}", f"{a:.3f}"}
        if any(re.search(rf"(?<![\d.]){re.escape(f)}(?![\d])", text) for f in forms):
            return True
    return False


def test_the_reveal_detector_flags_a_verdict_that_prints_the_answer():
    assert reveals("gamma = 5 gives 1.961x; gamma = 4 gives 1.981x", 4)
    assert reveals("gamma = 5 gives 1.961x; gamma = 4 gives 1.981x", 1.9807)
    assert not reveals("gamma = 5 is not the best at alpha = 0.7, c = 0.1", 4, 1.9807)


@pytest.mark.parametrize("notebook, check_name, value_name", [
    ("00_setup_and_cost_of_a_forward_pass.py", "check_best_gamma", "MY_BEST_GAMMA"),
    ("03_speculative_sampling.py", "check_tau", "MY_GAMMA"),
])
def test_a_wrong_prediction_is_told_wrong_without_the_right_answer(monkeypatch, notebook, check_name, value_name):
    """A prediction exercise's verdict says what is wrong, never the answer (nor its value), and a
    value of the wrong type gets a verdict naming the variable, not a traceback through course code."""
    from refimpl import speculative

    def expected_speedup(alpha, gamma, c):
        return speculative.expected_tau(alpha, gamma) / (gamma * c + 1)

    ns = {"expected_speedup": expected_speedup, "answers_on": solutions.answers_on, "speculative": speculative,
          "tau_formula": speculative.expected_tau}
    check_fn = notebook_function(notebook, check_name, ns)
    if value_name == "MY_BEST_GAMMA":
        best = max(range(1, 11), key=lambda g: expected_speedup(0.7, g, 0.1))
        answers = (best, expected_speedup(0.7, best, 0.1))
    else:
        best = next(g for g in range(1, 100) if speculative.expected_tau(0.8, g) >= 0.9 / (1 - 0.8))
        answers = (best, speculative.expected_tau(0.8, best))
    ns[value_name] = best
    assert verdict(monkeypatch, check_fn) == solutions.CORRECT
    for guess in [g for g in range(1, 12) if g != best]:
        ns[value_name] = guess
        got = verdict(monkeypatch, check_fn)
        assert got.startswith("wrong, because ") and not reveals(got, *answers), got
    ns[value_name] = "5"
    got = verdict(monkeypatch, check_fn)
    assert got.startswith(f"wrong, because {value_name} must be an int"), got


def test_chapter_14_mask_check_names_the_wrong_part_of_the_mask(monkeypatch):
    """A mask that lets the pending tokens see the block: the verdict names the row and column by
    part (pending token / block slot), not only a logits distance. The reference is judged right."""
    import torch

    from refimpl import block_diffusion as bd
    from refimpl import models, speculative

    bdlm = models.load("tiny-bdlm", device="cpu")
    ns = {"torch": torch, "DEVICE": torch.device("cpu"), "bdlm": bdlm, "MASK": bdlm.mask_token_id,
          "speculative": speculative, "bd": bd}
    for name in ("part", "block_step_run"):
        notebook_function("14_beyond_dllm_drafts_and_lossless_decoding.py", name, ns)
    check_fn = notebook_function("14_beyond_dllm_drafts_and_lossless_decoding.py", "check_decode_allow", ns)
    right = solutions.reference("14", "decode_allow")
    ns["decode_allow"] = right
    assert verdict(monkeypatch, check_fn) == solutions.CORRECT

    def sees_the_block(n_cache, n_pending, b):          # WRONG: every row sees everything
        return torch.ones(n_pending + b, n_cache + n_pending + b, dtype=torch.bool)
    ns["decode_allow"] = sees_the_block
    got = verdict(monkeypatch, check_fn)
    assert got.startswith("wrong, because cache 5, pending ") and "(pending token 0) / column " in got, got
    assert "you say True, block_step's mask says False" in got and "logits differ" not in got, got

    def blind_to_the_cache(n_cache, n_pending, b):      # WRONG: the block does not see the cache
        a = right(n_cache, n_pending, b).clone()
        a[n_pending:, :n_cache] = False
        return a
    ns["decode_allow"] = blind_to_the_cache
    got = verdict(monkeypatch, check_fn)
    assert "(block slot 0) / column 0 (cached token 0): you say False" in got, got


def test_chapter_06a_head_check_hints_at_the_missing_residual(monkeypatch):
    """The no-residual form SiLU(W h + b) @ lm_head gets a verdict that names the missing residual;
    the reference is judged right and an unrelated wrong answer gets no (misleading) hint."""
    import torch

    from refimpl import medusa

    g = torch.Generator().manual_seed(0)
    H, V, L, K = 16, 40, 5, 2
    ns = {"torch": torch, "DEVICE": torch.device("cpu"), "SEED": 0, "medusa": medusa, "K": K,
          "W": torch.randn(V, H, generator=g), "hid": torch.randn(1, L, H, generator=g)}
    check_fn = notebook_function("06a_medusa_and_eagle.py", "check_head", ns)
    ns["head_logits"] = solutions.reference("06a", "head_logits")
    with torch.no_grad():
        assert verdict(monkeypatch, check_fn) == solutions.CORRECT
        ns["head_logits"] = lambda w, b, lm_head, h: torch.nn.functional.silu(h @ w.T + b) @ lm_head.T
        got = verdict(monkeypatch, check_fn)
        assert got.startswith("wrong, because head 1: logits differ by ") and "the residual is missing" in got, got
        ns["head_logits"] = lambda w, b, lm_head, h: 2 * (h @ lm_head.T)
        got = verdict(monkeypatch, check_fn)
        assert got.startswith("wrong, because head 1: logits differ by ") and "missing" not in got, got
