"""``make lab`` never edits the repository: it serves ``work/``, the learner's git-ignored copy of
the chapters (notebooks/work_copy.py), and saving a notebook there leaves ``git status`` clean.

The end-to-end test builds a small git repository in a temporary folder (the chapters, their
plumbing and the repository's own ``.gitignore``, committed), makes the work copy there, starts
a Jupyter server on it as ``make lab`` does (jupytext's contents manager included, as installed),
saves an edited chapter through the contents API (``PUT /api/contents/...``) and checks ``git
status --porcelain``. The negative control serves ``notebooks/`` in place, as the lab used to:
the same save must then show up in ``git status`` (jupytext rewrites the paired ``.py``)."""
import json
import os
import secrets
import shutil
import subprocess
import sys

import pytest
from lab_server import request, serve

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "notebooks"))

import work_copy  # noqa: E402


def test_the_copy_has_every_chapter_unpaired_and_never_overwrites(tmp_path):
    dest = tmp_path / "work"
    copied = work_copy.create(str(dest))
    chapters = [os.path.basename(p) for p in work_copy.chapters()]
    assert copied == chapters and len(chapters) >= 10
    assert sorted(os.listdir(dest)) == chapters, "only the chapter notebooks: no .py, no plumbing"
    for name in chapters:
        nb = json.load(open(dest / name))
        assert "jupytext" not in nb["metadata"], f"{name}: still paired with a .py"
        assert nb["cells"] == json.load(open(os.path.join(work_copy.NOTEBOOKS, name)))["cells"]
    mine = dest / chapters[0]
    mine.write_text('{"learner": "edits"}')
    (dest / chapters[1]).unlink()
    assert work_copy.create(str(dest)) == [chapters[1]], "a missing chapter comes back, nothing else"
    assert mine.read_text() == '{"learner": "edits"}', "a learner's notebook is never overwritten"
    with pytest.raises(ValueError, match="src"):
        work_copy.create(str(dest), src=str(tmp_path / "nowhere"))


def test_make_lab_serves_the_ignored_work_copy_with_the_cpu_environment():
    make = open(os.path.join(ROOT, "Makefile")).read()
    recipe = make.split("\nlab: setup\n", 1)[1].split("\n\n", 1)[0]
    assert "notebooks/work_copy.py $(WORK)" in recipe and "--notebook-dir=$(WORK)" in recipe
    assert "--notebook-dir=notebooks" not in make
    assert "\nWORK    := work\n" in make and "/work/" in open(os.path.join(ROOT, ".gitignore")).read().split()
    env = make.split("\nLAB_ENV :=", 1)[1].split("\n\n", 1)[0]
    for setting in ("-u TRITON_INTERPRET", "-u OMP_NUM_THREADS", "PYTHONPATH=$(CURDIR)/notebooks",
                    "HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1"):
        assert setting in env, f"LAB_ENV lacks {setting}"
    # the thread count is fitted to the load by models.load (bench_results/load/README.md): nothing
    # may pin it, and the passive wait policy was measured slower on an idle machine
    for pinned in ("OMP_NUM_THREADS=", "REFIMPL_THREADS=", "OMP_WAIT_POLICY=PASSIVE"):
        assert pinned not in env, f"LAB_ENV sets {pinned}"
    # `COURSE_ANSWERS=1 make lab` (the workshop guide's projector) must reach the kernels
    assert "COURSE_ANSWERS" not in env, "LAB_ENV must pass COURSE_ANSWERS through"
    assert "lab-reset:" in make and "rm -rf $(WORK)" in make.split("lab-reset:", 1)[1].split("\n\n")[0]



def test_make_lab_starts_as_root_with_allow_root_and_as_a_user_without(tmp_path):
    """JupyterLab refuses root without --allow-root (containers, cloud notebooks run as root): make lab
    adds it there, says so in one line, and never for a user (``id -u`` faked on PATH)."""
    for uid, as_root in (("0", True), ("1000", False)):
        fake = tmp_path / uid
        fake.mkdir()
        (fake / "id").write_text(f"#!/bin/sh\necho {uid}\n")
        (fake / "id").chmod(0o755)
        out = subprocess.run(["make", "-n", "-o", ".venv/.installed", "-o", "setup", "lab"], cwd=ROOT, check=True,
                             capture_output=True, text=True, env=dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}")).stdout
        lab = next(ln for ln in out.splitlines() if "jupyter lab" in ln)
        assert ("--allow-root" in lab) == as_root and ("running as root" in out) == as_root, (uid, out)

# ---------------------------------------------------------------------------------------
# end to end: a Jupyter server on the copy, a save through the contents API, git status
# ---------------------------------------------------------------------------------------
def git(repo, *args) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def course_repo(tmp_path):
    """A git repository holding the chapters, their plumbing and the real .gitignore, committed."""
    repo = tmp_path / "course"
    shutil.copytree(os.path.join(ROOT, "notebooks"), repo / "notebooks",
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    shutil.copy(os.path.join(ROOT, ".gitignore"), repo / ".gitignore")
    git(tmp_path, "init", "-q", str(repo))
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "course")
    assert git(repo, "status", "--porcelain") == ""
    return repo


def save_through_the_server(tmp_path, root, name):
    """Start a Jupyter server on ``root``, fetch notebook ``name``, add a learner's cell, save it
    with PUT /api/contents, stop the server. Returns the file listing the server showed."""
    pytest.importorskip("jupyter_server", reason="Jupyter is missing: pip install -e '.[lab]'")
    env = dict(PYTHONPATH=os.path.join(ROOT, "notebooks"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    with serve("jupyter_server", root, tmp_path / f"jupyter-{secrets.token_hex(4)}", env) as (base, token):
        listing = [f["name"] for f in request(base, token, "/api/contents")[1]["content"]]
        _, model = request(base, token, f"/api/contents/{name}?content=1")
        nb = model["content"]
        nb["cells"].append({"cell_type": "code", "metadata": {}, "source": "my_answer = 42",
                            "outputs": [], "execution_count": None, "id": "learner1"})
        status, saved = request(base, token, f"/api/contents/{name}", "PUT",
                                {"type": "notebook", "format": "json", "content": nb})
        assert status == 200 and saved["name"] == name
        return listing


@pytest.mark.slow
def test_saving_in_the_lab_leaves_git_status_clean(tmp_path):
    repo = course_repo(tmp_path)
    work = repo / "work"
    work_copy.create(str(work), src=str(repo / "notebooks"))
    assert git(repo, "status", "--porcelain") == "", "the work copy is git-ignored"
    name = os.path.basename(work_copy.chapters()[0])
    listing = save_through_the_server(tmp_path, work, name)
    assert all(n.endswith(".ipynb") for n in listing) and name in listing, listing
    assert "my_answer = 42" in (work / name).read_text(), "the save reached the learner's copy"
    assert sorted(os.listdir(work)) == sorted(listing + [".ipynb_checkpoints"]) or \
        sorted(os.listdir(work)) == sorted(listing), f"the save wrote more than the notebook: {os.listdir(work)}"
    assert git(repo, "status", "--porcelain") == ""


@pytest.mark.slow
def test_the_clean_status_check_fails_when_the_lab_serves_notebooks_in_place(tmp_path):
    """The negative control: the old ``make lab`` (``--notebook-dir=notebooks``) edits the repository."""
    repo = course_repo(tmp_path)
    name = os.path.basename(work_copy.chapters()[0])
    save_through_the_server(tmp_path, repo / "notebooks", name)
    changed = git(repo, "status", "--porcelain")
    assert f"notebooks/{name}" in changed, changed
    assert f"notebooks/{name[:-6]}.py" in changed, f"jupytext rewrote the paired .py too: {changed}"
