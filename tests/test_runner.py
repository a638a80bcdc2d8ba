"""The papermill runner: selection errors before anything runs, PROFILE validation, ledger and report."""
import json

import nbformat
import pytest

from common.core import runner


def test_unknown_lab_lists_notebooks():
    with pytest.raises(SystemExit, match=r"LABS names 77.*Notebooks: 00_orientation"):
        runner.select("00 77")


def test_select_by_number_and_name():
    assert runner.select("00") == ["00_orientation.ipynb"]
    assert runner.select("00_orientation") == ["00_orientation.ipynb"]
    assert runner.select("") == runner.select(None)


def test_bad_profile_fails_before_running():
    with pytest.raises(SystemExit, match=r"PROFILE='turbo'.*auto, quick, full"):
        runner.run_all("turbo", "00")


def _notebook(path, body):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    params = nbformat.v4.new_code_cell('PROFILE = "auto"')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(body)]
    nbformat.write(nb, str(path))


@pytest.mark.notebooks
def test_execute_collects_ledger_and_reports(tmp_path):
    src = tmp_path / "97_demo.ipynb"
    _notebook(src, 'from common import setup\nfrom common.core import results\nenv = setup("97_demo", PROFILE)\n'
                   'results.record("demo.answer", 42, "units")')
    bad = tmp_path / "96_bad.ipynb"
    _notebook(bad, 'from common import setup\nenv = setup("96_bad", PROFILE)')
    ok_run = runner.execute(src, "quick", tmp_path / "out")
    assert ok_run.status == "ok", ok_run.error
    assert ok_run.records[0]["name"] == "demo.answer" and ok_run.records[0]["profile"] == "quick"
    bad_run = runner.execute(bad, "fast", tmp_path / "out")
    assert bad_run.status == "failed" and "PROFILE='fast'" in bad_run.error
    code = runner.write_report([ok_run, bad_run], "quick", tmp_path / "build")
    assert code == 1
    report = (tmp_path / "build" / "report.md").read_text()
    assert "97_demo" in report and "failed" in report and "demo.answer" in report
    assert json.loads((tmp_path / "build" / "results.jsonl").read_text())["value"] == 42


@pytest.mark.notebooks
def test_wrong_answer_in_a_notebook_shows_the_verdict_not_a_traceback(tmp_path):
    """A learner's wrong answer fails its check cell with the checker's message alone."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell('from common import setup\nenv = setup("98_demo", "quick")\n'
                                          'from common.exercises.lab00 import check_matmul_flops'),
                nbformat.v4.new_code_cell("check_matmul_flops(lambda m, n, k: m * n * k)")]
    with pytest.raises(CellExecutionError):
        NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    err = [o for o in nb.cells[1].outputs if o.output_type == "error"][0]
    assert err["ename"] == "CheckFailed"
    assert err["traceback"] == [f"FAIL {err['evalue']}"]
    assert "each is 2 FLOPs" in err["evalue"]


def test_fresh_machine_records_its_baseline_and_strict_passes(tmp_path):
    """A machine without a baseline reports no regression (strict passes), records one, and the next run uses it."""
    def run_with(value):
        rec = {"name": "demo.speed", "value": value, "unit": "GB/s", "lab": "97_demo", "device": "cpu",
               "device_name": "x", "profile": "quick", "measured": True, "higher_is_better": True}
        return runner.Run("solutions", "97_demo.ipynb", status="ok", records=[rec])
    own = tmp_path / "build" / "baselines" / "cpu-test.json"
    assert runner.write_report([run_with(1.0)], "quick", tmp_path / "build", strict=True, machine_baseline=own) == 0
    assert own.exists() and "no baseline" in (tmp_path / "build" / "report.md").read_text()
    assert runner.write_report([run_with(0.1)], "quick", tmp_path / "build", strict=True, machine_baseline=own) == 1
    assert runner.write_report([run_with(0.9)], "quick", tmp_path / "build", strict=True, machine_baseline=own) == 0
