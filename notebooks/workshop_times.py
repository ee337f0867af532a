"""Rewrite the "FAST run time" column of ``notebooks/WORKSHOP.md`` from a test run's JUnit XML.

``make test`` writes ``.pytest-times.xml`` (git-ignored): one ``testcase`` per nbval cell, classname
``notebooks.<chapter>.ipynb``, with its seconds. ``make workshop-times`` runs
``python notebooks/workshop_times.py .pytest-times.xml``, which sums the cells of each chapter and
rewrites the table's run times and the total line, so the teacher's guide quotes the last full run.
It refuses (ValueError) a file that lacks a chapter the table lists: a partial run must not
overwrite measured times with missing ones.
"""
from __future__ import annotations

import os
import re
import sys
import xml.etree.ElementTree as ET

GUIDE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "WORKSHOP.md")
ROW = re.compile(r"^\| (\d\d[a-z]?) \| ([^|]+) \| (\d+ s) \|")
TOTAL = re.compile(r"^Total FAST run time of all chapters: [0-9.]+ min")
DATE = re.compile(r"^Measured on \d{4}-\d\d-\d\d")


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


def rewrite(guide_text: str, seconds: dict[str, float], date: str) -> str:
    """The guide with each chapter's run time, the total and the date replaced by this run's."""
    listed = [m.group(1) for m in map(ROW.match, guide_text.splitlines()) if m]
    missing = sorted(set(listed) - set(seconds))
    if missing:
        raise ValueError(f"junit_xml: no cells of chapters {missing}: run the whole suite (make test) first")
    out = []
    for line in guide_text.splitlines(keepends=True):
        m = ROW.match(line)
        if m:
            line = line.replace(f"| {m.group(3)} |", f"| {round(seconds[m.group(1)])} s |", 1)
        elif TOTAL.match(line):
            line = TOTAL.sub(f"Total FAST run time of all chapters: {sum(seconds[c] for c in listed) / 60:.1f} min", line)
        elif DATE.match(line) and re.fullmatch(r"\d{4}-\d\d-\d\d", date):
            line = DATE.sub(f"Measured on {date}", line)
        out.append(line)
    return "".join(out)


def main(argv: list[str]) -> None:
    if len(argv) != 1 or not os.path.exists(argv[0]):
        raise SystemExit("usage: python notebooks/workshop_times.py JUNIT_XML (make test writes .pytest-times.xml)")
    with open(GUIDE) as f:
        text = rewrite(f.read(), *chapter_seconds(argv[0]))
    with open(GUIDE, "w") as f:
        f.write(text)
    print(f"rewrote the run times of {GUIDE}")


if __name__ == "__main__":
    main(sys.argv[1:])
