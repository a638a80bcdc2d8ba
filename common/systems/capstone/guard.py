"""Keep or revert: each candidate change is timed against the version it would replace with interleaved samples,
and kept only when lab 01's regression rule says the CURRENT version is a significant regression against it --
faster by more than `threshold` and by more than three standard errors of the shift (`measurement.is_regression`
with the roles swapped). Otherwise it is reverted, and its measured effect is kept for the record.

Samples are taken `batch` pairs at a time (round-robin, so a drifting machine slows both alike) until the call can
be made -- the shift's three-standard-error interval lies wholly above the threshold (kept) or wholly below it
(reverted) -- or until `max_samples`; a change still undecided then is reverted and marked `decided=False`: the
machine was too noisy for that many samples to tell, which the lab says instead of guessing.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable

from common.core import measurement
from common.systems.capstone.block import step
from common.systems.capstone.config import Version, apply
from common.systems.capstone.verify import verify

THRESHOLD = 0.10  # lab 01's rule: a shift must exceed 10% (and three standard errors) to count


@dataclass
class Verdict:
    """The guard's call on one candidate: samples in seconds, the relative gain and its standard error."""

    name: str
    current: list = field(repr=False)  # samples (s) of the version the candidate would replace
    candidate: list = field(repr=False)
    kept: bool
    decided: bool
    threshold: float = THRESHOLD
    version: Version | None = None  # the candidate (when made by `try_change`)
    worst_rel_err: float = float("nan")  # its verification against the baseline

    @property
    def current_ms(self) -> float:
        return 1e3 * statistics.median(self.current)

    @property
    def candidate_ms(self) -> float:
        return 1e3 * statistics.median(self.candidate)

    @property
    def gain(self) -> float:
        """median(current) / median(candidate) - 1: +0.25 means the candidate is 25% faster (1.25x)."""
        return statistics.median(self.current) / statistics.median(self.candidate) - 1.0

    @property
    def std_err(self) -> float:
        return measurement.shift_std_err(self.candidate, self.current)

    @property
    def samples(self) -> int:
        return len(self.candidate)

    def summary(self) -> str:
        verdict = "KEPT" if self.kept else ("reverted" if self.decided else "reverted (undecided: too noisy)")
        return (f"{self.name}: {self.current_ms:.1f} -> {self.candidate_ms:.1f} ms, gain {self.gain:+.1%} "
                f"+- {3 * self.std_err:.1%} (3 s.e., {self.samples} samples each) -> {verdict}")


def decide(current: list, candidate: list, threshold: float = THRESHOLD) -> tuple[bool, bool]:
    """(kept, decided) for two runs' samples by lab 01's rule: kept when the current version is a regression
    against the candidate; decided when the gain's three-standard-error interval clears the threshold either way."""
    kept = measurement.is_regression(candidate, current, threshold)
    gain = statistics.median(current) / statistics.median(candidate) - 1.0
    err = measurement.shift_std_err(candidate, current)
    surely_below = gain + 3.0 * err < threshold
    return kept, kept or surely_below


def judge(name: str, current: Callable[[], object], candidate: Callable[[], object], batch: int = 8,
          max_samples: int = 32, threshold: float = THRESHOLD, sync: Callable[[], None] = lambda: None) -> Verdict:
    """Time `current` and `candidate` (zero-argument steps) in interleaved batches and make the guard's call."""
    if batch < 3 or max_samples < batch:
        raise ValueError(f"batch={batch} must be >= 3 and max_samples={max_samples} >= batch")
    runs = {"current": [], "candidate": []}
    while True:
        got = measurement.interleaved_samples({"current": current, "candidate": candidate}, batch, sync)
        for key in runs:
            runs[key] += got[key]
        kept, decided = decide(runs["current"], runs["candidate"], threshold)
        if decided or len(runs["candidate"]) >= max_samples:
            return Verdict(name, runs["current"], runs["candidate"], kept, decided, threshold)


def try_change(block, x, current: Version, name: str, change: dict, ref: dict, moe_fn=None, rtol: float = 1e-4,
               batch: int = 8, max_samples: int = 32, threshold: float = THRESHOLD,
               sync: Callable[[], None] = lambda: None) -> Verdict:
    """Apply one candidate change to `current`, verify it against the baseline's `ref` (a wrong step is never
    timed), then judge it against `current`. `moe_fn` replaces the grouped layer (a learner's), never the loop."""
    candidate = apply(current, name, change)
    layer = (lambda v: moe_fn if v.moe == "grouped" else None)
    err = verify(block, x, candidate, ref, rtol, layer(candidate))
    verdict = judge(name, lambda: step(block, x, current, layer(current)),
                    lambda: step(block, x, candidate, layer(candidate)), batch, max_samples, threshold, sync)
    verdict.version, verdict.worst_rel_err = candidate, err
    return verdict


def plot_waterfall(baseline_ms: float, verdicts, title: str = "Step time, change by change (guard's call)"):
    """A waterfall: the baseline's bar, then each candidate as the step it took off (kept, coloured) or would have
    changed (reverted, grey, hatched), labelled with its measured gain; the running time follows kept changes only.
    Each bar is scaled from its own interleaved samples, so a kept change's bar is its measured ratio."""
    from common.core import plots
    verdicts = list(verdicts)
    fig, ax = plots.figure(title, "", "step time (ms, log scale)", logy=True, figsize=(8.5, 4.2))
    level = baseline_ms
    ax.bar(0, level, width=0.6, color=plots.PALETTE[0])
    ax.annotate(f"{level:.3g} ms", (0, level), textcoords="offset points", xytext=(0, 4), ha="center", fontsize=8)
    lows = [level]
    for i, v in enumerate(verdicts, start=1):
        new = level / (1.0 + v.gain)
        lo, hi = min(level, new), max(level, new)
        style = dict(color=plots.PALETTE[2] if v.gain > 0 else plots.PALETTE[1]) if v.kept else \
            dict(color="lightgrey", edgecolor="grey", hatch="//")
        ax.bar(i, hi - lo, bottom=lo, width=0.6, **style)
        ax.plot([i - 0.3, i + 0.3], [new, new], color="black" if v.kept else "grey", lw=1.5)
        label = f"{v.gain:+.0%}\nkept\n{new:.3g} ms" if v.kept else f"{v.gain:+.0%}\nreverted"
        ax.annotate(label, (i, lo), textcoords="offset points", xytext=(0, -34 if v.kept else -24), ha="center",
                    fontsize=8, color="black" if v.kept else "grey")
        lows.append(lo)
        if v.kept:
            level = new
    ax.set_xticks(range(len(verdicts) + 1), ["baseline"] + [v.name for v in verdicts], rotation=20, ha="right")
    ax.set_ylim(min(lows) / 3, baseline_ms * 2)
    return fig
