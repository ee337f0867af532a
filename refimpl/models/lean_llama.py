"""A lean forward pass for Llama-recipe models: the same weights and math, less overhead.

Two costs sit on top of the arithmetic of a decode step, and this module removes what it can of both.

- **Per-call machinery.** A draft's cost ratio ``c`` (Leviathan et al., arXiv 2211.17192, section
  3.3: speed-up ``tau / (gamma * c + 1)``) is what one draft *call* costs, and for a 3-layer draft
  most of a Hugging Face call is not arithmetic but the mask builders, the rotary module, output
  dataclasses and a ``DynamicCache`` that reallocates every layer's keys and values at every step.
  Here: one loop over the layers, the rotary angles once per call, a preallocated :class:`KVCache`.
- **Reading the weights.** A one-token step of the 135 M target must read its 538 MB of fp32
  weights once; on a CPU each matrix-vector product is one oneDNN call with its own thread
  fork/join and a memory stream that restarts, so many small products read slower than a few
  large ones. When the model's linears are prepacked (:mod:`refimpl.models.cpu_linear`), the
  projections that read the same input are fused into one packed matrix per layer -- q, k and v
  (``(H + 2 Hkv) D`` rows), gate and up (``2 I`` rows) -- and the residual additions after
  ``o_proj`` and ``down_proj`` run inside the product. Four products per layer instead of seven.
  On an AVX2 CPU the products are :mod:`refimpl.models.cpu_gemv`'s, written for 1-16 rows and
  batch-invariant (a row gets the same bits in a block as alone), summing in another order than
  Hugging Face's (logits within ~1e-6 relative, the same greedy text); elsewhere, or with
  ``REFIMPL_GEMV=0``, they are oneDNN's (with its binary ``add`` post-op), the same dot products as
  Hugging Face's up to the order oneDNN sums in (~1e-7), the same greedy text.
- **The stages between the products.** With cpu_gemv's products all the layers of a step run in
  one kernel call (:func:`whole_layers`, :class:`refimpl.models.cpu_gemv.LayerStep`): norms, rotary, the cache
  write, attention and SwiGLU as loops in the same OpenMP region as the products, where stage by
  stage they are ~15 torch calls a layer and a fork/join per product (a ``probe`` gets those stages).

The math is ``LlamaForCausalLM``'s: RMSNorm, rotary position embedding (Su et al., arXiv
2104.09864, eq. 34; applied to q and k in one call), grouped-query attention (Ainslie et al.,
arXiv 2305.13245) and the SwiGLU MLP, straight from the model's own parameters. The Hugging Face
model itself is untouched and still runs everywhere else (``generate``, assisted generation,
training). Only the plain Llama recipe is covered (:func:`supports` says whether a model fits):
default rotary embedding, no attention or MLP biases, SiLU.

- :func:`forward`: one cached step; ``probe`` times its stages (:func:`refimpl.bench.breakdown`).
- :class:`LeanLM`: an :class:`refimpl.lm.LM` whose ``forward``/``logits`` run here -- what
  ``models.load`` returns for the SmolLM2 target on a CPU (``fast=False`` gives the plain one).
- :class:`LeanTrimmedLM`: the zoo's SmolLM2 draft, a VocabTrim draft whose cached steps run here.
"""
from __future__ import annotations

import contextlib
import weakref
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..drafts import TrimmedLM
from ..lm import LM, as_token_batch, check_taps
from ..primitives import inv_frequencies, rms_norm, rope_tables, rope_theta, rotate
from . import cpu_gemv
from .cpu_linear import PrepackedLinear, pack_weight, packed_linear
from .kv_cache import CacheLayer, KVCache  # noqa: F401  (lean_llama.KVCache: the chapters' name for it)


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


class Projections:
    """One decoder layer's four matrix products, as :func:`forward` calls them.

    ``packed``: q/k/v fused into one (H + 2 Hkv) D x hidden matrix, gate/up into one 2 I x hidden
    matrix, the residual added inside the ``o_proj`` and ``down_proj`` products. ``gemv``: those
    matrices go to :func:`refimpl.models.cpu_gemv.run` (in its panel layout, :func:`refimpl.models.cpu_gemv.pack`); otherwise they
    are prepacked for oneDNN. Not packed: the layer's own modules are called one by one (any device
    or dtype).
    """

    def __init__(self, layer, packed: bool, gemv: bool = False):
        att, mlp = layer.self_attn, layer.mlp
        self.layer, self.packed, self.gemv = layer, packed, packed and gemv
        self.sources = (att.q_proj.weight, att.k_proj.weight, att.v_proj.weight, att.o_proj.weight,
                        mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)
        self.norms = (layer.input_layernorm.weight, layer.post_attention_layernorm.weight)
        self.version = self.signature()
        if packed:
            q, k, v, o, g, u, d = (w.detach() for w in self.sources)
            prep = cpu_gemv.pack if self.gemv else pack_weight
            self.w_qkv = prep(torch.cat([q, k, v]))  # ((H + 2 Hkv) D, hidden)
            self.w_o = prep(o)
            self.w_gate_up = prep(torch.cat([g, u]))  # (2 I, hidden)
            self.w_down = prep(d)
            n1, n2 = (w.detach() for w in self.norms)
            self.fused = (n1, self.w_qkv, self.w_o, n2, self.w_gate_up, self.w_down)  # refimpl_layers' order

    def signature(self) -> tuple:
        """Changes when a source weight is moved or cast (new storage) or edited in place (its version
        counter): then the fused copies are rebuilt. Checked at a cache's first step (:func:`checked`)."""
        return tuple((w.data_ptr(), w._version) for w in self.sources + self.norms)

    def product(self, x: torch.Tensor, w: torch.Tensor, add: torch.Tensor | None = None) -> torch.Tensor:
        """``add + x @ W.T`` with a fused matrix ``w``, by the kernel this layer was built for."""
        if self.gemv:
            return cpu_gemv.run(x, w, add)  # operands fp32 on the CPU, w packed: built here
        return packed_linear(x, w, add=add)

    def qkv(self, h: torch.Tensor) -> torch.Tensor:
        """(B, Q, hidden) -> (B, Q, (H + 2 Hkv) D): q, k and v side by side."""
        if self.packed:
            return self.product(h, self.w_qkv)
        att = self.layer.self_attn
        return torch.cat([att.q_proj(h), att.k_proj(h), att.v_proj(h)], -1)

    def o(self, a: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """residual + o_proj(a), a (B, Q, H D)."""
        if self.packed:
            return self.product(a, self.w_o, residual)
        return residual + self.layer.self_attn.o_proj(a)

    def gate_up(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, Q, hidden) -> gate, up (B, Q, I) each."""
        if self.packed:
            return self.product(h, self.w_gate_up).chunk(2, -1)
        mlp = self.layer.mlp
        return mlp.gate_proj(h), mlp.up_proj(h)

    def down(self, a: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """residual + down_proj(a), a (B, Q, I)."""
        if self.packed:
            return self.product(a, self.w_down, residual)
        return residual + self.layer.mlp.down_proj(a)


#: What a step reads from a model's config, read once per model (:func:`dims`; the config's attribute
#: lookups cost ~30 us a step): head counts and size, MLP width, RMSNorm epsilon, attention scale,
#: rotary base and frequencies (D/2,) (:func:`refimpl.primitives.inv_frequencies`).
Dims = NamedTuple("Dims", [("H", int), ("Hkv", int), ("D", int), ("inter", int), ("eps", float), ("scale", float),
                           ("theta", float), ("inv", torch.Tensor)])


#: per model, its :class:`Dims`
DIMS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def dims(model) -> Dims:
    """``model``'s :class:`Dims`, checked with :func:`supports` on first use (ValueError if it does not fit)."""
    have = DIMS.get(model)
    if have is None or have.inv.device != model.lm_head.weight.device:
        if not supports(model):
            raise ValueError("model must be a plain Llama-recipe causal LM (lean_llama.supports(model) is False)")
        cfg = model.config
        H = cfg.num_attention_heads
        D = getattr(cfg, "head_dim", None) or cfg.hidden_size // H
        theta = rope_theta(cfg)
        have = DIMS[model] = Dims(H, cfg.num_key_value_heads, D, cfg.intermediate_size, cfg.rms_norm_eps,
                                  model.model.layers[0].self_attn.scaling, theta,
                                  inv_frequencies(D, theta, model.lm_head.weight.device))
    return have


#: per model, its layers' :class:`Projections` (built on first use, rebuilt when weights change)
PROJECTIONS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def projections(model) -> list[Projections]:
    """The layers' :class:`Projections`: fused when the model's linears are prepacked
    (:func:`refimpl.models.cpu_linear.prepack_linears`) and it sits on a CPU in fp32, then run by
    :mod:`refimpl.models.cpu_gemv` where it is available, by oneDNN otherwise."""
    inner = model.model
    packed = (isinstance(inner.layers[0].self_attn.q_proj, PrepackedLinear)
              and model.lm_head.weight.device.type == "cpu" and model.lm_head.weight.dtype == torch.float32)
    gemv = packed and cpu_gemv.available()
    have = PROJECTIONS.get(model)
    if (have is None or len(have) != len(inner.layers) or have[0].packed != packed or have[0].gemv != gemv
            or any(p.version != p.signature() for p in have)):
        have = PROJECTIONS[model] = [Projections(layer, packed, gemv) for layer in inner.layers]
    return have


def checked(model, cache: KVCache) -> list[Projections]:
    """:func:`projections`, whose check of every weight (270 on SmolLM2: ~0.4 ms a step, ~0.8 after a draft's
    work) runs at a cache's first step only: edit weights between generations (each has its own cache)."""
    if getattr(cache, "weights", None) is None or cache.weights[0] is not model:
        cache.weights = (model, projections(model))  # (the model, its layers' Projections)
    return cache.weights[1]


HEADS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  #: per model, its LM head's cpu_gemv.PackedCopy


def head(model, proj: Projections, hidden: torch.Tensor) -> torch.Tensor:
    """The LM head on ``hidden`` (B, Q', hidden) -> (B, Q', V), by the layers' kernel when it has no
    bias (its weight packed once, again when it is moved, cast or edited in place)."""
    lm_head = model.lm_head
    if proj.gemv and getattr(lm_head, "bias", None) is None:
        copy = HEADS.get(model) or HEADS.setdefault(model, cpu_gemv.PackedCopy())
        return cpu_gemv.run(hidden, copy.of(lm_head.weight))
    return lm_head(hidden)


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


NO_PROBE = contextlib.nullcontext()


def whole_layers(model, proj: Projections, x, P, cos2, sin2, attention_mask) -> cpu_gemv.LayerStep | None:
    """A :class:`refimpl.models.cpu_gemv.LayerStep` for this step when the layers' products are
    cpu_gemv's and the step fits the whole-layer kernel (head size <= 512, a mask of one row per
    query), else None: the layers then run stage by stage below (also when a ``probe`` times them)."""
    dm = dims(model)
    (B, Q, hidden), D = x.shape, cos2.shape[-1]
    H, Hkv = dm.H, dm.Hkv
    if not proj.gemv or D > 512 or x.dtype != torch.float32 or H % Hkv:
        return None
    mask = None  # the kernel applies the causal rule itself
    if attention_mask is not None:
        mask = _mask(Q, P, attention_mask, x.device, x.dtype)
        if mask.shape[1] != 1 or mask.shape[0] not in (1, B) or mask.shape[2:] != (Q, P + Q):
            return None
        mask = mask[:, 0].contiguous()  # (B or 1, Q, P + Q)
    tables = [t.expand(B, 1, Q, D).reshape(B, Q, D).contiguous() for t in (cos2, sin2)]
    return cpu_gemv.LayerStep(B, Q, P, hidden, H, Hkv, D, dm.inter, dm.eps, dm.scale, *tables, mask=mask)


def norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim as ``LlamaRMSNorm`` computes it: torch's fused ``F.rms_norm`` in
    fp32 (the same bits, fewer calls), the float32 round trip otherwise."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return rms_norm(x, weight, eps)


@torch.no_grad()
def forward(model, input_ids: torch.Tensor, cache: KVCache, position_ids: torch.Tensor | None = None,
            attention_mask: torch.Tensor | None = None, logits_to_keep: int = 0, probe=None, taps=()):
    """One cached step of a Llama-recipe ``model`` (a ``LlamaForCausalLM``).

    input_ids (B, Q) after ``cache.length`` cached positions -> (logits (B, Q', V_head), hidden
    (B, Q, H) after the final norm); ``Q' = logits_to_keep`` last positions (0 = all). ``taps``
    (layer ids, :func:`refimpl.lm.check_taps`): ``hidden`` is instead those layers' residual streams
    side by side (B, Q, len(taps) H), Hugging Face's ``hidden_states[i]`` for each i. The cache
    grows by Q. ``probe(stage)``, when given, returns a context manager entered around each stage
    (``embed``, ``norm``, ``qkv``, ``rope``, ``cache``, ``attention``, ``o_proj``, ``gate_up``,
    ``swiglu``, ``down``, ``lm_head``): a timer sees where a step's time goes.
    """
    dm = dims(model)  # (checks supports(model) once)
    layers = checked(model, cache)
    stage = probe or (lambda name: NO_PROBE)
    inner = model.model
    B, Q = input_ids.shape
    P = cache.length
    H, Hkv, D, eps = dm.H, dm.Hkv, dm.D, dm.eps
    if position_ids is None:
        position_ids = torch.arange(P, P + Q, device=input_ids.device)[None].expand(B, Q)
    with stage("embed"):
        x = inner.embed_tokens(input_ids)  # (B, Q, hidden)
    with stage("rope"):
        cos2, sin2 = rope_tables(position_ids, D, dm.theta, x.dtype, dm.inv)  # (B, 1, Q, D), once for all layers
    scale = dm.scale
    step = None if probe else whole_layers(model, layers[0], x, P, cos2, sin2, attention_mask)
    mask = None if step is not None else _mask(Q, P, attention_mask, x.device, x.dtype)  # stage by stage
    streams = {}  # layer id -> its input residual stream (B, Q, hidden), for ``taps``
    if step is not None:  # every layer in one kernel call -> each one's output (layers, B, Q, hidden)
        outs = step.run(x, [p.fused for p in layers], [cache.buffers(li, B, Hkv, Q, D, x) for li in range(len(layers))])
        streams = {li: x if li == 0 else outs[li - 1] for li in taps if li < len(layers)}
        x = outs[-1]
    for li, proj in enumerate(layers if step is None else ()):
        layer = proj.layer
        if li in taps:
            streams[li] = x
        with stage("norm"):
            h = norm(x, layer.input_layernorm.weight, eps)  # (B, Q, hidden)
        with stage("qkv"):
            t = proj.qkv(h)  # (B, Q, (H + 2 Hkv) D)
        with stage("rope"):
            qk = rotate(t[..., :(H + Hkv) * D].view(B, Q, H + Hkv, D).transpose(1, 2), cos2, sin2)
            q, k = qk[:, :H], qk[:, H:]  # (B, H, Q, D), (B, Hkv, Q, D)
            v = t[..., (H + Hkv) * D:].view(B, Q, Hkv, D).transpose(1, 2)
        with stage("cache"):
            keys, values = cache.write(li, k, v)  # (B, Hkv, P+Q, D)
        with stage("attention"):
            o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale,
                                               enable_gqa=H != Hkv)  # (B, H, Q, D)
        with stage("o_proj"):
            x = proj.o(o.transpose(1, 2).reshape(B, Q, H * D), x)
        with stage("norm"):
            h = norm(x, layer.post_attention_layernorm.weight, eps)
        with stage("gate_up"):
            gate, up = proj.gate_up(h)  # (B, Q, I) each
        with stage("swiglu"):
            a = F.silu(gate) * up
        with stage("down"):
            x = proj.down(a, x)
    cache.length = P + Q
    with stage("norm"):
        hidden = norm(x, inner.norm.weight, eps)  # (B, Q, hidden)
    with stage("lm_head"):
        logits = head(model, layers[0], hidden[:, -logits_to_keep:] if logits_to_keep else hidden)
    if taps:
        streams[len(inner.layers)] = hidden
        hidden = torch.cat([streams[i] for i in taps], -1)  # (B, Q, len(taps) hidden)
    return logits, hidden


def on_device(lm, input_ids, cache: KVCache, position_ids=None, attention_mask=None, logits_to_keep: int = 0,
              output_hidden_states=False):
    """:func:`forward` for an LM wrapper: the inputs moved to its device first; ``output_hidden_states``
    as :meth:`refimpl.lm.LM.forward` (True: the normed last layer; layer ids: ``taps``)."""
    dev = lm.device
    taps = () if isinstance(output_hidden_states, bool) else check_taps(output_hidden_states, lm.num_layers)
    return forward(lm.model, input_ids.to(dev), cache,
                   position_ids=None if position_ids is None else position_ids.to(dev),
                   attention_mask=None if attention_mask is None else attention_mask.to(dev),
                   logits_to_keep=logits_to_keep, taps=taps)


class LeanSteps:
    """What both lean wrappers add to their :class:`refimpl.lm.LM`: the model must fit
    :func:`supports`, and its cache is a :class:`KVCache`."""

    def __post_init__(self):
        super().__post_init__()
        if not supports(self.model):
            raise ValueError("model must be a plain Llama-recipe causal LM (lean_llama.supports(model) is False)")

    def new_cache(self):
        return KVCache(self.num_layers)


class LeanLM(LeanSteps, LM):
    """An :class:`refimpl.lm.LM` whose cached steps and ``logits`` run through :func:`forward`:
    the same logits as the Hugging Face forward of the same model (with oneDNN's products bit for
    bit on the AVX2 CPUs we ran on, ~1e-7 apart on an AVX-512 one; within ~1e-6 relative with :mod:`refimpl.models.cpu_gemv`'s), with a :class:`KVCache`. ``models.load`` returns one for a Llama-recipe
    target on a CPU in fp32; ``models.load(name, fast=False)`` returns the plain :class:`LM`.
    Handed a Hugging Face cache (a ``DynamicCache`` made elsewhere), ``forward`` runs Hugging
    Face's forward on it instead, so either kind of cache keeps working."""

    @torch.no_grad()
    def logits(self, input_ids, attention_mask=None, position_ids=None) -> torch.Tensor:
        out, _ = on_device(self, as_token_batch(input_ids), self.new_cache(), position_ids, attention_mask)
        return out.float()

    @torch.no_grad()
    def forward(self, input_ids, cache=None, position_ids=None, attention_mask=None,
                output_hidden_states=False, logits_to_keep=0):
        if cache is not None and not isinstance(cache, KVCache):  # a Hugging Face cache: its own forward
            return super().forward(input_ids, cache, position_ids, attention_mask, output_hidden_states, logits_to_keep)
        if cache is None:
            cache = self.new_cache()
        if attention_mask is not None and attention_mask.dim() == 4:
            attention_mask = attention_mask.to(dtype=self.dtype)
        logits, hidden = on_device(self, input_ids, cache, position_ids, attention_mask, logits_to_keep,
                                   output_hidden_states)
        return (logits.float(), cache, hidden) if output_hidden_states else (logits.float(), cache)


class LeanTrimmedLM(LeanSteps, TrimmedLM):
    """A :class:`refimpl.drafts.TrimmedLM` whose cached steps run through :func:`forward` (same
    logits, a third less per-call overhead, its own preallocated :class:`KVCache`)."""

    @torch.no_grad()
    def forward_trimmed(self, input_ids, cache=None, position_ids=None, attention_mask=None,
                        output_hidden_states=False, logits_to_keep: int = 0):
        if cache is None:
            cache = self.new_cache()
        logits, hidden = on_device(self, input_ids, cache, position_ids, attention_mask, logits_to_keep)
        return (logits.float(), cache, hidden) if output_hidden_states else (logits.float(), cache)

    @classmethod
    def of(cls, trimmed: TrimmedLM) -> "LeanTrimmedLM":
        """The same trimmed draft (shared weights) with lean cached steps."""
        return cls(trimmed.model, trimmed.tokenizer, name=trimmed.name, kept_ids=trimmed.kept_ids,
                   context_vocab=trimmed.context_vocab)
