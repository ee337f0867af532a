"""refimpl.pard (PARD: k drafts from one draft call) and its trainer.

Greedy == AR greedy token for token (chains of several lengths, trees over the slots' top-k, a ragged
batch, EOS and max_new_tokens inside an accepted run); ONE draft call per target call; sampling passes
the chi-square on the first two tokens while a residual drawn from p fails it. The training layout is
PARD's: each mask sees the context up to its anchor and its own chain, and the packed loss over all
kept items equals a brute-force loop that runs every item alone; conditional drop-token sampling keeps
every chain's predecessor."""
import pytest
import torch

from decoding import first_accepted_draft  # tests/decoding.py
from first_two import exact_first_two, first_two_pvalue  # tests/first_two.py
from refimpl import autoregressive, generation, models, pard, speculative
from refimpl.drafts import distill_loss, early_exit
from refimpl.train.pard import pard_loss
from test_speculative import wrong_residual_is_p

pytestmark = pytest.mark.usefixtures("torch_kernels")

N = 20
MASK = 2  # tiny's tokenizer reserves id 2 for MASK


@pytest.fixture(scope="module")
def draft():
    return models.load("tiny-draft", device="cpu")  # a chain draft: drafts from masks badly, exactly verified


@pytest.mark.parametrize("opts", [dict(k=1), dict(k=3), dict(k=6), dict(k=5, topk=3, total=8), dict(k=4, topk=2, total=3)])
def test_greedy_equals_ar_on_a_ragged_batch(tiny, draft, spec_prompts, spec_ar_free, opts):
    g = pard.generate(tiny, spec_prompts, draft=draft, mask_id=MASK, max_new_tokens=N, eos_token_id=[], **opts)
    assert g.tokens == spec_ar_free
    assert 0 < g.stats.draft_calls <= g.stats.target_calls  # one draft call a step, from the very first


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_max_new_tokens_inside_a_block(tiny, draft, spec_prompts, spec_ar_free, n):
    g = pard.generate(tiny, spec_prompts, draft=draft, mask_id=MASK, max_new_tokens=n, eos_token_id=[], k=4)
    assert g.tokens == [t[:n] for t in spec_ar_free]


def test_eos_inside_an_accepted_run(tiny, spec_prompts, spec_ar_free):
    """With the target as its own draft every slot a copy can fill is accepted sooner or later."""
    own = pard.generate(tiny, spec_prompts, draft=tiny, mask_id=MASK, max_new_tokens=N, eos_token_id=[], k=3)
    found = first_accepted_draft(own, None)
    if found is None:
        pytest.skip("no draft accepted")
    row, eos, pos = found
    g = pard.generate(tiny, spec_prompts, draft=tiny, mask_id=MASK, max_new_tokens=N, eos_token_id=eos, k=3)
    assert g.tokens == [t[: t.index(eos) + 1] if eos in t else t for t in spec_ar_free]


def test_a_draft_without_a_mask_token_is_refused(tiny, draft, spec_prompts):
    with pytest.raises(ValueError, match="mask_id is required"):
        pard.generate(tiny, spec_prompts, draft=draft)
    with pytest.raises(ValueError, match="mask_id must be a token id"):
        pard.generate(tiny, spec_prompts, draft=draft, mask_id=10 ** 6)


def chi_pvalue(tiny, rule, samples=1200):
    """The first two tokens of PARD sampling (k = 3: slot 0 from the last real token, slot 1 from a mask)
    against tiny's exact joint. The draft is tiny's first two layers (an early exit) and the prompt one
    whose next token is uncertain (top-4 acceptance 0.63): a residual drawn from p then shifts the first
    token's distribution by 0.46 in L1 (a prompt whose next token has p = 0.95 shifts it by 0.02, and an
    untrained mask slot proposes tokens p rarely gives, so its residual is nearly p anyway)."""
    prompt = tiny.encode("The sons of")
    exact = exact_first_two(tiny, prompt, 1.0, 4)
    prop = pard.PardProposer(early_exit(tiny, 2), mask_id=MASK, k=3, topk=1, total=3, target=tiny)
    g = speculative.decode(tiny, prop, [prompt] * samples, max_new_tokens=3, temperature=1.0, top_k=4,
                           generator=torch.Generator().manual_seed(7), eos_token_id=[], rule=rule)
    return first_two_pvalue(g.tokens, exact), g.stats.alpha


def test_sampling_is_lossless_and_a_wrong_rule_is_caught(tiny):
    """Each slot's token is drawn from its own distribution (which ignores the other slots): the rule
    min(1, p/q) with that q stays lossless. Seed 7, 1,200 samples."""
    pvalue, alpha = chi_pvalue(tiny, None)
    assert 0.05 < alpha < 0.95 and pvalue > 1e-3
    assert chi_pvalue(tiny, wrong_residual_is_p)[0] < 1e-6


def test_training_layout_is_what_a_slot_sees_while_drafting():
    x = torch.arange(10)[None]
    slot, pos, allow = pard.training_layout(x, 4)
    items = list(zip(slot.tolist(), pos.tolist()))
    for i, (j, p) in enumerate(items):
        seen = {items[n] for n in allow[i].nonzero()[:, 0].tolist()}
        want = {(0, t) for t in range(p - j + 1)} | {(s, p - j + s) for s in range(1, j + 1)}
        assert seen == want, (j, p)
    # conditional drop-token: fewer masks per depth, each with its chain predecessor kept
    slot, pos, _ = pard.training_layout(torch.arange(64)[None], 5, 0.5, 0.1, torch.Generator().manual_seed(0))
    kept = set(zip(slot.tolist(), pos.tolist()))
    counts = [sum(1 for s, _ in kept if s == j) for j in range(5)]
    assert counts[0] == 64 and all(counts[j] < counts[j - 1] for j in range(1, 5))
    assert all((s - 1, p - 1) in kept for s, p in kept if s > 0)


def test_masks_start_at_the_first_anchor_that_carries_a_loss():
    """With ``first_anchor`` every mask's chain starts at or after it (its predicted token is one the loss
    reads), each mask keeps its chain predecessor, and copy j keeps its share of the anchors that remain;
    without it, masks sit on earlier positions (the negative control)."""
    x, first = torch.arange(40)[None], 25
    slot, pos, allow = pard.training_layout(x, 4, 0.7, 0.2, torch.Generator().manual_seed(1), first_anchor=first)
    kept = list(zip(slot.tolist(), pos.tolist()))
    masks = [(s, p) for s, p in kept if s > 0]
    assert masks and all(p - s >= first for s, p in masks)
    assert all((s - 1, p - 1) in set(kept) for s, p in masks)
    assert sum(s == 1 for s, _ in kept) == int((40 - first) * 0.7)
    assert sum(s == 0 for s, _ in kept) == 40  # every real token stays: the context
    slot, pos, _ = pard.training_layout(x, 4, 0.7, 0.2, torch.Generator().manual_seed(1))
    assert any(p - s < first for s, p in zip(slot.tolist(), pos.tolist()) if s > 0)
    with pytest.raises(ValueError, match="first_anchor"):
        pard.training_layout(x, 4, first_anchor=40)


def test_the_packed_loss_equals_every_item_run_alone(tiny, draft):
    """pard_loss (one forward over the k-copy layout) == the same distillation loss with every kept item
    run alone: the draft on its anchor's context followed by its masks, causally, its last logits."""
    x = torch.tensor([tiny.encode("And God said, Let there be light: and there was light.")[:12]])
    gen = torch.Generator().manual_seed(3)
    state = gen.get_state()
    got = pard_loss(draft.model, tiny.model, x, MASK, 3, 0.6, 0.2, gen)
    gen.set_state(state)
    slot, pos, _ = pard.training_layout(x, 3, 0.6, 0.2, gen)
    T, rows = x.shape[1], []
    for j, p in zip(slot.tolist(), pos.tolist()):
        if p + 1 < T:
            inp = torch.tensor([x[0, : p - j + 1].tolist() + [MASK] * j])
            rows.append((draft.model(input_ids=inp).logits[0, -1], p))
    teacher = tiny.model(input_ids=x).logits[0]
    want = distill_loss(torch.stack([r[0] for r in rows]), teacher[[p for _, p in rows]], x[0, [p + 1 for _, p in rows]])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    # negative control: dropping the chain from the masks' attention changes the loss
    gen.set_state(state)
    wrong = pard_loss(draft.model, tiny.model, x, MASK, 1, 0.6, 0.2, gen)  # (only copy 0: another loss)
    assert not torch.allclose(wrong, want)


def test_the_rows_loss_equals_every_item_run_alone(tiny, draft):
    """The SmolLM2 trainer's loss (pard_rows_loss over a ragged row_batch: the teacher's logits from its
    stored final hidden states, loss on answer positions only) == a brute-force loop over every kept item
    alone; a batch of two rows of different lengths checks that padding never leaks into a loss."""
    from refimpl.train.pard import pard_rows_loss, row_batch

    rows = []
    for text, n_prompt in (("And God said, Let there be light: and there was light.", 5), ("In the beginning", 2)):
        ids = tiny.encode(text)[:14]
        with torch.no_grad():
            h = tiny.model.model(input_ids=torch.tensor([ids])).last_hidden_state[0]  # (T, H) after the final norm
        rows.append((ids, n_prompt, h[n_prompt - 1:len(ids) - 1]))
    head = tiny.model.get_output_embeddings().weight.detach().float()
    col = torch.arange(tiny.vocab_size)
    x, teacher, has, labels = row_batch(rows, [0, 1], head, col, tiny.pad_token_id)
    gen = torch.Generator().manual_seed(5)
    state = gen.get_state()
    got = pard_rows_loss(draft.model, x, teacher, has, labels, MASK, 3, 0.7, 0.3, gen)
    gen.set_state(state)
    slot, pos, _ = pard.training_layout(x, 3, 0.7, 0.3, gen, first_anchor=min(n for _, n, _ in rows) - 1)
    s_rows, t_rows, lab = [], [], []
    for b, (ids, n, h) in enumerate(rows):
        for j, p in zip(slot.tolist(), pos.tolist()):
            if n - 1 <= p < len(ids) - 1:  # the item predicts an answer token of this row
                inp = torch.tensor([list(ids[: p - j + 1]) + [MASK] * j])
                s_rows.append(draft.model(input_ids=inp).logits[0, -1])
                t_rows.append(h[p - (n - 1)] @ head.T)
                lab.append(ids[p + 1])
    s, t = torch.stack(s_rows), torch.stack(t_rows)
    want = distill_loss(s, t, None, 2.0, 0.0) + 0.1 * torch.nn.functional.cross_entropy(s, torch.tensor(lab))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    # negative control: a teacher read one position late gives another loss
    late = torch.roll(teacher, 1, dims=1)
    gen.set_state(state)
    assert not torch.allclose(pard_rows_loss(draft.model, x, late, has, labels, MASK, 3, 0.7, 0.3, gen), want)


def test_the_cpu_preset_drafts_the_slots_the_drafts_measured_acceptance_pays_for(tiny, draft, spec_prompts,
                                                                                   spec_ar_free):
    """The ``"cpu"`` chain has as many slots as lead with a held-out acceptance of at least ``SLOT_COST``
    (at most ``CPU_SLOTS``); a draft whose trainer measured nothing drafts ``CPU_SLOTS``."""
    c = generation.SLOT_COST
    assert [generation.paying_slots(a, 4) for a in (None, (0.9,) * 8, (0.5, 0.2, c - 1e-3, 0.5), (0.0,) * 8,
                                                    (0.5, c, 0.3))] == [4, 4, 2, 1, 3]
    assert draft.config.__dict__.get("heldout_accept") is None and pard.cpu_slots(draft) == pard.CPU_SLOTS
    try:
        draft.config.heldout_accept = [0.6, 0.3, 0.01, 0.0, 0.0, 0.0, 0.0, 0.0]
        g = pard.generate(tiny, spec_prompts, draft=draft, mask_id=MASK, max_new_tokens=N, eos_token_id=[])
        assert g.tokens == spec_ar_free and max(g.stats.extra["gammas"]) == 2
        wide = pard.generate(tiny, spec_prompts, draft=draft, mask_id=MASK, max_new_tokens=N, eos_token_id=[], k=4)
        assert wide.tokens == spec_ar_free and max(wide.stats.extra["gammas"]) == 4
    finally:
        del draft.config.heldout_accept
