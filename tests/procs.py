"""The processes a test run starts, and the proof that none of them outlives it.

A Jupyter kernel runs in a session of its own (jupyter_client starts it so), so killing the process
group of whatever started it does not reach it: it leaves when ipykernel notices that its parent has
gone (it polls its parent's pid once a second). To find every process a run started, wherever it
ended up, the run's environment carries a tag (:data:`TAG`), which every child inherits (kernels,
pool workers, servers, browsers); Linux shows each process's environment in ``/proc/PID/environ``.

- :func:`run` runs a command in its own process group, with a deadline; past it, the group gets
  SIGTERM, then SIGKILL.
- :func:`survivors` lists the processes that still carry a tag, after a grace period.
- ``python tests/procs.py -- CMD ...`` runs ``CMD`` tagged, then fails (exit 3) if any process it
  started is still running once it has exited, naming them and stopping them (``make test`` runs
  pytest this way). It does not rely on the tag alone: it makes itself the "child subreaper" of what it
  starts (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``), so a process whose parent has gone is handed to it
  rather than to init, and it also counts every process below it in the parent links that
  ``/proc/PID/stat`` shows (:func:`descendants`). Either view alone catches a leftover; a machine whose
  ``/proc`` hides other processes' environments still has the second. Every ``/proc`` read is bounded
  (:func:`read_proc`): a process stuck in the kernel cannot stall the check.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass

TAG = "COURSE_PROCESS_TAG"
GRACE_S = 10.0   # a kernel leaves within ~1 s of its parent; a server's shutdown takes a few seconds


STUCK: set[int] = set()   #: pids whose /proc files did not answer in time: not read again
READ_S = 2.0              # a /proc read that takes longer is given up (see read_proc)


def read_proc(pid: int, name: str) -> bytes | None:
    """``/proc/PID/name``'s bytes, or None (gone, not ours to read, or stuck). Reading another process's
    ``environ`` or ``cmdline`` takes that process's memory lock, and a process stuck holding it (in
    uninterruptible sleep) blocks the reader: the read runs in a daemon thread, given up after
    :data:`READ_S` seconds, and that pid is not read again."""
    if pid in STUCK:
        return None
    box: list = [None]

    def read():
        try:
            with open(f"/proc/{pid}/{name}", "rb") as f:
                box[0] = f.read()
        except OSError:
            pass
    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(READ_S)
    if t.is_alive():
        STUCK.add(pid)
        return None
    return box[0]


def pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()] if os.path.isdir("/proc") else []


def tagged(tag: str) -> dict[int, str]:
    """{pid: command line} of the live processes whose environment carries ``TAG=tag`` (this one
    excepted); {} where ``/proc`` does not exist or shows no environments."""
    needle, found = f"{TAG}={tag}".encode(), {}
    for pid in pids():
        if pid == os.getpid():
            continue
        env = read_proc(pid, "environ")
        if env is None or needle not in env.split(b"\0"):
            continue
        stat = read_proc(pid, "stat")
        if stat is None or stat.rsplit(b")", 1)[1].split()[0] == b"Z":   # gone, or exited and not yet reaped
            continue
        found[pid] = command_line(pid)
    return found


def parents() -> dict[int, int]:
    """{pid: parent pid} of the live processes ``/proc/PID/stat`` shows (zombies left out)."""
    found = {}
    for pid in pids():
        stat = read_proc(pid, "stat")
        if stat is None:
            continue
        fields = stat.rsplit(b")", 1)[1].split()
        if fields[0] != b"Z":
            found[pid] = int(fields[1])
    return found


def command_line(pid: int) -> str:
    line = read_proc(pid, "cmdline")
    return "?" if line is None else line.replace(b"\0", b" ").decode(errors="replace").strip()


def descendants(root: int) -> dict[int, str]:
    """{pid: command line} of the live processes below ``root`` in the parent links."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents().items():
        children.setdefault(ppid, []).append(pid)
    found, todo = {}, list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        found[pid] = command_line(pid)
        todo.extend(children.get(pid, ()))
    return found


def become_subreaper() -> bool:
    """Make this process the child subreaper of its descendants (Linux >= 3.4); -> whether it is."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0   # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def reap() -> bool:
    """Collect the exit status of every child of this process that has exited (orphans handed to a
    subreaper come back to it as children); -> whether a child is still running."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def survivors(tag: str, grace_s: float = GRACE_S) -> dict[int, str]:
    """The processes still tagged ``tag`` after up to ``grace_s`` seconds of waiting for them to leave."""
    deadline = time.monotonic() + grace_s
    while True:
        left = tagged(tag)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.2)


def stop(pids) -> None:
    """SIGKILL each pid (already gone: ignored)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@dataclass
class Run:
    returncode: int | None   #: None: stopped at its deadline
    stdout: str
    stderr: str
    seconds: float
    tag: str

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


def tagged_env(env: dict | None = None) -> tuple[dict, str]:
    """(a copy of ``env`` (default: this process's) with a fresh :data:`TAG`, the tag)."""
    tag = uuid.uuid4().hex
    return dict(os.environ if env is None else env, **{TAG: tag}), tag


def run(cmd: list[str], timeout: float, env: dict | None = None, cwd=None, term_grace_s: float = 5.0) -> Run:
    """``cmd`` in a new session (its own process group), tagged, its output captured; past ``timeout``
    seconds the group gets SIGTERM, and SIGKILL ``term_grace_s`` seconds later. The run ends when ``cmd``
    exits, even where a process it left running still holds its output (the output goes to files, not
    pipes); :func:`survivors` finds such processes."""
    if timeout <= 0:
        raise ValueError(f"timeout: {timeout} s; a positive number of seconds")
    env, tag = tagged_env(env)
    start = time.monotonic()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=err, text=True, start_new_session=True)
        try:
            code = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
            for sig, wait in ((signal.SIGTERM, term_grace_s), (signal.SIGKILL, None)):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    p.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        texts = []
        for f in (out, err):
            f.seek(0)
            texts.append(f.read())
    return Run(code, texts[0], texts[1], time.monotonic() - start, tag)


def main(argv: list[str]) -> int:
    """``[--grace S] -- CMD ...``: run CMD tagged (in this process group: Ctrl-C reaches it), then exit 3 if any
    process it started is still running ``S`` (default ``GRACE_S``) seconds after it exited; else CMD's status."""
    grace = GRACE_S
    if argv[:1] == ["--grace"] and len(argv) > 1:
        grace, argv = float(argv[1]), argv[2:]
    if not argv or argv[0] != "--" or len(argv) < 2:
        print("usage: python tests/procs.py [--grace SECONDS] -- CMD [ARGS...]", file=sys.stderr)
        return 2
    env, tag = tagged_env()
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C reaches CMD (same group); this one waits for it
    become_subreaper()
    code = subprocess.Popen(argv[1:], env=env).wait()
    deadline = time.monotonic() + grace
    while True:
        running = reap()
        left = {**descendants(os.getpid()), **tagged(tag)}
        if not (left or running) or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    if running and not left:   # a child of this subreaper that /proc does not show
        print(f"a process that {argv[1]} started outlived it; this machine's /proc does not show which",
              file=sys.stderr)
        return 3
    if left:
        print(f"{len(left)} process(es) that {argv[1]} started outlived it (stopped now):", file=sys.stderr)
        for pid, line in sorted(left.items()):
            print(f"  {pid} {line[:200]}", file=sys.stderr)
        stop(left)
        return 3
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
