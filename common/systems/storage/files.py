"""Files for lab 11's storage measurements: a scratch directory that cleans up after itself, seeded files, and the
page cache (how much of a file it holds, how to evict a file, which cold-read method a file system allows).

Every file lives in a scratch directory (`scratch_dir`): a fresh temporary folder under `build/storage/`, at most
1 GiB in all, removed when the `with` block ends -- also when it fails. A directory that cannot be written, or a disk
without room, is a `StorageError` naming the path, and nothing is left behind.

Cold reads (`cold_method`): "fadvise" -- `fsync` (a dirty page cannot be dropped), then
`posix_fadvise(POSIX_FADV_DONTNEED)`, checked with `mincore` (`page_cache_fraction`); where that leaves the file
cached, "o_direct" -- `O_DIRECT` reads into page-aligned buffers, bypassing the cache -- where the file system allows
it; else None (tmpfs: the file *is* page cache). The reads themselves are measured in `reads`.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import mmap
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.core.env import REPO_ROOT
from common.core.validate import whole

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
MAX_SCRATCH_BYTES = GIB          # the most a lab may put on this machine's disk
DEFAULT_ROOT = REPO_ROOT / "build" / "storage"
SPARE_BYTES = 256 * MIB          # free space left over on the disk after the scratch budget
PAGE = mmap.PAGESIZE
_FULL = (errno.ENOSPC, errno.EDQUOT)


class StorageError(OSError):
    """A directory that cannot be written, a full disk, a file that cannot be read: the message names the path."""


def whole_in(name: str, value, minimum: int, maximum: int | None = None) -> int:
    """common.core.validate.whole, with an upper bound: a ValueError names the parameter, the value and the range."""
    whole(name, value, minimum)
    if maximum is not None and value > maximum:
        raise ValueError(f"{name}={value!r} must be at most {maximum}")
    return int(value)


# ---------------------------------------------------------------- the scratch directory

@dataclass
class Scratch:
    """A temporary directory with a byte budget: `reserve` before writing, `path / name` for a file."""
    path: Path
    budget: int
    reserved: int = 0

    def reserve(self, nbytes: int, what: str) -> None:
        """Count `nbytes` against the budget; raise ValueError (nothing written yet) when it would go over."""
        whole("nbytes", nbytes, 0)
        if self.reserved + nbytes > self.budget:
            raise ValueError(f"{what}: {nbytes / MIB:.0f} MiB more would bring the scratch directory to "
                             f"{(self.reserved + nbytes) / MIB:.0f} MiB, over its budget of {self.budget / MIB:.0f} "
                             f"MiB (budget_bytes, at most {MAX_SCRATCH_BYTES / MIB:.0f} MiB)")
        self.reserved += nbytes

    def __truediv__(self, name: str) -> Path:
        return self.path / name


def _make_dirs(root: Path) -> list[Path]:
    """mkdir -p, returning the directories it created (deepest last) so they can be removed again."""
    missing = []
    p = root
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        d.mkdir()
    return list(reversed(missing))


def _remove_dirs(created: list[Path]) -> None:
    for d in reversed(created):
        with contextlib.suppress(OSError):
            d.rmdir()  # only if empty: never removes anything else


@contextlib.contextmanager
def scratch_dir(budget_bytes: int = MAX_SCRATCH_BYTES, root: str | Path | None = None):
    """A fresh temporary directory under `root` (default build/storage/ in this checkout) for at most
    `budget_bytes`; removed with everything in it when the block ends, also on an error or an interrupt.

    Raises StorageError naming the directory when it cannot be created or written, or when its disk has less free
    space than the budget plus 256 MiB -- and then leaves nothing behind (not even the folders it made)."""
    whole_in("budget_bytes", budget_bytes, 1, MAX_SCRATCH_BYTES)
    root = Path(root) if root is not None else DEFAULT_ROOT
    created: list[Path] = []
    try:
        created = _make_dirs(root)
        path = Path(tempfile.mkdtemp(prefix="workbook-storage-", dir=root))
    except OSError as exc:
        _remove_dirs(created)
        raise StorageError(f"cannot write in directory {str(root)!r}: {exc.strerror or exc}; pass root= a directory "
                           f"this user can write (the default is build/storage/ in the checkout)") from None
    try:
        probe = path / ".probe"
        probe.write_bytes(b"x")  # mkdir can succeed where files cannot be written (a full disk, a quota)
        probe.unlink()
        free = shutil.disk_usage(path).free
        if free < budget_bytes + SPARE_BYTES:
            raise StorageError(errno.ENOSPC, f"not enough free space in {str(root)!r}: {free / MIB:.0f} MiB free, the "
                                             f"measurement needs {budget_bytes / MIB:.0f} MiB plus "
                                             f"{SPARE_BYTES / MIB:.0f} MiB to spare; free some space or pass a "
                                             f"smaller budget_bytes")
    except OSError as exc:
        shutil.rmtree(path, ignore_errors=True)
        _remove_dirs(created)
        if isinstance(exc, StorageError):
            raise
        raise StorageError(f"cannot write in directory {str(root)!r}: {exc.strerror or exc}") from None
    try:
        yield Scratch(path, budget_bytes)
    finally:
        shutil.rmtree(path, ignore_errors=True)
        _remove_dirs(created)


@contextlib.contextmanager
def disk_full_is_clear(path: str | Path, what: str = "writing"):
    """Turn ENOSPC / EDQUOT raised inside the block into a StorageError naming `path`."""
    try:
        yield
    except OSError as exc:
        if exc.errno in _FULL and not isinstance(exc, StorageError):
            raise StorageError(exc.errno, f"disk full while {what} {str(path)!r}: {exc.strerror}; free some space "
                                          f"or write less") from None
        raise


# ---------------------------------------------------------------- files and the page cache

def write_file(path: str | Path, nbytes: int, seed: int = 0, chunk: int = 16 * MIB) -> int:
    """Write `nbytes` of seeded random bytes (incompressible, never zeros) and fsync them; return nbytes.
    A full disk raises StorageError and the partial file is removed."""
    whole("nbytes", nbytes)
    rng = np.random.default_rng(seed)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with disk_full_is_clear(path):
            written = 0
            while written < nbytes:
                n = min(chunk, nbytes - written)
                view = memoryview(rng.bytes(n))
                while view:
                    k = os.write(fd, view)
                    view, written = view[k:], written + k
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            if os.path.isfile(path):
                os.unlink(path)
        raise
    os.close(fd)
    return nbytes


def _libc():
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    return libc


def page_cache_fraction(path: str | Path) -> float | None:
    """The fraction of the file's pages in the page cache (Linux `mincore` on a mapping, which reads nothing);
    None where it cannot be asked."""
    size = os.path.getsize(path)
    libc = _libc()
    if libc is None:
        return None
    if size == 0:
        return 0.0
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return None
        try:
            pages = -(-size // PAGE)
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(addr, size, vec) != 0:
                return None
            return float((np.frombuffer(vec, dtype=np.uint8) & 1).sum()) / pages
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def evict(path: str | Path) -> float | None:
    """fsync, then posix_fadvise(DONTNEED) over the whole file; return the page-cache fraction left."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return page_cache_fraction(path)


def o_direct_works(path: str | Path) -> bool:
    """Whether this file system lets the file be read with O_DIRECT (tmpfs, for one, does not)."""
    if not hasattr(os, "O_DIRECT"):
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return False
    try:
        buf = mmap.mmap(-1, 4096)
        try:
            os.preadv(fd, [buf], 0)
            return True
        except OSError:
            return False
        finally:
            buf.close()
    finally:
        os.close(fd)


def cold_method(path: str | Path, max_resident: float = 0.05) -> str | None:
    """"fadvise" when fsync + DONTNEED leaves at most `max_resident` of the file cached, else "o_direct" when the file
    system allows it, else None (no cold read possible: the file lives in memory)."""
    left = evict(path)
    if left is not None and left <= max_resident:
        return "fadvise"
    return "o_direct" if o_direct_works(path) else None


def file_system(path: str | Path) -> str:
    """The type of the file system holding `path` (from /proc/mounts: the longest mount point above it)."""
    try:
        mounts = [line.split()[1:3] for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return "unknown"
    target = str(Path(path).resolve())
    best = max((m for m in mounts if target == m[0] or target.startswith(m[0].rstrip("/") + "/")),
               key=lambda m: len(m[0]), default=None)
    return best[1] if best else "unknown"
