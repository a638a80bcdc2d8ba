"""Lab 05's named wrong answers (low precision): look-alike formulas, roundings and scales, and calls into the
workbook that do the exercise. Right answers written differently are in tests/test_exercises_lab05.py."""
import numpy as np
import torch

from common.exercises import lab05
from common.kernels import lowp, scaled_gemm
from test_exercises_lab05 import (FP8_LINEAR_MISTAKES, facts, fp8_blockwise, fp8_linear, mx, nvfp4, promoted,
                                  round_e4m3)


# ------------------------------------------------------------------------------------------------ 5.1
def _facts(e, m, sp, **wrong):
    return {**facts(e, m, sp), **{k: v(e, m, sp) for k, v in wrong.items()}}


def _bias(e):
    return 2 ** (e - 1) - 1


def _via_format(e, m, sp):
    f = lowp.Format("mine", e, m, sp)
    return {"max": f.max, "smallest_normal": f.smallest_normal, "smallest_subnormal": f.smallest_subnormal,
            "eps": f.eps}


def _emax(e, sp):
    return (2 ** e - 2 if sp == "ieee" else 2 ** e - 1) - _bias(e)


# ------------------------------------------------------------------------------------------------ 5.2
def _grid(x, man=3, emin=-6, top=448.0, how="nearest"):
    """A learner's rounding on a binary grid, with the named parameter wrong."""
    a = x.double().abs()
    e = torch.floor(torch.log2(torch.where(a > 0, a, torch.ones_like(a)))).clamp(min=emin)
    step = 2.0 ** (e - man)
    q = (torch.round(a / step) if how == "nearest" else torch.trunc(a / step)) * step
    return torch.copysign(q.clamp(max=top), x.double())


# ------------------------------------------------------------------------------------------------ 5.3 - 5.5
def _blockwise(x, block, top=448.0, rounding="nearest"):
    bm, bk = block
    if x.shape[0] % bm or x.shape[1] % bk:
        raise ValueError(f"block={block} does not tile x")
    b = lowp.blocks(x.double(), bm, bk)
    s = (b.abs().amax(-1) / top).float().double()
    s = torch.where(s > 0, s, torch.ones_like(s))
    return lowp.unblocks(lowp.round_to(b / s[..., None], lowp.e4m3, rounding=rounding), bm, bk), s


def _mx(x, elem, block=32, exponent=None, rounding="nearest"):
    b = lowp.blocks(x.double(), 1, block)
    amax = b.abs().amax(-1)
    safe = torch.where(amax > 0, amax, torch.ones_like(amax))
    e = exponent(safe, elem) if exponent else torch.floor(torch.log2(safe)) - elem.emax
    s = 2.0 ** torch.where(amax > 0, e, torch.full_like(e, -127.0)).clamp(-127, 127)
    return lowp.unblocks(lowp.round_to(b / s[..., None], elem, rounding=rounding), 1, block), s


def _nvfp4(x, top=6 * 448.0, block_rounding="nearest", q_rounding="nearest", combined=False):
    b = lowp.blocks(x.double(), 1, 16)
    amax = float(b.abs().max())
    ts = float(np.float32(amax / top)) if amax > 0 else 1.0
    bs = lowp.round_to(b.abs().amax(-1) / 6 / ts, lowp.e4m3, rounding=block_rounding)
    s = bs * ts
    safe = torch.where(s > 0, s, torch.ones_like(s))
    q = torch.where(s[..., None] > 0, lowp.round_to(b / safe[..., None], lowp.e2m1, rounding=q_rounding),
                    torch.zeros_like(b))
    return lowp.unblocks(q, 1, 16), (s if combined else bs), ts


def _quantize_cheat(x, block):
    qt = lowp.quantize(x, lowp.e4m3, block, "fp32")
    return qt.q, qt.scale


def _mx_cheat(x, elem, block=32):
    qt = lowp.quantize(x, elem, (1, block), "e8m0")
    return qt.q, qt.scale


def _nvfp4_cheat(x):
    qt = lowp.quantize(x, lowp.e2m1, (1, 16), "e4m3", tensor_scale=True)
    return qt.q, qt.block_scale, qt.tensor_scale


def _not_value_error(x, block):
    if x.shape[0] % block[0] or x.shape[1] % block[1]:
        raise TypeError("block does not tile x")
    return fp8_blockwise(x, block)


def _zero_nan(x, block):
    b = lowp.blocks(x.double(), *block) if not (x.shape[0] % block[0] or x.shape[1] % block[1]) else None
    if b is None:
        raise ValueError("does not tile")
    s = (b.abs().amax(-1) / 448).float().double()
    return lowp.unblocks(lowp.round_to(b / s[..., None], lowp.e4m3), *block), s


# ------------------------------------------------------------------------------------------------ 5.6
def _promoted(p, bits, every, rounding="truncate", first=0, leftover=True, round_products=False, restart=True):
    p = np.asarray(p, dtype=np.float64)
    acc, total = np.zeros(p.shape[0]), np.zeros(p.shape[0])
    for k in range(p.shape[1]):
        acc = acc + lowp.round_significand(p[:, k], bits, rounding) if round_products else \
            lowp.round_significand(acc + p[:, k], bits, rounding)
        if (k + 1 - first) % every == 0:
            total = total + acc
            if restart:
                acc = np.zeros_like(acc)
    return total + acc if leftover else total


_FP8_WORDS = dict(FP8_LINEAR_MISTAKES)

WRONG = {
    lab05.check_format_facts: [
        (lambda e, m, sp: facts(e, m, "ieee"), "IEEE answer"),
        (lambda e, m, sp: facts(e, m, "none" if sp == "fn" else sp), "all-ones mantissa"),
        (lambda e, m, sp: _facts(e, m, sp, eps=lambda e, m, sp: 2.0 ** -(m + 1)), "unit roundoff"),
        (_via_format, "lowp.Format is the workbook's reference"),
        (lambda e, m, sp: _facts(e, m, sp, max=lambda e, m, sp: 2.0 ** _emax(e, sp)), "leaves out the mantissa"),
        (lambda e, m, sp: _facts(e, m, sp, smallest_normal=lambda e, m, sp: 2.0 ** -_bias(e)),
         "smallest_normal .* exponent off by one"),
        (lambda e, m, sp: _facts(e, m, sp, smallest_subnormal=lambda e, m, sp: 2.0 ** (1 - _bias(e))),
         "smallest_subnormal equals smallest_normal"),
        (lambda e, m, sp: _facts(e, m, sp, smallest_subnormal=lambda e, m, sp: 2.0 ** (-_bias(e) - m)),
         "off by a factor of 2"),
        (lambda e, m, sp: facts(e, m, "none" if sp == "ieee" else sp), "keeps it for Inf and NaN"),
        (lambda e, m, sp: tuple(facts(e, m, sp).values()), "must return a dict"),
        (lambda e, m, sp: {("min_normal" if k == "smallest_normal" else k): v for k, v in facts(e, m, sp).items()},
         "missing keys"),
    ],
    lab05.check_round_to_e4m3: [
        (lambda x: torch.copysign((torch.floor(x.double().abs() / 2.0 ** (torch.floor(torch.log2(
            x.double().abs().clamp_min(1e-300))).clamp(min=-6) - 3) + 0.5) * 2.0 ** (torch.floor(torch.log2(
                x.double().abs().clamp_min(1e-300))).clamp(min=-6) - 3)).clamp(max=448.0), x.double()),
         "half to EVEN"),
        (lambda x: torch.where(x.abs() > 464, torch.full_like(x, float("nan")).double(), round_e4m3(x)),
         "no saturation"),
        (lambda x: torch.where(x.abs() < 2.0 ** -6, torch.zeros_like(x).double(), round_e4m3(x)), "flushed to 0"),
        (lambda x: _grid(x, how="trunc"), "you truncated"),
        (lambda x: _grid(x, man=2), "2 mantissa bits"),
        (lambda x: _grid(x, man=4), "4 mantissa bits"),
        (lambda x: _grid(x, emin=-7), "subnormal step is off"),
        (lambda x: _grid(x, emin=-200), "no subnormal step"),
        (lambda x: _grid(x, top=240.0), "saturates at 240"),
        (lambda x: _grid(x).abs(), "sign is lost"),
        (lambda x: x.float().to(torch.float8_e4m3fn).double(), "cast to a torch float8 dtype"),
        (lambda x: lowp.round_to(x, lowp.e4m3), "formats.round_to"),
    ],
    lab05.check_quantize_fp8_blockwise: [
        (lambda x, block: (lambda q, s: (q.T, s.T))(*_quantize_cheat(x.T.contiguous(), block)), "wrong block axis"),
        (lambda x, block: (lambda q, s: (q, 1 / s))(*fp8_blockwise(x, block)), "upside down"),
        (_zero_nan, "all zeros"),
        (lambda x, block: fp8_blockwise(x, (block[0], 128)) if x.shape[1] % 128 == 0 else fp8_blockwise(x, block),
         r"scale shape: expected"),
        (lambda x, b: fp8_blockwise(x, b) if x.shape[-1] % b[1] == 0 else
         (lowp.quantize(x, lowp.e4m3, b, "fp32", pad=True).q, None), "did not refuse"),
        (_not_value_error, "must raise ValueError"),
        (lambda x, block: (lambda q, s: (q * s.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1), s))(
            *fp8_blockwise(x, block)), "dequantized values"),
        (_quantize_cheat, "block_scaling.quantize"),
        (lambda x, block: (lambda q, s: (q.double(), s.double()))(*scaled_gemm.quantize_fp8(x, block)),
         "quantize_fp8"),
        (lambda x, block: _blockwise(x, block, top=127.0), r"amax / 127 \(int8"),
        (lambda x, block: _blockwise(x, block, top=57344.0), r"amax / 57344 \(E5M2"),
        (lambda x, block: _blockwise(x, block, rounding="truncate"), "truncated toward zero"),
    ],
    lab05.check_mx_quantize: [
        (lambda x, elem, block=32: (lambda qt: (qt.q, qt.scale))(lowp.quantize(x, elem, (1, block), "fp32")),
         "powers of two"),
        (lambda x, elem, block=32: (lambda qt: (qt.q, qt.scale))(lowp.quantize(x, elem, (1, block), "e8m0",
                                                                               e8m0_rounding="ceil")),
         "rounded the exponent up"),
        (lambda x, elem, block=32: (lambda q, s: (torch.where(q.abs() >= elem.max, q * 1.5, q), s))(
            *mx(x, elem, block)), "no saturation"),
        (lambda x, elem, block=32: (lambda qt: (qt.q.T, qt.scale.T))(lowp.quantize(x.T.contiguous(), elem,
                                                                                 (1, block), "e8m0")),
         "wrong block axis"),
        (lambda x, elem, block=32: mx(x, elem, 32), "block=16"),
        (lambda x, elem, block=32: (lambda b: (lowp.unblocks(lowp.round_to(b / (2.0 ** (torch.floor(torch.log2(
            b.abs().amax(-1))) - elem.emax))[..., None], elem), 1, block), 2.0 ** (torch.floor(torch.log2(
                b.abs().amax(-1))) - elem.emax)))(lowp.blocks(x.double(), 1, block)), "all zeros"),
        (lambda x, elem, block=32: _mx(x, elem, block, lambda a, el: torch.floor(torch.log2(a / el.max))),
         "divides by the element's max"),
        (lambda x, elem, block=32: _mx(x, elem, block, lambda a, el: torch.round(torch.log2(a)) - el.emax),
         "rounded to the nearest integer"),
        (lambda x, elem, block=32: _mx(x, elem, block, lambda a, el: torch.floor(torch.log2(a)) - el.emax + 1),
         "one too high"),
        (lambda x, elem, block=32: _mx(x, elem, block, lambda a, el: torch.floor(torch.log2(a)) - el.emax - 1),
         "one too low"),
        (lambda x, elem, block=32: _mx(x, elem, block, rounding="truncate"), "truncated toward zero"),
        (_mx_cheat, "block_scaling.quantize"),
    ],
    lab05.check_nvfp4_quantize: [
        (lambda x: (lambda q, bs, ts: (q, x.double().reshape(x.shape[0], -1, 16).abs().amax(-1) / 6 / ts, ts))(
            *nvfp4(x)), "not an FP8 E4M3 value"),
        (lambda x: (lambda qt: (qt.q, qt.block_scale, 1.0))(lowp.quantize(x, lowp.e2m1, (1, 16), "e4m3")),
         "tensor_scale is 1"),
        (lambda x: (lambda qt: (qt.q, qt.block_scale, qt.tensor_scale))(
            lowp.quantize(x, lowp.e2m1, (1, 32), "e4m3", tensor_scale=True)), "MXFP4's block"),
        (lambda x: (lambda b: (lowp.unblocks(lowp.round_to(b / (lowp.round_to(b.abs().amax(-1) / 6 / float(
            np.float32(float(b.abs().max()) / 2688)), lowp.e4m3) * float(np.float32(float(b.abs().max()) / 2688)))[
            ..., None], lowp.e2m1), 1, 16), lowp.round_to(b.abs().amax(-1) / 6 / float(np.float32(float(
                b.abs().max()) / 2688)), lowp.e4m3), float(np.float32(float(b.abs().max()) / 2688))))(
            lowp.blocks(x.double(), 1, 16)), "all zeros"),
        (lambda x: _nvfp4(x, top=6.0), "leaves out E4M3's 448"),
        (lambda x: _nvfp4(x, top=448.0), "leaves out E2M1's 6"),
        (lambda x: _nvfp4(x, top=6 * 240.0), "IEEE-style E4M3 max"),
        (lambda x: _nvfp4(x, combined=True), "whole decoding scale"),
        (lambda x: _nvfp4(x, block_rounding="truncate"), r"truncated \(rounded DOWN"),
        (lambda x: _nvfp4(x, q_rounding="truncate"), "truncated toward zero"),
        (_nvfp4_cheat, "block_scaling.quantize"),
    ],
    lab05.check_promoted_sum: [
        (lambda p, bits, every: _promoted(p, bits, 10 ** 9), "never promote"),
        (lambda p, bits, every: promoted(p, 14, every), "use the acc_bits argument"),
        (lambda p, bits, every: promoted(p, bits, 128), "promote every 128"),
        (lambda p, bits, every: _promoted(p, bits, every, restart=False), "restart"),
        (lambda p, bits, every: lowp.accumulate(p, bits, every), "accuracy.accumulate"),
        (lambda p, bits, every: _promoted(p, bits, every, rounding="nearest"), "rounded to nearest"),
        (lambda p, bits, every: _promoted(p, bits, every, first=1), "off by one"),
        (lambda p, bits, every: _promoted(p, bits, every, leftover=False), "partial group is lost"),
        (lambda p, bits, every: _promoted(p, bits, every, round_products=True), "rounded each product"),
        (lambda p, bits, every: np.asarray(p).sum(axis=1), "no limited accumulator"),
        (lambda p, bits, every: list(promoted(p, bits, every))[:1], "shape of the sums"),
    ],
    lab05.check_fp8_linear: [
        *[(lambda x, w, m=m: fp8_linear(x, w, m), words) for m, words in FP8_LINEAR_MISTAKES],
        (lambda x, w: (scaled_gemm.scaled_mm_fine_grained(*scaled_gemm.quantize_fp8(x, (1, 128)),
                                                          *scaled_gemm.quantize_fp8(w, (128, 128))),
                       fp8_linear(x, w)[1]), "scaled_gemm.quantize_fp8"),
        (lambda x, w: (fp8_linear(x, w)[0].to(torch.float8_e4m3fn), fp8_linear(x, w)[1]), "returned y in float8"),
    ],
}
