"""Lab 01's instruments: a CPU stand-in for an asynchronous GPU stream, noisy timing samples, cache-effect and
regression-rule references.

`AsyncQueue` behaves like a CUDA stream: `launch(work)` returns at once and the work runs on a worker thread in order;
`synchronize()` waits until everything launched has finished. Timing a launch without synchronising measures the
launch, not the work -- the classic GPU timing bug, reproduced on a CPU. `QueueEvent` is its
`torch.cuda.Event(enable_timing=True)`: `record()` enqueues a time stamp, `elapsed_time(end)` reads milliseconds
between two completed stamps (and refuses, like CUDA, before both have completed).
"""
from __future__ import annotations

import contextlib
import os
import queue
import statistics
import threading
import time
from typing import Callable, Sequence


class AsyncQueue:
    """An in-order work queue on a background thread: the CPU's picture of a GPU stream."""

    def __init__(self):
        self._q: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self):
        while True:
            work = self._q.get()
            try:
                if work is None:
                    return
                work()
            finally:
                self._q.task_done()

    def launch(self, work: Callable[[], object]) -> None:
        """Enqueue `work` and return immediately (like a kernel launch)."""
        self._q.put(work)

    def synchronize(self) -> None:
        """Block until every launched piece of work has finished (like torch.cuda.synchronize)."""
        self._q.join()

    def event(self) -> "QueueEvent":
        """A timing event on this queue (like torch.cuda.Event(enable_timing=True) on the current stream)."""
        return QueueEvent(self)

    def close(self) -> None:
        self.synchronize()
        self._q.put(None)
        self._thread.join(timeout=5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class QueueEvent:
    """A time stamp taken when the queue reaches it: the CPU picture of a CUDA timing event."""

    def __init__(self, q: AsyncQueue):
        self._q = q
        self._done = threading.Event()
        self._t: float | None = None
        self._recorded = False

    def _stamp(self) -> None:
        self._t = time.perf_counter()
        self._done.set()

    def record(self) -> None:
        """Enqueue the stamp behind everything launched so far (returns at once, like Event.record())."""
        self._done.clear()
        self._t = None
        self._recorded = True
        self._q.launch(self._stamp)

    def query(self) -> bool:
        return self._done.is_set()

    def synchronize(self) -> None:
        """Wait until the queue has reached this event."""
        if not self._recorded:
            raise RuntimeError("this event was never recorded: call record() first")
        self._done.wait()

    def elapsed_time(self, end: "QueueEvent") -> float:
        """Milliseconds from this event to `end`; both must be recorded and completed (synchronize first)."""
        if not (self._recorded and end._recorded):
            raise RuntimeError("both events must be recorded before calculating elapsed time")
        if not (self.query() and end.query()):
            raise RuntimeError("both events must be completed before calculating elapsed time: synchronize the "
                               "queue (or end.synchronize()) first")
        return (end._t - self._t) * 1e3


def sleep_work(seconds: float) -> Callable[[], None]:
    """Work that takes `seconds` of wall time without using a core (keeps demos stable on a busy machine)."""
    if seconds < 0:
        raise ValueError(f"seconds={seconds} must be >= 0")
    return lambda: time.sleep(seconds)


def median_and_iqr(samples: Sequence[float]) -> tuple[float, float]:
    if len(samples) < 2:
        raise ValueError(f"need at least 2 samples, got {len(samples)}")
    q = statistics.quantiles(samples, n=4, method="inclusive")
    return statistics.median(samples), q[2] - q[0]


def noisy_samples(n: int, median: float, noise: float, outlier_rate: float = 0.0, outlier_factor: float = 3.0,
                  rng=None) -> list[float]:
    """Synthetic timings: lognormal noise of relative width `noise`, and a fraction of slow outliers."""
    import numpy as np
    if n < 1 or median <= 0 or noise < 0 or not 0 <= outlier_rate < 1:
        raise ValueError(f"bad sample spec n={n}, median={median}, noise={noise}, outlier_rate={outlier_rate}")
    rng = rng if rng is not None else np.random.default_rng()
    x = median * np.exp(rng.normal(0.0, noise, n))
    slow = rng.random(n) < outlier_rate
    x[slow] *= outlier_factor
    return x.tolist()


def relative_mad(samples: Sequence[float]) -> float:
    """Robust relative spread: 1.4826 x median absolute deviation / median (equals sigma/mu for normal noise,
    and a few wild outliers barely move it)."""
    m = statistics.median(samples)
    return 1.4826 * statistics.median(abs(x - m) for x in samples) / m


def shift_std_err(baseline: Sequence[float], candidate: Sequence[float]) -> float:
    """Standard error of the relative shift between two runs' medians, estimated robustly from both runs' spread
    (relative MAD; 1.25 converts a mean's standard error into a median's)."""
    n = min(len(baseline), len(candidate))
    return 1.25 * (relative_mad(baseline) ** 2 + relative_mad(candidate) ** 2) ** 0.5 / n ** 0.5


def is_regression(baseline: Sequence[float], candidate: Sequence[float], threshold: float = 0.10) -> bool:
    """Reference rule: the candidate's median is slower by more than `threshold` (relative) AND by more than three
    standard errors of that difference (`shift_std_err`), so a noisy machine needs a bigger shift before it cries
    regression. Medians and MAD resist outliers; a speed-up never counts."""
    if len(baseline) < 3 or len(candidate) < 3:
        raise ValueError(f"need >= 3 samples on each side, got {len(baseline)} and {len(candidate)}")
    shift = statistics.median(candidate) / statistics.median(baseline) - 1.0
    return shift > threshold and shift > 3.0 * shift_std_err(baseline, candidate)


def surely_caught(shift: float, baseline: Sequence[float], candidate: Sequence[float],
                  threshold: float = 0.10) -> bool:
    """Whether `is_regression` catches a true slowdown of `shift` (relative) with near certainty at the noise of
    these two runs: the measured shift, give or take three standard errors, still clears both of the rule's bars.
    When it does not, a miss says the machine is too noisy for this many samples, not that the rule is wrong."""
    err = shift_std_err(baseline, candidate)
    return shift - 3.0 * err > max(threshold, 3.0 * err)


def warm_vs_cold_bandwidth(nbytes: int, n_buffers: int, samples: int = 100, device: str | None = None,
                           n_threads: int | None = 1) -> dict:
    """Read bandwidth (GB/s, median of interleaved samples) of summing an nbytes buffer two ways: "warm", the same
    buffer every call (it stays in cache), and "cold", a rotation over n_buffers distinct buffers (each call touches
    memory the cache has evicted). Interleaving makes a busy machine slow both alike. On a GPU both are timed in
    batches between CUDA events without an L2 flush (a read of an L2-resident buffer takes microseconds, less than
    a host synchronisation, and a flush would empty the very cache being measured). On a CPU the sums run on
    `n_threads` threads (one by default: the lesson is the cache, not the thread pool's hand-off cost)."""
    import torch

    from common.core.env import current
    dev = device or current().device
    if n_buffers < 2:
        raise ValueError(f"n_buffers={n_buffers} must be >= 2 to rotate")
    bufs = [torch.rand(nbytes // 4, device=dev) for _ in range(n_buffers)]
    state = {"i": 0}

    def cold():
        state["i"] = (state["i"] + 1) % n_buffers
        bufs[state["i"]].sum()

    moved = (nbytes // 4) * 4
    if dev == "cuda":
        from common.core import timing
        times = {name: timing.bench(fn, label=name, device="cuda", flush_l2=False, min_run_time=0.05).median_s
                 for name, fn in (("warm", lambda: bufs[0].sum()), ("cold", cold))}
        return {k: moved / v / 1e9 for k, v in times.items()}
    from common.core.ceilings import threads
    with threads(n_threads):
        runs = interleaved_samples({"warm": lambda: bufs[0].sum(), "cold": cold}, samples)
    return {k: moved / statistics.median(v) / 1e9 for k, v in runs.items()}


def interleaved_samples(fns: dict, n: int, sync: Callable[[], None] = lambda: None) -> dict:
    """n timings (seconds) of each function, taken round-robin so slow drifts of the machine hit all of them alike."""
    if n < 1:
        raise ValueError(f"n={n} must be >= 1")
    out = {name: [] for name in fns}
    for fn in fns.values():  # warm-up
        fn()
    sync()
    for _ in range(n):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            sync()
            out[name].append(time.perf_counter() - start)
    return out


@contextlib.contextmanager
def native_stderr_captured():
    """Capture what native code writes to file descriptor 2 (e.g. the profiler's `USDT ... profiler_start` lines,
    which bypass sys.stderr) while the block runs; yields a list that receives the captured lines."""
    import sys
    import tempfile
    lines: list[str] = []
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real stderr (an embedded interpreter): nothing to capture
        yield lines
        return
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            lines.extend(tmp.read().decode(errors="replace").splitlines())
