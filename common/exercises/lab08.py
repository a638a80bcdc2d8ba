"""Checkers for lab 08 (pipeline schedules and DualPipe): the 1F1B order of one stage, and one DualPipe rank's order built
from the eight steps' rules (against DeepSeek's, simulated, and planned under NCCL's rules)."""
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


def _order(pp, m, stage, warm=None, b_first=False, first=0):
    """A stage's 1F1B order with `warm` warm-up forwards (right: min(pp-1-stage, m)) -- or a known mistake: each
    steady pair backward first, micro-batches numbered from `first`."""
    warm = min(pp - 1 - stage, m) if warm is None else warm
    order = [("F", j) for j in range(warm)]
    for j in range(m - warm):
        pair = [("F", warm + j), ("B", j)]
        order += pair[::-1] if b_first else pair
    order += [("B", j) for j in range(m - warm, m)]
    return [(k, j + first) for k, j in order]


def _own() -> tuple:
    """The checker's own orders, which give the right answer too: watched like the references."""
    return _order, _order_mistakes, _tokens


def _peak(order) -> int:
    """The most micro-batches in flight (forwarded, not yet backwarded) at once."""
    in_flight = peak = 0
    for k, _ in order:
        in_flight += 1 if k == "F" else -1
        peak = max(peak, in_flight)
    return peak


def _order_mistakes(pp, m, s) -> dict:
    """{key: (what is wrong, the order it gives)} for the look-alike orders of one stage."""
    more, fewer = _order(pp, m, s, min(pp - s, m)), _order(pp, m, s, max(min(pp - 2 - s, m), 0))
    return {
        "gpipe": (f"that is GPipe (all forwards, then all backwards): it holds all {m} micro-batches' activations. "
                  f"1F1B starts backwards after pp-1-stage = {pp - 1 - s} warm-up forwards",
                  [("F", j) for j in range(m)] + [("B", j) for j in range(m)]),
        "one more": (f"{_peak(more)} micro-batches in flight at once, 1F1B keeps at most pp - stage = "
                     f"{min(pp - s, m)}: too many warm-up forwards (pp-1-stage = {pp - 1 - s} of them, then one F and "
                     f"one B alternately)", more),
        "none": (f"only 1 micro-batches in flight: no warm-up at all; stage {s} must run pp-1-stage = {pp - 1 - s} "
                 f"warm-up forwards before its first backward, or the next stage starves and the bubble grows",
                 _order(pp, m, s, 0)),
        "one fewer": (f"only {_peak(fewer)} micro-batches in flight: one warm-up forward too few -- stage {s} runs "
                      f"pp-1-stage = {pp - 1 - s} of them, not pp-2-stage", fewer),
        "reversed": (f"the stages are numbered the other way: stage 0 (the first) runs the most warm-up forwards, "
                     f"pp-1 of them, and the last stage none -- warm-up = pp-1-stage (here {pp - 1 - s}), not stage",
                     _order(pp, m, s, min(s, m))),
        "b first": ("each steady-state step runs the forward first, then the backward: F of micro-batch warm-up + j, "
                    "then B of micro-batch j (your backward first leaves one micro-batch fewer in flight, and the last "
                    "stage would run a backward before its forward)", _order(pp, m, s, b_first=True)),
        "uncapped": (f"with fewer micro-batches ({m}) than warm-up slots (pp-1-stage = {pp - 1 - s}) the warm-up is "
                     f"min(pp-1-stage, micro_batches): you ran micro-batches that do not exist",
                     _order(pp, m, s, pp - 1 - s)),
        "from 1": (f"micro-batches are numbered from 0 to micro_batches-1 = {m - 1}, as range(micro_batches) gives "
                   f"them", _order(pp, m, s, first=1)),
    }


@checker("8.1", "the 1F1B order of one stage")
@replayable
def check_one_f_one_b_order(one_f_one_b_order, cases):
    """one_f_one_b_order(pp, micro_batches, stage) -> [("F", j) or ("B", j), ...] in the order the stage runs them. A
    wrong order is named when one look-alike (GPipe, a warm-up one too long or short, none, stages reversed, B before
    F, the warm-up not capped, numbered from 1) gives every order the learner's gives."""
    return _check_one_f_one_b(one_f_one_b_order, cases.rng)


def _learner_order(one_f_one_b_order, pp, m, s):
    call = f"one_f_one_b_order({pp}, {m}, {s})"
    got = learner_call(one_f_one_b_order, (pp, m, s), call, (pipeline.one_f_one_b_order, pipeline.build, *_own()),
                       library=True)
    expect(isinstance(got, (list, tuple)), f"{call} returned {type(got).__name__}; return a list of ('F', j) / "
                                           f"('B', j) pairs")
    bad = [x for x in got if not (isinstance(x, (list, tuple)) and len(x) == 2)]
    if bad:
        fail(f"{call}: every item must be a pair ('F', j) or ('B', j); got {bad[0]!r} (of type "
             f"{type(bad[0]).__name__})")
    return [tuple(x) for x in got]


def _check_one_f_one_b(one_f_one_b_order, rng):
    cases = _one_f_one_b_cases(rng)
    got = [_learner_order(one_f_one_b_order, pp, m, s) for pp, m, s in cases]
    right = [pipeline.one_f_one_b_order(pp, m, s) for pp, m, s in cases]
    wrong = [i for i in range(len(cases)) if got[i] != right[i]]
    if wrong:
        i = wrong[0]
        (pp, m, s), mine, expected = cases[i], got[i], right[i]
        what = f"one_f_one_b_order(pp={pp}, micro_batches={m}, stage={s})"
        looks = [_order_mistakes(*c) for c in cases]
        for key in looks[0]:
            if all(look[key][1] == g for look, g in zip(looks, got)):
                fail(f"{what}: {looks[i][key][0]}")
        _explain_order(what, mine, expected, pp, m, s)
    # the whole pipeline runs without deadlock and has the 1F1B bubble
    pp, m = rng.randint(3, 8), rng.randint(8, 20)
    sched = pipeline.Schedule("yours", pp, pp, m, 1, {(0, s): s for s in range(pp)},
                              [[((k, 0, s, j),) for k, j in _learner_order(one_f_one_b_order, pp, m, s)]
                               for s in range(pp)])
    res = pipeline.simulate(sched, pipeline.Durations(1, 2, 1))
    expect_close(res.bubble_max, (pp - 1) * 3, f"simulated bubble of your 1F1B with pp={pp}, {m} micro-batches")
    return (f"right for {len(cases)} (pp, micro-batches, stage) cases, and a whole pipeline built from it has the "
            f"1F1B bubble (PP-1)(F+B)")


def _explain_order(what, got, expected, pp, m, s):
    """The verdict on an order that no named look-alike explains: what it breaks first."""
    if got and {k for k, _ in got} <= {"f", "b"}:
        fail(f"{what}: the ops are ('F', j) and ('B', j), capital letters; got {got[:4]}")
    if sorted(got) != sorted(expected):
        fail(f"{what}: every micro-batch needs exactly one ('F', j) and one ('B', j), j = 0..{m - 1}; "
             f"got {len(got)} items: {got[:6]}{' ...' if len(got) > 6 else ''}")
    fs = [j for k, j in got if k == "F"]
    bs = [j for k, j in got if k == "B"]
    if fs != sorted(fs) or bs != sorted(bs):
        fail(f"{what}: micro-batches must run in order, forwards j = 0, 1, ... and backwards j = 0, 1, ... (the "
             f"next stage receives them in that order); got forwards {fs[:8]}, backwards {bs[:8]}")
    early = next((j for n, (k, j) in enumerate(got) if k == "B" and ("F", j) not in got[:n]), None)
    if early is not None:
        fail(f"{what}: the backward of micro-batch {early} runs before its forward: a backward needs the "
             f"activations its forward kept")
    peak, warm = _peak(got), min(pp - s, m)
    if peak > warm:
        fail(f"{what}: {peak} micro-batches in flight at once, 1F1B keeps at most pp - stage = {warm}: "
             f"too many warm-up forwards (pp-1-stage = {pp - 1 - s} of them, then one F and one B alternately)")
    if peak < warm:
        fail(f"{what}: only {peak} micro-batches in flight; stage {s} must run pp-1-stage = {pp - 1 - s} "
             f"warm-up forwards, or the next stage starves and the bubble grows")
    expect_equal(got, expected, what)


# --------------------------------------------------------------------------------------------------------------
# 8.2 one DualPipe rank's order, built from the schedule's rules


def _tokens(pp, micro_batches, rank, mistake=None):
    """One rank's DualPipe order in tokens, built from the eight steps' rules -- or with a known `mistake`."""
    n, m = pp // 2, micro_batches // 2
    h = {"h is the rank": rank, "h off by one": min(rank, pp - rank)}.get(mistake, min(rank, pp - 1 - rank))
    ops = ["F0"] * ((n - h - 1) * (1 if mistake == "warm-up once" else 2))
    ops += (["F1", "F0"] if mistake == "step 2 late chunk first" else ["F0", "F1"]) * (h + 1)
    ops += (["B1", "F1"] if mistake == "step 3 not zero-bubble" else ["Bi1", "W", "F1"]) * (n - h - 1)
    for i in range(m - 2 * n + h + 1 + (mistake == "one main step more")):
        split = i == 0 and h == n - 1 and mistake != "middle ranks overlap their first pair"
        pair = ["F0", "B1"] if split or mistake == "no overlap" else ["F0&B1"]
        ops += ["F1&B0"] + pair if mistake == "pairs swapped" else pair + ["F1&B0"]
    ops += (["F1&B0", "B1"] if mistake == "step 5 backward last" else ["B1", "F1&B0"]) * (n - h - 1)
    last = ["B1", "B0"] * (h + 1)
    cut = {"step 6 all zero-bubble": 0, "step 6 not zero-bubble": 2 * h + 2}.get(mistake, h + 1)
    ops += last[:cut] + ["Bi" + t[1] for t in last[cut:]]
    ops += (["Bi0", "W"] if mistake == "step 7 backward first" else ["W", "Bi0"]) * (n - h - 1)
    if mistake != "queued weight passes never run":
        ops += ["W"] * (sum(t.startswith("Bi") for t in ops) - ops.count("W"))
    return ops


MISTAKES = {
    "h is the rank": "h is the rank's distance from the nearer end, min(rank, PP-1-rank): rank {r} has h = {h}",
    "h off by one": "h is the rank's distance from the nearer end, min(rank, PP-1-rank): the last rank, PP-1, is at "
                    "distance 0 like rank 0 (rank {r} has h = {h})",
    "step 2 late chunk first": "step 2 runs F0, then F1 (the early chunk's forward first), h + 1 times",
    "step 5 backward last": "step 5 runs B1, then F1&B0 (the backward alone first), PP/2 - h - 1 times",
    "warm-up once": "step 1 runs (PP/2 - h - 1) x 2 forwards of the early chunk, not PP/2 - h - 1",
    "step 3 not zero-bubble": "step 3 runs Bi1 (input gradients only), then W (the weight pass it queued), then F1 -- "
                              "a zero-bubble backward, not a full B1",
    "one main step more": "step 4 runs micro_batches/2 - PP + h + 1 rounds of F0&B1, F1&B0",
    "middle ranks overlap their first pair": "the middle ranks (h = PP/2 - 1) split the FIRST pair of step 4 into F0 "
                                             "then B1; every other pair overlaps",
    "no overlap": "step 4 overlaps each forward with a backward of the other chunk: F0&B1, then F1&B0",
    "pairs swapped": "each round of step 4 is F0&B1, then F1&B0",
    "step 6 all zero-bubble": "step 6 alternates B1, B0 h + 1 times; only the LAST h + 1 of those backwards are "
                              "zero-bubble (Bi)",
    "step 6 not zero-bubble": "the last h + 1 backwards of step 6 are zero-bubble (Bi): their weight passes fill "
                              "step 7",
    "step 7 backward first": "step 7 runs a weight pass, THEN a zero-bubble backward of the early chunk: W, Bi0",
    "queued weight passes never run": "step 8 runs a W for every weight pass still queued (one per Bi not yet "
                                      "followed by its W)",
}


def _dualpipe_cases(rng):
    # fixed: PP = 4 and 8 (all ranks: edges, middles, the second half), PP = 2 (no warm-up or zero-bubble steps),
    # PP = 6 (h = 0, 1, 2), the fewest micro-batches (2 PP) and more; then random even PP and micro-batch counts
    cases = [(4, 8), (8, 20), (2, 4), (6, 12), (8, 16), (4, 14)]
    for _ in range(3):
        pp = 2 * rng.randint(1, 6)
        cases.append((pp, 2 * pp + 2 * rng.randint(0, 6)))
    return cases


def _learner_tokens(dualpipe_ops, pp, m, r, what) -> list:
    got = learner_call(dualpipe_ops, (pp, m, r), what, (pipeline.dualpipe, pipeline.dualpipe_tokens, *_own()),
                       library=True)
    expect(isinstance(got, (list, tuple)) and all(isinstance(t, str) for t in got),
           f"{what} returned {type(got).__name__} {got!r:.100}; return a list of tokens such as 'F0', 'B1', 'Bi1', "
           f"'W', 'F0&B1'")
    unknown = [t for t in got if t not in pipeline.TOKENS]
    if unknown:
        fail(f"{what}: {unknown[0]!r} is not a token; allowed: {', '.join(pipeline.TOKENS)}")
    return list(got)


@checker("8.2", "one DualPipe rank's order, from the schedule's rules")
@replayable
def check_dualpipe_ops(dualpipe_ops, cases):
    """dualpipe_ops(pp, micro_batches, rank) -> the rank's ops as tokens ("F0", "B1", "Bi1", "W", "F0&B1", ...) in
    DeepSeek's order; the whole schedule built from it simulated, and planned under NCCL's rules."""
    from common.parallel.pipeline_run import plan
    for i, (pp, m) in enumerate(_dualpipe_cases(cases.rng)):
        whats = [f"dualpipe_ops(pp={pp}, micro_batches={m}, rank={r})" + cases.tag(i >= 6) for r in range(pp)]
        gots = [_learner_tokens(dualpipe_ops, pp, m, r, what) for r, what in enumerate(whats)]
        wrong = [r for r in range(pp) if gots[r] != pipeline.dualpipe_tokens(pp, m, r)]
        if not wrong:
            continue
        r = wrong[0]
        got, want, h = gots[r], pipeline.dualpipe_tokens(pp, m, r), min(r, pp - 1 - r)
        k = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        starts = pipeline.steps_of(pp, m, r)
        step = max(s for s in range(1, 9) if starts[s - 1] <= min(k, len(want) - 1))
        # a mistake that gives every rank's order first; else one that gives this rank's
        named = ([name for name in MISTAKES if all(_tokens(pp, m, q, name) == gots[q] for q in range(pp))]
                 or [name for name in MISTAKES if _tokens(pp, m, r, name) == got])
        why = MISTAKES[named[0]].format(r=r, h=h) if named else f"step {step}: {pipeline.STEPS[step]}"
        here = (f"op {k} is {got[k]!r} where DeepSeek's order runs {want[k]!r}" if k < min(len(got), len(want))
                else f"{len(got)} ops where DeepSeek's order has {len(want)}")
        fail(f"{whats[r]}: {here} (in its step {step}, h = {h}, PP/2 = {pp // 2}): {why}")
    pp, m = 8, 20
    mine = pipeline.schedule_from(dualpipe_ops, pp, m)
    sim, ref = pipeline.simulate(mine), pipeline.run("dualpipe", pp, m)
    expect(sim.bubble_max == ref.bubble_max, f"your schedule at PP = {pp} idles {sim.bubble_max:g} on its worst "
                                             f"rank, DeepSeek's {ref.bubble_max:g}")
    plan.make(mine)  # the point-to-point plan under NCCL's rules
    return (f"DeepSeek's order on every rank of {len(_dualpipe_cases(cases.rng))} (PP, micro-batches) cases; the whole "
            f"schedule simulates as DeepSeek's and plans under NCCL's rules")
