"""common/systems/cluster/topology.py: rack figures derived from per-GPU facts, fabrics, collectives, parallelism layouts."""
import json

import pytest

from common.systems.cluster import topology


def test_nvl72_figures_match_nvidia_headlines():
    f = topology.system_figures("GB200-NVL72")
    assert (f.gpus, f.cpus) == (72, 36)
    assert f.nvlink_aggregate_tbs == pytest.approx(129.6)
    assert round(f.nvlink_aggregate_tbs) == topology.headline("GB200-NVL72", "nvlink_tbs")
    assert f.pflops[("fp4", "sparse")] == pytest.approx(topology.headline("GB200-NVL72", "pflops_sparse.fp4"))
    assert f.pflops[("fp4", "dense")] == pytest.approx(f.pflops[("fp4", "sparse")] / 2)
    assert f.hbm_tb == pytest.approx(topology.headline("GB200-NVL72", "hbm_tb"), rel=0.01)
    assert f.cpu_memory_tb == pytest.approx(17.28)
    assert 30 <= f.fast_memory_tb < 31
    assert f.scale_up_vs_out == pytest.approx(18)
    assert f.gpu_power_kw < topology.fact("GB200-NVL72", "rack_power_kw")


def test_nodes_side_by_side():
    h100, h800 = topology.system_figures("HGX-H100"), topology.system_figures("H800-node")
    assert h100.scale_up_vs_out == pytest.approx(9) and h800.scale_up_vs_out == pytest.approx(4)
    assert ("fp4", "dense") not in h100.pflops
    assert topology.system_figures("NVLink-576").nvlink_domain == 576
    m = topology.fabric("H800-node", measured=True)
    assert (m.nvlink_gbs, m.network_gbs) == (160, 50)


def test_all_to_all_inside_and_across_the_domain():
    fab = topology.Fabric("f", 8, 200.0, 50.0)
    assert topology.all_to_all_seconds(8e9, 8, fab) == pytest.approx(7e9 / 200e9)
    assert topology.all_to_all_seconds(64e9, 64, fab) == pytest.approx(56e9 / 50e9)
    assert topology.all_to_all_seconds(1e9, 1, fab) == 0
    # strided group: no peer in the same domain
    assert topology.all_to_all_seconds(8e9, 8, fab, stride=8) == pytest.approx(7e9 / 50e9)
    assert topology.all_reduce_seconds(1e9, 8, fab) == pytest.approx(2 * 7 / 8 * 1e9 / 200e9)
    assert topology.all_reduce_seconds(1e9, 16, fab) == pytest.approx(2 * 15 / 16 * 1e9 / 50e9)
    assert topology.ep_network_copies(8, 64, fab, dedup=False) == pytest.approx(7)
    assert topology.ep_network_copies(8, 64, fab, max_nodes_per_token=4) == pytest.approx(3.5)
    with pytest.raises(ValueError, match="num_experts"):
        topology.ep_network_copies(8, 64, fab)


def test_node_limit_and_dedup_attributed():
    """Lab 06's routing-index figures (151.8 / 100.3 / 75.3 KB per token) within 1%: the node limit alone saves
    nothing; de-duplication does 151.8 -> 100.3; the limit on top of it 100.3 -> 75.3."""
    from common.moe import moe
    fab = topology.Fabric("h800", 8, 160.0, 50.0)
    kb = moe.token_traffic_bytes(7168, 1)["total"] / 1e3
    per_expert = topology.ep_network_copies(8, 64, fab, dedup=False)
    limit_alone = topology.ep_network_copies(8, 64, fab, max_nodes_per_token=4, dedup=False)
    dedup_alone = topology.ep_network_copies(8, 64, fab, dedup=True, num_experts=256)
    both = topology.ep_network_copies(8, 64, fab, max_nodes_per_token=4)
    assert limit_alone == per_expert
    assert per_expert * kb == pytest.approx(151.8, rel=0.01)
    assert dedup_alone * kb == pytest.approx(100.3, rel=0.01)
    assert both * kb == pytest.approx(75.3, rel=0.015)
    # NVLink carries the forwarding inside the destination nodes
    assert topology.ep_nvlink_copies(8, 64, fab, dedup=False) == pytest.approx(8 * 7 / 64)
    assert topology.ep_nvlink_copies(8, 64, fab) == pytest.approx(8 * 7 / 64 + 7 * 7 / 8)
    a2a = topology.ep_all_to_all_seconds(4096, 1000, 8, 64, fab, max_nodes_per_token=4)
    assert a2a["seconds"] == pytest.approx(max(a2a["network_s"], a2a["nvlink_s"]))
    assert a2a["network_s"] == pytest.approx(4096 * 1000 * 3.5 / 50e9)


def test_deepseek_layout_memory_and_communication():
    m = topology.model_sketch("deepseek_v3")
    assert m.total_params == pytest.approx(671e9, rel=0.01)
    ds = topology.Layout(tp=1, pp=16, dp=128, ep=64)
    assert ds.gpus == 2048
    mem = topology.memory_per_gpu_gb(m, ds)
    assert 5 < mem["total"] < 20  # fits an 80 GB H800 with room for activations, without TP
    tok = 15360 * 4096
    fab = topology.fabric("H800-node", measured=True)
    comm = topology.step_communication(m, ds, fab, tok)
    assert comm["tp_all_reduce"] == 0 and comm["ep_all_to_all"] > 0
    limited = topology.step_communication(m, ds, fab, tok, max_nodes_per_token=4)
    assert limited["ep_all_to_all"] == pytest.approx(comm["ep_all_to_all"] * 3.5 / topology.ep_network_copies(
        8, 64, fab, num_experts=256))
    tp8 = topology.step_communication(m, topology.Layout(tp=8, pp=16, dp=16, ep=8), fab, tok)
    assert tp8["tp_all_reduce"] > limited["ep_all_to_all"]
    nvl = topology.step_communication(m, ds, topology.fabric("GB200-NVL72"), tok)
    assert nvl["ep_all_to_all"] < comm["ep_all_to_all"] / 10


def test_dense_model_memory_without_and_with_zero():
    m = topology.dense_sketch("dense", 400e9, 128, 16384)
    a = topology.memory_per_gpu_gb(m, topology.Layout(tp=8, pp=16, dp=16, zero1=False))
    b = topology.memory_per_gpu_gb(m, topology.Layout(tp=8, pp=16, dp=16))
    assert a["total"] == pytest.approx(400e9 * 16 / 128 / 1e9)
    assert b["optimizer"] == pytest.approx(a["optimizer"] / 16)


def test_compute_seconds():
    assert topology.compute_seconds(1e9, 1e6, 10, 1000, 0.5) == pytest.approx(6e15 / (10 * 1e15 * 0.5))


@pytest.mark.parametrize("call, match", [
    (lambda: topology.system_figures("DGX-9000"), r"system_id='DGX-9000'.*allowed: GB200-NVL72"),
    (lambda: topology.Layout(tp=0), r"tp=0"),
    (lambda: topology.Layout(dp=4, ep=3), r"ep=3 does not divide dp=4"),
    (lambda: topology.aggregate_nvlink_tbs(-72, 1800), r"gpus=-72"),
    (lambda: topology.rack_pflops(72, 0), r"per_gpu_tflops=0"),
    (lambda: topology.all_to_all_seconds(1e9, 0, topology.fabric("H800-node")), r"group size 0"),
    (lambda: topology.compute_seconds(1e9, 1e6, 8, 989, 0), r"mfu=0"),
    (lambda: topology.fact("HGX-H100", "lpddr5x_gb_per_cpu"), r"not recorded for HGX-H100"),
])
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_every_fact_has_a_source():
    data = json.loads(topology.SYSTEMS_PATH.read_text())
    for sid, sysd in data["systems"].items():
        for name, entry in {**sysd["facts"], **sysd["headline"]}.items():
            assert entry["source"] in data["sources"], f"{sid}.{name}"
            assert "http" in topology.source(sid, name)


def test_draw_topology_all_systems():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    for sid in ("HGX-H100", "H800-node", "GB200-NVL72"):
        ax = topology.draw_topology(sid)
        assert "NVLink" in ax.get_title()
        plt.close("all")


# ---- placements and the traffic between domains (lab 09's build exercise)
def test_place_keeps_groups_that_fit_inside_a_domain():
    import numpy as np
    from common.systems.cluster import placement
    for tp, ep, pp, dp, domain in ((1, 64, 16, 128, 72), (16, 1, 4, 32, 72), (2, 4, 3, 8, 6), (8, 8, 2, 16, 8)):
        lay = topology.Layout(tp=tp, pp=pp, dp=dp, ep=ep)
        gpu = placement.place(tp, ep, pp, dp, domain)
        assert len(np.unique(gpu)) == gpu.size
        for kind, size in (("tp", tp), ("ep", tp * ep)):
            if size <= domain:
                assert all(len(d) == 1 for _, d in placement.spans(gpu, lay, domain, kind)), (kind, tp, ep, domain)


def test_crossing_bytes_by_hand():
    """Two TP2 groups on domains of 2 GPUs: placed side by side nothing crosses; interleaved each ring crosses twice
    (2 domains), each crossing carrying 2 (g - 1) / g = 1 x the bytes reduced."""
    import numpy as np
    from common.systems.cluster import placement
    lay = topology.Layout(tp=2, pp=1, dp=2)
    vol = {"tp": 10.0, "ep": 0.0, "pp": 0.0, "dp": 0.0, "dp_experts": 0.0}
    assert placement.crossing_bytes(np.array([[[0, 1], [2, 3]]]), lay, 2, vol)["total"] == 0
    assert placement.crossing_bytes(np.array([[[0, 2], [1, 3]]]), lay, 2, vol)["tp"] == 2 * 2 * 10.0
    ep = topology.Layout(tp=1, pp=1, dp=4, ep=4)  # an all-to-all of 4, two per domain: each sends 2 of 4 shares out
    vol = {"tp": 0.0, "ep": 8.0, "pp": 0.0, "dp": 0.0, "dp_experts": 0.0}
    assert placement.crossing_bytes(np.arange(4).reshape(1, 4, 1), ep, 2, vol)["ep"] == 4 * 8.0 * 2 / 4


def test_contiguous_splits_deepseeks_ep_groups_on_nvl72_and_placement_errors_are_clear():
    import pytest
    from common.systems.cluster import placement
    ds = topology.model_sketch("deepseek_v3")
    lay = topology.Layout(tp=1, pp=16, dp=128, ep=64)
    vol = placement.volumes(ds, lay, 62_914_560)
    naive = placement.crossing_bytes(placement.contiguous(1, 64, 16, 128), lay, 72, vol)
    best = placement.crossing_bytes(placement.place(1, 64, 16, 128, 72), lay, 72, vol)
    assert naive["ep"] > 0 == best["ep"] and best["total"] < naive["total"] / 10
    assert placement.domains_used(placement.place(1, 64, 16, 128, 72), 72) == 32
    with pytest.raises(ValueError, match=r"shape \(16, 1\).*\(pp, dp, tp\) = \(1, 16, 1\)"):
        placement.check_placement([[0]] * 16, topology.Layout(dp=16))
    with pytest.raises(ValueError, match="GPU 3 holds two ranks"):
        placement.check_placement([[[3], [3]]], topology.Layout(dp=2))
