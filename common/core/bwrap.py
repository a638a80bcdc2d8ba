"""Bubblewrap (https://github.com/containers/bubblewrap) and cgroups, as the grader's sandboxes and the hub's learner
servers use them.

A sandbox starts from an empty root: `usr_links()` and `python_roots()` say what of the host it needs to run the
workbook's Python, `etc_files()` writes the few /etc files that name its one user. Run as root, `launcher(uid)`
starts bwrap in a private mount namespace whose `stage()` script first binds every source where the unprivileged
user can reach it (so a workbook or a Python under /root works), then drops to that uid with setpriv. `Cgroup` puts a
sandbox under a memory and a pids limit when the host lets root make cgroups (v2, or v1 hierarchies).
"""
from __future__ import annotations

import os
import shlex
import signal
import sys
import time
from pathlib import Path

SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives",
                "/etc/nsswitch.conf", "/sys/devices/system/cpu")


def python_roots() -> list[Path]:
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


def python_aliases() -> list[tuple[str, str]]:
    """(real folder, path as this process names it) for each interpreter folder reached through a symlink -- a venv
    in /tmp linked into the checkout as .venv: a sandbox's command starts the interpreter by the linked path, so that
    path must exist inside too, bound read-only onto the real folder (wherever the sandbox's own tmpfs would hide it)."""
    out = []
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(sys.executable)):
        p = os.path.abspath(p)
        real = os.path.realpath(p)
        if p != real and not p.startswith("/usr/") and (real, p) not in out:
            out.append((real, p))
    return out


def usr_links() -> list[str]:
    """bwrap arguments for the top-level links into /usr (/bin, /lib, ...), or those folders read-only where they are
    not links; /usr itself is the caller's bind."""
    args = []
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = f"/{name}"
        if os.path.islink(host):
            args += ["--symlink", os.readlink(host), host]
        elif os.path.isdir(host):
            args += ["--ro-bind", host, host]
    return args


def etc_files(folder: Path, user: str, uid: int, home: str, shell: str = "/bin/sh") -> dict[str, Path]:
    """Generated /etc files, written into `folder`: a passwd and group naming only root, the sandbox's user and nobody,
    and hosts with localhost only. {path inside: file}."""
    files = {"passwd": f"root:x:0:0::/:/usr/sbin/nologin\n{user}:x:{uid}:{uid}::{home}:{shell}\n"
                       f"nobody:x:65534:65534::/:/usr/sbin/nologin\n",
             "group": f"root:x:0:\n{user}:x:{uid}:\nnogroup:x:65534:\n",
             "hosts": "127.0.0.1 localhost\n::1 localhost\n"}
    out = {}
    for name, text in files.items():
        path = Path(folder) / name
        path.write_text(text)
        path.chmod(0o644)
        out[f"/etc/{name}"] = path
    return out


def launcher(uid: int, stage_script: str = "", gid: int | None = None) -> list[str]:
    """The command prefix that starts bwrap as an unprivileged user: as root, a private mount namespace runs
    `stage_script` (see `stage`), then setpriv drops to uid/gid (no groups, no capabilities) and execs bwrap;
    otherwise bwrap itself (`uid` is then this user's own)."""
    if os.geteuid() != 0:
        return ["bwrap"]
    gid = uid if gid is None else gid
    drop = f"exec setpriv --reuid={uid} --regid={gid} --clear-groups --inh-caps=-all -- bwrap \"$@\""
    return ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-ec", stage_script + drop, "sh"]


def stage(binds: list[tuple[str, str, bool]], stage_dir: Path) -> tuple[str, list[list[str]]]:
    """For `launcher`: (script, bwrap arguments) binding each (host source, path inside, writable) in order. As root
    the script mounts a small tmpfs at `stage_dir` (created here) and binds every source under it, inside the private
    mount namespace, so the sandbox's user reaches sources it could not traverse to; otherwise no script and the
    sources as they are."""
    root = os.geteuid() == 0
    script = ""
    if root:
        Path(stage_dir).mkdir(mode=0o755)
        script = f"mount -t tmpfs -o mode=0755,size=1m wbstage {shlex.quote(str(stage_dir))}\n"
    args = []
    for i, (src, dst, writable) in enumerate(binds):
        if root:
            target = shlex.quote(str(Path(stage_dir) / str(i)))
            script += (f"{'mkdir' if os.path.isdir(src) else 'touch'} {target}\n"
                       f"mount --bind {shlex.quote(src)} {target}\n")
            src = str(Path(stage_dir) / str(i))
        args.append(["--bind" if writable else "--ro-bind", src, dst])
    return script, args


class Cgroup:
    """As root, a memory and a pids cgroup named `name` (v2 when its controllers are enabled, else the v1
    hierarchies), when the host lets us make them; `paths` is empty otherwise. `enter_script()` is the shell line
    that moves the shell running it (and so everything it starts) into them."""

    def __init__(self, name: str, memory_mb: int, processes: int, base: Path = Path("/sys/fs/cgroup")):
        self.paths: list[Path] = []
        if os.geteuid() != 0:
            return
        try:
            if (base / "cgroup.controllers").exists():
                if {"memory", "pids"} <= set((base / "cgroup.subtree_control").read_text().split()):
                    cg = base / name
                    cg.mkdir()
                    self.paths.append(cg)
                    (cg / "memory.max").write_text(str(memory_mb << 20))
                    (cg / "memory.swap.max").write_text("0")
                    (cg / "pids.max").write_text(str(processes))
                return
            for controller, knob, value in (("memory", "memory.limit_in_bytes", memory_mb << 20),
                                            ("pids", "pids.max", processes)):
                if (base / controller / knob).exists():
                    cg = base / controller / name
                    cg.mkdir()
                    self.paths.append(cg)
                    (cg / knob).write_text(str(value))
        except OSError:
            self.remove()

    def kinds(self) -> list[str]:
        """The controllers in force: 'memory', 'pids' (both for a v2 cgroup)."""
        if any((p / "memory.max").exists() for p in self.paths):
            return ["memory", "pids"]
        return [p.parent.name for p in self.paths]

    def enter_script(self) -> str:
        return "".join(f"echo $$ > {shlex.quote(str(cg / 'cgroup.procs'))}\n" for cg in self.paths)

    def out_of_memory(self) -> bool:
        """True when the memory limit was hit (v1 failcnt, v2 oom_kill events)."""
        for cg in self.paths:
            try:
                if (cg / "memory.failcnt").exists() and int((cg / "memory.failcnt").read_text()) > 0:
                    return True
                if (cg / "memory.events").exists() and "oom_kill 0" not in (cg / "memory.events").read_text():
                    return True
            except (OSError, ValueError):
                pass
        return False

    def pids(self) -> list[int]:
        found = set()
        for cg in self.paths:
            try:
                found |= {int(p) for p in (cg / "cgroup.procs").read_text().split()}
            except (OSError, ValueError):
                pass
        return sorted(found)

    def kill(self) -> None:
        """SIGKILL every process in the cgroups until none is left (at most 2.5 s)."""
        for _ in range(50):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)

    def remove(self) -> None:
        for cg in self.paths:
            for _ in range(40):
                try:
                    cg.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)
        self.paths = []


def wait_for_uid(uid: int, seconds: float = 5.0) -> list[int]:
    """Kill every process of `uid` until none is left (a PID namespace's teardown is asynchronous); the PIDs that were
    still there."""
    import psutil
    seen = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        left = [p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uid]
        if not left:
            break
        for p in left:
            seen.append(p.pid)
            try:
                p.kill()
            except psutil.Error:
                pass
        time.sleep(0.05)
    return sorted(set(seen))
