"""The CI workflows (.github/workflows/ci.yml) run what the README says: the CPU job runs `.ci/run`
(which runs `make test`), the GPU job runs `make test-gpu` on a self-hosted GPU runner, and that
target exists and runs the GPU checks without the interpreter; the site job runs `make site` and
publishes the site to GitHub Pages from main."""
import glob
import os
import re
import subprocess

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def workflow():
    with open(os.path.join(ROOT, ".github", "workflows", "ci.yml")) as f:
        return yaml.safe_load(f)


def commands(job):
    return " ; ".join(step.get("run", "") for step in job["steps"])


def test_cpu_job_runs_ci_run_within_the_time_limit():
    jobs = workflow()["jobs"]
    cpu = [j for j in jobs.values() if "bash .ci/run" in commands(j)]
    assert len(cpu) == 1, "exactly one job runs .ci/run"
    assert "self-hosted" not in str(cpu[0]["runs-on"])
    assert cpu[0]["timeout-minutes"] <= 90
    assert "make test" in open(os.path.join(ROOT, ".ci", "run")).read()


def test_gpu_job_runs_make_test_gpu_on_a_gpu_runner():
    jobs = workflow()["jobs"]
    gpu = [j for j in jobs.values() if "make test-gpu" in commands(j)]
    assert len(gpu) == 1, "exactly one job runs make test-gpu"
    assert {"self-hosted", "gpu"} <= set(gpu[0]["runs-on"])


def test_site_job_builds_the_site_and_publishes_it_from_main_only():
    """`make site` on a CPU runner (Python 3.11; the Makefile takes torch's CPU build there); the built
    folder goes to GitHub Pages (upload-pages-artifact, then deploy-pages in a job that needs it) on
    pushes to main only, with the permissions Pages needs and no more."""
    jobs = workflow()["jobs"]
    site = [j for j in jobs.values() if "make site" in commands(j)]
    assert len(site) == 1 and jobs.get("site") is site[0], "one job, `site`, runs make site"
    site = site[0]
    assert site["runs-on"] == "ubuntu-latest" and site["timeout-minutes"] <= 90
    uses = {s.get("uses", "").split("@")[0]: s for s in site["steps"]}
    assert uses["actions/setup-python"]["with"]["python-version"] == "3.11"
    make = open(os.path.join(ROOT, "Makefile")).read()
    rule = make.split("TORCH_INDEX ?=", 1)[1].split("\n\n", 1)[0]
    assert "TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu" in make and "$(TORCH_CPU_INDEX)" in rule \
        and "nvidia-smi" in rule, "make setup takes torch's CPU build on a machine without an NVIDIA driver"
    runs = [s.get("run", "") for s in site["steps"]]
    assert runs.index(next(r for r in runs if "make site" in r)) < [s.get("uses", "") for s in site["steps"]].index(
        uses["actions/upload-pages-artifact"]["uses"]), "the artifact is uploaded after the build"
    assert uses["actions/upload-pages-artifact"]["with"]["path"] == "site"
    on_main = "github.event_name == 'push' && github.ref == 'refs/heads/main'"
    assert uses["actions/upload-pages-artifact"]["if"] == on_main
    deploy = [(name, j) for name, j in jobs.items() if any("actions/deploy-pages" in s.get("uses", "") for s in j["steps"])]
    assert len(deploy) == 1, "one job deploys the site"
    deploy = deploy[0][1]
    assert deploy["needs"] in ("site", ["site"]) and deploy["if"] == on_main
    assert deploy["permissions"] == {"pages": "write", "id-token": "write"}
    assert deploy["environment"]["name"] == "github-pages"


def test_make_site_runs_the_site_builder():
    assert re.search(r"^site: setup", open(os.path.join(ROOT, "Makefile")).read(), re.M)
    out = subprocess.run(["make", "-n", "-o", ".venv/.installed", "-o", "setup", "site", "CHAPTERS=00 02"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert "notebooks/build_site.py" in out and "--chapters 00 02" in out and "--out site" in out, out


def test_both_run_on_push_and_pull_request():
    wf = workflow()
    triggers = wf.get("on", wf.get(True))  # YAML 1.1 reads a bare `on` key as True
    assert {"push", "pull_request"} <= set(triggers)


def gpu_recipe() -> list[str]:
    """The shell lines of ``make test-gpu`` with make's variables expanded (``make -n``: printed, not run)."""
    out = subprocess.run(["make", "-n", "-o", ".venv/.installed", "-o", "setup", "test-gpu"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return [ln for ln in out.replace("\\\n", " ").splitlines() if ln.strip()]


def test_make_test_gpu_runs_the_gpu_checks_natively():
    make = open(os.path.join(ROOT, "Makefile")).read()
    assert re.search(r"^test-gpu:", make, re.M), "Makefile has a test-gpu target"
    recipe = " ; ".join(gpu_recipe())
    runs = [c.strip() for c in recipe.split(";") if "pytest" in c]
    checks = [c for c in runs if "tests/test_gpu.py" in c]
    books = [c for c in runs if "--nbval-lax" in c]
    assert checks and books, f"test-gpu runs tests/test_gpu.py and the notebooks under nbval: {runs}"
    for c in checks + books:
        assert "env -u TRITON_INTERPRET" in c and "TRITON_INTERPRET=1" not in c, f"interpreter off: {c}"
    # every chapter notebook, the checks before the notebooks, the table at the end
    glob_arg = next(a for a in books[0].split() if a.startswith("notebooks/"))
    assert sorted(glob.glob(os.path.join(ROOT, glob_arg))) == sorted(glob.glob(os.path.join(ROOT, "notebooks", "[0-9]*.ipynb")))
    assert recipe.index("tests/test_gpu.py") < recipe.index("--nbval-lax") < recipe.index("tests/gpu_report.py")
    assert "FAST = False" not in recipe and "COURSE_FAST=0" not in recipe
    assert os.path.exists(os.path.join(ROOT, "tests", "test_gpu.py"))


def test_gpu_report_tabulates_kernels_methods_and_notebooks(tmp_path):
    """The table ``make test-gpu`` prints, from JUnit files like pytest's (a failing cell shows)."""
    import gpu_report

    checks, books = tmp_path / "checks.xml", tmp_path / "notebooks.xml"
    checks.write_text('''<testsuites><testsuite>
<testcase classname="tests.test_gpu" name="test_tree_attention_native" time="1.5"/>
<testcase classname="tests.test_gpu" name="test_every_decoding_method_runs_on_the_gpu[dynamic tree]" time="0.7"/>
<testcase classname="tests.test_gpu" name="test_every_decoding_method_runs_on_the_gpu[eagle]" time="0.2">
<failure message="assert [[1]] == [[2]]">trace</failure></testcase></testsuite></testsuites>''')
    books.write_text('''<testsuites><testsuite>
<testcase classname="notebooks.05_token_trees.ipynb" name="Cell 0" time="1.0"/>
<testcase classname="notebooks.05_token_trees.ipynb" name="Cell 1" time="2.0"><failure message="boom">x</failure></testcase>
<testcase classname="notebooks.00_why_decoding_is_slow.ipynb" name="Cell 0" time="3.0"/>
</testsuite></testsuites>''')
    text = gpu_report.table([str(checks), str(books), str(tmp_path / "absent.xml")])
    rows = {tuple(c.strip() for c in ln.strip("|").split("|")[:3]) for ln in text.splitlines() if ln.startswith("| ")}
    assert ("kernels", "tree attention native", "passed") in rows
    assert ("decoding", "dynamic tree", "passed") in rows and ("decoding", "eagle", "FAILED") in rows
    assert ("notebooks", "05_token_trees.ipynb", "FAILED") in rows
    assert ("notebooks", "00_why_decoding_is_slow.ipynb", "passed") in rows
    assert "failed: Cell 1" in text and "1/2 cells" in text and "MISSING" in text


def test_ci_runs_every_chapter_as_a_learner_too():
    """.ci/run executes the chapters a second way after make test (exercises unsolved, the interpreter off):
    a chapter that stops on an unsolved exercise fails CI."""
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    lines = [line.strip() for line in ci.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert "make test-learner" in lines and lines.index("make test-learner") > lines.index("make test")
    make = open(os.path.join(ROOT, "Makefile")).read()
    rule = make.split("\ntest-learner:", 1)[1].split("\n\n", 1)[0]
    assert "--nbval-lax notebooks" in rule and "LEARNER_ENV" in rule
    learner_env = make.split("LEARNER_ENV :=", 1)[1].split("\n\n", 1)[0]
    assert "-u COURSE_ANSWERS" in learner_env and "-u TRITON_INTERPRET" in learner_env


def test_the_browser_suites_run_in_ci_right_after_make_test():
    """make test leaves out only the suites that drive Chromium, make test-browser runs exactly those, and
    .ci/run runs it after make test: no test file is left out of CI."""
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    lines = [line.strip() for line in ci.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert "make test-browser" in lines and lines.index("make test-browser") > lines.index("make test")

    def recipe(target):
        return subprocess.run(["make", "-n", "-o", ".venv/.installed", "-o", "setup", target], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.replace("\\\n", " ")
    ignored = re.findall(r"--ignore=(\S+)", recipe("test"))
    assert ignored and all(os.path.exists(os.path.join(ROOT, f)) for f in ignored)
    browser = recipe("test-browser")
    assert all(f in browser for f in ignored) and "tests/procs.py --" in browser
