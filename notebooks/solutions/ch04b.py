"""Reference answers for chapter 04b (adaptive gamma and the copy prior). Shown only when the learner asks."""
import math

import torch


def cumulative_round(draft, context, threshold, max_gamma):
    """Draft greedily; stop after the token at which the product of the round's max q (the
    estimated chance that every draft so far is accepted) falls below threshold."""
    out, cache, reach = [], None, 1.0
    feed = torch.tensor([context], device=draft.device)
    for _ in range(max_gamma):
        logits, cache = draft.forward(feed, cache)
        q = torch.softmax(logits[0, -1], -1)
        out.append(int(q.argmax()))
        reach *= float(q.max())
        if reach < threshold:
            break
        feed = torch.tensor([[out[-1]]], device=draft.device)
    return out


def ucb_reward(emitted, gamma, c, gammas):
    """Tokens per unit of cost, (n + 1) / (1 + gamma c), scaled into [0, 1] by its best possible
    value over the arms (BanditSpec, arXiv 2505.15141)."""
    best = max((g + 1) / (1 + g * c) for g in gammas)
    return emitted / (1 + gamma * c) / best


def ucb_choose(total, n):
    """UCB1 (Auer et al. 2002): every arm once, in order; then the arm maximising
    mean reward + sqrt(2 ln t / n_arm), t = plays so far (ties: the first arm)."""
    if 0 in n:
        return n.index(0)
    t = sum(n)
    ucb = [s / k + math.sqrt(2 * math.log(t) / k) for s, k in zip(total, n)]
    return max(range(len(ucb)), key=ucb.__getitem__)
