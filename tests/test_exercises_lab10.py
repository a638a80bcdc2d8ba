"""Lab 10 checkers: right answers pass, each classic mistake fails with a telling message, stubs are not attempted."""
import math

import pytest

from common.core.checks import CheckFailed
from common.exercises.lab10 import (
    check_adam_state,
    check_gpus_to_hold,
    check_implied_mfu,
    check_train_flops,
    check_training_days,
)
from common.facts import hardware


def stub(*args, **kwargs):
    raise NotImplementedError("Exercise: replace this line with your code")


# ---- 10.1
def test_train_flops():
    assert check_train_flops(lambda n, d: 6 * n * d).passed
    assert check_train_flops(stub).status == "not attempted"


@pytest.mark.parametrize("wrong, match", [
    (lambda n, d: 2 * n * d, r"forward pass only"),
    (lambda n, d: n * d, r"forgets the factor 6"),
    (lambda n, d: 8 * n * d, r"recomputation"),
    (lambda n, d: 6 * n * d * 1.01, r"expected"),
])
def test_train_flops_wrong(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        check_train_flops(wrong)


# ---- 10.2
def right_mfu(flops, hours, gpu, dtype):
    return flops / (hours * 3600) / (hardware.peak_tflops(gpu, dtype) * 1e12)


def test_implied_mfu():
    assert check_implied_mfu(right_mfu).passed
    assert check_implied_mfu(stub).status == "not attempted"


@pytest.mark.parametrize("wrong, match", [
    (lambda f, h, g, d: f / h / (hardware.peak_tflops(g, d) * 1e12), r"x 3600"),
    (lambda f, h, g, d: 100 * right_mfu(f, h, g, d), r"percentage"),
    (lambda f, h, g, d: f / (h * 3600) / (hardware.peak_tflops(g, d, sparse=True) * 1e12), r"sparse"),
    (lambda f, h, g, d: f / (h * 3600) / hardware.peak_tflops(g, d), r"unit slip"),
])
def test_implied_mfu_wrong(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        check_implied_mfu(wrong)


# ---- 10.3
def right_adam(n):
    return {"weights": 2 * n, "grads": 2 * n, "master": 4 * n, "adam_m": 4 * n, "adam_v": 4 * n}


def test_adam_state():
    assert check_adam_state(right_adam).passed
    assert check_adam_state(lambda n: {**right_adam(n), "total": 16 * n}).passed
    assert check_adam_state(stub).status == "not attempted"


@pytest.mark.parametrize("wrong, match", [
    (lambda n: {**right_adam(n), "master": 2 * n}, r"FP32 \(4 bytes\)"),
    (lambda n: {**right_adam(n), "adam_m": 2 * n}, r"first moment is FP32"),
    (lambda n: {k: v for k, v in right_adam(n).items() if k != "master"}, r"keys"),
    (lambda n: 16 * n, r"return a dict"),
])
def test_adam_state_wrong(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        check_adam_state(wrong)


# ---- 10.4
def right_hold(nbytes, gpu):
    return math.ceil(nbytes / (hardware.gpu(gpu).hbm_gb * 1e9))


def test_gpus_to_hold():
    assert check_gpus_to_hold(right_hold).passed
    assert check_gpus_to_hold(stub).status == "not attempted"


@pytest.mark.parametrize("wrong, match", [
    (lambda b, g: b / (hardware.gpu(g).hbm_gb * 1e9), r"GPUs come whole|rounded down"),
    (lambda b, g: math.floor(b / (hardware.gpu(g).hbm_gb * 1e9)), r"rounded down"),
    (lambda b, g: math.ceil(b / (hardware.gpu(g).hbm_gb * 2**30)), r"GiB"),
])
def test_gpus_to_hold_wrong(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        check_gpus_to_hold(wrong)


# ---- 10.5
def right_days(flops, gpus, gpu, dtype, mfu):
    return flops / (gpus * hardware.peak_tflops(gpu, dtype) * 1e12 * mfu) / 86400


def test_training_days():
    assert check_training_days(right_days).passed
    assert check_training_days(stub).status == "not attempted"


@pytest.mark.parametrize("wrong, match", [
    (lambda f, n, g, d, m: right_days(f, n, g, d, m) * m * m, r"multiplied by the MFU"),
    (lambda f, n, g, d, m: right_days(f, n, g, d, m) * 24, r"hours"),
    (lambda f, n, g, d, m: f / (n * hardware.peak_tflops(g, d, sparse=True) * 1e12 * m) / 86400, r"sparse \(2:4\)"),
    (lambda f, n, g, d, m: right_days(f, n, g, d, m) * n, r"GPU count"),
])
def test_training_days_wrong(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        check_training_days(wrong)


# ---- issue 12: the classes of holes
def test_aliased_peaks_are_named_together():
    # dense FP8 = sparse BF16 on every GPU here: a learner who used either gets both named
    fp8_for_bf16 = lambda f, h, g, d: right_mfu(f, h, g, "fp8" if d == "bf16" else d)  # noqa: E731
    with pytest.raises(CheckFailed, match=r"sparse \(2:4\) BF16 peak or the dense FP8 peak"):
        check_implied_mfu(fp8_for_bf16)


def test_parameters_ignored_are_caught():
    always_bf16 = lambda f, h, g, d: right_mfu(f, h, g, "bf16")  # noqa: E731  (dtype ignored)
    with pytest.raises(CheckFailed, match=r"dense BF16 peak instead of FP8"):
        check_implied_mfu(always_bf16)
    always_h800 = lambda f, h, g, d: right_mfu(f, h, "H800-SXM", d)  # noqa: E731  (gpu ignored)
    with pytest.raises(CheckFailed, match=r"H800-SXM's peak"):
        check_implied_mfu(always_h800)
    with pytest.raises(CheckFailed, match=r"HBM of gpu_id"):
        check_gpus_to_hold(lambda b, g: right_hold(b, "H100-SXM"))
    with pytest.raises(CheckFailed, match=r"MFU is missing"):
        check_training_days(lambda f, n, g, d, m: right_days(f, n, g, d, 1.0))
    # fp4 has a fixed case: a peak table without fp4 fails on every call, not one in four
    def no_fp4(f, n, g, d, m):
        return right_days(f, n, g, "fp8" if d == "fp4" else d, m)
    for _ in range(3):
        with pytest.raises(CheckFailed, match=r"FP4"):
            check_training_days(no_fp4)


def test_more_mistakes_named_by_their_formula():
    with pytest.raises(CheckFailed, match=r"one FLOP per multiply-add"):
        check_train_flops(lambda n, d: 3 * n * d)
    with pytest.raises(CheckFailed, match=r"weights the model computes with are BF16"):
        check_adam_state(lambda n: {**right_adam(n), "weights": 4 * n})
    with pytest.raises(CheckFailed, match=r"one GPU too many"):
        check_gpus_to_hold(lambda b, g: int(b // (hardware.gpu(g).hbm_gb * 1e9)) + 1)
    with pytest.raises(CheckFailed, match=r"that is seconds"):
        check_training_days(lambda *a: right_days(*a) * 86400)


def test_learner_errors_and_wrong_types_are_verdicts():
    with pytest.raises(CheckFailed, match=r"train_flops\(3.7e\+10, 1.48e\+13\): your code raised RuntimeError"):
        check_train_flops(lambda n, d: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(CheckFailed, match=r"returned str .*expected a fraction"):
        check_implied_mfu(lambda *a: "0.3")
    with pytest.raises(CheckFailed, match=r"\['master'\] returned list"):
        check_adam_state(lambda n: {**right_adam(n), "master": [4 * n]})
    with pytest.raises(CheckFailed, match=r"seed \d+"):
        check_training_days(lambda *a: right_days(*a) * 1.01)


def test_calling_the_reference_is_caught():
    from common.systems.cluster import scaling
    with pytest.raises(CheckFailed, match="called common.systems.cluster.scaling.train_flops"):
        check_train_flops(lambda n, d: scaling.train_flops(n, d))
    with pytest.raises(CheckFailed, match="called common.systems.cluster.scaling.gpu_hours"):
        check_training_days(lambda f, n, g, d, m: scaling.gpu_hours(f, g, m, d) / n / 24)
