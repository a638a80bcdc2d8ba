import statistics
import time

import pytest

from common.checks import CheckFailed
from common.exercises.lab01 import check_is_regression, check_time_fn
from common.measurement import is_regression as reference_rule


def right_timer(fn, sync, warmup, repeats):
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


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


def test_time_fn_right():
    assert check_time_fn(right_timer).passed


@pytest.mark.parametrize("wrong,match", [(no_sync_timer, "timed the launch, not the work"),
                                         (no_warmup_timer, "3 warm-up calls"),
                                         (mean_timer, "report the median")])
def test_time_fn_wrong(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        check_time_fn(wrong)


def test_time_fn_stub():
    def stub(fn, sync, warmup, repeats):
        raise NotImplementedError("Exercise 1.1")
    assert check_time_fn(stub).status == "not attempted"


def test_is_regression_right():
    assert check_is_regression(reference_rule).passed


def mean_any_slower(base, cand):
    return statistics.mean(cand) > statistics.mean(base)


def mean_ten_percent(base, cand):
    return statistics.mean(cand) > 1.10 * statistics.mean(base)


def strict_fifty_percent(base, cand):
    return statistics.median(cand) > 1.5 * statistics.median(base)


def two_sided(base, cand):
    return abs(statistics.median(cand) / statistics.median(base) - 1) > 0.1


@pytest.mark.parametrize("wrong,match", [(mean_any_slower, "cried regression"), (mean_ten_percent, "cried regression"),
                                         (strict_fifty_percent, "flagged in only"), (two_sided, "SPEED-UP")])
def test_is_regression_wrong(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        check_is_regression(wrong)


def test_is_regression_stub():
    def stub(base, cand):
        raise NotImplementedError
    assert check_is_regression(stub).status == "not attempted"
