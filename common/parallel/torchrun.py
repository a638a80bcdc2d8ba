"""Past one machine: the labs' workers under torch's own launcher, `torchrun` (`torch.distributed.run`, elastic).

Four entry points run the same worker functions the notebooks run with `common.parallel.distributed.run_workers`, and
write the same ledger names on rank 0 (`common.core.results`, to $WORKBOOK_RESULTS or build/interactive/ on rank 0's
machine; the report says where):

    torchrun --nnodes N --nproc-per-node G -m common.parallel.collectives      # lab 07: sweep, alpha-beta fit
    torchrun --nnodes N --nproc-per-node G -m common.parallel.expert_parallel  # lab 07: EP dispatch and combine
    torchrun --nnodes N --nproc-per-node G -m common.parallel.pipeline_run     # lab 08: schedules on real ranks
    torchrun --nnodes N --nproc-per-node G -m common.parallel.ddp_overlap      # lab 08: DDP overlap

with `--rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id ID` on several nodes (the same command on each, HOST
one node's address, ID the same on every node and new for every job), or `--standalone` on one; each takes
`--backend gloo|nccl` (default: NCCL on GPUs) and `--help` (printed by rank 0 only). Network interfaces and
InfiniBand adapters: docs/multi_machine.md. `command(...)` writes such a command; `world_size()` reads the job's size;
`parse(parser)` reads the arguments (rank 0 alone speaks); `init_from_env` joins the group torchrun describes (NCCL:
with `device_id`, this rank's GPU); `main` runs a worker on every rank, gathers the results on rank 0 and hands them
to a `report` that prints and records.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import socket
import sys
import uuid
from typing import Callable, Sequence

from common.core.validate import whole
from common.parallel.ranks import BACKENDS, check_backend


def command(target: str, nproc_per_node: int, nnodes: int = 1, rdzv_endpoint: str = "HOST:29500",
            module: bool = True, script_args: Sequence[str] = (), rdzv_id: str | None = None) -> str:
    """The torchrun command that runs `target` (a module such as "common.parallel.collectives", or a script) with
    `nproc_per_node` processes on each of `nnodes` machines. One node: `--standalone`. Several: a c10d rendezvous
    at `rdzv_endpoint` under `rdzv_id` -- the same on every node of a job, a fresh one for each job (a new random
    id when None): agents of an earlier job that share an id would join this one."""
    whole("nproc_per_node", nproc_per_node, meaning="processes per node, one per GPU")
    whole("nnodes", nnodes, meaning="machines")
    parts = ["torchrun"]
    if nnodes == 1:
        parts.append("--standalone")
    else:
        parts += [f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}",
                  f"--rdzv-id={rdzv_id or 'workbook-' + uuid.uuid4().hex[:12]}"]
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
    device = None
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method="env://", device_id=device)
    return dist.get_rank(), dist.get_world_size()


def world_size() -> int:
    """WORLD_SIZE of this torchrun job (`check_world_size` holds this node's ranks, LOCAL_WORLD_SIZE, to the
    machine's limit: the other nodes bring their own GPUs)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def parser(description: str, module: str) -> argparse.ArgumentParser:
    """An argument parser for the entry point `module`, with the option every entry point has: --backend."""
    ap = argparse.ArgumentParser(prog=f"torchrun [--nnodes N --nproc-per-node G ...] -m {module}",
                                 description=description + " (run under torchrun; see common.parallel.torchrun)")
    ap.add_argument("--backend", default=None, choices=BACKENDS, help="default: nccl on GPUs, else gloo")
    return ap


def parse(ap: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """`ap.parse_args(argv)`, with rank 0 alone printing --help or an argument error (every rank exits the same)."""
    if int(os.environ.get("RANK", "0")) == 0:
        return ap.parse_args(argv)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return ap.parse_args(argv)


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
            from common.core import results
            report(gathered)
            print(f"results of rank 0 written to {results.ledger_path()} on {socket.gethostname()}", flush=True)
    finally:
        dist.destroy_process_group()
