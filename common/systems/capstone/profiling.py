"""Profiling the step, and what the profiler itself costs.

`profile_step` runs one step under `torch.profiler` (CPU activity, plus CUDA on a GPU; no shapes, no stacks: the
lean configuration) inside `record_function("step")`, writes the Chrome trace and reads it back with
`common.core.traces`: the profiled step's duration, each component's time and operator count, the idle share.
The profiler's native `USDT ... profiler_start/stop` lines are captured, not printed.

The profiler is not free: each operator it records costs it time, so a profiled step is slower than an unprofiled
one, and the extra time lands where the operators are. `overhead_per_op` measures it (profiled minus unprofiled
step, over the operators recorded); `corrected_share` takes it out of one component's profiled time; `amdahl`
bounds a change's speed-up from a share.
"""
from __future__ import annotations

import math
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


def profile_step(block: Block, x: torch.Tensor, version: Version, path, moe_fn=None, warmup: bool = True,
                 components=COMPONENTS) -> StepProfile:
    """Profile one step (after a warm-up step unless `warmup=False`), write its Chrome trace to `path`, read it."""
    from torch.profiler import ProfilerActivity, profile, record_function
    if warmup:
        step(block, x, version, moe_fn)
    cuda = x.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with measurement.native_stderr_captured():
        with profile(activities=activities) as prof:
            with record_function("step"):
                step(block, x, version, moe_fn)
                if cuda:
                    torch.cuda.synchronize()
        prof.export_chrome_trace(str(path))
    events = traces.load_trace(path)
    window = traces.find_window(events, "step")
    ops = [e for e in traces.of_category(events, "cpu_op") if window[0] <= e["ts"] <= window[1]]
    return StepProfile(path, window, traces.component_times(events, window, components),
                       traces.idle_share(ops, window), len(events), ops)


def profiled_and_unprofiled(block: Block, x: torch.Tensor, version: Version, path, n: int = 3, moe_fn=None,
                            sync=lambda: None) -> tuple[list, list]:
    """n unprofiled step times (s) and n profiles of the same step, taken alternately (so a drifting machine slows
    both alike): what the profiler adds, measured at one moment. The profiles are written to `path` in turn."""
    import time
    step(block, x, version, moe_fn)  # warm-up
    times, profiles = [], []
    for _ in range(n):
        start = time.perf_counter()
        step(block, x, version, moe_fn)
        sync()
        times.append(time.perf_counter() - start)
        profiles.append(profile_step(block, x, version, path, moe_fn, warmup=False))
    return times, profiles


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
