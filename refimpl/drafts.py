"""Where drafts come from (chapter 04a): distilled small models, a trimmed-vocabulary draft, and the
target's own first layers (early-exit self-speculation), plus how to measure a draft.

Speculative decoding (Leviathan et al., arXiv 2211.17192) pays ``1 + gamma * c`` target-forward
units per step and gains ``tau = (1 - alpha^(gamma+1)) / (1 - alpha)`` tokens, so a draft is good
when its acceptance rate ``alpha`` is high *and* its cost ratio ``c`` is low. Every draft here is
an :class:`refimpl.lm.LM`, so it plugs into :class:`refimpl.speculative.DraftModel` unchanged:

- **Distilled draft** (the zoo's ``"tiny-draft"``): a small Llama trained to match the target's
  softened next-token distribution, loss :func:`distill_loss` = ``KL(p_T || q_T) * T^2 + CE``
  (knowledge distillation, Hinton et al., arXiv 1503.02531; for drafts: "DistillSpec", Zhou et
  al., arXiv 2310.08461: matching the target on the target's own outputs raises ``alpha``). The
  trainers live in :mod:`refimpl.train`.
- **Trimmed vocabulary** (:class:`TrimmedLM`, :func:`trim_vocab`): the draft's head keeps only the
  K most frequent tokens ("VocabTrim", Goel et al., arXiv 2506.22694). Its q is zero outside
  them; rejection sampling stays lossless for any q, so :class:`TrimmedLM` returns
  full-vocabulary logits with ``-inf`` outside the kept set. The zoo's ``smollm2-135m-draft`` is
  one (3 layers, 8,192 kept tokens, sharing SmolLM2's embedding).
- **Early exit** (:func:`early_exit`): the target's first ``k`` layers, then its final norm and
  head, with their own KV cache: a training-free draft ("Draft & Verify: Lossless Large Language
  Model Acceleration via Self-Speculative Decoding", Zhang et al., arXiv 2309.08168, skips layers;
  "LayerSkip", Elhoushi et al., arXiv 2404.16710, exits early and verifies with the rest).

The copy prior (prompt lookup inside a draft) is :mod:`refimpl.copy_prior`; adaptive draft
lengths are :mod:`refimpl.adaptive`.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch

from .autoregressive import generate as ar_generate
from .lm import LM, decoder_of
from .speculative import expected_tau  # noqa: F401 - re-exported: drafts.expected_tau


# ---------------------------------------------------------------------------------------
# early exit: the target's own first k layers as a draft
# ---------------------------------------------------------------------------------------
def shell_sharing(src, cfg, layers, lm_head):
    """A model of ``src``'s class with config ``cfg`` built on the meta device (no memory), whose
    embedding, final norm and rotary tables are ``src``'s own modules, with the decoder ``layers``
    and head ``lm_head`` given: nothing is copied. Raises ``ValueError`` if a tensor is left unshared."""
    with torch.device("meta"):
        m = type(src)(cfg)
    si, mi = decoder_of(src), decoder_of(m)
    mi.embed_tokens, mi.norm, mi.rotary_emb = si.embed_tokens, si.norm, si.rotary_emb
    mi.layers = torch.nn.ModuleList(list(layers))
    m.lm_head = lm_head
    left = [n for n, t in list(m.named_parameters()) + list(m.named_buffers()) if t.is_meta]
    if left:
        raise ValueError(f"could not share these tensors of {type(src).__name__}: {left}")
    return m.eval()


def early_exit(lm: LM, k: int) -> LM:
    """A draft made of ``lm``'s layers ``0..k-1`` followed by its final norm and LM head.

    No weight is copied: the new module shares the target's embeddings, first ``k`` layers,
    norm, rotary tables and head, and is a plain Hugging Face model with a ``k``-layer config, so
    its KV cache (``new_cache()``) has ``k`` layers and is separate from the target's.
    """
    L = lm.num_layers
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= L:
        raise ValueError(f"k must be an integer in [1, {L}] (the number of layers kept), got {k!r}")
    m = shell_sharing(lm.model, student_config(lm.model.config, k), decoder_of(lm.model).layers[:k], lm.model.lm_head)
    return LM(m, lm.tokenizer, name=f"{lm.name}-exit{k}")


def greedy_continuations(target: LM, prompts, max_new_tokens: int):
    """[(ids (1, T), sl)] per prompt: the prompt + the target's greedy continuation, and the slice
    of positions that predict the new tokens (position t predicts token t + 1)."""
    out = []
    for p in prompts:
        new = ar_generate(target, [p], max_new_tokens=max_new_tokens, eos_token_id=[]).tokens[0]
        ids = torch.tensor([p + new], device=target.device)  # (1, T)
        out.append((ids, slice(len(p) - 1, ids.size(1) - 1)))
    return out


@torch.no_grad()
def greedy_agreement(target: LM, draft: LM, prompts, max_new_tokens: int = 48) -> float:
    """Teacher-forced greedy alpha: how often the draft's argmax equals the target's greedy token
    along the target's greedy continuation of each prompt (the draft's context is always accepted
    text there, as in greedy speculative decoding)."""
    hits = total = 0
    for ids, sl in greedy_continuations(target, prompts, max_new_tokens):
        guess = draft.logits(ids)[0, sl].argmax(-1).cpu()  # (N,)
        hits += int((guess == ids[0, sl.start + 1: sl.stop + 1].cpu()).sum())
        total += guess.numel()
    return hits / max(total, 1)


@torch.no_grad()
def exit_layer_agreement(lm: LM, prompts, max_new_tokens: int = 32) -> list[float]:
    """:func:`greedy_agreement` of every early exit ``k = 1..L`` at once, from one forward per prompt.

    ``alpha_k`` is the fraction of generated positions where the argmax of ``norm(h_k) @ W_head``
    (the exit after layer ``k``) is the target's greedy token. Returns ``[alpha_1, ..., alpha_L]``
    (``alpha_L`` = 1).
    """
    inner = decoder_of(lm.model)
    hits = torch.zeros(lm.num_layers, device=lm.device)
    total = 0
    for ids, sl in greedy_continuations(lm, prompts, max_new_tokens):
        out = inner(input_ids=ids, output_hidden_states=True, use_cache=False)
        hs = out.hidden_states  # L + 1 entries: embeddings, then after each layer
        ref = ids[:, sl.start + 1: sl.stop + 1]  # (1, N) the target's greedy tokens
        for k in range(1, lm.num_layers + 1):
            h = inner.norm(hs[k][:, sl]) if k < lm.num_layers else out.last_hidden_state[:, sl]
            hits[k - 1] += (lm.model.lm_head(h).argmax(-1) == ref).sum().item()
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
# students of a target
# ---------------------------------------------------------------------------------------
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


def init_from_target(student, teacher, layers=(0,)) -> None:
    """Copy the teacher's embeddings, the given layers and its final norm into a same-width student."""
    s, t = decoder_of(student), decoder_of(teacher)
    s.embed_tokens.load_state_dict(t.embed_tokens.state_dict())
    s.norm.load_state_dict(t.norm.state_dict())
    for i, j in enumerate(layers):
        s.layers[i].load_state_dict(t.layers[j].state_dict())


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

    Subclasses may run the cached steps another way by overriding :meth:`new_cache` and
    :meth:`forward_trimmed` (the zoo's SmolLM2 draft uses a lean forward with the same logits,
    :class:`refimpl.models.lean_llama.LeanTrimmedLM`); ``logits`` and :meth:`to_hf` always use the
    Hugging Face model.

    ``context_vocab=True`` (heads made of embedding rows only): the cached steps also score every
    token already in the context -- the prompt and what was generated -- so a draft can propose
    a rare name it is asked to copy. The head is then ``kept_ids`` plus the context's tokens (the
    union over the batch's rows), recorded on the cache object; any draft distribution is still
    verified exactly, so outputs stay lossless. With the 8,192-token head, SmolLM2's greedy
    answers on the benchmark's summary / copy prompts use 13% of tokens the draft could not
    propose; adding the prompt's tokens lifts its agreement there from 0.52 / 0.62 to 0.57 / 0.66.
    """

    kept_ids: torch.Tensor | None = None
    context_vocab: bool = False

    def __post_init__(self):
        super().__post_init__()
        if self.kept_ids is None:
            raise ValueError("kept_ids must list the token ids the trimmed head scores")
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

    @torch.no_grad()
    def forward_trimmed(self, input_ids, cache=None, position_ids=None, attention_mask=None,
                        output_hidden_states=False, logits_to_keep: int = 0):
        """A cached step with the (B, Q, K) logits of the kept tokens (plus the hidden states);
        ``logits_to_keep`` as :meth:`refimpl.lm.LM.forward`."""
        return super().forward(input_ids, cache, position_ids, attention_mask, output_hidden_states, logits_to_keep)

    @torch.no_grad()
    def forward(self, input_ids, cache=None, position_ids=None, attention_mask=None, output_hidden_states=False,
                logits_to_keep: int = 0):
        out = self.forward_trimmed(input_ids, cache, position_ids, attention_mask,
                                   output_hidden_states or self.context_vocab, logits_to_keep)
        full = self.expand(out[0])  # (B, Q', V), -inf outside kept_ids; Q' = logits_to_keep or Q
        if self.context_vocab:
            extra = self._context_tokens(out[1], input_ids)  # (n,) ids seen in the context, not kept
            if extra.numel():
                E = decoder_of(self.model).embed_tokens.weight  # the head's rows are embedding rows
                full[..., extra] = (out[2][:, out[2].shape[1] - full.shape[1]:] @ E[extra].T).float()  # (B, Q', n)
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
        W = decoder_of(self.model).embed_tokens.weight  # (V, H)
        head = torch.nn.Linear(W.shape[1], W.shape[0], bias=True, device="meta")
        head.weight = W if self.head_is_embedding() else torch.nn.Parameter(self.expand_head())
        bias = torch.full((W.shape[0],), -1e9, dtype=W.dtype, device=W.device)
        bias[self.kept_ids] = 0.0
        head.bias = torch.nn.Parameter(bias, requires_grad=False)
        hf = shell_sharing(self.model, cfg, decoder_of(self.model).layers, head)
        hf.generation_config.eos_token_id = self.eos_token_id
        hf.generation_config.pad_token_id = self.pad_token_id
        return hf.eval()

    def head_is_embedding(self) -> bool:
        W, E = self.model.lm_head.weight, decoder_of(self.model).embed_tokens.weight
        return W.shape[1] == E.shape[1] and torch.equal(W, E[self.kept_ids])

    def expand_head(self) -> torch.Tensor:
        W = self.model.lm_head.weight
        full = W.new_zeros((self.vocab_size, W.shape[1]))
        full[self.kept_ids] = W.detach()
        return full


def trim_vocab(lm: LM, kept_ids, context_vocab: bool = False) -> TrimmedLM:
    """VocabTrim any Llama-like ``lm``: same layers (shared), a head with only the ``kept_ids`` rows.

    ``context_vocab=True``: cached steps also score the context's tokens (see :class:`TrimmedLM`)."""
    kept = torch.as_tensor(kept_ids, dtype=torch.long, device=lm.device).unique()  # sorted, no repeats
    if kept.numel() == 0 or int(kept.min()) < 0 or int(kept.max()) >= lm.vocab_size:
        raise ValueError(f"kept_ids must be non-empty token ids in [0, {lm.vocab_size})")
    cfg = copy.deepcopy(lm.model.config)
    cfg.tie_word_embeddings = False
    W = lm.model.lm_head.weight  # (V, H)
    head = torch.nn.Linear(W.shape[1], kept.numel(), bias=False, device=W.device, dtype=W.dtype)
    with torch.no_grad():
        head.weight.copy_(W[kept.to(W.device)])  # (K, H)
    m = shell_sharing(lm.model, cfg, decoder_of(lm.model).layers, head)
    return TrimmedLM(m, lm.tokenizer, name=f"{lm.name}-trim{kept.numel()}", kept_ids=kept,
                     context_vocab=context_vocab)


def frequent_tokens(lm: LM, texts, k: int) -> torch.Tensor:
    """The ``k`` most frequent token ids of ``texts`` under ``lm``'s tokenizer (EOS always kept)."""
    rows = [(lm.encode(t) + [lm.eos_token_id], None) for t in texts]
    return top_tokens(rows, k, always=(lm.eos_token_id,), device=lm.device)


def top_tokens(data, k: int, always=(), device="cpu") -> torch.Tensor:
    """The ``k`` most frequent token ids in the rows ``(ids, ...)`` (``always`` included first), sorted,
    on ``device`` (default the CPU: a vocabulary list; :func:`frequent_tokens` puts it on ``lm``'s)."""
    counts: dict[int, int] = {}
    for row in data:
        for t in row[0]:
            counts[t] = counts.get(t, 0) + 1
    always = list(dict.fromkeys(always))  # (a model's EOS and PAD may be one token: each id once)
    ranked = always + [t for t, _ in sorted(counts.items(), key=lambda kv: -kv[1]) if t not in always]
    return torch.tensor(sorted(ranked[:k]), dtype=torch.long, device=device)
