"""The results ledger: notebooks record key results by name; the runner collects and compares them.

`record("machine.copy_gbps", 12.3, "GB/s")` appends one JSON line {name, value, unit, lab, device, profile, ...} to
the file named by WORKBOOK_RESULTS (the runner sets it per notebook), else to build/interactive/results.jsonl.
`compare_with_baseline` checks a list of records against a baseline within each entry's tolerance.

Two baselines, two jobs. Measured results (times, bandwidths) are compared only with a baseline of THIS machine,
build/baselines/<fingerprint>.json (recorded by `python -m common baseline`, or automatically by the first run), so a
new machine never reports a regression it did not cause. Deterministic results (a formula's output) are compared with
the committed reference, data/baselines/<device>.json, on every machine. `baselines_for` merges the two.
"""
from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

from common.core.env import REPO_ROOT, current

NAME_RE = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+|\.[A-Za-z0-9_-]+)*$")
_session: list[dict] = []
DETERMINISTIC_TOLERANCE = 1e-4


def ledger_path() -> Path:
    return Path(os.environ.get("WORKBOOK_RESULTS") or REPO_ROOT / "build" / "interactive" / "results.jsonl")


def validate_name(name: str) -> None:
    """Names are dotted paths, lower case, e.g. "roofline.ridge.H100-SXM.bf16" (hardware ids keep their case)."""
    if not isinstance(name, str) or not NAME_RE.match(name) or "." not in name:
        raise ValueError(f"result name {name!r} is not a dotted path like 'machine.copy_gbps' "
                         f"(segments of [a-z0-9_]; hardware ids such as H100-SXM may appear as segments)")


def record(name: str, value: float, unit: str, *, higher_is_better: bool | None = None, measured: bool | None = None,
           note: str = "") -> dict:
    """Append a result to the ledger and to this session's list; return the record.

    A measured result (a time, a bandwidth: it varies run to run) is compared with its baseline within a noise
    tolerance; give `higher_is_better` when it has a direction (that also marks it measured), or `measured=True`
    when it has none. Anything else is deterministic (a formula's output) and compared tightly."""
    validate_name(name)
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"result {name}: value {value!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"result {name}: value {value!r} is not finite")
    env = current()
    rec = {"name": name, "value": value, "unit": unit, "lab": env.lab, "device": env.device_id,
           "device_name": env.device_name, "profile": env.profile}
    rec["measured"] = bool(measured) if measured is not None else higher_is_better is not None
    if higher_is_better is not None:
        rec["higher_is_better"] = higher_is_better
    if note:
        rec["note"] = note
    path = ledger_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(rec) + "\n")
    _session[:] = [r for r in _session if r["name"] != name] + [rec]
    return rec


def session_records() -> list[dict]:
    return list(_session)


def summary():
    """A table of what this notebook recorded (for its closing cell)."""
    import pandas as pd
    if not _session:
        return pd.DataFrame(columns=["name", "value", "unit"]).set_index("name")
    return pd.DataFrame(_session)[["name", "value", "unit"]].set_index("name")


def read_ledger(path: Path) -> list[dict]:
    if not Path(path).exists():
        return []
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def load_baseline(device_id: str, root: Path = REPO_ROOT / "data" / "baselines") -> dict:
    """data/baselines/<device_id>.json -> {name: {value, unit, tolerance, higher_is_better?}}, or {} if none."""
    path = Path(root) / f"{device_id}.json"
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    return data.get("results", {})


def machine_baseline_path(fingerprint: str | None = None) -> Path:
    """build/baselines/<fingerprint>.json: this machine's own baseline (see common.core.ceilings.fingerprint)."""
    from common.core.ceilings import fingerprint as fp
    return REPO_ROOT / "build" / "baselines" / f"{fingerprint or fp()}.json"


def load_machine_baseline(fingerprint: str | None = None) -> dict:
    path = machine_baseline_path(fingerprint)
    return json.loads(path.read_text()).get("results", {}) if path.exists() else {}


def baselines_for(device_id: str, machine: dict, reference_root: Path = REPO_ROOT / "data" / "baselines") -> dict:
    """The baseline to compare a run with: measured entries from this machine's own baseline only, deterministic
    entries from the committed reference device (falling back to this machine's)."""
    reference = {k: v for k, v in load_baseline(device_id, reference_root).items() if not _is_measured(v)}
    own = dict(machine)
    own.update(reference)
    return own


def _is_measured(entry: dict) -> bool:
    return bool(entry.get("measured", "higher_is_better" in entry))


def compare_with_baseline(records: list[dict], baseline: dict) -> list[dict]:
    """Each record with `baseline`, `ratio` and `status`: ok / regression / improved / drift / changed / new.

    A measured result is a regression when it is worse than the baseline by more than the entry's relative tolerance
    (worse means lower when higher_is_better, higher when not), "drift" when it has no direction. A deterministic
    result that moves beyond its tolerance is "changed": the arithmetic changed, which counts as a failure.
    """
    out = []
    for rec in records:
        row = dict(rec)
        base = baseline.get(rec["name"])
        if base is None:
            row.update(status="new", baseline=None, ratio=None)
            out.append(row)
            continue
        b, tol = float(base["value"]), float(base.get("tolerance", 0.0))
        ratio = rec["value"] / b if b else (1.0 if rec["value"] == 0 else float("inf"))
        hib = base.get("higher_is_better", rec.get("higher_is_better"))
        measured = base.get("measured", "higher_is_better" in base)
        if abs(ratio - 1.0) <= tol + 1e-9:
            status = "ok"
        elif not measured:
            status = "changed"
        elif hib is None:
            status = "drift"
        elif (ratio > 1.0) == bool(hib):
            status = "improved"
        else:
            status = "regression"
        row.update(status=status, baseline=b, ratio=ratio)
        out.append(row)
    return out


def make_baseline(records: list[dict], device_id: str, measured_tolerance: float, note: str = "",
                  deterministic_only: bool = False) -> dict:
    """A baseline file's content from ledger records: deterministic results get a tight tolerance (1e-4: enough for
    float sums that differ in the last bits between CPUs, far too tight for a changed formula), measured ones
    `measured_tolerance`."""
    results = {}
    for r in records:
        measured = r.get("measured", "higher_is_better" in r)
        if measured and deterministic_only:
            continue
        entry = {"value": r["value"], "unit": r["unit"], "tolerance": measured_tolerance if measured else DETERMINISTIC_TOLERANCE,
                 "measured": measured}
        if "higher_is_better" in r:
            entry["higher_is_better"] = r["higher_is_better"]
        results[r["name"]] = entry
    return {"device": device_id, "note": note, "results": dict(sorted(results.items()))}
