"""A lean forward pass for small Llama-architecture drafts: the same weights and math, less overhead.

A draft's cost ratio ``c`` (Leviathan et al., arXiv 2211.17192, section 3.3: speed-up
``tau / (gamma * c + 1)``) is what one draft *call* costs, and for a 3-layer draft most of a
call is not arithmetic. In a Hugging Face forward of SmolLM2's 3-layer draft on a 2-core CPU
(~4.4 ms a token), the matrix products take ~1.3 ms; the rest is per-call machinery: the mask
builders, the rotary module, output dataclasses, and a ``DynamicCache`` that concatenates (and
so reallocates) every layer's keys and values at every step. This module runs the same
computation as ``LlamaForCausalLM`` -- RMSNorm, rotary position embedding (Su et al., arXiv
2104.09864, eq. 34), grouped-query attention (Ainslie et al., arXiv 2305.13245) and the SwiGLU
MLP -- straight from the model's own parameters, with a preallocated :class:`KVCache`
(~2.8 ms a token). Its logits equal the Hugging Face model's (checked in the tests); the Hugging
Face model itself is untouched and still runs everywhere else (assisted generation, training).

Only the plain Llama recipe is covered (:func:`supports` says whether a model fits): default
rotary embedding, no attention or MLP biases, SiLU. For anything else use the model directly.
:class:`LeanTrimmedLM` is the zoo's SmolLM2 draft: a VocabTrim draft whose cached steps run here.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..diffusion_lm import apply_rope, rms_norm, rope_angles
from ..drafts import TrimmedLM


def supports(model) -> bool:
    """True when ``model`` is a Llama-recipe causal LM this forward reproduces exactly."""
    cfg = getattr(model, "config", None)
    inner = getattr(model, "model", None)
    if cfg is None or inner is None or not hasattr(inner, "layers"):
        return False
    rope = getattr(cfg, "rope_parameters", None) or {}
    return (getattr(cfg, "model_type", None) == "llama" and rope.get("rope_type", "default") == "default"
            and not getattr(cfg, "attention_bias", False) and not getattr(cfg, "mlp_bias", False)
            and getattr(cfg, "hidden_act", None) == "silu")


class KVCache:
    """Keys and values of every layer in preallocated buffers (B, Hkv, capacity, D).

    Appending writes into the buffer (capacity doubles when full) instead of concatenating; the
    methods decoders use on a Hugging Face ``DynamicCache`` -- ``get_seq_length()``,
    ``crop(-n)``, ``batch_select_indices(rows)`` -- behave the same.
    """

    def __init__(self, num_layers: int):
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.length = 0

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def crop(self, n: int) -> None:
        """Drop the last ``-n`` positions (``n`` <= 0, as transformers 5's ``DynamicCache.crop``)."""
        if n > 0:
            raise ValueError(f"crop takes a negative count of positions to drop, got n={n}")
        self.length = max(0, self.length + n)

    def batch_select_indices(self, rows: torch.Tensor) -> None:
        self.keys = [None if k is None else k[rows] for k in self.keys]
        self.values = [None if v is None else v[rows] for v in self.values]

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Store k, v (B, Hkv, Q, D) after the cached ``length`` positions -> (B, Hkv, length + Q, D) views."""
        P, Q = self.length, k.shape[2]
        buf_k, buf_v = self.keys[layer], self.values[layer]
        if buf_k is None or buf_k.shape[2] < P + Q or buf_k.shape[0] != k.shape[0]:
            cap = max(64, 2 * (P + Q))
            new_k = k.new_empty(k.shape[0], k.shape[1], cap, k.shape[3])
            new_v = v.new_empty(v.shape[0], v.shape[1], cap, v.shape[3])
            if buf_k is not None and P:
                new_k[:, :, :P] = buf_k[:, :, :P]
                new_v[:, :, :P] = buf_v[:, :, :P]
            self.keys[layer], self.values[layer] = buf_k, buf_v = new_k, new_v
        buf_k[:, :, P:P + Q] = k
        buf_v[:, :, P:P + Q] = v
        return buf_k[:, :, :P + Q], buf_v[:, :, :P + Q]


def _mask(Q: int, P: int, attention_mask: torch.Tensor | None, device, dtype) -> torch.Tensor | None:
    """The attention mask for Q new tokens after P cached ones: None (Q = 1, no padding) or
    additive (B or 1, 1, Q, P + Q). A 2-D padding mask (B, P + Q) of 1/0 is combined with the
    causal rule; a 4-D additive mask (token trees) is used as given. A query always sees itself,
    so padded positions get finite (ignored) outputs instead of NaN."""
    if attention_mask is not None and attention_mask.dim() == 4:
        return attention_mask[..., : P + Q].to(dtype)
    if attention_mask is None and Q == 1:
        return None
    j = torch.arange(P + Q, device=device)
    i = torch.arange(Q, device=device)[:, None] + P
    allowed = (j[None, :] <= i)[None, None]  # (1, 1, Q, P+Q)
    if attention_mask is not None:
        allowed = allowed & attention_mask[:, None, None, : P + Q].bool()
    allowed = allowed | (j[None, :] == i)[None, None]
    return torch.zeros(allowed.shape, device=device, dtype=dtype).masked_fill_(~allowed, float("-inf"))


@torch.no_grad()
def forward(model, input_ids: torch.Tensor, cache: KVCache, position_ids: torch.Tensor | None = None,
            attention_mask: torch.Tensor | None = None, logits_to_keep: int = 0):
    """One cached step of a Llama-recipe ``model`` (a ``LlamaForCausalLM``).

    input_ids (B, Q) after ``cache.length`` cached positions -> (logits (B, Q', V_head), hidden
    (B, Q, H) after the final norm); ``Q' = logits_to_keep`` last positions (0 = all). The cache
    grows by Q.
    """
    if not supports(model):
        raise ValueError("model must be a plain Llama-recipe causal LM (lean_llama.supports(model) is False)")
    cfg, inner = model.config, model.model
    B, Q = input_ids.shape
    P = cache.length
    H, Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    D = getattr(cfg, "head_dim", None) or cfg.hidden_size // H
    eps = cfg.rms_norm_eps
    if position_ids is None:
        position_ids = torch.arange(P, P + Q, device=input_ids.device)[None].expand(B, Q)
    x = inner.embed_tokens(input_ids)  # (B, Q, hidden)
    theta = (cfg.rope_parameters or {}).get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
    cos, sin = rope_angles(position_ids, D, theta, x.dtype)  # (B, 1, Q, D/2), once for all layers
    mask = _mask(Q, P, attention_mask, x.device, x.dtype)
    for li, layer in enumerate(inner.layers):
        att = layer.self_attn
        h = rms_norm(x, layer.input_layernorm.weight, eps)
        q = att.q_proj(h).view(B, Q, H, D).transpose(1, 2)  # (B, H, Q, D)
        k = att.k_proj(h).view(B, Q, Hkv, D).transpose(1, 2)  # (B, Hkv, Q, D)
        v = att.v_proj(h).view(B, Q, Hkv, D).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        keys, values = cache.write(li, k, v)  # (B, Hkv, P+Q, D)
        o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=att.scaling,
                                           enable_gqa=H != Hkv)  # (B, H, Q, D)
        x = x + att.o_proj(o.transpose(1, 2).reshape(B, Q, H * D))
        h = rms_norm(x, layer.post_attention_layernorm.weight, eps)
        mlp = layer.mlp
        x = x + mlp.down_proj(F.silu(mlp.gate_proj(h)) * mlp.up_proj(h))
    cache.length = P + Q
    hidden = rms_norm(x, inner.norm.weight, eps)  # (B, Q, hidden)
    keep = hidden[:, -logits_to_keep:] if logits_to_keep else hidden
    return model.lm_head(keep), hidden


class LeanTrimmedLM(TrimmedLM):
    """A :class:`refimpl.drafts.TrimmedLM` whose cached steps run through :func:`forward` (same
    logits, a third less per-call overhead, its own preallocated :class:`KVCache`)."""

    def __post_init__(self):
        super().__post_init__()
        if not supports(self.model):
            raise ValueError("model must be a plain Llama-recipe causal LM (lean_llama.supports(model) is False)")

    def new_cache(self):
        return KVCache(self.num_layers)

    @torch.no_grad()
    def forward_trimmed(self, input_ids, cache=None, position_ids=None, attention_mask=None,
                        output_hidden_states=False):
        if cache is None:
            cache = self.new_cache()
        dev = self.device
        logits, hidden = forward(
            self.model, input_ids.to(dev), cache,
            position_ids=None if position_ids is None else position_ids.to(dev),
            attention_mask=None if attention_mask is None else attention_mask.to(dev))
        return (logits.float(), cache, hidden) if output_hidden_states else (logits.float(), cache)

    @classmethod
    def of(cls, trimmed: TrimmedLM) -> "LeanTrimmedLM":
        """The same trimmed draft (shared weights) with lean cached steps."""
        return cls(trimmed.model, trimmed.tokenizer, name=trimmed.name, kept_ids=trimmed.kept_ids,
                   context_vocab=trimmed.context_vocab)
