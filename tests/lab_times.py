"""Each chapter's Run All as a learner meets it, timed: ``python tests/lab_times.py [--chapters 00 09 ...]``.

JupyterLab runs headless on a free local port with ``make lab``'s settings (the Triton interpreter off, the
exercises unsolved: no ``COURSE_ANSWERS``, the chapters' plumbing on ``PYTHONPATH``) over the learner's
copy of the chapters (``notebooks/work_copy.py``); Chromium, driven by Playwright, opens one chapter at a
time in a fresh workspace, waits for its kernel, runs JupyterLab's own Run All, then stops that kernel. A chapter's time is Run All's wall clock,
from the command to the last cell's reply, rendering included (its kernel's start is not counted: a
learner's kernel starts when the chapter opens). A chapter whose Run All shows an error output or a
traceback, or leaves a cell unrun, is listed with what went wrong, and the script exits 1.

``--out FILE`` writes ``{"date", "machine", "chapters": {id: {"seconds", "slowest", "problems"}}}``, which
``python notebooks/workshop_times.py --lab FILE`` turns into the workshop guide's lab column; ``--shots
DIR`` keeps a screenshot of each chapter after its Run All.
"""
from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

LEARNER_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
               "PYTHONPATH": str(ROOT / "notebooks")}
UNSET = ("TRITON_INTERPRET", "OMP_NUM_THREADS", "COURSE_ANSWERS")
RUN_ALL_LIMIT_S = 600   # a chapter runs in about a minute; past this, it is reported and the next one starts


def chapters(wanted: list[str] | None) -> list[str]:
    names = sorted(os.path.basename(p) for p in glob.glob(str(ROOT / "notebooks" / "[0-9][0-9]*_*.ipynb")))
    if wanted:
        unknown = sorted(set(wanted) - {n.split("_")[0] for n in names})
        if unknown:
            raise ValueError(f"chapters: no chapter {unknown}; chapters are {[n.split('_')[0] for n in names]}")
        names = [n for n in names if n.split("_")[0] in wanted]
    return names


@contextlib.contextmanager
def learner_lab():
    """JupyterLab as ``make lab`` starts it (the learner's environment, the lab's default settings plus cell
    timings and no autosave) over a fresh learner's copy of the chapters, and a headless Chromium;
    yields ``(browser, base URL, token)``. Both stop afterwards, and the copy is deleted."""
    import test_browser as tb
    from lab_server import serve
    from playwright import sync_api

    with tempfile.TemporaryDirectory(prefix="lab-times-") as tmp:
        tmp = Path(tmp)
        work = tmp / "work"
        subprocess.run([sys.executable, str(ROOT / "notebooks" / "work_copy.py"), str(work)], check=True,
                       stdout=subprocess.DEVNULL)
        # the lab's defaults, plus cell timings and no autosave; of the test lab's variables only its folders
        settings = {name: '{"recordTiming": true}' if "notebook-extension" in name else text
                    for name, text in tb.SETTINGS.items()}
        folders = {k: v for k, v in tb.lab_env(tmp, settings).items() if k.startswith("JUPYTERLAB_")}
        with serve("jupyterlab", work, tmp, dict(LEARNER_ENV, **folders), ["--LabApp.expose_app_in_browser=True"],
                   unset=UNSET) as (base, token):
            with sync_api.sync_playwright() as p:
                browser = p.chromium.launch(executable_path=tb.CHROMIUM, headless=True, args=tb.CHROMIUM_ARGS)
                try:
                    yield browser, base, token
                finally:
                    browser.close()


@contextlib.contextmanager
def chapter_page(browser, base: str, token: str, name: str):
    """A page with chapter ``name`` open in a fresh workspace of its own (no tab, and no kernel, of an
    earlier chapter comes back) and its kernel ready; afterwards the page closes and the chapter's kernel stops."""
    import test_browser as tb
    from lab_server import request

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(f"{base}/lab/workspaces/{name[:-6]}/tree/{name}?reset&token={token}")
        page.wait_for_function(tb.KERNEL_READY, arg=name, timeout=120_000, polling=250)
        yield page
    finally:
        page.close()
        for session in request(base, token, "/api/sessions")[1]:   # the chapter's kernel stops with its page
            request(base, token, f"/api/sessions/{session['id']}", "DELETE")


def run_all(page, name: str) -> tuple[float, list[str]]:
    """JupyterLab's own Run All on the open chapter ``name``; -> (its wall clock in seconds, the problems:
    error outputs, tracebacks on the page, cells left unrun, a Run All past :data:`RUN_ALL_LIMIT_S`)."""
    import test_browser as tb

    page.evaluate(f"""(name) => {{
        const panel = ({tb.PANEL})(name);
        window.jupyterapp.shell.activateById(panel.id);
        window.jupyterapp.commands.execute('notebook:run-all-cells');
    }}""", name)
    start, problems = time.monotonic(), []
    while not page.evaluate(tb.RUN_STATE, name)[0]:
        if time.monotonic() - start > RUN_ALL_LIMIT_S:
            problems.append(f"Run All did not finish in {RUN_ALL_LIMIT_S} s")
            break
        page.wait_for_timeout(250)
    return time.monotonic() - start, problems + page.evaluate(tb.PROBLEMS, name)


def run_chapter(browser, base: str, token: str, name: str, shots: Path | None, move: bool = False) -> dict:
    """Open ``name``, wait for its kernel, Run All; -> {"seconds", "slowest", "problems"}. ``move``: then
    press an arrow key on the chapter's first slider, as a learner would, and add ``"slider"``: [value
    before, value after, whether the widget's picture or text changed]; an error the redraw raises is
    one of the problems."""
    import test_browser as tb

    with chapter_page(browser, base, token, name) as page:
        seconds, problems = run_all(page, name)
        if shots is not None:
            page.screenshot(path=str(shots / f"{name[:-6]}.png"), full_page=True)
        slowest = sorted(page.evaluate(tb.TIMINGS, name), key=lambda t: -t[1])[:3]
        out = {"seconds": round(seconds, 1), "slowest": [[i, round(s, 1)] for i, s in slowest], "problems": problems}
        slider = page.locator(tb.SLIDERS).first
        if move and not problems and slider.count():
            if slider.get_attribute("disabled") is not None:
                out["slider"] = "greyed out"   # a slider the widget disables until another control moves
            else:
                before, after, v0, v1 = tb.move_first_slider(page, name, wait_s=30)
                out["slider"] = [v0, v1, after != before]
                problems += [p for p in page.evaluate(tb.PROBLEMS, name) if p not in problems]
                if shots is not None:
                    slider.locator("xpath=ancestor::div[contains(concat(' ', @class, ' '), ' jp-Cell ')][1]").screenshot(
                        path=str(shots / f"{name[:-6]}-slider.png"))
        return out


def summary(name: str, r: dict) -> str:
    """One line of a chapter's :func:`run_chapter` result."""
    line = f"{name}: Run All {r['seconds']:.0f} s; slowest cells (index, s) {r['slowest']}"
    if isinstance(r.get("slider"), list):
        v0, v1, changed = r["slider"]
        line += f"; first slider {v0} -> {v1}, widget {'changed' if changed else 'UNCHANGED'}"
    elif "slider" in r:
        line += f"; first slider {r['slider']}"
    return line + (f"; PROBLEMS {r['problems']}" if r["problems"] else "")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chapters", nargs="*", help="chapter ids (00, 06a, 15b); default: all")
    ap.add_argument("--out", help="JSON file for the times")
    ap.add_argument("--shots", help="folder for a screenshot of each chapter after Run All")
    ap.add_argument("--move", action="store_true", help="after Run All, move each chapter's first slider "
                    "(a screenshot of its cell with --shots); not part of the time")
    args = ap.parse_args(argv)
    names = chapters(args.chapters)

    shots = Path(args.shots) if args.shots else None
    if shots:
        shots.mkdir(parents=True, exist_ok=True)
    results = {}
    with learner_lab() as (browser, base, token):
        for name in names:
            results[name.split("_")[0]] = r = run_chapter(browser, base, token, name, shots, args.move)
            print(summary(name, r), flush=True)
    if args.out:
        report = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                  "chapters": results}
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    bad = {k: r["problems"] for k, r in results.items() if r["problems"]}
    if bad:
        print(f"chapters with problems: {bad}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
