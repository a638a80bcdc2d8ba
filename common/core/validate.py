"""Argument checks shared by every module: a bad value gets a ValueError that names the parameter, the value and
what is allowed.

    n = whole("seq_len", n)                      # an int >= 1 (bools refused)
    p = whole("p", p, meaning="the number of ranks")
    bw = number("bandwidth", bw)                 # a finite real > 0
    alpha = number("alpha", alpha, strict=False) # a finite real >= 0
"""
from __future__ import annotations

import math
import numbers


def whole(name: str, value, minimum: int = 1, meaning: str = "") -> int:
    """`value` as an int, when it is a whole number (not a bool) >= `minimum`; else a ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        what = f" ({meaning})" if meaning else ""
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}{what}")
    return int(value)


def number(name: str, value, minimum: float = 0.0, strict: bool = True, meaning: str = "") -> float:
    """`value` as a float, when it is a finite real (a bool or a string is not) > `minimum` (>= with strict=False);
    else a ValueError."""
    try:
        v = float(value) if not isinstance(value, (bool, str, bytes)) else math.nan
    except (TypeError, ValueError):
        v = math.nan
    if not (math.isfinite(v) and (v > minimum if strict else v >= minimum)):
        what = f" ({meaning})" if meaning else ""
        raise ValueError(f"{name}={value!r} must be a finite number {'>' if strict else '>='} {minimum:g}{what}")
    return v
