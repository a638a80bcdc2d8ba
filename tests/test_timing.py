import time

import pytest

from common.core import timing


def test_bench_measures_sleep():
    t = timing.bench(time.sleep, 0.002, label="sleep", device="cpu", min_run_time=0.05)
    assert 0.0015 < t.median_s < 0.02
    assert t.label == "sleep" and t.times and t.iqr_s >= 0
    assert "sleep" in str(t)


def test_warmup_excludes_first_call_cost():
    calls = []

    def slow_first():
        calls.append(1)
        time.sleep(0.2 if len(calls) == 1 else 0.001)

    t = timing.bench(slow_first, device="cpu", min_run_time=0.05, warmup=1)
    assert t.median_s < 0.05, "the first (slow) call must be a warm-up, not a measurement"


def test_compare_table_rates_and_speedup():
    a = timing.Timing("a", 0.002, 0.0, [0.002], "cpu")
    b = timing.Timing("b", 0.001, 0.0, [0.001], "cpu")
    df = timing.compare([a, b], work=2e9, baseline="a")
    assert df.loc["b", "speedup"] == pytest.approx(2.0)
    assert df.loc["a", "GFLOP/s"] == pytest.approx(1000.0)
    with pytest.raises(ValueError, match="baseline='c'"):
        timing.compare([a, b], baseline="c")


@pytest.mark.parametrize("kwargs,match", [({"min_run_time": 0}, "min_run_time"), ({"warmup": -1}, "warmup"),
                                          ({"device": "tpu"}, "device='tpu'")])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        timing.bench(lambda: None, **kwargs)


def test_format_seconds():
    assert timing.format_seconds(2.0) == "2 s"
    assert timing.format_seconds(0.0015) == "1.5 ms"
    assert timing.format_seconds(3e-8) == "30 ns"


def test_slow_calls_still_get_several_blocks():
    """A call longer than min_run_time is timed in several blocks (a real IQR, not 0 from one block)."""
    import time
    t = timing.bench(lambda: time.sleep(0.03), device="cpu", min_run_time=0.01, min_blocks=4)
    assert len(t.times) >= 4 and t.iqr_s >= 0
    with pytest.raises(ValueError, match="min_blocks=0"):
        timing.bench(lambda: None, device="cpu", min_blocks=0)
