"""Checkers for lab 05 (low precision): formats from the bit layout, rounding, FP8 tiles, MX and NVFP4 block
scaling, promoted accumulation, bytes per parameter. Each draws fresh random inputs and compares with common.lowp."""
from __future__ import annotations

import math
import random

import numpy as np
import torch

from common import lowp
from common.checks import checker, expect, expect_close, expect_equal, fail

_SPECIALS = ("ieee", "fn", "none")


def _rand_tensor(rows, cols, gen, spread=3.0):
    """Values over several orders of magnitude, rows with different sizes, a few outliers."""
    x = torch.randn(rows, cols, generator=gen, dtype=torch.float64)
    x *= torch.exp(spread * torch.randn(rows, 1, generator=gen, dtype=torch.float64))
    x.view(-1)[torch.randint(0, x.numel(), (max(1, x.numel() // 200),), generator=gen)] *= 20
    return x.to(torch.float32)


def _gen():
    return torch.Generator().manual_seed(random.SystemRandom().randrange(2**31))


def _as_tensor(v, what):
    if v is None:
        fail(f"{what} is None -- did the function forget to return it?")
    try:
        return torch.as_tensor(v).to(torch.float64)
    except Exception:
        fail(f"{what}: expected a tensor, got {type(v).__name__}")


def _unpack(out, n, what):
    if not isinstance(out, (tuple, list)) or len(out) != n:
        fail(f"{what} must return a tuple of {n} items, got {type(out).__name__}"
             f"{f' of {len(out)}' if isinstance(out, (tuple, list)) else ''}")
    return out


def _first_diff(got, exp):
    bad = ~((got == exp) | (torch.isnan(got) & torch.isnan(exp)))
    if not bool(bad.any()):
        return None
    idx = tuple(int(i) for i in torch.nonzero(bad)[0])
    return idx, int(bad.sum())


# ---------------------------------------------------------------------------------------------- 5.1
@checker("5.1", "format facts from the bit layout")
def check_format_facts(format_facts):
    """format_facts(exp_bits, man_bits, special) -> dict(max, smallest_normal, smallest_subnormal, eps)."""
    rng = random.Random()
    cases = [(f.exp_bits, f.man_bits, f.special, f.name) for f in lowp.FORMATS.values()]
    for _ in range(4):
        e, m, sp = rng.randint(2, 6), rng.randint(1, 5), rng.choice(_SPECIALS)
        cases.append((e, m, sp, f"E{e}M{m} ({sp})"))
    keys = ("max", "smallest_normal", "smallest_subnormal", "eps")
    for e, m, sp, name in cases:
        ref = lowp.Format(name, e, m, sp)
        got = format_facts(e, m, sp)
        expect(isinstance(got, dict), f"format_facts({e}, {m}, {sp!r}) must return a dict, got {type(got).__name__}")
        missing = [k for k in keys if k not in got]
        expect(not missing, f"format_facts({e}, {m}, {sp!r}) is missing keys {missing}")
        if sp != "ieee" and math.isclose(got["max"], lowp.Format(name, e, m, "ieee").max):
            fail(f"{name}: max {got['max']:g} is the IEEE answer, which keeps the top exponent code for Inf/NaN. "
                 f"This format uses the top exponent for numbers" +
                 (" (only S.1111.111 is NaN in OCP E4M3), " if sp == "fn" else " (it has no Inf or NaN), ") +
                 f"so max = {ref.max:g}")
        if sp == "fn" and math.isclose(got["max"], lowp.Format(name, e, m, "none").max):
            fail(f"{name}: max {got['max']:g} forgets that the all-ones mantissa at the top exponent is NaN in "
                 f"an 'fn' format; max = {ref.max:g}")
        if math.isclose(got["eps"], ref.eps / 2):
            fail(f"{name}: eps {got['eps']:g} is half the spacing (the unit roundoff); machine epsilon is the "
                 f"distance from 1 to the next value, 2^-{m} = {ref.eps:g}")
        for k in keys:
            expect_close(got[k], getattr(ref, k), f"{name} {k}", rtol=1e-12, atol=0)
        if ref.torch_dtype and ref.bits >= 8 and hasattr(torch, ref.torch_dtype):
            fi = torch.finfo(getattr(torch, ref.torch_dtype))
            expect_close(got["max"], fi.max, f"{name} max vs torch.finfo", rtol=1e-12, atol=0)
            expect_close(got["eps"], fi.eps, f"{name} eps vs torch.finfo", rtol=1e-12, atol=0)
    return f"{len(cases)} layouts right (E4M3 max 448, E5M2 57344, E2M1 6; agrees with torch.finfo)"


# ---------------------------------------------------------------------------------------------- 5.2
@checker("5.2", "round to FP8 E4M3 (nearest-even, saturating)")
def check_round_to_e4m3(round_to_e4m3):
    """round_to_e4m3(x) -> tensor of E4M3 values nearest to x (ties to even), +-448 beyond the range."""
    gen = _gen()
    grid = torch.tensor(lowp.e4m3.values(), dtype=torch.float64)
    mids = (grid[1:] + grid[:-1]) / 2
    ties = torch.cat([mids, -mids])
    x = torch.cat([ties, grid, -grid, torch.tensor([464.0, 470.0, 500.0, 1e4, -1e6, 0.0]),
                   (torch.randn(2000, generator=gen, dtype=torch.float64)
                    * torch.exp(3 * torch.randn(2000, generator=gen, dtype=torch.float64)))]).to(torch.float32)
    got = _as_tensor(round_to_e4m3(x.clone()), "round_to_e4m3(x)")
    expect_equal(tuple(got.shape), tuple(x.shape), "output shape")
    ref = lowp.round_to(x, lowp.e4m3, saturate=True)
    big = x.abs() > 448
    if bool((~torch.isfinite(got[big])).any()) or bool((got[big].abs() > 448).any()):
        i = int(torch.nonzero(big & (~torch.isfinite(got) | (got.abs() > 448)))[0])
        fail(f"no saturation: x = {float(x[i]):g} gave {float(got[i]):g}; values beyond the range must clamp to "
             f"+-448 (E4M3 has no Inf, and a scaled tensor's amax lands on 448)")
    d = _first_diff(got, ref)
    if d is not None:
        (i,), n = d
        xv, g, r = float(x[i]), float(got[i]), float(ref[i])
        flushed = (x.abs() < lowp.e4m3.smallest_normal) & (got == 0) & (ref != 0)
        if bool(flushed.any()):
            j = int(torch.nonzero(flushed)[0])
            fail(f"x = {float(x[j]):g} flushed to 0; E4M3 has subnormals down to 2^-9 = "
                 f"{lowp.e4m3.smallest_subnormal:g}: below 2^-6 the step stays 2^-9 (expected {float(ref[j]):g})")
        if bool((ties == x[i].double()).any()) and abs(abs(g) - abs(xv)) == abs(abs(r) - abs(xv)):
            fail(f"tie x = {xv:g} (halfway between two E4M3 values) gave {g:g}; round half to EVEN gives {r:g} "
                 f"(the neighbour whose last mantissa bit is 0). Hint: torch.round rounds half to even; "
                 f"floor(v + 0.5) does not ({n} values wrong)")
        fail(f"x = {xv:g}: expected {r:g}, got {g:g} ({n} of {x.numel()} values wrong)")
    cast = lowp.torch_cast(x, lowp.e4m3)
    expect(bool((cast == got).all()), "your rounding disagrees with torch's float8_e4m3fn cast")
    return f"{x.numel()} values right: ties to even, subnormals, saturation at 448 (matches torch's cast)"


# ---------------------------------------------------------------------------------------------- shared
def _check_blockwise(fn_name, out, x, bm, bk, elem, ref_scale, scale_name):
    """Shape, axis, scale values, saturation, rounding of a (q, scale) result."""
    q, scale = _unpack(out, 2, fn_name)
    q, scale = _as_tensor(q, "q"), _as_tensor(scale, "scale")
    M, K = x.shape
    expect_equal(tuple(q.shape), (M, K), "q shape (same as x)")
    want = (M // bm, K // bk)
    wrong_axis = (M // bk, K // bm)
    if tuple(scale.shape) != want:
        if tuple(scale.shape) == wrong_axis and want != wrong_axis:
            fail(f"wrong block axis: scale has shape {tuple(scale.shape)}, i.e. blocks of {bk}x{bm} running down "
                 f"the columns; blocks are {bm}x{bk}, contiguous along the LAST dimension (K, the reduction "
                 f"dimension of the GEMM), so scale must have shape {want}")
        fail(f"scale shape: expected {want} (one per {bm}x{bk} block), got {tuple(scale.shape)}")
    if not torch.allclose(scale, ref_scale, rtol=1e-6, atol=0):
        if bm == 1 and M % bk == 0:
            wrong = lowp.quantize(x.T.contiguous(), elem, (1, bk), scale_name).scale.T.reshape(-1)
            if wrong.numel() == scale.numel() and torch.allclose(scale.reshape(-1).sort().values,
                                                                wrong.sort().values, rtol=1e-6):
                fail(f"wrong block axis: your scales are those of blocks of {bk} consecutive ROWS (down a column); "
                     f"a block is {bk} consecutive elements of a row (along K)")
    return q, scale


def _expand(scale, bm, bk):
    return scale.repeat_interleave(bm, 0).repeat_interleave(bk, 1)


def _check_elements(q, x, s_full, elem):
    """Elements saturated, on the grid, and the nearest-even rounding of x / scale."""
    over = q.abs() > elem.max
    if bool(over.any()) or not bool(torch.isfinite(q).all()):
        idx = tuple(int(i) for i in torch.nonzero(over | ~torch.isfinite(q))[0])
        fail(f"no saturation: q{idx} = {float(q[idx]):g} lies outside +-{elem.max:g} ({elem.name}'s range); "
             f"x / scale = {float(x[idx] / s_full[idx]):g} must clamp to +-{elem.max:g}")
    ref_q = lowp.round_to(x.double() / s_full, elem, saturate=True)
    d = _first_diff(q, ref_q)
    if d is not None:
        idx, n = d
        on_grid = bool((lowp.round_to(q[idx], elem) == q[idx]))
        fail(f"element {idx}: x / scale = {float(x[idx] / s_full[idx]):.6g} should round to {float(ref_q[idx]):g} "
             f"in {elem.name}, got {float(q[idx]):g}" + ("" if on_grid else f" (not a {elem.name} value at all)")
             + f"; {n} of {q.numel()} elements differ")


# ---------------------------------------------------------------------------------------------- 5.3
@checker("5.3", "DeepSeek-V3 fine-grained FP8 (1x128 tiles, 128x128 blocks)")
def check_quantize_fp8_blockwise(quantize_fp8_blockwise):
    """quantize_fp8_blockwise(x, block=(bm, bk)) -> (q, scale): q E4M3 values of x's shape, scale FP32 amax/448
    per block with shape (M/bm, K/bk); raises ValueError when the block does not tile x."""
    gen, rng = _gen(), random.Random()
    cases = [((1, 128), 128, 128 * rng.randint(2, 3)), ((128, 128), 128 * rng.randint(1, 2), 128 * rng.randint(1, 2))]
    for block, M, K in cases:
        x = _rand_tensor(M, K, gen)
        ref = lowp.quantize(x, lowp.e4m3, block, "fp32")
        out = quantize_fp8_blockwise(x.clone(), block)
        if isinstance(out, (tuple, list)) and len(out) == 2:
            s = _as_tensor(out[1], "scale")
            if s.shape == ref.scale.shape and torch.allclose(s, 1 / ref.scale, rtol=1e-5):
                fail("scale is upside down: you returned 448 / amax. The scale is what q is multiplied by to get "
                     "x back: scale = amax / 448, q = x / scale")
        q, s = _check_blockwise("quantize_fp8_blockwise", out, x, *block, lowp.e4m3, ref.scale, "fp32")
        expect_close(s, ref.scale, f"scale for block {block} (amax / 448 per block, in FP32)", rtol=1e-6, atol=0)
        _check_elements(q, x, _expand(s, *block), lowp.e4m3)
    bad = _rand_tensor(4, 200, gen)
    try:
        quantize_fp8_blockwise(bad, (1, 128))
    except ValueError:
        pass
    else:
        fail("x of shape (4, 200) with block (1, 128): 128 does not divide 200, so the function must refuse "
             "(raise ValueError naming the block and the shape) instead of quantizing a partial tile silently")
    return "1x128 activation tiles and 128x128 weight blocks right; a block that does not tile x is refused"


# ---------------------------------------------------------------------------------------------- 5.4
@checker("5.4", "MX block scaling (E8M0 power-of-two scale)")
def check_mx_quantize(mx_quantize):
    """mx_quantize(x, elem, block=32) -> (q, scale): scale = 2^(floor(log2 amax) - elem.emax) per 1 x block tile,
    q = x / scale rounded to elem (nearest-even) and saturated."""
    gen, rng = _gen(), random.Random()
    for elem in (lowp.e2m1, lowp.e4m3):
        M, K = 32 * rng.randint(1, 3), 32 * rng.randint(2, 6)
        x = _rand_tensor(M, K, gen)
        ref = lowp.quantize(x, elem, (1, 32), "e8m0")
        out = mx_quantize(x.clone(), elem, 32)
        q, s = _check_blockwise("mx_quantize", out, x, 1, 32, elem, ref.scale, "e8m0")
        not_pow2 = ~lowp.is_power_of_two(s)
        if bool(not_pow2.any()):
            idx = tuple(int(i) for i in torch.nonzero(not_pow2)[0])
            hint = " -- that is amax / elem.max, an FP32 scale" if math.isclose(
                float(s[idx]), float(x[idx[0], idx[1] * 32:(idx[1] + 1) * 32].abs().max()) / elem.max,
                rel_tol=1e-5) else ""
            fail(f"E8M0 scales must be powers of two, but scale{idx} = {float(s[idx]):.6g}{hint}. "
                 f"MX uses 2^(floor(log2(amax)) - emax_elem), emax_elem = {elem.emax} for {elem.name}")
        if not torch.equal(s, ref.scale):
            ceil = lowp.quantize(x, elem, (1, 32), "e8m0", e8m0_rounding="ceil").scale
            idx = tuple(int(i) for i in torch.nonzero(s != ref.scale)[0])
            if torch.equal(s, ceil):
                fail(f"scale{idx} = {float(s[idx]):g}: you rounded the exponent up (2^ceil(log2(amax/{elem.max:g}))"
                     f", a variant that never saturates). OCP MX v1.0 takes floor(log2(amax)) - {elem.emax} = "
                     f"{float(ref.scale[idx]):g} and saturates the few elements that land above {elem.max:g}")
            fail(f"scale{idx}: expected 2^(floor(log2 amax) - {elem.emax}) = {float(ref.scale[idx]):g}, got "
                 f"{float(s[idx]):g}")
        _check_elements(q, x, _expand(s, 1, 32), elem)
    return "MXFP4 and MXFP8 right: power-of-two scales per 32 elements along K, saturation above the element max"


# ---------------------------------------------------------------------------------------------- 5.5
@checker("5.5", "NVFP4 two-level scaling")
def check_nvfp4_quantize(nvfp4_quantize):
    """nvfp4_quantize(x) -> (q, block_scale, tensor_scale): tensor_scale = amax / (6 * 448) in FP32; block_scale
    = E4M3 rounding of block_amax / 6 / tensor_scale per 1x16 tile; q = x / (block_scale * tensor_scale) in E2M1."""
    gen, rng = _gen(), random.Random()
    for magnitude in (1.0, 1e4):
        M, K = rng.randint(2, 6), 32 * rng.randint(1, 4)
        x = _rand_tensor(M, K, gen) * magnitude
        ref = lowp.quantize(x, lowp.e2m1, (1, 16), "e4m3", tensor_scale=True)
        q, bs, ts = _unpack(nvfp4_quantize(x.clone()), 3, "nvfp4_quantize")
        bs = _as_tensor(bs, "block_scale")
        try:
            ts = float(ts)
        except (TypeError, ValueError):
            fail(f"tensor_scale must be one number, got {type(ts).__name__}")
        if tuple(bs.shape) == (M, K // 32):
            fail(f"block_scale has shape {tuple(bs.shape)}: one scale per 32 elements is MXFP4's block; NVFP4 "
                 f"uses 16-element blocks, so expect {(M, K // 16)}")
        if ts == 1.0 and ref.tensor_scale != 1.0:
            fail(f"tensor_scale is 1: NVFP4's second level is amax / (6 * 448) = {ref.tensor_scale:.6g} for this "
                 f"tensor (amax {float(x.abs().max()):.4g}); without it the E4M3 block scales saturate at 448 or "
                 f"underflow")
        expect_close(ts, ref.tensor_scale, "tensor_scale (amax / (6 * 448), FP32)", rtol=1e-6, atol=0)
        q, bs = _check_blockwise("nvfp4_quantize", (q, bs), x, 1, 16, lowp.e2m1, ref.block_scale, "e4m3")
        off_grid = lowp.round_to(bs, lowp.e4m3) != bs
        if bool(off_grid.any()):
            idx = tuple(int(i) for i in torch.nonzero(off_grid)[0])
            fail(f"block_scale{idx} = {float(bs[idx]):.6g} is not an FP8 E4M3 value: NVFP4 stores block scales in "
                 f"E4M3, so round block_amax / 6 / tensor_scale to E4M3 (it becomes {float(ref.block_scale[idx]):g})")
        expect_close(bs, ref.block_scale, "block_scale (E4M3 of block_amax / 6 / tensor_scale)", rtol=0, atol=0)
        _check_elements(q, x, _expand(bs * ts, 1, 16), lowp.e2m1)
    return "tensor scale, E4M3 block scales per 16 elements and E2M1 elements right, for small and large tensors"


# ---------------------------------------------------------------------------------------------- 5.6
@checker("5.6", "accumulate with promotion to FP32")
def check_promoted_sum(promoted_sum):
    """promoted_sum(products, acc_bits, promote_every) -> sums (batch,), the limited accumulator added into an FP32
    total every `promote_every` products and restarted; rounding via lowp.round_significand (truncate)."""
    rng = np.random.default_rng(random.SystemRandom().randrange(2**31))
    for acc_bits, every, K in [(14, 128, 1000), (10, 32, 300), (14, 128, 512)]:
        p = rng.standard_normal((8, K)) * np.exp(rng.standard_normal((8, 1)))
        ref = lowp.accumulate(p, acc_bits, every)
        got = promoted_sum(p.copy(), acc_bits, every)
        expect(got is not None, "promoted_sum returned None -- return the sums")
        got = np.asarray(got, dtype=np.float64)
        expect_equal(tuple(got.shape), (8,), "shape of the sums (one per row)")
        never = lowp.accumulate(p, acc_bits, None)
        if np.allclose(got, never, rtol=1e-12) and not np.allclose(ref, never, rtol=1e-12):
            fail("you never promote: the limited accumulator runs over all K products. Every "
                 f"{every} products add it into the FP32 total and start it again from 0")
        exact = p.sum(axis=1)
        if np.abs(got - exact).max() > 10 * np.abs(ref - exact).max() + 1e-9:
            fail(f"sums far from the exact ones (largest error {np.abs(got - exact).max():.3g}, the reference "
                 f"model's is {np.abs(ref - exact).max():.3g}): did you forget to restart the limited accumulator "
                 f"at 0 after adding it to the FP32 total?")
        expect_close(got, ref, f"sums (acc_bits={acc_bits}, promote_every={every}, K={K})", rtol=1e-6,
                     atol=1e-6 * float(np.abs(p).sum(axis=1).max()))
    return "limited accumulator promoted into FP32 every N products, including a ragged last group"


# ---------------------------------------------------------------------------------------------- 5.7
@checker("5.7", "bytes per parameter with scale overhead")
def check_bytes_per_param(bytes_per_param):
    """bytes_per_param(elem_bits, scale_bits, block_elems) -> bytes per element, scales included."""
    rng = random.Random()
    cases = [(8, 8, 32), (4, 8, 32), (4, 8, 16), (8, 32, 128), (8, 32, 16384)] + [
        (rng.choice([4, 6, 8, 16]), rng.choice([8, 16, 32]), rng.choice([16, 32, 64, 128])) for _ in range(4)]
    for e, s, b in cases:
        got = bytes_per_param(e, s, b)
        expected = lowp.bytes_per_param(e, s, b)
        if got is not None and math.isclose(got, e / 8):
            fail(f"bytes_per_param({e}, {s}, {b}) = {got:g} leaves out the scale: one {s}-bit scale per {b} "
                 f"elements adds {s / 8 / b:g} bytes per element ({expected:g} in all)")
        if got is not None and math.isclose(got, e / 8 + s / b):
            fail(f"bytes_per_param({e}, {s}, {b}) = {got:g} counts the scale in bits, not bytes: {s}/8/{b}")
        expect_close(got, expected, f"bytes_per_param({e}, {s}, {b})", rtol=1e-12)
    return "right for MXFP8 (1.03125), MXFP4 (0.53125), NVFP4 (0.5625) and DeepSeek's FP8 tiles"
