"""The lean forward's KV cache: every layer's keys and values in preallocated buffers.

A Hugging Face ``DynamicCache`` concatenates each layer's keys and values at every step (a
reallocation per layer per token); :class:`KVCache` writes into buffers that double when full,
with the methods decoders call on a ``DynamicCache``. :mod:`refimpl.models.lean_llama` fills it
stage by stage (:meth:`KVCache.write`) or hands its buffers to the whole-layer kernel
(:meth:`KVCache.buffers`, :class:`refimpl.models.cpu_gemv.LayerStep`).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from . import cpu_gemv


class CacheLayer(NamedTuple):
    """One layer's cached keys and values (B, Hkv, length, D): views into :class:`KVCache`'s buffers."""

    keys: torch.Tensor
    values: torch.Tensor


class KVCache:
    """Keys and values of every layer in preallocated buffers (B, Hkv, capacity, D).

    Appending writes into the buffer (capacity doubles when full) instead of concatenating; the
    methods decoders use on a Hugging Face ``DynamicCache`` -- ``get_seq_length()``,
    ``crop(-n)``, ``batch_select_indices(rows)``, ``layers[i].keys`` -- behave the same.
    """

    def __init__(self, num_layers: int):
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.length = 0
        self.weights = None  # (model, its fused weights) checked at this cache's first step (lean_llama.checked)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    @property
    def layers(self) -> list[CacheLayer]:
        """Per layer, views of the first ``length`` cached positions (writes go to the buffers)."""
        return [CacheLayer(k[:, :, :self.length], v[:, :, :self.length])
                for k, v in zip(self.keys, self.values) if k is not None]

    def crop(self, n: int) -> None:
        """Drop the last ``-n`` positions (``n`` <= 0, as transformers 5's ``DynamicCache.crop``)."""
        if n > 0:
            raise ValueError(f"crop takes a negative count of positions to drop, got n={n}")
        self.length = max(0, self.length + n)

    def batch_select_indices(self, rows: torch.Tensor) -> None:
        self.keys = [None if k is None else k[rows] for k in self.keys]
        self.values = [None if v is None else v[rows] for v in self.values]

    def buffers(self, layer: int, B: int, Hkv: int, Q: int, D: int, like: torch.Tensor):
        """The layer's key and value buffers (B, Hkv, capacity, D) with room for Q more positions,
        in ``like``'s dtype and on its device."""
        P = self.length
        buf_k, buf_v = self.keys[layer], self.values[layer]
        if buf_k is None or buf_k.shape[2] < P + Q or buf_k.shape[0] != B:
            cap = max(64, 2 * (P + Q))
            new_k, new_v = like.new_empty(B, Hkv, cap, D), like.new_empty(B, Hkv, cap, D)
            if buf_k is not None and P:
                new_k[:, :, :P] = buf_k[:, :, :P]
                new_v[:, :, :P] = buf_v[:, :, :P]
            self.keys[layer], self.values[layer] = buf_k, buf_v = new_k, new_v
        return buf_k, buf_v

    def move(self, dst: int, src: torch.Tensor) -> bool:
        """:meth:`refimpl.lm.LM.move_slots` in one :func:`refimpl.models.cpu_gemv.move_slots` call for every
        layer's buffers (CPU float32 ones, the kernel built) -> True; False: nothing moved, the caller
        moves them layer by layer."""
        bufs = [b for pair in zip(self.keys, self.values) for b in pair if b is not None]
        if not bufs or not cpu_gemv.available() or any(
                b.device.type != "cpu" or b.dtype != torch.float32 or b.shape != bufs[0].shape or not b.is_contiguous()
                for b in bufs):
            return False
        if src.shape[0] != bufs[0].shape[0] or dst + src.shape[1] > bufs[0].shape[2] or (
                src.numel() and not 0 <= int(src.min()) <= int(src.max()) < bufs[0].shape[2]):
            raise ValueError(f"src {tuple(src.shape)} must name cached positions of every row; dst={dst}")
        cpu_gemv.move_slots(bufs, dst, src)
        return True

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Store k, v (B, Hkv, Q, D) after the cached ``length`` positions -> (B, Hkv, length + Q, D) views."""
        P, Q = self.length, k.shape[2]
        buf_k, buf_v = self.buffers(layer, k.shape[0], k.shape[1], Q, k.shape[3], k)
        buf_k[:, :, P:P + Q] = k
        buf_v[:, :, P:P + Q] = v
        return buf_k[:, :, :P + Q], buf_v[:, :, :P + Q]
