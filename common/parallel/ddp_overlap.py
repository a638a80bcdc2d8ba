"""Data-parallel gradient all-reduce overlapped with the backward pass, measured against a fair baseline: hand-made
buckets and DDP itself.

Each rank of a process group holds the same MLP (`layers` x Linear(hidden, hidden) + ReLU) and its own batch; a
step's gradients are summed over ranks in buckets (up to `bucket_mb` MB each, in the order the backward produces
them: last layer first). Timed in turns (`common.parallel.overlap.time_round_robin`, a barrier before each), so
that every variant sees the same machine:

- `compute`: forward + backward, no communication;
- `comm`: the buckets' all-reduces alone, the FAIR way: every bucket launched (`async_op=True`), then all waited
  for -- as the overlapped step launches them, back to back;
- `comm_each`: the same all-reduces, each waited for before the next is launched (the unfair baseline an earlier
  version used: it charges comm with the gaps between buckets, which pipelining buckets removes with or without
  any overlap, and so credits overlap with a gain it did not make);
- `overlap`: each bucket's all-reduce launched from a gradient hook (`register_post_accumulate_grad_hook`, as DDP's
  autograd hooks do) as soon as the bucket is complete, while the backward goes on; then wait for all;
- `ddp`: `torch.nn.parallel.DistributedDataParallel` with the same bucket cap, beside its own `ddp_compute` (the
  step under `no_sync()`) and `ddp_comm` (all-reduces of DDP's own bucket sizes, launched all, then waited).

speedup = (compute + comm) / overlap, against ideal = (compute + comm) / max(compute, comm): overlap can at best
hide the shorter part. DDP: the same with its own compute and comm. A figure above its ideal is impossible for
overlap itself (a part timed alone was slowed by the machine): `above_ideal` lists each one. The overlapped and DDP
gradients are checked against the serial ones. `python -m common.parallel.ddp_overlap` runs it under torchrun.
"""
from __future__ import annotations

from common.core.validate import number, whole
from common.parallel.overlap import time_round_robin

VARIANTS = ("compute_s", "comm_s", "comm_each_s", "overlap_s", "ddp_s", "ddp_compute_s", "ddp_comm_s")


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
    """Sum gradients over ranks bucket by bucket: `all_then_wait()` after the backward (launch every bucket, then
    wait), `each_then_next()` (wait for each before the next), or `arm()` before the backward so that each bucket's
    all-reduce starts from a gradient hook as soon as the bucket is complete, then `finish()`."""

    def __init__(self, params: list, bucket_mb: float):
        self.buckets = buckets_of(params, bucket_mb)
        self.index = {id(p): b for b, bucket in enumerate(self.buckets) for p in bucket}
        self.armed, self.ready, self.works = False, [0] * len(self.buckets), []
        for p in params:
            p.register_post_accumulate_grad_hook(self._hook)

    def _launch(self, b: int):
        import torch
        import torch.distributed as dist
        flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[b]])
        return b, flat, dist.all_reduce(flat, async_op=True)

    def _land(self, b: int, flat, work) -> None:
        import torch.distributed as dist
        work.wait()
        offset, ws = 0, dist.get_world_size()
        for p in self.buckets[b]:
            n = p.numel()
            p.grad.copy_(flat[offset:offset + n].view_as(p.grad)).div_(ws)
            offset += n

    def _hook(self, p) -> None:
        if self.armed:
            b = self.index[id(p)]
            self.ready[b] += 1
            if self.ready[b] == len(self.buckets[b]):
                self.works.append(self._launch(b))

    def arm(self) -> None:
        self.armed, self.ready, self.works = True, [0] * len(self.buckets), []

    def finish(self) -> None:
        if len(self.works) != len(self.buckets):
            raise RuntimeError(f"only {len(self.works)} of {len(self.buckets)} buckets were reduced: a parameter "
                               f"got no gradient")
        for launched in self.works:
            self._land(*launched)
        self.armed, self.works = False, []

    def all_then_wait(self) -> None:
        for launched in [self._launch(b) for b in range(len(self.buckets))]:
            self._land(*launched)

    def each_then_next(self) -> None:
        for b in range(len(self.buckets)):
            self._land(*self._launch(b))


def ddp_buckets(ddp) -> list:
    """Zero tensors the size of DDP's gradient buckets, in its order, once it has rebuilt them (after its first
    step: it starts with one bucket and re-buckets in the order the gradients came)."""
    return [bucket.buffer() for bucket in ddp.reducer._get_zeros_like_grad_buckets()]


def ddp_overlap_worker(rank: int, world_size: int, layers: int = 8, hidden: int = 512, batch: int = 32,
                       bucket_mb: float = 2.0, repeats: int = 7, threads: int = 1) -> dict:
    """Median seconds of every variant (VARIANTS) on this rank, the gradients' agreement, the bucket sizes."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from common.parallel.ranks import synchronize, worker_device

    torch.set_num_threads(threads)
    dev = worker_device()  # the rank's GPU under NCCL, else the CPU
    model = make_mlp(layers, hidden).to(dev)
    params = list(model.parameters())
    reducer = BucketedAllReduce(params, bucket_mb)
    ddp = DistributedDataParallel(make_mlp(layers, hidden).to(dev), bucket_cap_mb=bucket_mb,
                                  device_ids=[dev.index] if dev.type == "cuda" else None)
    gen = torch.Generator().manual_seed(100 + rank)
    x, y = torch.randn(batch, hidden, generator=gen).to(dev), torch.randn(batch, hidden, generator=gen).to(dev)

    def backward(m):
        m.zero_grad(set_to_none=False)
        ((m(x) - y) ** 2).mean().backward()

    def overlapped():
        reducer.arm()
        backward(model)
        reducer.finish()

    def ddp_compute():
        with ddp.no_sync():
            backward(ddp)

    for _ in range(2):  # warm-up; DDP rebuilds its buckets after its first step
        backward(ddp)
    ddp_flats = ddp_buckets(ddp)

    def ddp_comm():
        for work in [dist.all_reduce(f, async_op=True) for f in ddp_flats]:
            work.wait()

    fns = {"compute_s": lambda: backward(model), "comm_s": reducer.all_then_wait,
           "comm_each_s": reducer.each_then_next, "overlap_s": overlapped, "ddp_s": lambda: backward(ddp),
           "ddp_compute_s": ddp_compute,
           "ddp_comm_s": ddp_comm}
    for f in fns.values():  # warm-up
        f()
    backward(model)
    reducer.all_then_wait()
    ref = [p.grad.clone() for p in params]
    overlapped()
    err = max(float((p.grad - r).abs().max()) for p, r in zip(params, ref))
    backward(ddp)
    err_ddp = max(float((p.grad - r).abs().max()) for p, r in zip(ddp.module.parameters(), ref))
    t = time_round_robin({k: (lambda f=f: (f(), synchronize())) for k, f in fns.items()}, repeats,
                         lambda: (synchronize(), dist.barrier()))
    return {**t, "grad_err": err, "ddp_grad_err": err_ddp, "buckets": len(reducer.buckets),
            "ddp_buckets": len(ddp_flats), "grad_mb": sum(p.numel() * p.element_size() for p in params) / 2**20}


def ddp_task(world_size: int = 2, layers: int = 8, hidden: int = 512, batch: int = 32, bucket_mb: float = 2.0,
             repeats: int = 7, backend: str | None = "gloo") -> tuple:
    """(ddp_overlap_worker, args), every argument checked now -- before any process starts."""
    from common.parallel.ranks import check_world_size
    check_world_size(world_size, backend)
    if world_size < 2:
        raise ValueError(f"world_size={world_size}: data parallelism needs at least 2 ranks")
    for name, v in (("layers", layers), ("hidden", hidden), ("batch", batch), ("repeats", repeats)):
        whole(name, v)
    number("bucket_mb", bucket_mb, meaning="MB")
    return ddp_overlap_worker, (layers, hidden, batch, bucket_mb, repeats)


def summarize(per_rank: list) -> dict:
    """The slowest rank's medians; speedup and ideal (hooks, fair baseline), ddp_speedup and ddp_ideal (DDP's own
    compute and comm), the same two against the unfair baseline (`*_each`), and `above_ideal`: the names of the
    figures above their ideal, with both values."""
    out = {k: max(r[k] for r in per_rank) for k in VARIANTS + ("grad_err", "ddp_grad_err")}
    for k in ("buckets", "ddp_buckets", "grad_mb"):
        out[k] = per_rank[0][k]

    def gain(compute, comm, step):
        return (compute + comm) / step, (compute + comm) / max(compute, comm)
    out["sum_s"] = out["compute_s"] + out["comm_s"]
    out["speedup"], out["ideal"] = gain(out["compute_s"], out["comm_s"], out["overlap_s"])
    out["ddp_speedup"], out["ddp_ideal"] = gain(out["ddp_compute_s"], out["ddp_comm_s"], out["ddp_s"])
    out["speedup_each"], out["ideal_each"] = gain(out["compute_s"], out["comm_each_s"], out["overlap_s"])
    out["above_ideal"] = {name: (out[name], out[ideal]) for name, ideal in
                          (("speedup", "ideal"), ("ddp_speedup", "ddp_ideal"), ("speedup_each", "ideal_each"))
                          if out[name] > out[ideal]}
    return out


def measure_ddp_overlap(world_size: int = 2, layers: int = 8, hidden: int = 512, batch: int = 32,
                        bucket_mb: float = 2.0, repeats: int = 7, backend: str | None = "gloo",
                        timeout: float = 180) -> dict:
    """Run `ddp_overlap_worker` on `world_size` ranks and `summarize`. All arguments are checked before a process
    starts."""
    from common.parallel.distributed import run_workers
    worker, args = ddp_task(world_size, layers, hidden, batch, bucket_mb, repeats, backend)
    return summarize(run_workers(worker, world_size, args=args, backend=backend, timeout=timeout))


def flagged(d: dict) -> list:
    """One line per figure above its ideal: printed, never silent."""
    return [f"FLAG {name} {v:.2f}x is above its ideal {ideal:.2f}x: overlap cannot beat hiding the shorter part "
            f"completely, so a part timed alone was slowed by the machine -- not a gain"
            for name, (v, ideal) in d["above_ideal"].items()]


def main() -> None:
    """`torchrun --nnodes N --nproc-per-node G -m common.parallel.ddp_overlap`: every rank measures; rank 0 prints
    and records ddp.overlap.speedup and ddp.overlap.ideal (as lab 08 does)."""
    from common.core import results
    from common.parallel import torchrun
    ap = torchrun.parser("DDP gradient all-reduce overlapped with the backward, against a fair baseline")
    for name, default in (("--layers", 8), ("--hidden", 1024), ("--batch", 64), ("--repeats", 15)):
        ap.add_argument(name, type=int, default=default)
    ap.add_argument("--bucket-mb", type=float, default=2.0)
    a = ap.parse_args()
    worker, args = ddp_task(torchrun.world_size(), a.layers, a.hidden, a.batch, a.bucket_mb, a.repeats, a.backend)

    def report(per_rank):
        d = summarize(per_rank)
        print(" | ".join(f"{k} {d[k] * 1e3:.2f} ms" for k in VARIANTS))
        print(f"hooks {d['speedup']:.2f}x (ideal {d['ideal']:.2f}x), DDP {d['ddp_speedup']:.2f}x (ideal "
              f"{d['ddp_ideal']:.2f}x); gradients vs serial {d['grad_err']:.1e}, {d['ddp_grad_err']:.1e}")
        print("\n".join(flagged(d)))
        results.record("ddp.overlap.speedup", d["speedup"], "x", higher_is_better=True,
                       note="(compute + comm) / overlapped, comm launched all then waited (torchrun)")
        results.record("ddp.overlap.ideal", d["ideal"], "x", measured=True,
                       note="(compute + comm) / max(compute, comm) (torchrun)")
    torchrun.main("08_pipeline_dualpipe", worker, args, report, a.backend)


if __name__ == "__main__":
    main()
