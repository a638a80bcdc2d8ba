"""A machine's baseline and the rule that judges a run against it.

A baseline holds, per result, the median over the runs that recorded it and a band from their spread, and the
machine probe's readings (`ceilings.Probe`, taken around every notebook). `judge` compares a run with it, one result
at a time, in three steps:
1. the result's own band: a measured result moves by up to `band` (relative) without comment; the band is
   BAND_SIGMAS times the spread of its baseline runs, at least MIN_BAND (DEFAULT_BAND when fewer than MIN_RUNS runs
   recorded it). A deterministic result has the tight tolerance of the committed reference;
2. the machine at that moment: when a probe around the notebook read the machine beyond the probe's own band (its
   spread over the baseline runs), or other processes used more than LOAD_LIMIT cores while it ran, a worse result
   is "machine drifted" (the report gives the drift and the load), not a regression. Otherwise an absolute
   speed (s, ms, us, GB/s, GFLOP/s, ...) that is worse than its band is also divided by the probe (result / probe at
   the same moment, against the baseline's result / probe): within that band it is "ok";
3. what is left is a candidate, "regression?". `confirm` turns a candidate into "regression" only when a re-run of
   its notebook finds it a candidate again under the same rule, else "not confirmed".
Kinds: "deterministic" (recorded with neither a direction nor measured=True), "speed" (measured, in a time or rate
unit), "ratio" (every other measured result: fractions, speed-ups, errors), "ledger" (the runner's own, never judged).
"""
from __future__ import annotations

import math
import statistics

RATE_UNITS = {"GB/s", "GFLOP/s", "TFLOP/s", "tokens/s", "samples/s"}
TIME_UNITS = {"s", "ms", "us", "ns"}
MIN_RUNS = 3  # runs needed before a result's own spread sets its band
DEFAULT_BAND = 0.5  # relative band of a result seen in fewer runs
MIN_BAND = 0.35  # three quiet runs can agree closely by chance: no band is narrower than this
BAND_SIGMAS = 4.0  # band = BAND_SIGMAS x the spread (standard deviation of the log values) of the baseline runs
PROBE_MIN_BAND = 0.2
PROBE_SIGMAS = 3.0
LOAD_LIMIT = 0.25  # cores other processes may use on average while a notebook runs before its moment is "drifted"
DETERMINISTIC_TOLERANCE = 1e-4
PROBE_KINDS = ("copy_gbps", "matmul_gflops")
FLAGGED = ("changed", "regression?", "regression", "moved")


def is_measured(entry: dict) -> bool:
    return bool(entry.get("measured", "higher_is_better" in entry))


def kind(entry: dict) -> str:
    """deterministic / speed / ratio / ledger (see the module's docstring)."""
    if str(entry.get("name", "")).startswith("ledger."):
        return "ledger"
    if not is_measured(entry):
        return "deterministic"
    return "speed" if entry.get("unit") in RATE_UNITS | TIME_UNITS else "ratio"


# ------------------------------------------------------------------------------------------------------ the probe
def probe_reference(moments: list[dict]) -> dict | None:
    """The median reading per kind, with the probe's band: {"copy_gbps", "matmul_gflops", "band", "spread",
    "readings"} from moments ({"probes": [readings], "others": cores}); None without readings. The spread is the
    larger standard deviation of the log readings."""
    readings = [r for m in moments for r in m.get("probes", []) if r and all(r.get(k, 0) > 0 for k in PROBE_KINDS)]
    if not readings:
        return None
    ref = {k: statistics.median(r[k] for r in readings) for k in PROBE_KINDS}
    spread = max(_log_spread([r[k] for r in readings]) for k in PROBE_KINDS)
    others = [m["others"] for m in moments if m.get("others") is not None]
    return {**ref, "band": max(PROBE_MIN_BAND, PROBE_SIGMAS * spread), "spread": spread, "readings": len(readings),
            "others": max(others) if others else None}


def machine_at(moment: dict | None, ref: dict | None) -> dict | None:
    """The machine around one notebook, `moment` = {"probes": [readings before and after], "others": cores other
    processes used on average while it ran}, against the reference probe: "factor" (the slowest of the readings'
    copy and matmul ratios: what a slower machine can explain), "drift" (the ratio farthest from 1, minus 1: -0.4 is
    a machine 40% slower), "others", and "drifted" (a reading beyond the probe's band, or others above LOAD_LIMIT
    cores); None when there is nothing to compare."""
    if not moment:
        return None
    readings = [r for r in moment.get("probes", []) if r and all(r.get(k, 0) > 0 for k in PROBE_KINDS)]
    others = moment.get("others")
    out = {"factor": 1.0, "drift": None, "others": others, "drifted": others is not None and others > LOAD_LIMIT}
    if readings and ref:
        ratios = [r[k] / ref[k] for r in readings for k in PROBE_KINDS]
        far = max(ratios, key=lambda x: abs(math.log(x)))
        out.update(factor=min(ratios), drift=far - 1.0)
        out["drifted"] = out["drifted"] or abs(math.log(far)) > math.log1p(ref["band"])
    return out if (out["drift"] is not None or others is not None) else None


def describe(at: dict | None) -> str:
    """"-45%, others 1.2 cores" for the report."""
    if not at:
        return "-"
    parts = [] if at["drift"] is None else [f"{at['drift']:+.0%}"]
    if at.get("others") is not None:
        parts.append(f"others {at['others']:.2f} cores")
    return ", ".join(parts)


# -------------------------------------------------------------------------------------------------- the baseline
def _log_spread(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    if all(v > 0 for v in values):
        return statistics.stdev(math.log(v) for v in values)
    med = abs(statistics.median(values))
    return statistics.stdev(values) / med if med else 0.0


def band_for(values: list[float], default_band: float = DEFAULT_BAND) -> float:
    """The relative band of a result from its baseline values (see the module's docstring)."""
    floor = MIN_BAND if len(values) >= MIN_RUNS else default_band
    return max(floor, math.expm1(BAND_SIGMAS * _log_spread(values)))


def make(runs: list[dict], device: str, note: str = "", default_band: float = DEFAULT_BAND,
         deterministic_only: bool = False) -> dict:
    """A baseline file's content from runs, each {"records": [...], "moments": {lab: moment}} (see `machine_at`;
    moments may be absent). Measured results: median, band, spread, values over the runs, and for speeds the same of result /
    probe; deterministic results: the last value, DETERMINISTIC_TOLERANCE (enough for float sums that differ in the
    last bits between CPUs, far too tight for a changed formula)."""
    ref = probe_reference([m for run in runs for m in run.get("moments", {}).values()])
    seen: dict[str, list] = {}
    for run in runs:
        for rec in run["records"]:
            if kind(rec) == "ledger" or (deterministic_only and is_measured(rec)):
                continue
            at = machine_at(run.get("moments", {}).get(rec.get("lab")), ref)
            seen.setdefault(rec["name"], []).append((rec, at))
    results = {}
    for name, got in sorted(seen.items()):
        rec = got[-1][0]
        entry = {"value": rec["value"], "unit": rec["unit"], "measured": is_measured(rec),
                 "tolerance": DETERMINISTIC_TOLERANCE}
        if "higher_is_better" in rec:
            entry["higher_is_better"] = rec["higher_is_better"]
        if entry["measured"]:
            values = [r["value"] for r, _ in got]
            entry.update(value=statistics.median(values), tolerance=band_for(values, default_band), runs=len(values),
                         spread=_log_spread(values), values=values)
            norm = [per_probe(r, at) for r, at in got]
            if kind(rec) == "speed" and all(v is not None for v in norm):
                entry["per_probe"] = {"value": statistics.median(norm), "tolerance": band_for(norm, default_band)}
        results[name] = entry
    out = {"device": device, "note": note, "runs": len(runs), "results": results}
    if ref:
        out["probe"] = ref
    return out


def per_probe(rec: dict, at: dict | None) -> float | None:
    """A speed over the machine's factor at its moment (a rate divided by it, a time multiplied by it)."""
    if at is None or rec["value"] <= 0:
        return None
    return rec["value"] * (at["factor"] if rec.get("unit") in TIME_UNITS else 1.0 / at["factor"])


# ---------------------------------------------------------------------------------------------------- the rule
def _goodness(value: float, base: float, higher_is_better: bool) -> float | None:
    """value against base, > 1 when better; None when either is not positive."""
    if value <= 0 or base <= 0:
        return None
    return value / base if higher_is_better else base / value


def judge(records: list[dict], baseline: dict, moments: dict | None = None, probe_ref: dict | None = None) -> list:
    """Each record with kind, baseline, ratio (value / baseline), band, machine (drift at its notebook's moment),
    per_probe (the result / probe ratio against the baseline's, for speeds) and status: ok / improved / moved /
    new / changed / machine drifted / regression? (see the module's docstring; `confirm` makes the last one
    "regression" or "not confirmed"). `baseline` maps names to entries; `moments` maps labs to their moments."""
    out = []
    for rec in records:
        row = dict(rec, kind=kind(rec), baseline=None, ratio=None, band=None, machine=None, per_probe=None)
        base = baseline.get(rec["name"])
        if row["kind"] == "ledger":
            continue
        if base is None:
            out.append(dict(row, status="new"))
            continue
        b, band = float(base["value"]), float(base.get("tolerance", 0.0))
        ratio = rec["value"] / b if b else (1.0 if rec["value"] == 0 else math.inf)
        row.update(baseline=b, ratio=ratio, band=band, kind=kind({**base, "name": rec["name"]}))
        at = machine_at((moments or {}).get(rec.get("lab")), probe_ref)
        row["machine"] = at
        row["status"] = _status(rec, base, row, at)
        out.append(row)
    return out


def _status(rec: dict, base: dict, row: dict, at: dict | None) -> str:
    ratio, band = row["ratio"], row["band"]
    if row["kind"] == "deterministic":
        return "ok" if abs(ratio - 1.0) <= band + 1e-9 else "changed"
    hib = base.get("higher_is_better", rec.get("higher_is_better"))
    drifted = at is not None and at["drifted"]
    if hib is None:
        moved = not (abs(ratio - 1.0) <= band if row["baseline"] <= 0 or rec["value"] <= 0
                     else abs(math.log(ratio)) <= math.log1p(band))
        return ("machine drifted" if drifted else "moved") if moved else "ok"
    good = _goodness(rec["value"], row["baseline"], bool(hib))
    if good is None:  # a zero or negative baseline or value: the relative difference, when there is a scale
        if not row["baseline"]:
            return "ok" if rec["value"] == 0 else "moved"
        good = max(0.0, 1.0 + (rec["value"] - row["baseline"]) / abs(row["baseline"]) * (1 if hib else -1))
    if good >= 1.0 / (1.0 + band):
        return "improved" if good > 1.0 + band else "ok"
    if drifted:
        return "machine drifted"
    norm = base.get("per_probe")
    if row["kind"] == "speed" and norm and at is not None:
        mine = per_probe(rec, at)
        g = _goodness(mine, norm["value"], bool(hib)) if mine is not None else None
        if g is not None:
            row["per_probe"] = mine / norm["value"]
            if g >= 1.0 / (1.0 + norm["tolerance"]):
                return "ok"
    return "regression?"


def candidates(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["status"] == "regression?"]


def confirm(rows: list[dict], rerun_rows: list[dict]) -> list[dict]:
    """The candidates of `rows` settled by a re-run of their notebooks (`rerun_rows`, judged by `judge` with the
    re-run's own probes): "regression" when the re-run is a candidate again, else "not confirmed". Every row of a
    re-run notebook gets the re-run's value and status in "rerun" and "rerun_status"."""
    again = {(r["lab"], r["name"]): r for r in rerun_rows}
    out = []
    for row in rows:
        row = dict(row)
        second = again.get((row.get("lab"), row["name"]))
        if second is not None:
            row.update(rerun=second["value"], rerun_status=second["status"], rerun_machine=second.get("machine"))
        if row["status"] == "regression?":
            row["status"] = "regression" if second is not None and second["status"] == "regression?" \
                else "not confirmed"
        out.append(row)
    return out
