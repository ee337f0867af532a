"""The pieces of one masked-diffusion denoising step: the linear schedule, the predictions and their
confidences, the commit rules, the argument checks, and :func:`denoise_step`, the one selection
that both :func:`refimpl.diffusion.generate` and the draft-and-verify loop
(:mod:`refimpl.free_draft`) run, so the two agree bit for bit.

Papers:

- "Large Language Diffusion Models" (LLaDA, Nie et al., arXiv 2502.09992), Algorithm 5
  (low-confidence remasking) and its ``get_num_transfer_tokens`` linear schedule.
- "Fast-dLLM: Training-free Acceleration of Diffusion LLM by Enabling KV Cache and Parallel
  Decoding" (Wu et al., arXiv 2505.22618), Sec. 3.3: the confidence threshold and the factor rule
  ``(n + 1) * (1 - c_(n)) < f`` (Theorem 1).
- "Diffusion Language Models Know the Answer Before Decoding" (Prophet, arXiv 2508.19982): the
  top-1 / top-2 probability gap.
"""
from __future__ import annotations

import inspect

import torch

from kernels.confidence_select import confidence_select
from kernels.verify_greedy import argmax

from .generation import check_positive_int
from .primitives import left_pad

REMASKING = ("low_confidence", "random")
CACHES = (None, "prefix", "dual")
CACHE_REFRESH = ("block", "step")


def num_transfer_tokens(masked_count: torch.Tensor, steps: int) -> torch.Tensor:
    """Linear schedule: (B,) masked counts -> (B, steps) tokens to commit per step.

    ``count // steps`` each step, plus one for the first ``count % steps`` steps.
    """
    base = masked_count // steps  # (B,)
    rem = masked_count % steps  # (B,)
    extra = torch.arange(steps, device=masked_count.device)[None, :] < rem[:, None]  # (B, steps)
    return base[:, None] + extra.long()


def gumbel_argmax(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    """A sample of softmax(logits / T) by the Gumbel-max trick, in float64 (LLaDA). (..., V) -> (...)."""
    gdev = generator.device if generator is not None else logits.device
    u = torch.rand(logits.shape, generator=generator, dtype=torch.float64, device=gdev).to(logits.device)
    u = u.clamp_(min=1e-300)
    return (logits.double() / temperature - torch.log(-torch.log(u))).argmax(-1)


def predict(logits: torch.Tensor, masked: torch.Tensor, temperature: float = 0.0, remasking: str = "low_confidence",
            generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Predicted tokens and confidences for one step. logits (B, N, V), masked (B, N) ->
    (x0 (B, N), conf (B, N) float64) with conf = -inf on positions that are not masked."""
    if temperature > 0:
        x0 = gumbel_argmax(logits, temperature, generator)  # (B, N)
    else:
        x0 = argmax(logits)
    if remasking == "low_confidence":
        p = torch.softmax(logits.double(), dim=-1)  # (B, N, V)
        conf = p.gather(-1, x0[..., None])[..., 0]  # (B, N)
    else:  # "random"
        gdev = generator.device if generator is not None else logits.device
        conf = torch.rand(masked.shape, generator=generator, dtype=torch.float64, device=gdev).to(logits.device)
    return x0, conf.masked_fill(~masked, float("-inf"))


def select_topk(conf: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """(B, N) confidences, (B,) counts -> (B, N) bool: the k[b] most confident positions of row b."""
    order = torch.sort(conf, dim=-1, descending=True, stable=True).indices  # (B, N)
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(conf.size(-1), device=conf.device).expand_as(order))
    return rank < k[:, None]


def most_confident(conf: torch.Tensor) -> torch.Tensor:
    """(B, N) confidences (-inf where not masked) -> (B, N) bool: each row's most confident position,
    none in a row with no finite confidence (the commit every threshold-like rule adds: progress)."""
    best = conf.argmax(-1, keepdim=True)  # (B, 1)
    has = torch.isfinite(conf).any(-1, keepdim=True)  # (B, 1)
    return torch.zeros(conf.shape, dtype=torch.bool, device=conf.device).scatter_(-1, best, True) & has


def select_threshold(conf: torch.Tensor, threshold: float) -> torch.Tensor:
    """Positions with conf > threshold, plus each row's most confident one (rows with any finite conf)."""
    return (conf > threshold) | most_confident(conf)


def never_mask(logits: torch.Tensor, mask_id: int) -> torch.Tensor:
    """(..., V) logits with the MASK column at -inf: a sampler never predicts MASK."""
    return logits.index_fill(-1, torch.tensor([mask_id], device=logits.device), float("-inf"))


def select_factor(conf: torch.Tensor, factor: float) -> torch.Tensor:
    """Fast-dLLM factor rule: the top n with (i + 1)(1 - c_(i)) < factor for every rank i <= n (n >= 1)."""
    srt = torch.sort(conf, dim=-1, descending=True).values  # (B, N)
    i = torch.arange(1, conf.size(-1) + 1, device=conf.device, dtype=conf.dtype)  # ranks 1..N
    ok = ((i + 1) * (1 - srt) < factor) & torch.isfinite(srt)
    n = ok.long().cumprod(-1).sum(-1).clamp(min=1)  # longest prefix that satisfies the rule
    n = torch.minimum(n, torch.isfinite(conf).sum(-1))
    return select_topk(conf, n)


def top2_gap(logits: torch.Tensor) -> torch.Tensor:
    """p_top1 - p_top2 per position: (B, N, V) -> (B, N) (Prophet's confidence gap)."""
    p = torch.softmax(logits.double(), dim=-1).topk(2, dim=-1).values  # (B, N, 2)
    return p[..., 0] - p[..., 1]


def selection_kernel(use_kernel: bool, temperature: float, remasking: str, factor):
    """:func:`kernels.confidence_select.confidence_select` where it applies (greedy low-confidence top-k or
    threshold), else None."""
    if use_kernel and temperature == 0 and remasking == "low_confidence" and factor is None:
        return confidence_select
    return None


def denoise_step(logits: torch.Tensor, masked: torch.Tensor, mask_id: int, k: torch.Tensor | None = None,
                 threshold: float | None = None, factor: float | None = None, temperature: float = 0.0,
                 remasking: str = "low_confidence", generator: torch.Generator | None = None,
                 kernel=None) -> tuple[torch.Tensor, torch.Tensor]:
    """One step's choice in the current block: logits (B, N, V), masked (B, N) -> (x0 (B, N), sel (B, N) bool).

    MASK is never predicted; ``sel`` (a subset of ``masked``) is the top ``k[b]`` by confidence
    (LLaDA), or Fast-dLLM's ``threshold`` / ``factor`` rule; ``kernel`` (from
    :func:`selection_kernel`) fuses the greedy low-confidence cases. Rows are independent.
    """
    logits = never_mask(logits, mask_id)
    if kernel is not None:
        x0, _, sel = kernel(logits, masked, k=k, threshold=threshold)
    else:
        x0, conf = predict(logits, masked, temperature, remasking, generator)
        if threshold is not None:
            sel = select_threshold(conf, threshold)
        elif factor is not None:
            sel = select_factor(conf, factor)
        else:
            sel = select_topk(conf, k)
    return x0, sel & masked


def masked_answer(model, prompts: list[list[int]], gen_length: int, mask_id: int, eos: frozenset):
    """The sampler's start state: prompts left-padded (with the model's PAD, else an EOS, else 0) and
    followed by ``gen_length`` MASKs -> ``(x (B, L + G), attention mask (B, L + G), L, ragged)``."""
    device = getattr(model, "device", None) or torch.device("cpu")
    B, L = len(prompts), max(len(p) for p in prompts)
    pad = getattr(model, "pad_token_id", None)
    pad = pad if isinstance(pad, int) else (next(iter(eos)) if eos else 0)
    ids, pmask = left_pad(prompts, pad, device)  # (B, L)
    x = torch.cat([ids, ids.new_full((B, gen_length), mask_id)], 1)  # (B, L + G): the answer starts masked
    attn = torch.cat([pmask, torch.ones_like(x[:, L:])], 1)
    return x, attn, L, bool((pmask == 0).any())


def check_prompts(prompts: list[list[int]], mask_id: int) -> None:
    """``ValueError`` naming ``prompts`` when one holds the MASK id (infilling is not supported)."""
    for i, p in enumerate(prompts):
        if mask_id in p:
            raise ValueError(f"prompts[{i}] contains the mask token id {mask_id}: a prompt must be plain text "
                             "(the sampler would treat that position as part of the answer's noise)")


def accepts(fn, name: str) -> bool:
    """Whether callable ``fn`` takes a parameter ``name``."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def check_commit_rule(temperature, remasking, threshold, factor) -> None:
    """Validate how a step chooses what to commit (``ValueError`` naming the argument); shared by
    every dLLM sampler (this one and :mod:`refimpl.block_diffusion`)."""
    if not isinstance(temperature, (int, float)) or temperature != temperature or temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature!r}")
    if remasking not in REMASKING:
        raise ValueError(f"remasking must be one of {REMASKING}, got {remasking!r}")
    if threshold is not None and (not isinstance(threshold, (int, float)) or not 0 < threshold <= 1):
        raise ValueError(f"threshold must be in (0, 1] or None, got {threshold!r}")
    if factor is not None and (not isinstance(factor, (int, float)) or not factor > 0):
        raise ValueError(f"factor must be > 0 or None, got {factor!r}")
    if threshold is not None and factor is not None:
        raise ValueError("pass threshold or factor, not both")


def check_args(model, gen_length, steps, block_length, temperature, remasking, threshold, factor, early_commit,
               cache, mask_token_id, cache_refresh="block"):
    """Validate the sampler's arguments (``ValueError`` naming the argument) -> (mask id, number of blocks)."""
    check_positive_int("gen_length", gen_length)
    check_positive_int("steps", steps)
    check_positive_int("block_length", block_length)
    if gen_length % block_length:
        raise ValueError(f"block_length ({block_length}) must divide gen_length ({gen_length})")
    num_blocks = gen_length // block_length
    if steps % num_blocks:
        raise ValueError(f"steps ({steps}) must be a multiple of the number of blocks ({num_blocks})")
    check_commit_rule(temperature, remasking, threshold, factor)
    if early_commit is not None and (not isinstance(early_commit, (int, float)) or not 0 < early_commit <= 1):
        raise ValueError(f"early_commit must be a probability gap in (0, 1] or None, got {early_commit!r}")
    if cache not in CACHES:
        raise ValueError(f"cache must be one of {CACHES}, got {cache!r}")
    if cache_refresh not in CACHE_REFRESH:
        raise ValueError(f"cache_refresh must be one of {CACHE_REFRESH}, got {cache_refresh!r}")
    if cache == "dual" and early_commit is not None:
        raise ValueError("early_commit needs the logits of every remaining position: use cache=None or 'prefix'")
    needs = {None: (), "prefix": ("past_key_values", "use_cache"),
             "dual": ("past_key_values", "use_cache", "replace_position")}[cache]
    if not all(accepts(getattr(model, "forward", None), n) for n in needs):
        raise ValueError(f"cache={cache!r} needs model(input_ids, attention_mask=, {'=, '.join(needs)}=) "
                         "returning .logits and .past_key_values, as refimpl.diffusion_lm.DiffusionLM")
    if not callable(getattr(model, "logits", None)):
        raise ValueError("model must have a logits(input_ids) method")
    mask_id = mask_token_id if mask_token_id is not None else getattr(model, "mask_token_id", None)
    if not isinstance(mask_id, int):
        raise ValueError("mask_token_id: the model has no mask_token_id (not a masked diffusion LM?); pass one")
    return mask_id, num_blocks
