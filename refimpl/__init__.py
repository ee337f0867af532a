"""refimpl: the tested reference implementation behind the course notebooks.

One algorithm per module, plain torch. Start with :mod:`refimpl.models` (``load``),
:mod:`refimpl.autoregressive` (the baseline) and :mod:`refimpl.generation` (what every
decoder returns).
"""
__version__ = "0.1.0"
