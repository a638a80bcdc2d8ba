"""What one MoE layer's training step costs, part by part, from its shapes: FLOPs and bytes, and the time a roofline
predicts for each part -- for a DeepSeek-V3 layer on an H800 and for lab 12's block on this machine, with the same
formulas, so the two can be ranked side by side.

Per part (the block's `COMPONENTS`), forward + backward:
- GEMMs (`m x k` times `k x n`): 3 passes (forward, input gradient, weight gradient) of 2mkn FLOPs each, reading
  and writing their operands once per pass;
- the attention core, causal: forward QK^T and PV over half the s x s scores, 2 x heads x (qk + v) x s/2 FLOPs per
  token; backward 2.5 x forward (FlashAttention recomputes the scores: five products against two);
- memory-bound passes (RMSNorm, SwiGLU's elementwise, the gate's sigmoid and top-k, the routed experts' dispatch
  and combine permutations) by the values they read and write.
A GEMM's time is max(FLOPs / peak, bytes / bandwidth) at its dtype's dense peak; a memory-bound pass's is bytes /
bandwidth. DeepSeek-V3 runs its GEMMs in FP8 and the attention core and router in BF16 (technical report, 3.3); the
block runs everything in its config's dtype.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from common.systems.capstone.block import COMPONENTS, Block, step
from common.systems.capstone.config import BlockConfig, Version

DTYPE_BYTES = {"fp8": 1, "bf16": 2, "float32": 4, "fp32": 4, "float64": 8, "bfloat16": 2}


@dataclass(frozen=True)
class LayerShape:
    """One MoE layer's dimensions, as the cost formulas need them."""

    name: str
    tokens: int  # tokens through the layer per step
    seq: int  # sequence length (causal attention)
    hidden: int
    heads: int
    qk_dim: int  # query/key width per head (DeepSeek-V3: 128 + 64 RoPE)
    v_dim: int
    q_rank: int  # query latent (0: a direct query projection)
    kv_rank: int
    rope_dim: int  # the decoupled RoPE key, shared by all heads (0 in the block)
    experts: int
    top_k: int
    expert_ffn: int
    shared: int  # shared experts
    gemm_dtype: str
    attn_dtype: str
    act_dtype: str  # what activations are stored in (the memory-bound passes)


def v3_layer() -> LayerShape:
    """A DeepSeek-V3 MoE layer (data/models/deepseek_v3.json) at its training sequence length, one micro-batch of
    one sequence (data/deepseek_v3_run.json)."""
    from common.systems.v3 import model as v3model
    c = v3model.config()
    seq = int(v3model.fact("sequence_length"))
    return LayerShape("DeepSeek-V3 MoE layer", seq, seq, c["hidden_size"], c["num_attention_heads"],
                      c["qk_nope_head_dim"] + c["qk_rope_head_dim"], c["v_head_dim"], c["q_lora_rank"],
                      c["kv_lora_rank"], c["qk_rope_head_dim"], c["n_routed_experts"], c["num_experts_per_tok"],
                      c["moe_intermediate_size"], c["n_shared_experts"], "fp8", "bf16", "bf16")


def block_layer(cfg: BlockConfig) -> LayerShape:
    """Lab 12's block as a LayerShape (one dtype for everything)."""
    return LayerShape("lab 12 block", cfg.tokens, cfg.seq, cfg.hidden, cfg.heads, cfg.head_dim, cfg.head_dim,
                      cfg.q_rank, cfg.kv_rank, 0, cfg.experts, cfg.top_k, cfg.expert_ffn, 1, cfg.dtype, cfg.dtype,
                      cfg.dtype)


@dataclass(frozen=True)
class Kernel:
    part: str
    what: str
    flops: float
    bytes: float
    dtype: str  # the peak it runs at ("" for a memory-bound pass)


def kernels(s: LayerShape) -> list[Kernel]:
    """The training step's work, as kernels grouped by part."""
    t, d, h, f = s.tokens, s.hidden, s.heads, s.expert_ffn
    act = DTYPE_BYTES[s.act_dtype]
    out = []

    def gemm(part, what, m, k, n, dtype):
        b = DTYPE_BYTES[dtype]
        out.append(Kernel(part, what, 3 * 2.0 * m * k * n, 3.0 * (m * k + k * n + m * n) * b, dtype))

    def passes(part, what, values):
        out.append(Kernel(part, what, 0.0, float(values) * act, ""))

    g = s.gemm_dtype
    passes("norm", "2 RMSNorms (forward read + write, backward 2 reads + 1 write)", 2 * 5 * t * d)
    if s.q_rank:
        gemm("mla_proj", "W_qa", t, d, s.q_rank, g)
        gemm("mla_proj", "W_qb", t, s.q_rank, h * s.qk_dim, g)
    else:
        gemm("mla_proj", "W_q", t, d, h * s.qk_dim, g)
    gemm("mla_proj", "W_dkv (+ RoPE key)", t, d, s.kv_rank + s.rope_dim, g)
    gemm("mla_proj", "W_uk, W_uv", t, s.kv_rank, h * (s.qk_dim - s.rope_dim + s.v_dim), g)
    gemm("mla_proj", "W_o", t, h * s.v_dim, d, g)
    fwd = 2.0 * t * h * (s.qk_dim + s.v_dim) * s.seq / 2
    qkvo = t * h * (2 * s.qk_dim + 2 * s.v_dim) * DTYPE_BYTES[s.attn_dtype]
    out.append(Kernel("attention_core", "causal flash attention, forward + backward", 3.5 * fwd, 3.0 * qkvo,
                      s.attn_dtype))
    gemm("gate", "router", t, d, s.experts, s.attn_dtype)
    passes("gate", "sigmoid, group top-k, top-k", 6 * t * s.experts)
    rows = t * s.top_k
    gemm("routed_experts", "gate + up projections", rows, d, 2 * f, g)
    gemm("routed_experts", "down projection", rows, f, d, g)
    passes("routed_experts", "SwiGLU elementwise", 8 * rows * f)
    passes("routed_experts", "dispatch + combine permutations", 8 * rows * d)
    if s.shared:
        gemm("shared_expert", "gate + up projections", t, d, 2 * f * s.shared, g)
        gemm("shared_expert", "down projection", t, f * s.shared, d, g)
        passes("shared_expert", "SwiGLU elementwise", 8 * t * f * s.shared)
    return out


def predicted_times(s: LayerShape, peak_flops: dict, bandwidth: float) -> dict:
    """{part: seconds} on a roofline with `peak_flops` {dtype: FLOP/s} and `bandwidth` bytes/s."""
    times = {part: 0.0 for part in COMPONENTS}
    for k in kernels(s):
        memory = k.bytes / bandwidth
        if k.dtype:
            if k.dtype not in peak_flops:
                raise ValueError(f"no peak given for dtype {k.dtype!r} ({k.part}: {k.what}); have {sorted(peak_flops)}")
            times[k.part] += max(k.flops / peak_flops[k.dtype], memory)
        else:
            times[k.part] += memory
    return times


def v3_predicted_times(gpu_id: str | None = None) -> dict:
    """A DeepSeek-V3 layer's part times on its training GPU's datasheet roofline (dense peaks, HBM bandwidth)."""
    from common.facts import hardware
    from common.systems.v3 import model as v3model
    gpu = hardware.gpu(gpu_id or v3model.fact("gpu_id"))
    peaks = {dt: gpu.peak_tflops(dt) * 1e12 for dt in ("fp8", "bf16")}
    return predicted_times(v3_layer(), peaks, gpu.hbm_bandwidth_gbs * 1e9)


def shares(times: dict) -> dict:
    total = sum(times.values())
    return {k: v / total for k, v in times.items()}


def ranking(values: dict, top: int = 3) -> list[str]:
    """The `top` largest entries' names, largest first."""
    return sorted(values, key=values.get, reverse=True)[:top]


def mla_vs_mha_kv_flops(cfg: BlockConfig) -> tuple[float, float]:
    """Forward FLOPs per token of producing K and V: MLA (h W_dkv, then W_uk and W_uv from the latent) and plain
    multi-head attention (h W_k, h W_v) at the same width."""
    a = cfg.attn_width
    mla = 2.0 * (cfg.hidden * cfg.kv_rank + 2 * cfg.kv_rank * a)
    mha = 2.0 * 2 * cfg.hidden * a
    return mla, mha


def step_flops_and_bytes(block: Block, x: torch.Tensor, version: Version) -> tuple[float, float]:
    """FLOPs of one step as torch's FlopCounterMode counts them (matmuls and attention, forward and backward) and
    the bytes its operators read and write if nothing stayed in cache (every aten op's tensor inputs and outputs):
    an upper bound on memory traffic, so the arithmetic intensity is a lower bound."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import FlopCounterMode

    class ByteCounter(TorchDispatchMode):
        total = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in torch.utils._pytree.tree_leaves((args, kwargs, out)):
                if isinstance(t, torch.Tensor):
                    ByteCounter.total += t.numel() * t.element_size()
            return out

    flops = FlopCounterMode(display=False)
    with flops, ByteCounter():
        step(block, x, replace(version, log_loss=False))
    return float(flops.get_total_flops()), float(ByteCounter.total)
