"""The instructor's grader: verdicts per exercise, and notebooks that loop, exit, kill their kernel or delete files
cannot stop the grading of the others or touch files outside their sandbox."""
import csv
import os

import nbformat
import pytest

from common.core import grading

pytestmark = pytest.mark.notebooks

HEAD = "from common.exercises.lab10 import check_train_flops, check_implied_mfu"


def _write(path, *sources):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))


def test_grade_sandboxed(tmp_path):
    sentinel_dir = tmp_path / "outside"
    sentinel_dir.mkdir()
    sentinel = sentinel_dir / "keep.txt"
    sentinel.write_text("precious")
    os.chmod(sentinel_dir, 0o755)
    name = "10_scaling_and_cost.ipynb"
    root = tmp_path / "class"
    _write(root / "ada" / name, HEAD, "check_train_flops(lambda n, d: 6 * n * d)",
           "check_implied_mfu(lambda *a: 0.5)")
    _write(root / "bob" / name, HEAD, "def f(n, d):\n    raise NotImplementedError\ncheck_train_flops(f)",
           "import sys\nsys.exit(3)", "check_implied_mfu(lambda *a: 0.5)")
    _write(root / "cyd" / name, HEAD, "check_train_flops(lambda n, d: 2 * n * d)", "while True:\n    pass")
    _write(root / "dan" / name, HEAD, f"import os\nos.remove({str(sentinel)!r})",
           "check_train_flops(lambda n, d: 6 * n * d)", "import os\nos._exit(1)")
    out = tmp_path / "grades"
    rows = grading.grade(root, out, cell_timeout=20, notebook_timeout=120, progress=lambda *_: None)
    status = {(r["learner"], r["exercise"]): r for r in rows}
    assert status[("ada", "10.1")]["status"] == "passed"
    assert status[("ada", "10.2")]["status"] == "failed" and status[("ada", "10.2")]["verdict"]
    assert status[("ada", "10.3")]["status"] == "not checked"
    assert status[("bob", "10.1")]["status"] == "not attempted"
    assert status[("bob", "10.2")]["status"] == "failed"  # sys.exit did not end the notebook
    assert status[("cyd", "10.1")]["status"] == "failed" and "2ND" in status[("cyd", "10.1")]["verdict"]
    assert status[("dan", "10.1")]["status"] == "passed"  # read from the printed verdicts: the kernel died later
    if grading.read_only_prefix(tmp_path):  # the kernel saw files outside its sandbox read-only
        assert sentinel.read_text() == "precious"
    with (out / "grades.csv").open() as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows) and set(table[0]) == {"learner", "lab", "exercise", "title", "status", "verdict"}
    summary = (out / "summary.md").read_text()
    assert "| ada | 10 | 1 of 5 | 1 | 0 | 3 |" in summary


def test_grade_bad_input(tmp_path):
    with pytest.raises(ValueError, match="not a folder"):
        grading.grade(tmp_path / "missing", tmp_path / "out")
    with pytest.raises(ValueError, match="holds no lab notebooks"):
        grading.grade(tmp_path, tmp_path / "out")
    with pytest.raises(ValueError, match="not named like a lab"):
        grading.lab_number("notes.ipynb")
