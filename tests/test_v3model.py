"""The DeepSeek-V3 step-time model: its parts agree with the helpers it is built from and with the report's facts."""
import dataclasses

import pytest

from common.facts import hardware
from common.moe import moe
from common.parallel import pipeline
from common.systems.cluster import topology
from common.systems.v3 import model as v3model, step as v3step


def test_defaults_come_from_data():
    x = v3model.defaults()
    assert (x.gpus, x.pp, x.ep, x.tp, x.comm_sms, x.sms) == (2048, 16, 64, 1, 20, 132)
    assert x.dp == 128 and x.micro_batches == 120 and x.tokens_per_step == 15360 * 4096
    assert x.fp8_efficiency == pytest.approx(1350 / hardware.peak_tflops("H800-SXM", "fp8"))
    assert "arXiv:2412.19437" in v3model.source("comm_sms")
    with pytest.raises(ValueError, match="not a fact"):
        v3model.fact("nope")


def test_flops_per_token_near_the_published_figure():
    # DeepSeek's ISCA paper: ~250 GFLOPs per training token; 6 x 37B = 222 GFLOPs without attention
    per_token = v3model.training_flops_per_token()
    assert 240e9 < per_token < 275e9
    linear = sum(f for n, _, f in v3model.forward_flops_per_token() if not n.startswith("attention core"))
    assert 3 * linear == pytest.approx(6 * 37e9, rel=0.08)


def test_chunk_passes():
    fl = v3model.chunk_flops(4096, 16)
    for p in v3model.PRECISIONS:
        assert fl["W"][p] < fl["B"][p]
        assert fl["B"][p] >= 2 * fl["F"][p]
    ch = v3model.chunk(v3model.defaults())
    # the report's ~1:1 computation-to-communication ratio for cross-node EP, forward
    assert 0.7 < ch.comm_F / ch.F < 1.4
    d = ch.durations("dualpipe")
    assert d.fb == pytest.approx(ch.F + ch.B)  # the pair hides its all-to-all
    assert ch.durations("1f1b").FB is None


def test_all_to_all_uses_topology_and_moe():
    x = v3model.defaults()
    a = v3model.chunk_all_to_all(x)
    per_copy = moe.token_traffic_bytes(7168, 1)["total"]
    assert a["network_copies"] == pytest.approx(3.5)
    assert a["per_layer_s"] == pytest.approx(4096 * per_copy * 3.5 / 50e9)
    assert v3model.chunk_all_to_all(dataclasses.replace(x, ep=1))["seconds"] == 0


def test_exposed():
    assert v3model.exposed(3.0, 1.0) == 2.0
    assert v3model.exposed(1.0, 3.0) == 0.0


def test_flop_rate_estimate_is_the_upper_bound_it_was():
    p = v3model.predict_flop_rate()
    assert p.step_s == pytest.approx(sum(p.breakdown.values()))
    assert p.gpu_hours_per_t == pytest.approx(v3model.gpu_hours_per_t_tokens(p.step_s, 2048, 15360 * 4096))
    assert p.mfu_fp8 == pytest.approx(0.405, abs=1e-3) and p.vs_reported == pytest.approx(0.502, abs=1e-3)
    eff = v3model.input_to_match("fp8_efficiency", 0.01, 1.0, model=v3model.predict_flop_rate, tol=1e-6)
    assert v3model.predict_flop_rate(fp8_efficiency=eff).gpu_hours_per_t == pytest.approx(180000, rel=1e-4)
    assert v3model.predict_flop_rate(fp8_efficiency=0.9).step_s < p.step_s


def test_kernel_prediction_meets_the_issue_targets():
    p = v3model.predict()
    assert p.step_s == pytest.approx(sum(p.breakdown.values()))
    assert p.full_batch_gpu_hours_per_t == pytest.approx(v3model.gpu_hours_per_t_tokens(p.step_s, 2048,
                                                                                         15360 * 4096))
    assert p.gpu_hours_per_t == pytest.approx(p.full_batch_gpu_hours_per_t + p.ramp_gpu_hours_per_t)
    assert 0 < p.ramp_gpu_hours_per_t < 0.02 * p.gpu_hours_per_t      # 3% of the tokens at smaller batches
    assert 0.75 <= p.vs_reported <= 1.25          # ledger v3model.vs_reported
    assert p.mfu_fp8 <= 0.3                        # ledger v3model.mfu_fp8
    assert p.memory["total"] < p.memory["hbm"]
    assert isinstance(p.result, pipeline.Result) and p.chunk.fb > 0
    assert all(v >= 0 for v in p.breakdown.values())
    # the stage plan covers every block once, in order, the heads last
    flat = [b for stage in p.plan for b in stage]
    assert flat == v3step.layer_list(v3model.config()) and p.plan[-1][-1] == "heads"
    assert v3model.predict() is p                  # cached: same inputs, same object


def test_counterfactuals_move_the_right_way():
    base = v3model.predict()
    assert v3model.predict(schedule="1f1b").step_s > base.step_s
    assert v3model.predict(max_nodes=None).step_s >= base.step_s
    assert v3model.predict(gemm_scale=1.2).step_s < base.step_s
    assert v3model.predict(hbm_efficiency=0.5).step_s > base.step_s
    assert v3model.predict(rows_factor=1.2).step_s > base.step_s
    assert v3model.predict(ib_gbs=25).step_s >= base.step_s
    assert v3model.predict(comm_sms=6).step_s < base.step_s      # more SMs compute
    h100 = v3model.predict(gpu_id="H100-SXM", nvlink_gbs=450)
    assert h100.step_s == pytest.approx(base.step_s)              # the IB share sets the all-to-all
    tp8 = v3model.predict(tp=8, ep=1, comm_sms=0)
    assert tp8.step_s > base.step_s and tp8.memory["total"] > tp8.memory["hbm"]
    nvl = topology.fabric("GB200-NVL72")
    gb = v3model.predict(gpu_id="GB200", domain_gpus=72, nvlink_gbs=nvl.nvlink_gbs, ib_gbs=nvl.network_gbs,
                         sms=hardware.gpu("GB200").sms)
    assert gb.step_s < base.step_s / 2
    assert v3model.chunk_all_to_all(gb.inputs)["network_copies"] == 0


def test_input_to_match_and_tornado():
    x = v3model.defaults()
    v = v3model.input_to_match("hbm_efficiency", 0.05, 1.0, x=x, tol=1e-3, inverse=True)
    assert v3model.predict(x, hbm_efficiency=v).gpu_hours_per_t == pytest.approx(180000, rel=2e-4)
    assert 0.05 < v < 1.0
    r = v3model.input_to_match("rows_factor", 1.5, 2.5, x=x, tol=1e-3)
    assert v3model.predict(x, rows_factor=r).gpu_hours_per_t == pytest.approx(180000, rel=2e-4)
    assert v3model.input_to_match("hbm_efficiency", 0.9, 1.0, x=x) != v3model.input_to_match("hbm_efficiency", 0.9,
                                                                                              1.0, x=x)   # NaN
    rows = v3model.tornado({"ib_gbs": (40, 50)})
    assert rows[0][3] >= rows[0][4]


def test_ep_imbalance_floor():
    # 64 ranks x 4,096 tokens x 8 experts over 256 experts, 4 per rank: sd of a rank's rows ~ 177 of 32,768
    f = v3model.ep_imbalance_floor()
    assert f == pytest.approx(1.0127, abs=2e-4)
    assert v3model.ep_imbalance_floor(tokens=4096 * 16) < f < v3model.ep_imbalance_floor(tokens=512)
    assert v3model.ep_imbalance_floor(ep=1) == 1.0


def test_bad_inputs():
    with pytest.raises(ValueError, match="fp8_efficiency"):
        v3model.predict(fp8_efficiency=1.5)
    with pytest.raises(ValueError, match="comm_sms"):
        v3model.predict(comm_sms=200)
    with pytest.raises(ValueError, match="schedule"):
        v3model.predict(schedule="gpipe")
    with pytest.raises(ValueError, match="hbm_efficiency"):
        v3model.predict(hbm_efficiency=0)
    with pytest.raises(ValueError, match="rows_factor"):
        v3model.predict(rows_factor=0.5)
    with pytest.raises(ValueError, match="step_seconds"):
        v3model.gpu_hours_per_t_tokens(0, 1, 1)


def test_memory_follows_deepseeks_recipe():
    # lab 09 / 13: BF16 weights, FP32 grads, FP32 master + two BF16 moments sharded by ZeRO-1, EMA on the CPU,
    # activations for PP + 1 chunks under DualPipe (PP under 1F1B)
    x = v3model.defaults()
    m = v3model.memory_gb(x)
    assert m["grads"] == pytest.approx(2 * m["weights"])  # 4-byte gradients beside 2-byte weights
    assert set(m) == {"weights", "grads", "optimizer", "activations", "total", "hbm"}
    assert m["total"] == pytest.approx(m["weights"] + m["grads"] + m["optimizer"] + m["activations"])
    assert m["total"] == pytest.approx(64.34, abs=0.05) and m["hbm"] == 80
    one_f = v3model.memory_gb(dataclasses.replace(x, schedule="1f1b"))
    assert one_f["activations"] == pytest.approx(m["activations"] * x.pp / (x.pp + 1))
    assert one_f["weights"] == pytest.approx(m["weights"] / 2)  # DualPipe holds two stages: 2x the parameters


def test_activation_bytes_per_token_layer():
    # two BF16 residual inputs, BF16 latents, FP8 attention output, FP32 log-sum-exp per head; per expert FP8 input
    # and FP8 SwiGLU input
    c = v3model.config()
    h, nh = c["hidden_size"], c["num_attention_heads"]
    attn = 4 * h + 2 * (1536 + 512 + 64) + nh * 128 + 4 * nh
    assert v3model.activation_bytes_per_token_layer() == attn + 9 * (h + 2 * 2048)
    assert v3model.optimizer_seconds(v3model.defaults()) < 0.01
