"""The layer on real ranks: `ep_worker` inside a process group (a `run_workers` group, one task of `tasks_worker`,
or torchrun), `ep_task` to validate and package it, `measure` to launch, run and summarize in one call
(as `common.parallel.collectives.measure` does for the sweep)."""
from __future__ import annotations

import time

from common.core.validate import whole
from common.moe import moe
from common.parallel.expert_parallel.config import EPConfig, check_config, rank_inputs
from common.parallel.expert_parallel.exchange import Exchange, hop_groups
from common.parallel.expert_parallel.layer import FORWARD, VARIANTS
from common.parallel.expert_parallel.summary import summarize

FIRST_DISPATCH = {"flat": "dispatch", "node_aware": "dispatch_ib"}


def ep_worker(rank: int, world_size: int, cfg_dict: dict, variants=VARIANTS, check: bool = True,
              repeats: int = 5, warmup: int = 1) -> dict:
    """Run each variant on this rank: the output against the single-process grouped layer (check=True, experts
    sharded), the record of every exchange (its split lists and bytes), the first dispatch's split list by rank,
    and `repeats` timings of dispatch + combine with identity experts (communication only)."""
    import torch.distributed as dist

    from common.parallel.ranks import synchronize, worker_device
    cfg = EPConfig(**cfg_dict)
    device = worker_device()
    groups = hop_groups(rank, world_size, cfg.ranks_per_node)

    def exchange(barrier=False):
        return Exchange(rank, world_size, cfg.ranks_per_node, device, groups, barrier)

    x, weights, indices = rank_inputs(cfg, rank, world_size, device)
    epr = cfg.num_experts // world_size
    out = {"rank": rank, "indices": indices.cpu(), "variants": {}}
    if check:
        experts = moe.make_experts(cfg.num_experts, cfg.hidden, cfg.intermediate, seed=cfg.seed + 17)
        experts = moe.Experts(*(w.to(device) for w in (experts.w_gate, experts.w_up, experts.w_down)))
        ref = moe.moe_grouped(x, weights, indices, experts)  # the single-process layer, on this rank's rows
        mine = moe.Experts(*(w[rank * epr:(rank + 1) * epr] for w in (experts.w_gate, experts.w_up, experts.w_down)))
    for v in variants:
        rec: dict = {}
        if check:
            y = FORWARD[v](x, weights, indices, mine, cfg, exchange())
            rec["max_abs_err"] = float((y - ref).abs().max())
            rec["ref_max_abs"] = float(ref.abs().max())
        ex = exchange()
        FORWARD[v](x, weights, indices, None, cfg, ex)  # one counted pass, communication only
        rec["calls"] = ex.calls
        rec["send_counts"] = ex.sent_by_rank(FIRST_DISPATCH[v])  # as exchanged, not recomputed
        for _ in range(warmup):
            FORWARD[v](x, weights, indices, None, cfg, exchange())
        times, comm = [], []
        for _ in range(repeats):  # the whole layer, as it runs
            dist.barrier()
            synchronize()
            t0 = time.perf_counter()
            FORWARD[v](x, weights, indices, None, cfg, exchange())
            synchronize()
            times.append(time.perf_counter() - t0)
        for _ in range(5 * repeats):  # its exchanges alone, each after a barrier (short: more repeats)
            ex = exchange(barrier=True)
            FORWARD[v](x, weights, indices, None, cfg, ex)
            comm.append(sum(c["seconds"] for c in ex.calls))
        rec["seconds"], rec["comm_seconds"] = times, comm
        out["variants"][v] = rec
    return out


def ep_task(cfg: EPConfig, world_size: int, backend: str | None = None, variants=VARIANTS, check: bool = True,
            repeats: int = 5) -> tuple:
    """(worker, args) for `common.parallel.distributed.tasks_worker`, validated now (before any process starts)."""
    check_config(cfg, world_size, backend)
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        raise ValueError(f"variants={tuple(variants)!r}; allowed: a non-empty subset of {VARIANTS}")
    whole("repeats", repeats)
    return ep_worker, (cfg.to_dict(), tuple(variants), check, repeats)


def measure(cfg: EPConfig, world_size: int, backend: str | None = None, variants=VARIANTS, check: bool = True,
        repeats: int = 5, fit=None, timeout: float = 300) -> dict:
    """Validate, start a process group of `world_size` ranks, run the variants and summarize."""
    from common.parallel.distributed import run_workers
    worker, args = ep_task(cfg, world_size, backend, variants, check, repeats)
    return summarize(run_workers(worker, world_size, args=args, backend=backend, timeout=timeout), cfg, fit)
