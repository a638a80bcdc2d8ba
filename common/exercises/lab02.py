"""Checkers for lab 02 (roofline): FLOPs and bytes of real operations, attainable performance, ridge points and the
critical batch of a decode matmul. References: common.roofline (costs, model) and common.hardware (datasheets)."""
from __future__ import annotations

import math
import random

from common import hardware
from common import roofline as rl
from common.checks import checker, expect, expect_close, fail

# the dtype sizes the notebook gives the learner (same as common.roofline.DTYPE_BYTES for these names)
B = {"fp64": 8, "fp32": 4, "bf16": 2, "fp8": 1}


def _pair(got, call: str):
    """A (flops, bytes) result as two floats, or a verdict saying what shape was expected."""
    if got is None:
        fail(f"{call} returned None -- return (flops, bytes)")
    try:
        flops, nbytes = got
    except (TypeError, ValueError):
        fail(f"{call} returned {got!r}; expected a pair (flops, bytes)")
    return float(flops), float(nbytes)


def _check_cost(call: str, got, ref: rl.Cost, mistakes: list[tuple[str, float | None, float | None]],
                flops_hint: str = ""):
    """Compare (flops, bytes) with the reference; name a known mistake when the answer matches one exactly.

    mistakes: (message, flops_if_that_mistake or None, bytes_if_that_mistake or None).
    """
    flops, nbytes = _pair(got, call)
    for message, mflops, mbytes in mistakes:
        hit_f = mflops is not None and math.isclose(flops, mflops, rel_tol=1e-9) and mflops != ref.flops
        hit_b = mbytes is not None and math.isclose(nbytes, mbytes, rel_tol=1e-9) and mbytes != ref.bytes
        if hit_f or hit_b:
            fail(f"{call} = ({flops:.6g}, {nbytes:.6g}): {message} (expected ({ref.flops:.6g}, {ref.bytes:.6g}))")
    expect_close(flops, ref.flops, f"{call} FLOPs{f' ({flops_hint})' if flops_hint else ''}", rtol=1e-9, atol=0)
    expect_close(nbytes, ref.bytes, f"{call} bytes", rtol=1e-9, atol=0)


@checker("2.1", "FLOPs and bytes of a vector add")
def check_vector_add_cost(vector_add_cost):
    """vector_add_cost(n, dtype) -> (flops, bytes) of c = a + b."""
    rng = random.Random()
    cases = [(1, "fp32"), (1000, "bf16")] + [(rng.randint(2, 10**8), rng.choice(sorted(B))) for _ in range(5)]
    for n, d in cases:
        ref, b = rl.vector_add_cost(n, d), B[d]
        _check_cost(f"vector_add_cost({n}, {d!r})", vector_add_cost(n, d), ref, [
            ("the bytes miss a stream: c = a + b reads a, reads b and writes c (3 x n x bytes)", None, 2 * n * b),
            ("the bytes are counted in elements; multiply by the bytes per element", None, 3 * n),
            ("one add per element is 1 FLOP, not 2 (there is no multiply)", 2 * n, None),
        ])
    return f"right for {len(cases)} sizes and dtypes: n FLOPs, 3n elements moved -> intensity 1/(3 x bytes)"


@checker("2.2", "FLOPs and bytes of a GEMM")
def check_gemm_cost(gemm_cost):
    """gemm_cost(m, n, k, dtype) -> (flops, bytes) of (m x k) @ (k x n), each operand moved once."""
    rng = random.Random()
    cases = [(1, 1, 1, "fp32"), (4096, 4096, 4096, "bf16"), (1, 8192, 8192, "bf16")] + [
        (rng.randint(1, 5000), rng.randint(1, 5000), rng.randint(1, 5000), rng.choice(sorted(B))) for _ in range(5)]
    for m, n, k, d in cases:
        ref, b = rl.gemm_cost(m, n, k, d), B[d]
        _check_cost(f"gemm_cost({m}, {n}, {k}, {d!r})", gemm_cost(m, n, k, d), ref, [
            ("that counts multiply-adds; each is 2 FLOPs", m * n * k, None),
            ("the bytes miss writing C (m x n): a GEMM reads A and B and writes C", None, (m * k + k * n) * b),
            ("the bytes are counted in elements; multiply by the bytes per element", None, m * k + k * n + m * n),
        ])
    return "2*m*n*k FLOPs and (m*k + k*n + m*n) x bytes for every shape, square to matrix-vector"


@checker("2.3", "FLOPs and bytes of a row softmax")
def check_softmax_cost(softmax_cost):
    """softmax_cost(rows, cols, dtype) -> (flops, bytes): 5 FLOPs per element, read x and write y once."""
    rng = random.Random()
    cases = [(1, 1, "fp32"), (4, 1000, "bf16")] + [(rng.randint(1, 8192), rng.randint(1, 50000), rng.choice(sorted(B)))
                                                   for _ in range(5)]
    for r, c, d in cases:
        ref, b = rl.softmax_cost(r, c, d), B[d]
        _check_cost(f"softmax_cost({r}, {c}, {d!r})", softmax_cost(r, c, d), ref, [
            ("the bytes count only the read of x; the output y is written too", None, r * c * b),
            ("the bytes are counted in elements; multiply by the bytes per element", None, 2 * r * c),
        ], flops_hint="the convention here: 5 FLOPs per element -- max, subtract, exp, sum, divide")
    return "5 FLOPs and 2 x bytes per element: a softmax does ~1 FLOP per byte, far below any ridge point"


@checker("2.4", "FLOPs and bytes of a LayerNorm")
def check_layernorm_cost(layernorm_cost):
    """layernorm_cost(rows, cols, dtype) -> (flops, bytes): 8 FLOPs per element; x, y, weight and bias moved once."""
    rng = random.Random()
    cases = [(1, 1, "fp32"), (8, 4096, "bf16")] + [(rng.randint(1, 8192), rng.randint(1, 16384), rng.choice(sorted(B)))
                                                   for _ in range(5)]
    for r, c, d in cases:
        ref, b = rl.layernorm_cost(r, c, d), B[d]
        _check_cost(f"layernorm_cost({r}, {c}, {d!r})", layernorm_cost(r, c, d), ref, [
            ("the bytes miss the weight and bias vectors (cols elements each)", None, 2 * r * c * b),
            ("weight and bias are read once per call, not once per row", None, (2 * r * c + 2 * r * c) * b),
            ("the bytes are counted in elements; multiply by the bytes per element", None, 2 * r * c + 2 * c),
        ], flops_hint="the convention here: 8 FLOPs per element -- mean 1, variance 3, normalise 2, affine 2")
    return "8 FLOPs per element; x, y, weight and bias each moved once"


@checker("2.5", "FLOPs and bytes of naive attention")
def check_attention_cost(attention_cost):
    """attention_cost(batch, heads, seq, head_dim, dtype) -> (flops, bytes) with S and P stored in main memory."""
    rng = random.Random()
    cases = [(1, 1, 1, 1, "fp32"), (2, 8, 1024, 64, "bf16")] + [
        (rng.randint(1, 8), rng.randint(1, 32), rng.randint(1, 8192), rng.choice([32, 64, 80, 128]),
         rng.choice(sorted(B))) for _ in range(5)]
    for bsz, h, s, d_, d in cases:
        ref, b, bh = rl.attention_cost(bsz, h, s, d_, d), B[d], bsz * h
        _check_cost(f"attention_cost({bsz}, {h}, {s}, {d_}, {d!r})", attention_cost(bsz, h, s, d_, d), ref, [
            ("those are FlashAttention's bytes (Q, K, V, O only); the naive version also writes S, reads it, writes "
             "P and reads P: 4*s*s more elements", None, bh * 4 * s * d_ * b),
            ("the bytes count S and P once each; each is written once and read once (4*s*s in all)", None,
             bh * (4 * s * d_ + 2 * s * s) * b),
            ("the FLOPs miss the softmax (5*s*s per head)", bh * 4 * s * s * d_, None),
            ("the two matmuls are 2*s*s*d FLOPs each (a multiply-add is 2 FLOPs)", bh * (2 * s * s * d_ + 5 * s * s),
             None),
            ("you computed one (batch, head); multiply by batch x heads", ref.flops / bh if bh > 1 else None,
             ref.bytes / bh if bh > 1 else None),
        ])
    return "4*s*s*d + 5*s*s FLOPs and (4*s*d + 4*s*s) elements per head: the s*s terms make it memory-bound"


@checker("2.6", "attainable performance")
def check_attainable(attainable):
    """attainable(intensity, peak_flops, bandwidth) -> min(peak, intensity * bandwidth)."""
    rng = random.Random()
    cases = [(0.25, 1e15, 3e12), (1000.0, 1e15, 3e12), (333.3, 1e15, 3e12)]
    cases += [(10 ** rng.uniform(-2, 4), 10 ** rng.uniform(10, 16), 10 ** rng.uniform(9, 13)) for _ in range(8)]
    got = []
    for x, peak, bw in cases:
        g = attainable(x, peak, bw)
        expect(g is not None, "attainable returned None -- return a FLOP/s number")
        got.append(float(g))

    def all_match(rule):
        return all(math.isclose(g, rule(x, p, b), rel_tol=1e-9) for g, (x, p, b) in zip(got, cases))

    if all_match(lambda x, p, b: max(p, x * b)):
        fail("your function returns the larger of the two roofs (max of peak and intensity x bandwidth); a kernel "
             "gets the *smaller*: min(peak, intensity x bandwidth)")
    if all_match(lambda x, p, b: x * b):
        fail("your function returns intensity x bandwidth everywhere, which exceeds the compute peak above the "
             "ridge: cap it at the peak")
    if all_match(lambda x, p, b: p):
        fail("your function returns the peak everywhere; below the ridge the bandwidth limits, so the answer there "
             "is intensity x bandwidth")
    for g, (x, peak, bw) in zip(got, cases):
        expect_close(g, min(peak, x * bw), f"attainable({x:.4g}, {peak:.4g}, {bw:.4g})", rtol=1e-9, atol=0)
    return "min(peak, intensity x bandwidth) on both sides of the ridge"


def _gpu_dtype_cases(rng):
    pairs = [(g, d) for g in hardware.gpu_ids() for d in hardware.supported_dtypes(g)]
    return [("H100-SXM", "bf16"), ("A100-SXM", "fp64")] + rng.sample(pairs, 6)


@checker("2.7", "ridge point of a GPU from the datasheet")
def check_ridge(ridge):
    """ridge(gpu_id, dtype) -> dense peak FLOP/s / HBM bytes/s (FLOP per byte), from common.hardware."""
    rng = random.Random()
    for g, d in _gpu_dtype_cases(rng):
        ref = hardware.ridge_point(g, d)
        got = ridge(g, d)
        expect(got is not None, "ridge returned None -- return FLOPs per byte")
        call = f"ridge({g!r}, {d!r})"
        tf, tbs = hardware.peak_tflops(g, d), hardware.gpu(g).hbm_bandwidth_tbs
        if hardware.gpu(g).tflops[d]["sparse"] and math.isclose(float(got), 2 * ref, rel_tol=1e-6):
            fail(f"{call} = {float(got):.4g}: that uses the sparse (2:4) datasheet rate; ridge points use the dense "
                 f"peak ({tf:g} TFLOPS) -> {ref:.4g}")
        for factor, what in ((1e3, "TFLOPS over GB/s"), (1e-3, "GFLOP/s over TB/s"), (1e-12, "TFLOPS in FLOP/s over "
                                                                                          "TB/s")):
            if math.isclose(float(got), ref * factor, rel_tol=1e-6):
                fail(f"{call} = {float(got):.4g}: units mixed up ({what}); convert both to per-second base units: "
                     f"{tf:g}e12 FLOP/s / {tbs:g}e12 B/s = {ref:.4g}")
        expect_close(got, ref, call, rtol=1e-6, atol=0)
    return "dense peak / HBM bandwidth for every GPU and dtype tried"


@checker("2.8", "critical batch of a decode matmul")
def check_critical_batch(critical_batch):
    """critical_batch(gpu_id, dtype, k, n) -> smallest integer batch whose (batch x k) @ (k x n) intensity reaches
    the GPU's dense ridge point."""
    rng = random.Random()
    cases = [("H100-SXM", "bf16", 8192, 8192), ("A100-SXM", "bf16", 4096, 4096)]
    for _ in range(5):
        g = rng.choice(hardware.gpu_ids())
        d = rng.choice([x for x in ("bf16", "fp8") if x in hardware.supported_dtypes(g)])
        cases.append((g, d, rng.choice([2048, 4096, 5120, 8192, 12288, 16384]),
                      rng.choice([2048, 4096, 8192, 14336, 28672])))
    for g, d, k, n in cases:
        roof = rl.Roof.datasheet(g, d)
        ref = rl.critical_batch(roof.peak_flops, roof.bandwidth, k, n, d)
        got = critical_batch(g, d, k, n)
        call = f"critical_batch({g!r}, {d!r}, k={k}, n={n})"
        expect(got is not None, f"{call} returned None -- return an integer batch size")
        if isinstance(got, float) and not float(got).is_integer():
            fail(f"{call} = {got}: a batch is a whole number of tokens; return the smallest integer that reaches the "
                 f"ridge ({ref})")
        got = int(got)
        approx = math.ceil(roof.ridge * rl.dtype_bytes(d) / 2)
        sparse_roof = hardware.gpu(g).tflops[d]["sparse"]
        if got == ref - 1:
            fail(f"{call} = {got}: one short -- at batch {got} the intensity is "
                 f"{rl.decode_gemm_intensity(got, k, n, d):.2f} FLOP/B, still below the ridge {roof.ridge:.2f}; round "
                 f"up, not down")
        if got == approx and approx != ref:
            fail(f"{call} = {got}: that is the weights-only estimate ridge x bytes / 2; the activations and outputs "
                 f"(batch x (k + n) elements) add bytes too, so the exact answer is larger ({ref})")
        if sparse_roof:
            try:
                sp = rl.critical_batch(sparse_roof * 1e12, roof.bandwidth, k, n, d)
            except ValueError:  # the sparse ridge is out of reach for this shape
                sp = None
            if sp is not None and got == sp and sp != ref:
                fail(f"{call} = {got}: that uses the sparse (2:4) peak; ridge points use the dense one (answer {ref})")
        expect(got == ref, f"{call}: expected {ref}, got {got} (intensity at {got}: "
                           f"{rl.decode_gemm_intensity(max(got, 1), k, n, d):.2f} FLOP/B; ridge {roof.ridge:.2f})")
    return "smallest batch with 2Bkn / (b(Bk + kn + Bn)) >= ridge, for every GPU, dtype and shape tried"
