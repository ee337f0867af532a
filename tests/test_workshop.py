"""The workshop guide (``notebooks/WORKSHOP.md``) stays in step with the notebooks: a row for every
chapter, its exercise count equal to the exercises the notebook checks, a measured run time, and the
README links it."""
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GUIDE = os.path.join(ROOT, "notebooks", "WORKSHOP.md")


def guide_rows():
    rows = {}
    for line in open(GUIDE):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and re.fullmatch(r"\d\d[a-z]?", cells[0]):
            rows[cells[0]] = cells
    return rows


def test_every_chapter_has_a_row_with_its_exercises_and_a_measured_time():
    rows = guide_rows()
    chapters = sorted(os.path.basename(p).split("_")[0] for p in glob.glob(os.path.join(ROOT, "notebooks", "[0-9]*.py")))
    assert sorted(rows) == chapters, "WORKSHOP.md's table must list exactly the notebooks"
    for ch in chapters:
        src = open(glob.glob(os.path.join(ROOT, "notebooks", f"{ch}_*.py"))[0]).read()
        n = len(re.findall(r'^check\("Exercise', src, flags=re.M))
        assert rows[ch][4] == str(n), f"chapter {ch}: the guide says {rows[ch][4]} exercises, the notebook checks {n}"
        assert re.fullmatch(r"\d+ s", rows[ch][2]), f"chapter {ch}: no measured run time ({rows[ch][2]!r})"


def test_the_readme_links_the_guide_and_the_guide_has_its_sections():
    assert "(notebooks/WORKSHOP.md)" in open(os.path.join(ROOT, "README.md")).read()
    text = open(GUIDE).read()
    for heading in ("## Setup checklist", "## When a cell is slow", "## Per chapter", "## Which chapters for which slot"):
        assert heading in text, heading
    for slot in ("90 minutes", "Half a day", "Two days"):
        assert slot in text, slot
