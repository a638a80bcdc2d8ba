"""Every lab 02 checker: a right implementation passes, each classic mistake fails with a telling message, a stub
is "not attempted"."""
import math

import pytest

from common.core.checks import CheckFailed
from common.exercises import lab02
from common.facts import hardware
from common.kernels import roofline as rl

B = {"fp64": 8, "fp32": 4, "bf16": 2, "fp8": 1}


def stub(*args):
    raise NotImplementedError("Exercise 2.x: replace this line with your code")


def _not_attempted(check):
    assert check(stub).status == "not attempted"


# 2.1 -----------------------------------------------------------------------------------------------------------
def test_gemm_cost():
    assert lab02.check_gemm_cost(lambda m, n, k, d: (2 * m * n * k, (m * k + k * n + m * n) * B[d])).passed
    assert lab02.check_gemm_cost(lambda m, n, k, d: rl.Cost(2 * m * n * k, (m * k + k * n + m * n) * B[d])).passed
    with pytest.raises(CheckFailed, match="each is 2 FLOPs"):
        lab02.check_gemm_cost(lambda m, n, k, d: (m * n * k, (m * k + k * n + m * n) * B[d]))
    with pytest.raises(CheckFailed, match="miss writing C"):
        lab02.check_gemm_cost(lambda m, n, k, d: (2 * m * n * k, (m * k + k * n) * B[d]))
    with pytest.raises(CheckFailed, match="counted in elements"):
        lab02.check_gemm_cost(lambda m, n, k, d: (2 * m * n * k, m * k + k * n + m * n))
    with pytest.raises(CheckFailed, match="returned None"):
        lab02.check_gemm_cost(lambda m, n, k, d: None)
    _not_attempted(lab02.check_gemm_cost)


# 2.2 -----------------------------------------------------------------------------------------------------------
def _attn(b, h, s, d, dt, flops_terms=(4, 5), byte_terms=(4, 4), per_head=False):
    bh = 1 if per_head else b * h
    fd, fs = flops_terms
    bd, bs = byte_terms
    return bh * (fd * s * s * d + fs * s * s), bh * (bd * s * d + bs * s * s) * B[dt]


def test_attention_cost():
    assert lab02.check_attention_cost(lambda *a: _attn(*a)).passed
    with pytest.raises(CheckFailed, match="FlashAttention's bytes"):
        lab02.check_attention_cost(lambda *a: _attn(*a, byte_terms=(4, 0)))
    with pytest.raises(CheckFailed, match="written once and read once"):
        lab02.check_attention_cost(lambda *a: _attn(*a, byte_terms=(4, 2)))
    with pytest.raises(CheckFailed, match="miss the softmax"):
        lab02.check_attention_cost(lambda *a: _attn(*a, flops_terms=(4, 0)))
    with pytest.raises(CheckFailed, match="a multiply-add is 2 FLOPs"):
        lab02.check_attention_cost(lambda *a: _attn(*a, flops_terms=(2, 5)))
    with pytest.raises(CheckFailed, match="multiply by batch x heads"):
        lab02.check_attention_cost(lambda *a: _attn(*a, per_head=True))
    _not_attempted(lab02.check_attention_cost)


# 2.3 -----------------------------------------------------------------------------------------------------------
def _ridge(g, d, sparse=False, scale=1.0):
    return hardware.peak_tflops(g, d, sparse) * 1e12 / (hardware.gpu(g).hbm_bandwidth_tbs * 1e12) * scale


def test_ridge():
    assert lab02.check_ridge(_ridge).passed
    with pytest.raises(CheckFailed, match="sparse"):
        lab02.check_ridge(lambda g, d: _ridge(g, d, sparse=hardware.gpu(g).tflops[d]["sparse"] is not None))
    with pytest.raises(CheckFailed, match="units mixed up"):
        lab02.check_ridge(lambda g, d: hardware.peak_tflops(g, d) / (hardware.gpu(g).hbm_bandwidth_tbs * 1e3) * 1e6)
    with pytest.raises(CheckFailed, match="units mixed up"):
        lab02.check_ridge(lambda g, d: _ridge(g, d, scale=1e-3))
    with pytest.raises(CheckFailed, match="ridge\\('A100-SXM', 'fp64'\\)"):  # a wrong rate for one dtype
        lab02.check_ridge(lambda g, d: _ridge(g, d) * (1.1 if d == "fp64" else 1.0))
    _not_attempted(lab02.check_ridge)


# 2.4 -----------------------------------------------------------------------------------------------------------
def _cost(op, shape, d, softmax_flops=5, ln_bytes=(2, 2), vec_streams=3, attn_bytes=(4, 4), elem=None):
    b = B[d] if elem is None else elem
    if op == "vector_add":
        (n,) = shape
        return n, vec_streams * n * b
    if op == "gemm":
        m, n, k = shape
        return 2 * m * n * k, (m * k + k * n + m * n) * b
    if op in ("softmax", "layernorm"):
        r, c = shape
        if op == "softmax":
            return softmax_flops * r * c, 2 * r * c * b
        return 8 * r * c, (ln_bytes[0] * r * c + ln_bytes[1] * (r if ln_bytes[1] > 2 else 1) * c) * b
    bsz, h, s, hd = shape
    return bsz * h * (4 * s * s * hd + 5 * s * s), bsz * h * (attn_bytes[0] * s * hd + attn_bytes[1] * s * s) * b


def predictor(op, shape, d, peak, bw, cost=_cost, inverted=False, att="min", ridge="right", seconds="max", **kw):
    """A learner's predictor, right by default; each keyword plants one named mistake."""
    flops, nbytes = cost(op, shape, d, **kw)
    intensity = nbytes / flops if inverted else flops / nbytes
    rate = {"min": min(peak, intensity * bw), "max": max(peak, intensity * bw), "uncapped": intensity * bw,
            "tflops": min(peak, intensity * bw) / 1e12}[att]
    edge = {"right": peak / bw, "inverted": bw / peak, "h100": 295.37}[ridge]
    bound = "memory-bound" if intensity < edge else "compute-bound"
    compute, memory = flops / peak, nbytes / bw
    time = {"max": flops / rate, "min": min(compute, memory), "sum": compute + memory, "ms": flops / rate * 1e3,
            "compute": compute}[seconds]
    return {"flops": flops, "bytes": nbytes, "intensity": intensity, "bound": bound, "attainable": rate,
            "seconds": time}


PREDICTOR_MISTAKES = {  # the planted mistake -> words its verdict must use (ten or more, each named as it is)
    "bytes counted once (softmax)": (dict(cost=lambda o, s, d: _cost(o, s, d) if o != "softmax" else
                                          (5 * s[0] * s[1], s[0] * s[1] * B[d])), "count the matrix once"),
    "softmax without its reductions": (dict(softmax_flops=3), "without its reductions"),
    "vector add: a stream missing": (dict(vec_streams=2), "count two streams"),
    "layernorm without weight and bias": (dict(ln_bytes=(2, 0)), "miss the weight and bias"),
    "attention without the s x s traffic": (dict(attn_bytes=(4, 0)), "without the s x s traffic"),
    "attention with S and P counted once": (dict(attn_bytes=(4, 2)), "written once and read once"),
    "elements, not bytes": (dict(elem=1), "counted in elements"),
    "intensity inverted": (dict(inverted=True), "intensity inverted"),
    "max where min is due (attainable)": (dict(att="max"), "max where min is due"),
    "attainable not capped": (dict(att="uncapped"), "not capped at the peak"),
    "attainable in TFLOP/s": (dict(att="tflops"), "in TFLOP/s"),
    "bound against the inverted ridge": (dict(ridge="inverted"), "wrong ridge, bandwidth / peak"),
    "bound against the H100's ridge": (dict(ridge="h100"), "H100's bf16 ridge"),
    "min where max is due (time)": (dict(seconds="min"), "min where max is due"),
    "compute and memory time added": (dict(seconds="sum"), "added the compute time and the memory time"),
    "milliseconds, not seconds": (dict(seconds="ms"), "milliseconds"),
    "compute time alone": (dict(seconds="compute"), "compute peak alone"),
}


def test_roofline_predictor_right():
    assert lab02.check_roofline_predictor(predictor).passed
    # a Cost-like pair and numpy numbers are fine too
    assert lab02.check_roofline_predictor(lambda *a: {k: (float(v) if k != "bound" else v)
                                                      for k, v in predictor(*a).items()}).passed


@pytest.mark.parametrize("mistake", sorted(PREDICTOR_MISTAKES))
def test_roofline_predictor_mistakes_named(mistake):
    planted, words = PREDICTOR_MISTAKES[mistake]
    for seed in (1, 2, 3):
        with pytest.raises(CheckFailed, match=words):
            lab02.check_roofline_predictor(lambda *a: predictor(*a, **planted), seed=seed)


def test_roofline_predictor_shape_of_the_answer():
    with pytest.raises(CheckFailed, match="return a dict with the keys"):
        lab02.check_roofline_predictor(lambda *a: tuple(predictor(*a).values()))
    with pytest.raises(CheckFailed, match="without 'seconds'"):
        lab02.check_roofline_predictor(lambda *a: {k: v for k, v in predictor(*a).items() if k != "seconds"})
    with pytest.raises(CheckFailed, match="return one of 'memory-bound', 'compute-bound'"):
        lab02.check_roofline_predictor(lambda *a: dict(predictor(*a), bound="memory"))
    with pytest.raises(CheckFailed, match="should return a dict.*raised KeyError"):
        lab02.check_roofline_predictor(lambda op, *a: predictor(op, *a) if op != "attention" else {}["flops"])
    _not_attempted(lab02.check_roofline_predictor)


def test_roofline_predictor_learners_warmups_propagate():
    """The predictor may call the learner's own gemm_cost (2.1): a GEMM mistake there is named here too."""
    def gemm_wrong(op, shape, d):
        return (shape[0] * shape[1] * shape[2], _cost(op, shape, d)[1]) if op == "gemm" else _cost(op, shape, d)
    with pytest.raises(CheckFailed, match="counts multiply-adds"):
        lab02.check_roofline_predictor(lambda *a: predictor(*a, cost=gemm_wrong))


# 2.5 -----------------------------------------------------------------------------------------------------------
def _critical(g, d, k, n, sparse=False):
    r = _ridge(g, d, sparse)
    b = B[d]
    return math.ceil(r * b * k * n / (2 * k * n - r * b * (k + n)))


def _scan(g, d, k, n):
    r, batch = _ridge(g, d), 1
    while 2 * batch * k * n / (B[d] * (batch * k + k * n + batch * n)) < r:
        batch += 1
    return batch


def test_critical_batch():
    assert lab02.check_critical_batch(_critical).passed
    assert lab02.check_critical_batch(_scan).passed  # a plain search is right too
    with pytest.raises(CheckFailed, match="one short"):
        lab02.check_critical_batch(lambda g, d, k, n: _critical(g, d, k, n) - 1)
    with pytest.raises(CheckFailed, match="weights-only estimate"):
        lab02.check_critical_batch(lambda g, d, k, n: math.ceil(_ridge(g, d) * B[d] / 2))
    with pytest.raises(CheckFailed, match="sparse"):
        lab02.check_critical_batch(lambda g, d, k, n: _critical(g, d, k, n, sparse=True))
    with pytest.raises(CheckFailed, match="whole number"):
        lab02.check_critical_batch(lambda g, d, k, n: _critical(g, d, k, n) - 0.5)
    with pytest.raises(CheckFailed, match="expected"):
        lab02.check_critical_batch(lambda g, d, k, n: _critical(g, d, k, n) + 7)
    _not_attempted(lab02.check_critical_batch)


# issue 12 classes ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("check,fn", [
    (lab02.check_gemm_cost, lambda T: lambda m, n, k, d: (2 * m * n * k, (m * k + k * n + m * n) * T[d])),
    (lab02.check_attention_cost, lambda T: lambda b, h, s, hd, d: (
        b * h * (4 * s * s * hd + 5 * s * s), b * h * (4 * s * hd + 4 * s * s) * T[d])),
])
@pytest.mark.parametrize("dtype", ["fp8", "fp64"])
def test_wrong_byte_size_fails_every_call(check, fn, dtype):
    """Class 1: a wrong size for any one dtype fails on every call (fixed cases), and the verdict names it."""
    table = dict(B, **{dtype: 2})
    for _ in range(3):
        with pytest.raises(CheckFailed, match=f"{dtype}.*use 2 bytes per element; {dtype} has {B[dtype]}"):
            check(fn(table))


def test_gemm_dimension_mixup_named():
    """Classes 2 and 5: asymmetric shapes expose a dimension used twice; the seed is printed."""
    with pytest.raises(CheckFailed, match=r"one dimension is used twice.*seed \d+"):
        lab02.check_gemm_cost(lambda m, n, k, d: (2 * m * n * n, (m * k + k * n + m * n) * B[d]))


def test_learner_crash_names_the_call():
    """Class 6."""
    with pytest.raises(CheckFailed, match=r"gemm_cost\(3, 5, 7, 'fp32'\) should return a pair \(flops, bytes\); "
                                          r"your code raised KeyError"):
        lab02.check_gemm_cost(lambda m, n, k, d: (2 * m * n * k, {"bf16": 2}[d]))
    with pytest.raises(CheckFailed, match=r"ridge\('H100-SXM', 'bf16'\) returned str"):
        lab02.check_ridge(lambda g, d: "295")


def _own_ridge(g, d):
    return hardware.peak_tflops(g, d) / hardware.gpu(g).hbm_bandwidth_tbs


def _crit(g, d, k, n, nbytes):
    target, batch = _own_ridge(g, d), 1
    while 2 * batch * k * n / (nbytes * (batch * k + k * n + batch * n)) < target:
        batch += 1
    return batch


def test_ridge_aliases_named():
    """Class 5: H100 bf16 with the sparse rate equals the fp8 dense ridge: both are named; a wrong dtype is named."""
    with pytest.raises(CheckFailed, match="sparse .*or it uses the fp8 rate"):
        lab02.check_ridge(lambda g, d: 2 * _own_ridge(g, d) if hardware.gpu(g).tflops[d]["sparse"] else _own_ridge(g, d))
    with pytest.raises(CheckFailed, match="that is the bf16 ridge"):
        lab02.check_ridge(lambda g, d: _own_ridge(g, "bf16" if "bf16" in hardware.supported_dtypes(g) else d))


def test_critical_batch_fixed_fp8_case():
    """Class 1: a byte size of 2 for every dtype fails on every call (an fp8 case is fixed)."""
    def bf16_bytes(g, d, k, n):
        return _crit(g, d, k, n, 2)
    for _ in range(3):
        with pytest.raises(CheckFailed, match="counts 2 bytes per element; fp8 has 1"):
            lab02.check_critical_batch(bf16_bytes)
    assert lab02.check_critical_batch(lambda g, d, k, n: float(_crit(g, d, k, n, B[d]))).passed


def test_calling_the_reference_is_caught():
    """Issue 12: where the exercise is to write it, calling common's reference is named."""
    with pytest.raises(CheckFailed, match="called common.kernels.roofline.gemm_cost, the reference this exercise"):
        lab02.check_gemm_cost(lambda m, n, k, d: tuple(rl.gemm_cost(m, n, k, d)))
    with pytest.raises(CheckFailed, match="called common.facts.hardware.ridge_point"):
        lab02.check_ridge(lambda g, d: hardware.ridge_point(g, d))
    with pytest.raises(CheckFailed, match="called common.kernels.roofline.Roof.datasheet, the workbook's own code"):
        lab02.check_critical_batch(lambda g, d, k, n: rl.Roof.datasheet(g, d).critical_batch(k, n, d))
    with pytest.raises(CheckFailed, match="called common.kernels.roofline.predict_op"):
        lab02.check_roofline_predictor(rl.predict_op)
    with pytest.raises(CheckFailed, match="called common.kernels.roofline.op_cost"):
        lab02.check_roofline_predictor(lambda op, sh, d, p, b: predictor(op, sh, d, p, b, cost=rl.op_cost))
