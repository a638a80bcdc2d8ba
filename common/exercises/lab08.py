"""Checkers for lab 08 (pipeline schedules and DualPipe): the 1F1B order, bubble formulas, DualPipe's stage pairs."""
from __future__ import annotations

from common.core.checks import checker, expect, expect_close, expect_equal, fail
from common.exercises.cases import as_number, learner_call, replayable
from common.parallel import pipeline


def _one_f_one_b_cases(rng):
    # fixed: several pp (a hard-coded pp fails every call), the last stage (no warm-up), fewer micro-batches than
    # warm-up slots, one micro-batch, one stage
    cases = [(4, 8, 0), (4, 8, 3), (6, 9, 1), (3, 5, 1), (4, 2, 0), (5, 1, 0), (5, 1, 4), (1, 3, 0)]
    for _ in range(6):
        pp = rng.randint(2, 12)
        cases.append((pp, rng.randint(1, 3 * pp), rng.randrange(pp)))
    return cases


@checker("8.1", "the 1F1B order of one stage")
@replayable
def check_one_f_one_b_order(one_f_one_b_order, cases):
    """one_f_one_b_order(pp, micro_batches, stage) -> [("F", j) or ("B", j), ...] in the order the stage runs them."""
    return _check_one_f_one_b(one_f_one_b_order, cases.rng)


def _check_one_f_one_b(one_f_one_b_order, rng):
    cases = _one_f_one_b_cases(rng)
    for pp, m, s in cases:
        got = learner_call(one_f_one_b_order, (pp, m, s), f"one_f_one_b_order({pp}, {m}, {s})",
                           (pipeline.one_f_one_b_order, pipeline.build))
        expect(isinstance(got, (list, tuple)), f"one_f_one_b_order({pp}, {m}, {s}) returned {type(got).__name__}; "
                                               f"return a list of ('F', j) / ('B', j) pairs")
        bad = [x for x in got if not (isinstance(x, (list, tuple)) and len(x) == 2)]
        if bad:
            fail(f"one_f_one_b_order({pp}, {m}, {s}): every item must be a pair ('F', j) or ('B', j); got "
                 f"{bad[0]!r} (of type {type(bad[0]).__name__})")
        got = [tuple(x) for x in got]
        expected = pipeline.one_f_one_b_order(pp, m, s)
        what = f"one_f_one_b_order(pp={pp}, micro_batches={m}, stage={s})"
        if sorted(got) != sorted(expected):
            fail(f"{what}: every micro-batch needs exactly one ('F', j) and one ('B', j), j = 0..{m - 1}; "
                 f"got {len(got)} items: {got[:6]}{' ...' if len(got) > 6 else ''}")
        in_flight = peak = 0
        for k, _ in got:
            in_flight += 1 if k == "F" else -1
            peak = max(peak, in_flight)
        warm = min(pp - s, m)
        if got == [("F", j) for j in range(m)] + [("B", j) for j in range(m)] and m > warm:
            fail(f"{what}: that is GPipe (all forwards, then all backwards): it holds all {m} micro-batches' "
                 f"activations. 1F1B starts backwards after pp-1-stage = {pp - 1 - s} warm-up forwards")
        if peak > warm:
            fail(f"{what}: {peak} micro-batches in flight at once, 1F1B keeps at most pp - stage = {warm}: "
                 f"too many warm-up forwards (pp-1-stage = {pp - 1 - s} of them, then one F and one B alternately)")
        if peak < warm:
            fail(f"{what}: only {peak} micro-batches in flight; stage {s} must run pp-1-stage = {pp - 1 - s} "
                 f"warm-up forwards, or the next stage starves and the bubble grows")
        fs = [j for k, j in got if k == "F"]
        bs = [j for k, j in got if k == "B"]
        if fs != sorted(fs) or bs != sorted(bs):
            fail(f"{what}: micro-batches must run in order, forwards j = 0, 1, ... and backwards j = 0, 1, ... (the "
                 f"next stage receives them in that order); got forwards {fs[:8]}, backwards {bs[:8]}")
        expect_equal(got, expected, what)
    # the whole pipeline runs without deadlock and has the 1F1B bubble
    pp, m = rng.randint(3, 8), rng.randint(8, 20)
    sched = pipeline.Schedule("yours", pp, pp, m, 1, {(0, s): s for s in range(pp)},
                              [[((k, 0, s, j),) for k, j in one_f_one_b_order(pp, m, s)] for s in range(pp)])
    res = pipeline.simulate(sched, pipeline.Durations(1, 2, 1))
    expect_close(res.bubble_max, (pp - 1) * 3, f"simulated bubble of your 1F1B with pp={pp}, {m} micro-batches")
    return (f"right for {len(cases)} (pp, micro-batches, stage) cases, and a whole pipeline built from it has the "
            f"1F1B bubble (PP-1)(F+B)")


def _bubble_reference(name, pp, F, B, W, FB):
    return pipeline.bubble_formula(name, pp, pipeline.Durations(F, B, W, FB))


@checker("8.2", "bubble per device by formula")
@replayable
def check_bubble(bubble, cases):
    """bubble(schedule, pp, F, B, W, FB) -> idle time per device for "gpipe", "1f1b", "zb1p", "dualpipe"."""
    return _check_bubble(bubble, cases.rng)


def _check_bubble(bubble, rng):
    # fixed: asymmetric timings first (with F=1, B=2, W=1 the ZB1P bubble equals (PP-1)F and (PP-1)W, which hides
    # mistakes), every schedule at two PP values, F&B different from F+B, and the PP=2 edge (DualPipe: no ramp)
    cases = [("1f1b", 6, 1.5, 2.7, 0.9, 3.6), ("zb1p", 6, 1.5, 2.7, 0.9, 3.6), ("dualpipe", 6, 1.5, 2.7, 0.9, 3.6),
             ("gpipe", 5, 1.5, 2.7, 0.9, 3.6),
             ("1f1b", 8, 1.0, 2.0, 1.0, 2.5), ("zb1p", 8, 1.0, 2.0, 1.0, 2.5), ("dualpipe", 8, 1.0, 2.0, 1.0, 2.5),
             ("gpipe", 4, 1.0, 2.0, 1.0, 2.5), ("dualpipe", 16, 0.8, 1.9, 0.5, 2.2), ("dualpipe", 2, 1.0, 2.0, 1.0, 2.5),
             ("1f1b", 1, 1.0, 2.0, 1.0, 2.5)]
    for _ in range(8):
        pp = 2 * rng.randint(1, 16)
        F = round(rng.uniform(0.5, 3), 3)
        B = round(rng.uniform(1.2, 2.5) * F, 3)
        W = round(rng.uniform(0.2, 0.45) * B, 3)
        FB = round(rng.uniform(max(F, B), F + B), 3)
        cases.append((rng.choice(pipeline.SCHEDULES), pp, F, B, W, FB))
    for name, pp, F, B, W, FB in cases:
        expected = _bubble_reference(name, pp, F, B, W, FB)
        what = f"bubble({name!r}, pp={pp}, F={F}, B={B}, W={W}, FB={FB})"
        got = as_number(learner_call(bubble, (name, pp, F, B, W, FB), what, (pipeline.bubble_formula,)), what,
                        "a number (the idle time per device)")
        if name == "dualpipe" and abs(got - (pp // 2 - 1) * (F + B + B - 3 * W)) < 1e-9 and abs(FB - F - B) > 1e-9 \
                and pp > 2:
            fail(f"{what} = {got:.6g}: that uses F + B for the overlapped pair; DualPipe's formula uses F&B (FB = {FB}), "
                 f"the time of a forward and a backward run together: (PP/2-1)(F&B+B-3W)")
        if name == "dualpipe" and abs(got - (pp // 2 - 1) * (FB + B - 2 * W)) < 1e-9 and pp > 2:
            fail(f"{what} = {got:.6g}: DualPipe subtracts 3W per ramp step, not 2W (that is ZB1P's): (PP/2-1)(F&B+B-3W)")
        if name == "zb1p" and pp > 1 and abs(got - (pp - 1) * (F + B)) < 1e-9:
            fail(f"{what} = {got:.6g}: that is 1F1B's bubble; ZB1P fills the ramp with weight passes: (PP-1)(F+B-2W)")
        if name == "dualpipe" and abs(got - (pp - 1) * (FB + B - 3 * W)) < 1e-9 and pp > 2:
            fail(f"{what} = {got:g}: DualPipe's bubble has PP/2 - 1 stages of ramp, not PP - 1 (each rank holds "
                 f"two stages and the pipeline is fed from both ends)")
        if name == "zb1p" and pp > 1 and abs(got - (pp - 1) * (F + B - W)) < 1e-9:
            fail(f"{what} = {got:g}: ZB1P removes 2W per stage, not W (the weight passes fill both the warm-up "
                 f"and the cool-down gaps): (PP-1)(F+B-2W)")
        if name in ("1f1b", "gpipe") and pp > 1 and abs(got - (pp - 1) * (F + B) / pp) < 1e-9:
            fail(f"{what} = {got:g}: that divides by PP; the formula is the idle time of one device, (PP-1)(F+B)")
        expect_close(got, expected, what, rtol=1e-9)
    return f"right for {len(cases)} schedules and timings (e.g. 1F1B, PP=8, F=1, B=2: {_bubble_reference('1f1b', 8, 1.0, 2.0, 1.0, 2.5):g})"


@checker("8.3", "pair stages for DualPipe")
@replayable
def check_dualpipe_pairs(dualpipe_pairs, cases):
    """dualpipe_pairs(pp) -> [(stage of the forward-direction pipeline, stage of the reverse one) for each rank];
    ValueError for an odd pp."""
    return _check_dualpipe_pairs(dualpipe_pairs, cases.rng)


def _check_dualpipe_pairs(dualpipe_pairs, rng):
    sizes = [4, 8, 2, 6] + [2 * rng.randint(3, 32) for _ in range(4)]
    for pp in sizes:
        what = f"dualpipe_pairs({pp})"
        got = learner_call(dualpipe_pairs, (pp,), what, (pipeline.dualpipe_stages,))
        expect(isinstance(got, (list, tuple)) and len(got) == pp,
               f"{what}: expected a list of one pair per rank ({pp} pairs), got "
               f"{got!r}" if not isinstance(got, (list, tuple)) else f"{what}: expected one pair per rank ({pp} "
               f"pairs), got {len(got)}")
        bad = [p for p in got if not (isinstance(p, (list, tuple)) and len(p) == 2)]
        if bad:
            fail(f"{what}: each rank's entry must be a pair (forward stage, reverse stage); got {bad[0]!r}")
        got = [tuple(p) for p in got]
        fwd = [p[0] for p in got]
        rev = [p[1] for p in got]
        if fwd == rev:
            fail(f"{what}: rank r holds the same stage r of both pipelines, so both are fed at rank 0 and run in "
                 f"the same direction -- the reverse pipeline must start at rank pp-1 (stage pp-1-r on rank r)")
        expect(sorted(fwd) == list(range(pp)) and sorted(rev) == list(range(pp)),
               f"{what}: each direction must place its stages 0..{pp - 1} on distinct ranks; got forward {fwd[:8]}, "
               f"reverse {rev[:8]}")
        expect(fwd[0] == 0 and rev[-1] == 0,
               f"{what}: forward micro-batches enter at rank 0 (its stage 0) and reverse ones at rank pp-1; got "
               f"rank 0 -> {got[0]}, rank {pp - 1} -> {got[-1]}")
        expect_equal(got, [(r, pp - 1 - r) for r in range(pp)], what)
    for odd in (3, 1, 2 * rng.randint(2, 20) + 1):
        try:
            dualpipe_pairs(odd)
        except ValueError:
            continue
        except Exception as exc:  # an assert or a RuntimeError where ValueError is asked for
            fail(f"dualpipe_pairs({odd}) raised {type(exc).__name__}: {exc}; expected ValueError (the error for a bad "
                 f"argument value), naming pp and saying it must be even")
        fail(f"dualpipe_pairs({odd}) returned instead of raising ValueError: with an odd PP the middle rank would hold "
             f"stage {odd // 2} of both pipelines, so DualPipe needs an even PP")
    return (f"right for {len(sizes)} even PP values (rank r holds stages r and PP-1-r), and odd PP (1, 3 and another) "
            f"raises ValueError")
