"""Lab 10 checkers: right answers pass, each classic mistake fails with a telling message, stubs are not attempted."""
import math

import pytest

from common.core.checks import CheckFailed
from common.exercises.lab10 import (
    check_adam_state,
    check_cost_model,
    check_gpus_to_hold,
    check_implied_mfu,
    check_train_flops,
    check_training_days,
)
from common.facts import hardware
from common.systems.cluster import cost
from test_wrong_answers import run_named


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


def test_the_two_missed_verdicts_name_their_mistakes():
    """86,400 (a day) for 3,600 (an hour) in the MFU, and a missing master copy, are named (issue 42)."""
    with pytest.raises(CheckFailed, match=r"86,400, the seconds in a DAY"):
        check_implied_mfu(lambda f, h, g, d: f / (h * 86400) / (hardware.peak_tflops(g, d) * 1e12))
    with pytest.raises(CheckFailed, match=r"master copy of the weights is missing"):
        check_adam_state(lambda n: {**right_adam(n), "master": 0})


# ---- 10.6, the build exercise
def right_cost(model, run):
    """The lab's solution, as a learner writes it."""
    attention = 3 * model["layers"] * model["heads"] * (model["qk_head_dim"] + model["v_head_dim"]) * run["seq_len"]
    per_token = 6 * model["active_params"] + attention
    hours = per_token * run["tokens"] / (hardware.peak_tflops(run["gpu_id"], run["dtype"]) * 1e12 * run["mfu"]) / 3600
    tp, pp, ep, zero = run["tp"], run["pp"], run["ep"], run["zero"]
    dp = run["gpus"] // (tp * pp)
    dense = (model["params"] - model["expert_params"]) / (tp * pp)
    experts = model["expert_params"] / (tp * pp * ep)

    def gb(b, sharded):
        return b * (dense / dp + experts / (dp // ep) if sharded else dense + experts) / 1e9
    act = (2 if run["recompute"] else 34) * model["hidden"]
    return {"flops_per_token": per_token, "flops": per_token * run["tokens"], "gpu_hours": hours,
            "days": hours / run["gpus"] / 24, "cost_usd": hours * run["usd_per_gpu_hour"],
            "weights_gb": gb(2, zero >= 3), "grads_gb": gb(2, zero >= 2), "optimizer_gb": gb(12, zero >= 1),
            "activations_gb": run["micro_batch_seqs"] * run["seq_len"] * model["layers"] * act / tp / 1e9}


def wrong_cost(**change):
    """right_cost with one of its figures replaced by change[key](model, run, right result)."""
    def fn(model, run):
        out = right_cost(model, run)
        for key, f in change.items():
            out[key] = f(model, run, out)
        return out
    return fn


def _attn(m, r):
    """Attention's training FLOPs per token, as a learner writes them (the workbook's helper is refused)."""
    return 3 * m["layers"] * m["heads"] * (m["qk_head_dim"] + m["v_head_dim"]) * r["seq_len"]


def _gb(m, r, b, sharded, ep=None, replicas=None):
    dp = r["gpus"] // (r["tp"] * r["pp"])
    ep = r["ep"] if ep is None else ep
    dense = (m["params"] - m["expert_params"]) / (r["tp"] * r["pp"])
    experts = m["expert_params"] / (r["tp"] * r["pp"] * ep)
    return b * (dense / dp + experts / (replicas or dp // r["ep"]) if sharded else dense + experts) / 1e9


COST_MISTAKES = [  # (the wrong answer, the words that must name it): at least ten, as issue 42 asks
    (wrong_cost(flops_per_token=lambda m, r, o: 6 * m["params"] + _attn(m, r)), r"TOTAL parameters"),
    (wrong_cost(flops_per_token=lambda m, r, o: 6 * m["active_params"]), r"attention's score and value products"),
    (wrong_cost(flops_per_token=lambda m, r, o: 6 * m["active_params"] + 2 * _attn(m, r)), r"causal mask"),
    (wrong_cost(gpu_hours=lambda m, r, o: o["gpu_hours"] / 2), r"sparse \(2:4\)"),
    (wrong_cost(gpu_hours=lambda m, r, o: o["gpu_hours"] / 24), r"86,400 s \(a day\)"),
    (wrong_cost(gpu_hours=lambda m, r, o: o["gpu_hours"] * r["mfu"] ** 2), r"multiplied by the MFU"),
    (wrong_cost(days=lambda m, r, o: o["gpu_hours"] / 24), r"GPU-days"),
    (wrong_cost(cost_usd=lambda m, r, o: o["days"] * r["usd_per_gpu_hour"]), r"per GPU-HOUR times days"),
    (wrong_cost(optimizer_gb=lambda m, r, o: o["optimizer_gb"] * 8 / 12), r"THREE FP32 values"),
    (wrong_cost(optimizer_gb=lambda m, r, o: o["optimizer_gb"] * 16 / 12), r"counts the BF16 weights and gradients"),
    (wrong_cost(optimizer_gb=lambda m, r, o: _gb(m, r, 12, False)), r"ZeRO-1 \(and above\) shards the optimizer"),
    (wrong_cost(grads_gb=lambda m, r, o: _gb(m, r, 2, r["zero"] >= 1)), r"gradients from stage 2"),
    (wrong_cost(weights_gb=lambda m, r, o: _gb(m, r, 2, r["zero"] >= 1)), r"weights only at stage 3"),
    (wrong_cost(optimizer_gb=lambda m, r, o: _gb(m, r, 12, r["zero"] >= 1, ep=1, replicas=r["gpus"] // (
        r["tp"] * r["pp"]))), r"not split by EP"),
    (wrong_cost(activations_gb=lambda m, r, o: o["activations_gb"] * (17 if r["recompute"] else 1)),
     r"recomputation keeps only each layer's BF16 input"),
    (wrong_cost(activations_gb=lambda m, r, o: o["activations_gb"] * r["tp"]), r"divide by tp"),
]


def test_cost_model_right_and_stub():
    for seed in range(5):
        assert check_cost_model(right_cost, seed=seed).passed
    assert check_cost_model(stub).status == "not attempted"


@pytest.mark.parametrize("wrong, match", COST_MISTAKES, ids=[m for _, m in COST_MISTAKES])
def test_cost_model_wrong_answers_are_named(wrong, match):
    run_named(check_cost_model, wrong, match, seeds=(0, 1))


def test_cost_model_shape_errors_and_reference():
    with pytest.raises(CheckFailed, match=r"returned list"):
        check_cost_model(lambda m, r: list(right_cost(m, r).values()))
    with pytest.raises(CheckFailed, match=r"has no 'activations_gb'"):
        check_cost_model(lambda m, r: {k: v for k, v in right_cost(m, r).items() if k != "activations_gb"})
    with pytest.raises(CheckFailed, match=r"called common.systems.cluster.cost.cost_model"):
        check_cost_model(lambda m, r: cost.cost_model(m, r))
