"""How many CPU threads a decoder should use: the cores that are free now, not every core.

A decoding step of a small model is a chain of short parallel regions (one per matrix product, or
one per layer in :mod:`refimpl.models.cpu_gemv`), each ending at a barrier where torch's OpenMP
threads wait for the slowest of them. With every core busy elsewhere, one of our threads shares a
core with another process: it runs in that process's time slices, so every barrier waits for it,
and the threads that arrive first spin on their cores meanwhile. One thread then decodes faster
than two (``bench_results/load/README.md``, SmolLM2-135M on a 2-core machine next to one spinning
process: our AR at 12.5 tok/s with 2 threads, 40.4 with 1, against 47-58 idle with 2; letting
waiting threads sleep, ``OMP_WAIT_POLICY=PASSIVE``, also helps there but costs ~30% when idle).

:func:`fit_to_load` samples ``/proc/stat`` for a fraction of a second and sets
``torch.set_num_threads`` to the cores of this process's affinity set that are not busy with other
work (at least one). :func:`refimpl.models.load` calls it, because the thread count is read when a
model's fused kernels are set up. ``REFIMPL_THREADS`` controls it: unset or ``auto`` = fit to the
load; a number = exactly that many threads; ``off`` = leave torch's setting alone. An explicit
``OMP_NUM_THREADS`` in the environment (as ``make test`` sets) is respected the same way as ``off``.
"""
from __future__ import annotations

import os
import time

import torch

#: a core counts as busy when other processes kept it at least this busy during the sample
BUSY = 0.5
#: the sample's length: long enough to average the scheduler's ticks (10 ms), short next to a load
SAMPLE_S = 0.2
#: loads within this many seconds of a fit reuse it (a chapter loads a target and its drafts at once)
REUSE_S = 10.0
_last_fit: list = []   # [(time.monotonic(), threads)] of the latest fit


def _cpu_times() -> dict[int, tuple[int, int]]:
    """{cpu index: (busy ticks, total ticks)} from ``/proc/stat`` (idle and iowait count as idle)."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and line[3].isdigit():
                name, *vals = line.split()
                ticks = [int(v) for v in vals[:8]]
                out[int(name[3:])] = (sum(ticks) - ticks[3] - ticks[4], sum(ticks))
    return out


def busy_cores(sample_s: float = SAMPLE_S) -> int | None:
    """How many cores of this process's affinity set other processes keep busy (>= :data:`BUSY`)
    over ``sample_s`` seconds, or None where ``/proc/stat`` cannot be read (not Linux). This
    process sleeps during the sample, so its own threads do not count."""
    if sample_s <= 0:
        raise ValueError(f"sample_s must be > 0, got {sample_s}")
    try:
        mine = os.sched_getaffinity(0)
        a = _cpu_times()
        time.sleep(sample_s)
        b = _cpu_times()
    except (OSError, AttributeError, ValueError, IndexError):
        return None
    count = 0
    for cpu in mine:
        if cpu in a and cpu in b and b[cpu][1] > a[cpu][1]:
            count += (b[cpu][0] - a[cpu][0]) / (b[cpu][1] - a[cpu][1]) >= BUSY
    return count


def choose(cores: int, busy: int | None) -> int:
    """Threads for ``cores`` usable cores of which ``busy`` are taken by other work: the free ones,
    at least 1 (every core, when the load is unknown)."""
    if cores < 1:
        raise ValueError(f"cores must be >= 1, got {cores}")
    return cores if busy is None else max(1, cores - max(0, int(busy)))


def fit_to_load() -> int:
    """Set torch's intra-op threads from ``REFIMPL_THREADS`` (see the module's docstring) and
    return the count in use."""
    setting = os.environ.get("REFIMPL_THREADS", "auto").strip().lower()
    if setting == "off" or (setting == "auto" and os.environ.get("OMP_NUM_THREADS")):
        return torch.get_num_threads()
    if setting == "auto":
        if _last_fit and time.monotonic() - _last_fit[0][0] < REUSE_S:
            return torch.get_num_threads()
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        n = choose(cores, busy_cores())
        _last_fit[:] = [(time.monotonic(), n)]
    elif setting.isdigit() and int(setting) >= 1:
        n = int(setting)
    else:
        raise ValueError(f"REFIMPL_THREADS must be 'auto', 'off' or a positive integer, got {setting!r}")
    if n != torch.get_num_threads():
        torch.set_num_threads(n)
    return n
