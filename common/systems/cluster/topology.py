"""Rack-scale topology math: what a GB200 NVL72 (or an 8-GPU node) adds up to, bandwidth inside vs outside the NVLink
domain, and what a parallelism layout (TP / PP / EP / DP) costs in memory and communication per GPU.

Rack and node facts (GPU counts, trays, NICs, power) come from data/systems.json; per-GPU facts (HBM, NVLink, FLOP
rates, TDP) from common.facts.hardware, so a rack figure is always `count x per-GPU fact`. Conventions:
- NVIDIA quotes NVLink per GPU as a *bidirectional* total (H100: 900 GB/s = 450 GB/s each way); network links are
  quoted per direction in Gb/s (400 Gb/s = 50 GB/s). Time to move bytes uses the per-direction figure of each.
- GB and TB are decimal (1e9, 1e12 bytes), as datasheets count.
- Layouts: ranks are numbered with TP innermost, then EP/DP, then PP outermost (Megatron's order); a group of `g`
  consecutive ranks shares one NVLink domain when g <= domain size.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache

from common.core.env import REPO_ROOT
from common.core.validate import whole
from common.systems.cluster import scaling

SYSTEMS_PATH = REPO_ROOT / "data" / "systems.json"
DTYPES = ("fp4", "fp8", "bf16")


# ---------------------------------------------------------------- facts

@lru_cache(maxsize=1)
def load_systems() -> dict:
    return json.loads(SYSTEMS_PATH.read_text())


def system_ids() -> list[str]:
    return list(load_systems()["systems"])


def check_system(system_id: str) -> dict:
    systems = load_systems()["systems"]
    if system_id not in systems:
        raise ValueError(f"system_id={system_id!r} is not a system in data/systems.json; "
                         f"allowed: {', '.join(systems)}")
    return systems[system_id]


def fact(system_id: str, name: str, default=None):
    """A rack/node fact's value, e.g. fact("GB200-NVL72", "grace_cpus") -> 36."""
    facts = check_system(system_id)["facts"]
    if name in facts:
        return facts[name]["value"]
    if default is not None:
        return default
    raise ValueError(f"fact {name!r} is not recorded for {system_id}; recorded: {', '.join(facts)}")


def headline(system_id: str, name: str):
    """The vendor's own rack total (to check derived figures against), or None: from data/systems.json, else from
    the rack totals common.facts.hardware keeps with the GPU (GB200: pflops_sparse, pflops_dense, hbm_tb, nvlink_tbs)."""
    entry = check_system(system_id)["headline"].get(name)
    if entry is not None:
        return entry["value"]
    system = getattr(_gpu(check_system(system_id)["gpu_id"]), "system", None) or {}
    if system.get("gpus") != fact(system_id, "gpus"):
        return None
    value = system
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def source(system_id: str, name: str) -> str:
    sysd = check_system(system_id)
    entry = sysd["facts"].get(name) or sysd["headline"].get(name)
    if entry is None:
        raise ValueError(f"{name!r} is not recorded for {system_id}")
    src = load_systems()["sources"][entry["source"]]
    return f"{src['title']} ({src['url']}, {src['date']})"


def _gpu(gpu_id: str):
    scaling.check_gpu(gpu_id)
    from common.facts import hardware
    return hardware.gpu(gpu_id)


# ---------------------------------------------------------------- rack arithmetic

def aggregate_nvlink_tbs(gpus, per_gpu_gbs) -> float:
    """Sum of the per-GPU NVLink figures (GB/s, bidirectional as NVIDIA quotes them) in TB/s."""
    return scaling._positive("gpus", gpus) * scaling._positive("per_gpu_gbs", per_gpu_gbs) / 1e3


def rack_pflops(gpus, per_gpu_tflops) -> float:
    """`gpus` x a per-GPU rate in TFLOP/s, in PFLOP/s."""
    return scaling._positive("gpus", gpus) * scaling._positive("per_gpu_tflops", per_gpu_tflops) / 1e3


@dataclass
class SystemFigures:
    """A rack's or node's headline figures, derived from per-GPU facts x counts."""
    system_id: str
    name: str
    gpu_id: str
    gpus: int
    cpus: int
    nvlink_domain: int
    nvlink_per_gpu_gbs: float        # bidirectional, as quoted
    nvlink_aggregate_tbs: float
    network_per_gpu_gbs: float       # per direction
    hbm_tb: float
    cpu_memory_tb: float
    pflops: dict = field(default_factory=dict)   # {(dtype, "dense"|"sparse"): PFLOP/s}
    gpu_power_kw: float = 0.0

    @property
    def fast_memory_tb(self) -> float:
        return self.hbm_tb + self.cpu_memory_tb

    @property
    def scale_up_vs_out(self) -> float:
        """Per-GPU bandwidth inside the NVLink domain / leaving it (both per direction)."""
        return (self.nvlink_per_gpu_gbs / 2) / self.network_per_gpu_gbs


def network_per_gpu_gbs(system_id: str) -> float:
    """Per-GPU scale-out bandwidth per direction in GB/s (links x Gb/s / 8)."""
    return fact(system_id, "network_links_per_gpu") * fact(system_id, "network_gbit_per_link") / 8


def system_figures(system_id: str) -> SystemFigures:
    sysd = check_system(system_id)
    gpu_id = sysd["gpu_id"]
    g = _gpu(gpu_id)
    gpus = int(fact(system_id, "gpus"))
    cpus = int(fact(system_id, "grace_cpus", 0))
    pflops = {}
    for dtype in DTYPES:
        for sparse in (False, True):
            try:
                per_gpu = scaling.peak_tflops(gpu_id, dtype, sparse=sparse)
            except ValueError:
                continue  # e.g. no FP4 on Hopper
            pflops[(dtype, "sparse" if sparse else "dense")] = rack_pflops(gpus, per_gpu)
    lp = fact(system_id, "lpddr5x_gb_per_cpu", 0)
    return SystemFigures(system_id=system_id, name=sysd["name"], gpu_id=gpu_id, gpus=gpus, cpus=cpus,
                         nvlink_domain=int(fact(system_id, "nvlink_domain_gpus")),
                         nvlink_per_gpu_gbs=float(g.nvlink_gbs),
                         nvlink_aggregate_tbs=aggregate_nvlink_tbs(gpus, g.nvlink_gbs),
                         network_per_gpu_gbs=network_per_gpu_gbs(system_id),
                         hbm_tb=gpus * float(g.hbm_gb) / 1e3, cpu_memory_tb=cpus * lp / 1e3,
                         pflops=pflops, gpu_power_kw=gpus * float(g.tdp_w) / 1e3)


# ---------------------------------------------------------------- fabrics and collectives

@dataclass(frozen=True)
class Fabric:
    """Per-GPU bandwidths (GB/s per direction) inside the NVLink domain and across the network."""
    name: str
    domain_gpus: int
    nvlink_gbs: float
    network_gbs: float


def fabric(system_id: str, measured: bool = False) -> Fabric:
    """The fabric of a system from datasheets, or (`measured=True`, where recorded) from achieved bandwidths."""
    f = system_figures(system_id)
    nv, net = f.nvlink_per_gpu_gbs / 2, f.network_per_gpu_gbs
    if measured:
        nv = fact(system_id, "measured_nvlink_gbs", nv)
        net = fact(system_id, "measured_ib_gbs", net)
    return Fabric(system_id + (" (measured)" if measured else ""), f.nvlink_domain, float(nv), float(net))


def _check_group(group) -> int:
    if not isinstance(group, (int,)) or isinstance(group, bool) or group < 1:
        raise ValueError(f"group size {group!r} is not allowed; allowed: an integer >= 1")
    return group


def _members_in_domain(group: int, stride: int, domain: int) -> int:
    """How many ranks of a group (consecutive members `stride` ranks apart) share each member's NVLink domain."""
    return max(1, min(group, domain // max(stride, 1)))


def all_to_all_seconds(bytes_per_gpu, group: int, fab: Fabric, stride: int = 1) -> float:
    """All-to-all where each GPU spreads `bytes_per_gpu` evenly over `group` ranks (itself included).

    Peers inside the GPU's NVLink domain are reached over NVLink, the rest over the network; both links work at once,
    so the time is the slower of the two shares.
    """
    g = _check_group(group)
    b = scaling._positive("bytes_per_gpu", bytes_per_gpu)
    inside = _members_in_domain(g, stride, fab.domain_gpus)
    over_nvlink = b * (inside - 1) / g
    over_network = b * (g - inside) / g
    return max(over_nvlink / (fab.nvlink_gbs * 1e9), over_network / (fab.network_gbs * 1e9))


def ep_network_copies(top_k: int, group: int, fab: Fabric, stride: int = 1, max_nodes_per_token=None,
                      dedup: bool = True, num_experts=None) -> float:
    """Expected copies of a token's hidden vector that cross the network in an EP dispatch (experts spread evenly,
    routing uniform).

    - `dedup=False` (one copy per remote expert): top_k x (g - inside) / g, whatever the node limit -- limiting a
      token to M nodes does not reduce the number of its experts outside the sender's node;
    - `dedup=True` (one copy per remote domain, forwarded to the experts there over NVLink, DeepSeek's way): the
      expected number of distinct remote domains. With node-limited routing (at most M domains, each as likely)
      that is M x (domains - 1) / domains; without it (or with a limit above it), the distinct domains that k
      experts drawn from `num_experts` reach (common.moe.moe.expected_distinct_nodes) x (domains - 1) / domains.
    """
    g = _check_group(group)
    inside = _members_in_domain(g, stride, fab.domain_gpus)
    per_expert = top_k * (g - inside) / g
    if not dedup or inside == g:
        return per_expert
    domains = g / inside
    copies = per_expert
    if max_nodes_per_token:
        copies = min(copies, max_nodes_per_token * (domains - 1) / domains)
    elif not num_experts:
        raise ValueError("num_experts=None: without a node limit, de-duplicated copies depend on how many experts "
                         "the top_k are drawn from; pass num_experts (e.g. 256 for DeepSeek-V3)")
    if num_experts:  # a limit above the nodes a token reaches anyway does not bind
        from common.moe import moe
        copies = min(copies, moe.expected_distinct_nodes(int(num_experts), top_k, int(domains)) * (domains - 1) /
                     domains)
    return copies


def ep_nvlink_copies(top_k: int, group: int, fab: Fabric, stride: int = 1, dedup: bool = True) -> float:
    """Expected copies of a token's hidden vector that move over NVLink in an EP dispatch: one per expert on another
    GPU of the sender's domain, plus (with `dedup`) the forwarding inside each remote domain, from the GPU the copy
    lands on to the GPUs of the experts there (all but the 1 / inside that sit on the landing GPU itself)."""
    g = _check_group(group)
    inside = _members_in_domain(g, stride, fab.domain_gpus)
    local = top_k * (inside - 1) / g
    if not dedup:
        return local
    return local + top_k * (g - inside) / g * (inside - 1) / inside


def ep_all_to_all_seconds(tokens, bytes_per_copy, top_k: int, group: int, fab: Fabric, stride: int = 1,
                          max_nodes_per_token=None, dedup: bool = True, num_experts=None) -> dict:
    """One EP all-to-all of `tokens` tokens per GPU, `bytes_per_copy` per token and destination: seconds over the
    network and over NVLink (both links work at once, the slower sets the time), and the copies per token."""
    tok = scaling._positive("tokens", tokens)
    b = scaling._positive("bytes_per_copy", bytes_per_copy)
    net = ep_network_copies(top_k, group, fab, stride, max_nodes_per_token, dedup, num_experts)
    nv = ep_nvlink_copies(top_k, group, fab, stride, dedup)
    t_net, t_nv = tok * b * net / (fab.network_gbs * 1e9), tok * b * nv / (fab.nvlink_gbs * 1e9)
    return {"network_copies": net, "nvlink_copies": nv, "network_s": t_net, "nvlink_s": t_nv,
            "seconds": max(t_net, t_nv)}


def all_reduce_seconds(nbytes, group: int, fab: Fabric, stride: int = 1) -> float:
    """Ring all-reduce of `nbytes` over `group` ranks spaced `stride` apart: 2 (g-1)/g x bytes / bandwidth.

    The ring runs at the speed of its slowest hop: NVLink when the whole group sits in one domain, else the network.
    """
    g = _check_group(group)
    if g == 1:
        return 0.0
    b = scaling._positive("nbytes", nbytes)
    span = (g - 1) * stride + 1
    bw = fab.nvlink_gbs if span <= fab.domain_gpus else fab.network_gbs
    return 2 * (g - 1) / g * b / (bw * 1e9)


# ---------------------------------------------------------------- parallelism layouts

@dataclass(frozen=True)
class Layout:
    """Parallelism degrees; GPUs = tp x pp x dp, and expert parallelism is carved out of data parallelism (ep | dp)."""
    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    zero1: bool = True  # optimizer state sharded over each parameter's data-parallel replicas

    def __post_init__(self):
        for name in ("tp", "pp", "dp", "ep"):
            whole(name, getattr(self, name), meaning="a parallel degree")
        if self.dp % self.ep:
            raise ValueError(f"ep={self.ep} does not divide dp={self.dp}; expert parallelism groups are carved out "
                             f"of the data-parallel ranks, so ep must divide dp")

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    def __str__(self) -> str:
        return f"TP{self.tp} x PP{self.pp} x DP{self.dp} (EP{self.ep}{', ZeRO-1' if self.zero1 else ''})"


@dataclass(frozen=True)
class ModelSketch:
    """What the layout math needs to know about a model (a dense model has expert_params = 0)."""
    name: str
    dense_params: float      # parameters every GPU of a TP x PP slice holds (attention, shared experts, embeddings)
    expert_params: float     # routed-expert parameters, sharded by EP
    layers: int
    moe_layers: int
    hidden: int
    top_k: int = 0
    active_params: float = 0.0
    experts: int = 0         # routed experts per MoE layer

    @property
    def total_params(self) -> float:
        return self.dense_params + self.expert_params


def dense_sketch(name: str, params: float, layers: int, hidden: int) -> ModelSketch:
    return ModelSketch(name, float(params), 0.0, int(layers), 0, int(hidden), 0, float(params))


def model_sketch(model_name: str) -> ModelSketch:
    """A ModelSketch of a model in data/models/ (common.facts.models): routed experts apart from everything else."""
    from common.facts import models
    cfg = models.load_model_config(model_name)
    counts = models.count_params(cfg)
    experts = float(counts["breakdown"]["routed_experts"]["total"])
    return ModelSketch(cfg.name, float(counts["total"]) - experts, experts, int(cfg["num_hidden_layers"]),
                       int(cfg.moe_layers), int(cfg["hidden_size"]), int(cfg["num_experts_per_tok"]),
                       float(counts["active_compute"]), int(cfg["n_routed_experts"]))


def memory_per_gpu_gb(model: ModelSketch, layout: Layout, weight_bytes: float = 2, grad_bytes: float = 2,
                      optimizer_bytes: float = 12) -> dict:
    """GB per GPU of weights, gradients and optimizer state (activations and KV cache not included).

    Dense parameters are split by TP x PP and replicated over DP; routed experts are split by TP x PP x EP and
    replicated over DP / EP. ZeRO-1 shards each parameter's optimizer state over its replicas.
    """
    dense = model.dense_params / (layout.tp * layout.pp)
    experts = model.expert_params / (layout.tp * layout.pp * layout.ep)
    params = dense + experts
    dense_replicas = layout.dp if layout.zero1 else 1
    expert_replicas = layout.dp // layout.ep if layout.zero1 else 1
    opt = optimizer_bytes * (dense / dense_replicas + experts / expert_replicas)
    out = {"params_per_gpu_b": params / 1e9, "weights": params * weight_bytes / 1e9,
           "grads": params * grad_bytes / 1e9, "optimizer": opt / 1e9}
    out["total"] = out["weights"] + out["grads"] + out["optimizer"]
    return out


def step_communication(model: ModelSketch, layout: Layout, fab: Fabric, tokens_per_step: float,
                       dispatch_bytes: float = 1, combine_bytes: float = 2, act_bytes: float = 2,
                       grad_bytes: float = 2, max_nodes_per_token=None, dedup: bool = True) -> dict:
    """Seconds per optimizer step that each GPU spends in each kind of communication (nothing overlapped).

    - EP all-to-all: per MoE layer, forward and backward, each token sends top_k copies of its hidden vector out
      (dispatch, `dispatch_bytes` per value) and gets them back (combine); `max_nodes_per_token` applies
      DeepSeek's node-limited routing and `dedup` one copy per remote node (see ep_network_copies).
    - TP all-reduce: per layer 2 in the forward + 2 in the backward, of tokens x hidden activations.
    - PP: each stage boundary sends activations forward and gradients back.
    - DP: one gradient reduction per step (reduce-scatter + all-gather under ZeRO-1, same volume as an all-reduce).
    """
    tokens = scaling._positive("tokens_per_step", tokens_per_step) / layout.dp   # tokens through each GPU's stage
    layers = model.layers / layout.pp
    moe_layers = model.moe_layers / layout.pp
    out = {"ep_all_to_all": 0.0, "tp_all_reduce": 0.0, "pp_send": 0.0, "dp_grad_sync": 0.0}
    if layout.ep > 1 and model.moe_layers:
        # forward + backward, each a dispatch and a combine of the tokens this EP rank holds (TP ranks split them)
        per_token = 2 * model.hidden * (dispatch_bytes + combine_bytes)
        a2a = ep_all_to_all_seconds(tokens / layout.tp, per_token, model.top_k, layout.ep, fab, layout.tp,
                                    max_nodes_per_token, dedup, model.experts or None)
        out["ep_all_to_all"] = moe_layers * a2a["seconds"]
    if layout.tp > 1:
        out["tp_all_reduce"] = layers * 4 * all_reduce_seconds(tokens * model.hidden * act_bytes, layout.tp, fab)
    if layout.pp > 1:
        bw = fab.nvlink_gbs if layout.tp * layout.dp < fab.domain_gpus else fab.network_gbs
        out["pp_send"] = 2 * tokens * model.hidden * act_bytes / layout.tp / (bw * 1e9)
    dense = model.dense_params / (layout.tp * layout.pp)
    experts = model.expert_params / (layout.tp * layout.pp * layout.ep)
    if layout.dp > 1:
        out["dp_grad_sync"] += all_reduce_seconds(dense * grad_bytes, layout.dp, fab, stride=layout.tp)
    if layout.dp // layout.ep > 1 and experts:
        out["dp_grad_sync"] += all_reduce_seconds(experts * grad_bytes, layout.dp // layout.ep, fab,
                                                  stride=layout.tp * layout.ep)
    out["total"] = sum(out.values())
    return out


def compute_seconds(active_params, tokens_per_step, gpus, peak_tflops_dense, mfu) -> float:
    """Per-step compute time: 6 x active params x tokens / (GPUs x peak x MFU)."""
    flops = scaling.train_flops(active_params, tokens_per_step)
    return flops / (scaling._positive("gpus", gpus) * scaling._positive("peak_tflops_dense", peak_tflops_dense) *
                    1e12 * scaling.check_mfu(mfu))


# ---------------------------------------------------------------- pictures

def draw_topology(system_id: str, ax=None, width_per_100gbs: float = 1.2):
    """Draw GPUs (bottom), NVLink switches (middle) and the scale-out network (top).

    Each GPU's thick blue stub (its NVLink bandwidth) and thin red line (its network port) have widths proportional
    to per-GPU bandwidth per direction (`width_per_100gbs` points per 100 GB/s), on the same scale for every system;
    the fan of thin lines shows that every GPU reaches every switch.
    """
    import matplotlib.pyplot as plt
    from matplotlib.collections import LineCollection

    from common.core import plots
    plots.use_house_style()
    f = system_figures(system_id)
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.2))
    n = min(f.gpus, 72)
    switches = fact(system_id, "nvlink_switch_chips", 0)
    known_switches = bool(switches)
    switches = int(switches) or 1
    xs = [(i + 0.5) / n for i in range(n)]
    sx = [(i + 0.5) / switches for i in range(switches)]
    nv_w = f.nvlink_per_gpu_gbs / 2 / 100 * width_per_100gbs
    net_w = f.network_per_gpu_gbs / 100 * width_per_100gbs
    fan = [[(x, 0.3), (s, 0.5)] for x in xs for s in sx]
    ax.add_collection(LineCollection(fan, colors=plots.PALETTE[0], linewidths=0.4, alpha=0.25 if n > 8 else 0.6))
    ax.add_collection(LineCollection([[(x, 0.1), (x, 0.3)] for x in xs], colors=plots.PALETTE[0], linewidths=nv_w))
    ax.add_collection(LineCollection([[(x, 0.1), (x, 0.9)] for x in xs], colors=plots.PALETTE[1], linewidths=net_w,
                                     alpha=0.8))
    ax.scatter(xs, [0.1] * n, marker="s", s=900 / n if n > 8 else 250, color=plots.PALETTE[2], zorder=3)
    ax.scatter(sx, [0.5] * switches, marker="D", s=60 if switches > 4 else 120, color=plots.PALETTE[0], zorder=3)
    ax.text(0.5, -0.02, f"{f.gpus} x {f.gpu_id} GPUs", ha="center", va="top", fontsize=9)
    sw = f"{switches} NVSwitch chips" if known_switches else "NVSwitch (chip count not recorded)"
    ax.axhline(0.9, color=plots.PALETTE[1], lw=3)
    ax.text(0.5, 0.95, f"InfiniBand / Ethernet: {f.network_per_gpu_gbs:.0f} GB/s per GPU per direction",
            ha="center", va="bottom", fontsize=9)
    ax.text(0.5, 0.62, f"NVLink: {f.nvlink_per_gpu_gbs / 2:.0f} GB/s per GPU per direction "
                       f"(domain {f.nvlink_domain} GPUs; {sw})", ha="center", va="bottom", fontsize=9)
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.12, 1.1)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)
    ax.set_title(f"{f.name}: NVLink / network = {f.scale_up_vs_out:.0f}x per GPU")
    return ax
