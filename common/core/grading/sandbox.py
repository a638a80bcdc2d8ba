"""The sandbox one learner notebook runs in: bubblewrap (Debian's `bubblewrap`, https://github.com/containers/bubblewrap).

Each notebook runs as an unprivileged user in new user, PID, network, IPC, UTS and mount namespaces: its own /proc
(the host's processes are invisible), no network but its own loopback, a read-only root holding only /usr, the Python
that runs the grader, the workbook's `common/` and `data/` (read-only) and a few files of /etc; a fresh tmpfs home,
/tmp, /dev/shm and work folder (each size-capped), and a minimal /dev. Nested user namespaces are disabled, so the
notebook cannot gain the capabilities a remount would need. When the sandbox's first process ends, the kernel ends
every process in the PID namespace (a detached `setsid` child too).

Run as root, the grader starts each sandbox as its own uid (SANDBOX_UID + slot, no home, no groups), binds the
sources through a private mount namespace (so a Python under /root works), and puts the sandbox in a memory and a
pids cgroup when the host lets it. The runner inside lowers its resource limits before anything of the learner
runs (RLIMIT_DATA/AS, CPU, NPROC, FSIZE, NOFILE; see `Limits`).
"""
from __future__ import annotations

import functools
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

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
    bwrap = shutil.which("bwrap")
    if not bwrap:
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


def _launcher(slot: int, stage_script: str | None) -> list[str]:
    """The command prefix that starts bwrap as an unprivileged user (root: via a private mount namespace that binds
    the sources where the sandbox user can reach them, then setpriv; otherwise bwrap itself)."""
    if os.geteuid() != 0:
        return ["bwrap"]
    uid = SANDBOX_UID + slot
    drop = f"exec setpriv --reuid={uid} --regid={uid} --clear-groups --inh-caps=-all -- bwrap \"$@\""
    script = (stage_script or "") + drop
    return ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-ec", script, "sh"]


def _python_roots() -> list[Path]:
    """Folders the interpreter and its packages live in (the venv and the Python it was made from)."""
    roots = []
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))):
        p = Path(os.path.realpath(p))
        if str(p).startswith("/usr/") or p == Path("/usr"):
            continue
        if p.name == "bin":
            p = p.parent
        if not any(p == r or r in p.parents for r in roots):
            roots = [r for r in roots if p not in r.parents] + [p]
    return roots


def _python_aliases() -> list[tuple[str, str]]:
    """(real folder, path as the grader names it) for each interpreter folder reached through a symlink -- a venv in
    /tmp linked into the checkout as .venv: the runner is started by the linked path, so that path must exist inside
    the sandbox too, bound read-only onto the real folder (wherever the sandbox's own tmpfs would hide it)."""
    out = []
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(sys.executable)):
        p = os.path.abspath(p)
        real = os.path.realpath(p)
        if p != real and not p.startswith("/usr/") and (real, p) not in out:
            out.append((real, p))
    return out


def _etc_files(folder: Path) -> dict[str, Path]:
    """Generated /etc files: a passwd and group naming the sandbox user, and hosts with localhost only."""
    files = {"passwd": f"root:x:0:0::/:/usr/sbin/nologin\nlearner:x:{INSIDE_UID}:{INSIDE_UID}::{HOME}:/bin/sh\n"
                       f"nobody:x:65534:65534::/:/usr/sbin/nologin\n",
             "group": f"root:x:0:\nlearner:x:{INSIDE_UID}:\nnogroup:x:65534:\n",
             "hosts": "127.0.0.1 localhost\n::1 localhost\n"}
    out = {}
    for name, text in files.items():
        path = folder / name
        path.write_text(text)
        path.chmod(0o644)
        out[f"/etc/{name}"] = path
    return out


SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives",
                "/etc/nsswitch.conf", "/sys/devices/system/cpu")


class Sandbox:
    """One sandbox for one notebook: `start(argv, env)` runs argv inside it (stdin/stdout pipes), `close()` ends every
    process in it and removes what it left on the host."""

    def __init__(self, slot: int, limits: Limits, threads: int = 1):
        self.slot, self.limits, self.threads = slot, limits, threads
        self.proc: subprocess.Popen | None = None
        self.cgroups: list[Path] = []
        self._tmp = Path(tempfile.mkdtemp(prefix="workbook-sandbox-"))
        self._tmp.chmod(0o755)

    def _binds(self) -> list[tuple[str, str]]:
        """(host source, path inside) of every read-only bind, in mount order (build/machine after build's tmpfs)."""
        binds = [("/usr", "/usr")] + [(str(p), str(p)) for p in _python_roots()]
        binds += [(str(REPO_ROOT / d), str(REPO_ROOT / d)) for d in ("common", "data")]
        binds += _python_aliases()
        binds += [(p, p) for p in SYSTEM_FILES if os.path.exists(p)]
        binds += [(str(src), dst) for dst, src in _etc_files(self._tmp).items()]
        return binds

    def command(self, argv: list[str], env: dict) -> list[str]:
        """The full command line: launcher, bwrap's namespaces and mounts, the environment, then argv."""
        root = os.geteuid() == 0
        stage_dir = self._tmp / "stage"
        stage = f"mount -t tmpfs -o mode=0755,size=1m wbstage {shlex.quote(str(stage_dir))}\n" if root else ""
        if root:
            stage_dir.mkdir(mode=0o755)
        machine = REPO_ROOT / "build" / "machine"
        binds = self._binds() + ([(str(machine), str(machine))] if machine.is_dir() else [])
        mounts = []
        for i, (src, dst) in enumerate(binds):
            if root:  # bind through the private namespace, where the sandbox user can reach it
                target = shlex.quote(str(stage_dir / str(i)))
                stage += f"{'mkdir' if os.path.isdir(src) else 'touch'} {target}\nmount --bind {shlex.quote(src)} {target}\n"
                src = str(stage_dir / str(i))
            mounts.append(["--ro-bind", src, dst])
        for cg in self.cgroups:
            stage += f"echo $$ > {shlex.quote(str(cg / 'cgroup.procs'))}\n"
        bw = mounts[0]  # /usr
        for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            host = f"/{name}"
            if os.path.islink(host):
                bw += ["--symlink", os.readlink(host), host]
            elif os.path.isdir(host):
                bw += ["--ro-bind", host, host]
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
        return _launcher(self.slot, stage) + flags + bw + ["--"] + argv

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

    def _make_cgroups(self) -> None:
        """As root, a memory and a pids cgroup (v2, or v1 hierarchies) for this sandbox, when the host allows it."""
        if os.geteuid() != 0:
            return
        name = f"workbook-grade-{os.getpid()}-{self.slot}-{self._tmp.name[-8:]}"
        base = Path("/sys/fs/cgroup")
        settings = {"memory": ("memory.limit_in_bytes", str(self.limits.memory_mb << 20)),
                    "pids": ("pids.max", str(self.limits.processes))}
        v2 = base / "cgroup.controllers"
        try:
            if v2.exists():
                enabled = (base / "cgroup.subtree_control").read_text().split()
                if {"memory", "pids"} <= set(enabled):
                    cg = base / name
                    cg.mkdir()
                    self.cgroups.append(cg)
                    (cg / "memory.max").write_text(str(self.limits.memory_mb << 20))
                    (cg / "memory.swap.max").write_text("0")
                    (cg / "pids.max").write_text(str(self.limits.processes))
                return
            for controller, (knob, value) in settings.items():
                if (base / controller / knob).exists():
                    cg = base / controller / name
                    cg.mkdir()
                    self.cgroups.append(cg)
                    (cg / knob).write_text(value)
        except OSError:
            self._remove_cgroups()

    def start(self, argv: list[str]) -> subprocess.Popen:
        self._make_cgroups()
        cmd = self.command(argv, self.environment())
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True)
        return self.proc

    def out_of_memory(self) -> bool:
        """True when the cgroup's memory limit was hit (v1 failcnt, v2 oom_kill events)."""
        for cg in self.cgroups:
            try:
                if (cg / "memory.failcnt").exists() and int((cg / "memory.failcnt").read_text()) > 0:
                    return True
                if (cg / "memory.events").exists() and "oom_kill 0" not in (cg / "memory.events").read_text():
                    return True
            except (OSError, ValueError):
                pass
        return False

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
        for cg in self.cgroups:
            self._kill_cgroup(cg)
        self._remove_cgroups()
        if os.geteuid() == 0:
            self._wait_for_uid(SANDBOX_UID + self.slot)
        shutil.rmtree(self._tmp, ignore_errors=True)

    @staticmethod
    def _wait_for_uid(uid: int, seconds: float = 5.0) -> None:
        """Until no process of the sandbox's own uid is left (the PID namespace's teardown is asynchronous)."""
        import time
        import psutil
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            left = [p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uid]
            if not left:
                return
            for p in left:
                try:
                    p.kill()
                except psutil.Error:
                    pass
            time.sleep(0.05)

    @staticmethod
    def _kill_cgroup(cg: Path) -> None:
        import time
        for _ in range(50):
            try:
                pids = [int(p) for p in (cg / "cgroup.procs").read_text().split()]
            except (OSError, ValueError):
                return
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)

    def _remove_cgroups(self) -> None:
        import time
        for cg in self.cgroups:
            for _ in range(40):
                try:
                    cg.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)
        self.cgroups = []


def limits_json(limits: Limits) -> str:
    return json.dumps(limits.rlimits())


def describe(limits: Limits) -> str:
    return ", ".join(f"{k}={v}" for k, v in asdict(limits).items())
