"""The CI workflows (.github/workflows/ci.yml) run what the README says: the CPU job runs `.ci/run`
(which runs `make test`), the GPU job runs `make test-gpu` on a self-hosted GPU runner, and that
target exists and runs the GPU checks without the interpreter."""
import os
import re

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


def test_both_run_on_push_and_pull_request():
    wf = workflow()
    triggers = wf.get("on", wf.get(True))  # YAML 1.1 reads a bare `on` key as True
    assert {"push", "pull_request"} <= set(triggers)


def test_make_test_gpu_runs_the_gpu_checks_natively():
    make = open(os.path.join(ROOT, "Makefile")).read()
    m = re.search(r"^test-gpu:.*\n((?:\t.*\n)+)", make, re.M)
    assert m, "Makefile has a test-gpu target"
    recipe = m.group(1)
    assert "tests/test_gpu.py" in recipe and "env -u TRITON_INTERPRET" in recipe
    assert os.path.exists(os.path.join(ROOT, "tests", "test_gpu.py"))
