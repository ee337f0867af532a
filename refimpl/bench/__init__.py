"""Layer 5, the benchmark: ``python -m refimpl.bench`` (:mod:`refimpl.bench.cli`). Nothing imports it.

- :mod:`refimpl.bench.rows`: the one table of decode rows (every method, and Hugging Face's where
  it has the same one);
- :mod:`refimpl.bench.decode`: the decode suite (interleaved runs, medians, exactness, per
  category), latency(k), markdown tables;
- :mod:`refimpl.bench.dllm`: the diffusion-LM samplers on digit reversal and King James text.
"""
from .cli import main  # noqa: F401
from .decode import Context, Method, latency_curve, markdown_table, run_decode  # noqa: F401
