"""This machine's two measured ceilings (memory copy bandwidth, matrix-multiply rate), its caches, and the machine
profile that holds them, measured once and saved under build/machine/<fingerprint>.json.

Lab 00 introduces them, lab 02 draws them as the measured roofline, later labs express kernels as fractions of them
through `machine_profile()`, so every lab of a run uses the same roof. Copy bandwidth counts read + write bytes (a copy
of N bytes moves 2N; on a CPU, write-allocate makes the memory really move up to 3N, see `copy_bytes`). Matmul rate
counts 2*M*N*K FLOPs. A ceiling is an upper bound, so it is the best of several timed blocks, not their median.
`Probe` is the same two measurements made short (a few tenths of a second) and typical (medians, not bests): the
machine's speed at one moment, which `make run` reads around every notebook to judge results against.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from common.core import timing
from common.core.env import REPO_ROOT, current
from common.core.validate import number, whole

MACHINE_DIR = REPO_ROOT / "build" / "machine"
MATMUL_N = {"cpu": 1024, "cuda": 8192}  # the ceilings' square matmul: large enough to be compute-bound


@dataclass
class Ceiling:
    name: str
    value: float  # GB/s or GFLOP/s
    unit: str
    detail: str
    timing: timing.Timing

    @property
    def threads(self) -> int | None:
        """The CPU threads that reached this ceiling (read from its detail); None on a GPU."""
        m = re.search(r"(\d+) threads?\b", self.detail)
        return int(m.group(1)) if m else None


def _device(device):
    if device is not None and device not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r} is not a device; allowed: 'cpu', 'cuda'")
    return device or current().device


def copy_bytes(nbytes: int) -> int:
    """Bytes a device copy of an nbytes buffer moves by convention: it reads nbytes and writes nbytes.

    On a CPU with write-allocate caches an ordinary store first reads the destination line into the cache, so DRAM
    really sees read src + read dst + write dst = 3 x nbytes (non-temporal stores avoid it). The convention (2x) is
    kept everywhere, so a copy ceiling and a kernel's bytes undercount alike."""
    return 2 * nbytes


def matmul_flops(m: int, n: int, k: int) -> int:
    """FLOPs of an (m x k) @ (k x n) product: m*n*k multiply-adds, 2 FLOPs each."""
    return 2 * m * n * k


@contextlib.contextmanager
def threads(n: int | None):
    """Run the block with torch using `n` CPU threads (None: leave as is), then restore the previous count."""
    import torch
    if n is None:
        yield torch.get_num_threads()
        return
    whole("threads", n, meaning="or None for torch's current count")
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(before)


# ------------------------------------------------------------------------------------------------------ caches
def _parse_size(text: str) -> int:
    text = text.strip().upper().replace("IB", "").replace("B", "")
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG").strip()) * scale)


def cache_sizes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> dict:
    """Per-core data cache sizes in bytes of CPU 0, e.g. {"L1": 32768, "L2": 1048576, "L3": 33554432}.

    Read from /sys (Linux), else from `lscpu`; {} when neither says (then defaults are used by the callers)."""
    out = {}
    base = Path(root)
    if base.exists():
        for idx in sorted(base.glob("index*")):
            try:
                kind = (idx / "type").read_text().strip()
                level = int((idx / "level").read_text())
                size = _parse_size((idx / "size").read_text())
            except (OSError, ValueError):
                continue
            if kind in ("Data", "Unified"):
                out[f"L{level}"] = max(out.get(f"L{level}", 0), size)
    if out:
        return out
    try:
        import subprocess
        text = subprocess.run(["lscpu", "-B", "-C=NAME,ONE-SIZE"], capture_output=True, text=True, timeout=5).stdout
        for line in text.splitlines()[1:]:
            name, size = line.split()[:2]
            if name in ("L1d", "L2", "L3"):
                out[name[:2]] = int(size)
    except (OSError, ValueError, IndexError):
        pass
    return out


def last_level_cache(caches: dict | None = None) -> int:
    """Bytes of the largest cache (on a GPU: its L2), 32 MiB when unknown."""
    caches = cache_sizes() if caches is None else caches
    return max(caches.values()) if caches else 32 * 2**20


def dram_buffer_bytes(caches: dict | None = None, device: str = "cpu") -> int:
    """A buffer size surely past the last-level cache: the power of two at or above 1.5x the LLC (source and
    destination: 3x or more), at least 64 MiB, at most 1/16 of the machine's memory. On a GPU: 1 GiB (at least 8x
    its L2). (A 2-core VM here reports its host's 300 MiB L3 and already copies at its DRAM rate from 128 MiB: the
    512 MiB this gives it, not the 1 GiB of a 4x rule, halves the time every DRAM measurement spends.)"""
    if device == "cuda":
        return max(2**30, 8 * (caches or {}).get("L2", 0))
    llc = last_level_cache(caches)
    size = 1 << max(26, (3 * llc // 2 - 1).bit_length())
    try:
        import psutil
        size = min(size, 1 << (psutil.virtual_memory().total // 16).bit_length() - 1)
    except Exception:  # psutil missing: keep the size
        pass
    return size


def hierarchy_sizes(caches: dict | None = None, device: str = "cpu") -> dict:
    """One copy buffer size per level, chosen from the cache sizes so each copy (source + destination = 2x the size)
    sits well inside its level: {"L1": ..., "L2": ..., "L3": ..., "DRAM": ...} (levels the machine has)."""
    caches = cache_sizes() if caches is None and device == "cpu" else (caches or {})
    if device == "cuda":
        l2 = caches.get("L2", 50 * 2**20)
        return {"L2": l2 // 4, "HBM": dram_buffer_bytes(caches, device)}
    out = {lvl: max(4096, caches[lvl] // 4) for lvl in sorted(caches)}
    out["DRAM"] = dram_buffer_bytes(caches)
    return out


def gpu_l2_bytes() -> int:
    import torch
    props = torch.cuda.get_device_properties(0)
    return int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)


# ---------------------------------------------------------------------------------------------------- ceilings
def measure_copy_bandwidth(nbytes: int | None = None, device: str | None = None, min_run_time: float = 0.2,
                           n_threads: int | None = None, best: bool = False) -> Ceiling:
    """Copy a buffer of `nbytes` (default: past the last-level cache) into another; GB/s of read + write.

    `n_threads`: torch CPU threads for the copy (None: torch's current count). `best=True` reports the fastest timed
    block (a ceiling, robust to a busy machine) instead of the median."""
    dev = _device(device)
    src, dst = _copy_buffers(nbytes or dram_buffer_bytes(device=dev), dev)
    return _time_copy(src, dst, dev, min_run_time, n_threads, best)


def _copy_buffers(nbytes: int, dev: str):
    """A random float32 source of `nbytes` and a destination of the same size (filling 2 x 128 MiB takes about
    0.2 s on a CPU, so the rounds of `machine_profile` share one pair)."""
    import torch
    if not isinstance(nbytes, int) or nbytes < 1024:
        raise ValueError(f"nbytes={nbytes!r} is too small to measure bandwidth; use an int of at least 1024 bytes")
    src = torch.rand(nbytes // 4, device=dev)
    return src, torch.empty_like(src)


def _time_copy(src, dst, dev: str, min_run_time: float, n_threads: int | None, best: bool) -> Ceiling:
    """Time `dst.copy_(src)`, verify the copy, and report it as a copy-bandwidth Ceiling."""
    import torch
    nbytes = src.numel() * src.element_size()
    with threads(n_threads if dev == "cpu" else None) as used:
        t = timing.bench(dst.copy_, src, label=f"copy {format_bytes(nbytes)}", device=dev, min_run_time=min_run_time,
                         flush_l2=False)
    if not torch.equal(dst, src):
        raise RuntimeError("copy produced a different buffer: the measurement is void")
    gbps = copy_bytes(nbytes) / (t.best_s if best else t.median_s) / 1e9
    where = f"{used} thread{'s' if used > 1 else ''}" if dev == "cpu" else "GPU"
    return Ceiling("copy bandwidth", gbps, "GB/s",
                   f"{dev}, {format_bytes(nbytes)} buffer, read+write, {where}{', best block' if best else ''}", t)


def format_bytes(nbytes: int) -> str:
    """1.5 MiB, 32 KiB, 512 B."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.4g} {unit}"
    return f"{nbytes} B"


def default_matmul_dtype(device: str):
    import torch
    return torch.bfloat16 if device == "cuda" else torch.float32


def measure_matmul_rate(n: int | None = None, dtype=None, device: str | None = None,
                        min_run_time: float = 0.2, n_threads: int | None = None, best: bool = False) -> Ceiling:
    """Square n x n matmul (default n: 1024 on CPU, 8192 on GPU; float32 on CPU, bf16 on GPU); GFLOP/s.

    `n_threads` and `best` as in `measure_copy_bandwidth`."""
    import torch
    dev = _device(device)
    n = n or MATMUL_N[dev]
    if not isinstance(n, int) or n < 16:
        raise ValueError(f"n={n!r} is too small for a matmul rate; use an int n >= 16")
    dtype = dtype or default_matmul_dtype(dev)
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    # verify before timing: a row of the product against float64
    got = (a @ b)[0].double()
    ref = a[0].double() @ b.double()
    tol = 1e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-4
    if not torch.allclose(got, ref, rtol=tol, atol=tol * n ** 0.5):
        raise RuntimeError("matmul result disagrees with a float64 reference: the measurement is void")
    dname = str(dtype).replace('torch.', '')
    with threads(n_threads if dev == "cpu" else None) as used:
        t = timing.bench(torch.matmul, a, b, label=f"matmul {n}x{n} {dname}", device=dev, min_run_time=min_run_time)
    gflops = matmul_flops(n, n, n) / (t.best_s if best else t.median_s) / 1e9
    where = f"{used} thread{'s' if used > 1 else ''}" if dev == "cpu" else "GPU"
    return Ceiling("matmul rate", gflops, "GFLOP/s",
                   f"{dev}, {n}x{n}x{n}, {dname}, {where}{', best block' if best else ''}", t)


_dtype_ceilings: dict = {}


def matmul_ceiling(dtype, device: str | None = None) -> Ceiling:
    """This machine's matmul ceiling in `dtype` (a torch dtype), for an MFU taken in the dtype the work runs in: the
    machine profile's own when it was measured in that dtype (`default_matmul_dtype`: float32 on a CPU, bf16 on a
    GPU), else measured now (best block of the profile's matrix size) and kept for the rest of the process."""
    dev = _device(device)
    if dtype == default_matmul_dtype(dev):
        return machine_profile().matmul
    key = (dev, str(dtype))
    if key not in _dtype_ceilings:
        prof = machine_profile()
        _dtype_ceilings[key] = measure_matmul_rate(prof.matmul_n, dtype=dtype, device=dev, best=True,
                                                   n_threads=prof.threads if dev == "cpu" else None)
    return _dtype_ceilings[key]


def bandwidth_sweep(sizes_bytes, device: str | None = None, min_run_time: float = 0.05, n_threads: int | None = 1):
    """Copy bandwidth (GB/s) for each buffer size, on ONE CPU thread by default (handing a few-KiB copy to a thread
    pool costs more than the copy); small buffers live in caches, large ones in DRAM/HBM. On a GPU the L2 is not
    flushed (flushing would measure the flush) and calls are timed in batches."""
    return [measure_copy_bandwidth(int(s), device, min_run_time, n_threads=n_threads) for s in sizes_bytes]


# ------------------------------------------------------------------------------------------------ machine profile
def fingerprint() -> str:
    """A short, stable id of this machine as the workbook sees it: CPU model, core count, memory, GPU, torch."""
    import platform

    from common.core.env import cpu_model
    parts = {"cpu": cpu_model(), "cores": os.cpu_count(), "machine": platform.machine()}
    try:
        import psutil
        parts["memory_gib"] = round(psutil.virtual_memory().total / 2**30)
    except Exception:
        pass
    try:
        import torch
        parts["torch"] = torch.__version__.split("+")[0]
        if current().device == "cuda":
            parts["gpu"] = torch.cuda.get_device_name(0)
    except Exception:
        pass
    digest = hashlib.sha1(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:10]
    return f"{current().device_id}-{digest}"


@dataclass
class MachineProfile:
    """This machine's measured ceilings and the sizes they were measured at (see `machine_profile`)."""
    fingerprint: str
    device: str
    threads: int  # CPU threads of the ceilings (on a GPU: torch's CPU thread count, unused by the kernels)
    caches: dict  # bytes per level
    copy_buffer_bytes: int
    matmul_n: int
    copy: Ceiling
    matmul: Ceiling
    extras: dict = field(default_factory=dict)

    def summary(self) -> str:
        caches = ", ".join(f"{k} {format_bytes(v)}" for k, v in sorted(self.caches.items())) or "unknown"
        return (f"machine {self.fingerprint}: {self.device}, {self.threads} thread(s); caches {caches}\n"
                f"  copy bandwidth {self.copy.value:,.1f} GB/s ({self.copy.detail})\n"
                f"  matmul rate    {self.matmul.value:,.1f} GFLOP/s ({self.matmul.detail})\n"
                f"  ridge {self.matmul.value / self.copy.value:,.2f} FLOP/B")

    def to_json(self) -> dict:
        d = asdict(self)
        for key in ("copy", "matmul"):
            c = getattr(self, key)
            d[key] = {"name": c.name, "value": c.value, "unit": c.unit, "detail": c.detail,
                      "timing": {"label": c.timing.label, "median_s": c.timing.median_s, "iqr_s": c.timing.iqr_s,
                                 "times": c.timing.times, "device": c.timing.device}}
        return d

    @classmethod
    def from_json(cls, d: dict) -> "MachineProfile":
        d = dict(d)
        for key in ("copy", "matmul"):
            c = dict(d[key])
            c["timing"] = timing.Timing(**c["timing"])
            d[key] = Ceiling(**c)
        return cls(**d)


def raise_to(prof: "MachineProfile", matmul_gflops: float | None = None, copy_gbps: float | None = None,
             source: str = "a later measurement") -> tuple["MachineProfile", list[str]]:
    """Raise a saved ceiling to a rate a kernel has just demonstrated, when that rate is higher (a ceiling is the best
    this machine has shown; on a shared machine the ceiling benchmark can have run at a busier moment). Returns the
    profile (saved under build/machine/) and one line per ceiling raised; an empty list when nothing was higher."""
    raised, new = [], {}
    for key, rate in (("matmul", matmul_gflops), ("copy", copy_gbps)):
        if rate is None:
            continue
        if not rate > 0:
            raise ValueError(f"{key} rate={rate!r} must be a positive number")
        old = getattr(prof, key)
        if rate > old.value:
            raised.append(f"{old.name} raised from {old.value:,.1f} to {rate:,.1f} {old.unit}, shown by {source}")
            base = old.detail.split("; raised to the rate of ")[0]
            new[key] = Ceiling(old.name, rate, old.unit, f"{base}; raised to the rate of {source}", old.timing)
    if not raised:
        return prof, []
    from dataclasses import replace
    return _save(replace(prof, **new)), raised


def _save(prof: "MachineProfile") -> "MachineProfile":
    """Write the profile to build/machine/<fingerprint>.json and serve it to later calls in this process."""
    path = profile_path(prof.fingerprint)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(prof.to_json(), indent=1) + "\n")
    _cached[prof.fingerprint] = prof
    return prof


def _best_of(found: list, rounds: int) -> Ceiling:
    """The fastest of the ceilings measured in the rounds, its detail saying how many rounds it was chosen from."""
    best = max(found, key=lambda c: c.value)
    return Ceiling(best.name, best.value, best.unit, f"{best.detail}, of {rounds} round{'s' if rounds > 1 else ''}",
                   best.timing)


def profile_path(fp: str | None = None) -> Path:
    return MACHINE_DIR / f"{fp or fingerprint()}.json"


_cached: dict = {}


def _torch_threads() -> int:
    import torch
    return torch.get_num_threads()


def machine_profile(refresh: bool = False, min_run_time: float = 0.1, keep_best: bool = False,
                    rounds: int = 6) -> MachineProfile:
    """This machine's profile: loaded from build/machine/<fingerprint>.json, measured (and saved) only when absent,
    when it was measured with fewer CPU threads than this process has, or when `refresh=True`. Each ceiling is the
    best block over `rounds` rounds (copy and matmul taking turns, each timed for `min_run_time` seconds per round),
    over one thread and torch's thread count (the count that won is in its detail), the copy buffer past the
    last-level cache; every lab that asks gets the same roof. Rounds spread the measurement over a few seconds: on a
    shared machine a single short burst of timing can fall wholly in a moment when a neighbour holds a core (a
    two-thread matmul then runs at one thread's rate).

    `keep_best=True` (lab 00's re-measurement) keeps, per ceiling, the higher of the saved and the new value: a
    ceiling is the best this machine has shown, so a run on a busy machine cannot lower the roof that later points
    are judged against. `refresh=True` alone replaces both (after a hardware or configuration change)."""
    whole("rounds", rounds)
    fp = fingerprint()
    path = profile_path(fp)
    old = None
    if keep_best and path.exists():
        try:
            old = MachineProfile.from_json(json.loads(path.read_text()))
        except (ValueError, TypeError, KeyError):
            old = None
    if not refresh:
        if fp in _cached:
            return _cached[fp]
        if path.exists():
            try:
                prof = MachineProfile.from_json(json.loads(path.read_text()))
            except (ValueError, TypeError, KeyError):
                prof = None  # an old or broken file: measure again
            # a CPU profile measured with fewer threads than this process has (a run under OMP_NUM_THREADS=1) set
            # its roof too low for it: measure again
            if prof is not None and (prof.device != "cpu" or prof.threads >= _torch_threads()):
                _cached[fp] = prof
                return prof
    import torch
    dev = current().device
    caches = cache_sizes() if dev == "cpu" else {"L2": gpu_l2_bytes()}
    n_threads = torch.get_num_threads()
    buf = dram_buffer_bytes(caches, dev)
    mm_n = MATMUL_N[dev]
    # each ceiling: the best over one thread and all threads (on a busy machine a straggling second thread can make
    # the all-thread copy slower than one core's)
    counts = sorted({1, n_threads}) if dev == "cpu" else [None]
    src, dst = _copy_buffers(buf, dev)
    copies, mms = [], []
    for _ in range(rounds):
        copies += [_time_copy(src, dst, dev, min_run_time, t, best=True) for t in counts]
        mms += [measure_matmul_rate(mm_n, device=dev, min_run_time=min_run_time, n_threads=t, best=True)
                for t in counts]
    copy, mm = (_best_of(found, rounds) for found in (copies, mms))
    if old is not None and old.threads == n_threads and old.copy_buffer_bytes == buf and old.matmul_n == mm_n:
        copy = old.copy if old.copy.value > copy.value else copy
        mm = old.matmul if old.matmul.value > mm.value else mm
    return _save(MachineProfile(fp, dev, n_threads, caches, buf, mm_n, copy, mm,
                                extras={"device_name": current().device_name}))


# ------------------------------------------------------------------------------------------------------ the probe
class Probe:
    """The machine's speed now: the ceilings' copy (past the last-level cache) and square matmul (MATMUL_N), each
    the median of its timed blocks, over `rounds` rounds taking turns, with torch's thread count. A call returns
    {"copy_gbps", "matmul_gflops", "seconds"}; it takes a few tenths of a second on an idle machine. The copy
    buffers are filled once, on the first call, and kept (`close()` frees them)."""

    def __init__(self, rounds: int = 2, min_run_time: float = 0.02):
        self.rounds = whole("rounds", rounds)
        self.min_run_time = number("min_run_time", min_run_time, meaning="seconds")
        self._buffers = None

    def __call__(self) -> dict:
        import statistics
        import time
        start = time.perf_counter()
        dev = current().device
        if self._buffers is None:
            self._buffers = _copy_buffers(dram_buffer_bytes(device=dev), dev)
        copies, mms = [], []
        for _ in range(self.rounds):
            copies.append(_time_copy(*self._buffers, dev, self.min_run_time, None, best=False).value)
            mms.append(measure_matmul_rate(MATMUL_N[dev], device=dev, min_run_time=self.min_run_time).value)
        return {"copy_gbps": statistics.median(copies), "matmul_gflops": statistics.median(mms),
                "seconds": time.perf_counter() - start}

    def close(self) -> None:
        self._buffers = None
