"""refimpl.models.cpu_gemv: the hand-written products give F.linear's results (within float
reordering), give a row the same bits whatever the number of rows, and refuse what they cannot do."""
import pytest
import torch
import torch.nn.functional as F

from refimpl.models import cpu_gemv

pytestmark = pytest.mark.skipif(not cpu_gemv.available(), reason="no AVX2/FMA CPU or no C++ compiler")


@pytest.mark.parametrize("n_out, k_in", [(1536, 576), (13, 37), (96, 1536), (8, 8), (5, 3)])
@pytest.mark.parametrize("rows", [1, 2, 5, 17])
def test_equals_f_linear_with_and_without_add(n_out, k_in, rows):
    g = torch.Generator().manual_seed(n_out + rows)
    w, x = torch.randn(n_out, k_in, generator=g), torch.randn(1, rows, k_in, generator=g)
    add = torch.randn(1, rows, n_out, generator=g)
    torch.testing.assert_close(cpu_gemv.linear(x, w), F.linear(x, w), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(cpu_gemv.linear(x, w, add), add + F.linear(x, w), atol=1e-4, rtol=1e-5)


def test_rows_scored_together_get_the_bits_they_get_alone():
    """Verification's property: a token's logits do not depend on how many tokens share the call
    (every blocking path of the kernel: 1-3 rows over 4 panels, more rows over 2 in
    tiles of 3-6, leftover panels one at a time, a last panel padded past N, odd K)."""
    g = torch.Generator().manual_seed(1)
    for n_out, k_in in ((1539, 580), (96, 1536), (70, 1030)):
        w, x = torch.randn(n_out, k_in, generator=g), torch.randn(40, k_in, generator=g)
        add = torch.randn(40, n_out, generator=g)
        alone = torch.cat([cpu_gemv.linear(x[i:i + 1], w, add[i:i + 1]) for i in range(40)])
        for k in [*range(2, 18), 40]:
            assert torch.equal(cpu_gemv.linear(x[:k], w, add[:k]), alone[:k]), k


def test_negative_controls_a_transposed_weight_or_a_dropped_add_is_caught():
    g = torch.Generator().manual_seed(2)
    w, x, add = torch.randn(64, 64, generator=g), torch.randn(3, 64, generator=g), torch.randn(3, 64, generator=g)
    want = add + F.linear(x, w)
    assert not torch.allclose(cpu_gemv.linear(x, w.t().contiguous(), add), want, atol=1e-2)
    assert not torch.allclose(cpu_gemv.linear(x, w), want, atol=1e-2)


def test_bad_inputs_raise_value_errors_naming_them():
    w, x = torch.randn(16, 8), torch.randn(2, 8)
    with pytest.raises(ValueError, match="x must be a CPU float32"):
        cpu_gemv.linear(x.double(), w)
    with pytest.raises(ValueError, match="weight"):
        cpu_gemv.linear(torch.randn(2, 9), w)
    with pytest.raises(ValueError, match="weight"):
        cpu_gemv.linear(torch.randn(2, 16), w.t())  # not contiguous
    with pytest.raises(ValueError, match="add must have"):
        cpu_gemv.linear(x, w, torch.randn(2, 15))


def test_the_off_switch(monkeypatch):
    monkeypatch.setenv("REFIMPL_GEMV", "0")
    assert not cpu_gemv.available()


def test_shares_of_the_rows_give_the_bits_one_thread_gives():
    """Rows split over 2, 3 or 4 threads: every output is still computed by one thread, in one order."""
    g = torch.Generator().manual_seed(3)
    w, x, add = torch.randn(1000, 96, generator=g), torch.randn(5, 96, generator=g), torch.randn(5, 1000, generator=g)
    one = cpu_gemv.linear(x, w, add, threads=1)
    for t in (2, 3, 2, 4):
        assert torch.equal(cpu_gemv.linear(x, w, add, threads=t), one)


def test_pack_is_the_documented_panel_layout_and_gives_the_same_bits():
    g = torch.Generator().manual_seed(4)
    w, x = torch.randn(37, 20, generator=g), torch.randn(3, 20, generator=g)
    p = cpu_gemv.pack(w)
    P = cpu_gemv.PANEL
    assert p.shape == (37, 20) and p.data.shape == (-(-37 // P), 20, P)
    for n in (0, P - 1, P, 36):
        assert torch.equal(p.data[n // P, :, n % P], w[n])  # panel n // P, lane n % P, every k
    assert not p.data[-1, :, 37 % P:].any()  # rows 37 .. : padding
    assert torch.equal(cpu_gemv.linear(x, p), cpu_gemv.linear(x, w))
    wrong = cpu_gemv.pack(w)
    wrong.data = w[:32].reshape(32 // P, P, 20).contiguous()  # negative control: row-major, not k-major
    wrong.shape = (32, 20)
    assert not torch.allclose(cpu_gemv.linear(x, wrong), F.linear(x, w[:32]), atol=1e-2)
    with pytest.raises(ValueError, match="weight"):
        cpu_gemv.pack(torch.randn(4))
    assert torch.equal(cpu_gemv.linear(x, cpu_gemv.pack(w.t().contiguous().t())), cpu_gemv.linear(x, w))  # strided
    assert cpu_gemv.linear(x[:, :0].contiguous(), cpu_gemv.pack(w[:, :0])).abs().sum() == 0  # K = 0: zeros


def test_layer_step_packs_plain_matrices_and_gets_the_packed_bits():
    """LayerStep.run takes pack()-ed matrices; plain (N, K) tensors are packed at the call, not read
    in the wrong layout (which would give wrong numbers silently)."""
    g = torch.Generator().manual_seed(5)
    B, Q, hidden, H, Hkv, D, inter, cap = 1, 3, 16, 2, 1, 8, 24, 8
    mats = [torch.randn(n, k, generator=g) for n, k in (((H + 2 * Hkv) * D, hidden), (hidden, H * D),
                                                        (2 * inter, hidden), (hidden, inter))]
    norms = [torch.rand(hidden, generator=g) + 0.5 for _ in range(2)]
    cos2, sin2 = torch.rand(B, Q, D, generator=g), torch.rand(B, Q, D, generator=g)
    x = torch.randn(B, Q, hidden, generator=g)
    outs = []
    for prep in (cpu_gemv.pack, lambda m: m):
        step = cpu_gemv.LayerStep(B, Q, 0, hidden, H, Hkv, D, inter, 1e-6, D ** -0.5, cos2, sin2)
        caches = [(torch.zeros(B, Hkv, cap, D), torch.zeros(B, Hkv, cap, D))]
        w = (norms[0], prep(mats[0]), prep(mats[1]), norms[1], prep(mats[2]), prep(mats[3]))
        outs.append(step.run(x, [w], caches))
    assert torch.equal(outs[0], outs[1]) and outs[0].abs().sum() > 0


def test_fp16_panels_give_the_fp32_panels_bits_for_fp16_weights():
    """A weight stored in fp16 and loaded as fp32 (the zoo's drafts) packs into fp16 panels: half the
    bytes, and the kernel widens each weight exactly, so every path gives the fp32 panels' bits."""
    g = torch.Generator().manual_seed(6)
    for n_out, k_in in ((1539, 580), (96, 1536), (13, 37)):
        w = torch.randn(n_out, k_in, generator=g).half().float()
        assert cpu_gemv.fits_half(w)
        half, full = cpu_gemv.pack(w, half=True), cpu_gemv.pack(w)
        assert half.half and half.data.dtype == torch.float16 and half.data.nbytes * 2 == full.data.nbytes
        for rows in (1, 2, 3, 5, 17):
            x, add = torch.randn(rows, k_in, generator=g), torch.randn(rows, n_out, generator=g)
            assert torch.equal(cpu_gemv.linear(x, half, add), cpu_gemv.linear(x, full, add)), (n_out, rows)
            torch.testing.assert_close(cpu_gemv.linear(x, half), F.linear(x, w), atol=1e-4, rtol=1e-5)


def test_fp16_panels_are_refused_for_weights_they_would_round():
    g = torch.Generator().manual_seed(7)
    w, x = torch.randn(64, 48, generator=g), torch.randn(2, 48, generator=g)
    assert not cpu_gemv.fits_half(w)
    with pytest.raises(ValueError, match="weight has values that are not fp16"):
        cpu_gemv.pack(w, half=True)
    rounded = cpu_gemv.Packed(w, half=True)  # negative control: forced, it rounds -> other numbers
    assert not torch.equal(cpu_gemv.linear(x, rounded), cpu_gemv.linear(x, w))
    copy = cpu_gemv.PackedCopy(half=True)  # chooses: fp32 panels for this weight, fp16 once it fits
    assert not copy.of(w).half and torch.equal(cpu_gemv.linear(x, copy.of(w)), cpu_gemv.linear(x, w))
    w.copy_(w.half().float())
    assert copy.of(w).half and torch.equal(cpu_gemv.linear(x, copy.of(w)), cpu_gemv.linear(x, w))


def test_layer_step_on_fp16_panels_gives_the_fp32_panels_bits_and_refuses_a_mix():
    """A layer whose four matrices are fp16 numbers runs on fp16 panels (the lean EAGLE drafts' layer)
    with the fp32 panels' bits, the embedded (EAGLE-3) first stage included; a layer mixing the two
    kinds is refused, naming the argument."""
    g = torch.Generator().manual_seed(8)
    hidden, H, Hkv, D, inter, B, Q = 48, 2, 1, 8, 24, 2, 3
    mats = [(torch.randn(n, k, generator=g) * 0.2).half().float() for n, k in ((32, 2 * hidden), (48, 16), (48, 48),
                                                                              (48, 24))]
    cos2, sin2 = torch.rand(B, Q, D, generator=g), torch.rand(B, Q, D, generator=g)
    x, e = torch.randn(B, Q, hidden, generator=g), torch.randn(B, Q, hidden, generator=g)
    outs = []
    for half in (True, False):
        step = cpu_gemv.LayerStep(B, Q, 0, hidden, H, Hkv, D, inter, 1e-6, 0.35, cos2, sin2, embedded=True)
        w = (torch.ones(hidden), *(cpu_gemv.pack(m, half=half) for m in mats[:2]), torch.ones(hidden),
             *(cpu_gemv.pack(m, half=half) for m in mats[2:]))
        caches = [(torch.zeros(B, Hkv, 4, D), torch.zeros(B, Hkv, 4, D))]
        outs.append(step.run(x, [w], caches, e=e, norm_e=torch.ones(hidden)))
    assert torch.equal(outs[0], outs[1]) and outs[0].abs().sum() > 0
    mixed = (w[0], cpu_gemv.pack(mats[0], half=True), *w[2:])
    with pytest.raises(ValueError, match="must all be fp32 panels, all fp16 or all int8"):
        step.run(x, [mixed], caches, e=e, norm_e=torch.ones(hidden))
    with pytest.raises(ValueError, match="e and norm_e"):
        step.run(x, [w], caches)


def test_int8_panels_are_the_quantized_weights_products():
    """int8 panels (a draft's, ``lean(draft, int8=True)``): each row quantized symmetric to [-127, 127]
    with its own scale; the products are F.linear's with the dequantized weight ``scale * q`` (within
    float rounding), batch-invariant like every path, and not the unquantized weight's (the control)."""
    g = torch.Generator().manual_seed(9)
    for n_out, k_in in ((1539, 580), (96, 1536), (13, 37)):
        w = torch.randn(n_out, k_in, generator=g)
        w[3] = 0  # a zero row: scale 1, all zeros
        q, scale = cpu_gemv.quantize(w)
        assert q.dtype == torch.int8 and int(q.abs().max()) == 127 and scale[3] == 1 and not q[3].any()
        assert torch.equal(q.abs().amax(1)[:3], torch.full((3,), 127, dtype=torch.int8))
        deq = scale[:, None] * q.float()
        assert (deq - w).abs().max() <= scale.max() / 2 + 1e-6  # rounding: half a step at most
        packed = cpu_gemv.pack(w, int8=True)
        assert packed.int8 and packed.kind == 2 and packed.data.dtype == torch.int8
        x, add = torch.randn(17, k_in, generator=g), torch.randn(17, n_out, generator=g)
        whole = cpu_gemv.linear(x, packed, add)
        torch.testing.assert_close(whole, F.linear(x, deq) + add, atol=1e-4, rtol=1e-5)
        for rows in (1, 2, 3, 5):
            assert torch.equal(cpu_gemv.linear(x[:rows], packed, add[:rows]), whole[:rows]), (n_out, rows)
        assert not torch.allclose(cpu_gemv.linear(x, packed), F.linear(x, w), atol=1e-3)
    with pytest.raises(ValueError, match="half and int8"):
        cpu_gemv.pack(w, half=True, int8=True)
    copy = cpu_gemv.PackedCopy(half=True, int8=True)
    assert copy.of(w).int8


def test_layer_step_on_int8_panels_is_the_dequantized_layer():
    """A layer of int8 panels (embedded first stage included) gives the fp32 layer of its dequantized
    matrices, within float rounding."""
    g = torch.Generator().manual_seed(10)
    hidden, H, Hkv, D, inter, B, Q = 48, 2, 1, 8, 24, 2, 3
    mats = [torch.randn(n, k, generator=g) * 0.2 for n, k in ((32, 2 * hidden), (48, 16), (48, 48), (48, 24))]
    deq = [s[:, None] * q.float() for q, s in map(cpu_gemv.quantize, mats)]
    cos2, sin2 = torch.rand(B, Q, D, generator=g), torch.rand(B, Q, D, generator=g)
    x, e = torch.randn(B, Q, hidden, generator=g), torch.randn(B, Q, hidden, generator=g)
    outs = []
    for prep in (lambda m, d: cpu_gemv.pack(m, int8=True), lambda m, d: cpu_gemv.pack(d)):
        step = cpu_gemv.LayerStep(B, Q, 0, hidden, H, Hkv, D, inter, 1e-6, 0.35, cos2, sin2, embedded=True)
        p = [prep(m, d) for m, d in zip(mats, deq)]
        caches = [(torch.zeros(B, Hkv, 4, D), torch.zeros(B, Hkv, 4, D))]
        outs.append(step.run(x, [(torch.ones(hidden), p[0], p[1], torch.ones(hidden), p[2], p[3])], caches,
                             e=e, norm_e=torch.ones(hidden)))
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)
    assert outs[0].abs().sum() > 0


def test_rmsnorm_is_torchs_within_rounding_and_gives_each_row_its_own_bits():
    """The EAGLE drafts' final norm in one call: torch.rms_norm's values (~1e-7), each row's bits
    whatever rows come with it, and a weight of the wrong size refused by name."""
    g = torch.Generator().manual_seed(3)
    for n in (576, 37, 8):
        x, w = torch.randn(2, 5, n, generator=g), torch.randn(n, generator=g)
        got = cpu_gemv.rmsnorm(x, w, 1e-5)
        torch.testing.assert_close(got, torch.rms_norm(x, (n,), w, 1e-5), atol=1e-5, rtol=1e-5)
        alone = torch.cat([cpu_gemv.rmsnorm(x[:, i:i + 1], w, 1e-5) for i in range(5)], 1)
        assert torch.equal(got, alone)
        assert not torch.allclose(cpu_gemv.rmsnorm(x, w, 1.0), got, atol=1e-3)  # eps is used
    with pytest.raises(ValueError, match="weight"):
        cpu_gemv.rmsnorm(torch.randn(3, 8), torch.randn(7), 1e-5)
    with pytest.raises(ValueError, match="weight"):
        cpu_gemv.rmsnorm(torch.randn(3, 8), torch.randn(8).half(), 1e-5)
    with pytest.raises(ValueError, match="x must"):
        cpu_gemv.rmsnorm(torch.randn(3, 8).double(), torch.randn(8), 1e-5)


def test_build_flags_add_avx512_where_the_cpu_has_it_and_the_switch_allows(monkeypatch):
    monkeypatch.delenv("REFIMPL_AVX512", raising=False)
    monkeypatch.setattr(cpu_gemv, "cpu_flags", lambda: frozenset({"avx2", "fma", "f16c", "avx512f"}))
    assert cpu_gemv.build_flags()[-1] == "-mavx512f"
    monkeypatch.setenv("REFIMPL_AVX512", "0")
    assert cpu_gemv.build_flags() == tuple(cpu_gemv.FLAGS)
    monkeypatch.delenv("REFIMPL_AVX512")
    monkeypatch.setattr(cpu_gemv, "cpu_flags", lambda: frozenset({"avx2", "fma", "f16c"}))
    assert cpu_gemv.build_flags() == tuple(cpu_gemv.FLAGS)


@pytest.mark.skipif("avx512f" not in cpu_gemv.cpu_flags(), reason="the CPU has no AVX-512F: one build only")
def test_the_avx512_build_gives_the_avx2_builds_bits(monkeypatch):
    """tile16 (two panels in one 16-lane vector, up to 16 rows a tile) runs each output's FMA chain as
    tile<RB, 2> does: every panel kind, row count (tiles of 1-16 rows, several tiles, leftovers) and
    the whole-layer kernel give the AVX2 build's bits."""
    wide, plain = cpu_gemv.build(cpu_gemv.FLAGS_AVX512), cpu_gemv.build(tuple(cpu_gemv.FLAGS))
    assert wide is not None and plain is not None and wide is not plain
    g = torch.Generator().manual_seed(9)
    runs = []
    for lib in (plain, wide):
        monkeypatch.setattr(cpu_gemv, "library", lambda lib=lib: lib)
        out = []
        for n_out, k_in in ((1539, 580), (61, 37)):
            w = torch.randn(n_out, k_in, generator=torch.Generator().manual_seed(n_out))
            x = torch.randn(40, k_in, generator=torch.Generator().manual_seed(k_in))
            add = torch.randn(40, n_out, generator=torch.Generator().manual_seed(1))
            for p in (cpu_gemv.pack(w), cpu_gemv.pack(w.half().float(), half=True), cpu_gemv.pack(w, int8=True)):
                out += [cpu_gemv.run(x[:r], p, add[:r]) for r in [*range(1, 18), 33, 40]]
        B, Q, hidden, H, Hkv, D, inter = 1, 20, 64, 4, 2, 16, 96
        gl = torch.Generator().manual_seed(3)
        mats = [cpu_gemv.pack(torch.randn(n, k, generator=gl)) for n, k in (((H + 2 * Hkv) * D, hidden),
                                                                          (hidden, H * D), (2 * inter, hidden),
                                                                          (hidden, inter))]
        norms = [torch.rand(hidden, generator=gl) + 0.5 for _ in range(2)]
        cos2, sin2 = torch.rand(B, Q, D, generator=gl), torch.rand(B, Q, D, generator=gl)
        step = cpu_gemv.LayerStep(B, Q, 0, hidden, H, Hkv, D, inter, 1e-6, D ** -0.5, cos2, sin2)
        caches = [(torch.zeros(B, Hkv, Q, D), torch.zeros(B, Hkv, Q, D))]
        out.append(step.run(torch.randn(B, Q, hidden, generator=gl), [(norms[0], *mats[:2], norms[1], *mats[2:])],
                            caches))
        runs.append(out)
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    assert not torch.equal(runs[0][0], runs[0][38])  # fp32 against int8 panels, 1 row: equal() tells them apart
