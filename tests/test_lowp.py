"""common.kernels.lowp: formats from the bit layout against torch, rounding against torch's casts, block quantizers."""
import math

import numpy as np
import pytest
import torch

from common.kernels import lowp

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("name", ["fp32", "bf16", "fp16", "e4m3", "e5m2"])
def test_format_facts_match_torch_finfo(name):
    fmt = lowp.FORMATS[name]
    fi = torch.finfo(getattr(torch, fmt.torch_dtype))
    assert fmt.max == fi.max
    assert fmt.smallest_normal == fi.smallest_normal
    assert fmt.eps == fi.eps
    assert fmt.bits == fi.bits


def test_headline_maxima_and_fp4_values():
    assert lowp.e4m3.max == 448.0
    assert lowp.e5m2.max == 57344.0
    assert lowp.e2m1.max == 6.0
    assert lowp.e2m1.values() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert lowp.tf32.bits == 19 and lowp.tf32.eps == 2.0 ** -10
    assert lowp.e4m3.smallest_subnormal == 2.0 ** -9 and lowp.e2m1.smallest_subnormal == 0.5


def test_decode_and_bit_strings():
    assert lowp.e4m3.bit_string(448.0) == "0 1111 110"
    assert math.isnan(lowp.e4m3.decode(0b01111111))
    assert lowp.e5m2.decode(0b01111100) == math.inf
    assert lowp.e2m1.bit_string(-6.0) == "1 11 1"
    assert lowp.e2m1.decode(0b0001) == 0.5
    assert len(lowp.e4m3.values()) == 127  # 128 non-negative codes, one of them NaN
    with pytest.raises(ValueError, match="not representable"):
        lowp.e2m1.bit_string(5.0)
    with pytest.raises(ValueError, match="code=256"):
        lowp.e4m3.decode(256)


def test_torch_e4m3_values_match_the_enumeration():
    codes = torch.arange(128, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float64)
    assert sorted(v for v in codes.tolist() if math.isfinite(v)) == lowp.e4m3.values()


def _wide(n=100_000, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g) * torch.exp(4 * torch.randn(n, generator=g))).float()


@pytest.mark.parametrize("name,saturate", [("e4m3", True), ("e5m2", False), ("bf16", False), ("fp16", False)])
def test_round_to_matches_torch_cast(name, saturate):
    fmt = lowp.FORMATS[name]
    x = _wide()
    if fmt.bits == 8:  # every tie and every grid point too
        v = torch.tensor(fmt.values(), dtype=torch.float64)
        mids = (v[1:] + v[:-1]) / 2
        x = torch.cat([x, v.float(), mids.float(), -mids.float()])
    r, t = lowp.round_to(x, fmt, saturate=saturate), lowp.torch_cast(x, fmt)
    same = (r == t) | (torch.isnan(r) & torch.isnan(t))
    assert bool(same.all()), f"{int((~same).sum())} values differ, first x={float(x[~same][0])}"


def test_round_to_fp32_matches_float():
    x = torch.randn(10000, dtype=torch.float64) * 1e3
    assert torch.equal(lowp.round_to(x, lowp.fp32), x.float().double())


def test_round_to_rules():
    r = lowp.round_to(torch.tensor([2.5, 5.0, 7.0, 0.25, 0.26, -3.5, 1e9]), lowp.e2m1)
    assert r.tolist() == [2.0, 4.0, 6.0, 0.0, 0.5, -4.0, 6.0]  # ties to even, saturation, subnormal 0.5
    assert math.isnan(float(lowp.round_to(torch.tensor([500.0]), lowp.e4m3, saturate=False)[0]))
    assert float(lowp.round_to(torch.tensor([464.0]), lowp.e4m3, saturate=False)[0]) == 448.0  # tie goes to even
    assert float(lowp.round_to(torch.tensor([1e6]), lowp.e5m2, saturate=False)[0]) == math.inf
    assert float(lowp.round_to(torch.tensor([math.inf]), lowp.e4m3)[0]) == 448.0
    assert math.isnan(float(lowp.round_to(torch.tensor([math.nan]), lowp.e4m3)[0]))
    assert float(lowp.round_to(torch.tensor([1.9]), lowp.e2m1, rounding="truncate")[0]) == 1.5
    with pytest.raises(ValueError, match="rounding"):
        lowp.round_to(torch.tensor([1.0]), lowp.e2m1, rounding="up")
    with pytest.raises(ValueError, match="format 'fp6'"):
        lowp.round_to(torch.tensor([1.0]), "fp6")


def test_quantize_refuses_nan_and_inf_naming_count_and_place():
    x = torch.randn(4, 64)
    x[1, 3], x[2, 5], x[3, 7] = math.nan, math.inf, -math.inf
    with pytest.raises(ValueError, match=r"3 non-finite values \(1 NaN, 2 Inf\).*index \(1, 3\)"):
        lowp.quantize(x, lowp.e2m1, 32, "e8m0")
    with pytest.raises(ValueError, match="non-finite"):
        lowp.fake_quantize(x, "nvfp4")


def test_block_that_does_not_divide_is_refused_or_padded():
    x = torch.randn(3, 100)
    with pytest.raises(ValueError, match=r"block=\(1, 32\) does not tile x of shape \(3, 100\).*pad=True"):
        lowp.quantize(x, lowp.e2m1, 32, "e8m0")
    with pytest.raises(ValueError, match="rows are not a multiple"):
        lowp.quantize(torch.randn(100, 128), lowp.e4m3, (128, 128))
    qt = lowp.quantize(x, lowp.e2m1, 32, "e8m0", pad=True)
    assert qt.q.shape == (3, 128) and qt.scale.shape == (3, 4)
    back = lowp.dequantize(qt)
    assert back.shape == (3, 100)
    assert lowp.rel_error(x, back) < 0.25
    with pytest.raises(ValueError, match="block="):
        lowp.quantize(x, lowp.e2m1, (0, 32))
    with pytest.raises(ValueError, match="scale='int8'"):
        lowp.quantize(x, lowp.e2m1, 4, "int8")


def test_mx_scales_are_powers_of_two_and_elements_saturate():
    x = lowp.make_activations(16, 256)
    for elem in (lowp.e2m1, lowp.e4m3):
        qt = lowp.quantize(x, elem, 32, "e8m0")
        assert bool(lowp.is_power_of_two(qt.scale).all())
        assert float(qt.q.abs().max()) <= elem.max
        assert torch.equal(lowp.round_to(qt.q, elem), qt.q)
        # OCP: scale = 2^(floor(log2 amax) - emax_elem)
        amax = x.double().reshape(16, -1, 32).abs().amax(-1)
        assert torch.equal(qt.scale, 2.0 ** (torch.floor(torch.log2(amax)) - elem.emax))
        ceil = lowp.quantize(x, elem, 32, "e8m0", e8m0_rounding="ceil")
        assert float((lowp.blocks(ceil.q.abs(), 1, 32).amax(-1) / elem.max).max()) <= 1.0
        assert bool((ceil.scale >= qt.scale).all())


def test_nvfp4_two_level_scales():
    x = lowp.make_activations(8, 256) * 1000
    qt = lowp.SCHEMES["nvfp4"].quantize(x)
    assert qt.tensor_scale == pytest.approx(float(x.abs().max()) / (6 * 448), rel=1e-6)
    assert torch.equal(lowp.round_to(qt.block_scale, lowp.e4m3), qt.block_scale)
    assert float(qt.block_scale.max()) == 448.0  # the block holding the tensor's amax
    assert qt.scale.shape == (8, 16)
    assert lowp.rel_error(x, lowp.dequantize(qt)) < 0.15


def test_deepseek_tiles_and_blocks():
    x = lowp.make_activations(4, 512)
    qt = lowp.SCHEMES["fp8_1x128"].quantize(x)
    assert qt.scale.shape == (4, 4)
    assert torch.allclose(qt.scale, lowp.blocks(x.double(), 1, 128).abs().amax(-1) / 448, rtol=1e-6)
    w = lowp.make_weights(256, 384)
    qw = lowp.SCHEMES["fp8_128x128"].quantize(w)
    assert qw.scale.shape == (2, 3)
    assert lowp.rel_error(w, lowp.dequantize(qw)) < 0.05
    # elementwise: normals within half an E4M3 ulp (2^-4 relative) of x
    back = lowp.dequantize(qt, torch.float64)
    normal = (x.double().abs() / qt.scale.repeat_interleave(128, 1)) >= lowp.e4m3.smallest_normal
    rel = ((back - x.double()).abs() / x.double().abs())[normal]
    assert float(rel.max()) <= 2.0 ** -4 + 1e-12


def test_leading_dims_flatten_and_zero_tensor():
    x = torch.randn(2, 3, 64)
    assert lowp.fake_quantize(x, "mxfp8").shape == (2, 3, 64)
    z = torch.zeros(2, 128)
    for name in lowp.SCHEMES:
        if name == "fp8_128x128":
            continue
        assert torch.equal(lowp.fake_quantize(z, name), z.double())


def test_block_errors_order_on_outlier_tensor():
    x = lowp.make_activations(32, 1024)
    err = {n: lowp.rel_error(x, lowp.fake_quantize(x, n)) for n in ("fp8_1x128", "mxfp8", "mxfp4", "nvfp4")}
    assert err["fp8_1x128"] < err["nvfp4"] < err["mxfp4"]
    assert err["mxfp8"] < err["nvfp4"]


def test_quantized_gemm_error_small_for_fp8():
    x, w = lowp.make_activations(16, 256), lowp.make_weights(128, 256)
    assert lowp.quantized_gemm_error(x, w, "fp8_1x128", "fp8_128x128") < 0.06
    assert lowp.quantized_gemm_error(x, w, "mxfp4", "mxfp4") > lowp.quantized_gemm_error(x, w, "nvfp4", "nvfp4")


def test_accumulate():
    rng = np.random.default_rng(0)
    p = rng.standard_normal((16, 1024))
    exact = p.sum(1)
    assert np.allclose(lowp.accumulate(p, 53), exact, rtol=1e-12, atol=1e-9)
    limited = lowp.accumulate(p, 14)
    promoted = lowp.accumulate(p, 14, promote_every=128)
    err = lambda s: np.linalg.norm(s - exact) / np.linalg.norm(exact)  # noqa: E731
    assert err(promoted) < err(limited) / 3
    cps = lowp.accumulate(p, 14, 128, checkpoints=[128, 1024])
    assert np.allclose(cps[1024], promoted)
    assert lowp.round_significand(np.array([1.0 + 2 ** -20]), 14)[0] == 1.0
    assert lowp.round_significand(np.array([3.0]), 1, "nearest")[0] == 4.0
    with pytest.raises(ValueError, match="non-finite"):
        lowp.accumulate(np.array([[1.0, np.nan]]))
    with pytest.raises(ValueError, match="promote_every=0"):
        lowp.accumulate(p, 14, 0)
    with pytest.raises(ValueError, match="checkpoints"):
        lowp.accumulate(p, 14, checkpoints=[2000])


def test_bytes_and_capacity():
    assert lowp.bytes_per_param(8, 8, 32) == 1.03125
    assert lowp.bytes_per_param(4, 8, 32) == 0.53125
    assert lowp.bytes_per_param(4, 8, 16) == 0.5625
    assert lowp.SCHEMES["nvfp4"].bytes_per_element() == 0.5625
    assert lowp.SCHEMES["fp8_tensor"].bytes_per_element() == 1.0
    assert lowp.max_params_billion(80, 1.0) == 80
    assert lowp.max_params_billion(141, 2.0, reserve_fraction=0.5) == pytest.approx(35.25)
    qt = lowp.SCHEMES["mxfp4"].quantize(torch.randn(4, 64))
    assert qt.bytes() == 4 * 64 * 0.5 + 8
    with pytest.raises(ValueError, match="block_elems"):
        lowp.bytes_per_param(4, 8)
    with pytest.raises(ValueError, match="reserve_fraction"):
        lowp.max_params_billion(80, 1.0, reserve_fraction=1.0)


def test_make_activations_is_seeded_and_has_outliers():
    a, b = lowp.make_activations(8, 512, seed=3), lowp.make_activations(8, 512, seed=3)
    assert torch.equal(a, b)
    col_amax = a.abs().amax(0)
    assert float(col_amax.max()) > 10 * float(col_amax.median())
    with pytest.raises(ValueError, match="outlier_channels"):
        lowp.make_activations(4, 8, outlier_channels=9)


def test_critical_batch_weight_only_halves_and_quarters():
    from common.kernels import lowp
    bf16 = lowp.critical_batch("H100-SXM", 2.0, "bf16")
    assert bf16["m_star"] == pytest.approx(989.5 / 3.35 * 2 / 2)
    rows = {label: lowp.critical_batch("H100-SXM", b, d, f)["m_star"] / bf16["m_star"]
            for label, b, d, f, _ in lowp.WEIGHT_FORMATS}
    assert rows["W8A16 (8-bit weights, BF16 math)"] == pytest.approx(0.5)
    assert rows["W4A16 (4-bit weights, BF16 scale per 128)"] == pytest.approx(0.2578125)
    assert rows["FP8 W8A8 (128x128 FP32 scales)"] == pytest.approx(1.0, abs=1e-3)  # both operands: M* stays
    nv = lowp.critical_batch("H100-SXM", 0.5625, "fp4", "fp8")
    assert nv["gemm_dtype"] == "fp8" and "dequantized" in nv["note"]
    assert lowp.critical_batch("B200", 0.5625, "fp4", "fp8")["gemm_dtype"] == "fp4"
    with pytest.raises(ValueError):
        lowp.critical_batch("H100-SXM", 0.5625, "fp4")  # no fallback: refused
    with pytest.raises(ValueError, match="weight_bytes"):
        lowp.critical_batch("H100-SXM", 0, "bf16")
