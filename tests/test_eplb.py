"""common.moe.eplb: DeepSeek's README example reproduced exactly, invariants of both policies, bad input, speed."""
import time

import pytest
import torch

from common.moe import eplb
from common.moe.eplb import balanced_packing, rebalance_experts, replicate_experts

# The worked example of github.com/deepseek-ai/EPLB README.md: 2 layers x 12 experts, 16 replicas, 4 groups,
# 2 nodes, 8 GPUs (hierarchical policy) -- input and printed phy2log as published there.
README_WEIGHT = torch.tensor([[90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
                              [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27]])
README_PHY2LOG = torch.tensor([[5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
                               [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1]])


def test_readme_example_exactly():
    phy2log, log2phy, logcnt = rebalance_experts(README_WEIGHT, 16, 4, 2, 8)
    assert torch.equal(phy2log, README_PHY2LOG)
    assert logcnt.tolist() == [[1, 2, 1, 1, 2, 2, 1, 1, 1, 1, 2, 1], [1, 2, 1, 1, 1, 2, 2, 1, 2, 1, 1, 1]]
    assert log2phy.shape == (2, 12, 2)
    _check_invariants(README_WEIGHT, phy2log, log2phy, logcnt, 16)


def _check_invariants(weight, phy2log, log2phy, logcnt, num_replicas):
    layers, experts = weight.shape
    assert phy2log.shape == (layers, num_replicas) and logcnt.shape == (layers, experts)
    assert (logcnt >= 1).all() and (logcnt.sum(-1) == num_replicas).all()
    for layer in range(layers):
        assert torch.equal(torch.bincount(phy2log[layer], minlength=experts), logcnt[layer])
        for e in range(experts):
            slots = log2phy[layer, e]
            real = slots[slots >= 0]
            assert len(real) == logcnt[layer, e] and (phy2log[layer, real] == e).all()
            assert (slots[len(real):] == -1).all()


@pytest.mark.parametrize("replicas, groups, nodes, gpus", [(16, 4, 2, 8), (16, 3, 2, 4), (24, 4, 2, 8),
                                                          (12, 1, 1, 4), (20, 6, 4, 4)])
def test_invariants_random(replicas, groups, nodes, gpus):
    g = torch.Generator().manual_seed(replicas + groups)
    w = torch.randint(0, 1000, (3, 12), generator=g)
    phy2log, log2phy, logcnt = rebalance_experts(w, replicas, groups, nodes, gpus)
    _check_invariants(w, phy2log, log2phy, logcnt, replicas)


def test_hierarchical_keeps_groups_on_one_node():
    g = torch.Generator().manual_seed(1)
    w = torch.randint(1, 1000, (4, 32), generator=g)
    phy2log, _, _ = rebalance_experts(w, 48, 8, 4, 16)  # 4 experts a group, 2 groups a node, 12 slots a node
    node_of_slot = torch.arange(48) // 12
    for layer in range(4):
        group = phy2log[layer] // 4
        for gr in group.unique():
            assert len(node_of_slot[group == gr].unique()) == 1


def test_balancing_beats_identity_and_replicas_help():
    g = torch.Generator().manual_seed(0)
    w = (torch.rand(8, 64, generator=g) ** 4 * 1000).round()
    pid, cid = eplb.identity_placement(8, 64, 16)
    before = eplb.max_over_mean(eplb.gpu_loads(w, pid, cid, 16))
    p, _, c = rebalance_experts(w, 64, 1, 1, 16)
    no_spare = eplb.max_over_mean(eplb.gpu_loads(w, p, c, 16))
    p, _, c = rebalance_experts(w, 80, 1, 1, 16)
    spare = eplb.max_over_mean(eplb.gpu_loads(w, p, c, 16))
    assert before > no_spare > spare >= 1.0
    assert spare < 1.1


def test_packing_and_replication_helpers():
    pack, rank = balanced_packing(torch.tensor([[5.0, 4, 3, 2, 1, 1]]), 2)
    assert pack.tolist() == [[0, 1, 1, 0, 0, 1]] and rank.tolist() == [[0, 0, 1, 1, 2, 2]]
    phy2log, rank, cnt = replicate_experts(torch.tensor([[10.0, 1, 4]]), 6)
    # 10 -> 10/2 = 5 > 4 -> 10/3 = 3.3 < 4: the third spare goes to expert 2
    assert cnt.tolist() == [[3, 1, 2]] and phy2log.tolist() == [[0, 1, 2, 0, 0, 2]]
    assert rank.tolist() == [[0, 0, 0, 1, 2, 1]]


@pytest.mark.parametrize("args, match", [
    ((8, 4, 2, 8), r"num_replicas=8 is fewer than the 12 logical experts"),
    ((16, 4, 2, 5), r"num_gpus=5 does not divide num_replicas=16"),
    ((16, 5, 1, 8), r"num_groups=5 does not divide the 12 experts"),
    ((16, 4, 4, 2), r"num_replicas=16.*|num_nodes=4 does not divide num_gpus=2"),
    ((16, 0, 2, 8), r"num_groups=0 must be an integer >= 1"),
])
def test_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        rebalance_experts(README_WEIGHT, *args)
    with pytest.raises(ValueError, match="2-D"):
        rebalance_experts(README_WEIGHT[0], 16, 4, 2, 8)
    with pytest.raises(ValueError, match="negative"):
        rebalance_experts(-README_WEIGHT, 16, 4, 2, 8)


def test_speed_58_layers_256_experts_64_gpus():
    w = torch.rand(58, 256, generator=torch.Generator().manual_seed(0)) * 1000
    t = time.perf_counter()
    phy2log, _, logcnt = rebalance_experts(w, 320, 8, 8, 64)
    hier = time.perf_counter() - t
    t = time.perf_counter()
    rebalance_experts(w, 320, 1, 8, 64)
    glob = time.perf_counter() - t
    assert logcnt.sum(-1).eq(320).all()
    assert hier < 5 and glob < 5, f"EPLB took {hier:.2f} s / {glob:.2f} s (target < 1 s on an idle machine)"
