"""Sampling from a masked diffusion LM: LLaDA low-confidence remasking, Fast-dLLM parallel
decoding and block KV caches, and Prophet-style early commit.

Papers:

- "Large Language Diffusion Models" (LLaDA, Nie et al., arXiv 2502.09992), Algorithm 5
  (low-confidence remasking) and Appendix B.2 (semi-autoregressive blocks).
- "Fast-dLLM: Training-free Acceleration of Diffusion LLM by Enabling KV Cache and Parallel
  Decoding" (Wu et al., arXiv 2505.22618): confidence-threshold parallel decoding (Sec. 3.3),
  its factor rule ``(n + 1) * (1 - c_(n)) < f`` (Theorem 1 / the factor variant), and the
  approximate prefix / dual block KV cache (Sec. 3.2).
- "Diffusion Language Models Know the Answer Before Decoding" (Prophet, arXiv 2508.19982):
  commit every remaining token once the top-1 / top-2 probability gap is large.

The LLaDA sampler (the public contract in the README). The answer region of ``gen_length`` positions starts fully
masked after the prompt and is split into ``gen_length / block_length`` blocks decoded left to
right. Each block gets ``steps * block_length / gen_length`` steps. At each step the denoiser
predicts every masked position at once; ``x0_i = argmax p_i`` (or a Gumbel-max sample at
``temperature > 0``, noise in float64 from ``generator``; the MASK token itself is excluded, so a
poorly trained model cannot stall by predicting MASK) and the confidence is
``c_i = p_i(x0_i)``, the softmax probability of the predicted token (``remasking="random"``
uses a uniform random number instead). The ``k`` most confident masked positions of the
current block are committed; ``k`` follows the linear schedule: the block's masked count split
evenly over its steps, the remainder going to the earliest steps (LLaDA's
``get_num_transfer_tokens``). A step whose schedule says 0 for every row is skipped (no
forward pass; it would commit nothing).

Parallel decoding (Fast-dLLM). ``threshold=t``: commit every masked position of the block with
``c_i > t`` and always at least the single most confident one; the block is decoded in as many
steps as it takes (``steps`` is then only validated). ``factor=f``: sort the block's masked
confidences ``c_(1) >= c_(2) >= ...`` and commit the top ``n`` where ``(n + 1)(1 - c_(n)) < f``
holds for every rank up to ``n`` (at least one).

Early commit (Prophet). ``early_commit=g``: when the mean over a row's remaining masked answer
positions of ``p_top1 - p_top2`` is at least ``g``, commit all of them in this step.

Block KV cache (Fast-dLLM, approximate). ``cache="prefix"``: at the first step of each block
run the whole sequence and keep the keys/values of the tokens before the block; the other steps
of the block feed only the block and everything after it. ``cache="dual"``: also keep the
keys/values of the (still masked) tokens after the block, and feed only the block. The cache is
refreshed at every block start (``cache_refresh="block"``), so it is stale only within a block:
committed tokens inside the block do not update the context's keys/values.
``cache_refresh="step"`` rebuilds it before every step and still decodes from the cached pass:
the cache is then exact and the sampler equals the uncached one token for token (two passes a
step: a check of the cache bookkeeping and a teaching reference, never faster).

Ragged prompt batches are left-padded with PAD; when the model's ``logits`` accepts
``attention_mask`` (ours does) pads are hidden from attention and position ids count only real
tokens, otherwise each row is decoded on its own (stats are summed). ``tokens[b]`` are the
``gen_length`` new tokens of row ``b`` stopped at EOS inclusive. Once every row has a committed
EOS in a finished block, decoding stops (later blocks cannot change the returned tokens).

Plugging in another dLLM. Any object with ``logits(input_ids (B, T)) -> (B, T, V)``,
``mask_token_id`` and (optionally) ``eos_token_id``, ``pad_token_id``, ``max_length``,
``device`` works, e.g. for LLaDA-8B on a GPU::

    class LLaDA:
        def __init__(self, name="GSAI-ML/LLaDA-8B-Instruct"):
            from transformers import AutoModel, AutoTokenizer
            self.tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=True)
            self.model = AutoModel.from_pretrained(name, trust_remote_code=True,
                                                   dtype=torch.bfloat16).cuda().eval()
            self.mask_token_id, self.eos_token_id = 126336, self.tokenizer.eos_token_id
            self.pad_token_id, self.device = self.tokenizer.pad_token_id, torch.device("cuda")
        @torch.no_grad()
        def logits(self, input_ids):
            return self.model(input_ids.to(self.device)).logits.float()

    g = diffusion.generate(LLaDA(), prompt_ids, gen_length=128, steps=128, block_length=32)

The caches need ``forward(input_ids, position_ids, kv=None, return_kv=False, attention_mask=None)``
as :class:`refimpl.diffusion_lm.DiffusionLM` has it.
"""
from __future__ import annotations

import inspect

import torch

from .generation import Generation, Stats, Timer, check_positive_int, eos_set, normalize_prompts, truncate_at_eos
from .lm import left_pad, positions_from_mask

REMASKING = ("low_confidence", "random")
CACHES = (None, "prefix", "dual")
CACHE_REFRESH = ("block", "step")


# ---------------------------------------------------------------------------------------
# the pieces (each used by the notebooks on its own)
# ---------------------------------------------------------------------------------------
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
        x0 = logits.argmax(-1)
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


def select_threshold(conf: torch.Tensor, threshold: float) -> torch.Tensor:
    """Positions with conf > threshold, plus each row's most confident one (rows with any finite conf)."""
    sel = conf > threshold
    best = conf.argmax(-1, keepdim=True)  # (B, 1)
    has = torch.isfinite(conf).any(-1, keepdim=True)  # (B, 1)
    return sel | (torch.zeros_like(sel).scatter_(-1, best, True) & has)


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


# ---------------------------------------------------------------------------------------
# argument checks
# ---------------------------------------------------------------------------------------
def check_args(model, gen_length, steps, block_length, temperature, remasking, threshold, factor, early_commit,
               cache, mask_token_id, cache_refresh="block"):
    check_positive_int("gen_length", gen_length)
    check_positive_int("steps", steps)
    check_positive_int("block_length", block_length)
    if gen_length % block_length:
        raise ValueError(f"block_length ({block_length}) must divide gen_length ({gen_length})")
    num_blocks = gen_length // block_length
    if steps % num_blocks:
        raise ValueError(f"steps ({steps}) must be a multiple of the number of blocks ({num_blocks})")
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
    if early_commit is not None and (not isinstance(early_commit, (int, float)) or not 0 < early_commit <= 1):
        raise ValueError(f"early_commit must be a probability gap in (0, 1] or None, got {early_commit!r}")
    if cache not in CACHES:
        raise ValueError(f"cache must be one of {CACHES}, got {cache!r}")
    if cache_refresh not in CACHE_REFRESH:
        raise ValueError(f"cache_refresh must be one of {CACHE_REFRESH}, got {cache_refresh!r}")
    if cache == "dual" and early_commit is not None:
        raise ValueError("early_commit needs the logits of every remaining position: use cache=None or 'prefix'")
    if cache is not None and not _accepts(getattr(model, "forward", None), "kv"):
        raise ValueError(f"cache={cache!r} needs model.forward(input_ids, position_ids, kv, return_kv, attention_mask)")
    if not callable(getattr(model, "logits", None)):
        raise ValueError("model must have a logits(input_ids) method")
    mask_id = mask_token_id if mask_token_id is not None else getattr(model, "mask_token_id", None)
    if not isinstance(mask_id, int):
        raise ValueError("mask_token_id: the model has no mask_token_id (not a masked diffusion LM?); pass one")
    return mask_id, num_blocks


def _accepts(fn, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


# ---------------------------------------------------------------------------------------
# the sampler
# ---------------------------------------------------------------------------------------
@torch.no_grad()
def generate(model, prompts, gen_length: int = 64, steps: int = 64, block_length: int = 64,
             temperature: float = 0.0, remasking: str = "low_confidence", threshold: float | None = None,
             factor: float | None = None, early_commit: float | None = None, cache: str | None = None,
             generator: torch.Generator | None = None, eos_token_id=None, mask_token_id: int | None = None,
             use_kernel: bool = True, cache_refresh: str = "block") -> Generation:
    """Decode ``gen_length`` tokens after each prompt with a masked diffusion LM (see the module doc).

    Returns a :class:`Generation`; ``stats.nfe`` counts denoiser calls, ``stats.extra["committed"]``
    lists per step the tokens committed in each row, ``stats.extra["schedule"]`` the per-block
    linear schedules (LLaDA mode). ``use_kernel`` routes greedy low-confidence selection through
    :func:`kernels.confidence_select` (Triton on CUDA / under ``TRITON_INTERPRET=1``).
    ``cache_refresh``: ``"block"`` (Fast-dLLM) or ``"step"`` (exact, see the module doc).
    """
    mask_id, num_blocks = check_args(model, gen_length, steps, block_length, temperature, remasking, threshold,
                                     factor, early_commit, cache, mask_token_id, cache_refresh)
    prompts = normalize_prompts(prompts, getattr(model, "max_length", None), gen_length)
    eos = eos_set(eos_token_id, getattr(model, "eos_token_id", None))
    kw = dict(gen_length=gen_length, steps=steps, block_length=block_length, temperature=temperature,
              remasking=remasking, threshold=threshold, factor=factor, early_commit=early_commit, cache=cache,
              generator=generator, eos_token_id=eos_token_id, mask_token_id=mask_id, use_kernel=use_kernel,
              cache_refresh=cache_refresh)
    ragged = len({len(p) for p in prompts}) > 1
    if ragged and cache is None and not _accepts(model.logits, "attention_mask"):
        return _row_by_row(model, prompts, kw)  # the model cannot hide pads: decode rows on their own
    stats = Stats(rows=len(prompts))
    with Timer(stats):
        x = _decode(model, prompts, mask_id, num_blocks, steps // num_blocks, eos, stats, **kw)
    L = x.size(1) - gen_length
    out = [truncate_at_eos(row, eos, gen_length)[0] for row in x[:, L:].tolist()]
    stats.target_calls = stats.nfe
    stats.new_tokens = sum(len(o) for o in out)
    return Generation(out, stats)


def _row_by_row(model, prompts, kw) -> Generation:
    gens = [generate(model, [p], **kw) for p in prompts]
    stats = Stats(rows=len(prompts))
    for g in gens:
        stats.nfe += g.stats.nfe
        stats.seconds += g.stats.seconds
        stats.new_tokens += g.stats.new_tokens
    stats.target_calls = stats.nfe
    stats.extra = {"rows": [g.stats.extra for g in gens]}
    return Generation([g.tokens[0] for g in gens], stats)


def _decode(model, prompts, mask_id, num_blocks, steps_per_block, eos, stats, *, gen_length, steps, block_length,
            temperature, remasking, threshold, factor, early_commit, cache, generator, eos_token_id,
            mask_token_id, use_kernel, cache_refresh):
    device = getattr(model, "device", None) or torch.device("cpu")
    B, L = len(prompts), max(len(p) for p in prompts)
    pad = getattr(model, "pad_token_id", None)
    pad = pad if isinstance(pad, int) else (next(iter(eos)) if eos else 0)
    ids, pmask = left_pad(prompts, pad, device)  # (B, L)
    x = torch.cat([ids, ids.new_full((B, gen_length), mask_id)], 1)  # (B, L + G): the answer starts masked
    attn = torch.cat([pmask, torch.ones_like(x[:, L:])], 1)
    ragged = bool((pmask == 0).any())
    pos = positions_from_mask(attn)  # (B, L + G)
    committed, schedules = [], []
    stats.extra.update(committed=committed, schedule=schedules, early_commits=0, blocks_decoded=0,
                       cache=cache, steps_per_block=steps_per_block)
    parallel = threshold is not None or factor is not None
    kernel = None
    if use_kernel and temperature == 0 and remasking == "low_confidence" and factor is None:
        from kernels import confidence_select as kernel

    def full(return_kv):
        stats.nfe += 1
        if return_kv:
            return model.forward(x, pos, return_kv=True, attention_mask=attn if ragged else None)
        if ragged:
            return model.logits(x, attention_mask=attn)
        return model.logits(x)

    for nb in range(num_blocks):
        s, e = L + nb * block_length, L + (nb + 1) * block_length
        sched = num_transfer_tokens((x[:, s:e] == mask_id).sum(-1), steps_per_block)  # (B, steps_per_block)
        schedules.append(sched.tolist())
        kv = ctx_mask = None
        step = 0
        while bool((x[:, s:e] == mask_id).any()):
            if not parallel and step >= steps_per_block:
                break  # cannot happen: the schedule sums to the block's masked count
            k = None if parallel else sched[:, step]
            step += 1
            if k is not None and int(k.sum()) == 0:
                continue  # nothing to commit at this step: skip the forward pass
            # ---- the denoiser call: logits for positions off .. end of ``x`` (or .. e for dual)
            if cache is None:
                logits, off = full(False), 0
            elif kv is None or cache_refresh == "step":
                logits, layers = full(True)
                off = 0
                if cache == "prefix":
                    kv = [(k_[:, :, :s], v_[:, :, :s]) for k_, v_ in layers]
                    ctx_mask = attn[:, :s]
                else:
                    kv = [(torch.cat([k_[:, :, :s], k_[:, :, e:]], 2), torch.cat([v_[:, :, :s], v_[:, :, e:]], 2))
                          for k_, v_ in layers]
                    ctx_mask = torch.cat([attn[:, :s], attn[:, e:]], 1)
                if cache_refresh == "step":  # decode from the cached pass on the fresh cache
                    logits, off = None, None
            else:
                logits, off = None, None
            if logits is None:
                q_end = x.size(1) if cache == "prefix" else e
                stats.nfe += 1
                am = torch.cat([ctx_mask, attn[:, s:q_end]], 1) if ragged else None
                logits, off = model.forward(x[:, s:q_end], pos[:, s:q_end], kv=kv, attention_mask=am), s
            logits[..., mask_id] = float("-inf")  # the denoiser never predicts MASK itself
            blk_logits = logits[:, s - off: e - off]  # (B, block, V)
            masked = x[:, s:e] == mask_id  # (B, block)
            # ---- early commit: every remaining masked answer position at once
            if early_commit is not None:
                tail = x[:, s:] == mask_id  # (B, L + G - s)
                tail_logits = logits[:, s - off:]
                gap = top2_gap(tail_logits).masked_fill(~tail, 0).sum(-1) / tail.sum(-1).clamp(min=1)  # (B,)
                go = (gap >= early_commit) & tail.any(-1)
                if bool(go.any()):
                    x0_tail, _ = predict(tail_logits, tail, temperature, remasking, generator)
                    fill = tail & go[:, None]
                    x[:, s:] = torch.where(fill, x0_tail, x[:, s:])
                    stats.extra["early_commits"] += int(go.sum())
                    counts = fill.sum(-1)
                    # rows not committing early still take an ordinary step below
                    masked = masked & ~go[:, None]
                    if not bool(masked.any()):
                        committed.append(counts.tolist())
                        continue
                    if k is not None:
                        k = torch.where(go, torch.zeros_like(k), k)
                else:
                    counts = torch.zeros(B, dtype=torch.long, device=device)
            else:
                counts = torch.zeros(B, dtype=torch.long, device=device)
            # ---- choose what to commit in the current block
            if kernel is not None:
                x0, _, sel = kernel(blk_logits, masked, k=k, threshold=threshold)
            else:
                x0, conf = predict(blk_logits, masked, temperature, remasking, generator)
                if threshold is not None:
                    sel = select_threshold(conf, threshold)
                elif factor is not None:
                    sel = select_factor(conf, factor)
                else:
                    sel = select_topk(conf, k)
            sel = sel & masked
            x[:, s:e] = torch.where(sel, x0, x[:, s:e])
            committed.append((counts + sel.sum(-1)).tolist())
        stats.extra["blocks_decoded"] += 1
        if eos and all(any(t in eos for t in row) for row in x[:, L:e].tolist()):
            break  # every row has finished: later blocks cannot change the returned tokens
    return x
