"""common.systems.inference.model and common.systems.inference.service: DeepGEMM's table reproduced at its own points, the
step model's structure, the day's accounting reproducing DeepSeek's reported nodes, cost and margin, bad input."""
import math

import pytest

from common.parallel import overlap
from common.systems.inference import model as im, service


def test_facts_have_sources():
    assert im.fact("decode_tokens_per_s_per_node") == 14.8e3 and im.fact("flashmla_memory_bound_gbs") == 3000
    assert "open-infra-index" in im.source("cost_per_day_usd") and "commit 9241ae3" in im.source("flashmla_page_block")
    with pytest.raises(ValueError, match=r"'nope' is not a fact"):
        im.fact("nope")


def test_kv_bytes_per_token_is_70272():
    assert im.kv_bytes_per_token() == 576 * 2 * 61 == 70272


@pytest.mark.parametrize("kind", ["normal", "masked", "contiguous"])
def test_gemm_seconds_reproduce_deepgemm_at_its_points(kind):
    rows = im.deepgemm_rows(kind)
    assert len(rows) == {"normal": 18, "masked": 6, "contiguous": 4}[kind]
    for r in rows:
        m, g = (r["m"], 1) if kind == "normal" else (r["m_per_group"], r["groups"])
        t = im.gemm_seconds(m, r["n"], r["k"], kind, g)
        assert math.isclose(2 * g * m * r["n"] * r["k"] / t / 1e12, r["tflops"], rel_tol=1e-12)


def test_gemm_seconds_between_below_and_above_the_points():
    t64, t128 = im.gemm_seconds(64, 7168, 16384), im.gemm_seconds(128, 7168, 16384)
    assert t64 < im.gemm_seconds(96, 7168, 16384) < t128
    assert im.gemm_seconds(8, 7168, 16384) == t64                       # the weights' read sets the floor
    assert math.isclose(im.gemm_seconds(8192, 7168, 16384), 2 * im.gemm_seconds(4096, 7168, 16384))
    assert im.gemm_seconds(64, 7168, 16384, gemm_efficiency=0.5) == 2 * t64
    off = im.gemm_seconds(64, 36864, 7168)                              # not in the table: roofline
    assert math.isclose(off, (36864 * 7168 + 64 * 7168 + 64 * 36864 * 2) / 3000e9)
    with pytest.raises(ValueError, match=r"kind='dense' is not allowed"):
        im.gemm_seconds(64, 7168, 2048, "dense")


def test_decode_prediction_structure():
    p = im.predict(im.decode_inputs())
    assert max(p.compute_s, p.network_s) - 1e-12 <= p.step_s <= p.serial_s + 1e-12
    assert math.isclose(sum(p.parts_s.values()), p.serial_s, rel_tol=1e-9)
    assert p.tokens_per_s_per_node == pytest.approx(8 * 128 / p.step_s)
    assert p.memory_gb["total"] < p.memory_gb["hbm"] and p.memory_gb["kv_cache"] == pytest.approx(
        128 * 4989 * 70272 / 1e9)
    compute_parts = [v for k, v in p.parts_s.items() if k not in ("dispatch", "combine")]
    assert p.parts_s["attention: core attention (MQA, KV cache)"] == max(compute_parts)
    assert p.parts_s["combine"] > p.parts_s["dispatch"]                  # BF16 back, FP8 out
    one = im.predict(im.decode_inputs(micro_batches=1))
    assert one.step_s == pytest.approx(one.serial_s) and one.step_s > p.step_s
    spans = p.spans
    for res in (overlap.COMPUTE, overlap.COMM):
        mine = sorted((s, e) for s, e, _, r in spans if r == res)
        assert all(a[1] <= b[0] + 1e-12 for a, b in zip(mine, mine[1:]))


def test_decode_throughput_grows_and_per_user_speed_falls_with_batch():
    rows = [im.predict(im.decode_inputs(tokens_per_gpu=b)) for b in (16, 64, 128, 192)]
    per_node = [r.tokens_per_s_per_node for r in rows]
    per_user = [r.per_user_tokens_per_s for r in rows]
    assert per_node == sorted(per_node) and per_user == sorted(per_user, reverse=True)


def test_prefill_prediction_and_the_cache_hit_credit():
    p = im.predict(im.prefill_inputs())
    no_hits = im.predict(im.prefill_inputs(hit_rate=0.0))
    assert p.tokens_per_s_per_node > no_hits.tokens_per_s_per_node
    assert p.inputs.comm_sms == 20 and p.inputs.sm_share == pytest.approx(112 / 132)
    assert p.memory_gb["kv_cache"] == 0 and p.memory_gb["weights"] < 80


def test_inputs_are_checked():
    with pytest.raises(ValueError, match=r"micro_batches=3 is not allowed"):
        im.decode_inputs(micro_batches=3)
    with pytest.raises(ValueError, match=r"hit_rate=1.0 is not allowed"):
        im.prefill_inputs(hit_rate=1.0)
    with pytest.raises(ValueError, match=r"hbm_gbs=0 must be a finite number > 0"):
        im.decode_inputs(hbm_gbs=0)
    with pytest.raises(ValueError, match=r"layer_overhead_us=-1 must be a finite number >= 0"):
        im.decode_inputs(layer_overhead_us=-1)


def test_the_reported_day_is_reproduced_by_its_own_accounting():
    d = service.reported_day()
    assert d["nodes"] == pytest.approx(im.fact("nodes_average"), rel=2e-3)
    assert d["cost_per_day"] == pytest.approx(im.fact("cost_per_day_usd"), rel=2e-3)
    assert d["revenue_per_day"] == pytest.approx(im.fact("revenue_per_day_usd"), rel=1e-3)
    assert d["margin"] == pytest.approx(im.fact("cost_profit_margin"), abs=0.02)
    assert d["usd_per_m_output_decode"] == pytest.approx(0.3003, rel=1e-3)


def test_cost_and_transfer_helpers():
    assert service.cost_per_m_tokens(1e6 / 3600, 1.0, 1) == pytest.approx(1.0)
    with pytest.raises(ValueError, match=r"tokens_per_s_per_node=0 must be a finite number > 0"):
        service.cost_per_m_tokens(0, 2, 8)
    t = service.kv_transfer(4096, 70272, 50)
    assert t["bytes"] == 4096 * 70272 and t["seconds"] == pytest.approx(4096 * 70272 / 50e9)


def test_solve_for_finds_the_value_that_reproduces_the_figure():
    v = service.solve_for("decode", "hbm_gbs", 300, 3000)
    assert 300 < v < 3000
    # the greedy schedule can jump where its order changes: within 1%
    assert im.predict(im.decode_inputs(hbm_gbs=v)).tokens_per_s_per_node == pytest.approx(14.8e3, rel=1e-2)
    assert math.isnan(service.solve_for("prefill", "hit_rate", 0.0, 0.563))       # no hit rate reaches 73.7K
    rows = service.tornado("decode", {"hbm_gbs": (2400, 3350)})
    assert rows[0][3] < rows[0][4]


def test_mtp_scenario_verifies_its_drafts_and_reads_each_cache_once():
    """MTP: 2 rows per request through the GEMMs, the all-to-all and the head; the cache read once for both rows;
    one more MoE layer; 1 + acceptance tokens per request and step. Left out (draft 0), the model is as stated."""
    base, mtp = im.predict(im.decode_inputs()), im.predict(im.decode_inputs(draft_tokens=1, acceptance=0.85))
    assert im.predict(im.decode_inputs(draft_tokens=0)).step_s == base.step_s
    b = 64
    x1, x2 = im.decode_inputs(), im.decode_inputs(draft_tokens=1)
    a1, a2 = im.attention_parts(x1, b), im.attention_parts(x2, b)
    core = "core attention (MQA, KV cache)"
    flops_bound = 2 * b * 128 * 4989 * 1088 / 660e12                   # 128 heads: past FlashMLA's measured ridge
    assert a1[core] == pytest.approx(flops_bound) and a2[core] == pytest.approx(2 * flops_bound)
    assert im.all_to_all(x2, 2 * b)["dispatch"] == pytest.approx(mtp.parts_s["dispatch"] / 2 / (58 + 1))
    assert mtp.tokens_per_step == 1.85 and mtp.tokens_per_s_per_node == pytest.approx(8 * 128 * 1.85 / mtp.step_s)
    assert mtp.per_user_tokens_per_s == pytest.approx(1.85 / mtp.step_s)
    assert "MTP module (one MoE layer and its head)" in mtp.parts_s and mtp.memory_gb["weights"] > base.memory_gb[
        "weights"]
    with pytest.raises(ValueError, match=r"acceptance=0.5 is not allowed; allowed: 0..1, and above 0 only with"):
        im.decode_inputs(acceptance=0.5)
    with pytest.raises(ValueError, match=r"draft_tokens=1 is not allowed in prefill"):
        im.prefill_inputs(draft_tokens=1)


def test_gap_budgets_multiply_to_the_whole_gap():
    d = service.decode_gap()
    assert d["decode_gap_batch"] * d["decode_gap_step"] == pytest.approx(d["decode_vs_reported"], rel=1e-12)
    assert d["decode_vs_reported"] == pytest.approx(im.predict(im.decode_inputs()).vs_reported)
    assert round(d["batch_reported"], 1) == 88.1 and d["batch_compared"] == 88
    assert round(d["step_reported_ms"], 1) == 47.6
    assert 1.1 < d["decode_gap_batch"] < 1.2 and 1.3 < d["decode_gap_step"] < 1.45     # 1.14 x 1.37 = 1.56
    p = service.prefill_gap()
    assert round(p["reported_computed_per_node"]) == 32207
    assert p["stated_vs_reported"] * p["kv_b_cached_prefix"] * p["threefs_load"] == pytest.approx(
        p["prefill_computed_vs_reported"], rel=1e-12)
    assert p["stated_vs_reported"] == pytest.approx(im.predict(im.prefill_inputs()).vs_reported)   # same ratio
    assert 0.9 < p["kv_b_cached_prefix"] < 1 and 0.8 < p["threefs_load"] < 1
    assert service.prefill_gap(storage_overlap=True)["threefs_load"] == 1.0       # hidden behind a 1.7 s step
    m = service.decode_mtp()
    assert m["acceptance"] == 0.85 and m["reported_tps_speedup"] == 1.8 and m["vs_no_mtp"] > 1
    assert service.decode_mtp(0.9)["tokens_per_s_per_node"] > m["tokens_per_s_per_node"]


def test_utilisation_is_an_input_of_the_cost_and_recovers_the_reported_day():
    d, p = im.predict(im.decode_inputs()), im.predict(im.prefill_inputs())
    ceiling = service.day(d.tokens_per_s_per_node, p.tokens_per_s_per_node)
    assert service.margin_kind(ceiling).startswith("ceiling") and ceiling["margin"] > 10
    u = (1 / d.vs_reported, 1 / p.vs_reported)
    at = service.day(d.tokens_per_s_per_node, p.tokens_per_s_per_node, utilisation=u)
    rep = service.reported_day()
    assert at["nodes"] == pytest.approx(rep["nodes"]) and at["margin"] == pytest.approx(rep["margin"])
    assert "64% (decode) and 40% (prefill)" in service.margin_kind(at)
    half = service.day(14.8e3, 73.7e3, utilisation=0.5)
    assert half["cost_per_day"] == pytest.approx(2 * rep["cost_per_day"])
    with pytest.raises(ValueError, match=r"decode utilisation=1.5 is not allowed"):
        service.day(14.8e3, 73.7e3, utilisation=1.5)
    assert set(service.implied_utilisation()) == {"decode", "prefill"}


def test_per_gpu_weight_reads_and_deepep_room_for_latency():
    i = im.decode_intensity_per_gpu()
    assert round(i["per_gpu"]) == 295 and round(i["weights_read_once"]) == 410 and i["requests_per_unit"] == 18432
    assert round(i["ridge_bf16"]) == 295 and 23 < i["weights_gb_per_gpu"] < 25
    c = im.deepep_low_latency_check()
    for name, measured in (("dispatch", 192), ("combine", 369)):
        assert c[name]["measured_us"] == measured and 0 < c[name]["latency_room_us"] < 0.1 * measured
