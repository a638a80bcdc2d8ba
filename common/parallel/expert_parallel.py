"""Expert parallelism on real ranks: DeepEP-style dispatch and combine with `all_to_all_single` and split sizes.

Experts are sharded over R ranks (rank r holds experts r*E/R .. (r+1)*E/R - 1); consecutive groups of
`ranks_per_node` ranks form a node (simulated nodes on a CPU, real ones under torchrun). Each rank routes its own
tokens with the DeepSeek-V3 gate (`common.moe.moe.deepseek_v3_gate`), exchanges row counts with its peers, sends token
rows with `all_to_all_single(output_split_sizes=..., input_split_sizes=...)`, the experts run on the rows they
received, and the results come back (the same exchange with the splits swapped) for the weighted combine.

Two variants:
- "flat": one copy per (token, expert), sent to the expert's rank -- an all-to-all of lab 06's dispatched rows;
  the origin applies the gate weights when the rows come back.
- "node_aware" (DeepEP's normal kernels): one copy per (token, destination node), sent to the rank with the
  sender's local index on that node (the RDMA hop; your own node's copy goes to yourself), then one copy per
  (token, destination rank) inside the node (the NVLink hop). Experts apply the gate weights; combine sums inside
  the node first, so one row per (token, node) crosses nodes on the way back too.

Payload: dispatch rows in the activation dtype (float32: the exact check) or FP8 E4M3 with one float32 scale per
128 elements (DeepSeek-V3's dispatch); combine rows in float32 or bfloat16. The k expert ids (int32) and weights
(float32) ride in the same row as metadata. Bytes sent to another rank are counted per link class -- "ib" when it is
on another node, "nvlink" when on the same node -- payload and metadata apart, so the payload can be compared with
lab 06's traffic model (`common.moe.moe.ep_traffic`).

`check_config` refuses bad input (world size, tokens that do not split, experts not divisible by ranks) before any
process starts; `ep_worker` runs inside a process group (`common.parallel.distributed.run_workers`, or one task of
`common.parallel.distributed.tasks_worker` so the lab reuses one group); `summarize` turns the per-rank results into the
error, the bytes against the model and the times against an alpha-beta prediction.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch

from common.core.validate import whole
from common.moe import moe

VARIANTS = ("flat", "node_aware")
SCALE_BLOCK = 128
FP8_MAX = 448.0  # largest finite E4M3 value


@dataclass
class EPConfig:
    """One expert-parallel MoE layer. `tokens` is the total over all ranks (each rank routes tokens / R)."""

    tokens: int = 512
    hidden: int = 256
    intermediate: int = 64
    num_experts: int = 32
    top_k: int = 8
    n_group: int = 8
    topk_group: int = 4
    ranks_per_node: int = 1
    fp8: bool = False  # dispatch in FP8 E4M3 + per-128 float32 scales
    combine_bf16: bool = False  # combine rows in bfloat16
    route_scale: float = 2.5
    seed: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def _positive_int(name: str, value) -> int:
    return whole(name, value)


def check_config(cfg: EPConfig, world_size: int, backend: str | None = None) -> EPConfig:
    """Raise ValueError naming the parameter, its value and what is allowed -- before any process starts."""
    from common.parallel import distributed
    backend = distributed._check_backend(backend)
    distributed.check_world_size(world_size, backend)
    for name in ("tokens", "hidden", "intermediate", "num_experts", "top_k", "n_group", "topk_group",
                 "ranks_per_node"):
        _positive_int(name, getattr(cfg, name))
    if cfg.tokens % world_size:
        raise ValueError(f"tokens={cfg.tokens} does not split over world_size={world_size} ranks; allowed: a "
                         f"multiple of {world_size} (e.g. {(cfg.tokens // world_size + 1) * world_size})")
    if cfg.num_experts % world_size:
        raise ValueError(f"num_experts={cfg.num_experts} is not divisible by world_size={world_size}; allowed: a "
                         f"multiple of {world_size}, so every rank holds the same number of experts")
    if world_size % cfg.ranks_per_node:
        raise ValueError(f"ranks_per_node={cfg.ranks_per_node} does not divide world_size={world_size}; allowed: "
                         f"a divisor of {world_size}")
    moe.check_routing(cfg.num_experts, cfg.top_k, cfg.n_group, cfg.topk_group)
    if cfg.fp8 and cfg.hidden % SCALE_BLOCK:
        raise ValueError(f"hidden={cfg.hidden}: FP8 dispatch scales blocks of {SCALE_BLOCK} elements; allowed: a "
                         f"multiple of {SCALE_BLOCK}")
    return cfg


# --------------------------------------------------------------------------------------------------------------
# Send counts (the lab's exercise 7.4 is node_send_counts)


def _node_of_expert(indices: torch.Tensor, num_experts: int, world_size: int, ranks_per_node: int) -> torch.Tensor:
    return indices // (num_experts // world_size * ranks_per_node)


def flat_send_counts(indices: torch.Tensor, num_experts: int, world_size: int) -> list:
    """Rows this rank sends to each rank in the flat dispatch: one per (token, expert) on that rank."""
    ranks = indices.reshape(-1) // (num_experts // world_size)
    return torch.bincount(ranks, minlength=world_size).tolist()


def node_send_counts(indices: torch.Tensor, num_experts: int, world_size: int, ranks_per_node: int,
                     rank: int) -> list:
    """Rows this rank sends to each rank in the node-aware dispatch's first (cross-node) hop: one per token per
    distinct destination node, to the rank of that node with this rank's local index (itself for its own node)."""
    n_nodes = world_size // ranks_per_node
    nodes = _node_of_expert(indices, num_experts, world_size, ranks_per_node)
    hit = torch.zeros(indices.shape[0], n_nodes, dtype=torch.bool).scatter_(1, nodes.cpu(), True)
    counts = [0] * world_size
    local = rank % ranks_per_node
    for m, c in enumerate(hit.sum(0).tolist()):
        counts[m * ranks_per_node + local] = int(c)
    return counts


# --------------------------------------------------------------------------------------------------------------
# Row encoding: payload (fp32, bf16 or FP8 + scales) and metadata packed into one uint8 row


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8).reshape(t.shape[0], -1)


def encode_fp8(x: torch.Tensor) -> torch.Tensor:
    """[n, H] float -> [n, H + 4*H/128] uint8: E4M3 elements, then one float32 scale per 128 elements."""
    n, h = x.shape
    blocks = x.float().reshape(n, h // SCALE_BLOCK, SCALE_BLOCK)
    amax = blocks.abs().amax(-1)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (blocks / scale.unsqueeze(-1)).reshape(n, h).to(torch.float8_e4m3fn)
    return torch.cat([_as_bytes(q), _as_bytes(scale)], dim=1)


def decode_fp8(b: torch.Tensor, hidden: int) -> torch.Tensor:
    n = b.shape[0]
    q = b[:, :hidden].contiguous().view(torch.float8_e4m3fn).float()
    scale = b[:, hidden:].contiguous().view(torch.float32)
    return (q.reshape(n, hidden // SCALE_BLOCK, SCALE_BLOCK) * scale.unsqueeze(-1)).reshape(n, hidden)


def dispatch_row_bytes(cfg: EPConfig) -> int:
    """Payload bytes of one dispatched token row."""
    if cfg.fp8:
        return cfg.hidden + 4 * (cfg.hidden // SCALE_BLOCK)
    return cfg.hidden * 4


def combine_row_bytes(cfg: EPConfig) -> int:
    return cfg.hidden * (2 if cfg.combine_bf16 else 4)


def _encode_dispatch(x: torch.Tensor, cfg: EPConfig) -> torch.Tensor:
    return encode_fp8(x) if cfg.fp8 else _as_bytes(x.float())


def _decode_dispatch(b: torch.Tensor, cfg: EPConfig) -> torch.Tensor:
    if cfg.fp8:
        return decode_fp8(b, cfg.hidden)
    return b.contiguous().view(torch.float32).reshape(b.shape[0], cfg.hidden)


def _encode_combine(y: torch.Tensor, cfg: EPConfig) -> torch.Tensor:
    return _as_bytes(y.to(torch.bfloat16 if cfg.combine_bf16 else torch.float32))


def _decode_combine(b: torch.Tensor, cfg: EPConfig) -> torch.Tensor:
    dtype = torch.bfloat16 if cfg.combine_bf16 else torch.float32
    return b.contiguous().view(dtype).reshape(b.shape[0], cfg.hidden).float()


# --------------------------------------------------------------------------------------------------------------
# The exchange


class Exchange:
    """all_to_all_single of uint8 rows with split sizes; records every call's off-rank bytes per link class and its
    time. barrier=True waits for all ranks before each call, so the time is the exchange's own, not a wait for a
    peer still busy with its local work (packing, encoding)."""

    def __init__(self, rank: int, world_size: int, ranks_per_node: int, device, barrier: bool = False):
        self.rank, self.world, self.g, self.device = rank, world_size, ranks_per_node, device
        self.barrier = barrier
        self.calls: list = []  # per call: {"name", "sent", "recv", "ib", "nvlink", "meta"} (bytes, off-rank)

    def same_node(self, other: int) -> bool:
        return other // self.g == self.rank // self.g

    def counts(self, send_counts: list) -> list:
        """Exchange row counts: what each peer will send me."""
        import torch.distributed as dist
        send = torch.tensor(send_counts, dtype=torch.int64, device=self.device)
        recv = torch.empty_like(send)
        if self.barrier:
            dist.barrier()
        t0 = time.perf_counter()
        dist.all_to_all_single(recv, send)
        counts = recv.tolist()  # (a device-to-host copy: waits for the exchange)
        self.calls.append({"name": "counts", "sent": 8 * (self.world - 1), "recv": 8 * (self.world - 1),
                           "ib": 0, "nvlink": 0, "meta": 8 * (self.world - 1), "seconds": time.perf_counter() - t0})
        return counts

    def rows(self, name: str, rows: torch.Tensor, send_counts: list, recv_counts: list,
             payload_bytes: int) -> torch.Tensor:
        """Send `rows` [sum(send_counts), W] uint8 grouped by destination; return the received rows by source."""
        import torch.distributed as dist

        from common.parallel.distributed import synchronize
        width = rows.shape[1]
        out = torch.empty(sum(recv_counts), width, dtype=torch.uint8, device=self.device)
        rows = rows.contiguous()
        synchronize()
        if self.barrier:
            dist.barrier()
        t0 = time.perf_counter()
        dist.all_to_all_single(out, rows, output_split_sizes=list(recv_counts), input_split_sizes=list(send_counts))
        synchronize()
        rec = {"name": name, "sent": 0, "recv": 0, "ib": 0, "nvlink": 0, "meta": 0,
               "seconds": time.perf_counter() - t0}
        for d in range(self.world):
            if d == self.rank:
                continue
            rec["sent"] += send_counts[d] * width
            rec["recv"] += recv_counts[d] * width
            rec["ib" if not self.same_node(d) else "nvlink"] += send_counts[d] * payload_bytes
            rec["meta"] += send_counts[d] * (width - payload_bytes)
        self.calls.append(rec)
        return out


def _grouped_experts(x: torch.Tensor, local_expert: torch.Tensor, experts) -> torch.Tensor:
    """Run local expert local_expert[i] on row x[i] (sorted into contiguous slices, as moe_grouped does)."""
    if experts is None:  # communication only: the identity expert
        return x.clone()
    order = torch.argsort(local_expert, stable=True)
    xs = x.index_select(0, order)
    counts = torch.bincount(local_expert, minlength=experts.num_experts).tolist()
    ys = torch.empty_like(xs)
    start = 0
    for e, n in enumerate(counts):
        if n:
            ys[start:start + n] = experts.forward(e, xs[start:start + n])
        start += n
    out = torch.empty_like(ys)
    out[order] = ys
    return out


def _meta(indices: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return torch.cat([_as_bytes(indices.to(torch.int32)), _as_bytes(weights.float())], dim=1)


def _unmeta(b: torch.Tensor, k: int):
    idx = b[:, :4 * k].contiguous().view(torch.int32).reshape(-1, k).long()
    w = b[:, 4 * k:8 * k].contiguous().view(torch.float32).reshape(-1, k)
    return idx, w


def flat_forward(x, weights, indices, experts_local, cfg: EPConfig, ex: Exchange) -> torch.Tensor:
    """Flat EP layer on this rank's tokens: one row per (token, expert) to the expert's rank, and back."""
    r, world = ex.rank, ex.world
    epr = cfg.num_experts // world
    plan = moe.dispatch_plan(indices, cfg.num_experts)
    send = plan.counts.view(world, epr).sum(1).tolist()
    recv = ex.counts(send)
    expert_ids = indices.reshape(-1).index_select(0, plan.order)
    rows = torch.cat([_encode_dispatch(x.index_select(0, plan.token_index), cfg),
                      _as_bytes(expert_ids.to(torch.int32).unsqueeze(1))], dim=1)
    got = ex.rows("dispatch", rows, send, recv, dispatch_row_bytes(cfg))
    pb = dispatch_row_bytes(cfg)
    xr = _decode_dispatch(got[:, :pb], cfg)
    local = got[:, pb:].contiguous().view(torch.int32).reshape(-1).long() - r * epr
    y = _grouped_experts(xr, local, experts_local)
    back = ex.rows("combine", _encode_combine(y, cfg), recv, send, combine_row_bytes(cfg))
    return moe.combine(_decode_combine(back, cfg), plan, weights.float(), x.shape[0])


def node_aware_forward(x, weights, indices, experts_local, cfg: EPConfig, ex: Exchange) -> torch.Tensor:
    """Node-aware EP layer: one row per (token, node) across nodes, then per (token, rank) inside the node;
    combine reduces inside the node before crossing back."""
    r, world, g = ex.rank, ex.world, cfg.ranks_per_node
    epr, k = cfg.num_experts // world, cfg.top_k
    n_nodes, node, local = world // g, r // g, r % g
    t = x.shape[0]
    # hop A (cross-node): one copy per destination node, to the rank with my local index there
    nodes = _node_of_expert(indices, cfg.num_experts, world, g)
    hit = torch.zeros(t, n_nodes, dtype=torch.bool, device=x.device).scatter_(1, nodes, True)
    send_a = [0] * world
    tok_a = []
    for m in range(n_nodes):
        rows_m = hit[:, m].nonzero().squeeze(1)
        send_a[m * g + local] = rows_m.numel()
        tok_a.append(rows_m)
    tok_a = torch.cat(tok_a)
    recv_a = ex.counts(send_a)
    pb = dispatch_row_bytes(cfg)
    rows = torch.cat([_encode_dispatch(x.index_select(0, tok_a), cfg),
                      _meta(indices.index_select(0, tok_a), weights.index_select(0, tok_a))], dim=1)
    got_a = ex.rows("dispatch_ib", rows, send_a, recv_a, pb)
    # hop B (in-node): forward the encoded row once to each rank of my node that holds some of its experts
    idx_a, _ = _unmeta(got_a[:, pb:], k)
    ranks_a = idx_a // epr
    send_b = [0] * world
    tok_b = []
    for j in range(g):
        rows_j = (ranks_a == node * g + j).any(1).nonzero().squeeze(1)
        send_b[node * g + j] = rows_j.numel()
        tok_b.append(rows_j)
    tok_b = torch.cat(tok_b)
    recv_b = ex.counts(send_b)
    got_b = ex.rows("dispatch_nvlink", got_a.index_select(0, tok_b), send_b, recv_b, pb)
    # experts: each received row, weighted sum over the token's experts that live on this rank
    xb = _decode_dispatch(got_b[:, :pb], cfg)
    idx_b, w_b = _unmeta(got_b[:, pb:], k)
    row, slot = ((idx_b // epr) == r).nonzero(as_tuple=True)
    y = _grouped_experts(xb.index_select(0, row), idx_b[row, slot] - r * epr, experts_local)
    partial = torch.zeros_like(xb).index_add_(0, row, y * w_b[row, slot].unsqueeze(1))
    # combine: back inside the node, reduce per (token, node), back across nodes, sum per token
    back_b = _decode_combine(ex.rows("combine_nvlink", _encode_combine(partial, cfg), recv_b, send_b,
                                     combine_row_bytes(cfg)), cfg)
    reduced = torch.zeros(got_a.shape[0], cfg.hidden, dtype=torch.float32, device=x.device).index_add_(
        0, tok_b, back_b)
    back_a = _decode_combine(ex.rows("combine_ib", _encode_combine(reduced, cfg), recv_a, send_a,
                                     combine_row_bytes(cfg)), cfg)
    return torch.zeros(t, cfg.hidden, dtype=torch.float32, device=x.device).index_add_(0, tok_a, back_a)


FORWARD = {"flat": flat_forward, "node_aware": node_aware_forward}


# --------------------------------------------------------------------------------------------------------------
# Inside a process group


def rank_inputs(cfg: EPConfig, rank: int, world_size: int, device=None):
    """This rank's tokens [T/R, H], the gate's weights and indices (DeepSeek-V3 gate on x @ W_gate)."""
    t = cfg.tokens // world_size
    g = torch.Generator().manual_seed(cfg.seed * 7919 + 1000 + rank)
    x = torch.randn(t, cfg.hidden, generator=g)
    wg = torch.randn(cfg.hidden, cfg.num_experts, generator=torch.Generator().manual_seed(cfg.seed * 7919 + 1))
    weights, indices = moe.deepseek_v3_gate(x @ (wg / cfg.hidden ** 0.5), None, cfg.top_k, cfg.n_group,
                                            cfg.topk_group, cfg.route_scale)
    if device is not None:
        x, weights, indices = x.to(device), weights.to(device), indices.to(device)
    return x, weights, indices


def ep_worker(rank: int, world_size: int, cfg_dict: dict, variants=VARIANTS, check: bool = True,
              repeats: int = 5, warmup: int = 1) -> dict:
    """Run each variant on this rank: the output against the single-process grouped layer (check=True, experts
    sharded), the bytes of every exchange, and `repeats` timings of dispatch+combine with identity experts
    (communication only). Returns plain data for `summarize`."""
    import torch.distributed as dist

    from common.parallel.distributed import synchronize, worker_device
    cfg = EPConfig(**cfg_dict)
    device = worker_device()
    x, weights, indices = rank_inputs(cfg, rank, world_size, device)
    epr = cfg.num_experts // world_size
    out = {"rank": rank, "indices": indices.cpu(), "variants": {}}
    experts = ref = None
    if check:
        experts = moe.make_experts(cfg.num_experts, cfg.hidden, cfg.intermediate, seed=cfg.seed + 17)
        experts = moe.Experts(*(w.to(device) for w in (experts.w_gate, experts.w_up, experts.w_down)))
        ref = moe.moe_grouped(x, weights, indices, experts)  # the single-process layer, on this rank's rows
        mine = moe.Experts(experts.w_gate[rank * epr:(rank + 1) * epr], experts.w_up[rank * epr:(rank + 1) * epr],
                           experts.w_down[rank * epr:(rank + 1) * epr])
    for v in variants:
        rec: dict = {}
        if check:
            ex = Exchange(rank, world_size, cfg.ranks_per_node, device)
            y = FORWARD[v](x, weights, indices, mine, cfg, ex)
            rec["max_abs_err"] = float((y - ref).abs().max())
            rec["ref_max_abs"] = float(ref.abs().max())
        ex = Exchange(rank, world_size, cfg.ranks_per_node, device)
        FORWARD[v](x, weights, indices, None, cfg, ex)  # one counted pass, communication only
        rec["calls"] = ex.calls
        rec["send_counts"] = (node_send_counts(indices, cfg.num_experts, world_size, cfg.ranks_per_node, rank)
                              if v == "node_aware" else flat_send_counts(indices, cfg.num_experts, world_size))
        for _ in range(warmup):
            FORWARD[v](x, weights, indices, None, cfg, Exchange(rank, world_size, cfg.ranks_per_node, device))
        times, comm = [], []
        for _ in range(repeats):  # the whole layer, as it runs
            dist.barrier()
            synchronize()
            t0 = time.perf_counter()
            FORWARD[v](x, weights, indices, None, cfg, Exchange(rank, world_size, cfg.ranks_per_node, device))
            synchronize()
            times.append(time.perf_counter() - t0)
        for _ in range(5 * repeats):  # its exchanges alone, each after a barrier (short: more repeats)
            ex = Exchange(rank, world_size, cfg.ranks_per_node, device, barrier=True)
            FORWARD[v](x, weights, indices, None, cfg, ex)
            comm.append(sum(c["seconds"] for c in ex.calls))
        rec["seconds"], rec["comm_seconds"] = times, comm
        out["variants"][v] = rec
    return out


# --------------------------------------------------------------------------------------------------------------
# In the parent


def global_indices(per_rank: list, cfg: EPConfig) -> torch.Tensor:
    """All ranks' routing, ordered so that token i lives on node i mod nodes (lab 06's `ep_traffic` convention)."""
    world = len(per_rank)
    g = cfg.ranks_per_node
    by_node = [torch.cat([per_rank[n * g + j]["indices"] for j in range(g)]) for n in range(world // g)]
    return torch.stack(by_node, dim=1).reshape(-1, cfg.top_k)


def model_ib_bytes(per_rank: list, cfg: EPConfig) -> dict:
    """Lab 06's model of the bytes crossing nodes (dispatch + combine payload), over all tokens, per variant."""
    world = len(per_rank)
    g = cfg.ranks_per_node
    traffic = moe.ep_traffic(global_indices(per_rank, cfg), cfg.hidden, cfg.num_experts // world * g, world // g,
                             dispatch_bytes=1.0 if cfg.fp8 else 4.0, combine_bytes=2.0 if cfg.combine_bf16 else 4.0)
    return {"flat": traffic["ib_bytes_per_expert"] * cfg.tokens, "node_aware": traffic["ib_bytes_per_node"] * cfg.tokens,
            "nodes_per_token": traffic["nodes_per_token"]}


def predict_seconds(calls_per_rank: list, alpha_s: float, bandwidth_Bps: float) -> float:
    """Alpha-beta time of one forward's exchanges: per call, (p-1) alpha + the busiest rank's off-rank bytes
    (sent or received) over the bandwidth of an all-to-all fit (common.parallel.collectives.fit_alpha_beta)."""
    p = len(calls_per_rank)
    total = 0.0
    for i in range(len(calls_per_rank[0])):
        busiest = max(max(c[i]["sent"], c[i]["recv"]) for c in calls_per_rank)
        total += (p - 1) * max(alpha_s, 0.0) + busiest / bandwidth_Bps
    return total


def summarize(per_rank: list, cfg: EPConfig, fit=None) -> dict:
    """Per variant: max_abs_err (worst rank), ib/nvlink/meta bytes (all ranks), model_ib_bytes, bytes_ratio,
    seconds and fastest_seconds (the whole dispatch + combine: median and minimum over repeats of the slowest rank),
    comm_seconds and fastest_comm_seconds (the exchanges alone: the sum of the all_to_all calls' times) and, given
    an all-to-all Fit, predicted_seconds (of the exchanges)."""
    world = len(per_rank)
    model = model_ib_bytes(per_rank, cfg)
    out = {"world_size": world, "nodes": world // cfg.ranks_per_node, "nodes_per_token": model["nodes_per_token"],
           "variants": {}}
    for v in per_rank[0]["variants"]:
        recs = [r["variants"][v] for r in per_rank]
        s = {k: sum(c[k] for rec in recs for c in rec["calls"]) for k in ("ib", "nvlink", "meta")}
        if "max_abs_err" in recs[0]:
            s["max_abs_err"] = max(rec["max_abs_err"] for rec in recs)
            s["ref_max_abs"] = max(rec["ref_max_abs"] for rec in recs)
        s["model_ib_bytes"] = model[v]
        s["bytes_ratio"] = s["ib"] / model[v] if model[v] else float("nan")
        n_rep = len(recs[0]["seconds"])
        slowest = [max(rec["seconds"][i] for rec in recs) for i in range(n_rep)]
        s["seconds"], s["fastest_seconds"] = statistics.median(slowest), min(slowest)
        comm = [max(rec["comm_seconds"][i] for rec in recs) for i in range(n_rep)]
        s["comm_seconds"], s["fastest_comm_seconds"] = statistics.median(comm), min(comm)
        s["exchanges"] = len(recs[0]["calls"])
        if fit is not None:
            s["predicted_seconds"] = predict_seconds([rec["calls"] for rec in recs], fit.alpha_s, fit.bandwidth_Bps)
        out["variants"][v] = s
    if "flat" in out["variants"] and "node_aware" in out["variants"]:
        flat, na = out["variants"]["flat"]["ib"], out["variants"]["node_aware"]["ib"]
        out["dedup_bytes_saving"] = 1 - na / flat if flat else float("nan")
    return out


def ep_task(cfg: EPConfig, world_size: int, backend: str | None = None, variants=VARIANTS, check: bool = True,
            repeats: int = 5) -> tuple:
    """(worker, args) for `common.parallel.distributed.tasks_worker`, validated now (before any process starts)."""
    check_config(cfg, world_size, backend)
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        raise ValueError(f"variants={tuple(variants)!r}; allowed: a non-empty subset of {VARIANTS}")
    _positive_int("repeats", repeats)
    return ep_worker, (cfg.to_dict(), tuple(variants), check, repeats)


def run(cfg: EPConfig, world_size: int, backend: str | None = None, variants=VARIANTS, check: bool = True,
        repeats: int = 5, fit=None, timeout: float = 300) -> dict:
    """Validate, start a process group of `world_size` ranks, run the variants and summarize."""
    from common.parallel.distributed import run_workers
    worker, args = ep_task(cfg, world_size, backend, variants, check, repeats)
    return summarize(run_workers(worker, world_size, args=args, backend=backend, timeout=timeout), cfg, fit)
