"""refimpl.medusa: Medusa-1 heads as a tree proposer on the verification core.

Greedy == AR greedy (trained and random heads, several trees, ragged batches, EOS and
max_new_tokens inside an accepted path); the heads read the hidden state of the last accepted
token (checked against a fresh forward: a wrong index would still decode exactly, only worse);
lossless sampling passes the chi-square on the first two tokens while typical acceptance (lossy)
fails it; choose_tree is optimal among all trees of its size (brute force); saved heads reload
under Medusa's key names; bad arguments raise ValueError naming them."""
import itertools
import math

import pytest
import torch

from refimpl import medusa
from refimpl.models import drafters
from decoding import first_accepted_draft  # tests/decoding.py
from first_two import exact_first_two, first_two_pvalue  # tests/first_two.py

pytestmark = pytest.mark.usefixtures("torch_kernels")

N = 20  # = spec_ar_free's length
TREES = [[(0,)], [(0,), (1,), (0, 0)], [(0,), (1,), (2,), (0, 0), (1, 0), (0, 0, 0), (0, 0, 0, 0)],
         [(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)]]


@pytest.fixture(scope="module")
def heads(tiny):
    return drafters.load(tiny, "medusa")


@pytest.fixture(scope="module")
def random_heads(tiny):
    torch.manual_seed(0)
    h = medusa.MedusaHeads(tiny.model.get_output_embeddings().weight.detach(), 4)
    for b in h.blocks:
        torch.nn.init.normal_(b.weight, std=0.05)
    return h


@pytest.mark.parametrize("choices", TREES)
def test_greedy_equals_ar(tiny, heads, random_heads, spec_prompts, spec_ar_free, choices):
    for hd in (heads, random_heads):
        g = medusa.generate(tiny, spec_prompts, heads=hd, choices=choices, max_new_tokens=N, eos_token_id=[])
        assert g.tokens == spec_ar_free
    one = medusa.generate(tiny, [spec_prompts[0]], heads=heads, choices=choices, max_new_tokens=N, eos_token_id=[])
    assert one.tokens[0] == spec_ar_free[0]
    assert one.stats.tau > 1.0  # the trained heads get drafts accepted on the refrain


def test_default_tree_from_measured_accuracy(tiny, heads, spec_prompts, spec_ar_free):
    g = medusa.generate(tiny, spec_prompts, heads=heads, max_new_tokens=N, eos_token_id=[])  # choices=None
    assert g.tokens == spec_ar_free and g.stats.tau > 1.3


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_max_new_tokens_inside_a_path(tiny, heads, spec_prompts, spec_ar_free, n):
    g = medusa.generate(tiny, spec_prompts, heads=heads, choices=TREES[2], max_new_tokens=n, eos_token_id=[])
    assert g.tokens == [t[:n] for t in spec_ar_free]


def test_eos_inside_an_accepted_path(tiny, heads, spec_prompts, spec_ar_free):
    free = medusa.generate(tiny, spec_prompts, heads=heads, choices=TREES[3], max_new_tokens=N, eos_token_id=[])
    found = first_accepted_draft(free, None)
    assert found is not None
    row, eos, pos = found
    g = medusa.generate(tiny, spec_prompts, heads=heads, choices=TREES[3], max_new_tokens=N, eos_token_id=eos)
    assert g.tokens[row] == spec_ar_free[row][: pos + 1]
    assert g.tokens == [t[: t.index(eos) + 1] if eos in t else t for t in spec_ar_free]


class Spy(medusa.MedusaHeads):
    """Records every hidden state the proposer hands to the heads."""

    def top(self, h, k):
        self.seen.append(h.clone())
        return super().top(h, k)


def test_heads_read_the_last_accepted_tokens_hidden_state(tiny, heads, spec_prompts):
    spy = Spy(heads.lm_head, heads.num_heads)
    spy.load_state_dict(heads.state_dict())
    spy.seen = []
    prompt = spec_prompts[0]
    g = medusa.generate(tiny, [prompt], heads=spy, choices=TREES[2], max_new_tokens=N, eos_token_id=[])
    assert max(g.stats.accepted[i][0] for i in range(len(g.stats.accepted))) >= 1
    seq = prompt + g.tokens[0]
    _, _, hid = tiny.forward(torch.tensor([seq]), output_hidden_states=True)
    done = 0  # tokens emitted before the step that proposed
    for step, h in enumerate(spy.seen):
        done += g.stats.accepted[step][0] + 1  # the previous step's accepted drafts + the target's token
        # the heads see the state after the last accepted token, which predicted the newest one
        assert torch.allclose(h[0], hid[0, len(prompt) + done - 2], atol=1e-4), f"step {step}"


TOP_K, TEMP, SAMPLES = 5, 1.0, 1500


def test_lossless_sampling_passes_and_typical_acceptance_fails(tiny, heads):
    prompt = tiny.encode("And the")
    exact = exact_first_two(tiny, prompt, TEMP, TOP_K)

    def pvalue(acceptance):
        g = medusa.generate(tiny, [prompt] * SAMPLES, heads=heads, choices=TREES[2], acceptance=acceptance,
                            max_new_tokens=3, temperature=TEMP, top_k=TOP_K,
                            generator=torch.Generator().manual_seed(3), eos_token_id=[])
        return first_two_pvalue(g.tokens, exact), g

    good, g = pvalue("lossless")
    assert g.stats.tau > 1.0
    assert good > 1e-3
    assert pvalue("typical")[0] < 1e-6  # lossy: the negative control


def test_choose_tree_is_optimal_among_all_trees_of_its_size():
    acc = [[0.5, 0.2, 0.1], [0.4, 0.3, 0.05]]
    nodes = [(i,) for i in range(3)] + [(i, j) for i in range(3) for j in range(3)]
    for size in (1, 2, 4, 6):
        best = max(medusa.expected_length(acc, s) for s in itertools.combinations(nodes, size)
                   if all(len(c) == 1 or c[:-1] in s for c in s))
        got = medusa.choose_tree(acc, size)
        assert len(got) == size and math.isclose(medusa.expected_length(acc, got), best)


def test_save_and_load_round_trip(tiny, heads, tmp_path):
    drafters.save(heads, str(tmp_path), tiny)
    from safetensors.torch import load_file

    keys = set(load_file(str(tmp_path / "medusa.safetensors")))
    assert {f"medusa_head.{k}.0.linear.{w}" for k in range(heads.num_heads) for w in ("weight", "bias")} <= keys
    again = drafters.load(tiny, "medusa", str(tmp_path))
    h = torch.randn(3, tiny.config.hidden_size)
    assert torch.allclose(again(h), heads(h), atol=1e-2)  # (stored in fp16)
    assert again.accuracy == heads.accuracy


def test_untrained_heads_predict_what_the_target_predicts(tiny):
    h = torch.randn(2, tiny.config.hidden_size)
    fresh = medusa.MedusaHeads(tiny.model.get_output_embeddings().weight.detach(), 3)
    assert torch.equal(fresh.top(h, 4)[:, 0], fresh.top(h, 4)[:, 2])  # identity blocks: every head = the LM head


@pytest.mark.parametrize("kw,name", [({"acceptance": "fast"}, "acceptance"), ({"choices": []}, "choices"),
                                     ({"choices": [(0, 0)]}, "choices"), ({"choices": [(0,) * 5]}, "choices"),
                                     ({"choices": [(-1,)]}, "choices"), ({"choices": "ab"}, "choices"),
                                     ({"tree_size": 0}, "size"), ({"max_new_tokens": 0}, "max_new_tokens")])
def test_bad_arguments(tiny, heads, spec_prompts, kw, name):
    with pytest.raises(ValueError, match=name):
        medusa.generate(tiny, spec_prompts, heads=heads, **kw)


def test_heads_of_another_hidden_size(tiny, spec_prompts):
    with pytest.raises(ValueError, match="hidden size"):
        medusa.generate(tiny, spec_prompts, heads=medusa.MedusaHeads(torch.zeros(10, 7), 2))



@pytest.mark.skipif(__import__("os").environ.get("RUN_SLOW") != "1", reason="loads SmolLM2-135M: set RUN_SLOW=1")
def test_smollm2_heads_decode_exactly():
    import refimpl
    from refimpl import autoregressive, models
    from refimpl.prompts import encode_prompt, prompt_set

    lm = models.load("smollm2-135m", device="cpu")
    prompts = [encode_prompt(lm, t) for _, t in prompt_set(1)[:3]]
    ar = autoregressive.generate(lm, prompts, max_new_tokens=24)
    g = refimpl.generate(lm, prompts, method="medusa", max_new_tokens=24)  # the zoo's heads, the tree from their accuracy
    assert g.tokens == ar.tokens and g.stats.tau > 1.2


def test_chain_rates_count_every_position_as_a_loop_does(tiny, heads):
    """Held-out chain acceptance of the heads, against a position-by-position loop on tiny's own answers."""
    from refimpl.train.distill_data import generate_answers
    from refimpl.train.medusa import chain_rates

    rows = generate_answers(tiny, ["And God said", "The LORD is my shepherd", "Jesus wept"], 24, 3, progress=False)
    K, hits, count = heads.num_heads, [0] * heads.num_heads, 0
    for ids, n_prompt, hidden, *_ in rows:
        for i in range(hidden.shape[0] - K):
            count += 1
            for k in range(K):
                guess = int(heads.forward(hidden[i:i + 1].float())[k][0].argmax())
                if (guess if heads.kept is None else int(heads.kept[guess])) != ids[n_prompt + i + k + 1]:
                    break
                hits[k] += 1
    want = [round(h / count, 4) for h in hits]
    assert chain_rates(heads, rows) == want and want[0] > 0 and want[0] >= want[-1]
