"""What lab 13's layer-model exercise (13.2) is checked on: the cases (configs and runs), and the learner's formula
written once with each likely mistake a switch, so a wrong answer is named by the mistake whose numbers it gives.
`reference(cfg, tokens, kit)` with no switch equals `common.systems.v3.kit.layer_seconds` (tests/test_exercises_lab13).
"""
from __future__ import annotations

from common.systems.v3 import kernels as v3kernels

MISTAKES = {
    "sparse_peak": "the BF16 GEMMs at the SPARSE peak: NVIDIA's headline figure assumes 2:4 sparsity; dense is half",
    "fp8_for_bf16": "the router's BF16 GEMMs at DeepGEMM's FP8 rate: they run in BF16, at bf16_efficiency x the BF16 peak",
    "all_sms": "every kernel on all 132 SMs: while DeepEP runs, compute gets kit.sm_share of them",
    "comm_sms": "compute on DeepEP's share of the SMs (1 - sm_share): compute gets kit.sm_share, DeepEP the rest",
    "one_flop_per_mac": "one FLOP per multiply-add: a GEMM does 2 m n k FLOPs",
    "no_recompute": "the backward misses the recomputed up-projections (q_b and kv_b run forward again)",
    "no_wgrad": "the backward has the dgrads but no weight gradients: each linear layer runs a wgrad GEMM too",
    "attention_bwd_flops": "attention's backward at its forward FLOPs: FlashAttention's backward does 2.5x",
    "not_causal": "attention without the causal mask: causal attention computes half of the s x s scores",
    "attention_bwd_rate": "attention's backward at the forward rate: FlashAttention-3's backward has its own",
    "rows_per_group": "each expert given all T x k routed rows: a GPU's T x k rows are split over its E / ep experts",
    "no_shared": "the shared expert left out: every token goes through it",
    "no_router": "the router left out (a BF16 GEMM of hidden x experts per token, three ways)",
    "no_memory": "the memory-bound kernels left out: kit.memory_bytes over the HBM bandwidth",
    "hbm_in_gb": "the memory-bound bytes over hbm_tbs x 1e9: hbm_tbs is in TB/s (x 1e12)",
    "split_gate_up": "gate and up as two GEMMs of N = moe_intermediate: DeepSeek runs them as one of 2 x that",
}


def reference(cfg, tokens, kit, **mistake) -> dict:
    """One MoE layer's compute {forward, backward} in seconds, from the kit's rates; a keyword of MISTAKES set True
    makes that mistake."""
    unknown = set(mistake) - set(MISTAKES)
    if unknown:
        raise ValueError(f"unknown mistakes {sorted(unknown)}; known: {', '.join(MISTAKES)}")
    on = lambda name: bool(mistake.get(name))  # noqa: E731
    h, nh, E, top = cfg["hidden_size"], cfg["num_attention_heads"], cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    qr, kvr, rope = cfg["q_lora_rank"], cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    dq, dkv, vd = cfg["qk_nope_head_dim"] + rope, cfg["qk_nope_head_dim"] + cfg["v_head_dim"], cfg["v_head_dim"]
    inter, shared, T, groups = cfg["moe_intermediate_size"], cfg["n_shared_experts"], tokens, E // kit.ep
    share = 1.0 if on("all_sms") else (1 - kit.sm_share if on("comm_sms") else kit.sm_share)
    flop = 1 if on("one_flop_per_mac") else 2

    def gemm(m, n, k, kind, g=1):
        return flop * m * n * k * g / (kit.gemm_tflops(m, n, k, kind, g) * share * 1e12)

    rows = T * top if on("rows_per_group") else T * top / groups
    layers = [(T, qr, h, 1), (T, kvr + rope, h, 1), (T, nh * dq, qr, 1), (T, nh * dkv, kvr, 1), (T, h, nh * vd, 1)]
    ffns = ([] if on("no_shared") else [(T, inter * shared, 1)]) + [(rows, inter, groups)]
    for m, f, g in ffns:
        ups = [(m, f, h, g)] * 2 if on("split_gate_up") else [(m, 2 * f, h, g)]
        layers += ups + [(m, h, f, g)]
    fwd = bwd = 0.0
    for m, n, k, g in layers:
        fwd += gemm(m, n, k, "fwd", g)
        bwd += gemm(m, n, k, "dgrad", g) + (0.0 if on("no_wgrad") else gemm(m, n, k, "wgrad", g))
    if not on("no_recompute"):
        bwd += gemm(T, nh * dq, qr, "fwd") + gemm(T, nh * dkv, kvr, "fwd")
    if not on("no_router"):
        def bf16(kind):
            if on("fp8_for_bf16"):
                return gemm(T, E, h, kind)
            rate = kit.bf16_efficiency(T, E, h, kind) * kit.peak_tflops("bf16", sparse=on("sparse_peak"))
            return flop * T * E * h / (rate * share * 1e12)
        fwd += bf16("fwd")
        bwd += bf16("dgrad") + bf16("wgrad")
    att = T * kit.seq * nh * (dq + vd) * (2 if on("not_causal") else 1)
    fwd += att / (kit.attention_tflops("forward") * share * 1e12)
    bwd += (1.0 if on("attention_bwd_flops") else 2.5) * att / (
        kit.attention_tflops("forward" if on("attention_bwd_rate") else "backward") * share * 1e12)
    if not on("no_memory"):
        unit = 1e9 if on("hbm_in_gb") else 1e12
        fwd += kit.memory_bytes["forward"] / (kit.hbm_tbs * unit)
        bwd += kit.memory_bytes["backward"] / (kit.hbm_tbs * unit)
    return {"forward": fwd, "backward": bwd}


def cases(cfg0, rng) -> list:
    """[(cfg, Setup, is_random)]: V3 as run; two sequences; other SM splits and the BF16 range's high end; a config
    with three distinct head sizes, two shared experts and 8 experts per GPU on the trace's CUTLASS kernels; a random
    one."""
    other = cfg0.replace(hidden_size=4096, moe_intermediate_size=1408, num_experts_per_tok=6, n_routed_experts=64,
                         n_shared_experts=2, q_lora_rank=768, kv_lora_rank=384, num_attention_heads=32,
                         num_key_value_heads=32, qk_nope_head_dim=96, qk_rope_head_dim=32, v_head_dim=160)
    heads = rng.choice([16, 48])
    rand = cfg0.replace(hidden_size=rng.choice([2048, 3072, 5120]), moe_intermediate_size=rng.choice([768, 1536]),
                        num_experts_per_tok=rng.choice([4, 6]), n_routed_experts=rng.choice([64, 128]),
                        num_attention_heads=heads, num_key_value_heads=heads, qk_nope_head_dim=rng.choice([64, 96]))
    return [(cfg0, v3kernels.Setup(), False), (cfg0, v3kernels.Setup(tokens=8192), False),
            (cfg0, v3kernels.Setup(comm_sms=32, bf16_efficiency=0.75), False),
            (other, v3kernels.Setup(ep=8, kernels="cutlass"), False),
            (rand, v3kernels.Setup(tokens=rng.choice([4096, 12288]), ep=rng.choice([16, 32]),
                                   comm_sms=rng.choice([16, 24])), True)]
