"""Lab 13's kernel-level model: published rates by shape (kernel_rates), the kernels of a layer (v3kernels), the F&B
pair and stages (v3step), and the comparison with DeepSeek's trace and the road to 180K (v3waterfall)."""
import math

import pytest

from common.parallel import pipeline
from common.systems.v3 import kernel_rates as kr, kernels as v3kernels, model as v3model, step as v3step, trace as deepseek_trace, waterfall as v3waterfall


# ---------------------------------------------------------------- rates

def test_exact_rows_and_the_nearest_rule():
    r = kr.gemm_rate(4096, 7168, 16384)
    assert (r.tflops, r.distance, r.table) == (1358, 0, "normal")
    g = kr.gemm_rate(8192, 4096, 7168, groups=4)
    assert (g.tflops, g.table) == (1297, "grouped_contiguous")
    near = kr.gemm_rate(4096, 1536, 7168)             # q_a alone: the fused q_a + kv_a row (N 2112)
    assert near.row[:3] == (4096, 2112, 7168) and near.distance == pytest.approx(math.log2(2112 / 1536))


def test_dgrad_and_wgrad_map_onto_the_tables():
    # dgrad of Y[M,N] = X[M,K] W[N,K]^T is a forward-kind GEMM of shape (M, K, N)
    assert kr.gemm_rate(4096, 16384, 7168, "dgrad").row[:3] == (4096, 7168, 16384)
    # wgrad: the weight-gradient table, keyed by (K, N, tokens)
    w = kr.gemm_rate(4096, 7168, 16384, "wgrad")
    assert (w.table, w.row[:3], w.tflops) == ("wgrad dense", (16384, 7168, 4096), 994)
    wg = kr.gemm_rate(8192, 4096, 7168, "wgrad", groups=4)
    assert (wg.table, wg.tflops) == ("wgrad grouped", 1044)


def test_sm_share_and_other_gpus_scale_the_rate():
    assert kr.gemm_rate(4096, 7168, 16384, sm_share=112 / 132).tflops == pytest.approx(1358 * 112 / 132)
    scale = kr.peak_scale("GB200", "fp8")
    assert scale > 2 and kr.gemm_rate(4096, 7168, 16384, gpu_id="GB200").tflops == pytest.approx(1358 * scale)
    sec, rate = kr.gemm_seconds(4096, 7168, 16384)
    assert sec == pytest.approx(2 * 4096 * 7168 * 16384 / (1358e12))
    bf = kr.bf16_gemm_rate(4096, 7168, 16384)
    assert bf.tflops == pytest.approx(989.5 * 1358 / 1979)
    assert kr.hbm_seconds(3.35e12) == pytest.approx(1.0)


def test_attention_rates():
    fwd = kr.attention_rate("forward", 4096)
    assert fwd.tflops == 579 and fwd.row == (4096,)
    assert kr.attention_rate("forward", 4096, causal=False).tflops == 638
    bwd = kr.attention_rate("backward", 4096)
    assert bwd.tflops == pytest.approx(542 * 579 / 638)
    assert kr.attention_rate("backward", 4096, causal=False).tflops == 542
    assert kr.attention_rate("forward", 5000).row == (4096,)          # nearest tabled length
    # FlashAttention's count: 2 s^2 h (d_qk + d_v), halved causal, backward 2.5x
    f = kr.attention_flops(4096, 128, 192, 128)
    assert f == 4096 ** 2 * 128 * 320 and kr.attention_flops(4096, 128, 192, 128, direction="backward") == 2.5 * f


@pytest.mark.parametrize("call, match", [
    (lambda: kr.gemm_rate(0, 1, 1), "m=0"),
    (lambda: kr.gemm_rate(1, 1, 1, kind="bwd"), "kind='bwd'"),
    (lambda: kr.gemm_rate(1, 1, 1, sm_share=1.5), "sm_share=1.5"),
    (lambda: kr.attention_rate("sideways", 4096), "direction='sideways'"),
    (lambda: kr.attention_rate("forward", 4096, head_dim=96), "head_dim=96"),
    (lambda: kr.hbm_seconds(-1), "nbytes=-1"),
    (lambda: kr.source("nope"), "not a source"),
])
def test_rates_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ---------------------------------------------------------------- kernels of a layer

def test_moe_layer_flops_match_the_config():
    cfg = v3model.config()
    ks = v3kernels.moe_layer(cfg, v3kernels.Setup())
    fwd = sum(k.flops for k in ks if k.phase in ("attn(F)", "mlp(F)") and k.cls.endswith("gemm"))
    per_token = {n: f for n, _, f in v3model.forward_flops_per_token(cfg)}
    layers = cfg["num_hidden_layers"] + cfg["num_nextn_predict_layers"]
    moe_layers = cfg.moe_layers + cfg["num_nextn_predict_layers"]
    expect = 4096 * (per_token["MLA projections"] / layers + (per_token["shared expert"] + per_token["8 routed experts"]
                                                              + per_token["router"]) / moe_layers)
    assert fwd == pytest.approx(expect)
    # backward GEMMs: dgrad + wgrad (2x forward) + the recomputed up-projections
    bwd = sum(k.flops for k in ks if k.phase in ("mlp(B)", "mlp(W)", "attn(B)", "attn(W)") and k.cls.endswith("gemm"))
    rec = sum(k.flops for k in ks if "recompute" in k.name)
    assert bwd == pytest.approx(2 * fwd + rec)
    attn = [k for k in ks if k.cls == "attention_fwd"]
    assert attn[0].flops == pytest.approx(4096 * per_token["attention core (causal)"] / layers)
    for k in ks:
        assert k.seconds >= 0 and (k.flops > 0 or k.bytes > 0), k.name


def test_setup_changes_move_the_kernels():
    cfg = v3model.config()
    base = v3kernels.by_class(v3kernels.moe_layer(cfg, v3kernels.Setup()))
    slow = v3kernels.by_class(v3kernels.moe_layer(cfg, v3kernels.Setup(hbm_efficiency=0.5)))
    assert slow["quantize"] == pytest.approx(2 * base["quantize"]) and slow["fp8_gemm"] == base["fp8_gemm"]
    skew = v3kernels.by_class(v3kernels.moe_layer(cfg, v3kernels.Setup(rows_factor=1.1)))
    assert skew["grouped_gemm"] > base["grouped_gemm"] and skew["attention_fwd"] == base["attention_fwd"]
    alone = v3kernels.Setup(overlap=False)
    assert alone.sm_share == 1.0 and v3kernels.Setup().sm_share == pytest.approx(112 / 132)
    assert not [k for k in v3kernels.moe_layer(cfg, v3kernels.Setup(ep=1)) if k.cls.startswith("deepep")]
    assert v3kernels.by_phase(v3kernels.dense_layer(cfg))["dispatch(F)"] == 0
    with pytest.raises(ValueError, match="whole sequences"):
        v3kernels.moe_layer(cfg, v3kernels.Setup(tokens=1000))
    with pytest.raises(ValueError, match="hbm_efficiency"):
        v3kernels.moe_layer(cfg, v3kernels.Setup(hbm_efficiency=0))


# ---------------------------------------------------------------- the pair, stages

def blk(attn_f=1.0, mlp_f=1.0, mlp_b=1.0, mlp_w=1.0, attn_b=1.0, attn_w=1.0, comm=0.0, kind="moe"):
    ph = {"attn(F)": attn_f, "mlp(F)": mlp_f, "mlp(B)": mlp_b, "mlp(W)": mlp_w, "attn(B)": attn_b, "attn(W)": attn_w,
          "dispatch(F)": comm, "combine(F)": comm, "dispatch(B)": comm, "combine(B)": comm}
    return v3step.Block(kind, tuple(ph.items()))


def test_pair_hides_what_fits_and_waits_for_what_does_not():
    b = blk()
    assert v3step.pair([b] * 4, [b] * 4).step == pytest.approx(24.0)         # no communication: compute only
    small = blk(comm=0.5)
    assert v3step.pair([small] * 4, [small] * 4).step == pytest.approx(24.0)  # hidden behind the other chunk
    # a huge all-to-all: mlp(F) must wait for dispatch(F), attn(B) for dispatch(B)
    big = blk(comm=10.0)
    p = v3step.pair([big], [big])
    spans = {ph: (s, e) for res, ph, i, s, e in p.spans}
    assert spans["mlp(F)"][0] >= spans["dispatch(F)"][1] and spans["attn(B)"][0] >= spans["dispatch(B)"][1]
    assert p.step > 6 + 10
    assert v3step.lone([big], "F") == pytest.approx(2 + 20) and v3step.lone([big], "W") == 2


def test_stage_plan_and_ranks():
    cfg = v3model.config()
    blocks = v3step.blocks(cfg, v3kernels.Setup())
    plan = v3step.stage_plan(cfg, 16, blocks)
    assert len(plan) == 16 and [b for s in plan for b in s] == v3step.layer_list(cfg) and plan[-1][-1] == "heads"
    one = v3step.stage_plan(cfg, 16, blocks, "1f1b")
    assert len(one) == 16 and [b for s in one for b in s] == v3step.layer_list(cfg)
    ranks = v3step.rank_pairs(plan, blocks)
    assert ranks[0] == pytest.approx(ranks[15])
    assert ranks[3][3] == pytest.approx(v3waterfall.trace_pair().step, rel=0.02)
    d = v3step.durations(ranks, 0.001)
    assert isinstance(d, pipeline.Durations) and d.fb == max(r[3] for r in ranks) and d.comm == 0.001
    with pytest.raises(ValueError, match="pp=15"):
        v3step.stage_plan(cfg, 15, blocks)


# ---------------------------------------------------------------- against the trace

def test_model_meets_the_trace_step_target():
    c = v3waterfall.trace_comparison()
    assert 0.8 <= c["ratio"] <= 1.25                  # ledger v3model.trace_step_ratio
    assert c["trace_ms"] == deepseek_trace.step_ms(deepseek_trace.load_profile())
    rows = {n: (m, t) for n, m, t in c["rows"]}
    for phase in v3step.COMPUTE_ORDER:
        m, t = rows[phase]
        assert 0.7 < m / t < 1.1, phase
    gc = v3waterfall.gemm_comparison()
    grouped = [r for r in gc if r[1].startswith("routed experts") and r[0] in ("mlp(F)", "mlp(B)")]
    assert len(grouped) == 4 and all(0.9 < r[4] / r[5] < 1.1 for r in grouped)


def test_trace_durations_and_waterfall():
    prof = deepseek_trace.load_profile()
    d = v3step.trace_durations(prof)
    assert d.fb == pytest.approx(deepseek_trace.step_ms(prof) / 1e3) and d.W < d.B
    wf = v3waterfall.waterfall(prof)
    assert wf["total_k"] + wf["unexplained_k"] == pytest.approx(180.0)
    assert wf["unexplained_share"] == pytest.approx(wf["unexplained_k"] / 180.0)
    assert wf["terms"][0][1] == pytest.approx(v3model.gpu_hours_per_t_tokens(120 * d.fb, 2048, 15360 * 4096) / 1e3)
    assert all(t[1] >= 0 for t in wf["terms"]) and len(wf["terms"]) == 7
    assert abs(wf["unexplained_share"]) < 0.25
