"""Pipeline-parallel schedules, simulated: GPipe, 1F1B, ZB1P (zero bubble, ZB-H1) and DualPipe.

A *schedule* gives every device (pipeline rank) an ordered list of operations. An operation does the work of one
micro-batch on one stage -- a forward `F`, a full backward `B` (input and weight gradients), a backward for inputs only
`Bi` (B - W, zero-bubble split), a backward for weights `W` -- or an overlapped pair `FB` (the forward of one
micro-batch and the backward of another run together, DualPipe's "F&B"). `simulate` runs the schedule event by
event: a device starts its next operation when it is free and the operation's inputs have arrived (the previous stage's
forward, the next stage's backward, plus a point-to-point transfer time when they come from another device). A schedule
whose order waits on something that can never come is reported as a deadlock.

Bubble, as measured here: for each device, the time it is idle between t=0 and the makespan (the end of the last
operation anywhere). `Result.bubble` is the mean over devices and `Result.bubble_max` the largest; the README formulas
of DeepSeek's DualPipe (1F1B: (PP-1)(F+B), ZB1P: (PP-1)(F+B-2W), DualPipe: (PP/2-1)(F&B+B-3W)) give the idle time of
one device, in the same time unit as F, B, W.

Activation memory: a device holds a micro-batch's activations for a stage from the start of its forward until its
backward for inputs (B or Bi) ends; `Result.peak_activations` counts them in units of "one micro-batch through 1/PP
of the model" (one stage of 1F1B). Parameter memory: the stages of the model a device holds, in units of 1/PP of the
model. (DualPipeV's stages are half that size, `Schedule.stage_fraction` = 0.5.)
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field

SCHEDULES = ("gpipe", "1f1b", "zb1p", "dualpipe")   # the four of DeepSeek's README table (GPipe added)
ALL_SCHEDULES = SCHEDULES + ("dualpipev",)
INTERLEAVED = "interleaved"   # Megatron's interleaved 1F1B (virtual stages): build(INTERLEAVED, pp, m, virtual_stages)
KIND_COLORS = {"F": "#1f77b4", "B": "#2ca02c", "Bi": "#98df8a", "W": "#ff7f0e", "FB": "#9467bd"}
KIND_NAMES = {"F": "forward F", "B": "full backward B", "Bi": "backward for inputs B-W", "W": "backward for weights W",
              "FB": "overlapped F&B"}


# ----------------------------------------------------------------------------------------------- durations
@dataclass(frozen=True)
class Durations:
    """Execution times of one chunk (one micro-batch through one stage), all in the same unit.

    F: forward; B: full backward (inputs and weights); W: the weights part of B (so the zero-bubble "backward for
    inputs" takes B - W); FB: a forward and a backward chunk run overlapped (DualPipe's F&B; default F + B, i.e. no
    overlap gain); comm: point-to-point transfer time between two devices (default 0).
    """

    F: float = 1.0
    B: float = 2.0
    W: float = 1.0
    FB: float | None = None
    comm: float = 0.0

    def __post_init__(self):
        for name in ("F", "B", "W"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"{name}={v!r} is not a duration; allowed: a number > 0")
        if not self.W < self.B:
            raise ValueError(f"W={self.W!r} must be smaller than B={self.B!r}: W is the weights part of the full "
                             f"backward B, and the backward for inputs takes B - W > 0")
        if self.FB is not None and (not isinstance(self.FB, (int, float)) or not self.FB > 0):
            raise ValueError(f"FB={self.FB!r} is not a duration; allowed: a number > 0 (or None for F + B)")
        if not isinstance(self.comm, (int, float)) or not self.comm >= 0:
            raise ValueError(f"comm={self.comm!r} is not a transfer time; allowed: a number >= 0")

    @property
    def fb(self) -> float:
        return self.F + self.B if self.FB is None else self.FB

    def of(self, kind: str) -> float:
        return {"F": self.F, "B": self.B, "Bi": self.B - self.W, "W": self.W, "FB": self.fb}[kind]


# ----------------------------------------------------------------------------------------------- schedules
# A work item is (kind, direction, stage, micro_batch) with kind in F, B, Bi, W. An op is a tuple of work items:
# one item, or two for an overlapped FB op (forward item first, backward item second).

@dataclass
class Schedule:
    """Per-device op lists plus the placement of stages on devices.

    ops[d]: device d's operations in order; each is a tuple of work items (kind, direction, stage, micro_batch).
    placement[(direction, stage)] -> device. stages: stages per direction; micro_batches: per direction.
    stage_fraction: the share of 1/PP of the model one stage holds (1; DualPipeV cuts the model in 2*PP stages: 0.5).
    """

    name: str
    pp: int
    stages: int
    micro_batches: int
    directions: int
    placement: dict
    ops: list
    stage_fraction: float = 1.0

    def kind_of(self, op) -> str:
        return "FB" if len(op) == 2 else op[0][0]


def _check_pp(pp, name="pp"):
    if not isinstance(pp, int) or isinstance(pp, bool) or pp < 1:
        raise ValueError(f"{name}={pp!r} is not a pipeline size; allowed: an integer >= 1")


def _check_m(m, name="micro_batches"):
    if not isinstance(m, int) or isinstance(m, bool) or m < 1:
        raise ValueError(f"{name}={m!r} is not a number of micro-batches; allowed: an integer >= 1")


def _single(name, pp, m, ops):
    return Schedule(name, pp, pp, m, 1, {(0, s): s for s in range(pp)}, ops)


def gpipe(pp: int, micro_batches: int) -> Schedule:
    """GPipe: every device runs all forwards, then all backwards (activations of every micro-batch held)."""
    _check_pp(pp)
    _check_m(micro_batches)
    ops = [[(("F", 0, s, j),) for j in range(micro_batches)] + [(("B", 0, s, j),) for j in range(micro_batches)]
           for s in range(pp)]
    return _single("gpipe", pp, micro_batches, ops)


def one_f_one_b_order(pp: int, micro_batches: int, stage: int) -> list:
    """The 1F1B order of one stage as ("F", j) / ("B", j) pairs: pp-1-stage warm-up forwards, then one forward and
    one backward alternately, then the remaining backwards."""
    warm = min(pp - 1 - stage, micro_batches)
    order = [("F", j) for j in range(warm)]
    for j in range(micro_batches - warm):
        order += [("F", warm + j), ("B", j)]
    order += [("B", j) for j in range(micro_batches - warm, micro_batches)]
    return order


def one_f_one_b(pp: int, micro_batches: int) -> Schedule:
    """1F1B (PipeDream-flush): at most pp - stage micro-batches in flight on each stage."""
    _check_pp(pp)
    _check_m(micro_batches)
    ops = [[((k, 0, s, j),) for k, j in one_f_one_b_order(pp, micro_batches, s)] for s in range(pp)]
    return _single("1f1b", pp, micro_batches, ops)


def zb1p(pp: int, micro_batches: int) -> Schedule:
    """ZB1P (zero bubble, ZB-H1): 1F1B with the backward split into Bi (inputs) and W (weights).

    Bi stays on the critical path (gradients flow back sooner than with a full B); W is deferred: stage s keeps s weight
    passes pending and runs them at the end, where they fill what would be the cool-down bubble of 1F1B. Micro-batches
    in flight (forward done, Bi not yet) stay at most pp - s, as in 1F1B.
    """
    _check_pp(pp)
    _check_m(micro_batches)
    ops = []
    for s in range(pp):
        lag = min(s, micro_batches)
        order, w_next = [], 0
        for k, j in one_f_one_b_order(pp, micro_batches, s):
            if k == "F":
                order.append((("F", 0, s, j),))
            else:
                order.append((("Bi", 0, s, j),))
                if j + 1 > lag:  # keep `lag` weight passes pending
                    order.append((("W", 0, s, w_next),))
                    w_next += 1
        order += [(("W", 0, s, j),) for j in range(w_next, micro_batches)]
        ops.append(order)
    return _single("zb1p", pp, micro_batches, ops)


def interleaved_order(pp: int, micro_batches: int, rank: int, virtual_stages: int) -> list:
    """Megatron-LM's interleaved 1F1B order of one rank as (kind, chunk, micro_batch) with kind "F" or "B" and chunk
    0..virtual_stages-1 (chunk c of rank r is model stage c * pp + r).

    Forwards go through the rank's chunks in groups of pp micro-batches (chunk 0 for micro-batches 0..pp-1, chunk 1
    for the same ones, ...), backwards likewise from the last chunk; warm-up (pp - rank - 1) * 2 + (v - 1) * pp
    forwards, then one forward and one backward alternately, then the remaining backwards
    (megatron/core/pipeline_parallel/schedules.py, forward_backward_pipelining_with_interleaving).
    """
    v, total = virtual_stages, micro_batches * virtual_stages

    def item(k, forward):
        group, within = divmod(k, pp * v)
        chunk = within // pp
        return (group * pp + within % pp, chunk if forward else v - 1 - chunk)

    warm = min((pp - rank - 1) * 2 + (v - 1) * pp, total)
    order = [("F", *reversed(item(k, True))) for k in range(warm)]
    for k in range(total - warm):
        order.append(("F", *reversed(item(warm + k, True))))
        order.append(("B", *reversed(item(k, False))))
    order += [("B", *reversed(item(k, False))) for k in range(total - warm, total)]
    return order


def interleaved_1f1b(pp: int, micro_batches: int, virtual_stages: int = 2) -> Schedule:
    """Megatron's interleaved 1F1B: the model in pp * v stages, rank r holding stages r, r + pp, ..., r + (v-1) pp
    (v "virtual stages", each 1/v of a 1F1B stage: `stage_fraction` 1/v, so give it 1/v of the F, B, W times).
    Bubble (pp - 1)(F + B) / v in full-stage times, i.e. a fraction (pp - 1) / (v m) of the ideal step; activations
    pp + (pp - 1) / v stage-equivalents on rank 0. Needs micro_batches a multiple of pp (as Megatron does)."""
    _check_pp(pp)
    _check_m(micro_batches)
    v = virtual_stages
    if isinstance(v, bool) or not isinstance(v, int) or v < 2:
        raise ValueError(f"virtual_stages={v!r} is not a number of model chunks per rank; allowed: an integer >= 2 "
                         f"(v = 1 is plain 1F1B)")
    if micro_batches % pp:
        raise ValueError(f"micro_batches={micro_batches!r}: interleaved 1F1B needs a multiple of pp = {pp} "
                         f"(micro-batches go through each chunk in groups of pp)")
    ops = [[((k, 0, c * pp + r, j),) for k, c, j in interleaved_order(pp, micro_batches, r, v)] for r in range(pp)]
    placement = {(0, s): s % pp for s in range(pp * v)}
    return Schedule("interleaved", pp, pp * v, micro_batches, 1, placement, ops, stage_fraction=1 / v)


def check_dualpipe_args(pp, micro_batches) -> None:
    """DualPipe needs an even pp >= 2 and an even number of micro-batches >= 2 * pp (half enter at each end)."""
    _check_pp(pp)
    _check_m(micro_batches)
    if pp % 2 or pp < 2:
        raise ValueError(f"pp={pp!r}: DualPipe needs an even pipeline size >= 2 (rank r holds stages r and pp-1-r)")
    if micro_batches % 2 or micro_batches < 2 * pp:
        raise ValueError(f"micro_batches={micro_batches!r}: DualPipe needs an even number of micro-batches >= 2*pp "
                         f"= {2 * pp} (half are fed from each end)")


def dualpipe_stages(pp: int, rank: int) -> tuple:
    """The two stages rank `rank` holds: ((direction 0, stage), (direction 1, stage)) = ((0, rank), (1, pp-1-rank))."""
    return (0, rank), (1, pp - 1 - rank)


def dualpipe(pp: int, micro_batches: int) -> Schedule:
    """DualPipe (DeepSeek-V3): two copies of the pipeline run in opposite directions on the same pp ranks.

    Direction 0 feeds micro-batches at rank 0 (stage s on rank s), direction 1 at rank pp-1 (stage s on rank
    pp-1-s); `micro_batches` in all, half per direction. Each rank runs the 8-step order of DeepSeek's reference
    implementation: warm-up forwards, zero-bubble backward/weight passes at the edges, and a steady state of
    overlapped forward-and-backward pairs (F&B) from the two directions.
    """
    check_dualpipe_args(pp, micro_batches)
    half_pp, half_m = pp // 2, micro_batches // 2
    ops = []
    for r in range(pp):
        h = min(r, pp - 1 - r)  # position of the rank's early stage in its own direction
        early, late = ((0, r), (1, pp - 1 - r)) if r < half_pp else ((1, pp - 1 - r), (0, r))
        ops.append(_eight_steps((early, late), h, half_pp, half_m, middle=h == half_pp - 1))
    placement = {}
    for r in range(pp):
        for key in dualpipe_stages(pp, r):
            placement[key] = r
    return Schedule("dualpipe", pp, pp, half_m, 2, placement, ops)


def dualpipev(pp: int, micro_batches: int) -> Schedule:
    """DualPipeV ("cut-in-half" DualPipe): one direction, the model cut into 2*pp stages laid out as a V.

    Rank r holds stage r (on the way down) and stage 2*pp-1-r (on the way back up); all micro-batches enter at rank 0
    and leave there. Each stage is half of a 1F1B stage (`stage_fraction` 0.5), so give it half the F, B, W times to
    compare with the other schedules on the same model. Same 8-step order as DualPipe, with pp in place of pp/2.
    """
    _check_pp(pp)
    _check_m(micro_batches)
    if micro_batches < 2 * pp:
        raise ValueError(f"micro_batches={micro_batches!r}: DualPipeV needs at least 2*pp = {2 * pp} micro-batches")
    ops = [_eight_steps(((0, r), (0, 2 * pp - 1 - r)), r, pp, micro_batches, middle=r == pp - 1) for r in range(pp)]
    placement = {(0, s): (s if s < pp else 2 * pp - 1 - s) for s in range(2 * pp)}
    return Schedule("dualpipev", pp, 2 * pp, micro_batches, 1, placement, ops, stage_fraction=0.5)


def _eight_steps(chunks, h, n, m, middle):
    """One rank's order in DeepSeek's DualPipe / DualPipeV: `chunks` = (early stage, late stage) as (direction,
    stage); h = position of the early stage; n = ranks in a half pipeline (pp/2 for DualPipe, pp for DualPipeV);
    m = micro-batches through each chunk. Items: ("F"|"B"|"Bi"|"W", direction, stage, micro_batch)."""
    nf, nb = [0, 0], [0, 0]
    order, wq = [], []

    def f(ph):
        d, s = chunks[ph]
        nf[ph] += 1
        return ("F", d, s, nf[ph] - 1)

    def b(ph, zb=False):
        d, s = chunks[ph]
        nb[ph] += 1
        if zb:
            wq.append(("W", d, s, nb[ph] - 1))
        return ("Bi" if zb else "B", d, s, nb[ph] - 1)

    def w():
        return (wq.pop(0),)

    for _ in range((n - h - 1) * 2):                            # 1: nF0
        order.append((f(0),))
    for _ in range(h + 1):                                      # 2: nF0F1
        order.append((f(0),))
        order.append((f(1),))
    for _ in range(n - h - 1):                                  # 3: nB1W1F1 (zero bubble)
        order.append((b(1, zb=True),))
        order.append(w())
        order.append((f(1),))
    for i in range(m - 2 * n + h + 1):                          # 4: nF0B1F1B0 (main, overlapped)
        if i == 0 and middle:  # the turning-point ranks do not overlap their first pair
            order.append((f(0),))
            order.append((b(1),))
        else:
            order.append((f(0), b(1)))
        order.append((f(1), b(0)))
    for _ in range(n - h - 1):                                  # 5: nB1F1B0
        order.append((b(1),))
        order.append((f(1), b(0)))
    zb = False                                                  # 6: nB1B0 (second half zero bubble)
    for i in range(h + 1):
        if i == (h + 1) // 2 and h % 2 == 1:
            zb = True
        order.append((b(1, zb),))
        if i == (h + 1) // 2 and h % 2 == 0:
            zb = True
        order.append((b(0, zb),))
    for _ in range(n - h - 1):                                  # 7: nWB0 (zero bubble)
        order.append(w())
        order.append((b(0, zb=True),))
    while wq:                                                   # 8: nW
        order.append(w())
    assert nf == [m, m] and nb == [m, m], (h, nf, nb)
    return order


def build(name: str, pp: int, micro_batches: int, virtual_stages: int = 2) -> Schedule:
    """A schedule by name: one of ALL_SCHEDULES or "interleaved" (Megatron's interleaved 1F1B with
    `virtual_stages` chunks per rank). For DualPipe, `micro_batches` counts both directions together."""
    makers = {"gpipe": gpipe, "1f1b": one_f_one_b, "zb1p": zb1p, "dualpipe": dualpipe, "dualpipev": dualpipev}
    if name == INTERLEAVED:
        return interleaved_1f1b(pp, micro_batches, virtual_stages)
    if name not in makers:
        raise ValueError(f"schedule={name!r} is not a schedule; allowed: {', '.join(ALL_SCHEDULES + (INTERLEAVED,))}")
    return makers[name](pp, micro_batches)


# ----------------------------------------------------------------------------------------------- simulation
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
    stages, comm, placement = schedule.stages, dur.comm, schedule.placement
    n_dev, m = len(schedule.ops), schedule.micro_batches
    op_time = {k: dur.of(k) for k in ("F", "B", "Bi", "W", "FB")}

    # Compile every op to (duration, keys it needs, keys it produces, kind, forwards, backwards); a key is an int
    # naming (class, direction, stage, micro_batch), class 0 = forward done, 1 = input gradient done, 2 = weights done.
    C = 2 * stages * m
    dev_of = {d * stages + st: dev for (d, st), dev in placement.items()}
    plans = []
    for dev, ops in enumerate(schedule.ops):
        plan = []
        for op in ops:
            needs, makes = [], []   # needs: (key, transfer delay); makes: keys
            nf = nb = 0
            for kind, d, st, j in op:
                row = d * stages + st
                base = row * m + j
                if kind == "F":
                    if st > 0:
                        needs.append((base - m, comm if dev_of[row - 1] != dev else 0.0))
                    makes.append(base)
                    nf += 1
                elif kind == "W":
                    needs.append((C + base, 0.0))
                    makes.append(2 * C + base)
                else:
                    needs.append((base, 0.0))
                    if st < stages - 1:
                        needs.append((C + base + m, comm if dev_of[row + 1] != dev else 0.0))
                    makes.append(C + base)
                    if kind == "B":
                        makes.append(2 * C + base)
                    nb += 1
            kind = "FB" if len(op) == 2 else op[0][0]
            plan.append((op_time[kind], needs, makes, kind, nf, nb))
        plans.append(plan)

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


def run(name: str, pp: int, micro_batches: int, durations: Durations | None = None,
        virtual_stages: int = 2) -> Result:
    """build + simulate in one call."""
    return simulate(build(name, pp, micro_batches, virtual_stages), durations)


def fb_pairs(result_or_schedule) -> list:
    """Per device: how many of its operations are overlapped F&B pairs (DualPipe's steady state)."""
    sched = getattr(result_or_schedule, "schedule", result_or_schedule)
    return [sum(1 for op in ops if len(op) == 2) for ops in sched.ops]


# ----------------------------------------------------------------------------------------------- formulas
def bubble_formula(name: str, pp: int, durations: Durations | None = None, virtual_stages: int = 2) -> float:
    """Bubble per device by formula (DeepSeek DualPipe README; GPipe as 1F1B), in the unit of the durations.
    Interleaved 1F1B (Megatron, Narayanan et al. 2021): (pp-1)(F+B)/v with F, B the times of a full (1/pp) stage."""
    d = durations or Durations()
    _check_pp(pp)
    if name == INTERLEAVED:
        return (pp - 1) * (d.F + d.B) / virtual_stages
    if name in ("gpipe", "1f1b"):
        return (pp - 1) * (d.F + d.B)
    if name == "zb1p":
        return (pp - 1) * (d.F + d.B - 2 * d.W)
    if name == "dualpipe":
        if pp % 2:
            raise ValueError(f"pp={pp!r}: DualPipe needs an even pipeline size")
        return (pp // 2 - 1) * (d.fb + d.B - 3 * d.W)
    raise ValueError(f"schedule={name!r} is not a schedule; allowed: {', '.join(SCHEDULES)}")


def memory_formula(name: str, pp: int, micro_batches: int | None = None, virtual_stages: int = 2) -> dict:
    """Parameter (x one stage) and peak activation (x one micro-batch through one stage) memory per device.

    README table: 1F1B and ZB1P 1x / PP, DualPipe 2x / PP+1; GPipe holds every micro-batch: 1x / micro_batches.
    Interleaved 1F1B: 1x / PP + (PP-1)/v (Megatron: 1 + (PP-1)/(PP v) times 1F1B's; at most micro_batches).
    """
    _check_pp(pp)
    if name == INTERLEAVED:
        v = virtual_stages
        if micro_batches is None:
            raise ValueError("interleaved 1F1B's activation memory depends on micro_batches (when m = pp); pass it")
        return {"parameters": 1, "activations": min(2 * (pp - 1) + (v - 1) * pp + 1, micro_batches * v) / v}
    if name == "gpipe":
        if micro_batches is None:
            raise ValueError("GPipe's activation memory depends on micro_batches; pass it")
        return {"parameters": 1, "activations": micro_batches}
    if name in ("1f1b", "zb1p"):
        return {"parameters": 1, "activations": pp}
    if name == "dualpipe":
        return {"parameters": 2, "activations": pp + 1}
    raise ValueError(f"schedule={name!r} is not a schedule; allowed: {', '.join(SCHEDULES)}")


def readme_table(pp_values=(4, 8, 16), micro_batch_values=(20, 64), durations: Durations | None = None,
                 virtual_stages: int | None = None):
    """Simulated vs formula bubble and memory for 1F1B, ZB1P, DualPipe (and GPipe) as a pandas DataFrame; with
    `virtual_stages`, Megatron's interleaved 1F1B too (simulated with 1/v of the chunk times, on the same model)."""
    import pandas as pd
    d = durations or Durations(1, 2, 1, 2.5)
    v = virtual_stages
    names = SCHEDULES + ((INTERLEAVED,) if v else ())
    rows = []
    for pp in pp_values:
        for m in micro_batch_values:
            for name in names:
                if name == "dualpipe" and (pp % 2 or m < 2 * pp or m % 2):
                    continue
                if name == INTERLEAVED:
                    if m % pp:
                        continue
                    r = run(name, pp, m, Durations(d.F / v, d.B / v, d.W / v, d.fb / v, d.comm), v)
                    mem = memory_formula(name, pp, m, v)
                    rows.append({"PP": pp, "micro-batches": m, "schedule": f"interleaved v={v}",
                                 "bubble sim (mean)": r.bubble, "bubble sim (max)": r.bubble_max,
                                 "bubble formula": bubble_formula(name, pp, d, v),
                                 "params sim": max(r.parameters), "params formula": mem["parameters"],
                                 "activations sim": max(r.peak_activations),
                                 "activations formula": mem["activations"], "makespan": r.makespan})
                    continue
                r = run(name, pp, m, d)
                mem = memory_formula(name, pp, m)
                rows.append({"PP": pp, "micro-batches": m, "schedule": name,
                             "bubble sim (mean)": r.bubble, "bubble sim (max)": r.bubble_max,
                             "bubble formula": bubble_formula(name, pp, d),
                             "params sim": max(r.parameters), "params formula": mem["parameters"],
                             "activations sim": max(r.peak_activations), "activations formula": mem["activations"],
                             "makespan": r.makespan})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------------- plotting
def plot_timeline(result: Result, ax=None, title: str | None = None, label_micro_batches: bool | None = None):
    """A Gantt chart: one row per device, one bar per op, coloured by kind (FB purple, W orange, ...)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    from common.core import plots
    plots.use_house_style()
    sched = result.schedule
    if ax is None:
        _, ax = plt.subplots(figsize=(min(14, 4 + result.makespan / 4), 0.45 * sched.pp + 1.4))
    n_ops = sum(len(sp) for sp in result.spans)
    if label_micro_batches is None:
        label_micro_batches = n_ops <= 200 and sched.pp <= 16
    from matplotlib.collections import PolyCollection
    groups = {}  # (kind, reverse) -> list of rectangles
    for dev, spans in enumerate(result.spans):
        for start, end, kind, op in spans:
            reverse = op[0][1] == 1 and kind != "FB"
            groups.setdefault((kind, reverse), []).append(
                [(start, dev - 0.4), (end, dev - 0.4), (end, dev + 0.4), (start, dev + 0.4)])
            if label_micro_batches and end - start >= 0.6:
                text = "/".join(str(it[3]) for it in op)
                ax.text((start + end) / 2, dev, text, ha="center", va="center", fontsize=6)
    for (kind, reverse), rects in groups.items():
        ax.add_collection(PolyCollection(rects, facecolors=KIND_COLORS[kind], alpha=0.55 if reverse else 1.0,
                                         edgecolors="black" if kind == "FB" else "white", linewidths=0.6,
                                         hatch="//" if reverse else None))
    ax.set_ylim(sched.pp - 0.5, -0.5)
    ax.set_yticks(range(sched.pp))
    ax.set_yticklabels([f"dev {d}" for d in range(sched.pp)], fontsize=7)
    ax.set_xlim(0, result.makespan)
    ax.set_xlabel("time")
    ax.grid(False)
    kinds = sorted({k for sp in result.spans for _, _, k, _ in sp}, key=list(KIND_COLORS).index)
    ax.legend(handles=[Patch(color=KIND_COLORS[k], label=KIND_NAMES[k]) for k in kinds], loc="upper center",
              bbox_to_anchor=(0.5, -0.25), ncol=len(kinds), fontsize=8)
    ax.set_title(title or f"{sched.name}: PP={sched.pp}, makespan {result.makespan:g}, bubble/device "
                          f"{result.bubble:g} (max {result.bubble_max:g})")
    return ax


# ----------------------------------------------------------------------------------------------- formula vs schedule
def dualpipe_gap_rule(F: float, B: float, W: float) -> int:
    """Where DualPipe's simulated worst-rank bubble lands against its README formula, as the sweep of
    `dualpipe_formula_sweep` shows it: +1 above when the input-gradient backward is shorter than the forward
    (B - W < F) or the weight passes are long (3W >= 2B - F, strictly when B - W = F); 0 on the formula when B - W = F; -1 below otherwise.
    (A rule read off the simulator, not a theorem: `dualpipe_formula_sweep` counts the points it gets wrong.)"""
    bi, eps = B - W, 1e-9 * max(F, B)
    if abs(bi - F) <= eps:
        return 1 if 3 * W > 2 * B - F + eps else 0
    return 1 if bi < F or 3 * W >= 2 * B - F - eps else -1


def dualpipe_formula_sweep(pp_values=(4, 8, 16), B_values=None, W_values=None, F: float = 1.0,
                           micro_batches_per_pp: int = 4):
    """Simulated minus formula bubble (worst rank) of DualPipe over a grid of B and W (F fixed, F&B = F + B: the gap
    does not depend on F&B), with the sign `dualpipe_gap_rule` predicts; a pandas DataFrame."""
    import pandas as pd
    B_values = B_values if B_values is not None else [F * x / 4 for x in range(2, 17)]
    W_values = W_values if W_values is not None else [F * x / 4 for x in range(1, 16)]
    rows = []
    for pp in pp_values:
        for B in B_values:
            for W in W_values:
                if not W < B:
                    continue
                d = Durations(F, B, W)
                gap = run("dualpipe", pp, micro_batches_per_pp * pp, d).bubble_max - bubble_formula("dualpipe", pp, d)
                gap = 0.0 if abs(gap) < 1e-9 else gap
                rows.append({"PP": pp, "F": F, "B": B, "W": W, "sim - formula": gap,
                             "sign": (gap > 0) - (gap < 0), "rule": dualpipe_gap_rule(F, B, W)})
    return pd.DataFrame(rows)
