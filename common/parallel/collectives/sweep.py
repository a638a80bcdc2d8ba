"""Collectives measured: `measure(...)` spawns ONE process group (common.parallel.distributed.run_workers) and sweeps
message sizes for one or several collectives (`sweep_worker`); `Sweep` holds the times in nccl-tests' shape (algbw,
busbw) and fits the model. Several machines: `torchrun ... -m common.parallel.collectives` (`main`)."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Sequence

from common.core.validate import whole
from common.parallel.collectives.cost_model import COLLECTIVES, DTYPE_BYTES, algbw, busbw, check_bytes, check_collective
from common.parallel.collectives.fit import Fit, fit_alpha_beta


def elements_for(collective: str, n_bytes: float, p: int, element_size: int) -> int:
    """Element count of the message buffer for `n_bytes` (at least p, a multiple of p where the op splits it)."""
    n = max(1, int(round(n_bytes / element_size)))
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        n = max(p, (n // p) * p)
    return n


def iterations_for(n_bytes: float, target_bytes: float = 2**24, min_iters: int = 2, max_iters: int = 50) -> int:
    """Timed calls per repeat: enough to move ~target_bytes, within [min_iters, max_iters]. A function of the size
    only, so every rank runs the same number of calls (a rank that ran one more would wait for ever)."""
    return int(min(max_iters, max(min_iters, target_bytes // max(1, n_bytes))))


def sweep_worker(rank: int, world_size: int, collectives: Sequence[str], sizes_bytes: Sequence[float],
                 repeats: int = 5, warmup: int = 2, dtype: str = "float32", target_bytes: float = 2**24,
                 max_iters: int = 50) -> dict:
    """Inside a process group: for each collective and size, time `repeats` blocks of calls.

    Returns {collective: {"bytes": [...], "seconds": [[per-call seconds of each repeat] per size]}} for this rank.
    """
    import torch
    import torch.distributed as dist

    from common.parallel.ranks import synchronize, worker_device

    device = worker_device()
    tdtype = getattr(torch, dtype)
    esize = torch.tensor([], dtype=tdtype).element_size()
    out: dict = {}
    for coll in collectives:
        rec = {"bytes": [], "seconds": []}
        for size in sizes_bytes:
            n = elements_for(coll, size, world_size, esize)
            op = _make_op(coll, n, world_size, device, tdtype)
            for _ in range(warmup):
                op()
            synchronize()
            iters = iterations_for(n * esize, target_bytes, max_iters=max_iters)
            times = []
            for _ in range(repeats):
                dist.barrier()
                synchronize()
                t0 = time.perf_counter()
                for _ in range(iters):
                    op()
                synchronize()
                times.append((time.perf_counter() - t0) / iters)
            rec["bytes"].append(n * esize)
            rec["seconds"].append(times)
            del op
        out[coll] = rec
    return out


def _make_op(collective: str, n: int, p: int, device, dtype):
    import torch
    import torch.distributed as dist
    if collective == "all_reduce":
        x = torch.ones(n, device=device, dtype=dtype)
        return lambda: dist.all_reduce(x)
    if collective == "all_gather":
        inp, outp = torch.ones(n // p, device=device, dtype=dtype), torch.empty(n, device=device, dtype=dtype)
        return lambda: dist.all_gather_into_tensor(outp, inp)
    if collective == "reduce_scatter":
        inp, outp = torch.ones(n, device=device, dtype=dtype), torch.empty(n // p, device=device, dtype=dtype)
        return lambda: dist.reduce_scatter_tensor(outp, inp)
    if collective == "all_to_all":
        inp, outp = torch.ones(n, device=device, dtype=dtype), torch.empty(n, device=device, dtype=dtype)
        return lambda: dist.all_to_all_single(outp, inp)
    x = torch.ones(n, device=device, dtype=dtype)
    return lambda: dist.broadcast(x, 0)


@dataclass
class Sweep:
    """Measured times of one collective over p ranks: per size, the median over repeats of the slowest rank."""

    collective: str
    p: int
    backend: str
    sizes_bytes: list
    seconds: list
    spread: list = field(default_factory=list)  # IQR / median over repeats, per size
    fastest: list = field(default_factory=list)  # the fastest repeat (of the slowest rank), per size

    @property
    def algbw_gbps(self) -> list:
        return [algbw(n, t) / 1e9 for n, t in zip(self.sizes_bytes, self.seconds)]

    @property
    def busbw_gbps(self) -> list:
        return [busbw(self.collective, n, t, self.p) / 1e9 for n, t in zip(self.sizes_bytes, self.seconds)]

    def fit(self, stat: str = "median") -> Fit:
        """Fit alpha and B to the median times, or (stat="fastest") to the fastest repeat of each size: on a shared
        machine noise only ever adds time, so the fastest repeat is the steadiest estimate of what the link does."""
        if stat not in ("median", "fastest"):
            raise ValueError(f"stat={stat!r}; allowed: 'median', 'fastest'")
        times = self.fastest if stat == "fastest" else self.seconds
        return fit_alpha_beta(self.sizes_bytes, times, self.p, self.collective)

    def table(self):
        """A pandas table in nccl-tests' shape: size, time (us), algbw and busbw (GB/s)."""
        import pandas as pd
        return pd.DataFrame({"size_bytes": self.sizes_bytes, "time_us": [t * 1e6 for t in self.seconds],
                             "algbw_GBps": self.algbw_gbps, "busbw_GBps": self.busbw_gbps,
                             "spread": self.spread}).set_index("size_bytes")


def combine(per_rank: list, backend: str) -> dict:
    """Per-rank sweep_worker results -> {collective: Sweep}: the slowest rank of each repeat, then the median."""
    p = len(per_rank)
    sweeps = {}
    for coll in per_rank[0]:
        sizes = per_rank[0][coll]["bytes"]
        meds, spreads, fastest = [], [], []
        for i in range(len(sizes)):
            n_rep = len(per_rank[0][coll]["seconds"][i])
            reps = [max(r[coll]["seconds"][i][k] for r in per_rank) for k in range(n_rep)]
            med = statistics.median(reps)
            q = statistics.quantiles(reps, n=4, method="inclusive") if len(reps) > 1 else [med, med, med]
            meds.append(med)
            fastest.append(min(reps))
            spreads.append((q[2] - q[0]) / med if med > 0 else float("nan"))
        sweeps[coll] = Sweep(coll, p, backend, list(sizes), meds, spreads, fastest)
    return sweeps


def sweep_task(sizes_bytes: Sequence[float], world_size: int, collectives: Sequence[str] = ("all_reduce",),
               backend: str | None = None, repeats: int = 5, warmup: int = 2, dtype: str = "float32",
               target_bytes: float = 2**24, max_iters: int = 50) -> tuple:
    """(sweep_worker, args), validated now -- before any process starts -- for `run_workers` or one task of
    `common.parallel.distributed.tasks_worker` (a lab that measures several things in one process group)."""
    from common.parallel import distributed
    if not sizes_bytes:
        raise ValueError("sizes_bytes is empty: give at least one message size")
    for s in sizes_bytes:
        check_bytes(s, "message size")
    for c in collectives:
        check_collective(c)
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype={dtype!r} is not supported; allowed: {', '.join(DTYPE_BYTES)}")
    whole("repeats", repeats)
    whole("max_iters", max_iters)
    distributed.check_world_size(world_size, backend)
    return sweep_worker, (list(collectives), list(sizes_bytes), repeats, warmup, dtype, target_bytes, max_iters)


def measure(sizes_bytes: Sequence[float], world_size: int, collectives: Sequence[str] = ("all_reduce",),
            backend: str | None = None, repeats: int = 5, warmup: int = 2, dtype: str = "float32",
            target_bytes: float = 2**24, max_iters: int = 50, timeout: float = 300) -> dict:
    """Sweep message sizes for each collective in ONE process group of `world_size` ranks; {collective: Sweep}."""
    from common.parallel import distributed
    worker, args = sweep_task(sizes_bytes, world_size, collectives, backend, repeats, warmup, dtype, target_bytes,
                              max_iters)
    backend = distributed.check_backend(backend)
    return combine(distributed.run_workers(worker, world_size, args=args, backend=backend, timeout=timeout), backend)


def log_sizes(lo: int, hi: int, factor: int = 4) -> list:
    """lo, lo*factor, ... up to hi (bytes)."""
    check_bytes(lo, "lo")
    check_bytes(hi, "hi")
    out, s = [], lo
    while s <= hi:
        out.append(int(s))
        s *= factor
    return out



def main(argv: Sequence[str] | None = None) -> None:
    """`torchrun ... -m common.parallel.collectives`: the sweep on every rank (one process per GPU on every node);
    rank 0 prints an nccl-tests-like table and the alpha-beta fit and, for all_reduce, records
    collectives.fit.alpha_us and collectives.fit.beta_gbps (fitted on each size's fastest repeat, as lab 07 does)."""
    from common.core import results
    from common.parallel import torchrun
    ap = torchrun.parser("Collective bandwidth sweep", "common.parallel.collectives")
    ap.add_argument("--collective", default="all_reduce", choices=COLLECTIVES)
    ap.add_argument("--min-bytes", type=int, default=2**10)
    ap.add_argument("--max-bytes", type=int, default=2**28)
    ap.add_argument("--factor", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPE_BYTES))
    a = torchrun.parse(ap, argv)
    worker, args = sweep_task(log_sizes(a.min_bytes, a.max_bytes, a.factor), torchrun.world_size(), [a.collective],
                              a.backend, a.repeats, dtype=a.dtype)

    def report(per_rank):
        import torch.distributed as dist
        sweep = combine(per_rank, dist.get_backend())[a.collective]
        fit = sweep.fit("fastest")
        print(f"# {a.collective}, {sweep.p} ranks, backend {sweep.backend}, dtype {a.dtype}")
        print(sweep.table().to_string(float_format=lambda v: f"{v:.3f}"))
        print(f"# fit (fastest repeats): {fit}")
        if a.collective == "all_reduce":
            results.record("collectives.fit.alpha_us", fit.alpha_us, "us", higher_is_better=False,
                           note=f"{sweep.backend}, {fit.p} ranks, ring all-reduce model (torchrun)")
            results.record("collectives.fit.beta_gbps", fit.beta_gbps, "GB/s", higher_is_better=True,
                           note=f"{sweep.backend}, {fit.p} ranks, bus bandwidth of the fitted model (torchrun)")
    torchrun.main("07_collectives", worker, args, report, a.backend)
