"""The layering of refimpl (docs/architecture.md), read from the source with ``ast``.

Five layers: 1 core -> 2 chapters -> 3 models -> 4 train -> 5 bench and export. A module imports only from
lower layers and, inside layer 2, from earlier chapters; there are no import cycles, no private
name crosses a module boundary, no module registers itself into another at import time, kernels
never import refimpl, and no file is longer than ~400 lines.
"""
import ast
import glob
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: layer 2 in chapter order: a chapter may import only the ones before it
CHAPTERS = ["autoregressive", "speculative", "tree", "drafts", "copy_prior", "adaptive", "dynamic_tree", "medusa", "eagle", "eagle3",
            "jacobi",
            "lookahead", "retrieval",
            "diffusion_lm", "diffusion_steps", "free_draft", "diffusion", "digit_reversal", "block_diffusion", "dllm_draft",
            "cllm", "dparallel", "learn2pd", "pard", "dflash"]
CORE_FILES = {"refimpl", "refimpl.lm", "refimpl.generation", "refimpl.sampling", "refimpl.data", "refimpl.prompts",
              "refimpl.slot_cache", "refimpl.primitives"}
MAX_LINES = 400
#: the one import that goes up: ``refimpl.generate`` imports the front door (layer 3) at its first
#: call, so that ``import refimpl`` stays the core alone
FRONT_DOOR = ("refimpl", "refimpl.methods")


def module_name(path: str) -> str:
    rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


MODULES = {module_name(p): p for p in glob.glob(os.path.join(ROOT, "refimpl", "**", "*.py"), recursive=True)}


def layer(mod: str) -> tuple[int, int]:
    """(layer, chapter index) of a refimpl module; fails for a module nobody placed."""
    parts = mod.split(".")
    if mod in CORE_FILES:
        return 1, 0
    if parts[1] in ("models", "methods", "train", "bench", "export"):
        return {"models": 3, "methods": 3, "train": 4, "bench": 5, "export": 5}[parts[1]], 0
    assert parts[1] in CHAPTERS, f"{mod}: place it in a layer (tests/test_architecture.py CHAPTERS)"
    return 2, CHAPTERS.index(parts[1])


def imports(mod: str):
    """[(imported module, imported name or None, line)] of every import in ``mod``, lazy ones included."""
    path = MODULES[mod]
    pkg = mod if path.endswith("__init__.py") else mod.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.append((sub, None, node.lineno) if sub in MODULES else (target, a.name, node.lineno))
        elif isinstance(node, ast.Import):
            out.extend((a.name, None, node.lineno) for a in node.names)
    return out


def graph():
    return {m: {t for t, _, _ in imports(m) if t in MODULES and t != m} for m in MODULES}


def test_every_module_has_a_layer():
    for m in MODULES:
        layer(m)


def test_imports_only_go_down():
    bad = []
    for m in MODULES:
        lm = layer(m)
        for t, _, line in imports(m):
            if t not in MODULES or t == m or t == "refimpl" or (m, t) == FRONT_DOOR:
                continue
            lt = layer(t)  # inside layers 1, 3, 4, 5 modules import each other freely (the cycle test guards)
            if lt[0] > lm[0] or (lt[0] == lm[0] == 2 and lt[1] >= lm[1]):
                bad.append(f"{m}:{line} imports {t} (layer {lt} above or beside {lm})")
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    g = graph()
    state: dict = {}

    def visit(m, path):
        state[m] = 1
        for n in g[m]:
            if state.get(n) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(n):] + [n]))
            if n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in g:
        if m not in state:
            visit(m, [m])


def test_no_private_names_across_modules():
    bad = [f"{m}:{line} imports {t}.{name}" for m in MODULES for t, name, line in imports(m)
           if name and name.startswith("_") and not name.startswith("__") and t.startswith("refimpl")]
    for nb in glob.glob(os.path.join(ROOT, "notebooks", "*.py")):
        src = open(nb).read()
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                base = node.value
                if isinstance(base, ast.Name) and base.id in {m.rsplit(".", 1)[-1] for m in MODULES}:
                    bad.append(f"{os.path.basename(nb)}:{node.lineno} uses {base.id}.{node.attr}")
    assert not bad, "\n".join(bad)


def test_nothing_registers_itself_into_another_module():
    """No module-level statement assigns into a name imported from elsewhere (``models.ZOO[x] = ...``)."""
    bad = []
    for m, path in MODULES.items():
        tree = ast.parse(open(path).read())
        imported = {a.asname or a.name.split(".")[0] for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
                    for a in n.names}
        for node in tree.body:
            if isinstance(node, (ast.Assign, ast.AugAssign)):
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                    while isinstance(t, (ast.Subscript, ast.Attribute)):
                        t = t.value
                    if isinstance(t, ast.Name) and t.id in imported:
                        bad.append(f"{m}:{node.lineno} assigns into {t.id}")
            elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and not m.endswith("__main__"):
                bad.append(f"{m}:{node.lineno} calls a function at import time")
    assert not bad, "\n".join(bad)


def test_kernels_never_import_refimpl():
    for path in glob.glob(os.path.join(ROOT, "kernels", "*.py")):
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("refimpl"), path
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("refimpl") for a in node.names), path


@pytest.mark.parametrize("path", sorted(MODULES.values()), ids=lambda p: os.path.relpath(p, ROOT))
def test_files_stay_short(path):
    n = open(path).read().count("\n")
    assert n <= MAX_LINES, f"{n} lines: split it (one algorithm per file)"


def test_no_docstring_cites_a_file_outside_the_repository():
    for path in list(MODULES.values()) + glob.glob(os.path.join(ROOT, "kernels", "*.py")):
        src = open(path).read()
        assert "COURSE.md" not in src and "PAPERS.md" not in src, path


def test_importing_a_chapter_loads_only_the_core():
    code = ("import sys, refimpl.autoregressive; "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('refimpl'))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                            check=True).stdout.split()
    assert loaded and all(m == "refimpl.autoregressive" or layer(m)[0] == 1 for m in loaded), loaded


def test_the_test_can_fail(tmp_path, monkeypatch):
    """Negative control: an upward import, a cycle and a private import are all caught."""
    fake = {"refimpl.lm": tmp_path / "x.py", "refimpl.speculative": tmp_path / "s.py"}
    fake["refimpl.lm"].write_text("from .speculative import _hidden\n")
    fake["refimpl.speculative"].write_text("from . import lm\n")
    monkeypatch.setattr(sys.modules[__name__], "MODULES", {k: str(v) for k, v in fake.items()})
    with pytest.raises(AssertionError, match="imports refimpl.speculative"):
        test_imports_only_go_down()
    with pytest.raises(AssertionError, match="import cycle"):
        test_no_import_cycles()
    with pytest.raises(AssertionError, match="_hidden"):
        test_no_private_names_across_modules()


# -- what a copied algorithm drags with it ----------------------------------------------------------
#: the verification core every drafting method builds on (layer 1 plus chapters 02-05's loop and trees)
VERIFICATION_CORE = {"lm", "generation", "sampling", "slot_cache", "speculative", "tree", "primitives", "data",
                     "prompts"}
#: the one chain each algorithm module extends: the only other algorithm modules it may import
EXTENDS = {"eagle": {"dynamic_tree"}, "eagle3": {"eagle"}, "dllm_draft": {"block_diffusion"},
           "block_diffusion": {"diffusion_steps"}, "free_draft": {"diffusion_steps"},
           "diffusion": {"diffusion_steps", "free_draft"}, "dparallel": {"diffusion_steps"},
           "learn2pd": {"dparallel"}, "digit_reversal": {"diffusion", "diffusion_lm"},
           "drafts": {"autoregressive"}}
#: at most this many project files come with a copied algorithm module (EAGLE-3's chain is the longest)
MAX_DRAGGED = 9


def chain(mod: str) -> set:
    out, todo = set(), list(EXTENDS.get(mod, ()))
    while todo:
        m = todo.pop()
        if m not in out:
            out.add(m)
            todo += EXTENDS.get(m, ())
    return out


def algorithm_problems(modules: dict) -> list[str]:
    """For each layer-2 module of ``modules`` (name -> path): an import of another algorithm module
    outside its chain, or more than ``MAX_DRAGGED`` project files reached (imports anywhere in a file:
    a copy needs the lazy ones too)."""
    def deps(m):
        return {t.split(".")[1] for t, _, _ in imports_in(modules[m], m) if t.startswith("refimpl.")
                and t.split(".")[1] in {n.split(".")[1] for n in modules}} - {m.split(".")[1]}

    bad = []
    for m in modules:
        short = m.split(".")[1] if m.count(".") == 1 else None
        if short is None or short not in CHAPTERS:
            continue
        stray = deps(m) - VERIFICATION_CORE - chain(short)
        if stray:
            bad.append(f"{m} imports {sorted(stray)}: only the verification core and its chain {sorted(chain(short))}")
        seen, todo = set(), [m]
        while todo:
            for d in deps(todo.pop()):
                if f"refimpl.{d}" not in seen:
                    seen.add(f"refimpl.{d}")
                    todo.append(f"refimpl.{d}")
        if len(seen) > MAX_DRAGGED:
            bad.append(f"{m} drags {len(seen)} project files (at most {MAX_DRAGGED}): {sorted(seen)}")
    return bad


def imports_in(path: str, mod: str):
    """:func:`imports` of the module file at ``path`` named ``mod``."""
    saved = MODULES.get(mod)
    MODULES[mod] = path
    try:
        return imports(mod)
    finally:
        if saved is None:
            del MODULES[mod]
        else:
            MODULES[mod] = saved


def test_an_algorithm_imports_only_the_core_and_the_chain_it_extends():
    bad = algorithm_problems({m: p for m, p in MODULES.items() if m.count(".") == 1})
    assert not bad, "\n".join(bad)


def test_the_import_rule_catches_a_stray_import(tmp_path):
    """Negative control: EAGLE-3 importing the copy prior (another chapter's module) is refused."""
    fake = tmp_path / "eagle3.py"
    fake.write_text(open(MODULES["refimpl.eagle3"]).read() + "\nfrom .copy_prior import ContextCopyLM\n")
    modules = {m: p for m, p in MODULES.items() if m.count(".") == 1}
    modules["refimpl.eagle3"] = str(fake)
    bad = algorithm_problems(modules)
    assert any("refimpl.eagle3 imports ['copy_prior']" in b for b in bad), bad
