"""refimpl.models.threads: decode with the cores that are free, not with every core."""
import pytest
import torch

from refimpl.models import threads


def test_choose_takes_the_free_cores_and_at_least_one():
    assert threads.choose(2, 0) == 2
    assert threads.choose(2, 1) == 1
    assert threads.choose(2, 5) == 1
    assert threads.choose(8, 3) == 5
    assert threads.choose(4, None) == 4, "load unknown: every core, as torch would"
    with pytest.raises(ValueError, match="cores"):
        threads.choose(0, 0)


def test_busy_cores_reads_proc_stat_for_this_process_cpus(monkeypatch):
    """Two samples of /proc/stat: cpu0 busy 90% of the interval, cpu1 10%, cpu2 outside our affinity."""
    samples = iter([{0: (0, 0), 1: (0, 0), 2: (0, 0)}, {0: (90, 100), 1: (10, 100), 2: (100, 100)}])
    monkeypatch.setattr(threads, "_cpu_times", lambda: next(samples))
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1})
    assert threads.busy_cores(0.001) == 1
    with pytest.raises(ValueError, match="sample_s"):
        threads.busy_cores(0)


def test_the_real_proc_stat_gives_a_count_within_the_affinity_set():
    n = threads.busy_cores(0.05)
    assert n is None or 0 <= n <= len(threads.os.sched_getaffinity(0))


@pytest.fixture()
def keep_threads():
    before = torch.get_num_threads()
    threads._last_fit.clear()
    yield
    torch.set_num_threads(before)
    threads._last_fit.clear()


def test_fit_to_load_follows_refimpl_threads(monkeypatch, keep_threads):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("REFIMPL_THREADS", "1")
    assert threads.fit_to_load() == 1 and torch.get_num_threads() == 1
    monkeypatch.setenv("REFIMPL_THREADS", "off")
    torch.set_num_threads(2)
    assert threads.fit_to_load() == 2, "off: torch's setting stays"
    monkeypatch.setenv("REFIMPL_THREADS", "auto")
    monkeypatch.setattr(threads, "busy_cores", lambda: 1)
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1})
    assert threads.fit_to_load() == 1, "one of two cores busy elsewhere: one thread"
    monkeypatch.setattr(threads, "busy_cores", lambda: 0)
    assert threads.fit_to_load() == 1, "a fit is reused for a few seconds (a target and its draft)"
    threads._last_fit.clear()
    assert threads.fit_to_load() == 2, "idle again: both cores"
    monkeypatch.setenv("REFIMPL_THREADS", "many")
    with pytest.raises(ValueError, match="REFIMPL_THREADS"):
        threads.fit_to_load()


def test_an_explicit_omp_num_threads_wins(monkeypatch, keep_threads):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("REFIMPL_THREADS", raising=False)
    monkeypatch.setattr(threads, "busy_cores", lambda: pytest.fail("must not sample the load"))
    torch.set_num_threads(1)
    assert threads.fit_to_load() == 1


def test_the_load_benchmark_table_pairs_idle_and_loaded_runs():
    from refimpl.bench import load

    rows = [dict(policy="1 thread", competitors=c, engine=e, tok_s=s, threads=1)
            for c, e, s in ((0, "ours", 30.0), (0, "hf", 10.0), (1, "ours", 24.0), (1, "hf", 5.0))]
    md = load.table(rows)
    assert "| 1 thread | our AR | 30.0 (1) | 24.0 (1) | 0.80 |" in md
    assert "| 1 thread | HF generate | 10.0 (1) | 5.0 (1) | 0.50 |" in md
    assert set(load.POLICIES) >= {"torch default", "1 thread", "fit to load"}
    with pytest.raises(ValueError, match="tokens"):
        load.main(["--tokens", "0"])
    with pytest.raises(ValueError, match="engine"):
        load.measure("tiny", "vllm", 4, 1)


def test_the_load_benchmark_labels_the_fastest_method_engine():
    from refimpl.bench import load

    rows = [dict(policy="fit to load", competitors=c, engine="best", tok_s=s, threads=2 - c)
            for c, s in ((0, 60.0), (1, 45.0))]
    assert "| fit to load | fastest method | 60.0 (2) | 45.0 (1) | 0.75 |" in load.table(rows)
