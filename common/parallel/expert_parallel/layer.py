"""The expert-parallel layer on one rank: flat (one copy per (token, expert), to the expert's rank) and node-aware
(DeepEP's normal kernels: one copy per (token, node) across nodes, then per (token, rank) inside the node; the
combine reduces inside the node before crossing back)."""
from __future__ import annotations

import torch

from common.moe import moe
from common.parallel.expert_parallel import rows as R
from common.parallel.expert_parallel.config import EPConfig, node_of_expert
from common.parallel.expert_parallel.exchange import Exchange


def grouped_experts(x: torch.Tensor, local_expert: torch.Tensor, experts) -> torch.Tensor:
    """Run local expert local_expert[i] on row x[i] (sorted into contiguous slices, as moe_grouped does); the
    identity when `experts` is None (communication only)."""
    if experts is None:
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


def flat_forward(x, weights, indices, experts_local, cfg: EPConfig, ex: Exchange) -> torch.Tensor:
    """Flat EP on this rank's tokens, on the world group: one row per (token, expert) to the expert's rank, back."""
    r, world = ex.rank, ex.world
    epr = cfg.num_experts // world
    plan = moe.dispatch_plan(indices, cfg.num_experts)
    send = plan.counts.view(world, epr).sum(1).tolist()
    recv = ex.counts(send)
    expert_ids = indices.reshape(-1).index_select(0, plan.order)
    rows = torch.cat([R.encode_dispatch(x.index_select(0, plan.token_index), cfg),
                      R.as_bytes(expert_ids.to(torch.int32).unsqueeze(1))], dim=1)
    pb = R.dispatch_row_bytes(cfg)
    got = ex.rows("dispatch", rows, send, recv, pb)
    local = got[:, pb:].contiguous().view(torch.int32).reshape(-1).long() - r * epr
    y = grouped_experts(R.decode_dispatch(got[:, :pb], cfg), local, experts_local)
    back = ex.rows("combine", R.encode_combine(y, cfg), recv, send, R.combine_row_bytes(cfg))
    return moe.combine(R.decode_combine(back, cfg), plan, weights.float(), x.shape[0])


def node_aware_forward(x, weights, indices, experts_local, cfg: EPConfig, ex: Exchange) -> torch.Tensor:
    """Node-aware EP: hop A on the "ib" group (one row per (token, node), to the rank with my local index there),
    hop B on the "nvlink" group (one row per (token, rank holding some of its experts)); combine back the same way,
    summed inside the node first."""
    r, world, per_node = ex.rank, ex.world, cfg.ranks_per_node
    epr, k = cfg.num_experts // world, cfg.top_k
    n_nodes, node = world // per_node, r // per_node
    t = x.shape[0]
    # hop A (cross-node): one copy per destination node; split m goes to node m's rank with my local index
    nodes = node_of_expert(indices, cfg.num_experts, world, per_node)
    hit = torch.zeros(t, n_nodes, dtype=torch.bool, device=x.device).scatter_(1, nodes, True)
    tok_a = [hit[:, m].nonzero().squeeze(1) for m in range(n_nodes)]
    send_a = [rows_m.numel() for rows_m in tok_a]
    tok_a = torch.cat(tok_a)
    recv_a = ex.counts(send_a, "ib")
    pb = R.dispatch_row_bytes(cfg)
    rows = torch.cat([R.encode_dispatch(x.index_select(0, tok_a), cfg),
                      R.meta(indices.index_select(0, tok_a), weights.index_select(0, tok_a))], dim=1)
    got_a = ex.rows("dispatch_ib", rows, send_a, recv_a, pb, "ib")
    # hop B (in-node): the encoded row once to each rank of my node holding some of its experts (split j: local j)
    idx_a, _ = R.unmeta(got_a[:, pb:], k)
    ranks_a = idx_a // epr
    tok_b = [(ranks_a == node * per_node + j).any(1).nonzero().squeeze(1) for j in range(per_node)]
    send_b = [rows_j.numel() for rows_j in tok_b]
    tok_b = torch.cat(tok_b)
    recv_b = ex.counts(send_b, "nvlink")
    got_b = ex.rows("dispatch_nvlink", got_a.index_select(0, tok_b), send_b, recv_b, pb, "nvlink")
    # experts: each received row, weighted sum over the token's experts that live on this rank
    xb = R.decode_dispatch(got_b[:, :pb], cfg)
    idx_b, w_b = R.unmeta(got_b[:, pb:], k)
    row, slot = ((idx_b // epr) == r).nonzero(as_tuple=True)
    y = grouped_experts(xb.index_select(0, row), idx_b[row, slot] - r * epr, experts_local)
    partial = torch.zeros_like(xb).index_add_(0, row, y * w_b[row, slot].unsqueeze(1))
    # combine: back inside the node, reduce per (token, node), back across nodes, sum per token
    cb = R.combine_row_bytes(cfg)
    back_b = R.decode_combine(ex.rows("combine_nvlink", R.encode_combine(partial, cfg), recv_b, send_b, cb,
                                      "nvlink"), cfg)
    reduced = torch.zeros(got_a.shape[0], cfg.hidden, dtype=torch.float32, device=x.device).index_add_(
        0, tok_b, back_b)
    back_a = R.decode_combine(ex.rows("combine_ib", R.encode_combine(reduced, cfg), recv_a, send_a, cb, "ib"), cfg)
    return torch.zeros(t, cfg.hidden, dtype=torch.float32, device=x.device).index_add_(0, tok_a, back_a)


FORWARD = {"flat": flat_forward, "node_aware": node_aware_forward}
VARIANTS = tuple(FORWARD)
