"""Workers for the launcher's tests (`common.parallel.distributed.run_workers` imports them in each rank): a first
run, each way a rank can fail, and a rank with a child of its own (as a compile or DataLoader worker would be)."""
import os
import subprocess
import sys
import time


def hello_worker(rank: int, world_size: int) -> dict:
    """Each rank adds rank + 1 to an all-reduce, prints a line, and returns what it saw."""
    import torch
    import torch.distributed as dist

    from common.parallel.distributed import worker_device
    t = torch.tensor([float(rank + 1)], device=worker_device())
    dist.all_reduce(t)
    print(f"hello from rank {rank}")
    return {"rank": rank, "world_size": world_size, "backend": dist.get_backend(), "pid": os.getpid(),
            "sum": float(t.item())}


def failing_worker(rank: int, world_size: int, bad_rank: int = 1, message: str = "boom") -> int:
    """Rank `bad_rank` prints, then raises ValueError(message); the others wait in an all-reduce it never joins."""
    import torch
    import torch.distributed as dist
    if rank == bad_rank:
        print(f"rank {rank} is about to fail")
        raise ValueError(message)
    t = torch.ones(1)
    dist.all_reduce(t)
    return rank


def sleeping_worker(rank: int, world_size: int, seconds: float = 60.0) -> int:
    time.sleep(seconds)
    return rank


def exiting_worker(rank: int, world_size: int, bad_rank: int = 0, code: int = 3) -> int:
    """Rank `bad_rank` exits at once (os._exit), as an out-of-memory kill would; the others sleep."""
    if rank == bad_rank:
        os._exit(code)
    time.sleep(60)
    return rank


def parent_worker(rank: int, world_size: int, marker: str, then: str = "sleep") -> int:
    """Start a child process whose command line ends with `marker` (a stand-in for a compile or DataLoader worker) and
    write its pid to the file `marker`.<rank>; then
    `then`: "sleep" (60 s), "crash" (os._exit on rank 0, the others sleep), or "return"."""
    import multiprocessing.util
    import tempfile
    multiprocessing.util.get_temp_dir()  # a pymp-* folder, as any use of multiprocessing in a rank makes
    tempfile.NamedTemporaryFile(delete=False).close()  # a temporary file a rank forgets
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", marker])
    with open(f"{marker}.{rank}", "w") as f:  # the test checks that the child was started, then that it is gone
        f.write(str(child.pid))
    if then == "crash" and rank == 0:
        time.sleep(0.5)
        os._exit(9)
    if then != "return":
        time.sleep(60)
    return rank


def broken_ep_worker(rank: int, world_size: int, cfg_dict: dict) -> dict:
    """Expert parallelism's node-aware layer with a bug: the first token is never dispatched. Its split lists then
    differ from `node_send_counts` of the rank's routing -- which a record that recomputes them would never show."""
    from common.parallel.expert_parallel import layer, worker
    real = layer.node_aware_forward

    def forgets_a_token(x, weights, indices, experts, cfg, ex):
        return real(x[1:], weights[1:], indices[1:], experts, cfg, ex)
    layer.FORWARD["node_aware"] = forgets_a_token
    return worker.ep_worker(rank, world_size, cfg_dict, ("node_aware",), False, 1)


def modules_worker(rank: int, world_size: int, names: list) -> list:
    """Which of `names` this rank has imported, without importing any (the fork server's preloads show here)."""
    return [n in sys.modules for n in names]


def sysexit_worker(rank: int, world_size: int, code: int = 3) -> int:
    """Rank 0 calls sys.exit(code), as a script's argument check might; the others wait in a barrier."""
    import torch.distributed as dist
    if rank == 0:
        sys.exit(code)
    dist.barrier()
    return rank
