"""The lab's model under torch's own engine, `torch.distributed.pipelining`, on the same ranks as ours.

Writing a pipeline runtime is right for learning what one does; past the workbook a user would run torch's:
`PipelineStage` (a module, its stage index, the number of stages) and a schedule -- `Schedule1F1B` for one stage per
rank, `ScheduleDualPipeV` for DeepSeek's V of two stages per rank (rank r holds stages r and 2 pp - 1 - r, as ours).
`engines_worker` runs, for each schedule, one step of ours (`executor.run_step`, no weight update) and one of
torch's on the same weights and batch, and compares the loss and every gradient with each other and with one
process running the whole batch through the whole model; it also times torch's step. The loss is the workbook's:
the sum of squared errors over the batch / rows, so micro-batch losses add up (torch's `scale_grads` is off).
"""
from __future__ import annotations

import statistics
import time

from common.parallel import pipeline
from common.parallel.pipeline_run import plan
from common.parallel.pipeline_run.executor import run_step
from common.parallel.pipeline_run.model import loss_of, make_batch, make_model, reference_gradients, stage_forward
from common.parallel.pipeline_run.p2p import PointToPoint
from common.parallel.pipeline_run.stage import Stage

ENGINES = {"1f1b": "Schedule1F1B", "dualpipev": "ScheduleDualPipeV"}


def blocks_module(blocks: list):
    """The residual MLP blocks x <- x + W2 tanh(W1 x + b1) + b2 as a torch.nn.Module with these weights (copied)."""
    import torch

    class Blocks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weights = torch.nn.ParameterList([torch.nn.Parameter(t.clone()) for blk in blocks for t in blk])

        def forward(self, x):
            w = list(self.weights)
            for i in range(0, len(w), 4):
                x = x + torch.nn.functional.linear(torch.tanh(torch.nn.functional.linear(x, w[i], w[i + 1])),
                                                   w[i + 2], w[i + 3])
            return x
    return Blocks()


def torch_step(rank: int, world_size: int, name: str, model: list, x, target, micro_batches: int, device):
    """One step of torch's schedule `name` ("1f1b" or "dualpipev"): ({block index: its 4 gradients} this rank
    holds, this rank's share of the loss, a function that runs one more step)."""
    import torch
    from torch.distributed import pipelining as P
    n = world_size if name == "1f1b" else 2 * world_size
    ids = [rank] if name == "1f1b" else [rank, 2 * world_size - 1 - rank]
    per = len(model) // n
    mods = {s: blocks_module(model[s * per:(s + 1) * per]).to(device) for s in ids}
    stages = [P.PipelineStage(mods[s], s, n, device) for s in ids]
    rows = len(x)

    def loss_fn(y, t):
        return loss_of(y, t, rows)
    kind = getattr(P, ENGINES[name])
    sched = kind(stages[0] if name == "1f1b" else stages, micro_batches, loss_fn=loss_fn, scale_grads=False)
    first, last = 0 in ids, n - 1 in ids

    def step():
        for m in mods.values():
            m.zero_grad(set_to_none=True)
        losses = [] if last else None
        args = (x.to(device),) if first else ()
        sched.step(*args, target=target.to(device) if last else None, losses=losses)
        return float(sum(losses)) if last else 0.0
    loss = step()
    grads = {s * per + i: [t.grad.detach().cpu() for t in list(mods[s].weights)[4 * i:4 * i + 4]]
             for s in ids for i in range(per)}
    return grads, loss, step


def our_step(rank: int, name: str, world_size: int, model: list, x, target, micro_batches: int, device) -> tuple:
    """One step of our executor on the same model and batch: ({block index: gradients}, this rank's loss)."""
    sched = pipeline.build(name, world_size, micro_batches)
    plans = plan.make(sched)
    stage = Stage(sched, rank, model, x, target, device)
    run_step(plans[rank], sched, stage, PointToPoint(plans[rank], (stage.rows, x.shape[1]), device), lr=0.0)
    grads = {b: [t.grad.detach().cpu() for t in blk] for d, _, b, blk in stage.copies() if d == 0}
    return grads, float(sum(stage.losses))


def engines_worker(rank: int, world_size: int, schedules=("1f1b", "dualpipev"), micro_batches: int = 8,
                   batch: int = 64, blocks: int = 8, hidden: int = 64, repeats: int = 3, seed: int = 0) -> dict:
    """Per schedule: the worst gradient difference over the ranks, torch's vs one process, torch's vs ours, ours vs
    one process; the loss of each (summed over ranks) and of one process; torch's median step time."""
    import torch
    import torch.distributed as dist

    from common.parallel.ranks import worker_device
    device = worker_device()
    model = make_model(blocks, hidden, seed)
    x, target = make_batch(batch, hidden, seed + 1)
    ref = reference_gradients(blocks, hidden, batch, seed)
    params = [[t.clone().requires_grad_() for t in blk] for blk in model]
    ref_loss = float(loss_of(stage_forward(params, x), target, batch))
    out = {}
    for name in schedules:
        theirs, t_loss, step = torch_step(rank, world_size, name, model, x, target, micro_batches, device)
        ours, o_loss = our_step(rank, name, world_size, model, x, target, micro_batches, device)

        def worst(a, b):
            return max((float((g - h).abs().max()) for k in a for g, h in zip(a[k], b[k])), default=0.0)
        errs = [worst(theirs, {k: ref[k] for k in theirs}), worst(theirs, ours), worst(ours, {k: ref[k] for k in ours})]
        times = []
        for _ in range(repeats):
            dist.barrier()
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        vals = torch.tensor(errs + [statistics.median(times)], dtype=torch.float64)
        dist.all_reduce(vals, op=dist.ReduceOp.MAX)
        losses = torch.tensor([t_loss, o_loss], dtype=torch.float64)
        dist.all_reduce(losses)
        covered = torch.zeros(blocks, dtype=torch.float64)
        covered[list(theirs)] = 1
        dist.all_reduce(covered)
        out[name] = {"torch_vs_one": float(vals[0]), "torch_vs_ours": float(vals[1]), "ours_vs_one": float(vals[2]),
                     "torch_step_s": float(vals[3]), "torch_loss": float(losses[0]), "our_loss": float(losses[1]),
                     "one_loss": ref_loss, "blocks_compared": int((covered > 0).sum())}
    return out


def engines_task(schedules=("1f1b", "dualpipev"), world_size: int = 2, micro_batches: int = 8, batch: int = 64,
                 blocks: int = 8, hidden: int = 64, repeats: int = 3, backend: str | None = "gloo") -> tuple:
    """(engines_worker, args), everything validated now -- before any process starts."""
    from common.core.validate import whole
    from common.parallel.pipeline_run.executor import check_args
    if isinstance(schedules, str):
        schedules = (schedules,)
    for name in schedules:
        if name not in ENGINES:
            raise ValueError(f"schedules: {name!r} has no torch.distributed.pipelining schedule here; allowed: "
                             f"{', '.join(ENGINES)}")
        check_args(name, world_size, micro_batches, batch, blocks, backend)
    whole("hidden", hidden), whole("repeats", repeats)
    return engines_worker, (tuple(schedules), micro_batches, batch, blocks, hidden, repeats)


def table(per_rank: list):
    """The side-by-side table (pandas): per schedule, loss and gradient differences of ours, torch's, one process."""
    import pandas as pd
    rows = []
    for name, r in per_rank[0].items():
        rows.append({"schedule": name, "torch class": ENGINES[name], "loss (one process)": r["one_loss"],
                     "loss (ours)": r["our_loss"], "loss (torch)": r["torch_loss"],
                     "grad err ours vs one": r["ours_vs_one"], "grad err torch vs one": r["torch_vs_one"],
                     "grad err torch vs ours": r["torch_vs_ours"]})
    return pd.DataFrame(rows).set_index("schedule")


def grad_max_err(per_rank: list) -> float:
    """The ledger's pp.torch.grad_max_err: torch's gradients against one process's and ours, worst of all."""
    return max(max(r["torch_vs_one"], r["torch_vs_ours"]) for r in per_rank[0].values())


RANK_MODULES = ("torch.distributed.pipelining", "common.parallel.pipeline_run")  # seconds of imports (dynamo)


def run_engines(schedules=("1f1b", "dualpipev"), world_size: int = 2, micro_batches: int = 8, batch: int = 64,
                blocks: int = 8, hidden: int = 64, repeats: int = 3, backend: str | None = "gloo",
                timeout: float = 300) -> list:
    """`engines_worker` on `world_size` ranks (validated first); the ranks' records (`table`, `grad_max_err`)."""
    from common.parallel.distributed import run_workers, start_rank_server
    worker, args = engines_task(schedules, world_size, micro_batches, batch, blocks, hidden, repeats, backend)
    start_rank_server(*RANK_MODULES)  # a server already running keeps its imports: the ranks import then
    return run_workers(worker, world_size, args=args, backend=backend, timeout=timeout)
