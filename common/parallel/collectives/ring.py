"""A ring all-reduce built from point-to-point messages (the reference of lab 07's build exercise), and running a
learner's on real ranks: checked against `dist.all_reduce` and timed beside it.

`ring_all_reduce(x, rank, world_size, dist)` sums `x` over the ranks in place: the tensor is cut into `world_size`
chunks (`torch.tensor_split`, so any size works, empty chunks included); p - 1 reduce-scatter steps (at step k rank r
sends chunk r - k to rank r + 1 and adds what rank r - 1 sends into chunk r - k - 1, so that rank r ends with chunk
r + 1 summed over every rank), then p - 1 all-gather steps (send chunk r + 1 - k, receive chunk r - k in place). Each
step's send and receive go out together in one `dist.batch_isend_irecv`: under NCCL a lone send waits for its
receive, and p ranks each sending first would wait on each other forever. `dist` is `torch.distributed` on real
ranks, or a `common.parallel.rendezvous.ThreadDist` with NCCL's rules on threads.

A learner's function lives in a notebook, which the ranks cannot import: `ring_task(fn, ...)` sends its source, and
each rank defines it again (`learner_function`) with torch and math at hand -- so it must not use other names of the
notebook.
"""
from __future__ import annotations

import inspect
import statistics
import textwrap
import time

from common.core.validate import whole


def ring_all_reduce(x, rank: int, world_size: int, dist):
    """Sum `x` over the ranks, in place (as dist.all_reduce does), with a ring of point-to-point messages; x."""
    import torch
    p = world_size
    if p == 1:
        return x
    chunks = torch.tensor_split(x.view(-1), p)
    right, left = (rank + 1) % p, (rank - 1) % p
    for step in range(p - 1):  # reduce-scatter
        mine, theirs = chunks[(rank - step) % p], chunks[(rank - step - 1) % p]
        buf = torch.empty_like(theirs)
        for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, right), dist.P2POp(dist.irecv, buf, left)]):
            work.wait()
        theirs += buf
    for step in range(p - 1):  # all-gather
        mine, theirs = chunks[(rank + 1 - step) % p], chunks[(rank - step) % p]
        for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, right), dist.P2POp(dist.irecv, theirs, left)]):
            work.wait()
    return x


def source_of(fn) -> tuple[str, str]:
    """(source, name) of a function, to define it again in a rank; ValueError when its source cannot be read."""
    try:
        src = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        raise ValueError(f"the source of {getattr(fn, '__name__', fn)!r} cannot be read (a lambda, a built-in?): "
                         f"define it with def in a notebook cell") from None
    return src, fn.__name__


def learner_function(source: str, name: str):
    """The function `name` defined by `source`, in a namespace that has torch and math (inside a rank)."""
    import math

    import torch
    namespace = {"torch": torch, "math": math, "__name__": "learner"}
    exec(compile(source, f"<your {name}>", "exec"), namespace)  # the learner's own cell, run again in this rank
    return namespace[name]


def ring_worker(rank: int, world_size: int, source: str, name: str, sizes, repeats: int = 5, seed: int = 0) -> dict:
    """This rank's record: the worst difference of the learner's ring from dist.all_reduce over random tensors of
    each size (float32, fresh each size), and per size the median time of each (timed in turns, a barrier before each
    call)."""
    import torch
    import torch.distributed as dist

    from common.parallel.ranks import synchronize, worker_device
    fn = learner_function(source, name)
    device, err, mine, gloo = worker_device(), 0.0, [], []
    for i, n in enumerate(sizes):
        gen = torch.Generator().manual_seed(seed + 1000 * i + rank)
        x = torch.randn(n, generator=gen, dtype=torch.float64).float().to(device)
        ref = x.clone()
        dist.all_reduce(ref)
        got = fn(x.clone(), rank, world_size, dist)
        err = max(err, float((got - ref).abs().max()) if n else 0.0)
        calls = ((lambda: fn(x.clone(), rank, world_size, dist)), (lambda: dist.all_reduce(x.clone())))
        times = ([], [])
        for _ in range(repeats):  # in turns, so that a moment of load falls on both alike
            for call, out in zip(calls, times):
                dist.barrier()
                t0 = time.perf_counter()
                call()
                synchronize()
                out.append(time.perf_counter() - t0)
        mine.append(statistics.median(times[0]))
        gloo.append(statistics.median(times[1]))
    return {"max_abs_err": err, "ring_s": mine, "all_reduce_s": gloo}


def ring_task(fn, sizes, world_size: int = 2, repeats: int = 5, backend: str | None = "gloo") -> tuple:
    """(ring_worker, args) for the learner's `fn`, checked now -- before any process starts."""
    from common.parallel.ranks import check_world_size
    check_world_size(world_size, backend)
    whole("repeats", repeats)
    for n in sizes:
        whole("sizes", n, minimum=0, meaning="elements")
    return ring_worker, (*source_of(fn), tuple(sizes), repeats)


def summarize_ring(per_rank: list, sizes) -> dict:
    """The slowest rank's median time per size, the worst error over the ranks, and the bytes of each size."""
    return {"max_abs_err": max(r["max_abs_err"] for r in per_rank), "bytes": [4 * n for n in sizes],
            "ring_s": [max(r["ring_s"][i] for r in per_rank) for i in range(len(sizes))],
            "all_reduce_s": [max(r["all_reduce_s"][i] for r in per_rank) for i in range(len(sizes))]}
