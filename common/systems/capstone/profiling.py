"""Profiling the step, and what the profiler itself costs, measured warm.

`profile_step` runs one step under `torch.profiler` (CPU activity, plus CUDA on a GPU; no shapes, no stacks: the
lean configuration) inside `record_function("step")`, writes the Chrome trace and reads it back with
`common.core.traces`: the profiled step's duration, each component's time and operator count, the idle share.

The profiler is not free: each operator it records costs it time, so a profiled step is slower than an unprofiled
one, and the extra time lands where the operators are. Its FIRST step is slower still: the profiler starts up (a
cold profile once read 3x the step; warm ones 1.1-1.3x). `profiler_overhead` measures it the way a profiling
session runs: one `torch.profiler` with a schedule of `wait=1, warmup=1, active=1` repeated `rounds` times, every
step timed -- the wait steps run unprofiled, the warm-up step absorbs the start-up, the active step is the profiled
one -- so profiled and unprofiled steps alternate at the same moment of the machine. The FIRST round's profiled
step still pays the start-up (a warm-up step records nothing, so it cannot absorb it): that round is the warm-up
round, kept apart (`cold`); the ratio of each later round's active step to its wait step, median over the rounds,
is the overhead. `corrected_share` takes the profiler's cost
out of one component's profiled time; `amdahl` bounds a change's speed-up from a share.
The profiler's native `USDT ... profiler_start/stop` lines are captured, not printed.
"""
from __future__ import annotations

import math
import statistics
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from common.core import measurement, traces
from common.systems.capstone.block import COMPONENTS, Block, step
from common.systems.capstone.config import Version


@dataclass
class StepProfile:
    """One profiled step, read from its trace: times in microseconds."""

    path: Path
    window: tuple
    times: dict  # component -> {"us", "ops"} (traces.component_times), "other" included
    idle_share: float
    events: int  # complete events in the trace
    cpu_ops: list = field(default_factory=list, repr=False)  # the operator events inside the step

    @property
    def profiled_us(self) -> float:
        return self.window[1] - self.window[0]

    @property
    def ops(self) -> int:
        """Operator events recorded inside the step (nested ones included)."""
        return sum(t["ops"] for t in self.times.values())

    def share(self, component: str) -> float:
        """The component's share of the profiled step (its operators' time, backward included)."""
        return self.times[component]["us"] / self.profiled_us

    def shares(self) -> dict:
        out = {name: self.share(name) for name in self.times if name != "other"}
        out["idle"] = self.idle_share
        out["other"] = 1.0 - sum(out.values())
        return out

    def with_gaps(self, component: str) -> float:
        """The component's operator time plus its part of the host's gaps between operators (us; the gaps split
        among the components by their operator counts): what the component costs the profiled step."""
        t = self.times[component]
        return t["us"] + self.idle_share * self.profiled_us * t["ops"] / self.ops


def read_profile(path, components=COMPONENTS) -> StepProfile:
    """The StepProfile of a Chrome trace holding one `record_function("step")` range."""
    events = traces.load_trace(path)
    window = traces.find_window(events, "step")
    ops = [e for e in traces.of_category(events, "cpu_op") if window[0] <= e["ts"] <= window[1]]
    return StepProfile(Path(path), window, traces.component_times(events, window, components),
                       traces.idle_share(ops, window), len(events), ops)


def _activities(x: torch.Tensor):
    from torch.profiler import ProfilerActivity
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if x.device.type == "cuda" else [])


def _profiled_step(block, x, version, layers):
    with torch.profiler.record_function("step"):
        step(block, x, version, layers)
        if x.device.type == "cuda":
            torch.cuda.synchronize()


def profile_step(block: Block, x: torch.Tensor, version: Version, path, layers=None, warmup: bool = True,
                 components=COMPONENTS) -> StepProfile:
    """Profile one step (after an unprofiled warm-up step unless `warmup=False`), write its Chrome trace to `path`,
    read it. One profile, started cold: for the profiler's cost use `profiler_overhead`."""
    from torch.profiler import profile
    if warmup:
        step(block, x, version, layers)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with measurement.native_stderr_captured():
        with profile(activities=_activities(x)) as prof:
            _profiled_step(block, x, version, layers)
        prof.export_chrome_trace(str(path))
    return read_profile(path, components)


@dataclass
class Overhead:
    """`profiler_overhead`'s measurement: step times (s) by round, and each round's profile."""

    unprofiled: list
    profiled: list
    profiles: list = field(repr=False)
    cold: float = float("nan")  # the warm-up round's profiled / unprofiled step: the profiler's start-up in it

    @property
    def ratios(self) -> list:
        return [p / u for p, u in zip(self.profiled, self.unprofiled)]

    @property
    def ratio(self) -> float:
        """Median over the rounds of profiled / unprofiled step."""
        return statistics.median(self.ratios)

    @property
    def unprofiled_s(self) -> float:
        return statistics.median(self.unprofiled)

    @property
    def profile(self) -> StepProfile:
        """The round whose profiled step is the median one."""
        order = sorted(range(len(self.profiles)), key=lambda i: self.profiled[i])
        return self.profiles[order[len(order) // 2]]


def profiler_overhead(block: Block, x: torch.Tensor, version: Version, path, rounds: int = 3, layers=None,
                      sync=lambda: None, components=COMPONENTS) -> Overhead:
    """What the profiler adds to a step, warm: 1 + `rounds` cycles of (unprofiled, warm-up, profiled) steps under
    one profiler schedule, each step timed; the first cycle is the warm-up round (its ratio kept as `cold`); each
    later round's profiled trace is written to `path` (numbered) and read."""
    from torch.profiler import profile, schedule
    if not (isinstance(rounds, int) and rounds >= 1):
        raise ValueError(f"rounds={rounds!r} must be an int >= 1")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    written = []

    cycles = []

    def on_ready(prof):
        cycles.append(None)
        if len(cycles) == 1:
            return  # the warm-up round: its profile holds the start-up
        out = path.with_name(f"{path.stem}_{len(written)}{path.suffix}")
        prof.export_chrome_trace(str(out))
        written.append(out)

    step(block, x, version, layers)  # warm-up, unprofiled
    sync()
    times = {"wait": [], "warmup": [], "active": []}
    with measurement.native_stderr_captured(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle")
        with profile(activities=_activities(x), schedule=schedule(wait=1, warmup=1, active=1, repeat=rounds + 1),
                     on_trace_ready=on_ready) as prof:
            for i in range(3 * (rounds + 1)):
                start = time.perf_counter()
                _profiled_step(block, x, version, layers)
                sync()
                times[("wait", "warmup", "active")[i % 3]].append(time.perf_counter() - start)
                prof.step()
    cold = times["active"][0] / times["wait"][0]
    return Overhead(times["wait"][1:], times["active"][1:], [read_profile(p, components) for p in written], cold)


def busy_shares(profiles, components=COMPONENTS) -> dict:
    """Each component's share of the busy time of a step, from several profiles of it: the component's LEAST time
    over the profiles (a preemption on a shared machine lengthens an operator, never shortens it), over the sum of
    those least times."""
    least = {name: min(p.times[name]["us"] for p in profiles) for name in components}
    total = sum(least.values())
    return {name: t / total for name, t in least.items()}


def overhead_per_op(profiled_s: float, unprofiled_s: float, ops: int) -> float:
    """Seconds the profiler adds per recorded operator: (profiled step - unprofiled step) / operators."""
    if not (profiled_s > 0 and unprofiled_s > 0) or ops < 1:
        raise ValueError(f"need positive step times and ops >= 1, got {profiled_s}, {unprofiled_s}, {ops}")
    return (profiled_s - unprofiled_s) / ops


def corrected_share(part_s: float, part_ops: int, profiled_s: float, ops: int, unprofiled_s: float) -> float:
    """A component's share of the UNPROFILED step: its profiled time minus its operators' share of the profiler's
    overhead (part_ops x overhead per op), over the unprofiled step (clipped to [0, 1])."""
    per_op = overhead_per_op(profiled_s, unprofiled_s, ops)
    return min(max((part_s - part_ops * per_op) / unprofiled_s, 0.0), 1.0)


def amdahl(share: float, part_speedup: float = math.inf) -> float:
    """Amdahl's law: the step's speed-up when a part holding `share` of it gets `part_speedup` faster (infinite:
    the part becomes free, the bound 1 / (1 - share))."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share={share!r} must lie in [0, 1]")
    if not part_speedup > 0:
        raise ValueError(f"part_speedup={part_speedup!r} must be > 0")
    rest = 1.0 - share + (0.0 if math.isinf(part_speedup) else share / part_speedup)
    return math.inf if rest <= 0 else 1.0 / rest
