"""Measured claims, predictions, the Triton stand-in and the learner's error lines (common/core)."""
import pytest

from common import setup
from common.core import checks, claims, measurement, notebooks, predictions, tritonlang
from common.facts import published


@pytest.fixture(autouse=True)
def _lab():
    setup("98_test", quiet=True)
    predictions.reset()
    checks.reset()
    yield


def test_a_claim_says_whether_it_holds_and_why_not(capsys):
    c = claims.claim("a cache-resident read beats DRAM", 1.1, unit="x", holds=False,
                     why=[(False, "never this"), (True, "2 CPU cores: the other core was busy")])
    out = capsys.readouterr().out
    assert c.holds is False and "does not hold here: 2 CPU cores: the other core was busy" in out
    assert "1.10x" in out and out.startswith("CLAIM  a cache-resident read beats DRAM")
    claims.claim("it is fast", 3.0, unit="x", holds=True, why="never shown")
    out = capsys.readouterr().out
    assert "holds here" in out and "never shown" not in out


def test_a_claim_prints_the_published_gpu_figure_with_its_source(capsys):
    claims.claim("fusion pays", 2.0, unit="x", holds=True, gpu=published.figure("liger.rmsnorm_fused_vs_eager"))
    out = capsys.readouterr().out
    assert "published, H100 NVL: 10.5x" in out and "github.com/linkedin/Liger-Kernel" in out


def test_a_verdict_becomes_a_claim_with_its_interval(capsys):
    verdict = measurement.Verdict("slow", "fast", 0.3, None, 0.2, 0.1, 8)
    c = claims.claim("slow is slower by 30%", holds=verdict)
    out = capsys.readouterr().out
    assert c.holds is None and "not judged here" in out and "+20% +- 30% over 8" in out and "1.20x" in out


def test_an_invariant_that_fails_raises():
    with pytest.raises(claims.ClaimBroken, match="measurement broke"):
        claims.claim("synchronised time includes the work", 0.5, unit="x", holds=False, invariant=True, quiet=True)
    claims.claim("synchronised time includes the work", 5.0, unit="x", holds=True, invariant=True, quiet=True)


@pytest.mark.parametrize("bad", [{"statement": ""}, {"holds": "maybe"}])
def test_a_claim_refuses_bad_input(bad):
    kwargs = {"statement": "x", "holds": True} | bad
    with pytest.raises(ValueError):
        claims.claim(kwargs.pop("statement"), 1.0, quiet=True, **kwargs)


def test_numbers_are_formatted_for_reading():
    assert claims.readable(70272.0) == "70,272" and claims.readable(469000000000.0) == "469,000,000,000"
    assert claims.readable(0.001234) == "0.00123" and claims.readable(13.57) == "13.6"
    assert claims.readable(1.2e-7) == "1.20e-07"
    import numpy as np
    assert claims.readable(np.int64(4194304)) == "4,194,304" and claims.readable(np.float32(0.5)) == "0.500"
    assert claims.readable(3.2856e24) == "3.29e24"  # FLOPs of a training run, without the e+ no output may show


def test_every_published_figure_resolves_with_a_source():
    for name in published.names():
        fig = published.figure(name)
        assert fig.value > 0 and "http" in fig.source, name
    with pytest.raises(ValueError, match="known"):
        published.figure("no.such.figure")


def test_predictions_are_revealed_and_tabled(capsys):
    predictions.predict("copy_gbps", ..., "GB/s")
    assert "No guess yet" in capsys.readouterr().out
    predictions.predict("copy_gbps", 20, "GB/s")
    predictions.predict("bound", "memory-bound", choices=["memory-bound", "compute-bound"])
    predictions.reveal("copy_gbps", 10.0)
    predictions.reveal("bound", "memory-bound")
    out = capsys.readouterr().out
    assert "you guessed 20 GB/s, measured 10 GB/s -- 2x lower than your guess" in out and "right" in out
    predictions.calibration()
    out = capsys.readouterr().out
    assert "copy_gbps" in out and "1 of 1 numeric guesses within 2x; 1 of 1 choices right." in out
    with pytest.raises(ValueError, match="choices"):
        predictions.predict("bound", "fast", choices=["memory-bound", "compute-bound"])
    with pytest.raises(ValueError, match="finite number"):
        predictions.predict("copy_gbps", "lots")


def test_the_learner_copy_asks_for_the_guess():
    src = 'predict("copy_gbps", 20, "GB/s", "How fast?")\npredict("bound", "memory-bound", choices=("a", "b"))'
    assert notebooks._blank_predictions(src) == ('predict("copy_gbps", ..., "GB/s", "How fast?")\n'
                                                 'predict("bound", ..., choices=("a", "b"))')


def test_without_triton_a_kernel_defines_and_its_check_says_needs_triton(monkeypatch, capsys):
    monkeypatch.setattr(tritonlang, "available", lambda: False)
    triton, tl = tritonlang.triton, tritonlang.tl

    @triton.jit
    def kernel(x_ptr, n, BLOCK: tl.constexpr):
        pass

    assert triton.cdiv(10, 4) == 3 and triton.next_power_of_2(100) == 128
    with pytest.raises(tritonlang.TritonMissing, match="needs Triton"):
        kernel[(1,)](None, 1, BLOCK=4)

    @checks.checker("98.1", "a kernel")
    def check_kernel(fn):
        fn()

    check_kernel(lambda: kernel[(1,)](None, 1, BLOCK=4))
    assert checks.status("98.1") == checks.NEEDS_TRITON and "SKIP Exercise 98.1" in capsys.readouterr().out
    assert not checks.ready("98.1") and "needs Triton" in capsys.readouterr().out
    assert not tritonlang.needs_triton("the timing") and "Linux or in WSL" in capsys.readouterr().out


def test_a_learner_error_is_reported_at_the_learner_line():
    def learner_kernel():
        raise ValueError("shapes do not match")

    def library_wrapper():
        try:
            learner_kernel()
        except ValueError as exc:
            raise RuntimeError(repr(exc)) from exc  # as Triton's interpreter wraps a kernel's error

    with pytest.raises(RuntimeError) as info:
        library_wrapper()
    line = checks._learner_error(info.value)
    assert line.startswith("your code raised ValueError: shapes do not match") and "raise ValueError" in line


def test_without_a_working_sandbox_the_grading_tests_are_skipped_except_under_ci(tmp_path):
    """A learner's `make test` where bubblewrap cannot run: the grading tests are skipped with the install line; with
    CI set they run (and would fail)."""
    import os
    import subprocess
    import sys

    from common.core.env import REPO_ROOT
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "bwrap").write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    (fake / "bwrap").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_XDIST_WORKER")}
    env.update(PATH=f"{fake}{os.pathsep}{env['PATH']}", WORKBOOK_BROWSER="1")  # no warm kernels: none are needed
    cmd = [sys.executable, "-m", "pytest", "tests/test_grading.py", "-k", "refused_without_a_sandbox", "-q", "-rs",
           "-p", "no:cacheprovider", "-p", "no:xdist"]
    learner = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert "1 skipped" in learner.stdout and "install bubblewrap" in learner.stdout, learner.stdout[-2000:]
    ci = subprocess.run(cmd, cwd=REPO_ROOT, env=env | {"CI": "1"}, capture_output=True, text=True, timeout=120)
    assert "1 passed" in ci.stdout, ci.stdout[-2000:]
