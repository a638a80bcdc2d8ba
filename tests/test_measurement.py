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
    bw = measurement.warm_vs_cold_bandwidth(2**16, n_buffers=4, samples=5, device="cpu")
    assert bw["warm"] > 0 and bw["cold"] > 0 and torch.get_num_threads() == before


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
