"""One rank of a pipeline step: each op of the rank's list from `common.parallel.pipeline.build`, in order.

An op (one work item, or DualPipe's F&B pair) first receives what its items need -- a forward the previous stage's
output, a backward the next stage's input gradient -- in one batch with the sends the previous op produced
(`p2p.PointToPoint`); then its span starts, its items run (`stage.Stage`), and its outputs are queued for the next
batch. So a span holds the op's own work and never a wait for a peer: receive waits are idle time.
"""
from __future__ import annotations

import time

from common.core.validate import whole
from common.parallel import pipeline
from common.parallel.pipeline_run.p2p import PointToPoint
from common.parallel.pipeline_run.stage import Stage

RUNNABLE = ("gpipe", "1f1b", "zb1p", "dualpipe", "dualpipev")


def check_args(schedule: str, world_size: int, micro_batches: int, batch: int, blocks: int,
               backend: str | None = "gloo") -> pipeline.Schedule:
    """Validate everything before a process starts (the backend too: NCCL needs a GPU per rank); return the
    schedule. ValueError names the parameter, its value and what is allowed."""
    from common.parallel.ranks import check_world_size
    if schedule not in RUNNABLE:
        raise ValueError(f"schedule={schedule!r} cannot run on ranks; allowed: {', '.join(RUNNABLE)}")
    check_world_size(world_size, backend)
    if world_size < 2:
        raise ValueError(f"world_size={world_size}: a pipeline needs at least 2 ranks; allowed: 2 .. the machine's "
                         f"limit")
    if schedule == "dualpipe" and world_size % 2:
        raise ValueError(f"world_size={world_size}: schedule 'dualpipe' needs an even number of ranks (rank r holds "
                         f"stages r and world_size-1-r); allowed: 2, 4, ...")
    for name, v in (("micro_batches", micro_batches), ("batch", batch), ("blocks", blocks)):
        whole(name, v)
    if batch % micro_batches:
        raise ValueError(f"micro_batches={micro_batches}: the batch of {batch} rows does not split into "
                         f"{micro_batches} equal micro-batches; allowed: a divisor of {batch}")
    sched = pipeline.build(schedule, world_size, micro_batches)  # DualPipe: even micro_batches >= 2 * world_size
    if blocks % sched.stages:
        raise ValueError(f"blocks={blocks}: {schedule} on {world_size} ranks cuts the model into {sched.stages} "
                         f"stages; allowed: a multiple of {sched.stages}")
    return sched


def inputs_of(schedule, item):
    """(source rank, message key) that work item needs from another stage, or None."""
    kind, d, s, j = item
    if kind == "F" and s > 0:
        return schedule.placement[(d, s - 1)], ("act", d, s - 1, j)
    if kind in ("B", "Bi") and s < schedule.stages - 1:
        return schedule.placement[(d, s + 1)], ("grad", d, s + 1, j)
    return None


def output_of(schedule, item):
    """(destination rank, message key) of what the work item sends, or None."""
    kind, d, s, j = item
    if kind == "F" and s < schedule.stages - 1:
        return schedule.placement[(d, s + 1)], ("act", d, s, j)
    if kind in ("B", "Bi") and s > 0:
        return schedule.placement[(d, s - 1)], ("grad", d, s, j)
    return None


def run_op(op, schedule, stage: Stage, links: PointToPoint, clock=time.perf_counter) -> tuple:
    """Receive the op's inputs, then run its items: (start, end) of the work alone."""
    from common.parallel.ranks import synchronize
    needs = [n for n in (inputs_of(schedule, item) for item in op) if n is not None]
    received = dict(zip([key for _, key in needs], links.receive(needs)))
    synchronize()
    t0 = clock()
    for item in op:
        need, out = inputs_of(schedule, item), output_of(schedule, item)
        sent = stage.run(item, received.get(need[1]) if need else None)
        if out is not None:
            links.send(out[0], out[1], sent)
    synchronize()
    return t0, clock()


def run_step(schedule, stage: Stage, links: PointToPoint, clock=time.perf_counter) -> tuple:
    """One training step on this rank: ([(start, end, kind)] per op from the step's start, its end), the end
    after every send has gone."""
    stage.new_step()
    start = clock()
    spans = []
    for op in schedule.ops[stage.rank]:
        t0, t1 = run_op(op, schedule, stage, links, clock)
        spans.append((t0 - start, t1 - start, schedule.kind_of(op)))
    links.flush()
    if stage.held or stage.store.pending:
        raise RuntimeError(f"rank {stage.rank}: work left over after the schedule: {sorted(stage.held)}")
    return spans, clock() - start
