"""block_diffusion (tiny adapted into a block-diffusion LM, Fast-dLLM v2 style): the training mask
against a brute-force construction, the loss's block causality (no information flows from later
blocks or from the noisy copies into the clean stream), the exact block KV cache (cached decoding ==
uncached decoding token for token, ragged batches included), and bad input."""
import pytest
import torch

from refimpl import block_diffusion as bd
from refimpl import models

TEXTS = ["And God said", "In the beginning was the Word, and the Word was", "Jesus wept.", "The LORD is my shepherd"]


@pytest.fixture(scope="module")
def bdlm():
    return models.load("tiny-bdlm", device="cpu")


@pytest.fixture(scope="module")
def prompts(bdlm):
    return [bdlm.encode(t) for t in TEXTS]


def brute_allow(blk):
    """The training row [x_t ; x_t' ; x0] by its definition, one pair at a time."""
    T = len(blk)
    allow = torch.zeros(3 * T, 3 * T, dtype=torch.bool)
    for i in range(3 * T):
        ci, pi = divmod(i, T)
        for j in range(3 * T):
            cj, pj = divmod(j, T)
            if ci == 2:  # the clean stream: causal, clean only
                allow[i, j] = cj == 2 and pj <= pi
            elif cj == 2:  # a noisy copy sees the clean tokens of earlier blocks
                allow[i, j] = blk[pj] < blk[pi]
            else:  # and its own copy's tokens of its block
                allow[i, j] = cj == ci and blk[pj] == blk[pi]
    return allow


@pytest.mark.parametrize("size,offset,T", [(4, 0, 12), (3, 2, 10), (5, 4, 9), (16, 7, 11), (2, 1, 7)])
def test_training_mask_equals_brute_force(size, offset, T):
    blk = bd.block_ids(T, torch.tensor([size]), torch.tensor([offset]))
    assert torch.equal(bd.training_allow(blk)[0], brute_allow(blk[0].tolist()))


def test_block_ids():
    assert bd.block_ids(7, torch.tensor([3]), torch.tensor([1])).tolist() == [[0, 0, 1, 1, 1, 2, 2]]


def test_loss_is_block_causal(bdlm):
    """In one training forward: the clean stream ignores the noisy copies, and a noisy block ignores
    every later block (clean or noisy) -- what makes the block cache exact."""
    torch.manual_seed(0)
    T = 12
    x0 = torch.randint(3, 4000, (1, T))
    blk = bd.block_ids(T, torch.tensor([4]), torch.tensor([0]))
    attn = bd.additive(bd.training_allow(blk))
    pos = torch.arange(T).repeat(3)[None]

    def run(ids):
        with torch.no_grad():
            return bdlm.model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[0]

    noisy = torch.where(torch.rand(1, T) < 0.5, torch.full_like(x0, 2), x0)
    base = run(torch.cat([noisy, noisy, x0], 1))
    changed = noisy.clone()
    changed[0, :8] = 2  # every noisy token of blocks 0 and 1 replaced
    other = run(torch.cat([changed, changed, x0], 1))
    assert torch.allclose(base[2 * T:], other[2 * T:], atol=1e-5), "the clean stream must not see the noisy copies"
    assert not torch.allclose(base[:4], other[:4], atol=1e-3), "the control: block 0 sees its own noisy tokens"
    later = x0.clone()
    later[0, 8:] = (later[0, 8:] + 1) % 4000  # the clean tokens of the last block
    noisy2 = noisy.clone()
    noisy2[0, 8:] = 2
    third = run(torch.cat([noisy2, noisy2, later], 1))
    assert torch.allclose(base[:8], third[:8], atol=1e-5), "blocks 0-1 must not see block 2 (clean or noisy)"
    assert torch.allclose(base[2 * T: 2 * T + 8], third[2 * T: 2 * T + 8], atol=1e-5)


def test_one_training_step_changes_the_model_and_only_its_parameters(bdlm):
    """One SGD step on the loss moves every trainable tensor (the MASK embedding included: it is an
    input) and leaves the buffers (rotary frequencies) alone; the loss is finite and has both parts."""
    import copy

    model = copy.deepcopy(bdlm.model).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    x0 = torch.randint(3, 4000, (2, 32), generator=gen)
    loss, parts = bd.block_diffusion_loss(model, x0, bdlm.mask_token_id, generator=gen)
    assert torch.isfinite(loss) and parts["masked_ce"] > 0 and parts["ar_ce"] > 0
    loss.backward()
    assert model.model.embed_tokens.weight.grad[bdlm.mask_token_id].abs().sum() > 0
    torch.optim.SGD(model.parameters(), lr=1e-2).step()
    params = {p.data_ptr() for p in model.parameters()}  # the tied LM head is the embedding
    for k, v in model.state_dict().items():
        if v.data_ptr() in params:
            assert not torch.equal(v, before[k]), f"{k} did not move"
        else:
            assert torch.equal(v, before[k]), f"buffer {k} changed"


SETTINGS = [dict(), dict(steps=8), dict(threshold=0.9), dict(threshold=0.5), dict(factor=1.0),
            dict(temperature=0.8, generator=0)]


@pytest.mark.parametrize("kw", SETTINGS, ids=[str(s) for s in SETTINGS])
@pytest.mark.parametrize("block_length", [4, 8])
def test_block_cache_equals_no_cache(bdlm, prompts, kw, block_length):
    def run(cache):
        k = dict(kw)
        if "generator" in k:
            k["generator"] = torch.Generator().manual_seed(k["generator"])
        return bd.generate(bdlm, prompts, gen_length=16, block_length=block_length, cache=cache, eos_token_id=[], **k)

    a, b = run(True), run(False)
    assert a.tokens == b.tokens
    assert a.stats.nfe == b.stats.nfe
    assert all(len(t) == 16 for t in a.tokens)
    if "generator" not in kw:  # a ragged batch decodes each row as it would alone
        for i, p in enumerate(prompts):
            one = bd.generate(bdlm, [p], gen_length=16, block_length=block_length, eos_token_id=[], **kw)
            assert one.tokens[0] == a.tokens[i]


def test_one_token_per_step_costs_gen_length_calls_and_threshold_fewer(bdlm, prompts):
    one = bd.generate(bdlm, prompts, gen_length=16, block_length=8, eos_token_id=[])
    assert one.stats.nfe == 16 and all(c == [1] * len(prompts) for c in one.stats.extra["committed"])
    par = bd.generate(bdlm, prompts, gen_length=16, block_length=8, threshold=0.9, eos_token_id=[])
    assert par.stats.nfe <= 16
    assert sum(sum(c) for c in par.stats.extra["committed"]) == 16 * len(prompts)


def test_first_token_of_a_block_is_the_ar_prediction(bdlm, prompts):
    """The shift: the first token of the first block is the clean stream's next token, i.e. the
    adapted model's own AR greedy token."""
    g = bd.generate(bdlm, prompts, gen_length=8, block_length=8, eos_token_id=[])
    for p, t in zip(prompts, g.tokens):
        logits = bdlm.logits(torch.tensor([p]))[0, -1]
        logits[bdlm.mask_token_id] = float("-inf")
        assert t[0] == int(logits.argmax())


def test_eos_stops_and_truncates(bdlm, prompts):
    free = bd.generate(bdlm, prompts, gen_length=16, block_length=4, eos_token_id=[])
    tok = free.tokens[0][5]
    g = bd.generate(bdlm, prompts, gen_length=16, block_length=4, eos_token_id=tok)
    for row, full in zip(g.tokens, free.tokens):
        assert row == (full[: full.index(tok) + 1] if tok in full else full)


@pytest.mark.parametrize("kw,name", [
    (dict(gen_length=10, block_length=4), "block_length"), (dict(gen_length=0), "gen_length"),
    (dict(steps=3, gen_length=16, block_length=8), "steps"), (dict(threshold=1.5), "threshold"),
    (dict(factor=-1.0), "factor"), (dict(threshold=0.9, factor=1.0), "threshold"),
    (dict(temperature=-1.0), "temperature"), (dict(cache="prefix"), "cache"), (dict(remasking="x"), "remasking"),
])
def test_bad_arguments_name_the_argument(bdlm, prompts, kw, name):
    with pytest.raises(ValueError, match=name):
        bd.generate(bdlm, prompts, **kw)


def test_mask_inside_a_prompt_is_refused(bdlm, prompts):
    with pytest.raises(ValueError, match="prompts"):
        bd.generate(bdlm, [prompts[0] + [bdlm.mask_token_id]])


def test_a_model_without_mask_is_refused(tiny):
    class NoMask:
        mask_token_id = None
        max_length, eos_token_id = 512, 0

    with pytest.raises(ValueError, match="model"):
        bd.generate(NoMask(), [[5, 6]])
