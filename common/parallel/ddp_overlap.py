"""Data-parallel gradient all-reduce overlapped with the backward pass, measured: hand-made buckets and DDP itself.

Each rank of a `common.parallel.distributed.run_workers` group holds the same MLP (`layers` x Linear(hidden, hidden) + ReLU)
and its own batch. A training step's gradients must be summed over ranks. Five variants, timed in turns
(`common.parallel.overlap.time_round_robin`, a barrier before each) so that all see the same machine:

- `compute`: forward + backward, no communication;
- `comm`: the bucketed all-reduce of those gradients alone (same buckets, same calls);
- `serial`: forward + backward, then the all-reduces (not overlapped);
- `overlap`: the all-reduce of a bucket starts, asynchronously, as soon as the backward has produced all its
  gradients (`Tensor.register_post_accumulate_grad_hook`, as DDP does with its autograd hooks), while the backward
  goes on with the earlier layers; the step waits for the last bucket;
- `ddp`: `torch.nn.parallel.DistributedDataParallel` with the same bucket size.

Buckets hold the gradients in the order the backward produces them (last layer first), up to `bucket_mb` MB each.
The serial baseline is compute + comm, each timed alone the same way; speedup = (compute + comm) / overlapped and the
ideal (compute + comm) / max(compute, comm). The overlapped and DDP gradients are checked against the serial ones.
"""
from __future__ import annotations

from common.core.validate import whole
from common.parallel.overlap import time_round_robin


def make_mlp(layers: int, hidden: int, seed: int = 0):
    """The same `layers` x (Linear + ReLU) on every rank (seeded)."""
    import torch
    torch.manual_seed(seed)
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(hidden, hidden), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods)


def buckets_of(params: list, bucket_mb: float) -> list:
    """Gradient buckets in backward order (the last parameter first), each up to `bucket_mb` MB (at least one
    tensor): a list of lists of parameters."""
    cap = bucket_mb * 2**20
    out, cur, size = [], [], 0
    for p in reversed(params):
        nbytes = p.numel() * p.element_size()
        if cur and size + nbytes > cap:
            out.append(cur)
            cur, size = [], 0
        cur.append(p)
        size += nbytes
    if cur:
        out.append(cur)
    return out


class BucketedAllReduce:
    """Sum gradients over ranks bucket by bucket: `run()` after the backward (serial), or `arm()` before it so that
    each bucket's all-reduce starts from a gradient hook as soon as the bucket is complete, then `finish()`."""

    def __init__(self, params: list, bucket_mb: float):
        self.buckets = buckets_of(params, bucket_mb)
        self.index = {id(p): b for b, bucket in enumerate(self.buckets) for p in bucket}
        self.armed = False
        self.ready = [0] * len(self.buckets)
        self.works = []
        for p in params:
            p.register_post_accumulate_grad_hook(self._hook)

    def _flat(self, b):
        import torch
        return torch.cat([p.grad.reshape(-1) for p in self.buckets[b]])

    def _unflatten(self, b, flat, world_size):
        offset = 0
        for p in self.buckets[b]:
            n = p.numel()
            p.grad.copy_(flat[offset:offset + n].view_as(p.grad)).div_(world_size)
            offset += n

    def _hook(self, p):
        if not self.armed:
            return
        import torch.distributed as dist
        b = self.index[id(p)]
        self.ready[b] += 1
        if self.ready[b] == len(self.buckets[b]):
            flat = self._flat(b)
            self.works.append((b, flat, dist.all_reduce(flat, async_op=True)))

    def arm(self):
        self.armed, self.ready, self.works = True, [0] * len(self.buckets), []

    def finish(self):
        import torch.distributed as dist
        ws = dist.get_world_size()
        for b, flat, work in self.works:
            work.wait()
            self._unflatten(b, flat, ws)
        if len(self.works) != len(self.buckets):
            raise RuntimeError(f"only {len(self.works)} of {len(self.buckets)} buckets were reduced: a parameter got "
                               f"no gradient")
        self.armed, self.works = False, []

    def run(self):
        import torch.distributed as dist
        ws = dist.get_world_size()
        for b in range(len(self.buckets)):
            flat = self._flat(b)
            dist.all_reduce(flat)
            self._unflatten(b, flat, ws)


def ddp_overlap_worker(rank: int, world_size: int, layers: int = 8, hidden: int = 512, batch: int = 32,
                       bucket_mb: float = 2.0, repeats: int = 7, threads: int = 1) -> dict:
    """Median seconds of compute, comm, serial, overlap and ddp on this rank, and the gradients' agreement."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from common.parallel.distributed import synchronize, worker_device

    torch.set_num_threads(threads)
    dev = worker_device()  # the rank's GPU under NCCL, else the CPU
    model = make_mlp(layers, hidden).to(dev)
    params = list(model.parameters())
    reducer = BucketedAllReduce(params, bucket_mb)
    ddp = DistributedDataParallel(make_mlp(layers, hidden).to(dev), bucket_cap_mb=bucket_mb,
                                  device_ids=[dev.index] if dev.type == "cuda" else None)
    g = torch.Generator().manual_seed(100 + rank)
    x, y = torch.randn(batch, hidden, generator=g).to(dev), torch.randn(batch, hidden, generator=g).to(dev)

    def backward(m):
        m.zero_grad(set_to_none=False)
        ((m(x) - y) ** 2).mean().backward()

    def compute():
        backward(model)

    def comm():
        reducer.run()

    def serial():
        backward(model)
        reducer.run()

    def overlapped():
        reducer.arm()
        backward(model)
        reducer.finish()

    def with_ddp():
        backward(ddp)

    for f in (compute, comm, serial, overlapped, with_ddp):  # warm-up (DDP builds its buckets on the first step)
        f()
    serial()
    ref = [p.grad.clone() for p in params]
    overlapped()
    err = max(float((p.grad - r).abs().max()) for p, r in zip(params, ref))
    with_ddp()
    err_ddp = max(float((p.grad - r).abs().max()) for p, r in zip(ddp.module.parameters(), ref))
    fns = {"compute_s": compute, "comm_s": comm, "serial_s": serial, "overlap_s": overlapped, "ddp_s": with_ddp}
    t = time_round_robin({k: (lambda f=f: (f(), synchronize())) for k, f in fns.items()}, repeats,
                         lambda: (synchronize(), dist.barrier()))
    return {**t, "grad_err": err, "ddp_grad_err": err_ddp, "buckets": len(reducer.buckets),
            "grad_mb": sum(p.numel() * p.element_size() for p in params) / 2**20}


def measure_ddp_overlap(world_size: int = 2, layers: int = 8, hidden: int = 512, batch: int = 32,
                        bucket_mb: float = 2.0, repeats: int = 7, backend: str | None = "gloo",
                        timeout: float = 180) -> dict:
    """Run `ddp_overlap_worker` on `world_size` ranks; the slowest rank's medians, speed-ups and the ideal.

    speedup = (compute + comm) / overlap (hand-made buckets), ddp_speedup the same with DDP, ideal
    = (compute + comm) / max(compute, comm). All arguments are checked before a process starts.
    """
    from common.parallel.distributed import check_world_size, run_workers
    check_world_size(world_size, backend)
    if world_size < 2:
        raise ValueError(f"world_size={world_size}: data parallelism needs at least 2 ranks")
    for name, v in (("layers", layers), ("hidden", hidden), ("batch", batch), ("repeats", repeats)):
        whole(name, v)
    if not isinstance(bucket_mb, (int, float)) or not bucket_mb > 0:
        raise ValueError(f"bucket_mb={bucket_mb!r} must be a number of MB > 0")
    per_rank = run_workers(ddp_overlap_worker, world_size, args=(layers, hidden, batch, bucket_mb, repeats),
                           backend=backend, timeout=timeout)
    out = {k: max(r[k] for r in per_rank) for k in ("compute_s", "comm_s", "serial_s", "overlap_s", "ddp_s",
                                                    "grad_err", "ddp_grad_err")}
    out["buckets"], out["grad_mb"] = per_rank[0]["buckets"], per_rank[0]["grad_mb"]
    a, b = out["compute_s"], out["comm_s"]
    out["sum_s"] = a + b
    out["speedup"] = (a + b) / out["overlap_s"]
    out["ddp_speedup"] = (a + b) / out["ddp_s"]
    out["ideal"] = (a + b) / max(a, b)
    return out
