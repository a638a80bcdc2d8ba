"""DeepSeek-V3/R1's online service from first principles: decode and prefill throughput per H800 node, composed from
the workbook's models and DeepSeek's own measured kernels -- nothing fitted to the throughput it predicts.

Per GPU, per layer, a micro-batch of b tokens runs four parts (two micro-batches per step, as DeepSeek runs them):
- attention (SMs): MLA's projections as FP8 GEMMs at the rate DeepGEMM measured for that very shape (interpolated
  in M: `gemm_seconds`); the absorbed up-projections (decode) or the kv_b decompression (prefill); the core
  attention at the roofline of the measured ceilings (FlashMLA: 3,000 GB/s, 660 TFLOP/s) -- over the KV cache in
  decode (MQA mode, 576 / 512), over the prompt in prefill (MHA mode, 192 / 128, causal);
- dispatch (network): each token's FP8 hidden vector to its 8 experts; combine: the BF16 outputs back
  (`common.systems.cluster.topology.ep_all_to_all_seconds`, labs 07 and 13) -- decode on DeepEP's low-latency kernels
  (pure RDMA, one copy per expert, no SMs: `dedup=False`, DeepEP's measured bandwidth), prefill on the normal kernels
  (one IB copy per node, forwarded over NVLink; they take `comm_sms` of the 132 SMs);
- experts (SMs): this GPU's routed experts as one grouped GEMM (tokens spread evenly over the replicas, EPLB's
  goal) and the shared expert.
The two micro-batches alternate on two resources, the SMs and the network (`common.parallel.overlap`), so one's
all-to-all runs while the other computes. Facts: data/deepseek_v3_service.json (`fact`, `source`).

Scenarios beyond the stated inputs (their defaults leave the model as stated):
- MTP (decode, `draft_tokens` 1, `acceptance` an input; the V3 report measured 85-90% for the second token): every
  request verifies its draft, so the main model runs 1 + draft rows per request (the GEMMs, the all-to-all and the
  head on twice the tokens; the core attention reads each cache ONCE for both rows), the MTP module adds one more
  MoE layer over those rows and its output head, and a step yields 1 + acceptance x draft tokens per request;
- prefill with cache hits charged (`cached_prefix_kv_b`, `storage_gibs`): the cached prefix's latents must be
  up-projected by kv_b too (MHA mode attends over them), and loaded from 3FS first -- read at `storage_gibs` per
  node, in series with the step (`storage_overlap` hides it behind the step instead).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from common.core.env import REPO_ROOT
from common.core.validate import number, whole
from common.facts import hardware, models, sourced
from common.moe import moe
from common.parallel import overlap
from common.systems.cluster import topology
from common.systems.inference import kvcache
from common.systems.v3 import kernel_rates, model as v3model

SERVICE_PATH = REPO_ROOT / "data" / "deepseek_v3_service.json"
SECONDS_PER_DAY = 86400


_SERVICE = sourced.FactFile(SERVICE_PATH)


def fact(name: str):
    """A fact of the service, e.g. fact("decode_tokens_per_s_per_node") -> 14800.0."""
    return _SERVICE.fact(name)


def source(name: str) -> str:
    return _SERVICE.source(name)


def config():
    return v3model.config()


def kv_bytes_per_token(cfg=None, bytes_per_value: float = 2) -> float:
    """MLA's cache per token for the whole model: (kv_lora + rope) x bytes x layers = 70,272 B for V3 in BF16."""
    cfg = cfg or config()
    return kvcache.mla_bytes_per_token(cfg["num_hidden_layers"], cfg["kv_lora_rank"], cfg["qk_rope_head_dim"],
                                       bytes_per_value)


# ---------------------------------------------------------------- GEMMs at DeepGEMM's measured rates

GEMM_KINDS = {"normal": ("normal", "columns_normal"), "masked": ("grouped_masked", "columns_grouped_masked"),
              "contiguous": ("grouped_contiguous", "columns_grouped")}


def deepgemm_rows(kind: str) -> list:
    """DeepGEMM's first-release table of `kind` (data/kernel_rates.json) as dicts: m (or groups, m_per_group), n, k,
    tflops, gbs."""
    if kind not in GEMM_KINDS:
        raise ValueError(f"kind={kind!r} is not allowed; allowed: {', '.join(GEMM_KINDS)}")
    table, columns = GEMM_KINDS[kind]
    fp8 = kernel_rates.load_rates()["deepgemm_fp8"]
    names = [c.lower() for c in fp8[columns]]
    return [dict(zip(names, row)) for row in fp8[table]]


def gemm_seconds(m: float, n: int, k: int, kind: str = "normal", groups: int = 1, gemm_efficiency: float = 1.0,
                 hbm_gbs: float | None = None) -> float:
    """Seconds of an FP8 GEMM (`groups` groups of m x n x k) at the rate DeepGEMM measured on H800 for that (n, k)
    (`deepgemm_rows`): the time per group interpolated linearly in m between the measured points -- decode's m (64
    requests, 256 rows per expert) falls between rows, where lab 13's `kernel_rates` takes the nearest row --; below
    the smallest measured m the time of that m (the weights' read sets it), above the largest one that rate. A shape
    DeepGEMM did not measure runs at the roofline of its best rate (1,350 TFLOP/s) and `hbm_gbs`. `gemm_efficiency`
    scales every rate."""
    if m <= 0:
        return 0.0
    mkey = "m" if kind == "normal" else "m_per_group"
    pts = sorted((r[mkey], 2 * r[mkey] * n * k / (r["tflops"] * 1e12)) for r in deepgemm_rows(kind)
                 if r["n"] == n and r["k"] == k)
    if not pts:
        flops = 2 * groups * m * n * k
        nbytes = groups * (n * k + m * k) + groups * m * n * 2          # FP8 weights and input, BF16 output
        return max(flops / (v3model.fact("deepgemm_fp8_tflops") * 1e12),
                   nbytes / ((hbm_gbs or fact("flashmla_memory_bound_gbs")) * 1e9)) / gemm_efficiency
    if m <= pts[0][0]:
        t = pts[0][1]
    elif m >= pts[-1][0]:
        t = pts[-1][1] * m / pts[-1][0]
    else:
        (m0, t0), (m1, t1) = next((a, b) for a, b in zip(pts, pts[1:]) if a[0] <= m <= b[0])
        t = t0 + (t1 - t0) * (m - m0) / (m1 - m0)
    return groups * t / gemm_efficiency


def roofline_seconds(flops: float, nbytes: float, tflops: float, gbs: float) -> float:
    return max(flops / (tflops * 1e12), nbytes / (gbs * 1e9))


# ---------------------------------------------------------------- inputs

PHASES = ("decode", "prefill")


@dataclass(frozen=True)
class Inputs:
    """One phase of the service on one GPU; `decode_inputs()` / `prefill_inputs()` fill it from data/."""
    phase: str
    tokens_per_gpu: int            # decode: requests per GPU; prefill: prompt tokens computed per GPU and step
    context: int                   # decode: KV length per output token; prefill: prompt length
    hit_rate: float                # prefill: share of the prompt served from the on-disk KV cache
    ep: int
    routed_per_gpu: int
    micro_batches: int             # 2: dual micro-batch overlap; 1: none
    hbm_gbs: float                 # achieved HBM bandwidth of memory-bound kernels (FlashMLA's)
    attention_tflops: float        # achieved BF16 rate of the core attention
    gemm_efficiency: float         # x DeepGEMM's measured rates
    network_gbs: float             # per GPU per direction
    nvlink_gbs: float
    dedup: bool                    # one IB copy per destination node (normal kernels) or one per expert (LL)
    max_nodes: int | None
    comm_sms: int                  # SMs the all-to-all takes while it runs (0: DeepEP's low-latency kernels)
    layer_overhead_us: float = 0.0  # per layer and micro-batch, for work the model does not list (0 as stated)
    network_latency_us: float = 0.0  # alpha of each dispatch and combine (lab 07's alpha-beta model; 0 as stated)
    gpu_id: str = "H800-SXM"
    draft_tokens: int = 0           # decode: MTP's speculative tokens per request and step (V3: 1); 0: no MTP
    acceptance: float = 0.0         # decode: share of draft tokens accepted (V3 report: 0.85-0.90)
    cached_prefix_kv_b: bool = False  # prefill: charge kv_b on the cached prefix's latents too
    storage_gibs: float = 0.0       # prefill: GiB/s per node the cached prefix is read from (3FS); 0: not charged
    storage_overlap: bool = False   # prefill: the 3FS load hidden behind the step (else in series with it)

    @property
    def sm_share(self) -> float:
        return (hardware.gpu(self.gpu_id).sms - self.comm_sms) / hardware.gpu(self.gpu_id).sms


def decode_inputs(**changes) -> Inputs:
    """Decode as DeepSeek runs it: EP144, 2 routed experts per GPU, 128 requests per GPU (the decode profile's
    batch), KV length 4,989, DeepEP's low-latency all-to-all (its EP128 bandwidth), FlashMLA's ceilings."""
    x = Inputs("decode", fact("profile_decode_batch_per_gpu"), fact("kv_length_per_output_token"), 0.0,
               fact("decode_ep"), fact("decode_routed_per_gpu"), fact("micro_batches"),
               fact("flashmla_memory_bound_gbs"), fact("flashmla_compute_bound_tflops"), 1.0,
               fact("deepep_ll_dispatch_gbs_ep128"), v3model.fact("nvlink_gbs"), False, None, 0)
    return check(replace(x, **changes))


def prefill_inputs(**changes) -> Inputs:
    """Prefill: EP32 over 4 nodes, 9 routed experts per GPU, 16K tokens of 4K prompts per GPU (the prefill
    profile), the day's 56.3% cache hits, DeepEP's normal kernels on the V3 report's 20 SMs, IB 50 / NVLink 160."""
    x = Inputs("prefill", fact("profile_prefill_tokens_per_gpu"), fact("profile_prefill_prompt"),
               fact("cache_hit_rate"), fact("prefill_ep"), fact("prefill_routed_per_gpu"), fact("micro_batches"),
               fact("flashmla_memory_bound_gbs"), fact("flashmla_compute_bound_tflops"), 1.0,
               v3model.fact("ib_gbs"), v3model.fact("nvlink_gbs"), True, v3model.fact("max_nodes_per_token"),
               v3model.fact("comm_sms"))
    return check(replace(x, **changes))


def check(x: Inputs) -> Inputs:
    if x.phase not in PHASES:
        raise ValueError(f"phase={x.phase!r} is not allowed; allowed: {', '.join(PHASES)}")
    for name in ("tokens_per_gpu", "context", "ep", "routed_per_gpu"):
        whole(name, getattr(x, name))
    if x.micro_batches not in (1, 2) or x.tokens_per_gpu % x.micro_batches:
        raise ValueError(f"micro_batches={x.micro_batches!r} is not allowed; allowed: 1 or 2, dividing "
                         f"tokens_per_gpu={x.tokens_per_gpu}")
    if not 0 <= x.hit_rate < 1:
        raise ValueError(f"hit_rate={x.hit_rate!r} is not allowed; allowed: 0 <= hit_rate < 1")
    for name in ("hbm_gbs", "attention_tflops", "gemm_efficiency", "network_gbs", "nvlink_gbs"):
        number(name, getattr(x, name))
    for name in ("layer_overhead_us", "network_latency_us", "storage_gibs"):
        number(name, getattr(x, name), strict=False)
    whole("draft_tokens", x.draft_tokens, minimum=0)
    if not 0 <= x.acceptance <= 1 or (x.acceptance and not x.draft_tokens):
        raise ValueError(f"acceptance={x.acceptance!r} is not allowed; allowed: 0..1, and above 0 only with "
                         f"draft_tokens >= 1 (draft_tokens={x.draft_tokens})")
    if x.phase == "prefill" and x.draft_tokens:
        raise ValueError(f"draft_tokens={x.draft_tokens} is not allowed in prefill; MTP is a decode scenario")
    return x


def rows_per_request(x: Inputs) -> int:
    """Query rows a decode step runs per request: 1, plus MTP's draft tokens to verify."""
    return 1 + x.draft_tokens if x.phase == "decode" else 1


def cached_tokens(x: Inputs, b: float) -> float:
    """Prefill: the cached-prefix tokens behind b computed tokens (b x hit / (1 - hit))."""
    return b * x.hit_rate / (1 - x.hit_rate)


# ---------------------------------------------------------------- one layer of one micro-batch

def attention_parts(x: Inputs, b: float, cfg=None) -> dict:
    """Seconds of each piece of one layer's attention for a micro-batch of b tokens (decode: b sequences), in the
    order they run."""
    cfg = cfg or config()
    h, nh, qr, kvr = cfg["hidden_size"], cfg["num_attention_heads"], cfg["q_lora_rank"], cfg["kv_lora_rank"]
    nope, rope, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    g = dict(gemm_efficiency=x.gemm_efficiency, hbm_gbs=x.hbm_gbs)
    bf16 = dict(tflops=x.attention_tflops, gbs=x.hbm_gbs)
    rows = b * rows_per_request(x)                                     # tokens through the layer (MTP: verify too)
    parts = {"q_a + kv_a": gemm_seconds(rows, qr + kvr + rope, h, **g),
             "q_b": gemm_seconds(rows, nh * (nope + rope), qr, **g)}
    if x.phase == "decode":
        absorb = roofline_seconds(2 * rows * nh * nope * kvr, nh * kvr * nope * 2, **bf16)   # BF16 W_uk (W_uv alike)
        parts["W_uk (absorbed into q)"] = absorb
        kv = b * x.context * (kvr + rope) * 2                           # each request's cache read once per step
        parts["core attention (MQA, KV cache)"] = roofline_seconds(2 * rows * nh * x.context * (2 * kvr + rope), kv,
                                                                   **bf16)
        parts["W_uv (after attention)"] = absorb
    else:
        parts["kv_b (decompress)"] = gemm_seconds(b, nh * (nope + vd), kvr, **g)
        if x.cached_prefix_kv_b and x.hit_rate:
            parts["kv_b (cached prefix)"] = gemm_seconds(cached_tokens(x, b), nh * (nope + vd), kvr, **g)
        ctx = x.context * (1 + x.hit_rate) / 2                          # computed tokens sit after the cached prefix
        parts["core attention (MHA, causal)"] = roofline_seconds(2 * b * nh * ctx * (nope + rope + vd),
                                                                 b * nh * (nope + rope + vd) * 2 * 2, **bf16)
    parts["o_proj"] = gemm_seconds(rows, h, nh * vd, **g)
    parts["router"] = roofline_seconds(2 * rows * h * cfg["n_routed_experts"], h * cfg["n_routed_experts"] * 2,
                                       **bf16)
    return parts


def expert_parts(x: Inputs, b: float, cfg=None) -> dict:
    """Seconds of one MoE layer's experts on this GPU: its routed experts as one grouped GEMM (every replica gets
    b x ep x top_k / (ep x routed_per_gpu) tokens) and the shared expert over the b tokens."""
    cfg = cfg or config()
    h, inter, k = cfg["hidden_size"], cfg["moe_intermediate_size"], cfg["num_experts_per_tok"]
    per_expert = b * k / x.routed_per_gpu
    kind = "masked" if x.phase == "decode" else "contiguous"
    g = dict(gemm_efficiency=x.gemm_efficiency, hbm_gbs=x.hbm_gbs)
    routed = gemm_seconds(per_expert, 2 * inter, h, kind, x.routed_per_gpu, **g) + \
        gemm_seconds(per_expert, h, inter, kind, x.routed_per_gpu, **g)
    shared = cfg["n_shared_experts"] * (gemm_seconds(b, 2 * inter, h, **g) + gemm_seconds(b, h, inter, **g))
    return {"routed experts": routed, "shared expert": shared}


def dense_ffn_seconds(x: Inputs, b: float, cfg=None) -> float:
    cfg = cfg or config()
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    g = dict(gemm_efficiency=x.gemm_efficiency, hbm_gbs=x.hbm_gbs)
    return gemm_seconds(b, 2 * inter, h, **g) + gemm_seconds(b, h, inter, **g)


def all_to_all(x: Inputs, b: float, cfg=None) -> dict:
    """Dispatch (FP8 + scales) and combine (BF16) seconds of b tokens over the EP group, plus alpha each."""
    cfg = cfg or config()
    fab = topology.Fabric("H800 node", fact("gpus_per_node"), x.nvlink_gbs, x.network_gbs)
    per = moe.token_traffic_bytes(cfg["hidden_size"], 1)
    out = {}
    for name in ("dispatch", "combine"):
        out[name] = topology.ep_all_to_all_seconds(b, per[name], cfg["num_experts_per_tok"], x.ep, fab, 1,
                                                   x.max_nodes, x.dedup, cfg["n_routed_experts"])["seconds"] \
            + x.network_latency_us * 1e-6
    return out


def lm_head_seconds(x: Inputs, b: float, cfg=None) -> float:
    """The BF16 output head, for the last position of each sequence: every token in decode, one per prompt of
    context x (1 - hit_rate) computed tokens in prefill."""
    cfg = cfg or config()
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    rows = b * rows_per_request(x) if x.phase == "decode" else b / (x.context * (1 - x.hit_rate))
    return roofline_seconds(2 * rows * h * v, h * v * 2, x.attention_tflops, x.hbm_gbs)


def storage_seconds(x: Inputs, cfg=None) -> float:
    """Prefill: seconds to read one step's cached prefixes from 3FS into a node (all its GPUs' micro-batches), at
    storage_gibs per node; 0 when not charged."""
    if x.phase != "prefill" or not x.storage_gibs or not x.hit_rate:
        return 0.0
    nbytes = cached_tokens(x, x.tokens_per_gpu) * kv_bytes_per_token(cfg) * fact("gpus_per_node")
    return nbytes / (x.storage_gibs * 2 ** 30)


# ---------------------------------------------------------------- the step

@dataclass
class Prediction:
    inputs: Inputs
    step_s: float
    serial_s: float                # the same parts one after another (no overlap)
    compute_s: float               # SM time of the step (all micro-batches)
    network_s: float               # all-to-all time of the step
    parts_s: dict                  # seconds per step by part
    spans: list                    # (start, end, "mb<m> L<layer> <part>", resource) of the schedule
    memory_gb: dict

    @property
    def tokens_per_step(self) -> float:
        """Decode: output tokens per request and step (1, or 1 + acceptance x draft with MTP); prefill: 1."""
        return 1 + self.inputs.acceptance * self.inputs.draft_tokens

    @property
    def tokens_per_s_per_gpu(self) -> float:
        """Decode: output tokens/s; prefill: input tokens/s with the cache hits (computed / (1 - hit rate))."""
        x = self.inputs
        return x.tokens_per_gpu * self.tokens_per_step / self.step_s / (1 - x.hit_rate)

    @property
    def computed_tokens_per_s_per_node(self) -> float:
        """Prefill: prompt tokens computed per second and node (the cache hits not counted); decode: as per node."""
        return self.tokens_per_s_per_node * (1 - self.inputs.hit_rate)

    @property
    def tokens_per_s_per_node(self) -> float:
        return self.tokens_per_s_per_gpu * fact("gpus_per_node")

    @property
    def per_user_tokens_per_s(self) -> float:
        """Decode: the tokens a request gets per step (one; with MTP 1 + acceptance x draft) over the step."""
        return self.tokens_per_step / self.step_s

    @property
    def vs_reported(self) -> float:
        name = "decode_tokens_per_s_per_node" if self.inputs.phase == "decode" else "prefill_tokens_per_s_per_node"
        return self.tokens_per_s_per_node / fact(name)


def layer_chain(x: Inputs, b: float, cfg=None) -> tuple:
    """The parts of every layer for one micro-batch, [(name, resource, seconds)], and the seconds by part."""
    cfg = cfg or config()
    C, N = overlap.COMPUTE, overlap.COMM
    share = x.sm_share
    rows = b * rows_per_request(x)      # tokens through the experts and the all-to-all (MTP: the drafts too)
    attn = attention_parts(x, b, cfg)
    experts = expert_parts(x, rows, cfg)
    a2a = all_to_all(x, rows, cfg)
    over = x.layer_overhead_us * 1e-6
    a = (sum(attn.values()) + over) / share
    e = sum(experts.values()) / share
    dense = dense_ffn_seconds(x, rows, cfg) / share
    chain = []
    for layer in range(cfg["num_hidden_layers"]):
        chain.append((f"L{layer} attention", C, a))
        if layer < cfg.dense_layers:
            chain.append((f"L{layer} dense FFN", C, dense))
        else:
            chain += [(f"L{layer} dispatch", N, a2a["dispatch"]), (f"L{layer} experts", C, e),
                      (f"L{layer} combine", N, a2a["combine"])]
    head = lm_head_seconds(x, b, cfg) / share
    chain.append(("head", C, head))
    L, moe_l = cfg["num_hidden_layers"], cfg.moe_layers
    parts = {"attention: " + k: v / share * L for k, v in attn.items()}
    parts.update({k: v / share * moe_l for k, v in experts.items()})
    if over:
        parts["unlisted work (layer_overhead_us)"] = over / share * L
    parts.update({"dense FFN": dense * cfg.dense_layers, "output head": head, "dispatch": a2a["dispatch"] * moe_l,
                  "combine": a2a["combine"] * moe_l})
    if x.draft_tokens:                  # the MTP module: one more MoE layer over the step's rows, and its own head
        mtp_head = head / rows_per_request(x) * x.draft_tokens
        chain += [("MTP attention", C, a), ("MTP dispatch", N, a2a["dispatch"]), ("MTP experts", C, e),
                  ("MTP combine", N, a2a["combine"]), ("MTP head", C, mtp_head)]
        parts["MTP module (one MoE layer and its head)"] = a + e + mtp_head
        parts["dispatch"] += a2a["dispatch"]
        parts["combine"] += a2a["combine"]
    return chain, parts


def memory_gb(x: Inputs, cfg=None) -> dict:
    """GB per GPU: FP8 weights (attention, dense FFN, shared expert and this GPU's routed experts), BF16 embedding
    and head, and (decode) the BF16 KV cache of its requests. Activations and buffers not counted."""
    cfg = cfg or config()
    L, h, v = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]
    expert = models.ffn_params(h, cfg["moe_intermediate_size"])
    weights = (L * models.attention_params(cfg) + cfg.dense_layers * models.ffn_params(h, cfg["intermediate_size"])
               + cfg.moe_layers * (x.routed_per_gpu + cfg["n_shared_experts"]) * expert) + 2 * 2 * v * h
    if x.draft_tokens:                  # the MTP module's layer: attention, shared expert, this GPU's routed experts
        weights += models.attention_params(cfg) + (x.routed_per_gpu + cfg["n_shared_experts"]) * expert + 2 * h * h
    kv = x.tokens_per_gpu * x.context * kv_bytes_per_token(cfg) if x.phase == "decode" else 0.0
    kv *= 1 + x.draft_tokens / L        # the MTP layer caches its own latent
    hbm = float(hardware.gpu(x.gpu_id).hbm_gb)
    return {"weights": weights / 1e9, "kv_cache": kv / 1e9, "total": (weights + kv) / 1e9, "hbm": hbm}


def predict(x: Inputs, cfg=None) -> Prediction:
    """One step of the phase `x` describes on one GPU: its micro-batches list-scheduled on the SMs and the network
    (`common.parallel.overlap.list_schedule`: whatever is ready runs)."""
    cfg = cfg or config()
    x = check(x)
    b = x.tokens_per_gpu / x.micro_batches
    chain, parts = layer_chain(x, b, cfg)
    spans = overlap.list_schedule([[(f"mb{m} {name}", res, t) for name, res, t in chain]
                                   for m in range(x.micro_batches)])
    compute = x.micro_batches * sum(t for _, r, t in chain if r == overlap.COMPUTE)
    network = x.micro_batches * sum(t for _, r, t in chain if r == overlap.COMM)
    parts = {k: v * x.micro_batches for k, v in parts.items()}
    step = overlap.makespan(spans)
    load = storage_seconds(x, cfg)
    if load:
        parts["3FS load (cached prefix)"] = load
        step = max(step, load) if x.storage_overlap else step + load
    return Prediction(x, step, compute + network + load, compute, network, parts, spans, memory_gb(x, cfg))


# ---------------------------------------------------------------- checks beside the model

def decode_intensity_per_gpu(x: Inputs | None = None, cfg=None) -> dict:
    """FLOPs per HBM byte of one decode step on ONE GPU of DeepSeek's layout, each request a new token through the
    37B activated parameters (2 FLOPs each) and over its `context` cached tokens (2 x heads x (576 + 512) x layers
    FLOPs per token): under DP attention and EP each GPU reads its OWN weights (`memory_gb`: ~24 GB) for its own
    requests -- against the same FLOPs over the whole model's weights read once for the whole unit (tokens_per_gpu x
    ep requests), the intensity the unit would have if one read of the 671 GB served every request. With the
    H800's BF16 ridge (datasheet, dense) beside them."""
    from common.kernels import roofline
    x = x or decode_inputs()
    cfg = cfg or config()
    v3 = models.load_model_config("deepseek_v3")
    active, total = v3.published["params_active"], v3.published["params_total"]
    per_token = 2 * cfg["num_attention_heads"] * (cfg["kv_lora_rank"] * 2 + cfg["qk_rope_head_dim"]) * \
        cfg["num_hidden_layers"]
    flops = x.tokens_per_gpu * (2 * active + x.context * per_token)
    kv = x.tokens_per_gpu * x.context * kv_bytes_per_token(cfg)
    weights = memory_gb(x, cfg)["weights"] * 1e9
    return {"per_gpu": flops / (weights + kv), "weights_read_once": flops * x.ep / (total + kv * x.ep),
            "weights_gb_per_gpu": weights / 1e9, "requests_per_unit": x.tokens_per_gpu * x.ep,
            "ridge_bf16": roofline.Roof.datasheet(x.gpu_id, "bf16").ridge}


def deepep_low_latency_check(cfg=None) -> dict:
    """The model's low-latency all-to-all (bytes over DeepEP's measured bandwidth, no latency term) at DeepEP's own
    test setting -- 128 tokens, EP128, FP8 dispatch, BF16 combine -- beside the times DeepEP measured there. What is
    left, measured - modelled, is the most a per-call latency (`network_latency_us`) can add in the model without
    exceeding DeepEP's own measurement."""
    x = decode_inputs(ep=128)
    model = all_to_all(x, fact("deepep_ll_tokens"), cfg)
    out = {}
    for name in ("dispatch", "combine"):
        measured = fact(f"deepep_ll_{name}_us_ep128")
        out[name] = {"model_us": model[name] * 1e6, "measured_us": measured,
                     "latency_room_us": measured - model[name] * 1e6}
    return out
