"""DeepSeek-V3's pre-training run, predicted (lab 13): GPU-hours per trillion tokens from the real config, the
published per-kernel rates and lab 08's DualPipe simulator, with no constant fitted to a measured step or to the
reported 180K.

Two models live here:
- `predict_flop_rate(x)`: the first estimate -- every GEMM FLOP at one stated efficiency of the dense peak
  (DeepGEMM's headline 1,350 TFLOP/s), the attention core at FlashAttention-3's 75% of BF16, nothing else counted.
  An upper bound on the speed (lab 09 uses its chunk, `chunk(x)`, as the compute term);
- `predict(x)`: the kernel-level model -- each block's kernels timed from their shapes (common.systems.v3.kernels:
  DeepGEMM's per-shape tables, FlashAttention-3's figures, memory-bound kernels at the HBM bandwidth, DeepEP's
  all-to-all on the SMs it holds), composed into F&B pairs as DeepSeek's trace runs them (common.systems.v3.step),
  stages split as evenly as contiguous layers allow, the DualPipe / 1F1B schedule simulated
  (common.parallel.pipeline), plus the PP sends, the ZeRO-1 gradient sync and optimizer step, and the batch ramp.
The run's facts come from data/deepseek_v3_run.json (each with its source).

Units: seconds, FLOPs, bytes; GB = 1e9 bytes. One *chunk* = one micro-batch through one pipeline stage; F, B, W as in
common.parallel.pipeline (W: the weight-gradient GEMMs, B: input + weight gradients).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from statistics import NormalDist

from common.facts import hardware
from common.kernels import roofline
from common.moe import moe
from common.parallel import pipeline
from common.systems.cluster import scaling, topology
from common.systems.v3 import kernels as v3kernels, step as v3step
from common.systems.v3.facts import RUN_PATH, config, fact, load_run, source  # noqa: F401  (re-exported)
from common.systems.v3.memory import (activation_bytes_per_token_layer, dp_sync_seconds, memory_gb,  # noqa: F401
                                     optimizer_seconds, param_layout, sketch)

PRECISIONS = ("fp8", "bf16")


# ---------------------------------------------------------------- inputs

@dataclass(frozen=True)
class Inputs:
    """Everything the model needs; `defaults()` fills it from data/ (no free constant)."""
    gpu_id: str
    gpus: int
    pp: int
    ep: int
    tp: int
    schedule: str                # "dualpipe" or "1f1b"
    fp8_efficiency: float        # achieved / dense FP8 peak of the FP8 GEMMs
    bf16_efficiency: float       # achieved / dense BF16 peak of the BF16 work (attention core, router, head)
    ib_gbs: float                # per GPU per direction
    nvlink_gbs: float            # per GPU per direction
    domain_gpus: int             # GPUs per NVLink domain (node)
    comm_sms: int
    sms: int
    batch_sequences: int
    sequence_length: int
    micro_batch_tokens: int      # tokens of one micro-batch per GPU (a TP group of tp GPUs shares tp x as many)
    max_nodes: int | None        # node-limited routing: at most this many nodes per token (None: no limit)
    dedup: bool = True           # one IB copy per destination node, forwarded over NVLink
    gemm_scale: float = 1.0      # kernel model: x every published GEMM rate (1/1.2: the kernels DeepGEMM beat)
    hbm_efficiency: float = 1.0  # kernel model: share of the datasheet HBM bandwidth memory-bound kernels reach
    rows_factor: float | None = None   # kernel model: busiest EP rank's routed rows / mean (None: sampling floor)
    judgement: tuple = ()        # kernel model: judgement calls, (v3kernels.Setup field, value) pairs

    @property
    def dp(self) -> int:
        return self.gpus // (self.pp * self.tp)

    @property
    def tokens_per_step(self) -> int:
        return self.batch_sequences * self.sequence_length

    @property
    def micro_batches(self) -> int:
        """Micro-batches per pipeline per step (both DualPipe directions together)."""
        return self.tokens_per_step // (self.dp * self.micro_batch_tokens * self.tp)

    @property
    def sm_share(self) -> float:
        """Share of the SMs left to computation while the all-to-all kernels run."""
        return (self.sms - self.comm_sms) / self.sms


def defaults() -> Inputs:
    """DeepSeek-V3's run as reported: H800, PP16 x EP64, no TP, DualPipe, DeepGEMM's FP8 rate, 20 SMs, IB 50 GB/s."""
    gpu = fact("gpu_id")
    return Inputs(gpu_id=gpu, gpus=fact("gpus"), pp=fact("pipeline_parallel"), ep=fact("expert_parallel"),
                  tp=fact("tensor_parallel"), schedule=fact("schedule"),
                  fp8_efficiency=fact("deepgemm_fp8_tflops") / hardware.peak_tflops(gpu, "fp8"),
                  bf16_efficiency=fact("fa3_bf16_utilization"), ib_gbs=fact("ib_gbs"), nvlink_gbs=fact("nvlink_gbs"),
                  domain_gpus=fact("gpus_per_node"), comm_sms=fact("comm_sms"), sms=hardware.gpu(gpu).sms,
                  batch_sequences=fact("batch_sequences"), sequence_length=fact("sequence_length"),
                  micro_batch_tokens=fact("micro_batch_tokens"), max_nodes=fact("max_nodes_per_token"))


def check_inputs(x: Inputs) -> Inputs:
    for name in ("fp8_efficiency", "bf16_efficiency"):
        v = getattr(x, name)
        if not 0 < v <= 1:
            raise ValueError(f"{name}={v!r} is not allowed; an efficiency is a fraction of the peak in (0, 1]")
    if not 0 <= x.comm_sms < x.sms:
        raise ValueError(f"comm_sms={x.comm_sms!r} is not allowed; allowed: 0 <= comm_sms < sms={x.sms}")
    if x.schedule not in ("dualpipe", "1f1b"):
        raise ValueError(f"schedule={x.schedule!r} is not allowed; allowed: 'dualpipe', '1f1b'")
    if x.gpus % (x.pp * x.tp) or x.dp % x.ep:
        raise ValueError(f"gpus={x.gpus} is not tp x pp x dp with ep | dp (tp={x.tp}, pp={x.pp}, ep={x.ep})")
    for name in ("gemm_scale", "hbm_efficiency"):
        v = getattr(x, name)
        if not 0 < v <= 2:
            raise ValueError(f"{name}={v!r} is not allowed; allowed: a factor in (0, 2]")
    if x.rows_factor is not None and not x.rows_factor >= 1:
        raise ValueError(f"rows_factor={x.rows_factor!r} is not allowed; allowed: >= 1 (the busiest rank over the "
                         f"mean) or None")
    if x.tokens_per_step % (x.dp * x.micro_batch_tokens * x.tp):
        raise ValueError(f"micro_batch_tokens={x.micro_batch_tokens} does not divide the {x.tokens_per_step} tokens "
                         f"per step over dp={x.dp}")
    return x


# ---------------------------------------------------------------- compute

def forward_flops_per_token(cfg=None, seq: int | None = None) -> list:
    """Forward FLOPs of one token through the whole model (main model + one MTP module), by component:
    [(name, precision, flops)]. Linear layers as GEMMs of the config's shapes; the attention core causal
    (half of the s x s scores); embedding look-ups cost no FLOPs."""
    cfg = cfg or config()
    s = seq or fact("sequence_length")
    h, nh, L = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    qr, kvr, nope, rope, vd = (cfg["q_lora_rank"], cfg["kv_lora_rank"], cfg["qk_nope_head_dim"],
                               cfg["qk_rope_head_dim"], cfg["v_head_dim"])
    moe_l, dense_l, mtp = cfg.moe_layers, cfg.dense_layers, cfg["num_nextn_predict_layers"]
    g = lambda n, k: roofline.gemm_cost(1, n, k).flops  # noqa: E731  one token through an n x k weight

    def ffn(inter):
        return 2 * g(inter, h) + g(h, inter)  # gate, up, down

    up = g(nh * (nope + rope), qr) + g(nh * (nope + vd), kvr)   # MLA up-projections (recomputed in backward)
    down = g(qr, h) + g(kvr + rope, h) + g(h, nh * vd)            # q_a, kv_a, output projection
    core = nh * (roofline.gemm_cost(s, s, nope + rope).flops + roofline.gemm_cost(s, vd, s).flops) / 2 / s
    layers, moe_layers = L + mtp, moe_l + mtp                      # the MTP module adds one MoE layer
    return [
        ("MLA projections", "fp8", layers * (up + down)),
        ("attention core (causal)", "bf16", layers * core),
        ("dense FFN (first layers)", "fp8", dense_l * ffn(cfg["intermediate_size"])),
        ("shared expert", "fp8", moe_layers * cfg["n_shared_experts"] * ffn(cfg["moe_intermediate_size"])),
        ("8 routed experts", "fp8", moe_layers * cfg["num_experts_per_tok"] * ffn(cfg["moe_intermediate_size"])),
        ("router", "bf16", moe_layers * g(cfg["n_routed_experts"], h)),
        ("MTP projection", "fp8", mtp * g(h, 2 * h)),
        ("output head (main + MTP)", "bf16", (1 + mtp) * g(cfg["vocab_size"], h)),
    ]


def recompute_flops_per_token(cfg=None) -> float:
    """The MLA up-projections DeepSeek recomputes in the backward instead of storing their outputs."""
    cfg = cfg or config()
    nh, qr, kvr = cfg["num_attention_heads"], cfg["q_lora_rank"], cfg["kv_lora_rank"]
    g = lambda n, k: roofline.gemm_cost(1, n, k).flops  # noqa: E731
    up = g(nh * (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]), qr) + g(nh * (cfg["qk_nope_head_dim"] +
                                                                                   cfg["v_head_dim"]), kvr)
    return (cfg["num_hidden_layers"] + cfg["num_nextn_predict_layers"]) * up


def training_flops_per_token(cfg=None, seq: int | None = None) -> float:
    """Model FLOPs per token for forward + backward (3 x forward; recomputation not counted, as MFU counts)."""
    return 3 * sum(f for _, _, f in forward_flops_per_token(cfg, seq))


def chunk_flops(tokens: int, pp: int, cfg=None, seq: int | None = None) -> dict:
    """FLOPs of one chunk (tokens through 1/pp of the model) by pass and precision:
    {"F": {fp8, bf16}, "B": {...}, "W": {...}}. B = input + weight gradients (2 x forward for the GEMMs, 2 x for the
    attention core) + the recomputed up-projections; W = the weight-gradient GEMMs (1 x forward, no attention core)."""
    comps = forward_flops_per_token(cfg, seq)
    f = {p: sum(fl for _, q, fl in comps if q == p) * tokens / pp for p in PRECISIONS}
    core = sum(fl for n, _, fl in comps if n.startswith("attention core")) * tokens / pp
    rec = recompute_flops_per_token(cfg) * tokens / pp
    b = {"fp8": 2 * f["fp8"] + rec, "bf16": 2 * f["bf16"]}
    w = {"fp8": f["fp8"], "bf16": f["bf16"] - core}
    return {"F": f, "B": b, "W": w}


def compute_seconds(flops: dict, x: Inputs, sm_share: float = 1.0) -> float:
    """Time of {precision: FLOPs} at each precision's dense peak x efficiency x the share of SMs computing."""
    rate = {"fp8": hardware.peak_tflops(x.gpu_id, "fp8") * x.fp8_efficiency,
            "bf16": hardware.peak_tflops(x.gpu_id, "bf16") * x.bf16_efficiency}
    return sum(flops[p] / (rate[p] * 1e12 * sm_share) for p in PRECISIONS)


# ---------------------------------------------------------------- communication

def fabric(x: Inputs) -> topology.Fabric:
    return topology.Fabric("model", x.domain_gpus, x.nvlink_gbs, x.ib_gbs)


def chunk_all_to_all(x: Inputs, cfg=None) -> dict:
    """EP dispatch + combine of one chunk, forward (the backward moves the same bytes): per MoE layer of the stage,
    FP8 dispatch (with its scales) + BF16 combine (common.moe.moe.token_traffic_bytes) of the micro-batch's tokens."""
    cfg = cfg or config()
    if x.ep == 1:
        return {"seconds": 0.0, "per_layer_s": 0.0, "network_copies": 0.0, "nvlink_copies": 0.0, "moe_layers": 0.0}
    per_copy = moe.token_traffic_bytes(cfg["hidden_size"], 1)["total"]
    a2a = topology.ep_all_to_all_seconds(x.micro_batch_tokens, per_copy, cfg["num_experts_per_tok"], x.ep,
                                         fabric(x), x.tp, x.max_nodes, x.dedup, cfg["n_routed_experts"])
    layers = (cfg.moe_layers + cfg["num_nextn_predict_layers"]) / x.pp
    return {**a2a, "per_layer_s": a2a["seconds"], "seconds": layers * a2a["seconds"], "moe_layers": layers}


def chunk_tp_all_reduce(x: Inputs, cfg=None) -> float:
    """TP: 2 all-reduces of the micro-batch's BF16 activations per layer per pass (forward), on the critical path."""
    cfg = cfg or config()
    if x.tp == 1:
        return 0.0
    layers = (cfg["num_hidden_layers"] + cfg["num_nextn_predict_layers"]) / x.pp
    nbytes = x.micro_batch_tokens * x.tp * cfg["hidden_size"] * 2
    return layers * 2 * topology.all_reduce_seconds(nbytes, x.tp, fabric(x))


def exposed(comm_s: float, overlap_compute_s: float) -> float:
    """Communication left on the critical path when it runs beside `overlap_compute_s` of independent compute."""
    return max(0.0, comm_s - overlap_compute_s)


@dataclass(frozen=True)
class Chunk:
    F: float          # seconds of compute of each pass (SM tax included where the schedule overlaps)
    B: float
    W: float
    comm_F: float     # all-to-all seconds of each pass
    comm_B: float
    tp_F: float       # TP all-reduce seconds (never hidden)
    tp_B: float
    pp_send: float    # activations to the next stage

    def durations(self, schedule: str) -> pipeline.Durations:
        """pipeline.Durations: a lone F or B waits for its own all-to-all; an F&B pair hides each chunk's
        all-to-all behind the other's compute (DualPipe), leaving only what exceeds it."""
        F = self.F + self.comm_F + self.tp_F
        B = self.B + self.comm_B + self.tp_B
        if schedule == "1f1b":
            return pipeline.Durations(F=F, B=B, W=self.W, comm=self.pp_send)
        fb = self.F + self.B + self.tp_F + self.tp_B + exposed(self.comm_F + self.comm_B, self.F + self.B)
        return pipeline.Durations(F=F, B=B, W=self.W, FB=fb, comm=self.pp_send)


def chunk(x: Inputs, cfg=None) -> Chunk:
    cfg = cfg or config()
    fl = chunk_flops(x.micro_batch_tokens * x.tp, x.pp, cfg, x.sequence_length)
    share = x.sm_share if x.schedule == "dualpipe" else 1.0
    t = {k: compute_seconds(v, x, share) / x.tp for k, v in fl.items()}
    a2a = chunk_all_to_all(x, cfg)["seconds"]
    tp = chunk_tp_all_reduce(x, cfg)
    send = x.micro_batch_tokens * cfg["hidden_size"] * 2 / (x.ib_gbs * 1e9)   # stages sit on different nodes
    return Chunk(t["F"], t["B"], t["W"], a2a, a2a, tp, tp, send)


# ---------------------------------------------------------------- the prediction

def gpu_hours_per_t_tokens(step_seconds, gpus, tokens_per_step) -> float:
    """GPU-hours per trillion tokens: step time x GPUs / 3600, times the steps one trillion tokens takes."""
    return scaling._positive("step_seconds", step_seconds) * scaling._positive("gpus", gpus) / \
        scaling.SECONDS_PER_HOUR * 1e12 / scaling._positive("tokens_per_step", tokens_per_step)


@dataclass
class Prediction:
    inputs: Inputs
    chunk: Chunk
    result: pipeline.Result
    dp_sync_s: float
    dp_exposed_s: float
    step_s: float
    gpu_hours_per_t: float
    mfu_fp8: float
    breakdown: dict          # seconds per step by cause, summing to step_s
    memory: dict

    @property
    def vs_reported(self) -> float:
        return self.gpu_hours_per_t / fact("gpu_hours_per_t_tokens")


def predict_flop_rate(x: Inputs | None = None, **changes) -> Prediction:
    """The first estimate: one step with every GEMM FLOP at `fp8_efficiency` / `bf16_efficiency` of the peak."""
    x = check_inputs(replace(x or defaults(), **changes))
    ch = chunk(x)
    dur = ch.durations(x.schedule)
    res = pipeline.run(x.schedule, x.pp, x.micro_batches, dur)
    # ZeRO-1's gradient traffic can use the idle tail of each rank (after its last operation)
    tails = [res.makespan - max(end for _, end, _, _ in spans) for spans in res.spans]
    dp = dp_sync_seconds(x)
    dp_exposed = max(exposed(dp, tail) for tail in tails)
    step = res.makespan + dp_exposed
    # per rank: micro_batches forward and backward chunks (DualPipe: half on each of its two stages); what the
    # busy time holds beyond their compute is exposed communication, the rest of the makespan is bubble
    busy = sum(res.busy) / len(res.busy)
    compute = x.micro_batches * (ch.F + ch.B)
    share = x.sm_share if x.schedule == "dualpipe" else 1.0
    tokens = x.tokens_per_step
    flops = training_flops_per_token(seq=x.sequence_length) * tokens
    mfu = flops / (x.gpus * step * hardware.peak_tflops(x.gpu_id, "fp8") * 1e12)
    breakdown = {"compute (all SMs)": compute * share, "SM share for communication": compute * (1 - share),
                 "exposed communication": busy - compute, "pipeline bubble": res.makespan - busy,
                 "exposed DP sync": dp_exposed}
    return Prediction(x, ch, res, dp, dp_exposed, step, gpu_hours_per_t_tokens(step, x.gpus, tokens), mfu, breakdown,
                      memory_gb(x))


# ---------------------------------------------------------------- the kernel-level model

def ep_imbalance_floor(cfg=None, tokens: int | None = None, ep: int | None = None) -> float:
    """The busiest EP rank's routed rows over the mean when every expert is equally likely -- what DeepSeek's
    balancing aims at, so a floor: sampling alone. Each of the ep x tokens tokens puts a hypergeometric number of
    its top_k experts on a rank holding experts / ep of them; the busiest of ep ranks sits about z standard
    deviations above the mean (z: the expected maximum of ep standard normals, Blom's approximation)."""
    cfg = cfg or config()
    tokens, ep = tokens or fact("micro_batch_tokens"), ep or fact("expert_parallel")
    if ep == 1:
        return 1.0
    E, k = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    p = (E // ep) / E
    var = k * p * (1 - p) * (E - k) / (E - 1)
    n = ep * tokens
    z = NormalDist().inv_cdf((ep - 0.375) / (ep + 0.25))
    return 1 + z * math.sqrt(n * var) / (n * k * p)


def setup(x: Inputs, rows_factor: float | None = None) -> v3kernels.Setup:
    """The kernel model's view of the run: one GPU's micro-batch, the SMs DeepEP takes, the links."""
    rf = rows_factor if rows_factor is not None else (x.rows_factor or ep_imbalance_floor(tokens=x.micro_batch_tokens,
                                                                                          ep=x.ep))
    return replace(v3kernels.Setup(tokens=x.micro_batch_tokens, seq=x.sequence_length, ep=x.ep, tp=x.tp,
                                   gpu_id=x.gpu_id, comm_sms=x.comm_sms, overlap=x.schedule == "dualpipe",
                                   rows_factor=rf, gemm_scale=x.gemm_scale, hbm_efficiency=x.hbm_efficiency,
                                   dispatch_gbs=x.ib_gbs, combine_gbs=x.ib_gbs, nvlink_gbs=x.nvlink_gbs,
                                   domain_gpus=x.domain_gpus, max_nodes=x.max_nodes, dedup=x.dedup),
                   **dict(x.judgement))


def pp_send_seconds(x: Inputs) -> float:
    """One micro-batch's activations (BF16) to the next stage, over IB (the stages sit on different nodes)."""
    return x.micro_batch_tokens * x.tp * config()["hidden_size"] * 2 / x.tp / (x.ib_gbs * 1e9)


def kernel_chunks(x: Inputs, rows_factor: float | None = None) -> dict:
    """Blocks, stage plan, per-rank (F, B, W, F&B) seconds and the simulator's durations (the heaviest rank's)."""
    cfg = config()
    blk = v3step.blocks(cfg, setup(x, rows_factor))
    plan = v3step.stage_plan(cfg, x.pp, blk, x.schedule)
    ranks = v3step.rank_pairs(plan, blk, x.schedule)
    return {"blocks": blk, "plan": plan, "ranks": ranks, "durations": v3step.durations(ranks, pp_send_seconds(x))}


def unit_seconds(blk: dict, schedule: str) -> float:
    """A rank's work per micro-batch if its stages held 4 + 4 MoE layers (the trace's shape): an F&B pair with
    DualPipe, a lone F and a lone B otherwise."""
    four = [blk["moe"]] * 4
    if schedule == "dualpipe":
        return v3step.pair(four, four).step
    return v3step.lone(four, "F") + v3step.lone(four, "B")


def pipeline_step(x: Inputs, dur: pipeline.Durations, micro_batches: int | None = None) -> dict:
    """The simulated step with durations `dur`: makespan, plus the ZeRO-1 sync beyond each rank's idle tail and the
    optimizer update."""
    res = v3step.makespan(x.schedule, x.pp, micro_batches or x.micro_batches, dur)
    tails = [res.makespan - max(end for _, end, _, _ in spans) for spans in res.spans]
    dp = dp_sync_seconds(x)
    dp_exposed = max(exposed(dp, tail) for tail in tails)
    opt = optimizer_seconds(x)
    return {"result": res, "dp_sync": dp, "dp_exposed": dp_exposed, "optimizer": opt,
            "step": res.makespan + dp_exposed + opt}


def ramp_extra_gpu_hours_per_t(x: Inputs, step_of, points: int = 4) -> dict:
    """What the batch ramp adds to GPU-hours per trillion tokens averaged over the whole run: the batch grows from
    `batch_sequences_initial` to `batch_sequences` over the first `batch_ramp_tokens` (linearly in tokens: the
    report says "gradually"); each of `points` slices runs at its mid batch with whole-sequence micro-batches
    (DualPipe's minimum of 2 x PP per pipeline where the batch is smaller: a lower bound there). `step_of(m)`:
    seconds of a step with m micro-batches per pipeline."""
    b0, b1, ramp = fact("batch_sequences_initial"), fact("batch_sequences"), fact("batch_ramp_tokens")
    total = scaling.claim("deepseek_v3", "train_tokens")
    per_mb = x.micro_batch_tokens * x.tp // x.sequence_length       # sequences per micro-batch and pipeline
    least = 2 * x.pp if x.schedule == "dualpipe" else x.pp

    def cost(m):   # GPU-hours per token of a step with m micro-batches per pipeline
        return step_of(m) * x.gpus / scaling.SECONDS_PER_HOUR / (m * x.dp * x.micro_batch_tokens * x.tp)

    full = cost(x.micro_batches)
    extra, rows = 0.0, []
    for i in range(points):
        b = b0 + (b1 - b0) * (i + 0.5) / points
        m = max(least, 2 * round(b / (x.dp * per_mb) / 2))
        c = cost(m)
        extra += ramp / points * (c - full)
        rows.append((b, m, c * 1e12))
    return {"gpu_hours_per_t": extra / (total / 1e12), "slices": rows, "full_batch_gpu_hours_per_t": full * 1e12}


@dataclass
class KernelPrediction(Prediction):
    plan: list = None
    ranks: list = None
    blocks: dict = None
    full_batch_gpu_hours_per_t: float = 0.0
    ramp_gpu_hours_per_t: float = 0.0


def predict(x: Inputs | None = None, **changes) -> KernelPrediction:
    """The kernel-level prediction of the run described by `x` (default: as reported), changed by `changes`:
    GPU-hours per trillion tokens averaged over the run (the batch ramp included), MFU at the final batch, the step
    and its breakdown (seconds per step, summing to the step). Cached: the same inputs give the same object."""
    return _predict(check_inputs(replace(x or defaults(), **changes)))


@lru_cache(maxsize=128)
def _predict(x: Inputs) -> KernelPrediction:
    k = kernel_chunks(x)
    dur = k["durations"]
    main = pipeline_step(x, dur)
    step, res, m = main["step"], main["result"], x.micro_batches
    ramp = ramp_extra_gpu_hours_per_t(x, lambda mb: pipeline_step(x, dur, mb)["step"])
    full = gpu_hours_per_t_tokens(step, x.gpus, x.tokens_per_step)
    flops = training_flops_per_token(seq=x.sequence_length) * x.tokens_per_step
    mfu = flops / (x.gpus * step * hardware.peak_tflops(x.gpu_id, "fp8") * 1e12)
    base = unit_seconds(v3step.blocks(config(), setup(x, 1.0)), x.schedule)
    imb = unit_seconds(k["blocks"], x.schedule)
    no_send = v3step.makespan(x.schedule, x.pp, m, replace(dur, comm=0.0)).makespan
    breakdown = {"4 + 4 MoE layers per micro-batch (the trace's shape)": m * base,
                 "EP imbalance (sampling floor)": m * (imb - base),
                 "uneven stages: dense layers, heads": m * (dur.fb - imb),
                 "pipeline bubble and lone chunks": no_send - m * dur.fb,
                 "PP sends": res.makespan - no_send,
                 "ZeRO-1 sync + optimizer step": main["dp_exposed"] + main["optimizer"]}
    return KernelPrediction(x, dur, res, main["dp_sync"], main["dp_exposed"], step,
                            full + ramp["gpu_hours_per_t"], mfu, breakdown, memory_gb(x), plan=k["plan"],
                            ranks=k["ranks"], blocks=k["blocks"], full_batch_gpu_hours_per_t=full,
                            ramp_gpu_hours_per_t=ramp["gpu_hours_per_t"])


def reported_mfu_fp8(cfg=None) -> float:
    """The MFU the reported 180K GPU-hours per trillion tokens imply with this model's FLOPs per token."""
    return training_flops_per_token(cfg) * 1e12 / (fact("gpu_hours_per_t_tokens") * scaling.SECONDS_PER_HOUR *
                                                   hardware.peak_tflops(fact("gpu_id"), "fp8") * 1e12)


def input_to_match(name: str, lo: float, hi: float, target_gpu_hours: float | None = None, x: Inputs | None = None,
                   tol: float = 1e-6, model=None, inverse: bool = False) -> float:
    """The value of input `name` in [lo, hi] at which `model` (default: `predict`) gives `target_gpu_hours` (default:
    the reported figure), everything else as in `x`. The prediction must be monotone in `name`; found by regula
    falsi (Illinois variant) until it is within 0.01% of the target or the bracket within `tol` x the range --
    on 1 / value when `inverse` (a rate or an efficiency, to which time is inversely proportional: then a few
    evaluations suffice). NaN when no value in the range reaches the target."""
    target = target_gpu_hours or fact("gpu_hours_per_t_tokens")
    x = x or defaults()
    model = model or predict
    to_u = (lambda v: 1.0 / v) if inverse else (lambda v: v)  # noqa: E731
    f = lambda u: model(x, **{name: to_u(u)}).gpu_hours_per_t - target  # noqa: E731  (to_u is its own inverse)
    a, b = to_u(float(lo)), to_u(float(hi))
    width = abs(b - a)
    fa, fb = f(a), f(b)
    if fa * fb > 0:
        return float("nan")
    side = 0
    for _ in range(100):
        if fa == fb:
            break
        c = b - fb * (b - a) / (fb - fa)
        fc = f(c)
        if abs(fc) <= 1e-4 * target:
            return to_u(c)
        if fc * fb > 0:
            b, fb = c, fc
            if side == -1:
                fa /= 2
            side = -1
        else:
            a, fa = c, fc
            if side == 1:
                fb /= 2
            side = 1
        if abs(b - a) <= tol * width:
            break
    return to_u(b - fb * (b - a) / (fb - fa) if fa != fb else (a + b) / 2)


def tornado(ranges: dict, x: Inputs | None = None, model=None) -> list:
    """[(input, low value, high value, prediction at low, at high)] for each input moved alone."""
    x = x or defaults()
    model = model or predict
    rows = []
    for name, (lo, hi) in ranges.items():
        rows.append((name, lo, hi, model(x, **{name: lo}).gpu_hours_per_t, model(x, **{name: hi}).gpu_hours_per_t))
    return rows
