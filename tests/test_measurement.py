"""Lab 01's instruments: the stand-in queue and its timing events, native stderr capture, warm vs cold."""
import time

import numpy as np
import pytest

from common.core import measurement


def test_queue_event_times_queued_work_and_refuses_early_reads():
    with measurement.AsyncQueue() as q:
        start, end = q.event(), q.event()
        with pytest.raises(RuntimeError, match="recorded"):
            start.elapsed_time(end)
        start.record()
        q.launch(lambda: time.sleep(0.02))
        end.record()
        with pytest.raises(RuntimeError, match="completed"):
            start.elapsed_time(end)
        end.synchronize()
        assert 15 <= start.elapsed_time(end) < 200


def test_profiler_usdt_lines_are_captured(capfd):
    """Issue 18 #4: the profiler's native `USDT ... profiler_start` lines do not reach the cell's stderr."""
    import os

    import torch

    from common.core.env import current
    current()  # set Triton's mode before torch.profiler imports triton (as a notebook's set-up cell does)
    from torch.profiler import ProfilerActivity, profile
    with measurement.native_stderr_captured() as lines:
        with profile(activities=[ProfilerActivity.CPU]):
            torch.ones(4).sum()
        os.write(2, b"USDT: native line profiler_start\n")
    assert "profiler_start" not in capfd.readouterr().err
    assert any("profiler_start" in x for x in lines)


def test_warm_vs_cold_single_thread():
    import torch
    before = torch.get_num_threads()
    bw = measurement.warm_vs_cold_bandwidth(2**16, n_buffers=4, samples=5, device="cpu", max_samples=10)
    assert bw["warm"] > 0 and bw["cold"] > 0 and torch.get_num_threads() == before
    assert bw["verdict"].n in (5, 10) and bw["verdict"].slow == "cold"


def test_surely_caught_means_the_rule_catches_it():
    """Whenever `surely_caught` says a true 20% slowdown clears the rule's bars, `is_regression` flags it (the
    promise lab 12's guard relies on), across noise levels from quiet to a busy machine; and loud noise declines."""
    rng = np.random.default_rng(7)
    judged = 0
    for noise in (0.02, 0.05, 0.10, 0.20, 0.40):
        for _ in range(200):
            base = measurement.noisy_samples(30, 1.0, noise, outlier_rate=0.05, rng=rng)
            slow = [1.2 * t for t in measurement.noisy_samples(30, 1.0, noise, outlier_rate=0.05, rng=rng)]
            if measurement.surely_caught(0.20, base, slow):
                judged += 1
                assert measurement.is_regression(base, slow), f"noise {noise}: promised a catch, rule missed"
    assert judged >= 400, f"only {judged} of 1000 trials were judged: the promise is too cautious to be useful"
    loud = measurement.noisy_samples(30, 1.0, 0.5, rng=rng)
    assert not measurement.surely_caught(0.20, loud, [1.2 * t for t in loud])


def test_decide_needs_the_noise_to_allow_a_verdict():
    rng = np.random.default_rng(3)
    base = measurement.noisy_samples(40, 1.0, 0.03, rng=rng)
    assert measurement.decide(base, [1.5 * t for t in measurement.noisy_samples(40, 1.0, 0.03, rng=rng)], 0.1)
    assert measurement.decide(base, measurement.noisy_samples(40, 1.0, 0.03, rng=rng), 0.1) is False
    loud = measurement.noisy_samples(5, 1.0, 0.6, rng=rng)
    assert measurement.decide(loud, [1.2 * t for t in measurement.noisy_samples(5, 1.0, 0.6, rng=rng)], 0.1) is None
    with pytest.raises(ValueError, match="need >= 3 samples"):
        measurement.decide([1.0], [1.0, 2.0, 3.0])


def _sampler(rng, median, noise):
    return lambda: float(measurement.noisy_samples(1, median, noise, outlier_rate=0.05, rng=rng)[0])


def test_judge_slower_takes_samples_until_it_can_say():
    """A true 30% effect is shown, no effect is never shown (over seeded trials), and noise that even max_n samples
    cannot resolve gives shown=None ("too noisy") -- with the samples it took."""
    rng = np.random.default_rng(5)
    for _ in range(30):
        fns = {"fast": _sampler(rng, 1.0, 0.05), "slow": _sampler(rng, 1.3, 0.05), "same": _sampler(rng, 1.0, 0.05)}
        assert measurement.judge_slower(fns, "slow", "fast", by=0.1, n=10, max_n=80, returns_seconds=True).shown
        v = measurement.judge_slower(fns, "same", "fast", by=0.1, n=10, max_n=80, returns_seconds=True)
        assert v.shown is not True, v
    loud = {"fast": _sampler(rng, 1.0, 0.8), "slow": _sampler(rng, 1.12, 0.8)}
    v = measurement.judge_slower(loud, "slow", "fast", by=0.1, n=10, max_n=30, returns_seconds=True)
    assert v.shown is None and v.n == 30 and len(v.samples["slow"]) == 30 and "too noisy" in str(v)
    with pytest.raises(ValueError, match="'warm' is not one of"):
        measurement.judge_slower(loud, "warm", "fast")


def test_injected_slowdown_slows_the_timed_helper_only_when_set(monkeypatch):
    nap = {"nap": lambda: time.sleep(0.005)}
    plain = np.median(measurement.interleaved_samples(nap, 5)["nap"])
    monkeypatch.setenv(measurement.INJECT_ENV, "3")
    slowed = np.median(measurement.interleaved_samples(nap, 5)["nap"])
    assert slowed > 2.2 * plain
    monkeypatch.setenv(measurement.INJECT_ENV, "fast")
    with pytest.raises(ValueError, match="WORKBOOK_INJECT_SLOWDOWN='fast'"):
        measurement.interleaved_samples(nap, 1)
