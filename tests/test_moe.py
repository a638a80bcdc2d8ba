"""common.moe.moe: the gates against per-token references, dispatch/combine against dense and naive, balancing, traffic."""
import math

import pytest
import torch

from common.moe import moe


def _per_token_deepseek(logits, bias, k, n_group, topk_group, scale):
    """Plain-Python reading of DeepSeek-V3's gate, one token at a time (float64)."""
    t, e = logits.shape
    gs = e // n_group
    ws, ids = [], []
    for row in range(t):
        s = [1 / (1 + math.exp(-float(v))) for v in logits[row]]
        c = [s[i] + (float(bias[i]) if bias is not None else 0.0) for i in range(e)]
        gscore = [sum(sorted(c[g * gs:(g + 1) * gs], reverse=True)[:2]) for g in range(n_group)]
        groups = sorted(range(n_group), key=lambda g: -gscore[g])[:topk_group]
        cand = [i for g in groups for i in range(g * gs, (g + 1) * gs)]
        chosen = sorted(cand, key=lambda i: -c[i])[:k]
        tot = sum(s[i] for i in chosen)
        ws.append([s[i] / tot * scale for i in chosen])
        ids.append(chosen)
    return torch.tensor(ws, dtype=torch.float64), torch.tensor(ids)


@pytest.mark.parametrize("e, k, n_group, topk_group", [(32, 4, 4, 2), (64, 8, 8, 4), (16, 2, 1, 1), (24, 3, 6, 6)])
def test_deepseek_gate_matches_per_token_reference(e, k, n_group, topk_group):
    g = torch.Generator().manual_seed(e + k)
    logits = torch.randn(50, e, generator=g, dtype=torch.float64)
    bias = torch.randn(e, generator=g, dtype=torch.float64) * 0.3
    w, i = moe.deepseek_v3_gate(logits, bias, k, n_group, topk_group, 2.5)
    rw, ri = _per_token_deepseek(logits, bias, k, n_group, topk_group, 2.5)
    assert torch.equal(i, ri)
    torch.testing.assert_close(w, rw)
    torch.testing.assert_close(w.sum(-1), torch.full((50,), 2.5, dtype=torch.float64))


def test_bias_changes_choice_not_weights():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(200, 16, generator=g)
    bias = torch.zeros(16)
    bias[3] = 10.0  # expert 3 always chosen
    w, i = moe.deepseek_v3_gate(logits, bias, 2, 1, 1, 1.0)
    assert (i == 3).any(-1).all()
    scores = torch.sigmoid(logits)
    expected = scores.gather(1, i) / scores.gather(1, i).sum(-1, keepdim=True)
    torch.testing.assert_close(w, expected)


def test_group_limit_bounds_groups_per_token():
    logits = torch.randn(1000, 256, generator=torch.Generator().manual_seed(1))
    _, i = moe.deepseek_v3_gate(logits, None, 8, 8, 4, 2.5)
    assert int(moe.distinct_nodes(i, 32, 8).max()) <= 4
    _, i = moe.deepseek_v3_gate(logits, None, 8, 8, 8, 2.5)
    assert int(moe.distinct_nodes(i, 32, 8).max()) > 4


def test_chunked_gate_equals_unchunked():
    logits = torch.randn(1000, 64, generator=torch.Generator().manual_seed(2))
    a = moe.deepseek_v3_gate(logits, None, 6, 8, 4, 1.0, chunk=128)
    b = moe.deepseek_v3_gate(logits, None, 6, 8, 4, 1.0)
    assert torch.equal(a[1], b[1]) and torch.equal(a[0], b[0])


def test_mixtral_gate():
    logits = torch.randn(30, 8, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    w, i = moe.softmax_topk_gate(logits, 2)
    p = torch.softmax(logits, -1)
    top = p.topk(2, -1)
    assert torch.equal(i, top.indices)
    torch.testing.assert_close(w, top.values / top.values.sum(-1, keepdim=True))


def test_switch_gate_capacity():
    logits = torch.zeros(10, 4)
    logits[:, 0] = 5.0  # every token wants expert 0
    w, i, kept = moe.switch_gate(logits, capacity_factor=1.0)
    assert moe.expert_capacity(10, 4, 1.0) == 3
    assert (i == 0).all() and kept.squeeze(1).tolist() == [True] * 3 + [False] * 7
    assert moe.dropped_fraction(i, 4, 1.0) == pytest.approx(0.7)
    _, _, kept = moe.switch_gate(logits, capacity_factor=4.0)
    assert kept.all()


def test_position_in_expert():
    idx = torch.tensor([[1, 0], [1, 2], [0, 1]])
    assert moe.position_in_expert(idx, 3).tolist() == [[0, 0], [1, 0], [1, 2]]


@pytest.mark.parametrize("t, e, k", [(37, 8, 2), (64, 16, 4), (5, 4, 4)])
def test_dispatch_combine_matches_dense_and_naive(t, e, k):
    g = torch.Generator().manual_seed(t)
    x = torch.randn(t, 12, generator=g, dtype=torch.float64)
    experts = moe.make_experts(e, 12, 20, seed=t, dtype=torch.float64)
    w, i = moe.deepseek_v3_gate(torch.randn(t, e, generator=g, dtype=torch.float64), None, k, 1, 1, 1.0)
    ref = moe.moe_dense_reference(x, w, i, experts)
    torch.testing.assert_close(moe.moe_grouped(x, w, i, experts), ref)
    torch.testing.assert_close(moe.moe_naive(x, w, i, experts), ref)


def test_dispatch_plan_is_sorted_stable_with_offsets():
    idx = torch.tensor([[2, 0], [0, 1], [2, 1]])
    plan = moe.dispatch_plan(idx, 4)
    assert plan.counts.tolist() == [2, 2, 2, 0] and plan.offsets.tolist() == [0, 2, 4, 6]
    assert idx.reshape(-1)[plan.order].tolist() == [0, 0, 1, 1, 2, 2]
    assert plan.token_index.tolist() == [0, 1, 1, 2, 0, 2]
    x = torch.arange(3.0).unsqueeze(1)
    assert moe.dispatch(x, plan).squeeze(1).tolist() == [0, 1, 1, 2, 0, 2]
    with pytest.raises(ValueError, match="indices must lie in 0..3"):
        moe.dispatch_plan(torch.tensor([[4]]), 4)


@pytest.mark.parametrize("call, match", [
    (lambda: moe.deepseek_v3_gate(torch.randn(4, 16), None, 17, 1, 1), r"top_k=17 is larger than the 16 experts"),
    (lambda: moe.deepseek_v3_gate(torch.randn(4, 16), None, 2, 3, 1), r"n_group=3 does not divide the 16 experts"),
    (lambda: moe.deepseek_v3_gate(torch.randn(4, 16), None, 2, 4, 5), r"topk_group=5 is larger than n_group=4"),
    (lambda: moe.deepseek_v3_gate(torch.randn(4, 16), None, 9, 4, 2), r"top_k=9 exceeds the 8 experts"),
    (lambda: moe.deepseek_v3_gate(torch.randn(4, 16), torch.zeros(15), 2, 4, 2), r"bias must have shape \(16,\)"),
    (lambda: moe.softmax_topk_gate(torch.randn(4, 8), 9), r"top_k=9 is larger than the 8 experts"),
    (lambda: moe.deepseek_v3_gate(torch.randn(16), None, 2), r"logits must be a 2-D tensor"),
    (lambda: moe.expert_capacity(10, 4, 0), r"capacity_factor=0 must be > 0"),
    (lambda: moe.simulate_balance("magic"), r"method='magic'"),
])
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_balance_simulation_orders_methods():
    kw = dict(steps=120, tokens=1024, num_experts=32, top_k=4, n_group=4, topk_group=2, seed=0)
    none = moe.simulate_balance("none", **kw)
    free = moe.simulate_balance("aux_free", **kw)
    aux = moe.simulate_balance("aux_loss", **kw)
    assert len(free["max_over_mean"]) == 120
    f_none, f_free, f_aux = (moe.final_value(r["max_over_mean"]) for r in (none, free, aux))
    assert f_free < f_aux < f_none
    assert f_free < 1.5 and f_none > 2
    assert moe.final_value(free["dropped"]) < moe.final_value(none["dropped"])
    again = moe.simulate_balance("aux_free", **kw)
    assert again["max_over_mean"] == free["max_over_mean"]  # seeded: deterministic


def test_traffic():
    assert moe.expected_distinct_nodes(256, 8, 8) == pytest.approx(8 * (1 - math.comb(224, 8) / math.comb(256, 8)))
    b = moe.token_traffic_bytes(7168, 1)
    assert b["dispatch"] == 7168 + 56 * 4 and b["combine"] == 2 * 7168
    logits = torch.randn(4000, 256, generator=torch.Generator().manual_seed(5))
    _, free = moe.deepseek_v3_gate(logits, None, 8, 1, 1)
    _, limited = moe.deepseek_v3_gate(logits, None, 8, 8, 4)
    a = moe.ep_traffic(free, 7168, 32, 8)
    b = moe.ep_traffic(limited, 7168, 32, 8)
    assert a["nodes_per_token"] == pytest.approx(moe.expected_distinct_nodes(256, 8, 8), rel=0.03)
    assert b["max_nodes_per_token"] <= 4 < a["max_nodes_per_token"]
    assert b["ib_bytes_per_node"] < a["ib_bytes_per_node"] < a["ib_bytes_per_expert"]


def test_node_limit_attribution_splits_the_saving():
    logits = moe.SkewedRouter.make(256, skew=0.5, dim=32, seed=2).logits(0, 2048)
    free = moe.deepseek_v3_gate(logits, None, 8, 8, 8, 2.5)[1]
    lim = moe.deepseek_v3_gate(logits, None, 8, 8, 4, 2.5)[1]
    a = moe.node_limit_attribution(free, lim, 7168, 32, 8)
    # the limit alone (one copy per remote expert) saves nothing; de-duplication saves; the limit adds on top of it
    assert abs(a["node_limited_no_dedup"] - a["per_expert"]) < 0.02 * a["per_expert"]
    assert a["per_expert"] > a["dedup_no_limit"] > a["node_limited_dedup"]
    assert a["saved_by_dedup"] + a["saved_by_limit"] == pytest.approx(a["per_expert"] - a["node_limited_dedup"])
    assert "node limit then cuts" in a["statement"]
    tr = moe.ep_traffic(lim, 7168, 32, 8)
    assert tr["ib_copies_per_node"] <= 4 and tr["ib_copies_per_expert"] >= tr["ib_copies_per_node"]
    with pytest.raises(ValueError, match="same tokens"):
        moe.node_limit_attribution(free, lim[:10], 7168, 32, 8)


def test_experts_within_ib_budget_is_deepseeks_13():
    r = moe.experts_within_ib_budget(160, 50, 4)
    assert r["experts_per_node"] == pytest.approx(3.2) and round(r["experts_at_same_cost"]) == 13
    with pytest.raises(ValueError, match="ib_gbs"):
        moe.experts_within_ib_budget(160, 0, 4)
