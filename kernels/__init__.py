"""Triton kernels for fast decoding, each a triad in one self-contained file:

1. the ``@triton.jit`` kernel and its host wrapper ``<name>_triton(...)``;
2. a plain-torch reference ``<name>_reference(...)`` computing the same function;
3. the dispatcher ``<name>(...)``: Triton on CUDA tensors or when ``TRITON_INTERPRET=1``
   (the CPU interpreter the tests use), the torch reference otherwise.

Each file also has ``aot_specs()`` listing (kernel, signature, constexprs) so the tests can
compile it ahead of time for sm_80 and sm_90 on a machine without a GPU, and ``bench()``
using ``triton.testing.do_bench`` (skipped without CUDA). A kernel file imports only torch
and triton, so it can be copied into another project on its own.
"""
import contextlib
import os

from .decode_attention import decode_attention, decode_attention_reference, decode_attention_triton
from .rejection_sample import rejection_sample, rejection_sample_reference, rejection_sample_triton
from .verify_greedy import (argmax, verify_greedy, verify_greedy_host, verify_greedy_reference,  # noqa: F401
                            verify_greedy_triton)
from .confidence_select import confidence_select, confidence_select_reference, confidence_select_triton  # noqa: F401
from .tree_attention import tree_attention, tree_attention_reference, tree_attention_triton, tree_mask  # noqa: F401

#: kernel modules (for the ahead-of-time compile test and the kernel benchmark)
MODULES = ["decode_attention", "verify_greedy", "rejection_sample", "confidence_select", "tree_attention"]


@contextlib.contextmanager
def references():
    """Inside ``with kernels.references():`` every dispatcher takes its torch reference on a CPU.

    The dispatchers read ``TRITON_INTERPRET`` at every call; this sets it to ``"0"`` for the block
    (and restores it after), so a long statistical run in a notebook or test does not go through
    Triton's Python interpreter (about 0.3 s per batch row for ``rejection_sample``). CUDA tensors
    still run the native kernels. The kernels' own tests check kernel == reference."""
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old
