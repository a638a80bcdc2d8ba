"""One learner's Jupyter server, started in a bubblewrap sandbox of its own (`common.core.bwrap`).

What the learner's server sees: the workbook at its usual path, with the learner's own `~/workbook/` in its place
(their `labs/` and `build/`), the instructor's `common/` and `data/` read-only on top, and no `solutions/`; their
home; the shared venv and the system read-only; its own /tmp, /dev/shm, /proc (its own processes only) and IPC; the
box's network (the proxy reaches the server on 127.0.0.1). No other learner's home exists in that view, and as root the
server runs as the learner's own uid (homes 0700), so neither the view nor the permissions let one learner read
another's files. Its share of the box: threads through the environment, memory through a memory cgroup (as root where
the host lets us make one) or else RLIMIT_DATA per process, and its GPU device's /dev node only.
"""
from __future__ import annotations

import glob
import os
import resource
import sys
from dataclasses import dataclass
from pathlib import Path

from common.core import bwrap
from common.core.env import REPO_ROOT
from common.core.hub.accounts import Learner
from common.core.hub.share import Device, thread_environment

TMPFS_MB = 1024  # /tmp and /dev/shm, each (their pages count as the learner's memory)
PROCESSES = 4096  # the pids cgroup's limit: a fork bomb stops there
# read-only for a shell and JupyterLab inside (each when the host has it)
ETC = ("/etc/bash.bashrc", "/etc/profile", "/etc/inputrc", "/etc/terminfo", "/etc/mime.types", "/etc/ssl",
       "/etc/ca-certificates", "/etc/resolv.conf", "/etc/fonts")
READ_ONLY_DIRS = ("common", "data")


@dataclass(frozen=True)
class Share:
    threads: int
    memory_mb: int
    device: Device | None = None
    profile: str = "auto"


def home_inside(who: Learner) -> str:
    return f"/home/{who.name}"


def mountpoints() -> list[str]:
    """Folders of the learner's workbook where read-only binds land (created beforehand, owned by the learner)."""
    points = list(READ_ONLY_DIRS)
    for root in bwrap.python_roots():  # a venv inside the checkout (.venv)
        if REPO_ROOT in root.parents and root.parent == REPO_ROOT:
            points.append(root.name)
    return points


def gpu_nodes(device: Device | None) -> list[str]:
    """The /dev nodes a server with `device` needs: the driver's control nodes, its GPU's node (all GPUs' when the
    GPU is not known) and the MIG capability nodes."""
    if device is None:
        return []
    shared = [p for p in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset",
                          "/dev/nvidia-caps") if os.path.exists(p)]
    gpus = [f"/dev/nvidia{device.gpu}"] if device.gpu is not None else sorted(glob.glob("/dev/nvidia[0-9]*"))
    return shared + [p for p in gpus if os.path.exists(p)]


def binds(who: Learner, etc: dict[str, Path]) -> list[tuple[str, str, bool]]:
    """(host source, path inside, writable) in mount order: home, the learner's workbook in the checkout's place,
    then read-only the instructor's common/ and data/, the Python, /sys and /etc files."""
    out = [(str(who.home), home_inside(who), True), (str(who.workbook), str(REPO_ROOT), True)]
    out += [(str(REPO_ROOT / d), str(REPO_ROOT / d), False) for d in READ_ONLY_DIRS]
    out += [(str(p), str(p), False) for p in bwrap.python_roots()]
    system = [p for p in bwrap.SYSTEM_FILES if not p.startswith("/sys/")]  # /sys is bound whole
    out += [(p, p, False) for p in ["/sys", *ETC, *system] if os.path.exists(p)]
    out += [(str(src), dst, False) for dst, src in etc.items()]
    return out


def command(who: Learner, argv: list[str], share: Share, tmp: Path, cgroup: bwrap.Cgroup | None = None) -> list[str]:
    """The command line that starts argv (the Jupyter server) in the learner's sandbox; `tmp` (a fresh folder the hub
    owns, mode 0755) holds the generated /etc files and, as root, the staging mount point."""
    etc = bwrap.etc_files(tmp, who.name, who.uid, home_inside(who), "/bin/bash")
    stage, mounts = bwrap.stage([("/usr", "/usr", False)] + binds(who, etc), tmp / "stage")
    if cgroup is not None:
        stage += cgroup.enter_script()
    size = str(TMPFS_MB << 20)
    args = mounts[0] + bwrap.usr_links()
    args += ["--perms", "1777", "--size", size, "--tmpfs", "/tmp"]  # first: a checkout under /tmp goes on top of it
    for m in mounts[1:]:
        args += m
    for node in gpu_nodes(share.device):
        args += ["--dev-bind", node, node]
    args = ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", size, "--tmpfs", "/dev/shm"] + args
    args += ["--remount-ro", "/", "--chdir", home_inside(who)]
    flags = ["--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
             "--disable-userns", "--die-with-parent", "--new-session", "--hostname", "workbook"]
    return bwrap.launcher(who.uid, stage, who.gid) + flags + args + ["--"] + argv


def environment(who: Learner, share: Share, memory_note: str) -> dict[str, str]:
    """What the learner's server (and every kernel it starts) gets besides JupyterHub's own variables."""
    env = {"USER": who.name, "LOGNAME": who.name, "HOME": home_inside(who), "SHELL": "/bin/bash",
           "PATH": f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
           "PYTHONHASHSEED": "0", "WORKBOOK_HUB_LEARNER": who.name, "WORKBOOK_HUB_MEMORY": memory_note,
           **thread_environment(share.threads)}
    if share.device is not None:
        env["CUDA_VISIBLE_DEVICES"] = share.device.visible
    if share.profile != "auto":
        env["WORKBOOK_PROFILE"] = share.profile
    return env


def rlimit_preexec(memory_mb: int | None):
    """A preexec_fn for Popen: RLIMIT_DATA (soft = hard) of memory_mb, inherited by every process of the server; a
    no-op for None (a memory cgroup bounds the server instead)."""
    def preexec():
        if memory_mb is not None:
            limit = memory_mb << 20
            resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    return preexec
