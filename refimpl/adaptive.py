"""Adaptive draft length: choose ``gamma`` per step instead of fixing it.

A fixed ``gamma`` wastes draft calls where the draft is unsure (they will be rejected) and stops
too early where the text is easy (a copied name, a closing bracket). Two training-free policies:

- ``policy="threshold"`` (confidence stopping, the training-free form of "SpecDec++: Boosting
  Speculative Decoding via Adaptive Candidate Lengths", Huang et al., arXiv 2405.19715, which
  stops once a trained head predicts P(a rejection) above a threshold): after drafting token i,
  stop when the draft's own top-1 probability ``max_v q_i(v) < threshold`` (token i is still
  proposed: it has been paid for), or when ``max_gamma`` tokens are drafted. In a batch each row
  stops on its own; the batch drafts while any row goes on and rows verify only their own drafts.
- ``policy="cumulative"`` (the same idea as SpecDec++'s stopping rule, which bounds the chance
  that *some* draft of the round is rejected): use the product of the top-1 probabilities of the
  round's drafts as the estimate of P(all accepted), and stop once it falls below ``threshold``.
  Drafting token i + 1 only pays off when the round is likely to reach it, so a good threshold is
  near the cost ratio ``c``.
- ``policy="ucb"`` ("BanditSpec: Adaptive Speculative Decoding via Bandit Algorithms", Hou et al.,
  arXiv 2505.15141): UCB1 over the arms ``gammas`` (default 1, 2, 4, 6, 8). The reward of a step is
  the tokens emitted per unit of cost, ``(n + 1) / (1 + gamma * c)`` with ``c = cost_ratio``,
  scaled into [0, 1] by its best possible value ``(gamma + 1) / (1 + gamma * c)`` over the arms.

Both stay exact: the draft length is decided from the draft's side (and from past steps) before
the target is called, and verification is the one of :mod:`refimpl.speculative`: greedy gives
the autoregressive greedy tokens, sampling gives the target's distribution.

The decoding loop reuses :mod:`refimpl.speculative`'s per-row slot caches and its verification
kernels (``kernels.verify_greedy`` / ``kernels.rejection_sample``, whose ``valid`` argument holds
each row's draft length).
"""
from __future__ import annotations

import math

import torch

from . import sampling
from .autoregressive import check_generate_args, left_pad
from .generation import Generation, Stats, Timer, check_positive_int, eos_set, normalize_prompts, truncate_at_eos
from .speculative import _Slots, check_same_tokenizer

POLICIES = ("threshold", "cumulative", "ucb")


class UCB:
    """UCB1 over draft lengths: play each arm once, then the arm maximising mean + sqrt(2 ln t / n)."""

    def __init__(self, gammas=(1, 2, 4, 6, 8), cost_ratio: float = 0.2, explore: float = 1.0):
        if not gammas or any(isinstance(g, bool) or not isinstance(g, int) or g < 1 for g in gammas):
            raise ValueError(f"gammas must be a non-empty list of integers >= 1, got {gammas!r}")
        if not isinstance(cost_ratio, (int, float)) or cost_ratio < 0:
            raise ValueError(f"cost_ratio must be >= 0, got {cost_ratio!r}")
        self.gammas, self.c, self.explore = list(gammas), float(cost_ratio), explore
        self.best = max((g + 1) / (1 + g * self.c) for g in self.gammas)
        self.n = [0] * len(self.gammas)
        self.total = [0.0] * len(self.gammas)
        self.arm = 0

    def choose(self) -> int:
        for i, n in enumerate(self.n):
            if n == 0:
                self.arm = i
                return self.gammas[i]
        t = sum(self.n)
        ucb = [s / n + self.explore * math.sqrt(2 * math.log(t) / n) for s, n in zip(self.total, self.n)]
        self.arm = max(range(len(ucb)), key=ucb.__getitem__)
        return self.gammas[self.arm]

    def update(self, emitted: float, gamma: int) -> None:
        """Reward the last chosen arm with ``emitted`` tokens (mean over rows) for a ``gamma`` step."""
        self.n[self.arm] += 1
        self.total[self.arm] += emitted / (1 + gamma * self.c) / self.best

    def means(self) -> dict:
        return {g: (s / n if n else float("nan")) for g, s, n in zip(self.gammas, self.total, self.n)}


@torch.no_grad()
def generate(target, draft, prompts, max_gamma: int = 8, threshold: float = 0.6, max_new_tokens: int = 64,
             temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
             generator: torch.Generator | None = None, eos_token_id=None, policy: str = "threshold",
             gammas=(1, 2, 4, 6, 8), cost_ratio: float = 0.2, bandit: UCB | None = None,
             _verify=None) -> Generation:
    """Speculative decoding of a ragged batch with an adaptive number of drafts per step.

    ``policy="threshold"``: draft until the draft's top-1 probability falls below ``threshold``
    (the low-confidence token is still proposed), at most ``max_gamma`` tokens.
    ``policy="cumulative"``: draft until the product of the round's top-1 probabilities falls below
    ``threshold``.
    ``policy="ucb"``: a :class:`UCB` bandit over ``gammas`` picks each step's length (pass
    ``bandit`` to keep its statistics across calls). Other arguments as
    :func:`refimpl.speculative.generate`. ``stats.extra["gammas"]`` lists each step's draft calls,
    ``stats.extra["mean_gamma"]`` the mean draft length per row and step. ``_verify`` (tests only)
    replaces the sampling rule ``kernels.rejection_sample``.
    """
    import kernels

    check_positive_int("max_gamma", max_gamma)
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    if not isinstance(threshold, (int, float)) or not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold must be in [0, 1], got {threshold!r}")
    check_generate_args(max_new_tokens, temperature, top_k, top_p)
    check_same_tokenizer(target, draft)
    prompts = normalize_prompts(prompts, min(target.max_length, draft.max_length), max_new_tokens)
    if policy == "ucb" and bandit is None:
        bandit = UCB(gammas, cost_ratio)
    eos = eos_set(eos_token_id, target.eos_token_id)
    greedy = temperature == 0
    device = target.device
    B = len(prompts)
    stats = Stats(rows=B)
    out: list[list[int]] = [[] for _ in prompts]
    step_gammas: list[int] = []
    row_lengths: list[int] = []
    with Timer(stats):
        ids, pmask = left_pad(prompts, target.pad_token_id, device)  # (B, L)
        padded = bool((pmask == 0).any())
        tgt, drf = _Slots(target, B, device), _Slots(draft, B, draft.device)
        t_feed, t_fmask = ids, (pmask if padded else None)
        d_feed, d_fmask = ids.to(draft.device), (pmask.to(draft.device) if padded else None)
        rows = list(range(B))
        while rows:
            remaining = [max_new_tokens - len(out[r]) for r in rows]
            cap = bandit.choose() if policy == "ucb" else max_gamma
            cap = min(cap, max(remaining) - 1)
            # 1. draft until every row has stopped (confidence) or the cap is reached
            stop = torch.tensor([min(cap, m - 1) for m in remaining], device=draft.device)  # (b,) per-row cap
            drafts, qs = [], []
            g = 0
            while g < int(stop.max()):
                dl = drf.feed(d_feed, d_fmask)[:, -1]  # (b, V)
                if greedy:
                    x = dl.argmax(-1)  # (b,)
                    conf = torch.softmax(dl.float(), -1).amax(-1)  # (b,) the draft's top-1 probability
                else:
                    qs.append(sampling.probs(dl, temperature, top_k, top_p))  # (b, V)
                    x = sampling.sample_from_probs(qs[-1], generator)
                    conf = qs[-1].amax(-1)
                drafts.append(x)
                g += 1
                if policy != "ucb":
                    # rows still drafting whose draft is unsure stop after this token
                    cum = conf if g == 1 else cum * conf  # (b,) estimated P(every draft so far accepted)
                    unsure = ((conf if policy == "threshold" else cum) < threshold) & (stop > g)
                    stop = torch.where(unsure, torch.full_like(stop, g), stop)
                d_feed, d_fmask = x[:, None], None
            stats.draft_calls += g
            step_gammas.append(g)
            valid = stop.clamp(max=g).to(device)  # (b,) drafts each row proposes
            x = torch.stack(drafts, 1).to(device) if g else ids.new_zeros((len(rows), 0))  # (b, g)
            # 2. one target call on the unprocessed tokens + drafts
            qt = t_feed.shape[1]
            fm = None if t_fmask is None else torch.cat([t_fmask, torch.ones_like(x)], 1)
            logits = tgt.feed(torch.cat([t_feed, x], 1), fm)[:, qt - 1:]  # (b, g + 1, V)
            stats.target_calls += 1
            # 3. verification (speculative's kernels; ``valid`` makes the row lengths ragged)
            if greedy:
                n, nxt = kernels.verify_greedy(x, logits, valid)
            else:
                p = sampling.probs(logits, temperature, top_k, top_p)  # (b, g + 1, V)
                q = torch.stack(qs, 1).to(device) if g else p[:, :0]  # (b, g, V)
                u = torch.rand((len(rows), g + 1), generator=generator,
                               device=generator.device if generator is not None else device).to(device)
                n, nxt = (_verify or kernels.rejection_sample)(x, p, q, u, valid)
            host = torch.cat([n[:, None], nxt[:, None], valid[:, None], x], 1).tolist()
            # 4. emit
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
            if bandit is not None and policy == "ucb":
                bandit.update(sum(emitted) / len(emitted), g)
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
            # 6. unprocessed tokens: the new one, and the last draft where a row accepted all g
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
    if bandit is not None:
        stats.extra["bandit_means"] = bandit.means()
    return Generation(out, stats)


# ---------------------------------------------------------------------------------------
# benchmark hook
# ---------------------------------------------------------------------------------------
def bench_methods():
    """Adaptive rows for ``refimpl.bench`` (greedy, exact): per-token confidence stopping at 0.3 and
    cumulative stopping at 0.05, both with ``max_gamma = 8``. (On tiny / tiny-draft and on
    SmolLM2-135M / its draft these beat the best fixed gamma in target-call cost units by ~4-6%.)"""
    from .bench import Method

    def run(policy, threshold):
        def f(ctx, prompt_ids, max_new_tokens):
            return generate(ctx.target, ctx.draft, [prompt_ids], max_gamma=8, threshold=threshold, policy=policy,
                            max_new_tokens=max_new_tokens)
        return f

    return [Method("adaptive gamma (confidence < 0.3 stops, max 8)", run("threshold", 0.3), needs=("target", "draft")),
            Method("adaptive gamma (cumulative < 0.05 stops, max 8)", run("cumulative", 0.05),
                   needs=("target", "draft"))]
