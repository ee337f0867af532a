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
        if len(cells) == 7 and re.fullmatch(r"\d\d[a-z]?", cells[0]):
            rows[cells[0]] = cells
    return rows


def test_every_chapter_has_a_row_with_its_exercises_and_a_measured_time():
    rows = guide_rows()
    chapters = sorted(os.path.basename(p).split("_")[0] for p in glob.glob(os.path.join(ROOT, "notebooks", "[0-9]*.py")))
    assert sorted(rows) == chapters, "WORKSHOP.md's table must list exactly the notebooks"
    for ch in chapters:
        src = open(glob.glob(os.path.join(ROOT, "notebooks", f"{ch}_*.py"))[0]).read()
        n = len(re.findall(r'^check\("Exercise', src, flags=re.M))
        assert rows[ch][5] == str(n), f"chapter {ch}: the guide says {rows[ch][5]} exercises, the notebook checks {n}"
        assert re.fullmatch(r"\d+ s", rows[ch][2]), f"chapter {ch}: no measured run time ({rows[ch][2]!r})"
        assert re.fullmatch(r"[1-9]\d* s", rows[ch][3]), f"chapter {ch}: no Run All measured in the lab ({rows[ch][3]!r})"


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


def test_workshop_times_rewrites_the_lab_column_and_refuses_a_partial_or_failed_run():
    import sys
    sys.path.insert(0, os.path.join(ROOT, "notebooks"))
    import workshop_times

    chapters = sorted(guide_rows())
    runs = {c: {"seconds": 20.0 + i, "problems": []} for i, c in enumerate(chapters)}
    report = {"date": "2031-02-03", "machine": "x86_64, 2 cores", "chapters": runs}
    before = guide_rows()
    text = workshop_times.rewrite_lab(open(GUIDE).read(), report)
    rows = {m.group(1): (m.group(3), m.group(4)) for m in map(workshop_times.ROW.match, text.splitlines()) if m}
    assert rows == {c: (before[c][2], f"{round(runs[c]['seconds'])} s") for c in chapters}, "the FAST column stays"
    total = sum(r["seconds"] for r in runs.values()) / 60
    assert f"Total Run All in the lab, every chapter one after another: {total:.1f} min" in text
    assert "Lab times measured on 2031-02-03 (x86_64, 2 cores)" in text
    with pytest.raises(ValueError, match="report: no Run All of chapters"):
        workshop_times.rewrite_lab(open(GUIDE).read(), dict(report, chapters={c: runs[c] for c in chapters[1:]}))
    failed = dict(runs, **{chapters[0]: {"seconds": 5.0, "problems": ["cell 3: NameError: x"]}})
    with pytest.raises(ValueError, match="went wrong"):
        workshop_times.rewrite_lab(open(GUIDE).read(), dict(report, chapters=failed))


# ---- the slot plans add up --------------------------------------------------------------------------

#: the longest stretch of chapters (worked or demo) between two breaks, in minutes
MAX_STRETCH = 120
#: the longest demo of one chapter, in minutes
MAX_DEMO = 15
BREAKS = ("break", "lunch")


def learner_minutes(guide_text: str) -> dict:
    """{chapter id: learner minutes} from the per-chapter table's last column ("~45 min")."""
    out = {}
    for line in guide_text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 7 and re.fullmatch(r"\d\d[a-z]?", cells[0]):
            m = re.fullmatch(r"~(\d+) min", cells[6])
            assert m, f"chapter {cells[0]}: learner time {cells[6]!r} is not '~N min'"
            out[cells[0]] = int(m.group(1))
    return out


def plans(guide_text: str) -> list:
    """Every timetable of "Which chapters for which slot": [(heading, length in minutes, rows, late)],
    rows as (start minutes, minutes, what), late the plan's "If running late" line."""
    section = guide_text.split("## Which chapters for which slot", 1)[1].split("\n## ", 1)[0]
    out = []
    for block in re.split(r"\n(?=#{3,4} )", section)[1:]:
        heading = block.splitlines()[0]
        rows = [(int(h) * 60 + int(m), int(n), what.strip())
                for h, m, n, what in re.findall(r"^\| (\d+):(\d\d) \| (\d+) \| (.+?) \|$", block, flags=re.M)]
        if not rows:
            continue
        m = re.search(r"(\d+) minutes", heading)
        assert m, f"{heading!r}: the heading must give the slot's length in minutes"
        late = re.search(r"^\*\*If running late:\*\* (.+)$", block, flags=re.M)
        out.append((heading, int(m.group(1)), rows, late.group(1) if late else ""))
    return out


def chapter_of(what: str):
    """("worked" | "demo", chapter id) of a timetable row, or None for intro, breaks and wrap-ups."""
    m = re.match(r"(demo )?(\d\d[a-z]?):", what)
    return ("demo" if m.group(1) else "worked", m.group(2)) if m else None


def prerequisites(chapter: str) -> set:
    """The earlier chapters a chapter's opening cell names ("Chapter 00 showed ...")."""
    path = glob.glob(os.path.join(ROOT, "notebooks", f"{chapter}_*.py"))[0]
    opening = open(path).read().split("# %% [markdown]")[1]
    named = set(re.findall(r"[Cc]hapters? (\d\d[a-z]?)", opening))
    return {c for c in named if c < chapter}


def plan_problems(guide_text: str) -> list:
    """Everything wrong with the guide's slot plans (an empty list when they add up)."""
    minutes, problems = learner_minutes(guide_text), []
    found = plans(guide_text)
    if len(found) < 4:
        problems.append(f"expected the 90-minute, half-day and two day plans, found {[p[0] for p in found]}")
    for heading, length, rows, late in found:
        clock, stretch = 0, 0
        if not heading.startswith("#### Day 2"):   # the second day builds on the first
            seen = set()
        for start, n, what in rows:
            if start != clock:
                problems.append(f"{heading}: {what!r} starts at {start} min, the rows before end at {clock}")
            clock = start + n
            kind = chapter_of(what)
            if what.split(":")[0].strip() in BREAKS:
                stretch = 0
                continue
            if kind is None:
                continue
            stretch += n
            if stretch > MAX_STRETCH:
                problems.append(f"{heading}: {stretch} min of chapters without a break at {what!r}")
            mode, ch = kind
            if ch not in minutes:
                problems.append(f"{heading}: {what!r} names no chapter of the table")
                continue
            if mode == "worked" and n != minutes[ch]:
                problems.append(f"{heading}: {ch} worked in {n} min, its learner time is {minutes[ch]}")
            if mode == "demo" and n > MAX_DEMO:
                problems.append(f"{heading}: demo {ch} takes {n} min (at most {MAX_DEMO})")
            missing = prerequisites(ch) - seen
            if missing:
                problems.append(f"{heading}: {ch} builds on {sorted(missing)}, which the plan has not run")
            seen.add(ch)
        if clock != length:
            problems.append(f"{heading}: the rows add up to {clock} min, the slot is {length}")
        if not any(chapter_of(w) and chapter_of(w)[1] in late for _, _, w in rows):
            problems.append(f"{heading}: no 'If running late' line naming one of its chapters")
    return problems


def test_the_slot_plans_add_up_against_the_learner_time_column():
    assert plan_problems(open(GUIDE).read()) == []


def test_the_plan_check_can_fail():
    text = open(GUIDE).read()
    assert plan_problems(text.replace("| 0:20 | 45 | 02: draft, then verify |", "| 0:20 | 30 | 02: draft, then verify |"))
    assert plan_problems(text.replace("| 0:05 | 15 | demo 00:", "| 0:05 | 15 | intro again:"))   # 02 needs 00
    assert plan_problems(text.replace("| 1:30 | 15 | break |\n| 1:45 | 60 | 03", "| 1:30 | 15 | demo 05: x |\n| 1:45 | 60 | 03"))


def test_the_guide_states_the_total_learner_time():
    text = open(GUIDE).read()
    hours = sum(learner_minutes(text).values()) / 60
    m = re.search(r"about (\d+) hours of learner time for all of them", text)
    assert m and abs(int(m.group(1)) - hours) < 1, (m and m.group(0), hours)


def test_preflight_runs_every_check_and_reports_a_failure(capsys, monkeypatch):
    """`make preflight` (the day-before check) exercises SmolLM2 itself, and a failing check is
    reported by name, the rest still run, and the exit code counts it."""
    import sys
    sys.path.insert(0, os.path.join(ROOT, "notebooks"))
    import preflight

    assert preflight.main(["python", "triton", "corpus", "smollm2"]) == 0
    out = capsys.readouterr().out
    assert "smollm2-135m: loaded" in out and "== AR greedy" in out and out.rstrip().endswith("ready")

    def broken():
        raise RuntimeError("no corpus")
    monkeypatch.setattr(preflight, "CHECKS", [("corpus", broken), ("python", preflight.check_python)])
    assert preflight.main() == 1
    out = capsys.readouterr().out
    assert "FAIL  corpus: RuntimeError: no corpus" in out and "ok    Python" in out and "not ready: corpus" in out
    with pytest.raises(ValueError, match="only"):
        preflight.main(["nonsense"])


def test_preflight_runs_a_chapter_in_a_kernel_and_judges_speeds(tmp_path, monkeypatch, capsys):
    """The kernel check runs chapter 00 with its widget in a headless kernel; negative controls: a chapter
    whose widget never comes (no slider state) and one whose cell never ends (past its cell timeout, the cell
    named) fail it. A speed under half the course machine's is called slow."""
    import sys
    sys.path.insert(0, os.path.join(ROOT, "notebooks"))
    import nbformat
    import preflight

    assert preflight.main(["kernel"]) == 0 and "with its widget" in capsys.readouterr().out
    for cells, why in ((["x = 1"], "left no state"), (["import time\nwhile True:\n    time.sleep(1)"], "ran past 3 s")):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, tmp_path / preflight.KERNEL_CHAPTER)
        monkeypatch.setattr(preflight, "NOTEBOOKS", str(tmp_path))
        monkeypatch.setattr(preflight, "CELL_TIMEOUT_S", 3)
        assert preflight.main(["kernel"]) == 1
        out = capsys.readouterr().out
        assert "FAIL  kernel" in out and why in out, out
    want = preflight.expected_tok_s("tiny")
    assert want and "as expected" in preflight.judged("tiny", 0.6 * want) and "SLOW" in preflight.judged("tiny", 0.4 * want)

