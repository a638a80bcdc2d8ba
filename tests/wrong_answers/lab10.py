"""Lab 10's named wrong answers (issue 46): for 10.2, 10.3, 10.5 and 10.6, beyond the three of each in
test_wrong_answers.py -- peak look-ups of the wrong GPU or dtype, unit slips (minutes, years, bits, a factor of 1000),
a formula upside down, and cheats that call the workbook's own scaling and cost code."""
from common.exercises import lab10
from common.facts import hardware
from common.systems.cluster import cost, scaling
from test_exercises_lab10 import COST_MISTAKES, right_adam, right_cost, right_days, right_mfu


def _peak(g, d, sparse=False):
    return hardware.peak_tflops(g, d, sparse=sparse) * 1e12


WRONG = {
    lab10.check_implied_mfu: [
        (lambda f, h, g, d: f / (h * 86400) / _peak(g, d), "86,400, the seconds in a DAY"),
        (lambda f, h, g, d: right_mfu(f, h, "H800-SXM", d), "H800-SXM's peak"),
        (lambda f, h, g, d: right_mfu(f, h, g, "bf16"), "dense BF16 peak instead of"),
        (lambda f, h, g, d: f / (h * 3600) / hardware.peak_tflops(g, d), "unit slip"),
        (lambda f, h, g, d: _peak(g, d) * h * 3600 / f, "upside down"),
        (lambda f, h, g, d: f / (h * 60) / _peak(g, d), "not 60"),
        (lambda f, h, g, d: f / (h * 3600) / (hardware.peak_tflops(g, d) * 1e15), "factor of 1000"),
        (lambda f, h, g, d: scaling.implied_mfu(f, h, scaling.peak_tflops(g, d)),
         "called common.systems.cluster.scaling.implied_mfu, the reference"),
        (lambda f, h, g, d: f / scaling.gpu_hours(1.0, g, 1.0, d) / 3600 / h * 3600,
         "called common.systems.cluster.scaling.gpu_hours, the workbook's own code"),
    ],
    lab10.check_adam_state: [
        (lambda n: {**right_adam(n), "adam_m": 2 * n}, "first moment is FP32"),
        (lambda n: {**right_adam(n), "adam_v": 2 * n}, "second moment is FP32"),
        (lambda n: {**right_adam(n), "grads": 4 * n}, "gradients are BF16"),
        (lambda n: {**right_adam(n), "master": 0}, "master copy of the weights is missing"),
        (lambda n: {**right_adam(n), "adam_v": 0}, "second moment .* is missing"),
        (lambda n: {k: v for k, v in right_adam(n).items() if k != "master"}, "keys of the result"),
        (lambda n: 16 * n, "return a dict"),
        (lambda n: {k: 8 * v for k, v in right_adam(n).items()}, "that is bits"),
        (lambda n: {**right_adam(n), "total": 12 * n}, "\\['total'\\]"),
        (lambda n: scaling.adam_state_bytes(n), "called common.systems.cluster.scaling.adam_state_bytes"),
    ],
    lab10.check_training_days: [
        (lambda f, n, g, d, m: right_days(f, n, g, d, m) * 86400, "that is seconds"),
        (lambda f, n, g, d, m: right_days(f, n, g, d, 1.0), "MFU is missing"),
        (lambda f, n, g, d, m: f / (n * _peak(g, d, sparse=True) * m) / 86400, "sparse \\(2:4\\)"),
        (lambda f, n, g, d, m: right_days(f, n, g, "fp8" if d == "bf16" else d, m), "peak instead of BF16"),
        (lambda f, n, g, d, m: right_days(f, n, "GB200", d, m), "the GB200's peak"),
        (lambda f, n, g, d, m: right_days(f, n, g, d, m) / 365, "that is years"),
        (lambda f, n, g, d, m: right_days(f, n, g, d, m) / 7, "that is weeks"),
        (lambda f, n, g, d, m: right_days(f, n, g, d, m / 100), "already a fraction"),
        (lambda f, n, g, d, m: scaling.gpu_hours(f, g, m, d) / n / 24,
         "called common.systems.cluster.scaling.gpu_hours, the reference"),
        (lambda f, n, g, d, m: scaling.wall_days(f / (_peak(g, d) * m) / 3600, n),
         "called common.systems.cluster.scaling.wall_days, the workbook's own code"),
    ],
    lab10.check_cost_model: [(wrong, words) for wrong, words in COST_MISTAKES] + [
        (lambda m, r: {**right_cost(m, r), "flops_per_token": 6 * m["active_params"]
                       + cost.attention_flops_per_token(m, r["seq_len"])},
         "called common.systems.cluster.cost.attention_flops_per_token, the workbook's own code"),
        (lambda m, r: {**right_cost(m, r), "days": right_cost(m, r)["gpu_hours"] / r["gpus"] / 24
                       + 0 * cost.data_parallel(r)}, "called common.systems.cluster.cost.data_parallel"),
        (lambda m, r: cost.cost_model(m, r), "called common.systems.cluster.cost.cost_model, the reference"),
    ],
}
