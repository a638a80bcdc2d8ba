"""Each learner's share of the box: CPU threads (cores / learners), memory (what the box has, less a reserve, over the
learners) and a GPU device -- on a MIG box one instance per learner, from the list `nvidia-smi -L` prints, assigned
round-robin in roster order; on a box without MIG a GPU index; or none."""
from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")
RESERVE_MB = 2048  # left to the system, the hub and the proxy before the rest is divided
GPU_LINE = re.compile(r"^GPU\s+(\d+):\s*(.*?)\s*\(UUID:\s*(GPU-[^)\s]+)\)")
MIG_LINE = re.compile(r"^\s+MIG\s+(\S+)\s+Device\s+(\d+):\s*\(UUID:\s*(MIG-[^)\s]+)\)")


@dataclass(frozen=True)
class Device:
    """One GPU or MIG instance a learner may be given: `visible` goes into CUDA_VISIBLE_DEVICES, `gpu` is the index of
    the physical GPU (whose /dev/nvidiaN the learner's server gets), `label` what the start-up table shows."""
    visible: str
    gpu: int | None
    label: str
    mig: bool = False
    uuid: str = ""


def cores() -> int:
    """CPUs this process may run on (its affinity mask, not the whole machine when it is pinned)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def threads_per_learner(n_cores: int, learners: int) -> int:
    """cores // learners, at least 1: each learner's torch, OpenMP and BLAS pools get this many threads."""
    return max(1, n_cores // max(1, learners))


def thread_environment(threads: int) -> dict[str, str]:
    return {k: str(threads) for k in THREAD_VARIABLES}


def total_memory_mb() -> int:
    import psutil
    return psutil.virtual_memory().total >> 20


def memory_per_learner(total_mb: int, learners: int, reserve_mb: int = RESERVE_MB) -> int:
    """(total - reserve) / learners in MB, at least 512."""
    return max(512, (total_mb - reserve_mb) // max(1, learners))


def _listed(text: str) -> tuple[list[Device], list[Device]]:
    """(GPUs, MIG instances) in `nvidia-smi -L`'s output; each MIG instance belongs to the GPU line above it."""
    gpus, migs, current = [], [], None
    for line in text.splitlines():
        g = GPU_LINE.match(line)
        if g:
            current = int(g.group(1))
            gpus.append(Device(g.group(1), current, f"GPU {current}: {g.group(2)}", uuid=g.group(3)))
            continue
        m = MIG_LINE.match(line)
        if m and current is not None:
            migs.append(Device(m.group(3), current, f"GPU {current} MIG {m.group(1)} device {m.group(2)}", True,
                               m.group(3)))
    return gpus, migs


def parse_nvidia_smi(text: str) -> list[Device]:
    """The devices `nvidia-smi -L` lists: every MIG instance when any GPU has MIG on (a GPU with MIG on and no
    instance offers nothing), else every GPU by index."""
    gpus, migs = _listed(text)
    return migs if migs else gpus


def list_devices(spec: str = "auto", smi_output: str | None = None) -> list[Device]:
    """The devices to hand out. spec: "auto" (what `nvidia-smi -L` lists; none without nvidia-smi), "none", or a
    comma-separated list of CUDA_VISIBLE_DEVICES values (GPU indices, GPU-/MIG- UUIDs), mapped to their GPU through
    `nvidia-smi -L` where it knows them."""
    spec = (spec or "auto").strip()
    if spec == "none":
        return []
    if smi_output is None:
        smi_output = nvidia_smi_list()
    if spec == "auto":
        return parse_nvidia_smi(smi_output)
    gpus, migs = _listed(smi_output)
    known = {key: d for d in gpus + migs for key in (d.visible, d.uuid)}  # a GPU by its index or its UUID
    out = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        if not (item.isdigit() or item.startswith(("GPU-", "MIG-"))):
            raise ValueError(f"GPUS={spec!r}: {item!r} is not a GPU index or a GPU-/MIG- UUID; use auto, none, or a "
                             f"comma-separated list such as 0,1 or MIG-<uuid>,MIG-<uuid> (from `nvidia-smi -L`)")
        d = known.get(item)
        out.append(Device(item, d.gpu, d.label, d.mig, d.uuid) if d else
                   Device(item, int(item) if item.isdigit() else None, item, mig=item.startswith("MIG-")))
    if len({d.visible for d in out}) != len(out):
        raise ValueError(f"GPUS={spec!r} names a device twice; list each once (round-robin shares them)")
    return out


def nvidia_smi_list() -> str:
    """`nvidia-smi -L`'s output, or '' without nvidia-smi (or when it fails: no driver, no GPU)."""
    if not shutil.which("nvidia-smi"):
        return ""
    try:
        run = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return run.stdout if run.returncode == 0 else ""


def assign(names: list[str], devices: list[Device], allow_sharing: bool = False) -> dict[str, Device | None]:
    """{learner: device}, round-robin in roster order (learner i gets device i mod n), None for all without devices.
    More learners than MIG instances is refused unless allow_sharing: the error says how many would share each."""
    if not devices:
        return {n: None for n in names}
    if any(d.mig for d in devices) and len(names) > len(devices) and not allow_sharing:
        per = math.ceil(len(names) / len(devices))
        crowded = len(names) - (per - 1) * len(devices)
        raise ValueError(
            f"{len(names)} learners for {len(devices)} MIG instances: round-robin would put {per} learners on "
            f"{crowded} of the instances" + (f" and {per - 1} on the other {len(devices) - crowded}"
                                             if crowded < len(devices) else "")
            + f" (time-slicing each instance). Create {len(names) - len(devices)} more instances (INSTRUCTOR.md "
            f"section 4: `nvidia-smi mig -cgi ... -C`), or allow the sharing with GPU_SHARING=1")
    return {n: devices[i % len(devices)] for i, n in enumerate(names)}


def sharing_lines(assignment: dict[str, Device | None]) -> list[str]:
    """One line per device: which learners it serves (the start-up summary)."""
    by = {}
    for name, dev in assignment.items():
        if dev is not None:
            by.setdefault(dev.label, []).append(name)
    return [f"{label}: {', '.join(names)}" for label, names in by.items()]
