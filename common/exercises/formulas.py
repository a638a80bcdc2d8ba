"""Naming a wrong formula by what it computes on every case: a checker collects the learner's answers first, then
asks which known mistake -- a function of the same arguments -- the answers match on every case, so a mistake that
only some cases separate (a flag read backwards, a doubled factor) is named as itself, not as a nearby one.

    rows = [(call, args, got, expected), ...]
    name_formula(rows, [("the sparse flag is read backwards: ...", lambda g, t, s: ...), ...])
"""
from __future__ import annotations

import math

from common.core.checks import CheckFailed, fail


def _value(model, args):
    try:
        return float(model(*args))
    except (ArithmeticError, ValueError, TypeError, KeyError):
        return None


def _same(a, b, rtol: float) -> bool:
    return a is not None and math.isclose(a, b, rel_tol=rtol, abs_tol=1e-300)


def answered(rows: list, ask, rtol: float = 1e-9) -> bool:
    """Append ask() -> (call, args, got, expected) to `rows`; False (stop collecting) when it raised a verdict -- a
    crash, a wrong type -- while an earlier answer is already wrong: that earlier mistake is the verdict."""
    try:
        rows.append(ask())
    except CheckFailed:
        if any(not _same(got, expected, rtol) for _, _, got, expected in rows):
            return False
        raise
    return True


def name_formula(rows, models, rtol: float = 1e-9, unit: str = "") -> None:
    """A verdict naming the first mistake of `models` ((words, fn(*args) -> what that mistake returns)) that the
    learner's answers match on every row where it differs from the right answer, printed at the first row where the
    learner is wrong; nothing when no model matches (or when every answer is right)."""
    wrong = [r for r in rows if not _same(r[2], r[3], rtol)]
    if not wrong:
        return
    for words, model in models:
        values = [_value(model, args) for _, args, _, _ in rows]
        if any(v is None for v in values):
            continue
        if all(_same(got, v, rtol) for (_, _, got, _), v in zip(rows, values)):
            call, _, got, expected = wrong[0]
            fail(f"{call} = {got:.6g}{unit}: {words} (expected {expected:.6g}{unit})")
