"""Learn2PD (chapter 15): the filter's training rows == a brute-force replay, its loss == brute-force
binary cross-entropy, training moves it, decoding with the filter keeps the exact block cache, a
filter that never fires is one token per step, bad arguments raise."""
import copy
import math

import pytest
import torch

from refimpl import block_diffusion, dparallel, learn2pd, models
from refimpl.models import drafters

from decoding import kjv_contexts  # tests/decoding.py


@pytest.fixture(scope="module")
def bdlm():
    return models.load("tiny-bdlm-dparallel", device="cpu")


@pytest.fixture(scope="module")
def ctx(bdlm):
    return kjv_contexts(bdlm)


@torch.no_grad()
def brute_rows(bdlm, traj):
    """Per block, step and row: its own forward with an explicit block mask, the features in float64."""
    mask_id = bdlm.mask_token_id
    rows = []
    for k in range(len(traj.final)):
        ctx, final = traj.contexts[k], traj.final[k]
        (B, L), b = ctx.shape, final.shape[1]
        allow = torch.tensor([[c <= q or (q >= L and c >= L) for c in range(L + b)] for q in range(L + b)])
        mask = torch.zeros(1, 1, L + b, L + b).masked_fill(~allow, float("-inf"))
        for r in range(B):
            prev = None
            for s in range(b):
                state = [int(t) if int(o) < s else mask_id for t, o in zip(final[r], traj.order[k][r])]
                out = bdlm.model(input_ids=torch.tensor([ctx[r].tolist() + state]), attention_mask=mask).logits[0]
                conf, gap, same, label, masked, arg = [], [], [], [], [], []
                for i in range(b):
                    lg = out[L - 1 + i].double().clone()
                    lg[mask_id] = -math.inf
                    p = sorted(torch.softmax(lg, -1).tolist(), reverse=True)
                    a = int(lg.argmax())
                    m = state[i] == mask_id
                    conf.append(p[0] if m else 1.0)
                    gap.append(p[0] - p[1] if m else 1.0)
                    same.append((1.0 if prev is not None and prev[i] == a else 0.0) if m else 1.0)
                    label.append(float(a == int(final[r, i])))
                    masked.append(m)
                    arg.append(a)
                prev = arg
                rows.append((k, s, r, conf + gap + same, label, masked))
    return rows


def test_collect_equals_a_brute_force_replay(bdlm, ctx):
    b, nb = 4, 2
    traj = dparallel.record(bdlm.model, ctx, bdlm.mask_token_id, b, nb)
    data = learn2pd.collect(bdlm.model, traj, bdlm.mask_token_id)
    B = ctx.shape[0]
    assert data.feats.shape == (nb * b * B, learn2pd.NUM_FEATURES * b)
    for k, s, r, feats, label, masked in brute_rows(bdlm, traj):
        i = (k * b + s) * B + r  # collect's order: block, step, row
        assert data.feats[i].tolist() == pytest.approx(feats, abs=1e-5)
        assert data.labels[i].tolist() == label
        assert data.masked[i].tolist() == masked
    assert 0 < float(data.labels[data.masked].mean()) < 1, "both labels occur (else the loss test is weak)"


def test_filter_loss_equals_brute_force_bce():
    torch.manual_seed(0)
    filt = learn2pd.Filter(4, hidden=8)
    feats = torch.rand(5, 12)
    labels = (torch.rand(5, 4) > 0.5).float()
    masked = torch.rand(5, 4) > 0.3
    got = learn2pd.filter_loss(filt, feats, labels, masked)
    with torch.no_grad():
        z = filt(feats)
    terms = [-(math.log(1 / (1 + math.exp(-float(z[i, j])))) if labels[i, j] else
               math.log(1 - 1 / (1 + math.exp(-float(z[i, j])))))
             for i in range(5) for j in range(4) if masked[i, j]]
    assert float(got.detach()) == pytest.approx(sum(terms) / len(terms), rel=1e-5)
    with pytest.raises(ValueError, match="masked"):
        learn2pd.filter_loss(filt, feats, labels, torch.zeros_like(masked))


def test_one_step_lowers_the_filter_loss(bdlm, ctx):
    traj = dparallel.record(bdlm.model, ctx, bdlm.mask_token_id, 4, 1)
    data = learn2pd.collect(bdlm.model, traj, bdlm.mask_token_id)
    filt = learn2pd.Filter(4)
    opt = torch.optim.SGD(filt.parameters(), lr=0.5)
    before = learn2pd.filter_loss(filt, data.feats, data.labels, data.masked)
    before.backward()
    opt.step()
    with torch.no_grad():
        after = learn2pd.filter_loss(filt, data.feats, data.labels, data.masked)
    assert float(after) < float(before.detach())


def test_filter_decoding_keeps_the_exact_block_cache(bdlm):
    prompts = [bdlm.encode("And God said, Let there be light: and there was"), bdlm.encode("The LORD is my shepherd")]
    rule = learn2pd.FilterRule(drafters.load(bdlm, "learn2pd"), 0.5)
    on = block_diffusion.generate(bdlm, prompts, gen_length=16, block_length=8, eos_token_id=[], rule=rule)
    off = block_diffusion.generate(bdlm, prompts, gen_length=16, block_length=8, eos_token_id=[], rule=rule, cache=False)
    assert on.tokens == off.tokens and on.stats.nfe == off.stats.nfe
    assert on.stats.nfe < 16, "the trained filter commits several tokens in some call"
    for p, row in zip(prompts, on.tokens):  # batch == one row at a time (ragged prompts)
        assert block_diffusion.generate(bdlm, [p], gen_length=16, block_length=8, eos_token_id=[],
                                        rule=rule).tokens == [row]


def test_a_filter_that_never_fires_is_one_token_per_step(bdlm, ctx):
    filt = learn2pd.Filter(4)
    with torch.no_grad():
        filt.net[-1].bias.fill_(-50.0)
        filt.net[-1].weight.zero_()
    prompts = ctx.tolist()
    got = block_diffusion.generate(bdlm, prompts, gen_length=8, block_length=4, eos_token_id=[],
                                   rule=learn2pd.FilterRule(filt, 0.5))
    want = block_diffusion.generate(bdlm, prompts, gen_length=8, block_length=4, eos_token_id=[])
    assert got.tokens == want.tokens and got.stats.nfe == want.stats.nfe == 8


def test_save_and_load_round_trip(bdlm, tmp_path):
    filt = learn2pd.Filter(4, hidden=6)
    drafters.save(filt, str(tmp_path), bdlm)
    back = drafters.load(bdlm, "learn2pd", str(tmp_path))
    x = torch.rand(2, 12)
    assert torch.equal(back(x), filt(x).detach())


def test_bad_arguments_raise(bdlm, ctx):
    filt = learn2pd.Filter(4)
    with pytest.raises(ValueError, match="block_length"):
        learn2pd.Filter(0)
    with pytest.raises(ValueError, match="feats"):
        filt(torch.rand(2, 8))
    with pytest.raises(ValueError, match="cutoff"):
        learn2pd.FilterRule(filt, 1.0)
    with pytest.raises(ValueError, match="filt"):
        learn2pd.FilterRule(copy.deepcopy(filt.net), 0.5)
    with pytest.raises(ValueError, match="block_length"):  # a filter for blocks of 4 on blocks of 8
        block_diffusion.generate(bdlm, ctx.tolist(), gen_length=8, block_length=8, eos_token_id=[],
                                 rule=learn2pd.FilterRule(filt, 0.5))
    with pytest.raises(ValueError, match="rule"):
        block_diffusion.generate(bdlm, ctx.tolist(), gen_length=8, block_length=4, eos_token_id=[],
                                 rule=learn2pd.FilterRule(filt, 0.5), threshold=0.9)
    with pytest.raises(ValueError, match="rule committed no"):
        block_diffusion.generate(bdlm, ctx.tolist(), gen_length=8, block_length=4, eos_token_id=[],
                                 rule=lambda pred, masked, step: (pred.argmax(-1), torch.zeros_like(masked)))


def test_oracle_commits_exactly_the_predictions_that_equal_the_final_text():
    g = torch.Generator(device="cpu").manual_seed(0)
    B, b, V = 3, 4, 6
    final = torch.randint(0, V, (B, 3 * b), generator=g, device="cpu")
    rule = learn2pd.OracleRule(final.tolist())
    for block, step in ((0, 0), (0, 1), (1, 0), (1, 1), (1, 2), (2, 0)):
        pred = torch.randn(B, b, V, generator=g, device="cpu")
        masked = torch.rand(B, b, generator=g, device="cpu") < 0.7
        masked[:, 0] = True
        x0, sel = rule(pred, masked, step)
        for r in range(B):
            probs = torch.softmax(pred[r].double(), -1)
            best = max((i for i in range(b) if masked[r, i]), key=lambda i: float(probs[i].max()))
            for i in range(b):
                want = bool(masked[r, i]) and (int(pred[r, i].argmax()) == int(final[r, block * b + i]) or i == best)
                assert bool(sel[r, i]) == want, (block, step, r, i)
                assert int(x0[r, i]) == int(pred[r, i].argmax())


def test_oracle_needs_fewer_calls_and_an_unreachable_final_is_one_token_per_step(bdlm, ctx):
    prompts = ctx.tolist()
    one = block_diffusion.generate(bdlm, prompts, gen_length=16, block_length=8, eos_token_id=[])
    got = learn2pd.oracle_generate(block_diffusion.generate, bdlm, prompts, 16, 8)  # one token per step, then the oracle on that text
    assert got.tokens == block_diffusion.generate(bdlm, prompts, gen_length=16, block_length=8, eos_token_id=[],
                                                  rule=learn2pd.OracleRule(one.tokens)).tokens
    assert got.stats.nfe < one.stats.nfe
    # control: a final text the model never predicts (MASK) leaves only the most confident commit per step
    never = learn2pd.OracleRule(torch.full((len(prompts), 16), bdlm.mask_token_id, device="cpu"))
    same = block_diffusion.generate(bdlm, prompts, gen_length=16, block_length=8, eos_token_id=[], rule=never)
    assert same.tokens == one.tokens and same.stats.nfe == one.stats.nfe == 16
    with pytest.raises(ValueError, match="final"):
        learn2pd.OracleRule([1, 2, 3])
    with pytest.raises(ValueError, match="final"):  # 8 tokens per row for 16 new tokens
        block_diffusion.generate(bdlm, prompts, gen_length=16, block_length=8, eos_token_id=[],
                                 rule=learn2pd.OracleRule(torch.zeros(len(prompts), 8, dtype=torch.long, device="cpu")))
