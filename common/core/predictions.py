"""Predict, then measure: the learner's guesses, revealed beside what was measured, and a calibration table.

    predict("copy_gbps", 20, "GB/s", "How many GB/s does this machine copy?")   # a cell the learner edits
    ...
    reveal("copy_gbps", copy.value)          # in the measuring cell: the guess beside the result, off by how much
    ...
    calibration()                            # the lab's last cells: every guess of this lab against its result

A guess is a number (judged by the ratio measured / guess) or a word from `choices` (right or wrong). The learner
copy of a lab holds `...` in place of the solution's guess (the labs generator blanks it), and `predict` with `...`
says what to write. Not graded: nothing here reaches a checker or the grader.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from common.core.claims import readable
from common.core.env import current

NO_GUESS = Ellipsis


@dataclass
class Prediction:
    lab: str
    key: str
    question: str
    unit: str
    guess: Any = NO_GUESS
    choices: tuple = ()
    measured: Any = None
    revealed: bool = False
    notes: list = field(default_factory=list)

    def _ipython_display_(self) -> None:
        """Already printed by `predict` / `reveal`: show nothing more when it is a cell's last expression."""

    @property
    def guessed(self) -> bool:
        return self.guess is not NO_GUESS and self.guess is not None

    def verdict(self) -> str:
        """How far the guess was from the measurement, in words ("" before either is known)."""
        if not (self.guessed and self.revealed):
            return ""
        if self.choices:
            return "right" if str(self.guess) == str(self.measured) else f"wrong (it is {self.measured})"
        guess, measured = float(self.guess), float(self.measured)
        if guess == measured:
            return "exact"
        if guess <= 0 or measured <= 0:
            return f"off by {'+' if measured > guess else '-'}{_short(abs(measured - guess))} {self.unit}".rstrip()
        ratio = measured / guess
        if 0.8 <= ratio <= 1.25:
            return f"within {abs(ratio - 1):.0%}"
        return (f"{_short(ratio, 2)}x higher than your guess" if ratio > 1 else
                f"{_short(1 / ratio, 2)}x lower than your guess")


def _short(x: float, digits: int = 3) -> str:
    """x to `digits` significant digits, without an exponent: 8.05, 2, 20,073 (not 2.01e+04)."""
    if 1e-3 <= abs(x) < 10 ** digits:
        return f"{x:.{digits}g}"
    return readable(x, digits)


_predictions: dict[tuple[str, str], Prediction] = {}


def _number_or_choice(value, choices: tuple, what: str):
    if choices:
        if str(value) not in {str(c) for c in choices}:
            raise ValueError(f"{what}={value!r} is not one of the choices {list(choices)}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{what}={value!r} must be a finite number (or `...` while you have no guess yet)")
    return value


def predict(key: str, guess: Any, unit: str = "", question: str = "", *, choices=()) -> Prediction:
    """Record the learner's guess for `key` (a number, or one of `choices`); `...` means no guess yet."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"key={key!r} must be a non-empty string naming the prediction")
    choices = tuple(choices)
    lab = current().lab
    entry = _predictions.get((lab, key)) or Prediction(lab, key, question, unit, choices=choices)
    entry.question, entry.unit, entry.choices = question or entry.question, unit, choices
    if guess is NO_GUESS or guess is None:
        entry.guess = NO_GUESS
        hint = f" (one of {', '.join(map(str, choices))})" if choices else ""
        print(f"No guess yet for {key!r}: replace ... with your guess{hint} and run this cell, before the measurement.")
    else:
        entry.guess = _number_or_choice(guess, choices, "guess")
        entry.revealed, entry.measured = False, None
        print(f"Your guess for {key!r} is recorded: {entry.guess}{' ' + unit if unit and not choices else ''}. "
              f"It is revealed beside the measurement.")
    _predictions[(lab, key)] = entry
    return entry


def reveal(key: str, measured: Any) -> Prediction:
    """Set the measured value of `key` beside the learner's guess and print how far apart they are."""
    lab = current().lab
    entry = _predictions.get((lab, key))
    if entry is None:
        entry = Prediction(lab, key, "", "")
        _predictions[(lab, key)] = entry
    if not entry.choices:
        measured = float(measured)
    entry.measured, entry.revealed = measured, True
    shown = measured if entry.choices else f"{_short(measured)}{' ' + entry.unit if entry.unit else ''}"
    if entry.guessed:
        print(f"PREDICTION {key}: you guessed {entry.guess}{' ' + entry.unit if entry.unit and not entry.choices else ''}"
              f", measured {shown} -- {entry.verdict()}")
    else:
        print(f"PREDICTION {key}: measured {shown} (no guess recorded: next time write one in the predict cell first)")
    return entry


def records(lab: str | None = None) -> list[Prediction]:
    """The predictions of lab `lab` (default: the current lab), in the order they were made."""
    lab = lab or current().lab
    return [p for (l, _), p in _predictions.items() if l == lab]


def calibration(lab: str | None = None) -> None:
    """Print the lab's calibration table: each question, your guess, the measurement, how far apart."""
    rows = records(lab)
    if not rows:
        print("No predictions in this session: run the predict cells (and their measurements) first.")
        return
    header = ("prediction", "your guess", "measured", "how far")
    table = [header] + [
        (p.key, str(p.guess) + (f" {p.unit}" if p.unit and p.guessed and not p.choices else "") if p.guessed else "-",
         ("-" if not p.revealed else (str(p.measured) if p.choices else _short(p.measured)
                                      + (f" {p.unit}" if p.unit else ""))),
         p.verdict() or ("not measured yet" if not p.revealed else "no guess")) for p in rows]
    widths = [max(len(r[i]) for r in table) for i in range(4)]
    for n, r in enumerate(table):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))
    judged = [p for p in rows if p.guessed and p.revealed]
    numbers = [p for p in judged if not p.choices]
    words = [p for p in judged if p.choices]
    parts = []
    if numbers:
        close = sum(float(p.guess) > 0 and 0.5 <= float(p.measured) / float(p.guess) <= 2 for p in numbers)
        parts.append(f"{close} of {len(numbers)} numeric guesses within 2x")
    if words:
        parts.append(f"{sum(str(p.guess) == str(p.measured) for p in words)} of {len(words)} choices right")
    if parts:
        print("; ".join(parts) + ".")


def reset() -> None:
    """Forget every prediction (tests use this)."""
    _predictions.clear()
