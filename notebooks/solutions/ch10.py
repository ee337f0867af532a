"""Reference answers for chapter 10 (a masked diffusion LM). Shown only when the learner asks."""
import torch
import torch.nn.functional as F

from refimpl import diffusion_lm


def diffusion_loss(model, x0, t, gen):
    """LLaDA Eq. (3) with our per-token normalisation: mask x0 (B, T) at ratios t (B,), then
    sum over masked positions of CE / t, divided by B * T (Eq. 3 itself is a sum, not a mean)."""
    xt, masked = diffusion_lm.forward_mask(x0, t, model.mask_token_id, generator=gen)
    ce = F.cross_entropy(model(xt).logits.transpose(1, 2), x0, reduction="none")  # (B, T)
    return (ce * masked / t[:, None]).sum() / x0.numel()


def sft_forward_mask(x0, prompt_len, t, mask_id, gen):
    """Answer-only masking (LLaDA Eq. 5): one uniform per token of the row, prompt never masked."""
    u = torch.rand(x0.shape, generator=gen, device=x0.device)  # (B, T)
    answer = torch.arange(x0.size(1), device=x0.device) >= prompt_len  # (T,)
    masked = (u < t[:, None]) & answer[None]
    return torch.where(masked, torch.full_like(x0, mask_id), x0), masked


def stratified_t(B, gen):
    """Low-discrepancy mask ratios: t_i = (i + u) / B with one shared u ~ U(0, 1)."""
    u = torch.rand((), generator=gen, device=gen.device)
    return (torch.arange(B, device=gen.device) + u) / B
