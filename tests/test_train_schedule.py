"""A trainer with two budgets (steps and seconds) anneals on whichever runs out first: stopped by its
time limit, it still ends its cosine at the floor learning rate, not near the peak."""
import glob
import os

import pytest

from refimpl.train.common import budget_step, cosine_lr

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_run_stopped_by_its_clock_ends_its_cosine():
    steps, seconds, peak = 1200, 100.0, 1e-3
    # the clock runs out after 187 of 1200 steps (a step takes 100 / 187 s)
    lrs = [cosine_lr(budget_step(s, steps, (s + 1) * seconds / 187, seconds), steps, peak, warmup=30) for s in range(187)]
    assert lrs[-1] == pytest.approx(0.1 * peak, rel=1e-3), "the last step sits at the schedule's floor"
    plain = cosine_lr(186, steps, peak, warmup=30)
    assert plain > 0.9 * peak, "negative control: a schedule sized for the steps alone is still near its peak"
    # where the steps run out first, the clock changes nothing
    assert [budget_step(s, steps, 0.01 * s, seconds) for s in range(steps)] == list(range(steps))


def test_budget_step_refuses_empty_budgets():
    with pytest.raises(ValueError, match="steps, seconds"):
        budget_step(0, 0, 1.0, 10.0)
    with pytest.raises(ValueError, match="steps, seconds"):
        budget_step(0, 10, 1.0, 0.0)


def test_every_trainer_with_a_time_limit_schedules_on_both_budgets():
    for path in sorted(glob.glob(os.path.join(ROOT, "refimpl", "train", "*.py"))):
        src = open(path).read()
        if "t0 > seconds" in src and "cosine_lr(" in src:
            assert "budget_step(" in src, f"{os.path.basename(path)} stops at `seconds` but sizes its cosine for steps alone"


@pytest.mark.parametrize("trainer", ["refimpl.train.dflash:train_dflash_smollm2", "refimpl.train.pard:train_smollm2_pard"])
def test_smollm2_trainers_name_an_unknown_data_source(trainer, tmp_path):
    """SmolLM2's DFlash and PARD trainers take ``data="fp32"`` or ``"corpus"``; another is refused before any
    model loads."""
    import importlib

    mod, fn = trainer.split(":")
    with pytest.raises(ValueError, match="data must be 'corpus' or 'fp32'"):
        getattr(importlib.import_module(mod), fn)(str(tmp_path), data="bf16")


def test_the_dflash_trainer_names_a_missing_init_folder(tmp_path):
    from refimpl.train.dflash import train_dflash_smollm2

    with pytest.raises(ValueError, match="init: no folder"):
        train_dflash_smollm2(str(tmp_path), init=str(tmp_path / "nothing"))


def test_cached_shards_compute_once_resume_and_recompute_a_changed_shard(tmp_path):
    """Each shard is computed once and read back after; a changed row or key computes its shard again."""
    from refimpl.train.common import cached_shards

    calls = []

    def compute(part):
        calls.append(len(part))
        return [sum(r[0]) for r in part]

    rows = [([i, i + 1], 1) for i in range(7)]
    want = [2 * i + 1 for i in range(7)]
    assert cached_shards(rows, compute, None) == want and calls == [7]
    calls.clear()
    assert cached_shards(rows, compute, str(tmp_path), key=(1,), shard=3) == want and calls == [3, 3, 1]
    calls.clear()
    assert cached_shards(rows, compute, str(tmp_path), key=(1,), shard=3) == want and calls == []
    changed = rows[:4] + [([9, 9], 1)] + rows[5:]
    assert cached_shards(changed, compute, str(tmp_path), key=(1,), shard=3)[4] == 18 and calls == [3]
    calls.clear()
    assert cached_shards(rows, compute, str(tmp_path), key=(2,), shard=3) == want and calls == [3, 3, 1]
    assert not glob.glob(str(tmp_path / "*.part"))
