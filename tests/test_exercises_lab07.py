import math

import numpy as np
import pytest

import ring_answers as RA

from common.core.checks import CheckFailed
from common.exercises import lab07
from common.parallel import collectives as C


def _stub(*args):
    raise NotImplementedError("Exercise 7.x")


# ---- 7.1 all-reduce cost formulas

def _right(algorithm, n, p, alpha, bw):
    if p == 1:
        return 0.0
    lg = math.ceil(math.log2(p))
    if algorithm == "ring":
        return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n / bw
    if algorithm == "tree":
        return 2 * lg * (alpha + n / bw)
    return lg * (alpha + n / bw)


def _with(**over):
    def f(algorithm, n, p, alpha, bw):
        if algorithm in over and p > 1:
            return over[algorithm](n, p, alpha, bw)
        return _right(algorithm, n, p, alpha, bw)
    return f


def test_allreduce_time_right_and_stub():
    assert lab07.check_allreduce_time(_right).passed
    assert lab07.check_allreduce_time(_stub).status == "not attempted"


@pytest.mark.parametrize("wrong, match", [
    (_with(ring=lambda n, p, a, b: (p - 1) * a + (p - 1) / p * n / b), "reduce-scatter .* alone"),
    (_with(ring=lambda n, p, a, b: 2 * (p - 1) * (a + n / b)), "one chunk of n/p bytes"),
    (_with(ring=lambda n, p, a, b: 2 * p * a + 2 * (p - 1) / p * n / b), "p-1 steps per phase"),
    (_with(tree=lambda n, p, a, b: math.ceil(math.log2(p)) * (a + n / b)), "only the reduction up the tree"),
    (_with(recursive_doubling=lambda n, p, a, b: math.log2(p) * (a + n / b)), "not a power of two"),
    (_with(recursive_doubling=lambda n, p, a, b: 2 * math.ceil(math.log2(p)) * (a + n / b)), "does not reduce then"),
    (_with(ring=lambda n, p, a, b: 2 * (p - 1) * a + 2 * (p - 1) / p * n * b), "expected"),
    (lambda algorithm, n, p, alpha, bw: _right(algorithm, n, p, alpha, bw) if p > 1 else alpha, "nothing to exchange"),
    (lambda algorithm, n, p, alpha, bw: [_right(algorithm, n, p, alpha, bw)], r"returned list .*expected a number"),
])
def test_allreduce_time_wrong(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        lab07.check_allreduce_time(wrong)


# ---- 7.2 bus factors

def _factor(coll, p):
    return {"all_reduce": 2 * (p - 1) / p, "broadcast": 1.0}.get(coll, (p - 1) / p)


def test_bus_factor_right_and_stub():
    assert lab07.check_bus_factor(_factor).passed
    assert lab07.check_bus_factor(_stub).status == "not attempted"


@pytest.mark.parametrize("wrong, match", [
    (lambda c, p: (p - 1) / p if c != "broadcast" else 1.0, "moves 2\\(p-1\\)/p"),
    (lambda c, p: 2 * (p - 1) / p if c != "broadcast" else 1.0, "factor 2 belongs to the all-reduce only"),
    (lambda c, p: 1 / _factor(c, p), "upside down"),
    (lambda c, p: _factor(c, p) if c != "broadcast" else (p - 1) / p, "bus factor is 1"),
    (lambda c, p: _factor(c, p) * 1.01, "expected"),
    (lambda c, p: 1.0 if c == "all_reduce" else _factor(c, p), r"factor at p = 2 only"),
    (lambda c, p: str(_factor(c, p)), r"returned str .*expected a number"),
])
def test_bus_factor_wrong(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        lab07.check_bus_factor(wrong)


# ---- 7.3 ring all-reduce from isend/irecv (ring_answers.py holds the learner's attempts)

def test_ring_with_blocking_send_and_recv_is_right(monkeypatch):
    """Blocking send/recv ordered by parity deadlocks nowhere under NCCL's rules (threads; the real ranks are the
    other tests')."""
    monkeypatch.setattr(lab07, "_ring_on_ranks", lambda fn: 0.0)
    assert lab07.check_ring_all_reduce(RA.blocking_by_parity, seed=2).passed


def test_ring_right_both_ways_and_stub():
    v = lab07.check_ring_all_reduce(RA.right)
    assert v.passed and "3 gloo processes" in v.detail
    assert lab07.check_ring_all_reduce(RA.reverse_ring, seed=3).passed
    assert lab07.check_ring_all_reduce(_stub).status == "not attempted"


@pytest.mark.parametrize("wrong, match", [
    (RA.calls_all_reduce, r"you called dist.all_reduce: this exercise builds the all-reduce itself"),
    (RA.send_then_receive, r"every rank is waiting to send and none has posted its receive.*batch_isend_irecv"),
    (RA.wrong_neighbour, r"rank \d receives from rank \d, which does the same the other way"),
    (RA.reduce_scatter_only, r"sent 3 messages; a ring all-reduce over p = 4 ranks sends 2\(p-1\) = 6.*only the "
                             r"reduce-scatter: the all-gather phase is missing"),
    (RA.all_gather_only, r"rank \d sent 3 messages; .* no chunk was summed on the way: the reduce-scatter phase is "
                         r"missing"),
    (RA.wrong_chunk, r"rank \d sent chunk \d at step \d of the reduce-scatter, where the ring step needs chunk \d"),
    (RA.overwrites, r"rank \d's chunk \d at step 1 of the reduce-scatter holds ranks \[\d\] but not rank \d's own "
                    r"values: add what you receive to your chunk"),
    (RA.adds_in_all_gather, r"all-gather holds more than every rank's values once: in the all-gather copy what you "
                            r"receive"),
    (RA.p_steps, r"sent 8 messages; a ring all-reduce over p = 4 ranks sends 2\(p-1\) = 6.* p steps per phase"),
    (RA.torch_chunk, r"messages of \[1\] elements, where torch.tensor_split\(x.view\(-1\), 4\) makes chunks of "
                     r"\[2, 3\]: cut x with tensor_split \(torch.chunk cuts differently"),
    (RA.averages, r"the sum divided by world_size = 4: an all-reduce sums"),
    (RA.not_in_place, r"you returned the sum but left x as it was: reduce x in place"),
    (RA.whole_tensor, r"a message held all 10 elements: each ring step sends one chunk"),
    (RA.returns_none, r"rank 0 returned None; return x"),
    (RA.torch_dist, r"use the `dist` your function is given"),
    (RA.uses_the_reference, r"called common.parallel.collectives.ring.ring_all_reduce, the reference"),
])
def test_ring_wrong(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        lab07.check_ring_all_reduce(wrong, seed=1)


def test_ring_that_uses_a_notebook_name_is_told_on_real_ranks(monkeypatch):
    import ring_answers
    monkeypatch.setattr(ring_answers, "right", RA.right)  # on threads `right` is found; in a rank it is not defined
    with pytest.raises(CheckFailed, match=r"on real ranks your function raised NameError.*define what it uses inside"):
        lab07.check_ring_all_reduce(RA.uses_a_notebook_name, seed=1)


# ---- 7.4 alpha/beta fit

def _fit(sizes, times, p):
    n, t = np.asarray(sizes, float), np.asarray(times, float)
    a = np.stack([np.full_like(n, 2 * (p - 1)), 2 * (p - 1) / p * n], 1) / t[:, None]
    x, *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    return x[0], 1 / x[1]


def _absolute(sizes, times, p):
    n, t = np.asarray(sizes, float), np.asarray(times, float)
    a = np.stack([np.full_like(n, 2 * (p - 1)), 2 * (p - 1) / p * n], 1)
    x, *_ = np.linalg.lstsq(a, t, rcond=None)
    return x[0], 1 / x[1]


def _raw(sizes, times, p):  # forgets to convert the coefficients
    n, t = np.asarray(sizes, float), np.asarray(times, float)
    a = np.stack([np.ones_like(n), n], 1) / t[:, None]
    x, *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    return x[0], 1 / x[1]


def _slope(sizes, times, p):
    a, b = _fit(sizes, times, p)
    return a, 1 / b


def test_fit_right_and_stub():
    assert lab07.check_fit_alpha_beta(_fit).passed
    assert lab07.check_fit_alpha_beta(_stub).status == "not attempted"


@pytest.mark.parametrize("wrong, match", [
    (_absolute, "fitted absolute times"),
    (_raw, "fitted intercept"),
    (lambda s, t, p: (_fit(s, t, p)[0], _raw(s, t, p)[1]), "algorithm bandwidth"),
    (_slope, "returned the slope"),
    (lambda s, t, p: _fit(s, t, p)[0], "must return \\(alpha_seconds"),
])
def test_fit_wrong(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        lab07.check_fit_alpha_beta(wrong)


def test_reference_fit_matches_exercise_convention():
    sizes = C.log_sizes(2**10, 2**26)
    times = [C.ring_allreduce_time(n, 4, 7e-6, 20e9) for n in sizes]
    assert np.allclose(_fit(sizes, times, 4), (7e-6, 20e9), rtol=1e-9)


# ---- 7.5 send counts of the node-aware EP dispatch

def _counts(dedup=True, shift=0, first_rank=False, skip_own=False, per_expert_rank=False, per_rank=False):
    def f(indices, e, world, g, rank):
        epr = e // world
        counts = [0] * world
        for row in indices.tolist():
            if per_rank:
                for r in {x // epr for x in row}:
                    counts[r] += 1
                continue
            if per_expert_rank:
                for x in row:
                    counts[x // epr] += 1
                continue
            nodes = [x // (epr * g) for x in row]
            for m in (sorted(set(nodes)) if dedup else nodes):
                dest = m * g + (0 if first_rank else rank % g)
                counts[(dest + shift) % world] += 1
        if skip_own:
            counts[rank] = 0
        return counts
    return f


def test_send_counts_right_and_stub():
    assert lab07.check_send_counts(_counts()).passed
    assert lab07.check_send_counts(lambda *a: np.array(_counts()(*a))).passed  # an array is fine
    assert lab07.check_send_counts(_stub).status == "not attempted"


def test_send_counts_wrong():
    """The audit's named wrong answers (tests/wrong_answers/lab07.py), here on a fresh seed."""
    from wrong_answers.lab07 import WRONG
    for wrong, match in WRONG[lab07.check_send_counts]:
        with pytest.raises(CheckFailed, match=match):
            lab07.check_send_counts(wrong)


# ---- every exercise is to write the formula: calling the reference in common is caught

def test_calling_the_reference_is_caught():
    from common.parallel import expert_parallel as EP
    with pytest.raises(CheckFailed, match=r"called common.parallel.collectives.cost_model.allreduce_time, the reference"):
        lab07.check_allreduce_time(C.allreduce_time)
    with pytest.raises(CheckFailed, match=r"called common.parallel.collectives.cost_model.bus_factor, the reference"):
        lab07.check_bus_factor(C.bus_factor)

    def fit_via_reference(sizes, times, p):
        f = C.fit_alpha_beta(sizes, times, p)
        return f.alpha_s, f.bandwidth_Bps
    with pytest.raises(CheckFailed, match=r"called common.parallel.collectives.fit.fit_alpha_beta, the reference"):
        lab07.check_fit_alpha_beta(fit_via_reference)
    with pytest.raises(CheckFailed,
                       match=r"called common.parallel.expert_parallel.config.node_send_counts, the reference"):
        lab07.check_send_counts(EP.node_send_counts)


# ---- right answers written differently (issue 46): none is refused, the library watch included

def _time_by_bits(algorithm, n, p, alpha, bw):
    rounds = (p - 1).bit_length()  # ceil(log2 p) for p >= 1
    steps = {"ring": 2 * (p - 1), "tree": 2 * rounds, "recursive_doubling": rounds}[algorithm]
    share = {"ring": 2 * (p - 1) / p, "tree": 2 * rounds, "recursive_doubling": rounds}[algorithm]
    return steps * alpha + share * n / bw


def _factor_fraction(coll, p):
    from fractions import Fraction
    return {"all_reduce": Fraction(2 * (p - 1), p), "broadcast": Fraction(1)}.get(coll, Fraction(p - 1, p))


def _fit_polyfit(sizes, times, p):  # weights 1/t on the residuals: the relative fit
    n, t = np.asarray(sizes, float), np.asarray(times, float)
    slope, intercept = np.polyfit(2 * (p - 1) / p * n, t, 1, w=1 / t)
    return intercept / (2 * (p - 1)), 1 / slope


def _counts_by_sets(indices, e, world, g, rank):
    counts = np.zeros(world, dtype=np.int64)
    for row in indices.tolist():
        for node in {x * world // e // g for x in row}:
            counts[node * g + rank % g] += 1
    return counts


@pytest.mark.parametrize("check, right", [
    (lab07.check_allreduce_time, _time_by_bits), (lab07.check_bus_factor, _factor_fraction),
    (lab07.check_fit_alpha_beta, _fit_polyfit), (lab07.check_send_counts, _counts_by_sets),
])
def test_right_answers_written_differently(check, right):
    for seed in (1, 2):
        assert check(right, seed=seed).passed
