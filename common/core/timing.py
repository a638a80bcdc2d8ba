"""Timing that is right by default: warm-up, device synchronisation, repeats to a minimum time, median and spread.

`bench(fn, *args)` is the one entry point. On a CPU it stands on `torch.utils.benchmark.Timer.blocked_autorange`
(with torch's current thread count, not the Timer's default of one), and keeps at least `min_blocks` timed blocks
(within a time cap) so a spread is real, not the IQR of one block. On a GPU it stands on `triton.testing.do_bench` (CUDA events,
L2 flushed between repeats); with `flush_l2=False` it times batches of back-to-back calls between two CUDA events
instead, so a call shorter than a host synchronisation (a 2.5 us read of an L2-resident buffer) is still timed right.
`compare([...])` turns timings into a pandas table.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable, Sequence


@dataclass
class Timing:
    """One benchmark: seconds per call (median and interquartile range) over `len(times)` measured blocks."""

    label: str
    median_s: float
    iqr_s: float
    times: list = field(default_factory=list)  # seconds per call, one value per measured block/repeat
    device: str = "cpu"

    @property
    def ms(self) -> float:
        return self.median_s * 1e3

    @property
    def us(self) -> float:
        return self.median_s * 1e6

    @property
    def best_s(self) -> float:
        """The fastest timed block (the median when no blocks were kept): a ceiling's statistic."""
        return min(self.times) if self.times else self.median_s

    @property
    def spread(self) -> float:
        """Relative spread: IQR / median (0.05 means the middle half of runs lie within 5%)."""
        return self.iqr_s / self.median_s if self.median_s > 0 else float("nan")

    def rate(self, amount: float) -> float:
        """`amount` of work (FLOPs, bytes, tokens) per second at the median time."""
        return amount / self.median_s

    def __str__(self) -> str:
        return f"{self.label}: {format_seconds(self.median_s)} median, IQR {self.spread:.1%} over {len(self.times)} runs"


def format_seconds(s: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def _iqr(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[2] - q[0]


def _device_of(device: str | None) -> str:
    if device is not None:
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device={device!r} is not a device; allowed: 'cpu', 'cuda'")
        return device
    from common.core import env
    return env.current().device


def bench(fn: Callable, *args, label: str | None = None, device: str | None = None, min_run_time: float = 0.2,
          warmup: int = 1, flush_l2: bool = True, min_blocks: int = 3, **kwargs) -> Timing:
    """Time `fn(*args, **kwargs)`; return a `Timing` (seconds per call).

    - warm-up calls first (first-call costs: allocation, compilation, caches);
    - CPU: `torch.utils.benchmark` blocks of calls until `min_run_time` seconds and at least `min_blocks` blocks
      (the extra blocks capped at max(1 s, 4 x min_run_time), so a very slow call is not repeated for minutes), with
      torch's current thread count (see `common.core.ceilings.threads`);
    - GPU: `triton.testing.do_bench` (CUDA events, synchronised, L2 flushed); `flush_l2=False`: batches of calls
      between CUDA events (the cache stays warm, as the data would in a fused or repeated kernel).
    """
    if min_run_time <= 0:
        raise ValueError(f"min_run_time={min_run_time!r} must be > 0 seconds")
    if warmup < 0:
        raise ValueError(f"warmup={warmup!r} must be >= 0")
    if not isinstance(min_blocks, int) or min_blocks < 1:
        raise ValueError(f"min_blocks={min_blocks!r} must be an int >= 1")
    dev = _device_of(device)
    label = label or getattr(fn, "__name__", "fn")
    call = (lambda: fn(*args, **kwargs)) if (args or kwargs) else fn
    for _ in range(warmup):
        call()
    if dev == "cuda":
        return _bench_cuda(call, label, min_run_time, flush_l2)
    return _bench_cpu(call, label, min_run_time, min_blocks)


def _bench_cpu(call: Callable, label: str, min_run_time: float, min_blocks: int = 3) -> Timing:
    import torch
    from torch.utils import benchmark
    timer = benchmark.Timer(stmt="call()", globals={"call": call}, num_threads=torch.get_num_threads(),
                            label=label)
    m = timer.blocked_autorange(min_run_time=min_run_time)
    times = list(m.times)
    budget = max(1.0, 4 * min_run_time)
    while len(times) < min_blocks and budget > 0:  # a slow call fills min_run_time in one block: time more blocks
        extra = timer.timeit(m.number_per_run).times
        times.extend(extra)
        budget -= extra[0] * m.number_per_run
    return Timing(label=label, median_s=statistics.median(times), iqr_s=_iqr(times), times=times, device="cpu")


def _bench_cuda(call: Callable, label: str, min_run_time: float, flush_l2: bool) -> Timing:
    import torch
    rep_ms = max(min_run_time * 1e3, 25.0)
    if not flush_l2:
        times_ms = _cuda_batched_times(call, rep_ms, torch)
    else:
        try:
            from triton.testing import do_bench
            times_ms = do_bench(call, warmup=25, rep=rep_ms, return_mode="all")
        except Exception:  # older triton without return_mode="all": fall back to our own event loop
            times_ms = _cuda_event_times(call, rep_ms, flush_l2, torch)
    times = [t * 1e-3 for t in times_ms]
    return Timing(label=label, median_s=statistics.median(times), iqr_s=_iqr(times), times=times, device="cuda")


def _cuda_event_times(call: Callable, rep_ms: float, flush_l2: bool, torch) -> list:
    cache = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda") if flush_l2 else None
    torch.cuda.synchronize()
    times = []
    budget = 0.0
    while budget < rep_ms or len(times) < 5:
        if cache is not None:
            cache.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
        budget += times[-1]
    return times


def _cuda_batched_times(call: Callable, rep_ms: float, torch, batch_ms: float = 1.0, blocks: int = 10) -> list:
    """Per-call milliseconds from `blocks` batches of back-to-back calls, each batch between two CUDA events and
    long enough (>= batch_ms) that event and launch overheads vanish in it. No cache flush."""
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(); call(); end.record(); end.synchronize()
    per_call = max(start.elapsed_time(end), 1e-4)
    n = max(1, int(batch_ms / per_call))
    blocks = max(blocks, int(rep_ms / max(n * per_call, 1e-3)) // 4)
    times = []
    for _ in range(min(blocks, 200)):
        start.record()
        for _ in range(n):
            call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / n)
    return times


def compare(timings: Sequence[Timing], work: dict | float | None = None, work_unit: str = "GFLOP/s",
            work_scale: float = 1e9, baseline: str | None = None):
    """A pandas table of timings: median, spread, optional rate, and speed relative to `baseline` (a label).

    `work` is the amount of work per call (a number for all rows, or a dict label -> amount), reported as
    `work / median / work_scale` in column `work_unit`.
    """
    import pandas as pd
    rows = []
    for t in timings:
        row = {"label": t.label, "median_ms": t.ms, "iqr_%": 100 * t.spread, "runs": len(t.times)}
        amount = work.get(t.label) if isinstance(work, dict) else work
        if amount is not None:
            row[work_unit] = t.rate(amount) / work_scale
        rows.append(row)
    df = pd.DataFrame(rows).set_index("label")
    if baseline is not None:
        if baseline not in df.index:
            raise ValueError(f"baseline={baseline!r} is not a label here; labels: {list(df.index)}")
        df["speedup"] = df.loc[baseline, "median_ms"] / df["median_ms"]
    return df
