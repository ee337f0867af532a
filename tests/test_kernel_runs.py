"""Every place that runs a chapter in a kernel fails fast on a cell that never ends, names the cell, and
leaves no process running; and the site builder's kernel client reads a reply as soon as it arrives.

The reply: nbclient sends on the shell channel (mirroring an Output widget's state back to the kernel)
while it waits there for a cell's reply. jupyter_client sends through a blocking shadow of the asyncio
socket, and libzmq's send consumes the wake-up of a reply that arrived just before it: the stock
channel then reads the reply only at its poll's timeout (the negative control), the builder's
``ShellChannel`` at once. The race is made deterministic here: the reply is in the client's socket
before the send, and the event loop does not run in between.

A stalled cell: a chapter whose cell sleeps forever, run by the site builder (``--timeout``) and by
nbval (``--nbval-cell-timeout``, as ``make test`` and ``make test-learner`` run it). Each run carries a
tag in its environment (tests/procs.py), so the kernels, which run in sessions of their own, are found
wherever they are.
"""
import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import procs
from site_builder import SCRIPT, builder, write_notebook

ROOT = Path(__file__).resolve().parent.parent
STALL = "import time\nwhile True:\n    time.sleep(1)"

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.path.isdir("/proc"), reason="finding a run's processes reads /proc (Linux)")]


async def wait_for_reply_sent_past(channel_class, timeout_s: float) -> tuple[str, float]:
    """A fake kernel (a ROUTER socket) answers a client's channel; the reply reaches the client's socket
    while the client waits for it, then the client sends once on the same socket before its event loop
    runs again. -> (the type of the message read, seconds the wait took after that send)."""
    import zmq
    import zmq.asyncio
    from jupyter_client.session import Session

    kernel = zmq.Context.instance().socket(zmq.ROUTER)
    port = kernel.bind_to_random_port("tcp://127.0.0.1")
    sock = zmq.asyncio.Context.instance().socket(zmq.DEALER)
    sock.connect(f"tcp://127.0.0.1:{port}")
    session = Session()
    try:
        channel = channel_class(sock, session)
        channel.send(session.msg("kernel_info_request"))
        ident = kernel.recv_multipart()[0]                     # the kernel knows the client now
        waiting = asyncio.ensure_future(channel.get_msg(timeout=timeout_s))
        await asyncio.sleep(0.01)                             # the client's poll is registered
        session.send(kernel, session.msg("execute_reply"), ident=ident)
        time.sleep(0.05)                                      # the reply arrives; the loop does not run
        channel.send(session.msg("comm_msg"))                 # an Output widget's state, mirrored back
        start = time.monotonic()
        msg = await waiting
        return msg["header"]["msg_type"], time.monotonic() - start
    finally:
        sock.close(linger=0)
        kernel.close(linger=0)


def test_the_builders_client_reads_a_reply_at_once_even_when_it_sends_meanwhile():
    from jupyter_client.channels import AsyncZMQSocketChannel

    kind, waited = asyncio.run(wait_for_reply_sent_past(builder.ShellChannel, timeout_s=2))
    assert kind == "execute_reply" and waited < 0.5, f"the builder's channel waited {waited:.2f} s for a reply that was there"
    kind, waited = asyncio.run(wait_for_reply_sent_past(AsyncZMQSocketChannel, timeout_s=2))
    assert kind == "execute_reply"
    assert waited > 1.5, (f"jupyter_client's own channel read the reply after {waited:.2f} s: the send no longer "
                          "hides the reply's arrival, and ShellChannel may no longer be needed")


def stalling_chapters(src: Path, started: Path | None = None):
    """Two chapters; the second's cell 2 never ends (having touched ``started``, when given, first)."""
    touch = "" if started is None else f"open({str(started)!r}, 'w').close()\n"
    write_notebook(src, "01_fine.ipynb", ["x = 1", "print(x)"])
    write_notebook(src, "02_stalls.ipynb", ["x = 1", touch + STALL, "y = 2"])


def test_a_cell_that_never_ends_fails_the_build_in_its_timeout_naming_it_and_nothing_outlives_the_build(tmp_path):
    stalling_chapters(tmp_path / "src")
    run = procs.run([sys.executable, str(SCRIPT), "--src", str(tmp_path / "src"), "--out", str(tmp_path / "out"),
                     "--jobs", "2", "--timeout", "5"], timeout=120, cwd=ROOT)
    assert not run.timed_out, "the build did not stop at its cell timeout"
    assert run.returncode == 1 and run.seconds < 60, (run.returncode, run.seconds, run.stderr[-2000:])
    assert re.search(r"02_stalls\.ipynb: cell 2 \(.*first line: 'import time'\) ran past 5 s", run.stderr), run.stderr[-2000:]
    left = procs.survivors(run.tag)
    procs.stop(left)
    assert not left, f"processes that outlived the build: {left}"


def test_a_build_stopped_by_its_caller_leaves_no_kernel_or_worker_behind(tmp_path):
    """The caller's deadline comes first (the cell's timeout is longer): stopping the build's process
    group stops its workers, and their kernels (in sessions of their own) follow their parents out."""
    stalling_chapters(tmp_path / "src", tmp_path / "started")
    run = procs.run([sys.executable, str(SCRIPT), "--src", str(tmp_path / "src"), "--out", str(tmp_path / "out"),
                     "--jobs", "2", "--timeout", "600"], timeout=15, cwd=ROOT)
    assert run.timed_out and (tmp_path / "started").exists(), "stopped before its kernel ran the stalled cell"
    left = procs.survivors(run.tag)
    procs.stop(left)
    assert not left, f"processes that outlived the stopped build: {left}"


def test_nbval_fails_a_cell_that_never_ends_naming_it_and_nothing_outlives_the_run(tmp_path):
    """As make test and make test-learner run nbval (--nbval-cell-timeout, from the Makefile)."""
    for target in ("test", "test-learner", "test-gpu"):
        recipe = subprocess.run(["make", "-n", "-o", ".venv/.installed", "-o", "setup", target], cwd=ROOT,
                                capture_output=True, text=True, check=True).stdout.replace("\\\n", " ")
        runs = [c for c in re.split(r"[;\n]", recipe) if "--nbval-lax" in c]
        limits = [int(m) for c in runs for m in re.findall(r"--nbval-cell-timeout=(\d+)", c)]
        assert runs and len(limits) == len(runs), f"make {target}: every nbval run has a cell timeout: {runs}"
        assert all(60 <= t <= 600 for t in limits), f"make {target}: {limits} s, past the slowest cell, short of CI's limit"
        if target != "test-gpu":
            assert all("tests/procs.py --" in c for c in runs), f"make {target}: checks that nothing outlives it"
    nb = write_notebook(tmp_path, "02_stalls.ipynb", ["x = 1", STALL, "y = 2"])
    run = procs.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
                     "--nbval-cell-timeout=5", str(nb)], timeout=120, cwd=tmp_path)
    out = run.stdout + run.stderr
    assert not run.timed_out and run.returncode == 1, (run.returncode, out[-2000:])
    assert re.search(r"02_stalls\.ipynb::Cell 1\b", out) and "Timeout of 5 seconds exceeded" in out, out[-2000:]
    left = procs.survivors(run.tag)
    procs.stop(left)
    assert not left, f"processes that outlived the nbval run: {left}"


def test_the_process_check_names_what_a_command_leaves_running(tmp_path):
    """``python tests/procs.py -- CMD`` (how make test runs pytest) fails when CMD leaves a process
    running, naming and stopping it (negative controls: a sleeper left in CMD's own session, and one in a
    session of its own, as a kernel runs), and passes through CMD's status otherwise."""
    helper = str(ROOT / "tests" / "procs.py")
    named = os.getpid() in procs.parents()   # else /proc shows another pid namespace: the check counts only
    for session in (False, True):
        leave = (f"import subprocess; subprocess.Popen(['sleep', '300'], start_new_session={session}, "
                 "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)")
        run = procs.run([sys.executable, helper, "--grace", "1", "--", sys.executable, "-c", leave], timeout=60)
        seen = {"tagged": procs.tagged(run.tag), "processes /proc shows": len(procs.parents())}
        assert run.returncode == 3, (run.returncode, run.stderr, seen)
        assert ("sleep 300" if named else "does not show which") in run.stderr, (run.stderr, seen)
        assert not procs.survivors(run.tag, grace_s=2), "the check stops what it finds"
    run = procs.run([sys.executable, helper, "--", "sh", "-c", "exit 7"], timeout=60)
    assert run.returncode == 7 and not run.stderr


def test_a_process_whose_proc_files_hang_does_not_hang_the_check(monkeypatch):
    """Reading another process's /proc/PID/environ blocks while that process is stuck holding its memory
    lock; the check gives such a read up after procs.READ_S seconds and never reads that pid again."""
    import threading

    stuck, real_open = os.getppid(), open

    def hanging_open(path, *args, **kwargs):
        if str(path) == f"/proc/{stuck}/environ":
            threading.Event().wait(60)                 # a read that does not answer
        return real_open(path, *args, **kwargs)
    monkeypatch.setattr(procs, "open", hanging_open, raising=False)
    monkeypatch.setattr(procs, "STUCK", set())
    start = time.monotonic()
    assert procs.tagged("no such tag") == {}
    assert time.monotonic() - start < procs.READ_S + 5 and stuck in procs.STUCK
    start = time.monotonic()
    procs.tagged("no such tag")
    assert time.monotonic() - start < procs.READ_S, "a stuck pid is not read again"
