"""A drafter for a user's own model (``python -m refimpl.train {eagle3,dflash,pard} --target PATH``), on a small
random Hugging Face Llama saved to a folder: each kind's loss falls, the held-out prompts are disjoint from the
training rows, the front door decodes with the folder (``draft=DIR``, or by itself when the folder sits in the
models folder under its default name) and its greedy tokens equal AR's; a drafter trained for other weights is
refused."""
import json
import os
import shutil

import pytest
import torch

import refimpl
from refimpl import autoregressive, methods, models
from refimpl.models import drafters
from refimpl.train import own
from refimpl.train.__main__ import main

from own_model import random_llama

pytestmark = pytest.mark.usefixtures("torch_kernels")

SMALL = {"answers": 80, "max_new_tokens": 16, "steps": 60}


@pytest.fixture(scope="module")
def trained(tiny, tmp_path_factory):
    """The random target's folder and one drafter folder per kind, trained with the answers cached in a
    temporary folder."""
    root = tmp_path_factory.mktemp("own")
    path = random_llama(root / "mymodel", tiny.tokenizer, seed=0)
    mp = pytest.MonkeyPatch()
    mp.setattr(own, "cache_dir", lambda: str(root))
    try:
        reports = {k: own.train(k, path, out=str(root / k), progress=False, **SMALL) for k in own.OWN_KINDS}
    finally:
        mp.undo()
    return {"root": root, "path": path, "reports": reports}


@pytest.fixture(scope="module")
def target(trained):
    return models.load(trained["path"], device="cpu")


@pytest.fixture(scope="module")
def prompts(target):
    return [target.encode("And God said"), target.encode("In the beginning God created the heaven and the earth")]


@pytest.mark.parametrize("kind", own.OWN_KINDS)
def test_each_kind_learns_and_reports_only_this_run(trained, kind):
    r = trained["reports"][kind]
    if kind == "eagle3":
        first, last = r["first_ce_per_step"][0], r["final_ce_per_step"][0]
    else:
        first, last = r["first_loss"], r["final_loss"]
    assert last < 0.95 * first, (kind, first, last)
    assert r["steps"] == SMALL["steps"] and r["answers"] == SMALL["answers"]
    assert r["train_rows"] + r["heldout_rows"] == r["answers"] and r["heldout_rows"] > 0
    on_disk = json.load(open(os.path.join(trained["root"], kind, "train_report.json")))
    assert on_disk == r
    rec = drafters.recorded(str(trained["root"] / kind))
    assert rec["target"] == "mymodel" and rec["path"] == os.path.abspath(trained["path"])
    if kind != "eagle3":  # the one-call drafters carry their held-out acceptance: the "cpu" preset sizes by it
        cfg = json.load(open(os.path.join(trained["root"], kind, "config.json")))
        assert cfg["heldout_accept"] == r["accept_rate_per_depth"]


def test_the_held_out_prompts_are_the_same_for_every_kind_and_never_trained_on(trained):
    cached = [f for f in os.listdir(trained["root"]) if f.startswith("answers-")]
    assert len(cached) == 1  # one answer set, shared by the three kinds
    rows = torch.load(os.path.join(trained["root"], cached[0]))
    train, held = own.split(rows)
    assert held and {r[3] for r in train}.isdisjoint({r[3] for r in held})
    assert all(own.held_out(r[3]) for r in held) and not any(own.held_out(r[3]) for r in train)
    sizes = {k: (r["train_rows"], r["heldout_rows"]) for k, r in trained["reports"].items()}
    assert len(set(sizes.values())) == 1, sizes


@pytest.mark.parametrize("kind", own.OWN_KINDS)
def test_the_front_door_decodes_with_the_folder_and_equals_ar(trained, target, prompts, kind):
    ar = autoregressive.generate(target, prompts, max_new_tokens=24).tokens
    g = refimpl.generate(target, prompts, method=kind, draft=str(trained["root"] / kind), max_new_tokens=24)
    assert g.tokens == ar


def test_the_front_door_finds_a_drafter_in_the_models_folder_by_its_weights(trained, tiny, prompts, monkeypatch,
                                                                             tmp_path):
    shutil.copytree(trained["root"] / "eagle3", tmp_path / "eagle3-mymodel")
    shutil.copytree(trained["root"] / "pard", tmp_path / "pard-mymodel")
    monkeypatch.setattr(drafters, "MODELS_DIR", str(tmp_path))
    target = models.load(trained["path"], device="cpu")  # a fresh object: nothing cached on it
    assert {"eagle3", "pard"} <= set(methods.available(target))
    ar = autoregressive.generate(target, prompts, max_new_tokens=16).tokens
    for kind in ("eagle3", "pard"):
        assert refimpl.generate(target, prompts, method=kind, max_new_tokens=16).tokens == ar
    # another model of the same shapes and name: nothing attaches, a folder passed by hand is refused
    other = models.load(random_llama(tmp_path / "other" / "mymodel", tiny.tokenizer, seed=1), device="cpu")
    assert "eagle3" not in methods.available(other) and "pard" not in methods.available(other)
    for kind in ("eagle3", "pard"):
        with pytest.raises(ValueError, match="trained for other weights"):
            refimpl.generate(other, prompts, method=kind, draft=str(tmp_path / f"{kind}-mymodel"))


def test_the_command_line_trains_a_drafter_and_names_bad_flags(trained, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(own, "cache_dir", lambda: str(trained["root"]))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": f"Tell me about the number {i}."}) for i in range(40)))
    main(["dflash", "--target", trained["path"], "--out", str(tmp_path / "d"), "--steps", "3", "--answers", "40",
          "--prompts", str(prompts), "--taps", "0,1"])
    report = json.load(open(tmp_path / "d" / "train_report.json"))
    assert report["steps"] == 3 and report["answers"] == 40 and report["recipe"] == "cpu"
    assert report["taps"] == [0, 1] and json.load(open(tmp_path / "d" / "config.json"))["taps"] == [0, 1]
    for argv, says in ((["pard"], "--target PATH is required"), (["tiny", "--target", "x"], "--target: only with"),
                       (["dflash", "--target", "x", "--taps", "a,b"], "--taps: comma-separated"),
                       (["tiny", "--init", str(tmp_path)], "--init: tiny always trains from scratch")):
        with pytest.raises(SystemExit):
            main(argv)
        assert says in capsys.readouterr().err


@pytest.mark.parametrize("kind", own.OWN_KINDS)
def test_a_second_run_goes_on_from_the_first_ones_weights(trained, kind, monkeypatch, tmp_path):
    """``init``: the first step of the continued run starts where the first run ended, not at a new
    drafter's loss; the report names the folder it started from."""
    monkeypatch.setattr(own, "cache_dir", lambda: str(trained["root"]))
    r = own.train(kind, trained["path"], out=str(tmp_path / kind), init=str(trained["root"] / kind), progress=False,
                  **{**SMALL, "steps": 2})
    loss = (lambda rep, at: rep[f"{at}_ce_per_step"][0]) if kind == "eagle3" else (lambda rep, at: rep[f"{at}_loss"])
    fresh = trained["reports"][kind]
    assert r["init"] == os.path.abspath(trained["root"] / kind) and r["steps"] == 2
    assert loss(r, "first") < 0.5 * (loss(fresh, "first") + loss(fresh, "final")), (loss(r, "first"), fresh)
    with pytest.raises(ValueError, match="init: .* records no target"):
        own.train(kind, trained["path"], out=str(tmp_path / "x"), init=str(tmp_path), progress=False, **SMALL)


def test_servable_taps_are_each_layer_once_in_order_below_the_last():
    """vLLM reads the streams of a sorted set of layers, none of them ``L`` (its stream ``L`` is not our final
    normed state): a small target's defaults that repeat or reach ``L`` come out servable."""
    assert own.servable((1, 1, 2), 2) == (1,)
    assert own.servable((27, 2, 15), 30) == (2, 15, 27)
    assert own.servable((1, 2, 4), 4) == (1, 2, 3)


def test_bad_input_is_named(trained, tmp_path):
    with pytest.raises(ValueError, match="kind must be one of"):
        own.train("medusa", trained["path"])
    with pytest.raises(ValueError, match="options .*'lr_max'"):
        own.train("eagle3", trained["path"], lr_max=1.0)
    with pytest.raises(ValueError, match="taps: each target layer once"):
        own.train("eagle3", trained["path"], taps=(1, 1, 1))
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="prompts: .* holds no prompt"):
        own.read_prompts(str(empty))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no prompt field"}\n')
    with pytest.raises(ValueError, match="'prompt' field"):
        own.read_prompts(str(bad))
    with pytest.raises(ValueError, match="draft: .* records no target"):
        refimpl.generate(models.load(trained["path"], device="cpu"), [[1, 2, 3]], method="eagle3", draft=str(tmp_path))


def test_pards_student_is_the_targets_first_layers(target):
    """Any architecture: the student's weights are the target's for every name it keeps, and it has the
    layer count asked for."""
    s = own.pard_student(target, 1)
    assert s.config.num_hidden_layers == 1
    full = target.model.state_dict()
    for name, w in s.state_dict().items():
        torch.testing.assert_close(w, full[name].float())
    with pytest.raises(ValueError, match="layers must be in"):
        own.pard_student(target, 2)


@pytest.mark.parametrize("kind,method", [("eagle3", "eagle3"), ("dflash", "dflash"), ("pard", "draft_model")])
def test_the_folder_exports_to_vllms_layout(trained, tmp_path, kind, method):
    from refimpl.export import export

    info = export(str(trained["root"] / kind), str(tmp_path / "served"))
    assert info["speculative_config"]["method"] == method
    assert json.load(open(tmp_path / "served" / "export.json")) == info
    assert os.path.exists(tmp_path / "served" / "config.json")
    if kind == "pard":
        served = models.load(str(tmp_path / "served"), device="cpu")
        assert served.model.config.pard_token == info["pard_token"]
