"""Compute/communication overlap: DualPipe's F&B chunk model, and real overlap measured on this machine.

The model. In DeepSeek-V3 a chunk (one micro-batch through one stage of MoE layers) splits into four parts:
attention (compute), all-to-all dispatch (communication), MLP / experts (compute) and all-to-all combine
(communication); the backward chunk runs them in reverse, with about twice the compute. Run one after the other, a
chunk waits for its own all-to-alls. DualPipe pairs a forward chunk of one micro-batch with a backward chunk of
another and interleaves them on two resources -- the SMs (compute) and the network (communication) -- so one
chunk's all-to-all runs while the other chunk computes. `overlapped_pair` finds the best interleaving and returns
its time: that is the F&B of the pipeline simulator (`common.parallel.pipeline.Durations(FB=...)`).

The measurement. `cpu_overlap_worker` (run with `common.parallel.distributed.run_workers`, gloo) times a matmul, a gloo
all-reduce, the two serialised, and the two overlapped (the all-reduce launched asynchronously, the matmul run while
it is in flight), each timed in turns with the others. `cuda_stream_overlap` does the same on one GPU with two CUDA
streams: a matmul on one and a device-to-host copy (the PCIe copy engine standing in for the network) on the other.
Speedup = (a + b) / overlapped, the serial baseline being the sum of the parts timed alone the same way; the ideal
is (a + b) / max(a, b). `common.parallel.ddp_overlap` does the same for a data-parallel training step (bucketed
all-reduce overlapped with the backward pass).
"""
from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import dataclass

from common.core.validate import whole

COMPUTE, COMM = "compute", "comm"


@dataclass(frozen=True)
class ChunkCosts:
    """Times of one forward chunk's parts (any unit); the backward chunk has `backward_factor` x the compute and the
    same communication."""

    attention: float = 1.0
    dispatch: float = 1.0
    mlp: float = 1.0
    combine: float = 1.0
    backward_factor: float = 2.0

    def __post_init__(self):
        for name in ("attention", "dispatch", "mlp", "combine"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or v < 0:
                raise ValueError(f"{name}={v!r} is not a duration; allowed: a number >= 0")
        if not isinstance(self.backward_factor, (int, float)) or not self.backward_factor > 0:
            raise ValueError(f"backward_factor={self.backward_factor!r} must be a number > 0")

    def forward(self) -> list:
        """[(name, resource, time)] of the forward chunk, in order."""
        return [("F attn", COMPUTE, self.attention), ("F dispatch", COMM, self.dispatch),
                ("F mlp", COMPUTE, self.mlp), ("F combine", COMM, self.combine)]

    def backward(self) -> list:
        """The backward chunk: the forward's parts in reverse order, compute x backward_factor."""
        k = self.backward_factor
        return [("B combine", COMM, self.combine), ("B mlp", COMPUTE, k * self.mlp),
                ("B dispatch", COMM, self.dispatch), ("B attn", COMPUTE, k * self.attention)]

    @property
    def F(self) -> float:
        return sum(t for _, _, t in self.forward())

    @property
    def B(self) -> float:
        return sum(t for _, _, t in self.backward())


def _run_on_two_resources(chains: list, orders: dict) -> list:
    """Times of chains of parts when each resource runs its parts in `orders[resource]` (lists of (chain, index))."""
    start = {}
    end = {}
    free = {COMPUTE: 0.0, COMM: 0.0}
    pos = {COMPUTE: 0, COMM: 0}
    total = sum(len(c) for c in chains)
    while len(end) < total:
        progressed = False
        for res in (COMPUTE, COMM):
            if pos[res] >= len(orders[res]):
                continue
            c, i = orders[res][pos[res]]
            if i > 0 and (c, i - 1) not in end:
                continue
            t0 = max(free[res], end.get((c, i - 1), 0.0))
            start[(c, i)] = t0
            end[(c, i)] = t0 + chains[c][i][2]
            free[res] = end[(c, i)]
            pos[res] += 1
            progressed = True
        if not progressed:
            return []  # this pair of orders deadlocks
    return [(start[(c, i)], end[(c, i)], chains[c][i][0], chains[c][i][1]) for c in range(len(chains))
            for i in range(len(chains[c]))]


def list_schedule(chains: list) -> list:
    """Greedy list scheduling of chains of parts on two resources: whenever parts could start, the one that can start
    earliest runs (ties: the one that has waited longest, then the lower chain). For many chains or long ones, where
    `overlapped_pair`'s search over every order is out of reach. Returns [(start, end, name, resource)]."""
    nxt, ready = [0] * len(chains), [0.0] * len(chains)
    free = {COMPUTE: 0.0, COMM: 0.0}
    spans = []
    for _ in range(sum(len(c) for c in chains)):
        best = None
        for c, chain in enumerate(chains):
            if nxt[c] < len(chain):
                key = (max(free[chain[nxt[c]][1]], ready[c]), ready[c], c)
                best = key if best is None or key < best else best
        start, _, c = best
        name, res, d = chains[c][nxt[c]]
        spans.append((start, start + d, name, res))
        free[res] = ready[c] = start + d
        nxt[c] += 1
    return spans


def serial_pair(costs: ChunkCosts) -> list:
    """A forward chunk then a backward chunk, each part waiting for the previous: [(start, end, name, resource)]."""
    t, spans = 0.0, []
    for name, res, d in costs.forward() + costs.backward():
        spans.append((t, t + d, name, res))
        t += d
    return spans


def overlapped_pair(costs: ChunkCosts) -> list:
    """The best interleaving of a forward and a backward chunk on two resources (compute and communication).

    Each chunk keeps its own order; a resource runs one part at a time; among all orders of the parts on each
    resource, the one that ends first is returned as [(start, end, name, resource)].
    """
    chains = [costs.forward(), costs.backward()]
    by_res = {res: [(c, i) for c in range(2) for i, p in enumerate(chains[c]) if p[1] == res]
              for res in (COMPUTE, COMM)}
    best = None
    for oc in _merges(by_res[COMPUTE]):
        for om in _merges(by_res[COMM]):
            spans = _run_on_two_resources(chains, {COMPUTE: oc, COMM: om})
            if spans and (best is None or max(e for _, e, _, _ in spans) < max(e for _, e, _, _ in best) - 1e-12):
                best = spans
    return best


def _merges(items: list) -> list:
    """Every order of `items` that keeps each chain's parts in their own order."""
    out = set()
    for perm in itertools.permutations(items):
        if all(perm.index((c, i)) < perm.index((c, i + 1)) for (c, i) in perm if (c, i + 1) in perm):
            out.add(perm)
    return sorted(out)


def makespan(spans: list) -> float:
    return max(e for _, e, _, _ in spans) if spans else 0.0


def pair_times(costs: ChunkCosts) -> dict:
    """F, B, serial F+B, overlapped F&B, and the share of all-to-all time hidden by the overlap."""
    serial = makespan(serial_pair(costs))
    fb = makespan(overlapped_pair(costs))
    comm = 2 * (costs.dispatch + costs.combine)
    hidden = (serial - fb) / comm if comm else 0.0
    return {"F": costs.F, "B": costs.B, "F+B": serial, "F&B": fb, "comm": comm, "comm_hidden": hidden}


def plot_pair(costs: ChunkCosts, ax=None):
    """Two Gantt charts (serialised and overlapped), one row per resource."""
    import matplotlib.pyplot as plt

    from common.core import plots
    plots.use_house_style()
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3.2))
    rows = [("serial", serial_pair(costs)), ("overlapped F&B", overlapped_pair(costs))]
    colors = {"F": "#1f77b4", "B": "#2ca02c"}
    labels = []
    for r, (label, spans) in enumerate(rows):
        for k, res in enumerate((COMPUTE, COMM)):
            y = 2 * r + k
            labels.append(f"{label}: {res}")
            for s, e, name, rr in spans:
                if rr != res or e <= s:
                    continue
                ax.broken_barh([(s, e - s)], (y - 0.4, 0.8), facecolors=colors[name[0]],
                               edgecolors="black", linewidth=0.5, hatch="//" if res == COMM else None, alpha=0.85)
                ax.text((s + e) / 2, y, name.split()[1], ha="center", va="center", fontsize=7)
    ax.set_yticks(range(4))
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_ylim(3.5, -0.5)
    ax.set_xlabel("time")
    ax.grid(False)
    t = pair_times(costs)
    ax.set_title(f"forward (blue) + backward (green) chunk: serial {t['F+B']:g}, overlapped F&B {t['F&B']:g}")
    return ax


# ----------------------------------------------------------------------------------------------- measured
def time_round_robin(fns: dict, repeats: int, before=None) -> dict:
    """Median seconds of each function in `fns`, timed in turns (one call of each per round, `repeats` rounds), so
    that every variant sees the same drift in the machine's load; `before()` (a barrier, a sync) runs before each
    call, outside the timed region."""
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            if before:
                before()
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(v) for name, v in times.items()}


def cpu_overlap_worker(rank: int, world_size: int, matmul_n: int = 384, allreduce_elements: int = 2**21,
                       repeats: int = 7, threads: int = 1) -> dict:
    """Inside a gloo process group: seconds (median) of a matmul, an all-reduce, both serialised and both overlapped.

    Overlapped: `dist.all_reduce(x, async_op=True)` starts the all-reduce on gloo's own thread, the matmul runs on the
    caller's thread, then `work.wait()`. The four are timed in turns (`time_round_robin`). Returns a dict of medians
    for this rank and a check that the all-reduce was right.
    """
    import torch
    import torch.distributed as dist
    for name, v in (("matmul_n", matmul_n), ("allreduce_elements", allreduce_elements), ("repeats", repeats)):
        whole(name, v)
    torch.set_num_threads(threads)
    a = torch.randn(matmul_n, matmul_n)
    b = torch.randn(matmul_n, matmul_n)
    x = torch.full((allreduce_elements,), float(rank + 1))

    def mm():
        torch.mm(a, b)

    def ar():
        dist.all_reduce(x)

    def serial():
        dist.all_reduce(x)
        torch.mm(a, b)

    def overlapped():
        work = dist.all_reduce(x, async_op=True)
        torch.mm(a, b)
        work.wait()

    for f in (mm, ar, serial, overlapped):  # warm-up
        f()
    x.fill_(float(rank + 1))
    dist.all_reduce(x)
    expected = world_size * (world_size + 1) / 2
    correct = bool(torch.allclose(x, torch.full_like(x, expected)))
    t = time_round_robin({"matmul_s": mm, "allreduce_s": ar, "serial_s": serial, "overlapped_s": overlapped},
                         repeats, dist.barrier)
    return {"correct": correct, **t}


def measure_cpu_overlap(world_size: int = 2, matmul_n: int = 384, allreduce_elements: int = 2**21,
                        repeats: int = 7, timeout: float = 120) -> dict:
    """`world_size` gloo ranks (common.parallel.distributed.run_workers): the slowest rank's medians, and speedups."""
    from common.parallel.distributed import run_workers
    per_rank = run_workers(cpu_overlap_worker, world_size, args=(matmul_n, allreduce_elements, repeats),
                           backend="gloo", timeout=timeout)
    if not all(r["correct"] for r in per_rank):
        raise RuntimeError("the all-reduce gave a wrong sum on some rank: the overlap measurement is void")
    out = {k: max(r[k] for r in per_rank) for k in ("matmul_s", "allreduce_s", "serial_s", "overlapped_s")}
    return _with_speedups(out, "allreduce_s")


def _with_speedups(t: dict, comm_key: str) -> dict:
    """Add the speed-up of the overlapped run over the serial baseline and the ideal one.

    The serial baseline is the sum of the two parts, each timed alone the same way (`sum_s` = a + b): running them
    back to back (`serial_s`) is reported beside it but not used, because a back-to-back run pays extra costs of its
    own (the all-reduce's wake-up after a matmul, caches), which would credit the overlap with a gain it did not make.
    speedup = (a + b) / overlapped; ideal = (a + b) / max(a, b): overlap cannot do better than hiding the shorter
    part completely, so a speedup above the ideal means the parts were slower alone than together (noise, or a
    shared core that one of them left idle) -- `beats_ideal_by` says by how much.
    """
    a, b = t["matmul_s"], t[comm_key]
    t["sum_s"] = a + b
    t["speedup"] = t["sum_s"] / t["overlapped_s"]
    t["ideal_speedup"] = (a + b) / max(a, b)
    t["beats_ideal_by"] = t["speedup"] / t["ideal_speedup"] - 1
    return t


def cuda_stream_overlap(matmul_n: int = 8192, copy_bytes: int = 2**30, repeats: int = 10) -> dict:
    """One GPU, two CUDA streams: bf16 matmuls (as many as take about as long as the copy) and a device-to-host copy
    into pinned memory, alone, serialised and overlapped; median seconds (synchronised wall clock), and speedups."""
    import torch
    if not torch.cuda.is_available():
        raise RuntimeError("cuda_stream_overlap needs a CUDA GPU; on a CPU use measure_cpu_overlap")
    dev = torch.device("cuda")
    a = torch.randn(matmul_n, matmul_n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(matmul_n, matmul_n, device=dev, dtype=torch.bfloat16)
    src = torch.empty(copy_bytes // 2, device=dev, dtype=torch.bfloat16).normal_()
    dst = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
    side = torch.cuda.Stream()
    main = torch.cuda.current_stream()

    iters = [1]

    def mm():
        for _ in range(iters[0]):
            torch.mm(a, b)

    def copy():
        dst.copy_(src, non_blocking=True)

    def serial():
        mm()
        copy()

    def overlapped():
        side.wait_stream(main)
        with torch.cuda.stream(side):
            copy()
        mm()
        main.wait_stream(side)

    def timed(fn):
        return time_round_robin({"f": lambda: (fn(), torch.cuda.synchronize())}, repeats, torch.cuda.synchronize)["f"]

    for f in (mm, copy, serial, overlapped):
        f()
    torch.cuda.synchronize()
    iters[0] = max(1, round(timed(copy) / timed(mm)))  # balance the two, so that overlap can halve the time
    synced = {name: (lambda f=f: (f(), torch.cuda.synchronize()))
              for name, f in (("matmul_s", mm), ("copy_s", copy), ("serial_s", serial), ("overlapped_s", overlapped))}
    out = {"matmul_iters": iters[0], **time_round_robin(synced, repeats, torch.cuda.synchronize)}
    ok = torch.equal(dst[:1024].to(dev), src[:1024])
    if not ok:
        raise RuntimeError("the device-to-host copy is wrong: the overlap measurement is void")
    return _with_speedups(out, "copy_s")
