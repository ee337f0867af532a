"""dParallel (chapter 15): recorded trajectories == the block-diffusion sampler and a step-by-step
replay, the certainty-forcing loss == brute force, training moves it, bad arguments raise."""
import copy
import math

import pytest
import torch

from refimpl import block_diffusion, dparallel, models
from refimpl.diffusion_steps import denoise_step

from decoding import kjv_contexts  # tests/decoding.py


@pytest.fixture(scope="module")
def bdlm():
    return models.load("tiny-bdlm", device="cpu")


@pytest.fixture(scope="module")
def ctx(bdlm):
    return kjv_contexts(bdlm)


def test_record_equals_the_sampler_and_a_step_by_step_replay(bdlm, ctx):
    b, nb = 4, 2
    traj = dparallel.record(bdlm.model, ctx, bdlm.mask_token_id, b, nb)
    ref = block_diffusion.generate(bdlm, ctx.tolist(), gen_length=b * nb, block_length=b, eos_token_id=[])
    assert torch.cat(traj.final, 1).tolist() == ref.tokens
    one = torch.ones(3, dtype=torch.long)
    for k in range(nb):
        assert sorted(traj.order[k][0].tolist()) == list(range(b))
        for s in range(b):  # from the state after s steps, the sampler commits exactly order == s
            st = traj.state(k, torch.full((3,), s), bdlm.mask_token_id)
            assert int((st == bdlm.mask_token_id).sum()) == 3 * (b - s)
            x0, sel = denoise_step(dparallel.block_logits(bdlm.model, traj.contexts[k], st), st == bdlm.mask_token_id,
                                   bdlm.mask_token_id, k=one)
            assert torch.equal(sel, traj.order[k] == s) and torch.equal(x0[sel], traj.final[k][sel])
    assert torch.equal(traj.contexts[1], torch.cat([ctx, traj.final[0]], 1))


@torch.no_grad()
def brute(bdlm, ctx, state, final, beta, temperature):
    """Per row and masked position: its own forward with an explicit mask, sums in float64."""
    mask_id = bdlm.mask_token_id
    ces, ents = [], []
    L, b = ctx.shape[1], state.shape[1]
    for r in range(ctx.shape[0]):
        ids = torch.tensor([ctx[r].tolist() + state[r].tolist()])
        allow = torch.zeros(L + b, L + b, dtype=torch.bool)
        for q in range(L + b):
            for k in range(L + b):
                allow[q, k] = k <= q or (q >= L and k >= L)
        mask = torch.zeros(1, 1, L + b, L + b).masked_fill(~allow, float("-inf"))
        out = bdlm.model(input_ids=ids, attention_mask=mask).logits[0].double()  # (L + b, V)
        for i in range(b):
            if state[r, i] != mask_id:
                continue
            lg = out[L - 1 + i]
            ces.append(-float(torch.log_softmax(lg, -1)[final[r, i]]))
            if int(lg.argmax()) == int(final[r, i]):
                p = torch.softmax(lg / temperature, -1).tolist()
                ents.append(-sum(x * math.log(x) for x in p if x > 0))
    ent = sum(ents) / len(ents) if ents else 0.0
    return sum(ces) / len(ces) + beta * ent, len(ents)


def test_certainty_forcing_loss_equals_brute_force(bdlm, ctx):
    traj = dparallel.record(bdlm.model, ctx, bdlm.mask_token_id, 6, 1)
    state = traj.state(0, torch.tensor([0, 2, 4]), bdlm.mask_token_id)
    with torch.no_grad():
        got, parts = dparallel.certainty_forcing_loss(bdlm.model, ctx, state, traj.final[0], bdlm.mask_token_id,
                                                      beta=0.7, temperature=0.5)
    want, n_right = brute(bdlm, ctx, state, traj.final[0], 0.7, 0.5)
    assert n_right > 0, "some masked position is already right (else the entropy term is untested)"
    assert float(got) == pytest.approx(want, rel=1e-4)
    assert parts["correct"] == pytest.approx(n_right / int((state == bdlm.mask_token_id).sum()))
    assert parts["entropy"] > 0


def test_the_upstream_states_and_complementary_loss_equal_brute_force(bdlm, ctx):
    """The release's states: each block token masked with p = 0.5, and the complement; the loss is the
    certainty-forcing loss of each (every mean over its own masked positions), summed."""
    mask_id = bdlm.mask_token_id
    traj = dparallel.record(bdlm.model, ctx, mask_id, 6, 2)
    c, state, comp, final = traj.sample_random(torch.Generator(device="cpu").manual_seed(3), mask_id)
    assert any(torch.equal(c, x) and torch.equal(final, f) for x, f in zip(traj.contexts, traj.final))
    hidden = state == mask_id
    assert torch.equal(comp == mask_id, ~hidden), "the complement masks exactly the shown tokens"
    assert torch.equal(torch.where(hidden, final, state), final) and torch.equal(torch.where(hidden, comp, final), final)
    with torch.no_grad():
        got, _ = dparallel.complementary_loss(bdlm.model, c, state, comp, final, mask_id, beta=0.7, temperature=0.5)
    want = brute(bdlm, c, state, final, 0.7, 0.5)[0] + brute(bdlm, c, comp, final, 0.7, 0.5)[0]
    assert float(got) == pytest.approx(want, rel=1e-4)
    gen = torch.Generator(device="cpu").manual_seed(0)
    frac = float((dparallel.random_states(torch.zeros(64, 64, dtype=torch.long), 7, gen)[0] == 7).float().mean())
    assert 0.45 < frac < 0.55  # p = 0.5
    with pytest.raises(ValueError, match="p must"):
        dparallel.random_states(final, mask_id, gen, p=1.0)


def test_one_step_lowers_the_loss(bdlm, ctx):
    model = copy.deepcopy(bdlm.model).train()
    traj = dparallel.record(model, ctx, bdlm.mask_token_id, 4, 2)
    gen = torch.Generator(device="cpu").manual_seed(0)
    batch = traj.sample(gen, bdlm.mask_token_id)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    before, _ = dparallel.certainty_forcing_loss(model, *batch, bdlm.mask_token_id)
    before.backward()
    opt.step()
    with torch.no_grad():
        after, _ = dparallel.certainty_forcing_loss(model, *batch, bdlm.mask_token_id)
    assert float(after) < float(before.detach())


def test_bad_arguments_raise(bdlm, ctx):
    m = bdlm.mask_token_id
    with pytest.raises(ValueError, match="block_length"):
        dparallel.record(bdlm.model, ctx, m, 0, 1)
    with pytest.raises(ValueError, match="blocks"):
        dparallel.record(bdlm.model, ctx, m, 4, 0)
    with pytest.raises(ValueError, match="block"):
        dparallel.block_logits(bdlm.model, ctx, ctx[:2, :3])
    full = torch.full((3, 4), m)
    with pytest.raises(ValueError, match="beta"):
        dparallel.certainty_forcing_loss(bdlm.model, ctx, full, ctx[:, :4], m, beta=-1)
    with pytest.raises(ValueError, match="temperature"):
        dparallel.certainty_forcing_loss(bdlm.model, ctx, full, ctx[:, :4], m, temperature=0)
    with pytest.raises(ValueError, match="same shape"):
        dparallel.certainty_forcing_loss(bdlm.model, ctx, full, ctx[:, :3], m)
    with pytest.raises(ValueError, match="no masked"):
        dparallel.certainty_forcing_loss(bdlm.model, ctx, ctx[:, :4], ctx[:, :4], m)


def test_threshold_decoding_of_the_distilled_model_equals_with_and_without_the_cache():
    from refimpl import data

    lm = models.load("tiny-bdlm-dparallel", device="cpu")
    prompts = [p[:n] for p, n in zip(data.kjv_prompts(lm.tokenizer, 3, length=40), (40, 23, 9))]  # ragged
    for threshold in (0.9, 0.5):
        kw = dict(gen_length=16, block_length=8, threshold=threshold, eos_token_id=[])
        cached = block_diffusion.generate(lm, prompts, **kw)
        assert cached.tokens == block_diffusion.generate(lm, prompts, cache=False, **kw).tokens, threshold
    assert cached.stats.nfe < 16, "the distilled model commits more than one token per call at 0.5"


def test_the_trainer_refuses_fewer_than_one_round(tmp_path):
    from refimpl.train.cllm import train_tiny_bdlm_dparallel

    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="rounds"):
            train_tiny_bdlm_dparallel(str(tmp_path), rounds=bad)


def test_context_batches_draw_as_the_loop_they_replace():
    """The trainers' shared context sampler == random_windows called batch by batch, also when the
    caller draws from the same generator between batches (the CLLM's initial guesses)."""
    from refimpl.train.common import context_batches, random_windows

    stream = torch.arange(1000, device="cpu")
    got, g = [], torch.Generator(device="cpu").manual_seed(3)
    for ctx in context_batches(stream, 130, 12, g):  # 130 // 64 = 2 batches
        got.append(ctx)
        got.append(torch.randint(0, 9, (3,), generator=g, device="cpu"))
    want, g = [], torch.Generator(device="cpu").manual_seed(3)
    for _ in range(2):
        want.append(random_windows(stream, 64, 12, g))
        want.append(torch.randint(0, 9, (3,), generator=g, device="cpu"))
    assert len(got) == 4 and all(torch.equal(a, b) for a, b in zip(got, want))
    assert got[0].shape == (64, 12) and not torch.equal(got[0], got[2])
    assert len(list(context_batches(stream, 5, 12, g))) == 1, "fewer contexts than a batch: one batch"
