"""DFlash: a block-diffusion drafter conditioned on the target's own features, one forward per block
(chapter 15b).

Paper: Chen, Liang, Liu, "DFlash: Block Diffusion for Flash Speculative Decoding", arXiv 2602.06036;
code: z-lab/dflash ``dflash/model.py``; vLLM's ``model_executor/models/qwen3_dflash.py``.

- **The drafter (§3.1, §4.1).** A few decoder layers that draft a whole block ``[root, MASK, ..., MASK]``
  (``block`` positions after the last committed token; the root is the token the target verifies first)
  in ONE forward, attending to each other without a causal mask: a small block-diffusion model
  denoising the block in one step. The target's embedding embeds the block and the target's LM head
  reads the drafter's output (both shared and frozen); slot ``i`` predicts the token ``i`` after the root.
- **Conditioned on the target (§4.1).** The residual streams of a few target layers (``taps``, spread
  from shallow to deep: :func:`default_taps`) at every committed token are concatenated and fused,
  ``ctx = hidden_norm(fc([h_1; ...; h_m]))``, and *injected as keys and values into every draft layer*:
  layer ``l``'s attention keys are ``k_proj([ctx; norm(x)])`` (values alike), so the block reads the
  target's view of the context at every layer (``extract_context_feature``; EAGLE-3 feeds features in
  only at the input). The context's keys and values stay in the drafter's cache; the block's are dropped.
- **Training (§4.2).** On the target's own responses: random anchor positions per sequence, each
  anchor's block ``[x_a, MASK, ...]`` sees the context strictly before the anchor and its own block
  (:func:`block_loss`: one forward for all of a sequence's anchors with that sparse mask); cross-entropy
  of slot ``i`` against ``x_{a+i}`` weighted ``exp(-(i - 1) / decay)``: the early slots decide how many
  tokens are accepted.

The layer is Qwen3's (vLLM's ``qwen3_dflash.py``: per-head RMSNorm of queries and keys, no biases,
SwiGLU), in plain torch with an explicit boolean mask. Drafting is a :class:`~refimpl.speculative.Proposer`
(:class:`DFlashProposer`): one draft call a step, chains verified greedily or by lossless speculative
sampling (each slot drawn from its own ``q_i``), or a tree over the slots' top-k. Ours against upstream:
the head may score a kept subset of the vocabulary (``kept``, as our EAGLE-3 draft's; upstream scores
all of it); a target under 8 layers takes distinct taps spread over all its layers (upstream's rule
repeats a layer there); the mask token's embedding is the target's row for ``mask_id``, as upstream;
the first block is drafted at the first step after the prefill (vLLM drafts one right after the
prefill, so it verifies one block more on the same text); upstream's ``dflash_generate`` decodes one
sequence at a time, ours a ragged batch; sampling draws each slot from its own ``q_i`` and verifies with
the lossless rule, as upstream's ``dflash_generate`` at ``temperature > 0``.
"""
from __future__ import annotations

import torch
from torch import nn

from .generation import Generation, check_positive_int, paying_slots, preset_options, required
from .lm import check_feature_draft, check_taps
from .primitives import RMSNorm, positions_from_mask, rope_tables, rope_theta, rotate
from .speculative import Needs, Proposal, Proposer, decode
from .tree import pack, slot_proposal


def default_taps(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """The target's residual streams the drafter reads, as :meth:`refimpl.lm.LM.forward`'s layer ids (the
    output of layer ``j`` is stream ``j + 1``): upstream's ``build_target_layer_ids`` (one per draft layer,
    spread from layer 1 to layer L - 3; the middle one for a 1-layer draft); where that repeats a layer
    (a target under 8 layers) the ids spread over 1 .. L instead."""
    L, n = num_target_layers, num_draft_layers
    ids = [L // 2] if n == 1 else [int(round(1 + i * (L - 4) / (n - 1))) for i in range(n)]
    if len(set(ids)) < n:
        ids = [int(round(i * (L - 1) / max(n - 1, 1))) for i in range(n)]
    return tuple(i + 1 for i in ids)


class DFlashLayer(nn.Module):
    """Qwen3's decoder layer with the context injected as extra keys / values (see the module doc)."""

    def __init__(self, H: int, heads: int, kv_heads: int, d: int, intermediate: int, eps: float):
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads, d
        self.input_norm, self.post_norm = RMSNorm(H, eps), RMSNorm(H, eps)
        self.q_proj, self.o_proj = nn.Linear(H, heads * d, bias=False), nn.Linear(heads * d, H, bias=False)
        self.k_proj, self.v_proj = nn.Linear(H, kv_heads * d, bias=False), nn.Linear(H, kv_heads * d, bias=False)
        self.q_norm, self.k_norm = RMSNorm(d, eps), RMSNorm(d, eps)
        self.gate, self.up = nn.Linear(H, intermediate, bias=False), nn.Linear(H, intermediate, bias=False)
        self.down = nn.Linear(intermediate, H, bias=False)

    def forward(self, x, ctx, tables, allow, past=None):
        """``x`` (B, Q, H) the block's stream, ``ctx`` (B, C, H) new context features; ``tables`` the rotary
        tables at the C + Q positions; ``allow`` (B, Q, P + C + Q) over [past context, new context, block];
        ``past`` the cached (k, v) (B, kv heads, P, d). -> (x (B, Q, H), (k, v) of the new context)."""
        B, Q, _ = x.shape
        C = ctx.shape[1]
        h = self.input_norm(x)
        q = self.q_norm(self.q_proj(h).view(B, Q, self.heads, self.d)).transpose(1, 2)  # (B, h, Q, d)
        kv_in = torch.cat([ctx, h], 1)  # (B, C + Q, H): the context as it is, the block normed
        k = self.k_norm(self.k_proj(kv_in).view(B, C + Q, self.kv_heads, self.d)).transpose(1, 2)
        v = self.v_proj(kv_in).view(B, C + Q, self.kv_heads, self.d).transpose(1, 2)  # (B, kv, C + Q, d)
        cos2, sin2 = tables
        q, k = rotate(q, cos2[:, :, C:], sin2[:, :, C:]), rotate(k, cos2, sin2)
        K = k if past is None else torch.cat([past[0], k], 2)
        V = v if past is None else torch.cat([past[1], v], 2)
        a = nn.functional.scaled_dot_product_attention(q, K, V, attn_mask=allow[:, None],
                                                       enable_gqa=self.heads != self.kv_heads)  # (B, h, Q, d)
        x = x + self.o_proj(a.transpose(1, 2).reshape(B, Q, self.heads * self.d))
        h = self.post_norm(x)
        return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h)), (k[:, :, :C], v[:, :, :C])


class DFlashDraft(nn.Module):
    """The DFlash drafter (see the module doc). ``embed`` (V, H) and the head rows ``head`` (V', H) are
    the target's, frozen (never saved); ``kept`` (V',) token ids the head scores (None: all V); ``taps``
    the target streams it reads; ``block`` its block size (the root + ``block - 1`` drafts); ``mask_id``
    the token whose embedding fills the draft slots; ``accept`` (block - 1,) its chain's acceptance per depth
    on held-out text, as its trainer measured it (None: not measured; :func:`cpu_block` reads it)."""

    def __init__(self, embed: torch.Tensor, head: torch.Tensor, taps, num_layers: int, num_heads: int,
                 num_kv_heads: int, head_dim: int, intermediate: int, block: int, mask_id: int,
                 rope_theta: float = 10000.0, eps: float = 1e-6, kept: torch.Tensor | None = None,
                 accept=None):
        super().__init__()
        H = embed.shape[1]
        self.taps, self.block, self.mask_id, self.rope_theta = tuple(taps), block, mask_id, rope_theta
        self.accept = None if accept is None else tuple(float(a) for a in accept)
        self.num_heads, self.num_kv_heads, self.head_dim, self.intermediate = num_heads, num_kv_heads, head_dim, intermediate
        self.register_buffer("embed", embed.detach().float().clone(), persistent=False)  # (V, H)
        self.register_buffer("kept", None if kept is None else kept.long().to(embed.device), persistent=False)
        self.head = nn.Linear(H, head.shape[0], bias=False)  # (V', H) the target's rows, frozen
        self.head.weight = nn.Parameter(head.detach().float().clone(), requires_grad=False)
        self.fc = nn.Linear(len(self.taps) * H, H, bias=False)
        self.hidden_norm, self.norm = RMSNorm(H, eps), RMSNorm(H, eps)
        self.layers = nn.ModuleList(DFlashLayer(H, num_heads, num_kv_heads, head_dim, intermediate, eps)
                                    for _ in range(num_layers))

    @property
    def hidden_size(self) -> int:
        return self.embed.shape[1]

    def context(self, feats: torch.Tensor) -> torch.Tensor:
        """(..., len(taps) H) the target's streams side by side -> (..., H) the fused context."""
        return self.hidden_norm(self.fc(feats.to(self.fc.weight.dtype)))

    def step(self, tok, ctx, pos, allow, past=None):
        """The block ``tok`` (B, Q) after new context features ``ctx`` (B, C, H) at positions ``pos``
        (B, C + Q) (context, then block); ``allow`` (B, Q, P + C + Q); ``past``: per layer the cached (k, v).
        -> (the block's normed outputs (B, Q, H), per layer the new context's (k, v))."""
        x = self.embed[tok]  # (B, Q, H)
        tables = rope_tables(pos, self.head_dim, self.rope_theta, x.dtype)  # (B, 1, C + Q, d) each
        new = []
        for i, layer in enumerate(self.layers):
            x, kv = layer(x, ctx, tables, allow, None if past is None else past[i])
            new.append(kv)
        return self.norm(x), new

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """(..., H) outputs -> (..., V') the target's head (kept rows)."""
        return self.head(out)

    def full(self, idx: torch.Tensor) -> torch.Tensor:
        """Indices into :meth:`logits`' last axis -> token ids."""
        return idx if self.kept is None else self.kept[idx]

    def vocab_logits(self, out: torch.Tensor, vocab: int) -> torch.Tensor:
        """(..., H) -> (..., vocab) logits, -inf outside the kept tokens."""
        small = self.logits(out)
        if self.kept is None:
            return small
        return small.new_full((*small.shape[:-1], vocab), float("-inf")).index_copy_(-1, self.kept, small)


def loss_decay(block: int) -> float:
    """The position decay of :func:`block_loss` for a block of ``block`` tokens, as SpecForge's DFlash recipe
    recommends it (7 for blocks of 16, 5 for 10, 4 for 8: slot i's weight ``exp(-(i - 1) / decay)`` falls to
    about a seventh by the block's end), linear between those sizes and held at the ends outside them."""
    if not (isinstance(block, int) and block >= 2):
        raise ValueError(f"block must be an int >= 2, got {block!r}")
    points = ((8, 4.0), (10, 5.0), (16, 7.0))
    if block <= points[0][0]:
        return points[0][1]
    for (b0, d0), (b1, d1) in zip(points, points[1:]):
        if block <= b1:
            return d0 + (d1 - d0) * (block - b0) / (b1 - b0)
    return points[-1][1]


def block_loss(draft: DFlashDraft, tok: torch.Tensor, feats: torch.Tensor, anchors: torch.Tensor,
               weights: torch.Tensor | None = None, decay: float = 7.0):
    """DFlash's training loss for one batch (see the module doc): ``tok`` (B, T) the text, ``feats`` (B, T,
    len(taps) H) the target's streams at it, ``anchors`` (B, N) block starts (-1: none); ``weights`` (B, T)
    which tokens may be targets (the response's; None: all). All anchors of a row in one forward: block n
    sees the context before its anchor and itself. -> ``(loss, per-slot accuracy (Q - 1,))``, the loss the
    average cross-entropy of slot i against ``tok[a + i]`` weighted ``exp(-(i - 1) / decay)`` (the paper's
    gamma: here ``gamma`` is always a draft length)."""
    B, T = tok.shape
    N, Q, dev = anchors.shape[1], draft.block, tok.device
    ctx = draft.context(feats)  # (B, T, H)
    off = torch.arange(Q, device=dev)
    bpos = anchors.clamp(min=0)[:, :, None] + off  # (B, N, Q) the blocks' positions
    blk = torch.full((B, N, Q), draft.mask_id, dtype=torch.long, device=dev)
    blk[:, :, 0] = tok.gather(1, anchors.clamp(min=0))  # the root: the anchor's own token
    see_ctx = torch.arange(T, device=dev)[None, None, None, :] < anchors[:, :, None, None]  # (B, N, 1, T)
    same = torch.eye(N, dtype=torch.bool, device=dev)[None, :, None, :, None].expand(B, N, Q, N, Q)
    allow = torch.cat([see_ctx.expand(B, N, Q, T), same.reshape(B, N, Q, N * Q)], -1).reshape(B, N * Q, T + N * Q)
    allow[:, torch.arange(N * Q, device=dev), T + torch.arange(N * Q, device=dev)] = True  # (no empty rows)
    pos = torch.cat([torch.arange(T, device=dev).expand(B, T), bpos.reshape(B, N * Q)], 1)
    out, _ = draft.step(blk.reshape(B, N * Q), ctx, pos, allow)
    logits = draft.logits(out.view(B, N, Q, -1)[:, :, 1:]).float()  # (B, N, Q - 1, V')
    at = bpos[:, :, 1:]  # (B, N, Q - 1) the positions the slots predict
    ok = (anchors[:, :, None] >= 0) & (at < T)
    target = tok.gather(1, at.clamp(max=T - 1).reshape(B, -1)).view(B, N, Q - 1)
    if weights is not None:
        ok &= weights.gather(1, at.clamp(max=T - 1).reshape(B, -1)).view(B, N, Q - 1).bool()
    if draft.kept is not None:  # a target outside the kept vocabulary cannot be drafted: no loss there
        col = torch.full((draft.embed.shape[0],), -1, dtype=torch.long, device=dev).index_copy_(
            0, draft.kept, torch.arange(len(draft.kept), device=dev))
        target, ok = col[target], ok & (col[target] >= 0)
    slot_w = torch.exp(-torch.arange(Q - 1, device=dev, dtype=torch.float32) / decay)  # (Q - 1,)
    ce = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.clamp(min=0).reshape(-1),
                                     reduction="none").view(B, N, Q - 1)
    w = slot_w * ok
    right = ((logits.argmax(-1) == target) & ok).float().sum((0, 1)) / ok.float().sum((0, 1)).clamp(min=1)
    return (ce * w).sum() / w.sum().clamp(min=1e-9), right


def new_draft(target, num_layers: int = 1, block: int = 8, mask_id: int | None = None, taps=None,
              kept: torch.Tensor | None = None, **kw) -> DFlashDraft:
    """An untrained drafter shaped after ``target`` (its heads, head size, MLP width, rope, norm eps; its
    embedding; its LM head's ``kept`` rows), ``num_layers`` layers, ``block`` positions a block; ``mask_id``
    None: the tokenizer's mask token; ``taps`` None: :func:`default_taps`."""
    c = target.config
    mask_id = getattr(target.tokenizer, "mask_token_id", None) if mask_id is None else mask_id
    if mask_id is None:
        raise ValueError("mask_id is required: the target's tokenizer has no mask token")
    taps = check_taps(default_taps(c.num_hidden_layers, num_layers) if taps is None else taps, c.num_hidden_layers)
    heads = c.num_attention_heads
    kw = {"num_heads": heads, "num_kv_heads": getattr(c, "num_key_value_heads", None) or heads,
          "head_dim": getattr(c, "head_dim", None) or c.hidden_size // heads, "intermediate": c.intermediate_size,
          "rope_theta": rope_theta(c), "eps": c.rms_norm_eps, **kw}
    W = target.model.get_output_embeddings().weight.detach()
    return DFlashDraft(target.model.get_input_embeddings().weight, W if kept is None else W[kept.long().to(W.device)],
                       taps, num_layers, block=block, mask_id=mask_id, kept=kept, **kw)


class DFlashProposer(Proposer):
    """Proposer: each step ``draft`` reads the target's features at the tokens committed since its last
    call (their keys / values join its cache) and drafts ``[root, MASK x (g - 1)]`` in one call, ``g`` at
    most ``block``: a chain of ``g - 1`` tokens, or with ``topk`` > 1 a ``total``-node tree over the slots'
    top-k. The first call (the prefill) proposes nothing: the prompt's features do not exist yet."""

    def __init__(self, draft: DFlashDraft, block: int, topk: int, total: int):
        self.draft = draft
        self.block, self.topk, self.total = (check_positive_int(n, v) for n, v in
                                             (("block", block), ("topk", topk), ("total", total)))

    def start(self, ids, mask, settings) -> Needs:
        real = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
        self.settings, self.device, self.pmask = settings, ids.device, real
        self.roots = [row[-1] for row in ids.tolist()]  # each row's next token for the target: the block's root
        self.pending = None  # per row (n, len(taps) H): committed tokens' features not in the cache yet
        self.kv, self.kmask, self.done = None, None, [0] * ids.shape[0]  # the cache; cached tokens per row
        return Needs(hidden=self.draft.taps, trees=self.topk > 1)

    @torch.no_grad()
    def propose(self, caps: list[int]) -> Proposal:
        B, dev = len(caps), self.draft.embed.device
        g = min(self.block - 1, max(caps))  # drafts: the block is the root and g masks
        if self.pending is None or g <= 0:
            return pack([([], [])] * B, self.device)
        C = max(p.shape[0] for p in self.pending)
        ctx = torch.zeros((B, C, self.pending[0].shape[1]), device=dev)
        cmask = torch.zeros((B, C), dtype=torch.bool, device=dev)
        for r, p in enumerate(self.pending):  # left-padded new context
            ctx[r, C - p.shape[0]:], cmask[r, C - p.shape[0]:] = p, True
        start = torch.tensor(self.done, device=dev)
        cpos = positions_from_mask(cmask.long(), start)  # (B, C)
        root = start + cmask.sum(-1)  # (B,) the root's position: after every committed token
        bpos = root[:, None] + torch.arange(g + 1, device=dev)  # (B, g + 1)
        blk = torch.full((B, g + 1), self.draft.mask_id, dtype=torch.long, device=dev)
        blk[:, 0] = torch.tensor(self.roots, device=dev)
        P = 0 if self.kv is None else self.kmask.shape[1]
        allow = torch.cat([self.kmask if self.kv is not None else cmask[:, :0], cmask,
                           torch.ones((B, g + 1), dtype=torch.bool, device=dev)], 1)[:, None, :].expand(B, g + 1, P + C + g + 1)
        out, new = self.draft.step(blk, self.draft.context(ctx), torch.cat([cpos, bpos], 1), allow, self.kv)
        self.kv = new if self.kv is None else [(torch.cat([a, k], 2), torch.cat([b, v], 2))
                                               for (a, b), (k, v) in zip(self.kv, new)]
        self.kmask = cmask if self.kmask is None else torch.cat([self.kmask, cmask], 1)
        self.done, self.pending = root.tolist(), [p[:0] for p in self.pending]
        logits = self.draft.logits(out[:, 1:]).float()  # (B, g, V') the masks' slots, over the head's rows
        return slot_proposal(logits, caps, self.settings, self.topk, self.total, self.device, self.draft.kept,
                             self.draft.embed.shape[0])

    def accept(self, v) -> None:
        """The new context: the features at the root and the accepted drafts (the prompt's too, at first)."""
        path = None if v.path is None else v.path.tolist()
        first = self.pending is None
        pending = []
        for r, new in enumerate(v.committed):
            n = len(new) - 1  # the accepted drafts; then the target's token, the next block's root
            nodes = (path[r][:n] if path is not None else list(range(n))) if n else []
            f = v.hidden[r, [0] + [1 + i for i in nodes]]  # (n + 1, taps H)
            if first:  # the prompt's tokens before the root, without the left padding
                fed = v.fed_hidden[r][self.pmask[r, : v.fed_hidden.shape[1]].to(v.fed_hidden.device)]
                f = torch.cat([fed, f])
            pending.append(f.float().to(self.draft.embed.device))
            self.roots[r] = new[-1]
        self.pending = pending

    def select(self, rows: torch.Tensor) -> None:
        keep = rows.tolist()
        self.roots, self.done = [self.roots[i] for i in keep], [self.done[i] for i in keep]
        self.pmask = self.pmask[rows.to(self.pmask.device)]
        if self.pending is not None:
            self.pending = [self.pending[i] for i in keep]
        if self.kv is not None:
            idx = rows.to(self.kmask.device)
            self.kv, self.kmask = [(k[idx], v[idx]) for k, v in self.kv], self.kmask[idx]


def cpu_block(draft: DFlashDraft) -> int:
    """The block the ``"cpu"`` preset runs ``draft`` at: the root and the slots its held-out acceptance
    (``draft.accept``) pays for (:func:`refimpl.generation.paying_slots`), at most its own block."""
    return 1 + paying_slots(draft.accept, draft.block - 1)


#: named configurations (:func:`refimpl.generation.preset_options`): ``"cpu"``, a chain over the block
#: :func:`cpu_block` picks from the drafter's measured acceptance (None: that block, its chain of
#: ``block - 1``); ``"paper"``, the release's blocks of 16, a chain (z-lab/dflash ``*-DFlash-b16``)
PRESETS = {"cpu": {"block": None, "topk": 1, "total": None}, "paper": {"block": 16, "topk": 1, "total": 15}}


def generate(target, prompts, draft: DFlashDraft | None = None, max_new_tokens: int = 64, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, generator: torch.Generator | None = None,
             eos_token_id=None, block: int | None = None, topk: int | None = None, total: int | None = None,
             preset: str | None = None) -> Generation:
    """DFlash decoding: ``draft`` drafts a block of ``block`` positions (the root + ``block - 1`` drafts) in
    one call per step (``topk`` > 1: a ``total``-node tree over the slots' top-k); options left None:
    ``preset``'s (:data:`PRESETS`). ``draft`` is required (``refimpl.generate(target, prompts,
    method="dflash")`` takes the zoo's). Greedy: exactly AR's tokens; sampling: exactly the target's."""
    required(draft, "draft", "dflash")
    check_feature_draft(draft, DFlashDraft, target)
    o = preset_options(PRESETS, preset, target, block=block, topk=topk, total=total)
    block = cpu_block(draft) if o["block"] is None else o["block"]
    total = block - 1 if o["total"] is None else o["total"]
    proposer = DFlashProposer(draft.to(target.device).eval(), block, o["topk"], total)
    return decode(target, proposer, prompts, max_new_tokens, temperature, top_k, top_p, generator, eos_token_id)
