"""Checkers for lab 01 (measurement): a correct timing function, an event timer, a noise-aware regression rule.

The timers are checked on a simulated device queue (common.exercises.simtime): the work is asynchronous, the first
calls are slow, two timed calls are delayed on the host, and no real time passes, so the checker knows the exact
median a right timer reports, and the exact number each classic mistake gives (warm-up calls timed too, the minimum
or the mean instead of the median, no synchronisation, milliseconds), on any machine however busy.
"""
from __future__ import annotations

import statistics

import numpy as np

from common.core import timing
from common.core.checks import CheckFailed, _learner_error, checker, expect, fail
from common.core.measurement import noisy_samples
from common.exercises.cases import as_number, learner_call, replayable
from common.exercises.simtime import SimQueue, clock

WARMUP_HOST_S = 0.060  # each warm-up call pays this on the host (like compilation or autotuning)
OUTLIER_HOST_S = 0.040  # two timed calls are delayed on the host (like a preempted thread)
# two settings, so a hard-coded warm-up or repeat count, or a hard-coded answer, fails: (warmup, repeats, scale)
SETTINGS = ((3, 20, 1.0), (5, 11, 1.7))


def _plan(rng, warmup: int, repeats: int, scale: float) -> list[tuple[float, float]]:
    """(host_s, work_s) per call: warm-up calls slow on the host; of the timed calls one more than half are short
    (2-3 ms, all different) and the rest long (6-8 ms), two of the long ones delayed on the host. So the median is
    the largest short call, the minimum the smallest, the mean is pulled up by the delays, and a median that also
    takes the warm-up calls lands among the long ones."""
    short = repeats // 2 + 1
    works = [scale * rng.uniform(2e-3, 3e-3) for _ in range(short)] + \
            [scale * rng.uniform(6e-3, 8e-3) for _ in range(repeats - short)]
    hosts = [0.0] * short + [OUTLIER_HOST_S if i < 2 else 0.0 for i in range(repeats - short)]
    order = list(range(repeats))
    rng.shuffle(order)
    timed = [(hosts[i], works[i]) for i in order]
    return [(WARMUP_HOST_S, scale * 3e-3)] * warmup + timed


def _stopwatch(q, warmup, repeats, sync_each=True, time_warmup=False):
    """Run a stopwatch timer (right, or with one mistake) on q; its samples."""
    samples = []
    for i in range(warmup + repeats):
        timed = i >= warmup or time_warmup
        t0 = q.now
        q.fn()
        if sync_each or i == warmup + repeats - 1:
            q.sync()
        if timed:
            samples.append(q.now - t0)
        if i == warmup - 1:
            q.sync()
    return samples


def _event_samples(q, warmup, repeats, time_warmup=False, sync_warmup=True):
    """Event-timer samples on q (right, or with the warm-up calls timed too, with or without a sync after them)."""
    pairs = []
    for _ in range(warmup):
        if time_warmup:
            start, end = q.event(), q.event()
            start.record()
            q.fn()
            end.record()
            pairs.append((start, end))
        else:
            q.fn()
    if sync_warmup:
        q.sync()
    for _ in range(repeats):
        start, end = q.event(), q.event()
        start.record()
        q.fn()
        end.record()
        pairs.append((start, end))
    q.sync()
    return [s.elapsed_time(e) / 1e3 for s, e in pairs]


def _mistakes(plan, warmup, repeats, events: bool) -> tuple[list[float], list[tuple[str, float]]]:
    """The right samples, and (message, value) of each classic mistake on the same plan."""
    def samples(time_warmup=False):
        if events:
            return _event_samples(SimQueue(plan), warmup, repeats, time_warmup)
        return _stopwatch(SimQueue(plan), warmup, repeats, time_warmup=time_warmup)
    right = samples()
    med = statistics.median(right)
    wrong = [("the minimum of the timed calls: the exercise asks for the median (a typical call); the minimum is "
              "the luckiest call and hides the noise the median is robust to", min(right)),
             ("the mean of the timed calls: two calls delayed on the host pull a mean up -- report the median",
              statistics.fmean(right)),
             ("the total of the timed calls: divide by nothing, take the median per call", sum(right)),
             ("the warm-up calls were timed together with the measured ones: time only the `repeats` calls that "
              "come after the warm-up", statistics.median(samples(time_warmup=True))),
             ("milliseconds: return seconds", med * 1e3), ("microseconds: return seconds", med * 1e6),
             ("nanoseconds (perf_counter_ns?): return seconds", med * 1e9)]
    if events:  # warm-up timed in one loop with the rest, no sync between them: the same mistake, other samples
        wrong.append((wrong[3][0], statistics.median(_event_samples(SimQueue(plan), warmup, repeats, True, False))))
    if not events:
        wrong.append(("the work runs asynchronously and the clock stopped before sync() returned: you timed the "
                      "launch, not the work", statistics.median(_stopwatch(SimQueue(plan), warmup, repeats,
                                                                           sync_each=False)[:-1] or [0.0])))
    return right, wrong


def _judge(got, text: str, q: SimQueue, plan, warmup: int, repeats: int, events: bool) -> None:
    expect(q.calls == warmup + repeats,
           f"{text}: fn was called {q.calls} times; expected warmup={warmup} + repeats={repeats} = {warmup + repeats} "
           f"(warm-up calls run fn but are not timed; use the arguments, not fixed counts)")
    right, wrong = _mistakes(plan, warmup, repeats, events)
    ordered = sorted(right)
    low, high = statistics.median_low(ordered), statistics.median_high(ordered)
    if low * (1 - 1e-9) <= got <= high * (1 + 1e-9):
        return
    for message, value in wrong:
        if abs(got - value) <= 1e-9 * max(abs(value), 1e-12):
            fail(f"{text} = {got:.6g}, the median is {statistics.median(right):.6g} s: that is {message}")
    if not events and q.reads == 0:
        fail(f"{text} = {got:.6g}: your timer read none of time.perf_counter / monotonic / time (and their _ns "
             f"forms) -- this checker runs fn on a simulated clock that those read; time with time.perf_counter()")
    if got < min(right) / 4:
        fail(f"{text} = {got * 1e3:.4g} ms per call, but the fastest call takes {min(right) * 1e3:.3g} ms: the work "
             f"runs asynchronously -- stop the clock only after sync() (you timed the launch, not the work)")
    fail(f"{text} = {got:.6g} s; the median of the timed calls is {statistics.median(right):.6g} s (any value "
         f"between the two middle samples, {low:.6g} and {high:.6g}, is right)")


@checker("1.1", "a correct timing function", in_kernel="it times the learner's timer on a simulated clock in the "
                                                       "kernel")
@replayable
def check_time_fn(time_fn, cases):
    """time_fn(fn, sync, warmup, repeats) -> median seconds per call of fn, synchronised, after warm-up."""
    for warmup, repeats, scale in SETTINGS:
        plan = _plan(cases.rng, warmup, repeats, scale)
        q = SimQueue(plan)
        text = f"time_fn(fn, sync, warmup={warmup}, repeats={repeats})"
        with clock(q, getattr(time_fn, "__globals__", {})):
            got = learner_call(time_fn, (q.fn, q.sync, warmup, repeats), text, [(timing, "bench")],
                               expected="the median seconds per call")
        _judge(as_number(got, text), text, q, plan, warmup, repeats, events=False)
    return ("the exact median per call for two warm-up/repeat settings: synchronised, warmed up, and robust to "
            "the two delayed calls")


@checker("1.3", "a timer built on events", in_kernel="it times the learner's event timer on a simulated clock in the "
                                                     "kernel")
@replayable
def check_event_time(event_time, cases):
    """event_time(fn, make_event, sync, warmup, repeats) -> median seconds per call measured with timing events
    (torch.cuda.Event on a GPU; a QueueEvent-like event of the simulated queue here)."""
    for warmup, repeats, scale in SETTINGS:
        plan = _plan(cases.rng, warmup, repeats, scale)
        q = SimQueue(plan)
        records = {"n": 0}

        def make_event(q=q):
            ev = q.event()
            real = ev.record

            def record():
                records["n"] += 1
                real()
            ev.record = record
            return ev
        text = f"event_time(fn, make_event, sync, warmup={warmup}, repeats={repeats})"
        try:
            with clock(q, getattr(event_time, "__globals__", {})):
                got = event_time(q.fn, make_event, q.sync, warmup, repeats)
        except (NotImplementedError, CheckFailed):
            raise
        except RuntimeError as exc:
            if "completed" in str(exc) or "recorded" in str(exc):
                raise CheckFailed(f"{text}: elapsed_time was read before the events had completed ({exc}); "
                                  f"record the end event, then sync() (or end.synchronize()), then read "
                                  f"start.elapsed_time(end)") from None
            raise CheckFailed(f"{text} should return the median seconds per call; {_learner_error(exc)}") from exc
        except Exception as exc:
            raise CheckFailed(f"{text} should return the median seconds per call; {_learner_error(exc)}") from exc
        got = as_number(got, text)
        if records["n"] == 0:
            fail(f"{text}: no event was recorded -- time each call between start.record() and end.record() and read "
                 f"start.elapsed_time(end) (a stopwatch with sync() is exercise 1.1)")
        if records["n"] < 2 * repeats:
            fail(f"{text}: {records['n']} events recorded for {repeats} timed calls; record a start and an end event "
                 f"around EACH call (one pair around all calls gives a mean, and outliers inflate it)")
        _judge(got, text, q, plan, warmup, repeats, events=True)
    return "events around each call, read after synchronising, the exact median in seconds, for two settings"


def _boolean(got) -> None:
    if not isinstance(got, (bool, np.bool_)):
        fail(f"is_regression(...) returned {type(got).__name__} {got!r}; expected True or False")


def _rule(is_regression, base, cand, text):
    from common.core import measurement
    got = learner_call(is_regression, (list(base), list(cand)), text, [measurement.is_regression],
                       expected="True or False")
    _boolean(got)
    return bool(got)


def _trial_rates(is_regression, rng, slowdown: float, trials: int, n: int = 15) -> tuple[float, list]:
    """The share of `trials` pairs flagged; each pair at its own time scale (10 us to 10 s per sample), so a
    threshold in seconds cannot be tuned to one. Also the scales of the pairs flagged (or missed)."""
    flagged, scales = 0, []
    for _ in range(trials):
        noise = rng.uniform(0.02, 0.08)
        scale = 10 ** rng.uniform(-5, 1)
        base = noisy_samples(n, scale, noise, outlier_rate=0.1, rng=rng)
        cand = noisy_samples(n, scale * (1.0 + slowdown), noise, outlier_rate=0.1, rng=rng)
        hit = _rule(is_regression, base, cand, f"is_regression(<{n} baseline times>, <{n} candidate times>)")
        flagged += hit
        if hit != (slowdown > 0):
            scales.append(scale)
    return flagged / trials, scales


def _scale_hint(scales: list) -> str:
    """' -- the wrong answers were at 1.2 ms and slower: ...' when the mistakes sit at one end of the scales."""
    if len(scales) < 3:
        return ""
    lo, hi = min(scales), max(scales)
    if hi / lo < 1e3:
        return (f"; every wrong answer came at sample times between {lo:.3g} and {hi:.3g} s, and right ones at other "
                f"scales: a threshold in seconds (absolute) only fits one scale -- compare the shift relative to the "
                f"baseline's median")
    return ""


@checker("1.2", "a noise-aware regression rule")
@replayable
def check_is_regression(is_regression, cases):
    """is_regression(baseline_times, candidate_times) -> True for a real slowdown of >= 20%, False for noise, at any
    time scale (the rule is relative to the baseline)."""
    rng = np.random.default_rng(cases.seed)
    trials = 200
    # first, one candidate against a baseline 2x faster (a regression) and one 2x slower (a speed-up)
    cand = noisy_samples(15, 0.01, 0.03, rng=rng)
    slower, faster = [x * 2.0 for x in cand], [x / 2.0 for x in cand]
    against_faster = _rule(is_regression, faster, cand, "is_regression(<a baseline 2x faster>, <candidate>)")
    against_slower = _rule(is_regression, slower, cand, "is_regression(<a baseline 2x slower>, <candidate>)")
    if against_faster == against_slower:
        said = (f"is_regression returned {against_faster} for the same candidate (10 ms samples) against a baseline "
                f"2x faster and against one 2x slower")
        if against_faster and not _rule(is_regression, cand, cand, "is_regression(<candidate>, <the same times>)"):
            fail(f"{said}: a 2x SPEED-UP was flagged as a regression -- only slower counts (a shift in either "
                 f"direction is not a regression)")
        big = [x * 100 for x in cand]
        if _rule(is_regression, [x / 2.0 for x in big], big, "is_regression(<1 s samples>)") and not _rule(
                is_regression, [x * 2.0 for x in big], big, "is_regression(<1 s samples>)"):
            fail(f"{said}, but the right answers for 1 s samples: a threshold in seconds (absolute) fits one time "
                 f"scale only -- compare the shift relative to the baseline's median")
        fail(f"{said}: the rule ignores the baseline -- compare the candidate's median with the baseline's")
    expect(against_faster and not against_slower, "is_regression flagged a candidate 2x FASTER than its baseline "
                                                  "and not one 2x slower: the comparison points the wrong way")
    # edge cases: identical runs, and noiseless runs with a clear shift either way, at two time scales
    for scale in (1.0, 2e-4):
        flat = [scale] * 15
        for cand, want, what, why in (
                (flat, False, "two identical runs", "no shift is no regression"),
                ([1.3 * scale] * 15, True, "a noiseless 30% slowdown", "a 30% slowdown without any noise is as real "
                 "as a regression gets: a threshold above 30%, or a test that needs a non-zero spread, misses it"),
                ([0.7 * scale] * 15, False, "a noiseless 30% speed-up", "only slower counts")):
            what = f"{what} of {scale:g} s samples"
            got = _rule(is_regression, flat, cand, f"is_regression({what})")
            if got != want and scale < 1 and _rule(is_regression, [1.0] * 15, [x / scale for x in cand], what) == want:
                why = (f"right at 1 s per sample but not at {scale:g} s: a threshold in seconds (absolute) fits one "
                       f"scale only -- compare the shift relative to the baseline's median")
            expect(got == want, f"is_regression on {what} (15 each) returned {got!r}; expected {want}: {why}")
    for n in (15, 7):  # two sample counts: a rule tuned to one n fails the other
        false_alarms, wrong_fa = _trial_rates(is_regression, rng, 0.0, trials, n)
        detected, wrong_det = _trial_rates(is_regression, rng, 0.20, trials, n)
        speedups, _ = _trial_rates(is_regression, rng, -0.20, trials, n)
        if false_alarms > 0.05:
            fail(f"on {trials} pairs of runs of {n} samples with NO change (2-8% noise, 10% outliers) your rule "
                 f"cried regression {false_alarms:.1%} of the time (allowed 5%): compare medians, and demand a "
                 f"shift larger than the noise" + _scale_hint(wrong_fa))
        if detected < (0.95 if n >= 15 else 0.70):
            fail(f"a planted 20% slowdown in runs of {n} samples was flagged in only {detected:.1%} of {trials} "
                 f"trials (need {'95' if n >= 15 else '70'}%): your threshold is too strict, or a mean/min is "
                 f"being thrown off by outliers" + _scale_hint(wrong_det))
        if speedups > 0.05:
            fail(f"a 20% SPEED-UP was flagged as a regression in {speedups:.1%} of trials: only slower should "
                 f"count")
    return (f"at most 5% false alarms on noise and most planted 20% slowdowns caught, for runs of 15 and 7 samples "
            f"({trials} simulated pairs each, sample times from 10 us to 10 s), relative to the baseline")
