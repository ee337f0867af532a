"""decode_attention: Triton (interpreter) == torch reference on awkward shapes; HF integration."""
import pytest
import torch

from kernels.decode_attention import decode_attention, decode_attention_reference, decode_attention_triton

SHAPES = [  # B, Hq, Hkv, Q, K, D
    (1, 4, 2, 1, 1, 64),
    (1, 4, 2, 1, 37, 64),
    (2, 4, 4, 5, 100, 32),
    (3, 6, 2, 3, 65, 40),   # D not a power of two, G = 3
    (2, 8, 1, 9, 130, 16),  # MQA, more queries than one tile row group
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("splits", [None, 1, 3])
def test_causal_matches_reference(shape, splits):
    B, Hq, Hkv, Q, K, D = shape
    g = torch.Generator().manual_seed(hash(shape) % 1000)
    q, k, v = (torch.randn(B, h, n, D, generator=g) for h, n in ((Hq, Q), (Hkv, K), (Hkv, K)))
    ref = decode_attention_reference(q, k, v)
    out = decode_attention_triton(q, k, v, num_splits=splits)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_reference_equals_sdpa():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 6, 32), torch.randn(2, 2, 20, 32), torch.randn(2, 2, 20, 32)
    ref = decode_attention_reference(q, k, v)
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    causal = torch.ones(6, 20, dtype=torch.bool).tril(14)
    torch.testing.assert_close(ref, torch.nn.functional.scaled_dot_product_attention(q, kk, vv, attn_mask=causal))


def test_additive_and_boolean_masks_and_fully_masked_rows():
    torch.manual_seed(1)
    B, Hq, Hkv, Q, K, D = 2, 4, 2, 4, 50, 64
    q, k, v = torch.randn(B, Hq, Q, D), torch.randn(B, Hkv, K, D), torch.randn(B, Hkv, K, D)
    mask = torch.zeros(B, 1, Q, K)
    mask[0, :, :, :7] = float("-inf")                     # left padding
    mask[1, :, 2, :] = torch.finfo(torch.float32).min     # a fully blocked row
    mask[1, :, 3, 10:20] = -3.0                           # a soft bias
    ref = decode_attention_reference(q, k, v, mask)
    out = decode_attention_triton(q, k, v, mask, num_splits=2)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert torch.all(out[1, :, 2] == 0), "a fully blocked row returns zeros"
    tree = torch.rand(B, Hq, Q, K) > 0.3
    tree[..., 0] = True
    torch.testing.assert_close(decode_attention_triton(q, k, v, tree), decode_attention_reference(q, k, v, tree),
                               atol=1e-5, rtol=1e-5)


def test_half_precision():
    torch.manual_seed(2)
    q, k, v = (torch.randn(1, 4, n, 64).to(torch.float16) for n in (2, 70, 70))
    k, v = k[:, :2], v[:, :2]
    out = decode_attention_triton(q, k, v)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.float(), decode_attention_reference(q.float(), k.float(), v.float()),
                               atol=2e-3, rtol=2e-3)


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="multiple"):
        decode_attention(torch.randn(1, 3, 1, 8), torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8))
    with pytest.raises(ValueError, match="mask"):
        decode_attention(torch.randn(1, 2, 1, 8), torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8),
                         mask=torch.zeros(1, 1, 2, 4))


def test_tiny_model_through_triton_matches_default(tiny, tiny_prompts):
    """The whole tiny model with attention routed through the kernel (interpreter) == sdpa."""
    from refimpl import autoregressive as ar
    from refimpl import models

    tri = models.load("tiny", device="cpu", attn="triton")
    ids = torch.tensor([tiny_prompts[2]])
    torch.testing.assert_close(tri.logits(ids), tiny.logits(ids), atol=1e-4, rtol=1e-4)
    # cached decoding with a ragged batch (4-D padding masks) gives the same tokens
    prompts = tiny_prompts[:3]
    assert ar.generate(tri, prompts, max_new_tokens=6).tokens == ar.generate(tiny, prompts, max_new_tokens=6).tokens


@pytest.mark.parametrize("splits", [1, 2])
def test_bfloat16_under_the_interpreter(splits):
    """Triton 3.7's CPU interpreter multiplies the raw bits of bf16 ``tl.dot`` operands; the
    kernel upcasts them there (only there), so bf16 decodes the same on the CPU as on a GPU."""
    g = torch.Generator(device="cpu").manual_seed(5)
    q, k, v = (torch.randn(2, 4, n, 40, generator=g).to(torch.bfloat16) for n in (3, 60, 60))
    k, v = k[:, :2], v[:, :2]
    mask = torch.zeros(2, 1, 3, 60, dtype=torch.bfloat16)
    mask[0, :, :, :6] = float("-inf")  # left padding
    for m in (None, mask):
        out = decode_attention_triton(q, k, v, m, num_splits=splits)
        assert out.dtype == torch.bfloat16
        ref = decode_attention_reference(q.float(), k.float(), v.float(), None if m is None else m.float())
        torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
