"""The look-alike answers lab 05's checkers name (common.exercises.lab05): format facts with the bias, the mantissa or
the subnormals off, roundings on the wrong grid, scales divided by another format's max or on an exponent off by one,
and promoted accumulations with one step changed. Each is computed here and matched with the learner's answer."""
from __future__ import annotations

import math

import numpy as np
import torch

from common.core.checks import fail
from common.kernels import lowp


def format_mistakes(got, e, m, sp, name, ref):
    """Name the look-alike layouts: bias off by one, the mantissa left out of max, subnormals off or missing."""
    bias = 2 ** (e - 1) - 1
    emax = ref.emax
    same = lambda k, v: math.isclose(float(got[k]), v, rel_tol=1e-12) and not math.isclose(  # noqa: E731
        getattr(ref, k), v, rel_tol=1e-12)
    if sp == "ieee" and same("max", lowp.Format(name, e, m, "none").max):
        fail(f"{name}: max {got['max']:g} uses the top exponent code for numbers, but an IEEE format keeps it for "
             f"Inf and NaN: emax = 2^{e} - 2 - bias = {emax}, max = {ref.max:g}")
    if same("max", 2.0 ** emax) or same("max", 2.0 ** (emax + 1)):
        fail(f"{name}: max {got['max']:g} leaves out the mantissa: the largest value is 1.11..1 (binary) x 2^emax = "
             f"(2 - 2^-{m}{' x 2' if sp == 'fn' else ''}) x 2^{emax} = {ref.max:g}")
    if same("smallest_normal", 2.0 ** -bias) or same("smallest_normal", 2.0 ** (-bias - 1)):
        fail(f"{name}: smallest_normal {got['smallest_normal']:g} has the exponent off by one: exponent code 1 is "
             f"the smallest normal, 2^(1 - bias) with bias = 2^({e}-1) - 1 = {bias}: {ref.smallest_normal:g}")
    if same("smallest_subnormal", ref.smallest_normal):
        fail(f"{name}: smallest_subnormal equals smallest_normal: below 2^(1 - bias) the subnormals go on in steps "
             f"of 2^(1 - bias - {m}) = {ref.smallest_subnormal:g} (exponent code 0, no implicit 1)")
    if same("smallest_subnormal", ref.smallest_subnormal / 2) or same("smallest_subnormal", ref.smallest_subnormal * 2):
        fail(f"{name}: smallest_subnormal {got['smallest_subnormal']:g} is off by a factor of 2: it is the smallest "
             f"normal divided by 2^man_bits, 2^(1 - bias - {m}) = {ref.smallest_subnormal:g}")


def grid_round(x, man=3, emin=-6, top=448.0, how="nearest"):
    """x rounded on a binary grid with `man` mantissa bits, exponents clamped at `emin` (the subnormal step), clamped
    to +-top: the right E4M3 rounding by default, a named mistake otherwise."""
    a = x.double().abs()
    e = torch.floor(torch.log2(torch.where(a > 0, a, torch.ones_like(a)))).clamp(min=emin)
    step = 2.0 ** (e - man)
    q = (torch.round(a / step) if how == "nearest" else torch.floor(a / step)) * step
    return torch.copysign(q.clamp(max=top), x.double())


ROUNDING_MISTAKES = (
    (lambda x: grid_round(x, how="trunc"), "you truncated (floor of |x| / step, toward zero); round to the NEAREST "
                                           "E4M3 value, ties to even (torch.round)"),
    (lambda x: grid_round(x, man=2), "that is a grid of 2 mantissa bits (E5M2's step); E4M3 keeps 3: step = "
                                     "2^(e - 3)"),
    (lambda x: grid_round(x, man=4), "that is a grid of 4 mantissa bits; E4M3 keeps 3: step = 2^(e - 3)"),
    (lambda x: grid_round(x, emin=-7), "the subnormal step is off: E4M3's exponent stops at -6 (bias 7), so below "
                                       "2^-6 the step stays 2^-9 -- clamp the exponent at -6"),
    (lambda x: grid_round(x, emin=-60), "no subnormal step: below 2^-6 E4M3 has subnormals on a fixed step of 2^-9, "
                                        "not ever finer normal values -- clamp the exponent at -6"),
    (lambda x: grid_round(x, top=240.0), "saturates at 240, the IEEE-style E4M3 max; OCP E4M3 (fn) uses the top "
                                         "exponent for numbers, so it saturates at 448"),
    (lambda x: grid_round(x).abs(), "the sign is lost: round |x| and give the result x's sign (torch.copysign)"),
)


def name_divisor(s, ref_scale):
    """A scale of amax / (another format's max): named by the format whose max it used."""
    live = ref_scale != 1  # all-zero blocks keep scale 1 whatever the divisor
    if s.shape != ref_scale.shape or not bool(live.any()):
        return
    for top, what in ((127.0, "int8's largest value"), (57344.0, "E5M2's largest value"),
                      (240.0, "the IEEE-style E4M3 max"), (256.0, "a power of two near E4M3's max")):
        if torch.allclose(s.double()[live], ref_scale[live] * 448 / top, rtol=1e-5):
            fail(f"the scale is amax / {top:g} ({what}): OCP E4M3's largest value is 448, so scale = amax / 448 "
                 f"uses the whole FP8 range")


def name_mx_exponent(what, s, ref_scale, amax, elem, idx):
    """The look-alike E8M0 exponents: log2 of amax / elem.max floored, log2 amax rounded, emax off by one."""
    live = amax > 0
    s, amax = s.double(), amax.double()
    log = torch.log2(torch.where(live, amax, torch.ones_like(amax)))
    for other, why in (
            (2.0 ** torch.floor(torch.log2(torch.where(live, amax / elem.max, torch.ones_like(amax)))),
             f"2^floor(log2(amax / {elem.max:g})) divides by the element's max, not by 2^emax: the element's top "
             f"binade [2^emax, max] then goes unused in some blocks"),
            (2.0 ** (torch.round(log) - elem.emax), "log2(amax) was rounded to the nearest integer: OCP MX floors it"),
            (ref_scale.double() * 2, f"the exponent is one too high (emax - 1): subtract emax = {elem.emax}"),
            (ref_scale.double() / 2, f"the exponent is one too low (emax + 1): subtract emax = {elem.emax}")):
        if torch.equal(s[live], other[live]) and not torch.equal(other[live], ref_scale.double()[live]):
            fail(f"{what}: scale{idx} = {float(s[idx]):g}, expected 2^(floor(log2 amax) - {elem.emax}) = "
                 f"{float(ref_scale[idx]):g}: {why}")


def e4m3_up(v):
    """v rounded UP to an E4M3 value (the mistake; the right rounding is to the nearest)."""
    grid = torch.tensor(sorted(set(lowp.e4m3.values())), dtype=torch.float64)
    v = v.double()
    i = torch.searchsorted(grid, v.clamp(max=float(grid[-1]))).clamp(max=grid.numel() - 1)
    return grid[i]


def promoted(p, bits, every, rounding="truncate", first=0, leftover=True, round_products=False):
    """The promoted accumulation with one named change: round to nearest, the groups shifted (promote after product
    `first`, then every `every`), the leftover group dropped, the products rounded instead of the running sum."""
    acc, total = np.zeros(p.shape[0]), np.zeros(p.shape[0])
    for k in range(p.shape[1]):
        if round_products:
            acc = acc + lowp.round_significand(p[:, k], bits, rounding)
        else:
            acc = lowp.round_significand(acc + p[:, k], bits, rounding)
        if (k + 1 - first) % every == 0:
            total, acc = total + acc, np.zeros_like(acc)
    return total + acc if leftover else total


def accumulation_mistakes(p, bits, every):
    """(sums, message) of the promoted accumulation's look-alikes."""
    return (
        (promoted(p, bits, every, rounding="nearest"), "the running sum was rounded to nearest; a tensor core's "
                                                       "adder truncates the aligned bits (lowp.round_significand's "
                                                       "default, 'truncate')"),
        (promoted(p, bits, every, first=1), "promoted after products 1, 1 + N, ...: off by one -- promote after "
                                            "every N products, i.e. when (k + 1) % N == 0"),
        (promoted(p, bits, every, leftover=False), "the last, partial group is lost: add what is left in the limited "
                                                   "accumulator to the total at the end"),
        (promoted(p, bits, every, round_products=True), "you rounded each product, not the running sum: the limited "
                                                        "accumulator is acc = round(acc + p[:, k])"),
    )
