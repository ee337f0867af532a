"""Reference answers for chapter 06b (EAGLE-3 and the CPU fast path). Shown only when the learner asks."""
import torch


def ttt_mask(T, j):
    """EAGLE-3's training-time test (arXiv 2503.01840, §3.1): step j's queries see step 0's keys
    causally and, of each step 1..j, only their own index (their chain)."""
    blocks = [torch.ones(T, T, dtype=torch.bool, device="cpu").tril()]
    blocks += [torch.eye(T, dtype=torch.bool, device="cpu")] * j
    return torch.cat(blocks, 1)


def quantize_rows(weight):
    """Symmetric int8 per output row (the draft's int8 kernel panels): scale = the row's largest
    magnitude / 127 (1 for an all-zero row), q = the nearest integer to weight / scale, in [-127, 127]."""
    w = weight.detach().float()
    scale = w.abs().amax(1) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8), scale
