"""The sandbox one learner notebook runs in: bubblewrap (Debian's `bubblewrap`, https://github.com/containers/bubblewrap).

Each notebook runs as an unprivileged user in new user, PID, network, IPC, UTS and mount namespaces: its own /proc
(the host's processes are invisible), no network but its own loopback, a read-only root holding only /usr, the Python
that runs the grader, the workbook's `common/` and `data/` (read-only) and a few files of /etc; a fresh tmpfs home,
/tmp, /dev/shm and work folder (each size-capped), and a minimal /dev. Nested user namespaces are disabled, so the
notebook cannot gain the capabilities a remount would need. When the sandbox's first process ends, the kernel ends
every process in the PID namespace (a detached `setsid` child too).

Run as root, the grader starts each sandbox as its own uid (the first free from SANDBOX_UID + slot, no home, no groups), binds the
sources through a private mount namespace (so a Python under /root works), and puts the sandbox in a memory and a
pids cgroup when the host lets it. The runner inside lowers its resource limits before anything of the learner
runs (RLIMIT_DATA/AS, CPU, NPROC, FSIZE, NOFILE; see `Limits`).
"""
from __future__ import annotations

import fcntl
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from common.core import bwrap
from common.core.env import REPO_ROOT

SANDBOX_UID = 64100  # root only: slot k runs as uid/gid SANDBOX_UID + k (outside the usual user and subuid ranges)
INSIDE_UID = 1000
HOME = "/home/learner"
INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: `sudo apt-get install -y bubblewrap`; `make grade` installs it "
                "when run as root), or pass --unsafe-no-sandbox to grade without isolation (only for notebooks you "
                "trust)")


@dataclass(frozen=True)
class Limits:
    """Per-notebook limits. memory_mb bounds each process's data (RLIMIT_DATA, 0.8 x) and address space (2 x + 2 GiB),
    and, as root with cgroups, the whole sandbox; processes counts threads too (RLIMIT_NPROC, and a pids cgroup)."""
    memory_mb: int = 4096
    cpu_s: int = 900
    # the most tasks (processes and threads) a solution's sandbox held, measured by grading every solution as root
    # (2026-12-06, 2-core VM): 43 (lab 07's gloo ranks), 39 (labs 08 and 11), 20-24 for the rest; 3x that, so a
    # fork bomb is stopped after about 100 forks, not 500
    processes: int = 128
    file_size_mb: int = 256
    open_files: int = 4096
    tmpfs_mb: int = 512  # each of /tmp, /dev/shm, home and the work folder

    def rlimits(self) -> dict:
        mb = 1 << 20
        return {"data": int(0.8 * self.memory_mb) * mb, "memory": (2 * self.memory_mb + 2048) * mb,
                "cpu": self.cpu_s, "processes": self.processes, "file_size": self.file_size_mb * mb,
                "open_files": self.open_files, "core": 0}


@functools.lru_cache(maxsize=None)
def unavailable() -> str:
    """'' when sandboxes can be made here; otherwise why not (for the refusal)."""
    if not sys.platform.startswith("linux"):
        return f"the sandbox needs Linux (this is {sys.platform})"
    if not shutil.which("bwrap"):
        return "bubblewrap (bwrap) is not installed"
    if os.geteuid() == 0:
        missing = [t for t in ("unshare", "setpriv", "mount") if not shutil.which(t)]
        if missing:
            return f"{', '.join(missing)} (util-linux) not found"
    probe = subprocess.run(_launcher(0, None) + ["--unshare-user", "--unshare-pid", "--unshare-net", "--disable-userns",
                                                  "--ro-bind", "/", "/", "--proc", "/proc", "true"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode:
        why = (probe.stderr.strip().splitlines() or ["no message"])[-1]
        return (f"bubblewrap cannot create user namespaces here ({why}); on Ubuntu 24.04 allow them with "
                f"`sudo sysctl kernel.apparmor_restrict_unprivileged_userns=0`, in a container run it with "
                f"--security-opt seccomp=unconfined or as a VM")
    return ""


def _launcher(slot: int, stage_script: str | None, uid: int | None = None) -> list[str]:
    """The command prefix that starts bwrap as the sandbox's unprivileged user (root: uid SANDBOX_UID + slot)."""
    return bwrap.launcher(SANDBOX_UID + slot if uid is None else uid, stage_script or "")


UID_LOCKS = Path(tempfile.gettempdir()) / "workbook-sandbox-uids"


def claim_uid(slot: int) -> tuple[int, int]:
    """(uid, lock fd): the first sandbox uid from SANDBOX_UID + slot that no other grader holds. Two graders at once
    (two `make grade`, a hub's collect beside a test run) would otherwise share slot 0's uid: its process limit counts
    both sandboxes, and each one's clean-up kills every process of the uid, the other's notebook included."""
    UID_LOCKS.mkdir(mode=0o700, exist_ok=True)
    for uid in range(SANDBOX_UID + slot, SANDBOX_UID + slot + 1024):
        fd = os.open(UID_LOCKS / str(uid), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return uid, fd
        except BlockingIOError:
            os.close(fd)
    raise RuntimeError(f"no free sandbox uid from {SANDBOX_UID + slot}: 1,024 graders at once?")


class Sandbox:
    """One sandbox for one notebook: `start(argv, env)` runs argv inside it (stdin/stdout pipes), `close()` ends every
    process in it and removes what it left on the host."""

    def __init__(self, slot: int, limits: Limits, threads: int = 1):
        self.slot, self.limits, self.threads = slot, limits, threads
        self.proc: subprocess.Popen | None = None
        self.cgroup: bwrap.Cgroup | None = None
        self._tmp = Path(tempfile.mkdtemp(prefix="workbook-sandbox-"))
        self._tmp.chmod(0o755)
        self.uid, self._uid_lock = os.geteuid(), None  # as root, start() claims a free sandbox uid

    def _binds(self) -> list[tuple[str, str, bool]]:
        """(host source, path inside, writable) of every bind, in mount order (build/machine after build's tmpfs)."""
        binds = [("/usr", "/usr")] + [(str(p), str(p)) for p in bwrap.python_roots()]
        binds += [(str(REPO_ROOT / d), str(REPO_ROOT / d)) for d in ("common", "data")]
        binds += bwrap.python_aliases()
        binds += [(p, p) for p in bwrap.SYSTEM_FILES if os.path.exists(p)]
        binds += [(str(src), dst) for dst, src in bwrap.etc_files(self._tmp, "learner", INSIDE_UID, HOME).items()]
        return [(src, dst, False) for src, dst in binds]

    def command(self, argv: list[str], env: dict) -> list[str]:
        """The full command line: launcher, bwrap's namespaces and mounts, the environment, then argv."""
        machine = REPO_ROOT / "build" / "machine"
        binds = self._binds() + ([(str(machine), str(machine), False)] if machine.is_dir() else [])
        stage, mounts = bwrap.stage(binds, self._tmp / "stage")
        if self.cgroup is not None:
            stage += self.cgroup.enter_script()
        bw = mounts[0] + bwrap.usr_links()  # /usr, then the links into it
        size = str(self.limits.tmpfs_mb << 20)
        # /tmp and home first: a workbook (or its Python) that lives under either is bound on top of them, not hidden
        for path, perms in (("/tmp", "1777"), (HOME, "0700")):
            bw += ["--perms", perms, "--size", size, "--tmpfs", path]
        for m in mounts[1:len(mounts) - machine.is_dir()]:
            bw += m
        for path in (REPO_ROOT / "labs", REPO_ROOT / "build"):
            bw += ["--perms", "0755", "--size", size, "--tmpfs", str(path)]
        if machine.is_dir():  # this machine's measured ceilings, read-only, on top of build's tmpfs
            bw += mounts[-1]
        bw += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", size, "--tmpfs", "/dev/shm",
               "--remount-ro", "/", "--chdir", str(REPO_ROOT / "labs"), "--clearenv"]
        for k, v in env.items():
            bw += ["--setenv", k, v]
        flags = ["--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
                 "--unshare-cgroup-try", "--disable-userns", "--die-with-parent", "--new-session",
                 "--uid", str(INSIDE_UID), "--gid", str(INSIDE_UID), "--hostname", "sandbox"]
        return _launcher(self.slot, stage, self.uid) + flags + bw + ["--"] + argv

    def environment(self) -> dict:
        venv_bin = os.path.dirname(sys.executable)
        threads = str(max(1, self.threads))
        return {"PATH": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin", "HOME": HOME, "USER": "learner", "LANG": "C.UTF-8",
                "PYTHONPATH": str(REPO_ROOT), "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0",
                "WORKBOOK_HEADLESS": "1", "WORKBOOK_PROFILE": "quick", "WORKBOOK_FORCE_CPU": "1",
                "WORKBOOK_RESULTS": "/tmp/results.jsonl", "MPLBACKEND": "Agg", "MPLCONFIGDIR": "/tmp/mpl",
                "JUPYTER_RUNTIME_DIR": "/tmp/jupyter", "JUPYTER_CONFIG_DIR": "/tmp/jupyter-config",
                "IPYTHONDIR": "/tmp/ipython", "TMPDIR": "/tmp", "TRITON_CACHE_DIR": "/tmp/triton",
                "TORCHINDUCTOR_CACHE_DIR": "/tmp/inductor", "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}

    def start(self, argv: list[str]) -> subprocess.Popen:
        if os.geteuid() == 0:
            self.uid, self._uid_lock = claim_uid(self.slot)
            name = f"workbook-grade-{os.getpid()}-{self.slot}-{self._tmp.name[-8:]}"
            self.cgroup = bwrap.Cgroup(name, self.limits.memory_mb, self.limits.processes)
        cmd = self.command(argv, self.environment())
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True)
        return self.proc

    def out_of_memory(self) -> bool:
        """True when the cgroup's memory limit was hit (v1 failcnt, v2 oom_kill events)."""
        return self.cgroup is not None and self.cgroup.out_of_memory()

    def close(self) -> None:
        """End every process of the sandbox (bwrap's PID namespace, the cgroups), then remove the host leftovers."""
        if self.proc is not None:
            for stream in (self.proc.stdin,):
                try:
                    stream.close()
                except OSError:
                    pass
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.proc.wait()
            for stream in (self.proc.stdout, self.proc.stderr):
                stream.close()
        if self.cgroup is not None:
            self.cgroup.kill()
            self.cgroup.remove()
        if self._uid_lock is not None:
            bwrap.wait_for_uid(self.uid)
            os.close(self._uid_lock)  # the uid is free for another sandbox once none of its processes is left
            self._uid_lock = None
        shutil.rmtree(self._tmp, ignore_errors=True)


def limits_json(limits: Limits) -> str:
    return json.dumps(limits.rlimits())


def describe(limits: Limits) -> str:
    return ", ".join(f"{k}={v}" for k, v in asdict(limits).items())
