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
from .decode_attention import decode_attention, decode_attention_reference, decode_attention_triton
from .rejection_sample import rejection_sample, rejection_sample_reference, rejection_sample_triton
from .verify_greedy import verify_greedy, verify_greedy_reference, verify_greedy_triton
from .confidence_select import confidence_select, confidence_select_reference, confidence_select_triton  # noqa: F401
from .tree_attention import tree_attention, tree_attention_reference, tree_attention_triton, tree_mask  # noqa: F401

#: kernel modules (for the ahead-of-time compile test and the kernel benchmark)
MODULES = ["decode_attention", "verify_greedy", "rejection_sample", "confidence_select", "tree_attention"]
