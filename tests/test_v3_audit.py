"""Lab 13's audit of the prediction (common.systems.v3.audit) and the kit its layer exercise builds from
(common.systems.v3.kit): the judgement calls move what they should, the bands hold their central values, the
effective DeepEP bandwidth is the model's bytes over the trace's transfer time, the mixed-peak MFU is the FP8 one
rescaled, and the alternative kernel rates are the published ones divided by their stated speed-ups."""
import json

import pytest

from common.core.env import REPO_ROOT
from common.facts import hardware
from common.systems.v3 import audit, kernel_rates, kernels as v3kernels, kit as v3kit, model as v3model


def test_target_and_judgement_calls():
    assert audit.in_target(0.8) and audit.in_target(1.25) and not audit.in_target(0.79)
    band = audit.trace_ratio_band()
    assert band["low"] <= band["central"] <= band["high"] and len(band["rows"]) == len(audit.JUDGEMENT_CALLS)
    by = {name: ratio for name, _, ratio in band["rows"]}
    assert by["no Q/K assembly"] < band["central"] < by["CUTLASS kernels"]   # fewer kernels; slower GEMMs
    with pytest.raises(ValueError, match="not a judgement call"):
        audit.with_call(v3model.defaults(), "nope")


def test_deepep_effective_bandwidth_is_bytes_over_the_traced_transfer_time():
    bw = audit.deepep_effective_gbps()
    assert bw["all"] == pytest.approx(bw["gb"] / (bw["ms"] * 1e-3))
    assert 20 < bw["dispatch"] < bw["combine"] < v3model.fact("deepep_ep64_dispatch_gbs")
    x = audit.at_trace_bandwidth(v3model.defaults())
    s = v3model.setup(x)
    assert s.dispatch_gbs == pytest.approx(bw["dispatch"], abs=0.01) and s.combine_gbs == pytest.approx(
        bw["combine"], abs=0.01) and x.ib_gbs == v3model.defaults().ib_gbs   # PP and ZeRO-1 keep the IB figure


def test_waterfall_bands_hold_their_central_values():
    bands = audit.waterfall_bands()
    for term, value, lo, hi, lo_by, hi_by in bands["terms"]:
        assert lo <= value + 1e-9 and hi >= value - 1e-9, term
    assert bands["terms"][0][2] == bands["terms"][0][3]   # the trace's own pair: measured, no band
    ep = next(t for t in bands["terms"] if t[0].startswith("EP imbalance"))
    assert ep[2] == 0.0 and ep[4] == "perfect balance"
    total, lo, hi = bands["total"]
    assert lo <= total <= hi and bands["unexplained"][1] <= bands["unexplained"][0] <= bands["unexplained"][2]


def test_mixed_peak_mfu_and_the_identity():
    pred = v3model.predict()
    comps = v3model.forward_flops_per_token()
    f8 = sum(f for _, p, f in comps if p == "fp8")
    f16 = sum(f for _, p, f in comps if p == "bf16")
    p8, p16 = (hardware.peak_tflops(pred.inputs.gpu_id, p) for p in ("fp8", "bf16"))
    assert audit.mfu_mixed_peak(pred) == pytest.approx(pred.mfu_fp8 * p8 / ((f8 + f16) / (f8 / p8 + f16 / p16)))
    assert audit.mfu_mixed_peak(pred) > pred.mfu_fp8
    rc = audit.reconcile()
    assert rc["scaled"] == pytest.approx(rc["waterfall"] * rc["ratio"]) and abs(rc["rest"]) < 0.02


def test_provenance_rows_are_marked():
    rows = audit.provenance()
    assert len(rows) <= 20 and {r["kind"] for r in rows} == {"earned", "in-sample", "assumed"}
    assert audit.short_source("A very long title of a report about many things (https://x, 2024)", 20) == \
        "A very long title ..."


def test_cutlass_rates_are_the_published_ones_over_their_stated_speedups():
    rates = json.loads((REPO_ROOT / "data" / "kernel_rates.json").read_text())
    row = rates["deepgemm_fp8"]["normal"][15]                     # 4096 x 7168 x 16384: 1358 TFLOP/s, 1.2x
    new = kernel_rates.gemm_rate(*row[:3])
    old = kernel_rates.gemm_rate(*row[:3], generation="cutlass")
    assert new.tflops == row[3] and old.tflops == pytest.approx(row[3] / row[5])
    w = kernel_rates.gemm_rate(4096, 7168, 2048, "wgrad")
    assert kernel_rates.gemm_rate(4096, 7168, 2048, "wgrad", generation="cutlass").tflops == pytest.approx(
        w.tflops / rates["deepgemm_wgrad"]["speedup_vs_internal_cutlass"])
    assert kernel_rates.bf16_gemm_rate(4096, 7168, 7168, efficiency=0.75).tflops == pytest.approx(
        0.75 * hardware.peak_tflops("H800-SXM", "bf16"))
    with pytest.raises(ValueError, match="generation='v2'"):
        kernel_rates.gemm_rate(64, 64, 64, generation="v2")
    with pytest.raises(ValueError, match="efficiency=1.5"):
        kernel_rates.bf16_gemm_rate(64, 64, 64, efficiency=1.5)


def test_kit_and_the_qk_judgement_call():
    cfg = v3model.config()
    s = v3kernels.Setup()
    kit = v3kit.Kit(cfg, s)
    assert kit.sm_share == pytest.approx(112 / 132) and kit.peak_tflops("bf16", sparse=True) == 2 * kit.peak_tflops()
    assert 0 < kit.bf16_efficiency(4096, 256, 7168, "dgrad") < 1 and kit.memory_bytes["backward"] > \
        kit.memory_bytes["forward"] > 0
    with pytest.raises(ValueError, match="kind='bwd'"):
        kit.bf16_efficiency(1, 1, 1, "bwd")
    without = v3kit.layer_seconds(cfg, v3kernels.Setup(qk_assembly=False))
    assert without["forward"] < v3kit.layer_seconds(cfg, s)["forward"]
