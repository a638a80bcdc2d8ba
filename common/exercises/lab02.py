"""Checkers for lab 02 (roofline): FLOPs and bytes of a GEMM and of naive attention, a GPU's ridge point, the lab's
build exercise -- a roofline predictor for any operation from its shapes (FLOPs, bytes, intensity, bound, attainable
rate, time) -- and the critical batch of a decode matmul. References: common.kernels.roofline (costs, model,
`predict_op`) and common.facts.hardware (datasheets)."""
from __future__ import annotations

import math

from common.core.checks import checker, expect, expect_close, fail
from common.core.claims import readable
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


def _several(named: list) -> str:
    return {2: "two mistakes", 3: "three mistakes"}.get(len(named), "several mistakes")


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
        text = named[0] if len(named) == 1 else f"{_several(named)} give this answer -- " + "; or ".join(named)
        fail(f"{call} = ({flops:.6g}, {nbytes:.6g}): {text} (expected ({ref.flops:.6g}, {ref.bytes:.6g}))")
    expect_close(flops, ref.flops, f"{call} FLOPs{f' ({flops_hint})' if flops_hint else ''}", rtol=1e-9, atol=0)
    expect_close(nbytes, ref.bytes, f"{call} bytes", rtol=1e-9, atol=0)


def _learner(fn, text: str, *args, reference: str = ""):
    return learner_call(fn, tuple(args), text, [(rl, reference)] if reference else (), expected="a pair (flops, bytes)",
                        library=True)


def _elements(shape) -> float:
    out = 1
    for d in shape:
        out *= d
    return out


def _cost_mistakes(op: str, shape: tuple, dtype: str) -> list[tuple[str, float | None, float | None]]:
    """The classic wrong (flops, bytes) of each operation, as (message, flops or None, bytes or None)."""
    b, ref = B[dtype], rl.op_cost(op, shape, dtype)
    elements = ("the bytes are counted in elements; multiply by the bytes per element", None, ref.bytes / b)
    if op == "vector_add":
        (n,) = shape
        return [("the bytes count two streams; c = a + b reads a, reads b and writes c (3 x n x bytes)", None,
                 2 * n * b), ("one add per element is 1 FLOP, not 2 (there is no multiply)", 2 * n, None), elements]
    if op == "gemm":
        m, n, k = shape
        return [("that counts multiply-adds; each is 2 FLOPs", m * n * k, None),
                ("the bytes miss writing C (m x n): a GEMM reads A and B and writes C", None, (m * k + k * n) * b),
                elements] + [
            ("one dimension is used twice and another not at all: (m x k) @ (k x n) does m*n*k multiply-adds", f, None)
            for f in {2 * m * m * k, 2 * m * n * n, 2 * m * k * k, 2 * n * n * k} - {2 * m * n * k}]
    if op == "softmax":
        r, c = shape
        return [("the bytes count the matrix once (the read of x); the output y is written too", None, r * c * b),
                ("that is a softmax without its reductions: the row max and the row sum are FLOPs too (5 per "
                 "element: max, subtract, exp, sum, divide)", 3 * r * c, None), elements]
    if op == "layernorm":
        r, c = shape
        return [("the bytes miss the weight and bias vectors (cols elements each)", None, 2 * r * c * b),
                ("weight and bias are read once per call, not once per row", None, 4 * r * c * b), elements]
    bsz, h, s, d_ = shape
    bh = bsz * h
    return [("those are FlashAttention's bytes (Q, K, V, O only): attention without the s x s traffic; the naive "
             "version also writes S, reads it, writes P and reads P: 4*s*s more elements", None, bh * 4 * s * d_ * b),
            ("the bytes count S and P once each; each is written once and read once (4*s*s in all)", None,
             bh * (4 * s * d_ + 2 * s * s) * b),
            ("the FLOPs miss the softmax (5*s*s per head)", bh * 4 * s * s * d_, None),
            ("the two matmuls are 2*s*s*d FLOPs each (a multiply-add is 2 FLOPs)", bh * (2 * s * s * d_ + 5 * s * s),
             None),
            ("you computed one (batch, head); multiply by batch x heads", ref.flops / bh if bh > 1 else None,
             ref.bytes / bh if bh > 1 else None),
            ("you multiplied by batch only (or heads only); every (batch, head) pair is one attention: batch x heads",
             *((ref.flops / h, ref.bytes / h) if h > 1 and bsz != h else (None, None))),
            ("you multiplied by batch only (or heads only); every (batch, head) pair is one attention: batch x heads",
             *((ref.flops / bsz, ref.bytes / bsz) if bsz > 1 and bsz != h else (None, None))),
            ("the bytes miss writing O: read Q, K, V, write O (4*s*d) besides the s x s traffic", None,
             bh * (3 * s * d_ + 4 * s * s) * b), elements]


@checker("2.1", "FLOPs and bytes of a GEMM")
@replayable
def check_gemm_cost(gemm_cost, cases):
    """gemm_cost(m, n, k, dtype) -> (flops, bytes) of (m x k) @ (k x n), each operand moved once."""
    rng = cases.rng
    # asymmetric shapes (a mix-up of m, n, k cannot coincide), every element size, square and matrix-vector
    inputs = [(3, 5, 7, "fp32"), (4096, 2048, 1024, "bf16"), (1, 8192, 4096, "fp8"), (96, 40, 24, "fp64")] + [
        (rng.randint(1, 5000), rng.randint(1, 5000), rng.randint(1, 5000), rng.choice(sorted(B))) for _ in range(5)]
    for m, n, k, d in inputs:
        text = f"gemm_cost({m}, {n}, {k}, {d!r})"
        _check_cost(text, _learner(gemm_cost, text, m, n, k, d, reference="gemm_cost"), rl.gemm_cost(m, n, k, d),
                    dtype=d, mistakes=_cost_mistakes("gemm", (m, n, k), d))
    return "2*m*n*k FLOPs and (m*k + k*n + m*n) x bytes for every shape, square to matrix-vector"


@checker("2.2", "FLOPs and bytes of naive attention")
@replayable
def check_attention_cost(attention_cost, cases):
    """attention_cost(batch, heads, seq, head_dim, dtype) -> (flops, bytes) with S and P stored in main memory."""
    rng = cases.rng
    # batch != heads and seq != head_dim (a swap cannot coincide), every element size
    inputs = [(2, 3, 40, 8, "fp32"), (2, 8, 1024, 64, "bf16"), (3, 2, 256, 128, "fp8"), (1, 5, 96, 32, "fp64")] + [
        (rng.randint(1, 8), rng.randint(1, 32), rng.randint(1, 8192), rng.choice([32, 64, 80, 128]),
         rng.choice(sorted(B))) for _ in range(5)]
    for bsz, h, s, d_, d in inputs:
        text = f"attention_cost({bsz}, {h}, {s}, {d_}, {d!r})"
        _check_cost(text, _learner(attention_cost, text, bsz, h, s, d_, d, reference="attention_cost"),
                    rl.attention_cost(bsz, h, s, d_, d), dtype=d,
                    mistakes=_cost_mistakes("attention", (bsz, h, s, d_), d))
    return "4*s*s*d + 5*s*s FLOPs and (4*s*d + 4*s*s) elements per head: the s*s terms make it memory-bound"


def _gpu_dtype_cases(rng):
    pairs = [(g, d) for g in hardware.gpu_ids() for d in hardware.supported_dtypes(g)]
    fixed = [("H100-SXM", "bf16"), ("A100-SXM", "fp64"), ("H100-SXM", "fp8"), ("H200-SXM", "bf16"), ("B200", "fp4")]
    return [c for c in fixed if c in pairs] + rng.sample(pairs, 6)


@checker("2.3", "ridge point of a GPU from the datasheet")
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
                                 expected="FLOPs per byte (a number)", library=True), text)
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
    for wrong, why in ((1 / ref, "inverted: that is bytes per FLOP (bandwidth / peak); the ridge is FLOPs per byte, "
                                 "peak / bandwidth"),
                       (ref / 8, "the bandwidth is in bits (x 8); HBM bandwidth is in bytes per second"),
                       (ref * 1e12 / 2**40, "the bandwidth is taken as TiB/s (2^40 bytes); the datasheet's TB/s are "
                                            "10^12 bytes"),
                       (ref * hardware.gpu(g).hbm_bandwidth_tbs * 1e3 / hardware.gpu(g).nvlink_gbs
                        if hardware.gpu(g).nvlink_gbs else None,
                        "that divides by the NVLink bandwidth; the ridge uses HBM bandwidth (hbm_bandwidth_tbs)")):
        if wrong is not None and math.isclose(got, wrong, rel_tol=1e-6) and not math.isclose(wrong, ref, rel_tol=1e-6):
            fail(f"{text} = {got:.4g}: {why} -> {ref:.4g}")
    if float(got).is_integer() and abs(got - ref) < 1 and not math.isclose(got, ref, rel_tol=1e-6):
        fail(f"{text} = {got:g}: rounded to a whole number; the ridge is {ref:.6g} FLOP/B -- return it unrounded")
    expect_close(got, ref, text, rtol=1e-6, atol=0)


KEYS = ("flops", "bytes", "intensity", "bound", "attainable", "seconds")
BOUNDS = ("memory-bound", "compute-bound")
_PREDICTOR_REFS = [(rl, "predict_op"), (rl, "op_cost"), (rl, "attainable"), (rl, "bound")]


def _roofs(rng) -> dict:
    """name -> (peak FLOP/s, bandwidth B/s): the H100's bf16 datasheet roof, a laptop CPU's, and a random one."""
    return {"H100 bf16": (hardware.peak_tflops("H100-SXM", "bf16") * 1e12, hardware.gpu("H100-SXM").hbm_bandwidth_tbs
                          * 1e12),
            "CPU": (3.0e11, 2.5e10),
            "random": (10 ** rng.uniform(10.5, 15.5), 10 ** rng.uniform(10, 12.5))}


def _predictor_cases(rng) -> list[tuple]:
    """(op, shape, dtype, roof name): every operation, every element size, each side of the ridge."""
    fixed = [("vector_add", (1_000_003,), "fp32", "CPU"), ("gemm", (512, 384, 256), "fp32", "CPU"),
             ("gemm", (1, 8192, 4096), "bf16", "H100 bf16"), ("gemm", (4096, 2048, 1024), "bf16", "H100 bf16"),
             ("softmax", (4096, 1000), "fp8", "H100 bf16"), ("layernorm", (3000, 4096), "fp32", "CPU"),
             ("attention", (1, 16, 4096, 128), "bf16", "H100 bf16"), ("attention", (2, 4, 256, 64), "fp32", "CPU"),
             ("softmax", (7, 33), "bf16", "random"), ("layernorm", (5, 96), "fp64", "H100 bf16")]
    draws = {"vector_add": lambda: (rng.randint(2, 10**8),),
             "gemm": lambda: (rng.randint(1, 4096), rng.randint(1, 4096), rng.randint(1, 4096)),
             "softmax": lambda: (rng.randint(1, 8192), rng.randint(2, 50000)),
             "layernorm": lambda: (rng.randint(1, 8192), rng.randint(2, 16384)),
             "attention": lambda: (rng.randint(1, 4), rng.randint(1, 32), rng.randint(16, 8192),
                                   rng.choice([32, 64, 128]))}
    return fixed + [(op, draws[op](), rng.choice(sorted(B)), rng.choice(["H100 bf16", "CPU", "random"]))
                    for op in rng.sample(sorted(draws), 4)]


def _close(a, b, rtol: float = 1e-9) -> bool:
    return math.isclose(a, b, rel_tol=rtol)


def _name(call: str, got: float, ref: float, what: str, candidates: list[tuple[str, float]], rtol: float = 1e-9):
    """Fail naming every candidate mistake whose value `got` equals (and the right answer does not); then compare."""
    named = list(dict.fromkeys(m for m, v in candidates if v is not None and _close(got, v, rtol)
                               and not _close(v, ref, rtol)))
    if named:
        text = named[0] if len(named) == 1 else f"{_several(named)} give this answer -- " + "; or ".join(named)
        fail(f"{call}: {what} = {readable(got)}: {text} (expected {readable(ref)})")
    expect_close(got, ref, f"{call}: {what}", rtol=rtol, atol=0)


def _check_prediction(predict_op, op: str, shape: tuple, dtype: str, roof: str, peak: float, bw: float) -> str:
    call = (f"predict_op({op!r}, {shape}, {dtype!r}, peak_flops={peak:.4g}, bandwidth={bw:.4g})"
            + ("" if roof == "random" else f" [the {roof} roof]"))
    got = learner_call(predict_op, (op, shape, dtype, peak, bw), call, _PREDICTOR_REFS,
                       expected=f"a dict with the keys {', '.join(KEYS)}", library=True)
    if not isinstance(got, dict):
        fail(f"{call} returned {type(got).__name__} {got!r:.60}; return a dict with the keys {', '.join(KEYS)}")
    missing = [k for k in KEYS if k not in got]
    if missing:
        fail(f"{call} returned a dict without {', '.join(repr(k) for k in missing)}; return all of {', '.join(KEYS)}")
    ref = rl.predict_op(op, shape, dtype, peak, bw)
    # each stage is judged on the learner's own earlier values, so one mistake is named once, where it is made
    _check_cost(call, (got["flops"], got["bytes"]), rl.Cost(ref["flops"], ref["bytes"]),
                _cost_mistakes(op, shape, dtype), dtype=dtype,
                flops_hint={"softmax": "the convention here: 5 FLOPs per element -- max, subtract, exp, sum, divide",
                            "layernorm": "the convention here: 8 FLOPs per element -- mean 1, variance 3, normalise "
                                         "2, affine 2"}.get(op, ""))
    flops, nbytes, ridge = ref["flops"], ref["bytes"], peak / bw
    intensity = as_number(got["intensity"], f"{call}['intensity']", "FLOPs per byte (a number)")
    _name(call, intensity, ref["intensity"], "intensity", [
        ("intensity inverted: that is bytes per FLOP; intensity is FLOPs per byte, flops / bytes", nbytes / flops)])
    att = as_number(got["attainable"], f"{call}['attainable']", "FLOP/s (a number)")
    x = ref["intensity"]
    _name(call, att, ref["attainable"], "attainable", [
        ("max where min is due: a kernel gets the lower of the two roofs, min(peak, intensity x bandwidth)",
         max(peak, x * bw)),
        ("not capped at the peak: above the ridge intensity x bandwidth exceeds what the ALUs can do; take "
         "min(peak, intensity x bandwidth)", x * bw),
        ("the peak, whatever the intensity: below the ridge the bandwidth limits, intensity x bandwidth", peak),
        ("below the ridge the rate is intensity x bandwidth (FLOP/B x B/s = FLOP/s); you divided", min(peak, x / bw)),
        ("in TFLOP/s; return FLOP/s, the unit of peak_flops", ref["attainable"] / 1e12),
        ("in GFLOP/s; return FLOP/s, the unit of peak_flops", ref["attainable"] / 1e9)])
    bound = got["bound"]
    if bound not in BOUNDS:
        fail(f"{call}: bound = {bound!r}; return one of {', '.join(repr(b) for b in BOUNDS)}")
    if bound != ref["bound"]:
        if bound == ("memory-bound" if x < bw / peak else "compute-bound"):
            why = (f"the bound was decided against the wrong ridge, bandwidth / peak = {bw / peak:.3g}; the ridge is "
                   f"peak / bandwidth = {ridge:.4g} FLOP/B")
        elif roof != "H100 bf16" and bound == ("memory-bound" if x < 295.373 else "compute-bound"):
            why = (f"the bound was decided against the H100's bf16 ridge (295 FLOP/B), not this roof's: peak / "
                   f"bandwidth = {ridge:.4g} FLOP/B")
        else:
            why = (f"intensity {x:.4g} is {'below' if x < ridge else 'at or above'} the ridge {ridge:.4g} FLOP/B "
                   f"(peak / bandwidth), so the kernel is {ref['bound']}: below the ridge memory limits it")
        fail(f"{call}: bound = {bound!r}: {why}")
    seconds = as_number(got["seconds"], f"{call}['seconds']", "seconds (a number)")
    compute, memory = flops / peak, nbytes / bw
    _name(call, seconds, ref["seconds"], "seconds", [
        ("min where max is due: the slower of the two limits sets the time, max(flops / peak, bytes / bandwidth) = "
         "flops / attainable", min(compute, memory)),
        ("added the compute time and the memory time; the roofline overlaps them, so the slower one sets the time: "
         "flops / attainable", compute + memory),
        ("that is milliseconds; return seconds", ref["seconds"] * 1e3),
        ("that is microseconds; return seconds", ref["seconds"] * 1e6),
        ("the time at the compute peak alone; below the ridge the bytes set it: flops / attainable", compute),
        ("the memory time alone; above the ridge the FLOPs set it: flops / attainable", memory),
        ("bytes divided by a FLOP rate; the time is flops / attainable", nbytes / ref["attainable"])], rtol=1e-6)
    return ref["bound"]


@checker("2.4", "a roofline predictor for any operation")
@replayable
def check_roofline_predictor(predict_op, cases):
    """predict_op(op, shape, dtype, peak_flops, bandwidth) -> {flops, bytes, intensity, bound, attainable, seconds}
    for vector_add (n,), gemm (m, n, k), softmax and layernorm (rows, cols), attention (batch, heads, seq, head_dim)."""
    roofs, bounds = _roofs(cases.rng), set()
    todo = _predictor_cases(cases.rng)
    for op, shape, dtype, roof in todo:
        bounds.add(_check_prediction(predict_op, op, shape, dtype, roof, *roofs[roof]))
    return (f"right for {len(todo)} operations on three roofs (H100 bf16, a CPU, a random one), "
            f"{' and '.join(sorted(bounds))}: FLOPs, bytes, intensity, bound, attainable rate and time")


@checker("2.5", "critical batch of a decode matmul")
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
    got = learner_call(critical_batch, (g, d, k, n), text, [(rl, "critical_batch")], expected="an integer batch size",
                       library=True)
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
    if got != ref:
        named += _critical_look_alikes(got, ref, roof, g, d, k, n)
    if named:
        fail(f"{text} = {got}: " + ("; or ".join(named) if len(named) == 1 else
                                    f"{_several(named)} give this answer -- " + "; or ".join(named))
             + f" (answer {ref})")
    expect(got == ref, f"{text}: expected {ref}, got {got} (intensity at {got}: "
                       f"{rl.decode_gemm_intensity(max(got, 1), k, n, d):.2f} FLOP/B; ridge {roof.ridge:.2f})")


def _smallest(reaches, limit: int = 1 << 20) -> int | None:
    """The smallest batch b >= 1 with reaches(b), by doubling then bisection (None past `limit`)."""
    if reaches(1):
        return 1
    lo, hi = 1, 2  # reaches(lo) is False, reaches(hi) is True once found
    while not reaches(hi):
        lo, hi = hi, hi * 2
        if hi > limit:
            return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if reaches(mid) else (mid, hi)
    return hi


def _critical_look_alikes(got: int, ref: int, roof, g: str, d: str, k: int, n: int) -> list[str]:
    """The critical-batch mistakes (besides one short, weights-only, sparse and byte size) that give `got`."""
    b, ridge = B[d], roof.ridge
    ridges = {x: hardware.ridge_point(g, x) for x in hardware.supported_dtypes(g) if x != d}
    named = []
    if got == ref + 1:
        named.append(f"one past -- batch {ref} already reaches the ridge (intensity "
                     f"{rl.decode_gemm_intensity(ref, k, n, d):.2f} >= {ridge:.2f}): the test is >=, and return the "
                     f"first batch that passes it")
    for why, intensity in (
            ("the bytes miss writing the output (batch x n elements): a GEMM reads A and B and writes C",
             lambda x: 2 * x * k * n / (b * (x * k + k * n))),
            ("the FLOPs count multiply-adds (batch x k x n); each is 2 FLOPs",
             lambda x: x * k * n / (b * (x * k + k * n + x * n)))):
        if got == _smallest(lambda x: intensity(x) >= ridge):
            named.append(why)
    for x, r in ridges.items():
        if got == _smallest(lambda y: rl.decode_gemm_intensity(y, k, n, d) >= r):
            named.append(f"that reaches the {x} ridge ({r:.4g} FLOP/B); a {d} matmul is held to the {d} ridge "
                         f"({ridge:.4g})")
            break
    return named
