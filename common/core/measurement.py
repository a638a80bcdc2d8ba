"""Lab 01's instruments: a CPU stand-in for an asynchronous GPU stream, noisy timing samples, cache-effect and
regression-rule references.

`AsyncQueue` behaves like a CUDA stream: `launch(work)` returns at once and the work runs on a worker thread in order;
`synchronize()` waits until everything launched has finished. Timing a launch without synchronising measures the
launch, not the work -- the classic GPU timing bug, reproduced on a CPU. `QueueEvent` is its
`torch.cuda.Event(enable_timing=True)`: `record()` enqueues a time stamp, `elapsed_time(end)` reads milliseconds
between two completed stamps (and refuses, like CUDA, before both have completed).

`judge_slower` is the discipline every measured takeaway follows: interleaved samples, a noise estimate, and a
verdict only when the noise lets it be reached -- more samples until it is, bounded, else "too noisy".
`WORKBOOK_INJECT_SLOWDOWN=3` (set only by tests/test_runner.py) makes `interleaved_samples` sleep inside each timed
call, twice its own time: a planted 3x slowdown that `make run STRICT=1` must catch.
"""
from __future__ import annotations

import contextlib
import os
import queue
import statistics
import threading
import time
from dataclasses import dataclass, field
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
                           n_threads: int | None = 1, by: float = 0.10, max_samples: int | None = None) -> dict:
    """Read bandwidth (GB/s, median of interleaved samples) of summing an nbytes buffer two ways: "warm", the same
    buffer every call (it stays in cache), and "cold", a rotation over n_buffers distinct buffers (each call touches
    memory the cache has evicted). Interleaving makes a busy machine slow both alike. On a GPU both are timed in
    batches between CUDA events without an L2 flush (a read of an L2-resident buffer takes microseconds, less than
    a host synchronisation, and a flush would empty the very cache being measured). On a CPU the sums run on
    `n_threads` threads (one by default: the lesson is the cache, not the thread pool's hand-off cost).

    "verdict" (a `Verdict`): whether the cold read is slower than the warm one by more than `by`, judged at the
    samples' noise; on a CPU more samples are taken (up to `max_samples`, default 4 x samples) while it is open."""
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
        times = {name: timing.bench(fn, label=name, device="cuda", flush_l2=False, min_run_time=0.05)
                 for name, fn in (("warm", lambda: bufs[0].sum()), ("cold", cold))}
        w, c = times["warm"].times, times["cold"].times
        shift = statistics.median(c) / statistics.median(w) - 1.0
        verdict = Verdict("cold", "warm", by, decide(w, c, by), shift, shift_std_err(w, c), min(len(w), len(c)),
                          {"warm": w, "cold": c})
        return {"warm": moved / times["warm"].median_s / 1e9, "cold": moved / times["cold"].median_s / 1e9,
                "verdict": verdict}
    from common.core.ceilings import threads
    with threads(n_threads):
        verdict = judge_slower({"warm": lambda: bufs[0].sum(), "cold": cold}, "cold", "warm", by=by, n=samples,
                               max_n=max_samples or 4 * samples)
    out = {k: moved / statistics.median(v) / 1e9 for k, v in verdict.samples.items()}
    out["verdict"] = verdict
    return out


INJECT_ENV = "WORKBOOK_INJECT_SLOWDOWN"


def injected_slowdown() -> float:
    """The factor of a planted slowdown (1.0: none): WORKBOOK_INJECT_SLOWDOWN, which only the runner's test sets."""
    raw = os.environ.get(INJECT_ENV, "").strip()
    if not raw:
        return 1.0
    try:
        factor = float(raw)
    except ValueError:
        raise ValueError(f"{INJECT_ENV}={raw!r} is not a number; use a factor >= 1, e.g. 3") from None
    if not factor >= 1.0:
        raise ValueError(f"{INJECT_ENV}={raw!r} must be a factor >= 1, e.g. 3")
    return factor


def interleaved_samples(fns: dict, n: int, sync: Callable[[], None] = lambda: None) -> dict:
    """n timings (seconds) of each function, taken round-robin so slow drifts of the machine hit all of them alike.

    Under WORKBOOK_INJECT_SLOWDOWN=f each timed call also sleeps (f - 1) times its own time inside the timing."""
    if n < 1:
        raise ValueError(f"n={n} must be >= 1")
    slowdown = injected_slowdown()
    out = {name: [] for name in fns}
    for fn in fns.values():  # warm-up
        fn()
    sync()
    for _ in range(n):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            sync()
            if slowdown > 1.0:
                time.sleep((slowdown - 1.0) * (time.perf_counter() - start))
            out[name].append(time.perf_counter() - start)
    return out


def _interleaved_values(fns: dict, n: int) -> dict:
    """n values of each function (each returns its own measured seconds), called round-robin."""
    out = {name: [] for name in fns}
    for _ in range(n):
        for name, fn in fns.items():
            out[name].append(float(fn()))
    return out


def decide(fast: Sequence[float], slow: Sequence[float], by: float = 0.0) -> bool | None:
    """Whether `slow`'s median exceeds `fast`'s by more than `by` (relative), at this noise: True when the shift,
    less three standard errors (`shift_std_err`), still clears `by`; False when the shift plus three standard errors
    stays below it; None when the noise leaves it open. True implies `is_regression(fast, slow, by)` for by >= 0."""
    if len(fast) < 3 or len(slow) < 3:
        raise ValueError(f"need >= 3 samples on each side, got {len(fast)} and {len(slow)}")
    shift = statistics.median(slow) / statistics.median(fast) - 1.0
    err = shift_std_err(fast, slow)
    if shift - 3.0 * err > by:
        return True
    if shift + 3.0 * err < by:
        return False
    return None


@dataclass
class Verdict:
    """What `judge_slower` found: `shown` is True (the effect is there), False (it is not), None (too noisy)."""
    slow: str
    fast: str
    by: float
    shown: bool | None
    shift: float  # median(slow) / median(fast) - 1
    std_err: float  # of that shift
    n: int  # samples per function
    samples: dict = field(default_factory=dict, repr=False)

    @property
    def judged(self) -> bool:
        return self.shown is not None

    def __str__(self) -> str:
        what = f"{self.slow} vs {self.fast}: {self.shift:+.1%} ({1 + self.shift:.2f}x) +- {3 * self.std_err:.1%} " \
               f"(3 standard errors, {self.n} samples each)"
        if self.shown is None:
            return (f"{what}: too noisy to judge whether it exceeds {self.by:+.0%} -- the machine was too busy "
                    f"for {self.n} samples; the takeaway is not asserted")
        return f"{what}: {'exceeds' if self.shown else 'does NOT exceed'} {self.by:+.0%}"


def judge_slower(fns: dict, slow: str, fast: str, by: float = 0.0, n: int = 20, max_n: int = 80,
                 sync: Callable[[], None] = lambda: None, returns_seconds: bool = False) -> Verdict:
    """Is `fns[slow]` slower than `fns[fast]` by more than `by` (relative; 0.3 = 30%)? Samples every function in
    `fns` interleaved, `n` at a time, until `decide` reaches a verdict or `max_n` samples each are in; a verdict
    still open then is "too noisy" (shown=None): assert a takeaway only when `judged`.

    Each function is timed with `interleaved_samples` (and `sync`); with `returns_seconds=True` each returns its own
    measured seconds instead (an event timer, a scaled timing), and is only called."""
    for name in (slow, fast):
        if name not in fns:
            raise ValueError(f"{name!r} is not one of the functions {list(fns)}")
    if slow == fast:
        raise ValueError(f"slow and fast are both {slow!r}: compare two different functions")
    if not isinstance(n, int) or n < 3 or not isinstance(max_n, int) or max_n < n:
        raise ValueError(f"n={n!r} must be an int >= 3 and max_n={max_n!r} an int >= n")
    samples = {name: [] for name in fns}
    while True:
        got = _interleaved_values(fns, n) if returns_seconds else interleaved_samples(fns, n, sync)
        for name, values in got.items():
            samples[name] += values
        shown = decide(samples[fast], samples[slow], by)
        if shown is not None or len(samples[fast]) + n > max_n:
            break
    shift = statistics.median(samples[slow]) / statistics.median(samples[fast]) - 1.0
    return Verdict(slow, fast, by, shown, shift, shift_std_err(samples[fast], samples[slow]), len(samples[fast]),
                   samples)


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
