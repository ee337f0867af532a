"""Rewrite the run-time columns of ``notebooks/WORKSHOP.md``: "FAST run time" from a test run's JUnit XML,
"Run All in the lab" from ``tests/lab_times.py``'s JSON.

``make test`` writes ``.pytest-times.xml`` (git-ignored): one ``testcase`` per nbval cell, classname
``notebooks.<chapter>.ipynb``, with its seconds. ``python notebooks/workshop_times.py .pytest-times.xml``
(``make workshop-times``) sums the cells of each chapter and rewrites the FAST column and its total line.
``python notebooks/workshop_times.py --lab FILE.json`` (``make workshop-lab-times``, which first runs every
chapter in JupyterLab as a learner meets it) rewrites the lab column, its total and its date line. Both
refuse (ValueError) a file that lacks a chapter the table lists, and the lab file a chapter whose Run
All went wrong: a partial or failed run must not overwrite measured times.
"""
from __future__ import annotations

import os
import re
import sys
import xml.etree.ElementTree as ET

GUIDE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "WORKSHOP.md")
ROW = re.compile(r"^\| (\d\d[a-z]?) \| ([^|]+) \| (\d+ s) \| (\d+ s) \|")
TOTAL = re.compile(r"^Total FAST run time of all chapters: [0-9.]+ min")
DATE = re.compile(r"^Measured on \d{4}-\d\d-\d\d")
LAB_TOTAL = re.compile(r"^Total Run All in the lab, every chapter one after another: [0-9.]+ min")
LAB_DATE = re.compile(r"^Lab times measured on \d{4}-\d\d-\d\d \([^)]*\)")


def chapter_seconds(junit_xml: str) -> tuple[dict[str, float], str]:
    """{chapter id ("03", "06a"): seconds summed over its notebook's cells} from a JUnit XML file,
    and the run's date (YYYY-MM-DD)."""
    seconds: dict[str, float] = {}
    try:
        root = ET.parse(junit_xml).getroot()
    except ET.ParseError as e:
        raise ValueError(f"junit_xml: {junit_xml!r} is not JUnit XML ({e}): run make test first") from None
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    date = (suite.get("timestamp", "") if suite is not None else "")[:10]
    for case in root.iter("testcase"):
        m = re.fullmatch(r"notebooks\.((\d\d[a-z]?)_[^.]+)\.ipynb", case.get("classname", ""))
        if m:
            seconds[m.group(2)] = seconds.get(m.group(2), 0.0) + float(case.get("time", 0.0))
    return seconds, date


def listed(guide_text: str, have, missing: str) -> list[str]:
    """The chapter ids of the guide's table; ``ValueError`` (``missing`` formatted with the ids ``have``
    lacks) when a partial run lacks one of them."""
    chapters = [m.group(1) for m in map(ROW.match, guide_text.splitlines()) if m]
    lacking = sorted(set(chapters) - set(have))
    if lacking:
        raise ValueError(missing.format(lacking))
    return chapters


def with_column(guide_text: str, column: int, seconds: dict[str, float], lines) -> str:
    """The guide with column ``column`` (:data:`ROW`'s group: 3 the FAST time, 4 the lab's) of each chapter's
    row set to ``seconds[chapter]``, and each line a pattern of ``lines`` ([(pattern, new text)]) matches
    replaced."""
    out = []
    for line in guide_text.splitlines(keepends=True):
        m = ROW.match(line)
        if m:
            line = line[:m.start(column)] + f"{round(seconds[m.group(1)])} s" + line[m.end(column):]
        for pattern, text in () if m else lines:
            if pattern.match(line):
                line = pattern.sub(text, line)
        out.append(line)
    return "".join(out)


def rewrite(guide_text: str, seconds: dict[str, float], date: str) -> str:
    """The guide with each chapter's run time, the total and the date replaced by this run's."""
    chapters = listed(guide_text, seconds, "junit_xml: no cells of chapters {}: run the whole suite (make test) first")
    lines = [(TOTAL, f"Total FAST run time of all chapters: {sum(seconds[c] for c in chapters) / 60:.1f} min")]
    if re.fullmatch(r"\d{4}-\d\d-\d\d", date):
        lines.append((DATE, f"Measured on {date}"))
    return with_column(guide_text, 3, seconds, lines)


def rewrite_lab(guide_text: str, report: dict) -> str:
    """The guide with each chapter's Run All in the lab, its total and its date line replaced by
    ``report``'s (``tests/lab_times.py --out``: ``{"date", "machine", "chapters": {id: {"seconds",
    "problems"}}}``)."""
    runs = report.get("chapters", {})
    chapters = listed(guide_text, runs, "report: no Run All of chapters {}: run tests/lab_times.py on every chapter")
    failed = sorted(c for c in chapters if runs[c].get("problems"))
    if failed:
        raise ValueError(f"report: the Run All of chapters {failed} went wrong: {[runs[c]['problems'] for c in failed]}")
    seconds = {c: runs[c]["seconds"] for c in chapters}
    return with_column(guide_text, 4, seconds, [
        (LAB_TOTAL, f"Total Run All in the lab, every chapter one after another: {sum(seconds.values()) / 60:.1f} min"),
        (LAB_DATE, f"Lab times measured on {report['date']} ({report['machine']})")])


def main(argv: list[str]) -> None:
    if argv[:1] == ["--lab"] and len(argv) == 2 and os.path.exists(argv[1]):
        import json

        with open(GUIDE) as f, open(argv[1]) as r:
            text = rewrite_lab(f.read(), json.load(r))
    elif len(argv) == 1 and os.path.exists(argv[0]):
        with open(GUIDE) as f:
            text = rewrite(f.read(), *chapter_seconds(argv[0]))
    else:
        raise SystemExit("usage: python notebooks/workshop_times.py JUNIT_XML (make test writes .pytest-times.xml)\n"
                         "       python notebooks/workshop_times.py --lab LAB_JSON (python tests/lab_times.py --out LAB_JSON)")
    with open(GUIDE, "w") as f:
        f.write(text)
    print(f"rewrote the run times of {GUIDE}")


if __name__ == "__main__":
    main(sys.argv[1:])
