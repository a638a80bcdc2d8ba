"""Checkers for lab 02 (roofline): FLOPs and bytes of real operations, attainable performance, ridge points and the
critical batch of a decode matmul. References: common.kernels.roofline (costs, model) and common.facts.hardware (datasheets)."""
from __future__ import annotations

import math

from common.core.checks import checker, expect, expect_close, fail
from common.exercises.cases import as_number, learner_call, replayable
from common.facts import hardware
from common.kernels import roofline as rl

# the dtype sizes the notebook gives the learner (same as common.kernels.roofline.DTYPE_BYTES for these names)
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
                flops_hint: str = "", dtype: str | None = None):
    """Compare (flops, bytes) with the reference; name a known mistake when the answer matches one exactly.

    mistakes: (message, flops_if_that_mistake or None, bytes_if_that_mistake or None). With `dtype`, bytes that
    equal the reference's for another element size name the wrong size. When two mistakes give the same number,
    both are named.
    """
    flops, nbytes = _pair(got, call)
    named = []
    for message, mflops, mbytes in mistakes:
        hit_f = mflops is not None and math.isclose(flops, mflops, rel_tol=1e-9) and mflops != ref.flops
        hit_b = mbytes is not None and math.isclose(nbytes, mbytes, rel_tol=1e-9) and mbytes != ref.bytes
        if hit_f or hit_b:
            named.append(message)
    if dtype is not None and not math.isclose(nbytes, ref.bytes, rel_tol=1e-9):
        wrong = sorted({b for b in B.values() if b != B[dtype] and math.isclose(nbytes, ref.bytes * b / B[dtype],
                                                                                  rel_tol=1e-9)})
        if wrong:
            named.append(f"the bytes use {wrong[0]} bytes per element; {dtype} has {B[dtype]}")
    named = list(dict.fromkeys(named))
    if named:
        text = named[0] if len(named) == 1 else "two mistakes give this answer -- " + "; or ".join(named)
        fail(f"{call} = ({flops:.6g}, {nbytes:.6g}): {text} (expected ({ref.flops:.6g}, {ref.bytes:.6g}))")
    expect_close(flops, ref.flops, f"{call} FLOPs{f' ({flops_hint})' if flops_hint else ''}", rtol=1e-9, atol=0)
    expect_close(nbytes, ref.bytes, f"{call} bytes", rtol=1e-9, atol=0)


def _learner(fn, text: str, *args, reference: str = ""):
    return learner_call(fn, tuple(args), text, [(rl, reference)] if reference else (), expected="a pair (flops, bytes)")


_DTYPES_FIXED = ("fp32", "bf16", "fp8", "fp64")  # every element size in a fixed case, the 4-byte one first


@checker("2.1", "FLOPs and bytes of a vector add")
@replayable
def check_vector_add_cost(vector_add_cost, cases):
    """vector_add_cost(n, dtype) -> (flops, bytes) of c = a + b."""
    rng = cases.rng
    inputs = [(1000 + i, d) for i, d in enumerate(_DTYPES_FIXED)] + [(rng.randint(2, 10**8), rng.choice(sorted(B)))
                                                                    for _ in range(5)]
    for n, d in inputs:
        ref, b = rl.vector_add_cost(n, d), B[d]
        text = f"vector_add_cost({n}, {d!r})"
        _check_cost(text, _learner(vector_add_cost, text, n, d, reference="vector_add_cost"), ref, dtype=d, mistakes=[
            ("the bytes miss a stream: c = a + b reads a, reads b and writes c (3 x n x bytes)", None, 2 * n * b),
            ("the bytes are counted in elements; multiply by the bytes per element", None, 3 * n),
            ("one add per element is 1 FLOP, not 2 (there is no multiply)", 2 * n, None),
        ])
    return f"right for {len(inputs)} sizes and dtypes: n FLOPs, 3n elements moved -> intensity 1/(3 x bytes)"


@checker("2.2", "FLOPs and bytes of a GEMM")
@replayable
def check_gemm_cost(gemm_cost, cases):
    """gemm_cost(m, n, k, dtype) -> (flops, bytes) of (m x k) @ (k x n), each operand moved once."""
    rng = cases.rng
    # asymmetric shapes (a mix-up of m, n, k cannot coincide), every element size, square and matrix-vector
    inputs = [(3, 5, 7, "fp32"), (4096, 2048, 1024, "bf16"), (1, 8192, 4096, "fp8"), (96, 40, 24, "fp64")] + [
        (rng.randint(1, 5000), rng.randint(1, 5000), rng.randint(1, 5000), rng.choice(sorted(B))) for _ in range(5)]
    for m, n, k, d in inputs:
        ref, b = rl.gemm_cost(m, n, k, d), B[d]
        text = f"gemm_cost({m}, {n}, {k}, {d!r})"
        _check_cost(text, _learner(gemm_cost, text, m, n, k, d, reference="gemm_cost"), ref, dtype=d, mistakes=[
            ("that counts multiply-adds; each is 2 FLOPs", m * n * k, None),
            ("the bytes miss writing C (m x n): a GEMM reads A and B and writes C", None, (m * k + k * n) * b),
            ("the bytes are counted in elements; multiply by the bytes per element", None, m * k + k * n + m * n),
        ] + [("one dimension is used twice and another not at all: (m x k) @ (k x n) does m*n*k multiply-adds",
              f, None) for f in {2 * m * m * k, 2 * m * n * n, 2 * m * k * k, 2 * n * n * k} - {2 * m * n * k}])
    return "2*m*n*k FLOPs and (m*k + k*n + m*n) x bytes for every shape, square to matrix-vector"


@checker("2.3", "FLOPs and bytes of a row softmax")
@replayable
def check_softmax_cost(softmax_cost, cases):
    """softmax_cost(rows, cols, dtype) -> (flops, bytes): 5 FLOPs per element, read x and write y once."""
    rng = cases.rng
    inputs = [(3, 7, "fp32"), (4, 1000, "bf16"), (5, 96, "fp8"), (6, 10, "fp64")] + [
        (rng.randint(1, 8192), rng.randint(1, 50000), rng.choice(sorted(B))) for _ in range(5)]
    for r, c, d in inputs:
        ref, b = rl.softmax_cost(r, c, d), B[d]
        text = f"softmax_cost({r}, {c}, {d!r})"
        _check_cost(text, _learner(softmax_cost, text, r, c, d, reference="softmax_cost"), ref, dtype=d, mistakes=[
            ("the bytes count only the read of x; the output y is written too", None, r * c * b),
            ("the bytes are counted in elements; multiply by the bytes per element", None, 2 * r * c),
        ], flops_hint="the convention here: 5 FLOPs per element -- max, subtract, exp, sum, divide")
    return "5 FLOPs and 2 x bytes per element: a softmax does ~1 FLOP per byte, far below any ridge point"


@checker("2.4", "FLOPs and bytes of a LayerNorm")
@replayable
def check_layernorm_cost(layernorm_cost, cases):
    """layernorm_cost(rows, cols, dtype) -> (flops, bytes): 8 FLOPs per element; x, y, weight and bias moved once."""
    rng = cases.rng
    inputs = [(3, 7, "fp32"), (8, 4096, "bf16"), (5, 96, "fp8"), (6, 10, "fp64")] + [
        (rng.randint(1, 8192), rng.randint(1, 16384), rng.choice(sorted(B))) for _ in range(5)]
    for r, c, d in inputs:
        ref, b = rl.layernorm_cost(r, c, d), B[d]
        text = f"layernorm_cost({r}, {c}, {d!r})"
        _check_cost(text, _learner(layernorm_cost, text, r, c, d, reference="layernorm_cost"), ref, dtype=d, mistakes=[
            ("the bytes miss the weight and bias vectors (cols elements each)", None, 2 * r * c * b),
            ("weight and bias are read once per call, not once per row", None, (2 * r * c + 2 * r * c) * b),
            ("the bytes are counted in elements; multiply by the bytes per element", None, 2 * r * c + 2 * c),
        ], flops_hint="the convention here: 8 FLOPs per element -- mean 1, variance 3, normalise 2, affine 2")
    return "8 FLOPs per element; x, y, weight and bias each moved once"


@checker("2.5", "FLOPs and bytes of naive attention")
@replayable
def check_attention_cost(attention_cost, cases):
    """attention_cost(batch, heads, seq, head_dim, dtype) -> (flops, bytes) with S and P stored in main memory."""
    rng = cases.rng
    # batch != heads and seq != head_dim (a swap cannot coincide), every element size
    inputs = [(2, 3, 40, 8, "fp32"), (2, 8, 1024, 64, "bf16"), (3, 2, 256, 128, "fp8"), (1, 5, 96, 32, "fp64")] + [
        (rng.randint(1, 8), rng.randint(1, 32), rng.randint(1, 8192), rng.choice([32, 64, 80, 128]),
         rng.choice(sorted(B))) for _ in range(5)]
    for bsz, h, s, d_, d in inputs:
        ref, b, bh = rl.attention_cost(bsz, h, s, d_, d), B[d], bsz * h
        text = f"attention_cost({bsz}, {h}, {s}, {d_}, {d!r})"
        _check_cost(text, _learner(attention_cost, text, bsz, h, s, d_, d, reference="attention_cost"), ref, dtype=d, mistakes=[
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
@replayable
def check_attainable(attainable, cases):
    """attainable(intensity, peak_flops, bandwidth) -> min(peak, intensity * bandwidth)."""
    rng = cases.rng
    inputs = [(0.25, 1e15, 3e12), (1000.0, 1e15, 3e12), (333.3, 1e15, 3e12), (2.0, 5e10, 2e10)]
    inputs += [(10 ** rng.uniform(-2, 4), 10 ** rng.uniform(10, 16), 10 ** rng.uniform(9, 13)) for _ in range(8)]
    got = []
    for x, peak, bw in inputs:
        text = f"attainable({x:.4g}, {peak:.4g}, {bw:.4g})"
        got.append(as_number(learner_call(attainable, (x, peak, bw), text, [(rl, "attainable")],
                                          expected="a FLOP/s number"), text))

    def all_match(rule):
        return all(math.isclose(g, rule(x, p, b), rel_tol=1e-9) for g, (x, p, b) in zip(got, inputs))

    if all_match(lambda x, p, b: max(p, x * b)):
        fail("your function returns the larger of the two roofs (max of peak and intensity x bandwidth); a kernel "
             "gets the *smaller*: min(peak, intensity x bandwidth)")
    if all_match(lambda x, p, b: x * b):
        fail("your function returns intensity x bandwidth everywhere, which exceeds the compute peak above the "
             "ridge: cap it at the peak")
    if all_match(lambda x, p, b: p):
        fail("your function returns the peak everywhere; below the ridge the bandwidth limits, so the answer there "
             "is intensity x bandwidth")
    if all_match(lambda x, p, b: min(p, x / b)) or all_match(lambda x, p, b: min(p, b / x)):
        fail("below the ridge the answer is intensity x bandwidth (FLOP/B x B/s = FLOP/s); you divided")
    for g, (x, peak, bw) in zip(got, inputs):
        expect_close(g, min(peak, x * bw), f"attainable({x:.4g}, {peak:.4g}, {bw:.4g})", rtol=1e-9, atol=0)
    return "min(peak, intensity x bandwidth) on both sides of the ridge"


def _gpu_dtype_cases(rng):
    pairs = [(g, d) for g in hardware.gpu_ids() for d in hardware.supported_dtypes(g)]
    fixed = [("H100-SXM", "bf16"), ("A100-SXM", "fp64"), ("H100-SXM", "fp8"), ("H200-SXM", "bf16"), ("B200", "fp4")]
    return [c for c in fixed if c in pairs] + rng.sample(pairs, 6)


@checker("2.7", "ridge point of a GPU from the datasheet")
@replayable
def check_ridge(ridge, cases):
    """ridge(gpu_id, dtype) -> dense peak FLOP/s / HBM bytes/s (FLOP per byte), from common.facts.hardware."""
    rng = cases.rng
    for g, d in _gpu_dtype_cases(rng):
        _check_one_ridge(ridge, g, d)
    return "dense peak / HBM bandwidth for every GPU and dtype tried"


def _check_one_ridge(ridge, g: str, d: str) -> None:
    ref = hardware.ridge_point(g, d)
    text = f"ridge({g!r}, {d!r})"
    got = as_number(learner_call(ridge, (g, d), text, [(hardware, "ridge_point")],
                                 expected="FLOPs per byte (a number)"), text)
    tf, tbs = hardware.peak_tflops(g, d), hardware.gpu(g).hbm_bandwidth_tbs
    if hardware.gpu(g).tflops[d]["sparse"] and math.isclose(got, 2 * ref, rel_tol=1e-6):
        other = [x for x in hardware.supported_dtypes(g) if x != d and
                 math.isclose(hardware.ridge_point(g, x), got, rel_tol=1e-6)]
        also = f"; or it uses the {other[0]} rate, which equals {d}'s sparse one" if other else ""
        fail(f"{text} = {got:.4g}: that uses the sparse (2:4) datasheet rate{also}; ridge points use the dense "
             f"{d} peak ({tf:g} TFLOPS) -> {ref:.4g}")
    wrong_dtype = [x for x in hardware.supported_dtypes(g) if x != d and
                   math.isclose(hardware.ridge_point(g, x), got, rel_tol=1e-6)]
    if wrong_dtype and not math.isclose(got, ref, rel_tol=1e-6):
        fail(f"{text} = {got:.4g}: that is the {wrong_dtype[0]} ridge; use the {d} peak ({tf:g} TFLOPS) -> "
             f"{ref:.4g}")
    for factor, what in ((1e3, "TFLOPS over GB/s"), (1e-3, "GFLOP/s over TB/s"), (1e-12, "TFLOPS in FLOP/s over "
                                                                                      "TB/s")):
        if math.isclose(got, ref * factor, rel_tol=1e-6):
            fail(f"{text} = {got:.4g}: units mixed up ({what}); convert both to per-second base units: "
                 f"{tf:g}e12 FLOP/s / {tbs:g}e12 B/s = {ref:.4g}")
    expect_close(got, ref, text, rtol=1e-6, atol=0)


@checker("2.8", "critical batch of a decode matmul")
@replayable
def check_critical_batch(critical_batch, cases):
    """critical_batch(gpu_id, dtype, k, n) -> smallest integer batch whose (batch x k) @ (k x n) intensity reaches
    the GPU's dense ridge point."""
    rng = cases.rng
    # every dtype a decode checks (bf16, fp8) in a fixed case, k != n, two GPUs with different ridges
    inputs = [("H100-SXM", "bf16", 8192, 8192), ("A100-SXM", "bf16", 4096, 14336), ("H100-SXM", "fp8", 5120, 8192),
             ("H200-SXM", "fp8", 8192, 28672)]
    for _ in range(5):
        g = rng.choice(hardware.gpu_ids())
        d = rng.choice([x for x in ("bf16", "fp8") if x in hardware.supported_dtypes(g)])
        inputs.append((g, d, rng.choice([2048, 4096, 5120, 8192, 12288, 16384]),
                      rng.choice([2048, 4096, 8192, 14336, 28672])))
    for case in inputs:
        _check_one_critical_batch(critical_batch, *case)
    return "smallest batch with 2Bkn / (b(Bk + kn + Bn)) >= ridge, for every GPU, dtype and shape tried"


def _check_one_critical_batch(critical_batch, g: str, d: str, k: int, n: int) -> None:
    roof = rl.Roof.datasheet(g, d)
    ref = rl.critical_batch(roof.peak_flops, roof.bandwidth, k, n, d)
    text = f"critical_batch({g!r}, {d!r}, k={k}, n={n})"
    got = learner_call(critical_batch, (g, d, k, n), text, [(rl, "critical_batch")], expected="an integer batch size")
    expect(got is not None, f"{text} returned None -- return an integer batch size")
    if isinstance(got, float) and not float(got).is_integer():
        fail(f"{text} = {got}: a batch is a whole number of tokens; return the smallest integer that reaches the "
             f"ridge ({ref})")
    got = int(got)
    approx = math.ceil(roof.ridge * rl.dtype_bytes(d) / 2)
    sparse_roof = hardware.gpu(g).tflops[d]["sparse"]
    if got == ref - 1:
        fail(f"{text} = {got}: one short -- at batch {got} the intensity is "
             f"{rl.decode_gemm_intensity(got, k, n, d):.2f} FLOP/B, still below the ridge {roof.ridge:.2f}; round "
             f"up, not down")
    if got == approx and approx != ref:
        fail(f"{text} = {got}: that is the weights-only estimate ridge x bytes / 2; the activations and outputs "
             f"(batch x (k + n) elements) add bytes too, so the exact answer is larger ({ref})")
    named = []
    if sparse_roof:
        try:
            sp = rl.critical_batch(sparse_roof * 1e12, roof.bandwidth, k, n, d)
        except ValueError:  # the sparse ridge is out of reach for this shape
            sp = None
        if sp is not None and got == sp and sp != ref:
            named.append("that uses the sparse (2:4) peak; ridge points use the dense one")
    other = [x for x in ("bf16", "fp8", "fp32") if x != d and got != ref and
             got == rl.critical_batch(roof.peak_flops, roof.bandwidth, k, n, x)]
    if other:
        named.append(f"that counts {B[other[0]]} bytes per element; {d} has {B[d]}")
    if named:
        fail(f"{text} = {got}: " + ("; or ".join(named) if len(named) == 1 else
                                    "two mistakes give this answer -- " + "; or ".join(named)) + f" (answer {ref})")
    expect(got == ref, f"{text}: expected {ref}, got {got} (intensity at {got}: "
                       f"{rl.decode_gemm_intensity(max(got, 1), k, n, d):.2f} FLOP/B; ridge {roof.ridge:.2f})")
