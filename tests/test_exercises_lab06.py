"""Lab 06 checkers: a right answer passes, each classic mistake fails with a telling message, a stub is 'not attempted'."""
import math
import re

import pytest
import torch

from common.core.checks import CheckFailed
from common.exercises import eplb_place, lab06
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

def dispatch_combine(x, weights, indices, experts, mistake=None):
    """The exercise written out (permute, grouped compute, inverse permutation, gate weights), with one named
    mistake where asked."""
    t, k = indices.shape
    flat = indices.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=experts.num_experts)
    token = order % k if mistake == "token_mod_k" else order // k
    w_in = weights.reshape(-1)[order].unsqueeze(1).to(x.dtype)
    x_sorted = x[token] * (w_in if mistake == "weights_twice" else 1.0)
    pieces, start = [], 0
    for e, n in enumerate(counts.tolist()):
        if mistake == "per_token":
            pieces += [experts.forward(e, x_sorted[start + i:start + i + 1]) for i in range(n)]
        elif mistake == "dense":
            pieces.append(experts.forward(e, x)[token[start:start + n]])
        elif n:
            rows = x_sorted[:n] if mistake == "no_offsets" else x_sorted[start:start + n]
            pieces.append(experts.forward(e, rows))
        start += n
    y_sorted = torch.cat(pieces)
    if mistake in ("index_add", "token_mod_k", "weights_not_permuted", "overwrite", "no_offsets", "capacity"):
        w = weights.reshape(-1).unsqueeze(1).to(x.dtype) if mistake == "weights_not_permuted" else w_in
        if mistake == "capacity":
            cap = -(-t * k // experts.num_experts)
            rank = torch.arange(t * k) - (torch.cumsum(counts, 0) - counts)[flat[order]]
            w = w * (rank < cap).to(x.dtype).unsqueeze(1)
        if mistake == "overwrite":
            out = torch.zeros_like(x)
            out[token] = y_sorted * w
            return out
        return torch.zeros_like(x).index_add_(0, token, y_sorted * w)
    inverse = order if mistake == "inverse_is_order" else torch.argsort(order)
    y = y_sorted[inverse].view(t, k, -1)
    w = {"no_weights": torch.ones_like(weights), "renormalised": weights / weights.sum(-1, keepdim=True)}.get(
        mistake, weights)
    if mistake == "detached":
        w = torch.tensor(weights.tolist(), dtype=weights.dtype)
    if mistake == "first_only":
        return y[:, 0] * w[:, :1].to(y.dtype)
    return (y * w.unsqueeze(-1).to(y.dtype)).sum(1)


def test_dispatch_combine_right():
    assert lab06.check_dispatch_combine(dispatch_combine).passed
    assert lab06.check_dispatch_combine(dispatch_combine, seed=7).passed
    # the combine as index_add_ in expert order: another order of additions, the same bits on the exact cases
    assert lab06.check_dispatch_combine(lambda x, w, i, ex: dispatch_combine(x, w, i, ex, "index_add")).passed


DISPATCH_MISTAKES = [
    ("inverse_is_order", "used `order` itself"), ("token_mod_k", "not a % k"), ("weights_twice", "applied twice"),
    ("no_weights", "gate weights are missing"), ("weights_not_permuted", "weight of its own assignment"),
    ("renormalised", "renormalised"), ("first_only", "only the first of the k"), ("capacity", "capacity"),
    ("overwrite", "overwrites"), ("no_offsets", "starts where the previous one ended"),
    ("per_token", "once per .token, expert. pair"), ("dense", "every expert ran on every token"),
    ("detached", "no gradient reaches the gate weights"),
]


@pytest.mark.parametrize("mistake, words", DISPATCH_MISTAKES, ids=[m for m, _ in DISPATCH_MISTAKES])
def test_dispatch_combine_mistakes_named(mistake, words):
    with pytest.raises(CheckFailed, match=words):
        lab06.check_dispatch_combine(lambda x, w, i, ex: dispatch_combine(x, w, i, ex, mistake))


def test_dispatch_combine_references_inputs_and_stub():
    with pytest.raises(CheckFailed, match="called common.moe.moe.moe_grouped"):
        lab06.check_dispatch_combine(lambda *a: moe.moe_grouped(*a))
    with pytest.raises(CheckFailed, match="called common.moe.moe.dispatch_plan"):
        lab06.check_dispatch_combine(lambda x, w, i, ex: moe.combine(dispatch_combine(x, w, i, ex)[
            moe.dispatch_plan(i, ex.num_experts).token_index], moe.dispatch_plan(i, ex.num_experts), w, x.shape[0]))

    def modifies(x, w, i, ex):
        out = dispatch_combine(x, w, i, ex)
        i.zero_()
        return out
    with pytest.raises(CheckFailed, match="modified its input `indices`"):
        lab06.check_dispatch_combine(modifies)
    with pytest.raises(CheckFailed, match="return the .T, H. output tensor"):
        lab06.check_dispatch_combine(lambda *a: None)
    assert lab06.check_dispatch_combine(_stub).status == "not attempted"


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


# ---------------------------------------------------------------- 6.7

def place(load, num_replicas, num_gpus):
    """The exercise written out: replicate greedily by load per replica, pack heaviest first into the lightest GPU
    with a free slot."""
    e = load.numel()
    count = torch.ones(e, dtype=torch.int64)
    for _ in range(num_replicas - e):
        count[int((load / count).argmax())] += 1
    replicas = [x for x in range(e) for _ in range(int(count[x]))]
    per_replica = [float(load[x] / count[x]) for x in replicas]
    per_gpu = num_replicas // num_gpus
    slots, gpu_load = [[] for _ in range(num_gpus)], [0.0] * num_gpus
    for i in sorted(range(len(replicas)), key=lambda i: -per_replica[i]):
        g = min((g for g in range(num_gpus) if len(slots[g]) < per_gpu), key=lambda g: gpu_load[g])
        slots[g].append(replicas[i])
        gpu_load[g] += per_replica[i]
    return torch.tensor([x for g in slots for x in g])


def _from_gpus(gpus):
    return torch.tensor([x for g in gpus for x in g])


def test_place_replicas_right():
    assert lab06.check_place_replicas(place).passed
    assert lab06.check_place_replicas(place, seed=11).passed


def test_place_replicas_slot_order_inside_a_gpu_is_free():
    def shuffled(load, r, g):
        per_gpu = r // g
        return torch.cat([s.flip(0) for s in place(load, r, g).split(per_gpu)]).tolist()  # a list, GPUs reversed inside
    assert lab06.check_place_replicas(shuffled).passed


@pytest.mark.parametrize("mistake", list(eplb_place.MISTAKES), ids=list(eplb_place.MISTAKES))
def test_place_replicas_mistakes_named(mistake):
    words = eplb_place.MISTAKES[mistake].split(":")[0][:40]
    with pytest.raises(CheckFailed, match=re.escape(words)):
        lab06.check_place_replicas(lambda load, r, g: _from_gpus(eplb_place.placement(load, r, g, mistake)))


def test_place_replicas_layout_and_validity_named():
    def interleaved(load, r, g):  # GPU g's slots at g, g + G, g + 2G, ...
        per_gpu = r // g
        gpus = eplb_place.placement(load, r, g)
        return torch.tensor([gpus[i % g][i // g] for i in range(r)])
    with pytest.raises(CheckFailed, match="GPU p % num_gpus"):
        lab06.check_place_replicas(interleaved)
    with pytest.raises(CheckFailed, match="returned .* slots"):
        lab06.check_place_replicas(lambda load, r, g: place(load, r, g)[:-1])
    with pytest.raises(CheckFailed, match="must be expert ids"):
        lab06.check_place_replicas(lambda load, r, g: place(load, r, g) + 1)
    with pytest.raises(CheckFailed, match="has no replica"):
        lab06.check_place_replicas(lambda load, r, g: torch.where(place(load, r, g) == 0, 1, place(load, r, g)))
    with pytest.raises(CheckFailed, match="rebalance_experts"):
        lab06.check_place_replicas(lambda load, r, g: eplb.rebalance_experts(load[None], r, 1, 1, g)[0][0])
    assert lab06.check_place_replicas(_stub).status == "not attempted"


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


# ---------------------------------------------------------------- issue 46: right answers written differently, and
# the library watch (nothing of common.moe is handed out in this lab)

def test_right_answers_written_differently():
    def ffn_per_layer(h, f, nr, ns, k, L):  # a loop over layers, router and experts counted apart
        total = active = 0
        for _ in range(L):
            total += nr * h + (nr + ns) * 3 * h * f
            active += nr * h + (k + ns) * 3 * h * f
        return [total, active]
    assert lab06.check_moe_ffn_params(ffn_per_layer).passed

    def gate_by_sort(logits, bias, k, ng, tg, scale):  # argsort instead of topk, torch.where instead of masked_fill
        scores = logits.sigmoid()
        choice = scores + bias
        t, e = choice.shape
        top2 = choice.view(t, ng, -1).sort(-1, descending=True).values[..., :2].sum(-1)
        kept = top2.argsort(-1, descending=True)[:, :tg]
        in_kept = (torch.arange(e).view(1, 1, e) // (e // ng) == kept.unsqueeze(-1)).any(1)
        idx = torch.where(in_kept, choice, torch.full_like(choice, -math.inf)).argsort(-1, descending=True)[:, :k]
        w = scores.gather(1, idx)
        return (scale * w / w.sum(1, keepdim=True)).float(), idx
    assert lab06.check_deepseek_gate(gate_by_sort).passed

    def layer_by_masks(x, weights, indices, experts):  # each expert once, on the tokens that chose it
        out = torch.zeros_like(x)
        for e in range(experts.num_experts):
            tok, slot = (indices == e).nonzero(as_tuple=True)
            if tok.numel():
                out = out.index_add(0, tok, experts.forward(e, x[tok]) * weights[tok, slot].unsqueeze(1).to(x.dtype))
        return out
    assert lab06.check_dispatch_combine(layer_by_masks).passed

    def nodes_by_product(e, k, n):  # P(a node gets none) as a product of k draws without replacement
        none = 1.0
        for i in range(k):
            none *= (e - e // n - i) / (e - i)
        return n * (1 - none)
    assert lab06.check_expected_nodes(nodes_by_product).passed

    def counts_by_heap(load, r):
        import heapq
        count = [1] * len(load)
        heap = [(-float(v), i) for i, v in enumerate(load)]
        heapq.heapify(heap)
        for _ in range(r - len(load)):
            _, i = heapq.heappop(heap)
            count[i] += 1
            heapq.heappush(heap, (-float(load[i]) / count[i], i))
        return count
    assert lab06.check_replica_counts(counts_by_heap).passed

    def place_as_list(load, r, g):  # a list of ints, GPUs filled by a heap of (load, gpu)
        import heapq
        count = [int(c) for c in _counts(load, r)]
        reps = sorted(((float(load[x]) / count[x], x) for x in range(len(count)) for _ in range(count[x])),
                      reverse=True)
        heap, slots = [(0.0, i) for i in range(g)], [[] for _ in range(g)]
        for w, x in reps:
            full = []
            while True:
                gl, i = heapq.heappop(heap)
                if len(slots[i]) < r // g:
                    break
                full.append((gl, i))
            slots[i].append(x)
            heapq.heappush(heap, (gl + w, i))
            for item in full:
                heapq.heappush(heap, item)
        return [x for s in slots for x in s]
    assert lab06.check_place_replicas(place_as_list).passed


def test_library_helpers_that_do_the_exercise_are_refused():
    with pytest.raises(CheckFailed, match="called common.moe.moe.moe_dense_reference"):
        lab06.check_dispatch_combine(lambda x, w, i, ex: moe.moe_dense_reference(x, w, i, ex))
    with pytest.raises(CheckFailed, match="called common.moe.eplb.balanced_packing"):
        lab06.check_place_replicas(lambda load, r, g: (eplb.balanced_packing(load[None], g), place(load, r, g))[1])
    with pytest.raises(CheckFailed, match="called common.moe.eplb.replicate_experts"):
        lab06.check_place_replicas(lambda load, r, g: (eplb.replicate_experts(load[None], r), place(load, r, g))[1])
    with pytest.raises(CheckFailed, match="called common.moe.moe.deepseek_v3_gate"):
        lab06.check_dispatch_combine(lambda x, w, i, ex: (moe.deepseek_v3_gate(x @ x.T[:, :8], None, 2, 1, 1, 1.0),
                                                          dispatch_combine(x, w, i, ex))[1])


def test_the_grader_sees_the_same_library_watch(monkeypatch):
    """Through the grader's wire (common.exercises.remote's loopback), a call into common.moe is refused the same way."""
    from common.core import checks
    from common.exercises import remote
    monkeypatch.setattr(checks, "submission_hook", remote.loopback_hook)
    with pytest.raises(CheckFailed, match="called common.moe.eplb.balanced_packing"):
        lab06.check_place_replicas(lambda load, r, g: (eplb.balanced_packing(load[None], g), place(load, r, g))[1])
    assert lab06.check_place_replicas(place).passed
