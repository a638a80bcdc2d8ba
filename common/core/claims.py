"""Measured claims, printed by the run that measured them.

Markdown states mechanisms, formulas and sourced figures; a claim about what THIS machine measures is a code cell:

    claim("a copy in the core's own cache beats one from DRAM by more than 30%", hierarchy,
          why=[(env.device == "cpu" and busy, "the other core was busy: ...")],
          gpu=published.figure("h100.l2_vs_hbm_bandwidth"))

prints the claim, this run's value, whether it holds here and, when it does not, why (the first reason whose
condition is true, chosen from the measured values), beside the published GPU figure with its source, so that no
learner reads a sentence their own run contradicts, and a CPU learner still sees what a GPU does.

`holds` is True/False, None (not judged: too noisy to tell), or a `measurement.Verdict` (its `shown`, and its
interval printed). A claim marked `invariant=True` cannot fail on a working machine (a synchronised time includes
the work): when it does, the measurement broke, and it raises `ClaimBroken`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence


class ClaimBroken(AssertionError):
    """An invariant claim that did not hold: the measurement itself is broken."""


@dataclass(frozen=True)
class Published:
    """A published figure of the same measurement on other hardware (built by `common.facts.published.figure`)."""
    value: float
    unit: str
    device: str  # e.g. "H100 SXM"
    what: str  # what was measured, in words
    source: str  # "title (url, date)"

    def line(self) -> str:
        unit = self.unit if self.unit == "x" or self.unit.startswith("%") else f" {self.unit}"
        return f"published, {self.device}: {readable(self.value)}{unit} -- {self.what}\n    source: {self.source}"


@dataclass
class Claim:
    statement: str
    value: Any
    unit: str
    holds: bool | None
    reason: str  # why it does not hold here, or why it was not judged ("" when it holds)
    published: tuple[Published, ...]

    @property
    def verdict(self) -> str:
        return {True: "holds here", False: "does not hold here", None: "not judged here"}[self.holds]

    def text(self) -> str:
        value = self.value if isinstance(self.value, str) else readable(self.value)
        unit = self.unit if self.unit == "x" or self.unit.startswith("%") else f" {self.unit}" if self.unit else ""
        lines = [f"CLAIM  {self.statement}",
                 f"  this run: {value}{unit} -- {self.verdict}"
                 + (f": {self.reason}" if self.reason else "")]
        lines += ["  " + p.line() for p in self.published]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()

    def _ipython_display_(self) -> None:
        """Already printed by `claim`: show nothing more when it is a cell's last expression."""


_made: list[Claim] = []


def readable(x: Any, digits: int = 3) -> str:
    """A number for reading: 3 significant digits, thousands separated, no exponent between 1e-3 and 1e15 (and none
    with a '+' above: 3.29e24)."""
    if hasattr(x, "item") and getattr(x, "ndim", None) == 0:  # a NumPy or torch scalar
        x = x.item()
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return str(x)
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    if (isinstance(x, int) or (float(x).is_integer() and abs(x) >= 10 ** digits)) and abs(x) < 1e15:
        return f"{int(round(x)):,}"
    magnitude = math.floor(math.log10(abs(x)))
    if magnitude < -3 or magnitude >= 15:
        return f"{x:.{digits - 1}e}".replace("e+", "e")  # 3.29e24, as the labs' text writes it
    decimals = max(0, digits - 1 - magnitude)
    return f"{x:,.{decimals}f}"


def _reason(why: str | Sequence[tuple[Any, str]] | Callable[[], str] | None) -> str:
    if why is None:
        return ""
    if callable(why):
        return str(why())
    if isinstance(why, str):
        return why
    for condition, text in why:
        if condition:
            return text
    return ""


def claim(statement: str, value: Any = None, *, holds: Any, unit: str = "",
          why: str | Sequence[tuple[Any, str]] | Callable[[], str] | None = None,
          gpu: Published | Sequence[Published] | None = None, invariant: bool = False, quiet: bool = False) -> Claim:
    """Print (and return) the claim with this run's `value`, whether it `holds` here and, if not, `why`.

    `why` is a reason, or (condition, reason) pairs of which the first true one is given, or a function returning
    one; it is shown only when the claim does not hold (or was not judged). `gpu`: the published figure(s) of the
    same measurement on a GPU, from `common.facts.published.figure`."""
    if not isinstance(statement, str) or not statement.strip():
        raise ValueError(f"statement={statement!r}: a claim needs a sentence to print")
    detail = ""
    if hasattr(holds, "shown") and hasattr(holds, "judged"):  # a measurement.Verdict
        verdict = holds
        detail = (f"{verdict.shift:+.0%} +- {3 * verdict.std_err:.0%} over {verdict.n} interleaved samples each "
                  f"(3 standard errors), bar {verdict.by:+.0%}")
        holds = verdict.shown
        if value is None:
            value = 1.0 + verdict.shift
            unit = unit or "x"
    if holds is not None and not isinstance(holds, bool):
        if not hasattr(holds, "dtype"):  # a numpy or torch bool is fine; a word or a number is a mistake
            raise ValueError(f"holds={holds!r} must be True, False, None or a measurement Verdict")
        holds = bool(holds)
    reason = ""
    if holds is False:
        reason = _reason(why) or "no cause the lab knows of: run the cell again on a quiet machine"
    elif holds is None:
        reason = _reason(why) or "the measurements were too noisy to tell either way (a busy machine)"
    if detail:
        reason = f"{reason} [{detail}]" if reason else detail
    published = () if gpu is None else ((gpu,) if isinstance(gpu, Published) else tuple(gpu))
    made = Claim(statement.strip(), value, unit, holds, reason, published)
    _made.append(made)
    if not quiet:
        print(made.text())
    if invariant and holds is False:
        raise ClaimBroken(f"{made.statement}: {readable(value) if value is not None else ''} {unit} -- this cannot "
                          f"fail on a working machine, so the measurement broke")
    return made


def made() -> list[Claim]:
    """The claims printed in this session, in order (tests read them)."""
    return list(_made)
