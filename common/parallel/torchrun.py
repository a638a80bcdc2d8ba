"""Past one machine: the labs' workers under torch's own launcher, `torchrun` (`torch.distributed.run`, elastic).

Four entry points run the same worker functions the notebooks run with `common.parallel.distributed.run_workers`, and
write the same ledger names on rank 0 (`common.core.results`, to $WORKBOOK_RESULTS or build/interactive/):

    torchrun --nnodes N --nproc-per-node G -m common.parallel.collectives      # lab 07: sweep, alpha-beta fit
    torchrun --nnodes N --nproc-per-node G -m common.parallel.expert_parallel  # lab 07: EP dispatch and combine
    torchrun --nnodes N --nproc-per-node G -m common.parallel.pipeline_run     # lab 08: schedules on real ranks
    torchrun --nnodes N --nproc-per-node G -m common.parallel.ddp_overlap      # lab 08: DDP overlap

with `--rdzv-backend c10d --rdzv-endpoint HOST:PORT` on several nodes (the same command on each, HOST one node's
address), or `--standalone` on one; each takes `--backend gloo|nccl` (default: NCCL on GPUs) and `--help`.
`command(...)` writes such a command; `world_size()` reads the job's size (before the arguments are checked);
`init_from_env` joins the group torchrun describes; `main` runs a worker on every rank, gathers the results on rank 0
and hands them to a `report` that prints and records.
"""
from __future__ import annotations

import argparse
import os
from typing import Callable, Sequence

from common.core.validate import whole
from common.parallel.ranks import BACKENDS, check_backend, context


def command(target: str, nproc_per_node: int, nnodes: int = 1, rdzv_endpoint: str = "HOST:29500",
            module: bool = True, script_args: Sequence[str] = ()) -> str:
    """The torchrun command that runs `target` (a module such as "common.parallel.collectives", or a script) with
    `nproc_per_node` processes on each of `nnodes` machines. One node: `--standalone`."""
    whole("nproc_per_node", nproc_per_node, meaning="processes per node, one per GPU")
    whole("nnodes", nnodes, meaning="machines")
    parts = ["torchrun"]
    if nnodes == 1:
        parts.append("--standalone")
    else:
        parts += [f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}",
                  "--rdzv-id=workbook"]
    parts += [f"--nproc-per-node={nproc_per_node}"] + (["-m"] if module else []) + [target] + list(script_args)
    return " ".join(parts)


def init_from_env(backend: str | None = None) -> tuple[int, int]:
    """Inside a torchrun process: join the group from RANK/WORLD_SIZE/MASTER_* and return (rank, world_size)."""
    import torch
    import torch.distributed as dist
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise RuntimeError(f"init_from_env: {', '.join(missing)} not set -- launch this with torchrun (see "
                           f"common.parallel.torchrun.command), or use run_workers on one machine")
    backend = check_backend(backend)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, init_method="env://")
    context.update(rank=dist.get_rank(), world_size=dist.get_world_size(), backend=backend)
    return dist.get_rank(), dist.get_world_size()


def world_size() -> int:
    """WORLD_SIZE of this torchrun job. From now on `check_world_size` holds this node's ranks (LOCAL_WORLD_SIZE),
    not the whole world, to the machine's limit: the other nodes bring their own GPUs."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    context["per_node"] = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return world


def parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with the option every entry point has: --backend."""
    ap = argparse.ArgumentParser(description=description + " (run under torchrun; see common.parallel.torchrun)")
    ap.add_argument("--backend", default=None, choices=BACKENDS, help="default: nccl on GPUs, else gloo")
    return ap


def main(lab: str, worker: Callable, args: Sequence, report: Callable, backend: str | None = None) -> None:
    """Run `worker(rank, world_size, *args)` on every rank; on rank 0, `report(per_rank)` (print, record). Check the
    arguments before (with `world_size()`), as the notebook's launcher does; `lab` names the ledger entries' lab."""
    import torch.distributed as dist

    from common.core.env import setup
    setup(lab, quiet=True)  # as the notebook's first cell: the ledger's lab and device, Triton's mode
    rank, world = init_from_env(backend)
    try:
        mine = worker(rank, world, *args)
        gathered = [None] * world if rank == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        if rank == 0:
            report(gathered)
    finally:
        dist.destroy_process_group()
