"""refimpl.bench: the decode table interleaves methods (noise hits all alike), takes medians,
checks exactness against AR greedy, and the command line writes its tables."""
import json
import os

import pytest

from refimpl import bench
from refimpl.bench import decode
from refimpl.generation import Generation, Stats


@pytest.fixture
def no_interpreter(monkeypatch):
    """The benchmark refuses to time Triton's interpreter: TRITON_INTERPRET unset, and the kernel files this
    process imported under it (their dispatchers would still call it) take their torch paths."""
    import kernels

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with kernels.references():
        yield


class Fake:
    """A method whose k-th call takes ``secs[k]`` seconds and returns ``tokens``; logs its calls."""

    def __init__(self, name, log, secs, tokens):
        self.name, self.log, self.secs, self.tokens, self.k = name, log, secs, tokens, 0

    def __call__(self, ctx, ids, n):
        self.log.append((self.name, tuple(ids)))
        s = Stats(seconds=self.secs[self.k % len(self.secs)], target_calls=2, new_tokens=len(self.tokens))
        self.k += 1
        return Generation([list(self.tokens)], s)


def test_run_decode_interleaves_and_takes_medians(tiny, monkeypatch):
    prompts = [("chat", tiny.encode("And God said")), ("code", tiny.encode("In the beginning"))]
    ref = {tuple(ids): [5, 6, 7, 8] for _, ids in prompts}
    monkeypatch.setattr(decode.autoregressive, "generate",
                        lambda lm, ids, max_new_tokens: Generation([ref[tuple(ids)]], Stats()))
    log = []
    methods = [bench.Method("ar (cache)", Fake("ar", log, [1.0, 9.0, 1.0], [5, 6, 7, 8])),
               bench.Method("fast", Fake("fast", log, [0.5, 0.5, 7.0], [5, 6, 7, 8])),
               bench.Method("wrong", Fake("wrong", log, [1.0], [5, 6, 0, 0])),
               bench.Method("capped", Fake("capped", log, [1.0], [5, 6, 7, 8]), max_prompts=1)]
    rows = bench.run_decode(bench.Context(target=tiny), methods, prompts, max_new_tokens=4, repeats=3,
                            progress=False)
    # round robin: prompt 1 x 3 rounds of every method, then prompt 2 (without the capped method)
    names = [n for n, _ in log]
    assert names[:8] == ["ar", "fast", "wrong", "capped"] * 2
    assert names[12:15] == ["ar", "fast", "wrong"] and len(log) == 3 * 4 + 3 * 3
    by = {r["method"]: r for r in rows}
    assert by["ar (cache)"]["seconds"] == 2.0 and by["fast"]["seconds"] == 1.0  # medians per prompt
    assert by["fast"]["speedup"] == 2.0 and by["fast"]["tau"] == 2.0
    assert by["fast"]["per_category_tau"] == {"chat": 2.0, "code": 2.0}
    assert by["capped"]["per_category_tau"] == {"chat": 2.0}
    assert by["fast"]["exact"] == 1.0 and by["wrong"]["exact"] == 0.0
    assert by["capped"]["prompts"] == 1
    # the two terms of a speed-up: step cost in AR steps (seconds per target call) and draft calls per step
    assert by["fast"]["step_cost"] == 0.5 and by["ar (cache)"]["step_cost"] == 1.0
    assert by["fast"]["draft_calls_per_step"] == 0.0


def test_command_line_writes_json_and_markdown(tmp_path, no_interpreter):
    out = tmp_path / "res"
    result = bench.main(["--model", "tiny", "--fast", "--methods", "speculative [cpu];prompt", "--threads",
                         "1", "--max-new-tokens", "8", "--out", str(out)])
    names = [r["method"] for r in result["rows"]]
    assert names[0] == "ar (cache)" and "speculative [cpu]" in names
    assert {"hf prompt lookup (10 tokens, ngram <= 2)", "prompt_lookup [cpu]"} <= set(names)
    by = {r["method"]: r for r in result["rows"]}
    assert by["speculative [cpu]"]["key"] == {"method": "speculative", "preset": "cpu", "options": {}}
    assert by["speculative [cpu]"]["configuration"] == "gamma 4"
    assert all(r["exact"] == 1.0 for r in result["rows"] if r["exact"] is not None)
    saved = json.load(open(os.path.join(out, "decode_tiny.json")))
    assert saved["rows"] == json.loads(json.dumps(result["rows"], default=str))
    assert "prepacked_linears" in saved and "| method |" in open(os.path.join(out, "decode_tiny.md")).read()


def test_methods_pick_rows_by_substring_with_commas_or_semicolons():
    from refimpl.bench import cli

    names_ = ("ar (cache)", "tree (10 nodes, depth 6)", "tree (3 nodes, depth 3)", "chain")
    rows = [bench.Method(n, None) for n in names_]
    names = lambda spec: [m.name for m in cli.pick(rows, spec)]  # noqa: E731
    assert names("chain") == ["ar (cache)", "chain"]
    assert names("3 nodes, depth 6") == ["ar (cache)", "tree (10 nodes, depth 6)", "tree (3 nodes, depth 3)"]  # split
    assert names("(3 nodes, depth 3); chain") == ["ar (cache)", "tree (3 nodes, depth 3)", "chain"]  # whole names


def test_refuses_to_time_the_triton_interpreter(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(SystemExit, match="TRITON_INTERPRET"):
        bench.main(["--model", "tiny", "--fast", "--out", str(tmp_path)])
    assert not list(tmp_path.iterdir())  # refused before loading or writing anything


def test_the_gpu_step_cost_model_and_its_bad_arguments():
    """Chapter 16's flat-latency GPU model: one target call plus c_draft per draft call."""
    from refimpl.bench import capstone

    assert capstone.gpu_step_cost(0.0, 0.1) == 1.0 and abs(capstone.gpu_step_cost(4.0, 0.1) - 1.4) < 1e-12
    with pytest.raises(ValueError, match="draft_calls_per_step"):
        capstone.gpu_step_cost(-1.0, 0.1)
    with pytest.raises(ValueError, match="c_draft"):
        capstone.gpu_step_cost(1.0, -0.1)


def test_capstone_takes_every_chapters_default_row():
    from refimpl.bench import capstone, rows

    names = {m.name for m in rows.decode_rows()}
    missing = [n for n, _ in capstone.CHAPTER_DEFAULTS if n not in names]
    assert not missing, f"capstone rows renamed or removed: {missing}"
    chapters = {ch for _, ch in capstone.capstone_rows("tiny")}
    assert {"01", "02", "03", "04a", "04b", "05", "06a", "06b", "07", "08", "09", "14", "15", "15b"} <= chapters


def test_capstone_command_line(tmp_path, no_interpreter):
    out = tmp_path / "cap"
    result = bench.main(["--suite", "capstone", "--model", "tiny", "--fast", "--methods", "speculative [cpu];jacobi",
                         "--threads", "1", "--max-new-tokens", "8", "--out", str(out)])
    by = {r["method"]: r for r in result["rows"]}
    assert by["ar (cache)"]["chapter"] == "01" and by["speculative [cpu]"]["chapter"] == "02"
    cllm = next(r for r in result["rows"] if "tiny-cllm" in r["method"])
    assert cllm["chapter"] == "15" and cllm["exact"] == 1.0  # == tiny-cllm's own AR greedy
    assert all(r["step_cost"] > 0 for r in result["rows"])
    assert "step cost" in open(os.path.join(out, "capstone_tiny.md")).read()


def test_roofline_bytes_breakdown_and_bandwidth(tiny):
    from refimpl.bench import roofline

    m = tiny.model
    brute = sum(p.numel() * 4 for n, p in m.named_parameters() if "embed_tokens" not in n or m.config.tie_word_embeddings)
    assert roofline.weight_bytes(m) == brute  # tied head: the embedding is read once, as the head
    assert roofline.read_bandwidth(1 << 20, repeats=2) > 1e8
    b = roofline.breakdown(tiny, k=3, context=16, repeats=2)
    assert set(b["stages"]) == set(roofline.STAGES) and b["stages"]["qkv"] > 0
    assert abs(sum(b["stages"].values()) - b["wall_ms"]) < 0.5 * b["wall_ms"]
    with pytest.raises(ValueError, match="k"):
        roofline.breakdown(tiny, k=0)
    with pytest.raises(ValueError, match="nbytes"):
        roofline.read_bandwidth(0)


def test_latency_suite_reports_the_floor(tmp_path, no_interpreter):
    from refimpl.bench import cli

    out = str(tmp_path)
    result = cli.main(["--suite", "latency", "--model", "tiny", "--fast", "--prepack", "on", "--out", out])
    assert result["forward"] == "LeanLM" and result["floor_ms"] > 0 and result["hf_step_ms"]
    assert all(r["x_floor"] == pytest.approx(r["ms"] / result["floor_ms"]) for r in result["rows"])
    assert "floor" in open(os.path.join(out, "latency_tiny.md")).read()
    assert os.path.getsize(os.path.join(out, "latency_tiny.png")) > 1000


def test_held_out_quality_counts_the_prompts_a_row_breaks(tiny):
    """The learned suite's untimed quality pass: a row that writes the reference's text is off on no
    prompt; a row that writes commas is off on every one (its perplexity under tiny is far above
    twice the reference's), and its calls, agreement and perplexity are measured, not copied."""
    from refimpl import autoregressive
    from refimpl.bench import learned
    from refimpl.bench.dllm import ar_perplexity

    comma = tiny.encode(",")[-1]

    def ar(p):
        return autoregressive.generate(tiny, [p], max_new_tokens=8, eos_token_id=[])

    def commas(p):
        return Generation([[comma] * 8], Stats(target_calls=4))

    rows = [("tiny", "AR", ar), ("tiny", "copy of AR", ar), ("broken", "commas", commas)]
    out = {r["method"].split(",")[0]: r for r in learned.held_out_quality("q", tiny, rows, ("tiny", "AR"), 3)}
    assert out["AR"]["collapsed"] == 0 and out["copy of AR"]["collapsed"] == 0
    assert out["copy of AR"]["agreement"] == 1.0 and out["AR"]["tokens_per_call"] == 1.0
    assert out["commas"]["collapsed"] == 3 and out["commas"]["tokens_per_call"] == 2.0
    assert out["commas"]["agreement"] < 1.0 and out["commas"]["calls_per_row"] == 4.0
    prompts = learned.kjv_prompts(tiny.tokenizer, 3)
    assert out["commas"]["perplexity"] == pytest.approx(ar_perplexity(tiny, prompts, [[comma] * 8] * 3))


def test_capstone_add_rows_replaces_by_name_in_chapter_order(tmp_path):
    """A later run's rows join a committed capstone table in chapter order, a row of the same name replaced,
    and the run is recorded (an earlier run keeps only the rows still its own); a run with nothing but AR is
    refused."""
    import json

    from refimpl.bench import capstone

    names = [n for n, _ in capstone.CHAPTER_DEFAULTS]
    old = {"rows": [{"method": names[0], "tokens_per_s": 10.0}, {"method": names[-1], "speedup": 0.5},
                    {"method": names[2], "speedup": 1.1}]}
    path = tmp_path / "cap.json"
    path.write_text(json.dumps(old))
    new = {"args": {"methods": "x"}, "hardware": {}, "rows": [{"method": "ar (cache)", "tokens_per_s": 12.0},
                                                             {"method": names[-1], "speedup": 0.9}]}
    merged = capstone.add_rows(str(path), new)
    assert [r["method"] for r in merged["rows"]] == [names[0], names[2], names[-1]]
    assert merged["rows"][-1]["speedup"] == 0.9 and merged["rows"][0]["tokens_per_s"] == 10.0
    assert merged["added_runs"][0]["rows"] == [names[-1]] and merged["added_runs"][0]["ar_tokens_per_s"] == 12.0
    # a third run replaces that row again: the second run, left with no row of its own, drops out of the record
    earlier = {**merged, "added_runs": [{"rows": [names[2], names[-1]], "ar_tokens_per_s": 11.0}]}
    path.write_text(json.dumps(earlier))
    again = capstone.add_rows(str(path), {**new, "rows": [new["rows"][0], {"method": names[-1], "speedup": 1.2}]})
    assert [a["rows"] for a in again["added_runs"]] == [[names[2]], [names[-1]]]
    with pytest.raises(ValueError, match="new"):
        capstone.add_rows(str(path), {"args": {}, "hardware": {}, "rows": [{"method": "ar (cache)", "tokens_per_s": 1}]})


def test_per_category_speedups_are_against_the_ar_of_the_run_that_measured_the_row(tmp_path):
    """A row added from a later run on a machine 2x as fast keeps its own per-category speed-up: in the
    category tables (decode and the docs' quote) and the winners, never divided by the first run's AR."""
    import json

    from refimpl.bench import capstone, quote
    from refimpl.bench.decode import category_speedups, category_table

    name = capstone.CHAPTER_DEFAULTS[-1][0]
    def row(method, tokens_per_s, speedup, a, b):
        return {"method": method, "tokens_per_s": tokens_per_s, "speedup": speedup,
                "per_category_tokens_per_s": {"a": a, "b": b}, "per_category_tau": {}}

    first_ar, own = row("ar (cache)", 10.0, 1.0, 10.0, 20.0), row("mine", 15.0, 1.5, 15.0, 30.0)
    later_ar, later = row("ar (cache)", 20.0, 1.0, 20.0, 40.0), row(name, 24.0, 1.2, 22.0, 52.0)
    path = tmp_path / "cap.json"
    path.write_text(json.dumps({"rows": [first_ar, own]}))
    merged = capstone.add_rows(str(path), {"args": {}, "hardware": {}, "rows": [later_ar, later]})
    added = next(r for r in merged["rows"] if r["method"] == name)
    assert category_speedups(added, first_ar) == pytest.approx({"a": 1.1, "b": 1.3})
    assert category_speedups(own, first_ar) == pytest.approx({"a": 1.5, "b": 1.5})
    # a row recorded without its run's per-category AR: scaled by that run's overall AR (24 / 1.2 = 20 tok/s)
    bare = {k: v for k, v in added.items() if k != "per_category_ar_tokens_per_s"}
    assert category_speedups(bare, first_ar) == pytest.approx({"a": 1.1, "b": 1.3})
    assert "1.10x" in category_table(merged["rows"]) and "2.20x" not in category_table(merged["rows"])
    rel = tmp_path / "bench" / "cap.json"
    rel.parent.mkdir()
    rel.write_text(json.dumps(merged))
    assert "1.30x" in quote.categories(str(rel)) and "2.60x" not in quote.categories(str(rel))
