"""The processes and the folder of one launch of ranks, and their end (used by `common.parallel.distributed`).

`run_dir()` makes the launch's folder, `workbook-ranks-<pid>-*` in the temporary directory: the ranks' logs, and their
temporary directory (TMPDIR, `tempfile` and multiprocessing's `pymp-*` point into it), so that whatever a rank leaves
there -- it may die by os._exit or SIGKILL, before any clean-up -- goes with the folder. It first removes the folders
of launches whose parent process is gone (a killed notebook kernel cannot clean up after itself).
`server_dir()` does the same for the parent's own multiprocessing folder (the fork server's socket), so a killed
kernel leaves nothing that the next launch does not remove. `kill(ctx)` ends every rank's process group and waits
until no member is alive.
"""
from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import signal
import tempfile
import time

PREFIX, SERVER = "workbook-ranks-", "workbook-"  # <prefix><pid of the parent>-<random>


def run_dir(prefix: str = PREFIX) -> str:
    """A new folder for one launch; stale ones (of processes that are gone) removed first."""
    import psutil
    for path in glob.glob(os.path.join(tempfile.gettempdir(), SERVER + "*")):
        owner = re.match(r"workbook-(?:ranks-)?(\d+)-", os.path.basename(path))
        if owner and not psutil.pid_exists(int(owner.group(1))):
            shutil.rmtree(path, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")


def server_dir() -> None:
    """This process's multiprocessing folder (where the fork server's socket goes): one of ours, removed at exit."""
    import multiprocessing
    from multiprocessing import util
    config = multiprocessing.current_process()._config
    if config.get("tempdir") is None and len(tempfile.gettempdir()) < 60:  # a socket's path has at most 107 bytes
        config["tempdir"] = run_dir(SERVER)
        util.Finalize(None, shutil.rmtree, args=[config["tempdir"], True], exitpriority=-100)


def use_run_dir(path: str) -> None:
    """Inside a rank: its temporary files go into the launch's folder."""
    import multiprocessing
    tmp = os.path.join(path, "tmp")
    os.makedirs(tmp, exist_ok=True)
    os.environ["TMPDIR"] = tempfile.tempdir = tmp
    multiprocessing.current_process()._config.pop("tempdir", None)  # the fork server's pymp-* is not ours


def kill(ctx) -> None:
    """SIGKILL every worker's process group (the worker and its children, orphaned ones too) and the worker; join
    them, and wait (10 s at most) until no member of those groups is alive -- a zombie is not."""
    import psutil
    groups, deadline = [p.pid for p in ctx.processes] if ctx else [], time.monotonic() + 10
    for p in ctx.processes if ctx else ():
        for end in (os.killpg, os.kill):
            with contextlib.suppress(OSError):  # no such group (not made yet) or process (gone already)
                end(p.pid, signal.SIGKILL)
        p.join(10)
    while time.monotonic() < deadline and any(_member(q, groups) for q in psutil.process_iter(["status"])):
        time.sleep(0.01)


def _member(proc, groups: list) -> bool:
    with contextlib.suppress(Exception):  # gone meanwhile, or not ours to look at
        return proc.info["status"] != "zombie" and os.getpgid(proc.pid) in groups
    return False
