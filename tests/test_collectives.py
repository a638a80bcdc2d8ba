import pytest

from common.parallel import collectives as C


def test_ring_formulas_by_hand():
    # 8 ranks, 1 MB, alpha 10 us, 100 GB/s: 14 steps, 1.75 MB per rank
    assert C.ring_allreduce_time(1e6, 8, 10e-6, 100e9) == pytest.approx(14 * 10e-6 + 1.75e6 / 100e9)
    assert C.ring_allgather_time(1e6, 8, 10e-6, 100e9) == pytest.approx(7 * 10e-6 + 0.875e6 / 100e9)
    assert C.ring_reduce_scatter_time(1e6, 8, 10e-6, 100e9) == C.ring_allgather_time(1e6, 8, 10e-6, 100e9)
    assert C.alltoall_time(1e6, 8, 10e-6, 100e9) == pytest.approx(7 * 10e-6 + 0.875e6 / 100e9)
    # reduce-scatter + all-gather = all-reduce
    assert C.ring_allreduce_time(3e7, 5, 2e-6, 1e10) == pytest.approx(
        C.ring_reduce_scatter_time(3e7, 5, 2e-6, 1e10) + C.ring_allgather_time(3e7, 5, 2e-6, 1e10))


def test_tree_and_recursive_doubling():
    assert C.tree_allreduce_time(1e6, 8, 1e-6, 1e9) == pytest.approx(6 * (1e-6 + 1e-3))
    assert C.recursive_doubling_allreduce_time(1e6, 8, 1e-6, 1e9) == pytest.approx(3 * (1e-6 + 1e-3))
    assert C.recursive_doubling_allreduce_time(1e6, 6, 1e-6, 1e9) == pytest.approx(3 * (1e-6 + 1e-3))  # ceil
    assert C.rabenseifner_allreduce_time(1e6, 8, 1e-6, 1e9) == pytest.approx(6e-6 + 1.75e-3)
    assert C.allreduce_time("ring", 1e6, 1, 1e-6, 1e9) == 0.0
    # latency-bound small messages favour log-depth algorithms; large ones the ring
    assert C.allreduce_time("recursive_doubling", 1024, 64, 5e-6, 1e11) < C.allreduce_time("ring", 1024, 64, 5e-6, 1e11)
    assert C.allreduce_time("ring", 2**30, 64, 5e-6, 1e11) < C.allreduce_time("tree", 2**30, 64, 5e-6, 1e11)


def test_bus_factors_and_bandwidths():
    assert C.bus_factor("all_reduce", 8) == 1.75
    assert C.bus_factor("all_gather", 8) == C.bus_factor("reduce_scatter", 8) == C.bus_factor("all_to_all", 8) == 0.875
    assert C.bus_factor("broadcast", 8) == 1.0
    assert C.algbw(1e9, 0.01) == pytest.approx(1e11)
    assert C.busbw("all_reduce", 1e9, 0.01, 8) == pytest.approx(1.75e11)
    # the bus factor makes busbw equal the link bandwidth for a bandwidth-bound ring
    for coll in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        t = C.collective_time(coll, 2**30, 16, 0.0, 50e9)
        assert C.busbw(coll, 2**30, t, 16) == pytest.approx(50e9)


def test_hierarchical_against_one_flat_ring_and_against_one_ring_per_nic():
    nv, ib = C.nvlink_bandwidth("H100-SXM"), C.ib_bandwidth("ib-ndr")
    h = C.hierarchical_allreduce_time(2**30, 4, 8, 3e-6, nv, 10e-6, ib)
    one = C.flat_ring_allreduce_time(2**30, 4, 8, 3e-6, nv, 10e-6, ib)
    eight = C.flat_ring_allreduce_time(2**30, 4, 8, 3e-6, nv, 10e-6, ib, rings=8)
    assert h < one and eight < h  # one ring crosses one NIC; eight rings (NCCL's, one per NIC) use all eight
    # 58.7 MB over 2 nodes of 8 H100s, alpha 0: 8 rings of 7.34 MB at min(450/8, 50) GB/s = 0.275 ms, not 2.2 ms
    act = 4096 * 7168 * 2
    assert C.flat_ring_allreduce_time(act, 2, 8, 0, nv, 0, ib, rings=8) == pytest.approx(2 * 15 / 16 * act / 8 / 50e9)
    assert C.flat_ring_allreduce_time(act, 2, 8, 0, nv, 0, ib) == pytest.approx(2 * 15 / 16 * act / 50e9)
    # one node: hierarchical = ring on NVLink
    assert C.hierarchical_allreduce_time(2**20, 1, 8, 3e-6, nv, 10e-6, ib) == pytest.approx(
        C.ring_allreduce_time(2**20, 8, 3e-6, nv))
    # all-to-all inside one node uses NVLink only; across nodes the NIC dominates
    one = C.two_level_alltoall_time(2**26, 1, 8, 3e-6, nv, 10e-6, ib)
    assert one == pytest.approx(C.alltoall_time(2**26, 8, 3e-6, nv))
    assert C.two_level_alltoall_time(2**26, 8, 8, 3e-6, nv, 10e-6, ib) > one


def test_h800_vs_h100():
    assert C.nvlink_bandwidth("H100-SXM") == 450e9 and C.nvlink_bandwidth("H800-SXM") == 200e9
    assert C.h800_vs_h100_allreduce_ratio(2**30, 8) == pytest.approx(2.25)
    assert 1 < C.h800_vs_h100_allreduce_ratio(2**10, 8, alpha=5e-6) < 1.1  # small messages: latency-bound


@pytest.mark.parametrize("n", [0, -1, -2.5, float("nan"), float("inf"), "1MB", True])
def test_bad_message_size(n):
    with pytest.raises(ValueError, match="n_bytes="):
        C.ring_allreduce_time(n, 8, 1e-6, 1e9)


def test_bad_other_inputs():
    with pytest.raises(ValueError, match=r"p=0 must be an integer >= 1 \(the number of ranks\)"):
        C.ring_allreduce_time(1e6, 0, 1e-6, 1e9)
    with pytest.raises(ValueError, match="alpha=-1"):
        C.ring_allreduce_time(1e6, 2, -1e-6, 1e9)
    with pytest.raises(ValueError, match="bandwidth=0"):
        C.ring_allreduce_time(1e6, 2, 1e-6, 0)
    with pytest.raises(ValueError, match="collective='allreduce' is not known"):
        C.bus_factor("allreduce", 8)
    with pytest.raises(ValueError, match="algorithm='butterfly'"):
        C.allreduce_time("butterfly", 1e6, 8, 1e-6, 1e9)
    with pytest.raises(ValueError, match="message size=0"):
        C.measure([1024, 0], 2)
    with pytest.raises(ValueError, match="world_size=99 is more than this machine can run"):
        C.measure([1024], 99, backend="gloo")


def test_fit_recovers_parameters_and_rejects_bad_data():
    sizes = C.log_sizes(2**8, 2**28)
    for coll, p in (("all_reduce", 8), ("all_gather", 4), ("all_to_all", 3)):
        times = [C.collective_time(coll, n, p, 12e-6, 80e9) for n in sizes]
        fit = C.fit_alpha_beta(sizes, times, p, coll)
        assert fit.alpha_us == pytest.approx(12, rel=1e-6) and fit.beta_gbps == pytest.approx(80, rel=1e-6)
        assert fit.predict(sizes) == pytest.approx(times, rel=1e-6)
    with pytest.raises(ValueError, match="two different message sizes"):
        C.fit_alpha_beta([1024, 1024], [1e-3, 1e-3], 2)
    with pytest.raises(ValueError, match="do not grow with message size"):
        C.fit_alpha_beta([1024, 2**20], [2e-3, 1e-3], 2)
    with pytest.raises(ValueError, match="sizes_bytes must all be positive"):
        C.fit_alpha_beta([0, 2**20], [2e-3, 1e-3], 2)


def test_combine_takes_slowest_rank_then_median():
    r0 = {"all_reduce": {"bytes": [1024], "seconds": [[1.0, 2.0, 3.0]]}}
    r1 = {"all_reduce": {"bytes": [1024], "seconds": [[4.0, 1.0, 1.0]]}}
    s = C.combine([r0, r1], "gloo")["all_reduce"]
    assert s.seconds == [3.0] and s.p == 2  # max per repeat: 4, 2, 3 -> median 3


def test_sizes_helpers():
    assert C.log_sizes(1024, 2**20) == [2**10, 2**12, 2**14, 2**16, 2**18, 2**20]
    assert C.elements_for("all_gather", 1000, 3, 4) == 249
    assert C.elements_for("all_reduce", 1000, 3, 4) == 250
    assert C.elements_for("all_to_all", 4, 8, 4) == 8
    assert C.iterations_for(2**30) == 2 and C.iterations_for(1) == 50


def test_measured_sweep_gloo():
    sweeps = C.measure([2**10, 2**16, 2**20], 2, collectives=("all_reduce", "all_to_all"), backend="gloo",
                       repeats=2, target_bytes=2**20)
    for coll, s in sweeps.items():
        assert s.p == 2 and s.backend == "gloo" and len(s.seconds) == 3
        assert all(t > 0 for t in s.seconds)
        assert s.table().shape == (3, 4)
    ar = sweeps["all_reduce"]
    assert ar.busbw_gbps == pytest.approx(ar.algbw_gbps)  # bus factor 1 for two ranks
    assert len(ar.sizes_bytes) == 3 and ar.sizes_bytes[0] < ar.sizes_bytes[-1]  # timings are not asserted here


def test_v3_copies_node_limit_and_dedup():
    v3 = C.v3_copies_per_token()
    assert 3.2 < v3["ib_copies_node_limited"] < 3.7  # about 3.5 copies cross InfiniBand, not 7
    assert 6.5 < v3["ib_copies_per_expert"] < 7.2
    assert v3["nodes_per_token"] <= 4


def test_measured_comm_and_scenarios():
    m = C.measured_comm()
    assert m["deepep_h800_intranode_dispatch"]["value"] == 153 and m["deepep_h800_intranode_dispatch"]["link"] == "nvlink"
    assert all(e["source_title"] and e["source_date"] for e in m.values())
    rows = {r["scenario"]: r for r in C.comm_scenarios(7168)}
    assert not any("TP=16" in name or ("V3" in name and "TP" in name and "no TP" not in name) for name in rows)
    ep = [r for name, r in rows.items() if name.startswith("V3 EP=64 dispatch")][0]
    assert ep["ratio"] == pytest.approx(1.0)  # InfiniBand-bound: the H800 ties the H100
    assert ep["H800-SXM_measured_ms"] > 0
