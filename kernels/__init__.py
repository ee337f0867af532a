"""Triton kernels for fast decoding, each a triad in one self-contained file:

1. the ``@triton.jit`` kernel and its host wrapper ``<name>_triton(...)``;
2. a plain-torch reference ``<name>_reference(...)`` computing the same function;
3. the dispatcher ``<name>(...)``: Triton on CUDA tensors, or on CPU tensors in Triton's interpreter
   when ``TRITON_INTERPRET=1`` was set as the file was imported (the tests do); the torch reference
   otherwise, and wherever Triton is not installed (it publishes no wheel for macOS or Windows).

Import a kernel from its file (``from kernels.rejection_sample import rejection_sample``): this package
imports none of them, so a project that copies one file copies nothing else. Each file also has
``aot_specs()`` listing (kernel, signature, constexprs) so the tests can compile it ahead of time for
sm_80 and sm_90 on a machine without a GPU, and ``bench()`` using ``triton.testing.do_bench`` (skipped
without CUDA). A kernel file imports only torch, NumPy and (where installed) triton.
"""
import contextlib
import importlib
import importlib.util

#: kernel modules (for the ahead-of-time compile test and the kernel benchmark)
MODULES = ["decode_attention", "verify_greedy", "rejection_sample", "confidence_select", "tree_attention"]


@contextlib.contextmanager
def references():
    """Inside ``with kernels.references():`` every dispatcher takes its torch reference on a CPU.

    A file's ``INTERPRET`` switch (``TRITON_INTERPRET=1`` at import) sends CPU tensors through Triton's
    Python interpreter, about 0.3 s per batch row for ``rejection_sample``: a long statistical run in a
    notebook or test turns it off for the block, and it is restored after. CUDA tensors still run the
    native kernels. The kernels' own tests check kernel == reference."""
    mods = [importlib.import_module(f"{__name__}.{m}") for m in MODULES
            if importlib.util.find_spec(f"{__name__}.{m}") is not None]
    old = [m.INTERPRET for m in mods]
    for m in mods:
        m.INTERPRET = False
    try:
        yield
    finally:
        for m, o in zip(mods, old):
            m.INTERPRET = o
