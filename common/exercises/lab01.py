"""Checkers for lab 01 (measurement): a correct timing function and a noise-aware regression rule."""
from __future__ import annotations

import numpy as np

from common.checks import checker, expect, fail
from common.measurement import AsyncQueue, noisy_samples

WORK_S = 0.004  # each call's real work, done asynchronously on the queue
WARMUP_EXTRA_S = 0.060  # the first three calls pay this (like compilation or autotuning)
OUTLIER_EXTRA_S = 0.040  # every fifth timed call is delayed on the host (like a preempted thread)


@checker("1.1", "a correct timing function")
def check_time_fn(time_fn):
    """time_fn(fn, sync, warmup, repeats) -> median seconds per call of fn, synchronised, after warm-up."""
    with AsyncQueue() as q:
        calls = {"n": 0}

        def fn():
            calls["n"] += 1
            n = calls["n"]
            if n <= 3:  # first-call costs, paid on the host before the launch
                import time
                time.sleep(WARMUP_EXTRA_S)
            if n > 3 and (n - 3) % 5 == 0:
                import time
                time.sleep(OUTLIER_EXTRA_S)
            q.launch(lambda: __import__("time").sleep(WORK_S))

        got = time_fn(fn, q.synchronize, 3, 20)
        q.synchronize()
    expect(isinstance(got, (float, int)), f"time_fn should return seconds as a number, got {type(got).__name__}")
    expect(calls["n"] == 23, f"fn was called {calls['n']} times; expected 3 warm-up calls + 20 timed calls = 23 "
                             f"(warm-up calls run fn but are not timed)")
    if got < WORK_S / 4:
        fail(f"you measured {got * 1e3:.3f} ms per call, but each call's work takes {WORK_S * 1e3:.0f} ms: the work "
             f"runs asynchronously, so stop the clock only after sync() -- you timed the launch, not the work")
    if got > 2 * WORK_S:
        fail(f"you measured {got * 1e3:.1f} ms per call, but a typical call takes about {WORK_S * 1e3:.0f} ms: "
             f"a few slow outliers (or warm-up calls) inflate a mean or a total -- report the median of the timed "
             f"calls")
    return f"about {WORK_S * 1e3:.0f} ms per call: synchronised, warmed up, and the median resists outliers"


def _trial_rates(is_regression, rng, slowdown: float, trials: int, n: int = 15) -> float:
    flagged = 0
    for _ in range(trials):
        noise = rng.uniform(0.02, 0.08)
        base = noisy_samples(n, 1.0, noise, outlier_rate=0.1, rng=rng)
        cand = noisy_samples(n, 1.0 + slowdown, noise, outlier_rate=0.1, rng=rng)
        flagged += bool(is_regression(base, cand))
    return flagged / trials


@checker("1.2", "a noise-aware regression rule")
def check_is_regression(is_regression):
    """is_regression(baseline_times, candidate_times) -> True for a real slowdown of >= 20%, False for noise."""
    rng = np.random.default_rng()
    trials = 200
    false_alarms = _trial_rates(is_regression, rng, 0.0, trials)
    detected = _trial_rates(is_regression, rng, 0.20, trials)
    speedups = _trial_rates(is_regression, rng, -0.20, trials)
    if false_alarms > 0.05:
        fail(f"on {trials} pairs of runs with NO change (2-8% noise, 10% outliers) your rule cried regression "
             f"{false_alarms:.0%} of the time (allowed 5%): compare medians, and demand a shift larger than the noise")
    if detected < 0.95:
        fail(f"a planted 20% slowdown was flagged in only {detected:.0%} of {trials} trials (need 95%): your "
             f"threshold is too strict, or a mean/min is being thrown off by outliers")
    if speedups > 0.05:
        fail(f"a 20% SPEED-UP was flagged as a regression in {speedups:.0%} of trials: only slower should count")
    return (f"at most 5% false alarms on noise and at least 95% of planted 20% slowdowns caught, over {trials} "
            f"simulated pairs of runs each")
