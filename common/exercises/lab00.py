"""Checkers for lab 00 (orientation): counting bytes and FLOPs, predicting a time."""
from __future__ import annotations

from common.core import ceilings
from common.core.checks import checker, expect_close, fail
from common.exercises.cases import as_number, learner_call, replayable

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
                                     expected="a number of bytes"), text)
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
                                     expected="a number of FLOPs"), text)
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


@checker("0.3", "predict a matmul's time from the two ceilings")
@replayable
def check_predict_matmul_seconds(predict, cases):
    """predict(m, n, k, bytes_per_element, flops_per_s, bytes_per_s) -> seconds, the larger of compute and memory."""
    rng = cases.rng
    # compute-bound, and memory-bound cases with every element size (1, 2, 4 bytes), asymmetric shapes
    inputs = [(4096, 2048, 1024, 2, 1e15, 3e12), (8192, 1, 4096, 2, 1e15, 3e12), (1, 4096, 2048, 1, 1e14, 2e12),
             (3000, 2, 5000, 4, 1e12, 5e10)] + [
        (rng.randint(1, 4096), rng.randint(1, 4096), rng.randint(1, 4096), rng.choice([1, 2, 4]),
         rng.uniform(1e11, 1e15), rng.uniform(1e10, 8e12)) for _ in range(6)]
    for case in inputs:
        m, n, k, b, f, bw = case
        text = f"predict({m}, {n}, {k}, {b}, {f:.4g}, {bw:.4g})"
        got = as_number(learner_call(predict, tuple(case), text, expected="seconds (a number)"), text)
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
        expect_close(got, expected, f"predicted seconds of {text}", rtol=1e-6, atol=0)
    return "max(FLOPs / FLOP rate, bytes / bandwidth) for compute- and memory-bound shapes and every element size"
