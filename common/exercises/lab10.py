"""Checkers for lab 10 (scaling and cost): 6ND, implied MFU, mixed-precision Adam state, GPUs to hold a model,
training days."""
from __future__ import annotations

import math
import random

from common import scaling
from common.checks import checker, near, expect, expect_close, expect_equal


@checker("10.1", "training FLOPs with 6ND")
def check_train_flops(train_flops):
    """train_flops(params, tokens) -> FLOPs of training, 6 x N x D."""
    rng = random.Random()
    cases = [(37e9, 14.8e12), (100e12, 29e12), (1, 1)] + [
        (rng.uniform(1e6, 1e15), rng.uniform(1e9, 1e14)) for _ in range(5)]
    for n, d in cases:
        expected = 6.0 * n * d
        got = train_flops(n, d)
        expect(got is not None, "train_flops returned None -- return the FLOPs")
        if near(got, 2 * n * d):
            expect(False, f"train_flops({n:.3g}, {d:.3g}) = {got:.4g}: that is 2ND, the forward pass only; the "
                          f"backward pass costs twice the forward, so training is 6ND")
        if near(got, n * d):
            expect(False, f"train_flops({n:.3g}, {d:.3g}) = {got:.4g}: N x D forgets the factor 6 (2 FLOPs per "
                          f"multiply-add x 3 for forward + backward)")
        if near(got, 8 * n * d):
            expect(False, f"train_flops({n:.3g}, {d:.3g}) = {got:.4g}: 8ND counts activation recomputation; the "
                          f"model FLOPs of 6ND leave it out (recomputation is overhead, not model work)")
        expect_close(got, expected, f"train_flops({n:.3g}, {d:.3g})", rtol=1e-9)
    return "6 N D for every size (DeepSeek-V3: 6 x 37e9 x 14.8e12 = 3.29e24)"


@checker("10.2", "implied MFU")
def check_implied_mfu(implied_mfu):
    """implied_mfu(flops, gpu_hours, gpu_id, dtype) -> fraction of the GPU's *dense* `dtype` peak achieved."""
    rng = random.Random()
    cases = [(3.2856e24, 2.788e6, "H800-SXM", "bf16"), (3.2856e24, 2.788e6, "H800-SXM", "fp8")]
    for _ in range(5):
        gpu = rng.choice(["H100-SXM", "H800-SXM", "A100-SXM", "B200", "GB200"])
        dtype = rng.choice(["bf16", "fp8"]) if gpu != "A100-SXM" else "bf16"
        peak = scaling.peak_tflops(gpu, dtype)
        hours = rng.uniform(1e3, 1e7)
        cases.append((hours * 3600 * peak * 1e12 * rng.uniform(0.05, 0.9), hours, gpu, dtype))
    for flops, hours, gpu, dtype in cases:
        peak = scaling.peak_tflops(gpu, dtype)
        expected = scaling.implied_mfu(flops, hours, peak)
        got = implied_mfu(flops, hours, gpu, dtype)
        where = f"implied_mfu({flops:.4g}, {hours:.4g} h, {gpu!r}, {dtype!r})"
        expect(got is not None, "implied_mfu returned None -- return a fraction")
        if near(got, expected * 3600):
            expect(False, f"{where} = {got:.4g}: GPU-hours must become seconds (x 3600) before dividing FLOPs")
        if near(got, expected * 100):
            expect(False, f"{where} = {got:.4g}: that is a percentage; return a fraction (expected {expected:.4g})")
        if near(got, expected / 2):
            expect(False, f"{where} = {got:.4g}: you used the sparse (2:4) peak; MFU is measured against the "
                          f"dense peak, {peak:g} TFLOP/s")
        if near(got, expected * 1e12) or near(got, expected / 1e12):
            expect(False, f"{where} = {got:.4g}: a unit slip -- the peak is in TFLOP/s (1e12 FLOP/s)")
        expect_close(got, expected, where, rtol=1e-6)
    return "achieved FLOP/s over the dense peak (DeepSeek-V3 on H800: about 0.33 of BF16, 0.16 of FP8)"


@checker("10.3", "mixed-precision Adam state bytes")
def check_adam_state(adam_state_bytes):
    """adam_state_bytes(params) -> {"weights", "grads", "master", "adam_m", "adam_v"} in bytes."""
    rng = random.Random()
    expected_per = scaling.ADAM_MIXED_BYTES
    for n in [1, 1000, 100e12] + [rng.uniform(1e6, 1e15) for _ in range(4)]:
        got = adam_state_bytes(n)
        expect(isinstance(got, dict), f"adam_state_bytes({n:.3g}) returned {type(got).__name__}; return a dict "
                                      f"with keys {sorted(expected_per)}")
        expect_equal(sorted(k for k in got if k != "total"), sorted(expected_per), "keys of the result")
        for key, b in expected_per.items():
            if key == "master" and near(got[key], 2 * n):
                expect(False, "the master copy of the weights is kept in FP32 (4 bytes), so that small updates "
                              "are not lost to BF16 rounding")
            if key in ("adam_m", "adam_v") and near(got[key], 2 * n):
                expect(False, f"{key}: Adam's moments are FP32 (4 bytes each) in the classic mixed-precision recipe")
            expect_close(got[key], b * n, f"adam_state_bytes({n:.3g})[{key!r}]", rtol=1e-9)
        total = sum(v for k, v in got.items() if k != "total")
        expect_close(total, 16 * n, f"sum of the parts for {n:.3g} parameters (16 B/param)", rtol=1e-9)
    return "2 + 2 + 4 + 4 + 4 = 16 bytes per parameter (100T parameters: 1,600 TB)"


@checker("10.4", "GPUs just to hold a model")
def check_gpus_to_hold(gpus_to_hold):
    """gpus_to_hold(total_bytes, gpu_id) -> the fewest GPUs whose HBM (decimal GB) holds total_bytes."""
    rng = random.Random()
    cases = [(1600e12, "GB200"), (200e12, "H100-SXM"), (80e9, "H100-SXM"), (80e9 + 1, "H800-SXM")] + [
        (rng.uniform(1e10, 2e15), rng.choice(["H100-SXM", "H800-SXM", "H200-SXM", "B200", "GB200"]))
        for _ in range(5)]
    for nbytes, gpu in cases:
        hbm = scaling.hbm_gb(gpu) * 1e9
        expected = math.ceil(nbytes / hbm)
        got = gpus_to_hold(nbytes, gpu)
        where = f"gpus_to_hold({nbytes:.4g} bytes, {gpu!r})"
        expect(got is not None, "gpus_to_hold returned None -- return a whole number of GPUs")
        if isinstance(got, float) and not float(got).is_integer():
            expect(False, f"{where} = {got:.6g}: GPUs come whole -- round up (math.ceil)")
        if got == math.floor(nbytes / hbm) and got != expected:
            expect(False, f"{where} = {got}: rounded down -- {got} GPUs hold only {got * hbm:.4g} bytes; round up")
        if got == math.ceil(nbytes / (scaling.hbm_gb(gpu) * 2**30)) and got != expected:
            expect(False, f"{where} = {got}: HBM sizes are decimal GB (1e9 bytes), not GiB")
        expect_equal(int(got), expected, where)
    return "ceil(bytes / HBM bytes per GPU)"


@checker("10.5", "training days at a given MFU")
def check_training_days(training_days):
    """training_days(flops, gpus, gpu_id, dtype, mfu) -> calendar days, at `mfu` of the dense peak, perfect scaling."""
    rng = random.Random()
    cases = [(1.74e28, 100_000, "GB200", "bf16", 0.4), (3.2856e24, 2048, "H800-SXM", "fp8", 0.2)]
    for _ in range(5):
        gpu = rng.choice(["H100-SXM", "H800-SXM", "B200", "GB200"])
        cases.append((rng.uniform(1e22, 1e29), rng.randint(8, 200_000), gpu, rng.choice(["bf16", "fp8"]),
                      rng.uniform(0.1, 0.7)))
    for flops, gpus, gpu, dtype, mfu in cases:
        peak = scaling.peak_tflops(gpu, dtype)
        expected = flops / (gpus * peak * 1e12 * mfu) / 86400
        got = training_days(flops, gpus, gpu, dtype, mfu)
        where = f"training_days({flops:.3g}, {gpus} GPUs, {gpu!r}, {dtype!r}, mfu={mfu:.3g})"
        expect(got is not None, "training_days returned None -- return days")
        if near(got, expected * mfu * mfu):
            expect(False, f"{where} = {got:.4g}: you multiplied by the MFU; a lower MFU means a *longer* run, so "
                          f"divide by it")
        if near(got, expected * 24):
            expect(False, f"{where} = {got:.4g}: that is hours; return days")
        if near(got, expected / 2):
            expect(False, f"{where} = {got:.4g}: you used the sparse peak; use the dense one ({peak:g} TFLOP/s)")
        if near(got, expected * gpus):
            expect(False, f"{where} = {got:.4g}: the work is shared by {gpus} GPUs -- divide by the GPU count")
        expect_close(got, expected, where, rtol=1e-6)
    return "FLOPs / (GPUs x dense peak x MFU) / 86,400 s"
