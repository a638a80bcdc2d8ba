"""Named wrong answers for lab 02: naive attention's cost (2.2), the ridge point (2.3), the roofline predictor (2.4,
the lab test's PREDICTOR_MISTAKES) and the critical batch of a decode matmul (2.5). The first three of 2.2, 2.3 and
2.5 are in tests/test_wrong_answers.py."""
import math

from common.exercises import lab02
from common.facts import hardware
from common.kernels import roofline
from test_exercises_lab02 import PREDICTOR_MISTAKES, predictor

B = {"fp64": 8, "fp32": 4, "bf16": 2, "fp8": 1}


def _attn(b, h, s, d, dt, flops=(4, 5), nbytes=(4, 4), heads=True, batch=True, elem=None):
    bh = (b if batch else 1) * (h if heads else 1)
    size = B[dt] if elem is None else elem
    return bh * (flops[0] * s * s * d + flops[1] * s * s), bh * (nbytes[0] * s * d + nbytes[1] * s * s) * size


def _ridge(g, d, peak_scale=1.0, bw_scale=1.0):
    return hardware.peak_tflops(g, d) * 1e12 * peak_scale / (hardware.gpu(g).hbm_bandwidth_tbs * 1e12 * bw_scale)


def _critical(g, d, k, n, intensity=None, size=None, ridge=None, extra=0):
    target = hardware.ridge_point(g, d) if ridge is None else ridge
    b_, size = 1, B[d] if size is None else size
    intensity = intensity or (lambda x: 2 * x * k * n / (size * (x * k + k * n + x * n)))
    while intensity(b_) < target:
        b_ += 1
    return b_ + extra


def _other_ridge(g, d):
    others = [x for x in ("bf16", "fp8", "fp16", "fp32") if x != d and x in hardware.supported_dtypes(g)]
    return hardware.ridge_point(g, others[0])


WRONG = {
    lab02.check_attention_cost: [
        (lambda *a: _attn(*a, flops=(4, 0)), "miss the softmax"),
        (lambda *a: _attn(*a, flops=(2, 5)), "2\\*s\\*s\\*d FLOPs each"),
        (lambda *a: _attn(*a, elem=1), "counted in elements"),
        (lambda *a: _attn(*a, elem=2), "bytes per element"),
        (lambda *a: _attn(*a, heads=False), "batch only"),
        (lambda *a: _attn(*a, batch=False), "heads only"),
        (lambda *a: _attn(*a, nbytes=(3, 4)), "miss writing O"),
        (lambda *a: roofline.attention_cost(*a), "called common.kernels.roofline.attention_cost, the reference"),
        (lambda b, h, s, d, dt: tuple(roofline.op_cost("attention", (b, h, s, d), dt)),
         "called common.kernels.roofline.op_cost, the workbook's own code"),
    ],
    lab02.check_ridge: [
        (lambda g, d: 1 / _ridge(g, d), "inverted"),
        (lambda g, d: _ridge(g, d, bw_scale=8), "in bits"),
        (lambda g, d: _ridge(g, d, bw_scale=2**40 / 1e12), "TiB/s"),
        (lambda g, d: hardware.peak_tflops(g, d) * 1e12 / (hardware.gpu(g).nvlink_gbs * 1e9), "NVLink bandwidth"),
        (lambda g, d: float(round(_ridge(g, d))), "rounded to a whole number"),
        (lambda g, d: _ridge(g, d, peak_scale=1e-3), "GFLOP/s over TB/s"),
        (lambda g, d: _ridge(g, d, peak_scale=1e-12), "TFLOPS in FLOP/s over TB/s"),
        (lambda g, d: hardware.ridge_point(g, d), "called common.facts.hardware.ridge_point, the reference"),
        (lambda g, d: roofline.Roof.datasheet(g, d).ridge, "called common.kernels.roofline.Roof.datasheet"),
    ],
    lab02.check_roofline_predictor: [
        ((lambda *a, _p=planted: predictor(*a, **_p)), words) for planted, words in PREDICTOR_MISTAKES.values()] + [
        (lambda *a: roofline.predict_op(*a), "called common.kernels.roofline.predict_op, the reference"),
        (lambda op, shape, d, peak, bw: dict(predictor(op, shape, d, peak, bw),
                                             flops=roofline.op_cost(op, shape, d).flops),
         "called common.kernels.roofline.op_cost"),
    ],
    lab02.check_critical_batch: [
        (lambda g, d, k, n: _critical(g, d, k, n, extra=1), "one past"),
        (lambda g, d, k, n: _critical(g, d, k, n, size=2), "counts 2 bytes per element"),
        (lambda g, d, k, n: _critical(g, d, k, n, intensity=lambda x: 2 * x * k * n / (B[d] * (x * k + k * n))),
         "miss writing the output"),
        (lambda g, d, k, n: _critical(g, d, k, n, intensity=lambda x: x * k * n / (B[d] * (x * k + k * n + x * n))),
         "count multiply-adds"),
        (lambda g, d, k, n: _critical(g, d, k, n, ridge=_other_ridge(g, d)), "ridge \\(.*\\); a .* matmul is held"),
        (lambda g, d, k, n: float(math.ceil(_critical(g, d, k, n)) - 0.5), "a batch is a whole number"),
        (lambda g, d, k, n: roofline.critical_batch(hardware.peak_tflops(g, d) * 1e12,
                                                    hardware.gpu(g).hbm_bandwidth_tbs * 1e12, k, n, d),
         "called common.kernels.roofline.critical_batch, the reference"),
        (lambda g, d, k, n: _critical(g, d, k, n, intensity=lambda x: roofline.decode_gemm_intensity(x, k, n, d)),
         "called common.kernels.roofline.decode_gemm_intensity"),
    ],
}
