"""Route a Hugging Face model's attention through our Triton kernel.

transformers 5 lets a model call any registered attention function
(``AttentionInterface.register``) and build its mask with any registered mask function
(``AttentionMaskInterface.register``). We register ``"refimpl_triton"`` with
:func:`kernels.decode_attention` and the *eager* mask builder, which hands us an additive
float mask (B, 1, Q, past + Q) -- or ``None`` when no masking is needed, in which case the
kernel applies the causal rule itself. ``models.load(name, attn="triton")`` uses it.
"""
from __future__ import annotations

from kernels.decode_attention import decode_attention

NAME = "refimpl_triton"


def triton_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention-function signature: query (B, Hq, Q, D), key/value (B, Hkv, K, D).

    Returns (attn_output (B, Q, Hq, D), None) like transformers' own sdpa/eager functions.
    """
    if dropout and module.training:
        raise ValueError("dropout: the Triton decode-attention path is inference-only")
    if attention_mask is not None and attention_mask.dim() == 4:
        attention_mask = attention_mask[:, :, :, : key.shape[-2]]
    out = decode_attention(query, key, value, mask=attention_mask, scale=scaling,
                           causal=getattr(module, "is_causal", True))
    return out.transpose(1, 2).contiguous(), None


def register_triton_attention() -> str:
    """Register (idempotently) and return the attention implementation name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, eager_mask

    AttentionInterface.register(NAME, triton_attention_forward)
    if NAME not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        AttentionMaskInterface.register(NAME, eager_mask)
    return NAME
