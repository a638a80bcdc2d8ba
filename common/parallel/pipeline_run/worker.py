"""The executor on real ranks: `pipeline_worker` inside a process group (of `run_workers`, or torchrun) runs each
schedule `repeats` times after a warm-up step; `run_schedules` validates, launches and summarizes."""
from __future__ import annotations

import statistics
import time

from common.core.validate import whole
from common.parallel import pipeline
from common.parallel.pipeline_run import plan
from common.parallel.pipeline_run.executor import check_args, run_step
from common.parallel.pipeline_run.model import make_batch, make_model, reference_gradients
from common.parallel.pipeline_run.p2p import PointToPoint
from common.parallel.pipeline_run.stage import Stage
from common.parallel.pipeline_run.summary import summarize


def one_way_time(rank: int, rows: int, hidden: int, repeats: int = 30) -> float:
    """Half the median round trip of one activation between ranks 0 and 1 (the others wait)."""
    import torch
    import torch.distributed as dist

    from common.parallel.ranks import synchronize, worker_device
    buf = torch.zeros(rows, hidden, device=worker_device())
    times = []
    dist.barrier()
    for _ in range(repeats):
        t0 = time.perf_counter()
        if rank in (0, 1):
            for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, buf, 1 - rank)] if rank == 0 else
                                            [dist.P2POp(dist.irecv, buf, 0)]):
                w.wait()
            for w in dist.batch_isend_irecv([dist.P2POp(dist.irecv, buf, 1)] if rank == 0 else
                                            [dist.P2POp(dist.isend, buf, 0)]):
                w.wait()
            synchronize()
        times.append(time.perf_counter() - t0)
    t = torch.tensor([statistics.median(times) / 2], dtype=torch.float64, device=buf.device)
    dist.broadcast(t, 0)
    return float(t)


def run_schedule(rank: int, world_size: int, name: str, micro_batches: int, batch: int, blocks: int, hidden: int,
                 repeats: int, seed: int = 0, lr: float = 0.01, schedule=None) -> dict:
    """This rank's record of one schedule (or of `schedule`, a `pipeline.Schedule` built elsewhere): the median
    step's spans, every step's makespan (the slowest rank's), busy and receive-wait time, the peak live activation
    bytes, the bytes of one micro-batch through one stage, each op kind's median time, and the first step's
    gradient and weight errors (after the SGD step) against one process, worst over every copy this rank holds."""
    import torch
    import torch.distributed as dist

    from common.parallel.ranks import worker_device
    sched = schedule or pipeline.build(name, world_size, micro_batches)
    plans = plan.make(sched)  # every rank makes the same plans: the receives it posts are what its peers send
    device = worker_device()
    model = make_model(blocks, hidden, seed)
    x_all, t_all = make_batch(batch, hidden, seed + 1)
    stage = Stage(sched, rank, model, x_all, t_all, device)
    steps = []
    for i in range(repeats + 1):  # the first is a warm-up, and the one checked against one process
        links = PointToPoint(plans[rank], (stage.rows, hidden), device)
        dist.barrier()
        spans, end = run_step(plans[rank], sched, stage, links, lr)
        steps.append((spans, end, stage.live.peak, links.wait_s))
        if i == 0:
            errors = stage.errors(model, reference_gradients(blocks, hidden, batch, seed), lr)
    ends = torch.tensor([s[1] for s in steps] + list(errors), dtype=torch.float64, device=device)
    dist.all_reduce(ends, op=dist.ReduceOp.MAX)  # a step ends when its last rank ends; the worst rank's errors
    timed = [(spans, float(ends[i]), peak, wait) for i, (spans, _, peak, wait) in enumerate(steps)][1:]
    order = sorted(range(len(timed)), key=lambda i: timed[i][1])
    spans, makespan, peak, wait = timed[order[len(order) // 2]]  # the median step (the same one on every rank)
    all_spans = [sp for st in timed for sp in st[0]]  # op times: medians over every timed step
    return {"rank": rank, "spans": spans, "makespan": makespan, "step_times": sorted(t[1] for t in timed),
            "busy": sum(e - s for s, e, _ in spans), "recv_wait": wait, "peak_bytes": peak,
            "stage_bytes": stage.stage_bytes(), "grad_err": float(ends[-2]), "weight_err": float(ends[-1]),
            "op_median": {k: statistics.median([e - s for s, e, kk in all_spans if kk == k])
                          for k in {kk for _, _, kk in all_spans}}}


def pipeline_worker(rank: int, world_size: int, schedules, micro_batches: int, batch: int, blocks: int,
                    hidden: int, repeats: int = 3, seed: int = 0) -> dict:
    """Each of `schedules` (names, or `pipeline.Schedule`s built elsewhere -- a learner's) on this rank, in one
    process group, and the one-way time of one message."""
    import torch
    torch.set_num_threads(1)
    out = {"comm_s": one_way_time(rank, batch // micro_batches, hidden)}
    for item in schedules:
        name, sched = (item, None) if isinstance(item, str) else (item.name, item)
        out[name] = run_schedule(rank, world_size, name, micro_batches, batch, blocks, hidden, repeats, seed,
                                 schedule=sched)
        out[name]["schedule"] = sched
    return out


def pipeline_task(schedules=("gpipe", "1f1b", "dualpipe"), world_size: int = 2, micro_batches: int = 8,
                  batch: int = 128, blocks: int = 8, hidden: int = 256, repeats: int = 3,
                  backend: str | None = "gloo") -> tuple:
    """(pipeline_worker, args), everything validated now -- before any process starts. A schedule is a name of
    `executor.RUNNABLE`, or a `pipeline.Schedule` (checked as the simulator checks one, and planned)."""
    if isinstance(schedules, (str, pipeline.Schedule)):
        schedules = (schedules,)
    whole("repeats", repeats)
    whole("hidden", hidden)
    for item in schedules:
        if isinstance(item, pipeline.Schedule):
            check_args("1f1b", world_size, micro_batches, batch, blocks, backend)  # the machine and the batch
            check_schedule(item, world_size, micro_batches, blocks)
        else:
            check_args(item, world_size, micro_batches, batch, blocks, backend)
    return pipeline_worker, (tuple(schedules), micro_batches, batch, blocks, hidden, repeats)


def check_schedule(sched, world_size: int, micro_batches: int, blocks: int) -> None:
    """A Schedule built elsewhere: complete (`pipeline.validate`), runnable without a deadlock (`plan.make`), and
    sized as the run: `world_size` ranks, `micro_batches` in all, a model that cuts into its stages."""
    if len(sched.ops) != world_size or sched.micro_batches * sched.directions != micro_batches:
        raise ValueError(f"schedule {sched.name!r} has {len(sched.ops)} ranks and "
                         f"{sched.micro_batches * sched.directions} micro-batches; the run has world_size="
                         f"{world_size} and micro_batches={micro_batches}")
    if blocks % sched.stages:
        raise ValueError(f"blocks={blocks}: schedule {sched.name!r} has {sched.stages} stages; allowed: a multiple "
                         f"of {sched.stages}")
    pipeline.validate(sched)
    plan.make(sched)


def summarize_all(per_rank: list, world_size: int, micro_batches: int) -> dict:
    """{schedule: summary} from the ranks' `pipeline_worker` records."""
    comm = per_rank[0]["comm_s"]
    names = [k for k in per_rank[0] if k != "comm_s"]
    return {n: summarize(per_rank[0][n].get("schedule") or pipeline.build(n, world_size, micro_batches),
                         [r[n] for r in per_rank], comm) for n in names}


def run_schedules(schedules=("gpipe", "1f1b", "dualpipe"), world_size: int = 2, micro_batches: int = 8,
                  batch: int = 128, blocks: int = 8, hidden: int = 256, repeats: int = 3,
                  backend: str | None = "gloo", timeout: float = 300) -> dict:
    """Execute each schedule on `world_size` ranks (one process group for all); {schedule: summary}
    (`summary.summarize`). Everything is validated before any process starts; the tensors live on each rank's
    `worker_device()` (its GPU under NCCL)."""
    from common.parallel.distributed import run_workers
    worker, args = pipeline_task(schedules, world_size, micro_batches, batch, blocks, hidden, repeats, backend)
    per_rank = run_workers(worker, world_size, args=args, backend=backend, timeout=timeout)
    return summarize_all(per_rank, world_size, micro_batches)
