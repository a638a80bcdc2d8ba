"""From the ranks' records to the lab's figures: the error against one process, the bytes crossing nodes against
lab 06's traffic model (`common.moe.moe.ep_traffic`), and the exchanges' time against an alpha-beta fit."""
from __future__ import annotations

import statistics

import torch

from common.moe import moe
from common.parallel.expert_parallel.config import EPConfig


def global_indices(per_rank: list, cfg: EPConfig) -> torch.Tensor:
    """All ranks' routing, ordered so that token i lives on node i mod nodes (lab 06's `ep_traffic` convention)."""
    world = len(per_rank)
    per_node = cfg.ranks_per_node
    by_node = [torch.cat([per_rank[n * per_node + j]["indices"] for j in range(per_node)])
               for n in range(world // per_node)]
    return torch.stack(by_node, dim=1).reshape(-1, cfg.top_k)


def model_ib_bytes(per_rank: list, cfg: EPConfig) -> dict:
    """Lab 06's model of the bytes crossing nodes (dispatch + combine payload), over all tokens, per variant."""
    world = len(per_rank)
    per_node = cfg.ranks_per_node
    traffic = moe.ep_traffic(global_indices(per_rank, cfg), cfg.hidden, cfg.num_experts // world * per_node,
                             world // per_node, dispatch_bytes=1.0 if cfg.fp8 else 4.0,
                             combine_bytes=2.0 if cfg.combine_bf16 else 4.0)
    return {"flat": traffic["ib_bytes_per_expert"] * cfg.tokens,
            "node_aware": traffic["ib_bytes_per_node"] * cfg.tokens, "nodes_per_token": traffic["nodes_per_token"]}


def predict_seconds(calls_per_rank: list, alpha_s: float, bandwidth_Bps: float) -> float:
    """Alpha-beta time of one forward's exchanges: per call, (p-1) alpha for its group of p ranks, plus the busiest
    rank's off-rank bytes (sent or received) over the bandwidth of an all-to-all fit
    (common.parallel.collectives.fit_alpha_beta)."""
    total = 0.0
    for i in range(len(calls_per_rank[0])):
        p = len(calls_per_rank[0][i]["peers"])
        busiest = max(max(c[i]["sent"], c[i]["recv"]) for c in calls_per_rank)
        total += (p - 1) * max(alpha_s, 0.0) + busiest / bandwidth_Bps
    return total


def summarize(per_rank: list, cfg: EPConfig, fit=None) -> dict:
    """Per variant: max_abs_err (worst rank), ib/nvlink/meta bytes (all ranks), model_ib_bytes, bytes_ratio (the
    cross-node bytes of dispatch AND combine over the model's), seconds and fastest_seconds (the whole dispatch +
    combine: median and minimum over repeats of the slowest rank), comm_seconds and fastest_comm_seconds (the
    exchanges alone) and, given an all-to-all Fit, predicted_seconds (of the exchanges)."""
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
        comm = [max(rec["comm_seconds"][i] for rec in recs) for i in range(len(recs[0]["comm_seconds"]))]
        s["comm_seconds"], s["fastest_comm_seconds"] = statistics.median(comm), min(comm)
        s["exchanges"] = len(recs[0]["calls"])
        if fit is not None:
            s["predicted_seconds"] = predict_seconds([rec["calls"] for rec in recs], fit.alpha_s, fit.bandwidth_Bps)
        out["variants"][v] = s
    if "flat" in out["variants"] and "node_aware" in out["variants"]:
        flat, na = out["variants"]["flat"]["ib"], out["variants"]["node_aware"]["ib"]
        out["dedup_bytes_saving"] = 1 - na / flat if flat else float("nan")
    return out
