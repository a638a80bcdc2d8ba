"""Lab 05 checkers: right answers pass, each classic mistake fails with a telling message, stubs are 'not attempted'."""
import numpy as np
import pytest
import torch

from common import lowp
from common.checks import CheckFailed
from common.exercises.lab05 import (check_bytes_per_param, check_format_facts, check_mx_quantize,
                                    check_nvfp4_quantize, check_promoted_sum, check_quantize_fp8_blockwise,
                                    check_round_to_e4m3)


pytestmark = pytest.mark.usefixtures("one_thread")


def stub(*args, **kwargs):
    raise NotImplementedError("Exercise 5.x: replace this line with your code")


@pytest.mark.parametrize("check", [check_format_facts, check_round_to_e4m3, check_quantize_fp8_blockwise,
                                   check_mx_quantize, check_nvfp4_quantize, check_promoted_sum,
                                   check_bytes_per_param])
def test_stub_is_not_attempted(check):
    assert check(stub).status == "not attempted"


# ------------------------------------------------------------------------------------------------ 5.1
def facts(e, m, special):
    bias = 2 ** (e - 1) - 1
    top = 2 ** e - 1
    emax = (top - 1 if special == "ieee" else top) - bias
    frac = 1 - 2.0 ** -m * (2 if special == "fn" else 1)
    return {"max": (1 + frac) * 2.0 ** emax, "smallest_normal": 2.0 ** (1 - bias),
            "smallest_subnormal": 2.0 ** (1 - bias - m), "eps": 2.0 ** -m}


def test_format_facts_right():
    assert check_format_facts(facts).passed


def test_format_facts_ieee_rule_for_e4m3():
    def wrong(e, m, special):
        return facts(e, m, "ieee")
    with pytest.raises(CheckFailed, match="IEEE answer"):
        check_format_facts(wrong)


def test_format_facts_forgets_nan_code():
    def wrong(e, m, special):
        return facts(e, m, "none" if special == "fn" else special)
    with pytest.raises(CheckFailed, match="all-ones mantissa"):
        check_format_facts(wrong)


def test_format_facts_half_eps():
    def wrong(e, m, special):
        return {**facts(e, m, special), "eps": 2.0 ** -(m + 1)}
    with pytest.raises(CheckFailed, match="unit roundoff"):
        check_format_facts(wrong)


# ------------------------------------------------------------------------------------------------ 5.2
def round_e4m3(x):
    a = x.double().abs()
    e = torch.floor(torch.log2(torch.where(a > 0, a, torch.ones_like(a)))).clamp(min=-6)
    step = 2.0 ** (e - 3)
    q = torch.round(a / step) * step
    return torch.copysign(q.clamp(max=448.0), x.double())


def test_round_right():
    assert check_round_to_e4m3(round_e4m3).passed


def test_round_half_away_from_zero():
    def wrong(x):
        a = x.double().abs()
        e = torch.floor(torch.log2(torch.where(a > 0, a, torch.ones_like(a)))).clamp(min=-6)
        step = 2.0 ** (e - 3)
        return torch.copysign((torch.floor(a / step + 0.5) * step).clamp(max=448.0), x.double())
    with pytest.raises(CheckFailed, match="half to EVEN"):
        check_round_to_e4m3(wrong)


def test_round_no_saturation():
    def wrong(x):
        q = round_e4m3(x)
        return torch.where(x.abs() > 464, torch.full_like(q, float("nan")), q)
    with pytest.raises(CheckFailed, match="no saturation"):
        check_round_to_e4m3(wrong)


def test_round_flushes_subnormals():
    def wrong(x):
        q = round_e4m3(x)
        return torch.where(x.abs() < 2.0 ** -6, torch.zeros_like(q), q)
    with pytest.raises(CheckFailed, match="subnormals"):
        check_round_to_e4m3(wrong)


# ------------------------------------------------------------------------------------------------ 5.3
def fp8_blockwise(x, block):
    qt = lowp.quantize(x, lowp.e4m3, block, "fp32")
    return qt.q, qt.scale


def test_fp8_blockwise_right():
    assert check_quantize_fp8_blockwise(fp8_blockwise).passed


def test_fp8_blockwise_wrong_axis():
    def wrong(x, block):
        qt = lowp.quantize(x.T.contiguous(), lowp.e4m3, block, "fp32")
        return qt.q.T, qt.scale.T
    with pytest.raises(CheckFailed, match="wrong block axis"):
        check_quantize_fp8_blockwise(wrong)


def test_fp8_blockwise_inverted_scale():
    def wrong(x, block):
        q, s = fp8_blockwise(x, block)
        return q, 1 / s
    with pytest.raises(CheckFailed, match="upside down"):
        check_quantize_fp8_blockwise(wrong)


def test_fp8_blockwise_wrong_scale():
    def wrong(x, block):  # half the scale (as from a clipped amax), no clamp
        qt = lowp.quantize(x, lowp.e4m3, block, "fp32")
        s = qt.scale * 0.5
        full = s.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)
        return lowp.round_to(x.double() / full, lowp.e4m3, saturate=False), s
    with pytest.raises(CheckFailed, match="scale for block"):
        check_quantize_fp8_blockwise(wrong)


def test_fp8_blockwise_pads_silently():
    with pytest.raises(CheckFailed, match="must refuse"):
        check_quantize_fp8_blockwise(lambda x, b: fp8_blockwise(x, b) if x.shape[-1] % b[1] == 0 else
                                     (lowp.quantize(x, lowp.e4m3, b, "fp32", pad=True).q, None))


# ------------------------------------------------------------------------------------------------ 5.4
def mx(x, elem, block=32):
    qt = lowp.quantize(x, elem, (1, block), "e8m0")
    return qt.q, qt.scale


def test_mx_right():
    assert check_mx_quantize(mx).passed


def test_mx_scale_not_power_of_two():
    def wrong(x, elem, block=32):
        qt = lowp.quantize(x, elem, (1, block), "fp32")
        return qt.q, qt.scale
    with pytest.raises(CheckFailed, match="powers of two"):
        check_mx_quantize(wrong)


def test_mx_ceil_scale():
    def wrong(x, elem, block=32):
        qt = lowp.quantize(x, elem, (1, block), "e8m0", e8m0_rounding="ceil")
        return qt.q, qt.scale
    with pytest.raises(CheckFailed, match="rounded the exponent up"):
        check_mx_quantize(wrong)


def test_mx_no_saturation():
    def wrong(x, elem, block=32):
        qt = lowp.quantize(x, elem, (1, block), "e8m0")
        full = qt.scale.repeat_interleave(block, 1)
        # round without clamping: E2M1 values above 6 keep growing on the 2^(e-1) grid
        a = (x.double() / full).abs()
        e = torch.floor(torch.log2(torch.where(a > 0, a, torch.ones_like(a)))).clamp(min=elem.emin)
        step = 2.0 ** (e - elem.man_bits)
        return torch.copysign(torch.round(a / step) * step, x.double()), qt.scale
    with pytest.raises(CheckFailed, match="no saturation"):
        check_mx_quantize(wrong)


def test_mx_wrong_axis():
    def wrong(x, elem, block=32):
        qt = lowp.quantize(x.T.contiguous(), elem, (1, block), "e8m0")
        return qt.q.T, qt.scale.T
    with pytest.raises(CheckFailed, match="wrong block axis"):
        check_mx_quantize(wrong)


# ------------------------------------------------------------------------------------------------ 5.5
def nvfp4(x):
    qt = lowp.quantize(x, lowp.e2m1, (1, 16), "e4m3", tensor_scale=True)
    return qt.q, qt.block_scale, qt.tensor_scale


def test_nvfp4_right():
    assert check_nvfp4_quantize(nvfp4).passed


def test_nvfp4_fp32_block_scale():
    def wrong(x):
        q, bs, ts = nvfp4(x)
        amax = x.double().reshape(x.shape[0], -1, 16).abs().amax(-1)
        return q, amax / 6 / ts, ts
    with pytest.raises(CheckFailed, match="not an FP8 E4M3 value"):
        check_nvfp4_quantize(wrong)


def test_nvfp4_no_tensor_scale():
    def wrong(x):
        qt = lowp.quantize(x, lowp.e2m1, (1, 16), "e4m3", tensor_scale=False)
        return qt.q, qt.block_scale, 1.0
    with pytest.raises(CheckFailed, match="tensor_scale is 1"):
        check_nvfp4_quantize(wrong)


def test_nvfp4_block_of_32():
    def wrong(x):
        qt = lowp.quantize(x, lowp.e2m1, (1, 32), "e4m3", tensor_scale=True)
        return qt.q, qt.block_scale, qt.tensor_scale
    with pytest.raises(CheckFailed, match="MXFP4's block"):
        check_nvfp4_quantize(wrong)


# ------------------------------------------------------------------------------------------------ 5.6
def promoted(products, acc_bits, promote_every):
    p = np.asarray(products, dtype=np.float64)
    acc = np.zeros(p.shape[0])
    total = np.zeros(p.shape[0])
    for k in range(p.shape[1]):
        acc = lowp.round_significand(acc + p[:, k], acc_bits)
        if (k + 1) % promote_every == 0:
            total, acc = total + acc, np.zeros_like(acc)
    return total + acc


def test_promoted_right():
    assert check_promoted_sum(promoted).passed


def test_promoted_never():
    with pytest.raises(CheckFailed, match="never promote"):
        check_promoted_sum(lambda p, bits, every: lowp.accumulate(p, bits, None))


def test_promoted_no_restart():
    def wrong(products, acc_bits, promote_every):
        p = np.asarray(products, dtype=np.float64)
        acc, total = np.zeros(p.shape[0]), np.zeros(p.shape[0])
        for k in range(p.shape[1]):
            acc = lowp.round_significand(acc + p[:, k], acc_bits)
            if (k + 1) % promote_every == 0:
                total = total + acc
        return total + acc
    with pytest.raises(CheckFailed, match="restart"):
        check_promoted_sum(wrong)


# ------------------------------------------------------------------------------------------------ 5.7
def test_bytes_right():
    assert check_bytes_per_param(lambda e, s, b: e / 8 + s / 8 / b).passed


def test_bytes_no_scale():
    with pytest.raises(CheckFailed, match="leaves out the scale"):
        check_bytes_per_param(lambda e, s, b: e / 8)


def test_bytes_scale_in_bits():
    with pytest.raises(CheckFailed, match="in bits"):
        check_bytes_per_param(lambda e, s, b: e / 8 + s / b)
