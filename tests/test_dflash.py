"""refimpl.dflash (DFlash: a block-diffusion drafter on the target's features, one call a block).

Greedy == AR greedy token for token (random and trained drafters, several block sizes, trees over the
slots' top-k, a ragged batch, EOS and max_new_tokens inside an accepted run); one draft call per target
call after the prefill; the cached drafter drafts exactly what a from-scratch run on the whole context
drafts at every step of a ragged batch; sampling passes the chi-square while a residual drawn from p
fails it; the training loss (all anchors of a row in one forward, the sparse block mask) equals a loop
that runs every block alone, and it does not move when the context at or after an anchor does."""
import copy

import pytest
import torch

from decoding import first_accepted_draft  # tests/decoding.py
from first_two import exact_first_two, first_two_pvalue  # tests/first_two.py
from refimpl import dflash, generation, speculative
from refimpl.models import drafters
from refimpl.train.dflash import block_out
from test_speculative import wrong_residual_is_p

pytestmark = pytest.mark.usefixtures("torch_kernels")

N = 20


@pytest.fixture(scope="module")
def random_draft(tiny):
    torch.manual_seed(0)
    return dflash.new_draft(tiny, num_layers=2, block=6).eval()


@pytest.mark.parametrize("opts", [dict(block=2), dict(block=6), dict(block=4, topk=3, total=6), dict(block=16)])
def test_greedy_equals_ar_on_a_ragged_batch(tiny, random_draft, spec_prompts, spec_ar_free, opts):
    g = dflash.generate(tiny, spec_prompts, draft=random_draft, max_new_tokens=N, eos_token_id=[], **opts)
    assert g.tokens == spec_ar_free
    assert g.stats.draft_calls <= g.stats.target_calls - 1  # one call a step, none at the prefill


@pytest.mark.parametrize("n", [1, 2, 5])
def test_max_new_tokens_inside_a_block(tiny, random_draft, spec_prompts, spec_ar_free, n):
    g = dflash.generate(tiny, spec_prompts, draft=random_draft, max_new_tokens=n, eos_token_id=[], block=6)
    assert g.tokens == [t[:n] for t in spec_ar_free]


class FromScratch(dflash.DFlashProposer):
    """Also runs every step's block from scratch (``block_out`` on the row's whole committed context,
    nothing cached) and records the largest difference between the two runs' block outputs."""

    def __init__(self, draft, *args):
        super().__init__(copy.copy(draft), *args)  # a shallow copy: the same weights, its own ``step``
        real, self.diffs, self.ctx = self.draft.step, [], None

        def step(*a, **k):
            out, new = real(*a, **k)
            self.last = out  # (B, g, H) the cached run's block outputs
            return out, new
        self.draft.step, self.real = step, real

    def propose(self, caps):
        if self.pending is not None:
            self.ctx = [torch.cat([c, p]) for c, p in zip(self.ctx or [p[:0] for p in self.pending], self.pending)]
        self.last = None
        prop = super().propose(caps)
        if self.last is not None:
            step, self.draft.step = self.draft.step, self.real  # block_out calls draft.step: the real one
            block, self.draft.block = self.draft.block, self.last.shape[1]  # this step's block (shorter near the end)
            for r, (c, root) in enumerate(zip(self.ctx, self.roots)):
                n, g = c.shape[0], self.draft.block
                tok = torch.zeros((1, n + g), dtype=torch.long)
                tok[0, n] = root  # block_out reads the root only: the context is the features
                want = block_out(self.draft, tok, c[None], n)  # (g - 1, H)
                self.diffs.append(float((self.last[r, 1:] - want).abs().max()))
            self.draft.step, self.draft.block = step, block
        return prop

    def select(self, rows):
        self.ctx = [self.ctx[i] for i in rows.tolist()]
        super().select(rows)


def test_the_cached_drafter_drafts_what_a_from_scratch_run_drafts(tiny, random_draft, spec_prompts, spec_ar_free):
    """The cache (context keys / values added each step, left-padded rows, rows leaving the batch) gives the
    block outputs a from-scratch run gives, to float rounding. (Compared as outputs, not argmaxes: a random
    drafter's logits tie to 1e-5, where the summation order may pick either.)"""
    prop = FromScratch(random_draft, 6, 1, 5)
    g = speculative.decode(tiny, prop, spec_prompts, max_new_tokens=N, eos_token_id=[])
    assert g.tokens == spec_ar_free
    assert len(prop.diffs) > 5 and max(prop.diffs) < 1e-4, max(prop.diffs)


def test_eos_inside_an_accepted_run(tiny, spec_prompts, spec_ar_free):
    d = drafters.load(tiny, "dflash")
    free = dflash.generate(tiny, spec_prompts, draft=d, max_new_tokens=N, eos_token_id=[])
    found = first_accepted_draft(free, None)
    assert found is not None and free.stats.tau > 1.2
    row, eos, pos = found
    g = dflash.generate(tiny, spec_prompts, draft=d, max_new_tokens=N, eos_token_id=eos)
    assert g.tokens == [t[: t.index(eos) + 1] if eos in t else t for t in spec_ar_free]


def chi_pvalue(tiny, draft, rule, samples=800):
    prompt = tiny.encode("And the LORD spake unto Moses, saying")
    exact = exact_first_two(tiny, prompt, 1.0, 4)
    g = speculative.decode(tiny, dflash.DFlashProposer(draft, block=4, topk=1, total=3), [prompt] * samples, max_new_tokens=3,
                           temperature=1.0, top_k=4, generator=torch.Generator().manual_seed(5), eos_token_id=[],
                           rule=rule)
    return first_two_pvalue(g.tokens, exact), g.stats.alpha


def test_sampling_is_lossless_and_a_wrong_rule_is_caught(tiny):
    d = drafters.load(tiny, "dflash")
    pvalue, alpha = chi_pvalue(tiny, d, None)
    assert 0.05 < alpha < 0.95 and pvalue > 1e-3
    assert chi_pvalue(tiny, d, wrong_residual_is_p)[0] < 1e-6


def brute_force_loss(draft, tok, feats, anchors, decay):
    """Every anchor's block run alone (``block_out``), its slots' cross-entropy weighted as block_loss."""
    total = weight = 0.0
    T = tok.shape[1]
    for r in range(tok.shape[0]):
        for a in anchors[r].tolist():
            if a < 0:
                continue
            out = block_out(draft, tok[r:r + 1], feats[r:r + 1], a)
            logits = draft.logits(out)
            for i in range(draft.block - 1):
                if a + 1 + i < T:
                    w = float(torch.exp(torch.tensor(-i / decay)))
                    ce = torch.nn.functional.cross_entropy(logits[i][None], tok[r, a + 1 + i][None])
                    total, weight = total + w * ce, weight + w
    return total / weight


def test_the_block_loss_equals_every_block_run_alone(tiny, random_draft):
    torch.manual_seed(1)
    tok = torch.tensor([tiny.encode("And God said, Let there be light: and there was light. And God saw")[:16],
                        tiny.encode("In the beginning God created the heaven and the earth. And the earth was without form")[:16]])
    feats = torch.randn(2, 16, len(random_draft.taps) * random_draft.hidden_size)
    anchors = torch.tensor([[2, 7, 13], [0, 5, -1]])
    loss, _ = dflash.block_loss(random_draft, tok, feats, anchors, None, 7.0)
    torch.testing.assert_close(loss, brute_force_loss(random_draft, tok, feats, anchors, 7.0), rtol=1e-4, atol=1e-5)
    # negative control: changing the features at and after a block's anchor leaves its loss alone, changing
    # one before it does not (a block that saw its own future would learn from it)
    one, feats1, at7 = tok[:1], feats[:1], anchors[:1, 1:2]  # row 0's block at anchor 7 alone
    base = dflash.block_loss(random_draft, one, feats1, at7, None, 7.0)[0]
    seen = feats1.clone()
    seen[0, 7:9] = torch.randn(2, feats.shape[2])  # its anchor's own features and the next one: never seen
    assert torch.allclose(dflash.block_loss(random_draft, one, seen, at7, None, 7.0)[0], base)
    seen[0, 6] += 1.0  # the last context position it must see
    assert not torch.allclose(dflash.block_loss(random_draft, one, seen, at7, None, 7.0)[0], base)


def test_a_drafter_that_does_not_fit_is_refused(tiny, random_draft, spec_prompts):
    with pytest.raises(ValueError, match="draft is required"):
        dflash.generate(tiny, spec_prompts)
    with pytest.raises(ValueError, match="layer ids"):
        dflash.new_draft(tiny, num_layers=2, taps=(1, 9))


def test_save_and_load_round_trip(tiny, random_draft, tmp_path, spec_prompts):
    drafters.save(random_draft, str(tmp_path), tiny)
    again = drafters.load(tiny, "dflash", str(tmp_path))
    a = dflash.generate(tiny, spec_prompts, draft=random_draft, max_new_tokens=8)
    b = dflash.generate(tiny, spec_prompts, draft=again, max_new_tokens=8)
    assert a.tokens == b.tokens and a.stats.accepted == b.stats.accepted


def test_the_loss_decay_is_specforges_for_the_block():
    """SpecForge's recommendation: 7 for blocks of 16, 5 for 10, 4 for 8; linear between, held outside."""
    assert [dflash.loss_decay(b) for b in (4, 8, 9, 10, 13, 16, 32)] == [4.0, 4.0, 4.5, 5.0, 6.0, 7.0, 7.0]
    with pytest.raises(ValueError, match="block"):
        dflash.loss_decay(1)


def test_the_cpu_block_keeps_the_slots_whose_acceptance_pays_for_their_cost(tiny):
    """A slot joins the block while its held-out chain acceptance reaches ``SLOT_COST``; at least the root
    and one slot, at most the drafter's block; a drafter measured by no trainer runs its own block."""
    torch.manual_seed(0)
    d = dflash.new_draft(tiny, num_layers=1, block=8)
    assert dflash.cpu_block(d) == 8
    c = generation.SLOT_COST
    for accept, want in [((0.32, 0.08, c, c - 1e-3, 0.03, 0.0, 0.0), 4), ((0.9,) * 7, 8), ((0.9,) * 12, 8),
                         ((c / 2,) * 7, 2), ((0.5, 0.0, 0.5, 0.5, 0.5, 0.5, 0.5), 2)]:
        d.accept = accept
        assert dflash.cpu_block(d) == want, accept


def test_the_cpu_preset_runs_the_block_the_drafter_measured_and_saves_it(tiny, spec_prompts, spec_ar_free, tmp_path):
    torch.manual_seed(0)
    d = dflash.new_draft(tiny, num_layers=1, block=8, accept=(0.5, 0.2, 0.01, 0.0, 0.0, 0.0, 0.0)).eval()
    g = dflash.generate(tiny, spec_prompts, draft=d, max_new_tokens=N, eos_token_id=[])
    assert g.tokens == spec_ar_free and max(g.stats.extra["gammas"]) == 2  # block 3: the root + 2 drafts
    wide = dflash.generate(tiny, spec_prompts, draft=d, max_new_tokens=N, eos_token_id=[], block=8)
    assert wide.tokens == spec_ar_free and max(wide.stats.extra["gammas"]) == 7
    drafters.save(d, str(tmp_path), tiny)
    assert drafters.load(tiny, "dflash", str(tmp_path)).accept == d.accept
