"""Lab 07's named wrong answers: the cost formulas (7.1), the bus factors (7.2), the ring all-reduce (7.3), the
alpha/beta fit (7.4) and the node-aware send counts (7.5). The three most likely of 7.1, 7.2 and 7.4 stay in
test_wrong_answers_late.py; these add the rest, cheats included."""
import math

import numpy as np

import ring_answers as RA
from common.exercises import cost_mistakes as CM
from common.exercises import lab07
from common.parallel import collectives as C
from common.parallel import expert_parallel as EP
from test_exercises_lab07 import _counts, _factor, _fit, _right, _with


def _lg(p):
    return math.ceil(math.log2(p))


def _units(scale):
    return lambda *a: scale * _right(*a)


def _factor_with(**over):
    return lambda c, p: over[c](p) if c in over else _factor(c, p)


def _fit_with(steps=None, share=None, weight=1.0, ends=False):
    def fit(sizes, times, p):
        n, t = np.asarray(sizes, float), np.asarray(times, float)
        if ends:
            n, t = n[[0, -1]], t[[0, -1]]
        cols = np.stack([np.full_like(n, 2 * (p - 1) if steps is None else steps(p)),
                         (2 * (p - 1) / p if share is None else share(p)) * n], 1)
        (a, slope), *_ = np.linalg.lstsq(cols / t[:, None] ** weight, t / t ** weight, rcond=None)
        return float(a), float(1 / slope)
    return fit


def _steps_cheat(algorithm, n, p, alpha, bw):  # the workbook's step count and bus factor, put together
    if algorithm == "ring" and p > 1:
        return C.steps("all_reduce", p) * alpha + C.bus_factor("all_reduce", p) * n / bw
    return _right(algorithm, n, p, alpha, bw)


def _left_out(c, p):
    if c == "all_to_all":
        raise ValueError(f"unknown collective {c}")
    return _factor(c, p)


def _mutating(indices, e, world, g, rank):
    out = _counts()(indices, e, world, g, rank)
    indices.zero_()
    return out


def _by_node(indices, e, world, g, rank):
    nodes = indices // (e // world * g)
    return [int((nodes == m).any(dim=1).sum()) if m < world // g else 0 for m in range(world)]


def _global_rank(indices, e, world, g, rank):
    nodes = indices // (e // world * g)
    counts = [0] * world
    for m in range(world // g):
        counts[m * g + rank] = int((nodes == m).any(dim=1).sum())
    return counts


WRONG = {
    lab07.check_allreduce_time: [
        (_with(ring=lambda n, p, a, b: 2 * p * a + 2 * (p - 1) / p * n / b), "p-1 steps per phase, not p"),
        (_with(ring=lambda n, p, a, b: (p - 1) * a + 2 * (p - 1) / p * n / b), "latency term counts one phase"),
        (_with(ring=lambda n, p, a, b: 2 * (p - 1) * a + (p - 1) / p * n / b), "bandwidth term counts one phase"),
        (_with(ring=lambda n, p, a, b: 2 * (p - 1) / p * n / b), "latency term is missing"),
        (_with(tree=lambda n, p, a, b: 2 * int(math.log2(p)) * (a + n / b),
               recursive_doubling=lambda n, p, a, b: int(math.log2(p)) * (a + n / b)), "log2 p rounded down"),
        (_with(recursive_doubling=lambda n, p, a, b: math.log2(p) * (a + n / b)), "not a power of two"),
        (_with(recursive_doubling=lambda n, p, a, b: 2 * _lg(p) * (a + n / b)), "does not reduce then broadcast"),
        (lambda alg, n, p, a, b: _right(alg, 8 * n, p, a, b), "multiplied the bytes by 8"),
        (lambda alg, n, p, a, b: _right(alg, n, p, a, 1 / b), "multiplies by the bandwidth"),
        (_units(1e3), "milliseconds"),
        (_units(1e6), "microseconds"),
        (lambda alg, n, p, a, b: _right(alg, n, p, a, b) if p > 1 else a, "nothing to exchange"),
        (lambda alg, n, p, a, b: C.ALLREDUCE_TIMES[alg](n, p, a, b), "called .*, the reference"),
        (_steps_cheat, r"called common\.parallel\.collectives\..*steps, the workbook's own code"),
        (lambda *a: CM.allreduce_seconds(*a) if a[2] > 1 else 0.0, r"called common\.exercises\.cost_mistakes\."
                                                                    r"allreduce_seconds, the reference"),
    ],
    lab07.check_bus_factor: [
        (_factor_with(all_reduce=lambda p: (p - 1) / p), r"moves 2\(p-1\)/p"),
        (_factor_with(broadcast=lambda p: (p - 1) / p), "bus factor is 1"),
        (_factor_with(all_reduce=lambda p: 2 * (p - 1) // p, all_gather=lambda p: (p - 1) // p,
                      reduce_scatter=lambda p: (p - 1) // p, all_to_all=lambda p: (p - 1) // p),
         r"integer division \(//\) truncates"),
        (_factor_with(all_reduce=lambda p: 2.0), "limit for many ranks"),
        (_factor_with(all_to_all=lambda p: 1.0), "never crosses a link"),
        (lambda c, p: None if c == "broadcast" else _factor(c, p), "returned None"),
        (_left_out, r"bus_factor\('all_to_all', p=8\).*raised ValueError"),
        (lambda c, p: str(_factor(c, p)), "returned str"),
        (lambda c, p: C.bus_factor(c, p), "called .*bus_factor, the reference"),
        (lambda c, p: C.busbw(c, 1.0, 1.0, p), r"called common\.parallel\.collectives\..*busbw, the workbook's own"),
    ],
    lab07.check_ring_all_reduce: [
        (RA.calls_all_reduce, r"you called dist.all_reduce: this exercise builds the all-reduce itself"),
        (RA.reduce_scatter_only, r"only the reduce-scatter: the all-gather phase is missing"),
        (RA.all_gather_only, r"no chunk was summed on the way: the reduce-scatter phase is missing"),
        (RA.wrong_chunk, r"sent chunk \d at step \d of the reduce-scatter, where the ring step needs chunk \d"),
        (RA.overwrites, r"but not rank \d's own values: add what you receive to your chunk"),
        (RA.adds_in_all_gather, r"in the all-gather copy what you receive"),
        (RA.p_steps, r"p steps per phase"),
        (RA.torch_chunk, r"cut x with tensor_split \(torch.chunk cuts differently"),
        (RA.averages, r"the sum divided by world_size = \d: an all-reduce sums"),
        (RA.not_in_place, r"you returned the sum but left x as it was: reduce x in place"),
        (RA.whole_tensor, r"a message held all \d+ elements: each ring step sends one chunk"),
        (RA.returns_none, r"returned None; return x"),
        (RA.torch_dist, r"use the `dist` your function is given"),
        (RA.uses_the_reference, r"called common.parallel.collectives.ring.ring_all_reduce, the reference"),
    ],
    lab07.check_fit_alpha_beta: [
        (lambda s, t, p: (_fit(s, t, p)[0], _fit_with(share=lambda p: 1)(s, t, p)[1]), "algorithm bandwidth"),
        (_fit_with(weight=2), "divided each equation by its time twice"),
        (_fit_with(ends=True), "smallest and the largest size only"),
        (_fit_with(steps=lambda p: p - 1), r"2\(p-1\) = \d+ steps .*, not p-1"),
        (_fit_with(share=lambda p: (p - 1) / p), "one phase's share"),
        (lambda s, t, p: _fit(s, t, p)[::-1], r"returned \(bandwidth, alpha\)"),
        (lambda s, t, p: (_fit(s, t, p)[0] * 1e6, _fit(s, t, p)[1]), "alpha is in microseconds"),
        (lambda s, t, p: (_fit(s, t, p)[0] * 1e3, _fit(s, t, p)[1]), "alpha is in milliseconds"),
        (lambda s, t, p: (_fit(s, t, p)[0], _fit(s, t, p)[1] / 1e9), "bandwidth is in GB/s"),
        (lambda s, t, p: _fit(s, t, p)[0], r"must return \(alpha_seconds"),
        (lambda s, t, p: ((f := C.fit_alpha_beta(s, t, p)).alpha_s, f.bandwidth_Bps), "fit_alpha_beta, the reference"),
        (lambda s, t, p: CM.fit(s, t, p), r"called common\.exercises\.cost_mistakes\.fit, the reference"),
    ],
    lab07.check_send_counts: [
        (_counts(dedup=False), r"forgotten de-duplication"),
        (_counts(shift=1), r"off-by-one rank \(counts shifted one rank up\)"),
        (_counts(shift=-1), r"off-by-one rank \(counts shifted one rank down\)"),
        (_counts(first_rank=True), r"wrong destination rank .*first rank"),
        (_counts(skip_own=True), r"own node left out"),
        (_counts(per_expert_rank=True), r"flat split"),
        (_counts(per_rank=True), r"per-rank split"),
        (_by_node, r"node index used as the rank"),
        (_global_rank, r"raised IndexError.*not m \* ranks_per_node \+ rank"),
        (lambda *a: 3, r"returned int 3; expected a list of 8 ints"),
        (lambda *a: _counts()(*a)[:-1], r"returned 7 counts"),
        (lambda *a: [c * 2 for c in _counts()(*a)], r"the counts sum to"),
        (_mutating, r"modified `indices`"),
        (lambda i, e, w, g, r: EP.flat_send_counts(i, e, w) if g == 1 else _counts()(i, e, w, g, r),
         r"called .*flat_send_counts, the workbook's own code"),
        (EP.node_send_counts, r"node_send_counts, the reference"),
    ],
}
