"""The machine around a notebook: a probe of its speed before and after (`ceilings.Probe`), and how many cores other
processes used while it ran.

`Watch().run(fn)` returns fn's result and the moment, {"probes": [before, after], "others": cores}, that
`common.core.baseline` judges results against. "Other processes" are everything but this process and its children
(a notebook's kernel is a child; its own workers are grandchildren): all CPU time the system counted as busy
(user, nice, system, interrupts, and the hypervisor's steal) less ours, over the wall time.
"""
from __future__ import annotations

import os
import time
from typing import Callable


def _cpu_seconds() -> tuple[float, float]:
    """(system-wide busy CPU seconds, this process tree's CPU seconds: itself and its reaped children)."""
    import psutil
    c = psutil.cpu_times()
    busy = sum(getattr(c, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq", "steal"))
    t = os.times()
    return busy, t.user + t.system + t.children_user + t.children_system


def others_cores(fn: Callable[[], object]) -> tuple[object, float | None]:
    """fn's result and the cores other processes used on average while it ran (None where psutil cannot say)."""
    try:
        start, (busy0, ours0) = time.perf_counter(), _cpu_seconds()
    except Exception:  # no psutil, or no /proc: run it unwatched
        return fn(), None
    result = fn()
    wall = time.perf_counter() - start
    busy1, ours1 = _cpu_seconds()
    return result, max(0.0, ((busy1 - busy0) - (ours1 - ours0)) / wall) if wall > 0 else None


class Watch:
    """Probes the machine before and after `run(fn)` and meters the other processes during it. `probe` is a
    callable returning a reading ({"copy_gbps", "matmul_gflops"}); default `ceilings.Probe()`."""

    def __init__(self, probe: Callable[[], dict] | None = None):
        if probe is None:
            from common.core.ceilings import Probe
            probe = Probe()
        self.probe = probe

    def run(self, fn: Callable[[], object]) -> tuple[object, dict]:
        before = self.probe()
        result, others = others_cores(fn)
        after = self.probe()
        return result, {"probes": [before, after], "others": others}

    def close(self) -> None:
        getattr(self.probe, "close", lambda: None)()
