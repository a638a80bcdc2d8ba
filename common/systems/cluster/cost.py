"""A training run's cost, from the model's shape and the run's choices: lab 10's build exercise (this is its
reference).

    model = cost.model_shape("deepseek_v3")     # params, active_params, expert_params, layers, hidden, heads, dims
    run = cost.v3_run()                          # tokens, seq_len, gpus, gpu_id, dtype, mfu, price, tp, pp, ep, ...
    cost.cost_model(model, run)                  # FLOPs, GPU-hours, days, dollars; GB per GPU by kind

What it counts (GB = 1e9 bytes; every figure per GPU except FLOPs, hours and dollars):
- FLOPs per token: 6 x activated parameters (the matmuls, forward and backward) plus causal attention's score and
  value products, 6 x layers x heads x (qk + v head dims) x seq_len / 2 (each token attends to half the sequence
  on average; forward 2 FLOPs per multiply-add, backward twice that). Model FLOPs: recomputation is not counted.
- Time: FLOPs / (dense peak x MFU), in GPU-hours; days on `gpus` GPUs with perfect scaling; dollars per GPU-hour.
- Memory: BF16 weights (2 B) and gradients (2 B), the optimizer's FP32 master copy and Adam's two FP32 moments
  (4 + 4 + 4 = 12 B) per parameter. Dense parameters are split by TP x PP, routed experts by TP x PP x EP; ZeRO
  stage 1 shards the optimizer state over each parameter's data-parallel replicas (DP for dense parameters,
  DP / EP for experts), stage 2 the gradients too, stage 3 the weights too.
- Activations: 34 x hidden bytes per token per layer in BF16 (Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models", section 4.1: s b h (34 + 5 a s / h), the 5as/h attention-score term
  dropped because FlashAttention never stores the scores); with full recomputation only each layer's BF16 input,
  2 x hidden. Split by TP; under 1F1B the first stage holds PP micro-batches of layers / PP each, so a GPU holds
  one micro-batch's activations of all the model's layers (lab 08). A dense layer's formula: an MoE layer keeps
  more (its routed experts' inputs), so for an MoE it is a lower bound.
"""
from __future__ import annotations

from common.core.validate import number, whole
from common.systems.cluster import scaling

WEIGHT_BYTES, GRAD_BYTES, OPTIMIZER_BYTES = 2, 2, 12  # BF16, BF16, FP32 master + Adam m + Adam v
ACT_BYTES_PER_HIDDEN, RECOMPUTE_BYTES_PER_HIDDEN = 34, 2
ZERO_STAGES = (0, 1, 2, 3)
MODEL_KEYS = ("params", "active_params", "expert_params", "layers", "hidden", "heads", "qk_head_dim", "v_head_dim")
RUN_KEYS = ("tokens", "seq_len", "gpus", "gpu_id", "dtype", "mfu", "usd_per_gpu_hour", "tp", "pp", "ep", "zero",
            "recompute", "micro_batch_seqs")
RESULT_KEYS = ("flops_per_token", "flops", "gpu_hours", "days", "cost_usd", "weights_gb", "grads_gb",
               "optimizer_gb", "activations_gb")


def model_shape(name: str) -> dict:
    """The shape a cost model needs of a model in data/models/: published total and activated parameters, the
    routed experts' parameters (lab 06's count), layers, hidden size, attention heads and head dims."""
    from common.facts import models
    cfg = models.load_model_config(name)
    counts = models.count_params(cfg)
    qk = cfg.get("qk_nope_head_dim", 0) + cfg.get("qk_rope_head_dim", 0) or cfg["head_dim"]
    return {"name": cfg.name, "params": float(cfg.published["params_total"]),
            "active_params": float(cfg.published["params_active"]),
            "expert_params": float(counts["breakdown"]["routed_experts"]["total"]),
            "layers": int(cfg["num_hidden_layers"]), "hidden": int(cfg["hidden_size"]),
            "heads": int(cfg["num_attention_heads"]), "qk_head_dim": int(qk),
            "v_head_dim": int(cfg.get("v_head_dim", 0) or cfg["head_dim"])}


def v3_run(mfu: float = 0.2) -> dict:
    """DeepSeek-V3's pre-training as its report states it (data/claims.json): 14.8T tokens of 4,096, 2,048 H800s in
    FP8, PP16 x EP64 x ZeRO-1 DP, no TP, \\$2 per GPU-hour; `mfu` is the one input the report does not state."""
    c = lambda k: scaling.claim("deepseek_v3", k)  # noqa: E731
    return {"tokens": c("train_tokens"), "seq_len": c("sequence_length"), "gpus": c("cluster_gpus"),
            "gpu_id": "H800-SXM", "dtype": "fp8", "mfu": mfu, "usd_per_gpu_hour": c("usd_per_gpu_hour"),
            "tp": c("tensor_parallel"), "pp": c("pipeline_parallel"), "ep": c("expert_parallel"), "zero": 1,
            "recompute": False, "micro_batch_seqs": 1}


def llama3_70b_run(mfu: float = 0.4, gpus: int = 2048, tp: int = 8, pp: int = 4) -> dict:
    """Llama-3-70B's pre-training: 15T tokens of 8,192 on H100s in BF16 (Meta's model card, data/claims.json), on an
    illustrative layout -- the card publishes the GPU-hours, not the GPU count or the parallelism."""
    c = lambda k: scaling.claim("llama3_70b", k)  # noqa: E731
    return {"tokens": c("train_tokens"), "seq_len": c("sequence_length"), "gpus": gpus, "gpu_id": "H100-SXM",
            "dtype": "bf16", "mfu": mfu, "usd_per_gpu_hour": 2.0, "tp": tp, "pp": pp, "ep": 1, "zero": 1,
            "recompute": False, "micro_batch_seqs": 1}


def check_model(model: dict) -> dict:
    missing = [k for k in MODEL_KEYS if k not in model]
    if missing:
        raise ValueError(f"model is missing {', '.join(missing)}; a model has {', '.join(MODEL_KEYS)}")
    for k in ("params", "active_params", "layers", "hidden", "heads", "qk_head_dim", "v_head_dim"):
        number(k, model[k])
    number("expert_params", model["expert_params"], strict=False)
    if not model["active_params"] <= model["params"] or not model["expert_params"] < model["params"]:
        raise ValueError(f"active_params={model['active_params']!r} and expert_params={model['expert_params']!r} "
                         f"must not exceed params={model['params']!r}")
    return model


def data_parallel(run: dict) -> int:
    """The data-parallel degree: GPUs / (TP x PP), which EP must divide."""
    for k in ("gpus", "tp", "pp", "ep"):
        whole(k, run[k])
    if run["gpus"] % (run["tp"] * run["pp"]):
        raise ValueError(f"gpus={run['gpus']} is not a multiple of tp x pp = {run['tp'] * run['pp']}")
    dp = run["gpus"] // (run["tp"] * run["pp"])
    if dp % run["ep"]:
        raise ValueError(f"ep={run['ep']} does not divide the data-parallel degree {dp}: EP groups are carved out "
                         f"of the data-parallel ranks")
    return dp


def check_run(run: dict) -> dict:
    missing = [k for k in RUN_KEYS if k not in run]
    if missing:
        raise ValueError(f"run is missing {', '.join(missing)}; a run has {', '.join(RUN_KEYS)}")
    for k in ("tokens", "seq_len", "usd_per_gpu_hour"):
        number(k, run[k])
    whole("micro_batch_seqs", run["micro_batch_seqs"])
    scaling.check_mfu(run["mfu"])
    scaling.peak_tflops(run["gpu_id"], run["dtype"])
    if run["zero"] not in ZERO_STAGES:
        raise ValueError(f"zero={run['zero']!r} is not a ZeRO stage; allowed: {', '.join(map(str, ZERO_STAGES))}")
    data_parallel(run)
    return run


def attention_flops_per_token(model: dict, seq_len: float) -> float:
    """Training FLOPs per token of causal attention's two products (scores and values), all layers."""
    return 3 * model["layers"] * model["heads"] * (model["qk_head_dim"] + model["v_head_dim"]) * seq_len


def cost_model(model: dict, run: dict) -> dict:
    """FLOPs, GPU-hours, days and dollars of a training run, and GB per GPU of weights, gradients, optimizer state
    and activations (see the module docstring)."""
    check_model(model)
    check_run(run)
    per_token = 6 * model["active_params"] + attention_flops_per_token(model, run["seq_len"])
    flops = per_token * run["tokens"]
    hours = flops / (scaling.peak_tflops(run["gpu_id"], run["dtype"]) * 1e12 * run["mfu"]) / 3600
    dp = data_parallel(run)
    tp, pp, ep, zero = run["tp"], run["pp"], run["ep"], run["zero"]
    dense = (model["params"] - model["expert_params"]) / (tp * pp)
    experts = model["expert_params"] / (tp * pp * ep)

    def gb(bytes_per_param, sharded):
        return bytes_per_param * (dense / dp + experts / (dp // ep) if sharded else dense + experts) / 1e9

    act = (RECOMPUTE_BYTES_PER_HIDDEN if run["recompute"] else ACT_BYTES_PER_HIDDEN) * model["hidden"]
    return {"flops_per_token": per_token, "flops": flops, "gpu_hours": hours, "days": hours / run["gpus"] / 24,
            "cost_usd": hours * run["usd_per_gpu_hour"], "weights_gb": gb(WEIGHT_BYTES, zero >= 3),
            "grads_gb": gb(GRAD_BYTES, zero >= 2), "optimizer_gb": gb(OPTIMIZER_BYTES, zero >= 1),
            "activations_gb": run["micro_batch_seqs"] * run["seq_len"] * model["layers"] * act / tp / 1e9}


def total_gb(result: dict) -> float:
    """GB per GPU of everything the cost model counts."""
    return sum(result[k] for k in ("weights_gb", "grads_gb", "optimizer_gb", "activations_gb"))


def mfu_for_hours(model: dict, run: dict, gpu_hours: float) -> float:
    """The MFU at which `run` takes `gpu_hours` GPU-hours (the run's own MFU ignored)."""
    at_peak = cost_model(model, {**run, "mfu": 1.0})["gpu_hours"]
    return at_peak / number("gpu_hours", gpu_hours)
