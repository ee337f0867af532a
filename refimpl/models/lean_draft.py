"""EAGLE and DFlash drafts with their products on the lean forward's kernel (:mod:`refimpl.models.cpu_gemv`).

An EAGLE draft (:class:`refimpl.eagle.EagleDraft`, :class:`refimpl.eagle3.Eagle3Draft`) is one
decoder layer and an LM head: little work, called ~3 times a step on 1-10 rows (the root, then the
``topk`` nodes of each tree level). Through ``torch.nn.functional.linear`` in fp32 those calls go to
MKL's GEMM, which repacks each weight at every call, so a draft call can cost more than the target's
verification of the whole tree (EAGLE-3, arXiv 2503.01840, §3: the draft must be cheap for the tree
to pay; bench_results/experiments/2026-11-26_eagle3_cpu_draft/ measures SmolLM2's). Packed once into :func:`refimpl.models.cpu_gemv.pack`'s panels, the same products
read each weight once per call. A zoo draft is stored in fp16, so its fp32 weights are fp16 numbers:
its panels hold fp16 (``PackedCopy(half=True)``), half the bytes for the same bits (the kernel widens
each weight exactly); a weight trained past fp16 keeps fp32 panels.

:func:`lean` turns a draft into its lean twin *in place*: every ``nn.Linear`` becomes a
:class:`GemvLinear` (same parameters), and the head runs on a packed copy of ``lm_head`` that is
rebuilt when the weight changes. The decoder layer's ``step`` is one
:class:`refimpl.models.cpu_gemv.LayerStep` call (:func:`kernel_layer`: norms, q/k/v, rotary,
attention over the past and the new keys, o, SwiGLU in one OpenMP region; EAGLE-3's first stage reads
``[norm_in(embed); norm_hid(g)]``) instead of ~35 torch calls, whose per-call overhead dominated a
draft step (bench_results/experiments/2026-11-28_eagle3_kernel_layer_int8/). Outputs agree
with the plain draft within float rounding (~1e-6 relative: another summation order), so a tree can
differ in a near-tie, never the decoded text: the target verifies every token. Training (autograd
on) falls back to the plain products and step.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..dflash import DFlashDraft
from ..eagle import EagleDraft
from ..primitives import rope_tables
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


def panels(draft, x: torch.Tensor) -> list | None:
    """The packed panels of the draft layer's four :class:`GemvLinear` products (q/k/v, o, gate/up,
    down) for an input ``x``, or None where the plain step must run: the kernel not :func:`usable`, or
    the four not of one kind (fp16 panels and one weight trained past fp16, in fp32)."""
    if not usable(x, draft.qkv.weight):
        return None
    packed = [m.copy.of(m.weight) for m in (draft.qkv, draft.o, draft.gate_up, draft.down)]
    return packed if len({p.kind for p in packed}) == 1 else None


def eps_of(norm: nn.RMSNorm) -> float:
    """An ``nn.RMSNorm``'s epsilon as the kernel takes it (None: torch's default, float32's machine epsilon)."""
    return torch.finfo(torch.float32).eps if norm.eps is None else norm.eps


TABLES: dict = {}  # (head size, theta) -> the rotary tables cos2, sin2 (positions, d) for positions 0, 1, ...


def rope_rows(pos: torch.Tensor, d: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`refimpl.primitives.rope_tables` at positions pos (B, T) as (B, T, d) rows of a table computed
    once per head size and theta (grown by doubling when a position falls past it): the same numbers (each
    row is computed from its position alone) in two calls instead of ~15."""
    table = TABLES.get((d, theta))
    if table is not None:
        try:
            return table[0][pos], table[1][pos]  # (B, T, d) each
        except IndexError:  # a position past the table: grow it
            pass
    need = int(pos.max()) + 1 if pos.numel() else 1
    size = max(need, 256, 2 * (0 if table is None else table[0].shape[0]))
    cos2, sin2 = rope_tables(torch.arange(size, device="cpu")[None], d, theta)  # (1, 1, size, d)
    table = TABLES[(d, theta)] = (cos2[0, 0], sin2[0, 0])
    return table[0][pos], table[1][pos]


def kernel_layer(x, e, norms: tuple, packed: list, pos, allow, past, heads: int, kv_heads: int, theta: float):
    """One EAGLE draft layer in one :class:`refimpl.models.cpu_gemv.LayerStep` call: ``x`` (B, T, H) the
    layer's input (its residual stream), ``e`` (B, T, H) the token embedding EAGLE-3 reads beside it
    (None: EAGLE-1, whose input is already fused); ``norms`` = (norm_e or None, norm1, norm2)
    ``nn.RMSNorm``; ``allow`` (B, T, P + T) bool and ``past`` = (k, v) (B, kv heads, P, d) or None as
    the drafts' ``step`` (``allow`` None: the kernel's causal rule, no mask). -> (outputs (B, T, H), (k, v) of
    these T inputs (B, kv heads, T, d))."""
    B, T, H = x.shape
    d = packed[1].shape[1] // heads  # o reads heads * d
    P = 0 if past is None else past[0].shape[2]
    keys, values = (x.new_empty(B, kv_heads, P + T, d) for _ in range(2))  # the cache: past, then these T
    if P:
        keys[:, :, :P], values[:, :, :P] = past
    cos2, sin2 = rope_rows(pos.cpu(), d, theta)  # (B, T, d)
    mask = None if allow is None else torch.zeros(allow.shape, device="cpu").masked_fill_(~allow, float("-inf"))
    norm_e, norm1, norm2 = norms
    step = cpu_gemv.LayerStep(B, T, P, H, heads, kv_heads, d, packed[2].shape[0] // 2, eps_of(norm1), d ** -0.5,
                              cos2, sin2, mask, embedded=e is not None)
    w = (norm1.weight, *packed[:2], norm2.weight, *packed[2:])
    extra = {} if e is None else {"e": e.contiguous(), "norm_e": norm_e.weight}
    out = step.run(x.contiguous(), [w], [(keys, values)], **extra)[0]  # (B, T, H)
    return out, (keys[:, :, P:], values[:, :, P:])


class LeanEagleDraft(EagleDraft):
    """:class:`refimpl.eagle.EagleDraft` with its head on the kernel and its layer in one kernel call
    (made by :func:`lean`)."""

    def step(self, tok, feat, pos, allow, past=None):
        packed = panels(self, feat)
        if packed is None:
            return super().step(tok, feat, pos, allow, past)
        x = self.fc(torch.cat([self.embed[tok], feat.to(self.embed.dtype)], -1))  # (B, T, H)
        return kernel_layer(x, None, (None, self.norm1, self.norm2), packed, pos, allow, past, self.num_heads,
                            self.num_heads, self.rope_theta)

    def logits(self, f: torch.Tensor) -> torch.Tensor:
        return product(f, self.lm_head, self.head_copy)  # (..., V')


class LeanEagle3Draft(Eagle3Draft):
    """:class:`refimpl.eagle3.Eagle3Draft` with its head on the kernel and its layer in one kernel call
    (made by :func:`lean`)."""

    def step(self, tok, feat, pos, allow, past=None):
        packed = panels(self, feat)
        if packed is None:
            return super().step(tok, feat, pos, allow, past)
        return kernel_layer(feat, self.embed[tok], (self.norm_in, self.norm_hid, self.norm_mid), packed, pos, allow,
                            past, self.num_heads, self.num_kv_heads, self.rope_theta)

    def logits(self, o: torch.Tensor) -> torch.Tensor:
        if usable(o, self.lm_head):  # the final norm in one kernel call (torch's: ~6 small operations)
            normed = cpu_gemv.rmsnorm(o, self.norm.weight, eps_of(self.norm))
            return cpu_gemv.run(normed, self.head_copy.of(self.lm_head))  # (..., V')
        return product(self.norm(o), self.lm_head, self.head_copy)


#: a draft's class -> its lean twin (a DFlash drafter keeps its class: its products alone move to the kernel,
#: its layers, with their q / k norms and injected context, stay torch's)
LEAN = {EagleDraft: LeanEagleDraft, Eagle3Draft: LeanEagle3Draft, DFlashDraft: DFlashDraft}


def lean(draft: nn.Module, int8: bool = False) -> nn.Module:
    """Make ``draft`` (an EAGLE-1 or EAGLE-3 draft, a DFlash drafter) run its products on the kernel, in place,
    and return it: its ``nn.Linear`` modules become :class:`GemvLinear` (same parameters) and its class the
    lean twin, which overrides ``step`` and ``logits`` (a DFlash drafter: its projections, ``fc`` and head on
    the kernel, the rest of its layers as they are). ``int8``: every product reads int8
    panels (:func:`refimpl.models.cpu_gemv.quantize`, per output row): a quarter of fp32's bytes,
    half of fp16's, and a draft whose outputs move by the quantization (~0.2% a weight; the target
    verifies every token, so decoding stays exact; SmolLM2's EAGLE-3 trees keep their tau:
    bench_results/experiments/2026-11-28_eagle3_kernel_layer_int8/). Safe to call twice (the second call sets the panels' kind)."""
    kind = type(draft)
    if kind not in LEAN and kind not in LEAN.values():
        raise ValueError(f"draft must be an EagleDraft, an Eagle3Draft or a DFlashDraft, got {kind.__name__}")
    swaps = [(parent, name, child) for parent in draft.modules()
             for name, child in parent.named_children() if type(child) is nn.Linear]
    for parent, name, child in swaps:
        setattr(parent, name, GemvLinear(child))
    for m in draft.modules():
        if isinstance(m, GemvLinear):
            m.copy = cpu_gemv.PackedCopy(half=True, int8=int8)
    draft.head_copy = cpu_gemv.PackedCopy(half=True, int8=int8)
    draft.__class__ = LEAN.get(kind, kind)
    return draft
