"""Lab 01's instruments: the stand-in queue and its timing events, native stderr capture, warm vs cold."""
import time

import pytest

from common import measurement


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
    from common.env import current
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
