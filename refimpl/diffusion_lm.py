"""A masked diffusion language model from scratch: a bidirectional transformer with a MASK token.

Paper: "Large Language Diffusion Models" (LLaDA, Nie et al., arXiv 2502.09992).

Forward (masking) process: pick a mask ratio ``t ~ U(0, 1)`` per sequence and replace every
token independently by MASK with probability ``t``. The model ``p_theta(x0 | x_t)`` predicts
all masked tokens at once, with full (non-causal) attention. Training minimises LLaDA's
Eq. (3), an upper bound on the negative log-likelihood:

    L(theta) = - E_{t, x0, x_t} [ (1 / t) * sum_i 1[x_t^i = MASK] * log p_theta(x0^i | x_t) ] / T

(the ``1 / t`` weight makes it a bound on ``-log p(x0)``; see :func:`masked_diffusion_loss`).

Two models in the zoo, both trained on this CPU with ``python -m refimpl.train NAME``
(:mod:`refimpl.train.dllm`) and loaded by :func:`load_dir`:

- ``"tiny-dllm"``: King James Bible text with the ``tiny`` BPE tokenizer (MASK id 2, EOS 0, PAD 1).
- ``"tiny-dllm-rev"``: reverse 6 digits, ``"314159="`` -> ``"951413"`` + EOS, character vocabulary
  (:class:`CharTokenizer`), trained SFT-style (only the answer is ever masked) so quality is an
  exact-match accuracy (the task: :mod:`refimpl.digit_reversal`).

The network (:class:`DiffusionLM`) is a plain-torch Llama-style stack (RMSNorm, RoPE, SwiGLU,
tied embeddings) without a causal mask. Its ``forward`` takes an optional per-layer KV cache of
*context* tokens (keys with RoPE already applied) that the queries attend to bidirectionally
together with themselves; this is what the approximate block caches of Fast-dLLM
(:mod:`refimpl.diffusion`, ``cache="prefix"`` / ``"dual"``) need. The public samplers' calls work
as is: LLaDA's ``model(x).logits``, Fast-dLLM's (arXiv 2505.22618, Sec. 3.2) ``model(x, use_cache=True)
.past_key_values``, ``past_key_values=`` and ``replace_position=`` (see :class:`DiffusionLM`).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .lm import as_token_batch
from .primitives import RMSNorm, positions_from_mask, rope

# ---------------------------------------------------------------------------------------
# the network
# ---------------------------------------------------------------------------------------
@dataclass
class DLMConfig:
    vocab_size: int
    hidden_size: int = 192
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 512
    max_length: int = 256
    rope_theta: float = 10000.0
    mask_token_id: int = 2
    eos_token_id: int = 0
    pad_token_id: int = 1
    abs_pos: bool = False  # add learned absolute position embeddings (helps fixed-layout synthetic tasks)


class Block(nn.Module):
    def __init__(self, cfg: DLMConfig):
        super().__init__()
        h = cfg.hidden_size
        self.heads, self.theta = cfg.num_heads, cfg.rope_theta
        self.attn_norm = RMSNorm(h)
        self.qkv = nn.Linear(h, 3 * h, bias=False)
        self.o = nn.Linear(h, h, bias=False)
        self.mlp_norm = RMSNorm(h)
        self.gate_up = nn.Linear(h, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, h, bias=False)

    def forward(self, x, pos, kv=None, key_mask=None, slots=None):
        """x (B, Q, H) -> (B, Q, H) and the attended (k, v): context ``kv`` (B, H, S, D) then the
        queries (S + Q keys), or, with ``slots`` (B, Q), the context with the queries' K/V at their slots."""
        B, Q, Hd = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(B, Q, 3, self.heads, Hd // self.heads).permute(2, 0, 3, 1, 4)
        q, k = rope(q, pos, self.theta), rope(k, pos, self.theta)  # (B, H, Q, D)
        if kv is not None and slots is not None:  # the queries replace their own slots of the context
            idx = slots[:, None, :, None].expand_as(k)  # (B, H, Q, D)
            k, v = kv[0].scatter(2, idx, k), kv[1].scatter(2, idx, v)  # (B, H, S, D), out of place
        elif kv is not None:  # context tokens first, then the queries themselves
            k, v = torch.cat([kv[0], k], dim=2), torch.cat([kv[1], v], dim=2)  # (B, H, S + Q, D)
        attn_mask = None if key_mask is None else key_mask[:, None, None, :].bool()  # (B, 1, 1, keys)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)  # no causal mask
        x = x + self.o(a.transpose(1, 2).reshape(B, Q, Hd))
        g, u = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u), (k, v)


class DLMOutput(NamedTuple):
    """What :meth:`DiffusionLM.forward` returns: the field names of Hugging Face model outputs, so
    ``model(x).logits`` works, and a tuple, so ``logits, kv = model(x, pos, return_kv=True)`` too."""

    logits: torch.Tensor  # (B, Q, V) float32
    past_key_values: tuple | None = None  # per layer (k, v), each (B, H, keys, D); None without use_cache


class DiffusionLM(nn.Module):
    """Bidirectional transformer denoiser with the fields every dLLM sampler reads.

    - ``logits(input_ids)``: (B, T) -> (B, T, V) float32, full bidirectional attention, no grad.
    - ``forward(input_ids (B, Q), position_ids=None, kv=None, return_kv=False, attention_mask=None, *,
      past_key_values=None, use_cache=None, replace_position=None) -> DLMOutput(logits, past_key_values)``:
      ``kv`` (alias ``past_key_values``): per layer ``(k, v)`` each (B, H, S, D) of S context tokens
      (RoPE applied); the queries attend to context + themselves. ``replace_position`` (B, S) bool,
      Q ``True`` per row (Fast-dLLM's dual cache): the queries' K/V replace those slots (the cache
      passed in stays as is) and they attend to the S slots. ``attention_mask`` (B, keys) hides pads;
      ``position_ids`` default to the queries' key positions (real tokens only). ``return_kv`` (alias
      ``use_cache``): also return the ``(k, v)`` of every attended key, per layer.
    - ``mask_token_id``, ``eos_token_id``, ``pad_token_id``, ``tokenizer``, ``max_length``, ``device``.
    """

    def __init__(self, cfg: DLMConfig, tokenizer=None, name: str = "dllm"):
        super().__init__()
        self.cfg, self.tokenizer, self.name = cfg, tokenizer, name
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.pos_embed = nn.Embedding(cfg.max_length, cfg.hidden_size) if cfg.abs_pos else None
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size)
        nn.init.normal_(self.embed.weight, std=0.02)
        if self.pos_embed is not None:
            nn.init.normal_(self.pos_embed.weight, std=0.02)
        for blk in self.blocks:
            for lin in (blk.qkv, blk.o, blk.gate_up, blk.down):
                nn.init.normal_(lin.weight, std=0.02)
            for lin in (blk.o, blk.down):  # GPT-2 style scaled init of residual projections
                lin.weight.data.mul_(1 / math.sqrt(2 * cfg.num_layers))

    # the fields samplers and notebooks read
    mask_token_id = property(lambda self: self.cfg.mask_token_id)
    eos_token_id = property(lambda self: self.cfg.eos_token_id)
    pad_token_id = property(lambda self: self.cfg.pad_token_id)
    max_length = property(lambda self: self.cfg.max_length)
    vocab_size = property(lambda self: self.cfg.vocab_size)
    num_layers = property(lambda self: self.cfg.num_layers)
    device = property(lambda self: self.embed.weight.device)
    dtype = property(lambda self: self.embed.weight.dtype)

    def forward(self, input_ids, position_ids=None, kv=None, return_kv=False, attention_mask=None, *,
                past_key_values=None, use_cache=None, replace_position=None) -> DLMOutput:
        if kv is not None and past_key_values is not None:
            raise ValueError("past_key_values is an alias of kv: pass one of them")
        kv = past_key_values if kv is None else kv
        B, Q = input_ids.shape
        S = 0 if kv is None else kv[0][0].size(2)
        slots = None
        if replace_position is not None:
            rp = torch.as_tensor(replace_position, device=input_ids.device).bool()
            if kv is None or rp.shape != (B, S) or not bool((rp.sum(-1) == Q).all()):
                raise ValueError(f"replace_position must be a (B, S) = ({B}, {S}) bool with {Q} True per row, "
                                 "S the length of past_key_values")
            slots = rp.nonzero()[:, 1].view(B, Q)  # (B, Q): the cache slot of each query
        keys = S if slots is not None else S + Q
        if attention_mask is not None and tuple(attention_mask.shape) != (B, keys):
            raise ValueError(f"attention_mask must be (B, keys) = ({B}, {keys}), got {tuple(attention_mask.shape)}")
        if position_ids is None:  # the queries' key positions (pads not counted)
            key_pos = (positions_from_mask(attention_mask.long()) if attention_mask is not None
                       else torch.arange(keys, device=input_ids.device).expand(B, keys))  # (B, keys)
            position_ids = key_pos.gather(1, slots) if slots is not None else key_pos[:, S:]
        x = self.embed(input_ids)  # (B, Q, H)
        if self.pos_embed is not None:
            x = x + self.pos_embed(position_ids)
        new = []
        for i, blk in enumerate(self.blocks):
            x, layer_kv = blk(x, position_ids, None if kv is None else kv[i], attention_mask, slots)
            new.append(layer_kv)
        logits = F.linear(self.norm(x), self.embed.weight).float()  # tied head, (B, Q, V)
        return DLMOutput(logits, tuple(new) if (return_kv or use_cache) else None)

    @torch.no_grad()
    def logits(self, input_ids, attention_mask=None, position_ids=None) -> torch.Tensor:
        """(B, T) -> (B, T, V) float32 logits; for left-padded rows pass the 2-D ``attention_mask``."""
        input_ids = as_token_batch(input_ids).to(self.device)
        am = None if attention_mask is None else attention_mask.to(self.device)  # positions: real tokens only
        pos = None if position_ids is None else position_ids.to(self.device)
        return self.forward(input_ids, pos, attention_mask=am).logits

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids))


# ---------------------------------------------------------------------------------------
# the forward process and the loss
# ---------------------------------------------------------------------------------------
def forward_mask(x0: torch.Tensor, t: torch.Tensor, mask_token_id: int, maskable: torch.Tensor | None = None,
                 generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample x_t ~ q(x_t | x0): each (maskable) token becomes MASK with probability t[b].

    x0 (B, T), t (B,) -> (x_t (B, T), masked (B, T) bool).
    """
    u = torch.rand(x0.shape, generator=generator, device=x0.device)  # (B, T)
    masked = u < t[:, None]
    if maskable is not None:
        masked &= maskable
    return torch.where(masked, torch.full_like(x0, mask_token_id), x0), masked


def masked_diffusion_loss(model, x0: torch.Tensor, maskable: torch.Tensor | None = None,
                          t: torch.Tensor | None = None, generator: torch.Generator | None = None,
                          eps: float = 1e-3, weighting: str = "1/t") -> torch.Tensor:
    """LLaDA Eq. (3) (Eq. (5) with ``maskable`` = response positions for SFT).

    ``sum over masked positions of CE / t``, divided by the number of (maskable) tokens.
    ``t ~ U(eps, 1)`` per row unless given. ``weighting="mean"`` instead averages the CE over
    the masked tokens (no 1/t: not a likelihood bound, but lower-variance gradients; we use it
    for the synthetic task, where only accuracy matters).
    """
    B = x0.size(0)
    if t is None:
        t = eps + (1 - eps) * torch.rand(B, generator=generator, device=x0.device)  # (B,)
    xt, masked = forward_mask(x0, t, model.mask_token_id, maskable, generator)
    logits = model(xt).logits  # (B, T, V)
    ce = F.cross_entropy(logits.transpose(1, 2), x0, reduction="none")  # (B, T)
    if weighting == "mean":
        return (ce * masked).sum() / masked.sum().clamp(min=1)
    weighted = (ce * masked / t[:, None]).sum()
    denom = maskable.sum() if maskable is not None else torch.tensor(x0.numel(), device=x0.device)
    return weighted / denom.clamp(min=1)


@torch.no_grad()
def masked_token_eval(model, x0: torch.Tensor, ratios=(0.15, 0.5, 0.85), seed: int = 0, batch: int = 16) -> dict:
    """Validation metrics: mean CE on masked tokens at fixed mask ratios, and the NELBO bound.

    ``nelbo_per_token`` averages the 1/t-weighted loss over t on a grid (Monte Carlo of Eq. 3),
    an upper bound on the per-token NLL; ``ppl_bound = exp(nelbo_per_token)``.
    """
    gen = torch.Generator(device=x0.device).manual_seed(seed)  # the masks are drawn where x0 lives
    out = {}
    for r in ratios:
        tot, n = 0.0, 0
        for i in range(0, x0.size(0), batch):
            xb = x0[i: i + batch]
            xt, m = forward_mask(xb, torch.full((xb.size(0),), r, device=xb.device), model.mask_token_id, generator=gen)
            ce = F.cross_entropy(model(xt).logits.transpose(1, 2), xb, reduction="none")
            tot, n = tot + (ce * m).sum().item(), n + m.sum().item()
        out[f"masked_ce@{r}"] = round(tot / max(n, 1), 4)
    grid = [(i + 0.5) / 10 for i in range(10)]
    nelbo = 0.0
    for r in grid:
        for i in range(0, x0.size(0), batch):
            xb = x0[i: i + batch]
            xt, m = forward_mask(xb, torch.full((xb.size(0),), r, device=xb.device), model.mask_token_id, generator=gen)
            ce = F.cross_entropy(model(xt).logits.transpose(1, 2), xb, reduction="none")
            nelbo += (ce * m).sum().item() / r / x0.numel() / len(grid)
    out["nelbo_per_token"] = round(nelbo, 4)
    out["ppl_bound"] = round(math.exp(nelbo), 2)
    return out


# ---------------------------------------------------------------------------------------
# the synthetic task: reverse a string of digits (character vocabulary)
# ---------------------------------------------------------------------------------------
class CharTokenizer:
    """A character vocabulary with EOS, PAD and MASK specials (ids 0, 1, 2 like ``tiny``)."""

    SPECIALS = ["<|endoftext|>", "<|pad|>", "<|mask|>"]

    def __init__(self, chars: str):
        self.itos = self.SPECIALS + list(chars)
        self.stoi = {c: i for i, c in enumerate(self.itos)}
        self.eos_token_id, self.pad_token_id, self.mask_token_id = 0, 1, 2

    def __len__(self):
        return len(self.itos)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [self.stoi[c] for c in text]

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        out = []
        for i in ids:
            i = int(i)
            if i < 3:
                if not skip_special_tokens:
                    out.append({0: "<eos>", 1: "<pad>", 2: "_"}[i])
            else:
                out.append(self.itos[i])
        return "".join(out)

    def save_pretrained(self, path: str):
        with open(os.path.join(path, "char_vocab.json"), "w") as f:
            json.dump({"chars": "".join(self.itos[3:])}, f)

    @classmethod
    def from_pretrained(cls, path: str):
        with open(os.path.join(path, "char_vocab.json")) as f:
            return cls(json.load(f)["chars"])


# ---------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------
def load_dir(path: str, device=None, dtype=None, name: str | None = None) -> DiffusionLM:
    from safetensors.torch import load_file

    cfg_path = os.path.join(path, "config.json")
    if not os.path.exists(cfg_path):
        raise FileNotFoundError(f"no diffusion LM at {path} (missing config.json)")
    with open(cfg_path) as f:
        raw = json.load(f)
    kind = raw.pop("tokenizer", "hf")
    raw.pop("model_type", None)
    raw.pop("refimpl_model", None)
    if kind == "char":
        tok = CharTokenizer.from_pretrained(path)
    else:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path)
    model = DiffusionLM(DLMConfig(**raw), tok, name=name or os.path.basename(os.path.normpath(path)))
    state = {k: v.float() for k, v in load_file(os.path.join(path, "model.safetensors")).items()}
    model.load_state_dict(state)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return model.to(device=device, dtype=dtype or torch.float32).eval()
