"""Reads from files, measured: the page cache against the device, block sizes, reader threads, random 4 KiB reads.

What each read measures (files and eviction: `files`):
- **warm** (`cold=False`): the file is in the page cache (read into it first if it is not all there); a read is a
  copy from kernel memory into the reader's buffer plus one system call per block -- memory bandwidth and syscall
  cost, no device.
- **cold** (`cold=True`): method "fadvise" evicts the file first and the kernel reads it from the block device, with
  its readahead; method "o_direct" opens it with `O_DIRECT`, so every block is one device request and the page
  cache is bypassed. On a virtual machine the "device" is a virtual disk, which its host may cache.
- **random 4 KiB**: distinct 4 KiB blocks in random order, readahead off (`POSIX_FADV_RANDOM`): cold, each read is one
  device request; IOPS and latency percentiles. With `threads` synchronous readers, `threads` requests are in flight:
  queue depth 1 or 4, as fio's `psync` engine with `numjobs` readers.
- **time-based samples** (`sample_sequential`, `sample_random`, `read_sweep`): passes repeated until they add up to a
  minimum time of reading, as fio's `time_based` runs; `fio_command` prints the fio job that measures the same.
Each reader is a thread with its own file descriptor and a page-aligned buffer touched before the clock starts;
`os.preadv` releases the GIL, so readers run in parallel. Times are wall-clock (`time.perf_counter`) around
synchronous reads; GB = 1e9 bytes.
"""
from __future__ import annotations

import contextlib
import errno
import mmap
import os
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.systems.storage.files import KIB, MIB, StorageError, evict, page_cache_fraction, whole_in

COLD_METHODS = ("fadvise", "o_direct")
MAX_THREADS = 64


@dataclass
class Read:
    """One timed read: what was read, how, and how fast (GB = 1e9 bytes)."""
    nbytes: int
    seconds: float
    block_size: int
    threads: int
    cold: bool
    method: str            # "page cache", "fadvise" or "o_direct"
    resident_before: float | None  # page-cache fraction just before the read

    @property
    def gbps(self) -> float:
        return self.nbytes / self.seconds / 1e9


def _open(path, direct: bool) -> int:
    return os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))


def _buffers(threads: int, size: int) -> list:
    """One page-aligned buffer per reader (as O_DIRECT needs), every page touched before the clock starts: a first
    touch is a page fault, which is not what a read costs."""
    bufs = [mmap.mmap(-1, size) for _ in range(threads)]
    for b in bufs:
        b.write(b"\x01" * size)
        b.seek(0)
    return bufs


@contextlib.contextmanager
def _readers(path, threads: int, block_size: int, direct: bool):
    """One file descriptor and one buffer per reader, closed again whatever happens."""
    fds, bufs = [], []
    try:
        for _ in range(threads):
            fds.append(_open(path, direct))
        bufs = _buffers(threads, block_size)
        yield fds, bufs
    finally:
        for fd in fds:
            os.close(fd)
        for b in bufs:
            b.close()


def _run_threads(work, threads: int) -> float:
    """Run work(i) in `threads` threads released together; wall seconds from the release to the last finish."""
    errors: list[BaseException] = []
    gate = threading.Barrier(threads + 1)

    def body(i):
        try:
            gate.wait()
            work(i)
        except BaseException as exc:  # re-raised in the caller
            errors.append(exc)
    pool = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(threads)]
    for t in pool:
        t.start()
    gate.wait()
    start = time.perf_counter()
    for t in pool:
        t.join()
    seconds = time.perf_counter() - start
    if errors:
        raise errors[0]
    return seconds


def _cached(path, size: int) -> float | None:
    """Make sure the file is in the page cache (read it once if it is not all there); the fraction cached after."""
    resident = page_cache_fraction(path)
    if resident is None or resident < 0.99:
        fd = os.open(path, os.O_RDONLY)
        try:
            buf, off = mmap.mmap(-1, MIB), 0
            while off < size:
                n = os.preadv(fd, [buf], off)
                if n <= 0:
                    break
                off += n
            buf.close()
        finally:
            os.close(fd)
        resident = page_cache_fraction(path)
    return resident


def _check_read_args(path, block_size, threads, method):
    whole_in("block_size", block_size, 512, 256 * MIB)
    whole_in("threads", threads, 1, MAX_THREADS)
    if method not in COLD_METHODS:
        raise ValueError(f"method={method!r} is not a cold-read method; allowed: {', '.join(COLD_METHODS)}")
    if not os.path.isfile(path):
        raise StorageError(errno.ENOENT, f"no file to read at {str(path)!r}")
    return os.path.getsize(path)


def read_sequential(path: str | Path, block_size: int, threads: int = 1, cold: bool = False,
                    method: str = "fadvise") -> Read:
    """Read the whole file in blocks of `block_size` bytes; `threads` readers each take one contiguous part, each
    with its own file descriptor. Warm (cold=False): the file is read into the page cache first if it is not all
    there. Cold: evict first ("fadvise") or bypass the cache ("o_direct"; the block size and the file size must then
    be multiples of 4096)."""
    size = _check_read_args(path, block_size, threads, method)
    direct = cold and method == "o_direct"
    if direct and (block_size % 4096 or size % 4096):
        raise ValueError(f"block_size={block_size} and the file size {size} must be multiples of 4096 for O_DIRECT")
    resident = evict(path) if cold and method == "fadvise" else (page_cache_fraction(path) if cold else
                                                                   _cached(path, size))
    per = -(-size // threads)
    per = -(-per // block_size) * block_size
    done = [0] * threads

    def work(i):
        fd, buf, off, end = fds[i], bufs[i], i * per, min(size, (i + 1) * per)
        view = memoryview(buf)
        while off < end:
            n = os.preadv(fd, [view[:min(block_size, end - off)]], off)
            if n <= 0:
                raise StorageError(errno.EIO, f"short read at offset {off} of {str(path)!r}")
            off += n
            done[i] += n
        view.release()
    with _readers(path, threads, block_size, direct) as (fds, bufs):
        seconds = _run_threads(work, threads)
    if sum(done) != size:
        raise StorageError(errno.EIO, f"read {sum(done)} of the {size} bytes of {str(path)!r}")
    return Read(sum(done), seconds, block_size, threads, cold, method if cold else "page cache", resident)


@dataclass
class RandomReads:
    """Random reads of distinct blocks: IOPS and latency percentiles (microseconds)."""
    reads: int
    seconds: float
    threads: int
    block_size: int
    method: str
    resident_before: float | None
    latencies_us: list

    @property
    def iops(self) -> float:
        return self.reads / self.seconds

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies_us, q))


def random_reads(path: str | Path, reads: int, threads: int = 1, block_size: int = 4 * KIB, cold: bool = True,
                 method: str = "fadvise", seed: int = 0, max_seconds: float = 1.0) -> RandomReads:
    """Up to `reads` reads of distinct random blocks (readahead off), split over `threads` readers; stops after
    `max_seconds` (a slow disk must not hold the lab up), so `.reads` says how many were done. Cold: as in
    read_sequential; warm: the whole file is brought into the page cache first."""
    size = _check_read_args(path, block_size, threads, method)
    whole_in("reads", reads, threads, max(threads, size // block_size))
    if not max_seconds > 0:
        raise ValueError(f"max_seconds={max_seconds!r} must be > 0")
    direct = cold and method == "o_direct"
    offsets = [b * block_size for b in random.Random(seed).sample(range(size // block_size), reads)]
    resident = evict(path) if cold and method == "fadvise" else (page_cache_fraction(path) if cold else
                                                                   _cached(path, size))
    lat: list[list[float]] = [[] for _ in range(threads)]

    def work(i):
        fd, buf, mine, clock = fds[i], bufs[i], offsets[i::threads], time.perf_counter_ns
        for off in mine:
            t0 = clock()
            if os.preadv(fd, [buf], off) != block_size:
                raise StorageError(errno.EIO, f"short read at offset {off} of {str(path)!r}")
            lat[i].append((clock() - t0) / 1e3)
            if t0 / 1e9 > deadline:
                break
    with _readers(path, threads, block_size, direct) as (fds, bufs):
        for fd in fds:
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        deadline = time.perf_counter() + max_seconds
        seconds = _run_threads(work, threads)
    done = [x for per in lat for x in per]
    return RandomReads(len(done), seconds, threads, block_size, method if cold else "page cache", resident, done)


def sample_sequential(path: str | Path, block_size: int, threads: int = 1, cold: bool = False,
                      method: str = "fadvise", min_seconds: float = 2.0) -> list[Read]:
    """Whole-file sequential reads (`read_sequential`) again and again until they add up to `min_seconds` of reading
    (eviction between cold passes not counted): a time-based sample, as fio's `time_based` runs are."""
    return _until(lambda: read_sequential(path, block_size, threads, cold, method), min_seconds)


def _until(one, min_seconds: float) -> list:
    if not min_seconds > 0:
        raise ValueError(f"min_seconds={min_seconds!r} must be > 0")
    out, total = [], 0.0
    while total < min_seconds or not out:
        out.append(one())
        total += out[-1].seconds
    return out


def sample_random(path: str | Path, threads: int = 1, cold: bool = True, method: str = "fadvise",
                  min_seconds: float = 2.0, block_size: int = 4 * KIB, seed: int = 0) -> RandomReads:
    """Random reads of distinct blocks (`random_reads`), pass after pass over the file's blocks in a new random order
    (cold: evicted again before each pass, so no block is read from the cache) until the passes add up to
    `min_seconds` of reading; one RandomReads over all of them (IOPS = reads / reading seconds)."""
    size = _check_read_args(path, block_size, threads, method)
    blocks = max(threads, size // block_size)
    seeds = iter(range(seed, seed + 1_000_000))
    passes = _until(lambda: random_reads(path, blocks, threads, block_size, cold, method, next(seeds),
                                         max_seconds=min_seconds), min_seconds)
    return RandomReads(sum(p.reads for p in passes), sum(p.seconds for p in passes), threads, block_size,
                       passes[0].method, max((p.resident_before or 0.0) for p in passes) if cold else
                       passes[0].resident_before, [x for p in passes for x in p.latencies_us])


def fio_command(kind: str, file_mib: int, seconds: float = 2.0) -> str:
    """The fio job that measures what `kind` measures here, for a learner who has fio (on a file of `file_mib` MiB
    it creates itself). "warm": sequential 1 MiB reads from the page cache; "cold": sequential 1 MiB reads from the
    device (fio bypasses the cache with O_DIRECT, where this lab evicts and reads through the kernel's readahead);
    "qd1" / "qd4": random 4 KiB reads, 1 or 4 synchronous readers (O_DIRECT: each read is one device request)."""
    common = f"--filename=FILE --size={file_mib}m --ioengine=psync --time_based --runtime={seconds:g} --group_reporting"
    jobs = {"warm": "--name=warm --rw=read --bs=1m --numjobs=1 --direct=0 --pre_read=1",
            "cold": "--name=cold --rw=read --bs=1m --numjobs=1 --direct=1",
            "qd1": "--name=rand4k_qd1 --rw=randread --bs=4k --numjobs=1 --iodepth=1 --direct=1",
            "qd4": "--name=rand4k_qd4 --rw=randread --bs=4k --numjobs=4 --iodepth=1 --direct=1"}
    if kind not in jobs:
        raise ValueError(f"kind={kind!r}; allowed: {', '.join(jobs)}")
    return f"fio {jobs[kind]} {common}"


def read_sweep(path: str | Path, block_sizes, thread_counts, min_seconds: float = 2.0,
               method: str | None = "fadvise", thread_block: int = MIB) -> list[dict]:
    """Sequential reads, warm and (if `method`) cold, for each block size with one thread and for each thread count
    with `thread_block` blocks: each configuration a time-based sample of at least `min_seconds` of reading, warm
    and cold passes alternating so that the machine's drift hits both alike. One row per configuration: GB/s over
    the whole sample (bytes / reading seconds), the slowest and fastest pass, the passes, the cache fraction before
    cold reads. One reader with `thread_block` blocks is in both sweeps: it is measured once and shown in both."""
    if not min_seconds > 0:
        raise ValueError(f"min_seconds={min_seconds!r} must be > 0")
    configs = [("block", b, 1) for b in block_sizes] + [("threads", thread_block, t) for t in thread_counts]
    kinds = [False] + ([True] if method else [])
    samples: dict = {}
    for block, threads in dict.fromkeys((block, threads) for _, block, threads in configs):
        runs = {cold: [] for cold in kinds}
        while min(sum(r.seconds for r in runs[c]) for c in kinds) < min_seconds:
            for cold in kinds:
                if sum(r.seconds for r in runs[cold]) < min_seconds:
                    runs[cold].append(read_sequential(path, block, threads, cold=cold, method=method or "fadvise"))
        for cold in kinds:
            samples[(block, threads, cold)] = runs[cold]
    rows = []
    for (sweep, block, threads), cold in ((c, k) for c in configs for k in kinds):
        runs = samples[(block, threads, cold)]
        g = [r.gbps for r in runs]
        rows.append({"sweep": sweep, "block_size": block, "threads": threads,
                     "read": f"device ({method})" if cold else "page cache",
                     "gbps": sum(r.nbytes for r in runs) / sum(r.seconds for r in runs) / 1e9,
                     "gbps_min": min(g), "gbps_max": max(g), "passes": len(runs),
                     "seconds": sum(r.seconds for r in runs),
                     "resident_before": max((r.resident_before or 0.0) for r in runs) if cold else None})
    return rows
