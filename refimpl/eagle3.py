"""EAGLE-3: a feature draft that reads the target's low, middle and high layers, trained by running
itself (chapter 06b).

Paper: Li, Wei, Zhang, Zhang, "EAGLE-3: Scaling up Inference Acceleration of Large Language Models
via Training-Time Test", arXiv 2503.01840.

- **Multi-layer features (§3.2).** EAGLE-1 reads the target's top feature, which is shaped for the
  very next token; EAGLE-3 concatenates the residual streams entering three of the target's layers,
  low, middle and high (vLLM's default ids ``(2, L // 2, L - 3)``: :func:`default_taps`), and fuses
  them with one linear map ``g_t = fc([l_t; m_t; h_t])`` (3H -> H). The target's verification call
  returns them (``output_hidden_states=taps`` of :meth:`refimpl.lm.LM.forward`): no extra pass.
- **One decoder layer on (token, feature) (§3.2, vLLM's ``llama_eagle3.py``).** At input t the
  draft reads ``e = norm_in(embed(x_{t+1}))`` and ``a = norm_hid(g_t)``; attention takes their
  concatenation (2H wide) and its output is added to ``g_t`` (the residual); then a SiLU-gated MLP.
  The output ``o_t`` (before the final norm) is the draft's own feature: the next step's input in
  place of ``g``. Its own final norm and LM head give the draft distribution over a kept ("draft")
  vocabulary (``kept``; vLLM's ``d2t``), the head initialised from the target's rows (SafeAILab/EAGLE's
  ``traineagle3`` starts it at random; the target's rows are the best head there is before training, and
  a frozen head at those rows is the CPU recipe: :mod:`refimpl.train.eagle3`).
- **No feature regression; training-time test (§3.1, Fig. 5).** The loss is only the cross-entropy
  against the target's next-token distribution. Training unrolls the draft ``steps`` times on its
  own outputs (:func:`unroll`): step 0 reads the target's fused features; step j reads step j-1's
  outputs at the same index, the true token j further on, at position + j, and attends to step 0's
  keys causally plus the keys its own chain made at steps 1..j-1 (the diagonal of each later
  block: Fig. 5's mask). That is exactly what a tree node at depth j + 1 sees while decoding (the
  context, its ancestors, itself), so training sees what decoding sees; a test checks the unroll
  against the decoder's own draft steps. Upstream's trainer (``traineagle3/cnets.py``) also drops every
  position whose target argmax is outside the kept vocabulary and averages each step over all slots of
  the batch; ours keeps those positions and averages per step over its loss positions
  (:mod:`refimpl.train.eagle3` says why; ``recipe="upstream"`` there is theirs).

Decoding is :class:`refimpl.eagle.EagleProposer` unchanged (the draft's ``step`` / ``logits`` /
``fuse`` / ``taps`` are the interface): EAGLE-2's dynamic tree, the draft KV cache, the exact early
stop (:func:`refimpl.dynamic_tree.settled`) plus the chain tree's confidence ``floor``. Greedy is
exact and sampling lossless whatever the draft says (deterministic top-k children, SpecInfer's walk).
"""
from __future__ import annotations

import torch
from torch import nn

from .eagle import EagleProposer
from .generation import Generation, preset_options, required
from .lm import check_feature_draft, check_taps
from .primitives import causal, causal_after, positions_from_mask, rope, rope_theta
from .speculative import decode


def default_taps(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's low / middle / high layer ids: vLLM's ``(2, L // 2, L - 3)`` (SmolLM2-135M's 30
    layers: 2, 15, 27). A target under 8 layers (``tiny``: 4) takes ``(1, L // 2, L)``: its last
    layer does too much of the work to leave out, so "high" is the final normed state (vLLM's tap L is
    the residual stream before the final norm, another tensor: :func:`refimpl.export.write_eagle3`
    refuses such a draft)."""
    if num_layers >= 8:
        return 2, num_layers // 2, num_layers - 3
    return 1, num_layers // 2, num_layers


class Eagle3Draft(nn.Module):
    """The EAGLE-3 draft (see the module doc). ``embed`` (V, H): the target's token embedding,
    frozen (a buffer, never saved); ``head`` (V', H): the initial LM head rows (the target's ``kept``
    rows), trained; ``taps``: the target layers it reads. Attention: ``num_heads`` query heads and
    ``num_kv_heads`` key/value heads of size ``head_dim`` (the target's)."""

    def __init__(self, embed: torch.Tensor, head: torch.Tensor, taps, num_heads: int, num_kv_heads: int,
                 head_dim: int, intermediate: int, rope_theta: float = 10000.0, eps: float = 1e-6,
                 kept: torch.Tensor | None = None):
        super().__init__()
        H = embed.shape[1]
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
        self.taps, self.rope_theta, self.intermediate = tuple(taps), rope_theta, intermediate
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.register_buffer("embed", embed.detach().float().clone(), persistent=False)  # (V, H)
        self.register_buffer("kept", None if kept is None else kept.long().to(embed.device), persistent=False)
        self.fc = nn.Linear(len(self.taps) * H, H, bias=False)  # (3H -> H) the fusion
        self.norm_in, self.norm_hid, self.norm_mid, self.norm = (nn.RMSNorm(H, eps=eps) for _ in range(4))
        self.qkv = nn.Linear(2 * H, (num_heads + 2 * num_kv_heads) * head_dim, bias=False)
        self.o = nn.Linear(num_heads * head_dim, H, bias=False)
        self.gate_up = nn.Linear(H, 2 * intermediate, bias=False)
        self.down = nn.Linear(intermediate, H, bias=False)
        self.lm_head = nn.Parameter(head.detach().float().clone())  # (V', H)

    @property
    def hidden_size(self) -> int:
        return self.embed.shape[1]

    def fuse(self, feats: torch.Tensor) -> torch.Tensor:
        """(..., len(taps) H) the target's layer streams side by side -> (..., H) ``g``."""
        return self.fc(feats.to(self.fc.weight.dtype))

    def step(self, tok, feat, pos, allow, past=None):
        """Inputs ``(feat (B, T, H), tok (B, T))`` at positions ``pos`` (B, T): ``feat`` is ``g`` (fused
        target features) or the draft's own earlier outputs. ``allow`` (B, T, P + T) bool: query i may
        attend to key j (``past`` = (k, v), each (B, kv heads, P, d), first). -> (outputs o (B, T, H)
        before the final norm, (k, v) of these T inputs)."""
        B, T, H = feat.shape
        h, kv, d = self.num_heads, self.num_kv_heads, self.head_dim
        if allow is None:  # no padding: every key up to itself
            allow = causal_after(B, T, 0 if past is None else past[0].shape[2], feat.device)
        x = torch.cat([self.norm_in(self.embed[tok]), self.norm_hid(feat)], -1)  # (B, T, 2H)
        t = self.qkv(x).view(B, T, h + 2 * kv, d).transpose(1, 2)  # (B, heads, T, d)
        (q, k), v = rope(t[:, :h + kv], pos, self.rope_theta).split([h, kv], 1), t[:, h + kv:]  # q and k in one call
        K, V = (k, v) if past is None else (torch.cat([past[0], k], 2), torch.cat([past[1], v], 2))
        a = nn.functional.scaled_dot_product_attention(q, K, V, attn_mask=allow[:, None], enable_gqa=h != kv)
        r = feat + self.o(a.transpose(1, 2).reshape(B, T, h * d))  # (B, T, H) the residual stream
        g, u = self.gate_up(self.norm_mid(r)).chunk(2, -1)
        return r + self.down(nn.functional.silu(g) * u), (k, v)

    def logits(self, o: torch.Tensor) -> torch.Tensor:
        """(..., H) draft outputs -> (..., V') logits over the kept vocabulary."""
        return self.norm(o) @ self.lm_head.T

    def full(self, idx: torch.Tensor) -> torch.Tensor:
        """Indices into :meth:`logits`' last axis -> token ids."""
        return idx if self.kept is None else self.kept[idx]


def unroll(draft: Eagle3Draft, tok: torch.Tensor, g: torch.Tensor, mask: torch.Tensor, steps: int) -> list:
    """Training-time test: ``steps`` draft steps over a whole sequence at once.

    ``tok`` (B, T) the tokens x_{t+1} and ``g`` (B, T, H) the fused features g_t of inputs t; ``mask``
    (B, T) 1 = real (pads on the right). Step j (0-based) at index t reads token ``tok[t + j]`` (0 past
    the end), step j-1's output at t (step 0: ``g_t``), at position ``pos_t + j``; it attends to step 0's
    keys at indices <= t and to steps 1..j's keys at index t alone. -> ``[o_0, ..., o_{steps-1}]``,
    each (B, T, H): ``logits(o_j[:, t])`` predicts the token after ``tok[t + j]``."""
    B, T = tok.shape
    pos, allow0 = positions_from_mask(mask), causal(mask)  # (B, T), (B, T, T)
    eye = torch.eye(T, dtype=torch.bool, device=tok.device)[None].expand(B, T, T)
    out, (k, v) = draft.step(tok, g, pos, allow0)
    outs, ks, vs = [out], [k], [v]
    for j in range(1, steps):
        tj = torch.cat([tok[:, j:], torch.zeros_like(tok[:, :j])], 1)  # (B, T) the true token j further on
        allow = torch.cat([allow0] + [eye] * j, -1)  # (B, T, (j + 1) T)
        out, (k, v) = draft.step(tj, out, pos + j, allow, (torch.cat(ks, 2), torch.cat(vs, 2)))
        outs.append(out)
        ks.append(k)
        vs.append(v)
    return outs


def new_draft(target, taps=None, kept: torch.Tensor | None = None, **kw) -> Eagle3Draft:
    """An untrained EAGLE-3 draft shaped after ``target`` (its attention heads, MLP width, rope, norm
    eps; its embedding; the LM head's ``kept`` rows as the initial head); ``taps`` None:
    :func:`default_taps`."""
    c = target.config
    taps = check_taps(default_taps(c.num_hidden_layers) if taps is None else taps, c.num_hidden_layers)
    heads = c.num_attention_heads
    kw = {"num_heads": heads, "num_kv_heads": getattr(c, "num_key_value_heads", None) or heads,
          "head_dim": getattr(c, "head_dim", None) or c.hidden_size // heads, "intermediate": c.intermediate_size,
          "rope_theta": rope_theta(c), "eps": c.rms_norm_eps, **kw}
    W = target.model.get_output_embeddings().weight.detach()
    head = W if kept is None else W[kept.long().to(W.device)]
    return Eagle3Draft(target.model.get_input_embeddings().weight, head, taps, kept=kept, **kw)


#: named configurations (:func:`refimpl.generation.preset_options`): ``"cpu"``, the fastest lossless
#: configuration measured on SmolLM2-135M with the lean forward (``bench_results/capstone/``: a 5-node
#: tree of depth 5 from the top-2 nodes, floor 0.1, a strong copy prior); ``"paper"``, the EAGLE
#: repository's defaults for EAGLE-3 (SafeAILab/EAGLE ``EaModel.from_pretrained``: 60 nodes, depth 7,
#: top-10, no floor, no copy prior)
PRESETS = {"cpu": {"total": 5, "depth": 5, "topk": 2, "floor": 0.1, "copy": 12.0},
           "paper": {"total": 60, "depth": 7, "topk": 10, "floor": 0.0, "copy": 0.0}}


def generate(target, prompts, draft: Eagle3Draft | None = None, max_new_tokens: int = 64, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, generator: torch.Generator | None = None,
             eos_token_id=None, total: int | None = None, depth: int | None = None, topk: int | None = None,
             floor: float | None = None, copy: float | None = None, preset: str | None = None) -> Generation:
    """EAGLE-3 decoding: ``draft`` grows EAGLE-2's dynamic tree (``total`` nodes, ``depth`` levels,
    ``topk`` children and expanded nodes per level, no level grown below cumulative confidence
    ``floor``; ``copy`` > 0: the copy prior per node, :class:`refimpl.eagle.EagleProposer`). Options
    left None come from ``preset`` (:data:`PRESETS`; None: the target's device's). ``draft`` is required
    (``refimpl.generate(target, prompts, method="eagle3")`` takes the zoo's for the target, in its fast
    form); a draft passed in runs as given. Greedy: exactly ``autoregressive.generate``'s tokens;
    sampling: distributed exactly as sampling from ``target``."""
    required(draft, "draft", "eagle3")
    check_feature_draft(draft, Eagle3Draft, target)
    o = preset_options(PRESETS, preset, target, total=total, depth=depth, topk=topk, floor=floor, copy=copy)
    proposer = EagleProposer(draft.to(target.device).eval(), o["total"], o["depth"], o["topk"], o["floor"], o["copy"])
    return decode(target, proposer, prompts, max_new_tokens, temperature, top_k, top_p, generator, eos_token_id)
