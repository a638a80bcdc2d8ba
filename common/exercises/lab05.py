"""Checkers for lab 05 (low precision): formats from the bit layout, rounding, FP8 tiles, MX and NVFP4 block
scaling, promoted accumulation, bytes per parameter, and the build exercise: DeepSeek-V3's FP8 linear layer end to end
(common.exercises.fp8_linear). Each runs fixed cases (every format
and block shape it accepts, asymmetric shapes first) and then random ones drawn from a fresh seed, which a failure
prints (pass `seed=` to the check to replay it); each compares with common.kernels.lowp / common.kernels.scaled_gemm."""
from __future__ import annotations

import functools
import math

import numpy as np
import torch

from common.core.checks import CheckFailed, checker, expect, expect_close, expect_equal, fail, near
from common.exercises.blockwise import (
    Float8Watch,
    as_tensor,
    check_blockwise,
    check_elements,
    expand,
    expect_refusal,
    first_diff,
    rand_tensor,
    unpack,
    with_zero_block,
)
from common.exercises import fp8_linear as _fp8
from common.exercises import lowp_mistakes as named
from common.exercises.cases import learner_call, replayable
from common.kernels import lowp, scaled_gemm

_SPECIALS = ("ieee", "fn", "none")


# What each exercise asks the learner to write: calling these references in its place is caught (other helpers of
# common.kernels.lowp that the exercise text offers -- blocks, unblocks, round_to where allowed, round_significand -- are fine).
_REFERENCES = {
    "5.2": (lowp.round_to, lowp.torch_cast),
    "5.3": (lowp.quantize, lowp.fake_quantize, scaled_gemm.quantize_fp8),
    "5.4": (lowp.quantize, lowp.fake_quantize),
    "5.5": (lowp.quantize, lowp.fake_quantize),
    "5.6": (lowp.accumulate,),
    "5.7": (lowp.bytes_per_param,),
    "5.8": (scaled_gemm.scaled_mm_fine_grained, scaled_gemm.quantize_fp8, lowp.quantize, lowp.fake_quantize),
}


# 5.1 asks for what lowp.Format computes: reading its properties (from a Format of your own or from lowp.FORMATS) is
# calling the reference
_FORMAT_FACTS = tuple(getattr(lowp.Format, p).fget for p in ("max", "smallest_normal", "smallest_subnormal", "eps",
                                                             "emax", "emin", "bias"))


# What each exercise hands the learner from the workbook's library (every other call into it is refused: helpers that
# together do the exercise are a route around it). Format's properties (elem.emax, elem.max) are handed out from 5.2 on.
_FORMAT = "common.kernels.lowp.formats.Format"
_BLOCKS = ("common.kernels.lowp.block_scaling.blocks", "common.kernels.lowp.block_scaling.unblocks")
_ALLOWED = {
    "5.1": (),
    "5.2": (_FORMAT,),
    "5.3": (_FORMAT, "common.kernels.lowp.formats.round_to") + _BLOCKS,
    "5.4": (_FORMAT, "common.kernels.lowp.formats.round_to") + _BLOCKS,
    "5.5": (_FORMAT, "common.kernels.lowp.formats.round_to") + _BLOCKS,
    "5.6": ("common.kernels.lowp.accuracy.round_significand",),
    "5.7": (),
    "5.8": (_FORMAT,) + _BLOCKS,
}


def _call(exercise, fn, args, call, used):
    """learner_call with the exercise's references and the library watch (what the exercise hands out allowed)."""
    return learner_call(fn, args, call, _REFERENCES.get(exercise, ()), used, allowed=_ALLOWED[exercise], library=True)


def _names_calls(check):
    """check(fn, cases) with `cases.used`, the set of the workbook's functions the learner's code called; a verdict on
    wrong numbers also says what was called (a call that does the exercise is the likelier story)."""
    @functools.wraps(check)
    def run(fn, cases):
        cases.used = set()
        try:
            return check(fn, cases)
        except CheckFailed as exc:
            if cases.used and "come from" not in str(exc):
                raise CheckFailed(f"{exc}; and your code called {', '.join(sorted(cases.used))}, the workbook's own "
                                  f"code, which this exercise asks you to write yourself") from None
            raise
    return run


def _refuse_references(used, task):
    if used:
        fail(f"the numbers are right, but they come from {', '.join(sorted(used))}: this exercise is to {task} "
             f"yourself (the exercise text lists the helpers you may use)")


# ---------------------------------------------------------------------------------------------- 5.1
@checker("5.1", "format facts from the bit layout")
@replayable
def check_format_facts(format_facts, cases):
    """format_facts(exp_bits, man_bits, special) -> dict(max, smallest_normal, smallest_subnormal, eps)."""
    rng = cases.rng
    cases_ = [(f.exp_bits, f.man_bits, f.special, f.name) for f in lowp.FORMATS.values()]
    for _ in range(4):
        e, m, sp = rng.randint(2, 6), rng.randint(1, 5), rng.choice(_SPECIALS)
        cases_.append((e, m, sp, f"E{e}M{m} ({sp})"))
    keys = ("max", "smallest_normal", "smallest_subnormal", "eps")
    used = set()
    for e, m, sp, name in cases_:
        ref = lowp.Format(name, e, m, sp)
        got = learner_call(format_facts, (e, m, sp), f"format_facts({e}, {m}, {sp!r})", _FORMAT_FACTS, used,
                           library=True)
        if used:  # lowp.Format does this exercise: reading its properties (or building one) is the reference's answer
            names = sorted(used)
            fail(f"format_facts({e}, {m}, {sp!r}) called {', '.join(names[:3])}{', ...' if len(names) > 3 else ''}: "
                 f"lowp.Format is the workbook's reference for these facts; compute them from the bit layout "
                 f"yourself (bias, top exponent, mantissa bits)")
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
        named.format_mistakes(got, e, m, sp, name, ref)
        for k in keys:
            expect_close(got[k], getattr(ref, k), f"{name} {k}", rtol=1e-12, atol=0)
        if ref.torch_dtype and ref.bits >= 8 and hasattr(torch, ref.torch_dtype):
            fi = torch.finfo(getattr(torch, ref.torch_dtype))
            expect_close(got["max"], fi.max, f"{name} max vs torch.finfo", rtol=1e-12, atol=0)
            expect_close(got["eps"], fi.eps, f"{name} eps vs torch.finfo", rtol=1e-12, atol=0)
    return f"{len(cases_)} layouts right (E4M3 max 448, E5M2 57344, E2M1 6; agrees with torch.finfo)"


# ---------------------------------------------------------------------------------------------- 5.2
@checker("5.2", "round to FP8 E4M3 (nearest-even, saturating)",
         in_kernel="it watches the learner's torch calls for a cast to float8")
@replayable
@_names_calls
def check_round_to_e4m3(round_to_e4m3, cases):
    """round_to_e4m3(x) -> tensor of E4M3 values nearest to x (ties to even), +-448 beyond the range."""
    gen = cases.gen
    grid = torch.tensor(lowp.e4m3.values(), dtype=torch.float64)
    mids = (grid[1:] + grid[:-1]) / 2
    ties = torch.cat([mids, -mids])
    x = torch.cat([ties, grid, -grid, torch.tensor([464.0, 470.0, 500.0, 1e4, -1e6, 0.0]),
                   (torch.randn(2000, generator=gen, dtype=torch.float64)
                    * torch.exp(3 * torch.randn(2000, generator=gen, dtype=torch.float64)))]).to(torch.float32)
    used = cases.used
    with Float8Watch() as watch:  # a cast to FP8 does the rounding for you
        got = _call("5.2", round_to_e4m3, (x.clone(),), f"round_to_e4m3(x of shape {tuple(x.shape)})", used)
    got = as_tensor(got, "round_to_e4m3(x)")
    expect_equal(tuple(got.shape), tuple(x.shape), "output shape")
    ref = lowp.round_to(x, lowp.e4m3, saturate=True)
    big = x.abs() > 448
    if bool((~torch.isfinite(got[big])).any()) or bool((got[big].abs() > 448).any()):
        i = int(torch.nonzero(big & (~torch.isfinite(got) | (got.abs() > 448)))[0])
        fail(f"no saturation: x = {float(x[i]):g} gave {float(got[i]):g}; values beyond the range must clamp to "
             f"+-448 (E4M3 has no Inf, and a scaled tensor's amax lands on 448)")
    d = first_diff(got, ref)
    if d is not None:
        (i,), n = d
        xv, g, r = float(x[i]), float(got[i]), float(ref[i])
        for variant, message in named.ROUNDING_MISTAKES:
            if torch.equal(got.double(), variant(x)):
                fail(f"x = {xv:g} gave {g:g}, expected {r:g}: {message} ({n} of {x.numel()} values wrong)")
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
    if watch.used:
        used.add("a cast to a torch float8 dtype")
    _refuse_references(used, "round with torch arithmetic")
    return f"{x.numel()} values right: ties to even, subnormals, saturation at 448 (matches torch's cast)"


# ---------------------------------------------------------------------------------------------- 5.3
@checker("5.3", "DeepSeek-V3 fine-grained FP8 (1x128 tiles, 128x128 blocks)")
@replayable
@_names_calls
def check_quantize_fp8_blockwise(quantize_fp8_blockwise, cases):
    """quantize_fp8_blockwise(x, block=(bm, bk)) -> (q, scale): q E4M3 values of x's shape, scale FP32 amax/448
    per block with shape (M/bm, K/bk); raises ValueError when the block does not tile x (in either axis)."""
    gen, rng, used = cases.gen, cases.rng, cases.used
    cases_ = [((1, 128), 128, 384, True), ((128, 128), 256, 128, True), ((2, 64), 64, 256, True),
              ((1, 128), 128, 128 * rng.randint(2, 3), False),
              ((128, 128), 128 * rng.randint(1, 2), 128 * rng.randint(1, 2), False)]
    # the refusals first: they are cheap, and a learner who pads silently hears it at once
    expect_refusal(quantize_fp8_blockwise, "quantize_fp8_blockwise(x of shape (4, 200), block=(1, 128))",
                    rand_tensor(4, 200, gen), (1, 128))
    expect_refusal(quantize_fp8_blockwise, "quantize_fp8_blockwise(x of shape (100, 256), block=(128, 128))",
                    rand_tensor(100, 256, gen), (128, 128))
    for block, M, K, with_zero in cases_:
        x = rand_tensor(M, K, gen)
        if with_zero:
            x = with_zero_block(x, *block)
        ref = lowp.quantize(x, lowp.e4m3, block, "fp32")
        out = _call("5.3", quantize_fp8_blockwise, (x.clone(), block),
                    f"quantize_fp8_blockwise(x of shape {(M, K)}, block={block})", used)
        if isinstance(out, (tuple, list)) and len(out) == 2:
            s = as_tensor(out[1], "scale")
            if s.shape == ref.scale.shape and torch.allclose(s, 1 / ref.scale, rtol=1e-5):
                fail("scale is upside down: you returned 448 / amax. The scale is what q is multiplied by to get "
                     "x back: scale = amax / 448, q = x / scale")
            named.name_divisor(s, ref.scale)
        q, s = check_blockwise("quantize_fp8_blockwise", out, x, *block, lowp.e4m3, ref.scale, "fp32")
        expect_close(s, ref.scale, f"scale for block {block}, x of shape {(M, K)} (amax / 448 per block, in FP32)",
                     rtol=1e-6, atol=0)
        check_elements(q, x, expand(s, *block), lowp.e4m3)
        _refuse_references(used, "compute the block scales and the rounding")  # this case right: say so at once
    _refuse_references(used, "compute the block scales and the rounding")
    return ("1x128 tiles, 128x128 blocks and a 2x64 block right, all-zero blocks with finite scales; a block that does "
            "not tile x (K or rows) is refused")


# ---------------------------------------------------------------------------------------------- 5.4
@checker("5.4", "MX block scaling (E8M0 power-of-two scale)")
@replayable
@_names_calls
def check_mx_quantize(mx_quantize, cases):
    """mx_quantize(x, elem, block=32) -> (q, scale): scale = 2^(floor(log2 amax) - elem.emax) per 1 x block tile,
    q = x / scale rounded to elem (nearest-even) and saturated."""
    gen, rng, used = cases.gen, cases.rng, cases.used
    cases_ = [(lowp.e2m1, 32, 64, 96, True), (lowp.e4m3, 32, 2, 64, True), (lowp.e5m2, 32, 2, 64, False),
              (lowp.e2m1, 16, 2, 48, True), (lowp.e4m3, 64, 2, 128, False),
              (rng.choice([lowp.e2m1, lowp.e4m3]), 32, 32 * rng.randint(1, 3), 32 * rng.randint(2, 6), False)]
    for elem, block, M, K, with_zero in cases_:
        x = rand_tensor(M, K, gen)
        if with_zero:
            x = with_zero_block(x, 1, block)
        ref = lowp.quantize(x, elem, (1, block), "e8m0")
        what = f"mx_quantize(x of shape {(M, K)}, {elem.name}, block={block})"
        out = _call("5.4", mx_quantize, (x.clone(), elem, block), what, used)
        q, s = check_blockwise(what, out, x, 1, block, elem, ref.scale, "e8m0")
        not_pow2 = ~lowp.is_power_of_two(s)
        if bool(not_pow2.any()):
            idx = tuple(int(i) for i in torch.nonzero(not_pow2)[0])
            hint = " -- that is amax / elem.max, an FP32 scale" if math.isclose(
                float(s[idx]), float(x[idx[0], idx[1] * block:(idx[1] + 1) * block].abs().max()) / elem.max,
                rel_tol=1e-5) else ""
            fail(f"{what}: E8M0 scales must be powers of two, but scale{idx} = {float(s[idx]):.9g}{hint}. "
                 f"MX uses 2^(floor(log2(amax)) - emax_elem), emax_elem = {elem.emax} for {elem.name}")
        if not torch.equal(s, ref.scale):
            ceil = lowp.quantize(x, elem, (1, block), "e8m0", e8m0_rounding="ceil").scale
            idx = tuple(int(i) for i in torch.nonzero(s != ref.scale)[0])
            if torch.equal(s, ceil):
                fail(f"{what}: scale{idx} = {float(s[idx]):g}: you rounded the exponent up (2^ceil(log2(amax/"
                     f"{elem.max:g}))), a variant that never saturates). OCP MX v1.0 takes floor(log2(amax)) - "
                     f"{elem.emax} = {float(ref.scale[idx]):g} and saturates the few elements above {elem.max:g}")
            named.name_mx_exponent(what, s, ref.scale, lowp.blocks(x.double(), 1, block).abs().amax(-1), elem, idx)
            fail(f"{what}: scale{idx}: expected 2^(floor(log2 amax) - {elem.emax}) = {float(ref.scale[idx]):g}, got "
                 f"{float(s[idx]):g}")
        check_elements(q, x, expand(s, 1, block), elem)
        _refuse_references(used, "compute the E8M0 scales")
    _refuse_references(used, "compute the E8M0 scales")
    return ("MXFP4, MXFP8 (E4M3 and E5M2) right for blocks of 16, 32 and 64: power-of-two scales along K, "
            "saturation above the element max, all-zero blocks with finite scales")


# ---------------------------------------------------------------------------------------------- 5.5
@checker("5.5", "NVFP4 two-level scaling")
@replayable
@_names_calls
def check_nvfp4_quantize(nvfp4_quantize, cases):
    """nvfp4_quantize(x) -> (q, block_scale, tensor_scale): tensor_scale = amax / (6 * 448) in FP32; block_scale
    = E4M3 rounding of block_amax / 6 / tensor_scale per 1x16 tile; q = x / (block_scale * tensor_scale) in E2M1."""
    gen, rng, used = cases.gen, cases.rng, cases.used
    for magnitude, M, K, with_zero in [(1.0, 3, 64, True), (1e4, 2, 96, False), (1e-3, 4, 32, True),
                                       (1.0, 4, 64, "just above"), (1.0, rng.randint(2, 6), 32 * rng.randint(1, 4),
                                                                    False)]:
        x = rand_tensor(M, K, gen) * magnitude
        if with_zero == "just above":
            x = _amax_just_above_e4m3(x, gen)
        elif with_zero:
            x = with_zero_block(x, 1, 16)
        ref = lowp.quantize(x, lowp.e2m1, (1, 16), "e4m3", tensor_scale=True)
        what = f"nvfp4_quantize(x of shape {(M, K)}, amax {float(x.abs().max()):.4g})"
        q, bs, ts = unpack(_call("5.5", nvfp4_quantize, (x.clone(),), what, used), 3, "nvfp4_quantize")
        bs = as_tensor(bs, "block_scale")
        try:
            ts = float(ts)
        except (TypeError, ValueError):
            fail(f"{what}: tensor_scale must be one number, got {type(ts).__name__}")
        if tuple(bs.shape) == (M, K // 32) and K // 32 != K // 16:
            fail(f"{what}: block_scale has shape {tuple(bs.shape)}: one scale per 32 elements is MXFP4's block; "
                 f"NVFP4 uses 16-element blocks, so expect {(M, K // 16)}")
        if ts == 1.0 and ref.tensor_scale != 1.0:
            fail(f"{what}: tensor_scale is 1: NVFP4's second level is amax / (6 * 448) = {ref.tensor_scale:.9g} for "
                 f"this tensor; without it the E4M3 block scales saturate at 448 or underflow")
        amax = float(x.abs().max())
        for top, why in ((6.0, "amax / 6 leaves out E4M3's 448"), (448.0, "amax / 448 leaves out E2M1's 6"),
                         (6.0 * 240, "6 x 240 uses the IEEE-style E4M3 max; OCP E4M3 reaches 448")):
            if amax and math.isclose(ts, amax / top, rel_tol=1e-5):
                fail(f"{what}: tensor_scale = {ts:.6g}: {why}; the tensor scale is amax / (6 * 448) = "
                     f"{ref.tensor_scale:.9g}, so the block scales land in E4M3's range")
        expect_close(ts, ref.tensor_scale, f"{what}: tensor_scale (amax / (6 * 448), FP32)", rtol=1e-6, atol=0)
        bs_t = as_tensor(bs, "block_scale").double()
        if bs_t.shape == ref.block_scale.shape and torch.allclose(bs_t, ref.block_scale * ref.tensor_scale,
                                                                  rtol=1e-6) and ref.tensor_scale != 1:
            fail(f"{what}: block_scale holds block_scale x tensor_scale (the whole decoding scale): return the E4M3 "
                 f"block scale alone; a GEMM multiplies the two levels back together")
        down = lowp.round_to(lowp.blocks(x.double(), 1, 16).abs().amax(-1) / 6 / ref.tensor_scale, lowp.e4m3,
                             rounding="truncate")
        if bs_t.shape == ref.block_scale.shape and not torch.equal(bs_t, ref.block_scale) and torch.equal(bs_t, down):
            fail(f"{what}: the block scales were truncated (rounded DOWN to an E4M3 value): round block_amax / 6 / "
                 f"tensor_scale to the NEAREST E4M3 value")
        q, bs = check_blockwise("nvfp4_quantize", (q, bs), x, 1, 16, lowp.e2m1, ref.block_scale, "e4m3")
        up = named.e4m3_up(lowp.blocks(x.double(), 1, 16).abs().amax(-1) / 6 / ref.tensor_scale)
        if not torch.equal(bs, ref.block_scale) and torch.equal(bs, up.to(bs.dtype)):
            idx = tuple(int(i) for i in torch.nonzero(bs != ref.block_scale)[0])
            fail(f"{what}: block_scale{idx} = {float(bs[idx]):g}: you rounded block_amax / 6 / tensor_scale UP to the "
                 f"next E4M3 value; NVFP4 rounds it to the NEAREST ({float(ref.block_scale[idx]):g}), as every cast "
                 f"to E4M3 does")
        off_grid = lowp.round_to(bs, lowp.e4m3) != bs
        if bool(off_grid.any()):
            idx = tuple(int(i) for i in torch.nonzero(off_grid)[0])
            fail(f"{what}: block_scale{idx} = {float(bs[idx]):.9g} is not an FP8 E4M3 value: NVFP4 stores block "
                 f"scales in E4M3, so round block_amax / 6 / tensor_scale to E4M3 (it becomes "
                 f"{float(ref.block_scale[idx]):g})")
        expect_close(bs, ref.block_scale, f"{what}: block_scale (E4M3 of block_amax / 6 / tensor_scale)", rtol=0,
                     atol=0)
        s_full = expand(bs * ts, 1, 16)
        check_elements(q, x, torch.where(s_full > 0, s_full, torch.ones_like(s_full)), lowp.e2m1, ignore=s_full == 0)
        _refuse_references(used, "compute the two levels of scales")
    _refuse_references(used, "compute the two levels of scales")
    return ("tensor scale, E4M3 block scales per 16 elements and E2M1 elements right for amax from 1e-3 to 1e4; "
            "all-zero blocks give q = 0 and a finite scale")


def _amax_just_above_e4m3(x, gen):
    """x whose 1x16 blocks have amax / 6 / tensor_scale 3-5% above an E4M3 value (nearest rounds down, up rounds up),
    the block holding the global amax excepted (it lands on 448)."""
    x = x.clone()
    b = x.view(x.shape[0], -1, 16)
    amax = b.abs().amax(-1)
    ts = float(amax.max()) / (6 * 448)
    grid = torch.tensor([g for g in sorted(set(lowp.e4m3.values())) if 4 <= g <= 300], dtype=torch.float64)
    pick = grid[torch.randint(0, grid.numel(), amax.shape, generator=gen)]
    target = pick * (1.03 + 0.02 * torch.rand(amax.shape, generator=gen, dtype=torch.float64)) * 6 * ts
    top = amax == amax.max()
    ratio = torch.where(top | (amax == 0), torch.ones_like(target), target / amax.double().clamp_min(1e-30))
    b *= ratio[..., None].to(x.dtype)
    return x


# ---------------------------------------------------------------------------------------------- 5.6
@checker("5.6", "accumulate with promotion to FP32")
@replayable
@_names_calls
def check_promoted_sum(promoted_sum, cases):
    """promoted_sum(products, acc_bits, promote_every) -> sums (batch,), the limited accumulator added into an FP32
    total every `promote_every` products and restarted; rounding via lowp.round_significand (truncate)."""
    rng, used = np.random.default_rng(cases.seed), cases.used
    for acc_bits, every, K in [(14, 128, 1000), (10, 32, 300), (12, 64, int(rng.integers(200, 700)))]:
        p = rng.standard_normal((8, K)) * np.exp(rng.standard_normal((8, 1)))
        ref = lowp.accumulate(p, acc_bits, every)
        what = f"promoted_sum(products of shape {p.shape}, acc_bits={acc_bits}, promote_every={every})"
        got = _call("5.6", promoted_sum, (p.copy(), acc_bits, every), what, used)
        expect(got is not None, f"{what} returned None -- return the sums")
        try:
            got = np.asarray(got, dtype=np.float64)
        except (TypeError, ValueError):
            fail(f"{what} returned {type(got).__name__}; expected an array of {p.shape[0]} sums")
        expect_equal(tuple(got.shape), (8,), f"{what}: shape of the sums (one per row)")
        never = lowp.accumulate(p, acc_bits, None)
        if np.allclose(got, never, rtol=1e-12) and not np.allclose(ref, never, rtol=1e-12):
            fail(f"{what}: you never promote: the limited accumulator runs over all K products. Every "
                 f"{every} products add it into the FP32 total and start it again from 0")
        for bits in {14, 10, 12} - {acc_bits}:
            other = lowp.accumulate(p, bits, every)
            if np.allclose(got, other, rtol=1e-12) and not np.allclose(ref, other, rtol=1e-12):
                fail(f"{what}: your sums are those of a {bits}-bit accumulator: use the acc_bits argument")
        for ev in {128, 32, 64} - {every}:
            other = lowp.accumulate(p, acc_bits, ev)
            if np.allclose(got, other, rtol=1e-12) and not np.allclose(ref, other, rtol=1e-12):
                fail(f"{what}: you promote every {ev} products, not every promote_every = {every}")
        for other, why in named.accumulation_mistakes(p, acc_bits, every):
            if np.allclose(got, other, rtol=1e-12) and not np.allclose(ref, other, rtol=1e-12):
                fail(f"{what}: {why}")
        exact = p.sum(axis=1)
        if np.allclose(got, exact, rtol=1e-12) and not np.allclose(ref, exact, rtol=1e-12):
            fail(f"{what}: your sums are exact (no limited accumulator): round the running sum to acc_bits = "
                 f"{acc_bits} bits after every addition, acc = lowp.round_significand(acc + p[:, k], acc_bits)")
        if np.abs(got - exact).max() > 10 * np.abs(ref - exact).max() + 1e-9:
            fail(f"{what}: sums far from the exact ones (largest error {np.abs(got - exact).max():.3g}, the "
                 f"reference model's is {np.abs(ref - exact).max():.3g}): did you forget to restart the limited "
                 f"accumulator at 0 after adding it to the FP32 total?")
        expect_close(got, ref, f"{what}: sums", rtol=1e-6, atol=1e-6 * float(np.abs(p).sum(axis=1).max()))
        _refuse_references(used, "write the accumulation loop")
    _refuse_references(used, "write the accumulation loop")
    return "limited accumulator promoted into FP32 every N products (N and the bits varied), a ragged last group"


# ---------------------------------------------------------------------------------------------- 5.7
@checker("5.7", "bytes per parameter with scale overhead")
@replayable
@_names_calls
def check_bytes_per_param(bytes_per_param, cases):
    """bytes_per_param(elem_bits, scale_bits, block_elems) -> bytes per element, scales included."""
    rng, used = cases.rng, cases.used
    cases_ = [(8, 8, 32), (4, 8, 32), (4, 8, 16), (8, 32, 128), (8, 32, 16384), (6, 16, 64)] + [
        (rng.choice([4, 6, 8, 16]), rng.choice([8, 16, 32]), rng.choice([16, 32, 64, 128])) for _ in range(4)]
    for e, s, b in cases_:
        got = _call("5.7", bytes_per_param, (e, s, b), f"bytes_per_param({e}, {s}, {b})", used)
        expected = lowp.bytes_per_param(e, s, b)
        if near(got, e / 8, 1e-9):
            fail(f"bytes_per_param({e}, {s}, {b}) = {got:g} leaves out the scale: one {s}-bit scale per {b} "
                 f"elements adds {s / 8 / b:g} bytes per element ({expected:g} in all)")
        if near(got, e / 8 + s / b, 1e-9):
            fail(f"bytes_per_param({e}, {s}, {b}) = {got:g} counts the scale in bits, not bytes: {s}/8/{b}")
        if near(got, (e + s) / 8, 1e-9):
            fail(f"bytes_per_param({e}, {s}, {b}) = {got:g} charges the whole scale to every element; it is shared "
                 f"by {b} elements: {e}/8 + {s}/8/{b}")
        expect_close(got, expected, f"bytes_per_param({e}, {s}, {b})", rtol=1e-9)
    _refuse_references(used, "write the formula")
    return "right for MXFP8 (1.03125), MXFP4 (0.53125), NVFP4 (0.5625) and DeepSeek's FP8 tiles"

# ---------------------------------------------------------------------------------------------- 5.8
@checker("5.8", "DeepSeek-V3's FP8 linear layer, end to end")
@replayable
@_names_calls
def check_fp8_linear(fp8_linear, cases):
    """fp8_linear(x, w) -> (y, nbytes): x (M, K) and w (N, K) float32 quantized to FP8 E4M3 with 1x128 activation
    tiles and 128x128 weight blocks (FP32 scale amax / 448), y = x @ w.T from per-K-block FP8 products promoted into
    FP32 with the scales, nbytes the quantized operands with their scales (common.exercises.fp8_linear)."""
    return _fp8.check(fp8_linear, cases, _REFERENCES["5.8"], _ALLOWED["5.8"], cases.used)
