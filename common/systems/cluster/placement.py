"""Where each rank of a parallel job runs, and what its placement sends across the slow tier (lab 09's build
exercise; `place` is its reference).

A placement is an array `gpu[p][d][t]`: the GPU id of pipeline stage p, data-parallel rank d and tensor rank t, for a
`topology.Layout` (tp, pp, dp, ep). GPU g sits in NVLink domain g // domain (an 8-GPU node, a 72-GPU NVL72 rack);
ids need not be consecutive (a domain may keep GPUs idle), each is used once. The groups (Megatron's, with EP carved
out of DP as in `topology.Layout`):
- TP: the tp ranks of one (p, d); EP: the ep consecutive data-parallel ranks d // ep of one (p, t); PP: the chain of
  stages of one (d, t); DP: the dp ranks of one (p, t) for dense parameters, and for experts the dp / ep ranks with
  the same d % ep (the replicas of the same experts).

The traffic model (`crossing_bytes`): bytes per optimizer step that leave an NVLink domain, for the whole job, by kind
-- the same volumes as `topology.step_communication`:
- TP and DP are ring all-reduces; NCCL orders a ring by topology, so a ring over k domains crosses a boundary k times
  (k > 1), each crossing carrying what one GPU sends its successor, 2 (g - 1) / g x the bytes reduced;
- EP is an all-to-all: each GPU sends an equal share of its bytes to every member, itself included; the shares to
  members in other domains cross;
- PP sends each boundary's activations forward and their gradients back, between the same (d, t) of stages p, p + 1.
"""
from __future__ import annotations

import numpy as np

from common.core.validate import whole
from common.systems.cluster import scaling
from common.systems.cluster.topology import Layout, ModelSketch

KINDS = ("tp", "ep", "pp", "dp")


# ---------------------------------------------------------------- placements

def place(tp: int, ep: int, pp: int, dp: int, domain: int) -> np.ndarray:
    """The reference placement: ranks in Megatron's order (t fastest, then d -- so each EP group's ranks are
    consecutive -- then p), onto the GPUs each domain can hold whole: a domain takes as many whole TP x EP blocks as
    fit in it (else whole TP groups, else all its GPUs) and leaves the rest idle, so no group that fits in a domain
    is split across two."""
    Layout(tp=tp, pp=pp, dp=dp, ep=ep)
    whole("domain", domain, meaning="GPUs per NVLink domain")
    unit = tp * ep if tp * ep <= domain else (tp if tp <= domain else domain)
    usable = domain // unit * unit
    rank = np.arange(pp * dp * tp)
    return ((rank // usable) * domain + rank % usable).reshape(pp, dp, tp)


def contiguous(tp: int, ep: int, pp: int, dp: int) -> np.ndarray:
    """Ranks in Megatron's order on GPUs 0, 1, 2, ...: no GPU left idle, whatever the domains."""
    Layout(tp=tp, pp=pp, dp=dp, ep=ep)
    return np.arange(pp * dp * tp).reshape(pp, dp, tp)


def check_placement(gpu, layout: Layout) -> np.ndarray:
    """`gpu` as an integer array of shape (pp, dp, tp), each id a whole number >= 0 used once; else a ValueError
    that says what is wrong."""
    want = (layout.pp, layout.dp, layout.tp)
    try:
        arr = np.asarray(gpu, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"the placement is not an array of GPU ids of shape (pp, dp, tp) = {want}") from None
    if arr.shape != want:
        raise ValueError(f"the placement has shape {arr.shape}; it must be (pp, dp, tp) = {want}: gpu[p][d][t]")
    if not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)) or np.any(arr < 0):
        raise ValueError("GPU ids must be whole numbers >= 0")
    ids = arr.astype(np.int64)
    values, counts = np.unique(ids, return_counts=True)
    if np.any(counts > 1):
        g = int(values[counts > 1][0])
        where = [tuple(int(i) for i in w) for w in np.argwhere(ids == g)[:2]]
        raise ValueError(f"GPU {g} holds two ranks, (p, d, t) = {where[0]} and {where[1]}: each GPU runs one rank")
    return ids


def groups(layout: Layout, kind: str) -> list[tuple[tuple, np.ndarray]]:
    """(name, index arrays) of every group of `kind` ("tp", "ep", "pp", "dp", "dp_experts"): each index array picks the
    group's members out of a (pp, dp, tp) placement, in rank order."""
    pp, dp, tp, ep = layout.pp, layout.dp, layout.tp, layout.ep
    p_, d_, t_ = np.indices((pp, dp, tp))
    out = []
    if kind == "tp":
        for p in range(pp):
            for d in range(dp):
                out.append(((p, d), (p_[p, d, :], d_[p, d, :], t_[p, d, :])))
    elif kind == "ep":
        for p in range(pp):
            for g in range(dp // ep):
                for t in range(tp):
                    ds = np.arange(g * ep, (g + 1) * ep)
                    out.append(((p, g, t), (np.full(ep, p), ds, np.full(ep, t))))
    elif kind == "pp":
        for d in range(dp):
            for t in range(tp):
                out.append(((d, t), (np.arange(pp), np.full(pp, d), np.full(pp, t))))
    elif kind == "dp":
        for p in range(pp):
            for t in range(tp):
                out.append(((p, t), (np.full(dp, p), np.arange(dp), np.full(dp, t))))
    elif kind == "dp_experts":
        for p in range(pp):
            for t in range(tp):
                for e in range(ep):
                    ds = np.arange(e, dp, ep)
                    out.append(((p, t, e), (np.full(len(ds), p), ds, np.full(len(ds), t))))
    else:
        raise ValueError(f"kind={kind!r}; allowed: tp, ep, pp, dp, dp_experts")
    return out


# ---------------------------------------------------------------- the traffic model

def volumes(model: ModelSketch, layout: Layout, tokens_per_step: float, dispatch_bytes: float = 1,
            combine_bytes: float = 2, act_bytes: float = 2, grad_bytes: float = 2) -> dict:
    """Bytes per step each collective moves, for one GPU (as `topology.step_communication` counts them):
    - "tp": bytes reduced by its TP all-reduces (4 per layer of its stage, tokens x hidden each);
    - "ep": bytes each GPU sends in its all-to-alls (top_k copies of each token's hidden vector, dispatch and combine,
      forward and backward, per MoE layer of its stage), its own share included;
    - "pp": bytes between two neighbouring stages (activations forward, gradients back), per (d, t);
    - "dp", "dp_experts": gradient bytes its DP rings reduce (dense parameters; routed experts)."""
    tokens = scaling._positive("tokens_per_step", tokens_per_step) / layout.dp
    layers, moe_layers = model.layers / layout.pp, model.moe_layers / layout.pp
    dense = model.dense_params / (layout.tp * layout.pp)
    experts = model.expert_params / (layout.tp * layout.pp * layout.ep)
    return {"tp": layers * 4 * tokens * model.hidden * act_bytes if layout.tp > 1 else 0.0,
            "ep": (moe_layers * tokens / layout.tp * 2 * model.hidden * (dispatch_bytes + combine_bytes)
                   * model.top_k) if layout.ep > 1 else 0.0,
            "pp": 2 * tokens * model.hidden * act_bytes / layout.tp if layout.pp > 1 else 0.0,
            "dp": dense * grad_bytes, "dp_experts": experts * grad_bytes}


def _ring_crossings(members: np.ndarray) -> np.ndarray:
    """Boundaries each ring (the last axis holds its members' domains) crosses when ordered by topology: one per
    domain it spans, if it spans several."""
    ordered = np.sort(members, axis=-1)
    k = 1 + np.sum(ordered[..., 1:] != ordered[..., :-1], axis=-1)
    return np.where(k > 1, k, 0)


def _by_group(dom: np.ndarray, layout: Layout) -> dict:
    """The domains of each group's members, one group per row of the last axis, by kind."""
    pp, dp, tp, ep = layout.pp, layout.dp, layout.tp, layout.ep
    blocks = dom.reshape(pp, dp // ep, ep, tp)  # d = g * ep + e
    return {"tp": dom, "dp": dom.transpose(0, 2, 1), "dp_experts": blocks.transpose(0, 2, 3, 1),
            "ep": blocks.transpose(0, 1, 3, 2)}


def crossing_bytes(gpu, layout: Layout, domain: int, vol: dict) -> dict:
    """Bytes per step that cross between NVLink domains, for the whole job, by kind ("tp", "ep", "pp", "dp"), and
    "total" (see the module docstring); `vol` from `volumes`."""
    ids = check_placement(gpu, layout)
    whole("domain", domain, meaning="GPUs per NVLink domain")
    dom = ids // domain
    rows = _by_group(dom, layout)
    out = dict.fromkeys(KINDS, 0.0)
    for kind, key in (("tp", "tp"), ("dp", "dp"), ("dp", "dp_experts")):
        g = rows[key].shape[-1]
        if g > 1 and vol[key]:
            out[kind] += float(_ring_crossings(rows[key]).sum()) * 2 * (g - 1) / g * vol[key]
    members = rows["ep"]
    g = members.shape[-1]
    if vol["ep"] and g > 1:
        same = (members[..., :, None] == members[..., None, :]).sum(axis=-1)  # members in each one's own domain
        out["ep"] = vol["ep"] / g * float((g - same).sum())
    if vol["pp"] and layout.pp > 1:
        out["pp"] = vol["pp"] * float(np.sum(dom[1:] != dom[:-1]))
    out["total"] = sum(out[k] for k in KINDS)
    return out


def domains_used(gpu, domain: int) -> int:
    """How many NVLink domains the placement touches."""
    return len(np.unique(np.asarray(gpu, dtype=np.int64) // domain))


def spans(gpu, layout: Layout, domain: int, kind: str) -> list[tuple[tuple, list[int]]]:
    """(group name, its domains) of every group of `kind`, for naming the groups a placement splits."""
    dom = check_placement(gpu, layout) // domain
    return [(name, sorted(set(int(x) for x in dom[idx]))) for name, idx in groups(layout, kind)]
