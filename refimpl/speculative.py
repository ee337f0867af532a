"""Speculative decoding with a draft model: draft ``gamma`` tokens, verify them in one target pass.

Papers:
- Leviathan, Kalman, Matias, "Fast Inference from Transformers via Speculative Decoding",
  arXiv 2211.17192: Algorithm 1 (speculative sampling) and §3.1, the expected number of tokens
  per target call, ``E[tau] = (1 - alpha^(gamma+1)) / (1 - alpha)`` (their eq. 1).
- Chen et al., "Accelerating Large Language Model Decoding with Speculative Sampling",
  arXiv 2302.01318: Algorithm 2 and Theorem 1 (the modified rejection sampling is lossless).
- Stern, Shazeer, Uszkoreit, "Blockwise Parallel Decoding for Deep Autoregressive Models",
  arXiv 1811.03115: the greedy case (accept the longest prefix that equals the target argmax).

One step, for each row of the batch:

1. the draft ``q`` proposes ``x_1..x_gamma`` autoregressively (``gamma`` cached draft calls);
2. ONE target call scores the last committed token followed by the drafts: ``p_1..p_{gamma+1}``;
3. greedy (temperature 0): keep the longest prefix with ``x_i == argmax p_i`` and append the
   target's argmax after it (:func:`kernels.verify_greedy`); sampling: accept ``x_i`` with
   probability ``min(1, p_i(x_i) / q_i(x_i))``, at the first rejection draw from
   ``norm(max(0, p_i - q_i))``, and if every draft was accepted draw a bonus token from
   ``p_{gamma+1}`` (:func:`kernels.rejection_sample`). ``p`` and ``q`` get the same temperature /
   top-k / top-p processing (:func:`refimpl.sampling.probs`), so the output is distributed
   exactly as plain sampling from the target with those settings;
4. both KV caches are rolled back past the rejected drafts.

Ragged batches (rows accept different counts). Both caches keep one *physical* length for the
whole batch, and a 2-D slot mask (B, slots) marks which slots hold a row's real tokens. After a
verification each cache is cropped (:meth:`LM.crop`) to the longest row; in the other rows the
slots of rejected drafts stay behind as *holes* (mask 0) that are never attended to. Position
ids count only a row's valid slots, so every row computes exactly what it would compute alone.
At batch 1 there are never holes and no mask is passed at all. Rows that finish (EOS or
``max_new_tokens``) are dropped from both caches.

Draft lengths come from a policy object (:class:`FixedGamma` here; the adaptive policies of
:mod:`refimpl.adaptive` plug into the same loop, :func:`decode`), and each row verifies only its
own drafts.

The draft is never run twice on a token: after verification its cache keeps the accepted
drafts it has already processed, and the next round first feeds what it has not seen: the
correction/bonus token, preceded by the last draft token when all ``gamma`` were accepted (the
draft proposed it but never processed it).
"""
from __future__ import annotations

import torch

from . import sampling
from .autoregressive import check_generate_args, left_pad
from .generation import Generation, Stats, Timer, check_positive_int, eos_set, normalize_prompts, truncate_at_eos


# ---------------------------------------------------------------------------------------
# checks
# ---------------------------------------------------------------------------------------
_SAME_VOCAB: dict = {}


def check_same_tokenizer(target, draft) -> None:
    """Raise ``ValueError`` naming ``draft`` when its vocabulary differs from the target's."""
    if draft.vocab_size != target.vocab_size:
        raise ValueError(f"draft has {draft.vocab_size} output tokens but the target has {target.vocab_size}: "
                         "speculative decoding needs a draft with the target's tokenizer")
    key = (id(target.tokenizer), id(draft.tokenizer))
    if key in _SAME_VOCAB or target.tokenizer is draft.tokenizer:
        return
    tv = target.tokenizer.get_vocab() if hasattr(target.tokenizer, "get_vocab") else None
    dv = draft.tokenizer.get_vocab() if hasattr(draft.tokenizer, "get_vocab") else None
    if tv != dv:
        raise ValueError("draft tokenizer differs from the target tokenizer (different vocabularies): "
                         "speculative decoding needs a draft with the target's tokenizer")
    _SAME_VOCAB[key] = True


# ---------------------------------------------------------------------------------------
# a KV cache with per-row valid slots
# ---------------------------------------------------------------------------------------
class SlotCache:
    """One model's KV cache plus a (B, slots) mask of valid slots and per-row valid counts."""

    def __init__(self, lm, batch: int, device):
        self.lm = lm
        self.cache = None
        self.mask = torch.zeros((batch, 0), dtype=torch.long, device=device)  # (B, P)
        self.count = torch.zeros(batch, dtype=torch.long, device=device)  # (B,) valid slots
        self.holes = False  # does any row have a 0 in ``mask``?

    def feed(self, tokens: torch.Tensor, fmask: torch.Tensor | None = None) -> torch.Tensor:
        """Append ``tokens`` (B, Q) (``fmask`` (B, Q) marks real ones; None = all) -> logits (B, Q, V)."""
        B, Q = tokens.shape
        if fmask is None:
            pos = self.count[:, None] + torch.arange(Q, device=tokens.device)  # (B, Q)
            fmask = torch.ones_like(tokens)
        else:
            pos = self.count[:, None] + (fmask.cumsum(-1) - 1).clamp(min=0)
            self.holes = True  # callers pass a feed mask only when it has holes (pads)
        self.mask = torch.cat([self.mask, fmask], dim=1)
        logits, self.cache = self.lm.forward(tokens, self.cache, position_ids=pos,
                                             attention_mask=self.mask if self.holes else None)
        self.count = self.count + fmask.sum(-1)
        return logits

    def keep(self, block: int, keep: torch.Tensor, length: int, new_holes: bool) -> None:
        """Of the last ``block`` slots, keep those where ``keep`` (B, block) is 1; crop to ``length`` slots."""
        P = self.mask.shape[1]
        self.mask = torch.cat([self.mask[:, : P - block], self.mask[:, P - block:] * keep], dim=1)[:, :length]
        self.lm.crop(self.cache, length)
        self.count = self.mask.sum(-1)
        self.holes = self.holes or new_holes

    def select(self, rows: torch.Tensor) -> None:
        """Keep only the batch rows ``rows`` (finished rows leave the batch)."""
        self.cache.batch_select_indices(rows)
        self.mask, self.count = self.mask[rows], self.count[rows]


# ---------------------------------------------------------------------------------------
# draft-length policies: how many tokens to draft this step
# ---------------------------------------------------------------------------------------
class FixedGamma:
    """Draft ``gamma`` tokens every step (fewer where a row needs fewer tokens).

    The interface every draft-length policy of :func:`decode` has (see :mod:`refimpl.adaptive`):
    ``cap()`` the most drafts this step; when ``confidence`` is True, ``stop(g, conf, stop)`` is
    called after the g-th draft token with the draft's top-1 probabilities ``conf`` (b,) and
    returns the per-row draft lengths ``stop`` (b,) updated; ``update(emitted, g)`` sees the mean
    tokens emitted per row after each step.
    """

    confidence = False

    def __init__(self, gamma: int):
        self.gamma = gamma

    def cap(self) -> int:
        return self.gamma

    def stop(self, g: int, conf: torch.Tensor, stop: torch.Tensor) -> torch.Tensor:
        return stop

    def update(self, emitted: float, g: int) -> None:
        pass


# ---------------------------------------------------------------------------------------
# the decoder
# ---------------------------------------------------------------------------------------
@torch.no_grad()
def generate(target, draft, prompts, gamma: int = 4, max_new_tokens: int = 64, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, generator: torch.Generator | None = None,
             eos_token_id=None, _verify=None) -> Generation:
    """Speculative decoding of a ragged batch with ``draft`` proposing ``gamma`` tokens per step.

    ``temperature=0`` is greedy and returns exactly ``autoregressive.generate``'s tokens; otherwise
    the tokens are distributed exactly as sampling from ``target`` with the same temperature /
    top_k / top_p (seeded by ``generator``). ``eos_token_id=None`` uses the target's EOS.
    ``_verify`` (tests only) replaces the sampling rule ``kernels.rejection_sample``.

    Returns a :class:`Generation`; ``stats.accepted[step][row]`` is the number of drafts row
    ``row`` accepted at that step (0 once the row has finished) and ``stats.extra["gammas"][step]``
    the draft length of that step (``gamma``, less near ``max_new_tokens``).
    """
    check_positive_int("gamma", gamma)
    return decode(target, draft, prompts, FixedGamma(gamma), max_new_tokens, temperature, top_k, top_p, generator,
                  eos_token_id, _verify)


@torch.no_grad()
def decode(target, draft, prompts, policy, max_new_tokens: int = 64, temperature: float = 0.0,
           top_k: int | None = None, top_p: float | None = None, generator: torch.Generator | None = None,
           eos_token_id=None, _verify=None) -> Generation:
    """The draft / verify / roll-back loop shared by fixed and adaptive draft lengths.

    ``policy`` decides each step's draft length (:class:`FixedGamma`, or the adaptive policies of
    :mod:`refimpl.adaptive`); every row verifies only its own drafts (``valid`` of the kernels).
    ``stats.extra["gammas"]`` lists the draft calls of each step, ``stats.extra["mean_gamma"]`` the
    mean draft length per row and step.
    """
    import kernels

    check_generate_args(max_new_tokens, temperature, top_k, top_p)
    check_same_tokenizer(target, draft)
    prompts = normalize_prompts(prompts, min(target.max_length, draft.max_length), max_new_tokens, target.vocab_size)
    eos = eos_set(eos_token_id, target.eos_token_id)
    greedy = temperature == 0
    verify = _verify or kernels.rejection_sample
    device = target.device
    B = len(prompts)
    stats = Stats(rows=B)
    out: list[list[int]] = [[] for _ in prompts]
    step_gammas: list[int] = []
    row_lengths: list[int] = []
    with Timer(stats):
        ids, pmask = left_pad(prompts, target.pad_token_id, device)  # (B, L)
        padded = bool((pmask == 0).any())
        tgt, drf = SlotCache(target, B, device), SlotCache(draft, B, draft.device)
        t_feed, t_fmask = ids, (pmask if padded else None)  # tokens the target has not processed
        d_feed, d_fmask = ids.to(draft.device), (pmask.to(draft.device) if padded else None)
        rows = list(range(B))  # current batch index -> original row
        while rows:
            remaining = [max_new_tokens - len(out[r]) for r in rows]
            cap = min(policy.cap(), max(remaining) - 1)  # never draft past what any row still needs
            per_row = [min(cap, m - 1) for m in remaining]
            stop = torch.tensor(per_row, device=draft.device)  # (b,) each row's draft length
            limit = max(per_row)
            # 1. draft (the first call also feeds what the draft has not processed)
            drafts, qs = [], []
            g = 0
            while g < limit:
                dl = drf.feed(d_feed, d_fmask)[:, -1]  # (b, V)
                if greedy:
                    x = dl.argmax(-1)  # (b,)
                    conf = torch.softmax(dl.float(), -1).amax(-1) if policy.confidence else None
                else:
                    qs.append(sampling.probs(dl, temperature, top_k, top_p))  # (b, V)
                    x = sampling.sample_from_probs(qs[-1], generator)
                    conf = qs[-1].amax(-1)
                drafts.append(x)
                g += 1
                if policy.confidence:  # the draft's top-1 probability may stop rows early
                    stop = policy.stop(g, conf, stop)
                    limit = int(stop.max())
                d_feed, d_fmask = x[:, None], None
            stats.draft_calls += g
            step_gammas.append(g)
            valid = stop.clamp(max=g).to(device)  # (b,) drafts each row proposes
            x = torch.stack(drafts, 1).to(device) if g else ids.new_zeros((len(rows), 0))  # (b, g)
            # 2. one target call: unprocessed tokens (last committed, or the prompt) + drafts
            qt = t_feed.shape[1]
            fm = None if t_fmask is None else torch.cat([t_fmask, torch.ones_like(x)], 1)
            logits = tgt.feed(torch.cat([t_feed, x], 1), fm)[:, qt - 1:]  # (b, g + 1, V)
            stats.target_calls += 1
            stats.row_steps += len(rows)  # rows still decoding in this pass
            # 3. accept / reject
            if greedy:
                n, nxt = kernels.verify_greedy(x, logits, valid)
            else:
                p = sampling.probs(logits, temperature, top_k, top_p)  # (b, g + 1, V)
                q = torch.stack(qs, 1).to(device) if g else p[:, :0]  # (b, g, V)
                u = torch.rand((len(rows), g + 1), generator=generator,
                               device=generator.device if generator is not None else device).to(device)
                n, nxt = verify(x, p, q, u, valid)
            host = torch.cat([n[:, None], nxt[:, None], valid[:, None], x], 1).tolist()  # the one sync per step
            # 4. emit, stop rows at EOS / max_new_tokens
            step_acc = [0] * B
            finished, emitted = [], []
            for i, r in enumerate(rows):
                k, t, v, xs = host[i][0], host[i][1], host[i][2], host[i][3:]
                step_acc[r] = k
                stats.drafted += v
                row_lengths.append(v)
                new, done = truncate_at_eos(xs[:k] + [t], eos, remaining[i])
                out[r].extend(new)
                emitted.append(len(new))
                if done or len(out[r]) >= max_new_tokens:
                    finished.append(i)
            stats.accepted.append(step_acc)
            policy.update(sum(emitted) / len(emitted), g)
            if len(finished) == len(rows) or g == 0:  # g == 0 only when every row needed one token
                break
            # 5. roll both caches back past the rejected (or never proposed) drafts
            n_list = [h[0] for h in host]
            nmax = max(n_list)
            slot = torch.arange(g, device=device)
            tgt.keep(g, (slot[None, :] < n[:, None]).long(), tgt.mask.shape[1] - g + nmax,
                     new_holes=len(set(n_list)) > 1)
            if g > 1:  # the draft processed x_1 .. x_{g-1}; keep the accepted ones
                dn = n.clamp(max=g - 1).to(draft.device)
                dkeep = (slot[None, : g - 1].to(draft.device) < dn[:, None]).long()
                drf.keep(g - 1, dkeep, drf.mask.shape[1] - (g - 1) + min(nmax, g - 1),
                         new_holes=len({min(k, g - 1) for k in n_list}) > 1)
            # 6. what each model has not processed yet: the new token (and x_g if all were accepted)
            t_feed, t_fmask = nxt[:, None], None
            nxt_d = nxt.to(draft.device)
            if nmax == g:
                all_acc = (n == g).to(draft.device)  # (b,)
                d_feed = torch.stack([torch.where(all_acc, x[:, -1].to(draft.device), nxt_d), nxt_d], 1)
                d_fmask = None if all(k == g for k in n_list) else torch.stack(
                    [all_acc.long(), torch.ones_like(nxt_d)], 1)
            else:
                d_feed, d_fmask = nxt_d[:, None], None
            if finished:
                keep = [i for i in range(len(rows)) if i not in finished]
                sel = torch.tensor(keep, device=device)
                tgt.select(sel)
                drf.select(sel.to(draft.device))
                t_feed = t_feed[sel]
                d_feed = d_feed[sel.to(draft.device)]
                d_fmask = None if d_fmask is None else d_fmask[sel.to(draft.device)]
                rows = [rows[i] for i in keep]
    stats.nfe = stats.target_calls + stats.draft_calls
    stats.new_tokens = sum(len(o) for o in out)
    stats.extra["gammas"] = step_gammas
    stats.extra["mean_gamma"] = sum(row_lengths) / len(row_lengths) if row_lengths else 0.0
    return Generation(out, stats)


def expected_tau(alpha: float, gamma: int) -> float:
    """Expected tokens per target call with i.i.d. acceptance ``alpha`` (Leviathan et al., eq. 1)."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


# ---------------------------------------------------------------------------------------
# benchmark hook
# ---------------------------------------------------------------------------------------
def bench_methods():
    """Rows for ``refimpl.bench``: greedy (exact) and T=0.7 sampling, both with gamma = 4."""
    from .bench import Method

    def greedy(ctx, prompt_ids, max_new_tokens):
        return generate(ctx.target, ctx.draft, [prompt_ids], gamma=4, max_new_tokens=max_new_tokens)

    def sampled(ctx, prompt_ids, max_new_tokens):
        return generate(ctx.target, ctx.draft, [prompt_ids], gamma=4, max_new_tokens=max_new_tokens,
                        temperature=0.7, generator=ctx.generator)

    return [
        Method("speculative greedy (gamma=4)", greedy, needs=("target", "draft"), exact=True),
        Method("speculative sampling T=0.7 (gamma=4)", sampled, needs=("target", "draft"), exact=False),
    ]
