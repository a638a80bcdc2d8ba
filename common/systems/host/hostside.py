"""The CPU side of a training loop: a slow data pipeline, the consumer's idle time, host-to-device copy models, and
this machine's NUMA topology and thread affinity.
"""
from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import torch

from common.core.measurement import median_and_iqr


class SlowDataset(torch.utils.data.Dataset):
    """A synthetic dataset whose items take `item_ms` to produce (like decoding an image or tokenising text).

    The cost is a sleep, so it shows pipeline overlap without competing for the machine's cores. Each item carries
    the milliseconds it took to produce, measured where it was produced (a worker or this process), so a run knows
    its own load time L at the moment it ran."""

    def __init__(self, n_items: int, item_ms: float, shape=(3, 32, 32)):
        if n_items <= 0 or item_ms < 0:
            raise ValueError(f"n_items={n_items} must be > 0 and item_ms={item_ms} >= 0")
        self.n, self.item_s, self.shape = n_items, item_ms / 1e3, shape

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        """(image, label, ms, done): the item, how long producing it took here (the sleep's overshoot included), and
        when it was done on the system-wide monotonic clock (the same in every process of this machine)."""
        t0 = time.monotonic()
        time.sleep(self.item_s)
        g = torch.Generator().manual_seed(i)
        x = torch.randn(self.shape, generator=g)
        done = time.monotonic()
        return x, i % 10, (done - t0) * 1e3, done


def _timed_batches(loader, step_ms: float, max_batches: int | None = None) -> dict:
    """Take batches from `loader` (at most `max_batches`), spending `step_ms` (a sleep) after each: per batch the
    consumer's wait, the step's real length, and -- when the batch carries its items' times -- its load time (the sum
    of its items' times) and its hand-off (from when it was both asked for and ready to when the consumer had it:
    collation, the queue, tensors rebuilt from shared memory), all in ms; and the wall time in s. The iterator is
    dropped at the end, which shuts worker processes down."""
    waits, steps, loads, handoffs = [], [], [], []
    start = time.perf_counter()
    it = iter(loader)
    while max_batches is None or len(waits) < max_batches:
        t0, asked = time.perf_counter(), time.monotonic()
        try:
            batch = next(it)
        except StopIteration:
            break
        t1, got = time.perf_counter(), time.monotonic()
        waits.append((t1 - t0) * 1e3)
        if len(batch) == 4:
            loads.append(float(batch[2].sum()))
            handoffs.append(max(0.0, got - max(asked, float(batch[3].max()))) * 1e3)
        if step_ms:
            time.sleep(step_ms / 1e3)
        steps.append((time.perf_counter() - t1) * 1e3)
    wall = time.perf_counter() - start
    del it
    return {"waits": waits, "steps": steps, "loads": loads, "handoffs": handoffs, "wall": wall}


def _spread(values: list[float]) -> float:
    """Relative interquartile range (0 for fewer than four values)."""
    if len(values) < 4:
        return 0.0
    med, iqr = median_and_iqr(values)
    return iqr / med if med else 0.0


def consumer_idle(loader, step_ms: float, max_batches: int | None = None) -> dict:
    """Run a consumer that spends `step_ms` per batch (the training step, a sleep here) over `loader`.

    Returns wall time, time spent waiting for the next batch, the idle fraction (wait / wall), the steady-state idle
    fraction and wait per batch (the same without the first batch, whose wait is pipeline start-up: forking workers,
    filling queues), the batches seen, and what this run's model inputs were while it ran: the mean load time of a
    batch (`load_ms`, its relative IQR `load_spread`), the mean real step (`step_ms`: sleeps overshoot) and the mean
    hand-off (`handoff_ms`). Means, not medians: the idle fraction is a total over the run, so a few long hand-offs
    count (a median hand-off of 2.9 ms beside a mean wait of 7.2 ms once put 4 workers 0.12 off the model)."""
    got = _timed_batches(loader, step_ms, max_batches)
    waits, wall = got["waits"], got["wall"]
    steps = len(waits)
    waited, first_wait = sum(waits) / 1e3, (waits[0] / 1e3 if waits else 0.0)
    steady_wall = wall - first_wait
    loads, handoffs = got["loads"][1:] or got["loads"], got["handoffs"][1:] or got["handoffs"]
    return {"wall_s": wall, "wait_s": waited, "idle_fraction": waited / wall if wall else 0.0,
            "steady_idle_fraction": (waited - first_wait) / steady_wall if steady_wall > 0 else 0.0,
            "steady_wait_ms": (waited - first_wait) / (steps - 1) * 1e3 if steps > 1 else 0.0, "batches": steps,
            "load_ms": statistics.fmean(loads) if loads else float("nan"), "load_spread": _spread(loads),
            "step_ms": statistics.fmean(got["steps"]) if got["steps"] else float("nan"),
            "handoff_ms": statistics.fmean(handoffs) if handoffs else float("nan")}


def _loader(n_items: int, batch_size: int, item_ms: float, workers: int, prefetch_factor: int = 2):
    kwargs = {"prefetch_factor": prefetch_factor, "persistent_workers": False} if workers > 0 else {}
    return torch.utils.data.DataLoader(SlowDataset(n_items, item_ms), batch_size=batch_size, num_workers=workers,
                                       **kwargs)


def loader_idle_sweep(workers=(0, 1, 2), n_items: int = 96, batch_size: int = 4, item_ms: float = 2.0,
                      step_ms: float = 8.0, prefetch_factor: int = 2) -> list[dict]:
    """consumer_idle for each DataLoader worker count (0 = loading in the training process itself). The workers
    sleep rather than compute, so more of them than cores is fine here (PyTorch's warning about it is silenced)."""
    import warnings
    rows = []
    for w in workers:
        if w < 0:
            raise ValueError(f"workers={w} must be >= 0")
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*worker processes in total.*")
            rows.append({"workers": w, **consumer_idle(_loader(n_items, batch_size, item_ms, w, prefetch_factor),
                                                       step_ms)})
    return rows


def loader_experiment(workers=(0, 1, 2, 4), item_ms: float = 6.0, step_ms: float = 8.0, n_items: int = 96,
                      batch_size: int = 4, tolerance: float = 0.15) -> dict:
    """Lab 11's section 1: the consumer's steady-state idle fraction for each worker count (loader_idle_sweep) beside
    the model fed each run's OWN load time L, step S and hand-off h (sleeps overshoot, hand-offs wait for the worker
    to be scheduled, more on a busy machine) and beside the nominal model (L = batch_size x item_ms, S = step_ms,
    h = 0). A run whose load time moved by more than 30% within it (a burst of other load) cannot judge the model;
    when the model misses a judged run by `tolerance` or more, the sweep is measured once more (a burst that covered
    one run). Returns the rows, each worker count's gap to the model, the judged worker counts, and whether it
    measured twice."""
    def sweep():
        rows = loader_idle_sweep(workers, n_items, batch_size, item_ms, step_ms)
        for r in rows:
            r["predicted_idle"] = predicted_idle_fraction(r["workers"], r["load_ms"], r["step_ms"], r["handoff_ms"])
            r["nominal_model"] = predicted_idle_fraction(r["workers"], batch_size * item_ms, step_ms)
        gap = {r["workers"]: abs(r["steady_idle_fraction"] - r["predicted_idle"]) for r in rows}
        return rows, gap, [r["workers"] for r in rows if r["load_spread"] < 0.3]
    rows, gap, judged = sweep()
    again = any(gap[w] >= tolerance for w in judged)
    if again:
        rows, gap, judged = sweep()
    return {"rows": rows, "gap": gap, "judged": judged, "measured_twice": again}


def batch_cost_ms(batch_size: int = 4, item_ms: float = 2.0, n_batches: int = 12) -> float:
    """The model's load time L: the median time to produce one batch in this process (no workers, no step), the
    sleeps' overshoot and the collation included."""
    if n_batches < 1:
        raise ValueError(f"n_batches={n_batches} must be >= 1")
    return statistics.median_high(_timed_batches(_loader(n_batches * batch_size, batch_size, item_ms, 0), 0.0)["waits"])


def handoff_ms(step_ms: float, batch_size: int = 4, workers: int = 2, n_batches: int = 40, rounds: int = 3) -> float:
    """The model's hand-off cost h: the consumer's median wait per batch when loading is free (a dataset that does
    not sleep), i.e. what it takes to get a ready batch from a worker (a queue, tensors rebuilt from shared memory,
    whose file descriptors the worker must be scheduled to send). The first batches (workers starting) are left out;
    the median ignores a wait stretched by another process, and the least of `rounds` medians a round that a burst of
    load covered (seen: 21 ms in one round, 3-7 ms in the next, on a loaded 2-core VM)."""
    if step_ms <= 0 or n_batches < 8 or rounds < 1:
        raise ValueError(f"step_ms={step_ms} must be > 0, n_batches={n_batches} >= 8 and rounds={rounds} >= 1")
    medians = []
    for _ in range(rounds):
        waits = _timed_batches(_loader(n_batches * batch_size, batch_size, 0.0, workers), step_ms)["waits"]
        medians.append(statistics.median_high(waits[workers * 2:]))
    return min(medians)


def predicted_idle_fraction(workers: int, load_ms: float, step_ms: float, handoff_ms: float = 0.0) -> float:
    """Steady-state idle fraction of the consumer. Loading in-process serialises load and step: L / (L + S).
    With w workers a batch is ready every L / w; the consumer also pays the hand-off h for every batch it takes
    from a worker, so it cycles every max(L / w, S + h) and idles that cycle minus its step."""
    if workers < 0 or load_ms < 0 or step_ms <= 0 or handoff_ms < 0:
        raise ValueError(f"workers={workers}, load_ms={load_ms}, step_ms={step_ms}, handoff_ms={handoff_ms}: need "
                         f"workers >= 0, load_ms >= 0, step_ms > 0, handoff_ms >= 0")
    if workers == 0:
        return load_ms / (load_ms + step_ms)
    cycle = max(load_ms / workers, step_ms + handoff_ms)
    return (cycle - step_ms) / cycle


def h2d_copy_seconds(nbytes: float, link_gbs: float, memcpy_gbs: float, pinned: bool) -> float:
    """Host-to-device copy time. Pinned (page-locked) memory: the DMA engine reads it directly at link speed.
    Pageable memory: the driver first copies into a pinned staging buffer (a host memcpy), then DMAs it; modelled
    here without overlap between the two stages (the worst case)."""
    if nbytes < 0 or link_gbs <= 0 or memcpy_gbs <= 0:
        raise ValueError(f"nbytes={nbytes} >= 0, link_gbs={link_gbs} > 0 and memcpy_gbs={memcpy_gbs} > 0 required")
    dma = nbytes / (link_gbs * 1e9)
    return dma if pinned else dma + nbytes / (memcpy_gbs * 1e9)


def numa_topology() -> list[dict]:
    """NUMA nodes of this machine with their CPUs and memory (from /sys; one node on most laptops)."""
    nodes = []
    base = Path("/sys/devices/system/node")
    for node in sorted(base.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        cpus = (node / "cpulist").read_text().strip() if (node / "cpulist").exists() else "?"
        mem_kb = 0
        meminfo = node / "meminfo"
        if meminfo.exists():
            for line in meminfo.read_text().splitlines():
                if "MemTotal" in line:
                    mem_kb = int(line.split()[-2])
        nodes.append({"node": int(node.name[4:]), "cpus": cpus, "memory_gib": round(mem_kb / 2**20, 1)})
    return nodes or [{"node": 0, "cpus": f"0-{(os.cpu_count() or 1) - 1}", "memory_gib": None}]


def gpu_numa_nodes() -> list[dict]:
    """Which NUMA node each NVIDIA PCI device attaches to (empty without NVIDIA GPUs)."""
    out = []
    for dev in sorted(Path("/sys/bus/pci/devices").glob("*")):
        try:
            if (dev / "vendor").read_text().strip() != "0x10de" or not (dev / "class").read_text().startswith("0x03"):
                continue
            out.append({"pci": dev.name, "numa_node": int((dev / "numa_node").read_text())})
        except OSError:
            continue
    return out


_MATMUL_PROBE = """
import time, torch
n, repeats = {n}, {repeats}
a, b = torch.randn(n, n), torch.randn(n, n)
a @ b
start = time.perf_counter()
for _ in range(repeats):
    a @ b
print(2 * n**3 * repeats / (time.perf_counter() - start) / 1e9)
"""

# two workloads in one process: a matmul (long parallel regions) and many element-wise ops on 64K floats (a short
# parallel region, ending in a barrier, every few microseconds); one measurement per placement of the process, each
# on its turn ("go")
_PLACEMENT_PROBE = """
import os, sys, time, torch
n, repeats, elems, ops = {n}, {repeats}, {elems}, {ops}
print("ready", flush=True)  # started beside other probes: say so once imported, then wait for each turn to measure alone
for cpus, threads in {turns!r}:
    if sys.stdin.readline() != "go\\n":
        sys.exit("no go")
    os.sched_setaffinity(0, cpus)  # this thread: the first turn's CPUs, as the process started; a later turn's 1 thread
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    gflops = 2 * n**3 * repeats / (time.perf_counter() - start) / 1e9
    x = torch.randn(elems)
    y = torch.empty_like(x)
    for _ in range(20):
        torch.mul(x, 1.0001, out=y)
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(ops):
        torch.mul(x, 1.0001, out=y)
    print(gflops, (time.perf_counter() - start) / ops * 1e6, (time.process_time() - cpu) / ops * 1e6, flush=True)
"""


def _pinned_env(cpus: set[int], threads: int) -> dict:
    allowed = os.sched_getaffinity(0)
    if not cpus or not set(cpus) <= allowed:
        raise ValueError(f"cpus={sorted(cpus)} must be a non-empty subset of the CPUs this process may use, "
                         f"{sorted(allowed)}")
    if threads < 1:
        raise ValueError(f"threads={threads} must be >= 1")
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def _run_pinned(code: str, cpus: set[int], threads: int) -> list[float]:
    import subprocess
    import sys
    env = _pinned_env(cpus, threads)
    out = subprocess.run([sys.executable, "-c", code], env=env, preexec_fn=lambda: os.sched_setaffinity(0, set(cpus)),
                         capture_output=True, text=True, timeout=120, check=True)
    return [float(v) for v in out.stdout.strip().splitlines()[-1].split()]


def _run_pinned_gated(jobs: list[tuple[str, set, int]], timeout: float = 120,
                      turns: list[int] | None = None) -> list[list[list[float]]]:
    """Several pinned probes: all processes start at once, each on its own CPUs from the start (as `taskset` does:
    OpenMP reads the affinity when it loads, and picks its way of waiting from it), and import torch side by side
    (the slow part, seconds each); each says "ready", and only when all have, they measure ONE AT A TIME -- the
    others wait on a read from stdin, idle -- so no two measurements share the machine. Process i measures
    `turns[i]` times (default 1), a line of numbers per "go"; returns those lines by process. Every process is
    killed if anything fails."""
    import select
    import subprocess
    import sys
    envs = [_pinned_env(cpus, threads) for _, cpus, threads in jobs]
    turns = turns or [1] * len(jobs)
    procs = []

    def line(p, what):  # one line of p's stdout within the deadline; "" if p died
        if not select.select([p.stdout], [], [], max(0.0, deadline - time.monotonic()))[0]:
            raise TimeoutError(f"a placement probe did not {what} within timeout={timeout} s")
        text = p.stdout.readline()
        if not text.strip():
            p.kill() if p.poll() is None else None
            p.wait(timeout)
            raise RuntimeError(f"a placement probe failed to {what} (exit {p.returncode}): {p.stderr.read()[-800:]}")
        return text.strip()

    try:
        for (code, cpus, _), env in zip(jobs, envs):
            procs.append(subprocess.Popen([sys.executable, "-c", code], env=env, text=True, stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          preexec_fn=lambda c=frozenset(cpus): os.sched_setaffinity(0, set(c))))
        deadline = time.monotonic() + timeout
        for p in procs:  # wait for every "ready" (a probe that dies says "" at once; one that hangs meets the deadline)
            if line(p, "start") != "ready":
                raise RuntimeError("a placement probe said something else than 'ready' first")
        out = []
        for p, n in zip(procs, turns):
            mine = []
            for _ in range(n):
                p.stdin.write("go\n")
                p.stdin.flush()
                mine.append([float(v) for v in line(p, "measure").split()])
            p.stdin.close()
            if p.wait(max(0.0, deadline - time.monotonic())):
                raise RuntimeError(f"a placement probe failed (exit {p.returncode}): {p.stderr.read()[-800:]}")
            out.append(mine)
        return out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def placement_probes(placements, n: int = 512, repeats: int = 20, elems: int = 1 << 16, ops: int = 2000) -> dict:
    """For each (name, cpus, threads) of `placements`, in a process whose `threads` OpenMP threads may run only on
    `cpus`: GFLOP/s of n x n float32 matmuls, and the wall-clock and CPU microseconds of one element-wise op on
    `elems` floats (a short parallel region ending in a barrier). CPU time counts what the process's threads burned,
    so other processes' load does not inflate it the way it inflates wall-clock time. With more threads than cores
    the threads take turns, and a thread that reaches the barrier first spins or sleeps until its partner gets the
    core: more CPU time for the same work.

    A placement of several threads gets a fresh process, pinned from its start (OpenMP picks its way of waiting when
    it loads). A placement of ONE thread never waits at a barrier, so it is measured in the process of a
    several-thread placement whose CPUs include its own, after it, with that thread pinned and torch set to one
    thread: one torch import fewer (seconds). The processes import torch side by side, then measure one after the
    other, each alone (see _run_pinned_gated)."""
    placements = [(name, set(cpus), threads) for name, cpus, threads in placements]
    for _, cpus, threads in placements:
        _pinned_env(cpus, threads)  # bad input named before any process starts
    host = {}  # placement index -> the index of the placement whose process measures it
    for i, (_, cpus, threads) in enumerate(placements):
        if threads == 1:
            host[i] = next((j for j, (_, c, t) in enumerate(placements) if t > 1 and cpus <= c), i)
        else:
            host[i] = i
    owners = sorted(set(host.values()))
    members = {j: [j] + [i for i in host if host[i] == j and i != j] for j in owners}
    jobs, turns = [], []
    for j in owners:
        phases = [(sorted(placements[i][1]), placements[i][2]) for i in members[j]]
        code = _PLACEMENT_PROBE.format(n=n, repeats=repeats, elems=elems, ops=ops, turns=phases)
        jobs.append((code, placements[j][1], placements[j][2]))
        turns.append(len(phases))
    values = {}
    for j, lines in zip(owners, _run_pinned_gated(jobs, turns=turns)):
        values.update(zip(members[j], lines))
    return {name: dict(zip(("matmul_gflops", "elementwise_wall_us", "elementwise_cpu_us"), values[i]))
            for i, (name, _, _) in enumerate(placements)}


def matmul_gflops_pinned(cpus: set[int], threads: int, n: int = 512, repeats: int = 20) -> float:
    """GFLOP/s of n x n float32 matmuls in a fresh process whose `threads` OpenMP threads may run only on `cpus`
    (what `taskset -c` and `OMP_NUM_THREADS` do). A fresh process, because threads inherit affinity when created."""
    return _run_pinned(_MATMUL_PROBE.format(n=n, repeats=repeats), cpus, threads)[0]
