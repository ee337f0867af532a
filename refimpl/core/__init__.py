"""Layer 1, the core every chapter builds on (imports torch and transformers only):

- :mod:`refimpl.core.lm`: the :class:`LM` adapter (logits, cached forward, crop) and batch helpers;
- :mod:`refimpl.core.generation`: :class:`Generation` / :class:`Stats`, what every decoder
  returns, and the input checks they share;
- :mod:`refimpl.core.sampling`: temperature, top-k, top-p and seeded sampling.
"""
