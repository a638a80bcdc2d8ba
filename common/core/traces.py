"""Reading a profiler trace instead of eyeballing it: idle share and the share of time per component.

`torch.profiler.profile(...).export_chrome_trace(path)` writes Chrome-trace JSON; `load_trace` returns its complete
("X") events: dicts with `name`, `cat` (cpu_op, user_annotation, kernel, ...), `ts` and `dur` in microseconds,
`tid`, and `args` (autograd's "Sequence number" links a backward function to the forward op that recorded it).

- `idle_share(events, window)`: the fraction of a time window in which none of the events runs (overlaps and nesting
  merged). With CPU operators it is the host's time between operators -- Python, dispatch, waiting; with GPU kernels
  it is the GPU's idle fraction.
- `component_shares(events, window, components)`: the share of the window spent in each named `record_function`
  range, backward included (each backward function is charged to the component whose forward op it differentiates);
  `component_times` gives each component's time and operator count (what the profiler's per-operator cost scales with).

Reading a GPU trace (a PyTorch-profiler Chrome trace of a real training step, e.g. DeepSeek's profile-data):
- `read_trace(path)`: the whole file, checked -- a clear error when it is not JSON, truncated, has no `traceEvents`;
- `gpu_events(events)`: kernels, memcpys and memsets (the device side), each with its `stream`;
- `attribute(events, annotations)`: for each GPU event, the annotation (a `user_annotation` range on the host)
  whose range holds the host call that launched it (matched by the `correlation` id): phases as the GPU ran them,
  not as the host issued them (the host runs ahead, or waits at a sync, so host ranges are not GPU times);
- `stream_busy(gpu)`, `overlap(a, b)`, `exposed(comm, compute)`: per-stream busy time, the time two sets of events
  run together, and the time a set runs with nothing of the other beside it (exposed communication);
- `phase_table(events, window)`: per annotation inside a window -- host duration, GPU start/end/busy, per stream.
Times are microseconds, as in the trace.
"""
from __future__ import annotations

import json
from bisect import bisect_right
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


def component_times(events, window: tuple[float, float], components) -> dict:
    """{component: {"us": time, "ops": operators}} inside `window`, backward included, plus "other" (operators
    outside the components: the loss, logging). "us" adds the durations of top-level operators (nesting counted
    once); "ops" counts every operator event, nested ones too -- each is one the profiler recorded (and paid for).
    A forward op is charged to the `record_function` range it ran in; a backward function (and what it calls) to
    the component whose forward op it differentiates (autograd's sequence numbers link the two)."""
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
    out = {name: {"us": 0.0, "ops": 0} for name in (*components, "other")}
    open_top = {}  # tid -> (end, owner) of the top-level op that is open on that thread
    for e in sorted(ops, key=lambda e: (e["ts"], -e["dur"])):
        tid = e.get("tid")
        end, owner = open_top.get(tid, (float("-inf"), None))
        if e["ts"] >= end:  # a new top-level op
            owner = inside(e)
            if owner is None and e["name"].startswith("autograd::engine::evaluate_function"):
                owner = seq_owner.get(_seq(e))
            owner = owner or "other"
            open_top[tid] = (e["ts"] + e["dur"], owner)
            out[owner]["us"] += e["dur"]
        out[owner]["ops"] += 1
    return out


def component_shares(events, window: tuple[float, float], components) -> dict:
    """Share of `window` per component (a record_function name), backward included, plus "other" (operators outside
    the components: the loss, logging) and "idle" (no operator running). The shares sum to 1."""
    lo, hi = window
    ops = [e for e in of_category(events, "cpu_op") if lo <= e["ts"] and e["ts"] + e["dur"] <= hi]
    charged = {name: t["us"] for name, t in component_times(events, window, components).items()}
    span = hi - lo
    shares = {name: charged.get(name, 0.0) / span for name in components}
    shares["idle"] = idle_share(ops, window)
    shares["other"] = 1.0 - sum(shares.values())  # operators outside the components (one thread: exact)
    return shares


# ---------------------------------------------------------------- GPU traces: streams, phases, overlap

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")


def read_trace(path) -> dict:
    """A Chrome-trace JSON file as a dict with `traceEvents` (a bare list of events is wrapped). Errors name what is
    wrong: a missing file, not JSON, a truncated file, no `traceEvents` list."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"trace {str(p)!r} does not exist")
    text = p.read_text(errors="replace")
    if not text.strip():
        raise ValueError(f"trace {p.name!r} is empty: expected Chrome-trace JSON with a 'traceEvents' list")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        if text.lstrip()[:1] in "{[" and _unclosed(text):
            raise ValueError(f"trace {p.name!r} is truncated: its JSON stops after {len(text)} characters with a "
                             f"string or brackets still open ({e.msg}); download or export it again") from None
        raise ValueError(f"trace {p.name!r} is not JSON ({e.msg} at line {e.lineno}, column {e.colno}); expected "
                         f"the Chrome-trace JSON that torch.profiler's export_chrome_trace writes") from None
    if isinstance(data, list):
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        keys = ", ".join(sorted(data)) if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"trace {p.name!r} has no 'traceEvents' list (found: {keys})")
    return data


def _unclosed(text: str) -> bool:
    """Whether the text ends inside a string or with brackets still open: JSON cut short."""
    depth, in_str, esc = 0, False, False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
    return in_str or depth > 0


def complete_events(data) -> list[dict]:
    """The complete ("X") events of a trace (dict or list), sorted by start time."""
    events = data["traceEvents"] if isinstance(data, dict) else data
    return sorted((e for e in events if e.get("ph") == "X" and "dur" in e and "ts" in e), key=lambda e: e["ts"])


def stream_of(e) -> int | str | None:
    return (e.get("args") or {}).get("stream", e.get("tid"))


def gpu_events(events) -> list[dict]:
    """Kernels, memcpys and memsets: what ran on the device."""
    return [e for e in events if e.get("cat") in GPU_CATEGORIES]


def intersect(a, b) -> list[tuple[float, float]]:
    """The intersection of two sorted disjoint interval lists."""
    i = j = 0
    out = []
    while i < len(a) and j < len(b):
        s, t = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < t:
            out.append((s, t))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def total(intervals) -> float:
    return float(sum(t - s for s, t in intervals))


def busy(events, window=None) -> float:
    """Time at least one of `events` runs (overlaps merged), optionally clipped to `window`."""
    return total(merged_intervals(events, window))


def stream_busy(gpu, window=None) -> dict:
    """{stream: busy time} of the GPU events of each stream."""
    by = defaultdict(list)
    for e in gpu:
        by[stream_of(e)].append(e)
    return {k: busy(v, window) for k, v in sorted(by.items(), key=lambda kv: str(kv[0]))}


def overlap(a, b, window=None) -> float:
    """Time during which something of `a` and something of `b` run at once."""
    return total(intersect(merged_intervals(a, window), merged_intervals(b, window)))


def exposed(comm, compute, window=None) -> float:
    """Time `comm` runs with none of `compute` beside it: communication on the critical path."""
    return busy(comm, window) - overlap(comm, compute, window)


def span(events) -> tuple[float, float]:
    """(first start, last end) of `events`."""
    if not events:
        raise ValueError("no events: a span needs at least one")
    return min(float(e["ts"]) for e in events), max(float(e["ts"]) + float(e["dur"]) for e in events)


def annotations(events, window=None, exclude=()) -> list[dict]:
    """The user_annotation ranges (record_function) inside `window`, minus names in `exclude`, by start time."""
    out = []
    for e in of_category(events, "user_annotation"):
        if e["name"] in exclude:
            continue
        if window is None or (window[0] <= e["ts"] and e["ts"] + e["dur"] <= window[1]):
            out.append(e)
    return sorted(out, key=lambda e: e["ts"])


def attribute(events, ranges) -> list[tuple[dict, int | None]]:
    """[(gpu event, index into `ranges` or None)]: each GPU event goes to the innermost range (shortest) that holds
    the host launch with the same `correlation` id. GPU events without a launch in the trace get None."""
    launch_ts = {}
    for e in events:
        if e.get("cat") in LAUNCH_CATEGORIES:
            c = (e.get("args") or {}).get("correlation")
            if c is not None:
                launch_ts[c] = float(e["ts"])
    starts = [float(r["ts"]) for r in ranges]
    out = []
    for g in gpu_events(events):
        ts = launch_ts.get((g.get("args") or {}).get("correlation"))
        best = None
        if ts is not None:
            for i in range(bisect_right(starts, ts) - 1, -1, -1):
                r = ranges[i]
                if starts[i] <= ts < starts[i] + float(r["dur"]):
                    if best is None or r["dur"] < ranges[best]["dur"]:
                        best = i
        out.append((g, best))
    return out


def phase_table(events, window, exclude=()) -> list[dict]:
    """One row per annotation inside `window` (host range): its name, host start/duration, and the GPU events it
    launched -- their GPU start/end, busy time in all and per stream, and the events themselves."""
    ranges = annotations(events, window, exclude)
    rows = [{"name": r["name"], "host_ts": float(r["ts"]), "host_dur": float(r["dur"]), "events": []} for r in ranges]
    for g, i in attribute(events, ranges):
        if i is not None:
            rows[i]["events"].append(g)
    for row in rows:
        ev = row["events"]
        row["gpu_start"], row["gpu_end"] = span(ev) if ev else (None, None)
        row["busy"] = busy(ev)
        row["streams"] = stream_busy(ev)
    return rows
