"""Run chapters in Jupyter kernels again and again on a loaded machine, and count the runs that stall.

    python tests/stress_kernels.py site    --runs 50 --load 2   # make site's build of chapters 00 and 02
    python tests/stress_kernels.py nbval   --runs 50 --load 2   # make test's nbval run of chapter 03
    python tests/stress_kernels.py widgets --runs 20 --load 2 --client stock   # the stall, in 3 s a run

``--load N`` keeps N busy processes running beside the runs (a second job, as CI's two pytest
workers are). A run *stalls* when it is stopped at its deadline or fails with a cell that ran past its
timeout; a run that fails otherwise is counted apart, with its error. For each stall the stacks of
every process the run started (``py-spy dump``, where py-spy is installed) go to ``--logs``.

``widgets`` runs a small notebook of ``interact`` widgets (each moved once, as the chapters' self-tests
do) through nbclient in this process, with the site builder's kernel client (``--client course``) or
nbclient's own (``--client stock``), and counts the cells that took their whole timeout: with the stock
client a reply that arrives while nbclient mirrors an Output widget's state back to the kernel is
read only at the cell's deadline (notebooks/build_site.py, ``ShellChannel``, says why).

Each mode prints one line per run and a summary; the exit status is 1 if any run stalled or failed.
docs/testing.md records the results.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import procs  # noqa: E402
from site_builder import SCRIPT as BUILD_SITE  # noqa: E402

# make test's environment (Makefile TEST_ENV): answers on, interpreter on, one thread, offline
TEST_ENV = {"TRITON_INTERPRET": "1", "COURSE_ANSWERS": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
STALL_WORDS = ("ran past", "Timeout of")   # build_site's and nbval's words for a cell past its timeout


def start_load(n: int) -> list[subprocess.Popen]:
    """``n`` processes that keep one core busy each."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def dump_stacks(tag: str, logs: str, label: str) -> str:
    """``py-spy dump`` of every process tagged ``tag`` into ``logs/label.txt``; -> the file, or why not."""
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))
    if not spy:
        return "(no py-spy: pip install py-spy to capture the stacks of a stall)"
    os.makedirs(logs, exist_ok=True)
    path = os.path.join(logs, f"{label}.txt")
    with open(path, "w") as f:
        for pid, line in sorted(procs.tagged(tag).items()):
            f.write(f"=== {pid} {line}\n")
            f.flush()
            subprocess.run([spy, "dump", "--pid", str(pid)], stdout=f, stderr=subprocess.STDOUT, timeout=60)
    return path


def one_command(mode: str, args, tmp: str) -> tuple[list[str], dict]:
    if mode == "site":
        out = os.path.join(tmp, "site")
        return ([sys.executable, BUILD_SITE, "--chapters", "00", "02", "--jobs", "2", "--out", out,
                 "--timeout", str(args.cell_timeout)], dict(os.environ))
    chapter = next(f for f in sorted(os.listdir(os.path.join(ROOT, "notebooks")))
                   if f.startswith(args.chapter + "_") and f.endswith(".ipynb"))
    return ([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
             f"--nbval-cell-timeout={args.cell_timeout}", os.path.join("notebooks", chapter)],
            dict(os.environ, **TEST_ENV))


def stress_commands(mode: str, args) -> list[str]:
    """site / nbval: the command, ``args.runs`` times, each under ``args.deadline``."""
    rows, times = [], []
    with tempfile.TemporaryDirectory() as tmp:
        cmd, env = one_command(mode, args, tmp)
        for i in range(args.runs):
            r = procs.run(cmd, timeout=args.deadline, env=env, cwd=ROOT)
            text = r.stdout + r.stderr
            if r.timed_out or (r.returncode and any(w in text for w in STALL_WORDS)):
                kind = "STALL"
            else:
                kind = "ok" if r.returncode == 0 else "FAILED"
            note = ""
            if kind == "STALL":
                note = dump_stacks(r.tag, args.logs, f"{mode}-{i}")   # the group is gone; kernels may linger
            left = procs.survivors(r.tag)
            if left:
                note += f" {len(left)} process(es) outlived the run: {sorted(left.values())}"
                procs.stop(left)
            if kind == "FAILED":
                note += "\n" + text[-1500:]
            times.append(r.seconds)
            rows.append(kind)
            print(f"{mode} run {i + 1}/{args.runs}: {kind} in {r.seconds:.0f} s {note}", flush=True)
    print(f"{mode}: {args.runs} runs, {rows.count('STALL')} stalls, {rows.count('FAILED')} other failures; "
          f"median {statistics.median(times):.0f} s, slowest {max(times):.0f} s, load {args.load}")
    return rows


WIDGET_CELL = """def play(a=1, b=2.0):
    global shown
    shown = f"a={a} b={b}"
    fig, ax = plt.subplots(figsize=(2, 2)); ax.plot([0, a], [0, b]); plt.show()
    display(HTML(shown))
ui = widgets.interact(play, a=widgets.IntSlider(value=1, min=0, max=10), b=widgets.FloatSlider(value=2.0)).widget"""
MOVE_CELL = "before = shown\nui.children[0].value = 5\nassert shown != before\nui.children[0].value = 1"


def widget_notebook(n: int = 10):
    """``n`` interact widgets, each moved once by the next cell (as the chapters' self-tests do)."""
    from nbformat.v4 import new_code_cell, new_notebook

    cells = [new_code_cell("import ipywidgets as widgets\nimport matplotlib.pyplot as plt\n"
                           "from IPython.display import HTML, display")]
    for _ in range(n):
        cells += [new_code_cell(WIDGET_CELL), new_code_cell(MOVE_CELL)]
    return new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}})


def stress_widgets(args) -> list[str]:
    """The widget notebook through nbclient in this process; a cell that took its whole timeout stalled."""
    from jupyter_client import AsyncKernelManager
    from nbclient import NotebookClient

    from site_builder import builder

    manager = builder.KernelManager if args.client == "course" else AsyncKernelManager
    rows = []
    for i in range(args.runs):
        nb, stalled, start = widget_notebook(), [], time.monotonic()
        client = NotebookClient(nb, timeout=args.cell_timeout, kernel_name="python3", store_widget_state=True,
                                kernel_manager_class=manager)
        with client.setup_kernel(env=dict(os.environ, MPLBACKEND="module://matplotlib_inline.backend_inline")):
            for index, cell in enumerate(nb.cells):
                t = time.monotonic()
                client.execute_cell(cell, index)
                if time.monotonic() - t >= args.cell_timeout:
                    stalled.append(index)
        rows.append("STALL" if stalled else "ok")
        print(f"widgets ({args.client} client) run {i + 1}/{args.runs}: {rows[-1]} in "
              f"{time.monotonic() - start:.0f} s" + (f", cells {stalled} took their whole timeout" if stalled else ""),
              flush=True)
    print(f"widgets ({args.client} client): {args.runs} runs, {rows.count('STALL')} stalled, load {args.load}")
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=["site", "nbval", "widgets"])
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--load", type=int, default=2, help="busy processes running beside the runs (default 2)")
    p.add_argument("--chapter", default="03", help="nbval: the chapter to run (default 03)")
    p.add_argument("--client", choices=["course", "stock"], default="course", help="widgets: whose kernel client")
    p.add_argument("--cell-timeout", type=int, default=None,
                   help="seconds a cell may run (default: 60 for site and nbval, 10 for widgets)")
    p.add_argument("--deadline", type=float, default=300, help="site / nbval: seconds a whole run may take")
    p.add_argument("--logs", default=os.path.join(ROOT, "build", "stress"), help="where stacks of stalls go")
    args = p.parse_args(argv)
    if args.runs < 1 or args.load < 0:
        raise ValueError(f"runs: {args.runs}, load: {args.load}; runs >= 1 and load >= 0")
    args.cell_timeout = args.cell_timeout or (10 if args.mode == "widgets" else 60)
    load = start_load(args.load)
    try:
        rows = stress_widgets(args) if args.mode == "widgets" else stress_commands(args.mode, args)
    finally:
        for q in load:
            q.kill()
            q.wait()
    return 0 if all(r == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
