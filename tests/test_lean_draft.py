"""refimpl.models.lean_draft: EAGLE drafts with their products on the cpu_gemv kernel."""
import copy

import pytest
import torch

from refimpl import eagle, eagle3
from refimpl.models import cpu_gemv, drafters, lean_draft

pytestmark = pytest.mark.usefixtures("torch_kernels")


def drafts(tiny):
    torch.manual_seed(0)
    return [eagle.new_draft(tiny).eval(), eagle3.new_draft(tiny).eval()]


def test_lean_draft_gives_the_plain_drafts_outputs(tiny):
    for plain in drafts(tiny):
        keys = sorted(plain.state_dict())
        fast = lean_draft.lean(copy.deepcopy(plain))
        assert lean_draft.lean(fast) is fast  # twice: a no-op
        assert isinstance(fast, type(plain)) and type(fast) is not type(plain)
        assert sorted(fast.state_dict()) == keys  # saved and exported as before
        assert not any(type(m) is torch.nn.Linear for m in fast.modules())
        B, T, P, H = 2, 3, 5, plain.hidden_size
        g = torch.Generator(device="cpu").manual_seed(1)
        tok = torch.randint(0, plain.embed.shape[0], (B, P + T), generator=g, device="cpu")
        feat = torch.randn(B, P + T, len(plain.taps or (0,)) * H, generator=g, device="cpu")
        with torch.no_grad():
            f = plain.fuse(feat)
            assert torch.allclose(fast.fuse(feat), f, atol=1e-5)
            pos = torch.arange(P + T, device="cpu")[None].expand(B, -1)
            allow = torch.ones(B, P + T, P + T, dtype=torch.bool, device="cpu").tril()
            want, (k, v) = plain.step(tok, f, pos, allow)
            got, (k2, v2) = fast.step(tok, f, pos, allow)
            assert torch.allclose(got, want, atol=1e-4) and torch.allclose(k2, k, atol=1e-4)
            assert torch.allclose(fast.logits(got), plain.logits(want), atol=1e-4)
            # a cached step over the last T inputs, as a tree level runs it
            want2 = plain.step(tok[:, P:], f[:, P:], pos[:, P:], allow[:, P:], (k[:, :, :P], v[:, :, :P]))[0]
            got2 = fast.step(tok[:, P:], f[:, P:], pos[:, P:], allow[:, P:], (k2[:, :, :P], v2[:, :, :P]))[0]
            assert torch.allclose(got2, want2, atol=1e-4) and torch.allclose(got2, got[:, P:], atol=1e-4)


def test_the_packed_copies_follow_the_weights(tiny):
    plain = drafts(tiny)[1]
    fast = lean_draft.lean(copy.deepcopy(plain))
    o = torch.randn(3, plain.hidden_size, device="cpu")
    with torch.no_grad():
        before = fast.logits(o)
        for p, q in [(plain.lm_head, fast.lm_head), (plain.qkv.weight, fast.qkv.weight)]:
            p.mul_(-0.5)
            q.mul_(-0.5)  # edited in place: the packed copy is rebuilt
        assert not torch.allclose(fast.logits(o), before, atol=1e-3)
        assert torch.allclose(fast.logits(o), plain.logits(o), atol=1e-4)
        x = torch.randn(2, 2 * plain.hidden_size, device="cpu")
        assert torch.allclose(fast.qkv(x), plain.qkv(x), atol=1e-4)


def test_training_falls_back_to_plain_products(tiny):
    fast = lean_draft.lean(drafts(tiny)[1].train())
    o = torch.randn(2, fast.hidden_size, device="cpu")
    loss = fast.logits(fast.fc(torch.randn(2, 3 * fast.hidden_size, device="cpu"))[:, : o.shape[1]]).sum()
    loss.backward()  # the kernel has no backward: with autograd on, F.linear runs
    assert fast.lm_head.grad is not None and fast.fc.weight.grad is not None


def test_lean_drafts_decode_exactly(tiny, spec_prompts, spec_ar_free):
    e1, e3 = (lean_draft.lean(d) for d in drafts(tiny))
    assert eagle.generate(tiny, spec_prompts, draft=e1, max_new_tokens=20, eos_token_id=[]).tokens == spec_ar_free
    for kw in ({}, {"copy": 6.0}):
        g = eagle3.generate(tiny, spec_prompts, draft=e3, max_new_tokens=20, eos_token_id=[], **kw)
        assert g.tokens == spec_ar_free


def test_the_zoo_draft_keeps_its_trees(tiny, spec_prompts):
    """On the trained draft the lean products give the same trees (no near-tie on these prompts)."""
    plain = drafters.load(tiny, "eagle3")
    fast = lean_draft.lean(copy.deepcopy(plain))
    a = eagle3.generate(tiny, spec_prompts, draft=plain, max_new_tokens=20, eos_token_id=[])
    b = eagle3.generate(tiny, spec_prompts, draft=fast, max_new_tokens=20, eos_token_id=[])
    assert a.tokens == b.tokens and a.stats.accepted == b.stats.accepted


def test_bad_arguments():
    with pytest.raises(ValueError, match="draft"):
        lean_draft.lean(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="linear"):
        lean_draft.GemvLinear(torch.nn.Conv1d(1, 1, 1))


@pytest.mark.skipif(not cpu_gemv.available(), reason="the cpu_gemv kernel does not build here")
def test_the_kernel_runs_the_products(tiny, monkeypatch):
    fast = lean_draft.lean(drafts(tiny)[1])
    calls = []
    real = cpu_gemv.run
    monkeypatch.setattr(cpu_gemv, "run", lambda *a, **k: calls.append(a[1].shape) or real(*a, **k))
    with torch.no_grad():
        fast.logits(fast.fc(torch.randn(1, 3 * fast.hidden_size, device="cpu")))
    assert calls == [tuple(fast.fc.weight.shape), tuple(fast.lm_head.shape)]


def test_a_draft_stored_in_fp16_runs_on_fp16_panels_with_the_same_bits(tiny):
    """The zoo's drafts are saved in fp16 (eagle3.save_draft): their fp32 weights are fp16 numbers, so
    the lean draft packs them into fp16 panels (half the bytes) and its outputs keep the fp32 panels'
    bits; a weight trained past fp16 keeps fp32 panels."""
    plain = drafts(tiny)[1]
    with torch.no_grad():
        for p in plain.parameters():
            p.copy_(p.half().float())
    halves = lean_draft.lean(copy.deepcopy(plain))
    fulls = lean_draft.lean(copy.deepcopy(plain))
    for m in fulls.modules():
        if isinstance(m, lean_draft.GemvLinear):
            m.copy = cpu_gemv.PackedCopy()
    fulls.head_copy = cpu_gemv.PackedCopy()
    o = torch.randn(3, plain.hidden_size, device="cpu")
    x = torch.randn(2, 3 * plain.hidden_size, device="cpu")
    with torch.no_grad():
        assert torch.equal(halves.logits(o), fulls.logits(o)) and torch.equal(halves.fc(x), fulls.fc(x))
        assert halves.head_copy.of(halves.lm_head).half and halves.fc.copy.of(halves.fc.weight).half
        assert not fulls.head_copy.of(fulls.lm_head).half
        halves.lm_head.add_(1e-4)  # no longer fp16 numbers: back to fp32 panels, still right
        assert not halves.head_copy.of(halves.lm_head).half
        assert torch.allclose(halves.logits(o), plain.logits(o) + 1e-4 * plain.norm(o).sum(-1, keepdim=True),
                              atol=1e-4)


@pytest.mark.skipif(not cpu_gemv.available(), reason="the cpu_gemv kernel does not build here")
def test_the_draft_layer_runs_in_one_kernel_call(tiny, monkeypatch):
    """The lean drafts' ``step`` is one ``LayerStep`` call (EAGLE-3's embedded first stage) and gives
    the plain step's outputs and keys under a ragged mask with a cached past, its norms made distinct
    (the negative control: the embedding's and the feature's norms swapped is caught)."""
    g = torch.Generator(device="cpu").manual_seed(2)
    real, calls = cpu_gemv.LayerStep.run, []
    monkeypatch.setattr(cpu_gemv.LayerStep, "run", lambda self, *a, **k: calls.append(self.embedded) or
                        real(self, *a, **k))
    for plain in drafts(tiny):
        with torch.no_grad():
            for m in plain.modules():
                if isinstance(m, torch.nn.RMSNorm):
                    m.weight.copy_(1 + torch.rand(m.weight.shape, generator=g, device="cpu"))
        fast = lean_draft.lean(copy.deepcopy(plain))
        calls.clear()
        B, T, P, H = 2, 3, 4, plain.hidden_size
        kv = getattr(plain, "num_kv_heads", plain.num_heads)
        d = getattr(plain, "head_dim", H // plain.num_heads)
        tok = torch.randint(0, plain.embed.shape[0], (B, T), generator=g, device="cpu")
        f = torch.randn(B, T, H, generator=g, device="cpu")
        pos = torch.randint(0, 60, (B, T), generator=g, device="cpu")
        past = tuple(torch.randn(B, kv, P, d, generator=g, device="cpu") for _ in range(2))
        allow = torch.rand(B, T, P + T, generator=g, device="cpu") > 0.4
        allow[:, :, P:] = torch.eye(T, dtype=torch.bool, device="cpu")  # gaps in the past; each sees itself
        with torch.no_grad():
            want, (k, v) = plain.step(tok, f, pos, allow, past)
            got, (k2, v2) = fast.step(tok, f, pos, allow, past)
            assert calls == [isinstance(plain, eagle3.Eagle3Draft)]
            assert torch.allclose(got, want, atol=1e-4) and torch.allclose(k2, k, atol=1e-5)
            assert torch.allclose(v2, v, atol=1e-5)
            if isinstance(plain, eagle3.Eagle3Draft):
                fast.norm_in.weight, fast.norm_hid.weight = fast.norm_hid.weight, fast.norm_in.weight
                assert not torch.allclose(fast.step(tok, f, pos, allow, past)[0], want, atol=1e-3)


def test_rope_rows_are_the_tables_at_those_positions():
    """The kept table gives rope_tables' numbers bit for bit, before and after it grows; a row off by
    one position does not."""
    from refimpl.primitives import rope_tables

    lean_draft.TABLES.clear()
    for hi in (10, 300, 5000):  # the table grows past 256, then past 512
        pos = torch.randint(0, hi, (2, 5), generator=torch.Generator().manual_seed(hi), device="cpu")
        cos2, sin2 = lean_draft.rope_rows(pos, 16, 10000.0)
        want = rope_tables(pos, 16, 10000.0)
        assert torch.equal(cos2, want[0][:, 0]) and torch.equal(sin2, want[1][:, 0])
        assert not torch.equal(lean_draft.rope_rows(pos + 1, 16, 10000.0)[0], want[0][:, 0])


def test_an_int8_draft_is_its_dequantized_twin_and_decodes_exactly(tiny, spec_prompts, spec_ar_free):
    """``lean(draft, int8=True)``: every product on int8 panels, so the draft is the plain draft with
    its matrices dequantized (not the original: the control), and decoding with it is still AR greedy."""
    for plain in drafts(tiny):
        fast = lean_draft.lean(copy.deepcopy(plain), int8=True)
        assert fast.head_copy.of(fast.lm_head).int8 and fast.qkv.copy.of(fast.qkv.weight).int8
        twin = copy.deepcopy(plain)
        with torch.no_grad():
            for m in twin.modules():
                if isinstance(m, torch.nn.Linear):
                    q, s = cpu_gemv.quantize(m.weight)
                    m.weight.copy_(s[:, None] * q.float())
            q, s = cpu_gemv.quantize(twin.lm_head)
            twin.lm_head.copy_(s[:, None] * q.float())
        B, T, H = 2, 4, plain.hidden_size
        g = torch.Generator(device="cpu").manual_seed(3)
        tok = torch.randint(0, plain.embed.shape[0], (B, T), generator=g, device="cpu")
        f = plain.fuse(torch.randn(B, T, len(plain.taps or (0,)) * H, generator=g, device="cpu"))
        pos = torch.arange(T, device="cpu")[None].expand(B, -1)
        allow = torch.ones(B, T, T, dtype=torch.bool, device="cpu").tril()
        with torch.no_grad():
            got = fast.logits(fast.step(tok, f, pos, allow)[0])
            assert torch.allclose(got, twin.logits(twin.step(tok, f, pos, allow)[0]), atol=1e-4)
            assert not torch.allclose(got, plain.logits(plain.step(tok, f, pos, allow)[0]), atol=1e-4)
    e1, e3 = (lean_draft.lean(d, int8=True) for d in drafts(tiny))
    assert eagle.generate(tiny, spec_prompts, draft=e1, max_new_tokens=20, eos_token_id=[]).tokens == spec_ar_free
    g3 = eagle3.generate(tiny, spec_prompts, draft=e3, max_new_tokens=20, eos_token_id=[], copy=6.0)
    assert g3.tokens == spec_ar_free


def test_a_lean_dflash_drafter_drafts_what_the_plain_one_drafts(tiny, spec_prompts, spec_ar_free):
    """DFlash's products on the kernel (int8 panels, as the front door runs it beside the lean target): its
    block outputs within the panels' rounding of the plain drafter's, its greedy decoding still AR's tokens, and
    the zoo drafter accepting about as many drafts (the rounding may flip a near-tie)."""
    from refimpl import dflash

    torch.manual_seed(0)
    plain = dflash.new_draft(tiny, num_layers=1, block=4).eval()
    fast = lean_draft.lean(copy.deepcopy(plain), int8=True)
    assert type(fast) is type(plain) and not any(type(m) is torch.nn.Linear for m in fast.modules())
    assert sorted(fast.state_dict()) == sorted(plain.state_dict())
    g = torch.Generator(device="cpu").manual_seed(1)
    feats = torch.randn(1, 6, len(plain.taps) * plain.hidden_size, generator=g, device="cpu")
    tok = torch.full((1, 4), plain.mask_id, dtype=torch.long, device="cpu")
    pos = torch.arange(10, device="cpu")[None]
    allow = torch.ones(1, 4, 10, dtype=torch.bool, device="cpu")
    with torch.no_grad():
        want, _ = plain.step(tok, plain.context(feats), pos, allow)
        got, _ = fast.step(tok, fast.context(feats), pos, allow)
    assert torch.allclose(got, want, atol=0.05, rtol=0.05) and not torch.equal(got, want)  # int8: rounded, close
    assert dflash.generate(tiny, spec_prompts, draft=fast, max_new_tokens=20, eos_token_id=[]).tokens == spec_ar_free
    zoo = drafters.load(tiny, "dflash")
    a = dflash.generate(tiny, spec_prompts, draft=zoo, max_new_tokens=20, eos_token_id=[])
    b = dflash.generate(tiny, spec_prompts, draft=lean_draft.lean(copy.deepcopy(zoo), int8=True), max_new_tokens=20,
                        eos_token_id=[])
    total = lambda g: sum(map(sum, g.stats.accepted))  # noqa: E731
    assert a.tokens == b.tokens and total(b) >= 0.9 * total(a), (total(a), total(b))  # int8 may flip a near-tie
