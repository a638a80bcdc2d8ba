"""Named wrong answers for lab 01: the timer (1.1), the regression rule (1.2) and do_bench (1.3); most are the lab
test's own wrong answers, run here on one seed each, plus the look-alikes and cheats issue 46 adds."""
import math
import statistics

import numpy as np

from common.core import measurement, timing
from common.exercises import lab01
from test_exercises_lab01 import (BENCH_MISTAKES, _samples, absolute_threshold, bench_with, hardcoded_counts_timer,
                                  ignores_baseline, inline_rule, mean_any_slower, milliseconds_timer, min_timer,
                                  no_sync_timer, no_warmup_timer, per_call_mean_timer, strict_fifty_percent,
                                  two_sided, warmup_timed_timer)


def _scaled(unit):
    return lambda fn, sync, warmup, repeats: statistics.median(_samples(fn, sync, warmup, repeats)) * unit


def _ns_timer(fn, sync, warmup, repeats):  # perf_counter_ns, never divided by 1e9
    return statistics.median(_samples(fn, sync, warmup, repeats, clock="perf_counter_ns"))


def _bench_timer(fn, sync, warmup, repeats):
    return timing.bench(fn, warmup=0, min_run_time=1e-5, min_blocks=1).median_s


def _bench_do_bench(fn, flush, make_event, sync, warmup, min_time):
    t = timing.bench(fn, warmup=0, min_run_time=1e-5, min_blocks=1)
    return t.median_s, t.iqr_s


def _pairs_bench(mode):
    """do_bench with one of the event mistakes of issue 46: 'last' reads the last pair for every sample (a loop
    variable read after the loop); 'sync_each' flushes after the call and syncs and reads each pair before the next
    call; 'sync_start' syncs between the flush and the start event; 'half_iqr' returns half the IQR."""
    def do_bench(fn, flush, make_event, sync, warmup, min_time):
        for _ in range(warmup):
            fn()
        sync()
        start, end = make_event(), make_event()  # estimate one call
        start.record()
        fn()
        end.record()
        sync()
        repeats = max(5, math.ceil(min_time / (start.elapsed_time(end) / 1e3)))
        times, pairs = [], []
        flush()
        for _ in range(repeats):
            if mode != "sync_each":
                flush()
            if mode == "sync_start":
                sync()
            start, end = make_event(), make_event()
            start.record()
            fn()
            end.record()
            pairs.append((start, end))
            if mode == "sync_each":
                flush()
                sync()
                times.append(start.elapsed_time(end) / 1e3)
        sync()
        if mode == "last":
            times = [start.elapsed_time(end) / 1e3 for _ in pairs]
        elif mode != "sync_each":
            times = [s.elapsed_time(e) / 1e3 for s, e in pairs]
        q1, q3 = np.percentile(times, [25, 75])
        return statistics.median(times), (q3 - q1) / (2 if mode == "half_iqr" else 1)
    return do_bench


def _slowest_bench(fn, flush, make_event, sync, warmup, min_time):
    med, iqr = bench_with()(fn, flush, make_event, sync, warmup, min_time)
    return med * 1e3, iqr  # elapsed_time's milliseconds, the median only


WRONG = {
    lab01.check_time_fn: [
        (no_sync_timer, "timed the launch, not the work"),
        (no_warmup_timer, r"warmup=3 \+ repeats=20 = 23"),
        (warmup_timed_timer, "warm-up calls were timed together"),
        (min_timer, "the minimum of the timed calls"),
        (per_call_mean_timer, "the mean of the timed calls"),
        (hardcoded_counts_timer, r"warmup=5 \+ repeats=11"),
        (milliseconds_timer, "that is milliseconds"),
        (_scaled(1e6), "that is microseconds"),
        (_ns_timer, "nanoseconds"),
        (lambda fn, sync, w, r: sum(_samples(fn, sync, w, r)), "the total of the timed calls"),
        (lambda fn, sync, w, r: max(_samples(fn, sync, w, r)), "the slowest timed call"),
        (lambda fn, sync, w, r: [fn() for _ in range(w + r)] and 0.0025, "read none of time.perf_counter"),
        (_bench_timer, "called common.core.timing.bench"),
    ],
    lab01.check_is_regression: [
        (absolute_threshold, "a threshold in seconds \\(absolute\\)"),
        (ignores_baseline, "ignores the baseline"),
        (mean_any_slower, "cried regression"),
        (strict_fifty_percent, "flagged in only|noiseless 30% slowdown"),
        (two_sided, "SPEED-UP"),
        (lambda b, c: statistics.median(b) > 1.1 * statistics.median(c), "points the wrong way"),
        (lambda b, c: len(b) >= 15 and inline_rule(b, c), "runs of 7 samples"),
        (lambda b, c: "yes" if inline_rule(b, c) else "no", "expected True or False"),
        (lambda b, c: measurement.is_regression(b, c), "called common.core.measurement.is_regression, the reference"),
        (lambda b, c: bool(statistics.median(c) / statistics.median(b) - 1 > max(
            0.1, 3 * measurement.shift_std_err(b, c))), "called common.core.measurement.shift_std_err"),
        (lambda b, c: statistics.median(c) >= statistics.median(b), "two identical runs"),
    ],
    lab01.check_do_bench: [(fn, words) for _, fn, words in BENCH_MISTAKES] + [
        (_pairs_bench("last"), "read a pair already read"),
        (_pairs_bench("sync_each"), "synchronised and read after each call"),
        (_pairs_bench("sync_start"), "sits between the flush and start.record"),
        (_pairs_bench("half_iqr"), "half the IQR"),
        (_bench_do_bench, "called common.core.timing.bench"),
        (_slowest_bench, "that is milliseconds"),
    ],
}
