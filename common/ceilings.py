"""This device's two measured ceilings: memory copy bandwidth and matrix-multiply rate.

Lab 00 introduces them, lab 02 draws them as the measured roofline, later labs express kernels as fractions of them.
Copy bandwidth counts read + write bytes (a copy of N bytes moves 2N). Matmul rate counts 2*M*N*K FLOPs.
"""
from __future__ import annotations

from dataclasses import dataclass

from common import timing
from common.env import current


@dataclass
class Ceiling:
    name: str
    value: float  # GB/s or GFLOP/s
    unit: str
    detail: str
    timing: timing.Timing


def _device(device):
    return device or current().device


def copy_bytes(nbytes: int) -> int:
    """Bytes a device copy of an nbytes buffer moves: it reads nbytes and writes nbytes."""
    return 2 * nbytes


def matmul_flops(m: int, n: int, k: int) -> int:
    """FLOPs of an (m x k) @ (k x n) product: m*n*k multiply-adds, 2 FLOPs each."""
    return 2 * m * n * k


def measure_copy_bandwidth(nbytes: int | None = None, device: str | None = None, min_run_time: float = 0.2) -> Ceiling:
    """Copy a buffer of `nbytes` (default: 256 MiB on CPU, 1 GiB on GPU) into another; GB/s of read + write."""
    import torch
    dev = _device(device)
    nbytes = nbytes or (2**30 if dev == "cuda" else 2**28)
    if nbytes < 1024:
        raise ValueError(f"nbytes={nbytes} is too small to measure bandwidth; use at least 1024 bytes")
    n = nbytes // 4
    src = torch.rand(n, device=dev)
    dst = torch.empty_like(src)
    t = timing.bench(dst.copy_, src, label=f"copy {nbytes / 2**20:.0f} MiB", device=dev, min_run_time=min_run_time)
    if not torch.equal(dst, src):
        raise RuntimeError("copy produced a different buffer: the measurement is void")
    gbps = copy_bytes(n * 4) / t.median_s / 1e9
    return Ceiling("copy bandwidth", gbps, "GB/s", f"{dev}, {n * 4 / 2**20:.0f} MiB buffer, read+write", t)


def default_matmul_dtype(device: str):
    import torch
    return torch.bfloat16 if device == "cuda" else torch.float32


def measure_matmul_rate(n: int | None = None, dtype=None, device: str | None = None,
                        min_run_time: float = 0.2) -> Ceiling:
    """Square n x n matmul (default n: 2048 on CPU, 8192 on GPU; float32 on CPU, bf16 on GPU); GFLOP/s."""
    import torch
    dev = _device(device)
    n = n or (8192 if dev == "cuda" else 2048)
    if n < 16:
        raise ValueError(f"n={n} is too small for a matmul rate; use n >= 16")
    dtype = dtype or default_matmul_dtype(dev)
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    # verify before timing: a row of the product against float64
    got = (a @ b)[0].double()
    ref = a[0].double() @ b.double()
    tol = 1e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-4
    if not torch.allclose(got, ref, rtol=tol, atol=tol * n ** 0.5):
        raise RuntimeError("matmul result disagrees with a float64 reference: the measurement is void")
    t = timing.bench(torch.matmul, a, b, label=f"matmul {n}x{n} {str(dtype).replace('torch.', '')}", device=dev,
                     min_run_time=min_run_time)
    gflops = matmul_flops(n, n, n) / t.median_s / 1e9
    return Ceiling("matmul rate", gflops, "GFLOP/s", f"{dev}, {n}x{n}x{n}, {str(dtype).replace('torch.', '')}", t)


def bandwidth_sweep(sizes_bytes, device: str | None = None, min_run_time: float = 0.05):
    """Copy bandwidth (GB/s) for each buffer size: small buffers live in caches, large ones in DRAM/HBM."""
    return [measure_copy_bandwidth(s, device, min_run_time) for s in sizes_bytes]
