"""Any model a user brings: tiny random Hugging Face causal LMs of many architectures, saved with
``save_pretrained`` and loaded with ``models.load(folder)``, through every method that runs without a
trained drafter, plus the draft-model methods with a random draft and with the target as its own
draft (which accepts everything: the case that exercises acceptance and long roll-backs).

Sliding-window attention is the case that needs care (:class:`refimpl.lm.WindowCache`): Mistral-style
models window every layer, Gemma 2 alternates windowed and full layers, Qwen2 windows only its upper
layers. The windows here (16) are smaller than the longer prompt, and prompt + new tokens reach 4x
the window, so every roll-back happens after the window has slid. Greedy output must equal AR's token
for token on a ragged batch; our AR must equal Hugging Face's own ``generate`` (whose masks are the
reference for what a window means); sampling must be lossless on a windowed model (chi-square,
with a wrong rule as its negative control)."""
import pytest
import torch

from first_two import exact_first_two, first_two_pvalue
import refimpl
from refimpl import adaptive, autoregressive, dynamic_tree, methods, models, speculative, tree

pytestmark = pytest.mark.usefixtures("torch_kernels")

WINDOW = 16
#: name -> (model_type, config fields): eight architectures, three of them windowed
ARCHITECTURES = {
    "llama": ("llama", {}),
    "qwen3": ("qwen3", {"head_dim": 16}),
    "gemma": ("gemma", {"head_dim": 16}),
    "phi3": ("phi3", {}),
    "gpt_neox": ("gpt_neox", {}),
    "gpt2": ("gpt2", {}),
    "opt": ("opt", {}),
    "mistral window 16": ("mistral", {"sliding_window": WINDOW}),
    "gemma2 alternating window 16": ("gemma2", {"sliding_window": WINDOW, "head_dim": 16}),
    "qwen2 upper layer window 16": ("qwen2", {"sliding_window": WINDOW, "use_sliding_window": True,
                                              "max_window_layers": 1}),
}
#: the front door's methods that need no trained drafter
DRAFTER_FREE = ["jacobi", "lookahead", "prompt_lookup", "sam", "recycling", "sam+recycling"]
NEW = 4 * WINDOW + 2 - 21  # the long prompt (21 tokens) + NEW > 4 windows


def config_fields(model_type: str, tok) -> dict:
    """A 2-layer, 64-wide config of ``model_type`` on the ``tiny`` tokenizer, 4,096 positions."""
    ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    if model_type == "gpt2":
        return {"vocab_size": len(tok), "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 4096, **ids}
    base = {"vocab_size": len(tok), "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "max_position_embeddings": 4096, **ids}
    if model_type == "opt":
        return {**base, "ffn_dim": 128, "word_embed_proj_dim": 64}
    if model_type == "gpt_neox":
        return {**base, "intermediate_size": 128}
    return {**base, "intermediate_size": 128, "num_key_value_heads": 2}


def random_model(folder, model_type: str, fields: dict, tok, seed: int):
    """A random model saved to ``folder`` and loaded the way a user would: ``models.load(folder)``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = AutoConfig.for_model(model_type, **{**config_fields(model_type, tok), **fields})
    AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return models.load(str(folder), device="cpu")


@pytest.fixture(scope="module")
def tok(tiny):
    return tiny.tokenizer


@pytest.fixture(scope="module")
def prompts(tok):
    long = tok.encode("And God said, Let there be light: and there was light. And God saw the light, that it was good",
                      add_special_tokens=False)[:21]
    assert len(long) == 21 > WINDOW
    return [long, tok.encode("In the beginning", add_special_tokens=False)]


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def pair(request, tmp_path_factory, tok):
    """(target, a random draft of the same architecture) for one architecture."""
    model_type, fields = ARCHITECTURES[request.param]
    folder = tmp_path_factory.mktemp(model_type)
    return (random_model(folder / "target", model_type, fields, tok, seed=0),
            random_model(folder / "draft", model_type, fields, tok, seed=1))


def test_every_method_equals_ar_greedy_on_a_ragged_batch(pair, prompts):
    target, draft = pair
    ar = autoregressive.generate(target, prompts, max_new_tokens=NEW, eos_token_id=[]).tokens
    runs = {m: lambda m=m: refimpl.generate(target, prompts, method=m, max_new_tokens=NEW, eos_token_id=[])
            for m in DRAFTER_FREE}
    for name, d in (("random draft", draft), ("itself as draft", target)):
        for mod in (speculative, adaptive, tree, dynamic_tree):
            runs[f"{mod.__name__.split('.')[-1]}, {name}"] = lambda mod=mod, d=d: mod.generate(
                target, prompts, draft=d, max_new_tokens=NEW, eos_token_id=[])
    differ = [name for name, run in runs.items() if run().tokens != ar]
    assert not differ, f"not AR's greedy tokens: {differ}"


def test_a_foreign_model_is_offered_only_what_runs_without_a_drafter(pair):
    target, _ = pair
    assert set(methods.available(target)) == {"ar", *DRAFTER_FREE}


@pytest.mark.parametrize("name", [n for n in ARCHITECTURES if "window" in n])
def test_our_windowed_ar_equals_hugging_face_generate_and_the_window_matters(name, tmp_path, tok, prompts):
    model_type, fields = ARCHITECTURES[name]
    lm = random_model(tmp_path / "w", model_type, fields, tok, seed=0)
    unwindowed = random_model(tmp_path / "full", model_type, {**fields, "sliding_window": 4096}, tok, seed=0)
    p = prompts[0]
    ours = autoregressive.generate(lm, [p], max_new_tokens=NEW, eos_token_id=[]).tokens[0]
    hf = lm.model.generate(torch.tensor([p]), max_new_tokens=NEW, do_sample=False, eos_token_id=None,
                           pad_token_id=tok.pad_token_id)[0, len(p):].tolist()
    assert ours == hf
    assert autoregressive.generate(unwindowed, [p], max_new_tokens=NEW, eos_token_id=[]).tokens[0] != ours


# -- sampling on a windowed model: tiny's trained weights in Mistral's architecture, window 16 ----------
@pytest.fixture(scope="module")
def windowed_tiny(tiny, tmp_path_factory):
    """``tiny`` (a 4-layer Llama) as a Mistral model with a 16-token window: the same weights, so its
    distributions are a trained model's (peaked: the chi-square test has power), windowed."""
    from transformers import MistralConfig, MistralForCausalLM

    c = tiny.config
    cfg = MistralConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
                        num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim,
                        max_position_embeddings=c.max_position_embeddings, rms_norm_eps=c.rms_norm_eps,
                        rope_theta=tiny.config.rope_parameters["rope_theta"], tie_word_embeddings=True,
                        sliding_window=WINDOW, bos_token_id=c.bos_token_id, eos_token_id=c.eos_token_id,
                        pad_token_id=c.pad_token_id)
    model = MistralForCausalLM(cfg)
    model.load_state_dict(tiny.model.state_dict())
    folder = tmp_path_factory.mktemp("windowed-tiny")
    model.save_pretrained(folder)
    tiny.tokenizer.save_pretrained(folder)
    return models.load(str(folder), device="cpu")


@pytest.fixture(scope="module")
def chi_prompt(tok):
    ids = tok.encode("And the LORD spake unto Moses, saying, Speak unto the children of Israel, and say unto them, When any man of you bring an offering",
                     add_special_tokens=False)
    assert len(ids) > WINDOW + 4
    return ids


def chi_square_pvalue(target, draft, prompt, rule, exact, samples=600):
    g = speculative.decode(target, speculative.DraftModel(draft, speculative.FixedGamma(2), target),
                           [prompt] * samples, max_new_tokens=3, temperature=1.0, top_k=4,
                           generator=torch.Generator().manual_seed(1234), eos_token_id=[], rule=rule)
    return first_two_pvalue(g.tokens, exact), g.stats.alpha


def test_sampling_on_a_windowed_model_is_lossless_and_a_wrong_rule_is_caught(windowed_tiny, tiny, chi_prompt):
    """The exact joint of the first two tokens comes from Hugging Face's own windowed forward without
    a cache (``logits``); speculative sampling with ``tiny-draft`` rolls the windowed cache back after
    every rejection. Negative controls: the same test rejects a residual drawn from p, and it sees the
    window (sampling ``tiny``, the same weights unwindowed, is rejected). Seed 1234, 600 samples:
    p = 0.20 for the right rule, 3e-41 for the wrong residual, 0 (an impossible pair) unwindowed."""
    from test_speculative import wrong_residual_is_p

    draft = models.load("tiny-draft", device="cpu")
    exact = exact_first_two(windowed_tiny, chi_prompt, 1.0, 4)
    pvalue, alpha = chi_square_pvalue(windowed_tiny, draft, chi_prompt, None, exact)
    assert 0.05 < alpha < 0.95, "the draft must differ from the target for the test to have power"
    assert pvalue > 1e-3
    assert chi_square_pvalue(windowed_tiny, draft, chi_prompt, wrong_residual_is_p, exact)[0] < 1e-6
    assert chi_square_pvalue(tiny, draft, chi_prompt, None, exact, samples=200)[0] < 1e-6


def test_a_cache_that_cannot_roll_back_is_refused_before_decoding(tmp_path, tok, prompts):
    """Llama 4's chunked attention: the front door offers AR alone and runs it for "fastest"; every
    method that rolls a cache back says which layer type stops it and what to use instead."""
    from refimpl import generate

    lm = random_model(tmp_path / "chunked", "llama4_text", {"intermediate_size_mlp": 128}, tok, seed=0)
    assert methods.available(lm) == ["ar"]
    ar = autoregressive.generate(lm, prompts, max_new_tokens=8, eos_token_id=[]).tokens
    assert generate(lm, prompts, max_new_tokens=8, eos_token_id=[]).tokens == ar
    with pytest.raises(ValueError, match=r"speculative decoding \(PromptLookup\).*'chunked_attention'.*method='ar'"):
        generate(lm, prompts, method="prompt_lookup", max_new_tokens=8)
    with pytest.raises(ValueError, match=r"speculative decoding \(DraftModel\).*'chunked_attention'"):
        speculative.generate(lm, prompts, draft=lm, max_new_tokens=8)


def test_a_target_is_known_by_its_weights_not_its_folder_name(tmp_path, tok, tiny, prompts):
    """The zoo's drafters attach by fingerprint (models/<drafter>/target.json). Negative control: a
    foreign model saved in a folder named ``tiny`` gets none of them, and a drafter passed by hand that
    does not fit it is refused before any forward; tiny's own weights under another name get them all."""
    from refimpl import eagle3, medusa
    from refimpl.models import drafters

    foreign = random_model(tmp_path / "tiny", "qwen2", {}, tok, seed=0)
    assert foreign.name == "tiny" and drafters.zoo_name(foreign) is None
    assert set(methods.available(foreign)) == {"ar", *DRAFTER_FREE}
    with pytest.raises(ValueError, match="no EAGLE-3 draft for this target"):
        refimpl.generate(foreign, prompts, method="eagle3")
    with pytest.raises(ValueError, match="draft was trained for hidden size 256, the target has 64"):
        eagle3.generate(foreign, prompts, draft=drafters.load(tiny, "eagle3"))
    with pytest.raises(ValueError, match="heads was trained for hidden size 256"):
        medusa.generate(foreign, prompts, heads=drafters.load(tiny, "medusa"))
    with pytest.raises(FileNotFoundError, match="no EAGLE-3 draft for 'tiny' in the zoo"):
        drafters.load(foreign, "eagle3")

    tiny.model.save_pretrained(tmp_path / "my-model")
    tok.save_pretrained(tmp_path / "my-model")
    mine = models.load(str(tmp_path / "my-model"), device="cpu")
    assert drafters.zoo_name(mine) == "tiny" and set(methods.available(mine)) == set(methods.available(tiny))
    ar = autoregressive.generate(mine, prompts, max_new_tokens=12).tokens
    assert refimpl.generate(mine, prompts, method="eagle3", max_new_tokens=12).tokens == ar


@pytest.mark.parametrize("window,model_type,fields", [
    (64, "gemma2", {"head_dim": 16}),                                     # alternating windowed / full layers
    (1024, "mistral", {}),                                                # every layer windowed
], ids=["gemma2 alternating window 64", "mistral window 1024"])
def test_every_method_equals_ar_far_past_larger_windows(window, model_type, fields, tmp_path, tok, prompts):
    """Windows of 64 and 1024 on a batch whose longer row reaches 4 windows (a prompt of nearly 4 windows,
    then 24 new tokens): every roll-back happens long after the window has slid. At 1024 the static tree
    (``tree``) is left out: its draft keeps no cache and re-reads the 4,076-token context for every level
    (55 s here), and its target side is the verification every other method exercises."""
    from refimpl.data import kjv_split

    text = " ".join(kjv_split()[1])
    long = tok.encode(text, add_special_tokens=False)[: 4 * window]
    assert len(long) == 4 * window
    batch = [long[:-20], prompts[1]]                                      # ragged: 4 windows and a short row
    fields = {**fields, "sliding_window": window, "max_position_embeddings": 8 * window}
    target = random_model(tmp_path / "target", model_type, fields, tok, seed=0)
    draft = random_model(tmp_path / "draft", model_type, fields, tok, seed=1)
    new = 24
    ar = autoregressive.generate(target, batch, max_new_tokens=new, eos_token_id=[]).tokens
    runs = {m: lambda m=m: refimpl.generate(target, batch, method=m, max_new_tokens=new, eos_token_id=[])
            for m in DRAFTER_FREE}
    for name, d in (("random draft", draft), ("itself as draft", target)):
        for mod in (speculative, adaptive, tree, dynamic_tree) if window < 1024 else (speculative, adaptive, dynamic_tree):
            runs[f"{mod.__name__.split('.')[-1]}, {name}"] = lambda mod=mod, d=d: mod.generate(
                target, batch, draft=d, max_new_tokens=new, eos_token_id=[])
    differ = [name for name, run in runs.items() if run().tokens != ar]
    assert not differ, f"not AR's greedy tokens: {differ}"
