import numpy as np
import pytest
import torch

from common.core import checks
from common.core.checks import CheckFailed, checker, expect_close, expect_equal


@checker("99.1", "double it")
def check_double(fn):
    for x in (1, 2, 5):
        expect_equal(fn(x), 2 * x, f"fn({x})")
    return "doubles"


def test_verdicts(capsys):
    assert check_double(lambda x: 2 * x).passed
    assert "PASS Exercise 99.1 (double it): doubles" in capsys.readouterr().out
    assert checks.status("99.1") == "passed" and checks.ready("99.1")


def test_not_attempted_does_not_raise(capsys):
    def stub(x):
        raise NotImplementedError("Exercise 99.1: replace this line with your code")
    v = check_double(stub)
    assert v.status == "not attempted"
    assert "not attempted yet" in capsys.readouterr().out
    assert not checks.ready("99.1")
    assert "needs Exercise 99.1 (double it), and it is not attempted yet" in capsys.readouterr().out


def test_wrong_answer_names_expected_and_got():
    with pytest.raises(CheckFailed, match=r"Exercise 99.1 \(double it\): fn\(1\): expected 2, got 3"):
        check_double(lambda x: 2 * x + 1)
    assert checks.status("99.1") == "failed"


def test_crash_in_learner_code_is_a_verdict():
    with pytest.raises(CheckFailed, match=r"your code raised ZeroDivisionError"):
        check_double(lambda x: x / 0)


def test_ready_before_any_check(capsys):
    assert not checks.ready("99.9")
    assert "its check has not run yet" in capsys.readouterr().out


def test_expect_close_first_mismatch_index():
    expected = torch.arange(12.0).reshape(3, 4)
    got = expected.clone()
    got[1, 2] += 1
    with pytest.raises(CheckFailed, match=r"1 of 12 elements differ; first at index \(1, 2\): expected 6, got 7"):
        expect_close(got, expected, "out")


def test_expect_close_shape_nan_none_and_scalars():
    with pytest.raises(CheckFailed, match=r"shape: expected \(2, 3\), got \(3, 2\)"):
        expect_close(np.zeros((3, 2)), np.zeros((2, 3)))
    with pytest.raises(CheckFailed, match=r"NaN at index \(0,\)"):
        expect_close(np.array([np.nan, 1.0]), np.array([0.0, 1.0]))
    with pytest.raises(CheckFailed, match="got None"):
        expect_close(None, 1.0)
    with pytest.raises(CheckFailed, match="relative error"):
        expect_close(1.1, 1.0, rtol=1e-3)
    expect_close(1.0 + 1e-9, 1.0)


def test_expect_equal_sequences_and_dicts():
    with pytest.raises(CheckFailed, match="first difference at index 2: expected 3, got 4"):
        expect_equal([1, 2, 4], [1, 2, 3])
    with pytest.raises(CheckFailed, match="expected 3 items, got 2"):
        expect_equal([1, 2], [1, 2, 3])
    with pytest.raises(CheckFailed, match=r"missing \['b'\]"):
        expect_equal({"a": 1}, {"a": 1, "b": 2})


def test_widgets_static_and_interactive(monkeypatch, capsys):
    from common.core import widgets
    seen = []
    widgets.explore(lambda n, gpu: seen.append((n, gpu)), n=(1, 9, 1), gpu=["H100-SXM", "B200"])
    assert seen == [(5, "H100-SXM")] and "Static view" in capsys.readouterr().out
    with pytest.raises(ValueError, match="not controls"):
        widgets.explore(lambda n: None, defaults={"m": 1}, n=(1, 9, 1))
    monkeypatch.setattr(widgets, "is_headless", lambda: False)
    import IPython.display
    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda *objs, **kw: shown.extend(objs))
    result = widgets.explore(lambda n, gpu: seen.append((n, gpu)), defaults={"n": 3}, n=(1, 9, 1),
                             gpu=["H100-SXM", "B200"])
    assert seen[-1] == (3, "H100-SXM")
    # displayed exactly once, and nothing returned that Jupyter would display a second time as the cell's value
    assert result is None and len(shown) == 1 and len(shown[0].children) >= 2
    controls = [c for c in shown[0].children if getattr(c, "description", None) in ("n", "gpu")]
    assert len(controls) == 2
    assert all(c.style.description_width == "initial" for c in controls)  # long labels are not cut
    assert controls[0].continuous_update is False  # one redraw per release, not one per pixel dragged


def test_widget_cell_displays_once():
    """A cell whose last expression is explore(...) shows one widget, not a second copy under Out[n]."""
    from IPython.core.interactiveshell import InteractiveShell

    from common.core import widgets
    shell = InteractiveShell.instance()
    shown = []
    shell.display_pub.publish = lambda data, *a, **kw: shown.append(data)
    try:
        shell.user_ns["widgets"] = widgets
        shell.user_ns["seen"] = []
        widgets_headless = widgets.is_headless
        widgets.is_headless = lambda: False
        shell.run_cell('widgets.explore(lambda n: seen.append(n), n=(1, 9, 1))', store_history=True)
        assert shell.user_ns["seen"] == [5]
        outputs = shell.user_ns.get("Out", {})
        assert not outputs or all(v is None for v in outputs.values()), outputs
    finally:
        widgets.is_headless = widgets_headless
        InteractiveShell.clear_instance()


def test_progress_lists_every_exercise_of_the_lab(capsys):
    from common.core import checks
    from common.core.checks import CheckFailed, checker, expect_equal

    @checker("97.1", "first")
    def check_first(fn):
        expect_equal(fn(), 1)

    @checker("97.2", "second, a longer title")
    def check_second(fn):
        expect_equal(fn(), 2)

    @checker("97.10", "tenth")
    def check_tenth(fn):
        expect_equal(fn(), 10)

    checker("970.1", "another lab")(lambda fn: None)
    checks.reset()
    check_first(lambda: 1)
    with pytest.raises(CheckFailed):
        check_second(lambda: 3)
    capsys.readouterr()
    assert checks.progress(97) is None  # a cell ending in progress(N) shows the table once, no Out[n]
    out = capsys.readouterr().out
    records = checks.progress_records(97)
    assert [r["exercise"] for r in records] == ["97.1", "97.2", "97.10"]  # numeric order, only lab 97
    assert [r["status"] for r in records] == ["passed", "failed", "not checked"]
    assert "expected 2, got 3" in records[1]["verdict"] and "expected 2, got 3" in out
    assert "Lab 97: 1 of 3 exercises passed, 1 failed, 0 not attempted, 1 not checked yet." in out
    with pytest.raises(ValueError, match="lab='x'"):
        checks.progress("x")
    checks.reset()


def test_in_a_notebook_a_failed_check_prints_and_the_cell_goes_on(monkeypatch, capsys):
    """After setup() in a notebook (install_notebook_handler), a failed check prints FAIL with its verdict and
    returns instead of raising, so Run All reaches the progress cell (tests/test_browser.py proves it in JupyterLab);
    a crash in the learner's code too. Outside a notebook it raises."""
    monkeypatch.setattr(checks, "_print_failures", True)
    v = check_double(lambda x: x + 1)
    assert v.status == "failed" and capsys.readouterr().out.startswith("FAIL Exercise 99.1 (double it):")
    v = check_double(lambda x: x / 0)
    assert v.status == "failed" and "ZeroDivisionError" in capsys.readouterr().out
    assert checks.status("99.1") == "failed" and not checks.ready("99.1")
    monkeypatch.setattr(checks, "_print_failures", False)
    with pytest.raises(CheckFailed):
        check_double(lambda x: x + 1)


def test_judge_gives_the_verdict_without_printing_or_recording(capsys):
    checks.reset()
    v = checks.judge("99.1", lambda x: x + 1)
    assert v.status == "failed" and capsys.readouterr().out == "" and checks.status("99.1") is None
    assert checks.judge("99.1", lambda x: 2 * x).passed
