"""One rank of a pipeline step, as its plan (`plan.RankPlan`) says: before op k it posts batch k (the sends of op
k-1 and the receives the plan placed there) and waits where the plan waits; then the op runs (`stage.Stage`) and its
outputs are queued for the next batch. After the last op: the last batch, every send waited for, the mirrored
stages' gradients summed with the rank holding the other copy (DualPipe), and an SGD step.

Spans: a span holds an op's own work and never a wait for a peer (receive waits are idle time). On a CPU they are
read from the host's clock; on a GPU from CUDA events recorded on the rank's stream around each op, read once at the
end of the step (no synchronisation between ops), so the compute overlaps the transfers.
"""
from __future__ import annotations

import time

from common.core.validate import number, whole
from common.parallel import pipeline
from common.parallel.pipeline_run.p2p import PointToPoint
from common.parallel.pipeline_run.plan import inputs_of, output_of
from common.parallel.pipeline_run.stage import Stage

RUNNABLE = ("gpipe", "1f1b", "zb1p", "dualpipe", "dualpipev", "interleaved")


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


class HostClock:
    """Marks from the host's clock (a CPU rank: the work is done when the call returns)."""

    def mark(self):
        return time.perf_counter()

    def seconds(self, marks: list) -> list:
        return [m - marks[0] for m in marks]


class EventClock:
    """Marks as CUDA events on the current stream, read once, at the end (`seconds`)."""

    def mark(self):
        import torch
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, marks: list) -> list:
        marks[-1].synchronize()
        return [marks[0].elapsed_time(m) / 1e3 for m in marks]


def run_op(op, schedule, stage: Stage, links: PointToPoint) -> None:
    """Run the op's items with the inputs received for them; queue their outputs for the next batch."""
    inputs = []
    for item in op:
        need = inputs_of(schedule, item)
        inputs.append(links.take(need[1]) if need else None)
    for item, out in zip(op, stage.run_op(op, inputs)):
        dest = output_of(schedule, item)
        if dest is not None:
            links.put(dest[0], dest[1], out)


def run_step(plan, schedule, stage: Stage, links: PointToPoint, lr: float = 0.0, clock=None) -> tuple:
    """One training step on this rank: ([(start, end, kind)] per op from the step's start, its end), the end after
    every send has gone, the gradients are complete and the weights stepped (SGD, `lr`)."""
    number("lr", lr, strict=False, meaning="the SGD learning rate")
    clock = clock or (EventClock() if stage.device.type == "cuda" else HostClock())
    stage.new_step()
    marks = [clock.mark()]
    for k, op in enumerate(plan.ops):
        links.post(k)
        for b in plan.waits[k]:
            links.wait(b)
        marks.append(clock.mark())
        run_op(op, schedule, stage, links)
        marks.append(clock.mark())
    links.post(len(plan.ops))
    links.flush()
    if stage.held or stage.store.pending:
        raise RuntimeError(f"rank {stage.rank}: work left over after the schedule: {sorted(stage.held)}")
    if plan.mirror is not None:
        flat = stage.flat_grads()
        stage.set_flat_grads(flat + links.exchange(plan.mirror, flat))
    stage.sgd(lr)
    marks.append(clock.mark())
    t = clock.seconds(marks)
    kinds = [schedule.kind_of(op) for op in plan.ops]
    return [(t[1 + 2 * i], t[2 + 2 * i], kind) for i, kind in enumerate(kinds)], t[-1]

