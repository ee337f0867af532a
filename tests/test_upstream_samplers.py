"""Our zoo dLLMs under the public samplers, called the way those samplers call a model.

Re-implementations (written here, greedy) of the samplers of LLaDA's ``generate.py``
(``model(x).logits`` / ``model(x, attention_mask=m).logits``, a fixed number of steps per block)
and of Fast-dLLM's ``llada/generate.py`` (the threshold rule of ``get_transfer_index``; the
prefix cache ``model(x, use_cache=True).past_key_values`` sliced ``[:, :, :s]``, then
``model(x[:, s:], past_key_values=kv, use_cache=True).logits``; the dual cache
``model(x[:, s:e], past_key_values=kv, use_cache=True, replace_position=rp).logits``). They must
give the tokens of :func:`refimpl.diffusion.generate` up to and including the first EOS (ours
stops once every row has an EOS in a finished block; theirs fills every block).
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from refimpl import diffusion, digit_reversal, models
from refimpl.bench.dllm import kjv_prompts


def schedule(block_masked, steps):
    """LLaDA's linear schedule, (B, N) bool -> (B, steps): count // steps, +1 on the first count % steps."""
    n = block_masked.sum(1, keepdim=True)  # (B, 1)
    return n // steps + (torch.arange(steps)[None] < n % steps).long()


def transfer(logits, mask_index, x, k, threshold=None, conf_dtype=torch.float64):
    """Fast-dLLM's ``get_transfer_index`` at temperature 0: (x0 (B, N), transfer (B, N) bool)."""
    x0 = logits.argmax(-1)  # (B, N): MASK is *not* excluded upstream
    conf = torch.softmax(logits.to(conf_dtype), -1).gather(-1, x0[..., None])[..., 0]  # (B, N)
    x0 = torch.where(mask_index, x0, x)
    conf = torch.where(mask_index, conf, torch.tensor(float("-inf"), dtype=conf.dtype))
    sel = torch.zeros_like(mask_index)
    for b in range(x.size(0)):
        n = int(mask_index[b].sum()) if threshold is not None else int(k[b])
        top = torch.topk(conf[b], n).indices
        sel[b, top] = True
        if threshold is not None:  # keep the best one, then those at or above the threshold
            sel[b, top[1:]] = conf[b, top[1:]] >= threshold
    return x0, sel


def commit(x, x0, sel, mask_id):
    assert not bool((x0[sel] == mask_id).any()), "the model predicted MASK: upstream would commit it"
    x[sel] = x0[sel]


def llada(model, prompt, gen_length, steps, block_length, mask_id, attention_mask=None):
    """LLaDA ``generate``: ``steps // blocks`` forwards per block, top-k by float32 confidence."""
    B, P = prompt.shape
    x = torch.cat([prompt, torch.full((B, gen_length), mask_id)], 1)
    am = None if attention_mask is None else torch.cat([attention_mask, torch.ones(B, gen_length).long()], 1)
    per_block = steps // (gen_length // block_length)
    for s in range(P, P + gen_length, block_length):
        k = schedule(x[:, s: s + block_length] == mask_id, per_block)
        for i in range(per_block):
            mask_index = x == mask_id
            mask_index[:, s + block_length:] = False
            logits = model(x).logits if am is None else model(x, attention_mask=am).logits
            commit(x, *transfer(logits, mask_index, x, k[:, i], conf_dtype=torch.float32), mask_id)
    return x[:, P:]


def fast_dllm(model, prompt, gen_length, steps, block_length, mask_id, threshold=None, cache=None):
    """Fast-dLLM ``generate`` / ``generate_with_prefix_cache`` / ``generate_with_dual_cache``."""
    B, P = prompt.shape
    x = torch.cat([prompt, torch.full((B, gen_length), mask_id)], 1)
    per_block = steps // (gen_length // block_length)
    for s in range(P, P + gen_length, block_length):
        e = s + block_length
        k = schedule(x[:, s:e] == mask_id, per_block)
        i, kv = 0, None
        while True:
            if cache is None or kv is None:  # a full pass (and, with a cache, the block's cache)
                mask_index = x == mask_id
                mask_index[:, e:] = False
                out = model(x, use_cache=True) if cache else model(x)
                commit(x, *transfer(out.logits, mask_index, x, k[:, i] if threshold is None else None, threshold),
                       mask_id)
                if cache == "prefix":
                    kv = [tuple(t[:, :, :s] for t in layer) for layer in out.past_key_values]
                elif cache == "dual":
                    kv = out.past_key_values
                    rp = torch.zeros_like(x, dtype=torch.bool)
                    rp[:, s:e] = True
            else:
                end = x.size(1) if cache == "prefix" else e
                mask_index = x[:, s:end] == mask_id
                mask_index[:, block_length:] = False
                extra = dict(replace_position=rp) if cache == "dual" else {}
                logits = model(x[:, s:end], past_key_values=kv, use_cache=True, **extra).logits
                x0, sel = transfer(logits, mask_index, x[:, s:end], k[:, i] if threshold is None else None, threshold)
                part = x[:, s:end]
                commit(part, x0, sel, mask_id)
            i += 1
            if cache is None or i > 1:
                if not bool((x[:, s:e] == mask_id).any()):
                    break
    return x[:, P:]


def until_eos(row, eos):
    row = row.tolist()
    return row[: row.index(eos) + 1] if eos in row else row


@pytest.fixture(scope="module")
def kjv():
    if not os.path.exists(os.path.join(models.MODELS_DIR, "tiny-dllm", "config.json")):
        pytest.skip("models/tiny-dllm not trained yet")
    m = models.load("tiny-dllm", device="cpu")
    return m, kjv_prompts(m.tokenizer, 3, length=20)


@pytest.fixture(scope="module")
def rev():
    m = models.load("tiny-dllm-rev", device="cpu")
    return m, [m.tokenizer.encode(digit_reversal.synthetic_problem(d)[0]) for d in digit_reversal.synthetic_split()[:6]]


def check(model, prompts, want, **kw):
    g = diffusion.generate(model, prompts, **kw)
    got = [until_eos(torch.tensor(t), model.eos_token_id) for t in g.tokens]
    assert got == [until_eos(r, model.eos_token_id) for r in want]
    return g


SETTINGS = [dict(gen_length=16, steps=16, block_length=16), dict(gen_length=16, steps=8, block_length=8)]


@pytest.mark.parametrize("kw", SETTINGS)
def test_llada_sampler_calls_model_logits(kjv, rev, kw):
    for model, prompts in (kjv, rev):
        for p in prompts:
            want = llada(model, torch.tensor([p]), mask_id=model.mask_token_id, **kw)
            check(model, [p], want, **kw)
        # the same-length batch of rev, one call for all rows
        if model is rev[0]:
            want = llada(model, torch.tensor(prompts), mask_id=model.mask_token_id, **kw)
            check(model, prompts, want, **kw)


def test_llada_sampler_ragged_batch_with_attention_mask(kjv):
    model, prompts = kjv
    prompts = [prompts[0], prompts[1][:12], prompts[2][:7]]
    L = max(len(p) for p in prompts)
    ids = torch.tensor([[model.pad_token_id] * (L - len(p)) + p for p in prompts])
    am = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts])
    kw = SETTINGS[1]
    want = llada(model, ids, mask_id=model.mask_token_id, attention_mask=am, **kw)
    check(model, prompts, want, **kw)
    unmasked = llada(model, ids, mask_id=model.mask_token_id, **kw)  # negative control: pads seen
    assert [until_eos(r, 0) for r in unmasked] != [until_eos(r, 0) for r in want]


@pytest.mark.parametrize("cache", [None, "prefix", "dual"])
@pytest.mark.parametrize("threshold", [None, "t"])
def test_fast_dllm_samplers(kjv, rev, cache, threshold):
    for (model, prompts), t in ((kjv, 0.2), (rev, 0.9)):
        thr = t if threshold else None
        for kw in SETTINGS:
            for p in prompts[:2]:
                want = fast_dllm(model, torch.tensor([p]), mask_id=model.mask_token_id, threshold=thr, cache=cache,
                                 **kw)
                g = check(model, [p], want, threshold=thr, cache=cache, use_kernel=False, **kw)
                if thr is not None:
                    assert g.stats.nfe <= kw["gen_length"]
    if cache is not None and threshold is None:  # a stale cache really differs from no cache somewhere
        model, prompts = kjv
        kw = SETTINGS[1]
        stale = [fast_dllm(model, torch.tensor([p]), mask_id=model.mask_token_id, cache=cache, **kw) for p in prompts]
        fresh = [fast_dllm(model, torch.tensor([p]), mask_id=model.mask_token_id, **kw) for p in prompts]
        assert any(not torch.equal(a, b) for a, b in zip(stale, fresh))
