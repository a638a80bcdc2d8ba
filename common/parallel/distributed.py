"""Run a torch.distributed worker on processes of this machine, get each rank's result, leave nothing behind:
`run_workers(worker, 2, args=(...,), backend="gloo", timeout=120)` is [rank 0's result, rank 1's], `.output` what
each printed; `worker(rank, world_size, *args)` is a top-level function of an importable module, arguments and result
pickle (a script calling this needs `if __name__ == "__main__":`, checked). `tasks_worker` runs several (worker,
args) in ONE group; `start_rank_server(*modules)` starts the ranks' fork server ahead, with what the workers import;
pass a `Launch()` to see the port, pids and folder a run used. Several machines: `common.parallel.torchrun`.
Torch launches: `torch.multiprocessing.start_processes` forks the ranks from multiprocessing's fork server (it imports
torch once: a rank starts in milliseconds) and `ProcessContext.join` sees one fail. Added, what torch lacks: results
and the first failure through a `TCPStore` the parent opens on port 0 (`rank_failures` words it); `PR_SET_PDEATHSIG`
with SIGKILL, so a killed kernel leaves no rank; each rank leads a process group, so its children die with it and a
terminal's Ctrl-C reaches only the parent; a time limit; one folder per launch for logs and the ranks' temporary
files (`processes`). Whatever the way out, every group is killed and waited for, and the folder removed."""
from __future__ import annotations

import contextlib
import datetime
import os
import pickle
import shutil
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing import forkserver
from typing import Callable, Sequence

from common.core.validate import number
from common.parallel import processes
from common.parallel.rank_failures import WorkerError, check_main_guard, failure, read_log  # noqa: F401
from common.parallel.ranks import check_backend, check_world_size, synchronize, worker_device  # noqa: F401

HOST = "127.0.0.1"


@dataclass
class Launch:
    """What one `run_workers` call used, for a caller that checks that nothing is left: port, pids, folder."""
    port: int = 0
    pids: list = field(default_factory=list)
    folder: str = ""


class Results(list):
    """The workers' return values by rank; `output[rank]` is what that rank wrote to stdout and stderr."""


def tasks_worker(rank: int, world_size: int, tasks: Sequence) -> list:
    """[worker(rank, world_size, *args) for (worker, args) in tasks], in one process group, a barrier after each."""
    import torch.distributed as dist
    out = []
    for worker, args in tasks:
        out.append(worker(rank, world_size, *args))
        dist.barrier()
    return out


def _entry(rank, world_size, backend, port, timeout, payload: bytes, folder: str, environ: dict) -> None:
    """One rank (torch's wrapper calls it): report ("ok", value) or ("error", ...) under result/<rank>."""
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    mp._prctl_pr_set_pdeathsig(signal.SIGKILL)  # die with the fork server, which exits when the parent does ...
    os.close(forkserver._forkserver._forkserver_alive_fd)  # ... once no rank holds the "parent alive" pipe it inherits
    forkserver._forkserver._forkserver_alive_fd = None
    os.setpgid(0, 0)
    os.environ.clear(), os.environ.update(environ)  # the parent's now, not the fork server's when it started
    processes.use_run_dir(folder)
    log = os.open(os.path.join(folder, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(log, 1), os.dup2(log, 2)
    sys.stdout.reconfigure(line_buffering=True)
    store = dist.TCPStore(HOST, port, is_master=False, timeout=datetime.timedelta(seconds=timeout))
    try:
        worker, args = pickle.loads(payload)
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
        device = None
        if backend == "nccl":
            device = torch.device("cuda", rank % torch.cuda.device_count())
            torch.cuda.set_device(device)
        dist.init_process_group(backend, store=dist.PrefixStore("pg/", store), rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout), device_id=device)
        value = pickle.dumps(("ok", worker(rank, world_size, *args)))
        sys.stdout.flush()
        store.set(f"result/{rank}", value)
    except BaseException as exc:  # KeyboardInterrupt too; then exit at once, not waiting for peers that may be stuck
        blob = None
        with contextlib.suppress(Exception):
            blob = pickle.dumps(exc)
        info = (type(exc).__name__, str(exc), traceback.format_exc(), blob, time.time())
        store.set(f"result/{rank}", pickle.dumps(("error", info)))
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(1)
    dist.destroy_process_group()


def _payload(worker: Callable, args: Sequence) -> bytes:
    name = getattr(worker, "__qualname__", repr(worker))
    if not callable(worker):
        raise ValueError(f"worker={worker!r} is not callable; pass a function worker(rank, world_size, *args)")
    if getattr(worker, "__module__", None) in ("__main__", "__mp_main__", None) or "<locals>" in name:
        raise ValueError(f"worker {name!r} is defined in this notebook, script or function; the worker processes "
                         f"cannot import it. Put it at the top level of a module (e.g. common/<package>/<module>.py)")
    try:
        return pickle.dumps((worker, tuple(args)))
    except Exception as exc:
        raise ValueError(f"worker {name!r} and its args must pickle: {type(exc).__name__}: {exc}") from None


def start_rank_server(*modules: str) -> bool:
    """Start the fork server that `run_workers` forks its ranks from, now and in the background: it imports
    torch.distributed and `modules` (those the workers will import, seconds of CPU each) while this process goes on,
    so the first `run_workers` forks ranks that already have them. Returns True if it started it; False when a
    server already runs, whose imports are then left as they are (modules load only when a server starts)."""
    import importlib.util
    for m in modules:
        if not isinstance(m, str) or importlib.util.find_spec(m) is None:
            raise ValueError(f"modules: {m!r} is not an importable module name (e.g. 'torch.distributed.checkpoint')")
    import psutil
    pid = forkserver._forkserver._forkserver_pid
    with contextlib.suppress(psutil.NoSuchProcess):
        if pid is not None and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            return False
    processes.server_dir()
    forkserver.set_forkserver_preload(["torch.distributed", __name__, *modules])
    forkserver.ensure_running()  # spawns the server and returns; the server imports before it takes a request
    return True


def run_workers(worker: Callable, world_size: int, args: Sequence = (), backend: str | None = None,
                timeout: float = 120, launch: Launch | None = None) -> Results:
    """Run `worker(rank, world_size, *args)` on `world_size` processes of one process group; results by rank.
    backend: None picks NCCL on GPUs, gloo on a CPU. timeout: seconds for the whole run. Raises ValueError (before
    any process starts) for what this machine cannot run, WorkerError when a rank fails, TimeoutError past `timeout`;
    in every case no process and no folder of the run is left."""
    import torch.distributed as dist
    import torch.multiprocessing as mp
    backend = check_backend(backend)
    check_world_size(world_size, backend)
    number("timeout", timeout, meaning="seconds")
    payload = _payload(worker, args)
    check_main_guard()
    launch = launch if launch is not None else Launch()
    store = dist.TCPStore(HOST, 0, None, True, timeout=datetime.timedelta(seconds=timeout), wait_for_workers=False)
    launch.port, launch.folder = store.port, processes.run_dir()
    ctx, held = None, []  # an interrupt while the ranks start would leave them without a handle: hold it till then
    hold = threading.current_thread() is threading.main_thread() and callable(signal.getsignal(signal.SIGINT))
    try:
        previous = signal.signal(signal.SIGINT, lambda *a: held.append(a)) if hold else None
        try:
            start_rank_server()  # if none runs yet (or it died): one that imports torch.distributed
            ctx = mp.start_processes(_entry, args=(world_size, backend, store.port, timeout, payload, launch.folder,
                                                   dict(os.environ)), nprocs=world_size, join=False,
                                     start_method="forkserver")
            launch.pids = ctx.pids()
        finally:
            if hold:
                signal.signal(signal.SIGINT, previous)
        if held:  # the interrupt, now that the ranks can be stopped
            previous(*held[0])
        deadline, keys = time.monotonic() + timeout, [f"result/{r}" for r in range(world_size)]
        while not store.check(keys):  # done when every rank has reported: its teardown is not waited for
            try:
                exited = ctx.join(timeout=0.05, grace_period=0.5)
            except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
                raise failure(store, launch.folder, world_size, exc)
            if exited and not store.check(keys):  # exit code 0 without a word: an interrupt torch's wrapper swallowed
                raise failure(store, launch.folder, world_size, None)
            if time.monotonic() > deadline:
                raise TimeoutError(f"run_workers: {world_size} ranks did not finish within timeout={timeout:g} s "
                                   f"(a rank waiting in a collective its peers never called?); all were stopped")
        reports = [pickle.loads(store.get(k)) for k in keys]
        if any(status != "ok" for status, _ in reports):
            raise failure(store, launch.folder, world_size, None)
        out = Results(value for _, value in reports)
        out.output = [read_log(launch.folder, r) for r in range(world_size)]
        return out
    finally:
        processes.kill(ctx)
        del store  # closes the port
        shutil.rmtree(launch.folder, ignore_errors=True)
