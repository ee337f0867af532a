"""CLLMs (chapter 15): trajectories == a step-by-step replay, the losses == brute force, training
moves them, and Jacobi / lookahead on the fine-tuned model stay exact for its own greedy output."""
import copy
import math

import pytest
import torch

from refimpl import autoregressive, cllm


@pytest.fixture(scope="module")
def ctx(tiny):
    """Three equal-length contexts (B, L) of tiny's tokens."""
    texts = ["And God said, Let there be light", "In the beginning God created the", "The LORD is my shepherd; I"]
    ids = [tiny.encode(t) for t in texts]
    L = min(len(i) for i in ids)
    return torch.tensor([i[:L] for i in ids])


def test_trajectory_equals_a_step_by_step_replay_and_ends_at_greedy(tiny, ctx):
    gen = torch.Generator(device="cpu").manual_seed(0)
    n = 6
    init = cllm.context_guesses(ctx, n, gen)
    states = cllm.jacobi_trajectory(tiny.model, ctx, init)  # (S, B, n)
    assert states.shape[1:] == (3, n) and 1 <= states.shape[0] <= n + 1
    for b in range(3):  # replay: one call per position, per iteration, per row
        y = init[b].tolist()
        for j in range(1, states.shape[0]):
            y = [int(tiny.logits(torch.tensor([ctx[b].tolist() + y[:i]]))[0, -1].argmax()) for i in range(n)]
            assert y == states[j, b].tolist(), (b, j)
    greedy = autoregressive.generate(tiny, ctx.tolist(), max_new_tokens=n, eos_token_id=[]).tokens
    assert states[-1].tolist() == greedy, "the fixed point is the greedy continuation"
    later = cllm.jacobi_trajectory(tiny.model, ctx, states[-1])
    assert later.shape[0] == 1, "the fixed point does not move"


def brute_kl_sum(tiny, ctx, state, target, teacher_model, horizon=None):
    total = 0.0
    for b in range(ctx.shape[0]):
        wrong = [i for i in range(state.shape[1]) if state[b, i] != target[b, i]]
        first = wrong[0] if wrong else state.shape[1]
        for i in range(state.shape[1]):
            if horizon is not None and i > first + horizon:
                continue  # its context holds more than `horizon` state tokens from the first wrong one on
            t = torch.tensor([ctx[b].tolist() + target[b, :i].tolist()])
            s = torch.tensor([ctx[b].tolist() + state[b, :i].tolist()])
            p = torch.softmax(teacher_model(input_ids=t).logits[0, -1].double(), -1)
            q = torch.softmax(tiny.model(input_ids=s).logits[0, -1].double(), -1)
            total += float(sum(pi * (math.log(pi) - math.log(qi)) for pi, qi in zip(p.tolist(), q.tolist()) if pi > 0))
    return total / ctx.shape[0]


def test_consistency_and_ar_losses_equal_brute_force(tiny, ctx):
    gen = torch.Generator(device="cpu").manual_seed(1)
    n = 4
    states = cllm.jacobi_trajectory(tiny.model, ctx, cllm.context_guesses(ctx, n, gen))
    state, fixed = states[0], states[-1]
    with torch.no_grad():
        got = float(cllm.consistency_loss(tiny.model, ctx, state, fixed))
    assert got == pytest.approx(brute_kl_sum(tiny, ctx, state, fixed, tiny.model), rel=1e-4)
    assert got > 0.01, "a random state is not the fixed point"
    with torch.no_grad():
        assert float(cllm.consistency_loss(tiny.model, ctx, fixed, fixed)) == pytest.approx(0.0, abs=1e-6)
    nll = 0.0  # AR loss: mean over the block's tokens of -log p(token | context, earlier tokens)
    for b in range(3):
        for i in range(n):
            logits = tiny.logits(torch.tensor([ctx[b].tolist() + fixed[b, :i].tolist()]))[0, -1].double()
            nll -= float(torch.log_softmax(logits, -1)[fixed[b, i]])
    with torch.no_grad():
        assert float(cllm.ar_loss(tiny.model, ctx, fixed)) == pytest.approx(nll / (3 * n), rel=1e-4)


def test_the_frontier_loss_keeps_the_positions_near_the_first_wrong_token(tiny, ctx):
    gen = torch.Generator(device="cpu").manual_seed(4)
    n = 6
    states = cllm.jacobi_trajectory(tiny.model, ctx, cllm.context_guesses(ctx, n, gen))
    state, fixed = states[min(1, states.shape[0] - 1)], states[-1]
    state = state.clone()
    state[0, 2] = (fixed[0, 2] + 1) % 4096  # row 0: first wrong token at 2 whatever the trajectory did
    state[0, :2] = fixed[0, :2]
    keep = cllm.frontier_mask(state, fixed, 1)
    assert keep[0].tolist() == [True, True, True, True, False, False]
    assert cllm.frontier_mask(fixed, fixed, 0).all(), "a converged state keeps every position"
    for h in (0, 2):
        with torch.no_grad():
            got = float(cllm.consistency_loss(tiny.model, ctx, state, fixed, horizon=h))
        assert got == pytest.approx(brute_kl_sum(tiny, ctx, state, fixed, tiny.model, horizon=h), rel=1e-4, abs=1e-7)
    with torch.no_grad():
        full = float(cllm.consistency_loss(tiny.model, ctx, state, fixed))
        assert float(cllm.consistency_loss(tiny.model, ctx, state, fixed, horizon=n)) == pytest.approx(full, rel=1e-6)
        assert float(cllm.consistency_loss(tiny.model, ctx, state, fixed, horizon=0)) < full


def test_the_upstream_recipe_equals_brute_force(tiny, ctx):
    """Consistency_LLM's recipe: the KL only from the first wrong token on, averaged per token over the
    batch; the AR loss label-smoothed (0.1) over every token of [context ; fixed point]."""
    gen = torch.Generator(device="cpu").manual_seed(4)
    n = 6
    states = cllm.jacobi_trajectory(tiny.model, ctx, cllm.context_guesses(ctx, n, gen))
    fixed = states[-1]
    state = states[0].clone()
    state[0, :2] = fixed[0, :2]
    state[0, 2] = (fixed[0, 2] + 1) % 4096  # row 0: the first wrong token at 2
    state[1] = fixed[1]  # row 1: converged, nothing to learn
    assert cllm.unconverged_mask(state, fixed)[0].tolist() == [False, False, True, True, True, True]
    assert not cllm.unconverged_mask(state, fixed)[1].any()
    other = copy.deepcopy(tiny.model)
    with torch.no_grad():
        other.lm_head.weight.mul_(1.5)  # a teacher that differs from the student: the prefix would count
    total, count = 0.0, 0
    for b in range(3):
        wrong = [i for i in range(n) if state[b, i] != fixed[b, i]]
        for i in range(wrong[0] if wrong else n, n):
            t = torch.tensor([ctx[b].tolist() + fixed[b, :i].tolist()])
            s = torch.tensor([ctx[b].tolist() + state[b, :i].tolist()])
            p = torch.softmax(other(input_ids=t).logits[0, -1].detach().double(), -1)
            q = torch.softmax(tiny.model(input_ids=s).logits[0, -1].detach().double(), -1)
            total += float((p * (p.log() - q.log())).sum())
            count += 1
    with torch.no_grad():
        got = float(cllm.upstream_consistency_loss(tiny.model, ctx, state, fixed, teacher=other))
        ours = float(cllm.consistency_loss(tiny.model, ctx, state, fixed, teacher=other))
    assert got == pytest.approx(total / count, rel=1e-4)
    assert ours != pytest.approx(got, rel=1e-2)  # the sum over the block, prefix included, differs
    with torch.no_grad():
        assert float(cllm.upstream_consistency_loss(tiny.model, ctx, fixed, fixed)) == 0.0
    V, eps, nll, m = tiny.config.vocab_size, 0.1, 0.0, 0
    for b in range(3):
        seq = ctx[b].tolist() + fixed[b].tolist()
        logp = torch.log_softmax(tiny.logits(torch.tensor([seq]))[0].double(), -1)
        for i in range(1, len(seq)):
            nll -= (1 - eps) * float(logp[i - 1, seq[i]]) + eps * float(logp[i - 1].mean())
            m += 1
    with torch.no_grad():
        assert float(cllm.sequence_ar_loss(tiny.model, ctx, fixed)) == pytest.approx(nll / m, rel=1e-4)
        loss, parts = cllm.cllm_loss(tiny.model, (ctx, state, fixed, fixed), 10.0, other, recipe="upstream")
    assert float(loss) == pytest.approx(total / count + 10 * nll / m, rel=1e-4)
    with pytest.raises(ValueError, match="recipe"):
        cllm.cllm_loss(tiny.model, (ctx, state, fixed, fixed), recipe="paper")
    with pytest.raises(ValueError, match="horizon"):
        cllm.cllm_loss(tiny.model, (ctx, state, fixed, fixed), horizon=1, recipe="upstream")


def test_a_frozen_teacher_and_the_local_target(tiny, ctx):
    import copy

    gen = torch.Generator(device="cpu").manual_seed(2)
    other = copy.deepcopy(tiny.model)
    with torch.no_grad():
        other.lm_head.weight.mul_(1.5)  # a different teacher: the loss must read it, not the student
    states = cllm.jacobi_trajectory(tiny.model, ctx, cllm.context_guesses(ctx, 3, gen))
    with torch.no_grad():
        got = float(cllm.consistency_loss(tiny.model, ctx, states[0], states[-1], teacher=other))
    assert got == pytest.approx(brute_kl_sum(tiny, ctx, states[0], states[-1], other), rel=1e-4)
    traj = cllm.Trajectories([ctx], [states])
    c, y, nxt, fx = traj.sample(torch.Generator(device="cpu").manual_seed(0), local=True)
    for b in range(3):
        j = next(j for j in range(states.shape[0]) if torch.equal(states[j, b], y[b]))
        assert torch.equal(nxt[b], states[min(j + 1, states.shape[0] - 1), b]) and torch.equal(fx[b], states[-1, b])


def test_on_policy_contexts_follow_the_students_greedy_text(tiny, ctx):
    from refimpl.lm import LM

    student = copy.deepcopy(tiny.model)
    with torch.no_grad():
        student.model.norm.weight.mul_(torch.linspace(0.2, 3.0, student.model.norm.weight.numel()))
    as_lm = LM(student, tiny.tokenizer, name="student")
    n, blocks = 4, 3
    on = cllm.collect(tiny.model, ctx, n, blocks, torch.Generator(device="cpu").manual_seed(5), student=student)
    off = cllm.collect(tiny.model, ctx, n, blocks, torch.Generator(device="cpu").manual_seed(5))
    assert torch.equal(on.states[0], off.states[0]), "the first block's context is the same: so is its trajectory"
    own = autoregressive.generate(as_lm, ctx.tolist(), max_new_tokens=n * blocks, eos_token_id=[]).tokens
    teacher = autoregressive.generate(tiny, ctx.tolist(), max_new_tokens=n * blocks, eos_token_id=[]).tokens
    assert own != teacher, "the student must write another text, or this test checks nothing"
    for b in range(blocks):  # contexts: the student's greedy text; trajectories: the teacher's, ending at its greedy
        assert on.contexts[b].tolist() == [c + o[:n * b] for c, o in zip(ctx.tolist(), own)]
        greedy = autoregressive.generate(tiny, on.contexts[b].tolist(), max_new_tokens=n, eos_token_id=[]).tokens
        assert on.states[b][-1].tolist() == greedy
    assert any(not torch.equal(a, b) for a, b in zip(on.contexts[1:], off.contexts[1:]))


def test_one_step_lowers_the_loss_on_its_batch(tiny, ctx):
    import copy

    model = copy.deepcopy(tiny.model).train()
    gen = torch.Generator(device="cpu").manual_seed(3)
    traj = cllm.collect(model, ctx, 5, 2, gen)
    assert len(traj.states) == 2 and torch.equal(traj.contexts[1], torch.cat([ctx, traj.states[0][-1]], 1))
    batch = traj.sample(gen)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    before, parts = cllm.cllm_loss(model, batch, ar_weight=1.0)
    assert set(parts) == {"consistency", "ar"}
    before.backward()
    opt.step()
    with torch.no_grad():
        after, _ = cllm.cllm_loss(model, batch, ar_weight=1.0)
    assert float(after) < float(before.detach())


def test_bad_arguments_raise(tiny, ctx):
    gen = torch.Generator(device="cpu").manual_seed(0)
    with pytest.raises(ValueError, match="init"):
        cllm.jacobi_trajectory(tiny.model, ctx, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="n"):
        cllm.collect(tiny.model, ctx, 0, 1, gen)
    with pytest.raises(ValueError, match="blocks"):
        cllm.collect(tiny.model, ctx, 3, 0, gen)
    with pytest.raises(ValueError, match="target"):
        cllm.consistency_loss(tiny.model, ctx, ctx[:, :3], ctx[:, :2])
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="horizon"):
            cllm.consistency_loss(tiny.model, ctx, ctx[:, :3], ctx[:, :3], horizon=bad)
    with pytest.raises(ValueError, match="ar_weight"):
        cllm.cllm_loss(tiny.model, (ctx, ctx[:, :3], ctx[:, :3], ctx[:, :3]), ar_weight=-1.0)


@pytest.mark.parametrize("name", ["tiny-cllm", "tiny-cllm-onpolicy"])
def test_jacobi_and_lookahead_on_the_cllms_equal_their_own_greedy(name):
    """A fine-tuned model is a different model; the verification core keeps every parallel decoder
    exact with respect to *its* greedy output (ragged batch, held-out prompts, EOS allowed)."""
    from refimpl import data, jacobi, lookahead, models

    lm = models.load(name, device="cpu")
    prompts = [p[:n] for p, n in zip(data.kjv_prompts(lm.tokenizer, 3, length=40), (40, 23, 9))]  # ragged
    ar = autoregressive.generate(lm, prompts, max_new_tokens=40).tokens
    for window in (4, 16):
        for init in jacobi.INITS:
            assert jacobi.generate(lm, prompts, max_new_tokens=40, window=window, init=init).tokens == ar, (window, init)
    assert lookahead.generate(lm, prompts, max_new_tokens=40).tokens == ar
    one = jacobi.generate(lm, [prompts[1]], max_new_tokens=40, window=16)
    assert one.tokens == [ar[1]] and one.stats.tau > 1.0


def test_interpolate_mixes_the_weights_and_its_ends_are_the_two_models(tiny):
    """WiSE-FT weights == base + alpha (tuned - base) by hand, parameter by parameter; alpha 0 / 1 give
    the two models' logits; the mix decodes exactly (its own greedy) on the fast paths too."""
    from refimpl import data, jacobi, models

    tuned = models.load("tiny-cllm", device="cpu", prepack=False)
    ids = torch.tensor([tiny.encode("And God said, Let there be light")])
    for alpha, lm in ((0, tiny), (1, tuned)):
        mixed = cllm.interpolate(tiny, tuned, alpha)
        assert torch.allclose(mixed.logits(ids), lm.logits(ids), atol=1e-5), alpha
    mixed = cllm.interpolate(tiny, tuned, 0.3)
    b, t = dict(tiny.model.named_parameters()), dict(tuned.model.named_parameters())
    for name, p in mixed.model.named_parameters():
        want = b[name] + 0.3 * (t[name] - b[name])
        assert torch.allclose(p, want, atol=1e-6), name
        assert not torch.equal(p, t[name]) or torch.equal(b[name], t[name]), name  # really mixed
    assert not any(p is q for p, q in zip(mixed.model.parameters(), tuned.model.parameters()))  # a copy
    prompts = data.kjv_prompts(tiny.tokenizer, 2, length=24)
    ar = autoregressive.generate(mixed, prompts, max_new_tokens=24, eos_token_id=[]).tokens
    fast = models.accelerate(cllm.interpolate(tiny, tuned, 0.3), prepack=True)
    assert jacobi.generate(fast, prompts, max_new_tokens=24, window=4, init="lookup", eos_token_id=[]).tokens == ar


def test_interpolate_bad_arguments_raise(tiny):
    from refimpl import models
    from refimpl.lm import LM

    tuned = models.load("tiny-cllm", device="cpu", prepack=False)
    for bad in (-0.1, 1.5, float("nan"), True, "0.5"):
        with pytest.raises(ValueError, match="alpha"):
            cllm.interpolate(tiny, tuned, bad)
    with pytest.raises(ValueError, match="base"):  # a LeanLM (fast path): its packed weights would go stale
        cllm.interpolate(models.load("tiny", device="cpu", fast=True), tuned, 0.5)
    two = copy.deepcopy(tuned.model)
    two.model.layers = two.model.layers[:2]
    with pytest.raises(ValueError, match="same parameter names"):
        cllm.interpolate(tiny, LM(two, tuned.tokenizer, name="two layers"), 0.5)
