"""Collective communication: alpha-beta cost models, nccl-tests' bus bandwidth, measured sweeps, and a fitted model.

The alpha-beta model: sending a message of n bytes over one link costs alpha + n / B (alpha: the fixed latency of a
step, seconds; B: the link's bandwidth in one direction, bytes/s; "beta" is 1/B). A collective over p ranks is a
sequence of steps; its time is (number of steps) * alpha + (bytes each rank sends in sequence) / B:

    ring all-reduce          2(p-1) alpha + 2(p-1)/p * n/B   (reduce-scatter, then all-gather; n = buffer per rank)
    ring reduce-scatter       (p-1) alpha +  (p-1)/p * n/B   (n = input buffer per rank; each rank keeps n/p)
    ring all-gather           (p-1) alpha +  (p-1)/p * n/B   (n = gathered output per rank; each rank owns n/p)
    all-to-all (pairwise)     (p-1) alpha +  (p-1)/p * n/B   (n = bytes each rank sends, its own share included)
    binary-tree all-reduce   2 ceil(log2 p) (alpha + n/B)    (reduce to the root, broadcast back; not pipelined)
    recursive doubling       ceil(log2 p) (alpha + n/B)      (log2 p exchanges of the whole buffer)
    Rabenseifner             2 log2(p) alpha + 2(p-1)/p * n/B (recursive halving + doubling)
    hierarchical all-reduce  reduce-scatter inside each node (NVLink), all-reduce of n/g across nodes (InfiniBand,
                             g rings in parallel, one per GPU and NIC), all-gather inside each node

nccl-tests report algbw = n / t and busbw = algbw * bus_factor, where the bus factor (all-reduce 2(p-1)/p; all-gather,
reduce-scatter and all-to-all (p-1)/p; broadcast and reduce 1) makes busbw comparable with the link bandwidth B:
a bandwidth-optimal algorithm has busbw -> B for large messages, whatever p is.

Measurement: `measure(...)` spawns ONE process group (common.parallel.distributed.run_workers) and sweeps message sizes for
one or several collectives (`sweep_worker`); `fit_alpha_beta` fits alpha and B by least squares on relative error.
Several machines: `torchrun ... -m common.parallel.collectives` (see `main`).
"""
from __future__ import annotations

import argparse
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Sequence

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
ALLREDUCE_ALGORITHMS = ("ring", "tree", "recursive_doubling", "rabenseifner")
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8, "int8": 1}


# --------------------------------------------------------------------------------------------------------------
# Validation


def check_bytes(n_bytes, name: str = "n_bytes") -> float:
    """A message size must be a positive number of bytes."""
    if isinstance(n_bytes, bool) or not isinstance(n_bytes, (int, float)) or not math.isfinite(n_bytes):
        raise ValueError(f"{name}={n_bytes!r} must be a positive number of bytes")
    if n_bytes <= 0:
        raise ValueError(f"{name}={n_bytes!r}: a message size must be positive (> 0 bytes)")
    return n_bytes


def check_ranks(p, name: str = "p") -> int:
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise ValueError(f"{name}={p!r} must be an int >= 1 (the number of ranks)")
    return p


def _check_positive(x, name: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0:
        raise ValueError(f"{name}={x!r} must be a positive number")
    return x


def _check_alpha(alpha) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha < 0:
        raise ValueError(f"alpha={alpha!r} must be a latency in seconds, >= 0")
    return alpha


def check_collective(collective: str) -> str:
    if collective not in COLLECTIVES:
        raise ValueError(f"collective={collective!r} is not known; allowed: {', '.join(COLLECTIVES)}")
    return collective


def _log2_ceil(p: int) -> int:
    return max(0, math.ceil(math.log2(p))) if p > 1 else 0


# --------------------------------------------------------------------------------------------------------------
# Bus bandwidth (nccl-tests' convention)


def bus_factor(collective: str, p: int) -> float:
    """busbw / algbw for `collective` over p ranks, as nccl-tests define it."""
    check_collective(collective)
    check_ranks(p)
    if collective == "all_reduce":
        return 2 * (p - 1) / p
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (p - 1) / p
    return 1.0  # broadcast (and reduce)


def algbw(n_bytes: float, seconds: float) -> float:
    """Algorithm bandwidth, bytes/s: the message size over the time."""
    check_bytes(n_bytes)
    _check_positive(seconds, "seconds")
    return n_bytes / seconds


def busbw(collective: str, n_bytes: float, seconds: float, p: int) -> float:
    """Bus bandwidth, bytes/s: algbw times the bus factor (comparable with one link's bandwidth)."""
    return algbw(n_bytes, seconds) * bus_factor(collective, p)


# --------------------------------------------------------------------------------------------------------------
# Alpha-beta cost models (alpha: seconds per step; bandwidth: bytes/s per direction of one rank's link)


def _args(n_bytes, p, alpha, bandwidth):
    check_bytes(n_bytes)
    check_ranks(p)
    _check_alpha(alpha)
    _check_positive(bandwidth, "bandwidth")


def ring_allreduce_time(n_bytes: float, p: int, alpha: float, bandwidth: float) -> float:
    _args(n_bytes, p, alpha, bandwidth)
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n_bytes / bandwidth


def ring_reduce_scatter_time(n_bytes: float, p: int, alpha: float, bandwidth: float) -> float:
    _args(n_bytes, p, alpha, bandwidth)
    return (p - 1) * alpha + (p - 1) / p * n_bytes / bandwidth


def ring_allgather_time(n_bytes: float, p: int, alpha: float, bandwidth: float) -> float:
    _args(n_bytes, p, alpha, bandwidth)
    return (p - 1) * alpha + (p - 1) / p * n_bytes / bandwidth


def alltoall_time(n_bytes: float, p: int, alpha: float, bandwidth: float) -> float:
    """Pairwise all-to-all: p-1 steps, each rank sends (p-1)/p of its n bytes to the others."""
    _args(n_bytes, p, alpha, bandwidth)
    return (p - 1) * alpha + (p - 1) / p * n_bytes / bandwidth


def tree_allreduce_time(n_bytes: float, p: int, alpha: float, bandwidth: float) -> float:
    """Binary tree, not pipelined: reduce up ceil(log2 p) levels, broadcast down as many, whole buffer each step."""
    _args(n_bytes, p, alpha, bandwidth)
    return 2 * _log2_ceil(p) * (alpha + n_bytes / bandwidth)


def recursive_doubling_allreduce_time(n_bytes: float, p: int, alpha: float, bandwidth: float) -> float:
    """ceil(log2 p) pairwise exchanges of the whole buffer (exact for p a power of two)."""
    _args(n_bytes, p, alpha, bandwidth)
    return _log2_ceil(p) * (alpha + n_bytes / bandwidth)


def rabenseifner_allreduce_time(n_bytes: float, p: int, alpha: float, bandwidth: float) -> float:
    """Recursive-halving reduce-scatter + recursive-doubling all-gather: log latency, ring bandwidth."""
    _args(n_bytes, p, alpha, bandwidth)
    return 2 * _log2_ceil(p) * alpha + 2 * (p - 1) / p * n_bytes / bandwidth


_ALLREDUCE = {"ring": ring_allreduce_time, "tree": tree_allreduce_time,
              "recursive_doubling": recursive_doubling_allreduce_time, "rabenseifner": rabenseifner_allreduce_time}


def allreduce_time(algorithm: str, n_bytes: float, p: int, alpha: float, bandwidth: float) -> float:
    """All-reduce time under the alpha-beta model for one of ALLREDUCE_ALGORITHMS."""
    if algorithm not in _ALLREDUCE:
        raise ValueError(f"algorithm={algorithm!r} is not known; allowed: {', '.join(ALLREDUCE_ALGORITHMS)}")
    return _ALLREDUCE[algorithm](n_bytes, p, alpha, bandwidth)


def steps(collective: str, p: int) -> int:
    """Number of sequential alpha terms of the ring (all-to-all: pairwise) algorithm."""
    check_collective(collective)
    check_ranks(p)
    if collective == "all_reduce":
        return 2 * (p - 1)
    if collective == "broadcast":
        return 1
    return p - 1


def collective_time(collective: str, n_bytes: float, p: int, alpha: float, bandwidth: float) -> float:
    """Time of `collective` with the bandwidth-optimal (ring / pairwise / pipelined) algorithm:
    steps * alpha + bus_factor * n / bandwidth -- so busbw -> bandwidth for large messages."""
    _args(n_bytes, p, alpha, bandwidth)
    return steps(collective, p) * alpha + bus_factor(collective, p) * n_bytes / bandwidth


def hierarchical_allreduce_time(n_bytes: float, nodes: int, gpus_per_node: int, alpha_intra: float,
                                bw_intra: float, alpha_inter: float, bw_inter: float) -> float:
    """Two-level all-reduce: ring reduce-scatter inside each node (NVLink), ring all-reduce of each GPU's n/g shard
    across the nodes (g parallel rings, one per GPU and its NIC, InfiniBand), ring all-gather inside each node."""
    check_bytes(n_bytes)
    check_ranks(nodes, "nodes")
    check_ranks(gpus_per_node, "gpus_per_node")
    g = gpus_per_node
    inside = 0.0
    if g > 1:
        inside = (ring_reduce_scatter_time(n_bytes, g, alpha_intra, bw_intra)
                  + ring_allgather_time(n_bytes, g, alpha_intra, bw_intra))
    across = ring_allreduce_time(n_bytes / g, nodes, alpha_inter, bw_inter) if nodes > 1 else 0.0
    return inside + across


def flat_ring_allreduce_time(n_bytes: float, nodes: int, gpus_per_node: int, alpha_intra: float, bw_intra: float,
                             alpha_inter: float, bw_inter: float) -> float:
    """One ring over all nodes * gpus_per_node ranks: every step waits for its slowest link (InfiniBand once the
    ring leaves a node), and every step pays the larger alpha."""
    check_ranks(nodes, "nodes")
    check_ranks(gpus_per_node, "gpus_per_node")
    p = nodes * gpus_per_node
    if nodes == 1:
        return ring_allreduce_time(n_bytes, p, alpha_intra, bw_intra)
    return ring_allreduce_time(n_bytes, p, max(alpha_intra, alpha_inter), min(bw_intra, bw_inter))


def two_level_alltoall_time(n_bytes: float, nodes: int, gpus_per_node: int, alpha_intra: float, bw_intra: float,
                            alpha_inter: float, bw_inter: float) -> float:
    """All-to-all over nodes * gpus_per_node ranks, each sending n bytes spread evenly: the share for other GPUs of
    the same node crosses NVLink, the share for other nodes crosses the GPU's NIC; both run at once (the slower
    sets the time), and each peer costs one alpha of its link."""
    check_bytes(n_bytes)
    check_ranks(nodes, "nodes")
    check_ranks(gpus_per_node, "gpus_per_node")
    _check_alpha(alpha_intra)
    _check_alpha(alpha_inter)
    _check_positive(bw_intra, "bw_intra")
    _check_positive(bw_inter, "bw_inter")
    g, p = gpus_per_node, nodes * gpus_per_node
    intra = (g - 1) * alpha_intra + n_bytes * (g - 1) / p / bw_intra
    inter = (p - g) * alpha_inter + n_bytes * (p - g) / p / bw_inter
    return max(intra, inter)


# --------------------------------------------------------------------------------------------------------------
# Hardware: NVLink and InfiniBand bandwidths from data/hardware.json (common.facts.hardware)


def nvlink_bandwidth(gpu_id: str) -> float:
    """Bytes/s one GPU can send over NVLink in one direction: half the datasheet's bidirectional figure."""
    from common.facts import hardware
    return hardware.gpu(gpu_id).nvlink_gbs / 2 * 1e9


def ib_bandwidth(link_id: str = "ib-ndr") -> float:
    """Bytes/s of one InfiniBand port (one NIC per GPU) in one direction."""
    from common.facts import hardware
    return hardware.interconnect(link_id).gbs_per_direction * 1e9


def nvlink_allreduce_time(gpu_id: str, n_bytes: float, p: int = 8, alpha: float = 0.0) -> float:
    """Ring all-reduce of n bytes over p GPUs of one NVSwitch node of `gpu_id`s (alpha-beta model)."""
    return ring_allreduce_time(n_bytes, p, alpha, nvlink_bandwidth(gpu_id))


def h800_vs_h100_allreduce_ratio(n_bytes: float = 2**30, p: int = 8, alpha: float = 0.0) -> float:
    """Time on H800 NVLink (400 GB/s) over time on H100 NVLink (900 GB/s): ring all-reduce, alpha-beta model."""
    return nvlink_allreduce_time("H800-SXM", n_bytes, p, alpha) / nvlink_allreduce_time("H100-SXM", n_bytes, p, alpha)


def measured_comm() -> dict:
    """Published measured bandwidths from data/comm_measured.json: {key: entry}; each entry carries `value` (or
    `value_low`/`value_high`), unit, gpu, link, conditions and `source_title`."""
    import json
    from common.core.env import REPO_ROOT
    data = json.loads((REPO_ROOT / "data" / "comm_measured.json").read_text())
    out = {}
    for key, entry in data["measurements"].items():
        e = dict(entry)
        e["source_title"] = data["sources"][e["source"]]["title"]
        e["source_date"] = data["sources"][e["source"]]["date"]
        if "value" not in e:
            e["value"] = e["value_low"]
        out[key] = e
    return out


def derating_table() -> list:
    """Datasheet (per direction) beside published measured bandwidth: rows {measurement, link, datasheet_GBps,
    measured_GBps, measured_over_datasheet, conditions}."""
    rows = []
    for key, e in measured_comm().items():
        if e["link"] == "nvlink":
            sheet = nvlink_bandwidth(e["gpu"]) / 1e9
        else:
            sheet = ib_bandwidth() / 1e9
        shown = (f"{e['value_low']:g}-{e['value_high']:g}" if "value_high" in e else f"{e['value']:g}")
        rows.append({"measurement": key, "link": e["link"], "datasheet_GBps": sheet, "measured_GBps": shown,
                     "measured_over_datasheet": e["value"] / sheet, "conditions": e["conditions"]})
    return rows


def v3_copies_per_token(tokens: int = 4096, seed: int = 0) -> dict:
    """DeepSeek-V3's routing (256 experts, 8 groups = 8 nodes of 8 GPUs, 4 groups kept, top-8) on random logits:
    the mean copies of a token that cross InfiniBand (one per remote node: node limit + de-duplication), the same
    without de-duplication (one per remote expert), and the GPUs a token reaches (the NVLink fan-out)."""
    import torch
    from common.moe import moe
    g = torch.Generator().manual_seed(seed)
    _, idx = moe.deepseek_v3_gate(torch.randn(tokens, 256, generator=g), None, 8, 8, 4)
    traffic = moe.ep_traffic(idx, 128, 32, 8)
    per_copy = moe.token_traffic_bytes(128, 1.0)["total"]
    gpus = moe.distinct_nodes(idx, 4, 64).to(torch.float64).mean()
    return {"ib_copies_node_limited": traffic["ib_bytes_per_node"] / per_copy,
            "ib_copies_per_expert": traffic["ib_bytes_per_expert"] / per_copy,
            "nodes_per_token": traffic["nodes_per_token"], "gpus_per_token": float(gpus)}


def ep_alltoall_time(tokens: int, row_bytes: float, ib_copies: float, nvlink_copies: float, bw_nvlink: float,
                     bw_ib: float) -> float:
    """Node-limited EP dispatch or combine of one GPU's tokens: `ib_copies` rows per token leave over the GPU's NIC
    while `nvlink_copies` rows per token fan out over NVLink; both run at once, the slower sets the time."""
    return max(tokens * ib_copies * row_bytes / bw_ib, tokens * nvlink_copies * row_bytes / bw_nvlink)


def comm_scenarios(hidden: int, tokens: int = 4096, top_k: int = 8, gpus: Sequence[str] = ("H100-SXM", "H800-SXM"),
                   gpus_per_node: int = 8, alpha_nvlink: float = 0.0, alpha_ib: float = 0.0,
                   ib: str = "ib-ndr") -> list:
    """Times (bandwidth terms of the alpha-beta model) of a large MoE layer's collectives on each GPU of `gpus`,
    with datasheet bandwidths ("<gpu>_ms") and published measured ones ("<gpu>_measured_ms", data/comm_measured.json).

    Rows: a 1 GiB all-reduce; an 8-GPU all-reduce of `tokens` x `hidden` bf16 activations (a TP=8 layout, for
    comparison: DeepSeek-V3 used no tensor parallelism); a data-parallel all-reduce of such a bucket over 2 nodes,
    flat ring and hierarchical; DeepSeek-V3's EP dispatch (FP8 + per-128 scales) and combine (bf16) inside a node,
    and over 8 nodes with the node limit (4) and per-node de-duplication (`v3_copies_per_token` IB copies).
    """
    check_ranks(hidden, "hidden")
    check_ranks(tokens, "tokens")
    check_ranks(top_k, "top_k")
    from common.moe import moe
    g, ibw = gpus_per_node, ib_bandwidth(ib)
    meas = measured_comm()
    m_ar = {"H100-SXM": meas["nccl_allreduce_busbw_8xH100"]["value"] * 1e9}
    m_nv = {"H800-SXM": (meas["deepep_h800_intranode_dispatch"]["value"] * 1e9,
                         meas["deepep_h800_intranode_combine"]["value"] * 1e9)}
    m_ib = (meas["deepep_h800_internode_dispatch_ep64"]["value"] * 1e9,
            meas["deepep_h800_internode_combine_ep64"]["value"] * 1e9)  # CX7 NIC, the same on both GPUs
    act = tokens * hidden * 2
    d_row = moe.token_traffic_bytes(hidden, 1.0)["dispatch"]
    c_row = moe.token_traffic_bytes(hidden, 1.0)["combine"]
    v3 = v3_copies_per_token(tokens)
    nan = float("nan")
    rows = []

    def add(name, n, sheet, measured):
        row = {"scenario": name, "message_MB": n / 1e6}
        for gid in gpus:
            row[f"{gid}_ms"] = sheet(gid) * 1e3
            m = measured(gid)
            row[f"{gid}_measured_ms"] = m * 1e3 if m is not None else nan
        row["ratio"] = row[f"{gpus[-1]}_ms"] / row[f"{gpus[0]}_ms"]
        rows.append(row)

    def ar(n, p, bw):
        return ring_allreduce_time(n, p, alpha_nvlink, bw)

    add(f"all-reduce 1 GiB bf16, {g} GPUs, NVLink ring", 2**30, lambda gid: ar(2**30, g, nvlink_bandwidth(gid)),
        lambda gid: ar(2**30, g, m_ar[gid]) if gid in m_ar else None)
    add(f"all-reduce of {tokens} tokens' bf16 activations, {g} GPUs (a TP={g} layout; V3 used no TP)", act,
        lambda gid: ar(act, g, nvlink_bandwidth(gid)), lambda gid: ar(act, g, m_ar[gid]) if gid in m_ar else None)
    add(f"DP all-reduce of a {act / 1e6:.1f} MB bf16 bucket, 2 nodes x {g}, flat ring (IB-bound)", act,
        lambda gid: flat_ring_allreduce_time(act, 2, g, alpha_nvlink, nvlink_bandwidth(gid), alpha_ib, ibw),
        lambda gid: None)
    add(f"DP all-reduce of a {act / 1e6:.1f} MB bf16 bucket, 2 nodes x {g}, hierarchical", act,
        lambda gid: hierarchical_allreduce_time(act, 2, g, alpha_nvlink, nvlink_bandwidth(gid), alpha_ib, ibw),
        lambda gid: None)
    n_in = tokens * top_k * d_row
    add(f"V3 EP={g} dispatch in one node (FP8 + scales, top-{top_k}), NVLink", n_in,
        lambda gid: alltoall_time(n_in, g, alpha_nvlink, nvlink_bandwidth(gid)),
        lambda gid: alltoall_time(n_in, g, alpha_nvlink, m_nv[gid][0]) if gid in m_nv else None)
    for what, row_b, k in (("dispatch (FP8 + scales)", d_row, 0), ("combine (bf16)", c_row, 1)):
        n = tokens * v3["ib_copies_node_limited"] * row_b
        add(f"V3 EP={8 * g} {what} over 8 nodes: node limit 4 + de-dup, "
            f"{v3['ib_copies_node_limited']:.2f} IB copies/token", n,
            lambda gid, rb=row_b: ep_alltoall_time(tokens, rb, v3["ib_copies_node_limited"], v3["gpus_per_token"],
                                                   nvlink_bandwidth(gid), ibw),
            lambda gid, rb=row_b, k=k: ep_alltoall_time(tokens, rb, v3["ib_copies_node_limited"],
                                                        v3["gpus_per_token"], m_nv[gid][k] if gid in m_nv else
                                                        nvlink_bandwidth(gid), m_ib[k]))
    n = tokens * v3["ib_copies_per_expert"] * d_row
    add(f"the same dispatch without de-dup: {v3['ib_copies_per_expert']:.2f} IB copies/token", n,
        lambda gid: ep_alltoall_time(tokens, d_row, v3["ib_copies_per_expert"], v3["gpus_per_token"],
                                     nvlink_bandwidth(gid), ibw),
        lambda gid: ep_alltoall_time(tokens, d_row, v3["ib_copies_per_expert"], v3["gpus_per_token"],
                                     m_nv[gid][0] if gid in m_nv else nvlink_bandwidth(gid), m_ib[0]))
    return rows


# --------------------------------------------------------------------------------------------------------------
# Fitting alpha and the bandwidth


@dataclass
class Fit:
    """A fitted alpha-beta model of one collective over p ranks: t = steps*alpha + bus_factor*n/bandwidth."""

    collective: str
    p: int
    alpha_s: float
    bandwidth_Bps: float
    rms_rel_error: float = float("nan")

    @property
    def alpha_us(self) -> float:
        return self.alpha_s * 1e6

    @property
    def beta_gbps(self) -> float:
        """The fitted bandwidth in GB/s (beta = 1/bandwidth is the time per byte)."""
        return self.bandwidth_Bps / 1e9

    def predict(self, n_bytes):
        """Predicted seconds for one size or a sequence of sizes."""
        if isinstance(n_bytes, (int, float)):
            return collective_time(self.collective, n_bytes, self.p, max(self.alpha_s, 0.0), self.bandwidth_Bps)
        return [self.predict(float(n)) for n in n_bytes]

    def __str__(self) -> str:
        return (f"{self.collective} over {self.p} ranks: alpha = {self.alpha_us:.1f} us, bandwidth = "
                f"{self.beta_gbps:.2f} GB/s (rms relative error {self.rms_rel_error:.1%})")


def fit_alpha_beta(sizes_bytes: Sequence[float], seconds: Sequence[float], p: int,
                   collective: str = "all_reduce") -> Fit:
    """Least-squares fit of alpha (s) and bandwidth (bytes/s) to measured times of the ring/pairwise algorithm.

    The model is linear in x = (alpha, 1/bandwidth): t_i = steps * alpha + bus_factor * n_i * (1/bandwidth).
    Each equation is divided by t_i, so the fit minimises *relative* error: with sizes spanning several orders of
    magnitude, absolute least squares would let the largest messages decide everything and leave alpha to noise.
    """
    import numpy as np
    check_collective(collective)
    check_ranks(p)
    if p < 2:
        raise ValueError(f"p={p}: a collective over one rank moves nothing; fit with p >= 2")
    n = np.asarray(sizes_bytes, dtype=np.float64)
    t = np.asarray(seconds, dtype=np.float64)
    if n.ndim != 1 or n.shape != t.shape or len(n) < 2:
        raise ValueError(f"sizes_bytes and seconds must be 1-D of the same length >= 2 (got shapes {n.shape}, "
                         f"{t.shape})")
    if (n <= 0).any():
        raise ValueError(f"sizes_bytes must all be positive; got {n[n <= 0][0]!r}")
    if (t <= 0).any() or not np.isfinite(t).all():
        raise ValueError("seconds must all be positive and finite")
    if len(np.unique(n)) < 2:
        raise ValueError("need at least two different message sizes to separate alpha from bandwidth")
    a = np.stack([np.full_like(n, steps(collective, p)), bus_factor(collective, p) * n], axis=1) / t[:, None]
    x, *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    alpha, inv_bw = float(x[0]), float(x[1])
    if inv_bw <= 0:
        raise ValueError("the fitted time per byte is not positive: the times do not grow with message size; "
                         "sweep larger messages")
    pred = steps(collective, p) * alpha + bus_factor(collective, p) * n * inv_bw
    rms = float(np.sqrt(np.mean(((pred - t) / t) ** 2)))
    return Fit(collective, p, alpha, 1.0 / inv_bw, rms)


# --------------------------------------------------------------------------------------------------------------
# Measurement: one worker sweeps sizes for several collectives inside one process group


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
    from common.parallel.distributed import synchronize, worker_device

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
    if not (isinstance(repeats, int) and repeats >= 1):
        raise ValueError(f"repeats={repeats!r} must be an int >= 1")
    if not (isinstance(max_iters, int) and max_iters >= 1):
        raise ValueError(f"max_iters={max_iters!r} must be an int >= 1")
    backend = distributed._check_backend(backend)
    distributed.check_world_size(world_size, backend)
    return sweep_worker, (list(collectives), list(sizes_bytes), repeats, warmup, dtype, target_bytes, max_iters)


def measure(sizes_bytes: Sequence[float], world_size: int, collectives: Sequence[str] = ("all_reduce",),
            backend: str | None = None, repeats: int = 5, warmup: int = 2, dtype: str = "float32",
            target_bytes: float = 2**24, max_iters: int = 50, timeout: float = 300) -> dict:
    """Sweep message sizes for each collective in ONE process group of `world_size` ranks; {collective: Sweep}."""
    from common.parallel import distributed
    worker, args = sweep_task(sizes_bytes, world_size, collectives, backend, repeats, warmup, dtype, target_bytes,
                              max_iters)
    backend = distributed._check_backend(backend)
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


# --------------------------------------------------------------------------------------------------------------
# Several machines: torchrun --nnodes=N --nproc-per-node=G ... -m common.parallel.collectives


def main(argv: Sequence[str] | None = None) -> None:
    """Sweep under torchrun (one process per GPU on every node) and print an nccl-tests-like table on rank 0."""
    import torch.distributed as dist
    from common.parallel import distributed
    ap = argparse.ArgumentParser(description="Collective bandwidth sweep (run under torchrun)")
    ap.add_argument("--collective", default="all_reduce", choices=COLLECTIVES)
    ap.add_argument("--min-bytes", type=int, default=2**10)
    ap.add_argument("--max-bytes", type=int, default=2**28)
    ap.add_argument("--factor", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPE_BYTES))
    ap.add_argument("--backend", default=None, choices=distributed.BACKENDS)
    a = ap.parse_args(argv)
    rank, world = distributed.init_from_env(a.backend)
    try:
        mine = sweep_worker(rank, world, [a.collective], log_sizes(a.min_bytes, a.max_bytes, a.factor), a.repeats,
                            dtype=a.dtype)
        gathered = [None] * world if rank == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        if rank == 0:
            sweep = combine(gathered, dist.get_backend())[a.collective]
            print(f"# {a.collective}, {world} ranks, backend {sweep.backend}, dtype {a.dtype}")
            print(sweep.table().to_string(float_format=lambda v: f"{v:.3f}"))
            print(f"# fit: {sweep.fit()}")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
