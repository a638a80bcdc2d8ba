"""A step-time model of DeepSeek-V3's pre-training run, composed from the labs' helpers: GEMM FLOPs of the real config
(common.kernels.roofline.gemm_cost over common.facts.models' shapes), a FLOP rate at a stated GEMM efficiency of the datasheet peaks
(common.facts.hardware), the EP all-to-all with node-limited routing and per-node de-duplication (common.systems.topology,
common.moe.moe),
the DualPipe / 1F1B schedule (common.parallel.pipeline's simulator), the ZeRO-1 gradient reduce-scatter / all-gather
(common.parallel.collectives) and memory per GPU (common.systems.topology.memory_per_gpu_gb). The run's facts come from
data/deepseek_v3_run.json (each with its source).

Units: seconds, FLOPs, bytes; GB = 1e9 bytes. One *chunk* = one micro-batch through one pipeline stage (1/PP of the
model, layers split evenly); F, B, W as in common.parallel.pipeline (W: the weight-gradient GEMMs, B: input + weight gradients).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import lru_cache

from common.core.env import REPO_ROOT
from common.facts import hardware, models
from common.kernels import roofline
from common.moe import moe
from common.parallel import collectives, pipeline
from common.systems import scaling, topology

RUN_PATH = REPO_ROOT / "data" / "deepseek_v3_run.json"
PRECISIONS = ("fp8", "bf16")


# ---------------------------------------------------------------- facts

@lru_cache(maxsize=1)
def load_run() -> dict:
    return json.loads(RUN_PATH.read_text())


def fact(name: str):
    """A fact of the run, e.g. fact("comm_sms") -> 20."""
    facts = load_run()["facts"]
    if name not in facts:
        raise ValueError(f"{name!r} is not a fact in data/deepseek_v3_run.json; recorded: {', '.join(facts)}")
    return facts[name]["value"]


def source(name: str) -> str:
    entry = load_run()["facts"].get(name)
    if entry is None:
        raise ValueError(f"{name!r} is not a fact in data/deepseek_v3_run.json")
    src = load_run()["sources"][entry["source"]]
    return f"{src['title']} ({src['url']}, {src['date']})"


@lru_cache(maxsize=1)
def config():
    return models.load_model_config("deepseek_v3")


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


# ---------------------------------------------------------------- data parallel and memory

def sketch(cfg=None) -> topology.ModelSketch:
    """DeepSeek-V3 with its MTP module (whose routed experts are sharded like the others)."""
    cfg = cfg or config()
    base = topology.model_sketch("deepseek_v3")
    c = models.count_params(cfg)
    mtp_experts = cfg["num_nextn_predict_layers"] * cfg["n_routed_experts"] * models.ffn_params(
        cfg["hidden_size"], cfg["moe_intermediate_size"])
    return replace(base, dense_params=base.dense_params + c["mtp_total"] - mtp_experts,
                   expert_params=base.expert_params + mtp_experts)


def param_layout(x: Inputs) -> topology.Layout:
    """DualPipe keeps two stages per rank (two copies of the model across the pipeline): parameters as for PP/2
    with twice the replicas. 1F1B: one stage per rank."""
    if x.schedule == "dualpipe":
        return topology.Layout(tp=x.tp, pp=x.pp // 2, dp=x.dp * 2, ep=x.ep)
    return topology.Layout(tp=x.tp, pp=x.pp, dp=x.dp, ep=x.ep)


def dp_sync_seconds(x: Inputs) -> float:
    """ZeRO-1: reduce-scatter of the FP32 gradients, all-gather of the updated BF16 weights, over each parameter's
    replicas (dense: all DP ranks, across nodes; routed experts: dp / ep ranks), at the IB bandwidth."""
    m, lay = sketch(), param_layout(x)
    dense = m.dense_params / (lay.tp * lay.pp)
    experts = m.expert_params / (lay.tp * lay.pp * lay.ep)
    bw = x.ib_gbs * 1e9
    t = 0.0
    for n, replicas in ((dense, lay.dp), (experts, lay.dp // lay.ep)):
        if replicas > 1:
            t += collectives.ring_reduce_scatter_time(n * fact("grad_bytes"), replicas, 0.0, bw)
            t += collectives.ring_allgather_time(n * 2, replicas, 0.0, bw)
    return t


def activation_bytes_per_token_layer(cfg=None) -> float:
    """Bytes a MoE layer keeps per token for its backward, with DeepSeek's recipe: the layer input (BF16; RMSNorm
    recomputed), the MLA latents (BF16; up-projections recomputed), the attention output (FP8, input of the output
    projection), and per expert (shared + routed) its FP8 input and FP8 SwiGLU input (the SwiGLU output recomputed)."""
    cfg = cfg or config()
    h = cfg["hidden_size"]
    attn = 2 * h + 2 * (cfg["q_lora_rank"] + cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) + \
        cfg["num_attention_heads"] * cfg["v_head_dim"]
    experts = cfg["num_experts_per_tok"] + cfg["n_shared_experts"]
    return attn + experts * (h + 2 * cfg["moe_intermediate_size"])


def memory_gb(x: Inputs) -> dict:
    """GB per GPU: BF16 weights, FP32 gradients, FP32 master + BF16 moments sharded by ZeRO-1 (EMA on the CPU, so
    none here), and activations of the chunks in flight (DualPipe: PP + 1; 1F1B: PP), common.parallel.pipeline's count."""
    mem = topology.memory_per_gpu_gb(sketch(), param_layout(x), weight_bytes=2, grad_bytes=fact("grad_bytes"),
                                     optimizer_bytes=fact("master_weight_bytes") + 2 * fact("adam_moment_bytes"))
    cfg = config()
    in_flight = pipeline.memory_formula(x.schedule, x.pp)["activations"]
    layers = (cfg["num_hidden_layers"] + cfg["num_nextn_predict_layers"]) / x.pp
    act = in_flight * x.micro_batch_tokens * layers * activation_bytes_per_token_layer(cfg) / 1e9
    out = {k: mem[k] for k in ("weights", "grads", "optimizer")}
    out["activations"] = act
    out["total"] = sum(out.values())
    out["hbm"] = float(hardware.gpu(x.gpu_id).hbm_gb)
    return out


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


def predict(x: Inputs | None = None, **changes) -> Prediction:
    """One training step of the run described by `x` (default: as reported), changed by `changes`."""
    x = check_inputs(replace(x or defaults(), **changes))
    ch = chunk(x)
    dur = ch.durations(x.schedule)
    res = pipeline.simulate(pipeline.build(x.schedule, x.pp, x.micro_batches), dur)
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


def reported_mfu_fp8(cfg=None) -> float:
    """The MFU the reported 180K GPU-hours per trillion tokens imply with this model's FLOPs per token."""
    return training_flops_per_token(cfg) * 1e12 / (fact("gpu_hours_per_t_tokens") * scaling.SECONDS_PER_HOUR *
                                                   hardware.peak_tflops(fact("gpu_id"), "fp8") * 1e12)


def input_to_match(name: str, lo: float, hi: float, target_gpu_hours: float | None = None, x: Inputs | None = None,
                   tol: float = 1e-6) -> float:
    """The value of input `name` in [lo, hi] at which the model predicts `target_gpu_hours` (default: the reported
    figure), everything else as in `x`; found by bisection (the prediction must be monotone in `name`). NaN when
    no value in the range reaches the target."""
    target = target_gpu_hours or fact("gpu_hours_per_t_tokens")
    x = x or defaults()
    f = lambda v: predict(x, **{name: v}).gpu_hours_per_t - target  # noqa: E731
    f_lo, f_hi = f(lo), f(hi)
    if f_lo * f_hi > 0:
        return float("nan")
    while hi - lo > tol * max(1.0, abs(hi)):
        mid = (lo + hi) / 2
        if (f(mid) > 0) == (f_lo > 0):
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def tornado(ranges: dict, x: Inputs | None = None) -> list:
    """[(input, low value, high value, prediction at low, at high)] for each input moved alone."""
    x = x or defaults()
    rows = []
    for name, (lo, hi) in ranges.items():
        rows.append((name, lo, hi, predict(x, **{name: lo}).gpu_hours_per_t, predict(x, **{name: hi}).gpu_hours_per_t))
    return rows
