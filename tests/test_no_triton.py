"""The labs with Triton cells run to the end where Triton is missing (macOS, native Windows): each solution is executed
whole in a kernel that cannot import triton (tests/no_triton/sitecustomize.py), and must finish without an error,
its Triton exercises reported "needs Triton" and nothing else failing."""
import os
import re

import nbformat
import pytest

from common.core import notebooks, tritonlang
from common.core.env import REPO_ROOT

HIDE = REPO_ROOT / "tests" / "no_triton"
TRITON_LABS = [n for n in notebooks.notebook_names() if n[:2] in tritonlang.LABS]


def test_the_triton_labs_are_the_ones_set_up_names():
    setup_script = (REPO_ROOT / "scripts" / "setup_venv.sh").read_text()
    named = re.search(r"labs ([0-9, and]+) run their Triton cells", setup_script)
    assert named, "scripts/setup_venv.sh must name the labs whose Triton cells need Triton"
    assert re.findall(r"\d\d", named.group(1)) == list(tritonlang.LABS)
    with_triton = sorted(n[:2] for n in notebooks.notebook_names()
                         if "tritonlang" in (notebooks.SOLUTIONS / n).read_text())
    assert with_triton == list(tritonlang.LABS), f"labs importing Triton: {with_triton}; tritonlang.LABS must match"


def _run_without_triton(name, monkeypatch):
    from nbclient import NotebookClient
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(HIDE), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("WORKBOOK_HEADLESS", "1")
    monkeypatch.setenv("WORKBOOK_PROFILE", "quick")
    nb = nbformat.read(str(notebooks.SOLUTIONS / name), as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(notebooks.SOLUTIONS)}}).execute()
    printed = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs
                        if o.output_type == "stream")
    assert "triton unavailable" in printed, f"{name}: the kernel could import triton: the test proves nothing"
    assert "needs Triton" in printed, f"{name}: no cell said it needs Triton"
    assert "FAIL Exercise" not in printed, f"{name}: an exercise failed without Triton:\n" + \
        "\n".join(line for line in printed.splitlines() if "FAIL" in line)
    stderr = [o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "stream" and o.get("name") == "stderr"]
    assert not any("Traceback" in t for t in stderr), f"{name}: a traceback on stderr: {stderr}"


def _no_triton_class(name):
    """One class per lab: `make test`'s --dist loadscope gives each class to a worker, so the three notebooks (about
    17 s each) run on both workers."""
    @pytest.mark.notebooks
    class TestWithoutTriton:
        def test_lab_runs_to_the_end_without_triton(self, monkeypatch):
            _run_without_triton(name, monkeypatch)
    TestWithoutTriton.__name__ = TestWithoutTriton.__qualname__ = f"TestWithoutTritonLab{name[:2]}"
    return TestWithoutTriton


for _name in TRITON_LABS:
    globals()[f"TestWithoutTritonLab{_name[:2]}"] = _no_triton_class(_name)
