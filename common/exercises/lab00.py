"""Checkers for lab 00 (orientation): counting bytes and FLOPs, predicting a time."""
from __future__ import annotations

import random

from common.checks import checker, expect, expect_close, expect_equal

_DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "int8": 1}


@checker("0.1", "bytes moved by a copy")
def check_copy_bytes(copy_bytes):
    """copy_bytes(n_elements, dtype_name) -> bytes read + written by dst.copy_(src)."""
    rng = random.Random()
    cases = [(1, "float32"), (1000, "bfloat16")] + [
        (rng.randint(2, 10**7), rng.choice(sorted(_DTYPE_BYTES))) for _ in range(5)]
    for n, dtype in cases:
        got = copy_bytes(n, dtype)
        expected = 2 * n * _DTYPE_BYTES[dtype]
        if got == n * _DTYPE_BYTES[dtype]:
            expect(False, f"copy_bytes({n}, {dtype!r}) = {got}: that counts only the read (or only the write); "
                          f"a copy reads every byte once and writes it once")
        expect_equal(got, expected, f"copy_bytes({n}, {dtype!r})")
    return f"right for {len(cases)} sizes and dtypes (a copy moves 2 x n x bytes-per-element)"


@checker("0.2", "FLOPs of a matmul")
def check_matmul_flops(matmul_flops):
    """matmul_flops(m, n, k) -> FLOPs of (m x k) @ (k x n), a multiply-add counted as 2."""
    rng = random.Random()
    cases = [(1, 1, 1), (2, 3, 4)] + [tuple(rng.randint(1, 5000) for _ in range(3)) for _ in range(5)]
    for m, n, k in cases:
        got = matmul_flops(m, n, k)
        if got == m * n * k and m * n * k:
            expect(False, f"matmul_flops({m}, {n}, {k}) = {got}: that counts multiply-adds; each is 2 FLOPs "
                          f"(a multiply and an add)")
        expect_equal(got, 2 * m * n * k, f"matmul_flops({m}, {n}, {k})")
    return f"right for {len(cases)} shapes (2*m*n*k)"


def _reference_predict(m, n, k, bytes_per_element, flops_per_s, bytes_per_s):
    flops = 2 * m * n * k
    moved = (m * k + k * n + m * n) * bytes_per_element
    return max(flops / flops_per_s, moved / bytes_per_s)


@checker("0.3", "predict a matmul's time from the two ceilings")
def check_predict_matmul_seconds(predict):
    """predict(m, n, k, bytes_per_element, flops_per_s, bytes_per_s) -> seconds, the larger of compute and memory."""
    rng = random.Random()
    # one compute-bound case, one memory-bound case (a matrix-vector product), then random ones
    cases = [(4096, 4096, 4096, 2, 1e15, 3e12), (8192, 1, 8192, 2, 1e15, 3e12)] + [
        (rng.randint(1, 4096), rng.randint(1, 4096), rng.randint(1, 4096), rng.choice([1, 2, 4]),
         rng.uniform(1e11, 1e15), rng.uniform(1e10, 8e12)) for _ in range(6)]
    for case in cases:
        expected = _reference_predict(*case)
        got = predict(*case)
        m, n, k, b, f, bw = case
        compute, memory = 2 * m * n * k / f, (m * k + k * n + m * n) * b / bw
        expect(got is not None, "predict returned None -- return the predicted seconds")
        if abs(got - (compute + memory)) < 1e-12 * expected and abs(compute - memory) > 1e-3 * expected:
            expect(False, f"for m,n,k={m},{n},{k} you added compute time and memory time ({got:.3g} s); the "
                          f"roofline model takes the larger of the two ({expected:.3g} s), as they overlap")
        expect_close(got, expected, f"predicted seconds for m,n,k={m},{n},{k}, {b} B/element", rtol=1e-6, atol=0)
    return "max(FLOPs / FLOP rate, bytes / bandwidth) for compute- and memory-bound shapes"
