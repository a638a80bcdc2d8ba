"""For each checker, its three most likely wrong answers (as a learner would write them), and the words its verdict
must use to name each one as it is -- not a nearby mistake. Labs 00-05 and 09-10 here; labs 06-08 and 11-13 in
test_wrong_answers_late.py. (Exercises whose lab test file already holds three or more named mistakes -- 0.3, 1.1-1.3,
2.4, 3.1-3.3, 4.2-4.8, 5.2, 5.8 -- are counted by test_every_checker_has_three_named_mistakes.)

Each wrong answer runs on three seeds: a mistake must be named whatever the random cases are.
"""
import math

import pytest

from common.core.checks import CheckFailed
from test_exercises_lab05 import fp8_linear
from common.exercises import lab00, lab02, lab04, lab05, lab09, lab10
from common.facts import hardware
from common.systems.cluster import scaling

B = {"fp64": 8, "fp32": 4, "bf16": 2, "fp8": 1, "fp4": 0.5}
DT = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "int8": 1}


def _peak(g, d):
    return hardware.peak_tflops(g, d) * 1e12


def _bw(g):
    return hardware.gpu(g).hbm_bandwidth_tbs * 1e12


def _ridge_sparse(g, d):
    sparse = hardware.gpu(g).tflops[d]["sparse"] or hardware.gpu(g).tflops[d]["dense"]
    return sparse * 1e12 / _bw(g)


def _critical(g, d, k, n, peak=None):
    peak = peak or _peak(g, d)
    ridge = peak / _bw(g)
    b = 1
    while 2 * b * k * n / (B[d] * (b * k + k * n + b * n)) < ridge:
        b += 1
    return b


def _weights_only(g, d, k, n):
    return math.ceil(_peak(g, d) / _bw(g) * B[d] / 2)


WRONG = {
    # ------------------------------------------------------------------------------------------- lab 00
    lab00.check_copy_bytes: [
        (lambda n, d: n * DT[d], "counts only the read"),
        (lambda n, d: 2 * n, "counts elements"),
        (lambda n, d: 16 * n * DT[d], "counts bits"),
    ],
    lab00.check_matmul_flops: [
        (lambda m, n, k: m * n * k, "counts multiply-adds"),
        (lambda m, n, k: 2 * m * n * n, "one dimension is used twice"),
        (lambda m, n, k: 2 * m * k * k, "one dimension is used twice"),
    ],
    lab00.check_predict_matmul_seconds: [
        (lambda m, n, k, b, f, bw: 2 * m * n * k / f + (m * k + k * n + m * n) * b / bw, "added compute time and "
                                                                                      "memory time"),
        (lambda m, n, k, b, f, bw: 2 * m * n * k / f, "compute time alone"),
        (lambda m, n, k, b, f, bw: max(2 * m * n * k / f, (m * k + k * n) * b / bw), "miss writing C"),
    ],
    # ------------------------------------------------------------------------------------------- lab 02
    lab02.check_gemm_cost: [
        (lambda m, n, k, d: (m * n * k, (m * k + k * n + m * n) * B[d]), "counts multiply-adds"),
        (lambda m, n, k, d: (2 * m * n * k, (m * k + k * n) * B[d]), "miss writing C"),
        (lambda m, n, k, d: (2 * m * n * k, (m * k + k * n + m * n) * 2), "bytes per element|bytes use"),
    ],
    lab02.check_attention_cost: [
        (lambda b, h, s, d_, d: (b * h * (4 * s * s * d_ + 5 * s * s), b * h * 4 * s * d_ * B[d]),
         "FlashAttention's bytes"),
        (lambda b, h, s, d_, d: (b * h * (4 * s * s * d_ + 5 * s * s), b * h * (4 * s * d_ + 2 * s * s) * B[d]),
         "count S and P once each"),
        (lambda b, h, s, d_, d: (4 * s * s * d_ + 5 * s * s, (4 * s * d_ + 4 * s * s) * B[d]),
         "one \\(batch, head\\)"),
    ],
    lab02.check_ridge: [
        (_ridge_sparse, "sparse"),
        (lambda g, d: _peak(g, d) / 1e12 / (_bw(g) / 1e9), "units mixed up"),
        (lambda g, d: _peak(g, "bf16") / _bw(g) if "bf16" in hardware.supported_dtypes(g) else 0.0,
         "that is the bf16 ridge"),
    ],
    lab02.check_critical_batch: [
        (lambda g, d, k, n: _critical(g, d, k, n) - 1, "one short"),
        (_weights_only, "weights-only estimate"),
        (lambda g, d, k, n: _critical(g, d, k, n, (hardware.gpu(g).tflops[d]["sparse"] or
                                                  hardware.gpu(g).tflops[d]["dense"]) * 1e12), "sparse"),
    ],
    # ------------------------------------------------------------------------------------------- lab 04 (4.1)
    lab04.check_standard_attention_bytes: [
        (lambda n, d, b: b * (4 * n * d + 2 * n * n), "written to HBM and read back"),
        (lambda n, d, b: 4 * n * d + 4 * n * n, "count of elements"),
        (lambda n, d, b: b * 4 * n * d, "FlashAttention|S and P|N x N|left out"),
    ],
    # ------------------------------------------------------------------------------------------- lab 05 (5.7)
    lab05.check_bytes_per_param: [
        (lambda e, s, b: e / 8, "leaves out the scale"),
        (lambda e, s, b: e / 8 + s / b, "in bits, not bytes"),
        (lambda e, s, b: (e + s) / 8, "charges the whole scale to every element"),
    ],
    # ------------------------------------------------------------------------------------------- lab 05 (5.8)
    lab05.check_fp8_linear: [
        (lambda x, w: fp8_linear(x, w, "x_row"), "one activation scale per row"),
        (lambda x, w: fp8_linear(x, w, "once"), "applied once"),
        (lambda x, w: fp8_linear(x, w, "bytes_no_scales"), "leave out the scales"),
    ],
    # ------------------------------------------------------------------------------------------- lab 09
    lab09.check_aggregate_nvlink: [
        (lambda g, per: g * per, "that is GB/s"),
        (lambda g, per: g * per / 2e3, "halved the per-GPU figure"),
        (lambda g, per: per / 1e3, "one GPU's figure"),
    ],
    lab09.check_rack_pflops: [
        (lambda g, t, sparse: g * t / 1e3, "that is the sparse figure"),
        (lambda g, t, sparse: g * t / (1 if sparse else 2), "TFLOP/s"),
        (lambda g, t, sparse: t / 1e3 / (1 if sparse else 2), "one GPU's rate"),
    ],
    lab09.check_memory_per_gpu: [
        (lambda *a: _memory(*a, gib=True), "GiB"),
        (lambda *a: _memory(*a, zero1=False), "not sharded"),
        (lambda *a: _memory(*a, split_experts=False), "not split by EP"),
    ],
    lab09.check_all_to_all_seconds: [
        (lambda b, g, dom, nv, net: max(b * (min(g, dom) - 1) / g / (net * 1e9), b * (g - min(g, dom)) / g
                                        / (nv * 1e9)), "bandwidths are swapped"),
        (lambda b, g, dom, nv, net: b * (min(g, dom) - 1) / g / (nv * 1e9) + b * (g - min(g, dom)) / g / (net * 1e9),
         "added the NVLink and network times"),
        (lambda b, g, dom, nv, net: max(b * min(g, dom) / g / (nv * 1e9), b * (g - min(g, dom)) / g / (net * 1e9)),
         "keeps for itself"),
    ],
    lab09.check_place: [  # the build exercise: its other named mistakes are in test_exercises_lab09.py
        (lambda tp, ep, pp, dp, dom: _contiguous(tp, ep, pp, dp), "fit in one 72-GPU domain: start each TP x EP block"),
        (lambda tp, ep, pp, dp, dom: _aligned(tp, ep, pp, dp, dom).reshape(tp, pp, dp).transpose(1, 2, 0),
         "varies faster than t"),
        (lambda tp, ep, pp, dp, dom: _aligned(tp, ep, pp, dp, dom).reshape(pp, ep, dp // ep, tp).transpose(0, 2, 1, 3)
         .reshape(pp, dp, tp), "an EP group is ep consecutive DP ranks"),
    ],
    # ------------------------------------------------------------------------------------------- lab 10
    lab10.check_train_flops: [
        (lambda n, d: 2 * n * d, "2ND, the forward pass only"),
        (lambda n, d: n * d, "forgets the factor 6"),
        (lambda n, d: 8 * n * d, "8ND counts activation recomputation"),
    ],
    lab10.check_implied_mfu: [
        (lambda f, h, g, d: f / (h * scaling.peak_tflops(g, d) * 1e12), "must become seconds"),
        (lambda f, h, g, d: 100 * f / (h * 3600 * scaling.peak_tflops(g, d) * 1e12), "percentage"),
        (lambda f, h, g, d: f / (h * 3600 * (hardware.gpu(g).tflops[d]["sparse"] or
                                             2 * hardware.gpu(g).tflops[d]["dense"]) * 1e12), "sparse"),
    ],
    lab10.check_adam_state: [
        (lambda n: {"weights": 2 * n, "grads": 2 * n, "master": 2 * n, "adam_m": 4 * n, "adam_v": 4 * n},
         "master copy of the weights is kept in FP32"),
        (lambda n: {"weights": 4 * n, "grads": 2 * n, "master": 4 * n, "adam_m": 4 * n, "adam_v": 4 * n},
         "weights the model computes with are BF16"),
        (lambda n: {"weights": 2, "grads": 2, "master": 4, "adam_m": 4, "adam_v": 4}, "bytes per parameter"),
    ],
    lab10.check_gpus_to_hold: [
        (lambda b, g: b / (scaling.hbm_gb(g) * 1e9), "GPUs come whole"),
        (lambda b, g: b // (scaling.hbm_gb(g) * 1e9) + 1, "// HBM \\+ 1"),
        (lambda b, g: math.ceil(b / (scaling.hbm_gb(g) * 2**30)), "GiB"),
    ],
    lab10.check_training_days: [
        (lambda f, n, g, d, mfu: f * mfu / (n * scaling.peak_tflops(g, d) * 1e12) / 86400, "multiplied by the MFU"),
        (lambda f, n, g, d, mfu: f / (n * scaling.peak_tflops(g, d) * 1e12 * mfu) / 3600, "that is hours"),
        (lambda f, n, g, d, mfu: f / (scaling.peak_tflops(g, d) * 1e12 * mfu) / 86400, "divide by the GPU count"),
    ],
    lab10.check_cost_model: [  # the build exercise: its other named mistakes are in test_exercises_lab10.py
        (lambda m, r: _cost(m, r, flops_per_token=6 * m["params"] + _attention(m, r)), "TOTAL parameters"),
        (lambda m, r: _cost(m, r, gpu_hours=_cost(m, r)["gpu_hours"] / 2), "sparse \\(2:4\\)"),
        (lambda m, r: _cost(m, r, optimizer_gb=_cost(m, r)["optimizer_gb"] * 8 / 12), "THREE FP32 values"),
    ],
}


def _contiguous(tp, ep, pp, dp):
    """Ranks in Megatron's order on GPUs 0, 1, 2, ... (a learner's placement that ignores the domains)."""
    import numpy as np
    return np.arange(pp * dp * tp).reshape(pp, dp, tp)


def _aligned(tp, ep, pp, dp, domain):
    """The GPU ids a right placement uses, in rank order (lab 09's solution), to be put in a wrong order."""
    from test_exercises_lab09 import _slots
    return _slots(tp, ep, pp, dp, domain)


def _attention(m, r):
    return 3 * m["layers"] * m["heads"] * (m["qk_head_dim"] + m["v_head_dim"]) * r["seq_len"]


def _cost(m, r, **wrong):
    """A learner's cost model (lab 10's solution) with some of its figures replaced by `wrong`."""
    from test_exercises_lab10 import right_cost
    return {**right_cost(m, r), **wrong}


def _memory(dn, ex, tp, pp, dp, ep, gib=False, zero1=True, split_experts=True):
    """GB per GPU: BF16 weights and gradients (4 B/param) of the local share, 12 B/param of Adam state sharded over
    the data-parallel replicas (dp for dense parameters, dp / ep for experts)."""
    d, e = dn / (tp * pp), ex / (tp * pp * (ep if split_experts else 1))
    adam = 12 * d / (dp if zero1 else 1) + 12 * e / ((dp // ep if split_experts else dp) if zero1 else 1)
    return (4 * (d + e) + adam) / (2**30 if gib else 1e9)


CASES = [(check, i, wrong, words) for check, answers in WRONG.items() for i, (wrong, words) in enumerate(answers)]


@pytest.mark.parametrize("check, i, wrong, words", CASES, ids=[f"{c.exercise}-{i}" for c, i, _, _ in CASES])
def test_wrong_answer_is_named(check, i, wrong, words):
    run_named(check, wrong, words)


def takes_seed(check) -> bool:
    """Whether some layer of the checker's decorators takes `seed=` (functools.wraps hides it from a plain
    inspect.signature, which reads the innermost function)."""
    import inspect
    fn = check
    while fn is not None:
        if "seed" in inspect.signature(fn, follow_wrapped=False).parameters:
            return True
        fn = getattr(fn, "__wrapped__", None)
    return False


def run_named(check, wrong, words, seeds=(1, 2, 3)):
    """The checker names `wrong` (its message matches `words`) on each of three random draws."""
    replay = takes_seed(check)
    for seed in seeds:
        with pytest.raises(CheckFailed, match=words):
            check(wrong, seed=seed) if replay else check(wrong)


# Exercises whose three (or more) most likely wrong answers live in their lab's test file, by test name: each of
# these tests feeds a wrong answer and matches the words that name it.
IN_LAB_TESTS = {
    "1.1": ("01", ["test_time_fn_wrong", "test_time_fn_parameters_varied"]),
    "1.2": ("01", ["test_is_regression_wrong", "test_is_regression_scale_and_baseline",
                   "test_is_regression_wrapper_of_the_reference_is_caught"]),
    "0.3": ("00", ["test_ceilings_mistakes_named", "test_ceilings_reference_is_caught"]),
    "1.3": ("01", ["test_do_bench_mistakes_named"]),
    "2.4": ("02", ["test_roofline_predictor_mistakes_named", "test_roofline_predictor_learners_warmups_propagate"]),
    "3.1": ("03", ["test_vector_add_missing_mask", "test_vector_add_wrong_grid", "test_vector_add_ignoring_block_size_caught",
                   "test_vector_add_unmasked_loads_caught", "test_vector_add_in_pytorch_is_not_a_kernel"]),
    "3.2": ("03", ["test_softmax_without_max_subtraction", "test_softmax_wrong_axis", "test_softmax_padding_counted",
                   "test_softmax_ignores_row_stride"]),
    "3.3": ("03", ["test_add_rmsnorm_mistakes_named", "test_add_rmsnorm_accumulated_in_bf16_named",
                   "test_add_rmsnorm_in_pytorch_is_not_a_kernel"]),
    "4.2": ("04", ["test_online_softmax_no_rescale", "test_online_softmax_max_not_subtracted",
                   "test_online_softmax_must_be_online"]),
    "4.3": ("04", ["test_tiled_mistakes", "test_tiled_sdpa_is_not_the_loop"]),
    "4.4": ("04_steps", ["test_workbook_kernel_is_refused", "test_triton_sdpa_is_not_the_kernel"]),
    "4.5": ("04_steps", ["test_workbook_kernel_is_refused", "test_one_block_kernel_fails_the_loop"]),
    "4.6": ("04_steps", ["test_workbook_kernel_is_refused"]),
    "4.7": ("04_steps", ["test_workbook_kernel_is_refused", "test_triton_sdpa_is_not_the_kernel"]),
    "4.8": ("04", ["test_tiled_backward_mistakes_named", "test_tiled_backward_autograd_is_not_the_backward",
                   "test_tiled_backward_swapped_blocks_caught"]),
    "5.1": ("05", ["test_format_facts_ieee_rule_for_e4m3", "test_format_facts_forgets_nan_code",
                   "test_format_facts_half_eps", "test_format_facts_from_the_reference_class"]),
    "5.2": ("05", ["test_round_half_away_from_zero", "test_round_no_saturation", "test_round_flushes_subnormals"]),
    "5.3": ("05", ["test_fp8_blockwise_wrong_axis", "test_fp8_blockwise_inverted_scale",
                   "test_fp8_blockwise_zero_block_nan", "test_fp8_blockwise_rows_and_columns_swapped"]),
    "5.4": ("05", ["test_mx_scale_not_power_of_two", "test_mx_ceil_scale", "test_mx_no_saturation"]),
    "5.5": ("05", ["test_nvfp4_fp32_block_scale", "test_nvfp4_no_tensor_scale", "test_nvfp4_block_of_32",
                   "test_nvfp4_block_scale_rounded_up"]),
    "5.6": ("05", ["test_promoted_never", "test_promoted_parameters_ignored", "test_promoted_no_restart"]),
    "5.8": ("05", ["test_fp8_linear_mistakes_named", "test_fp8_linear_zero_block_nan_named"]),
    "6.1": ("06", ["test_moe_ffn_params", "test_ffn_params_mistakes_named_by_their_own_formula"]),
    "6.2": ("06", ["test_deepseek_gate", "test_gate_negative_biased_scores_and_seed"]),
    "6.3": ("06", ["test_dispatch_combine_mistakes_named"]),
    "6.4": ("06", ["test_update_bias", "test_update_bias_zero_step_ties_and_float32"]),
    "6.5": ("06", ["test_expected_nodes", "test_expected_nodes_upper_bound_named"]),
    "6.7": ("06", ["test_place_replicas_mistakes_named", "test_place_replicas_layout_and_validity_named"]),
    "6.6": ("06", ["test_replica_counts", "test_replica_counts_largest_remainders_named"]),
    "7.3": ("07", ["test_ring_wrong"]),
    "7.5": ("07", ["test_send_counts_wrong"]),
    "8.2": ("08", ["test_dualpipe_ops_wrong"]),
    "12.2": ("12", ["test_equivalent"]),
    "12.3": ("12", ["test_corrected_share"]),
    "12.6": ("12", ["test_profile_steps"]),
    "12.7": ("12", ["test_top_op"]),
    "12.8": ("12", ["test_moe_grouped_forward", "test_one_act_call_is_required"]),
    "13.1": ("13", ["test_moe_layer_flops_wrong"]),
    "14.1": ("14", ["test_kv_bytes_wrong"]),
    "14.2": ("14", ["test_absorbed_wrong"]),
    "14.3": ("14", ["test_gather_wrong"]),
    "14.4": ("14", ["test_intensity_wrong"]),
    "14.5": ("14", ["test_cost_wrong"]),
    "14.6": ("14", ["test_schedule_step_wrong_policies_named", "test_schedule_step_other_wrong_answers"]),
    "14.7": ("14", ["test_paged_decode_mistakes_named", "test_paged_decode_other_wrong_answers"]),
    "14.8": ("14", ["test_prefix_cache_wrong_policies_named", "test_prefix_cache_other_wrong_answers"]),
    "14.9": ("14", ["test_blocks_to_grow_mistakes_named"]),
    "14.10": ("14", ["test_can_admit_mistakes_named"]),
    "14.11": ("14", ["test_new_token_mask_mistakes_named", "test_new_token_mask_other_wrong_answers"]),
    "14.12": ("14", ["test_block_names_wrong"]),
    "14.13": ("14", ["test_hit_tokens_mistakes_named"]),
}
OTHERS: set = set()  # exercises whose cases another change owns


def test_every_checker_has_three_named_mistakes():
    """Every exercise of labs 00-14 has at least three wrong answers whose verdict names them: in these tables, or
    in the named tests of its lab's test file (which must exist)."""
    import importlib
    from pathlib import Path

    from common.core import checks
    from test_wrong_answers_late import WRONG as LATE
    for lab in range(15):
        importlib.import_module(f"common.exercises.lab{lab:02d}")
    tables = {c.exercise: len(v) for c, v in {**WRONG, **LATE}.items()}
    missing = []
    for ex in sorted((e for e in checks._titles if int(e.split(".")[0]) < 15), key=lambda e: tuple(map(int,
                                                                                                      e.split(".")))):
        if ex in OTHERS:
            continue
        if tables.get(ex, 0) >= 3:
            continue
        lab, names = IN_LAB_TESTS.get(ex, (None, []))
        text = (Path(__file__).parent / f"test_exercises_lab{lab}.py").read_text() if lab else ""
        absent = [n for n in names if f"def {n}(" not in text]
        if not names or absent:
            missing.append(f"{ex}: {absent or 'no table entries and no named lab tests'}")
    assert not missing, missing
