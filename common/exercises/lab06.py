"""Checkers for lab 06 (MoE routing): expert parameters, the DeepSeek-V3 gate, dispatch and combine (a build
exercise: common.exercises.moe_dispatch), the auxiliary-loss-free bias update, nodes per token, and EPLB's
replication and placement (the second build exercise: common.exercises.eplb_place)."""
from __future__ import annotations

import math

import torch

from common.core.checks import checker, expect, expect_close, expect_equal, fail
from common.exercises import eplb_place as _place
from common.exercises import moe_dispatch as _dispatch
from common.exercises.cases import as_number, digits, fresh_cases, learner_call, replayable
from common.moe import eplb, moe

# ---------------------------------------------------------------- 6.1

def _ref_moe_ffn_params(hidden, inter, n_routed, n_shared, top_k, layers):
    expert = 3 * hidden * inter
    gate = n_routed * hidden
    return layers * (n_routed + n_shared) * expert + layers * gate, layers * (top_k + n_shared) * expert + layers * gate


@checker("6.1", "MoE FFN parameters: total and activated")
def check_moe_ffn_params(moe_ffn_params):
    """moe_ffn_params(hidden, moe_intermediate, n_routed, n_shared, top_k, moe_layers) -> (total, active)."""
    with fresh_cases() as cases:
        rng = cases.rng
        # DeepSeek-V3, Mixtral, and an asymmetric case where every parameter differs (so no two mistakes alias)
        cases_ = [(7168, 2048, 256, 1, 8, 58), (4096, 14336, 8, 0, 2, 32), (96, 40, 12, 2, 3, 5)]
        for _ in range(5):
            nr = rng.randint(2, 512)
            cases_.append((rng.randint(8, 8192), rng.randint(8, 8192), nr, rng.randint(0, 4), rng.randint(1, nr),
                           rng.randint(1, 96)))
        for h, f, nr, ns, k, L in cases_:
            args = f"moe_ffn_params({h}, {f}, {nr}, {ns}, {k}, {L})"
            got = learner_call(moe_ffn_params, (h, f, nr, ns, k, L), args, library=True)
            expect(isinstance(got, (tuple, list)) and len(got) == 2,
                   f"{args}: return (total, active), a pair of ints; got {type(got).__name__} {got!r:.80}")
            total, active = got
            ref_total, ref_active = _ref_moe_ffn_params(h, f, nr, ns, k, L)
            if (total, active) == (ref_active, ref_total) and ref_total != ref_active:
                fail(f"{args}: total and active are swapped: return (total, active), total the larger")
            if total == ref_total - L * (nr + ns) * h * f:
                fail(f"{args}: total {total} counts 2 matrices per expert; a SwiGLU expert has three "
                     f"(gate, up and down projections): 3 x hidden x intermediate")
            if total == ref_total and active == ref_active - L * (k + ns) * h * f:
                fail(f"{args}: active {active} counts 2 matrices per expert; a SwiGLU expert has three")
            if total == ref_total - L * nr * h or active == ref_active - L * nr * h:
                fail(f"{args}: the router is missing: every MoE layer has a gate matrix of n_routed x hidden "
                     f"({nr} x {h}) and every token uses all of it")
            if k < nr and active == ref_active - L * (nr - k) * h:
                fail(f"{args}: active counts only top_k={k} rows of the router; every token scores all {nr} "
                     f"experts, so the whole n_routed x hidden gate is active")
            if ns and active == ref_active - L * ns * 3 * h * f:
                fail(f"{args}: active {active} leaves out the shared experts; they run for every token")
            if active == ref_total and k < nr:
                fail(f"{args}: active equals total; a token only runs top_k={k} of the {nr} routed experts")
            if L > 1 and (total == ref_total // L or active == ref_active // L):
                fail(f"{args}: that is one layer's count; multiply by moe_layers={L}")
            if ns and total == ref_total - L * ns * 3 * h * f:
                fail(f"{args}: total {total} leaves out the shared experts; they are parameters of every MoE layer "
                     f"too: (n_routed + n_shared) experts per layer")
            if L > 1 and (total == ref_total - (L - 1) * nr * h or active == ref_active - (L - 1) * nr * h):
                fail(f"{args}: the router is counted once; every one of the {L} MoE layers has its own "
                     f"n_routed x hidden gate")
            expect_equal(total, ref_total, f"{args} total")
            expect_equal(active, ref_active, f"{args} active")
    return f"right for {len(cases_)} configurations, DeepSeek-V3's and Mixtral's included"


# ---------------------------------------------------------------- 6.2

def _sorted_pairs(weights, indices):
    order = indices.argsort(dim=-1)
    return weights.gather(1, order), indices.gather(1, order)


@checker("6.2", "the DeepSeek-V3 gate")
def check_deepseek_gate(deepseek_gate):
    """deepseek_gate(logits, bias, top_k, n_group, topk_group, route_scale) -> (weights [T, k], indices [T, k])."""
    with fresh_cases() as cases:
        rng, gen = cases.rng, cases.gen
        # (T, E, k, n_group, topk_group, route_scale, bias shift): a negative shift makes most biased scores < 0,
        # so the value that fills a dropped group matters (0 would beat every kept expert)
        cases_ = [(257, 64, 8, 8, 4, 2.5, 0.0), (33, 16, 2, 4, 2, 1.0, 0.0), (65, 32, 4, 8, 2, 2.5, -1.5),
                  (rng.randint(1, 300), 96, 6, 12, 3, 2.0, 0.0), (rng.randint(1, 300), 32, 4, 1, 1, 1.5, 0.0)]
        for t, e, k, ng, tg, scale, shift in cases_:
            logits = torch.randn(t, e, dtype=torch.float64, generator=gen)
            bias = torch.randn(e, dtype=torch.float64, generator=gen) * 0.5 + shift
            args = f"T={t}, E={e}, top_k={k}, n_group={ng}, topk_group={tg}, route_scale={scale}" + (
                f", bias around {shift}" if shift else "")
            call = f"deepseek_gate(logits [{t}, {e}], bias [{e}], {k}, {ng}, {tg}, {scale})"
            lg, bs = logits.clone(), bias.clone()
            got = learner_call(deepseek_gate, (lg, bs, k, ng, tg, scale), call, references=(moe.deepseek_v3_gate,),
                               library=True)
            expect(torch.equal(lg, logits) and torch.equal(bs, bias),
                   f"{call}: your gate modified its input `{'logits' if not torch.equal(lg, logits) else 'bias'}` "
                   f"in place (e.g. sigmoid_ or +=); the router's logits and bias are still needed by the caller")
            expect(isinstance(got, (tuple, list)) and len(got) == 2,
                   f"{call}: return (weights, indices); got {type(got).__name__}")
            try:
                w, i = (torch.as_tensor(x) for x in got)
            except (TypeError, ValueError, RuntimeError) as exc:
                fail(f"{call}: weights and indices must be tensors [T, top_k]; converting them failed: {exc}")
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
                         "you ignored the group limit: keep only the topk_group groups with the largest sum of "
                         "their two best (biased) scores, then pick top_k experts inside them"),
                        (lambda: moe.deepseek_v3_gate(logits, None, k, ng, tg, scale)[1],
                         "the bias was not used to choose: experts are picked by sigmoid(logits) + bias"),
                        (lambda: _group_by_max(logits, bias, k, ng, tg),
                         "groups are ranked by the sum of their top-2 scores, not by their single best score"),
                        (lambda: _group_by_max(logits, bias, k, ng, tg, rank="sum"),
                         "groups are ranked by the sum of their two best scores, not the sum of all their scores"),
                        (lambda: _group_by_max(logits, bias, k, ng, tg, rank="top2", keep="smallest"),
                         "you kept the topk_group groups with the SMALLEST scores: keep the largest (topk, not the "
                         "bottom of a sort)"),
                        (lambda: _group_by_max(logits, bias, k, ng, tg, fill=0.0, rank="top2"),
                         "the experts of the dropped groups were masked with 0, but biased scores can be negative "
                         "(sigmoid + a negative bias), so a 0 beats the kept experts: mask with -inf"),
                        (lambda: _softmax_choice(logits, bias, k, ng, tg),
                         "scores come from a sigmoid per expert in DeepSeek-V3, not a softmax")):
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
            # float32 weights (a natural choice) are right to ~1e-7 relative
            expect_close(gw, rw, f"{args}: weights (columns in expert order)", rtol=1e-5, atol=1e-7)
    return "sigmoid scores, bias for the choice only, group-limited top-k, normalised and scaled weights"


def _softmax_choice(logits, bias, k, ng, tg):
    """The gate with softmax instead of sigmoid scores (a mistake)."""
    return moe.deepseek_v3_gate(torch.logit(torch.softmax(logits, -1)), bias, k, ng, tg, 1.0)[1]


def _group_by_max(logits, bias, k, ng, tg, fill=float("-inf"), rank="max", keep="largest"):
    """Group-limited choice with groups ranked by their best score (or top-2 sum, or the sum of all), the
    largest (or smallest) kept, and dropped groups set to `fill`."""
    choice = torch.sigmoid(logits) + bias
    t, e = choice.shape
    grouped = choice.view(t, ng, e // ng)
    gscore = {"top2": lambda: grouped.topk(min(2, e // ng), -1).values.sum(-1), "sum": lambda: grouped.sum(-1),
              "max": lambda: grouped.amax(-1)}[rank]()
    keep = gscore.topk(tg, -1, largest=keep == "largest").indices
    mask = torch.zeros(t, ng, dtype=torch.bool).scatter_(1, keep, True).repeat_interleave(e // ng, 1)
    return choice.masked_fill(~mask, fill).topk(k, -1).indices


# ---------------------------------------------------------------- 6.3

@checker("6.3", "dispatch and combine: an MoE layer for top-k routing",
         in_kernel="it back-propagates through the learner's layer")
@replayable
def check_dispatch_combine(moe_dispatch_combine, cases):
    """moe_dispatch_combine(x [T, H], weights [T, k], indices [T, k], experts) -> [T, H], each expert called once
    on its rows; bit for bit against moe.moe_grouped on exact cases, and its gradient
    (common.exercises.moe_dispatch)."""
    return _dispatch.check(moe_dispatch_combine, cases, (moe.moe_grouped, moe.dispatch_plan, moe.dispatch,
                                                         moe.combine, moe.moe_dense_reference))


# ---------------------------------------------------------------- 6.4

def _loads_with_mean_on_experts(rng, e: int, on_mean: int) -> torch.Tensor:
    """Skewed integer loads (mean well above the median, as with a few popular experts) whose mean is exactly the
    load of the first `on_mean` experts (the zero step, with ties)."""
    while True:
        rest = [int(1000 * rng.random() ** 3) for _ in range(e - on_mean)]
        m = sum(rest) // (e - on_mean)
        if sum(rest) % (e - on_mean) == 0 and m not in rest:
            return torch.tensor([m] * on_mean + rest, dtype=torch.float64)


@checker("6.4", "the auxiliary-loss-free bias update")
def check_update_bias(update_bias):
    """update_bias(bias [E], load [E], gamma) -> new bias: + gamma for underloaded experts, - gamma for overloaded,
    unchanged for an expert exactly at the mean load."""
    with fresh_cases() as cases:
        rng, gen = cases.rng, cases.gen
        for e, gamma, on_mean in [(8, 0.001, 1), (64, 0.01, 2), (rng.randint(3, 300), rng.uniform(1e-4, 0.1), 1)]:
            bias = torch.randn(e, dtype=torch.float64, generator=gen) * 0.1
            load = _loads_with_mean_on_experts(rng, e, on_mean)
            perm = torch.randperm(e, generator=gen)
            load = load[perm]
            assert int((load == load.mean()).sum()) == on_mean
            sign = torch.sign(load.mean() - load)
            expected = bias + gamma * sign
            args = f"E={e}, gamma={gamma:.4g}"
            got = learner_call(update_bias, (bias.clone(), load.clone(), gamma),
                               f"update_bias(bias [{e}], load [{e}], {gamma:.4g})", library=True)
            expect(got is not None, "update_bias returned None -- return the new bias")
            try:
                got = torch.as_tensor(got).to(torch.float64)
            except (TypeError, ValueError, RuntimeError) as exc:
                fail(f"{args}: return the new bias as a tensor [E]; got {type(got).__name__} ({exc})")
            expect(tuple(got.shape) == (e,), f"{args}: the new bias must be [E] = [{e}], got {tuple(got.shape)}")
            # a natural answer (torch.where with Python floats) computes the step in float32: allow its rounding
            tol = dict(rtol=1e-6, atol=gamma * 1e-6)
            close = lambda a, b: torch.allclose(a, b, **tol)  # noqa: E731
            if close(got, bias - gamma * sign):
                fail(f"{args}: the sign is reversed: an overloaded expert (load > mean) must become *less* "
                     f"attractive, so its bias goes down by gamma")
            if close(got, bias + gamma * (load.mean() - load)) or \
                    close(got, bias + gamma * (load.mean() - load) / load.mean()):
                fail(f"{args}: the step is proportional to the imbalance; DeepSeek-V3 moves every bias by the same "
                     f"step gamma, up or down (sign of mean load - load)")
            at_mean = (load == load.mean()).nonzero().flatten().tolist()
            moved = [j for j in at_mean if abs(float(got[j] - bias[j])) > gamma / 2]
            if moved and close(got[sign != 0], expected[sign != 0]):
                j = moved[0]
                fail(f"{args}: expert {j} has exactly the mean load ({load[j]:.0f}) and should keep its bias "
                     f"(sign(0) = 0), but it moved from {digits(bias[j])} to {digits(got[j])}: a comparison like "
                     f"load > mean puts the balanced expert on one side; use sign(mean - load)")
            bad = (~torch.isclose(got, expected, **tol)).nonzero().flatten().tolist()
            if bad:
                j = bad[0]
                fail(f"{args}: expert {j} (load {load[j]:.0f}, mean {float(load.mean()):.6g}): expected "
                     f"{digits(expected[j])}, got {digits(got[j])} ({len(bad)} of {e} experts differ)")
    return "bias += gamma * sign(mean load - load): up when underloaded, down when overloaded, still at the mean"


# ---------------------------------------------------------------- 6.5

@checker("6.5", "nodes a token is sent to")
def check_expected_nodes(expected_nodes):
    """expected_nodes(num_experts, top_k, num_nodes) -> mean distinct nodes for k distinct experts drawn at random."""
    with fresh_cases() as cases:
        rng = cases.rng
        n, m = rng.randint(1, 16), rng.randint(1, 16)
        cases_ = [(256, 8, 8), (8, 4, 2), (256, 8, 32), (64, 1, 4), (16, 16, 4), (60, 7, 3),
                  (n * m, rng.randint(1, n * m), n)]
        for e, k, n in cases_:
            call = f"expected_nodes({e}, {k}, {n})"
            got = as_number(learner_call(expected_nodes, (e, k, n), call, references=(moe.expected_distinct_nodes,),
                                         library=True), call, "a number of nodes (a float: the mean)")
            ref = moe.expected_distinct_nodes(e, k, n)
            _name_nodes_mistake(call, got, ref, e, k, n)
            with_replacement = n * (1 - (1 - 1 / n) ** k)
            if abs(ref - with_replacement) > 1e-6 and _near(got, with_replacement):
                fail(f"{call} = {float(got):.6g} treats the k picks as independent (with replacement); a token "
                     f"picks k *different* experts: use C(E - E/nodes, k) / C(E, k) for the chance that a node "
                     f"gets none")
            if abs(ref - min(k, n)) > 1e-6 and _near(got, min(k, n)):
                fail(f"{call} = {float(got):.6g} is the most nodes a token can reach (min(k, nodes)), not the "
                     f"mean over random choices")
            expect_close(got, ref, call, rtol=1e-9)
    return f"right for {len(cases_)} cases (nodes x (1 - C(E - E/nodes, k) / C(E, k)))"


def _name_nodes_mistake(call, got, ref, e, k, n):
    """The look-alikes of nodes x (1 - C(E - E/nodes, k) / C(E, k))."""
    per = e // n
    none = math.comb(e - per, k) / math.comb(e, k)
    for value, why in (
            (1 - none, "is one node's chance of being reached; by symmetry the mean is nodes x that chance"),
            (n * none, "counts the nodes a token does NOT reach (nodes x P(a node gets none)): take 1 - P"),
            (n * (1 - math.comb(e - n, k) / math.comb(e, k)) if e >= n else None,
             f"uses E - nodes; a node holds E / nodes = {per} experts, so P(a node gets none) = C(E - E/nodes, k) / "
             f"C(E, k)"),
            (n * (1 - math.comb(e - per, k - 1) / math.comb(e, k - 1)) if k > 1 else None,
             "uses k - 1 picks: off by one -- a token picks all k experts"),
            (math.floor(ref), "is truncated to a whole number of nodes" + (
                " (or rounded: here both give it)" if math.floor(ref) == round(ref) else "") +
             ": the mean is a fraction"),
            (round(ref), "is rounded to a whole number of nodes: the mean is a fraction")):
        if value is not None and abs(ref - value) > 1e-6 and _near(got, value):
            fail(f"{call} = {float(got):.6g} {why} (expected {ref:.6g})")


def _near(got, value) -> bool:
    try:
        return math.isclose(float(got), value, rel_tol=1e-9)
    except (TypeError, ValueError):
        return False


# ---------------------------------------------------------------- 6.6

def _is_greedy_result(load: list[float], counts: list[int]) -> bool:
    """True when `counts` is what the greedy rule gives with some tie-breaking: no expert's load per replica
    exceeds what any expert with a spare would have per replica without it (D'Hondt's condition)."""
    worst = max(l / c for l, c in zip(load, counts))
    best_spare = min((l / (c - 1) for l, c in zip(load, counts) if c > 1), default=math.inf)
    return worst <= best_spare * (1 + 1e-12)


def _largest_remainders(load: list[float], r: int) -> list[list[int]]:
    """Two ways a learner allots by largest remainders: shares of all r replicas (at least 1 each), and one replica
    each then shares of the spares; the leftovers to the largest fractional parts."""
    out = []
    for spares in (r, r - len(load)):
        quota = [x * spares / sum(load) for x in load]
        counts = [max(1, math.floor(q)) if spares == r else 1 + math.floor(q) for q in quota]
        order = sorted(range(len(load)), key=lambda i: -(quota[i] - math.floor(quota[i])))
        for i in order[:max(0, r - sum(counts))]:
            counts[i] += 1
        out.append(counts)
    return out


def _counts_by(load, r, rule):
    """Replica counts by a look-alike rule (a named mistake)."""
    if rule == "sorted":
        return sorted(_counts_by(load, r, "right"))
    count = torch.ones(len(load), dtype=torch.float64)
    for i in range(r - len(load)):
        per = load.double() / (count + (1 if rule == "plus_one" else 0))
        j = i % len(load) if rule == "in_order" else int(per.argmin() if rule == "smallest" else per.argmax())
        count[j] += 1
    return [int(c) for c in count.tolist()]


@checker("6.6", "EPLB: how many replicas per expert")
def check_replica_counts(replica_counts):
    """replica_counts(load [E], num_replicas) -> replicas per expert [E]: one each, then greedily to the expert
    with the largest load per replica."""
    with fresh_cases() as cases:
        rng, gen = cases.rng, cases.gen
        # the 12-expert case first: there the look-alike rules (heaviest, largest remainders, load / (count + 1))
        # all give different counts, so the first failure names the rule
        cases_ = [(torch.tensor([90.0, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86]), 16),
                  (torch.tensor([10.0, 1, 4]), 6),
                  (torch.tensor([6.0, 6, 1, 3]), 5),  # a tie: either of the two experts of load 6 may get the spare
                  (torch.tensor([3.0, 18, 13]), 9)]  # largest remainders give [2, 4, 3]; the greedy rule [1, 5, 3]
        for _ in range(3):
            e = rng.randint(2, 40)
            cases_.append(((torch.rand(e, generator=gen) ** 3 * 1000).round() + 1, e + rng.randint(0, 2 * e)))
        for load, r in cases_:
            args = f"replica_counts(load of {len(load)} experts, num_replicas={r})"
            got = learner_call(replica_counts, (load.clone(), r), args, references=(eplb.replicate_experts,),
                               library=True)
            expect(got is not None, "replica_counts returned None -- return the count per expert")
            try:
                got = [int(v) for v in torch.as_tensor(got).reshape(-1).tolist()]
            except (TypeError, ValueError, RuntimeError) as exc:
                fail(f"{args}: return one integer count per expert (a list or tensor); got {type(got).__name__} "
                     f"({exc})")
            _, _, ref = eplb.replicate_experts(load.unsqueeze(0), r)
            ref = ref[0].tolist()
            expect(len(got) == len(ref), f"{args}: return one count per expert ({len(ref)}), got {len(got)}")
            expect(min(got) >= 1, f"{args}: every expert needs at least one replica; got a count of {min(got)}")
            expect(sum(got) != r + len(ref), f"{args}: the counts add up to num_replicas + E = {sum(got)}: you handed "
                                             f"out num_replicas spares after the first replica each; the spares are "
                                             f"num_replicas - E = {r - len(ref)}")
            expect(sum(got) == r, f"{args}: the counts must add up to num_replicas={r}; they add up to {sum(got)}")
            heaviest = [1] * len(ref)
            heaviest[int(load.argmax())] += r - len(ref)
            if got == heaviest and got != ref:
                fail(f"{args}: all spare replicas went to the heaviest expert; give each spare to the expert whose "
                     f"load *per replica* (load / count) is largest right now")
            proportional = [max(1, round(float(v) * r / float(load.sum()))) for v in load]
            if got == proportional and got != ref:
                fail(f"{args}: counts proportional to the load (rounded) are not the greedy rule; give one spare at "
                     f"a time to the largest load per replica")
            for rule, why in (("in_order", "the spares went to the experts in turn (0, 1, 2, ...), whatever their "
                                           "load"),
                              ("smallest", "each spare went to the SMALLEST load per replica: it goes to the largest"),
                              ("plus_one", "each spare went to the largest load / (count + 1), the load per replica "
                                           "after the spare: compare load / count, the load each replica carries now"),
                              ("sorted", "the counts are in sorted order, not in expert order: count[i] belongs to "
                                         "expert i")):
                if got != ref and got == _counts_by(load, r, rule) and not _is_greedy_result(load.tolist(), got):
                    fail(f"{args} = {got}, expected {ref}: {why}")
            if got != ref and got in _largest_remainders(load.tolist(), r):
                fail(f"{args} = {got}: that is proportional shares with the leftovers to the largest remainders "
                     f"(Hamilton's method), not the greedy rule ({ref}): give one spare at a time to the expert with "
                     f"the largest load per replica right now")
            if got != ref and _is_greedy_result(load.tolist(), got):
                continue  # a different tie-break of the same rule
            expect_equal(got, ref, args)
    return "one replica each, then each spare to the largest load per replica (DeepSeek's EPLB rule), ties either way"


# ---------------------------------------------------------------- 6.7

@checker("6.7", "EPLB: place the replicas of one layer on GPUs")
@replayable
def check_place_replicas(place_replicas, cases):
    """place_replicas(load [E], num_replicas, num_gpus) -> phy2log [num_replicas], slot p on GPU p // (R / G);
    against eplb.rebalance_experts (global policy) on max/mean GPU load (common.exercises.eplb_place)."""
    return _place.check(place_replicas, cases, (eplb.rebalance_experts, eplb.replicate_experts,
                                                eplb.balanced_packing, eplb.rebalance_hierarchical))
