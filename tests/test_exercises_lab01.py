import statistics
import time
from time import perf_counter

import pytest

from common.core.checks import CheckFailed
from common.core.measurement import is_regression as reference_rule
from common.exercises.lab01 import check_is_regression, check_time_fn


def right_timer(fn, sync, warmup, repeats):
    return statistics.median(_samples(fn, sync, warmup, repeats))


def no_sync_timer(fn, sync, warmup, repeats):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def no_warmup_timer(fn, sync, warmup, repeats):
    return right_timer(fn, sync, 0, repeats)


def mean_timer(fn, sync, warmup, repeats):
    for _ in range(warmup):
        fn()
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
        sync()
    return (time.perf_counter() - start) / repeats


def numpy_timer(fn, sync, warmup, repeats):  # right, written differently: perf_counter imported, numpy's median
    import numpy as np
    for _ in range(warmup):
        fn()
        sync()
    out = []
    for _ in range(repeats):
        sync()
        t0 = perf_counter()
        fn()
        sync()
        out.append(perf_counter() - t0)
    return float(np.median(out))


def median_low_timer(fn, sync, warmup, repeats):  # right: either middle sample of an even count is a median
    return statistics.median_low(_samples(fn, sync, warmup, repeats))


def test_time_fn_right():
    assert check_time_fn(right_timer).passed
    assert check_time_fn(numpy_timer).passed
    assert check_time_fn(median_low_timer).passed


def test_time_fn_exact_under_load():
    """The timers run on a simulated clock: a right answer is exact however busy the machine (it once read 8 ms
    for 4 ms under load), and the verdict is the same for every replay of one seed."""
    import threading
    stop = []

    def burn():
        while not stop:
            sum(range(1000))
    hogs = [threading.Thread(target=burn) for _ in range(4)]
    for h in hogs:
        h.start()
    try:
        for _ in range(5):
            assert check_time_fn(right_timer).passed
    finally:
        stop.append(1)
        for h in hogs:
            h.join()


def warmup_timed_timer(fn, sync, warmup, repeats):  # every call timed, the warm-up ones too
    times = []
    for _ in range(warmup + repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def min_timer(fn, sync, warmup, repeats):
    return min(_samples(fn, sync, warmup, repeats))


def per_call_mean_timer(fn, sync, warmup, repeats):
    return statistics.fmean(_samples(fn, sync, warmup, repeats))


def _samples(fn, sync, warmup, repeats, clock="perf_counter"):
    """Each call's time on time.<clock> (looked up at each read: the checker's simulated clock replaces it)."""
    for _ in range(warmup):
        fn()
    sync()
    out = []
    for _ in range(repeats):
        start = getattr(time, clock)()
        fn()
        sync()
        out.append(getattr(time, clock)() - start)
    return out


@pytest.mark.parametrize("wrong,match", [(no_sync_timer, "timed the launch, not the work"),
                                         (no_warmup_timer, r"warmup=3 \+ repeats=20 = 23"),
                                         (mean_timer, "report the median"),
                                         (warmup_timed_timer, "warm-up calls were timed together"),
                                         (min_timer, "the minimum of the timed calls"),
                                         (per_call_mean_timer, "the mean of the timed calls")])
def test_time_fn_wrong(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        check_time_fn(wrong)


def test_time_fn_stub():
    def stub(fn, sync, warmup, repeats):
        raise NotImplementedError("Exercise 1.1")
    assert check_time_fn(stub).status == "not attempted"


def test_is_regression_right():
    assert check_is_regression(inline_rule).passed


def test_is_regression_wrapper_of_the_reference_is_caught():
    with pytest.raises(CheckFailed, match="called common.core.measurement.is_regression, the reference"):
        check_is_regression(lambda b, c: reference_rule(b, c))


def absolute_threshold(base, cand):  # 0.5 ms in seconds: right only near 1 ms per sample
    return statistics.median(cand) - statistics.median(base) > 0.0005


def absolute_threshold_at_one_second(base, cand):  # tuned to samples of about 1 s
    return statistics.median(cand) - statistics.median(base) > 0.1


def ignores_baseline(base, cand):  # "slow" = the candidate's spread or level alone
    return statistics.median(cand) > 1.1 * min(cand) + 0.01 * statistics.median(cand)


@pytest.mark.parametrize("wrong,match", [(absolute_threshold, "absolute|relative to the baseline"),
                                         (absolute_threshold_at_one_second, "absolute|relative to the baseline"),
                                         (ignores_baseline, "ignores the baseline")])
def test_is_regression_scale_and_baseline(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        check_is_regression(wrong)


def mean_any_slower(base, cand):
    return statistics.mean(cand) > statistics.mean(base)


def mean_ten_percent(base, cand):
    return statistics.mean(cand) > 1.10 * statistics.mean(base)


def strict_fifty_percent(base, cand):
    return statistics.median(cand) > 1.5 * statistics.median(base)


def two_sided(base, cand):
    return abs(statistics.median(cand) / statistics.median(base) - 1) > 0.1


@pytest.mark.parametrize("wrong,match", [(mean_any_slower, "cried regression"), (mean_ten_percent, "cried regression"),
                                         (strict_fifty_percent, "flagged in only|noiseless 30% slowdown"), (two_sided, "SPEED-UP|speed-up")])
def test_is_regression_wrong(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        check_is_regression(wrong)


def test_is_regression_stub():
    def stub(base, cand):
        raise NotImplementedError
    assert check_is_regression(stub).status == "not attempted"


def hardcoded_counts_timer(fn, sync, warmup, repeats):
    return right_timer(fn, sync, 3, 20)


def milliseconds_timer(fn, sync, warmup, repeats):
    return 1e3 * right_timer(fn, sync, warmup, repeats)


def test_time_fn_parameters_varied():
    """Class 2: hard-coded warm-up/repeat counts fail; class 5: returning ms is named as such."""
    with pytest.raises(CheckFailed, match=r"warmup=5 \+ repeats=11"):
        check_time_fn(hardcoded_counts_timer)
    with pytest.raises(CheckFailed, match="that is milliseconds"):
        check_time_fn(milliseconds_timer)


def test_time_fn_crash_names_the_call():
    def crash(fn, sync, warmup, repeats):
        assert repeats > 100, "too few repeats"
    with pytest.raises(CheckFailed, match=r"time_fn\(fn, sync, warmup=3, repeats=20\) should return the median seconds "
                                          r"per call; your code raised AssertionError: too few repeats"):
        check_time_fn(crash)
    with pytest.raises(CheckFailed, match="returned NoneType|returned None"):
        check_time_fn(lambda fn, sync, w, r: None)


def test_is_regression_edge_cases_and_sample_counts():
    """Class 4: zero spread; class 2: a rule tuned to 15 samples fails at 7; failures print the seed."""
    def zero_spread_crash(base, cand):
        import statistics as st
        return st.median(cand) / st.median(base) - 1 > 0.1 and (st.median(cand) - st.median(base)) / st.stdev(base) > 3

    with pytest.raises(CheckFailed, match="ZeroDivisionError|noiseless"):
        check_is_regression(zero_spread_crash)

    def needs_fifteen(base, cand):
        return len(base) >= 15 and inline_rule(base, cand)
    with pytest.raises(CheckFailed, match=r"runs of 7 samples.*seed \d+"):
        check_is_regression(needs_fifteen)

    with pytest.raises(CheckFailed, match="expected True or False"):
        check_is_regression(lambda b, c: "yes")


def test_is_regression_reference_itself_is_caught():
    with pytest.raises(CheckFailed, match="you passed common.core.measurement.is_regression itself"):
        check_is_regression(reference_rule)


def inline_rule(baseline_times, candidate_times):
    import numpy as np
    base, cand = np.median(baseline_times), np.median(candidate_times)
    shift = cand / base - 1.0
    spread = 1.4826 * np.median(np.abs(np.asarray(baseline_times) - base)) / base
    return bool(shift > 0.10 and shift > 3.0 * spread * (2.0 / len(baseline_times)) ** 0.5)


# --- 1.3: your own do_bench (on a simulated queue with a cache) ----------------------------------------------------
def bench_with(warm=True, flush_at="before", fresh=True, sync_before_read=True, stat="median", spread="iqr",
               per_ms=1e3, fixed=None, per_call=True, swapped=False):
    """The right do_bench (warm-up; estimate one call; flush, start, call, end for each repeat; one sync; median and
    IQR in seconds), or it with one mistake."""
    import math

    import numpy as np

    def do_bench(fn, flush, make_event, sync, warmup, min_time):
        if warm:
            for _ in range(warmup):
                fn()
            sync()
        start, end = make_event(), make_event()
        start.record()
        fn()
        end.record()
        sync()
        repeats = fixed or max(5, math.ceil(min_time / (start.elapsed_time(end) / 1e3)))
        if not per_call:
            start, end = make_event(), make_event()
            start.record()
            for _ in range(repeats):
                flush()
                fn()
            end.record()
            sync()
            return start.elapsed_time(end) / per_ms / repeats, 0.0
        pairs, shared = [], (make_event(), make_event())
        for _ in range(repeats):
            if flush_at == "before":
                flush()
            start, end = (make_event(), make_event()) if fresh else shared
            start.record()
            if flush_at == "inside":
                flush()
            fn()
            end.record()
            pairs.append((start, end))
        if sync_before_read:
            sync()
        times = [s.elapsed_time(e) / per_ms for s, e in pairs]
        middle = {"median": statistics.median, "mean": statistics.fmean, "min": min}[stat](times)
        q1, q3 = np.percentile(times, [25, 75])
        width = {"iqr": q3 - q1, "std": statistics.stdev(times), "range": max(times) - min(times)}[spread]
        return (width, middle) if swapped else (middle, width)
    return do_bench


def test_do_bench_right():
    from common.exercises.lab01 import check_do_bench
    for seed in range(4):
        assert check_do_bench(bench_with(), seed=seed).passed


def test_do_bench_right_written_otherwise():
    """Repeats until the timed calls add up to min_time, a sync per call, statistics.quantiles: also right."""
    from common.exercises.lab01 import check_do_bench

    def until_min_time(fn, flush, make_event, sync, warmup, min_time):
        for _ in range(warmup):
            fn()
        sync()
        times, total = [], 0.0
        while total < min_time or len(times) < 5:
            flush()
            start, end = make_event(), make_event()
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
            total += times[-1]
        q = statistics.quantiles(times, n=4)
        return statistics.median(times), q[2] - q[0]
    for seed in range(3):
        assert check_do_bench(until_min_time, seed=seed).passed


def _stopwatch_bench(fn, flush, make_event, sync, warmup, min_time):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(50):
        flush()
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), 0.0


BENCH_MISTAKES = [  # (name, do_bench, the words that must name it)
    ("one event pair reused", bench_with(fresh=False), "recorded again and again"),
    ("elapsed_time before synchronising", bench_with(sync_before_read=False), "before the events had completed"),
    ("flush inside the events", bench_with(flush_at="inside"), "flush sits between the start and end"),
    ("no flush", bench_with(flush_at=None), "flush\(\) was never called"),
    ("no warm-up", bench_with(warm=False), "call fn `warmup` times"),
    ("mean instead of median", bench_with(stat="mean"), "that is the mean"),
    ("minimum instead of median", bench_with(stat="min"), "that is the minimum"),
    ("milliseconds as seconds", bench_with(per_ms=1), "that is milliseconds"),
    ("standard deviation as IQR", bench_with(spread="std"), "standard deviation"),
    ("range as IQR", bench_with(spread="range"), "the range"),
    ("fixed repeats", bench_with(fixed=10), "add up to min_time|min_time="),
    ("one pair around all calls", bench_with(per_call=False), "around EACH call"),
    ("(iqr, median)", bench_with(swapped=True), "IQR first"),
    ("a host stopwatch", _stopwatch_bench, "no event was made"),
]


@pytest.mark.parametrize("name, do_bench, words", BENCH_MISTAKES, ids=[m[0] for m in BENCH_MISTAKES])
def test_do_bench_mistakes_named(name, do_bench, words):
    from common.exercises.lab01 import check_do_bench
    for seed in (1, 2, 3):
        with pytest.raises(CheckFailed, match=words):
            check_do_bench(do_bench, seed=seed)


def test_do_bench_stub():
    from common.exercises.lab01 import check_do_bench

    def stub(fn, flush, make_event, sync, warmup, min_time):
        raise NotImplementedError("Exercise 1.3")
    assert check_do_bench(stub).status == "not attempted"


def test_do_bench_one_pair_read_after_each_call_is_right():
    """One event pair reused, but synchronised and read before it is recorded again (the flush keeps the queue busy
    when start is recorded): every sample is its own call's, so this is right too (issue 46)."""
    from common.exercises.lab01 import check_do_bench

    def reuse_and_read(fn, flush, make_event, sync, warmup, min_time):
        for _ in range(warmup):
            fn()
        sync()
        start, end = make_event(), make_event()
        times = []
        while sum(times) < min_time or len(times) < 5:
            flush()
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        q1, q3 = statistics.quantiles(times, n=4, method="inclusive")[::2]
        return statistics.median(times), q3 - q1
    for seed in range(3):
        assert check_do_bench(reuse_and_read, seed=seed).passed
