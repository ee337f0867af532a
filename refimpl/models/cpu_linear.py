"""Pre-packed fp32 linear layers: make a k-token verification pass cheap on a CPU.

Speculative decoding pays off when scoring ``gamma + 1`` tokens costs about as much as scoring
one (Leviathan et al., "Fast Inference from Transformers via Speculative Decoding", arXiv
2211.17192, section 3.3: the speed-up ``tau / (gamma * c + 1)`` assumes exactly that). A GPU at
batch 1 is memory-bound, so that holds. A CPU can break it: ``torch.nn.functional.linear`` in
fp32 goes through MKL's GEMM, which repacks the weight matrix on every call once the input has
4 or more rows. On a 2-core machine, summed over SmolLM2-135M's 211 matrices (torch 2.13):

====  ==================  ========================
rows  MKL ``F.linear``     oneDNN, weight prepacked
====  ==================  ========================
1     26.7 ms             27.0 ms
3     26.4 ms             31.0 ms
5     39.8 ms             29.3 ms
9     49.8 ms             38.6 ms
====  ==================  ========================

(``python -m refimpl.bench --suite matmul`` measures your machine.) Packing each weight once into oneDNN's
blocked layout (``torch.ops.mkldnn._reorder_linear_weight``) and calling
``torch.ops.mkldnn._linear_pointwise`` removes the repacking, so verifying 5 tokens costs ~1.1x
one instead of ~1.5x. A second gain: oneDNN gives every row the same bits whatever the number of
rows, so a token scored inside a block of 5 gets exactly the logits it gets alone (MKL differs by
~1e-6), and greedy speculative decoding stays token-for-token equal to AR greedy.

Pack small drafts too when they score more than one row a call. SmolLM2's 3-layer draft (lean
forward, 200-token context, 2 threads, medians): 6.9 / 11.3 / 16.8 ms for 1 / 2 / 3 rows with MKL,
6.6 / 7.2 / 7.4 ms prepacked -- and a draft feeds 2 rows after a fully accepted chain and 2-4 nodes
per level of a token tree (:mod:`refimpl.dynamic_tree`). The zoo packs it by default.

This is an inference-only optimisation of the *model*, used by every decoder alike (our AR, the
speculative decoders and Hugging Face's own ``generate``/assisted generation when they run the
same model object). :func:`prepack_linears` swaps each ``nn.Linear`` for a
:class:`PrepackedLinear` that keeps the original parameters (state dict, weight tying, ``.to()``
and training are unchanged) and falls back to ``F.linear`` whenever the packed copy does not
apply: not on CPU, not fp32, or autograd recording.
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn


def available() -> bool:
    """True when this torch build has oneDNN (mkldnn) and its prepacked linear ops."""
    return (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """A CPU fp32 weight (out, in) packed once into oneDNN's blocked layout (for :func:`packed_linear`)."""
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        raise ValueError(f"weight must be a CPU float32 tensor, got {weight.dtype} on {weight.device}")
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), batch_size=None)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None,
                  add: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T (+ bias) (+ add)`` with ``W`` from :func:`pack_weight`; x (..., in) -> (..., out).

    ``add`` (same shape as the output) is summed inside the product (oneDNN's binary post-op):
    one call instead of two, the same bits as ``add + packed_linear(x, packed)``.
    """
    if add is not None:
        return torch.ops.mkldnn._linear_pointwise.binary(x, add, packed, bias, "add")
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class PrepackedLinear(nn.Module):
    """``nn.Linear`` whose fp32 CPU forward uses a weight packed once for oneDNN.

    ``weight`` (out, in) and ``bias`` are the original module's parameters (shared, not copied);
    the packed copy is a plain attribute, outside the state dict. Input (..., in) -> (..., out).
    """

    def __init__(self, linear: nn.Linear):
        super().__init__()
        if not isinstance(linear, nn.Linear):
            raise ValueError(f"linear must be an nn.Linear, got {type(linear).__name__}")
        if not available():
            raise ValueError("this torch build has no oneDNN prepacked linear (torch.backends.mkldnn)")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self._packed = None
        self._packed_version = None
        self.repack()

    def repack(self) -> None:
        """(Re)build the packed copy from ``weight`` (call after changing the weights in place)."""
        w = self.weight.detach()
        if w.device.type == "cpu" and w.dtype == torch.float32:
            self._packed = pack_weight(w)
        else:
            self._packed = None
        self._packed_version = (w.data_ptr(), w._version, w.device, w.dtype)

    def _usable(self, x: torch.Tensor) -> bool:
        w = self.weight
        if x.device.type != "cpu" or x.dtype != torch.float32 or w.dtype != torch.float32:
            return False
        if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad):
            return False
        if self._packed_version != (w.data_ptr(), w._version, w.device, w.dtype):
            self.repack()  # weights moved, were cast or were edited in place: pack again
        return self._packed is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._usable(x):
            return F.linear(x, self.weight, self.bias)
        return packed_linear(x, self._packed, None if self.bias is None else self.bias.detach())

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, prepacked"


def prepack_linears(model: nn.Module) -> int:
    """Swap every ``nn.Linear`` inside ``model`` for a :class:`PrepackedLinear`; returns how many.

    A no-op returning 0 when oneDNN is unavailable. Safe to call twice (already swapped modules
    are skipped).
    """
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not available():
        return 0
    swaps = [(parent, name, child) for parent in model.modules()
             for name, child in parent.named_children() if type(child) is nn.Linear]
    for parent, name, child in swaps:
        setattr(parent, name, PrepackedLinear(child))
    return len(swaps)


def matmul_cost(model: nn.Module, rows=(1, 2, 3, 4, 5, 6, 9), repeats: int = 15) -> list[dict]:
    """Median ms to run every ``nn.Linear``/``PrepackedLinear`` of ``model`` once on ``rows`` rows,
    with MKL's ``F.linear`` and with the prepacked weights (the table in this module's docstring)."""
    import statistics

    lins = [m for m in model.modules() if isinstance(m, (nn.Linear, PrepackedLinear))]
    packed = [m if isinstance(m, PrepackedLinear) else PrepackedLinear(m) for m in lins]
    out = []
    with torch.no_grad():
        for r in rows:
            xs = [torch.randn(r, m.in_features, device="cpu") for m in lins]  # a CPU measurement
            row = {"rows": r}
            for label, mods, fn in (("mkl_ms", lins, lambda m, x: F.linear(x, m.weight, m.bias)),
                                    ("prepacked_ms", packed, lambda m, x: m(x))):
                times = []
                for _ in range(repeats):
                    t = time.perf_counter()
                    for m, x in zip(mods, xs):
                        fn(m, x)
                    times.append(time.perf_counter() - t)
                row[label] = 1e3 * statistics.median(times)
            out.append(row)
    return out
