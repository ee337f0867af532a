"""Sliding-window attention under draft / verify / roll back: a cache that can always be rolled back.

Models such as Mistral 7B v0.1, Phi-3, Gemma 2 / 3 (local layers) and gpt-oss restrict some or all
attention layers to a window of the last ``W`` positions: the query at position ``i`` sees the keys
at positions ``j`` with ``i - W < j <= i`` (Beltagy, Peters, Cohan, "Longformer", arXiv 2004.05150,
§3.1; Jiang et al., "Mistral 7B", arXiv 2310.06825, §2). Hugging Face's cache for such a layer keeps
only the last ``W - 1`` keys, which is all that plain decoding needs, but a speculative step appends
drafts first and removes the rejected ones after: once the window is full, the keys the rejected
drafts pushed out are gone, and ``crop`` raises. Token trees and ragged batches break two more
assumptions of that cache: the tree's compaction indexes slots by their physical place, and a row
with holes (slots of rejected drafts, :mod:`refimpl.slot_cache`) has fewer real tokens in its last
``W`` slots than the window allows.

:class:`WindowCache` is what :meth:`refimpl.lm.LM.new_cache` gives a model with sliding layers:

- every layer keeps every position (the window's overflow stays until it can no longer be rolled
  back: here, until the generation ends), so crop, tree compaction and row selection work as on a
  full-attention cache; the memory is that of a full-attention cache of the same length;
- it records the position id of every slot of every row (``positions`` (B, S)), and
  :func:`layer_masks` measures each window in *positions*, not in slots: a row with holes sees
  exactly the keys it would see decoding alone, so every method stays token-for-token AR greedy
  and lossless when sampling, for any window size and any sequence length.

The masks go to the model as one 4-D additive mask when every layer has the same window, or as
Hugging Face's per-layer-type mapping (``{"full_attention": ..., "sliding_attention": ...}``) for a
model that alternates them. A layer the cache cannot roll back (a recurrent state, chunked
attention, a layer reading another layer's cache), or a mixed model whose forward takes no mapping,
is reported by :func:`rollback_problem`: the verification loop refuses it before decoding.
"""
from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache
from transformers.cache_utils import get_layer_types_and_kwargs

#: the layer types whose keys and values this cache can keep, crop and move: window None = full
SUPPORTED = ("full_attention", "sliding_attention")


def layer_types(config) -> list[str]:
    """Hugging Face's attention type of every decoder layer (``full_attention``, ``sliding_attention``, ...)."""
    return list(get_layer_types_and_kwargs(config.get_text_config(decoder=True))[0])


def attention_windows(config) -> list[int | None]:
    """The window ``W`` of every decoder layer (None: full attention; a layer type this cache does not
    support counts as full here, :func:`rollback_problem` names it)."""
    types, kwargs = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
    return [kw.get("sliding_window") if t == "sliding_attention" else None for t, kw in zip(types, kwargs)]


def takes_mask_mapping(model) -> bool:
    """Does the model's decoder accept a ``{layer type: mask}`` mapping as its attention mask (the
    transformers 5 models with mixed layers do: ``isinstance(attention_mask, dict)`` in their forward)?"""
    inner = getattr(model, "model", model)
    try:
        src = inspect.getsource(type(inner).forward)
    except (OSError, TypeError):
        return False
    return "attention_mask, dict)" in src


def rollback_problem(model) -> str | None:
    """Why the draft / verify / roll back loop cannot run on ``model`` (a Hugging Face causal LM), or None."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "get_text_config"):
        return None  # not a Hugging Face model (the lean forward, a test double): its cache rolls back
    types = layer_types(config)
    for i, t in enumerate(types):
        if t not in SUPPORTED:
            return (f"layer {i} is a {t!r} layer, whose cache cannot be rolled back past a rejected draft "
                    f"(supported: {', '.join(SUPPORTED)})")
    if len(set(attention_windows(config))) > 1 and not takes_mask_mapping(model):
        return (f"it mixes {sorted(set(types))} layers, and {type(model).__name__}'s forward takes no "
                "per-layer-type attention masks")
    return None


class WindowCache(DynamicCache):
    """A ``DynamicCache`` whose layers all keep every position (sliding ones too) and which records
    the position id of every cached slot of every row: ``positions`` (B, S) long.

    :meth:`refimpl.lm.LM.forward` appends the new tokens' positions after each call; ``crop``,
    ``batch_select_indices`` and :meth:`move` keep them in step with the keys and values."""

    def __init__(self):
        super().__init__()  # no config: every layer a plain DynamicLayer, which keeps everything
        self.positions: torch.Tensor | None = None

    def append_positions(self, pos: torch.Tensor) -> None:
        """Record the position ids (B, Q) of the slots the last forward appended."""
        self.positions = pos if self.positions is None else torch.cat([self.positions, pos], 1)

    def crop(self, max_length: int) -> None:
        super().crop(max_length)
        if self.positions is not None:
            self.positions = self.positions[:, : self.get_seq_length()]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        if self.positions is not None:
            self.positions = self.positions[indices.to(self.positions.device)]

    def move(self, dst: int, src: torch.Tensor) -> bool:
        """Copy each row's slots ``src`` (B, k) to ``dst .. dst + k - 1`` in every layer (a token tree's
        compaction, :meth:`refimpl.lm.LM.move_slots`), positions included. Returns True (done)."""
        k = src.shape[1]
        for lay in self.layers:
            if lay.keys is None or lay.keys.numel() == 0:
                continue
            idx = src.to(lay.keys.device)[:, None, :, None].expand(-1, lay.keys.shape[1], -1, lay.keys.shape[3])
            lay.keys[:, :, dst:dst + k] = lay.keys.gather(2, idx)  # gather copies first: overlaps are safe
            lay.values[:, :, dst:dst + k] = lay.values.gather(2, idx)
        pos = self.positions
        pos[:, dst:dst + k] = pos.gather(1, src.to(pos.device))
        return True


def layer_masks(cache: WindowCache, types: list, windows: list, batch: int, Q: int, position_ids, attention_mask,
                dtype, device):
    """The attention mask(s) for ``Q`` new tokens at ``position_ids`` (B or 1, Q) after ``cache``, and
    the new tokens' positions (B, Q).

    ``attention_mask`` is the caller's: None (causal), a 2-D padding / slot mask (B, S + Q) of 1/0, or
    a 4-D additive mask (B, 1, Q, S + Q) (a token tree's). Every layer gets that mask; a sliding layer
    of window ``W`` also blocks the keys whose position is ``W`` or more below the query's. Returns
    one (B, 1, Q, S + Q) additive mask when all layers share a window, else ``{layer type: mask}``
    (``types``, ``windows``: :func:`layer_types` and :func:`attention_windows` of the model's config)."""
    S = cache.get_seq_length()
    if position_ids is None:  # Hugging Face's default: the next slots
        position_ids = torch.arange(S, S + Q, device=device)[None]
    qpos = position_ids.to(device).expand(batch, Q)  # (B, Q)
    past = cache.positions if cache.positions is not None else qpos.new_zeros((batch, 0))
    kpos = torch.cat([past.to(device), qpos], 1)  # (B, S + Q)
    if attention_mask is not None and attention_mask.dim() == 4:
        allow = attention_mask[:, 0].to(device) == 0  # (B, Q, S + Q)
    else:
        allow = torch.ones((Q, S + Q), dtype=torch.bool, device=device).tril(S)[None].expand(batch, Q, S + Q)
        if attention_mask is not None:
            allow = allow & attention_mask.to(device).bool()[:, None, :]
        allow = allow.clone()
    diag = torch.arange(Q, device=device)
    allow[:, diag, S + diag] = True  # every new token sees itself: a pad's row is never empty
    gap = qpos[:, :, None] - kpos[:, None, :]  # (B, Q, S + Q) how far below the query each key sits

    def additive(ok):
        return torch.zeros(ok.shape, dtype=dtype, device=device).masked_fill(~ok, float("-inf"))[:, None]

    masks = {t: additive(allow if w is None else allow & (gap < w)) for t, w in zip(types, windows)}
    return (next(iter(masks.values())) if len(masks) == 1 else masks), qpos
