"""Named wrong answers for lab 00: the ceilings (0.3, three functions judged together) and the matmul time
prediction (0.4). The mistakes of 0.3 are the lab test's CEILING_MISTAKES, each one function of the three wrong."""
from common.core import ceilings
from common.exercises import lab00
from common.kernels import roofline
from test_exercises_lab00 import CEILING_MISTAKES, RIGHT, RIGHT_HARNESS


def check_ceilings(fns, seed=None):
    """0.3 on a triple (best_seconds_per_call, copy_ceiling, matmul_ceiling): the audit passes one wrong answer."""
    return lab00.check_ceilings(*fns, seed=seed)


check_ceilings.exercise = "0.3"


def _copy_by_reference(nbytes, device, sync, min_time):
    c = ceilings.measure_copy_bandwidth(nbytes, device, min_run_time=0.001)
    return {"gbps": c.value, "threads": 1}


def _mem(m, n, k, b, bw, c=1):
    return (m * k + k * n + c * m * n) * b / bw


WRONG = {
    check_ceilings: [(fns, words) for _, fns, words in CEILING_MISTAKES] + [
        ((RIGHT_HARNESS, _copy_by_reference, RIGHT[2]), "called common.core.ceilings.measure_copy_bandwidth"),
    ],
    lab00.check_predict_matmul_seconds: [
        (lambda m, n, k, b, f, bw: min(2 * m * n * k / f, _mem(m, n, k, b, bw)), "smaller of compute"),
        (lambda m, n, k, b, f, bw: _mem(m, n, k, b, bw), "memory time alone"),
        (lambda m, n, k, b, f, bw: max(2 * m * n * k / f, _mem(m, n, k, 2, bw)), "ignore bytes_per_element"),
        (lambda m, n, k, b, f, bw: max(2 * m * n * k / f, _mem(m, n, k, 1, bw)), "counts elements, not bytes"),
        (lambda m, n, k, b, f, bw: max(m * n * k / f, _mem(m, n, k, b, bw)), "count multiply-adds"),
        (lambda m, n, k, b, f, bw: 1e3 * max(2 * m * n * k / f, _mem(m, n, k, b, bw)), "that is milliseconds"),
        (lambda m, n, k, b, f, bw: max(2 * m * n * k / bw, _mem(m, n, k, b, f)), "rates are swapped"),
        (lambda m, n, k, b, f, bw: max(2 * m * n * k / f, _mem(m, n, k, b, bw, c=2)), "count C twice"),
        (lambda m, n, k, b, f, bw: max(2 * m * n * k / f, 8 * _mem(m, n, k, b, bw)), "in bits"),
        (lambda m, n, k, b, f, bw: max(2 * m * m * k / f, _mem(m, n, k, b, bw)), "one dimension is used twice"),
        (lambda m, n, k, b, f, bw: roofline.predict_op("gemm", (m, n, k), {1: "fp8", 2: "bf16", 4: "fp32"}[b], f,
                                                       bw)["seconds"], "called common.kernels.roofline"),
        (lambda m, n, k, b, f, bw: max(ceilings.matmul_flops(m, n, k) / f, _mem(m, n, k, b, bw)),
         "called common.core.ceilings.matmul_flops"),
    ],
}
