"""refimpl.bench.sweep (a method's settings against AR, through the front door) on ``tiny``: every
configuration's greedy tokens equal AR's, and its counters come from the generations it ran."""
import pytest

from refimpl import models
from refimpl.bench import sweep


def test_parse_config_reads_python_literals_and_refuses_a_bare_word():
    assert sweep.parse_config("total=5, depth=5,copy=12.0,method=sam") == {"total": 5, "depth": 5, "copy": 12.0,
                                                                           "method": "sam"}
    with pytest.raises(ValueError, match="config"):
        sweep.parse_config("total=5,deep")


def test_sweep_counts_tau_and_draft_calls_of_each_configuration():
    lm = models.load("tiny")
    prompts = [lm.encode("And God said"), lm.encode("In the beginning")]
    rows = sweep.sweep(lm, prompts, "speculative", [{"gamma": 1}, {"gamma": 4}], max_new_tokens=12, repeats=1)
    assert [r["method"] for r in rows] == ["ar", "speculative", "speculative"]
    ar, g1, g4 = rows
    assert ar["tau"] == 1.0  # AR: one target call a token
    assert ar["draft_calls_per_step"] == 0
    assert 1.0 < g1["tau"] <= 2.0 < g4["tau"] <= 5.0  # gamma bounds the tokens a call commits
    assert g4["draft_calls_per_step"] > g1["draft_calls_per_step"] > 0
    assert all(r["step_ms"] > 0 and r["speedup"] > 0 for r in rows)


def test_sweep_refuses_empty_input():
    with pytest.raises(ValueError):
        sweep.sweep(None, [], "speculative", [{}])


def test_the_pipeline_bench_counts_the_slots_a_full_batch_would_spend_on_finished_rows():
    from refimpl.bench.pipeline import wasted_share

    rows = [([0] * (2 + n), 2) for n in (4, 4, 1, 3, 2)]  # answers of 4, 4, 1, 3, 2 tokens
    # batches of 2: (4, 4) -> 8 of 8 slots used; (1, 3) -> 4 of 6; (2) -> 2 of 2: 14 of 16
    assert wasted_share(rows, 2) == round(1 - 14 / 16, 3)
    assert wasted_share(rows, 1) == 0.0 and wasted_share([], 4) == 0.0
