"""A device queue on a simulated clock, for checking a learner's timer exactly (lab 01's exercises 1.1 and 1.3).

`SimQueue(plan)` stands for an asynchronous device: `fn()` pays the call's host cost (first-call costs, a preempted
thread) and queues its work, returning at once; `sync()` waits until the queue is empty; `event()` makes a timing
event (record / synchronize / elapsed_time, as torch.cuda.Event). No time really passes: inside `clock(queue)` the
clocks a timer reads (time.perf_counter, monotonic, time and their _ns forms, timeit.default_timer, and such names
bound in the learner's module) return the simulated time, in the checking thread only. So the checker knows every
sample a right timer takes and every number a classic mistake gives, exactly, however busy the machine is.
"""
from __future__ import annotations

import contextlib
import threading
import time
import timeit

LAUNCH_S = 2e-6  # host cost of one launch
SYNC_S = 1e-6  # host cost of a synchronize that finds the queue empty
EPOCH = 1000.0  # the simulated clock starts here (a timer that returns the clock itself is not near 0)
_CLOCKS = {"perf_counter": 1.0, "monotonic": 1.0, "time": 1.0, "perf_counter_ns": 1e9, "monotonic_ns": 1e9,
           "time_ns": 1e9}


class SimQueue:
    """plan[i] = (host_s, work_s) of the i-th call of fn (the last entry repeats)."""

    def __init__(self, plan: list[tuple[float, float]]):
        self.plan = list(plan)
        self.now = 0.0  # host time
        self.busy_until = 0.0  # when the queue finishes what it holds
        self.calls = 0
        self.reads = 0

    def fn(self) -> None:
        host, work = self.plan[min(self.calls, len(self.plan) - 1)]
        self.calls += 1
        self.now += host
        self.busy_until = max(self.now, self.busy_until) + work
        self.now += LAUNCH_S

    def sync(self) -> None:
        self.now = max(self.now, self.busy_until) + SYNC_S

    def event(self) -> "SimEvent":
        return SimEvent(self)

    def read(self, scale: float = 1.0):
        self.reads += 1
        t = EPOCH + self.now
        return int(t * scale) if scale != 1.0 else t


class SimEvent:
    """A timing event on the simulated queue: it completes when the queue has done all work launched before it."""

    def __init__(self, q: SimQueue):
        self._q, self._t = q, None

    def record(self) -> None:
        self._t = max(self._q.now, self._q.busy_until)
        self._q.now += LAUNCH_S

    def query(self) -> bool:
        return self._t is not None and self._q.now >= self._t

    def synchronize(self) -> None:
        if self._t is None:
            raise RuntimeError("this event was never recorded: call record() first")
        self._q.now = max(self._q.now, self._t)

    def elapsed_time(self, end: "SimEvent") -> float:
        """Milliseconds from this event to `end` (both recorded and completed, as CUDA requires)."""
        if self._t is None or end._t is None:
            raise RuntimeError("both events must be recorded before calculating elapsed time")
        if not (self.query() and end.query()):
            raise RuntimeError("both events must be completed before calculating elapsed time: synchronize the "
                               "queue (or end.synchronize()) first")
        return (end._t - self._t) * 1e3


@contextlib.contextmanager
def clock(q: SimQueue, *namespaces: dict):
    """Inside: this thread's clocks read q's simulated time (also names like `perf_counter` that a learner imported
    into `namespaces`, e.g. their function's globals); other threads keep the real clocks."""
    me = threading.get_ident()
    real = {name: getattr(time, name) for name in _CLOCKS}
    fake = {}
    for name, scale in _CLOCKS.items():
        def read(_real=real[name], _scale=scale):
            return q.read(_scale) if threading.get_ident() == me else _real()
        fake[name] = read
    patched = []  # (namespace, key, old value)
    for name, f in fake.items():
        patched.append((time.__dict__, name, real[name]))
        setattr(time, name, f)
    patched.append((timeit.__dict__, "default_timer", timeit.default_timer))
    timeit.default_timer = fake["perf_counter"]
    for ns in namespaces:
        for key, value in list(ns.items()):
            for name, r in real.items():
                if value is r:
                    patched.append((ns, key, value))
                    ns[key] = fake[name]
    try:
        yield q
    finally:
        for ns, key, value in reversed(patched):
            ns[key] = value
