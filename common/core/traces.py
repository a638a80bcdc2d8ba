"""Reading a profiler trace instead of eyeballing it: idle share and the share of time per component.

`torch.profiler.profile(...).export_chrome_trace(path)` writes Chrome-trace JSON; `load_trace` returns its complete
("X") events: dicts with `name`, `cat` (cpu_op, user_annotation, kernel, ...), `ts` and `dur` in microseconds,
`tid`, and `args` (autograd's "Sequence number" links a backward function to the forward op that recorded it).

- `idle_share(events, window)`: the fraction of a time window in which none of the events runs (overlaps and nesting
  merged). With CPU operators it is the host's time between operators -- Python, dispatch, waiting; with GPU kernels
  it is the GPU's idle fraction.
- `component_shares(events, window, components)`: the share of the window spent in each named `record_function`
  range, backward included (each backward function is charged to the component whose forward op it differentiates).
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path


def load_trace(path) -> list[dict]:
    """The complete ("X") events of a Chrome-trace JSON file, sorted by start time."""
    data = json.loads(Path(path).read_text())
    events = data["traceEvents"] if isinstance(data, dict) else data
    return sorted((e for e in events if e.get("ph") == "X" and "dur" in e), key=lambda e: e["ts"])


def find_window(events, name: str) -> tuple[float, float]:
    """(start, end) in microseconds of the first event called `name` (e.g. a record_function("step") range)."""
    for e in events:
        if e["name"] == name:
            return float(e["ts"]), float(e["ts"]) + float(e["dur"])
    raise ValueError(f"no event named {name!r} in the trace (wrap the step in record_function({name!r}))")


def of_category(events, *cats: str) -> list[dict]:
    return [e for e in events if e.get("cat") in cats]


def merged_intervals(events, window: tuple[float, float] | None = None) -> list[tuple[float, float]]:
    """The union of the events' [ts, ts + dur) intervals (clipped to `window`), as sorted disjoint intervals."""
    spans = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events)
    if window is not None:
        lo, hi = window
        spans = [(max(s, lo), min(t, hi)) for s, t in spans if t > lo and s < hi]
    out: list[list[float]] = []
    for s, t in spans:
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], t)
        else:
            out.append([s, t])
    return [(s, t) for s, t in out]


def idle_share(events, window: tuple[float, float]) -> float:
    """Fraction of `window` (start, end in us) covered by none of `events` (dicts with ts, dur in us)."""
    lo, hi = window
    if not hi > lo:
        raise ValueError(f"window={window!r} must have end > start")
    busy = sum(t - s for s, t in merged_intervals(events, window))
    return 1.0 - busy / (hi - lo)


def top_level(events) -> list[dict]:
    """Events not nested inside another event of the same thread (so durations add up without double counting)."""
    out, open_end = [], defaultdict(lambda: float("-inf"))
    for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
        if e["ts"] >= open_end[e.get("tid")]:
            out.append(e)
            open_end[e.get("tid")] = e["ts"] + e["dur"]
    return out


def _seq(e):
    return (e.get("args") or {}).get("Sequence number")


def component_shares(events, window: tuple[float, float], components) -> dict:
    """Share of `window` per component (a record_function name), backward included, plus "other" (operators outside
    the components: the loss, logging) and "idle" (no operator running). The shares sum to 1."""
    lo, hi = window
    if not hi > lo:
        raise ValueError(f"window={window!r} must have end > start")
    ops = [e for e in of_category(events, "cpu_op") if lo <= e["ts"] and e["ts"] + e["dur"] <= hi]
    ranges = [(e["name"], e["ts"], e["ts"] + e["dur"]) for e in of_category(events, "user_annotation")
              if e["name"] in components]

    def inside(e):
        return next((name for name, s, t in ranges if s <= e["ts"] < t), None)

    # every forward op (at any depth) maps its autograd sequence number to the component it ran in
    seq_owner = {}
    for e in ops:
        if _seq(e) is not None and not e["name"].startswith("autograd::"):
            owner = inside(e)
            if owner is not None:
                seq_owner.setdefault(_seq(e), owner)
    charged = defaultdict(float)
    for e in top_level(ops):
        owner = inside(e)
        if owner is None and e["name"].startswith("autograd::engine::evaluate_function"):
            owner = seq_owner.get(_seq(e))
        charged[owner or "other"] += e["dur"]
    span = hi - lo
    shares = {name: charged.get(name, 0.0) / span for name in components}
    shares["idle"] = idle_share(ops, window)
    shares["other"] = 1.0 - sum(shares.values())  # operators outside the components (one thread: exact)
    return shares
