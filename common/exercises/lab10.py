"""Checkers for lab 10 (scaling and cost): 6ND, implied MFU, mixed-precision Adam state, GPUs to hold a model,
training days, and the build exercise: a training run's cost model (common.systems.cluster.cost is its reference)."""
from __future__ import annotations

import math

from common.core.checks import checker, expect, expect_equal, near
from common.exercises.cases import as_number, expect_number, fresh_cases, learner_call, replayable
from common.exercises.formulas import answered, name_formula
from common.systems.cluster import cost, scaling

GPUS = ["H100-SXM", "H800-SXM", "H200-SXM", "A100-SXM", "B200", "GB200"]
# what the lab hands the learner from the workbook's library: datasheet look-ups (common.facts.hardware is not watched)
LOOKUPS = ("common.systems.cluster.scaling.peak_tflops", "common.systems.cluster.scaling.hbm_gb")


def _dtypes(gpu: str) -> list[str]:
    """The dtypes with a dense peak on `gpu`."""
    out = []
    for dtype in ("bf16", "fp8", "fp4"):
        try:
            scaling.peak_tflops(gpu, dtype)
            out.append(dtype)
        except ValueError:
            pass
    return out


def _peak_mistakes(gpu: str, dtype: str) -> list[tuple[float, str]]:
    """(factor by which a peak mistake scales the *peak*, what it is), every mistake named by its own peak; two
    mistakes with the same peak are named together."""
    dense = scaling.peak_tflops(gpu, dtype)
    named: dict[float, list[str]] = {}
    named.setdefault(scaling.peak_tflops(gpu, dtype, sparse=True), []).append(
        f"the sparse (2:4) {dtype.upper()} peak")
    for other in _dtypes(gpu):
        if other != dtype:
            named.setdefault(scaling.peak_tflops(gpu, other), []).append(
                f"the dense {other.upper()} peak instead of {dtype.upper()}")
    return [(peak / dense, " or ".join(whats) + (" (the same number on this GPU)" if len(whats) > 1 else ""))
            for peak, whats in named.items() if peak != dense]


def _other_gpu_peak(gpu: str, dtype: str):
    """A GPU whose dense `dtype` peak differs from `gpu`'s (to recognise a hard-coded GPU)."""
    for other in ("H800-SXM", "GB200", "B200", "A100-SXM"):
        if other != gpu and dtype in _dtypes(other) and \
                scaling.peak_tflops(other, dtype) != scaling.peak_tflops(gpu, dtype):
            yield other, scaling.peak_tflops(other, dtype)




@checker("10.1", "training FLOPs with 6ND")
def check_train_flops(train_flops):
    """train_flops(params, tokens) -> FLOPs of training, 6 x N x D."""
    with fresh_cases() as cases:
        rng = cases.rng
        cases_ = [(37e9, 14.8e12), (100e12, 29e12), (3, 7)] + [
            (rng.uniform(1e6, 1e15), rng.uniform(1e9, 1e14)) for _ in range(5)]
        for n, d in cases_:
            expected = 6.0 * n * d
            where = f"train_flops({n:.4g}, {d:.4g})"
            got = as_number(learner_call(train_flops, (n, d), where, (scaling.train_flops,), allowed=LOOKUPS,
                                         library=True), where, "the FLOPs, a number")
            for factor, why in ((2, "that is 2ND, the forward pass only; the backward pass costs twice the forward, "
                                    "so training is 6ND"),
                                (1, "N x D forgets the factor 6 (2 FLOPs per multiply-add x 3 for forward + "
                                    "backward)"),
                                (8, "8ND counts activation recomputation; the model FLOPs of 6ND leave it out "
                                    "(recomputation is overhead, not model work)"),
                                (3, "3ND counts one FLOP per multiply-add; a multiply-add is 2 FLOPs")):
                if near(got, factor * n * d):
                    expect(False, f"{where} = {got:.4g}: {why}")
            if near(got, 6 * n) or near(got, 6 * d):
                expect(False, f"{where} = {got:.4g}: one of N and D is missing: C = 6 x N x D")
            expect_number(got, expected, where, rtol=1e-9)
    return "6 N D for every size (DeepSeek-V3: 6 x 37e9 x 14.8e12 = 3.29e24)"


def _mfu(flops, hours, gpu, dtype, seconds_per_hour=3600, flops_per_tflop=1e12):
    return flops / (hours * seconds_per_hour) / (scaling.peak_tflops(gpu, dtype) * flops_per_tflop)


MFU_MISTAKES = [  # (what it is, what that mistake returns): named when every case matches it
    ("upside down: MFU is the achieved FLOP/s over the peak, not the peak over the achieved",
     lambda f, h, g, d: 1 / _mfu(f, h, g, d)),
    ("a GPU-hour is 3,600 GPU-seconds, not 60 (you converted to minutes)",
     lambda f, h, g, d: _mfu(f, h, g, d, seconds_per_hour=60)),
    ("off by a factor of 1000: the peak is in TFLOP/s, 1e12 FLOP/s (not 1e9 or 1e15)",
     lambda f, h, g, d: _mfu(f, h, g, d, flops_per_tflop=1e9)),
    ("off by a factor of 1000: the peak is in TFLOP/s, 1e12 FLOP/s (not 1e9 or 1e15)",
     lambda f, h, g, d: _mfu(f, h, g, d, flops_per_tflop=1e15)),
]


@checker("10.2", "implied MFU")
def check_implied_mfu(implied_mfu):
    """implied_mfu(flops, gpu_hours, gpu_id, dtype) -> fraction of the GPU's *dense* `dtype` peak achieved."""
    with fresh_cases() as cases:
        rng = cases.rng
        cases_ = [(3.2856e24, 2.788e6, "H800-SXM", "bf16"), (3.2856e24, 2.788e6, "H800-SXM", "fp8")]
        for gpu, dtype in (("A100-SXM", "bf16"), ("B200", "fp4"), ("GB200", "fp8"), ("H100-SXM", "fp8")):
            peak = scaling.peak_tflops(gpu, dtype)  # every GPU and dtype the exercise accepts has a fixed case
            hours = rng.uniform(1e3, 1e7)
            cases_.append((hours * 3600 * peak * 1e12 * rng.uniform(0.05, 0.9), hours, gpu, dtype))
        for _ in range(3):
            gpu = rng.choice(GPUS)
            dtype = rng.choice(_dtypes(gpu))
            hours = rng.uniform(1e3, 1e7)
            cases_.append((hours * 3600 * scaling.peak_tflops(gpu, dtype) * 1e12 * rng.uniform(0.05, 0.9), hours,
                           gpu, dtype))
        rows = []
        for flops, hours, gpu, dtype in cases_:
            expected = scaling.implied_mfu(flops, hours, scaling.peak_tflops(gpu, dtype))
            where = f"implied_mfu({flops:.4g}, {hours:.4g} h, {gpu!r}, {dtype!r})"
            def ask():
                got = as_number(learner_call(implied_mfu, (flops, hours, gpu, dtype), where, (scaling.implied_mfu,),
                                             allowed=LOOKUPS, library=True), where, "a fraction")
                return (where, (flops, hours, gpu, dtype), got, expected)
            if not answered(rows, ask, 1e-6):
                break
        name_formula(rows, MFU_MISTAKES, rtol=1e-6)
        for where, (flops, hours, gpu, dtype), got, expected in rows:
            peak = scaling.peak_tflops(gpu, dtype)
            if near(got, expected * 3600):
                expect(False, f"{where} = {got:.4g}: GPU-hours must become seconds (x 3600) before dividing FLOPs")
            if near(got, expected * 3600 / 86400):
                expect(False, f"{where} = {got:.4g}: you multiplied the GPU-hours by 86,400, the seconds in a DAY; "
                              f"a GPU-hour is 3,600 GPU-seconds")
            if near(got, expected * 100):
                expect(False, f"{where} = {got:.4g}: that is a percentage; return a fraction (expected "
                              f"{expected:.4g})")
            for factor, what in _peak_mistakes(gpu, dtype):
                if near(got, expected / factor):
                    expect(False, f"{where} = {got:.4g}: you used {what}; MFU is measured against the dense "
                                  f"{dtype.upper()} peak, {peak:g} TFLOP/s")
            for other, other_peak in _other_gpu_peak(gpu, dtype):
                if near(got, expected * peak / other_peak):
                    expect(False, f"{where} = {got:.4g}: that is the MFU against the {other}'s peak "
                                  f"({other_peak:g} TFLOP/s); look the peak up for gpu_id={gpu!r}")
            if near(got, expected * 1e12) or near(got, expected / 1e12):
                expect(False, f"{where} = {got:.4g}: a unit slip -- the peak is in TFLOP/s (1e12 FLOP/s)")
            expect_number(got, expected, where, rtol=1e-6)
    return "achieved FLOP/s over the dense peak (DeepSeek-V3 on H800: about 0.33 of BF16, 0.16 of FP8)"


_MISSING = {"master": "the FP32 master copy of the weights is missing -- mixed precision keeps one, or every update "
                      "smaller than a BF16 step (1/256 of the weight) would be rounded away",
            "adam_m": "Adam's first moment (the running mean of the gradients) is missing",
            "adam_v": "Adam's second moment (the running mean of the squared gradients) is missing",
            "weights": "the BF16 weights the forward and backward passes compute with are missing",
            "grads": "the gradients are missing: the backward pass writes one per parameter"}


@checker("10.3", "mixed-precision Adam state bytes")
def check_adam_state(adam_state_bytes):
    """adam_state_bytes(params) -> {"weights", "grads", "master", "adam_m", "adam_v"} in bytes."""
    expected_per = scaling.ADAM_MIXED_BYTES
    wrong = {"master": (2, "the master copy of the weights is kept in FP32 (4 bytes), so that small updates are not "
                           "lost to BF16 rounding"),
             "adam_m": (2, "Adam's first moment is FP32 (4 bytes) in the classic mixed-precision recipe"),
             "adam_v": (2, "Adam's second moment is FP32 (4 bytes) in the classic mixed-precision recipe"),
             "weights": (4, "the weights the model computes with are BF16 (2 bytes); the FP32 copy is `master`"),
             "grads": (4, "the gradients are BF16 (2 bytes) in this recipe")}
    with fresh_cases() as cases:
        rng = cases.rng
        for n in [7, 1000, 100e12] + [rng.uniform(1e6, 1e15) for _ in range(4)]:
            where = f"adam_state_bytes({n:.4g})"
            got = learner_call(adam_state_bytes, (n,), where, (scaling.adam_state_bytes,), allowed=LOOKUPS,
                               library=True)
            expect(isinstance(got, dict), f"{where} returned {type(got).__name__}; return a dict with keys "
                                          f"{sorted(expected_per)}")
            expect_equal(sorted(k for k in got if k != "total"), sorted(expected_per), f"{where}: keys of the result")
            for key, b in expected_per.items():
                value = as_number(got[key], f"{where}[{key!r}]", "bytes, a number")
                bad, why = wrong[key]
                if value == 0:
                    expect(False, f"{where}[{key!r}] = 0: {_MISSING[key]}")
                if near(value, bad * n):
                    expect(False, f"{where}[{key!r}] = {value:.4g}: {why}")
                if near(value, 8 * b * n):
                    expect(False, f"{where}[{key!r}] = {value:.4g}: that is bits; count bytes ({b} per parameter)")
                if near(value, b):
                    expect(False, f"{where}[{key!r}] = {value:.4g}: that is bytes per parameter; multiply by the "
                                  f"{n:.4g} parameters")
                expect_number(value, b * n, f"{where}[{key!r}]", rtol=1e-9)
            total = sum(float(v) for k, v in got.items() if k != "total")
            expect_number(total, 16 * n, f"sum of the parts for {n:.4g} parameters (16 B/param)", rtol=1e-9)
            if "total" in got:
                expect_number(as_number(got["total"], f"{where}['total']"), 16 * n, f"{where}['total']", rtol=1e-9)
    return "2 + 2 + 4 + 4 + 4 = 16 bytes per parameter (100T parameters: 1,600 TB)"


@checker("10.4", "GPUs just to hold a model")
def check_gpus_to_hold(gpus_to_hold):
    """gpus_to_hold(total_bytes, gpu_id) -> the fewest GPUs whose HBM (decimal GB) holds total_bytes."""
    with fresh_cases() as cases:
        rng = cases.rng
        # an exact fit (80e9 on an 80 GB H100), one byte more, and every GPU once
        cases_ = [(1600e12, "GB200"), (200e12, "H100-SXM"), (80e9, "H100-SXM"), (80e9 + 1, "H800-SXM"),
                  (3 * 141e9, "H200-SXM"), (1e12, "A100-SXM"), (5e12, "B200")] + [
            (rng.uniform(1e10, 2e15), rng.choice(GPUS)) for _ in range(4)]
        for nbytes, gpu in cases_:
            hbm = scaling.hbm_gb(gpu) * 1e9
            expected = math.ceil(nbytes / hbm)
            where = f"gpus_to_hold({nbytes:.6g} bytes, {gpu!r})"
            got = learner_call(gpus_to_hold, (nbytes, gpu), where, (scaling.gpus_to_hold,), allowed=LOOKUPS,
                               library=True)
            value = as_number(got, where, "a whole number of GPUs")
            if not value.is_integer():
                expect(False, f"{where} = {value:.6g}: GPUs come whole -- round up (math.ceil)")
            if value == math.floor(nbytes / hbm) and value != expected:
                expect(False, f"{where} = {value:.0f}: rounded down -- {value:.0f} GPUs hold only "
                              f"{value * hbm:.4g} bytes; round up")
            if value == nbytes // hbm + 1 and value != expected:
                expect(False, f"{where} = {value:.0f}: bytes // HBM + 1 counts one GPU too many when the bytes fill "
                              f"whole GPUs exactly; use math.ceil")
            if value == math.ceil(nbytes / (scaling.hbm_gb(gpu) * 2**30)) and value != expected:
                expect(False, f"{where} = {value:.0f}: HBM sizes are decimal GB (1e9 bytes), not GiB")
            for other in GPUS:
                if scaling.hbm_gb(other) != scaling.hbm_gb(gpu) and value == math.ceil(
                        nbytes / (scaling.hbm_gb(other) * 1e9)) and value != expected:
                    expect(False, f"{where} = {value:.0f}: that fits {other}'s {scaling.hbm_gb(other):g} GB; use "
                                  f"the HBM of gpu_id={gpu!r} ({scaling.hbm_gb(gpu):g} GB)")
            expect_equal(int(value), expected, where)
    return "ceil(bytes / HBM bytes per GPU)"


def _days(flops, gpus, gpu, dtype, mfu, per_day=86400):
    return flops / (gpus * scaling.peak_tflops(gpu, dtype) * 1e12 * mfu) / per_day


DAYS_MISTAKES = [  # (what it is, what that mistake returns): named when every case matches it
    ("that is years; return days", lambda f, n, g, d, m: _days(f, n, g, d, m) / 365),
    ("that is weeks; return days", lambda f, n, g, d, m: _days(f, n, g, d, m) / 7),
    ("the MFU is already a fraction (0.4 is 40%): you divided it by 100 again",
     lambda f, n, g, d, m: _days(f, n, g, d, m / 100)),
]


@checker("10.5", "training days at a given MFU")
def check_training_days(training_days):
    """training_days(flops, gpus, gpu_id, dtype, mfu) -> calendar days, at `mfu` of the dense peak, perfect scaling."""
    with fresh_cases() as cases:
        rng = cases.rng
        cases_ = [(1.74e28, 100_000, "GB200", "bf16", 0.4), (3.2856e24, 2048, "H800-SXM", "fp8", 0.2),
                  (1e26, 16_384, "B200", "fp4", 0.35), (5e23, 512, "A100-SXM", "bf16", 0.5)]
        for _ in range(4):
            gpu = rng.choice(GPUS)
            cases_.append((rng.uniform(1e22, 1e29), rng.randint(8, 200_000), gpu, rng.choice(_dtypes(gpu)),
                           rng.uniform(0.1, 0.7)))
        rows = []
        for flops, gpus, gpu, dtype, mfu in cases_:
            expected = _days(flops, gpus, gpu, dtype, mfu)
            where = f"training_days({flops:.4g}, {gpus} GPUs, {gpu!r}, {dtype!r}, mfu={mfu:.3g})"
            def ask():
                got = as_number(learner_call(training_days, (flops, gpus, gpu, dtype, mfu), where,
                                             (scaling.gpu_hours, scaling.plan_training),
                                             allowed=LOOKUPS, library=True), where, "days")
                return (where, (flops, gpus, gpu, dtype, mfu), got, expected)
            if not answered(rows, ask, 1e-6):
                break
        name_formula(rows, DAYS_MISTAKES, rtol=1e-6, unit=" days")
        for where, (flops, gpus, gpu, dtype, mfu), got, expected in rows:
            peak = scaling.peak_tflops(gpu, dtype)
            if near(got, expected * mfu * mfu):
                expect(False, f"{where} = {got:.4g}: you multiplied by the MFU; a lower MFU means a *longer* run, "
                              f"so divide by it")
            if near(got, expected * mfu):
                expect(False, f"{where} = {got:.4g}: the MFU is missing; at {mfu:.0%} of the peak the run takes "
                              f"1/{mfu:.3g} times longer")
            if near(got, expected * 24):
                expect(False, f"{where} = {got:.4g}: that is hours; return days")
            if near(got, expected * 86400):
                expect(False, f"{where} = {got:.4g}: that is seconds; return days (86,400 s each)")
            for factor, what in _peak_mistakes(gpu, dtype):
                if near(got, expected / factor):
                    expect(False, f"{where} = {got:.4g}: you used {what}; use the dense {dtype.upper()} peak "
                                  f"({peak:g} TFLOP/s)")
            for other, other_peak in _other_gpu_peak(gpu, dtype):
                if near(got, expected * peak / other_peak):
                    expect(False, f"{where} = {got:.4g}: that is the time at the {other}'s peak "
                                  f"({other_peak:g} TFLOP/s); look the peak up for gpu_id={gpu!r}")
            if gpus > 1 and near(got, expected * gpus):
                expect(False, f"{where} = {got:.4g}: the work is shared by {gpus} GPUs -- divide by the GPU count")
            expect_number(got, expected, where, rtol=1e-6)
    return "FLOPs / (GPUs x dense peak x MFU) / 86,400 s"


# ---------------------------------------------------------------- 10.6, the build exercise: a training run's cost model

def _named_cases(rng) -> list[tuple[str, dict, dict]]:
    """(what, model, run): the lab's two runs, each lever of theirs moved, a toy, and random models and runs."""
    v3, llama = cost.model_shape("deepseek_v3"), cost.model_shape("llama3_70b")
    out = [("DeepSeek-V3 as the report states it", v3, cost.v3_run(0.2)),
           ("Llama-3-70B on 2,048 H100s, TP8 x PP4", llama, cost.llama3_70b_run(0.4)),
           ("Llama-3-70B, ZeRO-3 with recomputation", llama, {**cost.llama3_70b_run(0.35), "zero": 3,
                                                               "recompute": True, "micro_batch_seqs": 2}),
           ("DeepSeek-V3 with ZeRO-2", v3, {**cost.v3_run(0.25), "zero": 2}),
           ("DeepSeek-V3 without ZeRO, recomputing", v3, {**cost.v3_run(0.15), "zero": 0, "recompute": True}),
           ("a dense toy", {"params": 1e9, "active_params": 1e9, "expert_params": 0.0, "layers": 16, "hidden": 2048,
                            "heads": 16, "qk_head_dim": 128, "v_head_dim": 128},
            {"tokens": 2e10, "seq_len": 2048, "gpus": 8, "gpu_id": "A100-SXM", "dtype": "bf16", "mfu": 0.5,
             "usd_per_gpu_hour": 1.5, "tp": 2, "pp": 1, "ep": 1, "zero": 2, "recompute": False,
             "micro_batch_seqs": 4})]
    for i in range(4):
        moe = rng.random() < 0.6
        params = rng.uniform(1e9, 2e12)
        experts = params * rng.uniform(0.6, 0.97) if moe else 0.0
        active = (params - experts) + experts * rng.uniform(0.01, 0.2)
        heads = rng.choice([8, 16, 32, 64, 128])
        model = {"params": params, "active_params": active, "expert_params": experts, "layers": rng.randint(8, 128),
                 "hidden": 128 * rng.randint(8, 128), "heads": heads, "qk_head_dim": rng.choice([64, 128, 192]),
                 "v_head_dim": rng.choice([64, 128])}
        tp, pp, ep = rng.choice([1, 2, 4, 8]), rng.choice([1, 2, 4, 8, 16]), rng.choice([2, 4, 8, 16, 64]) if moe else 1
        gpu = rng.choice(GPUS)
        run = {"tokens": rng.uniform(1e11, 3e13), "seq_len": rng.choice([1024, 2048, 4096, 8192, 32768]),
               "gpus": tp * pp * ep * rng.randint(1, 16), "gpu_id": gpu, "dtype": rng.choice(_dtypes(gpu)),
               "mfu": rng.uniform(0.1, 0.7), "usd_per_gpu_hour": rng.uniform(0.5, 5.0), "tp": tp, "pp": pp, "ep": ep,
               "zero": rng.choice(cost.ZERO_STAGES), "recompute": rng.random() < 0.5,
               "micro_batch_seqs": rng.randint(1, 4)}
        out.append((f"a random {'MoE' if moe else 'dense'} run [random case, seed {{seed}}]", model, run))
    return out


def _gb(model, run, bytes_per_param, sharded, dp=None, expert_replicas=None, ep=None):
    """GB per GPU of `bytes_per_param` per parameter, split as the reference splits it unless told otherwise."""
    ep = run["ep"] if ep is None else ep
    dp = cost.data_parallel(run) if dp is None else dp
    replicas = dp // run["ep"] if expert_replicas is None else expert_replicas
    dense = (model["params"] - model["expert_params"]) / (run["tp"] * run["pp"])
    experts = model["expert_params"] / (run["tp"] * run["pp"] * ep)
    return bytes_per_param * (dense / dp + experts / replicas if sharded else dense + experts) / 1e9


def _mistakes(model: dict, run: dict, ref: dict) -> dict:
    """{result key: [(what a known mistake gives, how the verdict names it)]}."""
    moe, zero, dp = model["expert_params"] > 0, run["zero"], cost.data_parallel(run)
    attn = cost.attention_flops_per_token(model, run["seq_len"])
    n = model["active_params"]
    peak = scaling.peak_tflops(run["gpu_id"], run["dtype"])
    out = {"flops_per_token": [
        (6 * model["params"] + attn, "6ND with the TOTAL parameters; a token of an MoE touches only its activated "
                                     "ones (active_params)"),
        (6 * n, "attention's score and value products are missing: add 6 x layers x heads x (qk + v head dims) x "
                "seq_len / 2 per token"),
        (6 * n + 2 * attn, "attention counted over the whole sequence; with a causal mask a token attends to half of "
                           "it on average (divide by 2)"),
        (6 * n + attn / 3, "attention counted for the forward pass only; training does it three times (forward, "
                           "and twice in the backward), like the 6 in 6N"),
        (2 * n + attn / 3, "that is the forward pass only (2N): training is 6N plus attention"),
        (6 * n + 3 * model["layers"] * model["heads"] * 2 * model["qk_head_dim"] * run["seq_len"],
         "V's head dim is not Q.K's (DeepSeek-V3's MLA: 192 for the scores, 128 for the values): use both")],
        "flops": [(ref["flops_per_token"] * run["seq_len"], "FLOPs per token x seq_len is one sequence; the run "
                                                            "trains on `tokens` tokens")],
        "gpu_hours": [(ref["gpu_hours"] * run["mfu"] ** 2, "multiplied by the MFU; at a lower MFU the run takes "
                                                           "LONGER: divide by it"),
                      (ref["gpu_hours"] / 24, "divided by 86,400 s (a day) where a GPU-hour is 3,600 s"),
                      (ref["gpu_hours"] * 3600, "that is GPU-seconds; divide by 3,600 for GPU-hours")]
        + [(ref["gpu_hours"] / factor, f"you used {what}; a run's time comes from the dense "
                                       f"{run['dtype'].upper()} peak, {peak:g} TFLOP/s")
           for factor, what in _peak_mistakes(run["gpu_id"], run["dtype"])],
        "days": [(ref["gpu_hours"] / 24, "those are GPU-days; the run's GPUs work at once, so divide by them too"),
                 (ref["gpu_hours"] / run["gpus"], "those are hours; divide by 24 for days")],
        "cost_usd": [(ref["days"] * run["usd_per_gpu_hour"], "a price per GPU-HOUR times days"),
                     (ref["gpu_hours"] * run["usd_per_gpu_hour"] * run["gpus"], "the GPU-hours already count every "
                                                                               "GPU: do not multiply by the GPUs")],
        "weights_gb": [(_gb(model, run, 2, zero < 3), "ZeRO shards the weights only at stage 3; at stages 0-2 every "
                                                      "replica keeps its whole slice"),
                       (_gb(model, run, 4, zero >= 3), "the weights the model computes with are BF16 (2 B); the FP32 "
                                                       "copy is the optimizer's master"),
                       (ref["weights_gb"] * 1e9 / 2**30, "that is GiB; the lab counts GB = 1e9 bytes")],
        "grads_gb": [(_gb(model, run, 2, zero < 2), "ZeRO shards the gradients from stage 2; stage 1 shards only the "
                                                    "optimizer state (and stage 0 nothing)")],
        "optimizer_gb": [(_gb(model, run, 8, zero >= 1), "8 B per parameter: the optimizer keeps THREE FP32 values -- "
                                                         "the master copy and Adam's two moments (m and v)"),
                         (_gb(model, run, 16, zero >= 1), "16 B counts the BF16 weights and gradients again; "
                                                          "the optimizer state is the master copy and Adam's "
                                                          "moments, 12 B"),
                         (_gb(model, run, 12, zero < 1), "ZeRO-1 (and above) shards the optimizer state over each "
                                                         "parameter's data-parallel replicas" if zero else
                          "ZeRO stage 0 shards nothing"),
                         (_gb(model, run, 12, zero >= 1, dp=run["gpus"], expert_replicas=run["gpus"]),
                          "sharded over all the GPUs; a parameter's state is shared only by its data-parallel "
                          "replicas (GPUs / (TP x PP))")],
        "activations_gb": [(run["micro_batch_seqs"] * run["seq_len"] * model["layers"] * model["hidden"]
                            * (34 if run["recompute"] else 2) / run["tp"] / 1e9,
                            "recomputation keeps only each layer's BF16 input (2 x hidden bytes per token); without "
                            "it, 34 x hidden" if run["recompute"] else "without recomputation every layer keeps "
                            "34 x hidden bytes per token, not just its input"),
                           (ref["activations_gb"] * run["tp"], "TP splits the activations too: divide by tp"),
                           (ref["activations_gb"] / run["pp"], "under 1F1B the first stage holds PP micro-batches "
                                                               "of layers / PP: all the model's layers"),
                           (ref["activations_gb"] / run["micro_batch_seqs"], "a micro-batch holds micro_batch_seqs "
                                                                              "sequences"),
                           (ref["activations_gb"] / run["seq_len"], "per token: a sequence has seq_len tokens")]}
    for key in ("weights_gb", "grads_gb", "optimizer_gb"):
        if moe and run["ep"] > 1:
            bpp = {"weights_gb": 2, "grads_gb": 2, "optimizer_gb": 12}[key]
            sharded = {"weights_gb": zero >= 3, "grads_gb": zero >= 2, "optimizer_gb": zero >= 1}[key]
            out[key].append((_gb(model, run, bpp, sharded, ep=1, expert_replicas=dp),
                             "the routed experts are not split by EP; each EP rank holds 1/ep of them"))
            if sharded:
                out[key].append((_gb(model, run, bpp, sharded, expert_replicas=dp),
                                 f"the experts' state is sharded over all {dp} DP ranks, but each expert has only "
                                 f"dp / ep = {dp // run['ep']} replicas to share it with"))
        if run["pp"] > 1 and (zero >= 1 or key == "weights_gb"):
            out[key].append((_gb(model, run, {"weights_gb": 2, "grads_gb": 2, "optimizer_gb": 12}[key],
                                 {"weights_gb": zero >= 3, "grads_gb": zero >= 2, "optimizer_gb": zero >= 1}[key],
                                 dp=run["gpus"] // run["tp"], expert_replicas=run["gpus"] // run["tp"] // run["ep"]),
                             "the data-parallel degree is GPUs / (TP x PP), not GPUs / TP"))
    return out


@checker("10.6", "a training run's cost model")
@replayable
def check_cost_model(cost_model, cases):
    """cost_model(model, run) -> {flops_per_token, flops, gpu_hours, days, cost_usd, weights_gb, grads_gb,
    optimizer_gb, activations_gb}: the training run of common.systems.cluster.cost (the lab's section 5)."""
    named = _named_cases(cases.rng)
    for what, model, run in named:
        what = what.format(seed=cases.seed)
        ref = cost.cost_model(model, run)
        where = f"cost_model(model, run) for {what}"
        got = learner_call(cost_model, (dict(model), dict(run)), where, (cost.cost_model,),
                           expected="a dict of the nine figures", allowed=LOOKUPS,
                           library=True)
        expect(isinstance(got, dict), f"{where} returned {type(got).__name__}; return a dict with the keys "
                                      f"{', '.join(cost.RESULT_KEYS)}")
        missing = [k for k in cost.RESULT_KEYS if k not in got]
        expect(not missing, f"{where}: the result has no {', '.join(repr(k) for k in missing)}")
        mistakes = _mistakes(model, run, ref)
        for key in cost.RESULT_KEYS:
            value = as_number(got[key], f"{where}[{key!r}]")
            if not near(value, ref[key]):
                for wrong, why in mistakes.get(key, []):
                    if near(value, wrong) and not near(wrong, ref[key]):
                        expect(False, f"{where}[{key!r}] = {value:.4g}: {why} (expected {ref[key]:.4g})")
            expect_number(value, ref[key], f"{where}[{key!r}]", rtol=1e-6)
    return (f"right for {len(named)} runs: FLOPs with attention, time at the dense peak, and memory per GPU under "
            f"every ZeRO stage, with and without recomputation")
