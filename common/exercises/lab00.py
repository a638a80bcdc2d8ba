"""Checkers for lab 00 (orientation): counting bytes and FLOPs, measuring the two ceilings, predicting a time.

The ceilings (exercise 0.3) are checked on a simulated device (common.exercises.simtime): the learner's torch code
runs for real on small tensors while its copies and matmuls are charged to a simulated clock at known rates, on a
machine where most synchronisations return late. So the checker knows the right ceiling exactly, and what each
classic mistake gives (no synchronisation, blocks too short, the median block, bytes counted once, ...), however busy
the real machine is.
"""
from __future__ import annotations

import contextlib
import io

from common.core import ceilings, timing
from common.core.checks import CheckFailed, checker, expect_close, fail
from common.exercises import simtime
from common.exercises.cases import as_number, fresh_cases, learner_call, replayable

_DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "int8": 1}


@checker("0.1", "bytes moved by a copy")
@replayable
def check_copy_bytes(copy_bytes, cases):
    """copy_bytes(n_elements, dtype_name) -> bytes read + written by dst.copy_(src)."""
    rng = cases.rng
    # every dtype in a fixed case (a wrong byte size fails on every call), then random sizes and dtypes
    inputs = [(3, d) for d in ("float32", "bfloat16", "float16", "int8", "float64")] + [(1000, "bfloat16"),
                                                                                        (7, "int8")]
    inputs += [(rng.randint(2, 10**7), rng.choice(sorted(_DTYPE_BYTES))) for _ in range(5)]
    for n, dtype in inputs:
        text = f"copy_bytes({n}, {dtype!r})"
        got = as_number(learner_call(copy_bytes, (n, dtype), text, [(ceilings, "copy_bytes")],
                                     expected="a number of bytes", library=True), text)
        b = _DTYPE_BYTES[dtype]
        expected = 2 * n * b
        if got == expected:
            continue
        named = []
        if got == n * b:
            named.append("that counts only the read (or only the write); a copy reads every byte once and "
                         "writes it once")
        if got == 2 * n:
            named.append(f"that counts elements; multiply by the bytes per element ({b} for {dtype})")
        if got == 8 * expected:
            named.append("that counts bits; the answer is in bytes")
        wrong = sorted({bb for d, bb in _DTYPE_BYTES.items() if d != dtype and got == 2 * n * bb})
        if wrong:
            named.append(f"that uses {wrong[0]} bytes per element; {dtype} has {b}")
        if named:
            fail(f"{text} = {got:g} (expected {expected}): " + ("; or ".join(named) if len(named) == 1 else
                 "two mistakes give this number -- " + "; or ".join(named)))
        fail(f"{text}: expected {expected}, got {got:g}")
    return f"right for every dtype ({', '.join(_DTYPE_BYTES)}) and {len(inputs)} sizes (2 x n x bytes-per-element)"


@checker("0.2", "FLOPs of a matmul")
@replayable
def check_matmul_flops(matmul_flops, cases):
    """matmul_flops(m, n, k) -> FLOPs of (m x k) @ (k x n), a multiply-add counted as 2."""
    rng = cases.rng
    # asymmetric fixed shapes first: a mix-up of m, n and k cannot coincide with the right answer
    inputs = [(2, 3, 5), (7, 1, 11), (1, 4096, 4096)]
    inputs += [tuple(rng.randint(1, 5000) for _ in range(3)) for _ in range(5)]
    for m, n, k in inputs:
        text = f"matmul_flops({m}, {n}, {k})"
        got = as_number(learner_call(matmul_flops, (m, n, k), text, [(ceilings, "matmul_flops")],
                                     expected="a number of FLOPs", library=True), text)
        if got == 2 * m * n * k:
            continue
        if got == m * n * k:
            fail(f"{text} = {got:g}: that counts multiply-adds; each is 2 FLOPs (a multiply and an add), "
                 f"so {2 * m * n * k}")
        if got in (2 * m * m * k, 2 * m * n * n, 2 * m * k * k, 2 * n * n * k, 2 * m * m * n):
            fail(f"{text} = {got:g}: one dimension is used twice and another not at all; (m x k) @ (k x n) "
                 f"does m*n*k multiply-adds -> {2 * m * n * k}")
        fail(f"{text}: expected {2 * m * n * k}, got {got:g}")
    return f"right for {len(inputs)} shapes, none square (2*m*n*k)"


def _reference_predict(m, n, k, bytes_per_element, flops_per_s, bytes_per_s):
    flops = 2 * m * n * k
    moved = (m * k + k * n + m * n) * bytes_per_element
    return max(flops / flops_per_s, moved / bytes_per_s)


@checker("0.4", "predict a matmul's time from the two ceilings")
@replayable
def check_predict_matmul_seconds(predict, cases):
    """predict(m, n, k, bytes_per_element, flops_per_s, bytes_per_s) -> seconds, the larger of compute and memory."""
    rng = cases.rng
    # compute-bound, and memory-bound cases with every element size (1, 2, 4 bytes), asymmetric shapes
    inputs = [(4096, 2048, 1024, 2, 1e15, 3e12), (8192, 1, 4096, 2, 1e15, 3e12), (1, 4096, 2048, 1, 1e14, 2e12),
             (3000, 2, 5000, 4, 1e12, 5e10), (6000, 5000, 4000, 2, 1e14, 3e12)] + [
        (rng.randint(1, 4096), rng.randint(1, 4096), rng.randint(1, 4096), rng.choice([1, 2, 4]),
         rng.uniform(1e11, 1e15), rng.uniform(1e10, 8e12)) for _ in range(6)]
    for case in inputs:
        m, n, k, b, f, bw = case
        text = f"predict({m}, {n}, {k}, {b}, {f:.4g}, {bw:.4g})"
        got = as_number(learner_call(predict, tuple(case), text, [(ceilings, "matmul_flops")], expected="seconds (a number)",
                                     library=True), text)
        expected = _reference_predict(*case)
        compute, memory = 2 * m * n * k / f, (m * k + k * n + m * n) * b / bw
        apart = abs(compute - memory) > 1e-3 * expected

        def near(x):
            return abs(got - x) <= 1e-9 * max(abs(x), 1e-30)
        if apart and near(compute + memory):
            fail(f"{text} = {got:.6g} s: you added compute time and memory time; the roofline model takes the "
                 f"larger of the two ({expected:.6g} s), as they overlap")
        if apart and near(compute) and memory > compute:
            fail(f"{text} = {got:.6g} s: that is the compute time alone; this shape is memory-bound -- moving "
                 f"(m*k + k*n + m*n) x {b} bytes takes {memory:.6g} s, longer than the FLOPs -- take the larger")
        if apart and compute / 2 <= memory < compute and near(memory):
            fail(f"{text} = {got:.6g} s: that is the memory time; this shape is compute-bound -- its FLOPs take "
                 f"{compute:.6g} s. Either the FLOPs count multiply-adds (m*n*k; each is 2 FLOPs: 2*m*n*k), which "
                 f"halves the compute time below the memory time, or you took the memory time alone (or the smaller of "
                 f"compute and memory time): take the larger")
        if apart and near(memory) and compute > memory:
            fail(f"{text} = {got:.6g} s: that is the memory time alone (or the smaller of compute and memory "
                 f"time); this shape is compute-bound -- its FLOPs take {compute:.6g} s -- take the larger")
        if apart and near(min(compute, memory)):
            fail(f"{text} = {got:.6g} s: that is the smaller of compute ({compute:.6g} s) and memory "
                 f"({memory:.6g} s); the slower of the two sets the time ({expected:.6g} s)")
        if memory > compute and near(max(compute, (m * k + k * n) * b / bw)) and m * n:
            fail(f"{text} = {got:.6g} s: the bytes miss writing C (m x n elements); memory time is "
                 f"{memory:.6g} s")
        if memory > compute and b != 2 and near(max(compute, memory * 2 / b)):
            fail(f"{text} = {got:.6g} s: the bytes ignore bytes_per_element={b} (2 is hard-coded?)")
        if memory > compute and near(max(compute, memory / b)) and b != 1:
            fail(f"{text} = {got:.6g} s: the memory time counts elements, not bytes; multiply by "
                 f"bytes_per_element={b}")
        _name_predict(got, text, case, compute, memory, expected, near)
        expect_close(got, expected, f"predicted seconds of {text}", rtol=1e-6, atol=0)
    return "max(FLOPs / FLOP rate, bytes / bandwidth) for compute- and memory-bound shapes and every element size"


def _name_predict(got, text, case, compute, memory, expected, near) -> None:
    """The rarer mistakes of 0.4, named when `got` equals what one gives (and the right answer does not)."""
    m, n, k, b, f, bw = case
    c_twice = (m * k + k * n + 2 * m * n) * b / bw
    twice = {2 * m * m * k, 2 * m * n * n, 2 * m * k * k, 2 * n * n * k} - {2 * m * n * k}
    for wrong, why in (
            (max(compute / 2, memory), "the FLOPs count multiply-adds (m*n*k); each is 2 FLOPs, a multiply and an "
                                       "add: 2*m*n*k"),
            (expected * 1e3, "that is milliseconds; return seconds"),
            (expected * 1e6, "that is microseconds; return seconds"),
            (max(2 * m * n * k / bw, (m * k + k * n + m * n) * b / f), "the two rates are swapped: FLOPs divide by "
                                                                      "flops_per_s, bytes by bytes_per_s"),
            (max(compute, c_twice), "the bytes count C twice (read and written); C = A @ B only writes C: "
                                    "(m*k + k*n + m*n) x bytes_per_element"),
            (max(compute, memory * 8), "the bytes are in bits (x 8); bytes_per_s is in bytes"),
    ) + tuple((max(t / f, memory), "one dimension is used twice in the FLOPs and another not at all; (m x k) @ "
                                   "(k x n) does m*n*k multiply-adds") for t in twice):
        if near(wrong) and abs(wrong - expected) > 1e-6 * expected:
            fail(f"{text} = {got:.6g} s, expected {expected:.6g}: {why}")


# ------------------------------------------------------------------------------ 0.3: the two ceilings, measured right
FIRST_CALL_S = 0.03  # the first call of an op pays one-time costs (page faults on fresh memory, library set-up)
BUSY_DELAY_S = 2.5e-4  # two of every three synchronisations return this late: another process held the core
TOLERANCE = 0.05  # a right measurement lands within 5% above the device's time per call (a sync per block)
MIN_TIMES = (0.04, 0.015)  # min_time of the two settings (simulated seconds)
_REFERENCES = [(ceilings, "measure_copy_bandwidth"), (ceilings, "measure_matmul_rate"),
               (ceilings, "machine_profile"), (timing, "bench")]


def _name_seconds(got: float, w: float, bs: list, text: str, min_time: float, unit: str = "s") -> None:
    """Fail with the name of the mistake when `got` (seconds per call) is not within TOLERANCE above `w`."""
    if w * (1 - 1e-9) <= got <= w * (1 + TOLERANCE):
        return
    for factor, name in ((1e3, "milliseconds"), (1e6, "microseconds"), (1e9, "nanoseconds")):
        if w * (1 - 1e-9) <= got / factor <= w * (1 + TOLERANCE):
            fail(f"{text} = {got:.6g}: that is {name}; return seconds")
    if not bs:
        fail(f"{text} = {got:.6g} s, but no clock read came before and after a call: time the calls with "
             f"time.perf_counter() (the checker runs op on a simulated clock that it reads)")
    stats = simtime.summary(bs)
    steady = [b for b in bs if b.calls == bs[-1].calls]  # the blocks of the final size: the timing loop's own
    said = {"median": "the median of your blocks", "mean": "the mean of your blocks",
            "pooled": "the total time over the total calls (a mean)", "worst": "your slowest block",
            "last": "your last block", "first": "your first block"}
    for part in (steady, steady[1:], steady[2:], bs):
        if not part:
            continue
        found = simtime.summary(part)
        for key in said:
            if found[key] > stats["best"] * (1 + 1e-9) and abs(got - found[key]) <= 1e-9 * found[key]:
                fail(f"{text} = {got:.6g} s per call: that is {said[key]}. Most synchronisations here return late "
                     f"(another process holds the core), so most blocks are slow; a ceiling is an upper bound -- keep "
                     f"the BEST block ({stats['best']:.6g} s per call)")
    if any(b.calls > 1 and abs(got - b.seconds) <= 1e-9 * b.seconds for b in bs) or \
            abs(got - stats["total"]) <= 1e-9 * stats["total"]:
        fail(f"{text} = {got:.6g}: that is the seconds of a whole block (or of all of them); divide by the calls it "
             f"holds and keep the best block's seconds per call")
    if got < w * (1 - 1e-9):
        if any(not b.synced for b in bs):
            fail(f"{text} = {got:.6g} s per call, but one call keeps the device busy {w:.6g} s: the clock stopped "
                 f"before sync() returned -- you timed the launches, not the work. Call sync() after each block's "
                 f"calls, before reading the clock")
        fail(f"{text} = {got:.6g} s per call, faster than the device can run one ({w:.6g} s): divide each block's "
             f"time by the calls in it, synchronised")
    best = min(bs, key=lambda b: b.per_call)
    if best.per_call > w * (1 + TOLERANCE) and all(b.calls == 1 for b in bs):
        if bs[0].first:
            fail(f"{text} = {got:.6g} s: your first timed call paid the one-time costs ({FIRST_CALL_S * 1e3:.0f} ms "
                 f"here: page faults, library set-up), so the blocks were sized from it at one call each. Warm up: "
                 f"call op() and sync() once before the clock starts")
        fail(f"{text} = {got:.6g} s per call, the device takes {w:.6g} s: each block holds ONE call, and the launch "
             f"and synchronisation around it (microseconds) are a large part of a short call. Time blocks of calls "
             f"that last about a millisecond")
    if best.per_call > w * (1 + TOLERANCE) and best.seconds < 5e-4:
        fail(f"{text} = {got:.6g} s per call, the device takes {w:.6g} s: your blocks last only "
             f"{best.seconds * 1e6:.0f} us, so the synchronisation at the end of each is a large part of it. Make "
             f"each block about a millisecond of calls")
    fail(f"{text} = {got:.6g} s per call; the device takes {w:.6g} s per call (a right measurement lands within "
         f"{TOLERANCE:.0%} above it)")


def _timed_enough(bs: list, text: str, min_time: float) -> None:
    total = sum(b.seconds for b in bs)
    if total < 0.5 * min_time:
        fail(f"{text}: your timed blocks add up to {total:.4g} s, but min_time={min_time:g}: keep timing blocks "
             f"until they add up to min_time (use the argument, not a fixed count)")
    if total > 20 * min_time + 0.05:
        fail(f"{text}: your timed blocks add up to {total:.4g} s for min_time={min_time:g}: stop once they reach "
             f"min_time")


def _check_harness(best_seconds_per_call, rng) -> None:
    """The harness alone, on a plain simulated op: one setting with a millisecond op, one with a ~100 us op."""
    for w, min_time in ((rng.uniform(1.5e-3, 2.5e-3), MIN_TIMES[0]), (rng.uniform(6e-5, 1e-4), MIN_TIMES[1])):
        q = simtime.BusyQueue([(FIRST_CALL_S, w), (0.0, w)], BUSY_DELAY_S, max_calls=200_000)
        text = f"best_seconds_per_call(op, sync, min_time={min_time:g})"
        with simtime.clock(q, getattr(best_seconds_per_call, "__globals__", {})):
            got = learner_call(best_seconds_per_call, (q.fn, q.sync, min_time), text, _REFERENCES,
                               expected="the best block's seconds per call", library=True)
        got = as_number(got, text)
        bs = simtime.blocks(q.log)
        _name_seconds(got, w, bs, text, min_time)
        _timed_enough(bs, text, min_time)


def _run_device(fn, args, text, q, dev, threads, learner=True):
    with ceilings.threads(1), simtime.clock(q, getattr(fn, "__globals__", {})), dev, simtime.threads_reported(threads):
        with contextlib.redirect_stdout(io.StringIO()):
            if not learner:
                return fn(*args)
            try:
                return learner_call(fn, args, text, _REFERENCES, expected="a dict", library=True)
            except CheckFailed as exc:
                if "without the measurement ending" in str(exc) or "called common." in str(exc):
                    raise
                raise CheckFailed(f"{exc}. The device was working correctly: if that is your verification refusing "
                                  f"a right result, compare with a tolerance -- float32 and bf16 round differently "
                                  f"from float64 (bf16 keeps 8 bits: rtol=1e-2, atol=1e-2 * n ** 0.5)") from None


def _check_result(got, key: str, unit: str, text: str, threads: int) -> float:
    if not isinstance(got, dict) or key not in got or "threads" not in got:
        fail(f"{text} returned {type(got).__name__} {got!r:.80}; return a dict {{'{key}': <{unit}>, 'threads': "
             f"<the torch threads it ran on>}}")
    expect_threads = got["threads"]
    if expect_threads != threads:
        fail(f"{text} reported threads={expect_threads!r}, but torch ran on {threads} threads: report "
             f"torch.get_num_threads() -- a ceiling is stated with the threads that reached it")
    return as_number(got[key], f"{text}['{key}']")


def _name_rate(got: float, right: float, work: float, text: str, unit: str, factors: list, bs: list,
               w: float, min_time: float) -> None:
    """Fail naming the mistake when the rate `got` is not within TOLERANCE below `right` (= work / w)."""
    low = right / (1 + TOLERANCE)
    if low * (1 - 1e-9) <= got <= right * (1 + 1e-9):
        return
    for factor, why in factors:
        if low * factor * (1 - 1e-6) <= got <= right * factor * (1 + 1e-6):
            fail(f"{text} = {got:.6g} {unit}, expected about {right:.6g}: {why}")
    if got <= 0:
        fail(f"{text} = {got:.6g} {unit}: a rate is work / seconds, a positive number")
    _name_seconds(work / (got * 1e9), w, bs, f"{text}: your seconds per call", min_time)
    fail(f"{text} = {got:.6g} {unit}, expected about {right:.6g}")


def _structure(dev, bs: list, text: str, what: str) -> None:
    if dev.constant:
        fail(f"{text}: you timed the {what} on constant data (zeros, ones, an untouched torch.empty): an untouched "
             f"zero page or bits that never toggle run faster than real data. Draw random inputs (torch.rand, "
             f"torch.randn)")
    if any(b.allocs for b in bs):
        fail(f"{text}: a tensor was allocated inside a timed block (torch.empty, clone, randn, ... between the two "
             f"clock reads): the page faults and filling are timed with the {what}. Allocate the inputs and the "
             f"output once, before timing, and time only the {what}")


def _check_copy(copy_ceiling, rng, min_time: float, threads: int) -> None:
    nbytes = rng.choice([2**17, 3 * 2**16, 2**18])
    w = rng.uniform(1e-4, 1.6e-4)  # seconds per copy on the simulated device
    bps = 2 * nbytes / w
    q = simtime.BusyQueue([(0.0, 0.0)], BUSY_DELAY_S)
    dev = simtime.SimDevice(q, bps, 1e10, first_s=FIRST_CALL_S)
    text = f"copy_ceiling({nbytes}, 'cpu', sync, min_time={min_time:g})"
    got = _run_device(copy_ceiling, (nbytes, "cpu", q.sync, min_time), text, q, dev, threads)
    gbps = _check_result(got, "gbps", "GB/s", text, threads)
    bs = simtime.blocks(q.log, ("op",))
    _structure(dev, bs, text, "copy")
    right = bps / 1e9
    _name_rate(gbps, right, 2 * nbytes / 1e9, text, "GB/s", [
        (0.5, "that counts the bytes once; a copy reads every byte and writes it: 2 x nbytes"),
        (1.5, "that counts 3 bytes per byte (write-allocate's extra read of the destination); the convention, and "
              "the workbook's, is read + write: 2 x nbytes"),
        (2.0, "that counts 4 bytes per byte copied; a copy moves 2 x nbytes"),
        (1e9 / 2**30, "that is GiB/s (2^30 bytes); GB/s are 10^9 bytes per second"),
        (8.0, "that counts bits; GB/s are bytes"), (1e3, "that is MB/s; return GB/s"),
        (1e-3, "that is TB/s, or seconds taken as milliseconds; return GB/s")], bs, w, min_time)
    _timed_enough(bs, text, min_time)


def _check_matmul(matmul_ceiling, rng, min_time: float, threads: int, dtype) -> None:
    n = rng.choice([48, 64, 80])
    w = rng.uniform(6e-5, 1e-4)
    flops = 2 * n ** 3
    q = simtime.BusyQueue([(0.0, 0.0)], BUSY_DELAY_S)
    dev = simtime.SimDevice(q, 1e10, flops / w, first_s=FIRST_CALL_S)
    name = str(dtype).replace("torch.", "")
    text = f"matmul_ceiling({n}, torch.{name}, 'cpu', sync, min_time={min_time:g})"
    got = _run_device(matmul_ceiling, (n, dtype, "cpu", q.sync, min_time), text, q, dev, threads)
    gflops = _check_result(got, "gflops", "GFLOP/s", text, threads)
    bs = simtime.blocks(q.log, ("op",))
    _structure(dev, bs, text, "matmul")
    right = flops / w / 1e9
    _name_rate(gflops, right, flops / 1e9, text, "GFLOP/s", [
        (0.5, "that counts multiply-adds; each is 2 FLOPs: 2 x n^3 for an n x n x n product"),
        (1 / n, "that counts 2 x n^2 FLOPs (a matrix-vector product's); an n x n x n matmul does 2 x n^3"),
        (1e3, "that is MFLOP/s; return GFLOP/s"), (1e-3, "that is TFLOP/s, or seconds taken as milliseconds; "
                                                         "return GFLOP/s")], bs, w, min_time)
    _timed_enough(bs, text, min_time)


def _check_refused(fn, args, text: str, what: str, how: str, threads: int) -> None:
    """On a broken device, the learner's function must refuse to time a wrong result, before timing it."""
    q = simtime.BusyQueue([(0.0, 0.0)], BUSY_DELAY_S)
    dev = simtime.SimDevice(q, 1e10, 1e10, first_s=FIRST_CALL_S, broken=True, max_ops=20_000)
    try:
        got = _run_device(fn, args(q), text, q, dev, threads, learner=False)
    except NotImplementedError:
        raise
    except Exception as exc:  # refused (CheckFailed from checks.verify, AssertionError, RuntimeError, ...)
        if simtime.blocks(q.log, ("op",)) and any(b.calls > 1 for b in simtime.blocks(q.log, ("op",))):
            fail(f"{text} on a device whose {what} is wrong raised ({type(exc).__name__}), but only after timing "
                 f"it: verify first -- the time of a wrong result is not a measurement")
        return
    fail(f"{text} returned {got!r:.60} on a device whose {what} is wrong ({how}): verify the result before timing "
         f"it and raise when it is wrong -- " + ("compare the WHOLE destination with the source (torch.equal)"
                                                 if what == "copy" else
                                                 "compare a few rows with the same rows computed in float64"))


def check_all(best_seconds_per_call, copy_ceiling, matmul_ceiling, rng) -> str:
    import torch
    _check_harness(best_seconds_per_call, rng)
    for (min_time, threads, dtype) in ((MIN_TIMES[1], rng.choice([3, 4]), torch.float32),
                                       (MIN_TIMES[1] * 0.8, rng.choice([5, 6]), torch.bfloat16)):
        _check_copy(copy_ceiling, rng, min_time, threads)
        _check_matmul(matmul_ceiling, rng, min_time, threads, dtype)
    _check_refused(copy_ceiling, lambda q: (2**16, "cpu", q.sync, MIN_TIMES[1]), "copy_ceiling(65536, 'cpu', "
                   "sync, ...)", "copy", "it fills only the first half of the destination", 3)
    _check_refused(matmul_ceiling, lambda q: (48, torch.float32, "cpu", q.sync, MIN_TIMES[1]), "matmul_ceiling(48, "
                   "torch.float32, 'cpu', sync, ...)", "matmul", "every float32 product is half what it should be", 3)
    return ("on a simulated busy device: the best block of synchronised ~1 ms blocks after a warm-up, within "
            f"{TOLERANCE:.0%} of the device's rate, for a ~2 ms and a ~0.1 ms op; copies counted read + write, "
            "matmuls 2n^3, on random data, nothing allocated while timing, the threads reported; a wrong copy and a "
            "wrong matmul refused before timing")


@checker("0.3", "the two ceilings, measured right", in_kernel="it times the learner's functions on a simulated clock "
                                                            "and watches their torch calls in the kernel")
def check_ceilings(best_seconds_per_call, copy_ceiling, matmul_ceiling, seed=None):
    """best_seconds_per_call(op, sync, min_time) -> the best block's seconds per call; copy_ceiling(nbytes, device,
    sync, min_time) -> {"gbps", "threads"}; matmul_ceiling(n, dtype, device, sync, min_time) -> {"gflops",
    "threads"}: verified, warmed up, synchronised, timed in blocks until min_time, the best block kept."""
    with fresh_cases(seed, replay=True) as cases:
        return check_all(best_seconds_per_call, copy_ceiling, matmul_ceiling, cases.rng)
