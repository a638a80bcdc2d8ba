"""Checkers for lab 13 (DeepSeek-V3 from first principles): the FLOPs of one MoE layer from the config (13.1), one
MoE layer's forward and backward time from the published rates (13.2, the build exercise), the exposed all-to-all
time of a chunk (13.3), GPU-hours per trillion tokens from a step time (13.4).

Each checker starts with fixed, asymmetric cases (no two mistakes give the same number), then random cases from a
fresh seed that a failure prints."""
from __future__ import annotations

from common.core.checks import checker, expect, expect_close, fail, near
from common.exercises import layer_model
from common.exercises.cases import as_number, learner_call, replayable
from common.systems.v3 import kit as v3kit, model as v3model

NUMBER = "one number (a float)"


# ---------------------------------------------------------------- 13.1

def moe_layer_parts(cfg) -> dict:
    """Forward FLOPs per token of one MoE layer's GEMMs, by part, from v3model.forward_flops_per_token."""
    comps = {name: f for name, _, f in v3model.forward_flops_per_token(cfg)}
    layers = cfg["num_hidden_layers"] + cfg["num_nextn_predict_layers"]
    moe_layers = cfg.moe_layers + cfg["num_nextn_predict_layers"]
    return {"mla": comps["MLA projections"] / layers, "shared": comps["shared expert"] / moe_layers,
            "routed": comps["8 routed experts"] / moe_layers, "router": comps["router"] / moe_layers}


def _configs(rng):
    base = v3model.config()
    # V3's own heads have qk_nope = v_head = 128, so a swap of those two would pass on it alone: the second fixed
    # config and the random ones give the three head sizes three different values
    fixed = [base,
             base.replace(hidden_size=4096, moe_intermediate_size=1408, num_experts_per_tok=6, n_routed_experts=64,
                          n_shared_experts=2, q_lora_rank=768, kv_lora_rank=384, num_attention_heads=32,
                          num_key_value_heads=32, qk_nope_head_dim=96, qk_rope_head_dim=32, v_head_dim=160)]
    heads = [rng.choice([16, 40, 96]) for _ in range(3)]
    dims = [rng.sample([32, 48, 64, 96, 128, 192], 3) for _ in range(3)]
    rand = [base.replace(hidden_size=rng.choice([1024, 2048, 3072, 5120]),
                         moe_intermediate_size=rng.choice([512, 768, 1536]), num_experts_per_tok=rng.choice([2, 4, 6]),
                         n_routed_experts=rng.choice([32, 64, 160]), n_shared_experts=rng.choice([1, 2, 3]),
                         q_lora_rank=rng.choice([256, 1024]), kv_lora_rank=rng.choice([128, 256]),
                         num_attention_heads=nh, num_key_value_heads=nh, qk_nope_head_dim=d[0], qk_rope_head_dim=d[1],
                         v_head_dim=d[2]) for nh, d in zip(heads, dims)]
    return fixed, rand


def mla_flops_per_token(cfg, nope=None, rope=None, vd=None) -> float:
    """Forward FLOPs per token of MLA's five projections, with the head sizes overridable (to name a swap)."""
    h, nh, qr, kvr = cfg["hidden_size"], cfg["num_attention_heads"], cfg["q_lora_rank"], cfg["kv_lora_rank"]
    nope = cfg["qk_nope_head_dim"] if nope is None else nope
    rope = cfg["qk_rope_head_dim"] if rope is None else rope
    vd = cfg["v_head_dim"] if vd is None else vd
    return 2 * (h * qr + qr * nh * (nope + rope) + h * (kvr + rope) + kvr * nh * (nope + vd) + nh * vd * h)


@checker("13.1", "forward FLOPs of one MoE layer from the config")
@replayable
def check_moe_layer_flops(moe_layer_flops, cases):
    """moe_layer_flops(cfg, tokens) -> forward FLOPs of one MoE layer's GEMMs for `tokens` tokens: MLA projections
    (q_a, q_b, kv_a, kv_b, output), the shared expert(s) and the top-k routed experts (SwiGLU: 3 matrices each) and
    the router; 2 FLOPs per multiply-add; the attention core (scores) not included."""
    rng = cases.rng
    fixed, rand = _configs(rng)
    cases_ = [(c, t, False) for c, t in zip(fixed, (4096, 1000))] + [(c, rng.choice([1, 512, 3000]), True)
                                                                     for c in rand]
    for cfg, tokens, is_random in cases_:
        p = moe_layer_parts(cfg)
        expected = tokens * sum(p.values())
        k, s = cfg["num_experts_per_tok"], cfg["n_shared_experts"]
        h, inter = cfg["hidden_size"], cfg["moe_intermediate_size"]
        where = (f"moe_layer_flops(cfg with hidden={h}, moe_intermediate={inter}, top_k={k}, shared={s}, "
                 f"experts={cfg['n_routed_experts']}, tokens={tokens}){cases.tag(is_random)}")
        got = as_number(learner_call(moe_layer_flops, (cfg, tokens), where, (v3model.forward_flops_per_token,),
                                     library=True), where, NUMBER)
        one_expert = p["routed"] / k
        mistakes = [
            (expected / 2, "counts one FLOP per multiply-add; a GEMM does 2 (multiply and add) per weight and token"),
            (expected * 3, "is the forward + backward (training) count; the question asks for the forward pass"),
            (expected - tokens * p["shared"], "leaves out the shared expert(s): every token also goes through them"),
            (expected - tokens * p["router"], "leaves out the router (hidden x experts scores per token)"),
            (expected - tokens * p["mla"], "leaves out the MLA projections (q_a, q_b, kv_a, kv_b, output)"),
            (expected + tokens * (cfg["n_routed_experts"] - k) * one_expert,
             "runs every routed expert on every token; a token only visits its top-k experts"),
            (expected - tokens * (p["routed"] + p["shared"]) / 3,
             "counts 2 matrices per expert; a SwiGLU expert has 3 (gate, up and down)"),
        ]
        nope, rope, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
        for a, b_, c, why in [(rope, nope, vd, "qk_nope_head_dim and qk_rope_head_dim"),
                              (vd, rope, nope, "qk_nope_head_dim and v_head_dim"),
                              (nope, vd, rope, "qk_rope_head_dim and v_head_dim")]:
            swapped = expected - tokens * (p["mla"] - mla_flops_per_token(cfg, a, b_, c))
            mistakes.append((swapped, f"swaps {why} in the MLA projections (q_b: heads x (nope + rope), kv_a: "
                                      f"kv_lora_rank + rope, kv_b: heads x (nope + v), output: heads x v)"))
        for value, why in mistakes:
            if near(got, value, 1e-9) and not near(got, expected, 1e-9):
                fail(f"{where} = {got:.10g}: that {why} (expected {expected:.10g})")
        expect_close(got, expected, where, rtol=1e-9, atol=0.0)
    return f"right for {len(cases_)} configs, head sizes swapped and not"


# ---------------------------------------------------------------- 13.3

@checker("13.3", "exposed all-to-all time of a chunk")
@replayable
def check_exposed_all_to_all(exposed_all_to_all, cases):
    """exposed_all_to_all(F, B, comm_F, comm_B, overlapped) -> seconds of all-to-all left on the critical path:
    alone (overlapped=False) a chunk waits for its own dispatch/combine; in a DualPipe F&B pair (overlapped=True) each
    chunk's all-to-all runs beside the other chunk's compute, so only what exceeds F + B stays exposed."""
    rng = cases.rng
    cases_ = [(0.022, 0.046, 0.023, 0.023, True, False), (0.022, 0.046, 0.023, 0.023, False, False),
              (0.010, 0.021, 0.030, 0.025, True, False), (0.010, 0.021, 0.030, 0.025, False, False),
              (0.010, 0.030, 0.045, 0.005, True, False)]  # own-compute, crosswise and right hiding all differ
    for _ in range(4):
        cases_.append((rng.uniform(0.005, 0.05), rng.uniform(0.01, 0.1), rng.uniform(0.001, 0.08),
                      rng.uniform(0.001, 0.08), rng.random() < 0.5, True))
    ambiguous = ""
    for F, B, cf, cb, ov, is_random in cases_:
        expected = v3model.exposed(cf + cb, F + B) if ov else cf + cb
        where = (f"exposed_all_to_all(F={F:.6g}, B={B:.6g}, comm_F={cf:.6g}, comm_B={cb:.6g}, overlapped={ov})"
                 f"{cases.tag(is_random)}")
        got = as_number(learner_call(exposed_all_to_all, (F, B, cf, cb, ov), where, (v3model.exposed,), library=True),
                        where, NUMBER)
        larger = max(cf, cb)
        if ov and near(got, v3model.exposed(larger, F + B)) and not near(expected, got):
            fail(f"{where} = {got:.6g}: you took the larger of the two all-to-alls, as if they ran at once; the "
                 f"dispatch and the combine run one after the other -- sum them (expected {expected:.6g})")
        if near(got, 1e3 * expected) and expected > 0:
            fail(f"{where} = {got:.6g}: milliseconds; the times are in seconds (expected {expected:.6g})")
        if ov:
            if got < 0:
                fail(f"{where} = {got:.6g}: negative -- when compute outlasts the all-to-all nothing is exposed "
                     f"(clamp at 0)")
            if near(got, cf + cb) and not near(expected, cf + cb):
                fail(f"{where} = {got:.6g}: no overlap counted; in an F&B pair the all-to-all runs beside the other "
                     f"chunk's compute (expected {expected:.6g})")
            if near(got, max(cf + cb, F + B)) and not near(expected, got):
                fail(f"{where} = {got:.6g}: that is the pair's time, max(compute, communication); the exposed part "
                     f"is what communication adds beyond the compute (expected {expected:.6g})")
            own = max(0.0, cf - F) + max(0.0, cb - B)
            cross = max(0.0, cf - B) + max(0.0, cb - F)
            pair = (f"in the pair both passes' compute (F + B) runs beside both all-to-alls: "
                    f"max(0, comm_F + comm_B - (F + B)) = {expected:.6g}")
            if near(got, own) and near(got, cross) and not near(expected, got):  # a later case tells them apart
                ambiguous = ambiguous or (f"{where} = {got:.6g}: you hid each pass's all-to-all behind ONE pass's "
                                          f"compute (its own or the other's: both give this number); {pair}")
                continue
            if near(got, cross) and not near(expected, cross):
                fail(f"{where} = {got:.6g}: you hid each pass's all-to-all behind the other pass's compute separately "
                     f"(comm_F behind B, comm_B behind F); {pair}")
            if near(got, own) and not near(expected, own):
                fail(f"{where} = {got:.6g}: you hid each chunk's all-to-all behind its own compute; it needs the "
                     f"other chunk's (its own compute waits for the dispatched tokens) (expected {expected:.6g})")
        else:
            if near(got, v3model.exposed(cf + cb, F + B)) and not near(expected, got):
                fail(f"{where} = {got:.6g}: a chunk alone has nothing to overlap with; its all-to-all is all "
                     f"exposed (expected {expected:.6g})")
            if near(got, cf) or near(got, cb):
                if not near(expected, got):
                    fail(f"{where} = {got:.6g}: count both passes' all-to-all (forward and backward)")
        expect_close(got, expected, where, rtol=1e-9, atol=1e-15)
    if ambiguous:
        fail(ambiguous)
    return "alone: comm_F + comm_B; in an F&B pair: max(0, comm_F + comm_B - (F + B))"


# ---------------------------------------------------------------- 13.4

@checker("13.4", "GPU-hours per trillion tokens from a step time")
@replayable
def check_gpu_hours(gpu_hours_per_t_tokens, cases):
    """gpu_hours_per_t_tokens(step_seconds, gpus, tokens_per_step) -> GPU-hours one trillion tokens takes."""
    rng = cases.rng
    cases_ = [(9.99, 2048, 15360 * 4096, False), (3.0, 1024, 3072 * 4096, False), (20.0, 512, 8e6, False)]
    for _ in range(4):
        cases_.append((rng.uniform(0.5, 60), rng.choice([64, 256, 1000, 2048, 16384]), rng.uniform(1e6, 1e8), True))
    for step, gpus, tokens, is_random in cases_:
        expected = v3model.gpu_hours_per_t_tokens(step, gpus, tokens)
        where = f"gpu_hours_per_t_tokens({step:.6g}, {gpus}, {tokens:.6g}){cases.tag(is_random)}"
        got = as_number(learner_call(gpu_hours_per_t_tokens, (step, gpus, tokens), where,
                                     (v3model.gpu_hours_per_t_tokens,), library=True), where, NUMBER)
        for value, why in [(expected * 3600, "that is GPU-seconds; divide by 3600 for GPU-hours"),
                           (expected / gpus, "that is wall-clock hours; multiply by the number of GPUs"),
                           (expected / 1e12, "that is per token; the question asks per trillion tokens"),
                           (expected / 24, "that is GPU-days; the question asks for GPU-hours")]:
            if near(got, value) and not near(got, expected):
                fail(f"{where} = {got:.6g}: {why} (expected {expected:.6g})")
        expect(got > 0, f"{where} = {got:.6g}: GPU-hours are positive")
        expect_close(got, expected, where, rtol=1e-9, atol=0.0)
    return "step x GPUs / 3600 x (1e12 / tokens per step): DeepSeek's 180K means ~20 s steps would be needed"


# ---------------------------------------------------------------- 13.2 (the build exercise)

@checker("13.2", "one MoE layer's forward and backward from the published rates")
@replayable
def check_layer_seconds(layer_seconds, cases):
    """layer_seconds(cfg, tokens, kit) -> {"forward": s, "backward": s}: one MoE layer's compute on one GPU -- every
    GEMM of its linear layers forward, dgrad and wgrad at DeepGEMM's rates on the SMs DeepEP leaves, the recomputed
    up-projections, the router in BF16, causal attention at FlashAttention-3's rates, the memory-bound bytes over
    HBM -- as the lab's kernel model sums it (DeepEP's all-to-all left out)."""
    cfg0 = v3model.config()
    for i, (cfg, setup, is_random) in enumerate(layer_model.cases(cfg0, cases.rng)):
        kit = v3kit.Kit(cfg, setup)
        where = (f"layer_seconds(cfg with hidden={cfg['hidden_size']}, heads={cfg['num_attention_heads']}, "
                 f"experts={cfg['n_routed_experts']}, tokens={setup.tokens}, kit: EP{setup.ep}, "
                 f"{kit.sm_share * 132:.0f} of 132 SMs, {setup.kernels} kernels"
                 f"{', BF16 at %g' % setup.bf16_efficiency if setup.bf16_efficiency else ''}){cases.tag(is_random)}")
        got = learner_call(layer_seconds, (cfg, setup.tokens, kit), where, (v3kit.layer_seconds,),
                           expected='{"forward": seconds, "backward": seconds}', library=True,
                           allowed=("common.systems.v3.kit.Kit",))  # the kit's rates are what the exercise hands
        expect(isinstance(got, dict) and set(got) >= {"forward", "backward"},
               f"{where} returned {got!r:.80}; return a dict with 'forward' and 'backward' (seconds)")
        f, b = (as_number(got[d], f"{where}['{d}']", "seconds") for d in ("forward", "backward"))
        want = v3kit.layer_seconds(cfg, setup)
        if near(f, want["forward"], 1e-9) and near(b, want["backward"], 1e-9):
            continue
        if near(f, b, 1e-9) and not near(want["forward"], want["backward"], 1e-3):
            fail(f"{where}: backward = forward ({f:.6g} s); a backward runs two GEMMs per linear layer (dgrad and "
                 f"wgrad), recomputes the up-projections and runs attention's backward at 2.5x its forward FLOPs")
        for mistake, why in layer_model.MISTAKES.items():
            alt = layer_model.reference(cfg, setup.tokens, kit, **{mistake: True})
            if near(f, alt["forward"], 1e-6) and near(b, alt["backward"], 1e-6):
                fail(f"{where} = forward {f:.6g} s, backward {b:.6g} s: {why} (expected forward "
                     f"{want['forward']:.6g} s, backward {want['backward']:.6g} s)")
        for d, value in (("forward", f), ("backward", b)):
            expect_close(value, want[d], f"{where}['{d}'] (seconds)", rtol=1e-9, atol=0.0)
    return "every GEMM three ways on 112 SMs, recompute, BF16 router, causal attention, memory bytes: as the lab's model"
