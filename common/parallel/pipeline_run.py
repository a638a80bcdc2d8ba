"""Pipeline schedules executed on real ranks: the per-rank order of `common.parallel.pipeline`, run with send/recv.

A small model (`blocks` residual MLP blocks, hidden size `hidden`) is cut into the schedule's stages; each rank of a
`common.parallel.distributed.run_workers` process group holds its stages and executes *its* op list from
`common.parallel.pipeline.build(...)` -- the very schedule the simulator runs -- one op after the other:

- `F`: forward of one micro-batch through one stage; the output goes to the next stage's rank (`isend`), the last
  stage computes the loss instead.
- `B`: full backward (input and weight gradients); the input gradient goes back to the previous stage's rank.
- `Bi` / `W` (zero-bubble split, DualPipe's edges): `Bi` computes the input gradient only; the weight gradients of
  its linear layers are queued (as DualPipe's `WeightGradStore` does) and computed by the matching `W`.
- `FB` (DualPipe's F&B pair): the forward, then the backward (a CPU has no second engine to overlap them on).

Messages: a rank receives (blocking `recv`) only when an op needs an input; between two ranks messages are matched in
the order the sender sends them (the receiver knows the sender's op list, so it receives earlier messages first and
keeps them), which is what NCCL's in-order point-to-point matching also requires.

DualPipe holds two copies of the model (rank r: stage r of direction 0, stage pp-1-r of direction 1); direction 0
takes the first half of the micro-batches, direction 1 the second; a stage's gradient is the sum of its two copies'.

Measured per rank, in the median of `repeats` steps (after a warm-up step): busy time (inside ops, sends included,
receives excluded), idle time (the step's wall clock minus busy); each op kind's median time over all steps; and the peak bytes of activations saved for backward (autograd's
saved-tensor hooks, counted from a forward until its input-gradient backward, as the simulator counts them). The
gradients are compared with one process running the whole batch through the whole model.
"""
from __future__ import annotations

import statistics
import time

from common.core.validate import whole
from common.parallel import pipeline

RUNNABLE = ("gpipe", "1f1b", "zb1p", "dualpipe", "dualpipev")


# ----------------------------------------------------------------------------------------------- the model
def make_model(blocks: int, hidden: int, seed: int = 0):
    """`blocks` residual MLP blocks x + W2 tanh(W1 x) (float32), the same weights for a given seed on every rank."""
    import torch
    g = torch.Generator().manual_seed(seed)
    scale = hidden ** -0.5
    return [(torch.randn(hidden, hidden, generator=g) * scale, torch.zeros(hidden),
             torch.randn(hidden, hidden, generator=g) * scale, torch.zeros(hidden)) for _ in range(blocks)]


def make_batch(batch: int, hidden: int, seed: int = 1):
    """Inputs and targets of one step (synthetic)."""
    import torch
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, hidden, generator=g), torch.randn(batch, hidden, generator=g)


class _WeightGrads:
    """Deferred weight-gradient closures (zero-bubble `Bi` then `W`), keyed by the work item being run."""

    key = None          # set while a Bi runs: its closures go to pending[key]
    pending: dict = {}


_ZB = []  # the autograd Function, made on first use (torch is imported lazily)


def _linear(x, w, b):
    """x @ w.T + b whose weight gradients go to `_WeightGrads` while a `Bi` runs (and are computed at once
    otherwise)."""
    if not _ZB:
        import torch

        class ZBLinear(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, w, b):
                ctx.save_for_backward(x)
                ctx.weight, ctx.bias = w, b
                return torch.addmm(b, x, w.t())

            @staticmethod
            def backward(ctx, g):
                x, = ctx.saved_tensors
                w, b = ctx.weight, ctx.bias
                gx = g @ w
                if _WeightGrads.key is not None:  # Bi: queue the weight part for the matching W
                    def weight_part():
                        with torch.no_grad():
                            _accumulate(w, g.t() @ x)
                            _accumulate(b, g.sum(0))
                    _WeightGrads.pending.setdefault(_WeightGrads.key, []).append(weight_part)
                    return gx, None, None
                return gx, g.t() @ x, g.sum(0)
        _ZB.append(ZBLinear)
    return _ZB[0].apply(x, w, b)


def _accumulate(p, grad):
    p.grad = grad.clone() if p.grad is None else p.grad + grad


def stage_forward(params: list, x):
    """Run the blocks of one stage: x <- x + W2 tanh(W1 x + b1) + b2 for each (W1, b1, W2, b2)."""
    import torch
    for w1, b1, w2, b2 in params:
        x = x + _linear(torch.tanh(_linear(x, w1, b1)), w2, b2)
    return x


def loss_of(y, target, total_rows: int):
    """Sum of squared errors over the whole batch / rows: micro-batch losses add up to the full-batch loss."""
    return ((y - target) ** 2).sum() / total_rows


def reference_gradients(blocks: int, hidden: int, batch: int, seed: int = 0) -> list:
    """One process, the whole batch through the whole model: the gradient of every block's 4 tensors."""
    model = make_model(blocks, hidden, seed)
    params = [[t.clone().requires_grad_() for t in blk] for blk in model]
    x, target = make_batch(batch, hidden, seed + 1)
    loss_of(stage_forward(params, x), target, batch).backward()
    return [[t.grad for t in blk] for blk in params]


# ----------------------------------------------------------------------------------------------- checks
def check_args(schedule: str, world_size: int, micro_batches: int, batch: int, blocks: int,
               backend: str | None = "gloo") -> pipeline.Schedule:
    """Validate everything before a process starts; return the schedule. ValueError names parameter, value, allowed."""
    from common.parallel.distributed import check_world_size
    if schedule not in RUNNABLE:
        raise ValueError(f"schedule={schedule!r} cannot run on ranks; allowed: {', '.join(RUNNABLE)}")
    check_world_size(world_size, backend)
    if world_size < 2:
        raise ValueError(f"world_size={world_size}: a pipeline needs at least 2 ranks; allowed: 2 .. the machine's "
                         f"limit")
    if schedule == "dualpipe" and world_size % 2:
        raise ValueError(f"world_size={world_size}: schedule 'dualpipe' needs an even number of ranks (rank r holds "
                         f"stages r and world_size-1-r); allowed: 2, 4, ...")
    for name, v in (("micro_batches", micro_batches), ("batch", batch), ("blocks", blocks)):
        whole(name, v)
    if batch % micro_batches:
        raise ValueError(f"micro_batches={micro_batches}: the batch of {batch} rows does not split into "
                         f"{micro_batches} equal micro-batches; allowed: a divisor of {batch}")
    sched = pipeline.build(schedule, world_size, micro_batches)  # DualPipe: even micro_batches >= 2 * world_size
    if blocks % sched.stages:
        raise ValueError(f"blocks={blocks}: {schedule} on {world_size} ranks cuts the model into {sched.stages} "
                         f"stages; allowed: a multiple of {sched.stages}")
    return sched


# ----------------------------------------------------------------------------------------------- one rank
def _messages(sched, dev):
    """The messages device `dev` sends, in its order: (destination, (kind, direction, stage, micro_batch)) with kind
    'act' (a forward's output, for stage + 1) or 'grad' (an input gradient, for stage - 1)."""
    out = []
    for op in sched.ops[dev]:
        for kind, d, s, j in op:
            if kind == "F" and s < sched.stages - 1:
                dst = sched.placement[(d, s + 1)]
                if dst != dev:
                    out.append((dst, ("act", d, s, j)))
            elif kind in ("B", "Bi") and s > 0:
                dst = sched.placement[(d, s - 1)]
                if dst != dev:
                    out.append((dst, ("grad", d, s, j)))
    return out


def pipeline_worker(rank: int, world_size: int, schedules, micro_batches: int, batch: int, blocks: int,
                    hidden: int, repeats: int = 3, seed: int = 0) -> dict:
    """Run each of `schedules` `repeats` times (one more as warm-up) on this rank, in one process group; return per
    schedule the gradients, op spans and activation memory, and the measured one-way time of one message."""
    import torch

    torch.set_num_threads(1)
    out = {"comm_s": _one_way_time(rank, world_size, batch // micro_batches, hidden)}
    for name in schedules:
        out[name] = _run_one(rank, world_size, name, micro_batches, batch, blocks, hidden, repeats, seed)
    return out


def _one_way_time(rank, world_size, rows, hidden, repeats=30):
    """Half the median round trip of one activation between ranks 0 and 1 (the others wait)."""
    import torch
    import torch.distributed as dist
    buf = torch.zeros(rows, hidden)
    times = []
    dist.barrier()
    for _ in range(repeats):
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        elif rank == 1:
            dist.recv(buf, 0)
            dist.send(buf, 0)
        times.append(time.perf_counter() - t0)
    t = torch.tensor([statistics.median(times) / 2], dtype=torch.float64)
    dist.broadcast(t, 0)
    return float(t)


def _run_one(rank, world_size, schedule, micro_batches, batch, blocks, hidden, repeats, seed):
    import torch
    import torch.distributed as dist
    from torch.autograd.graph import saved_tensors_hooks
    sched = pipeline.build(schedule, world_size, micro_batches)
    stages, m = sched.stages, sched.micro_batches
    per_stage = blocks // stages
    model = make_model(blocks, hidden, seed)
    mine = {key: [[t.clone().requires_grad_() for t in blk] for blk in model[key[1] * per_stage:(key[1] + 1) *
                                                                               per_stage]]
            for key, dev in sched.placement.items() if dev == rank}
    x_all, t_all = make_batch(batch, hidden, seed + 1)
    rows = batch // (m * sched.directions)
    inbox_order = {src: [msg for dst, msg in _messages(sched, src) if dst == rank] for src in range(world_size)}
    param_ids = {id(t) for blks in mine.values() for blk in blks for t in blk}

    def rows_of(d, j):
        k = d * m + j
        return slice(k * rows, (k + 1) * rows)

    def one_step():
        for blks in mine.values():
            for blk in blks:
                for t in blk:
                    t.grad = None
        inbox, next_msg, sends = {}, {src: 0 for src in inbox_order}, []
        saved, live = {}, [0, 0]  # saved bytes per item; [live bytes, peak]
        held = {}   # (d, s, j) -> (input, output or loss)
        spans = []

        def receive(src, msg):
            while msg not in inbox:
                nxt = inbox_order[src][next_msg[src]]
                next_msg[src] += 1
                buf = torch.empty(rows, hidden)
                dist.recv(buf, src)
                inbox[nxt] = buf
            return inbox.pop(msg)

        def forward(d, s, j):
            if s == 0:
                x = x_all[rows_of(d, j)]
            else:
                src = sched.placement[(d, s - 1)]
                x = receive(src, ("act", d, s - 1, j)) if src != rank else inbox.pop(("act", d, s - 1, j))
                x.requires_grad_()
            t0 = time.perf_counter()
            nbytes = [0]

            def pack(t):
                if id(t) not in param_ids:
                    nbytes[0] += t.numel() * t.element_size()
                return t
            with saved_tensors_hooks(pack, lambda t: t):  # the blocks' activations (the loss's own are not counted)
                y = stage_forward(mine[(d, s)], x)
            if s == stages - 1:
                y = loss_of(y, t_all[rows_of(d, j)], batch)
            saved[(d, s, j)] = nbytes[0]
            live[0] += nbytes[0]
            live[1] = max(live[1], live[0])
            held[(d, s, j)] = (x, y)
            if s < stages - 1:
                dst = sched.placement[(d, s + 1)]
                out = y.detach()
                if dst != rank:
                    sends.append((dist.isend(out, dst), out))
                else:
                    inbox[("act", d, s, j)] = out
            return t0

        def backward(kind, d, s, j):
            x, y = held.pop((d, s, j))
            if s == stages - 1:
                grad = None
            else:
                src = sched.placement[(d, s + 1)]
                grad = receive(src, ("grad", d, s + 1, j)) if src != rank else inbox.pop(("grad", d, s + 1, j))
            t0 = time.perf_counter()
            _WeightGrads.key = (d, s, j) if kind == "Bi" else None
            try:
                y.backward(grad)
            finally:
                _WeightGrads.key = None
            live[0] -= saved.pop((d, s, j))
            if s > 0:
                dst = sched.placement[(d, s - 1)]
                g = x.grad
                if dst != rank:
                    sends.append((dist.isend(g, dst), g))
                else:
                    inbox[("grad", d, s, j)] = g
            return t0

        dist.barrier()
        start = time.perf_counter()
        for op in sched.ops[rank]:
            kinds = "FB" if len(op) == 2 else op[0][0]
            t0 = None
            for kind, d, s, j in op:
                if kind == "F":
                    t = forward(d, s, j)
                elif kind in ("B", "Bi"):
                    t = backward(kind, d, s, j)
                else:
                    t = time.perf_counter()
                    for fn in _WeightGrads.pending.pop((d, s, j)):
                        fn()
                t0 = t if t0 is None else t0
            spans.append((t0 - start, time.perf_counter() - start, kinds))
        for work, _ in sends:
            work.wait()
        end = time.perf_counter() - start
        assert not held and not _WeightGrads.pending and not inbox, "work left over after the schedule"
        return spans, end, live[1], saved

    runs = []
    for _ in range(repeats + 1):
        runs.append(one_step())
        dist.barrier()
    ends = torch.tensor([r[1] for r in runs], dtype=torch.float64)
    dist.all_reduce(ends, op=dist.ReduceOp.MAX)  # a step ends when its last rank ends
    steps = [(spans, float(ends[i]), peak) for i, (spans, _, peak, _) in enumerate(runs)][1:]
    order = sorted(range(len(steps)), key=lambda i: steps[i][1])
    spans, makespan, peak = steps[order[len(order) // 2]]  # the median step (the same one on every rank)
    all_spans = [sp for st in steps for sp in st[0]]  # op times: medians over every timed step
    ranked = sorted(s[1] for s in steps)
    one_item = []
    # the whole model's gradient: each rank adds its stages' (both copies under DualPipe), then a sum over ranks
    full = [[torch.zeros_like(t) for t in blk] for blk in model]
    for (d, s), blks in mine.items():
        for i, blk in enumerate(blks):
            for k, t in enumerate(blk):
                full[s * per_stage + i][k] += t.grad
    flat = torch.cat([t.flatten() for blk in full for t in blk])
    dist.all_reduce(flat)
    ref = torch.cat([t.flatten() for blk in reference_gradients(blocks, hidden, batch, seed) for t in blk])
    grad_err = float((flat - ref).abs().max())
    # bytes one micro-batch leaves saved in one stage (the unit of the simulator's activation column)
    with saved_tensors_hooks(lambda t: one_item.append(t.numel() * t.element_size() * (id(t) not in param_ids))
                             or t, lambda t: t):
        x = torch.zeros(rows, hidden, requires_grad=True)
        stage_forward(next(iter(mine.values())), x)
    return {"rank": rank, "spans": spans, "makespan": makespan, "step_times": ranked, "busy": sum(e - s for s, e, _ in spans),
            "peak_bytes": peak, "stage_bytes": sum(one_item), "grad_err": grad_err,
            "op_median": {k: statistics.median([e - s for s, e, kk in all_spans if kk == k])
                          for k in {kk for _, _, kk in all_spans}}}


# ----------------------------------------------------------------------------------------------- the parent
def run_schedules(schedules=("gpipe", "1f1b", "dualpipe"), world_size: int = 2, micro_batches: int = 8,
                  batch: int = 128, blocks: int = 8, hidden: int = 256, repeats: int = 3,
                  backend: str | None = "gloo", timeout: float = 300) -> dict:
    """Execute each schedule on `world_size` ranks (one process group for all); compare gradients with one process
    and timings with the simulator. Returns {schedule: summary} (see `summarise`).

    Everything is validated before any process starts. backend: gloo by default -- the pipeline's tensors stay on the
    CPU (with NCCL, one GPU per rank and in-order matching of the two directions' messages between a pair of ranks).
    """
    from common.parallel.distributed import run_workers
    if isinstance(schedules, str):
        schedules = (schedules,)
    whole("repeats", repeats)
    whole("hidden", hidden)
    scheds = {name: check_args(name, world_size, micro_batches, batch, blocks, backend) for name in schedules}
    per_rank = run_workers(pipeline_worker, world_size,
                           args=(tuple(schedules), micro_batches, batch, blocks, hidden, repeats), backend=backend,
                           timeout=timeout)
    comm = per_rank[0]["comm_s"]
    return {name: summarise(sched, [r[name] for r in per_rank], blocks, hidden, batch, comm)
            for name, sched in scheds.items()}


def summarise(sched, per_rank: list, blocks: int, hidden: int, batch: int, comm: float = 0.0) -> dict:
    """Gradient error vs one process, measured busy/idle/peak activations per rank, and the simulator run with the
    measured op times and message time (`sim`)."""
    err = max(r["grad_err"] for r in per_rank)
    makespan = max(r["makespan"] for r in per_rank)
    med = {}
    for k in ("F", "B", "Bi", "W", "FB"):
        vals = [r["op_median"][k] for r in per_rank if k in r["op_median"]]
        if vals:
            med[k] = statistics.mean(vals)
    F = med.get("F", 1e-9)
    B = med.get("B", med.get("Bi", 0) + med.get("W", 0))
    W = med.get("W", B / 2)
    durations = pipeline.Durations(F=F, B=B, W=min(W, 0.99 * B), FB=med.get("FB"), comm=comm)
    sim = pipeline.simulate(sched, durations)
    busy = [r["busy"] for r in per_rank]
    return {"schedule": sched.name, "max_grad_err": err, "makespan": makespan, "busy": busy,
            "idle": [makespan - b for b in busy],
            "peak_activations": [sched.stage_fraction * r["peak_bytes"] / r["stage_bytes"] for r in per_rank],
            "durations": durations, "sim": sim, "spans": [r["spans"] for r in per_rank]}


def compare(results: dict) -> "object":
    """A table (pandas) of measured vs simulated: makespan, idle (max over ranks), peak activations."""
    import pandas as pd
    rows = []
    for name, r in results.items():
        sim = r["sim"]
        rows.append({"schedule": name, "grad max err": r["max_grad_err"],
                     "step ms": 1e3 * r["makespan"], "step ms (sim)": 1e3 * sim.makespan,
                     "idle ms (max rank)": 1e3 * max(r["idle"]), "idle ms (sim)": 1e3 * sim.bubble_max,
                     "idle measured / sim": max(r["idle"]) / sim.bubble_max if sim.bubble_max else float("nan"),
                     "peak activations": max(r["peak_activations"]),
                     "peak activations (sim)": max(sim.peak_activations)})
    return pd.DataFrame(rows).set_index("schedule")
