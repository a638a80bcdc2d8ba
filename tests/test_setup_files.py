"""The set-up files agree with each other and name the commands the README promises."""
import re
import tomllib

import yaml

from common.core.env import REPO_ROOT


def _name(req: str) -> str:
    return re.split(r"[<>=!~ \[]", req.strip(), maxsplit=1)[0].lower()


def test_environment_yml_lists_what_pyproject_lists():
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    env = yaml.safe_load((REPO_ROOT / "environment.yml").read_text())["dependencies"]
    conda = {_name(d) for d in env if isinstance(d, str)} - {"python", "pip"}
    pip = {_name(d) for d in env if isinstance(d, dict) for d in d["pip"]}
    wanted = {_name(d) for d in project}
    assert conda | pip == wanted, (f"environment.yml and pyproject.toml disagree: only in pyproject "
                                   f"{sorted(wanted - conda - pip)}, only in environment.yml {sorted((conda | pip) - wanted)}")


def test_ci_runs_the_readme_test_command():
    readme = (REPO_ROOT / "README.md").read_text()
    assert "make test" in readme and "make run" in readme and "make lab" in readme
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test$", ci, re.M), ".ci/run must call `make test`, the README's test command"


def test_workflows_name_their_commands():
    cpu = yaml.safe_load((REPO_ROOT / ".github/workflows/cpu.yml").read_text())
    gpu = yaml.safe_load((REPO_ROOT / ".github/workflows/gpu.yml").read_text())
    cpu_runs = [s.get("run", "") for job in cpu["jobs"].values() for s in job["steps"]]
    gpu_runs = [s.get("run", "") for job in gpu["jobs"].values() for s in job["steps"]]
    assert "make test" in cpu_runs
    assert "make run PROFILE=full" in gpu_runs and "make nbval" in gpu_runs
    gpu_job = next(iter(gpu["jobs"].values()))
    assert "self-hosted" in gpu_job["runs-on"]
    uploads = [s for s in gpu_job["steps"] if "upload-artifact" in s.get("uses", "")]
    assert uploads and uploads[0]["with"]["path"].rstrip("/") == "build"


def test_makefile_targets_create_the_venv():
    make = (REPO_ROOT / "Makefile").read_text()
    for target in ("run", "test", "lab", "labs", "refresh", "nbval"):
        assert re.search(rf"^{target}: \$\(VENV\)/\.installed", make, re.M), f"`make {target}` must depend on the venv"
    assert "torch==2.13.0" in (REPO_ROOT / "scripts/setup_venv.sh").read_text()
