"""Block diffusion from an autoregressive model: ``tiny`` adapted into ``tiny-bdlm``.

Paper: "Fast-dLLM v2: Efficient Block-Diffusion LLM" (Wu et al., arXiv 2509.26328), which adapts a
pretrained AR model into a block-diffusion LM with little fine-tuning; the block-causal layout
follows "Block Diffusion: Interpolating Between Autoregressive and Diffusion Language Models"
(BD3-LM, Arriola et al., arXiv 2503.09573, Sec. 3.2 and its vectorised training mask).

The sequence is cut into blocks of ``b`` tokens. Attention is *causal across blocks* and
*bidirectional inside the block being denoised*; committed tokens are processed exactly as the
AR model processes them (causally), so their keys/values never change once written: the block
KV cache is exact, not an approximation like Fast-dLLM v1's (:mod:`refimpl.diffusion`).

The AR model's *shifted* prediction is kept: the output at position ``j - 1`` predicts token
``j``. Inside a block starting at ``s`` the first token is predicted by the clean token ``s - 1``
(exactly the AR model's next-token distribution), token ``j > s`` by the block's slot ``j - 1``,
whose input is either a committed token or MASK.

Training (:func:`block_diffusion_loss`, Fast-dLLM v2 Sec. 3.1): each window ``x0`` is fed three
times in one row, ``[x_t ; x_t' ; x0]``, all with positions ``0..T-1``: two noisy copies with
*complementary* masks (every token is masked in exactly one of them) and the clean stream,
causal, which the noisy blocks attend to for their prefix. Loss = mean cross-entropy of the
masked tokens (shifted) + the AR loss of the clean stream, which keeps the AR model intact.
The block size is drawn per row, so one model decodes with any ``block_length``.

Decoding (:func:`generate`): blocks left to right; inside a block the LLaDA / Fast-dLLM
commit rules of :mod:`refimpl.diffusion` (top-k linear schedule, ``threshold``, ``factor``);
with ``cache=True`` each call feeds only the newly finished block (causally) and the current
block, and the finished block's keys/values stay in the cache: exact, tested equal to
``cache=False``, which recomputes the whole prefix at every step.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .diffusion_steps import check_commit_rule, check_prompts, denoise_step, never_mask, num_transfer_tokens
from .generation import Generation, Stats, Timer, check_positive_int, eos_set, normalize_prompts, truncate_at_eos
from .primitives import additive, left_pad
from .speculative import SlotCache
from .tree import SIDE, Tree

# ---------------------------------------------------------------------------------------
# masks
# ---------------------------------------------------------------------------------------
def block_ids(length: int, size: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """(B,) block sizes and offsets -> (B, T) block index of each position: ``(j + offset) // size``."""
    j = torch.arange(length, device=size.device)
    return (j[None, :] + offset[:, None]) // size[:, None]


def training_allow(blk: torch.Tensor) -> torch.Tensor:
    """Who may attend to whom in a training row ``[x_t ; x_t' ; x0]``: (B, T) block ids -> (B, 3T, 3T) bool.

    Clean stream: causal. A noisy copy at position i: the clean tokens of earlier blocks
    (``blk[j] < blk[i]``) and its own copy's tokens of the same block (bidirectional).
    """
    B, T = blk.shape
    same = blk[:, :, None] == blk[:, None, :]  # (B, T, T)
    before = blk[:, None, :] < blk[:, :, None]  # (B, T, T): key block earlier than query block
    causal = torch.ones(T, T, dtype=torch.bool, device=blk.device).tril().expand(B, T, T)
    none = torch.zeros_like(same)
    noisy_a = torch.cat([same, none, before], dim=2)  # (B, T, 3T)
    noisy_b = torch.cat([none, same, before], dim=2)
    clean = torch.cat([none, none, causal], dim=2)
    return torch.cat([noisy_a, noisy_b, clean], dim=1)  # (B, 3T, 3T)


# ---------------------------------------------------------------------------------------
# training
# ---------------------------------------------------------------------------------------
def block_diffusion_loss(model, x0: torch.Tensor, mask_token_id: int, generator: torch.Generator | None = None,
                         sizes: tuple[int, int] = (2, 16), ar_weight: float = 1.0) -> tuple[torch.Tensor, dict]:
    """Fast-dLLM v2 style loss on windows ``x0`` (B, T) for a Hugging Face causal LM ``model``.

    Block size per row ~ U{sizes[0]..sizes[1]}, random offset; mask ratio per block ~ U(0, 1);
    the second noisy copy masks exactly the tokens the first one keeps (complementary masks).
    Returns ``(loss, parts)`` with the masked and the AR cross-entropies in ``parts``.
    """
    B, T = x0.shape
    dev = x0.device
    gdev = generator.device if generator is not None else dev  # draws happen where the generator lives
    size = torch.randint(sizes[0], sizes[1] + 1, (B,), generator=generator, device=gdev).to(dev)  # (B,)
    offset = (torch.rand(B, generator=generator, device=gdev).to(dev) * size).long()  # (B,)
    blk = block_ids(T, size, offset)  # (B, T)
    blk = blk - blk[:, :1]  # 0-based
    t = torch.rand(B, int(blk.max()) + 1, generator=generator, device=gdev).to(dev)  # (B, blocks) mask ratio per block
    masked_a = torch.rand(B, T, generator=generator, device=gdev).to(dev) < t.gather(1, blk)  # (B, T)
    masked_b = ~masked_a
    mask_tok = torch.full_like(x0, mask_token_id)
    ids = torch.cat([torch.where(masked_a, mask_tok, x0), torch.where(masked_b, mask_tok, x0), x0], 1)  # (B, 3T)
    pos = torch.arange(T, device=dev).repeat(3)[None].expand(B, 3 * T)
    attn = additive(training_allow(blk), next(model.parameters()).dtype)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits  # (B, 3T, V)
    V = logits.size(-1)
    start = torch.ones_like(masked_a)
    start[:, 1:] = blk[:, 1:] != blk[:, :-1]  # (B, T) first token of a block: predicted by the clean stream
    ce = []
    for c, m in ((0, masked_a), (1, masked_b)):
        lg = logits[:, c * T: c * T + T - 1]  # slot j - 1 predicts token j
        want = (m & ~start)[:, 1:]  # (B, T - 1)
        ce.append(F.cross_entropy(lg.reshape(-1, V), x0[:, 1:].reshape(-1), reduction="none").view(B, T - 1)[want])
    masked_ce = torch.cat(ce).mean()
    ar_ce = F.cross_entropy(logits[:, 2 * T: 3 * T - 1].reshape(-1, V), x0[:, 1:].reshape(-1))
    return masked_ce + ar_weight * ar_ce, {"masked_ce": masked_ce.item(), "ar_ce": ar_ce.item()}


# ---------------------------------------------------------------------------------------
# one denoiser call: finished tokens (causal) + the current block (bidirectional)
# ---------------------------------------------------------------------------------------
def block_step(sc: SlotCache, pending: torch.Tensor, pmask: torch.Tensor | None,
               block: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward of ``sc.lm`` on top of its cache: ``pending`` (B, F) committed tokens not yet in
    the cache (``pmask`` (B, F) marks real ones, None = all) see the cache and each other causally;
    ``block`` (B, b) sees the cache, the pending tokens and the whole block.

    The pending tokens' keys/values stay in ``sc`` (they are final); the block's are dropped.
    Returns ``(pending logits (B, F, V), block logits (B, b, V))``.
    """
    B, Fn = pending.shape
    b, dev = block.shape[1], block.device
    P = sc.length
    if Fn == 0 and not sc.holes:  # a block's later calls: it sees every cached slot and itself, nothing else
        see_all = torch.zeros((B, 1, b, P + b), dtype=torch.float32, device=dev)  # additive: 0 = may attend
        pos = sc.count[:, None] + torch.arange(b, device=dev)  # (B, b)
        logits = sc.lm.forward(block, sc.cache, position_ids=pos, attention_mask=see_all)[0]  # (B, b, V)
        sc.lm.crop(sc.cache, P)  # drop the block's keys/values
        return logits[:, :0], logits
    # the block as b side nodes of a refimpl.tree.Tree: positions 1..b after the pending tokens, each
    # sees all the others (and, as every node does, the cache and the pending tokens)
    slots = Tree(torch.full((B, b), SIDE, device=dev), torch.arange(1, b + 1, device=dev).expand(B, b),
                 torch.ones(B, b, b, dtype=torch.bool, device=dev))
    logits = slots.feed(sc, pending, pmask, block, torch.full((B,), b, device=dev)).logits  # (B, F + b, V)
    sc.keep(b, torch.zeros_like(block), P + Fn, new_holes=False)  # drop the block's keys/values
    return logits[:, :Fn], logits[:, Fn:]


def block_predictions(first: torch.Tensor, block_logits: torch.Tensor) -> torch.Tensor:
    """The shift: (B, V) logits of the token before the block + (B, b, V) block logits -> (B, b, V)
    predictions of the block's b tokens (slot j - 1 predicts token j)."""
    return torch.cat([first[:, None], block_logits[:, :-1]], 1)


def learned_commit(rule, predictions: torch.Tensor, masked: torch.Tensor, mask_id: int,
                   step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One step's choice by a learned ``rule`` (see :func:`generate`): MASK is never predicted, the
    choice is restricted to ``masked``, and a row left with nothing to commit is an error."""
    x0, sel = rule(never_mask(predictions, mask_id), masked, step)
    sel = sel & masked
    if not bool((sel.any(-1) | ~masked.any(-1)).all()):
        raise ValueError("rule committed no masked position in a row: the block would never finish")
    return x0, sel


# ---------------------------------------------------------------------------------------
# the sampler
# ---------------------------------------------------------------------------------------
def check_args(model, prompts, gen_length, block_length, steps, threshold, factor, temperature, remasking):
    check_positive_int("gen_length", gen_length)
    check_positive_int("block_length", block_length)
    if gen_length % block_length:
        raise ValueError(f"block_length ({block_length}) must divide gen_length ({gen_length})")
    nb = gen_length // block_length
    if steps is None:
        steps = gen_length
    check_positive_int("steps", steps)
    if steps % nb or steps // nb > block_length:
        raise ValueError(f"steps ({steps}) must be a multiple of the number of blocks ({nb}) "
                         f"and at most gen_length ({gen_length})")
    check_commit_rule(temperature, remasking, threshold, factor)
    mask_id = getattr(model, "mask_token_id", None)
    if not isinstance(mask_id, int) or not callable(getattr(model, "forward", None)):
        raise ValueError("model must be a block-diffusion LM (an LM with a mask_token_id, e.g. models.load('tiny-bdlm'))")
    check_prompts(prompts, mask_id)
    return nb, steps // nb, mask_id


@torch.no_grad()
def generate(model, prompts, gen_length: int = 32, block_length: int = 8, steps: int | None = None,
             threshold: float | None = None, factor: float | None = None, temperature: float = 0.0,
             remasking: str = "low_confidence", cache: bool = True, generator: torch.Generator | None = None,
             eos_token_id=None, rule=None) -> Generation:
    """Block-diffusion decoding of ``gen_length`` tokens after each prompt (see the module doc).

    ``steps`` (default ``gen_length``: one token per step) is split evenly over the blocks;
    ``threshold`` / ``factor`` switch to Fast-dLLM's parallel commits (``steps`` is then only
    validated: a block takes as many calls as it needs). ``cache=False`` recomputes the
    prefix at every call (the reference the exact cache is tested against). ``stats.nfe``:
    forward passes; ``stats.extra["committed"]``: tokens committed per step per row.
    """
    prompts = normalize_prompts(prompts, model.max_length, gen_length)
    nb, per_block, mask_id = check_args(model, prompts, gen_length, block_length, steps, threshold, factor,
                                        temperature, remasking)
    if not isinstance(cache, bool):
        raise ValueError(f"cache must be True or False, got {cache!r}")
    if rule is not None and (not callable(rule) or threshold is not None or factor is not None or temperature):
        raise ValueError("rule must be a callable commit rule, used alone (no threshold / factor) and greedy "
                         f"(temperature 0); got rule={rule!r}, threshold={threshold}, factor={factor}, "
                         f"temperature={temperature}")
    eos = eos_set(eos_token_id, model.eos_token_id)
    dev, B = model.device, len(prompts)
    stats = Stats(rows=B)
    committed = []
    stats.extra.update(committed=committed, cache=cache, block_length=block_length)
    with Timer(stats):
        ids, pm = left_pad(prompts, model.pad_token_id, dev)  # (B, L)
        pm = pm if bool((pm == 0).any()) else None
        done = ids.new_zeros((B, 0))  # generated tokens so far
        sc, pending, pmask = SlotCache(model, B, dev), ids, pm
        for _ in range(nb):
            x = torch.full((B, block_length), mask_id, dtype=torch.long, device=dev)  # (B, b)
            sched = num_transfer_tokens((x == mask_id).sum(-1), per_block)  # (B, per_block)
            first, step = None, 0
            while bool((x == mask_id).any()):
                if not cache:  # recompute everything before the block
                    sc = SlotCache(model, B, dev)
                    pending = torch.cat([ids, done], 1)
                    pmask = None if pm is None else torch.cat([pm, torch.ones_like(done)], 1)
                lp, lb = block_step(sc, pending, pmask, x)
                stats.nfe += 1
                if pending.shape[1]:
                    first = lp[:, -1]  # (B, V): the clean token before the block predicts its first token
                pending, pmask = pending[:, :0], None
                masked = x == mask_id
                if rule is not None:
                    x0, sel = learned_commit(rule, block_predictions(first, lb), masked, mask_id, step)
                else:
                    x0, sel = denoise_step(block_predictions(first, lb), masked, mask_id,  # MASK never predicted
                                           k=sched[:, min(step, per_block - 1)], threshold=threshold, factor=factor,
                                           temperature=temperature, remasking=remasking, generator=generator)
                x = torch.where(sel, x0, x)
                committed.append(sel.sum(-1).tolist())
                step += 1
            done = torch.cat([done, x], 1)
            pending, pmask = x, None
            if eos and all(any(t in eos for t in row) for row in done.tolist()):
                break  # every row has finished
    out = [truncate_at_eos(row, eos, gen_length)[0] for row in done.tolist()]
    stats.target_calls = stats.nfe
    stats.new_tokens = sum(len(o) for o in out)
    return Generation(out, stats)
