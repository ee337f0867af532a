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
- "Free Draft-and-Verification: Toward Lossless Parallel Decoding for Diffusion Large Language
  Models" (FreeDave, Wu and Zhang, arXiv 2510.00294): ``draft_steps``, :mod:`refimpl.free_draft`.

The LLaDA sampler (the public contract). The answer region of ``gen_length`` positions starts fully
masked after the prompt and is split into ``gen_length / block_length`` blocks decoded left to
right. Each block gets ``steps * block_length / gen_length`` steps. At each step the denoiser
predicts every masked position at once; ``x0_i = argmax p_i`` (or a Gumbel-max sample at
``temperature > 0``, noise in float64 from ``generator``; the MASK token itself is excluded, so a
poorly trained model cannot stall by predicting MASK: our choice, LLaDA's ``generate.py`` takes the
argmax over the whole vocabulary) and the confidence is
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

The caches call the model the way Fast-dLLM's ``generate.py`` does: ``model(x, use_cache=True)``
(``.logits``, ``.past_key_values``: per layer ``(k, v)`` each (B, H, T, D)), then
``model(x[:, s:], past_key_values=prefix).logits`` (prefix) or ``model(x[:, s:e],
past_key_values=full, replace_position=rp).logits`` (dual), each with ``attention_mask=`` for
ragged rows, as :class:`refimpl.diffusion_lm.DiffusionLM` answers them.

Lossless draft-and-verify ("Free Draft-and-Verification: Toward Lossless Parallel Decoding for
Diffusion Large Language Models", FreeDave, arXiv 2510.00294). ``draft_steps=K`` (greedy,
``remasking="low_confidence"``, no cache, no early commit; top-k schedule, threshold or factor)
guesses the next ``K`` steps from the logits in hand, scores the ``K`` drafts in one batched
forward and keeps the deepest one the sampler itself would have reached: the same tokens in
fewer denoiser calls (:mod:`refimpl.free_draft`). The pieces of a step live in
:mod:`refimpl.diffusion_steps` (re-exported here); a prompt holding the MASK id is rejected.
"""
from __future__ import annotations

import torch

from . import free_draft
from .diffusion_steps import (CACHE_REFRESH, CACHES, REMASKING, accepts, check_args, check_prompts,  # noqa: F401
                              denoise_step, gumbel_argmax, masked_answer, num_transfer_tokens, predict,
                              select_factor, select_threshold, select_topk, selection_kernel, top2_gap)
from .generation import Generation, Stats, Timer, eos_set, normalize_prompts, truncate_at_eos

__all__ = ["generate", "CACHES", "CACHE_REFRESH", "REMASKING", "check_args", "denoise_step", "gumbel_argmax",
           "num_transfer_tokens", "predict", "select_factor", "select_threshold", "select_topk", "top2_gap"]


# ---------------------------------------------------------------------------------------
# the sampler
# ---------------------------------------------------------------------------------------
@torch.no_grad()
def generate(model, prompts, gen_length: int = 64, steps: int = 64, block_length: int = 64,
             temperature: float = 0.0, remasking: str = "low_confidence", threshold: float | None = None,
             factor: float | None = None, early_commit: float | None = None, cache: str | None = None,
             generator: torch.Generator | None = None, eos_token_id=None, mask_token_id: int | None = None,
             use_kernel: bool = True, cache_refresh: str = "block", draft_steps: int | None = None) -> Generation:
    """Decode ``gen_length`` tokens after each prompt with a masked diffusion LM (see the module doc).

    Returns a :class:`Generation`; ``stats.nfe`` counts denoiser calls, ``stats.extra["committed"]``
    lists per step the tokens committed in each row, ``stats.extra["schedule"]`` the per-block
    linear schedules (LLaDA mode). ``use_kernel`` routes greedy low-confidence selection through
    :func:`kernels.confidence_select` (Triton on CUDA / under ``TRITON_INTERPRET=1``).
    ``cache_refresh``: ``"block"`` (Fast-dLLM) or ``"step"`` (exact, see the module doc).
    ``draft_steps=K``: FreeDave draft-and-verify (:mod:`refimpl.free_draft`), the same tokens in
    fewer denoiser calls; ``stats.accepted`` then lists per call the steps each row advanced.
    """
    mask_id, num_blocks = check_args(model, gen_length, steps, block_length, temperature, remasking, threshold,
                                     factor, early_commit, cache, mask_token_id, cache_refresh)
    if draft_steps is not None:
        free_draft.check_draft_args(draft_steps, temperature, remasking, cache, early_commit)
    prompts = normalize_prompts(prompts, getattr(model, "max_length", None), gen_length)
    check_prompts(prompts, mask_id)
    eos = eos_set(eos_token_id, getattr(model, "eos_token_id", None))
    kw = dict(gen_length=gen_length, steps=steps, block_length=block_length, temperature=temperature,
              remasking=remasking, threshold=threshold, factor=factor, early_commit=early_commit, cache=cache,
              generator=generator, eos_token_id=eos_token_id, mask_token_id=mask_id, use_kernel=use_kernel,
              cache_refresh=cache_refresh)
    ragged = len({len(p) for p in prompts}) > 1
    if ragged and cache is None and not accepts(model.logits, "attention_mask"):
        return _row_by_row(model, prompts, dict(kw, draft_steps=draft_steps))  # pads cannot be hidden
    stats = Stats(rows=len(prompts))
    with Timer(stats):
        if draft_steps is None:
            x = _decode(model, prompts, mask_id, num_blocks, steps // num_blocks, eos, stats, **kw)
        else:
            x = free_draft.decode(model, prompts, mask_id, num_blocks, steps // num_blocks, eos, stats,
                                  gen_length=gen_length, block_length=block_length, threshold=threshold,
                                  factor=factor, draft_steps=draft_steps, use_kernel=use_kernel)
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
    x, attn, L, ragged = masked_answer(model, prompts, gen_length, mask_id, eos)  # (B, L + G) each
    B, device = x.size(0), x.device
    am = attn if ragged else None  # position ids follow from it (pads not counted)
    committed, schedules = [], []
    stats.extra.update(committed=committed, schedule=schedules, early_commits=0, blocks_decoded=0,
                       cache=cache, steps_per_block=steps_per_block)
    parallel = threshold is not None or factor is not None
    kernel = selection_kernel(use_kernel, temperature, remasking, factor)

    for nb in range(num_blocks):
        s, e = L + nb * block_length, L + (nb + 1) * block_length
        sched = num_transfer_tokens((x[:, s:e] == mask_id).sum(-1), steps_per_block)  # (B, steps_per_block)
        schedules.append(sched.tolist())
        kv = None
        rp = torch.zeros_like(x, dtype=torch.bool)
        rp[:, s:e] = True  # the block's slots in the full-length cache (dual)
        step = 0
        while bool((x[:, s:e] == mask_id).any()):
            if not parallel and step >= steps_per_block:
                break  # cannot happen: the schedule sums to the block's masked count
            k = None if parallel else sched[:, step]
            step += 1
            if k is not None and int(k.sum()) == 0:
                continue  # nothing to commit at this step: skip the forward pass
            # ---- the denoiser call (Fast-dLLM's calls): logits for positions off .. end of x (.. e for dual)
            stats.nfe += 1
            fresh = cache is not None and (kv is None or cache_refresh == "step")
            if cache is None:
                logits, off = model.logits(x, attention_mask=am) if ragged else model.logits(x), 0
            elif fresh:  # a full pass: this step's logits and the block's cache
                out = model(x, attention_mask=am, use_cache=True)
                kv = (out.past_key_values if cache == "dual"
                      else tuple((k_[:, :, :s], v_[:, :, :s]) for k_, v_ in out.past_key_values))
                logits, off = out.logits, 0
            if cache is not None and (not fresh or cache_refresh == "step"):  # a cached pass
                stats.nfe += int(fresh)  # "step": decode from the cached pass on the fresh cache
                if cache == "prefix":  # the block and what follows; the prefix from the cache
                    logits = model(x[:, s:], past_key_values=kv, attention_mask=am).logits
                else:  # the block only, at its slots of the full cache
                    logits = model(x[:, s:e], past_key_values=kv, replace_position=rp, attention_mask=am).logits
                off = s
            blk_logits = logits[:, s - off: e - off]  # (B, block, V)
            masked = x[:, s:e] == mask_id  # (B, block)
            # ---- early commit: every remaining masked answer position at once
            if early_commit is not None:
                logits[..., mask_id] = float("-inf")  # the denoiser never predicts MASK itself
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
            # ---- choose what to commit in the current block (MASK is never predicted)
            x0, sel = denoise_step(blk_logits, masked, mask_id, k, threshold, factor, temperature, remasking,
                                   generator, kernel)
            x[:, s:e] = torch.where(sel, x0, x[:, s:e])
            committed.append((counts + sel.sum(-1)).tolist())
        stats.extra["blocks_decoded"] += 1
        if eos and all(any(t in eos for t in row) for row in x[:, L:e].tolist()):
            break  # every row has finished: later blocks cannot change the returned tokens
    return x
