"""EAGLE drafts with their products on the lean forward's kernel (:mod:`refimpl.models.cpu_gemv`).

An EAGLE draft (:class:`refimpl.eagle.EagleDraft`, :class:`refimpl.eagle3.Eagle3Draft`) is one
decoder layer and an LM head: little work, called ~3 times a step on 1-10 rows (the root, then the
``topk`` nodes of each tree level). Through ``torch.nn.functional.linear`` in fp32 those calls go to
MKL's GEMM, which repacks each weight at every call: SmolLM2's EAGLE-3 draft (a 7,316-row head over
576 features, a 2 x 576 -> 960 qkv, a 576 -> 2 x 1,536 MLP; 2 threads, this machine) took 5.0 ms
for its head alone on 3 rows and ~1.6 ms for the layer's four products, so its draft calls cost more
than the target's 11-row verification (EAGLE-3, arXiv 2503.01840, §3: the draft must be cheap for
the tree to pay). Packed once into :func:`refimpl.models.cpu_gemv.pack`'s panels, the same products
read each weight once per call. A zoo draft is stored in fp16, so its fp32 weights are fp16 numbers:
its panels hold fp16 (``PackedCopy(half=True)``), half the bytes for the same bits (the kernel widens
each weight exactly); a weight trained past fp16 keeps fp32 panels.

:func:`lean` turns a draft into its lean twin *in place*: every ``nn.Linear`` becomes a
:class:`GemvLinear` (same parameters), and the head runs on a packed copy of ``lm_head`` that is
rebuilt when the weight changes. Outputs agree with the plain draft within float rounding (~1e-6
relative: another summation order), so a tree can differ in a near-tie, never the decoded text:
the target verifies every token. Training (autograd on) falls back to the plain products.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..eagle import EagleDraft
from ..eagle3 import Eagle3Draft
from . import cpu_gemv


def usable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """May ``x @ weight.T`` run on the kernel: CPU float32 operands, nothing to differentiate, the
    kernel built."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or weight.dtype != torch.float32:
        return False
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return False
    return weight.device.type == "cpu" and cpu_gemv.available()


def product(x: torch.Tensor, weight: torch.Tensor, copy: cpu_gemv.PackedCopy,
            bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T (+ bias)``: x (..., K), weight (N, K) -> (..., N), on the kernel with ``copy``'s
    panels when :func:`usable`, else ``F.linear``."""
    if not usable(x, weight):
        return F.linear(x, weight, bias)
    y = cpu_gemv.run(x, copy.of(weight))  # (..., N)
    return y if bias is None else y.add_(bias.detach())


class GemvLinear(nn.Module):
    """An ``nn.Linear`` whose forward is :func:`product`: the original ``weight`` and ``bias``
    (shared, so the state dict, ``.to()`` and training are unchanged). (..., in) -> (..., out)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        if not isinstance(linear, nn.Linear):
            raise ValueError(f"linear must be an nn.Linear, got {type(linear).__name__}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.copy = cpu_gemv.PackedCopy(half=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return product(x, self.weight, self.copy, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, cpu_gemv panels"


class LeanEagleDraft(EagleDraft):
    """:class:`refimpl.eagle.EagleDraft` with its head on the kernel (made by :func:`lean`)."""

    def logits(self, f: torch.Tensor) -> torch.Tensor:
        return product(f, self.lm_head, self.head_copy)  # (..., V')


class LeanEagle3Draft(Eagle3Draft):
    """:class:`refimpl.eagle3.Eagle3Draft` with its head on the kernel (made by :func:`lean`)."""

    def logits(self, o: torch.Tensor) -> torch.Tensor:
        return product(self.norm(o), self.lm_head, self.head_copy)  # (..., V')


LEAN = {EagleDraft: LeanEagleDraft, Eagle3Draft: LeanEagle3Draft}


def lean(draft: nn.Module) -> nn.Module:
    """Make ``draft`` (an EAGLE-1 or EAGLE-3 draft) run its products on the kernel, in place, and
    return it: its ``nn.Linear`` modules become :class:`GemvLinear` (same parameters) and its class
    the lean twin, which overrides only ``logits``. Safe to call twice."""
    kind = type(draft)
    if kind in LEAN.values():
        return draft
    if kind not in LEAN:
        raise ValueError(f"draft must be an EagleDraft or an Eagle3Draft, got {kind.__name__}")
    swaps = [(parent, name, child) for parent in draft.modules()
             for name, child in parent.named_children() if type(child) is nn.Linear]
    for parent, name, child in swaps:
        setattr(parent, name, GemvLinear(child))
    draft.head_copy = cpu_gemv.PackedCopy(half=True)
    draft.__class__ = LEAN[kind]
    return draft
