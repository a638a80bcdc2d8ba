"""The launcher: results by rank, errors with rank, traceback and output, and no process left -- no worker and no
worker's child -- after a success, a crash, a timeout, an interrupt or the parent's death (processes are counted)."""
import _thread
import glob
import multiprocessing
import signal
import socket
import tempfile
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest
import torch.distributed  # noqa: F401  (imported here, so an interrupt in a test lands in the run, not in this import)
import workers as W

from common.core.env import REPO_ROOT
from common.parallel import distributed as D
from common.parallel import torchrun


def _alive(pids) -> list:
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def _with_marker(marker: str) -> list:
    """Live processes whose command line ends with `marker`: the workers' children (`workers.parent_worker`)."""
    return [p.pid for p in psutil.process_iter(["cmdline", "status"])
            if p.info["status"] != psutil.STATUS_ZOMBIE and (p.info["cmdline"] or [""])[-1] == marker]


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((D.HOST, port)) == 0


def _nothing_left(launch: D.Launch, marker: str | None = None, started: bool = True):
    pids = launch.pids
    assert pids, "run_workers did not record its processes"
    assert not _alive(pids), f"worker processes left behind: {_alive(pids)}"
    if marker:
        children = [int(Path(f).read_text()) for f in glob.glob(f"{marker}.*")]
        assert not started or len(children) == len(pids), "the workers' children were not started: nothing tested"
        assert not _alive(children) and not _with_marker(marker), f"children of the workers left: {_alive(children)}"
    assert not _port_open(launch.port), "the rendezvous port is still open"
    assert launch.folder and not Path(launch.folder).exists(), f"the run's folder {launch.folder} is left"
    own = multiprocessing.current_process()._config.get("tempdir")  # this process's, for the fork server's socket
    left = [p for pattern in ("pymp-*", "workbook-*", "tmp*") for p in glob.glob(f"{tempfile.tempdir}/{pattern}")
            if p != own]
    assert not left, f"temporary files of the run left: {left}"


@pytest.fixture
def launch(tmp_path, monkeypatch) -> D.Launch:
    """What a run used, to check that nothing is left; the run's temporary files go under `tmp_path`, where a test
    can see that none is left (other processes' files in the shared /tmp do not count)."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return D.Launch()


@pytest.fixture
def marker(tmp_path) -> str:
    """A unique path: the workers' children carry it on their command line and write their pids next to it."""
    return str(tmp_path / f"child-{uuid.uuid4().hex}")


def test_results_by_rank_with_their_output(launch):
    for name in ("workbook-ranks-999999999-abc", "workbook-999999999-abc"):  # of a parent that is gone: a killed kernel
        Path(tempfile.tempdir, name).mkdir()
    out = D.run_workers(W.hello_worker, 3, backend="gloo", launch=launch)
    assert [o["rank"] for o in out] == [0, 1, 2]
    assert all(o["sum"] == 6.0 and o["world_size"] == 3 and o["backend"] == "gloo" for o in out)
    assert len({o["pid"] for o in out}) == 3
    assert [line.strip() for line in out.output] == [f"hello from rank {r}" for r in range(3)]
    _nothing_left(launch)


def test_a_rank_server_started_ahead_brings_its_imports_and_one_running_is_left_alone(launch):
    from multiprocessing import forkserver
    with pytest.raises(ValueError, match="modules: 'no_such_module_x' is not an importable module name"):
        D.start_rank_server("no_such_module_x")
    forkserver._forkserver._stop()  # a fresh server for this test; later runs fork from it
    assert D.start_rank_server("email.mime.text") is True
    assert D.start_rank_server("json.tool") is False  # one runs (importing still, in the background)
    names = ["email.mime.text", "json.tool"]
    assert D.run_workers(W.modules_worker, 2, args=(names,), backend="gloo", launch=launch) == [[True, False]] * 2
    _nothing_left(launch)


def test_worker_exception_names_rank_traceback_and_output(launch):
    with pytest.raises(D.WorkerError, match=r"rank 2 of 3 raised ValueError: bad input on rank 2") as info:
        D.run_workers(W.failing_worker, 3, args=(2, "bad input on rank 2"), backend="gloo", timeout=60,
                      launch=launch)
    err = info.value
    assert err.rank == 2 and err.exc_type == "ValueError" and isinstance(err.__cause__, ValueError)
    assert "failing_worker" in str(err) and "Traceback" in err.worker_traceback
    assert "rank 2 is about to fail" in err.output and "rank 2 is about to fail" in str(err)
    _nothing_left(launch)


def test_a_crash_kills_the_workers_and_their_children(marker, launch):
    with pytest.raises(D.WorkerError, match=r"rank 0 of 2 exited with code 9 without reporting"):
        D.run_workers(W.parent_worker, 2, args=(marker, "crash"), backend="gloo", timeout=60, launch=launch)
    _nothing_left(launch, marker)


def test_timeout_stops_everything(marker, launch):
    with pytest.raises(TimeoutError, match=r"did not finish within timeout=4 s"):
        D.run_workers(W.parent_worker, 2, args=(marker, "sleep"), backend="gloo", timeout=4, launch=launch)
    _nothing_left(launch, marker)


def _interrupted_run(after_s: float | None, marker: str, launch: D.Launch, started: bool = True) -> None:
    """A run interrupted (KeyboardInterrupt, the notebook's stop button) after `after_s`, or (None) once every rank
    has started its child and gone to sleep in the worker. Python's own SIGINT handler is put in place first:
    `interrupt_main` does nothing while SIGINT is ignored, as an earlier test may leave it."""
    saved = signal.signal(signal.SIGINT, signal.default_int_handler)
    stop = threading.Event()

    def interrupt():
        if after_s is not None:
            stop.wait(after_s)
        else:
            deadline = time.monotonic() + 60
            while len(glob.glob(f"{marker}.*")) < 2 and time.monotonic() < deadline and not stop.wait(0.05):
                pass
            stop.wait(0.3)  # the ranks are past writing their children's pids: asleep in the worker
        if not stop.is_set():
            _thread.interrupt_main()

    timer = threading.Thread(target=interrupt, daemon=True)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            D.run_workers(W.parent_worker, 2, args=(marker, "sleep"), backend="gloo", timeout=60, launch=launch)
    finally:
        stop.set()
        timer.join()
        signal.signal(signal.SIGINT, saved)
    _nothing_left(launch, marker, started)


def test_keyboard_interrupt_stops_everything(marker, launch):
    _interrupted_run(None, marker, launch)  # while the ranks run (it used to wait a fixed 6 s for them to start)


def test_interrupt_while_ranks_start_stops_everything(marker, launch):
    _interrupted_run(0.05, marker, launch, started=False)  # before the ranks have even started


def test_a_killed_parent_takes_its_ranks_with_it(marker):
    """PR_SET_PDEATHSIG: the parent (a notebook kernel) killed with SIGKILL; its ranks must not outlive it."""
    script = Path(marker + ".py")  # a script, guarded: each rank imports it again, as multiprocessing does
    script.write_text(f"import sys; sys.path[:0] = [{str(REPO_ROOT)!r}, {str(REPO_ROOT / 'tests')!r}]\n"
                      f"import workers\nfrom common.parallel.distributed import run_workers\n\n"
                      f"if __name__ == '__main__':\n"
                      f"    run_workers(workers.parent_worker, 2, args=({marker!r}, 'sleep'), backend='gloo', "
                      f"timeout=120)\n")
    parent = subprocess.Popen([sys.executable, str(script)])
    try:
        deadline = time.monotonic() + 90
        while len(_with_marker(marker)) < 2 and time.monotonic() < deadline and parent.poll() is None:
            time.sleep(0.2)
        children = _with_marker(marker)
        assert len(children) == 2, "the ranks did not start"
        ranks = [psutil.Process(c).ppid() for c in children]
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 15
        while _alive(ranks) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(ranks), f"ranks {_alive(ranks)} outlived their killed parent"
    finally:
        parent.kill()
        for pid in _with_marker(marker):  # the ranks' own children are orphaned, not killed: tidy up
            psutil.Process(pid).kill()


@pytest.mark.parametrize("ws, match", [(0, r"world_size=0 must be an integer >= 1"),
                                       (-2, r"world_size=-2 must be an integer >= 1"),
                                       (2.0, r"world_size=2.0 must be an integer >= 1"),
                                       (10**4, r"world_size=10000 is more than this machine can run with gloo: "
                                               r"at most \d+")])
def test_bad_world_size(ws, match):
    with pytest.raises(ValueError, match=match):
        D.run_workers(W.hello_worker, ws, backend="gloo")


def test_bad_backend_and_timeout_and_worker():
    with pytest.raises(ValueError, match=r"backend='mpi' is not supported"):
        D.run_workers(W.hello_worker, 2, backend="mpi")
    with pytest.raises(ValueError, match=r"timeout=0 must be a finite number > 0 \(seconds\)"):
        D.run_workers(W.hello_worker, 2, backend="gloo", timeout=0)
    with pytest.raises(ValueError, match=r"cannot import it"):
        D.run_workers(lambda rank, ws: rank, 2, backend="gloo")

    def local(rank, ws):
        return rank
    with pytest.raises(ValueError, match=r"cannot import it"):
        D.run_workers(local, 2, backend="gloo")


def test_nccl_without_gpu_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("WORKBOOK_FORCE_CPU", "1")
    assert D.check_backend(None) == "gloo"
    with pytest.raises(ValueError, match=r"backend='nccl' needs CUDA GPUs"):
        D.check_world_size(2, "nccl")


def test_tasks_worker_runs_several_workers_in_one_group_and_a_success_leaves_no_child(marker, launch):
    tasks = [(W.hello_worker, ()), (W.hello_worker, ()), (W.parent_worker, (marker, "return"))]
    out = D.run_workers(D.tasks_worker, 2, args=(tasks,), backend="gloo", launch=launch)
    assert [len(r) for r in out] == [3, 3] and [r[2] for r in out] == [0, 1]
    assert all(r[0]["pid"] == r[1]["pid"] and r[0]["sum"] == r[1]["sum"] == 3.0 for r in out)  # same processes
    _nothing_left(launch, marker)


def test_a_failing_task_stops_everything(launch):
    tasks = [(W.hello_worker, ()), (W.failing_worker, (0, "second task fails on rank 0"))]
    with pytest.raises(D.WorkerError, match=r"rank 0 of 2 raised ValueError: second task fails on rank 0"):
        D.run_workers(D.tasks_worker, 2, args=(tasks,), backend="gloo", timeout=60, launch=launch)
    _nothing_left(launch)


def test_exit_codes_and_sys_exit_are_named(launch):
    with pytest.raises(D.WorkerError, match=r"rank 0 of 2 exited with code 3 without reporting a result \(os._exit"):
        D.run_workers(W.exiting_worker, 2, args=(0, 3), backend="gloo", timeout=60, launch=launch)
    _nothing_left(launch)
    with pytest.raises(D.WorkerError, match=r"rank 0 of 2 called sys.exit\(3\): exit code 3"):
        D.run_workers(W.sysexit_worker, 2, args=(3,), backend="gloo", timeout=60)


def test_a_script_without_main_guard_is_told_before_anything_starts(tmp_path, monkeypatch):
    """Every rank starts by importing the script that launched it: without the guard it would launch again. (A
    guarded script that launches ranks: the killed-parent test's.)"""
    import types
    script = tmp_path / "launch.py"
    script.write_text("from common.parallel.distributed import run_workers\nrun_workers(print, 2)\n")
    main = types.ModuleType("__main__")
    main.__file__ = str(script)
    monkeypatch.setitem(sys.modules, "__main__", main)
    with pytest.raises(ValueError, match='launch.py has no `if __name__ == "__main__":` guard.*Put the script'):
        D.run_workers(W.hello_worker, 2, backend="gloo")
    script.write_text("from common.parallel.distributed import run_workers\n\nif __name__ == '__main__':\n"
                      "    run_workers(print, 2)\n")
    D.check_main_guard()  # guarded: no complaint


def test_torchrun_command():
    assert torchrun.command("common.parallel.collectives", 2) == \
        "torchrun --standalone --nproc-per-node=2 -m common.parallel.collectives"
    cmd = torchrun.command("common.parallel.collectives", 8, nnodes=2, rdzv_endpoint="node0:29500")
    assert "--nnodes=2" in cmd and "--rdzv-endpoint=node0:29500" in cmd and "--nproc-per-node=8" in cmd
    ids = {part for c in (cmd, torchrun.command("x", 8, nnodes=2)) for part in c.split() if "--rdzv-id=" in part}
    assert len(ids) == 2, "every job needs a rendezvous id of its own"
    assert "--rdzv-id=job7" in torchrun.command("x", 8, nnodes=2, rdzv_id="job7")
    with pytest.raises(ValueError, match="nproc_per_node=0"):
        torchrun.command("x", 0)
