"""The event simulator: a device starts its next operation when it is free and the operation's inputs have arrived
(the previous stage's forward, the next stage's backward, plus a point-to-point transfer time when they come from
another device). A schedule whose order waits on something that can never come is reported as a deadlock.

Bubble, as measured here: for each device, the time it is idle between t=0 and the makespan (the end of the last
operation anywhere). `Result.bubble` is the mean over devices and `Result.bubble_max` the largest. Activation memory:
a device holds a micro-batch's activations for a stage from the start of its forward until its backward for inputs
(B or Bi) ends; `Result.peak_activations` counts them in units of "one micro-batch through 1/PP of the model". Parameter
memory: the stages a device holds, in units of 1/PP of the model (DualPipeV's stages are half that size).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from functools import lru_cache

from common.parallel.pipeline.schedules import Durations, Schedule, build


@dataclass
class Result:
    """What `simulate` measured. Times are in the unit of the durations."""

    schedule: Schedule
    durations: Durations
    makespan: float
    busy: list                      # per device: time spent running operations
    idle: list                      # per device: makespan - busy (the bubble of that device)
    peak_activations: list          # per device, in units of one micro-batch through 1/PP of the model
    parameters: list                # per device, in units of 1/PP of the model
    spans: list = field(repr=False)  # per device: list of (start, end, kind, op)

    @property
    def bubble(self) -> float:
        """Mean idle time per device within the makespan."""
        return sum(self.idle) / len(self.idle)

    @property
    def bubble_max(self) -> float:
        return max(self.idle)

    @property
    def bubble_fraction(self) -> float:
        """Idle share of all device time: sum(idle) / (devices x makespan)."""
        return sum(self.idle) / (len(self.idle) * self.makespan)

    def summary(self) -> dict:
        return {"schedule": self.schedule.name, "pp": self.schedule.pp, "makespan": self.makespan,
                "bubble_mean": self.bubble, "bubble_max": self.bubble_max, "bubble_min": min(self.idle),
                "peak_activations": max(self.peak_activations), "parameters": max(self.parameters)}


class Deadlock(RuntimeError):
    """The schedule's order makes some device wait for work that can never happen."""


def _dependencies(item, stages):
    """Keys (class, direction, stage, micro_batch) an item needs: class "F" = forward done, "G" = input grad done."""
    kind, d, s, j = item
    if kind == "F":
        return [("F", d, s - 1, j)] if s > 0 else []
    if kind in ("B", "Bi"):
        deps = [("F", d, s, j)]
        if s < stages - 1:
            deps.append(("G", d, s + 1, j))
        return deps
    return [("G", d, s, j)]  # W needs its Bi


def _produces(item):
    kind, d, s, j = item
    if kind == "F":
        return [("F", d, s, j)]
    if kind == "B":
        return [("G", d, s, j), ("W", d, s, j)]
    if kind == "Bi":
        return [("G", d, s, j)]
    return [("W", d, s, j)]


def _done_keys(done_at, stages, m):
    """Decode the int keys of `simulate` back to (class, direction, stage, micro_batch) tuples (for messages)."""
    out = set()
    for k in done_at:
        j, rest = k % m, k // m
        st, rest = rest % stages, rest // stages
        d, c = rest % 2, rest // 2
        out.add(("F" if c == 0 else "G" if c == 1 else "W", d, st, j))
    return out


_BITS = {"F": 1, "B": 6, "Bi": 2, "W": 4}  # forward, input gradient, weight gradient


def validate(schedule: Schedule) -> None:
    """Every work item exactly once, on the device that holds its stage; B or (Bi and W) for every forward."""
    seen = {}
    placement, m = schedule.placement, schedule.micro_batches
    for dev, ops in enumerate(schedule.ops):
        for op in ops:
            if len(op) == 2 and not (op[0][0] == "F" and op[1][0] == "B"):
                raise ValueError(f"device {dev}: an overlapped op pairs a forward with a full backward, got {op}")
            for item in op:
                kind, d, s, j = item
                bits = _BITS.get(kind)
                if bits is None:
                    raise ValueError(f"device {dev}: unknown kind {kind!r} in {item}; allowed: F, B, Bi, W")
                where = placement.get((d, s))
                if where is None or not 0 <= j < m:
                    raise ValueError(f"device {dev}: {item} names a stage or micro-batch outside the schedule")
                if where != dev:
                    raise ValueError(f"device {dev}: {item} belongs to device {where}")
                key = (d, s, j)
                have = seen.get(key, 0)
                if have & bits:
                    raise ValueError(f"{item} on device {dev} repeats work already done for micro-batch {j} "
                                     f"on that stage")
                seen[key] = have | bits
    if len(seen) != len(placement) * m or any(v != 7 for v in seen.values()):
        names = {1: "F", 2: "G", 4: "W"}
        for (d, s) in placement:
            for j in range(m):
                have = seen.get((d, s, j), 0)
                for bit, c in names.items():
                    if not have & bit:
                        raise ValueError(f"schedule {schedule.name}: work item {(c, d, s, j)} is missing (F forward, "
                                         f"G backward for inputs, W backward for weights)")


def simulate(schedule: Schedule, durations: Durations | None = None, check: bool = True) -> Result:
    """Run `schedule` event by event with `durations`; return a `Result` (makespan, per-device busy/idle, memory).

    Each device executes its ops in order, one at a time. An op starts at max(device free, every input ready), where
    an input produced on another device is ready `durations.comm` after its producer ended. Raises `Deadlock` when
    devices wait on each other forever.
    """
    dur = durations or Durations()
    if not isinstance(dur, Durations):
        raise ValueError(f"durations={durations!r} is not a Durations(F, B, W, FB, comm)")
    if check:
        validate(schedule)
    return run_compiled(schedule, compile_plans(schedule), dur)


def compile_plans(schedule: Schedule) -> list:
    """Every op of every device as (kind, needs, makes, forwards, backwards): what it waits for -- (key, whether
    it comes from another device) -- and the keys it produces; a key is an int naming (class, direction, stage,
    micro_batch), class 0 = forward done, 1 = input gradient done, 2 = weights done. A sweep over durations
    compiles a schedule once (`run_compiled`)."""
    stages, placement, m = schedule.stages, schedule.placement, schedule.micro_batches
    C = 2 * stages * m
    dev_of = {d * stages + st: dev for (d, st), dev in placement.items()}
    plans = []
    for dev, ops in enumerate(schedule.ops):
        plan = []
        for op in ops:
            needs, makes = [], []
            nf = nb = 0
            for kind, d, st, j in op:
                row = d * stages + st
                base = row * m + j
                if kind == "F":
                    if st > 0:
                        needs.append((base - m, dev_of[row - 1] != dev))
                    makes.append(base)
                    nf += 1
                elif kind == "W":
                    needs.append((C + base, False))
                    makes.append(2 * C + base)
                else:
                    needs.append((base, False))
                    if st < stages - 1:
                        needs.append((C + base + m, dev_of[row + 1] != dev))
                    makes.append(C + base)
                    if kind == "B":
                        makes.append(2 * C + base)
                    nb += 1
            plan.append(("FB" if len(op) == 2 else op[0][0], needs, makes, nf, nb))
        plans.append(plan)
    return plans


def run_compiled(schedule: Schedule, compiled: list, dur: Durations) -> Result:
    """`simulate` on the plans `compile_plans(schedule)` made (no validation)."""
    stages, comm, placement = schedule.stages, dur.comm, schedule.placement
    n_dev, m = len(schedule.ops), schedule.micro_batches
    op_time = {k: dur.of(k) for k in ("F", "B", "Bi", "W", "FB")}
    plans = [[(op_time[kind], [(k, comm if far else 0.0) for k, far in needs], makes, kind, nf, nb)
              for kind, needs, makes, nf, nb in plan] for plan in compiled]

    done_at = {}                       # key -> end time
    waiting = {}                       # key -> devices waiting for it
    pos = [0] * n_dev
    free = [0.0] * n_dev
    starts = [[] for _ in range(n_dev)]
    running = [None] * n_dev           # makes-list of the op a device is running
    events = [(0.0, d) for d in range(n_dev)]  # (time, device): an op ended, or the device may try its next op
    heapq.heapify(events)
    push, pop = heapq.heappush, heapq.heappop

    while events:
        now, dev = pop(events)
        makes = running[dev]
        if makes is not None:  # completion of this device's running op
            running[dev] = None
            for k in makes:
                done_at[k] = now
                if k in waiting:
                    for other in waiting.pop(k):
                        push(events, (now, other))
        plan = plans[dev]
        p = pos[dev]
        if p >= len(plan):
            continue
        step = plan[p]
        ready = free[dev]
        blocked = None
        for k, delay in step[1]:
            t = done_at.get(k)
            if t is None:
                blocked = k
                break
            t += delay
            if t > ready:
                ready = t
        if blocked is not None:
            waiting.setdefault(blocked, []).append(dev)
            continue
        starts[dev].append(ready)
        end = ready + step[0]
        free[dev] = end
        pos[dev] = p + 1
        running[dev] = step[2]
        push(events, (end, dev))

    if any(pos[d] < len(plans[d]) for d in range(n_dev)):
        stuck = [d for d in range(n_dev) if pos[d] < len(plans[d])]
        d = stuck[0]
        op = schedule.ops[d][pos[d]]
        finished = _done_keys(done_at, stages, m)
        need = [k for item in op for k in _dependencies(item, stages) if k not in finished]
        raise Deadlock(f"schedule {schedule.name} deadlocks: {len(stuck)} devices wait forever; device {d} waits "
                       f"to run {op} which needs {need[0] if need else '?'} (F = forward, G = backward for inputs), "
                       f"which is never produced before it in any device's order")
    spans = [[(st, st + plans[d][i][0], plans[d][i][3], schedule.ops[d][i]) for i, st in enumerate(starts[d])]
             for d in range(n_dev)]
    makespan = max(free)
    busy = [sum(pl[0] for pl in plan) for plan in plans]
    idle = [makespan - b for b in busy]
    peaks = []
    for plan in plans:
        count = peak = 0
        for pl in plan:
            count += pl[4]
            if count > peak:
                peak = count
            count -= pl[5]
        peaks.append(peak)
    frac = schedule.stage_fraction
    peaks = [p * frac for p in peaks] if frac != 1 else peaks
    params = [sum(frac for key, d in placement.items() if d == dev) for dev in range(n_dev)]
    params = [int(p) if float(p).is_integer() else p for p in params]
    return Result(schedule, dur, makespan, busy, idle, peaks, params, spans)


def bubble_max_over(schedule: Schedule, durations: list) -> list:
    """`simulate(schedule, d).bubble_max` for every d in `durations`, all at once: a start time is the max of the
    device's previous end and the inputs' arrivals whatever the durations, so one run's start order (an order of
    the dependencies alone) evaluates every run together, as vectors -- the same floats as one run at a time."""
    import numpy as np
    first = simulate(schedule, durations[0])  # validates, and gives an order that respects every dependency
    compiled = compile_plans(schedule)
    order = sorted((span[0], dev, i) for dev, spans in enumerate(first.spans) for i, span in enumerate(spans))
    of = {k: np.array([d.of(k) for d in durations]) for k in ("F", "B", "Bi", "W", "FB")}
    comm, zero = np.array([d.comm for d in durations]), np.zeros(len(durations))
    done, free, busy = {}, [zero] * len(compiled), [zero] * len(compiled)
    for _, dev, i in order:
        kind, needs, makes, _, _ = compiled[dev][i]
        start = free[dev]
        for k, far in needs:
            start = np.maximum(start, done[k] + comm if far else done[k])
        free[dev] = start + of[kind]
        busy[dev] = busy[dev] + of[kind]
        for k in makes:
            done[k] = free[dev]
    makespan = np.max(free, axis=0)
    return np.max([makespan - b for b in busy], axis=0).tolist()


@lru_cache(maxsize=128)
def _compiled(name: str, pp: int, micro_batches: int, virtual_stages: int) -> tuple[Schedule, list]:
    schedule = build(name, pp, micro_batches, virtual_stages)
    validate(schedule)
    return schedule, compile_plans(schedule)


def run(name: str, pp: int, micro_batches: int, durations: Durations | None = None,
        virtual_stages: int = 2) -> Result:
    """build + simulate in one call. The schedule is built, validated and compiled once per (name, pp, micro_batches,
    virtual_stages) and shared by the results (read it, do not change it): a sweep over durations re-runs only the
    event loop (lab 13's model simulates six schedules per prediction)."""
    dur = durations or Durations()
    if not isinstance(dur, Durations):
        raise ValueError(f"durations={durations!r} is not a Durations(F, B, W, FB, comm)")
    schedule, plans = _compiled(name, pp, micro_batches, virtual_stages)
    return run_compiled(schedule, plans, dur)


def fb_pairs(result_or_schedule) -> list:
    """Per device: how many of its operations are overlapped F&B pairs (DualPipe's steady state)."""
    sched = getattr(result_or_schedule, "schedule", result_or_schedule)
    return [sum(1 for op in ops if len(op) == 2) for ops in sched.ops]
