"""The workshop guide (``notebooks/WORKSHOP.md``) stays in step with the notebooks: a row for every
chapter, its exercise count equal to the exercises the notebook checks, a measured run time, and the
README links it."""
import glob
import os
import re

import pytest

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


def teacher_notes() -> dict:
    """{chapter id: its text} of the "Before and after each chapter" section (``### NN · title``)."""
    text = open(GUIDE).read()
    assert "## Before and after each chapter" in text
    section = text.split("## Before and after each chapter", 1)[1].split("\n## ", 1)[0]
    notes = {}
    for block in section.split("\n### ")[1:]:
        m = re.match(r"(\d\d[a-z]?) ", block)
        assert m, f"a teacher's note without a chapter id: {block[:40]!r}"
        notes[m.group(1)] = block
    return notes


def test_every_chapter_has_a_teachers_note_naming_each_exercise():
    """Before (the one idea), the common mistake of every exercise by name, a question for the room.
    A split chapter (06 -> 06a, 06b) may keep one note under its number."""
    notes = teacher_notes()
    for path in sorted(glob.glob(os.path.join(ROOT, "notebooks", "[0-9]*.py"))):
        ch = os.path.basename(path).split("_")[0]
        note = notes.get(ch) or notes.get(ch[:2])
        assert note, f"chapter {ch}: no '### {ch} · ...' note in WORKSHOP.md's 'Before and after each chapter'"
        for part in ("**Before:**", "**Mistakes:**", "**Ask:**"):
            assert part in note, f"chapter {ch}: the note lacks {part}"
        for name in re.findall(r'^@exercise\("[^"]+", "(\w+)"\)', open(path).read(), flags=re.M):
            assert f"`{name}`" in note, f"chapter {ch}: the note names no common mistake for `{name}`"


def test_the_note_check_can_fail(monkeypatch, tmp_path):
    bad = tmp_path / "WORKSHOP.md"
    bad.write_text("## Before and after each chapter\n\n### 00 · Setup\n- **Before:** x\n\n## Next\n")
    monkeypatch.setitem(globals(), "GUIDE", str(bad))
    import pytest

    with pytest.raises(AssertionError):
        test_every_chapter_has_a_teachers_note_naming_each_exercise()


def test_workshop_times_rewrites_every_run_time_from_a_junit_file_and_refuses_a_partial_one(tmp_path):
    import sys
    sys.path.insert(0, os.path.join(ROOT, "notebooks"))
    import workshop_times

    chapters = sorted(guide_rows())
    cases = "".join(f'<testcase classname="notebooks.{c}_x.ipynb" name="Cell {k}" time="{10 + i + k / 2}" />'
                    for i, c in enumerate(chapters) for k in range(2))
    cases += '<testcase classname="tests.test_workshop" name="test_x" time="99" />'      # not a chapter
    xml = tmp_path / "times.xml"
    xml.write_text(f'<testsuites><testsuite timestamp="2031-02-03T04:05:06">{cases}</testsuite></testsuites>')
    seconds, date = workshop_times.chapter_seconds(str(xml))
    assert date == "2031-02-03" and seconds[chapters[0]] == 20.5
    text = workshop_times.rewrite(open(GUIDE).read(), seconds, date)
    rows = {}
    for line in text.splitlines():
        m = workshop_times.ROW.match(line)
        if m:
            rows[m.group(1)] = m.group(3)
    assert rows == {c: f"{round(seconds[c])} s" for c in chapters}
    total = sum(seconds.values()) / 60
    assert f"Total FAST run time of all chapters: {total:.1f} min" in text and "Measured on 2031-02-03" in text
    (tmp_path / "empty.xml").write_text("")
    with pytest.raises(ValueError, match="junit_xml"):
        workshop_times.chapter_seconds(str(tmp_path / "empty.xml"))
    del seconds[chapters[-1]]
    with pytest.raises(ValueError, match="junit_xml"):
        workshop_times.rewrite(open(GUIDE).read(), seconds, date)
