"""One expert-parallel MoE layer's configuration, its checks (before any process starts), each rank's tokens and
routing, and the send counts of the two dispatches (flat: per expert's rank; node-aware: per destination node)."""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from common.core.validate import whole
from common.moe import moe

SCALE_BLOCK = 128  # FP8 dispatch: one float32 scale per 128 elements (DeepSeek-V3)


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


def check_config(cfg: EPConfig, world_size: int, backend: str | None = None) -> EPConfig:
    """Raise ValueError naming the parameter, its value and what is allowed -- before any process starts."""
    from common.parallel.ranks import check_world_size
    check_world_size(world_size, backend)
    for name in ("tokens", "hidden", "intermediate", "num_experts", "top_k", "n_group", "topk_group",
                 "ranks_per_node"):
        whole(name, getattr(cfg, name))
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


def node_of_expert(indices: torch.Tensor, num_experts: int, world_size: int, ranks_per_node: int) -> torch.Tensor:
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
    nodes = node_of_expert(indices, num_experts, world_size, ranks_per_node)
    hit = torch.zeros(indices.shape[0], n_nodes, dtype=torch.bool).scatter_(1, nodes.cpu(), True)
    counts = [0] * world_size
    local = rank % ranks_per_node
    for m, c in enumerate(hit.sum(0).tolist()):
        counts[m * ranks_per_node + local] = int(c)
    return counts


def rank_inputs(cfg: EPConfig, rank: int, world_size: int, device=None):
    """This rank's tokens [T/R, H], the gate's weights and indices (DeepSeek-V3 gate on x @ W_gate)."""
    t = cfg.tokens // world_size
    gen = torch.Generator().manual_seed(cfg.seed * 7919 + 1000 + rank)
    x = torch.randn(t, cfg.hidden, generator=gen)
    wg = torch.randn(cfg.hidden, cfg.num_experts, generator=torch.Generator().manual_seed(cfg.seed * 7919 + 1))
    weights, indices = moe.deepseek_v3_gate(x @ (wg / cfg.hidden ** 0.5), None, cfg.top_k, cfg.n_group,
                                            cfg.topk_group, cfg.route_scale)
    if device is not None:
        x, weights, indices = x.to(device), weights.to(device), indices.to(device)
    return x, weights, indices
