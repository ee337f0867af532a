"""Presets and the front door: every method's plain call runs its module's preset, every preset is
exact under greedy decoding, ``refimpl.generate`` dispatches by name and refuses what does not exist,
and the benchmark's rows name only presets the modules export."""
import glob
import json
import os

import pytest
import torch

import refimpl
from refimpl import autoregressive, dllm_draft, methods, models, speculative
from refimpl.bench import capstone
from refimpl.bench.rows import decode_rows, lookahead_sweep_rows, preset_row
from refimpl.generation import default_preset, preset_options
from refimpl.models import drafters

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N = 12


@pytest.fixture(scope="module")
def target():
    return models.load("tiny", device="cpu")


@pytest.fixture(scope="module")
def prompts(target):
    return [target.encode("And God said, Let there be light"), target.encode("In the beginning God created")]


@pytest.fixture(scope="module")
def reference(target, prompts):
    return autoregressive.generate(target, prompts, max_new_tokens=N).tokens


def drafter_kw(target, method):
    """The zoo's drafter for a method that takes one as an argument (the front door loads it itself)."""
    kind = methods.METHODS[method][1]
    return {drafters.KINDS[kind].arg: drafters.zoo(target, kind)} if kind else {}


PLAIN = [m for m in methods.METHODS if m != "ar"]


@pytest.mark.parametrize("method", PLAIN)
def test_the_plain_call_runs_the_default_preset(target, prompts, method):
    """module.generate(target, prompts) == module.generate(..., preset=<the target's default>): the
    same tokens, target calls and draft calls."""
    module, _, fixed = methods.METHODS[method]
    kw = {**drafter_kw(target, method), **fixed}
    plain = module.generate(target, prompts, max_new_tokens=N, **kw)
    name = fixed.get("method") if fixed and fixed["method"] != "prompt_lookup" else default_preset(target, module.PRESETS)
    explicit = module.generate(target, prompts, max_new_tokens=N, preset=name, **kw)
    assert plain.tokens == explicit.tokens
    assert (plain.stats.target_calls, plain.stats.draft_calls) == (explicit.stats.target_calls, explicit.stats.draft_calls)
    assert default_preset(target, module.PRESETS) == "cpu"  # a CPU target


def every_preset():
    seen = set()
    for method in PLAIN:
        module, _, fixed = methods.METHODS[method]
        for name, opts in module.PRESETS.items():
            if all(opts.get(k) == v for k, v in fixed.items()) and (module.__name__, name) not in seen:
                seen.add((module.__name__, name))
                yield method, name


@pytest.mark.parametrize("method,preset", list(every_preset()))
def test_greedy_equals_ar_under_every_preset(target, prompts, reference, method, preset):
    g = refimpl.generate(target, prompts, method=method, preset=preset, max_new_tokens=N)
    assert g.tokens == reference


def test_the_front_door_runs_every_method_and_picks_the_fastest(target, prompts, reference):
    assert set(methods.available(target)) == set(methods.METHODS)  # the zoo has every drafter for tiny
    for method in methods.available(target):
        assert refimpl.generate(target, prompts, method=method, max_new_tokens=N).tokens == reference, method
    assert methods.fastest(target) == methods.FASTEST["tiny"][0]
    fast = refimpl.generate(target, prompts, max_new_tokens=N)
    direct = refimpl.generate(target, prompts, method=methods.FASTEST["tiny"][0], max_new_tokens=N)
    assert fast.tokens == reference and fast.stats.target_calls == direct.stats.target_calls


def test_the_front_door_refuses_what_does_not_exist(target, prompts):
    with pytest.raises(ValueError, match="one of .*eagle3.*got 'eagle4'"):
        refimpl.generate(target, prompts, method="eagle4")
    with pytest.raises(ValueError, match="does not take \\['gamma'\\].*window"):
        refimpl.generate(target, prompts, method="jacobi", gamma=3)
    with pytest.raises(ValueError, match="preset must be one of"):
        refimpl.generate(target, prompts, method="eagle3", preset="turbo")
    stranger = models.load("tiny-cllm", device="cpu")  # tiny's shapes, other weights: the zoo has nothing for it
    with pytest.raises(ValueError, match="no EAGLE-3 draft.*prompt_lookup"):
        refimpl.generate(stranger, prompts, method="eagle3")
    with pytest.raises(ValueError, match="no draft model for this target \\('tiny-cllm'"):
        refimpl.generate(stranger, prompts, method="speculative")
    assert methods.fastest(stranger) == "prompt_lookup"  # SmolLM2's order, without drafters


def test_a_method_without_its_drafter_says_how_to_get_one(target, prompts):
    with pytest.raises(ValueError, match="draft is required.*method='speculative'"):
        speculative.generate(target, prompts)
    with pytest.raises(ValueError, match="dlm is required"):
        dllm_draft.generate(target, prompts)


def test_presets_resolve_with_the_callers_options_on_top():
    presets = {"cpu": {"a": 1, "b": 2}, "paper": {"a": 3, "b": 4}}
    assert preset_options(presets, None, None) == {"a": 1, "b": 2}
    assert preset_options(presets, "paper", None, a=None, b=9) == {"a": 3, "b": 9}
    with pytest.raises(ValueError, match="does not set \\['c'\\]"):
        preset_options(presets, "cpu", None, c=1)
    with pytest.raises(ValueError, match="preset must be one of \\['cpu', 'paper'\\]"):
        preset_options(presets, "gpu", None)
    meta = torch.empty(0, device="meta")
    assert default_preset(meta, presets) == "paper" and default_preset(meta, {"cpu": {}}) == "cpu"


def test_every_benchmark_row_names_a_preset_its_module_exports():
    rows = decode_rows() + lookahead_sweep_rows()
    for m in rows:
        if not m.method or m.method == "ar":
            continue
        module = methods.METHODS[m.method][0]
        assert m.preset in module.PRESETS, m.name
        assert set(m.options) - {"temperature"} <= set(module.PRESETS[m.preset]), m.name
    assert {m.method for m in rows} >= set(methods.METHODS)
    names = {m.name for m in decode_rows()}
    assert all(name in names for name, _ in capstone.CHAPTER_DEFAULTS)
    with pytest.raises(ValueError, match="preset must be one of"):
        preset_row("eagle3", "turbo")
    with pytest.raises(ValueError, match="does not set \\['gamma'\\]"):
        preset_row("eagle3", "cpu", gamma=4)


def committed_ranking(path):
    """Lossless greedy rows of a committed capstone run at their default presets, fastest first, down to
    AR: by speed-up, each row against the AR of the run that measured it (rows added by a later run,
    ``capstone.add_rows``, carry their own run's ratio)."""
    rows = json.load(open(path))["rows"]
    keyed = [r for r in rows if r.get("key") and r["exact"] == 1.0 and not r["key"]["options"]]
    faster = sorted((r for r in keyed if r["speedup"] > 1.0 and r["key"]["method"] != "ar"),
                    key=lambda r: -r["speedup"])
    return tuple(r["key"]["method"] for r in faster) + ("ar",)


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "bench_results", "capstone", "capstone_*.json"))))
def test_fastest_follows_the_committed_capstone_results(path):
    model = os.path.basename(path)[len("capstone_"):-len(".json")]
    assert model in methods.FASTEST, f"{model}: add its order to refimpl.methods.FASTEST"
    assert methods.FASTEST[model] == committed_ranking(path)


def test_a_new_kind_of_drafter_is_one_registry_entry(target, prompts, reference, monkeypatch):
    """docs/architecture.md's checklist: a kind of drafter (one ``KINDS`` entry) and its method (one
    ``METHODS`` row) are all the front door, the zoo lookup and the benchmark's rows need; a target the
    zoo has no such drafter for is told so, by the kind's name."""
    monkeypatch.setitem(drafters.KINDS, "toy", drafters.Kind("toy draft model", "draft", models={"tiny": "tiny-draft"}))
    monkeypatch.setitem(methods.METHODS, "toy_speculative", (speculative, "toy", {}))
    assert "toy_speculative" in methods.available(target)
    g = refimpl.generate(target, prompts, method="toy_speculative", max_new_tokens=N)
    assert g.tokens == reference and g.stats.draft_calls > 0
    assert preset_row("toy_speculative", "cpu").needs == ("target", "toy")
    stranger = models.load("tiny-cllm", device="cpu")
    assert "toy_speculative" not in methods.available(stranger)
    with pytest.raises(ValueError, match="no toy draft model for this target"):
        refimpl.generate(stranger, prompts, method="toy_speculative")

