"""Keep or revert, by a paired test: each candidate change is timed against the version it would replace in PAIRS
(one run of each, back to back, in random order), and judged by the ratios of the pairs' times.

A pair's two runs see the same moment of a shared machine, so a slow minute slows both and cancels in their ratio;
the random order stops "the second run is warmer" (or colder) from biasing every ratio the same way. The guard's
figure is the median ratio t_current / t_candidate (above 1: the candidate is faster), with a distribution-free
90% interval for it (`median_interval`: two order statistics of the ratios, no normality assumed). The call:
- keep when the whole interval lies above 1 + `bar` -- a gain the test resolves, however small the bar;
- revert when the whole interval lies below 1 + `bar` -- surely not worth keeping (slower, or not enough faster);
- otherwise take more pairs, in batches, up to `max_pairs`; still open then: "undecided", and the simpler code stays
  (the lab says the machine was too noisy to tell rather than guessing).
`keep_or_revert` is the workbook's guard (lab 12's exercise builds the same); `try_change` verifies a candidate
against the baseline's outputs and gradients, then lets a guard judge it; `plot_waterfall` draws the verdicts.
"""
from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import dataclass
from typing import Callable

from common.systems.capstone.block import step
from common.systems.capstone.config import Version, apply
from common.systems.capstone.verify import verify

BAR = 0.02  # keep a change only when its gain surely exceeds 2%
LEVEL = 0.90  # the confidence of the interval the call is made on
DECISIONS = ("keep", "revert", "undecided")


def median_rank(n: int, level: float = LEVEL) -> int:
    """j such that [j-th smallest, j-th largest] of n samples covers their median with probability >= `level` (the
    largest such j; 1 -- the extremes -- when even they fall short: then `coverage` says by how much)."""
    if n < 1:
        raise ValueError(f"n={n!r}: an interval needs at least one sample")
    if not 0 < level < 1:
        raise ValueError(f"level={level!r} must lie in (0, 1)")
    tail, j, cdf = (1 - level) / 2, 1, 0.0
    for i in range(n // 2):
        cdf += math.comb(n, i) / 2 ** n  # P(fewer than i + 1 samples below the median)
        if cdf > tail:
            break
        j = i + 1
    return j


def coverage(n: int, j: int) -> float:
    """Probability that [j-th smallest, j-th largest] of n samples holds their median."""
    return 1 - 2 * sum(math.comb(n, i) for i in range(j)) / 2 ** n


def median_interval(values, level: float = LEVEL) -> tuple[float, float]:
    """A distribution-free `level` interval for the median of `values` (order statistics; at least 5 values give
    90%)."""
    v = sorted(float(x) for x in values)
    if len(v) < 2:
        raise ValueError(f"got {len(v)} value(s): an interval for a median needs at least 2")
    j = median_rank(len(v), level)
    return v[j - 1], v[len(v) - j]


def decide(ratios, bar: float = BAR, level: float = LEVEL) -> str | None:
    """"keep", "revert", or None (not yet: the interval straddles 1 + bar)."""
    if not 0 <= bar < 1:
        raise ValueError(f"bar={bar!r} is a fraction (0.02 = a 2% gain), in [0, 1)")
    low, high = median_interval(ratios, level)
    if low > 1 + bar:
        return "keep"
    if high < 1 + bar:
        return "revert"
    return None


def paired_ratios(current: Callable[[], object], candidate: Callable[[], object], pairs: int,
                  rng: random.Random | None = None, clock: Callable[[], float] = time.perf_counter,
                  sync: Callable[[], None] = lambda: None) -> list:
    """t_current / t_candidate of `pairs` pairs, each pair's two runs back to back in random order, each timed alone
    (clock, run, sync, clock). No warm-up: call each once first."""
    rng = rng or random.Random()
    steps = {"current": current, "candidate": candidate}
    ratios = []
    for _ in range(pairs):
        took = {}
        for name in rng.sample(list(steps), 2):
            start = clock()
            steps[name]()
            sync()
            took[name] = clock() - start
        ratios.append(took["current"] / took["candidate"])
    return ratios


def keep_or_revert(current: Callable[[], object], candidate: Callable[[], object], bar: float = BAR,
                   pairs: int = 8, max_pairs: int = 24, rng: random.Random | None = None,
                   clock: Callable[[], float] = time.perf_counter, sync: Callable[[], None] = lambda: None):
    """The guard: (decision, ratios) -- `DECISIONS[i]`, and t_current / t_candidate for each pair, in order."""
    if not (isinstance(pairs, int) and isinstance(max_pairs, int) and 5 <= pairs <= max_pairs):
        raise ValueError(f"pairs={pairs!r} and max_pairs={max_pairs!r} must be ints with 5 <= pairs <= max_pairs")
    rng = rng or random.Random()
    for fn in (current, candidate):  # warm-up: the first call of each pays for allocations and cold caches
        fn()
    sync()
    ratios = []
    while True:
        ratios += paired_ratios(current, candidate, pairs, rng, clock, sync)
        decision = decide(ratios, bar)
        if decision:
            return decision, ratios
        if len(ratios) + pairs > max_pairs:
            return "undecided", ratios


@dataclass
class Verdict:
    """A guard's call on one candidate."""

    name: str
    ratios: list  # t_current / t_candidate per pair (above 1: the candidate is faster)
    decision: str
    bar: float = BAR
    level: float = LEVEL
    version: Version | None = None  # the candidate (when made by `try_change`)
    worst_rel_err: float = float("nan")  # its verification against the baseline

    def __post_init__(self):
        if self.decision not in DECISIONS:
            raise ValueError(f"decision={self.decision!r}; allowed: {', '.join(DECISIONS)}")
        if len(self.ratios) < 2:
            raise ValueError(f"{self.name}: {len(self.ratios)} ratio(s); a verdict needs at least 2 pairs")

    @property
    def kept(self) -> bool:
        return self.decision == "keep"

    @property
    def decided(self) -> bool:
        return self.decision != "undecided"

    @property
    def ratio(self) -> float:
        """The median ratio: the candidate's speed-up over the current version."""
        return statistics.median(self.ratios)

    @property
    def gain(self) -> float:
        return self.ratio - 1.0

    @property
    def interval(self) -> tuple[float, float]:
        return median_interval(self.ratios, self.level)

    @property
    def pairs(self) -> int:
        return len(self.ratios)

    def summary(self) -> str:
        low, high = self.interval
        call = {"keep": "KEPT", "revert": "reverted", "undecided": "undecided: too noisy to tell, reverted"}
        return (f"{self.name}: x{self.ratio:.3f} (90% interval {low:.3f}-{high:.3f}, {self.pairs} pairs; bar "
                f"x{1 + self.bar:.2f}) -> {call[self.decision]}")


def judge(name: str, current: Callable[[], object], candidate: Callable[[], object], guard=None, **kw) -> Verdict:
    """Run a guard (default `keep_or_revert`; a learner's takes the same arguments) and wrap its call."""
    decision, ratios = (guard or keep_or_revert)(current, candidate, **kw)
    return Verdict(name, list(ratios), decision, kw.get("bar", BAR))


def try_change(block, x, current: Version, name: str, change: dict, ref: dict, layers=None, rtol: float = 1e-4,
               guard=None, **kw) -> Verdict:
    """Apply one candidate change to `current`, verify it against the baseline's `ref` (a wrong step is never
    timed), then judge it against `current` with `guard` (keyword arguments go to the guard). `layers`: the
    routed-expert layers to use by kind (a learner's), as in `step`."""
    candidate = apply(current, name, change)
    err = verify(block, x, candidate, ref, rtol, layers)
    verdict = judge(name, lambda: step(block, x, current, layers), lambda: step(block, x, candidate, layers), guard,
                    **kw)
    verdict.version, verdict.worst_rel_err = candidate, err
    return verdict


def plot_waterfall(baseline_ms: float, verdicts, title: str = "Step time, change by change (the guard's call)"):
    """A waterfall: the baseline's bar, then each candidate as the step it took off (kept, coloured) or would have
    changed (reverted or undecided, grey, hatched), labelled with its median ratio; the running time follows kept
    changes only. Each bar is scaled by its own paired ratios."""
    from common.core import plots
    verdicts = list(verdicts)
    fig, ax = plots.figure(title, "", "step time (ms, log scale)", logy=True, figsize=(8.5, 4.2))
    level = baseline_ms
    ax.bar(0, level, width=0.6, color=plots.PALETTE[0])
    ax.annotate(f"{level:.3g} ms", (0, level), textcoords="offset points", xytext=(0, 4), ha="center", fontsize=8)
    lows = [level]
    for i, v in enumerate(verdicts, start=1):
        new = level / v.ratio
        lo, hi = min(level, new), max(level, new)
        style = dict(color=plots.PALETTE[2] if v.gain > 0 else plots.PALETTE[1]) if v.kept else \
            dict(color="lightgrey", edgecolor="grey", hatch="//")
        ax.bar(i, hi - lo, bottom=lo, width=0.6, **style)
        ax.plot([i - 0.3, i + 0.3], [new, new], color="black" if v.kept else "grey", lw=1.5)
        label = f"x{v.ratio:.2f}\nkept\n{new:.3g} ms" if v.kept else f"x{v.ratio:.2f}\n{v.decision}"
        ax.annotate(label, (i, lo), textcoords="offset points", xytext=(0, -34 if v.kept else -24), ha="center",
                    fontsize=8, color="black" if v.kept else "grey")
        lows.append(lo)
        if v.kept:
            level = new
    ax.set_xticks(range(len(verdicts) + 1), ["baseline"] + [v.name for v in verdicts], rotation=20, ha="right")
    ax.set_ylim(min(lows) / 3, baseline_ms * 2)
    return fig
