"""DeepSeek-V3's memory per GPU and its ZeRO-1 step: parameters laid out over PP x EP x DP (DualPipe keeps two
stages per rank), the gradient reduce-scatter and weight all-gather, the optimizer update, and the activations a
layer keeps for its backward with DeepSeek's recipe. `x` is a v3model.Inputs (any object with its fields)."""
from __future__ import annotations

from dataclasses import replace

from common.facts import hardware, models
from common.parallel import collectives, pipeline
from common.systems.cluster import topology
from common.systems.v3 import kernel_rates
from common.systems.v3.facts import config, fact


def sketch(cfg=None) -> topology.ModelSketch:
    """DeepSeek-V3 with its MTP module (whose routed experts are sharded like the others)."""
    cfg = cfg or config()
    base = topology.model_sketch("deepseek_v3")
    c = models.count_params(cfg)
    mtp_experts = cfg["num_nextn_predict_layers"] * cfg["n_routed_experts"] * models.ffn_params(
        cfg["hidden_size"], cfg["moe_intermediate_size"])
    return replace(base, dense_params=base.dense_params + c["mtp_total"] - mtp_experts,
                   expert_params=base.expert_params + mtp_experts)


def param_layout(x) -> topology.Layout:
    """DualPipe keeps two stages per rank (two copies of the model across the pipeline): parameters as for PP/2
    with twice the replicas. 1F1B: one stage per rank."""
    if x.schedule == "dualpipe":
        return topology.Layout(tp=x.tp, pp=x.pp // 2, dp=x.dp * 2, ep=x.ep)
    return topology.Layout(tp=x.tp, pp=x.pp, dp=x.dp, ep=x.ep)


def dp_sync_seconds(x) -> float:
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
    """Bytes a MoE layer keeps per token for its backward, with DeepSeek's recipe: the two residual-stream inputs
    of its blocks (BF16; the RMSNorms recomputed), the MLA latents (BF16; up-projections recomputed), the attention
    output (FP8, input of the output projection, also read by the attention backward) and the attention's
    log-sum-exp (FP32 per head), and per expert (shared + routed) its FP8 input and FP8 SwiGLU input (the SwiGLU
    output recomputed)."""
    cfg = cfg or config()
    h, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    attn = 2 * 2 * h + 2 * (cfg["q_lora_rank"] + cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) + \
        nh * cfg["v_head_dim"] + 4 * nh
    experts = cfg["num_experts_per_tok"] + cfg["n_shared_experts"]
    return attn + experts * (h + 2 * cfg["moe_intermediate_size"])


def memory_gb(x) -> dict:
    """GB per GPU: BF16 weights, FP32 gradients, FP32 master + BF16 moments sharded by ZeRO-1 (EMA on the CPU, so
    none here), and activations of the chunks in flight (DualPipe: PP + 1; 1F1B: PP), as common.parallel.pipeline
    counts them."""
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


def optimizer_seconds(x) -> float:
    """The AdamW update of this GPU's ZeRO-1 shard, memory-bound: per parameter it reads the FP32 gradient, FP32
    master weight and two BF16 moments, writes master and moments back and the BF16 weight (8 + 4 + 4 + 2 = 4 + 4 +
    2 + 2 read, 4 + 2 + 2 + 2 written: 22 bytes), over the HBM bandwidth."""
    mem = memory_gb(x)
    per_param = fact("master_weight_bytes") + 2 * fact("adam_moment_bytes")
    shard = mem["optimizer"] * 1e9 / per_param
    nbytes = shard * (fact("grad_bytes") + 2 * fact("master_weight_bytes") + 4 * fact("adam_moment_bytes") + 2)
    return kernel_rates.hbm_seconds(nbytes, x.gpu_id)

