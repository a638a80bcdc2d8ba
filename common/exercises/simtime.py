"""A device queue on a simulated clock, for checking a learner's timer exactly (labs 00 and 01).

`SimQueue(plan)` stands for an asynchronous device: `fn()` pays the call's host cost (first-call costs, a preempted
thread) and queues its work, returning at once; `sync()` waits until the queue is empty; `event()` makes a timing
event (record / synchronize / elapsed_time, as torch.cuda.Event); `flush()` queues a cache flush, after which the next
call of `fn` runs cold (a call right after another runs `warm_factor` times faster). No time really passes: inside
`clock(queue)` the clocks a timer reads (time.perf_counter, monotonic, time and their _ns forms, timeit.default_timer,
and such names bound in the learner's module) return the simulated time, in the checking thread only. So the checker
knows every sample a right timer takes and every number a classic mistake gives, exactly, however busy the machine is.

`BusyQueue` adds a busy machine: most synchronisations return late (another process held the core). `SimDevice`
runs a learner's torch code for real on small tensors while charging each copy and matmul to the queue at simulated
rates (lab 00's ceilings). `blocks(queue.log)` reads back how the learner timed: the calls between each two clock
reads, and whether the device was synchronised before the second.
"""
from __future__ import annotations

import contextlib
import statistics
import threading
import time
import timeit
from dataclasses import dataclass

LAUNCH_S = 2e-6  # host cost of one launch
SYNC_S = 1e-6  # host cost of a synchronize that finds the queue empty
EPOCH = 1000.0  # the simulated clock starts here (a timer that returns the clock itself is not near 0)
_CLOCKS = {"perf_counter": 1.0, "monotonic": 1.0, "time": 1.0, "perf_counter_ns": 1e9, "monotonic_ns": 1e9,
           "time_ns": 1e9}


class SimQueue:
    """plan[i] = (host_s, work_s) of the i-th call of fn (the last entry repeats). `log` records, in order,
    ("call" | "op" | "flush" | "alloc" | "sync" | "clock", host time)."""

    def __init__(self, plan: list[tuple[float, float]], warm_factor: float = 1.0, flush_s: float = 0.0,
                 max_calls: int | None = None):
        self.plan = list(plan)
        self.now = 0.0  # host time
        self.busy_until = 0.0  # when the queue finishes what it holds
        self.calls = 0
        self.reads = 0
        self.warm_factor, self.flush_s, self.max_calls = warm_factor, flush_s, max_calls
        self.warm = False  # is fn's data in the cache (fn ran, no flush since)?
        self.log: list[tuple[str, float]] = []

    def launch(self, work_s: float, host_s: float = 0.0, what: str = "op") -> None:
        """Queue `work_s` seconds of device work after `host_s` seconds on the host; return at once."""
        self.now += host_s
        self.busy_until = max(self.now, self.busy_until) + work_s
        self.now += LAUNCH_S
        self.log.append((what, self.now))

    def fn(self) -> None:
        if self.max_calls is not None and self.calls >= self.max_calls:
            from common.core.checks import CheckFailed
            raise CheckFailed(f"fn was called {self.calls:,} times without the timer stopping: time until the calls "
                              f"add up to the minimum time asked for, then stop")
        host, work = self.plan[min(self.calls, len(self.plan) - 1)]
        self.calls += 1
        self.launch(work * (self.warm_factor if self.warm else 1.0), host, "call")
        self.warm = True

    def flush(self) -> None:
        """Queue a write of a buffer larger than the cache: the next call of fn reads from memory again."""
        self.launch(self.flush_s, 0.0, "flush")
        self.warm = False

    def sync(self) -> None:
        self.now = max(self.now, self.busy_until) + SYNC_S
        self.log.append(("sync", self.now))

    def event(self) -> "SimEvent":
        return SimEvent(self)

    def read(self, scale: float = 1.0):
        self.reads += 1
        self.log.append(("clock", self.now))
        t = EPOCH + self.now
        return int(t * scale) if scale != 1.0 else t


class BusyQueue(SimQueue):
    """A SimQueue on a busy machine: a synchronisation costs a host wake-up (`wake_s`), and two of every three
    return `delay_s` late (another process held the core), so most blocks of calls are slowed and a few are not."""

    def __init__(self, plan, delay_s: float, wake_s: float = 5e-6, **kwargs):
        super().__init__(plan, **kwargs)
        self.delay_s, self.wake_s, self.syncs = delay_s, wake_s, 0

    def sync(self) -> None:
        self.syncs += 1
        self.now = max(self.now, self.busy_until) + self.wake_s + (self.delay_s if self.syncs % 3 else 0.0)
        self.log.append(("sync", self.now))


@dataclass
class Block:
    """The calls a timer made between two clock reads: per-call seconds, how many, and whether the device was
    synchronised after the last of them (before the clock was read)."""
    per_call: float
    calls: int
    synced: bool
    allocs: int  # tensors allocated between the two reads
    first: bool  # holds the first call of all (no warm-up before it)

    @property
    def seconds(self) -> float:
        return self.per_call * self.calls


def blocks(log: list[tuple[str, float]], ops: tuple[str, ...] = ("call", "op")) -> list[Block]:
    """The learner's timed blocks, read from a queue's log: each stretch between two clock reads that holds a call."""
    out, start, calls, synced, allocs, seen_call, first = [], None, 0, False, 0, False, False
    for what, t in log:
        if what == "clock":
            if start is not None and calls:
                out.append(Block((t - start) / calls, calls, synced, allocs, first))
            start, calls, synced, allocs, first = t, 0, False, 0, False
        elif what in ops:
            calls, synced = calls + 1, False
            if not seen_call:
                seen_call, first = True, start is not None
        elif what == "sync" and calls:
            synced = True
        elif what == "alloc":
            allocs += 1
    return out


def summary(bs: list[Block]) -> dict[str, float]:
    """The statistics a timer could report from its blocks (seconds per call): best, median, mean, worst, first,
    last, pooled (all time over all calls); and the seconds of a whole block (median) and of all blocks, for naming
    which one a learner returned."""
    per = [b.per_call for b in bs]
    total = sum(b.seconds for b in bs)
    return {"best": min(per), "median": statistics.median(per), "mean": statistics.fmean(per), "worst": max(per),
            "first": per[0], "last": per[-1], "block": statistics.median(b.seconds for b in bs), "total": total,
            "pooled": total / sum(b.calls for b in bs)}


_MATMULS = {"matmul", "mm", "__matmul__", "__rmatmul__"}
_CREATES = {"rand", "randn", "empty", "zeros", "ones", "full", "randint", "rand_like", "randn_like", "empty_like",
            "zeros_like", "ones_like", "full_like", "clone", "arange", "tensor"}


def _torch_mode():
    from torch.overrides import TorchFunctionMode
    return TorchFunctionMode


class SimDevice:
    """Run a learner's torch code for real (small tensors) while charging its copies and matmuls to `q` at simulated
    rates: a copy `2 x bytes / copy_bps`, a matmul `2mnk / flops_per_s` (float64, the reference, 16x slower). The
    first copy and the first matmul each pay `first_s` on the host (page faults, library set-up); a new tensor costs
    its bytes at `alloc_bps` on the host (page faults and filling); a copy or matmul of constant data (zeros) runs
    `constant_speedup` times faster, as an untouched zero page or bits that never toggle do. `broken=True` makes the
    device wrong: a copy fills only the first half of its destination, a float32/bf16 matmul returns half its product.

    `with SimDevice(...) as dev:` installs it for torch calls (a TorchFunctionMode); `dev.constant` counts the copies
    and matmuls that ran on constant data, `dev.ops` all of them."""

    def __init__(self, q: SimQueue, copy_bps: float, flops_per_s: float, first_s: float = 0.03,
                 alloc_bps: float = 2e9, constant_speedup: float = 1.3, broken: bool = False, max_ops: int = 200_000):
        self.q, self.copy_bps, self.flops_per_s, self.first_s = q, copy_bps, flops_per_s, first_s
        self.alloc_bps, self.constant_speedup, self.broken, self.max_ops = alloc_bps, constant_speedup, broken, max_ops
        self.constant, self.ops, self._seen, self._checked = 0, 0, set(), {}
        self._mode = None

    def __enter__(self):
        dev = self

        class Mode(_torch_mode()):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                return dev._handle(func, args, kwargs or {})
        self._mode = Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)

    def _is_constant(self, t) -> bool:
        key = (id(t), t._version, t.data_ptr())
        if key not in self._checked:
            self._checked[key] = bool(t.numel() > 1 and (t.max() == t.min()).item())
        return self._checked[key]

    def _first(self, kind: str) -> float:
        if kind in self._seen:
            return 0.0
        self._seen.add(kind)
        return self.first_s

    def _op(self, kind: str, work: float, inputs) -> None:
        self.ops += 1
        if self.ops > self.max_ops:
            from common.core.checks import CheckFailed
            raise CheckFailed(f"{self.ops - 1:,} copies and matmuls without the measurement ending: time blocks until "
                              f"they add up to min_time, then stop")
        if any(self._is_constant(t) for t in inputs):
            self.constant += 1
            work /= self.constant_speedup
        self.q.launch(work, self._first(kind), "op")

    def _handle(self, func, args, kwargs):
        import torch
        name = getattr(func, "__name__", "")
        if name == "copy_" and len(args) >= 2:
            dst, src = args[0], args[1]
            self._op("copy", 2 * src.numel() * src.element_size() / self.copy_bps, [src])
            if self.broken:
                half = dst.numel() // 2
                dst.view(-1)[:half].copy_(src.reshape(-1)[:half])
                return dst
            return func(*args, **kwargs)
        if name in _MATMULS:
            out = func(*args, **kwargs)
            a, b = args[0], args[1]
            if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
                flops = 2 * a.numel() * (b.shape[-1] if b.dim() > 1 else 1)
                slow = 16 if out.dtype == torch.float64 else 1
                self._op("matmul", flops * slow / self.flops_per_s, [a, b])
                if self.broken and out.dtype != torch.float64:
                    out = out * 0.5
            return out
        if name == "clone" and args and isinstance(args[0], torch.Tensor):  # a copy into a new buffer
            self._op("copy", 2 * args[0].numel() * args[0].element_size() / self.copy_bps, [args[0]])
        out = func(*args, **kwargs)
        if name in _CREATES and isinstance(out, torch.Tensor):
            self.q.now += out.numel() * out.element_size() / self.alloc_bps
            self.q.log.append(("alloc", self.q.now))
        return out


@contextlib.contextmanager
def threads_reported(n: int):
    """Inside: torch.get_num_threads() returns `n` (the simulated device's thread count)."""
    import torch
    real = torch.get_num_threads
    torch.get_num_threads = lambda: n
    try:
        yield
    finally:
        torch.get_num_threads = real
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
