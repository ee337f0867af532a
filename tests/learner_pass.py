"""A learner's pass through chapters in Chromium, every exercise answered wrongly and then rightly, every
slider moved: ``python tests/learner_pass.py [--chapters 09 12 15 15b 16] [--shots /tmp/learner_pass]``.

The lab, the learner's copy of the chapters and the browser are ``tests/lab_times.py``'s (``learner_lab``,
``chapter_page``, ``run_all``): JupyterLab as ``make lab`` starts it, the exercises unsolved. Each chapter
is opened and Run All; then each exercise stub (a cell with ``@exercise("NN", "name")``), in order, is
answered a few times. A try sets the body of the stub's function (the cell's source, set through
JupyterLab's model as typing would; the decorator and ``def`` line stay), runs the stub's cell, then its
check cell (the next code cell calling ``check("Exercise N", ...)``), and reads that cell's verdict line
"Exercise N: ...". The tries, in order:

- ``as given``: the stub as Run All left it, unchanged: "not attempted yet";
- ``no return``: the reference answer's body (``notebooks/solutions/chNN.py``) with every ``return X``
  turned into ``result = X``, so the function falls off its end: the verdict must say it returned None;
- ``typo``: the reference answer with its first use of a parameter misspelt (a NameError): the verdict
  must quote the learner's own line ("line N of your cell: ...");
- ``wrong: ...``: the reference answer with a learner-like mistake (:data:`MISTAKES`; for 15b's
  Exercise 1 two, one each way: a mask that lets an item see what it must not, and one that hides what
  it must see, whose two verdict lines must differ): "wrong", blaming no other cell;
- ``interrupt``: an answer that prints, then loops forever, interrupted (Kernel > Interrupt) once its
  print shows: "stopped: you interrupted the check ...";
- ``right``: the reference answer's body: "correct" (and the stub stays right for the rest of the pass).

Every slider of the chapter is moved one step with an arrow key (``test_browser.move_first_slider``; a
slider greyed out until another control of its widget changes gets that dropdown's next option first) twice:
right after Run All (the exercises unsolved: a widget may use the learner's function) and after the exercises
(answered right); the script records whether the widget's picture or text changed and whether an error showed.

A problem is: an error output or a traceback (in the cells run, or anywhere on the page, a widget's output
included), a verdict other than the try's (above), more or fewer than one verdict line, 15b's two mask
mistakes getting the same line, a slider that did not move or whose widget did not change. The script
prints a table of the tries and moves, then the problems, and exits 1 if there is any.

``--shots DIR`` (default ``/tmp/learner_pass``) keeps screenshots to look at: ``<ch>.png`` the page after
Run All, ``<ch>-ex<N>-<try>.png`` the check cell after each try, ``<ch>-slider<K>-as-run.png`` slider K's
widget as Run All drew it, ``<ch>-slider<K>-unsolved.png`` / ``-solved.png`` after its move in each phase,
``<ch>-cell<I>.png`` the output of each cell showing a picture, after the pass (labels, legends). ``--out
FILE`` writes the results as JSON, every cell's text output included (the tables the widgets repeat).
On the 2-core machine the course is built on, chapters 09, 12, 15, 15b and 16 take about 5 minutes
(up to 15 while other jobs share the cores).
"""
from __future__ import annotations

import argparse
import ast
import json
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import lab_times  # noqa: E402  (tests/ is on the path only from here)

SOLUTIONS = ROOT / "notebooks" / "solutions"
VIEWPORT = {"width": 1400, "height": 2000}   # tall: a widget's cell, picture and all, fits its screenshot
CELL_LIMIT_S = 300            # one cell; the slowest check takes under a minute here
#: learner-like mistakes, (chapter, function) -> [(try's name, text of the reference answer, replacement)]
MISTAKES = {
    ("09", "lookup"): [("wrong: the match's start", "return i + n", "return i")],
    ("09", "draft_tree"): [("wrong: cap off by one", "len(path) > cap", "len(path) >= cap")],
    ("12", "factor_select"): [("wrong: (n + 1) for (n + 2)", "(n + 2) * (1 - conf", "(n + 1) * (1 - conf")],
    ("12", "commit_all_now"): [("wrong: min for mean", "[tail_masked].mean()", "[tail_masked].min()")],
    ("12", "p_valid"): [("wrong: 1 / n!", "math.factorial(n) / n ** n", "1 / math.factorial(n)")],
    ("15", "local_targets"): [("wrong: j, not j + 1", "torch.clamp(j + 1, max=S - 1)", "torch.clamp(j, max=S - 1)")],
    ("15", "certainty_mask"): [("wrong: every masked slot", "(state == mask_id) & (logits.argmax(-1) == final)",
                                "state == mask_id")],
    ("15", "predicted_speedup"): [("wrong: upside down", "tokens_per_call / call_cost", "call_cost / tokens_per_call"),
                                  ("wrong: always 1x", "return tokens_per_call / call_cost", "return 1.0")],
    ("15b", "pard_allow"): [("wrong: sees too much", "allow[row, :anchor + 1] = True", "allow[row, :p + 1] = True"),
                            ("wrong: sees too little", "for i in range(1, j + 1):", "for i in range(1, j):")],
    ("15b", "dflash_allow"): [("wrong: sees its anchor", "allow[n * g:(n + 1) * g, :a]", "allow[n * g:(n + 1) * g, :a + 1]")],
    ("15b", "predicted_speedup"): [("wrong: tau without the 1", "(1 + sum(accept))", "sum(accept)")],
    ("16", "predict_speedup"): [("wrong: tau * cost", "tau / step_cost", "tau * step_cost")],
    ("16", "pick_method"): [("wrong: the slowest", "max(ok", "min(ok")],
    ("16", "gpu_step_cost"): [("wrong: no target call", "1.0 + draft_calls_per_step", "draft_calls_per_step")],
}
#: the exercise whose two mistakes (one each way) must get different verdict lines
BOTH_WAYS = ("15b", "pard_allow")
LOOP = '    print("thinking...")\n    while True:\n        pass'
#: words of a verdict that blame something else than the learner's own code
ELSEWHERE = ("another cell", "a cell of the course", "checking your answer")


def reference_body(chapter: str, name: str) -> tuple[str, ast.FunctionDef]:
    """The body (docstring included, indented as in the file) of the reference answer, and its syntax tree."""
    text = (SOLUTIONS / f"ch{chapter}.py").read_text()
    fn = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == name)
    lines = text.splitlines()[fn.body[0].lineno - 1:fn.end_lineno]
    return "\n".join(lines), fn


def typo(chapter: str, name: str) -> str:
    """The reference body with its first use of a parameter misspelt (``tokens`` -> ``tokenss``)."""
    body, fn = reference_body(chapter, name)
    params = {a.arg for a in fn.args.args}
    first = min((n for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id in params),
                key=lambda n: (n.lineno, n.col_offset))
    lines = body.split("\n")
    i, col = first.lineno - fn.body[0].lineno, first.col_offset
    wrong = first.id + first.id[-1]                  # a key pressed twice: tokens -> tokenss, n -> nn
    lines[i] = lines[i][:col] + wrong + lines[i][col + len(first.id):]
    return "\n".join(lines)


def tries(chapter: str, name: str) -> list[tuple[str, str | None]]:
    """(try's name, new body of the stub or None: the stub unchanged), in the order they are made."""
    body, _ = reference_body(chapter, name)
    out = [("as given", None), ("no return", re.sub(r"^(\s*)return\b *(.*)$", lambda m: f"{m[1]}result = {m[2] or 'None'}",
                                                     body, flags=re.M)),
           ("typo", typo(chapter, name))]
    for label, old, new in MISTAKES.get((chapter, name), []):
        if old not in body:
            raise ValueError(f"MISTAKES[{chapter!r}, {name!r}]: {old!r} is not in the reference answer any more")
        out.append((label, body.replace(old, new, 1)))
    return out + [("interrupt", LOOP), ("right", body)]


def expected(label: str, verdict: str) -> str | None:
    """What is wrong with ``verdict`` (the text after "Exercise N: ") for the try ``label``; None when it is right."""
    if label == "as given":
        return None if verdict == "not attempted yet" else "the stub as given is not 'not attempted yet'"
    if label == "right":
        return None if verdict == "correct" else "the reference answer is not 'correct'"
    if label == "interrupt":
        return None if verdict.startswith("stopped: you interrupted the check") else "an interrupt is not 'stopped: ...'"
    if label == "no return":
        return None if "returned None" in verdict else "a missing return is not 'your function ... returned None'"
    if not verdict.startswith("wrong"):
        return "a wrong answer is not 'wrong'"
    if any(w in verdict for w in ELSEWHERE):
        return "the learner's own mistake is blamed on another cell"
    if label == "typo" and "of your cell:" not in verdict:
        return "a NameError in the learner's cell does not quote the learner's line"
    return None


# JavaScript run in the page (``name``: the notebook's file name)
def _js(body: str) -> str:
    import test_browser as tb
    return f"""([name, i, arg]) => {{ const panel = ({tb.PANEL})(name); {body}
}}"""


CELLS = _js("return panel.content.widgets.map(c => [c.model.type, c.model.sharedModel.getSource()]);")
SET_SOURCE = _js("panel.content.widgets[i].model.sharedModel.setSource(arg);")
RUN_CELL = _js("""
    const cell = panel.content.widgets[i];
    cell.model.outputs.clear(); cell.model.executionCount = null;   // so that CELL_DONE waits for this run
    window.jupyterapp.shell.activateById(panel.id);
    panel.content.activeCellIndex = i;
    panel.content.deselectAll();
    window.jupyterapp.commands.execute('notebook:run-cell');         // not awaited: we poll""")
CELL_DONE = _js("""
    const cell = panel.content.widgets[i], kernel = panel.sessionContext.session.kernel;
    return cell.model.executionCount !== null && cell.model.executionState !== 'running' && kernel.status === 'idle';""")
# [output type, its text (a stream's, else text/plain or text/html), error name and value]
OUTPUTS = _js("""return panel.content.widgets[i].model.outputs.toJSON().map(o => [o.output_type,
    [].concat(o.text || (o.data || {})['text/plain'] || (o.data || {})['text/html'] || '').join(''),
    o.ename || '', o.evalue || '']);""")
INTERRUPT = _js("panel.sessionContext.session.kernel.interrupt();")
# mark a cell's node, so that Playwright can find it (and scroll to it) by the attribute
MARK = _js("""const cell = panel.content.widgets[i];
    panel.content.scrollToItem(i); cell.node.setAttribute('data-learner-pass', String(i));""")
# every code cell's text outputs, by index (for the record: the tables the widgets are compared with)
TEXTS = _js("""return Object.fromEntries(panel.content.widgets.map((c, i) => [i, c.model.type !== 'code' ? '' :
    c.model.outputs.toJSON().map(o => [].concat(o.text || (o.data || {})['text/plain'] || '').join('')).join('').slice(0, 3000)])
    .filter(([i, t]) => t));""")
PICTURES = _js("""return panel.content.widgets.map((c, i) => c.model.type === 'code'
    && c.model.outputs.toJSON().some(o => o.data && o.data['image/png']) ? i : -1).filter(i => i >= 0);""")


def run_cell(page, name: str, i: int, interrupt_on: str | None = None) -> list:
    """Run cell ``i`` as Shift-Enter would (without moving on); -> its outputs (see :data:`OUTPUTS`).
    ``interrupt_on``: interrupt the kernel once an output of the cell shows this text."""
    page.evaluate(RUN_CELL, [name, i, None])
    start, interrupted = time.monotonic(), False
    while not page.evaluate(CELL_DONE, [name, i, None]):
        if interrupt_on and not interrupted and any(interrupt_on in o[1] for o in page.evaluate(OUTPUTS, [name, i, None])):
            page.wait_for_timeout(1000)
            page.evaluate(INTERRUPT, [name, i, None])
            interrupted = True
        if time.monotonic() - start > CELL_LIMIT_S:
            page.evaluate(INTERRUPT, [name, i, None])
            raise TimeoutError(f"{name}: cell {i} ran past {CELL_LIMIT_S} s")
        page.wait_for_timeout(250)
    return page.evaluate(OUTPUTS, [name, i, None])


def cell_locator(page, name: str, i: int):
    page.evaluate(MARK, [name, i, None])
    return page.locator(f'[data-learner-pass="{i}"]')


def exercises(cells: list) -> list[dict]:
    """The exercises of a notebook's cells [(type, source)]: {"stub", "check", "chapter", "name", "title"}."""
    out = []
    for i, (kind, src) in enumerate(cells):
        m = kind == "code" and re.search(r'@exercise\("(\w+)", "(\w+)"\)', src)
        if not m:
            continue
        j = next(j for j in range(i + 1, len(cells)) if cells[j][0] == "code" and re.search(r'^check\("', cells[j][1], re.M))
        out.append({"stub": i, "check": j, "chapter": m[1], "name": m[2],
                    "title": re.search(r'^check\("([^"]+)"', cells[j][1], re.M)[1]})
    return out


def answer(page, name: str, ex: dict, label: str, body: str | None, shots: Path | None, ch: str) -> dict:
    """One try at exercise ``ex``: -> {"exercise", "try", "verdict", "errors", "problem"}."""
    import test_browser as tb

    seen = set(page.evaluate(tb.PROBLEMS, name))
    stub_out, check_out = [], page.evaluate(OUTPUTS, [name, ex["check"], None])
    if body is not None:
        head = page.evaluate(CELLS, [name, 0, None])[ex["stub"]][1].split("\n")
        d = next(k for k, line in enumerate(head) if line.startswith("def "))
        page.evaluate(SET_SOURCE, [name, ex["stub"], "\n".join(head[:d + 1]) + "\n" + body])
        stub_out = run_cell(page, name, ex["stub"])
        check_out = run_cell(page, name, ex["check"], interrupt_on="thinking..." if label == "interrupt" else None)
    lines = [line for o in check_out if o[0] == "stream" for line in o[1].splitlines()
             if line.startswith(ex["title"] + ":")]
    verdict = lines[0][len(ex["title"]) + 1:].strip() if lines else ""
    errors = [f"{o[2]}: {o[3]}" for o in stub_out + check_out if o[0] == "error"]
    errors += [p for p in page.evaluate(tb.PROBLEMS, name) if p not in seen and not p.endswith("did not run")]
    problem = ("a traceback: " + "; ".join(errors) if errors else
               f"{len(lines)} verdict lines" if len(lines) != 1 else expected(label, verdict))
    if shots is not None:
        slug = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")
        cell_locator(page, name, ex["check"]).screenshot(path=str(shots / f"{ch}-ex{ex['title'].split()[-1]}-{slug}.png"))
    return {"exercise": f"{ex['title']} ({ex['name']})", "try": label, "verdict": verdict, "errors": errors,
            "problem": problem}


def move_sliders(page, name: str, shots: Path | None, ch: str, phase: str) -> list[dict]:
    """Every slider of the chapter moved one step: -> [{"slider", "phase", "moved", "changed", "problem"}]."""
    import test_browser as tb

    out = []
    for k in range(page.locator(tb.SLIDERS).count()):
        slider = page.locator(tb.SLIDERS).nth(k)
        slider.scroll_into_view_if_needed()
        cell = slider.locator("xpath=ancestor::div[contains(concat(' ', @class, ' '), ' jp-Cell ')][1]")
        label = slider.evaluate("(el) => (el.closest('.widget-slider').querySelector('.widget-label') || {}).textContent")
        label = (label or "").strip() or f"slider {k}"
        seen, row = set(page.evaluate(tb.PROBLEMS, name)), {"slider": f"{label} (#{k})", "phase": phase, "moved": "",
                                                             "changed": None, "problem": None}
        if shots is not None and phase == "unsolved":   # the widget as Run All left it (to compare with its table)
            cell.locator(".jp-Cell-outputArea").screenshot(path=str(shots / f"{ch}-slider{k}-as-run.png"))
        select = cell.locator("select").first
        if slider.get_attribute("disabled") is not None and select.count():   # greyed out until the dropdown moves
            options = [o.replace("\xa0", " ") for o in select.locator("option").all_inner_texts()]
            at = select.evaluate("(el) => el.selectedIndex")
            now, other = options[at], options[(at + 1) % len(options)]
            select.select_option(index=(at + 1) % len(options))
            row["moved"] = f"dropdown {now!r} -> {other!r}; "
            try:   # the kernel redraws the widget and lets the slider act
                page.wait_for_function("(el) => !el.hasAttribute('disabled')", arg=slider.element_handle(), timeout=30_000)
                page.wait_for_function(tb.KERNEL_READY, arg=name, timeout=60_000, polling=250)
            except Exception:   # noqa: BLE001 -- still greyed out: reported below
                pass
        if slider.get_attribute("disabled") is not None:
            row["moved"] += "greyed out"
            out.append(row)
            continue
        try:
            before, after, v0, v1 = tb.move_first_slider(page, name, wait_s=30, nth=k)
            row["moved"] += f"{v0:g} -> {v1:g}"
            row["changed"] = after != before
            if v0 == v1:
                row["problem"] = "the slider did not move"
            elif after == before:
                row["problem"] = "the widget did not change"
        except Exception as e:   # noqa: BLE001 -- a move that never ends is a finding, not a crash of the pass
            row["problem"] = f"the move failed: {type(e).__name__}: {str(e).splitlines()[0]}"
        errors = [p for p in page.evaluate(tb.PROBLEMS, name) if p not in seen]
        if errors:
            row["problem"] = "an error: " + "; ".join(errors)
        if shots is not None:
            cell.locator(".jp-Cell-outputArea").screenshot(path=str(shots / f"{ch}-slider{k}-{phase}.png"))
        out.append(row)
    return out


def pass_chapter(browser, base: str, token: str, name: str, shots: Path | None) -> dict:
    """Open ``name``, Run All, answer each exercise (see the module's doc), move each slider; -> its results."""
    import test_browser as tb

    ch = name.split("_")[0]
    start = time.monotonic()
    with lab_times.chapter_page(browser, base, token, name) as page:
        page.set_viewport_size(VIEWPORT)
        seconds, problems = lab_times.run_all(page, name)
        if shots is not None:
            page.screenshot(path=str(shots / f"{ch}.png"))
        slowest = sorted(page.evaluate(tb.TIMINGS, name), key=lambda t: -t[1])[:3]
        result = {"run_all_s": round(seconds, 1), "slowest": [[i, round(t, 1)] for i, t in slowest],
                  "run_all_problems": problems, "tries": [],
                  "sliders": move_sliders(page, name, shots, ch, "unsolved")}
        for ex in exercises(page.evaluate(CELLS, [name, 0, None])):
            for label, body in tries(ex["chapter"], ex["name"]):
                result["tries"].append(r := answer(page, name, ex, label, body, shots, ch))
                print(f"  {ch} {r['exercise']} [{label}]: {r['verdict']!r}" + (f"  PROBLEM: {r['problem']}" if r["problem"] else ""),
                      flush=True)
            if (ex["chapter"], ex["name"]) == BOTH_WAYS:
                ways = [r for r in result["tries"] if r["exercise"].startswith(ex["title"] + " ") and r["try"].startswith("wrong")]
                if len({r["verdict"] for r in ways}) < len(ways):
                    ways[-1]["problem"] = "the two directions of the mask mistake get the same verdict line"
        result["sliders"] += move_sliders(page, name, shots, ch, "solved")
        result["texts"] = page.evaluate(TEXTS, [name, 0, None])
        if shots is not None:
            for i in page.evaluate(PICTURES, [name, 0, None]):
                cell_locator(page, name, i).locator(".jp-Cell-outputArea").screenshot(path=str(shots / f"{ch}-cell{i}.png"))
    result["seconds"] = round(time.monotonic() - start, 1)
    return result


def table(results: dict) -> str:
    """The tries and moves, one line each, problems marked."""
    rows = [("chapter", "exercise", "try", "verdict", "problem")]
    for ch, r in results.items():
        rows += [(ch, t["exercise"], t["try"], t["verdict"], t["problem"] or "") for t in r["tries"]]
        rows += [(ch, f"(widget, {s['phase']})", s["slider"], s["moved"] + ("" if s["changed"] is None else
                  ", widget changed" if s["changed"] else ", widget UNCHANGED"), s["problem"] or "") for s in r["sliders"]]
        rows += [(ch, "(Run All)", f"{r['run_all_s']:.0f} s", "", "; ".join(r["run_all_problems"]))]
    widths = [max(len(str(row[c])) for row in rows) for c in range(3)]
    return "\n".join(" | ".join([str(row[c]).ljust(widths[c]) for c in range(3)] + [row[3]] +
                                ([f"PROBLEM: {row[4]}"] if row[4] else [])) for row in rows)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chapters", nargs="*", default=["09", "12", "15", "15b", "16"], help="chapter ids (default: %(default)s)")
    ap.add_argument("--shots", default="/tmp/learner_pass", help="folder for the screenshots (default: %(default)s)")
    ap.add_argument("--out", help="JSON file for the results")
    args = ap.parse_args(argv)
    names = lab_times.chapters(args.chapters)
    for name in names:   # every mistake still applies to its reference answer: fail now, not after an hour
        for ch, fn in MISTAKES:
            if name.startswith(ch + "_"):
                tries(ch, fn)
    shots = Path(args.shots)
    shots.mkdir(parents=True, exist_ok=True)
    start, results = time.monotonic(), {}
    with lab_times.learner_lab() as (browser, base, token):
        for name in names:
            print(f"{name}:", flush=True)
            results[name.split("_")[0]] = r = pass_chapter(browser, base, token, name, shots)
            print(f"{name}: {r['seconds']:.0f} s (Run All {r['run_all_s']:.0f} s; slowest cells (index, s) "
                  f"{r['slowest']})", flush=True)
    print(table(results))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    bad = [f"{ch} {t['exercise']} [{t['try']}]: {t['problem']} (verdict {t['verdict']!r})"
           for ch, r in results.items() for t in r["tries"] if t["problem"]]
    bad += [f"{ch} {s['slider']} ({s['phase']}): {s['problem']}" for ch, r in results.items() for s in r["sliders"] if s["problem"]]
    bad += [f"{ch} Run All: {p}" for ch, r in results.items() for p in r["run_all_problems"]]
    print(f"\n{len(names)} chapters in {time.monotonic() - start:.0f} s; screenshots in {shots}")
    print("problems:\n  " + "\n  ".join(bad) if bad else "no problems", file=sys.stderr if bad else sys.stdout)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
