"""refimpl.free_draft (``diffusion.generate(..., draft_steps=K)``): FreeDave draft-and-verify gives the
plain sampler's tokens in fewer denoiser calls; accepting unverified drafts would not."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from refimpl import diffusion, digit_reversal, free_draft, models
from refimpl.bench.dllm import kjv_prompts


@pytest.fixture(scope="module")
def kjv():
    if not os.path.exists(os.path.join(models.MODELS_DIR, "tiny-dllm", "config.json")):
        pytest.skip("models/tiny-dllm not trained yet")
    m = models.load("tiny-dllm", device="cpu")
    p = kjv_prompts(m.tokenizer, 3, length=20)
    return m, [[p[0]], [p[1][:9]], [p[0], p[1][:9], p[2][:14]]]  # two rows alone, one ragged batch


@pytest.fixture(scope="module")
def rev():
    m = models.load("tiny-dllm-rev", device="cpu")
    enc = [m.tokenizer.encode(digit_reversal.synthetic_problem(d)[0]) for d in digit_reversal.synthetic_split()[:8]]
    return m, [[enc[0]], enc[1:7], [enc[7], enc[2][3:]]]  # alone, a batch, a ragged batch


KJV = [dict(gen_length=16, steps=16, block_length=16),  # one token per step
       dict(gen_length=16, steps=8, block_length=16),  # k = 2 per step
       dict(gen_length=24, steps=24, block_length=8),  # three blocks
       dict(gen_length=16, steps=16, block_length=8, threshold=0.9),
       dict(gen_length=16, steps=16, block_length=8, threshold=0.2),
       dict(gen_length=16, steps=16, block_length=8, factor=1.0)]
REV = [dict(gen_length=8, steps=8, block_length=8), dict(gen_length=8, steps=4, block_length=8),
       dict(gen_length=8, steps=6, block_length=8),  # uneven schedule: k = 2, 2, 1, 1, 1, 1
       dict(gen_length=8, steps=16, block_length=4),  # more steps than tokens: skipped zero-k steps
       dict(gen_length=12, steps=12, block_length=4),  # EOS in the 2nd of 3 blocks: the stop rule
       dict(gen_length=8, steps=8, block_length=8, threshold=0.9), dict(gen_length=8, steps=8, block_length=4, factor=1.0)]


@pytest.mark.parametrize("which,settings", [("kjv", KJV), ("rev", REV)])
def test_draft_and_verify_equals_plain_sampler(which, settings, request):
    model, batches = request.getfixturevalue(which)
    fewer = 0
    for kw in settings:
        for prompts in batches:
            base = diffusion.generate(model, prompts, use_kernel=False, **kw)
            for K in (2, 4):
                g = diffusion.generate(model, prompts, draft_steps=K, use_kernel=False, **kw)
                assert g.tokens == base.tokens, (kw, K, prompts)
                assert g.stats.nfe <= base.stats.nfe
                fewer += g.stats.nfe < base.stats.nfe
                depths = [d for step in g.stats.accepted for d in step]
                assert max(depths) <= K and g.stats.extra["draft_rows"] >= g.stats.nfe - 1
                assert sum(map(sum, g.stats.extra["committed"])) >= sum(map(len, g.tokens))
    assert fewer > 0


def test_one_draft_step_is_the_plain_sampler(kjv, rev):
    runs = [(kjv[0], kjv[1], KJV[2], False)] + [(rev[0], rev[1], kw, True) for kw in (REV[0], REV[4], REV[5])]
    for model, batches, kw, use_kernel in runs:  # the fused selection kernel on both sides for rev
        for prompts in batches:
            base = diffusion.generate(model, prompts, use_kernel=use_kernel, **kw)
            one = diffusion.generate(model, prompts, draft_steps=1, use_kernel=use_kernel, **kw)
            assert one.tokens == base.tokens and one.stats.nfe == base.stats.nfe
            assert all(d in (0, 1) for step in one.stats.accepted for d in step)


def test_unverified_drafts_change_the_output(kjv, rev, monkeypatch):
    """Negative control: accept every draft (depth K) without the check and the tokens change."""
    runs = [(kjv[0], kjv[1][0], KJV[0]), (kjv[0], kjv[1][1], KJV[2]), (rev[0], rev[1][1], REV[4])]
    base = [diffusion.generate(m, p, use_kernel=False, **kw).tokens for m, p, kw in runs]
    monkeypatch.setattr(free_draft, "accept_depth", lambda agree: torch.full((agree.size(0),), agree.size(1) + 1))
    blind = [diffusion.generate(m, p, draft_steps=4, use_kernel=False, **kw).tokens for m, p, kw in runs]
    assert any(a != b for a, b in zip(base, blind))


def test_accept_depth():
    agree = torch.tensor([[True, True, False], [False, True, True], [True, True, True]])
    assert free_draft.accept_depth(agree).tolist() == [3, 1, 4]
    assert free_draft.accept_depth(torch.zeros(2, 0, dtype=torch.bool)).tolist() == [1, 1]  # K = 1


def test_bad_draft_arguments(rev):
    model, batches = rev
    kw = dict(gen_length=8, steps=8, block_length=8)
    for bad in (0, -2, 1.5, True, "2"):
        with pytest.raises(ValueError, match="draft_steps"):
            diffusion.generate(model, batches[0], draft_steps=bad, **kw)
    for other in (dict(temperature=0.5), dict(cache="prefix"), dict(cache="dual"), dict(early_commit=0.5),
                  dict(remasking="random")):
        with pytest.raises(ValueError, match="draft_steps"):
            diffusion.generate(model, batches[0], draft_steps=2, **other, **kw)


def test_model_with_only_logits_decodes_ragged_rows_alone(rev):
    """A model whose ``logits`` takes no attention mask: ragged rows are drafted one by one."""
    model, batches = rev

    class LogitsOnly:
        mask_token_id, eos_token_id, pad_token_id = model.mask_token_id, model.eos_token_id, model.pad_token_id
        max_length, device = model.max_length, model.device

        def logits(self, ids):
            return model.logits(ids)

    kw = REV[0]
    base = diffusion.generate(model, batches[2], use_kernel=False, **kw)
    g = diffusion.generate(LogitsOnly(), batches[2], draft_steps=3, use_kernel=False, **kw)
    assert g.tokens == base.tokens and g.stats.nfe < base.stats.nfe * len(batches[2])
