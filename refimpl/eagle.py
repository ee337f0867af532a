"""An EAGLE-style feature-level draft growing EAGLE-2's dynamic token tree (chapter 06a).

Papers:
- Li, Wei, Zhang, Zhang, "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty",
  arXiv 2401.15077: draft at the *feature* level. At position t the draft reads the target's
  feature ``f_t`` together with the token ``x_{t+1}`` that was actually emitted after it (the
  token sequence "advanced by one time step", which removes the sampling uncertainty) and
  predicts the next feature ``f_{t+1}``; the target's own frozen LM head turns a predicted feature
  into the draft distribution q; the target's frozen token embedding embeds the tokens. The draft
  is ``fc(concat(embed(x_{t+1}), f_t))`` (2H -> H) followed by ONE decoder layer. Trained with a
  Smooth-L1 feature regression plus 0.1 x the cross-entropy of the LM head on the predicted
  feature (:mod:`refimpl.train.eagle`).
- Li, Wei, Zhang, Zhang, "EAGLE-2: Faster Inference of Language Models with Dynamic Draft Trees",
  arXiv 2406.16858: the draft's confidence approximates the acceptance rate, so the tree is grown
  by *cumulative* confidence (the product of draft probabilities along the path): expand the
  ``topk`` nodes of each level with the highest cumulative confidence (each gets its top-``topk``
  children), to depth ``depth``, then re-rank every grown node and keep the ``total`` best.
  A child's value is at most its parent's, so the kept set is a tree (ties: the parent first).
  Named tree settings, measured and the release's: :data:`PRESETS`.

Our choices. ``LM.forward``'s hidden states are the target's state AFTER its final norm, the
feature EAGLE's own code uses (SafeAILab/EAGLE ``ea_model.py`` feeds ``base_model.model(...)[0]``, the
normed output its LM head reads) and vLLM's EAGLE-1 too, so the draft predicts *normed* features and
applies the LM head directly (no norm of its own). The decoder layer is a minimal Llama layer in plain torch
(RMSNorm, rotary causal attention, SiLU-gated MLP, residuals) with an explicit boolean mask and
extra keys / values. The draft's KV cache keeps the keys / values of every row's committed inputs;
each step runs the layer only on the new ones, then each level's expanded nodes attend to the
context and their ancestors (``depth`` draft calls per step) and the tree's keys are dropped.
``cache=False`` re-runs the whole context every step: the same trees (tested). Ragged rows are
left-padded. The tree's confidence is the draft's raw distribution (temperature 1). A draft may
score a kept subset of the vocabulary (``kept``; exactness does not depend on it). ``copy`` adds
the chain draft's copy prior (chapter 04b) to every node, as :mod:`refimpl.dynamic_tree` does; a
copy candidate outside the kept vocabulary gets a column of its own (:meth:`EagleProposer.children`).

Decoding is a proposer on :func:`refimpl.speculative.decode` (``wants_hidden``): it keeps every
row's committed tokens and their target features (the prompt's from ``Verdict.fed_hidden`` at the
first step, then the root's and the accepted path's from ``Verdict.hidden``). Children are top-k,
deterministic (``q = None``): greedy is exact, sampling lossless by SpecInfer's walk.
"""
from __future__ import annotations

import torch
from torch import nn

from .dynamic_tree import Growth, boost_columns, check_floor, settled
from .generation import Generation, check_positive_int, preset_options, required
from .lm import check_vocab, check_width
from .primitives import causal, causal_after, positions_from_mask, rope, rope_theta, unpad
from .speculative import Needs, Proposer, decode
from .tree import pack


class EagleDraft(nn.Module):
    """``fc(concat(embed(x_{t+1}), f_t))`` then one Llama-style decoder layer -> predicted ``f_{t+1}``.

    ``embed`` (V, H) and ``lm_head`` (V, H) are the target's, frozen (buffers, never saved). ``kept``
    (V',) token ids: the head scores only those rows of ``lm_head`` (None: all V); :meth:`full` maps
    its indices back to token ids. Saved as ``kept_ids`` (SmolLM2's 49,152-token head, as Medusa's)."""

    def __init__(self, embed: torch.Tensor, lm_head: torch.Tensor, num_heads: int = 4, intermediate: int | None = None,
                 rope_theta: float = 10000.0, eps: float = 1e-6, kept: torch.Tensor | None = None):
        super().__init__()
        H = embed.shape[1]
        if H % num_heads:
            raise ValueError(f"hidden size {H} is not divisible by num_heads={num_heads}")
        self.num_heads, self.rope_theta, self.intermediate = num_heads, rope_theta, intermediate or 4 * H
        self.register_buffer("embed", embed.detach().float().clone(), persistent=False)  # (V, H)
        kept = None if kept is None else kept.long().to(lm_head.device)
        self.register_buffer("kept", kept, persistent=False)  # (V',) or None
        head = lm_head.detach().float() if kept is None else lm_head.detach()[kept].float()
        self.register_buffer("lm_head", head.clone(), persistent=False)  # (V', H)
        self.fc = nn.Linear(2 * H, H)
        self.norm1, self.norm2 = nn.RMSNorm(H, eps=eps), nn.RMSNorm(H, eps=eps)
        self.qkv, self.o = nn.Linear(H, 3 * H, bias=False), nn.Linear(H, H, bias=False)
        self.gate_up = nn.Linear(H, 2 * self.intermediate, bias=False)
        self.down = nn.Linear(self.intermediate, H, bias=False)

    @property
    def hidden_size(self) -> int:
        return self.embed.shape[1]

    def step(self, tok, feat, pos, allow, past=None):
        """Inputs ``(feat (B, T, H), tok (B, T))`` at positions ``pos`` (B, T); ``allow`` (B, T, P + T)
        bool: query i may attend to key j (``past`` = (k, v), each (B, heads, P, d), first; None: every
        key up to itself, :func:`causal_after`). -> (predicted features (B, T, H), (k, v) of these T inputs)."""
        B, T, H = feat.shape
        if allow is None:
            allow = causal_after(B, T, 0 if past is None else past[0].shape[2], feat.device)
        x = self.fc(torch.cat([self.embed[tok], feat.to(self.embed.dtype)], -1))  # (B, T, H)
        qkv = self.qkv(self.norm1(x)).view(B, T, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)  # (3, B, h, T, d)
        (q, k), v = rope(qkv[:2], pos, self.rope_theta), qkv[2]  # (B, h, T, d) each
        K, V = (k, v) if past is None else (torch.cat([past[0], k], 2), torch.cat([past[1], v], 2))
        a = nn.functional.scaled_dot_product_attention(q, K, V, attn_mask=allow[:, None])  # (B, h, T, d)
        x = x + self.o(a.transpose(1, 2).reshape(B, T, H))
        g, u = self.gate_up(self.norm2(x)).chunk(2, -1)
        return x + self.down(nn.functional.silu(g) * u), (k, v)

    def forward(self, tok: torch.Tensor, feat: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Teacher-forced: (B, T) tokens x_{t+1}, (B, T, H) features f_t, (B, T) 1 = real (padding
        anywhere) -> (B, T, H) predicted f_{t+1}, causal over each row's real inputs."""
        mask = torch.ones_like(tok) if mask is None else mask
        return self.step(tok, feat, positions_from_mask(mask), causal(mask))[0]

    taps = None  # the target's last (normed) layer: ``Verdict.hidden`` as it comes

    def fuse(self, feats: torch.Tensor) -> torch.Tensor:
        """The target's features as the draft reads them: (..., H) unchanged (EAGLE-3 fuses layers)."""
        return feats.float()

    def logits(self, f: torch.Tensor) -> torch.Tensor:
        """(..., H) predicted features -> (..., V') the target's LM head on them (kept rows)."""
        return f @ self.lm_head.T

    def full(self, idx: torch.Tensor) -> torch.Tensor:
        """Indices into :meth:`logits`' last axis -> token ids."""
        return idx if self.kept is None else self.kept[idx]


def new_draft(target, **kw) -> EagleDraft:
    """An untrained draft shaped after ``target`` (its embedding, LM head, heads, MLP width, rope)."""
    c = target.config
    kw = {"num_heads": c.num_attention_heads, "intermediate": c.intermediate_size, "rope_theta": rope_theta(c),
          "eps": c.rms_norm_eps, **kw}
    return EagleDraft(target.model.get_input_embeddings().weight, target.model.get_output_embeddings().weight, **kw)


# -- the proposer -------------------------------------------------------------------------
class EagleProposer(Proposer):
    """Proposer: the draft reads every row's committed (token, feature) pairs, then grows EAGLE-2's
    dynamic tree below the next token (the root). The first call (the prefill) proposes nothing:
    the prompt's features do not exist yet.

    The draft layer's keys / values of the committed inputs stay cached across steps, and each step
    runs the layer only on the new ones (a run from an empty cache grows the same trees: tested).
    Growth stops early (:func:`refimpl.dynamic_tree.settled`): once deeper nodes could not enter the
    kept tree (exact: same tree, fewer draft calls), or no node of a level reaches cumulative
    confidence ``floor`` (0: EAGLE-2's rule). ``draft`` is an :class:`EagleDraft` or an EAGLE-3 draft
    (:mod:`refimpl.eagle3`): the proposer asks it for the target layers it reads (``taps``; None: the
    last, normed) and fuses them (``fuse``) as it stores the features. The tree's settings are
    explicit: :data:`PRESETS` names them. After :meth:`propose`, ``rows`` holds each row's ``(tokens,
    parents)`` (None: nothing proposed) and ``scores`` the kept nodes' cumulative log-confidence."""

    compact_at = 0.25  # squeeze the cache's padding out once every row has this fraction of it

    def __init__(self, draft, total: int, depth: int, topk: int, floor: float, copy: float):
        self.total, self.depth = check_positive_int("total", total), check_positive_int("depth", depth)
        self.topk, self.floor = check_positive_int("topk", topk), check_floor(floor)
        if not (isinstance(copy, (int, float)) and not isinstance(copy, bool) and 0.0 <= copy < float("inf")):
            raise ValueError(f"copy must be a logit bias >= 0 (0: no copy prior), got {copy!r}")
        self.copy = float(copy)  # the copy prior per node: its 3..2-gram candidate's logit + copy
        self.draft, kept = draft, draft.kept
        self.columns = None if kept is None else torch.full((draft.embed.shape[0],), -1, device="cpu").index_copy_(
            0, kept.cpu(), torch.arange(len(kept), device="cpu")).tolist()  # token id -> its column, -1 = not kept

    def children(self, o: torch.Tensor, hist: list[list[list[int]]] | None):
        """The ``topk`` likeliest children of nodes whose draft outputs are ``o`` (B, e, H) -> (log-probs,
        token ids), each (B, e, topk). The copy prior (``copy`` > 0; ``hist[b][i]``: node i's tokens,
        committed + path) adds ``copy`` to each node's copy candidate
        (:func:`refimpl.dynamic_tree.boost_columns`). A candidate outside the draft's kept vocabulary
        has no logit of the draft's: it gets one more column, at the node's best logit + ``copy``, so
        the prior ranks it first, as it ranks a kept candidate the draft already likes. Those are the
        copied names and rare words: 9.5% of SmolLM2's greedy tokens on the benchmark prompts lie
        outside the EAGLE-3 draft's 8,192 (18% on summaries, most of them copy candidates)."""
        logits = self.draft.logits(o)  # (B, e, V')
        V, cand = logits.shape[-1], None
        if self.copy:
            logits, cand = boost_columns(logits, hist, self.columns, self.copy)  # (B, e, V' [+ 1]), B lists of e
        lp, idx = torch.log_softmax(logits, -1).topk(self.topk, -1)  # (B, e, k)
        ids = self.draft.full(idx.clamp(max=V - 1))
        if logits.shape[-1] > V:  # the extra column is the node's copy candidate
            ids = torch.where(idx == V, torch.tensor(cand, device=idx.device)[..., None].expand_as(idx), ids)
        return lp, ids

    def start(self, ids, mask, settings) -> Needs:
        real = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
        self.toks = unpad(ids, mask)  # committed + the root
        self.feats = None  # per row (n, H): the target's feature after each committed token but the root
        self.pmask, self.rows = real, None
        self.device = ids.device  # the target's: proposals are built there
        self.kv = None  # the draft cache: (k, v), each (B, heads, P, d), of the inputs run so far (rotary applied)
        self.kmask = None  # (B, P) bool: which cached keys are real (left padding, gaps left by ragged steps)
        self.done = None  # per row: inputs in the cache (= the position of the next one)
        self.dense = True  # every cached key is real (no padding): the next inputs may attend causally
        return Needs(hidden=self.draft.taps or True, trees=True)

    def context(self, skip: list[int] | None = None):
        """Left-padded draft inputs, each row's first ``skip[r]`` left out (None: none): tokens
        x_{t+1} (B, L), features f_t (B, L, H), mask (B, L)."""
        skip = skip or [0] * len(self.feats)
        dev, L = self.draft.embed.device, max(f.shape[0] - s for f, s in zip(self.feats, skip))
        tok = torch.zeros((len(self.feats), L), dtype=torch.long, device=dev)
        feat = torch.zeros((len(self.feats), L, self.draft.hidden_size), device=dev)
        mask = torch.zeros((len(self.feats), L), dtype=torch.long, device=dev)
        for r, (t, f, s) in enumerate(zip(self.toks, self.feats, skip)):
            n = f.shape[0] - s
            tok[r, L - n:], feat[r, L - n:], mask[r, L - n:] = torch.tensor(t[1 + s:], device=dev), f[s:], 1
        return tok, feat, mask

    def unmasked(self, first: bool, new: set) -> bool:
        """Can the new inputs attend causally with no mask built? Yes when every row brings as many
        (``new``: the set of counts) and no padding is cached (one row, say)."""
        return (first or self.dense) and len(new) == 1 and min(new) > 0

    def encode(self):
        """Run the draft layer over the inputs not in the cache yet -> the root's predicted feature
        (B, H), keys / values ``(k, v)`` (B, heads, P, d) of every row's whole context, which of them
        are real (B, P) and the inputs per row (B,)."""
        first = self.kv is None
        done = [0] * len(self.feats) if first else self.done
        new, dev, past = {f.shape[0] - s for f, s in zip(self.feats, done)}, self.draft.embed.device, self.kv
        if self.unmasked(first, new):
            m = new.pop()
            tok = torch.tensor([t[1 + s:] for t, s in zip(self.toks, done)], device=dev)  # (B, m)
            feat = torch.stack([f[s:] for f, s in zip(self.feats, done)])  # (B, m, H)
            pos = torch.tensor(done, device=dev)[:, None] + torch.arange(m, device=dev)  # (B, m)
            allow, mask = None, torch.ones(tok.shape, dtype=torch.bool, device=dev)
        else:
            tok, feat, mask = self.context(done)  # (B, m): the inputs not in the cache, left-padded
            pos, allow = positions_from_mask(mask, torch.tensor(done, device=tok.device)), causal(mask)  # as if run from 0
            if not first:  # the new inputs see the real cached keys, then each other causally
                allow = torch.cat([self.kmask[:, None, :].expand(-1, tok.shape[1], -1), allow], -1)
        out, (k, v) = self.draft.step(tok, feat, pos, allow, None if first else past)
        kv, kmask = (k, v), mask.bool()
        if not first:
            kv, kmask = (torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)), torch.cat([self.kmask, kmask], 1)
        self.kv, self.kmask, self.done = kv, kmask, [f.shape[0] for f in self.feats]
        if allow is not None:  # padding may have come in: squeezed out when it is worth it
            self.compact()
        self.dense = allow is None or bool(self.kmask.all())
        return out[:, -1], self.kv, self.kmask, torch.tensor(self.done, device=tok.device)

    def compact(self) -> None:
        """Move each row's real cached keys to the right end and drop the columns no row uses."""
        free = int((~self.kmask).sum(-1).min()) if len(self.kmask) else 0
        if free == 0 or free < self.compact_at * self.kmask.shape[1]:
            return
        order = torch.sort(self.kmask.long(), dim=-1, stable=True).indices[:, free:]  # (B, P'): pads first, order kept
        self.kmask = self.kmask.gather(1, order)
        idx = order[:, None, :, None].expand(-1, self.kv[0].shape[1], -1, self.kv[0].shape[3])
        self.kv = tuple(t.gather(2, idx) for t in self.kv)

    @torch.no_grad()
    def propose(self, caps: list[int]):
        B = len(caps)
        D = min(self.depth, max(caps))
        if self.feats is None or D <= 0:
            self.rows = None
            return pack([([], [])] * B, self.device)
        root, past, kmask, n = self.encode()
        self.calls = D  # (fewer when growth settles early)
        self.rows, self.scores = self.grow(root, past, kmask, n, caps, D)
        return pack(self.rows, self.device, calls=self.calls)

    def grow(self, root, past, kmask, n, caps, D):
        """EAGLE-2's tree below the root: ``root`` (B, H) its predicted feature; the context's
        ``past`` keys / values (B, heads, P, d), real where ``kmask`` (B, P); ``n`` (B,) inputs per row
        (the root's children sit at position n). Each of the ``D - 1`` levels runs its ``topk`` most
        confident nodes through the draft, attending to the context and their ancestors (their keys
        are dropped afterwards). -> :func:`refimpl.tree.keep_best`'s ``(rows, scores)``."""
        B, P, k, dev = root.shape[0], kmask.shape[1], self.topk, root.device
        score, toks = self.children(root[:, None], [[t] for t in self.toks] if self.copy else None)  # (B, 1, k)
        grown = Growth(score[:, 0], toks[:, 0])  # level 1
        lvl_feat = root[:, None].expand(B, k, -1)  # the current level's nodes' input features
        for d in range(1, D):  # expand the topk most confident nodes of level d
            if settled(grown.scores, grown.lvl, d, caps, self.total, self.floor):
                self.calls = d
                break
            top, anc = grown.expand()  # (B, e) global ids, (B, e, expanded before)
            e = top.shape[1]
            allow = torch.cat([kmask[:, None, :].expand(B, e, P), anc,
                               torch.eye(e, dtype=torch.bool, device=dev)[None].expand(B, e, e)], -1)
            inp = lvl_feat.gather(1, (top - grown.lvl[0])[..., None].expand(-1, -1, root.shape[-1]))  # (B, e, H)
            f, (kk, vv) = self.draft.step(grown.tokens_at(top), inp, (n - 1 + d)[:, None].expand(B, e), allow, past)
            past = (torch.cat([past[0], kk], 2), torch.cat([past[1], vv], 2))
            hist = [[self.toks[b] + p for p in row] for b, row in enumerate(grown.paths(top))] if self.copy else None
            lp, ch = self.children(f, hist)  # (B, e, k)
            grown.add(top, lp, ch)
            lvl_feat = f[:, :, None].expand(B, e, k, -1).flatten(1, 2)
        return grown.keep(caps, self.total)  # EAGLE-2's re-rank

    @torch.no_grad()
    def accept(self, v) -> None:
        path = None if v.path is None else v.path.tolist()
        nodes = [path[r][:k] if k else [] for r, k in enumerate(v.n_list)]  # each row's accepted nodes
        rows = [[0] + [1 + i for i in nd] for nd in nodes]  # v.hidden's rows to keep: the root, the path
        w = max(map(len, rows))
        idx = torch.tensor([r + [0] * (w - len(r)) for r in rows], device=v.hidden.device)  # (b, w)
        hid = self.draft.fuse(v.hidden.gather(1, idx[..., None].expand(-1, -1, v.hidden.shape[-1])))  # (b, w, H)
        fed_all = v.fed_hidden is not None and v.fed_hidden.shape[1] > 0  # tokens fed before the root
        new = []
        for r, committed in enumerate(v.committed):
            fed = self.draft.fuse(v.fed_hidden[r]) if fed_all else hid[r, :0]  # (F - 1, H)
            if self.feats is None:  # the prompt: drop the left padding
                fed = fed[self.pmask[r, : fed.shape[0]].to(fed.device)]
            old = [] if self.feats is None else [self.feats[r]]
            new.append(torch.cat(old + [fed, hid[r, :len(rows[r])]]).to(self.draft.embed.device))
            self.toks[r] += committed
        self.feats = new

    def select(self, rows: torch.Tensor) -> None:
        keep = rows.tolist()
        self.toks = [self.toks[i] for i in keep]
        self.feats = None if self.feats is None else [self.feats[i] for i in keep]
        self.pmask = self.pmask[rows.to(self.pmask.device)]
        if self.kv is not None:
            idx = rows.to(self.kmask.device)
            self.kv, self.kmask = tuple(t[idx] for t in self.kv), self.kmask[idx]
            self.done = [self.done[i] for i in keep]
            self.compact()


#: ``"cpu"``: fastest on SmolLM2's lean forward (bench_results/plain_calls/), EAGLE-3's; ``"paper"``: SafeAILab/EAGLE's
PRESETS = {"cpu": {"total": 5, "depth": 5, "topk": 2, "floor": 0.1, "copy": 12.0},
           "paper": {"total": 60, "depth": 5, "topk": 10, "floor": 0.0, "copy": 0.0}}


def generate(target, prompts, draft: EagleDraft | None = None, max_new_tokens: int = 64, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, generator: torch.Generator | None = None,
             eos_token_id=None, total: int | None = None, depth: int | None = None, topk: int | None = None,
             floor: float | None = None, copy: float | None = None, preset: str | None = None) -> Generation:
    """EAGLE decoding: ``draft`` grows EAGLE-2's dynamic tree (``total`` nodes, ``depth`` levels, ``topk``
    children and expanded nodes per level, none below cumulative confidence ``floor``; ``copy``: the copy
    prior); options left None: ``preset``'s (:data:`PRESETS`). ``draft`` is required
    (``refimpl.generate(target, prompts, method="eagle")`` takes the zoo's for the target, in its fast form).
    Greedy: exactly AR's tokens; sampling: exactly the target's."""
    required(draft, "draft", "eagle")
    check_width("draft", draft.hidden_size, target)
    check_vocab("draft", draft.embed.shape[0], target)
    o = preset_options(PRESETS, preset, target, total=total, depth=depth, topk=topk, floor=floor, copy=copy)
    proposer = EagleProposer(draft.to(target.device).eval(), o["total"], o["depth"], o["topk"], o["floor"], o["copy"])
    return decode(target, proposer, prompts, max_new_tokens, temperature, top_k, top_p, generator, eos_token_id)
