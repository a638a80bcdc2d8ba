"""Checkers for lab 06 (MoE routing): expert parameters, the DeepSeek-V3 gate, a sorted MoE layer, the
auxiliary-loss-free bias update, nodes per token, and EPLB's replication."""
from __future__ import annotations

import math
import random

import torch

from common import eplb, moe
from common.checks import checker, expect, expect_close, expect_equal, fail


# ---------------------------------------------------------------- 6.1

def _ref_moe_ffn_params(hidden, inter, n_routed, n_shared, top_k, layers):
    expert = 3 * hidden * inter
    gate = n_routed * hidden
    return layers * (n_routed + n_shared) * expert + layers * gate, layers * (top_k + n_shared) * expert + layers * gate


@checker("6.1", "MoE FFN parameters: total and activated")
def check_moe_ffn_params(moe_ffn_params):
    """moe_ffn_params(hidden, moe_intermediate, n_routed, n_shared, top_k, moe_layers) -> (total, active)."""
    rng = random.Random()
    cases = [(7168, 2048, 256, 1, 8, 58), (4096, 14336, 8, 0, 2, 32)]
    for _ in range(5):
        nr = rng.randint(2, 512)
        cases.append((rng.randint(8, 8192), rng.randint(8, 8192), nr, rng.randint(0, 4), rng.randint(1, nr),
                      rng.randint(1, 96)))
    for h, f, nr, ns, k, L in cases:
        got = moe_ffn_params(h, f, nr, ns, k, L)
        expect(isinstance(got, (tuple, list)) and len(got) == 2,
               f"return (total, active), a pair of ints; got {got!r}")
        total, active = got
        ref_total, ref_active = _ref_moe_ffn_params(h, f, nr, ns, k, L)
        args = f"moe_ffn_params({h}, {f}, {nr}, {ns}, {k}, {L})"
        if total == ref_total - L * (nr + ns) * h * f:
            fail(f"{args}: total {total} counts 2 matrices per expert; a SwiGLU expert has three "
                 f"(gate, up and down projections): 3 x hidden x intermediate")
        if total == ref_total - L * nr * h or active == ref_active - L * nr * h:
            fail(f"{args}: the router is missing: every MoE layer has a gate matrix of n_routed x hidden "
                 f"({nr} x {h}) and every token uses all of it")
        if ns and active == ref_active - L * ns * 3 * h * f:
            fail(f"{args}: active {active} leaves out the shared experts; they run for every token")
        if active == ref_total and k < nr:
            fail(f"{args}: active equals total; a token only runs top_k={k} of the {nr} routed experts")
        expect_equal(total, ref_total, f"{args} total")
        expect_equal(active, ref_active, f"{args} active")
    return f"right for {len(cases)} configurations, DeepSeek-V3's and Mixtral's included"


# ---------------------------------------------------------------- 6.2

def _sorted_pairs(weights, indices):
    order = indices.argsort(dim=-1)
    return weights.gather(1, order), indices.gather(1, order)


@checker("6.2", "the DeepSeek-V3 gate")
def check_deepseek_gate(deepseek_gate):
    """deepseek_gate(logits, bias, top_k, n_group, topk_group, route_scale) -> (weights [T, k], indices [T, k])."""
    rng = random.Random()
    cases = [(257, 64, 8, 8, 4, 2.5), (33, 16, 2, 4, 2, 1.0), (rng.randint(1, 300), 96, 6, 12, 3, 2.0),
             (rng.randint(1, 300), 32, 4, 1, 1, 1.5)]
    for t, e, k, ng, tg, scale in cases:
        logits = torch.randn(t, e, dtype=torch.float64)
        bias = torch.randn(e, dtype=torch.float64) * 0.5
        args = f"T={t}, E={e}, top_k={k}, n_group={ng}, topk_group={tg}, route_scale={scale}"
        got = deepseek_gate(logits.clone(), bias.clone(), k, ng, tg, scale)
        expect(isinstance(got, (tuple, list)) and len(got) == 2, f"return (weights, indices); got {type(got)}")
        w, i = (torch.as_tensor(x) for x in got)
        expect(tuple(i.shape) == (t, k) and tuple(w.shape) == (t, k),
               f"{args}: weights and indices must be [T, top_k] = [{t}, {k}]; got {tuple(w.shape)} and "
               f"{tuple(i.shape)}")
        i = i.long()
        rw, ri = moe.deepseek_v3_gate(logits, bias, k, ng, tg, scale)
        gw, gi = _sorted_pairs(w.to(torch.float64), i)
        rw, ri = _sorted_pairs(rw, ri)
        if not torch.equal(gi, ri):
            for variant, why in (
                    (lambda: moe.deepseek_v3_gate(logits, bias, k, 1, 1, scale)[1],
                     "you ignored the group limit: keep only the topk_group groups with the largest sum of their "
                     "two best (biased) scores, then pick top_k experts inside them"),
                    (lambda: moe.deepseek_v3_gate(logits, None, k, ng, tg, scale)[1],
                     "the bias was not used to choose: experts are picked by sigmoid(logits) + bias"),
                    (lambda: _group_by_max(logits, bias, k, ng, tg),
                     "groups are ranked by the sum of their top-2 scores, not by their single best score")):
                if torch.equal(variant().sort(-1).values, gi):
                    fail(f"{args}: wrong experts chosen: {why}")
            row = int((gi != ri).any(-1).nonzero()[0])
            fail(f"{args}: token {row} got experts {gi[row].tolist()}, expected {ri[row].tolist()}")
        scores = torch.sigmoid(logits).gather(1, ri)
        biased = (torch.sigmoid(logits) + bias).gather(1, ri)
        if torch.allclose(gw, biased / biased.sum(-1, keepdim=True) * scale, rtol=1e-5):
            fail(f"{args}: the weights use the biased scores; the bias only chooses experts, the weights come "
                 f"from the unbiased sigmoid scores")
        if torch.allclose(gw, scores, rtol=1e-5):
            fail(f"{args}: the weights are the raw sigmoid scores; normalise them to sum 1 over the chosen "
                 f"experts, then multiply by route_scale")
        if scale != 1.0 and torch.allclose(gw, scores / scores.sum(-1, keepdim=True), rtol=1e-5):
            fail(f"{args}: the weights sum to 1; DeepSeek-V3 then multiplies them by route_scale={scale}")
        soft = torch.softmax(logits, -1).gather(1, ri)
        if torch.allclose(gw, soft / soft.sum(-1, keepdim=True) * scale, rtol=1e-5):
            fail(f"{args}: scores come from a sigmoid per expert in DeepSeek-V3, not a softmax")
        expect_close(gw, rw, f"{args}: weights (columns in expert order)", rtol=1e-5, atol=1e-7)
    return "sigmoid scores, bias for the choice only, group-limited top-k, normalised and scaled weights"


def _group_by_max(logits, bias, k, ng, tg):
    choice = torch.sigmoid(logits) + bias
    t, e = choice.shape
    gmax = choice.view(t, ng, e // ng).amax(-1)
    keep = gmax.topk(tg, -1).indices
    mask = torch.zeros(t, ng, dtype=torch.bool).scatter_(1, keep, True).repeat_interleave(e // ng, 1)
    return choice.masked_fill(~mask, float("-inf")).topk(k, -1).indices


# ---------------------------------------------------------------- 6.3

class _CountingExperts:
    """Wraps moe.Experts and counts forward calls (a grouped layer calls each expert at most once)."""

    def __init__(self, experts):
        self._experts = experts
        self.calls = 0
        self.rows = 0
        self.num_experts = experts.num_experts

    def forward(self, e, x):
        self.calls += 1
        self.rows += x.shape[0]
        return self._experts.forward(e, x)


@checker("6.3", "a sorted (grouped) MoE layer")
def check_moe_layer_sorted(moe_layer_sorted):
    """moe_layer_sorted(x [T, H], weights [T, k], indices [T, k], experts) -> [T, H], each expert called once."""
    rng = random.Random()
    for t, e, k, h in [(rng.randint(20, 120), 8, 2, 16), (rng.randint(1, 9), 16, 4, 8), (97, 6, 3, 12)]:
        x = torch.randn(t, h, dtype=torch.float64)
        experts = moe.make_experts(e, h, 24, seed=rng.randint(0, 10**6), dtype=torch.float64)
        logits = torch.randn(t, e, dtype=torch.float64)
        logits[:, 0] -= 50  # expert 0 receives no token: the layer must cope with empty slices
        w, i = moe.deepseek_v3_gate(logits, None, k, 1, 1, 2.0)
        counting = _CountingExperts(experts)
        args = f"T={t}, E={e}, k={k}"
        got = moe_layer_sorted(x.clone(), w.clone(), i.clone(), counting)
        expect(got is not None, "moe_layer_sorted returned None -- return the [T, H] output")
        got = torch.as_tensor(got)
        ref = moe.moe_dense_reference(x, w, i, experts)
        expect(tuple(got.shape) == (t, h), f"{args}: output must be [T, H] = [{t}, {h}], got {tuple(got.shape)}")
        unweighted = moe.moe_dense_reference(x, torch.ones_like(w), i, experts)
        if torch.allclose(got, unweighted, rtol=1e-6, atol=1e-9):
            fail(f"{args}: the expert outputs were summed without the gate weights; multiply each by its weight")
        expect(counting.calls <= e, f"{args}: the experts were called {counting.calls} times; sort the "
                                    f"assignments by expert and call each expert once on its contiguous slice")
        expect(counting.rows == t * k, f"{args}: the experts saw {counting.rows} rows in all; with T*k = {t * k} "
                                       f"assignments each (token, expert) pair is computed exactly once")
        expect_close(got, ref, f"{args}: output vs the dense masked reference", rtol=1e-6, atol=1e-9)
    return "matches the dense masked reference, one call per expert, empty experts handled"


# ---------------------------------------------------------------- 6.4

@checker("6.4", "the auxiliary-loss-free bias update")
def check_update_bias(update_bias):
    """update_bias(bias [E], load [E], gamma) -> new bias: + gamma for underloaded experts, - gamma for overloaded."""
    for e, gamma in [(8, 0.001), (64, 0.01), (random.randint(2, 300), random.uniform(1e-4, 0.1))]:
        bias = torch.randn(e, dtype=torch.float64) * 0.1
        load = torch.randint(0, 1000, (e,)).to(torch.float64)
        load[0] = load.mean()  # exactly balanced: no change
        expected = bias + gamma * torch.sign(load.mean() - load)
        got = update_bias(bias.clone(), load.clone(), gamma)
        expect(got is not None, "update_bias returned None -- return the new bias")
        got = torch.as_tensor(got, dtype=torch.float64)
        args = f"E={e}, gamma={gamma:.4g}"
        if torch.allclose(got, bias - gamma * torch.sign(load.mean() - load)):
            fail(f"{args}: the sign is reversed: an overloaded expert (load > mean) must become *less* "
                 f"attractive, so its bias goes down by gamma")
        if torch.allclose(got, bias + gamma * (load.mean() - load)) or \
                torch.allclose(got, bias + gamma * (load.mean() - load) / load.mean()):
            fail(f"{args}: the step is proportional to the imbalance; DeepSeek-V3 moves every bias by the same "
                 f"step gamma, up or down (sign of mean load - load)")
        expect_close(got, expected, f"{args}: new bias", rtol=1e-9, atol=1e-12)
    return "bias += gamma * sign(mean load - load): up when underloaded, down when overloaded"


# ---------------------------------------------------------------- 6.5

@checker("6.5", "nodes a token is sent to")
def check_expected_nodes(expected_nodes):
    """expected_nodes(num_experts, top_k, num_nodes) -> mean distinct nodes for k distinct experts drawn at random."""
    cases = [(8, 4, 2), (256, 8, 8), (256, 8, 32), (64, 1, 4), (16, 16, 4)] + [
        (n * m, random.randint(1, n * m), n) for n, m in [(random.randint(1, 16), random.randint(1, 16))]]
    for e, k, n in cases:
        got = expected_nodes(e, k, n)
        ref = moe.expected_distinct_nodes(e, k, n)
        with_replacement = n * (1 - (1 - 1 / n) ** k)
        if abs(ref - with_replacement) > 1e-6 and math.isclose(float(got), with_replacement, rel_tol=1e-9):
            fail(f"expected_nodes({e}, {k}, {n}) = {float(got):.6g} treats the k picks as independent (with "
                 f"replacement); a token picks k *different* experts: use C(E - E/nodes, k) / C(E, k) for the "
                 f"chance that a node gets none")
        expect_close(got, ref, f"expected_nodes({e}, {k}, {n})", rtol=1e-9)
    return f"right for {len(cases)} cases (nodes x (1 - C(E - E/nodes, k) / C(E, k)))"


# ---------------------------------------------------------------- 6.6

@checker("6.6", "EPLB: how many replicas per expert")
def check_replica_counts(replica_counts):
    """replica_counts(load [E], num_replicas) -> replicas per expert [E]: one each, then greedily to the expert
    with the largest load per replica."""
    rng = random.Random()
    cases = [(torch.tensor([10.0, 1, 4]), 6), (torch.tensor([90.0, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86]),
                                               16)]
    for _ in range(3):
        e = rng.randint(2, 40)
        cases.append(((torch.rand(e) ** 3 * 1000).round() + 1, e + rng.randint(0, 2 * e)))
    for load, r in cases:
        got = replica_counts(load.clone(), r)
        expect(got is not None, "replica_counts returned None -- return the count per expert")
        got = [int(v) for v in torch.as_tensor(got).reshape(-1).tolist()]
        _, _, ref = eplb.replicate_experts(load.unsqueeze(0), r)
        ref = ref[0].tolist()
        args = f"replica_counts(load of {len(load)} experts, num_replicas={r})"
        expect(len(got) == len(ref), f"{args}: return one count per expert ({len(ref)}), got {len(got)}")
        expect(min(got) >= 1, f"{args}: every expert needs at least one replica; got a count of {min(got)}")
        expect(sum(got) == r, f"{args}: the counts must add up to num_replicas={r}; they add up to {sum(got)}")
        heaviest = [1] * len(ref)
        heaviest[int(load.argmax())] += r - len(ref)
        if got == heaviest and got != ref:
            fail(f"{args}: all spare replicas went to the heaviest expert; give each spare to the expert whose "
                 f"load *per replica* (load / count) is largest right now")
        expect_equal(got, ref, args)
    return "one replica each, then each spare to the largest load per replica (DeepSeek's EPLB rule)"
