"""Mixture-of-experts routing, dispatch/combine, load balancing and expert-parallel traffic, vectorised in torch.

Gates (each returns `weights` [T, k] and `indices` [T, k]):
- `deepseek_v3_gate`: sigmoid scores; a per-expert bias used only to *choose* experts (auxiliary-loss-free
  balancing); group-limited selection (keep the `topk_group` groups whose two best biased scores sum highest, then
  the top-k experts inside them); weights from the *unbiased* scores of the chosen experts, normalised to sum 1 and
  scaled by `route_scale` (DeepSeek-V3: 256 experts, 8 groups, 4 groups kept, k=8, scale 2.5).
- `softmax_topk_gate`: Mixtral's softmax over the top-k logits (k=2).
- `switch_gate`: Switch Transformer's top-1 with an expert capacity; tokens past it are dropped.

Dispatch/combine: `dispatch_plan` sorts the T*k (token, expert) assignments by expert (counts, offsets), `dispatch`
gathers the token rows in that order, each expert runs on its contiguous slice, `combine` scatters the outputs back
weighted. `moe_dense_reference` (every expert on every token, masked) and `moe_naive` (a Python loop per token)
are the slow references.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from common.core.validate import whole


@contextlib.contextmanager
def single_thread():
    """Run torch on one thread inside the block: loops of small tensor ops are faster without the thread pool's
    hand-offs (and far faster on a busy machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ---------------------------------------------------------------- argument checks

def check_routing(num_experts: int, top_k: int, n_group: int = 1, topk_group: int = 1) -> None:
    """Raise ValueError (naming the parameter, its value and what is allowed) for an impossible routing setup."""
    for name, value in (("num_experts", num_experts), ("top_k", top_k), ("n_group", n_group),
                        ("topk_group", topk_group)):
        whole(name, value)
    if top_k > num_experts:
        raise ValueError(f"top_k={top_k} is larger than the {num_experts} experts (allowed: 1..{num_experts})")
    if num_experts % n_group:
        raise ValueError(f"n_group={n_group} does not divide the {num_experts} experts (allowed: a divisor of "
                         f"{num_experts})")
    if topk_group > n_group:
        raise ValueError(f"topk_group={topk_group} is larger than n_group={n_group} (allowed: 1..{n_group})")
    if top_k > topk_group * (num_experts // n_group):
        raise ValueError(f"top_k={top_k} exceeds the {topk_group * (num_experts // n_group)} experts in the "
                         f"topk_group={topk_group} kept groups of {num_experts // n_group}")


def _check_logits(logits: torch.Tensor) -> tuple[int, int]:
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        raise ValueError(f"logits must be a 2-D tensor [tokens, experts], got "
                         f"{tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__}")
    return logits.shape


# ---------------------------------------------------------------- gates

def _top2_sum(grouped: torch.Tensor) -> torch.Tensor:
    """Sum of the two largest values along the last dim (= topk(2).values.sum(-1), ties included), via two max
    passes, which are much faster than topk on a CPU for short rows."""
    best, where = grouped.max(dim=-1, keepdim=True)
    if grouped.shape[-1] == 1:
        return best.squeeze(-1)
    second = grouped.scatter(-1, where, float("-inf")).amax(dim=-1, keepdim=True)
    return (best + second).squeeze(-1)


def _deepseek_chunk(logits, bias, top_k, n_group, topk_group, route_scale):
    scores = torch.sigmoid(logits)
    choice = scores if bias is None else scores + bias
    t, e = choice.shape
    if n_group > 1 and topk_group < n_group:
        size = e // n_group
        grouped = choice.view(t, n_group, size)
        kept = _top2_sum(grouped).topk(topk_group, dim=-1).indices  # [t, topk_group]
        # the top-k among the kept groups' experts only (a gather of topk_group * size candidates is cheaper than
        # masking the others with -inf and searching all e)
        candidates = grouped.gather(1, kept.unsqueeze(-1).expand(t, topk_group, size)).view(t, -1)
        pos = candidates.topk(top_k, dim=-1).indices
        indices = kept.gather(1, torch.div(pos, size, rounding_mode="floor")) * size + pos % size
    else:
        indices = choice.topk(top_k, dim=-1).indices
    weights = scores.gather(1, indices)
    weights = weights / weights.sum(-1, keepdim=True) * route_scale
    return weights, indices


def deepseek_v3_gate(logits: torch.Tensor, bias: torch.Tensor | None = None, top_k: int = 8, n_group: int = 8,
                     topk_group: int = 4, route_scale: float = 2.5, chunk: int = 4096):
    """DeepSeek-V3's router on `logits` [T, E] (= x @ W_gate^T). Returns (weights [T, k] float, indices [T, k]).

    `bias` [E] shifts the scores for the choice only; the weights come from the unbiased sigmoid scores.
    On a CPU, tokens are processed `chunk` at a time (temporaries stay in cache) by one worker thread per torch
    thread, each running single-threaded torch ops: cheaper than splitting every small op across threads.
    """
    t, e = _check_logits(logits)
    check_routing(e, top_k, n_group, topk_group)
    if bias is not None and tuple(bias.shape) != (e,):
        raise ValueError(f"bias must have shape ({e},), got {tuple(bias.shape)}")
    if t <= chunk or logits.device.type != "cpu":
        return _deepseek_chunk(logits, bias, top_k, n_group, topk_group, route_scale)
    weights = torch.empty(t, top_k, dtype=logits.dtype, device=logits.device)
    indices = torch.empty(t, top_k, dtype=torch.int64, device=logits.device)

    def work(start):
        w, i = _deepseek_chunk(logits[start:start + chunk], bias, top_k, n_group, topk_group, route_scale)
        weights[start:start + chunk], indices[start:start + chunk] = w, i

    workers = torch.get_num_threads()
    with single_thread():
        if workers <= 1:
            for start in range(0, t, chunk):
                work(start)
        else:
            from concurrent.futures import ThreadPoolExecutor
            with ThreadPoolExecutor(max_workers=workers) as pool:
                list(pool.map(work, range(0, t, chunk)))
    return weights, indices


def softmax_topk_gate(logits: torch.Tensor, top_k: int = 2):
    """Mixtral's router: the top-k logits, softmax over those k (= full softmax renormalised over the chosen)."""
    t, e = _check_logits(logits)
    check_routing(e, top_k)
    values, indices = logits.topk(top_k, dim=-1)
    return torch.softmax(values, dim=-1), indices


def expert_capacity(num_tokens: int, num_experts: int, capacity_factor: float, top_k: int = 1) -> int:
    """Slots per expert: ceil(capacity_factor * tokens * k / experts)."""
    if capacity_factor <= 0:
        raise ValueError(f"capacity_factor={capacity_factor!r} must be > 0")
    return math.ceil(capacity_factor * num_tokens * top_k / num_experts)


def position_in_expert(indices: torch.Tensor, num_experts: int) -> torch.Tensor:
    """For each assignment of `indices` [T, k], its arrival rank at its expert (token order, then slot order)."""
    flat = indices.reshape(-1)
    order = _stable_argsort_small(flat, num_experts)
    counts = torch.bincount(flat, minlength=num_experts)
    offsets = torch.cumsum(counts, 0) - counts
    rank = torch.empty_like(flat)
    rank[order] = torch.arange(flat.numel(), device=flat.device) - offsets[flat[order]]
    return rank.view_as(indices)


def switch_gate(logits: torch.Tensor, capacity_factor: float = 1.25):
    """Switch Transformer: top-1 expert by softmax probability, weight = that probability, and a capacity per expert.

    Returns (weights [T, 1], indices [T, 1], kept [T, 1] bool); dropped tokens skip the layer (residual only).
    """
    t, e = _check_logits(logits)
    probs = torch.softmax(logits, dim=-1)
    weights, indices = probs.max(dim=-1, keepdim=True)
    capacity = expert_capacity(t, e, capacity_factor)
    kept = position_in_expert(indices, e) < capacity
    return weights, indices, kept


def dropped_fraction(indices: torch.Tensor, num_experts: int, capacity_factor: float) -> float:
    """Share of the T*k assignments that overflow an expert capacity of ceil(cf * T * k / E)."""
    t, k = indices.shape
    cap = expert_capacity(t, num_experts, capacity_factor, k)
    load = torch.bincount(indices.reshape(-1), minlength=num_experts)
    return float((load - cap).clamp(min=0).sum()) / (t * k)


def expert_load(indices: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Tokens routed to each expert."""
    return torch.bincount(indices.reshape(-1), minlength=num_experts)


# ---------------------------------------------------------------- dispatch and combine

def _stable_argsort_small(flat: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Stable argsort of expert ids; narrow integer keys sort 2-3x faster than int64 on a CPU."""
    if num_experts <= 2**15 and flat.device.type == "cpu":
        flat = flat.to(torch.int16)
    return torch.argsort(flat, stable=True)


@dataclass
class DispatchPlan:
    """The permutation that groups the T*k assignments by expert."""

    order: torch.Tensor  # [T*k] positions in the flattened [T, k] assignment list, sorted by expert
    token_index: torch.Tensor  # [T*k] the token of each sorted assignment (order // k)
    counts: torch.Tensor  # [E] assignments per expert
    offsets: torch.Tensor  # [E] start of each expert's slice in the sorted order
    top_k: int

    @property
    def num_experts(self) -> int:
        return self.counts.numel()


def dispatch_plan(indices: torch.Tensor, num_experts: int) -> DispatchPlan:
    """Sort assignments by expert (stable: token order kept within an expert); counts and offsets per expert."""
    if indices.dim() != 2:
        raise ValueError(f"indices must be [tokens, k], got shape {tuple(indices.shape)}")
    flat = indices.reshape(-1)
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= num_experts):
        raise ValueError(f"indices must lie in 0..{num_experts - 1}")
    order = _stable_argsort_small(flat, num_experts)
    counts = torch.bincount(flat, minlength=num_experts)
    offsets = torch.cumsum(counts, 0) - counts
    return DispatchPlan(order, order // indices.shape[1], counts, offsets, indices.shape[1])


def dispatch(x: torch.Tensor, plan: DispatchPlan) -> torch.Tensor:
    """Token rows in expert order: [T*k, H]."""
    return x.index_select(0, plan.token_index)


def combine(y: torch.Tensor, plan: DispatchPlan, weights: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Undo the permutation: out[t] = sum over t's assignments of weight * expert output. [T, H]."""
    w = weights.reshape(-1).index_select(0, plan.order).to(y.dtype)
    out = torch.zeros(num_tokens, y.shape[1], dtype=y.dtype, device=y.device)
    return out.index_add_(0, plan.token_index, y * w.unsqueeze(1))


@dataclass
class Experts:
    """E SwiGLU experts, stacked: w_gate, w_up [E, H, F] and w_down [E, F, H]."""

    w_gate: torch.Tensor
    w_up: torch.Tensor
    w_down: torch.Tensor

    @property
    def num_experts(self) -> int:
        return self.w_gate.shape[0]

    def forward(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert e on rows x [n, H] -> [n, H]."""
        return (F.silu(x @ self.w_gate[e]) * (x @ self.w_up[e])) @ self.w_down[e]

    def to(self, dtype) -> "Experts":
        return Experts(self.w_gate.to(dtype), self.w_up.to(dtype), self.w_down.to(dtype))


def make_experts(num_experts: int, hidden: int, intermediate: int, seed: int = 0,
                 dtype=torch.float32) -> Experts:
    """Random experts (scaled so outputs stay O(1))."""
    g = torch.Generator().manual_seed(seed)
    def w(*shape, fan_in):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) / math.sqrt(fan_in)).to(dtype)
    return Experts(w(num_experts, hidden, intermediate, fan_in=hidden),
                   w(num_experts, hidden, intermediate, fan_in=hidden),
                   w(num_experts, intermediate, hidden, fan_in=intermediate))


def moe_grouped(x: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor, experts: Experts) -> torch.Tensor:
    """Sorted/grouped MoE layer: dispatch, one matmul chain per expert on its contiguous slice, combine."""
    plan = dispatch_plan(indices, experts.num_experts)
    xs = dispatch(x, plan)
    ys = torch.empty_like(xs)
    for e, (start, n) in enumerate(zip(plan.offsets.tolist(), plan.counts.tolist())):
        if n:
            ys[start:start + n] = experts.forward(e, xs[start:start + n])
    return combine(ys, plan, weights, x.shape[0])


def routing_matrix(weights: torch.Tensor, indices: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Dense [T, E] matrix of gate weights (0 where a token does not use an expert)."""
    dense = torch.zeros(indices.shape[0], num_experts, dtype=weights.dtype, device=weights.device)
    return dense.scatter_add_(1, indices, weights)


def moe_dense_reference(x, weights, indices, experts: Experts) -> torch.Tensor:
    """Every expert on every token, masked by the routing matrix (E times the work; a correctness reference)."""
    mask = routing_matrix(weights.to(x.dtype), indices, experts.num_experts)
    out = torch.zeros_like(x)
    for e in range(experts.num_experts):
        out += mask[:, e:e + 1] * experts.forward(e, x)
    return out


def moe_naive(x, weights, indices, experts: Experts) -> torch.Tensor:
    """One token and one expert at a time: the obvious loop (slow: T*k tiny matmuls from Python)."""
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(indices.shape[1]):
            e = int(indices[t, j])
            out[t] += weights[t, j].to(x.dtype) * experts.forward(e, x[t:t + 1])[0]
    return out


# ---------------------------------------------------------------- load balancing over training steps

@dataclass
class SkewedRouter:
    """A synthetic router: logits = x @ W + popularity, with x fresh Gaussian tokens each step.

    `popularity` [E] is the skew: evenly spaced from +skew to -skew in a seeded random order, so some experts are
    favoured by every token (as a router that learned to prefer them).
    """

    w: torch.Tensor  # [d, E]
    popularity: torch.Tensor  # [E]
    seed: int

    @classmethod
    def make(cls, num_experts: int, skew: float = 1.0, dim: int = 16, seed: int = 0) -> "SkewedRouter":
        g = torch.Generator().manual_seed(seed)
        w = torch.randn(dim, num_experts, generator=g) / math.sqrt(dim)
        levels = torch.linspace(skew, -skew, num_experts)
        popularity = levels[torch.randperm(num_experts, generator=g)]
        return cls(w, popularity, seed)

    def logits(self, step: int, tokens: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 100003 + step + 1)
        x = torch.randn(tokens, self.w.shape[0], generator=g)
        return x @ self.w + self.popularity


def simulate_balance(method: str, steps: int = 200, tokens: int = 2048, num_experts: int = 64, top_k: int = 6,
                     n_group: int = 8, topk_group: int = 4, skew: float = 1.0, gamma: float = 0.002,
                     alpha: float = 0.03, lr: float = 100.0, task_pull: float = 0.02, capacity_factor: float = 1.25,
                     seed: int = 0) -> dict:
    """Route a skewed synthetic router for `steps` steps and balance it with `method`:

    - "none": no balancing;
    - "aux_free": DeepSeek-V3's bias: after each step b_e += gamma * sign(mean load - load_e); b only picks experts;
    - "aux_loss": a Switch-style auxiliary loss alpha * sum_e f_e * P_e (f_e: fraction of assignments to e times
      E/k, P_e: mean normalised score of e) trained by SGD (rate `lr`) on per-expert logit offsets c; the language
      model's own loss, which wants its routing unchanged, is modelled as a pull task_pull * c back to 0.
    Returns per-step lists: max_over_mean (max expert load / mean), dropped (share past capacity_factor), and
    the final bias or offsets.
    """
    if method not in ("none", "aux_free", "aux_loss"):
        raise ValueError(f"method={method!r}; allowed: 'none', 'aux_free', 'aux_loss'")
    check_routing(num_experts, top_k, n_group, topk_group)
    with single_thread():
        return _simulate(method, steps, tokens, num_experts, top_k, n_group, topk_group, skew, gamma, alpha, lr,
                         task_pull, capacity_factor, seed)


def _simulate(method, steps, tokens, num_experts, top_k, n_group, topk_group, skew, gamma, alpha, lr, task_pull,
              capacity_factor, seed):
    router = SkewedRouter.make(num_experts, skew, seed=seed)
    bias = torch.zeros(num_experts)
    offset = torch.zeros(num_experts, requires_grad=True)
    mom, dropped = [], []
    for step in range(steps):
        logits = router.logits(step, tokens)
        if method == "aux_loss":
            logits = logits + offset
        with torch.no_grad():
            _, idx = deepseek_v3_gate(logits, bias if method == "aux_free" else None, top_k, n_group, topk_group, 1.0)
        load = expert_load(idx, num_experts).to(torch.float32)
        mom.append(float(load.max() / load.mean()))
        dropped.append(dropped_fraction(idx, num_experts, capacity_factor))
        if method == "aux_free":
            bias += gamma * torch.sign(load.mean() - load)
        elif method == "aux_loss":
            scores = torch.sigmoid(logits)
            p = (scores / scores.sum(-1, keepdim=True)).mean(0)
            f = load * num_experts / (top_k * tokens)
            loss = alpha * (f * p).sum()
            (grad,) = torch.autograd.grad(loss, offset)
            with torch.no_grad():
                offset -= lr * grad + task_pull * offset
    final = offset.detach() if method == "aux_loss" else bias
    return {"method": method, "max_over_mean": mom, "dropped": dropped, "final_adjustment": final}


def final_value(series, last: int = 20) -> float:
    """Mean of the last `last` values of a per-step series (the steady state, less noisy than the last step)."""
    tail = list(series)[-last:]
    return sum(tail) / len(tail)


# ---------------------------------------------------------------- expert-parallel traffic

def distinct_nodes(indices: torch.Tensor, experts_per_node: int, num_nodes: int) -> torch.Tensor:
    """Number of different nodes each token's experts live on (expert e on node e // experts_per_node)."""
    nodes = indices // experts_per_node
    hit = torch.zeros(indices.shape[0], num_nodes, dtype=torch.bool, device=indices.device)
    hit.scatter_(1, nodes, True)
    return hit.sum(-1)


def expected_distinct_nodes(num_experts: int, top_k: int, num_nodes: int) -> float:
    """For k experts drawn uniformly without replacement: nodes * (1 - C(E - E/nodes, k) / C(E, k))."""
    per_node = num_experts // num_nodes
    return num_nodes * (1 - math.comb(num_experts - per_node, top_k) / math.comb(num_experts, top_k))


def token_traffic_bytes(hidden: int, copies: float, dispatch_bytes: float = 1.0, combine_bytes: float = 2.0,
                        scale_block: int = 128, scale_bytes: int = 4) -> dict:
    """Bytes one token sends for `copies` destinations: dispatch in FP8 (1 B per element plus one FP32 scale per
    `scale_block` elements) and combine in BF16 (2 B per element), as DeepSeek-V3 does."""
    d = hidden * dispatch_bytes + (math.ceil(hidden / scale_block) * scale_bytes if dispatch_bytes < 2 else 0)
    c = hidden * combine_bytes
    return {"dispatch": copies * d, "combine": copies * c, "total": copies * (d + c)}


def ep_traffic(indices: torch.Tensor, hidden: int, experts_per_node: int, num_nodes: int,
               dispatch_bytes: float = 1.0, combine_bytes: float = 2.0) -> dict:
    """Mean bytes per token crossing InfiniBand, each token living on node (token index mod num_nodes):
    - "per_expert": one copy per remote expert (no de-duplication);
    - "per_node": one copy per distinct remote node (then forwarded over NVLink inside the node), DeepSeek-V3's way.
    Also the mean number of distinct nodes per token."""
    t, k = indices.shape
    home = torch.arange(t, device=indices.device) % num_nodes
    nodes = indices // experts_per_node
    remote_experts = (nodes != home.unsqueeze(1)).sum(-1).to(torch.float64)
    hit = torch.zeros(t, num_nodes, dtype=torch.bool, device=indices.device).scatter_(1, nodes, True)
    n_nodes = hit.sum(-1).to(torch.float64)
    remote_nodes = n_nodes - hit.gather(1, home.unsqueeze(1)).squeeze(1).to(torch.float64)
    per_expert = token_traffic_bytes(hidden, float(remote_experts.mean()), dispatch_bytes, combine_bytes)
    per_node = token_traffic_bytes(hidden, float(remote_nodes.mean()), dispatch_bytes, combine_bytes)
    return {"nodes_per_token": float(n_nodes.mean()), "max_nodes_per_token": int(n_nodes.max()),
            "ib_copies_per_expert": float(remote_experts.mean()), "ib_copies_per_node": float(remote_nodes.mean()),
            "ib_bytes_per_expert": per_expert["total"], "ib_bytes_per_node": per_node["total"]}


def node_limit_attribution(unlimited: torch.Tensor, limited: torch.Tensor, hidden: int, experts_per_node: int,
                           num_nodes: int, dispatch_bytes: float = 1.0, combine_bytes: float = 2.0) -> dict:
    """Split the InfiniBand saving of DeepSeek-V3's routing between its two mechanisms, from routing indices.

    `unlimited` and `limited` [T, k] route the same tokens without and with the node limit (groups = nodes). Mean IB
    bytes per token for the four combinations:
    - "per_expert": no limit, one copy per remote expert (no de-duplication);
    - "node_limited_no_dedup": the node limit alone -- still one copy per remote expert, so it saves ~nothing;
    - "dedup_no_limit": one copy per distinct remote node, no limit;
    - "node_limited_dedup": both (DeepSeek-V3's way).
    Also "saved_by_dedup" (per_expert - dedup_no_limit) and "saved_by_limit" (dedup_no_limit - node_limited_dedup:
    what the limit adds once copies are de-duplicated), and "statement", one sentence saying so.
    """
    if tuple(unlimited.shape) != tuple(limited.shape):
        raise ValueError(f"unlimited {tuple(unlimited.shape)} and limited {tuple(limited.shape)} must route the same "
                         f"tokens with the same k")
    free = ep_traffic(unlimited, hidden, experts_per_node, num_nodes, dispatch_bytes, combine_bytes)
    lim = ep_traffic(limited, hidden, experts_per_node, num_nodes, dispatch_bytes, combine_bytes)
    out = {"per_expert": free["ib_bytes_per_expert"], "node_limited_no_dedup": lim["ib_bytes_per_expert"],
           "dedup_no_limit": free["ib_bytes_per_node"], "node_limited_dedup": lim["ib_bytes_per_node"]}
    out["saved_by_dedup"] = out["per_expert"] - out["dedup_no_limit"]
    out["saved_by_limit"] = out["dedup_no_limit"] - out["node_limited_dedup"]
    kb = {k: v / 1e3 for k, v in out.items()}
    out["statement"] = (
        f"per-node de-duplication cuts {kb['per_expert']:.1f} -> {kb['dedup_no_limit']:.1f} KB per token; the node "
        f"limit then cuts {kb['dedup_no_limit']:.1f} -> {kb['node_limited_dedup']:.1f} KB; without de-duplication "
        f"the limit alone saves nothing ({kb['per_expert']:.1f} -> {kb['node_limited_no_dedup']:.1f} KB: a token "
        f"still sends one copy per remote expert)")
    return out


def experts_within_ib_budget(nvlink_gbs: float, ib_gbs: float, max_nodes: int) -> dict:
    """DeepSeek-V3's argument (report, section 3.2.2) for routing to at most M nodes: a token crosses IB once per
    node and NVLink once per expert inside it, so while NVLink is `nvlink_gbs / ib_gbs` times faster, up to that
    many experts per node cost no more time than the single IB transfer; M nodes then allow M x ratio experts at
    the same communication cost (160 / 50 = 3.2 per node, 4 x 3.2 = 12.8, "up to 13")."""
    for name, value in (("nvlink_gbs", nvlink_gbs), ("ib_gbs", ib_gbs), ("max_nodes", max_nodes)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name}={value!r} must be a positive number")
    per_node = nvlink_gbs / ib_gbs
    return {"experts_per_node": per_node, "experts_at_same_cost": max_nodes * per_node}
