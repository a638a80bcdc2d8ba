"""What ranks this machine can run, and where a rank's tensors live: checks made before any process starts.

`check_backend(None)` picks NCCL when CUDA GPUs are there and gloo otherwise; `check_world_size` refuses, naming the
value and the limit, more ranks than the machine runs (one per GPU for NCCL, two per CPU core for gloo; under torchrun,
this node's ranks, LOCAL_WORLD_SIZE). Inside a worker (of `common.parallel.distributed.run_workers` or of torchrun),
`worker_device()` is the device its tensors go on -- its own GPU under NCCL, else the CPU -- read from the process
group it is in, and `synchronize()` waits for that device. No state is kept here: what a rank is, its process group
says.
"""
from __future__ import annotations

import os

from common.core.validate import whole

BACKENDS = ("gloo", "nccl")
RANKS_PER_CPU_CORE = 2  # a gloo rank is a Python process with torch (a few hundred MB) that needs a core to progress
MIN_CPU_RANKS = 4  # the labs use 2 to 4 ranks: allowed even on a 1-core laptop


def cuda_available() -> bool:
    """True when CUDA GPUs are usable (and WORKBOOK_FORCE_CPU is not set)."""
    if os.environ.get("WORKBOOK_FORCE_CPU") == "1":
        return False
    import torch
    return torch.cuda.is_available()


def check_backend(backend: str | None) -> str:
    """`backend`, or NCCL when CUDA GPUs are there and gloo otherwise for None; ValueError for anything else."""
    if backend is None:
        return "nccl" if cuda_available() else "gloo"
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not supported; allowed: None (automatic), {', '.join(BACKENDS)}")
    return backend


def max_world_size(backend: str | None = None) -> int:
    """How many ranks this machine runs: one per GPU for NCCL; RANKS_PER_CPU_CORE per core for gloo (at least 4)."""
    if check_backend(backend) == "nccl":
        import torch
        return torch.cuda.device_count() if cuda_available() else 0
    return max(MIN_CPU_RANKS, RANKS_PER_CPU_CORE * (os.cpu_count() or 1))


def check_world_size(world_size: int, backend: str | None = None) -> int:
    """`world_size` when this machine can run it with `backend`, else a ValueError naming the value and the limit.
    Under torchrun the limit holds this node's ranks only (LOCAL_WORLD_SIZE): the other nodes bring their own."""
    backend = check_backend(backend)
    whole("world_size", world_size, meaning="ranks")
    limit = max_world_size(backend)
    if backend == "nccl" and limit == 0:
        raise ValueError(f"backend='nccl' needs CUDA GPUs and this machine has none; use backend='gloo' "
                         f"(world_size={world_size})")
    per_node = int(os.environ["LOCAL_WORLD_SIZE"]) if "TORCHELASTIC_RUN_ID" in os.environ else world_size
    if per_node > limit:
        why = (f"one rank per GPU, {limit} GPU(s)" if backend == "nccl" else
               f"{RANKS_PER_CPU_CORE} ranks per CPU core (at least {MIN_CPU_RANKS}), {os.cpu_count()} core(s)")
        what = f"world_size={world_size}" + (f" ({per_node} on this node)" if per_node != world_size else "")
        raise ValueError(f"{what} is more than this machine can run with {backend}: at most "
                         f"{limit} ({why}). Use more machines with torchrun (`common.parallel.torchrun`).")
    return world_size


def worker_device():
    """The torch.device a worker puts its tensors on: its own GPU under NCCL, else the CPU."""
    import torch
    import torch.distributed as dist
    backend = dist.get_backend() if dist.is_initialized() else "gloo"
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")


def synchronize() -> None:
    """Wait for this worker's device to finish its queued work (nothing to wait for on a CPU)."""
    import torch
    if worker_device().type == "cuda":
        torch.cuda.synchronize()


