"""What lab 12's guard exercise (12.4) is checked on: a device and a clock the checker controls, the cases, and the
checks of the ratios and of the call.

Each step only QUEUES its work, as a GPU launch does (the clock moves by a launch cost); `sync()` runs the queue
(the clock moves by the queued work); `clock()` reads the time. So a harness that reads the clock before `sync()`
times the launch, not the work -- and the device notices (`unsynced_reads`). A step's work is set per call: the
k-th call of "current" costs `current[k]`, the k-th call of "candidate" `candidate[k]` (the first call of each, the
warm-up, costs `cold[name]` times more), so the pairs' true ratios are known whatever order the harness runs them in,
and `timed_pairs()` rebuilds them from the log.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from common.core.checks import expect, fail
from common.systems import capstone

LAUNCH = 1e-5  # seconds a call costs the host before its work runs


@dataclass
class Device:
    current: list  # seconds of work of each call (index 0: the first call)
    candidate: list
    cold: dict = field(default_factory=lambda: {"current": 4.0, "candidate": 1.5})  # x the first call of each
    now: float = 0.0
    queued: float = 0.0
    unsynced_reads: int = 0
    log: list = field(default_factory=list)  # (name, seconds of work) per call, in order
    calls: dict = field(default_factory=lambda: {"current": 0, "candidate": 0})

    def step(self, name: str):
        work = getattr(self, name)

        def run():
            i = self.calls[name]
            if i >= len(work):
                raise RuntimeError(f"the step {name!r} was called {i + 1} times; this check allows {len(work)} "
                                   f"(max_pairs is a limit: stop there)")
            self.calls[name] = i + 1
            seconds = work[i] * (self.cold[name] if i == 0 else 1.0)
            self.now += LAUNCH
            self.queued += seconds
            self.log.append((name, seconds))
        run.__name__ = f"{name}_step"
        return run

    def sync(self) -> None:
        self.now += self.queued
        self.queued = 0.0

    def clock(self) -> float:
        if self.queued > 0:
            self.unsynced_reads += 1
        return self.now

    def timed_pairs(self, pairs: int) -> tuple[list, int]:
        """([(first name, t_current, t_candidate)] of the last `pairs` pairs of calls, how many calls came before
        them) -- the times a correct harness measures: launch + work."""
        skip = len(self.log) - 2 * pairs
        out = []
        for i in range(skip, len(self.log), 2):
            (a, wa), (b, wb) = self.log[i], self.log[i + 1]
            if {a, b} != {"current", "candidate"}:
                return out, -1
            t = {a: LAUNCH + wa, b: LAUNCH + wb}
            out.append((a, t["current"], t["candidate"]))
        return out, skip


def series(base: float, ratios) -> tuple[list, list]:
    """(current, candidate) work lists whose k-th pair has ratio ratios[k]: candidate `base`, current base x ratio;
    index 0 is the warm-up call (ratio 1)."""
    current = [base] + [base * r for r in ratios]
    candidate = [base] * (len(ratios) + 1)
    return current, candidate


# (name, bar, pairs, max_pairs, ratios of the pairs): what each case's right call is, and the mistake it exposes
CASES = [
    ("a clear win", 0.02, 6, 18, [1.9, 2.1, 2.0, 1.95, 2.05, 2.02] * 3),                       # keep at 6
    ("a clear loss", 0.02, 6, 18, [0.7, 0.72, 0.69, 0.71, 0.7, 0.68] * 3),                     # revert at 6
    ("a small gain that needs more pairs", 0.02, 6, 18,
     [1.01, 1.09, 0.99, 1.07, 1.05, 1.06] + [1.05, 1.06, 1.07, 1.04, 1.055, 1.065] * 2),      # keep at 12
    ("no effect on a noisy machine", 0.02, 6, 18, [0.95, 1.06, 1.0, 1.05, 0.97, 1.04] * 3),   # undecided at 18
    ("a gain surely below the bar", 0.02, 6, 18, [1.008, 1.012, 1.01, 1.005, 1.015, 1.011] * 3),  # revert at 6
    ("a clear win, batches that do not divide max_pairs", 0.05, 5, 12, [1.3, 1.5, 1.4, 1.35, 1.45] * 3),
]


def call(name, bar, pairs, max_pairs):
    return (f"keep_or_revert(current, candidate, bar={bar}, pairs={pairs}, max_pairs={max_pairs}, rng, clock, "
            f"sync) on {name}")


def check_ratios(call, dev, got, pairs_seen):
    """The learner's ratios against the pairs the device ran: structure, warm-up, order, direction, values."""
    timed, skip = dev.timed_pairs(len(got))
    expect(skip >= 0, f"{call}: your calls do not come in pairs of one current and one candidate step after the "
                      f"warm-up ({[n for n, _ in dev.log][:12]}...); each pair runs each step once")
    expect(skip != 0, f"{call}: no warm-up -- the first call of each step (allocation, cold caches: here "
                      f"{dev.cold['current']:g}x and {dev.cold['candidate']:g}x slower) was timed; call each step "
                      f"once before the pairs")
    expect(skip == 2 and {n for n, _ in dev.log[:2]} == {"current", "candidate"},
           f"{call}: {skip} calls before the timed pairs; warm up with ONE call of each step")
    want = [c / d for _, c, d in timed]
    pairs_seen += [first for first, _, _ in timed]
    if all(abs(g / w - 1) < 1e-9 for g, w in zip(got, want)):
        return
    if all(abs(g * w - 1) < 1e-9 for g, w in zip(got, want)):
        fail(f"{call}: your ratios are t_candidate / t_current; the guard's ratio is t_current / t_candidate "
             f"(above 1: the candidate is faster)")
    i = next(i for i, (g, w) in enumerate(zip(got, want)) if abs(g / w - 1) >= 1e-9)
    fail(f"{call}: pair {i}'s ratio is {got[i]:.6g}, but its two runs took {timed[i][1]:.6g} s (current) and "
         f"{timed[i][2]:.6g} s (candidate): {want[i]:.6g} -- time each run alone (clock before, sync, clock after)")


def check_decision(call, decision, ratios, bar, pairs, max_pairs):
    n = len(ratios)
    expect(decision in capstone.DECISIONS, f"{call} decided {decision!r}; return one of 'keep', 'revert', "
                                                  f"'undecided'")
    expect(n <= max_pairs, f"{call}: {n} pairs, past max_pairs={max_pairs}; stop before another batch would pass it")
    for b in range(pairs, n, pairs):
        early = capstone.decide(ratios[:b], bar)
        if early:
            fail(f"{call}: after {b} pairs the 90% interval {_iv(ratios[:b])} already lay "
                 f"{'above' if early == 'keep' else 'below'} 1 + bar = {1 + bar:g}, yet you took more pairs -- "
                 f"decide after each batch with the order-statistic interval (capstone.median_interval); a wider "
                 f"one (the extremes, +-3 standard errors) wastes samples")
    right = capstone.decide(ratios, bar)
    low, high = capstone.median_interval(ratios)
    med = sorted(ratios)[n // 2] if n % 2 else sum(sorted(ratios)[n // 2 - 1:n // 2 + 1]) / 2
    if decision == (right or "undecided"):
        if right is None:
            expect(n + pairs > max_pairs, f"{call}: 'undecided' after {n} pairs, but another batch of {pairs} fits "
                                          f"under max_pairs={max_pairs}: take more pairs while the interval "
                                          f"{_iv(ratios)} straddles 1 + bar")
        return
    if decision == "keep" and right is None and med > 1 + bar:
        fail(f"{call}: kept on the median ({med:.4g}) alone, but the 90% interval {_iv(ratios)} still reaches below "
             f"1 + bar = {1 + bar:g}: keep only when the whole interval clears the bar")
    if decision == "keep" and low > 1:
        fail(f"{call}: kept a gain whose interval {_iv(ratios)} clears 1 but not 1 + bar = {1 + bar:g}: the bar is "
             f"the least gain worth keeping")
    if decision != "keep" and right == "keep" and low < 1 + 100 * bar:
        fail(f"{call}: the interval {_iv(ratios)} clears 1 + bar = {1 + bar:g}, but you did not keep it -- is your "
             f"bar a percentage (1 + {100 * bar:g})? bar is a fraction: 0.02 means 2%")
    if right is None and decision == "revert":
        fail(f"{call}: reverted while the interval {_iv(ratios)} still straddles 1 + bar = {1 + bar:g}; revert only "
             f"when the whole interval lies below it" + (", and say 'undecided' when max_pairs runs out"
                                                        if n + pairs > max_pairs else ": take more pairs first"))
    if right is None:
        fail(f"{call}: decided {decision!r} after {n} pairs while the interval {_iv(ratios)} straddles 1 + bar = "
             f"{1 + bar:g}: take more pairs, up to max_pairs={max_pairs}, then 'undecided'")
    fail(f"{call}: decided {decision!r}; the 90% interval of the median ratio, {_iv(ratios)}, says {right!r} "
         f"(keep: all of it above 1 + bar = {1 + bar:g}; revert: all of it below)")


def _iv(ratios):
    low, high = capstone.median_interval(ratios)
    return f"[{low:.4g}, {high:.4g}]"
