"""Data-parallel gradient all-reduce overlapped with the backward pass, measured honestly: hand-made buckets (hooks)
and DDP itself, on the same buckets, against the faster baseline and a bound that counts what cannot overlap.

Each rank of a process group holds the same MLP (`layers` x Linear(hidden, hidden) + ReLU) and its own batch; a
step's gradients are summed over ranks in buckets made by DDP's own rule (`buckets_of`: parameters in the order the
backward produces them, last layer first; a bucket closes once it holds `bucket_mb` or more -- so the hooks' buckets
are DDP's, counted in the output). The variants, timed in turns (`common.parallel.overlap.time_round_robin`, a barrier
before each) so that every one sees the same machine:

- `forward_s`; `compute_s` (forward + backward, no communication);
- `comm_all_s` (every bucket's all-reduce launched, then all waited for) and `comm_each_s` (each waited for before
  the next is launched): the baseline's comm is the FASTER of the two -- neither is a lower bound on gloo;
- `last_s`: the last bucket's all-reduce alone (it starts when the backward ends: it can never overlap);
- `overlap_s`: each bucket's all-reduce launched from a gradient hook (`register_post_accumulate_grad_hook`, as DDP's
  autograd hooks do) once the bucket is complete, while the backward goes on; then all waited for;
- `ddp_s`: `torch.nn.parallel.DistributedDataParallel` with the same cap, beside its own `ddp_forward_s`,
  `ddp_compute_s` (its step under `no_sync()`) and comm of its own buckets (`ddp_comm_all_s`, `ddp_comm_each_s`).

speedup = (compute + comm) / overlapped. The bound: gradients cannot be reduced before the backward makes them, so
the forward never overlaps, nor does the last bucket: ideal = (compute + comm) / (forward + max(backward, comm - last)
+ last). Ranks that share cores take turns instead: gloo's all-reduce is work for a core the backward is using
(`shared_cores`), so a speed-up there measures the machine's load as much as the overlap. Figures are medians over `runs` runs (each the slowest rank's medians of `repeats` rounds) with
their spread. A speed-up above its ideal is impossible for overlap itself and is flagged. The overlapped and DDP
gradients are checked against the serial ones. `python -m common.parallel.ddp_overlap` runs it under torchrun.
"""
from __future__ import annotations

import os
import statistics

from common.core.claims import readable
from common.core.validate import number, whole
from common.parallel.overlap import time_round_robin

VARIANTS = ("forward_s", "compute_s", "comm_all_s", "comm_each_s", "last_s", "overlap_s", "ddp_forward_s",
            "ddp_compute_s", "ddp_comm_all_s", "ddp_comm_each_s", "ddp_s")
FIGURES = ("speedup", "ideal", "ddp_speedup", "ddp_ideal")


def make_mlp(layers: int, hidden: int, seed: int = 0):
    """The same `layers` x (Linear + ReLU) on every rank (seeded)."""
    import torch
    torch.manual_seed(seed)
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(hidden, hidden), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods)


def buckets_of(params: list, bucket_mb: float) -> list:
    """DDP's buckets for `params` (in forward order): the parameters in backward order (the last first), a bucket
    closed once it holds `bucket_mb` MiB or more (so a bucket may pass the cap by its last tensor): lists of
    parameters. (DDP's first step uses a 1 MiB first bucket; it re-buckets after it, by this rule.)"""
    cap = bucket_mb * 2**20
    out, cur, size = [], [], 0
    for p in reversed(params):
        cur.append(p)
        size += p.numel() * p.element_size()
        if size >= cap:
            out.append(cur)
            cur, size = [], 0
    return out + [cur] if cur else out


class BucketedAllReduce:
    """Sum gradients over ranks bucket by bucket: `all_then_wait()` after the backward (launch every bucket, then
    wait), `each_then_next()` (wait for each before the next), `last_only()` (the last bucket alone), or `arm()`
    before the backward so that each bucket's all-reduce starts from a gradient hook as soon as the bucket is
    complete, then `finish()`."""

    def __init__(self, params: list, bucket_mb: float):
        self.buckets = buckets_of(params, bucket_mb)
        self.index = {id(p): b for b, bucket in enumerate(self.buckets) for p in bucket}
        self.position = {id(p): i for i, p in enumerate(params)}
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

    def last_only(self) -> None:
        import torch.distributed as dist
        dist.all_reduce(self._launch(len(self.buckets) - 1)[1])


def ddp_buckets(ddp) -> list:
    """DDP's gradient buckets as it holds them after its first step (it starts with a small first bucket and
    re-buckets in the order the gradients came): flat zero tensors of their sizes, and each one's parameters."""
    return [(b.buffer(), b.parameters()) for b in ddp.reducer._get_zeros_like_grad_buckets()]


def ddp_overlap_worker(rank: int, world_size: int, layers: int = 8, hidden: int = 512, batch: int = 32,
                       bucket_mb: float = 2.0, repeats: int = 7, runs: int = 5, threads: int = 1) -> dict:
    """Per run, this rank's median seconds of every variant (VARIANTS); the gradients' agreement; the buckets."""
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

    def forward(m):
        return ((m(x) - y) ** 2).mean()

    def backward(m):
        m.zero_grad(set_to_none=False)
        forward(m).backward()

    def overlapped():
        reducer.arm()
        backward(model)
        reducer.finish()

    def ddp_no_sync(fn):
        with ddp.no_sync():
            fn(ddp)

    for _ in range(2):  # warm-up; DDP re-buckets after its first step
        backward(ddp)
    flats = [flat for flat, _ in ddp_buckets(ddp)]

    def ddp_comm_all():
        for work in [dist.all_reduce(f, async_op=True) for f in flats]:
            work.wait()

    fns = {"forward_s": lambda: forward(model), "compute_s": lambda: backward(model),
           "comm_all_s": reducer.all_then_wait, "comm_each_s": reducer.each_then_next, "last_s": reducer.last_only,
           "overlap_s": overlapped, "ddp_forward_s": lambda: ddp_no_sync(forward),
           "ddp_compute_s": lambda: ddp_no_sync(backward), "ddp_comm_all_s": ddp_comm_all,
           "ddp_comm_each_s": lambda: [dist.all_reduce(f) for f in flats], "ddp_s": lambda: backward(ddp)}
    for f in fns.values():  # warm-up
        f()
    backward(model)
    reducer.all_then_wait()
    ref = [p.grad.clone() for p in params]
    overlapped()
    err = max(float((p.grad - r).abs().max()) for p, r in zip(params, ref))
    backward(ddp)
    err_ddp = max(float((p.grad - r).abs().max()) for p, r in zip(ddp.module.parameters(), ref))
    where = {p.data_ptr(): i for i, p in enumerate(ddp.module.parameters())}
    theirs = [sorted(where[p.data_ptr()] for p in ps) for _, ps in ddp_buckets(ddp)]
    mine = [sorted(reducer.position[id(p)] for p in b) for b in reducer.buckets]
    timed = [time_round_robin({k: (lambda f=f: (f(), synchronize())) for k, f in fns.items()}, repeats,
                              lambda: (synchronize(), dist.barrier())) for _ in range(runs)]
    return {"runs": timed, "grad_err": err, "ddp_grad_err": err_ddp, "same_buckets": mine == theirs,
            "buckets": [sum(p.numel() * p.element_size() for p in b) for b in reducer.buckets],
            "ddp_buckets": [f.numel() * f.element_size() for f in flats],
            "grad_mb": sum(p.numel() * p.element_size() for p in params) / 2**20}


def ddp_task(world_size: int = 2, layers: int = 8, hidden: int = 512, batch: int = 32, bucket_mb: float = 2.0,
             repeats: int = 7, backend: str | None = "gloo", runs: int = 5) -> tuple:
    """(ddp_overlap_worker, args), every argument checked now -- before any process starts."""
    from common.parallel.ranks import check_world_size
    check_world_size(world_size, backend)
    if world_size < 2:
        raise ValueError(f"world_size={world_size}: data parallelism needs at least 2 ranks")
    for name, v in (("layers", layers), ("hidden", hidden), ("batch", batch), ("repeats", repeats), ("runs", runs)):
        whole(name, v)
    number("bucket_mb", bucket_mb, meaning="MB")
    return ddp_overlap_worker, (layers, hidden, batch, bucket_mb, repeats, runs)


def ideal(forward: float, compute: float, comm: float, last: float) -> float:
    """The most overlap can give: (compute + comm) / (forward + max(backward, comm - last) + last) -- the forward
    runs before any gradient exists, and the last bucket's all-reduce after the backward has ended."""
    return (compute + comm) / (forward + max(compute - forward, comm - last) + last)


def figures(t: dict) -> dict:
    """One run's figures from its (slowest-rank) medians: the baseline comm is the faster way of the two."""
    comm, ddp_comm = min(t["comm_all_s"], t["comm_each_s"]), min(t["ddp_comm_all_s"], t["ddp_comm_each_s"])
    return {"comm_s": comm, "ddp_comm_s": ddp_comm, "speedup": (t["compute_s"] + comm) / t["overlap_s"],
            "ideal": ideal(t["forward_s"], t["compute_s"], comm, t["last_s"]),
            "ddp_speedup": (t["ddp_compute_s"] + ddp_comm) / t["ddp_s"],
            "ddp_ideal": ideal(t["ddp_forward_s"], t["ddp_compute_s"], ddp_comm, t["last_s"])}


def summarize(per_rank: list, ranks_here: int | None = None, cores: int | None = None) -> dict:
    """Medians over the runs of each variant (the slowest rank's) and of each figure (`figures`), each figure's
    spread (min, max) over the runs, the buckets (bytes each; `same_buckets`: the hooks' parameters grouped as DDP's),
    `shared_cores` (fewer than two cores for each of the `ranks_here` ranks of this machine: gloo's all-reduce and the
    backward take turns on them), and `above_ideal`."""
    runs = [{k: max(r["runs"][i][k] for r in per_rank) for k in VARIANTS} for i in range(len(per_rank[0]["runs"]))]
    runs = [{**t, **figures(t)} for t in runs]
    out = {k: statistics.median(t[k] for t in runs) for k in runs[0]}
    out["spread"] = {k: (min(t[k] for t in runs), max(t[k] for t in runs)) for k in FIGURES}
    out["runs"] = len(runs)
    for k in ("buckets", "ddp_buckets", "grad_mb"):
        out[k] = per_rank[0][k]
    out["same_buckets"] = all(r["same_buckets"] for r in per_rank)
    out["grad_err"] = max(r["grad_err"] for r in per_rank)
    out["ddp_grad_err"] = max(r["ddp_grad_err"] for r in per_rank)
    out["cores_per_rank"] = (cores or os.cpu_count() or 1) / (ranks_here or len(per_rank))
    out["shared_cores"] = out["cores_per_rank"] < 2
    out["above_ideal"] = {name: (out[name], out[bound]) for name, bound in
                          (("speedup", "ideal"), ("ddp_speedup", "ddp_ideal")) if out[name] > out[bound] * (1 + 1e-9)}
    return out


def measure_ddp_overlap(world_size: int = 2, layers: int = 8, hidden: int = 512, batch: int = 32,
                        bucket_mb: float = 2.0, repeats: int = 7, backend: str | None = "gloo",
                        timeout: float = 180, runs: int = 5) -> dict:
    """Run `ddp_overlap_worker` on `world_size` ranks and `summarize`. All arguments are checked before a process
    starts."""
    from common.parallel.distributed import run_workers
    worker, args = ddp_task(world_size, layers, hidden, batch, bucket_mb, repeats, backend, runs)
    return summarize(run_workers(worker, world_size, args=args, backend=backend, timeout=timeout), world_size)


def flagged(d: dict) -> list:
    """One line per figure above its ideal: printed, never silent."""
    return [f"FLAG {name} {v:.2f}x is above its ideal {bound:.2f}x: overlap cannot beat hiding all that can be "
            f"hidden, so a part timed alone was slowed by the machine -- not a gain"
            for name, (v, bound) in d["above_ideal"].items()]


def lines(d: dict) -> list:
    """What a run says: buckets, the medians, the figures with their spread, the bound for shared cores."""
    def fig(k):
        lo, hi = d["spread"][k]
        return f"{d[k]:.2f}x ({lo:.2f}-{hi:.2f})"
    mb = [f"{b / 2**20:.2f}" for b in d["buckets"]]
    out = [f"{d['grad_mb']:.1f} MB of gradients in {len(d['buckets'])} buckets of {', '.join(mb)} MB (DDP's: "
           f"{len(d['ddp_buckets'])})",
           " | ".join(f"{k} {d[k] * 1e3:.2f} ms" for k in VARIANTS + ("comm_s",)),
           f"medians over {d['runs']} runs (min-max): hooks {fig('speedup')} of an ideal {fig('ideal')}; "
           f"DDP {fig('ddp_speedup')} of {fig('ddp_ideal')}",
           f"gradients vs serial: max err {readable(d['grad_err'])} (hooks), {readable(d['ddp_grad_err'])} (DDP)"]
    if d["shared_cores"]:
        out.append(f"{d['cores_per_rank']:.2g} CPU core(s) per rank: the all-reduce's work and the backward take "
                   f"turns on the same cores, so a speed-up here measures the machine's load as much as the overlap")
    return out + flagged(d)


def main() -> None:
    """`torchrun --nnodes N --nproc-per-node G -m common.parallel.ddp_overlap`: every rank measures; rank 0 prints
    and records ddp.overlap.speedup, ddp.overlap.ideal, ddp.hooks.buckets and ddp.ddp.buckets (as lab 08 does)."""
    from common.parallel import torchrun
    ap = torchrun.parser("DDP gradient all-reduce overlapped with the backward, against a fair baseline",
                         "common.parallel.ddp_overlap")
    for name, default in (("--layers", 8), ("--hidden", 1024), ("--batch", 64), ("--repeats", 15), ("--runs", 5)):
        ap.add_argument(name, type=int, default=default)
    ap.add_argument("--bucket-mb", type=float, default=2.0)
    a = torchrun.parse(ap)
    world = torchrun.world_size()
    worker, args = ddp_task(world, a.layers, a.hidden, a.batch, a.bucket_mb, a.repeats, a.backend, a.runs)

    def report(per_rank):
        d = summarize(per_rank, int(os.environ.get("LOCAL_WORLD_SIZE", world)))  # the ranks sharing a node
        print("\n".join(lines(d)))
        record(d, "torchrun")
    torchrun.main("08_pipeline_dualpipe", worker, args, report, a.backend)


def record(d: dict, how: str) -> None:
    """The ledger entries of a run (lab 08 and the torchrun entry point write the same)."""
    from common.core import results
    results.record("ddp.overlap.speedup", d["speedup"], "x", higher_is_better=True,
                   note=f"median of {d['runs']} runs: (compute + comm) / overlapped, hooks; comm the faster of "
                        f"launch-all and one-at-a-time ({how})")
    results.record("ddp.overlap.ideal", d["ideal"], "x", measured=True,
                   note=f"median of {d['runs']} runs: (compute + comm) / (forward + max(backward, comm - last "
                        f"bucket) + last bucket) ({how})")
    results.record("ddp.hooks.buckets", len(d["buckets"]), "buckets", note="by DDP's rule (buckets_of)")
    results.record("ddp.ddp.buckets", len(d["ddp_buckets"]), "buckets", note="DDP's own, after its first step")


if __name__ == "__main__":
    main()
