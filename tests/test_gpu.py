"""The GPU checks (``make test-gpu``, the self-hosted GPU job of .github/workflows/ci.yml): every
Triton kernel compiled natively and run on CUDA tensors against its torch reference, the kernel
benchmarks, and end-to-end decoding on the GPU (greedy methods == AR greedy, the exact block cache
== no cache). Skipped, with the reason, without CUDA or under TRITON_INTERPRET=1 (where the
kernels would run in the CPU interpreter: the CPU suite already covers that)."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA device: the GPU checks run with `make test-gpu` on a GPU machine", allow_module_level=True)
if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("TRITON_INTERPRET=1: the native kernels are not used; run `make test-gpu`", allow_module_level=True)

import decoding  # noqa: E402
from kernels.confidence_select import confidence_select_reference, confidence_select_triton
from kernels.decode_attention import decode_attention_reference, decode_attention_triton
from kernels.rejection_sample import rejection_sample_reference, rejection_sample_triton
from kernels.tree_attention import tree_attention_reference, tree_attention_triton
from kernels.verify_greedy import verify_greedy_reference, verify_greedy_triton
from refimpl import autoregressive, block_diffusion, dllm_draft, models, speculative, tree  # noqa: E402

DEV = "cuda"


# A tolerance that holds even where a dot rounds its fp32 inputs to TF32 (10-bit mantissa, ~5e-4
# relative per product): the kernels ask for tf32x3, but a driver or a future Triton may not honour
# it, and a wrong mask or merge is off by O(1), far above this.
TOL = {torch.float32: 3e-3, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def test_decode_attention_native():
    g = torch.Generator(device=DEV).manual_seed(0)
    for B, Hq, Hkv, Q, K, D, dt in [(1, 4, 2, 1, 37, 64, torch.float32), (3, 6, 2, 5, 130, 40, torch.float32),
                                    (2, 8, 1, 9, 1000, 128, torch.float32), (2, 4, 2, 3, 300, 64, torch.float16),
                                    (2, 4, 2, 3, 300, 64, torch.bfloat16)]:
        q, k, v = (torch.randn(B, h, n, D, device=DEV, generator=g).to(dt) for h, n in ((Hq, Q), (Hkv, K), (Hkv, K)))
        mask = torch.zeros(B, 1, Q, K, device=DEV, dtype=dt)
        mask[0, :, :, :5] = float("-inf")  # pads
        for m in (None, mask):
            ref = decode_attention_reference(q.float(), k.float(), v.float(), None if m is None else m.float())
            torch.testing.assert_close(decode_attention_triton(q, k, v, m).float(), ref, atol=TOL[dt], rtol=TOL[dt])


def test_tree_attention_native():
    g = torch.Generator(device=DEV).manual_seed(3)
    for B, Hq, Hkv, m, P, D, dt in [(1, 4, 2, 1, 0, 64, torch.float32), (3, 6, 2, 9, 130, 40, torch.float32),
                                    (2, 8, 1, 80, 1000, 128, torch.float16), (2, 4, 4, 17, 300, 80, torch.bfloat16)]:
        q = torch.randn(B, Hq, m, D, device=DEV, generator=g).to(dt)
        k, v = (torch.randn(B, Hkv, P + m, D, device=DEV, generator=g).to(dt) for _ in range(2))
        slot_ok = torch.rand(B, P, device=DEV, generator=g) > 0.2  # holes
        parents = [int(torch.randint(-1, i, (1,), generator=g, device=DEV)) for i in range(m)]  # parents[i] < i
        anc = torch.eye(m, dtype=torch.bool, device=DEV)
        for i, p in enumerate(parents):
            if p >= 0:
                anc[i] |= anc[p]
        anc = anc.expand(B, m, m)
        tol = TOL[dt]
        torch.testing.assert_close(tree_attention_triton(q, k, v, slot_ok, anc).float(),
                                   tree_attention_reference(q, k, v, slot_ok, anc).float(), atol=tol, rtol=tol)


def test_verify_greedy_and_rejection_sample_native():
    g = torch.Generator(device=DEV).manual_seed(1)
    for B, gamma, V in [(1, 4, 1000), (5, 8, 4099), (4, 0, 37)]:
        logits = torch.randn(B, gamma + 1, V, device=DEV, generator=g)
        draft = torch.randint(0, V, (B, gamma), device=DEV, generator=g)
        draft[:, : gamma // 2] = logits[:, : gamma // 2].argmax(-1)
        valid = torch.randint(0, gamma + 1, (B,), device=DEV, generator=g)
        for a, b in zip(verify_greedy_triton(draft, logits, valid),
                        verify_greedy_reference(draft, logits, valid)):
            assert torch.equal(a, b)
        p = torch.softmax(logits, -1)
        q = torch.softmax(torch.randn(B, gamma, V, device=DEV, generator=g), -1)
        u = torch.rand(B, gamma + 1, device=DEV, generator=g)
        for a, b in zip(rejection_sample_triton(draft, p, q, u, valid),
                        rejection_sample_reference(draft, p, q, u, valid)):
            assert torch.equal(a, b)


def test_confidence_select_native():
    g = torch.Generator(device=DEV).manual_seed(2)
    logits = torch.randn(4, 32, 4096, device=DEV, generator=g)
    masked = torch.rand(4, 32, device=DEV, generator=g) < 0.7
    for kw in (dict(k=torch.full((4,), 3, device=DEV)), dict(threshold=0.01)):
        a, b = confidence_select_triton(logits, masked, **kw), confidence_select_reference(logits, masked, **kw)
        assert torch.equal(a[0], b[0]) and torch.equal(a[2], b[2])
        torch.testing.assert_close(a[1], b[1])


def test_kernel_benchmarks_run():
    import importlib

    for name in kernels.MODULES:
        r = importlib.import_module(f"kernels.{name}").bench()
        assert r and all(v > 0 for v in r.values() if isinstance(v, float)), name  # times; "shape" is a dict


@pytest.fixture(scope="module")
def gpu_models():
    return {n: models.load(n, device=DEV) for n in ("tiny", "tiny-draft", "tiny-bdlm")}


def test_greedy_methods_equal_ar_on_the_gpu(gpu_models):
    lm, dr, bd = gpu_models["tiny"], gpu_models["tiny-draft"], gpu_models["tiny-bdlm"]
    prompts = [lm.encode(t) for t in ("And God said, Let there be light: and there was", "In the beginning", "And")]
    want = autoregressive.generate(lm, prompts, max_new_tokens=24, eos_token_id=[]).tokens
    assert speculative.generate(lm, prompts, draft=dr, gamma=4, max_new_tokens=24, eos_token_id=[]).tokens == want
    assert tree.generate(lm, prompts, draft=dr, max_new_tokens=24, eos_token_id=[], widths=(2, 2)).tokens == want
    assert dllm_draft.generate(lm, prompts, dlm=bd, gamma=4, max_new_tokens=24, eos_token_id=[]).tokens == want
    tri = models.load("tiny", device=DEV, attn="triton")
    assert tree.generate(tri, prompts, draft=dr, max_new_tokens=24, eos_token_id=[], widths=(2, 2)).tokens == want


@pytest.fixture(scope="module")
def entry_points():
    return decoding.entry_points(decoding.entry_point_models(DEV))


@pytest.mark.parametrize("name", decoding.ENTRY_POINTS)
def test_every_decoding_method_runs_on_the_gpu(entry_points, name):
    """Every entry point the notebooks call, on CUDA models: the exact greedy ones == AR greedy on
    the GPU, the others return every row's tokens (the table at the end of ``make test-gpu``)."""
    out = entry_points[name]()
    if name in decoding.EXACT_GREEDY:
        assert out.tokens == entry_points["ar"]().tokens
    assert out.tokens and all(len(t) > 0 for t in out.tokens)


def test_block_cache_equals_no_cache_on_the_gpu(gpu_models):
    bd = gpu_models["tiny-bdlm"]
    prompts = [bd.encode(t) for t in ("And God said", "Jesus wept.")]
    a = block_diffusion.generate(bd, prompts, gen_length=16, block_length=8, eos_token_id=[])
    b = block_diffusion.generate(bd, prompts, gen_length=16, block_length=8, cache=False, eos_token_id=[])
    assert a.tokens == b.tokens
