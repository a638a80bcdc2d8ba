"""What lab 12's trace and profiler exercises are checked on: 12.1's event cases and the look-alike sweeps a
learner might write (clipped at one end, unsorted, a nested end moving the sweep back), 12.6's schedule read back
from the profiler and the steps its trace recorded, and 12.7's key_averages rows."""
from __future__ import annotations

import random

from common.core import traces
from common.core.checks import expect, fail


def idle_cases(seed):
    rng = random.Random(seed)
    ev = lambda ts, dur, tid=1, name="aten::op": {"name": name, "ts": float(ts), "dur": float(dur), "tid": tid}
    cases = [
        # nested: a parent op, its child and grandchild, then an op overlapping the parent -- busy 0..70 of 120
        ([ev(0, 60), ev(10, 30), ev(15, 5), ev(50, 20)], (0, 120), "nested"),
        # gaps before the first and after the last op
        ([ev(20, 10), ev(50, 20)], (0, 100), "edges"),
        # ops sticking out of the window on both sides, listed out of order
        ([ev(80, 60), ev(-30, 45), ev(40, 10)], (0, 100), "clip"),
        # two threads overlapping
        ([ev(0, 50, 1), ev(25, 50, 2), ev(90, 5, 1)], (0, 100), "threads"),
        ([], (0, 10), "empty"),
    ]
    for _ in range(3):
        n = rng.randint(5, 40)
        lo = rng.uniform(-50, 50)
        hi = lo + rng.uniform(200, 1000)
        events = []
        for _ in range(n):
            ts = rng.uniform(lo - 50, hi)
            events.append(ev(ts, rng.uniform(0, 80), rng.choice([1, 1, 2])))
            if rng.random() < 0.4:  # a nested child
                events.append(ev(ts + 1, rng.uniform(0, 0.5) * events[-1]["dur"], events[-1]["tid"]))
        rng.shuffle(events)
        cases.append((events, (lo, hi), "random"))
    return cases


def one_end(events, window, lo):
    """The idle share with every event clipped at one end of the window only (a likely mistake)."""
    a, b = window
    clipped = [{"ts": max(e["ts"], a) if lo else e["ts"], "dur": 0.0} for e in events]
    for c, e in zip(clipped, events):
        c["dur"] = (e["ts"] + e["dur"] if lo else min(e["ts"] + e["dur"], b)) - c["ts"]
    return 1 - sum(t - s for s, t in traces.merged_intervals([c for c in clipped if c["dur"] > 0])) / (b - a)


def merged(events, window, in_order=False, keep_max=True):
    """A sweep over the clipped events with one mistake: unsorted (`in_order`) or a nested end moving it back."""
    lo, hi = window
    spans = [(max(e["ts"], lo), min(e["ts"] + e["dur"], hi)) for e in events]
    busy, covered = 0.0, lo
    for s, t in (spans if in_order else sorted(spans)):
        s = max(s, covered)
        if t > s:
            busy += t - s
        covered = max(covered, t) if keep_max else t
    return 1 - busy / (hi - lo)


def profiled_names(prof, path):
    import json
    from pathlib import Path
    expect(Path(path).is_file(), f"no trace at {path}: call prof.export_chrome_trace(trace_path) after the steps")
    try:
        events = json.loads(Path(path).read_text())["traceEvents"]
    except (ValueError, KeyError, TypeError) as exc:
        fail(f"the file at {path} is not a Chrome trace with traceEvents ({exc}); write it with "
             f"prof.export_chrome_trace")
    return [e.get("name") for e in events if e.get("cat") == "user_annotation"]


def check_schedule(call, prof, wait, warmup, active):
    """The profiler's schedule read back: `wait` skipped steps, `warmup` warm-up steps, then `active` recorded."""
    from torch.profiler import ProfilerAction
    n = wait + warmup + active
    try:
        got = [prof.schedule(i) for i in range(n)]
    except Exception as exc:  # noqa: BLE001 -- a learner's own schedule function
        fail(f"{call}: the profiler's schedule could not be read back ({type(exc).__name__}: {exc}); use "
             f"torch.profiler.schedule(wait=..., warmup=..., active=...)")
    record = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)
    if all(a in record for a in got):
        fail(f"{call}: the profiler has no schedule: it records every step, the skipped and the warm-up ones too -- "
             f"pass schedule=torch.profiler.schedule(wait={wait}, warmup={warmup}, active={active})")
    skipped = sum(a == ProfilerAction.NONE for a in got[:wait + warmup])
    warm = sum(a == ProfilerAction.WARMUP for a in got)
    if warm == 0:
        how = "folded into wait" if skipped == wait + warmup else "warmup=0"
        fail(f"{call}: the schedule skips {skipped} step(s) and warms up none ({how}): without a warm-up step the "
             f"first recorded step pays for the profiler starting; use wait={wait}, warmup={warmup}")
    want = [ProfilerAction.NONE] * wait + [ProfilerAction.WARMUP] * warmup + [ProfilerAction.RECORD] * (active - 1) \
        + [ProfilerAction.RECORD_AND_SAVE]
    if got != want:
        fail(f"{call}: the schedule's steps read back as {[a.name for a in got]}; wait={wait}, warmup={warmup}, "
             f"active={active} gives {[a.name for a in want]}")


def row(key, self_cpu, total_cpu, self_dev=0.0, total_dev=0.0, shapes=(), count=1):
    from types import SimpleNamespace
    return SimpleNamespace(key=key, input_shapes=[list(s) for s in shapes], count=count,
                           self_cpu_time_total=self_cpu, cpu_time_total=total_cpu,
                           self_device_time_total=self_dev, device_time_total=total_dev)
