"""Lab 06's named wrong answers (MoE routing): look-alike counts, gates, layers and placements, and calls into the
workbook (common.moe) that do the exercise. Right answers written differently are in tests/test_exercises_lab06.py."""
import math
import re

import torch

from common.exercises import eplb_place, lab06
from common.moe import eplb, moe
from test_exercises_lab06 import DISPATCH_MISTAKES, _counts, _ffn, _from_gpus, _gate, dispatch_combine, place


# ------------------------------------------------------------------------------------------------ 6.1
def _params(h, f, nr, ns, k, L, matrices=3, router=True, shared=True, layers=True, router_layers=True):
    per = matrices * h * f
    gate = nr * h if router else 0
    n = L if layers else 1
    g = n * gate if router_layers else gate
    return (n * (nr + (ns if shared else 0)) * per + g, n * (k + (ns if shared else 0)) * per + g)


# ------------------------------------------------------------------------------------------------ 6.2
def _ranked(logits, bias, k, ng, tg, scale, rank="top2", largest=True, fill=float("-inf")):
    """A learner's gate whose groups are ranked by `rank`, the largest (or smallest) kept, dropped ones set to
    `fill`."""
    scores = torch.sigmoid(logits)
    choice = scores + bias
    t, e = choice.shape
    grouped = choice.view(t, ng, e // ng)
    gscore = grouped.sum(-1) if rank == "sum" else grouped.topk(min(2, e // ng), -1).values.sum(-1)
    keep = gscore.topk(tg, -1, largest=largest).indices
    mask = torch.zeros(t, ng, dtype=torch.bool).scatter_(1, keep, True).repeat_interleave(e // ng, 1)
    idx = choice.masked_fill(~mask, fill).topk(k, -1).indices
    w = scores.gather(1, idx)
    return w / w.sum(-1, keepdim=True) * scale, idx


def _in_place(logits, bias, k, ng, tg, scale):
    logits.sigmoid_()  # the scores in place: the caller's logits are gone
    return _gate(torch.logit(logits.clone()), bias, k, ng, tg, scale)


# ------------------------------------------------------------------------------------------------ 6.5
def _nodes(e, k, n, per=None, picks=None, mean=True):
    per = e // n if per is None else per
    picks = k if picks is None else picks
    none = math.comb(e - per, picks) / math.comb(e, picks)
    return n * (1 - none) if mean else 1 - none


# ------------------------------------------------------------------------------------------------ 6.6
def _by_rule(load, r, rule):
    cnt = torch.ones(len(load), dtype=torch.float64)
    for i in range(r - len(load)):
        per = load.double() / (cnt + (1 if rule == "plus_one" else 0))
        j = i % len(load) if rule == "in_order" else int(per.argmin() if rule == "smallest" else per.argmax())
        cnt[j] += 1
    return cnt.long()


def _heaviest(load, r):
    cnt = torch.ones(len(load), dtype=torch.int64)
    cnt[int(load.argmax())] += r - len(load)
    return cnt


def _too_many_spares(load, r):
    cnt = torch.ones(len(load), dtype=torch.int64)
    for _ in range(r):  # num_replicas spares on top of one each
        cnt[int((load / cnt).argmax())] += 1
    return cnt


def _hamilton(load, r):
    quota = load.double() * (r - len(load)) / load.sum()  # one each, then shares of the spares
    cnt = 1 + quota.floor().long()
    frac = quota - quota.floor()
    for i in frac.argsort(descending=True)[:max(0, r - int(cnt.sum()))].tolist():
        cnt[i] += 1
    return cnt


def _interleaved(load, r, g):
    gpus = eplb_place.placement(load, r, g)
    return torch.tensor([gpus[i % g][i // g] for i in range(r)])


WRONG = {
    lab06.check_moe_ffn_params: [
        (lambda *a: _params(*a, matrices=2), "2 matrices per expert"),
        (lambda *a: _params(*a, router=False), "router is missing"),
        (lambda *a: _params(*a, layers=False), "one layer's count"),
        (lambda h, f, nr, ns, k, L: (_ffn(h, f, nr, ns, k, L)[0], _ffn(h, f, nr, ns, k, L)[1] - L * (k + ns) * h * f),
         "active .* counts 2 matrices"),
        (lambda h, f, nr, ns, k, L: (_ffn(h, f, nr, ns, k, L)[0], _ffn(h, f, nr, ns, k, L)[1] - L * (nr - k) * h),
         "only top_k=.* rows of the router"),
        (lambda *a: _ffn(*a, shared_active=False), "active .* leaves out the shared experts"),
        (lambda *a: _ffn(*a, active_all=True), "active equals total"),
        (lambda *a: _ffn(*a)[::-1], "swapped"),
        (lambda *a: (_params(*a, shared=False)[0], _params(*a)[1]), "total .* leaves out the shared experts"),
        (lambda *a: _params(*a, router_layers=False), "router is counted once"),
        (lambda *a: _ffn(*a)[0], "pair"),
    ],
    lab06.check_deepseek_gate: [
        (lambda *a: _gate(*a, groups=False), "ignored the group limit"),
        (lambda *a: _gate(*a, use_bias=False), "bias was not used to choose"),
        (lambda *a: _gate(*a, group_by_max=True), "sum of their top-2 scores"),
        (lambda *a: _ranked(*a, rank="sum"), "not the sum of all their scores"),
        (lambda *a: _ranked(*a, largest=False), "SMALLEST scores"),
        (lambda *a: _ranked(*a, fill=0.0), "masked with 0"),
        (lambda *a: _gate(*a, biased_weights=True), "weights use the biased scores"),
        (lambda *a: _gate(*a, normalise=False), "raw sigmoid scores"),
        (lambda *a: _gate(*a, scaled=False), "multiplies them by route_scale"),
        (lambda *a: _gate(*a, softmax=True), "wrong experts chosen: scores come from a sigmoid"),
        (lambda *a: (_gate(*a)[0][:, :1], _gate(*a)[1][:, :1]), r"\[T, top_k\]"),
        (_in_place, "modified its input `logits` in place"),
        (lambda *a: moe.deepseek_v3_gate(*a), "called common.moe.moe.deepseek_v3_gate, the reference"),
    ],
    lab06.check_update_bias: [  # one line of solution: no bar, these three moved from test_wrong_answers_late.py
        (lambda bias, load, g: bias - g * torch.sign(load.mean() - load), "sign is reversed"),
        (lambda bias, load, g: bias + g * (load.mean() - load), "proportional to the imbalance"),
        (lambda bias, load, g: bias + g * torch.where(load < load.mean(), 1.0, -1.0), "exactly the mean load"),
    ],
    lab06.check_dispatch_combine: [
        *[(lambda x, w, i, ex, m=m: dispatch_combine(x, w, i, ex, m), words) for m, words in DISPATCH_MISTAKES],
        (lambda *a: moe.moe_grouped(*a), "called common.moe.moe.moe_grouped"),
        (lambda x, w, i, ex: moe.combine(dispatch_combine(x, w, i, ex)[moe.dispatch_plan(i, ex.num_experts)
                                                                        .token_index],
                                         moe.dispatch_plan(i, ex.num_experts), w, x.shape[0]),
         "called common.moe.moe.dispatch_plan"),
    ],
    lab06.check_expected_nodes: [
        (lambda e, k, n: n * (1 - (1 - 1 / n) ** k), "with replacement"),
        (lambda e, k, n: min(k, n), "most nodes a token can reach"),
        (lambda e, k, n: moe.expected_distinct_nodes(e, k, n), "expected_distinct_nodes, the reference"),
        (lambda e, k, n: _nodes(e, k, n, mean=False), "one node's chance"),
        (lambda e, k, n: n - _nodes(e, k, n), "does NOT reach"),
        (lambda e, k, n: _nodes(e, k, n, per=n), "uses E - nodes"),
        (lambda e, k, n: _nodes(e, k, n, picks=k - 1) if k > 1 else _nodes(e, k, n), "k - 1 picks"),
        (lambda e, k, n: round(_nodes(e, k, n)), "rounded"),
        (lambda e, k, n: math.floor(_nodes(e, k, n)), "truncated"),
        (lambda e, k, n: (_nodes(e, k, n),), "expected a number of nodes"),
        (lambda e, k, n: n * (1 - math.comb(e - e / n, k) / math.comb(e, k)), "raised TypeError"),  # E / N, a float
    ],
    lab06.check_replica_counts: [
        (_heaviest, "heaviest expert"),
        (lambda load, r: eplb.replicate_experts(load[None], r)[2][0], "called common.moe.eplb.replicate_experts"),
        (lambda load, r: torch.cat([torch.zeros(1, dtype=torch.long), _counts(load, r)[1:]]), "at least one replica"),
        (_hamilton, "largest remainders"),
        (lambda load, r: _by_rule(load, r, "in_order"), "in turn"),
        (lambda load, r: _by_rule(load, r, "smallest"), "SMALLEST load per replica"),
        (lambda load, r: _by_rule(load, r, "plus_one"), r"load / \(count \+ 1\)"),
        (lambda load, r: _counts(load, r).sort().values, "sorted order"),
        (_too_many_spares, "num_replicas \\+ E"),
        (lambda load, r: _counts(load, r + 1), "must add up to num_replicas"),
        (lambda load, r: _counts(load, r)[:-1], "one count per expert"),
    ],
    lab06.check_place_replicas: [
        *[(lambda load, r, g, m=m: _from_gpus(eplb_place.placement(load, r, g, m)),
           re.escape(eplb_place.MISTAKES[m].split(":")[0][:40]))
          for m in eplb_place.MISTAKES],
        (_interleaved, "GPU p % num_gpus"),
        (lambda load, r, g: _from_gpus(eplb_place.placement(load, r, g, "no_capacity")), "more than num_replicas"),
        (lambda load, r, g: place(load, r, g)[:-1], "returned .* slots"),
        (lambda load, r, g: place(load, r, g) + 1, "must be expert ids"),
        (lambda load, r, g: torch.where(place(load, r, g) == 0, 1, place(load, r, g)), "has no replica"),
        (lambda load, r, g: eplb.rebalance_experts(load[None], r, 1, 1, g)[0][0], "rebalance_experts"),
        (lambda load, r, g: eplb.balanced_packing(load[None], g), "balanced_packing"),
    ],
}
