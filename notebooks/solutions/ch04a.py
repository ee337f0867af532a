"""Reference answers for chapter 04a (drafts and their cost). Shown only when the learner asks."""
import torch

from refimpl import autoregressive


def agreement(target, draft, prompts, n):
    """Teacher-forced greedy agreement: along the target's greedy continuation of each prompt, the
    fraction of positions where the draft's argmax is the target's next token."""
    hits = total = 0
    for p in prompts:
        new = autoregressive.generate(target, [p], max_new_tokens=n, eos_token_id=[]).tokens[0]
        ids = torch.tensor([p + new], device=draft.device)                   # (1, T)
        guess = draft.logits(ids)[0, len(p) - 1: len(p) - 1 + len(new)].argmax(-1)   # predicts each new token
        hits += int((guess == torch.tensor(new, device=guess.device)).sum())
        total += len(new)
    return hits / total


def rate_from_alpha(alpha, gamma):
    """Expected accepted drafts / gamma: a round accepts draft i only if drafts 1..i were, so
    E[accepted] = alpha + alpha^2 + ... + alpha^gamma."""
    return sum(alpha ** i for i in range(1, gamma + 1)) / gamma


def exit_cost(lm, k):
    """Multiply-accumulates per token of the exit after k layers / those of the full model: every
    nn.Linear of the first k layers, plus the LM head (which every exit keeps)."""
    def macs(module):
        return sum(m.weight.numel() for m in module.modules() if isinstance(m, torch.nn.Linear))

    layers, head = lm.model.model.layers, lm.model.lm_head.weight.numel()
    return (sum(macs(layer) for layer in layers[:k]) + head) / (sum(macs(layer) for layer in layers) + head)
