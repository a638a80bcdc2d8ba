"""Launch torch.distributed worker processes from a notebook or a script, and always clean them up.

`run_workers(worker, world_size, args)` starts `world_size` fresh processes, joins them into one process group --
gloo on a CPU, NCCL on GPUs -- calls `worker(rank, world_size, *args)` in each, and returns the per-rank return
values as a list indexed by rank:

    from common.parallel.distributed import run_workers
    from common.parallel.collectives import sweep_worker
    per_rank = run_workers(sweep_worker, 2, args=(["all_reduce"], [2**10, 2**20]))

`tasks_worker` runs several workers one after the other in the same group (starting a group costs seconds).
The worker must be a top-level function of an importable module (`common.*`); its arguments and result must pickle.

What torch already does, and what this module adds. Several machines: use torch's own `torchrun`
(`torch.distributed.run`, elastic); `torchrun_command(...)` writes the command and `init_from_env()` joins the group
inside the launched script -- nothing is re-implemented there. One machine, from a notebook: torch's
`torch.multiprocessing.spawn` starts the ranks (spawn start method), reports a failing rank with its traceback and
stops the others, also on KeyboardInterrupt (checked with torch 2.13). It is not used because it lacks what a
notebook call needs, and each remaining piece here exists for one of those gaps:
- **Return values.** `spawn` returns nothing; the lab needs each rank's measurements. Results (or the error) come
  back through the rendezvous store.
- **No port race.** `spawn` leaves rendezvous to `init_process_group(init_method="env://")` with a MASTER_PORT the
  caller picks; probing a free port and binding it later in a child races with any other run. Here the parent opens
  the TCPStore on port 0 (the OS picks and the store holds it for the whole run) and hands that store to the group.
- **No re-import of the caller.** `spawn` re-imports the caller's `__main__` in every child: a script without an
  `if __name__ == "__main__":` guard runs again in each rank. Here each rank is `python -c` importing only
  `common.parallel.distributed`.
- **A time limit and a dead-parent watch.** `timeout` bounds the whole run (a rank stuck in a collective whose peer
  never comes); a worker exits when its parent disappears (a killed notebook kernel), so no orphan is left.
- **Clean-up, whatever happens.** On an error, a timeout, or KeyboardInterrupt (the notebook's stop button), every
  process is terminated, then killed if it does not exit, and joined, and the store -- with its port -- is closed,
  before `run_workers` returns or raises. A rank that raises gives `WorkerError` naming the rank, the exception and
  the worker's traceback (the first rank to fail, not the peers that then lose their connection); a rank that dies
  without a word (killed, out of memory) is reported with its exit code and the tail of its output.
"""
from __future__ import annotations

import datetime
import os
import pickle
import socket
import sys
import time
import traceback
from typing import Any, Callable, Sequence

from common.core.env import REPO_ROOT
from common.core.validate import number

BACKENDS = ("gloo", "nccl")
HOST = "127.0.0.1"
# A rank of gloo on a CPU is a whole Python process with torch imported (a few hundred MB) and needs a core to
# make progress; more than two ranks per core only measures the scheduler.
RANKS_PER_CPU_CORE = 2
MIN_CPU_RANKS = 4  # the labs use 2 to 4 ranks; allow that much even on a 1-core laptop

_context: dict = {}  # set inside a worker process: rank, world_size, backend
last_run: dict = {}  # the latest run_workers call in this process: port, pids (tests check nothing is left)


class WorkerError(RuntimeError):
    """A worker process failed; `rank`, `exc_type` and `worker_traceback` say where and how."""

    def __init__(self, message: str, rank: int | None = None, exc_type: str = "", worker_traceback: str = ""):
        super().__init__(message)
        self.rank = rank
        self.exc_type = exc_type
        self.worker_traceback = worker_traceback


def cuda_available() -> bool:
    """True when CUDA GPUs are usable (and WORKBOOK_FORCE_CPU is not set)."""
    if os.environ.get("WORKBOOK_FORCE_CPU") == "1":
        return False
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


def default_backend() -> str:
    """NCCL when CUDA GPUs are there, gloo otherwise."""
    return "nccl" if cuda_available() else "gloo"


def max_world_size(backend: str | None = None) -> int:
    """How many ranks this machine can run: one per GPU for NCCL; a couple per CPU core for gloo (at least 4)."""
    backend = _check_backend(backend)
    if backend == "nccl":
        if not cuda_available():
            return 0
        import torch
        return torch.cuda.device_count()
    return max(MIN_CPU_RANKS, RANKS_PER_CPU_CORE * (os.cpu_count() or 1))


def _check_backend(backend: str | None) -> str:
    if backend is None:
        return default_backend()
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not supported; allowed: None (automatic), {', '.join(BACKENDS)}")
    return backend


def check_world_size(world_size: int, backend: str | None = None) -> int:
    """Validate `world_size` for `backend` on this machine; return it, or raise ValueError naming value and limit."""
    backend = _check_backend(backend)
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise ValueError(f"world_size={world_size!r} must be a whole number of ranks (an int >= 1)")
    if world_size < 1:
        raise ValueError(f"world_size={world_size} must be at least 1")
    limit = max_world_size(backend)
    if backend == "nccl" and limit == 0:
        raise ValueError(f"backend='nccl' needs CUDA GPUs and this machine has none; use backend='gloo' "
                         f"(world_size={world_size})")
    if world_size > limit:
        if backend == "nccl":
            why = f"one rank per GPU and this machine has {limit} GPU(s)"
        else:
            why = (f"{RANKS_PER_CPU_CORE} ranks per CPU core (at least {MIN_CPU_RANKS}) and this machine has "
                   f"{os.cpu_count()} core(s)")
        raise ValueError(f"world_size={world_size} is more than this machine can run with {backend}: at most "
                         f"{limit} ({why}). Use more machines with torchrun (see torchrun_command).")
    return world_size


def free_port(host: str = HOST) -> int:
    """A TCP port that is free right now (the OS picks it); for commands such as torchrun's --master-port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_in_use(port: int, host: str = HOST) -> bool:
    """True when something listens on `port` (tests use it to show a run left no port behind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


# --------------------------------------------------------------------------------------------------------------
# Inside a worker process


def rank() -> int:
    """This worker's rank (inside a `run_workers` worker or a torchrun process)."""
    import torch.distributed as dist
    return dist.get_rank()


def worker_device():
    """The torch.device a worker should put its tensors on: its own GPU under NCCL, else the CPU."""
    import torch
    backend = _context.get("backend")
    if backend is None:
        import torch.distributed as dist
        backend = dist.get_backend() if dist.is_initialized() else "gloo"
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def synchronize() -> None:
    """Wait for this worker's device to finish its queued work (no-op on a CPU)."""
    import torch
    if worker_device().type == "cuda":
        torch.cuda.synchronize()


_KEY = "workbook/"  # prefix of the launcher's keys in the rendezvous store


def _watch_parent(parent_pid: int) -> None:
    """In a worker: exit when the parent process is gone, so a killed notebook kernel leaves no orphan behind."""
    import threading

    def watch():
        while True:
            if os.getppid() != parent_pid:
                os._exit(1)
            time.sleep(0.5)
    threading.Thread(target=watch, daemon=True, name="workbook-parent-watch").start()


def _child_main() -> None:
    """Entry point of one worker process (started by run_workers with `python -c`): rank, size, backend, port,
    timeout and the parent's pid come in argv; the worker and its args come pickled through the store; the result
    (or the error) goes back through the store."""
    rank, world_size, backend, port, timeout_s, parent_pid = sys.argv[1:7]
    rank, world_size, port, parent_pid, timeout_s = int(rank), int(world_size), int(port), int(parent_pid), float(
        timeout_s)
    _watch_parent(parent_pid)
    import torch
    import torch.distributed as dist
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(HOST, port, is_master=False, timeout=timeout)
    try:
        worker, args = pickle.loads(store.get(_KEY + "payload"))
        _context.update(rank=rank, world_size=world_size, backend=backend)
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend, store=dist.PrefixStore("pg/", store), rank=rank, world_size=world_size,
                                timeout=timeout)
        value = worker(rank, world_size, *args)
        report = ("ok", value)
    except BaseException as exc:  # report everything, KeyboardInterrupt included, before tearing down the group
        report = ("error", _error_info(exc))
        try:
            store.set(_KEY + f"result/{rank}", pickle.dumps(report))
        finally:
            os._exit(1)  # do not wait for a group whose peers may be stuck
    try:
        dist.destroy_process_group()
    except Exception:
        pass
    try:
        blob = pickle.dumps(report)
    except Exception as exc:
        blob = pickle.dumps(("error", _error_info(exc)))
    store.set(_KEY + f"result/{rank}", blob)


def _error_info(exc: BaseException) -> tuple:
    """(type name, message, traceback text, pickled exception or None, time caught) of an exception."""
    try:
        blob = pickle.dumps(exc)
        pickle.loads(blob)
    except Exception:
        blob = None
    return type(exc).__name__, str(exc), traceback.format_exc(), blob, time.time()


# --------------------------------------------------------------------------------------------------------------
# In the parent


def _check_importable(worker: Callable, args: Sequence) -> bytes:
    if not callable(worker):
        raise ValueError(f"worker={worker!r} is not callable; pass a function worker(rank, world_size, *args)")
    name = getattr(worker, "__qualname__", repr(worker))
    if getattr(worker, "__module__", None) in ("__main__", "__mp_main__", None) or "<locals>" in name:
        raise ValueError(f"worker {name!r} is defined in this notebook, script or function; the worker processes "
                         f"cannot import it. Put it at the top level of a module (e.g. common/<lab module>.py) and "
                         f"import it from there.")
    try:
        return pickle.dumps((worker, tuple(args)))
    except Exception as exc:
        raise ValueError(f"worker {name!r} and its args must pickle to reach the worker processes: "
                         f"{type(exc).__name__}: {exc}") from None


def _stop(procs: list) -> None:
    """Terminate, then kill, then wait for every process; never raises."""
    for p in procs:
        if p.poll() is None:
            try:
                p.terminate()
            except OSError:
                pass
    deadline = time.monotonic() + 3.0
    for p in procs:
        try:
            p.wait(max(0.01, deadline - time.monotonic()))
        except Exception:
            try:
                p.kill()
                p.wait(5.0)
            except Exception:
                pass


def _tail(path: str, n: int = 1500) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - n))
            return f.read().decode(errors="replace").strip()
    except OSError:
        return ""


def _raise_worker_error(rank: int, world_size: int, info) -> None:
    etype, message, tb, blob, _ = info
    text = (f"rank {rank} of {world_size} raised {etype}: {message}\n"
            f"--- traceback in worker rank {rank} ---\n{tb.rstrip()}")
    err = WorkerError(text, rank=rank, exc_type=etype, worker_traceback=tb)
    try:
        cause = pickle.loads(blob) if blob is not None else None
    except Exception:  # the exception's class cannot be imported here: the text above still says it all
        cause = None
    if isinstance(cause, BaseException):
        raise err from cause
    raise err


def _child_env() -> dict:
    """The workers' environment: the parent's, with its import path (so `common` and the worker's module import)."""
    env = dict(os.environ)
    paths = [os.getcwd() if p == "" else p for p in sys.path if isinstance(p, str)]
    repo = str(REPO_ROOT)
    env["PYTHONPATH"] = os.pathsep.join([repo] + [p for p in paths if os.path.isdir(p)])
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run_workers(worker: Callable, world_size: int, args: Sequence = (), backend: str | None = None,
                timeout: float = 120) -> list:
    """Run `worker(rank, world_size, *args)` in `world_size` processes of one process group; results by rank.

    backend: None picks NCCL on GPUs and gloo on a CPU. timeout: seconds for the whole run (start-up included).
    Raises ValueError for a world size this machine cannot run, WorkerError when a worker fails or dies, and
    TimeoutError when the run takes longer than `timeout`; in every case no process is left behind.
    """
    import subprocess
    import tempfile

    backend = _check_backend(backend)
    check_world_size(world_size, backend)
    number("timeout", timeout, meaning="seconds")
    payload = _check_importable(worker, args)

    import torch.distributed as dist
    store = dist.TCPStore(HOST, 0, None, True, timeout=datetime.timedelta(seconds=timeout), wait_for_workers=False)
    store.set(_KEY + "payload", payload)
    last_run.clear()
    last_run.update(port=store.port, pids=[])
    procs: list = []
    logs = tempfile.TemporaryDirectory(prefix="workbook-workers-")
    env = _child_env()
    code = "from common.parallel.distributed import _child_main; _child_main()"
    try:
        for r in range(world_size):
            log = open(os.path.join(logs.name, f"rank{r}.log"), "wb")
            try:
                procs.append(subprocess.Popen(
                    [sys.executable, "-c", code, str(r), str(world_size), backend, str(store.port), str(timeout),
                     str(os.getpid())], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env))
                last_run["pids"].append(procs[-1].pid)
            finally:
                log.close()
        out: list[Any] = [None] * world_size
        pending = set(range(world_size))
        deadline = time.monotonic() + timeout
        while pending:
            errors = {}
            for r in sorted(pending):
                key = _KEY + f"result/{r}"
                if store.check([key]):
                    status, data = pickle.loads(store.get(key))
                    if status == "error":
                        errors[r] = data
                    else:
                        out[r] = data
                        pending.discard(r)
                elif procs[r].poll() is not None and not store.check([key]):
                    rc = procs[r].returncode
                    how = f"was killed by signal {-rc}" if rc < 0 else f"exited with code {rc}"
                    log = _tail(os.path.join(logs.name, f"rank{r}.log"))
                    raise WorkerError(f"rank {r} of {world_size} {how} without reporting a result (out of memory? "
                                      f"killed?)" + (f"\n--- last output of rank {r} ---\n{log}" if log else ""),
                                      rank=r)
            if errors:  # the first error is the cause; its peers then fail with "connection closed" and the like
                time.sleep(0.2)
                for r in sorted(pending - set(errors)):
                    key = _KEY + f"result/{r}"
                    if store.check([key]):
                        status, data = pickle.loads(store.get(key))
                        if status == "error":
                            errors[r] = data
                first = min(errors, key=lambda r: errors[r][4])
                _raise_worker_error(first, world_size, errors[first])
            if not pending:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"run_workers: ranks {sorted(pending)} of {world_size} did not finish within "
                                   f"timeout={timeout} s (a rank stuck in a collective its peers never called?); "
                                   f"all worker processes were stopped")
            time.sleep(0.02)
        return out
    finally:
        _stop(procs)
        del store  # closes the rendezvous port
        logs.cleanup()



# --------------------------------------------------------------------------------------------------------------
# Small workers: a first run, and the failure modes (the lab shows them; the tests use them)


def hello_worker(rank: int, world_size: int) -> dict:
    """Each rank contributes rank+1 to an all-reduce; returns what this rank saw."""
    import torch
    import torch.distributed as dist
    t = torch.tensor([float(rank + 1)], device=worker_device())
    dist.all_reduce(t)
    return {"rank": rank, "world_size": world_size, "backend": dist.get_backend(), "pid": os.getpid(),
            "sum": float(t.item())}


def tasks_worker(rank: int, world_size: int, tasks: Sequence) -> list:
    """Run several workers one after the other in ONE process group: `tasks` is a list of (worker, args); returns
    [worker(rank, world_size, *args) for each]. Starting a group costs seconds (fresh processes import torch), so a
    lab that measures several things starts one group and hands it all of them."""
    import torch.distributed as dist
    out = []
    for worker, args in tasks:
        out.append(worker(rank, world_size, *args))
        dist.barrier()
    return out


def failing_worker(rank: int, world_size: int, bad_rank: int = 1, message: str = "boom") -> int:
    """Rank `bad_rank` raises ValueError(message) while the others wait in an all-reduce that never completes."""
    import torch
    import torch.distributed as dist
    if rank == bad_rank:
        raise ValueError(message)
    t = torch.ones(1, device=worker_device())
    dist.all_reduce(t)  # blocks: bad_rank never joins
    return rank


def sleeping_worker(rank: int, world_size: int, seconds: float = 60.0) -> int:
    """Sleeps `seconds` (to show the timeout)."""
    time.sleep(seconds)
    return rank


def exiting_worker(rank: int, world_size: int, bad_rank: int = 0, code: int = 3) -> int:
    """Rank `bad_rank` exits the process abruptly (os._exit), as an out-of-memory kill would."""
    if rank == bad_rank:
        os._exit(code)
    time.sleep(60)
    return rank


# --------------------------------------------------------------------------------------------------------------
# Several machines: torchrun


def torchrun_command(target: str, nproc_per_node: int, nnodes: int = 1, rdzv_endpoint: str = "HOST:29500",
                     module: bool = True, script_args: Sequence[str] = ()) -> str:
    """The torchrun command that runs `target` (a module such as "common.parallel.collectives", or a script) on
    `nnodes` machines with `nproc_per_node` processes each. Run the same command on every node; the rendezvous
    endpoint is one node's address and a port open between the nodes. One node: `--standalone` instead."""
    if not (isinstance(nproc_per_node, int) and nproc_per_node >= 1):
        raise ValueError(f"nproc_per_node={nproc_per_node!r} must be an int >= 1")
    if not (isinstance(nnodes, int) and nnodes >= 1):
        raise ValueError(f"nnodes={nnodes!r} must be an int >= 1")
    parts = ["torchrun"]
    if nnodes == 1:
        parts.append("--standalone")
    else:
        parts += [f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}",
                  "--rdzv-id=workbook"]
    parts.append(f"--nproc-per-node={nproc_per_node}")
    if module:
        parts.append("-m")
    parts.append(target)
    parts += list(script_args)
    return " ".join(parts)


def init_from_env(backend: str | None = None) -> tuple[int, int]:
    """Inside a torchrun-launched process: join the group from RANK/WORLD_SIZE/MASTER_* and return (rank, size)."""
    import torch
    import torch.distributed as dist
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise RuntimeError(f"init_from_env: {', '.join(missing)} not set -- launch this with torchrun "
                           f"(torchrun_command shows how), or use run_workers on one machine")
    backend = _check_backend(backend)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    _context.update(backend=backend)
    dist.init_process_group(backend, init_method="env://")
    return dist.get_rank(), dist.get_world_size()
