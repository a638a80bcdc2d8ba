"""Expert-parallel load balancing (EPLB): replicate heavy experts, then pack the replicas onto GPUs.

The interface and the outputs are those of DeepSeek's public load balancer (github.com/deepseek-ai/EPLB):

    phy2log, log2phy, logcnt = rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_gpus)

- `weight` [layers, experts]: measured load of each logical expert (tokens routed to it);
- `phy2log` [layers, num_replicas]: the logical expert held by each physical slot; slot p lives on GPU
  p // (num_replicas // num_gpus), and GPU g on node g // (num_gpus // num_nodes);
- `log2phy` [layers, experts, max_replicas]: the physical slots of each logical expert, padded with -1;
- `logcnt` [layers, experts]: how many replicas each logical expert got.

Two policies, as in DeepSeek's: **hierarchical** (when the expert groups divide evenly among the nodes: pack whole
groups onto nodes, replicate experts within each node, pack the replicas onto the node's GPUs -- cross-node traffic
stays as group-limited routing planned it) and **global** (otherwise: replicate over all experts and pack onto all
GPUs). Both are greedy: replication gives the next replica to the expert with the largest load per replica; packing
takes items heaviest first and puts each into the lightest pack that still has room (every pack gets the same number
of items). This is an independent implementation, vectorised over layers.
"""
from __future__ import annotations

import torch

from common.core.validate import whole
from common.moe.moe import single_thread


def _check(weight, num_replicas: int, num_groups: int, num_nodes: int, num_gpus: int) -> torch.Tensor:
    if not isinstance(weight, torch.Tensor):
        weight = torch.as_tensor(weight)
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D [layers, experts], got shape {tuple(weight.shape)}")
    experts = weight.shape[1]
    for name, value in (("num_replicas", num_replicas), ("num_groups", num_groups), ("num_nodes", num_nodes),
                        ("num_gpus", num_gpus)):
        whole(name, value)
    if num_replicas < experts:
        raise ValueError(f"num_replicas={num_replicas} is fewer than the {experts} logical experts: every expert "
                         f"needs at least one physical slot (allowed: num_replicas >= {experts})")
    if num_replicas % num_gpus:
        raise ValueError(f"num_gpus={num_gpus} does not divide num_replicas={num_replicas}: every GPU must hold "
                         f"the same number of physical experts (allowed: num_gpus a divisor of num_replicas)")
    if experts % num_groups:
        raise ValueError(f"num_groups={num_groups} does not divide the {experts} experts (allowed: a divisor of "
                         f"{experts})")
    if num_groups % num_nodes == 0 and num_gpus % num_nodes:
        raise ValueError(f"num_nodes={num_nodes} does not divide num_gpus={num_gpus} (the hierarchical policy, "
                         f"chosen because num_groups={num_groups} is a multiple of num_nodes, needs whole nodes)")
    if torch.is_floating_point(weight) and not torch.isfinite(weight).all():
        raise ValueError("weight has NaN or infinite entries")
    if (weight < 0).any():
        raise ValueError("weight has negative entries; loads are token counts >= 0")
    return weight.detach().to("cpu", torch.float32)


def balanced_packing(weight: torch.Tensor, num_packs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Split each row's n items into `num_packs` packs of n / num_packs items with balanced sums.

    Greedy, heaviest item first, each into the lightest pack that is not full (lowest index on ties).
    Returns (pack_index, rank_in_pack), both [rows, n] int64: item i of row r goes to pack pack_index[r, i] as its
    rank_in_pack[r, i]-th item.
    """
    rows, n = weight.shape
    if n % num_packs:
        raise ValueError(f"num_packs={num_packs} does not divide the {n} items per row")
    per_pack = n // num_packs
    if per_pack == 1:
        idx = torch.arange(n, dtype=torch.int64).expand(rows, n).clone()
        return idx, torch.zeros_like(idx)
    order = torch.sort(weight, dim=-1, descending=True, stable=True).indices
    pack_weight = torch.zeros(rows, num_packs, dtype=torch.float64)
    pack_count = torch.zeros(rows, num_packs, dtype=torch.int64)
    pack_index = torch.empty(rows, n, dtype=torch.int64)
    rank_in_pack = torch.empty(rows, n, dtype=torch.int64)
    row = torch.arange(rows)
    w64 = weight.to(torch.float64)
    inf = torch.tensor(float("inf"), dtype=torch.float64)
    for step in range(n):
        item = order[:, step]
        candidates = torch.where(pack_count < per_pack, pack_weight, inf)
        pack = candidates.argmin(dim=-1)
        pack_index[row, item] = pack
        rank_in_pack[row, item] = pack_count[row, pack]
        pack_count[row, pack] += 1
        pack_weight[row, pack] += w64[row, item]
    return pack_index, rank_in_pack


def replicate_experts(weight: torch.Tensor, num_physical: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Give each row's n logical experts num_physical slots: one each, then the spare ones greedily to the expert
    whose load per replica is largest (lowest index on ties).

    Returns (phy2log [rows, num_physical], replica_rank [rows, num_physical], logcnt [rows, n]).
    """
    rows, n = weight.shape
    spare = num_physical - n
    if spare < 0:
        raise ValueError(f"num_physical={num_physical} is fewer than the {n} experts")
    row = torch.arange(rows)
    phy2log = torch.arange(num_physical, dtype=torch.int64).repeat(rows, 1)
    replica_rank = torch.zeros(rows, num_physical, dtype=torch.int64)
    logcnt = torch.ones(rows, n, dtype=torch.int64)
    for slot in range(n, num_physical):
        heaviest = (weight / logcnt).argmax(dim=-1)
        phy2log[:, slot] = heaviest
        replica_rank[:, slot] = logcnt[row, heaviest]
        logcnt[row, heaviest] += 1
    return phy2log, replica_rank, logcnt


def _invert(perm: torch.Tensor) -> torch.Tensor:
    """The inverse of each row's permutation."""
    inv = torch.empty_like(perm)
    inv.scatter_(1, perm, torch.arange(perm.shape[1], dtype=perm.dtype).expand_as(perm))
    return inv


def rebalance_hierarchical(weight: torch.Tensor, num_physical: int, num_groups: int, num_nodes: int,
                           num_gpus: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Groups to nodes, replicas within nodes, replicas to GPUs. Returns (phy2log, replica_rank, logcnt)."""
    layers, experts = weight.shape
    group_size = experts // num_groups
    groups_per_node = num_groups // num_nodes
    gpus_per_node = num_gpus // num_nodes
    slots_per_gpu = num_physical // num_gpus
    experts_per_node = experts // num_nodes
    # 1. whole groups onto nodes; renumber experts node-major ("node order"): node 0's groups first.
    group_load = weight.view(layers, num_groups, group_size).sum(-1)
    node_of_group, rank_of_group = balanced_packing(group_load, num_nodes)
    first = (node_of_group * groups_per_node + rank_of_group) * group_size  # [layers, groups]
    log2ord = (first.unsqueeze(-1) + torch.arange(group_size)).flatten(1)  # logical -> node order
    ord2log = _invert(log2ord)
    # 2. replicate within each node: rows are (layer, node) pairs
    node_load = weight.gather(1, ord2log).view(layers * num_nodes, experts_per_node)
    slot2local, slot_rank, local_cnt = replicate_experts(node_load, num_physical // num_nodes)
    # 3. pack each node's replicas onto its GPUs, a replica carrying its expert's load / replica count
    replica_load = (node_load / local_cnt).gather(1, slot2local)
    gpu, rank_on_gpu = balanced_packing(replica_load, gpus_per_node)
    placed = gpu * slots_per_gpu + rank_on_gpu  # slot -> position within the node
    at_position = _invert(placed)  # position within the node -> slot
    local = slot2local.gather(1, at_position)
    node_base = (torch.arange(num_nodes) * experts_per_node).repeat(layers).unsqueeze(-1)
    phy2ord = (local + node_base).view(layers, -1)
    phy2log = ord2log.gather(1, phy2ord)
    replica_rank = slot_rank.gather(1, at_position).view(layers, -1)
    logcnt = local_cnt.view(layers, -1).gather(1, log2ord)
    return phy2log, replica_rank, logcnt


def rebalance_experts(weight, num_replicas: int, num_groups: int, num_nodes: int, num_gpus: int):
    """Plan the replication and placement of experts; see the module docstring for inputs and outputs.

    Hierarchical when num_groups is a multiple of num_nodes, global otherwise (DeepSeek's choice: hierarchical for
    prefill's smaller expert-parallel size, global for decoding's larger one).
    """
    weight = _check(weight, num_replicas, num_groups, num_nodes, num_gpus)
    layers, experts = weight.shape
    with single_thread():
        if num_groups % num_nodes == 0:
            phy2log, rank, logcnt = rebalance_hierarchical(weight, num_replicas, num_groups, num_nodes, num_gpus)
        else:
            phy2log, rank, logcnt = rebalance_hierarchical(weight, num_replicas, 1, 1, num_gpus)
    width = int(logcnt.max())
    log2phy = torch.full((layers, experts * width), -1, dtype=torch.int64)
    log2phy.scatter_(1, phy2log * width + rank, torch.arange(num_replicas, dtype=torch.int64).expand(layers, -1))
    return phy2log, log2phy.view(layers, experts, width), logcnt


def gpu_loads(weight, phy2log: torch.Tensor, logcnt: torch.Tensor, num_gpus: int) -> torch.Tensor:
    """[layers, num_gpus] load per GPU when each expert's load is split evenly over its replicas."""
    weight = torch.as_tensor(weight, dtype=torch.float64)
    per_replica = weight / logcnt.to(torch.float64)
    slot_load = per_replica.gather(1, phy2log)
    return slot_load.view(weight.shape[0], num_gpus, -1).sum(-1)


def identity_placement(num_layers: int, num_experts: int, num_gpus: int) -> tuple[torch.Tensor, torch.Tensor]:
    """No balancing: expert e on GPU e // (num_experts // num_gpus), one replica each. Returns (phy2log, logcnt)."""
    if num_experts % num_gpus:
        raise ValueError(f"num_gpus={num_gpus} does not divide num_experts={num_experts}")
    phy2log = torch.arange(num_experts).repeat(num_layers, 1)
    return phy2log, torch.ones(num_layers, num_experts, dtype=torch.int64)


def max_over_mean(loads: torch.Tensor) -> float:
    """Imbalance of per-GPU (or per-expert) loads: max / mean per layer, averaged over layers."""
    loads = torch.as_tensor(loads, dtype=torch.float64)
    if loads.dim() == 1:
        loads = loads.unsqueeze(0)
    return float((loads.max(-1).values / loads.mean(-1)).mean())
