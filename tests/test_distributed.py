"""The process launcher: results by rank, errors with rank and traceback, timeouts, interrupts, no leftovers."""
import _thread
import signal
import threading

import psutil
import pytest
import torch.distributed  # noqa: F401  (imported here, so an interrupt in a test lands in the run, not in this import)

from common.parallel import distributed as D


def _assert_nothing_left():
    pids = D.last_run.get("pids", [])
    assert pids, "run_workers did not record its processes"
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"worker processes left behind: {alive}"
    assert not D.port_in_use(D.last_run["port"]), "the rendezvous port is still open"


def test_results_by_rank_and_allreduce():
    out = D.run_workers(D.hello_worker, 3, backend="gloo")
    assert [o["rank"] for o in out] == [0, 1, 2]
    assert all(o["sum"] == 6.0 and o["world_size"] == 3 and o["backend"] == "gloo" for o in out)
    assert len({o["pid"] for o in out}) == 3
    _assert_nothing_left()


def test_worker_exception_names_rank_and_traceback():
    with pytest.raises(D.WorkerError, match=r"rank 2 of 3 raised ValueError: bad input on rank 2") as info:
        D.run_workers(D.failing_worker, 3, args=(2, "bad input on rank 2"), backend="gloo", timeout=60)
    assert info.value.rank == 2 and info.value.exc_type == "ValueError"
    assert "failing_worker" in str(info.value) and "Traceback" in info.value.worker_traceback
    assert isinstance(info.value.__cause__, ValueError)
    _assert_nothing_left()


def test_worker_that_dies_silently_is_reported():
    with pytest.raises(D.WorkerError, match=r"rank 1 of 2 exited with code 7 without reporting"):
        D.run_workers(D.exiting_worker, 2, args=(1, 7), backend="gloo", timeout=60)
    _assert_nothing_left()


def test_timeout_stops_everything():
    with pytest.raises(TimeoutError, match=r"did not finish within timeout=4 s"):
        D.run_workers(D.sleeping_worker, 2, args=(60,), backend="gloo", timeout=4)
    _assert_nothing_left()


def _interrupted_run(after_s: float) -> None:
    """A run of sleeping workers interrupted (KeyboardInterrupt, the notebook's stop button) after `after_s`.
    Python's own SIGINT handler is put in place first: `interrupt_main` does nothing while SIGINT is ignored, and an
    earlier test in the same process (a library that starts helper processes) may have left it so."""
    saved = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(after_s, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            D.run_workers(D.sleeping_worker, 2, args=(60,), backend="gloo", timeout=60)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, saved)
    _assert_nothing_left()


def test_keyboard_interrupt_stops_everything():
    _interrupted_run(4.0)


@pytest.mark.parametrize("ws, match", [(0, r"world_size=0 must be at least 1"),
                                       (-2, r"world_size=-2 must be at least 1"),
                                       (2.0, r"world_size=2.0 must be a whole number"),
                                       (10**4, r"world_size=10000 is more than this machine can run with gloo: "
                                               r"at most \d+")])
def test_bad_world_size(ws, match):
    with pytest.raises(ValueError, match=match):
        D.run_workers(D.hello_worker, ws, backend="gloo")


def test_bad_backend_and_timeout_and_worker():
    with pytest.raises(ValueError, match=r"backend='mpi' is not supported"):
        D.run_workers(D.hello_worker, 2, backend="mpi")
    with pytest.raises(ValueError, match=r"timeout=0 must be a finite number > 0 \(seconds\)"):
        D.run_workers(D.hello_worker, 2, backend="gloo", timeout=0)
    with pytest.raises(ValueError, match=r"cannot import it"):
        D.run_workers(lambda rank, ws: rank, 2, backend="gloo")

    def local(rank, ws):
        return rank
    with pytest.raises(ValueError, match=r"cannot import it"):
        D.run_workers(local, 2, backend="gloo")


def test_nccl_without_gpu_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("WORKBOOK_FORCE_CPU", "1")
    assert D.default_backend() == "gloo"
    with pytest.raises(ValueError, match=r"backend='nccl' needs CUDA GPUs"):
        D.check_world_size(2, "nccl")


def test_limits_and_ports():
    assert D.max_world_size("gloo") >= 4
    p = D.free_port()
    assert 0 < p < 65536 and not D.port_in_use(p)


def test_torchrun_command():
    assert D.torchrun_command("common.parallel.collectives", 2) == \
        "torchrun --standalone --nproc-per-node=2 -m common.parallel.collectives"
    cmd = D.torchrun_command("common.parallel.collectives", 8, nnodes=2, rdzv_endpoint="node0:29500")
    assert "--nnodes=2" in cmd and "--rdzv-endpoint=node0:29500" in cmd and "--nproc-per-node=8" in cmd
    with pytest.raises(ValueError, match="nproc_per_node=0"):
        D.torchrun_command("x", 0)


def test_tasks_worker_runs_several_workers_in_one_group():
    out = D.run_workers(D.tasks_worker, 2, args=([(D.hello_worker, ()), (D.hello_worker, ())],), backend="gloo")
    assert [len(r) for r in out] == [2, 2]
    assert all(r[0]["pid"] == r[1]["pid"] and r[0]["sum"] == r[1]["sum"] == 3.0 for r in out)  # same processes
    _assert_nothing_left()


def test_a_failing_task_stops_everything():
    tasks = [(D.hello_worker, ()), (D.failing_worker, (0, "second task fails on rank 0"))]
    with pytest.raises(D.WorkerError, match=r"rank 0 of 2 raised ValueError: second task fails on rank 0"):
        D.run_workers(D.tasks_worker, 2, args=(tasks,), backend="gloo", timeout=60)
    _assert_nothing_left()


def test_interrupt_while_ranks_start_stops_everything():
    _interrupted_run(0.5)  # before the ranks have even imported torch
