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
from common.exercises.cases import as_number, learner_call, refused, replayable, watched
from common.exercises.simtime import LAUNCH_S, SimQueue, clock

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


def _mistakes(plan, warmup, repeats) -> tuple[list[float], list[tuple[str, float]]]:
    """The right samples, and (message, value) of each classic mistake on the same plan."""
    def samples(time_warmup=False):
        return _stopwatch(SimQueue(plan), warmup, repeats, time_warmup=time_warmup)
    right = samples()
    med = statistics.median(right)
    wrong = [("the minimum of the timed calls: the exercise asks for the median (a typical call); the minimum is "
              "the luckiest call and hides the noise the median is robust to", min(right)),
             ("the mean of the timed calls: two calls delayed on the host pull a mean up -- report the median",
              statistics.fmean(right)),
             ("the total of the timed calls: divide by nothing, take the median per call", sum(right)),
             ("the slowest timed call (the maximum): report the median, a typical call", max(right)),
             ("the warm-up calls were timed together with the measured ones: time only the `repeats` calls that "
              "come after the warm-up", statistics.median(samples(time_warmup=True))),
             ("milliseconds: return seconds", med * 1e3), ("microseconds: return seconds", med * 1e6),
             ("nanoseconds (perf_counter_ns?): return seconds", med * 1e9)]
    wrong.append(("the work runs asynchronously and the clock stopped before sync() returned: you timed the "
                  "launch, not the work", statistics.median(_stopwatch(SimQueue(plan), warmup, repeats,
                                                                       sync_each=False)[:-1] or [0.0])))
    return right, wrong


def _judge(got, text: str, q: SimQueue, plan, warmup: int, repeats: int) -> None:
    expect(q.calls == warmup + repeats,
           f"{text}: fn was called {q.calls} times; expected warmup={warmup} + repeats={repeats} = {warmup + repeats} "
           f"(warm-up calls run fn but are not timed; use the arguments, not fixed counts)")
    right, wrong = _mistakes(plan, warmup, repeats)
    ordered = sorted(right)
    low, high = statistics.median_low(ordered), statistics.median_high(ordered)
    if low * (1 - 1e-9) <= got <= high * (1 + 1e-9):
        return
    for factor, unit in ((1e3, "milliseconds"), (1e6, "microseconds"), (1e9, "nanoseconds (perf_counter_ns?)")):
        if low * (1 - 1e-6) <= got / factor <= high * (1 + 1e-6):
            fail(f"{text} = {got:.6g}, the median is {statistics.median(right):.6g} s: that is {unit}: return seconds")
    for message, value in wrong:
        if abs(got - value) <= 1e-9 * max(abs(value), 1e-12):
            fail(f"{text} = {got:.6g}, the median is {statistics.median(right):.6g} s: that is {message}")
    if q.reads == 0:
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
            got = learner_call(time_fn, (q.fn, q.sync, warmup, repeats), text, _BENCH_REFS,
                               expected="the median seconds per call", library=True)
        _judge(as_number(got, text), text, q, plan, warmup, repeats)
    return ("the exact median per call for two warm-up/repeat settings: synchronised, warmed up, and robust to "
            "the two delayed calls")


# ---------------------------------------------------------------------------------- 1.3: a do_bench of your own
FLUSH_S = 1e-3  # device time of one cache flush (a write of a buffer larger than the cache)
WARM_FACTOR = 0.5  # a call right after another, with no flush between, finds its data in cache: twice as fast
# (warmup, min_time, scale of the call times): two settings, so that no fixed warm-up or repeat count fits both
BENCH_SETTINGS = ((3, 0.3, 1.0), (5, 0.12, 4.0))


def _bench_plan(rng, warmup: int, scale: float, calls: int = 600) -> list[tuple[float, float]]:
    """(host_s, work_s) per call: warm-up calls slow on the host (compilation, autotuning); then cold times drawn
    per call, most 2-3 ms and 15% of them 6-8 ms (slow outliers), so median, mean, minimum and IQR all differ."""
    works = [scale * (rng.uniform(6e-3, 8e-3) if rng.random() < 0.15 else rng.uniform(2e-3, 3e-3))
             for _ in range(calls)]
    return [(WARMUP_HOST_S, 3e-3)] * warmup + [(0.0, w) for w in works]


class _Watch:
    """Watches a learner's do_bench on a SimQueue: each event's recordings (the fn calls and flushes before each) and
    each elapsed_time read: which calls a pair brackets, whether they ran cold, whether a flush sat inside."""

    def __init__(self, q: SimQueue):
        self.q, self.events, self.reads, self.cold = q, 0, [], []
        self.flushes = 0
        real_fn, real_flush = q.fn, q.flush

        def fn():
            self.cold.append(not q.warm)
            real_fn()

        def flush():
            self.flushes += 1
            real_flush()
        self.fn, self.flush = fn, flush

    def make_event(self):
        ev = self.q.event()
        self.events += 1
        ev.recordings = []
        real_record, real_elapsed = ev.record, ev.elapsed_time

        def record():
            ev.recordings.append((self.q.calls, self.flushes, self.q.busy_until <= self.q.now))
            real_record()

        def elapsed_time(end):
            value = real_elapsed(end)
            self.reads.append((ev, end, value, len(ev.recordings), len(end.recordings), self.q.calls))
            return value
        ev.record, ev.elapsed_time = record, elapsed_time
        return ev

    def pairs(self) -> list[dict]:
        """Each pair read: the calls it brackets (indices), whether a flush sat inside, whether the device was idle
        when its start was recorded, its value in seconds; "stale" when that recording was read before, "reused"
        when one of its events holds recordings never read (recorded again before the read); "interleaved" when it
        was read before the next call."""
        out, seen, read = [], set(), {}
        for start, end, _, n0, n1, _ in self.reads:
            read.setdefault(id(start), set()).add(n0)
            read.setdefault(id(end), set()).add(n1)
        for start, end, value, n0, n1, calls in self.reads:
            (c0, f0, idle), (c1, f1, _) = start.recordings[n0 - 1], end.recordings[n1 - 1]
            key = (id(start), n0, id(end), n1)
            out.append({"calls": list(range(c0, c1)), "flush_inside": f1 > f0, "s": value / 1e3, "idle": idle,
                        "reused": any(len(ev.recordings) > len(read[id(ev)]) > 0 for ev in (start, end)),
                        "stale": key in seen, "interleaved": calls == c1})
            seen.add(key)
        return out


def _quartile_spreads(xs: list[float]) -> list[float]:
    """IQR of xs by the usual definitions (inclusive and exclusive quantiles, numpy's linear, nearest, midpoint)."""
    out = [float(np.subtract(*np.percentile(xs, [75, 25], method=m))) for m in ("linear", "nearest", "midpoint",
                                                                                "lower", "higher")]
    for method in ("inclusive", "exclusive"):
        q = statistics.quantiles(xs, n=4, method=method)
        out.append(q[2] - q[0])
    return out


def _judge_bench(got, text: str, w: _Watch, warmup: int, min_time: float) -> None:
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        fail(f"{text} returned {type(got).__name__} {got!r:.80}; return (median_seconds, iqr_seconds)")
    med, iqr = as_number(got[0], f"{text}[0]"), as_number(got[1], f"{text}[1]")
    if w.events == 0:
        fail(f"{text}: no event was made -- time each call between its own start.record() and end.record() and "
             f"read start.elapsed_time(end) after sync() (a host stopwatch is exercise 1.1)")
    pairs = w.pairs()
    if not pairs:
        fail(f"{text}: elapsed_time was never read: after sync(), read start.elapsed_time(end) of each pair")
    stale = sum(p["stale"] for p in pairs)
    if any(p["reused"] for p in pairs) or stale:
        reused = any(p["reused"] for p in pairs)
        what = ("one event pair was recorded again and again" if reused else
                f"{stale} of your {len(pairs)} elapsed_time reads read a pair already read (the same two events, the "
                f"same recordings)")
        fix = ("make a fresh pair (make_event() twice) for each call" if reused else
               "read each pair of your list, not the last start and end (a loop variable read after the loop?)")
        fail(f"{text}: {what}: an event keeps only its LAST recording, so every elapsed_time you read is the last "
             f"call's -- {fix}")
    before = min(p["calls"][0] for p in pairs if p["calls"]) if any(p["calls"] for p in pairs) else 0
    if before < warmup:
        fail(f"{text}: fn was called {before} time(s) before the first timed call, but warmup={warmup}: call fn "
             f"`warmup` times, untimed, first -- the first calls pay one-time costs ({WARMUP_HOST_S * 1e3:.0f} ms "
             f"each here: compilation, autotuning)")
    singles = [p for p in pairs if len(p["calls"]) == 1]
    if len(singles) < 5 and any(len(p["calls"]) > 2 for p in pairs):
        fail(f"{text}: an event pair you read brackets {max(len(p['calls']) for p in pairs)} calls: one pair around "
             f"all calls gives their mean, which the outliers inflate. Record a start and an end event around EACH "
             f"call")
    if w.flushes == 0:
        fail(f"{text} = ({med:.6g}, {iqr:.6g}): flush() was never called, so every timed call found its data in "
             f"the cache left by the call before it (twice as fast here): launch flush() before each call's start "
             f"event")
    timed = [p for p in singles if p["calls"][0] >= warmup]
    if sum(p["flush_inside"] for p in timed) > len(timed) // 2:
        fail(f"{text}: the flush sits between the start and end events, so each sample includes the flush "
             f"({FLUSH_S * 1e3:g} ms of device work here): launch flush() BEFORE start.record()")
    cold = [p for p in timed if w.cold[p["calls"][0]] and not p["flush_inside"]]
    if sum(p["idle"] for p in cold) > len(cold) // 2:
        how = ("you synchronised and read after each call, and then recorded the next start event on an idle device"
               if sum(p["interleaved"] for p in cold) > len(cold) // 2 else
               "a sync() sits between the flush and start.record(), so each start event was recorded on an idle "
               "device")
        fail(f"{text}: {how}: each sample then also measures the launch gap (the ~{LAUNCH_S * 1e6:g} us between "
             f"start.record() and fn's work reaching the device). Keep the queue busy: flush(), start.record(), fn(), "
             f"end.record() with no sync between them; record every pair, then sync() once and read them all")
    right = sorted(p["s"] for p in cold)
    if len(right) < 5:
        fail(f"{text}: only {len(right)} call(s) were timed cold between their own events: flush, record start, "
             f"call, record end -- for each of the repeats")
    total = sum(right)
    if total < 0.35 * min_time:
        fail(f"{text}: your timed calls add up to {total:.4g} s, but min_time={min_time:g}: repeat until they add up "
             f"to min_time (estimate one call's time first; use the argument, not a fixed count)")
    if total > 4 * min_time:
        fail(f"{text}: your timed calls add up to {total:.4g} s for min_time={min_time:g}: estimate one call's time, "
             f"then repeat about min_time / estimate times")
    n = len(right)
    low, high = right[max(0, (n - 1) // 2 - 1)], right[min(n - 1, n // 2 + 1)]
    if abs(med - iqr_of(right)) <= 1e-9 * med and med < low:
        fail(f"{text} = ({med:.6g}, {iqr:.6g}): the order is (median, iqr); you returned the IQR first")
    if not low * (1 - 1e-9) <= med <= high * (1 + 1e-9):
        true_med = statistics.median(right)
        named = [("milliseconds: elapsed_time returns ms -- divide by 1e3", true_med * 1e3),
                 ("microseconds: return seconds", true_med * 1e6),
                 ("the mean: a few slow calls pull a mean up -- report the median", statistics.fmean(right)),
                 ("the minimum: the luckiest call; report the median (a typical call)", right[0]),
                 ("the slowest call: report the median", right[-1]),
                 ("the total of the timed calls: report the median per call", total)]
        for message, value in named:
            if abs(med - value) <= 1e-6 * value:
                fail(f"{text}: the median is {true_med:.6g} s, you returned {med:.6g}: that is {message}")
        if any(abs(med - WARM_FACTOR * x) <= 0.02 * x for x in (true_med,)):
            fail(f"{text}: median {med:.6g} s is the WARM time (about half the cold {true_med:.6g} s): the data was "
                 f"still in cache -- flush() before every timed call")
        fail(f"{text}: median {med:.6g} s; the median of the calls you timed cold is {true_med:.6g} s (any value "
             f"between {low:.6g} and {high:.6g} is right)")
    spreads = _quartile_spreads(right)
    if not (0.8 * min(spreads) <= iqr <= 1.25 * max(spreads)):
        stdev, ranged = statistics.stdev(right), right[-1] - right[0]
        for message, value in (("milliseconds: return seconds", 1e3 * spreads[-2]),
                               ("the standard deviation: the IQR is the 75th minus the 25th percentile (robust to "
                                "the slow outliers a standard deviation follows)", stdev),
                               ("the range (slowest minus fastest): the IQR is the 75th minus the 25th percentile",
                                ranged),
                               ("half the IQR: return the whole of it, the 75th minus the 25th percentile",
                                spreads[-2] / 2)):
            if abs(iqr - value) <= 0.02 * value:
                fail(f"{text}: IQR {iqr:.6g} s, expected about {spreads[-2]:.6g}: that is {message}")
        fail(f"{text}: IQR {iqr:.6g} s, expected about {spreads[-2]:.6g} s (the 75th minus the 25th percentile of "
             f"the cold samples)")


def iqr_of(xs: list[float]) -> float:
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[2] - q[0]


_BENCH_REFS = [(timing, "bench"), (timing, "_cuda_event_times"), (timing, "_bench_cpu")]


@checker("1.3", "your own do_bench", in_kernel="it times the learner's do_bench on a simulated clock in the kernel")
@replayable
def check_do_bench(do_bench, cases):
    """do_bench(fn, flush, make_event, sync, warmup, min_time) -> (median_s, iqr_s): warm up, then time calls one at a
    time between their own events, with flush() launched before each start event, until min_time is timed."""
    for warmup, min_time, scale in BENCH_SETTINGS:
        plan = _bench_plan(cases.rng, warmup, scale)
        q = SimQueue(plan, warm_factor=WARM_FACTOR, flush_s=FLUSH_S, max_calls=20_000)
        w = _Watch(q)
        text = f"do_bench(fn, flush, make_event, sync, warmup={warmup}, min_time={min_time:g})"
        try:
            with clock(q, getattr(do_bench, "__globals__", {})), watched(_BENCH_REFS, library=True) as called:
                got = do_bench(w.fn, w.flush, w.make_event, q.sync, warmup, min_time)
            if called:
                raise refused(text, called[0], _BENCH_REFS)
        except (NotImplementedError, CheckFailed):
            raise
        except RuntimeError as exc:
            if "completed" in str(exc) or "recorded" in str(exc):
                raise CheckFailed(f"{text}: elapsed_time was read before the events had completed ({exc}); record "
                                  f"every pair, then sync() once, then read start.elapsed_time(end)") from None
            raise CheckFailed(f"{text} should return (median, iqr) in seconds; {_learner_error(exc)}") from exc
        except Exception as exc:
            raise CheckFailed(f"{text} should return (median, iqr) in seconds; {_learner_error(exc)}") from exc
        _judge_bench(got, text, w, warmup, min_time)
    return ("events around each call, the flush outside them, after the warm-up, repeated to min_time; the median "
            "and IQR in seconds, for two settings")


def _boolean(got) -> None:
    if not isinstance(got, (bool, np.bool_)):
        fail(f"is_regression(...) returned {type(got).__name__} {got!r}; expected True or False")


def _rule(is_regression, base, cand, text):
    from common.core import measurement
    got = learner_call(is_regression, (list(base), list(cand)), text, [measurement.is_regression,
                       (measurement, "shift_std_err"), (measurement, "surely_caught"), (measurement, "decide")],
                       expected="True or False", library=True)
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
