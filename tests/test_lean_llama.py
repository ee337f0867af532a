"""refimpl.models.lean_llama: the lean forward gives the Hugging Face Llama's logits (prefill, steps, crop,
padding masks, token-tree masks, batch selection), and a lean trimmed draft leaves speculative
greedy decoding equal to AR greedy."""
import pytest
import torch

from refimpl import autoregressive, drafts, models, speculative
from refimpl.models import cpu_gemv, lean_llama


def small_llama(**over):
    from transformers import LlamaConfig, LlamaForCausalLM

    kw = dict(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False)
    kw.update(over)
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**kw)).eval()


PATHS = ["stage by stage", pytest.param("whole-layer kernel", marks=pytest.mark.skipif(
    not cpu_gemv.available(), reason="no AVX2/FMA CPU or no C++ compiler"))]


def llama_for(path):
    """small_llama() as the lean forward runs it: plain modules stage by stage, or prepacked, whose
    steps run one kernel call per layer (``cpu_gemv.LayerStep``) where cpu_gemv builds."""
    from refimpl.models import cpu_linear

    m = small_llama()
    if path == "whole-layer kernel":
        cpu_linear.prepack_linears(m)
        assert lean_llama.projections(m)[0].gemv
    return m


def hf_step(model, ids, cache, **kw):
    with torch.no_grad():
        out = model(input_ids=ids, past_key_values=cache, use_cache=True, **kw)
    return out.logits, out.past_key_values


@pytest.mark.parametrize("path", PATHS)
def test_prefill_steps_and_crop_equal_hugging_face(path):
    from transformers import DynamicCache

    m = llama_for(path)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 97, (2, 90), generator=g)
    lean, ref = lean_llama.KVCache(2), DynamicCache(config=m.config)
    chunks = [(0, 7), (7, 10), (10, 11)] + [(t, t + 1) for t in range(11, 80)]  # grows past 64 slots
    for a, b in chunks:
        want, ref = hf_step(m, ids[:, a:b], ref)
        got, hidden = lean_llama.forward(m, ids[:, a:b], lean)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert lean.get_seq_length() == ref.get_seq_length() == b
    assert hidden.shape == (2, 1, 48)
    lean.crop(-5)
    ref.crop(-5)
    lean.crop(-5)
    ref.crop(-5)
    with pytest.raises(ValueError, match="n="):
        lean.crop(3)
    pos = torch.tensor([[70, 71, 72]] * 2)
    want, _ = hf_step(m, ids[:, 80:83], ref, position_ids=pos)
    got, _ = lean_llama.forward(m, ids[:, 80:83], lean, position_ids=pos)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    last, _ = lean_llama.forward(m, ids[:, 83:86], lean, logits_to_keep=1)
    assert last.shape == (2, 1, 97)


@pytest.mark.parametrize("path", PATHS)
def test_padding_mask_and_batch_select(path):
    from transformers import DynamicCache

    m = llama_for(path)
    ids = torch.randint(0, 97, (3, 12), generator=torch.Generator().manual_seed(2))
    am = torch.ones(3, 12, dtype=torch.long)
    am[1, :4] = 0  # a left-padded row
    am[2, :1] = 0
    pos = (am.cumsum(-1) - 1).clamp(min=0)
    lean, ref = lean_llama.KVCache(2), DynamicCache(config=m.config)
    got, _ = lean_llama.forward(m, ids, lean, position_ids=pos, attention_mask=am)
    want, ref = hf_step(m, ids, ref, position_ids=pos, attention_mask=am)
    real = am.bool()
    assert torch.isfinite(got).all()  # padded queries see themselves: finite, ignored
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-5)
    rows = torch.tensor([2, 1])
    lean.batch_select_indices(rows)
    ref.batch_select_indices(rows)
    nxt = torch.tensor([[5, 6], [7, 8]])
    am2 = torch.cat([am[rows], torch.ones(2, 2, dtype=torch.long)], 1)
    pos2 = pos[rows, -1:] + torch.tensor([[1, 2]])
    got, _ = lean_llama.forward(m, nxt, lean, position_ids=pos2, attention_mask=am2)
    want, _ = hf_step(m, nxt, ref, position_ids=pos2, attention_mask=am2)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("path", PATHS)
def test_token_tree_mask_equals_hugging_face(path):
    from transformers import DynamicCache

    m = llama_for(path)
    ids = torch.randint(0, 97, (1, 10), generator=torch.Generator().manual_seed(3))
    lean, ref = lean_llama.KVCache(2), DynamicCache(config=m.config)
    lean_llama.forward(m, ids[:, :6], lean)
    _, ref = hf_step(m, ids[:, :6], ref)
    # a tree of 4 nodes after 6 cached tokens: 0 -> {1, 2}, 2 -> 3
    parent = [-1, 0, 0, 2]
    allowed = torch.zeros(4, 10, dtype=torch.bool)
    allowed[:, :6] = True
    for i in range(4):
        j = i
        while j >= 0:
            allowed[i, 6 + j] = True
            j = parent[j]
    mask = torch.zeros(1, 1, 4, 10).masked_fill(~allowed, float("-inf"))
    pos = torch.tensor([[6, 7, 7, 8]])
    got, _ = lean_llama.forward(m, ids[:, 6:10], lean, position_ids=pos, attention_mask=mask)
    want, _ = hf_step(m, ids[:, 6:10], ref, position_ids=pos, attention_mask=mask)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_unsupported_models_are_refused():
    m = small_llama(attention_bias=True)
    assert lean_llama.supports(small_llama()) and not lean_llama.supports(m)
    with pytest.raises(ValueError, match="model"):
        lean_llama.forward(m, torch.zeros(1, 2, dtype=torch.long), lean_llama.KVCache(2))
    with pytest.raises(ValueError, match="lean"):
        lean_llama.LeanTrimmedLM(m, None, kept_ids=torch.arange(97))


@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_lean_trimmed_draft_keeps_speculative_equal_to_ar(tiny, gamma):
    from refimpl import data

    draft = models.load("tiny-draft", device="cpu")
    kept = drafts.frequent_tokens(tiny, data.kjv_chapters()[:40], 600)
    lean, plain = lean_llama.LeanTrimmedLM.of(drafts.trim_vocab(draft, kept)), drafts.trim_vocab(draft, kept)
    assert isinstance(lean.new_cache(), lean_llama.KVCache)
    prompts = [tiny.encode(t) for t in ["And God said", "The LORD is my shepherd; I shall not want.", "And"]]
    ref = [autoregressive.generate(tiny, p, max_new_tokens=20, eos_token_id=[]).tokens[0] for p in prompts]
    got = speculative.generate(tiny, prompts, draft=lean, gamma=gamma, max_new_tokens=20, eos_token_id=[])
    assert got.tokens == ref  # ragged batch of three
    slow = speculative.generate(tiny, prompts, draft=plain, gamma=gamma, max_new_tokens=20, eos_token_id=[])
    assert got.stats.accepted == slow.stats.accepted  # same draft logits, same acceptances


@pytest.mark.parametrize("lean", [False, True])
def test_context_vocab_scores_tokens_of_the_context(tiny, lean):
    """A trimmed head plus the context's tokens: a prompt token outside kept_ids gets its
    embedding-row logit (it is -inf without context_vocab); greedy stays equal to AR."""
    from refimpl import data

    draft = models.load("tiny-draft", device="cpu")
    kept = drafts.frequent_tokens(tiny, data.kjv_chapters()[:40], 300)
    make = lean_llama.LeanTrimmedLM.of if lean else (lambda t: t)
    ctx = make(drafts.trim_vocab(draft, kept, context_vocab=True))
    plain = make(drafts.trim_vocab(draft, kept))
    prompt = tiny.encode("Nebuchadnezzar the king of Babylon came, and Nebuchadnezzar")
    rare = [t for t in prompt if t not in set(kept.tolist())]
    assert rare, "the prompt must hold tokens outside the kept set"
    ids = torch.tensor([prompt])
    got, cache = ctx.forward(ids)
    base, _ = plain.forward(ids)
    assert torch.isfinite(got[0, -1, rare]).all() and torch.isneginf(base[0, -1, rare]).all()
    h = draft.model.model(input_ids=ids).last_hidden_state[0, -1]
    E = draft.model.model.embed_tokens.weight
    torch.testing.assert_close(got[0, -1, rare], h @ E[rare].T, atol=1e-4, rtol=1e-4)
    keep = list(kept.tolist())
    torch.testing.assert_close(got[0, -1, keep], base[0, -1, keep])
    assert set(cache.refimpl_extra_tokens.tolist()) == set(rare)
    unseen = [t for t in range(tiny.vocab_size) if t not in set(keep) | set(prompt)][:5]
    assert torch.isneginf(got[0, -1, unseen]).all()  # tokens never seen stay out
    ref = autoregressive.generate(tiny, prompt, max_new_tokens=16, eos_token_id=[]).tokens[0]
    for gamma in (2, 4):
        assert speculative.generate(tiny, prompt, draft=ctx, gamma=gamma, max_new_tokens=16,
                                    eos_token_id=[]).tokens[0] == ref


def test_context_vocab_needs_an_embedding_head(tiny):
    from refimpl import data

    tr = drafts.trim_vocab(models.load("tiny-draft", device="cpu"), drafts.frequent_tokens(
        tiny, data.kjv_chapters()[:5], 100))
    with torch.no_grad():
        tr.model.lm_head.weight.mul_(2.0)  # no longer the embedding rows
    with pytest.raises(ValueError, match="context_vocab"):
        drafts.TrimmedLM(tr.model, tr.tokenizer, kept_ids=tr.kept_ids, context_vocab=True)


# -- the target's fast path: LeanLM with fused, prepacked projections ------------------------------
def lean_and_hf(model):
    """A LeanLM and a plain LM over the same (prepacked) weights."""
    from refimpl.models import cpu_linear

    cpu_linear.prepack_linears(model)
    return lean_llama.LeanLM(model, None, name="lean"), models.LM(model, None, name="hf")


def steps_of(lm, ids, cuts=(0, 9, 10, 15, 16)):
    """Logits of a prefill then cached steps of 1, 5 and 1 tokens (a verification-sized block)."""
    cache, out = lm.new_cache(), []
    for a, b in zip(cuts, cuts[1:]):
        logits, cache = lm.forward(ids[:, a:b], cache)
        out.append(logits)
    return out


def test_fused_prepacked_forward_matches_hugging_face(monkeypatch):
    """Same weights prepacked, products by oneDNN (``REFIMPL_GEMV=0``): the lean forward (q/k/v and
    gate/up fused, residuals inside the product) gives Hugging Face's logits, prefill and k = 1 / 5
    steps, B = 2, with the same argmax everywhere. Bit for bit on the AVX2 hosts this ran on until
    2026-11; on an AVX-512 host (AMD EPYC, 2026-11-28) the two sum somewhere in another order, ~1e-7
    apart, so the bound is 1e-6."""
    monkeypatch.setenv("REFIMPL_GEMV", "0")
    lean, hf = lean_and_hf(small_llama())
    ids = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(4))
    assert all(lean_llama.projections(lean.model)[i].packed and not lean_llama.projections(lean.model)[i].gemv
               for i in range(2))
    tol = dict(atol=1e-6, rtol=1e-6)  # 0 / 0 held on the AVX2 hosts; an AVX-512 host gives ~1e-7
    for got, want in zip(steps_of(lean, ids), steps_of(hf, ids)):
        torch.testing.assert_close(got, want, **tol)
        assert torch.equal(got.argmax(-1), want.argmax(-1))
    torch.testing.assert_close(lean.logits(ids), hf.logits(ids), **tol)


@pytest.mark.skipif(not cpu_gemv.available(), reason="no AVX2/FMA CPU or no C++ compiler")
def test_gemv_forward_matches_hugging_face_and_scores_a_block_as_its_rows():
    """Products by :mod:`refimpl.models.cpu_gemv` (the default where it builds): Hugging Face's
    logits within 1e-5 (the sums run in another order), and each matrix product gives a row the
    same bits in a block of 5 as alone."""
    lean, hf = lean_and_hf(small_llama())
    ids = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(4))
    proj = lean_llama.projections(lean.model)
    assert all(p.gemv for p in proj)
    for got, want in zip(steps_of(lean, ids), steps_of(hf, ids)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    h = torch.randn(1, 5, 48, generator=torch.Generator().manual_seed(8))
    alone = torch.cat([proj[0].qkv(h[:, i:i + 1]) for i in range(5)], 1)
    assert torch.equal(proj[0].qkv(h), alone)


@pytest.mark.skipif(not cpu_gemv.available(), reason="no AVX2/FMA CPU or no C++ compiler")
@pytest.mark.parametrize("mask", ["causal", "padding", "tree"])
def test_whole_layer_kernel_scores_a_block_as_its_tokens_one_by_one(mask):
    """A step of k tokens through the whole-layer kernel gives each token the logits, bit for bit,
    it gets in k one-token steps (norm, products, rotary, attention all batch-invariant): what makes
    a verification agree with AR decoding token for token. B = 2 rows; a padding mask and a chain
    given as a 4-D tree mask take the kernel's mask path."""
    lean, _ = lean_and_hf(small_llama())
    ids = torch.randint(0, 97, (2, 14), generator=torch.Generator().manual_seed(9))
    am = torch.ones(2, 14, dtype=torch.long)
    am[1, :3] = 0
    pos = (am.cumsum(-1) - 1).clamp(min=0) if mask == "padding" else torch.arange(14).expand(2, 14)

    def masks(a, b):
        if mask == "padding":
            return am[:, :b]
        if mask == "tree":  # a chain of b - a nodes after a cached tokens: the causal rule, as a tree mask
            allowed = torch.arange(b)[None, :] <= torch.arange(a, b)[:, None]
            return torch.zeros(1, 1, b - a, b).masked_fill(~allowed, float("-inf"))
        return None

    def run(cuts):
        cache, out = lean.new_cache(), []
        for a, b in zip(cuts, cuts[1:]):
            logits, cache = lean.forward(ids[:, a:b], cache, position_ids=pos[:, a:b], attention_mask=masks(a, b))
            out.append(logits)
        return torch.cat(out, 1)

    block, one_by_one = run([0, 8, 13, 14]), run([0, 8] + list(range(9, 15)))
    assert torch.equal(block[:, 8:], one_by_one[:, 8:])
    assert lean_llama.whole_layers(lean.model, lean_llama.projections(lean.model)[0], torch.zeros(2, 5, 48), 8,
                                   torch.zeros(2, 1, 5, 12), torch.zeros(2, 1, 5, 12), None) is not None


def test_stage_by_stage_and_whole_layer_paths_agree():
    """A ``probe`` (the latency suite's timer) runs the layers stage by stage; the same step through
    the whole-layer kernel gives the same logits and residual streams (``taps``) within 1e-5."""
    lean, _ = lean_and_hf(small_llama())
    ids = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(10))
    seen = set()

    def probe(name):
        seen.add(name)
        return lean_llama.NO_PROBE

    c1, c2 = lean.new_cache(), lean.new_cache()
    for a, b in ((0, 7), (7, 8), (8, 12)):
        fused, taps = lean_llama.forward(lean.model, ids[:, a:b], c1, taps=(0, 1, 2))
        staged, taps_staged = lean_llama.forward(lean.model, ids[:, a:b], c2, probe=probe, taps=(0, 1, 2))
        torch.testing.assert_close(fused, staged, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(taps, taps_staged, atol=1e-5, rtol=1e-5)  # every layer's residual stream
        assert taps.shape == (2, b - a, 3 * 48)
    assert {"qkv", "attention", "swiglu", "down"} <= seen


def test_unpacked_lean_lm_matches_hugging_face_within_tolerance():
    m = small_llama()
    lean, hf = lean_llama.LeanLM(m, None), models.LM(m, None)
    ids = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(5))
    assert not lean_llama.projections(m)[0].packed
    for got, want in zip(steps_of(lean, ids), steps_of(hf, ids)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    got, cache = lean.forward(ids, hf.new_cache())  # a Hugging Face cache: Hugging Face's forward
    assert not isinstance(cache, lean_llama.KVCache)
    torch.testing.assert_close(got, hf.forward(ids)[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fault", ["qkv layout", "norms swapped", "skipped residual"])
def test_negative_controls_a_wrong_layout_or_a_skipped_add_is_caught(fault, monkeypatch):
    """The equality above would fail if the fused matrix had k and v swapped or the layer's two
    norms were exchanged (either path), or if the residual add inside the product were skipped
    (stage by stage)."""
    from refimpl.models.cpu_linear import pack_weight

    lean, hf = lean_and_hf(small_llama())
    ids = torch.randint(0, 97, (1, 16), generator=torch.Generator().manual_seed(6))
    proj = lean_llama.projections(lean.model)[1]
    if fault == "qkv layout":
        q, k, v, *_ = (w.detach() for w in proj.sources)
        proj.w_qkv = torch.cat([q, v, k]) if proj.gemv else pack_weight(torch.cat([q, v, k]))
        if proj.gemv:
            proj.fused = (proj.fused[0], proj.w_qkv, *proj.fused[2:])
    elif fault == "norms swapped":
        with torch.no_grad():
            proj.layer.input_layernorm.weight.uniform_(0.5, 1.5)  # not all ones, so a swap shows
        lean_llama.projections(lean.model)  # rebuilt after the edit
        proj = lean_llama.projections(lean.model)[1]
        want = steps_of(hf, ids)
        if proj.gemv:
            n1, w_qkv, w_o, n2, *rest = proj.fused
            proj.fused = (n2, w_qkv, w_o, n1, *rest)
        else:
            a, b = proj.layer.input_layernorm, proj.layer.post_attention_layernorm
            proj.layer.input_layernorm, proj.layer.post_attention_layernorm = b, a
        assert not torch.allclose(steps_of(lean, ids)[0], want[0], atol=1e-3)
        return
    else:
        monkeypatch.setattr(lean_llama, "whole_layers", lambda *a: None)  # this fault lives stage by stage
        monkeypatch.setattr(proj, "down", lambda a, residual: proj.product(a, proj.w_down))
    got, want = steps_of(lean, ids), steps_of(hf, ids)
    assert not torch.allclose(got[0], want[0], atol=1e-3)


def test_fused_weights_follow_in_place_edits():
    lean, hf = lean_and_hf(small_llama())
    ids = torch.randint(0, 97, (1, 8), generator=torch.Generator().manual_seed(7))
    before = lean.logits(ids)
    with torch.no_grad():
        lean.model.model.layers[0].mlp.up_proj.weight.mul_(1.5)
    after = lean.logits(ids)
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, hf.logits(ids), atol=1e-5, rtol=1e-5)


def test_weights_are_checked_at_a_caches_first_step_only(monkeypatch):
    """lean_llama.checked: one check of every weight per cache (its first step), none at its later steps;
    a new cache checks again, so an edit between generations is seen (the test above)."""
    lean, _ = lean_and_hf(small_llama())
    calls = []
    real = lean_llama.projections
    monkeypatch.setattr(lean_llama, "projections", lambda m: calls.append(m) or real(m))
    ids = torch.randint(0, 97, (1, 6), generator=torch.Generator().manual_seed(8))
    cache = lean.new_cache()
    for t in range(ids.shape[1]):  # a prefill of one token, then cached steps
        lean.forward(ids[:, t:t + 1], cache)
    assert len(calls) == 1 and calls[0] is lean.model
    lean.forward(ids, lean.new_cache())
    assert len(calls) == 2


def test_load_picks_the_lean_forward_with_an_off_switch(tiny):
    assert type(tiny) is models.LM  # tiny: nothing packed, so the plain forward
    fast = models.load("tiny", device="cpu", prepack=True)
    assert isinstance(fast, lean_llama.LeanLM)
    assert type(models.load("tiny", device="cpu", prepack=True, fast=False)) is models.LM
    assert isinstance(models.load("tiny", device="cpu", fast=True), lean_llama.LeanLM)
    with pytest.raises(ValueError, match="fast"):
        models.load("tiny", device="cpu", fast="yes")
    with pytest.raises(ValueError, match="fast"):
        models.load("tiny-dllm", device="cpu", fast=True)


def hf_greedy(lm, prompts, n):
    """Hugging Face ``generate`` greedy on a left-padded batch, cut at EOS as ours."""
    from refimpl.primitives import left_pad

    ids, mask = left_pad(prompts, lm.pad_token_id)
    out = lm.model.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False,
                            eos_token_id=lm.eos_token_id, pad_token_id=lm.pad_token_id)
    rows = []
    for row in out[:, ids.shape[1]:].tolist():
        rows.append(row[: row.index(lm.eos_token_id) + 1] if lm.eos_token_id in row else row)
    return rows


def test_lean_tiny_greedy_equals_hugging_face_generate():
    lm = models.load("tiny", device="cpu", prepack=True)
    texts = ["Then said Moses unto the people", "And it came to pass in those days, that the king"]
    prompts = [lm.encode(t) for t in texts]
    got = autoregressive.generate(lm, prompts, max_new_tokens=20).tokens
    assert got == hf_greedy(lm, prompts, 20)  # a ragged batch
    assert autoregressive.generate(lm, prompts[:1], max_new_tokens=20).tokens == hf_greedy(lm, prompts[:1], 20)


def test_smollm2_default_is_the_lean_forward_and_greedy_equals_hugging_face():
    from refimpl.prompts import encode_prompt

    lm = models.load("smollm2-135m", device="cpu")
    assert isinstance(lm, lean_llama.LeanLM) and all(p.packed for p in lean_llama.projections(lm.model))
    prompts = [encode_prompt(lm, t) for t in ("Name three things a lighthouse keeper does.",
                                              "Give one reason why bread goes stale.")]
    got = autoregressive.generate(lm, prompts, max_new_tokens=16).tokens
    assert got == hf_greedy(lm, prompts, 16)
    plain = models.LM(lm.model, lm.tokenizer)  # the same weights through Hugging Face's forward
    ids = torch.tensor([prompts[0]])
    # 30 layers of sums in another order (cpu_gemv): logits of size ~20 agree to 5e-4
    torch.testing.assert_close(lm.logits(ids), plain.logits(ids), atol=5e-4, rtol=0)
