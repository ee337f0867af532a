"""Reference answers for chapter 11 (LLaDA sampling). Shown only when the learner asks."""
import torch


def llada_nfe(gen_length, steps, block_length):
    """Denoiser calls on a fully masked answer without an EOS stop: each block gets
    steps / num_blocks steps, but a step of the linear schedule that commits 0 tokens (more steps
    than positions in the block) is skipped, so a block costs min(steps per block, block_length)."""
    num_blocks = gen_length // block_length
    return num_blocks * min(steps // num_blocks, block_length)


def random_remask(masked, k, gen):
    """Random remasking: one uniform per position as its "confidence", committed positions at
    -inf, then the top min(k, #masked) of them (LLaDA's remasking="random")."""
    u = torch.rand(masked.shape, generator=gen, dtype=torch.float64, device=masked.device)
    u = u.masked_fill(~masked, float("-inf"))
    n = min(int(k), int(masked.sum()))
    sel = torch.zeros_like(masked)
    sel[u.topk(n).indices] = True
    return sel


def margin(logits):
    """p_top1 - p_top2 of softmax(logits) per position: (..., V) -> (...)."""
    top = torch.softmax(logits.double(), -1).topk(2, -1).values
    return top[..., 0] - top[..., 1]
