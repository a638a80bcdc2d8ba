"""Expert parallelism on real ranks: same output as the single-process layer, bytes equal to lab 06's model."""
import psutil
import pytest
import torch
import workers as W

from common.moe import moe
from common.parallel import distributed as D
from common.parallel import expert_parallel as EP


def _nothing_left(launch: D.Launch):
    assert launch.pids
    alive = [p for p in launch.pids
             if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive


@pytest.mark.parametrize("cfg, ws, match", [
    (EP.EPConfig(), 10**4, r"world_size=10000 is more than this machine can run with gloo: at most \d+"),
    (EP.EPConfig(tokens=511), 2, r"tokens=511 does not split over world_size=2 ranks; allowed: a multiple of 2"),
    (EP.EPConfig(num_experts=30, n_group=5, topk_group=4), 4,
     r"num_experts=30 is not divisible by world_size=4; allowed: a multiple of 4"),
    (EP.EPConfig(ranks_per_node=3), 4, r"ranks_per_node=3 does not divide world_size=4"),
    (EP.EPConfig(fp8=True, hidden=200), 2, r"hidden=200: FP8 dispatch scales blocks of 128"),
    (EP.EPConfig(top_k=0), 2, r"top_k=0 must be an integer >= 1"),
])
def test_bad_input_before_any_process(cfg, ws, match):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(D, "run_workers", lambda *a, **k: pytest.fail("a process group was started before the input "
                                                                 "was checked"))
        with pytest.raises(ValueError, match=match):
            EP.measure(cfg, ws, backend="gloo")


def test_bad_variant():
    with pytest.raises(ValueError, match=r"variants=\('ring',\); allowed"):
        EP.ep_task(EP.EPConfig(), 2, "gloo", variants=("ring",))


def test_fp8_rows_round_trip():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 256, generator=gen) * torch.tensor([1e-3, 1.0, 30.0, 0.0, 5.0]).unsqueeze(1)
    b = EP.encode_fp8(x)
    assert b.dtype == torch.uint8 and b.shape == (5, 256 + 2 * 4)
    y = EP.decode_fp8(b, 256)
    assert torch.equal(y[3], torch.zeros(256))  # an all-zero block stays zero (scale 1, not 0/0)
    # E4M3: 3 mantissa bits (relative error <= 2^-4) for normal values; values below 2^-6 of the block's scale are
    # subnormal, spaced 2^-9 x scale apart, so their error is up to half that step (scale = block amax / 448)
    scale = x.reshape(5, 2, 128).abs().amax(-1, keepdim=True).expand(5, 2, 128).reshape(5, 256) / 448
    assert ((y - x).abs() <= x.abs() * 2**-4 + scale * 2**-10 + 1e-12).all()


def test_send_counts():
    idx = torch.tensor([[0, 1, 5], [6, 7, 2], [3, 4, 7]])  # 8 experts over 4 ranks (2 per rank), 2 nodes of 2
    assert EP.flat_send_counts(idx, 8, 4) == [2, 2, 2, 3]
    # rank 1 (local 1): node 0 (experts 0-3) hit by all three tokens, node 1 (4-7) by all three
    assert EP.node_send_counts(idx, 8, 4, 2, 1) == [0, 3, 0, 3]
    assert EP.node_send_counts(idx, 8, 4, 2, 2) == [3, 0, 3, 0]
    assert EP.node_send_counts(idx, 8, 4, 1, 0) == [1, 2, 2, 2]  # one rank per node: per-rank de-duplication


def test_two_ranks_match_the_single_process_layer_and_record_the_splits_they_sent():
    cfg = EP.EPConfig(tokens=256, hidden=128, intermediate=32, num_experts=16, top_k=4, n_group=4, topk_group=2)
    tasks = [EP.ep_task(cfg, 2, "gloo", repeats=2), (W.broken_ep_worker, (cfg.to_dict(),))]
    launch = D.Launch()
    per_rank = D.run_workers(D.tasks_worker, 2, args=(tasks,), backend="gloo", timeout=180, launch=launch)
    _nothing_left(launch)
    out = EP.summarize([r[0] for r in per_rank], cfg)
    for v in EP.VARIANTS:
        s = out["variants"][v]
        assert s["max_abs_err"] < 1e-5, (v, s["max_abs_err"])
        assert s["bytes_ratio"] == pytest.approx(1.0, abs=1e-12) and s["ib"] > 0
        assert s["seconds"] > 0
    assert 0.3 < out["dedup_bytes_saving"] < 1
    for rank, (good, broken) in enumerate(per_rank):
        right = EP.node_send_counts(good["indices"], cfg.num_experts, 2, 1, rank)
        assert good["variants"]["node_aware"]["send_counts"] == right
        assert good["variants"]["flat"]["send_counts"] == EP.flat_send_counts(good["indices"], cfg.num_experts, 2)
        # a layer that forgets a token: the recorded split list is what it sent, so the mismatch shows (the old
        # record recomputed node_send_counts from the routing and would have equalled `right`)
        sent = broken["variants"]["node_aware"]["send_counts"]
        assert sent != right and sum(right) - sum(sent) == len(set(EP.config.node_of_expert(
            good["indices"][:1], cfg.num_experts, 2, 1).flatten().tolist()))
        first = next(c for c in broken["variants"]["node_aware"]["calls"] if c["name"] == "dispatch_ib")
        assert first["peers"] == [0, 1] and first["send_counts"] == sent


def test_each_hop_pays_only_its_own_group():
    """One rank per node: the in-node hop's group is the rank alone, so the model charges it no latency; with the
    world group (the old way) it would pay (p-1) alpha for sending to itself."""
    def call(peers, nbytes):
        return {"peers": peers, "sent": nbytes, "recv": nbytes}
    ranks = [[call([0, 1], 0), call([r], 0)] for r in range(2)]  # a cross-node call, then an in-node one
    assert EP.predict_seconds(ranks, 1e-3, 1e9) == pytest.approx(1e-3)
    world = [[call([0, 1], 0), call([0, 1], 0)] for _ in range(2)]
    assert EP.predict_seconds(world, 1e-3, 1e9) == pytest.approx(2e-3)
    assert EP.hop_lists(4, 2) == {"ib": [[0, 2], [1, 3]], "nvlink": [[0, 1], [2, 3]]}
    assert EP.hop_lists(2, 1) == {"ib": [[0, 1]], "nvlink": [[0], [1]]}


def test_four_ranks_two_nodes_fp8_and_nvlink_hop():
    exact = EP.EPConfig(tokens=128, hidden=128, intermediate=32, num_experts=16, top_k=4, n_group=4, topk_group=2,
                        ranks_per_node=2)
    lowp = EP.EPConfig(**{**exact.to_dict(), "fp8": True, "combine_bf16": True})
    tasks = [EP.ep_task(exact, 4, "gloo", repeats=1), EP.ep_task(lowp, 4, "gloo", repeats=1)]
    launch = D.Launch()
    per_rank = D.run_workers(D.tasks_worker, 4, args=(tasks,), backend="gloo", timeout=180, launch=launch)
    _nothing_left(launch)
    a = EP.summarize([r[0] for r in per_rank], exact)
    b = EP.summarize([r[1] for r in per_rank], lowp)
    for v in EP.VARIANTS:
        assert a["variants"][v]["max_abs_err"] < 1e-5
        assert a["variants"][v]["bytes_ratio"] == pytest.approx(1.0, abs=1e-12)
        assert b["variants"][v]["bytes_ratio"] == pytest.approx(1.0, abs=1e-12)
        rel = b["variants"][v]["max_abs_err"] / b["variants"][v]["ref_max_abs"]
        assert 1e-4 < rel < 0.1, (v, rel)  # FP8 dispatch + BF16 combine: a few percent, not zero
    assert a["variants"]["node_aware"]["nvlink"] > 0  # the in-node hop really moved rows
    calls = per_rank[0][0]["variants"]["node_aware"]["calls"]
    assert [(c["name"], c["hop"], c["peers"]) for c in calls if c["name"] != "counts"] == [
        ("dispatch_ib", "ib", [0, 2]), ("dispatch_nvlink", "nvlink", [0, 1]), ("combine_nvlink", "nvlink", [0, 1]),
        ("combine_ib", "ib", [0, 2])]  # each hop on its own subgroup
    # FP8 + scales then BF16 is (1 + 4/128 + 2) / (4 + 4) of the fp32 payload
    ratio = b["variants"]["flat"]["ib"] / a["variants"]["flat"]["ib"]
    assert ratio == pytest.approx((128 + 4 + 256) / (512 + 512))


def test_model_matches_moe_ep_traffic_ordering():
    cfg = EP.EPConfig(tokens=8, top_k=2, num_experts=8, n_group=1, topk_group=1, ranks_per_node=1)
    per_rank = [{"indices": torch.tensor([[0, 1]] * 4)}, {"indices": torch.tensor([[6, 7]] * 4)}]
    glob = EP.global_indices(per_rank, cfg)
    assert glob[:2].tolist() == [[0, 1], [6, 7]]  # token i lives on node i mod 2
    assert moe.ep_traffic(glob, 16, 4, 2)["ib_bytes_per_node"] == 0  # every token's experts are at home
