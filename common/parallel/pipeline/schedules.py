"""Pipeline schedules as per-device op lists: GPipe, 1F1B, ZB1P (zero bubble, ZB-H1), Megatron's interleaved 1F1B,
DualPipe and DualPipeV, and the chunk durations (`Durations`) they are simulated with.

An operation does the work of one micro-batch on one stage -- a forward `F`, a full backward `B` (input and weight
gradients), a backward for inputs only `Bi` (B - W, zero-bubble split), a backward for weights `W` -- or an overlapped
pair `FB` (the forward of one micro-batch and the backward of another run together, DualPipe's "F&B").
"""
from __future__ import annotations

from dataclasses import dataclass

from common.core.validate import whole

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
    whole(name, pp, meaning="a pipeline size")


def _check_m(m, name="micro_batches"):
    whole(name, m, meaning="a number of micro-batches")

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
    whole("virtual_stages", v, 2, meaning="model chunks per rank; v = 1 is plain 1F1B")
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
