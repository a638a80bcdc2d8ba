"""DeepSeek-V3's collectives sized: its node-limited routing's InfiniBand copies per token, the EP all-to-all, and a
large MoE layer's collectives on H100 vs H800 (datasheet and measured bandwidths)."""
from __future__ import annotations

from typing import Sequence

from common.parallel.collectives.cost_model import (
    alltoall_time,
    check_ranks,
    flat_ring_allreduce_time,
    hierarchical_allreduce_time,
    ring_allreduce_time,
)
from common.parallel.collectives.links import ib_bandwidth, measured_comm, nvlink_bandwidth


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
    flat (one ring per NIC, as NCCL runs it) and hierarchical; DeepSeek-V3's EP dispatch (FP8 + per-128 scales) and combine (bf16) inside a node,
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
    add(f"DP all-reduce of a {act / 1e6:.1f} MB bf16 bucket, 2 nodes x {g}, flat: {g} rings, one per NIC (NCCL)", act,
        lambda gid: flat_ring_allreduce_time(act, 2, g, alpha_nvlink, nvlink_bandwidth(gid), alpha_ib, ibw, rings=g),
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
