"""The GPU path, audited from a CPU: the suite runs on machines without a GPU, so the mistakes that
only a GPU would show are made to fail here.

Two checks:

1. **Read** (``ast``): every torch factory call (``torch.tensor``, ``zeros``, ``full``, ``arange``,
   ``rand`` ..., ``torch.Generator()``) in ``refimpl/``, ``kernels/`` and the notebooks names its
   device, and every ``.cpu()`` in a notebook says why on its line (a ``#`` comment: scipy,
   matplotlib, ...). A tensor made on the default device is on the CPU while the model is on the
   GPU: the comparison or the indexing that follows fails there, and only there.
2. **Run**: every decoding entry point the notebooks call, on CPU models, with
   ``torch.set_default_device("meta")`` around it. Any tensor our code makes without naming a
   device then lands on ``meta`` (no data) instead of the model's device, and the run fails the
   way it would on a GPU, where the default device (the CPU) is not the model's either. The
   outputs must equal the same calls without the trap.
"""
import ast
import glob
import os
import re

import decoding
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: torch functions that create a tensor on the default device unless told otherwise
FACTORIES = {"tensor", "as_tensor", "zeros", "ones", "full", "empty", "arange", "linspace", "eye",
             "rand", "randn", "randint", "randperm"}


def unnamed_devices(path: str) -> list[str]:
    """``file:line: call`` for every factory call in ``path`` that names no device."""
    src = open(path).read()
    out = []
    for node in ast.walk(ast.parse(src)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"):
            continue
        named = any(k.arg == "device" for k in node.keywords)
        if node.func.attr in FACTORIES and not named:
            out.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}: {ast.get_source_segment(src, node)[:90]}")
        elif node.func.attr == "Generator" and not node.args and not named:
            out.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}: torch.Generator() (a CPU generator; say so)")
    return out


def silent_cpu_moves(path: str) -> list[str]:
    """``file:line`` for every ``.cpu()`` in ``path`` whose line carries no comment saying why."""
    out = []
    for i, line in enumerate(open(path), 1):
        code, _, comment = line.partition("#")
        if ".cpu()" in code and not comment.strip():
            out.append(f"{os.path.relpath(path, ROOT)}:{i}: {line.strip()[:90]}")
    return out


LIBRARY = sorted(glob.glob(os.path.join(ROOT, "refimpl", "**", "*.py"), recursive=True)
                 + glob.glob(os.path.join(ROOT, "kernels", "*.py")))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "[0-9]*.py")) + [os.path.join(ROOT, "notebooks", "figures.py")]
                   + glob.glob(os.path.join(ROOT, "notebooks", "solutions", "ch*.py")))


def test_the_reader_catches_what_it_should(tmp_path):
    """Negative control: the two readers flag an unnamed device and a silent ``.cpu()``, not their fixed forms."""
    f = tmp_path / "case.py"
    f.write_text("import torch\nx = torch.tensor([1])\ny = torch.zeros(3, device=d)\ng = torch.Generator()\n"
                 "h = torch.Generator(device='cpu')\nz = x.cpu()\nw = x.cpu()  # scipy reads CPU arrays\n")
    assert [s.split(":")[1] for s in unnamed_devices(str(f))] == ["2", "4"]
    assert [s.split(":")[1] for s in silent_cpu_moves(str(f))] == ["6"]


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: os.path.relpath(p, ROOT))
def test_library_names_every_device(path):
    bad = unnamed_devices(path)
    assert not bad, "tensors made on the default device (pass device=...):\n" + "\n".join(bad)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: os.path.relpath(p, ROOT))
def test_notebooks_name_every_device(path):
    bad = unnamed_devices(path)
    assert not bad, "tensors made on the default device (device=DEVICE next to a model, else device='cpu'):\n" + "\n".join(bad)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: os.path.relpath(p, ROOT))
def test_notebooks_say_why_they_move_data_to_the_cpu(path):
    bad = silent_cpu_moves(path)
    assert not bad, ".cpu() with no comment saying why (compare on the device instead):\n" + "\n".join(bad)


def test_notebooks_share_one_device_helper():
    """Every chapter's setup asks ``refimpl``'s one helper, none spells out its own CUDA test."""
    for path in glob.glob(os.path.join(ROOT, "notebooks", "[0-9]*.py")):
        src = open(path).read()
        assert "torch.cuda.is_available()" not in src, f"{path}: use DEVICE = default_device()"
        if re.search(r"^DEVICE\s*=", src, re.M):
            assert re.search(r"^DEVICE\s*=\s*default_device\(\)", src, re.M), f"{path}: DEVICE = default_device()"


# --- 2. run: the decoding entry points with the default device set to ``meta`` ---------------------

@pytest.fixture(scope="module")
def cpu_models():
    return decoding.entry_point_models("cpu")


@pytest.mark.parametrize("name", decoding.ENTRY_POINTS)
def test_decoding_never_uses_the_default_device(cpu_models, name):
    """With the default device on ``meta``, every entry point gives the tokens it gives without the trap."""
    want = decoding.entry_points(cpu_models)[name]().tokens
    call = decoding.entry_points(cpu_models)[name]  # fresh generators
    with torch.device("meta"):
        got = call().tokens
    assert got == want


@pytest.mark.parametrize("name", ["copy_accuracy", "heldout_agreement"])
def test_draft_trainer_metrics_build_on_the_models_device(tiny, name):
    """The SmolLM2 draft trainer's held-out metrics build their drill on the model's device, not the CPU."""
    from refimpl.train import smol_draft

    model = tiny.model  # a CausalLM over the full vocabulary: kept = every token
    kept = torch.arange(model.lm_head.weight.shape[0], device="cpu")
    rows = [(list(range(3, 15)), 6, None), (list(range(20, 28)), 3, None)]  # (tokens, answer start, features)

    def call():
        if name == "copy_accuracy":
            return smol_draft.copy_accuracy(model, kept, span=6, batch=2)
        return smol_draft.heldout_agreement(model, rows, kept, pad_id=0)

    want = call()
    with torch.device("meta"):
        assert call() == want
