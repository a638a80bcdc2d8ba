"""Checkers for lab 01 (measurement): a correct timing function, an event timer, a noise-aware regression rule."""
from __future__ import annotations

import time

import numpy as np

from common.core.checks import CheckFailed, _learner_error, checker, expect, fail
from common.core.measurement import AsyncQueue, noisy_samples
from common.exercises.cases import as_number, learner_call, replayable

WORK_S = 0.004  # each call's real work, done asynchronously on the queue (the first setting; the second differs)
WARMUP_EXTRA_S = 0.060  # the warm-up calls pay this (like compilation or autotuning)
OUTLIER_EXTRA_S = 0.040  # every fifth timed call is delayed on the host (like a preempted thread)
# two settings, so a hard-coded warm-up or repeat count, or a hard-coded answer, fails: (warmup, repeats, work_s)
SETTINGS = ((3, 20, WORK_S), (5, 11, 0.007))


def _workload(q: AsyncQueue, warmup: int, work_s: float, calls: dict):
    """fn(): slow for its first `warmup` calls, a host delay every fifth timed call, then `work_s` of queued work."""
    def fn():
        calls["n"] += 1
        n = calls["n"]
        if n <= warmup:  # first-call costs, paid on the host before the launch
            time.sleep(WARMUP_EXTRA_S)
        elif (n - warmup) % 5 == 0:
            time.sleep(OUTLIER_EXTRA_S)
        q.launch(lambda: time.sleep(work_s))
    return fn


def _judge(got, text: str, work_s: float, calls: int, warmup: int, repeats: int):
    expect(calls == warmup + repeats,
           f"{text}: fn was called {calls} times; expected warmup={warmup} + repeats={repeats} = {warmup + repeats} "
           f"(warm-up calls run fn but are not timed; use the arguments, not fixed counts)")
    if got < work_s / 4:
        fail(f"{text} = {got * 1e3:.3f} ms per call, but each call's work takes {work_s * 1e3:.0f} ms: the work "
             f"runs asynchronously, so stop the clock only after sync() -- you timed the launch, not the work")
    if 200 * work_s < got < 2000 * work_s:
        fail(f"{text} = {got:.4g}, about 1000x the {work_s * 1e3:.0f} ms of work: that is milliseconds; return "
             f"seconds")
    if got > 2 * work_s:
        fail(f"{text} = {got * 1e3:.1f} ms per call, but a typical call takes about {work_s * 1e3:.0f} ms: a few "
             f"slow outliers (or warm-up calls) inflate a mean or a total -- report the median of the timed calls")


@checker("1.1", "a correct timing function")
def check_time_fn(time_fn):
    """time_fn(fn, sync, warmup, repeats) -> median seconds per call of fn, synchronised, after warm-up."""
    for warmup, repeats, work_s in SETTINGS:
        with AsyncQueue() as q:
            calls = {"n": 0}
            text = f"time_fn(fn, sync, warmup={warmup}, repeats={repeats})"
            got = learner_call(time_fn, (_workload(q, warmup, work_s, calls), q.synchronize, warmup, repeats), text,
                               expected="the median seconds per call")
            q.synchronize()
        _judge(as_number(got, text), text, work_s, calls["n"], warmup, repeats)
    return (f"about {SETTINGS[0][2] * 1e3:.0f} and {SETTINGS[1][2] * 1e3:.0f} ms per call for two warm-up/repeat "
            f"settings: synchronised, warmed up, and the median resists outliers")


@checker("1.3", "a timer built on events")
def check_event_time(event_time):
    """event_time(fn, make_event, sync, warmup, repeats) -> median seconds per call measured with timing events
    (torch.cuda.Event on a GPU; QueueEvent on the CPU's stand-in queue)."""
    for warmup, repeats, work_s in SETTINGS:
        with AsyncQueue() as q:
            calls, records = {"n": 0}, {"n": 0}

            def make_event():
                ev = q.event()
                real = ev.record

                def record():
                    records["n"] += 1
                    real()
                ev.record = record
                return ev
            text = f"event_time(fn, make_event, sync, warmup={warmup}, repeats={repeats})"
            try:
                got = event_time(_workload(q, warmup, work_s, calls), make_event, q.synchronize, warmup, repeats)
            except RuntimeError as exc:
                if "completed" in str(exc) or "recorded" in str(exc):
                    raise CheckFailed(f"{text}: elapsed_time was read before the events had completed ({exc}); "
                                      f"record the end event, then sync() (or end.synchronize()), then read "
                                      f"start.elapsed_time(end)") from None
                raise
            except (NotImplementedError, CheckFailed):
                raise
            except Exception as exc:
                raise CheckFailed(f"{text} should return the median seconds per call; {_learner_error(exc)}") from exc
            q.synchronize()
        got = as_number(got, text)
        if records["n"] == 0:
            fail(f"{text}: no event was recorded -- time each call between start.record() and end.record() and read "
                 f"start.elapsed_time(end) (a stopwatch with sync() is exercise 1.1)")
        if records["n"] < 2 * repeats:
            fail(f"{text}: {records['n']} events recorded for {repeats} timed calls; record a start and an end event "
                 f"around EACH call (one pair around all calls gives a mean, and outliers inflate it)")
        _judge(got, text, work_s, calls["n"], warmup, repeats)
    return "events around each call, read after synchronising, median in seconds, for two warm-up/repeat settings"


def _boolean(got) -> None:
    if not isinstance(got, (bool, np.bool_)):
        fail(f"is_regression(...) returned {type(got).__name__} {got!r}; expected True or False")


def _trial_rates(is_regression, rng, slowdown: float, trials: int, n: int = 15) -> float:
    flagged = 0
    for _ in range(trials):
        noise = rng.uniform(0.02, 0.08)
        base = noisy_samples(n, 1.0, noise, outlier_rate=0.1, rng=rng)
        cand = noisy_samples(n, 1.0 + slowdown, noise, outlier_rate=0.1, rng=rng)
        got = learner_call(is_regression, (base, cand), f"is_regression(<{n} baseline times>, <{n} candidate times>)",
                           expected="True or False")
        _boolean(got)
        flagged += bool(got)
    return flagged / trials


@checker("1.2", "a noise-aware regression rule")
@replayable
def check_is_regression(is_regression, cases):
    """is_regression(baseline_times, candidate_times) -> True for a real slowdown of >= 20%, False for noise."""
    from common.core import measurement
    if is_regression is measurement.is_regression:
        fail("is_regression is common.core.measurement.is_regression, the workbook's reference answer: this exercise "
             "is to write the rule yourself")
    rng = np.random.default_rng(cases.seed)
    trials = 200
    # edge cases first: identical runs, and noiseless runs with a clear shift either way
    flat = [1.0] * 15
    for base, cand, want, what, why in (
            (flat, flat, False, "two identical runs", "no shift is no regression"),
            (flat, [1.3] * 15, True, "a noiseless 30% slowdown", "a 30% slowdown without any noise is as real as "
             "a regression gets: a threshold above 30%, or a test that needs a non-zero spread, misses it"),
            (flat, [0.7] * 15, False, "a noiseless 30% speed-up", "only slower counts")):
        got = learner_call(is_regression, (list(base), list(cand)), f"is_regression({what})", expected="True or False")
        _boolean(got)
        expect(bool(got) == want, f"is_regression on {what} (15 samples each) returned {got!r}; expected {want}: "
                                  f"{why}")
    for n in (15, 7):  # two sample counts: a rule tuned to one n fails the other
        false_alarms = _trial_rates(is_regression, rng, 0.0, trials, n)
        detected = _trial_rates(is_regression, rng, 0.20, trials, n)
        speedups = _trial_rates(is_regression, rng, -0.20, trials, n)
        if false_alarms > 0.05:
            fail(f"on {trials} pairs of runs of {n} samples with NO change (2-8% noise, 10% outliers) your rule "
                 f"cried regression {false_alarms:.1%} of the time (allowed 5%): compare medians, and demand a "
                 f"shift larger than the noise")
        if detected < (0.95 if n >= 15 else 0.70):
            fail(f"a planted 20% slowdown in runs of {n} samples was flagged in only {detected:.1%} of {trials} "
                 f"trials (need {'95' if n >= 15 else '70'}%): your threshold is too strict, or a mean/min is "
                 f"being thrown off by outliers")
        if speedups > 0.05:
            fail(f"a 20% SPEED-UP was flagged as a regression in {speedups:.1%} of trials: only slower should "
                 f"count")
    return (f"at most 5% false alarms on noise and most planted 20% slowdowns caught, for runs of 15 and 7 samples "
            f"({trials} simulated pairs each), and the noiseless edge cases right")
