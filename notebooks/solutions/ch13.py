"""Reference answers for chapter 13 (dLLM caching and windows). Shown only when the learner asks."""
import torch


def dual_cache_logits(model, x, kv, s, e):
    """One dual-cache step: feed only the block x[:, s:e]; every other position's keys/values come from
    the block-start cache ``kv`` (per layer (k, v), each (B, H, T, D), RoPE applied). The block's own
    cached K/V are stale, so they are left out: the block's fresh K/V take their place."""
    context = tuple((torch.cat([k[:, :, :s], k[:, :, e:]], 2), torch.cat([v[:, :, :s], v[:, :, e:]], 2))
                    for k, v in kv)                                  # prefix + suffix, (B, H, T - b, D)
    pos = torch.arange(s, e, device=x.device).expand(x.size(0), -1)  # the block's own positions
    return model(x[:, s:e], past_key_values=context, position_ids=pos).logits   # (B, b, V)


def tokens_fed(P, G, b, j, cache):
    """Tokens one cached call (not the block's first) feeds the model during block j (0-based)."""
    if cache is None:
        return P + G                      # everything, every call
    if cache == "prefix":
        return G - j * b                  # the block and every later position
    return b                              # dual: the block only
