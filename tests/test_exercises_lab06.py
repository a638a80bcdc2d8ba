"""Lab 06 checkers: a right answer passes, each classic mistake fails with a telling message, a stub is 'not attempted'."""
import math

import pytest
import torch

from common.core.checks import CheckFailed
from common.exercises import lab06
from common.moe import eplb, moe


def _stub(*args, **kwargs):
    raise NotImplementedError("Exercise 6.x: replace this line with your code")


# ---------------------------------------------------------------- 6.1

def _ffn(h, f, nr, ns, k, L, mats=3, gate=True, shared_active=True, active_all=False):
    expert = mats * h * f
    g = L * nr * h if gate else 0
    total = L * (nr + ns) * expert + g
    active = L * ((nr if active_all else k) + (ns if shared_active else 0)) * expert + g
    return total, active


def test_moe_ffn_params():
    assert lab06.check_moe_ffn_params(_ffn).passed
    with pytest.raises(CheckFailed, match="three"):
        lab06.check_moe_ffn_params(lambda *a: _ffn(*a, mats=2))
    with pytest.raises(CheckFailed, match="router is missing"):
        lab06.check_moe_ffn_params(lambda *a: _ffn(*a, gate=False))
    with pytest.raises(CheckFailed, match="leaves out the shared experts"):
        lab06.check_moe_ffn_params(lambda *a: _ffn(*a, shared_active=False))
    with pytest.raises(CheckFailed, match="active equals total"):
        lab06.check_moe_ffn_params(lambda *a: _ffn(*a, active_all=True))
    with pytest.raises(CheckFailed, match="pair"):
        lab06.check_moe_ffn_params(lambda *a: _ffn(*a)[0])
    assert lab06.check_moe_ffn_params(_stub).status == "not attempted"


# ---------------------------------------------------------------- 6.2

def _gate(logits, bias, k, ng, tg, scale, biased_weights=False, groups=True, use_bias=True, normalise=True,
          scaled=True, softmax=False, group_by_max=False):
    scores = torch.softmax(logits, -1) if softmax else torch.sigmoid(logits)
    choice = scores + bias if use_bias else scores.clone()
    t, e = choice.shape
    if groups:
        grouped = choice.view(t, ng, e // ng)
        gscore = grouped.amax(-1) if group_by_max else grouped.topk(min(2, e // ng), -1).values.sum(-1)
        keep = gscore.topk(tg, -1).indices
        mask = torch.zeros(t, ng, dtype=torch.bool).scatter_(1, keep, True).repeat_interleave(e // ng, 1)
        choice = choice.masked_fill(~mask, float("-inf"))
    idx = choice.topk(k, -1).indices
    w = (scores + bias if biased_weights else scores).gather(1, idx)
    if normalise:
        w = w / w.sum(-1, keepdim=True)
    if scaled and normalise:
        w = w * scale
    return w, idx


def test_deepseek_gate():
    assert lab06.check_deepseek_gate(_gate).passed
    # any order of the k chosen experts is accepted
    def shuffled(*a):
        w, i = _gate(*a)
        perm = torch.randperm(i.shape[1])
        return w[:, perm], i[:, perm]
    assert lab06.check_deepseek_gate(shuffled).passed
    with pytest.raises(CheckFailed, match="called common.moe.moe.deepseek_v3_gate, the reference"):
        lab06.check_deepseek_gate(lambda *a: moe.deepseek_v3_gate(*a))
    cases = [(dict(groups=False), "ignored the group limit"),
             (dict(use_bias=False), "bias was not used to choose"),
             (dict(group_by_max=True), "sum of their top-2 scores"),
             (dict(biased_weights=True), "weights use the biased scores"),
             (dict(normalise=False), "raw sigmoid scores"),
             (dict(scaled=False), "multiplies them by route_scale"),
             (dict(softmax=True), "not a softmax|experts")]
    for kw, match in cases:
        with pytest.raises(CheckFailed, match=match):
            lab06.check_deepseek_gate(lambda *a, kw=kw: _gate(*a, **kw))
    with pytest.raises(CheckFailed, match=r"\[T, top_k\]"):
        lab06.check_deepseek_gate(lambda *a: (_gate(*a)[0][:, :1], _gate(*a)[1][:, :1]))
    assert lab06.check_deepseek_gate(_stub).status == "not attempted"


# ---------------------------------------------------------------- 6.3

def _sorted_layer(x, weights, indices, experts, weighted=True, token_of=lambda order, k: order // k):
    t, k = indices.shape
    flat = indices.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=experts.num_experts).tolist()
    tok = token_of(order, k)
    xs = x[tok]
    ys = torch.empty_like(xs)
    start = 0
    for e, n in enumerate(counts):
        if n:
            ys[start:start + n] = experts.forward(e, xs[start:start + n])
        start += n
    w = weights.reshape(-1)[order] if weighted else torch.ones(t * k, dtype=x.dtype)
    return torch.zeros_like(x).index_add_(0, tok, ys * w.unsqueeze(1))


def _per_token_layer(x, weights, indices, experts):
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(indices.shape[1]):
            out[t] += weights[t, j] * experts.forward(int(indices[t, j]), x[t:t + 1])[0]
    return out


def test_moe_layer_sorted():
    assert lab06.check_moe_layer_sorted(_sorted_layer).passed
    with pytest.raises(CheckFailed, match="called common.moe.moe.moe_grouped"):
        lab06.check_moe_layer_sorted(lambda *a: moe.moe_grouped(*a))
    with pytest.raises(CheckFailed, match="without the gate weights"):
        lab06.check_moe_layer_sorted(lambda *a: _sorted_layer(*a, weighted=False))
    with pytest.raises(CheckFailed, match="called .* times"):
        lab06.check_moe_layer_sorted(_per_token_layer)
    with pytest.raises(CheckFailed, match="dense masked reference"):
        lab06.check_moe_layer_sorted(lambda *a: _sorted_layer(*a, token_of=lambda order, k: order % a[0].shape[0]))
    with pytest.raises(CheckFailed, match="returned None"):
        lab06.check_moe_layer_sorted(lambda *a: None)
    assert lab06.check_moe_layer_sorted(_stub).status == "not attempted"


# ---------------------------------------------------------------- 6.4

def test_update_bias():
    assert lab06.check_update_bias(lambda b, load, g: b + g * torch.sign(load.mean() - load)).passed
    with pytest.raises(CheckFailed, match="sign is reversed"):
        lab06.check_update_bias(lambda b, load, g: b + g * torch.sign(load - load.mean()))
    with pytest.raises(CheckFailed, match="proportional"):
        lab06.check_update_bias(lambda b, load, g: b + g * (load.mean() - load))
    with pytest.raises(CheckFailed, match=r"expert \d+ \(load"):
        lab06.check_update_bias(lambda b, load, g: b + g * torch.sign(load.median() - load))
    assert lab06.check_update_bias(_stub).status == "not attempted"


# ---------------------------------------------------------------- 6.5

def test_expected_nodes():
    right = lambda e, k, n: n * (1 - math.comb(e - e // n, k) / math.comb(e, k))
    assert lab06.check_expected_nodes(right).passed
    with pytest.raises(CheckFailed, match="with replacement"):
        lab06.check_expected_nodes(lambda e, k, n: n * (1 - (1 - 1 / n) ** k))
    with pytest.raises(CheckFailed, match="expected_nodes"):
        lab06.check_expected_nodes(lambda e, k, n: min(k, n))
    assert lab06.check_expected_nodes(_stub).status == "not attempted"


# ---------------------------------------------------------------- 6.6

def _counts(load, r):
    cnt = torch.ones(len(load), dtype=torch.int64)
    for _ in range(r - len(load)):
        cnt[int((load / cnt).argmax())] += 1
    return cnt


def test_replica_counts():
    assert lab06.check_replica_counts(_counts).passed
    with pytest.raises(CheckFailed, match="called common.moe.eplb.replicate_experts"):
        lab06.check_replica_counts(lambda load, r: eplb.replicate_experts(load[None], r)[2][0])
    def heaviest(load, r):
        cnt = torch.ones(len(load), dtype=torch.int64)
        cnt[int(load.argmax())] += r - len(load)
        return cnt
    with pytest.raises(CheckFailed, match="per replica"):
        lab06.check_replica_counts(heaviest)
    def proportional(load, r):
        return (load / load.sum() * r).round().clamp(min=1).long()
    with pytest.raises(CheckFailed, match="add up to|replica_counts"):
        lab06.check_replica_counts(proportional)
    with pytest.raises(CheckFailed, match="at least one replica"):
        lab06.check_replica_counts(lambda load, r: torch.cat([torch.zeros(1, dtype=torch.long), _counts(load, r)[1:]]))
    assert lab06.check_replica_counts(_stub).status == "not attempted"


# ---------------------------------------------------------------- issue 12: the classes of holes, per checker

def test_ffn_params_mistakes_named_by_their_own_formula():
    def active_two_mats(*a):
        t, act = _ffn(*a)
        h, f, nr, ns, k, L = a
        return t, act - L * (k + ns) * h * f
    with pytest.raises(CheckFailed, match="active .* counts 2 matrices"):
        lab06.check_moe_ffn_params(active_two_mats)
    def gate_topk_rows(*a):
        t, act = _ffn(*a)
        h, f, nr, ns, k, L = a
        return t, act - L * (nr - k) * h
    with pytest.raises(CheckFailed, match="only top_k=8 rows of the router"):
        lab06.check_moe_ffn_params(gate_topk_rows)
    with pytest.raises(CheckFailed, match="one layer's count"):
        lab06.check_moe_ffn_params(lambda h, f, nr, ns, k, L: _ffn(h, f, nr, ns, k, 1))
    with pytest.raises(CheckFailed, match=r"moe_ffn_params\(7168, .*raised ZeroDivisionError"):
        lab06.check_moe_ffn_params(lambda *a: 1 / 0)
    with pytest.raises(CheckFailed, match="pair of ints; got str"):
        lab06.check_moe_ffn_params(lambda *a: "12")


def test_gate_negative_biased_scores_and_seed():
    # masking the dropped groups with 0 instead of -inf only shows when biased scores are negative
    def zero_fill(logits, bias, k, ng, tg, scale):
        return _zero_filled_gate(logits, bias, k, ng, tg, scale)
    with pytest.raises(CheckFailed, match=r"masked with 0.*seed \d+"):
        lab06.check_deepseek_gate(zero_fill)
    # float32 weights are a right answer
    assert lab06.check_deepseek_gate(lambda *a: (_gate(*a)[0].float(), _gate(*a)[1].int())).passed
    with pytest.raises(CheckFailed, match="return \\(weights, indices\\); got dict"):
        lab06.check_deepseek_gate(lambda *a: {"w": 1})


def _zero_filled_gate(logits, bias, k, ng, tg, scale):
    scores = torch.sigmoid(logits)
    choice = scores + bias
    t, e = choice.shape
    grouped = choice.view(t, ng, e // ng)
    keep = grouped.topk(min(2, e // ng), -1).values.sum(-1).topk(tg, -1).indices
    mask = torch.zeros(t, ng, dtype=torch.bool).scatter_(1, keep, True).repeat_interleave(e // ng, 1)
    idx = (choice * mask).topk(k, -1).indices  # dropped groups become 0
    w = scores.gather(1, idx)
    return w / w.sum(-1, keepdim=True) * scale, idx


def test_moe_layer_must_not_modify_its_input():
    def in_place(x, w, i, experts):
        out = _sorted_layer(x, w, i, experts)
        w.mul_(0)
        return out
    with pytest.raises(CheckFailed, match="modified its input `weights`"):
        lab06.check_moe_layer_sorted(in_place)


def test_update_bias_zero_step_ties_and_float32():
    # torch.where with Python floats computes the step in float32: a right answer
    assert lab06.check_update_bias(lambda b, load, g: b + torch.where(load > load.mean(), -g, torch.where(
        load < load.mean(), g, 0.0))).passed
    # a comparison that puts the expert sitting exactly on the mean on one side
    with pytest.raises(CheckFailed, match="exactly the mean load"):
        lab06.check_update_bias(lambda b, load, g: b + torch.where(load > load.mean(), -g, g))
    with pytest.raises(CheckFailed, match="exactly the mean load"):
        lab06.check_update_bias(lambda b, load, g: b - torch.where(load >= load.mean(), g, -g))
    with pytest.raises(CheckFailed, match="must be \\[E\\]"):
        lab06.check_update_bias(lambda b, load, g: (b + g * torch.sign(load.mean() - load))[:-1])


def test_expected_nodes_upper_bound_named():
    with pytest.raises(CheckFailed, match="most nodes a token can reach"):
        lab06.check_expected_nodes(lambda e, k, n: min(k, n))


def test_replica_counts_ties_either_way_and_wrong_types():
    def last_argmax(load, r):
        cnt = torch.ones(len(load), dtype=torch.int64)
        for _ in range(r - len(load)):
            ratio = (load / cnt).flip(0)
            cnt[len(load) - 1 - int(ratio.argmax())] += 1
        return cnt
    assert lab06.check_replica_counts(last_argmax).passed
    with pytest.raises(CheckFailed, match="one integer count per expert"):
        lab06.check_replica_counts(lambda load, r: {"counts": 1})


def test_gate_must_not_modify_its_input():
    def in_place(logits, bias, k, ng, tg, scale):
        w, i = _gate(logits, bias, k, ng, tg, scale)
        logits.sigmoid_()
        return w, i
    with pytest.raises(CheckFailed, match="modified its input `logits`"):
        lab06.check_deepseek_gate(in_place)


def test_replica_counts_largest_remainders_named():
    """Largest remainders (Hamilton) agree with the greedy rule on most small loads: it passed on about 2% of draws.
    A fixed case where they differ names it, for both ways of writing it."""
    import math

    def hamilton(load, r):  # one replica each, then the spares in proportion, leftovers to the largest remainders
        load = load.tolist()
        quota = [x * (r - len(load)) / sum(load) for x in load]
        counts = [1 + math.floor(q) for q in quota]
        for i in sorted(range(len(load)), key=lambda i: quota[i] - math.floor(quota[i]), reverse=True):
            if sum(counts) < r:
                counts[i] += 1
        return counts

    for _ in range(3):
        with pytest.raises(CheckFailed, match="largest remainders"):
            lab06.check_replica_counts(hamilton)
