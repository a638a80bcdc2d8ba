"""The results ledger: notebooks record key results by name; the runner collects and compares them.

`record("machine.copy_gbps", 12.3, "GB/s")` appends one JSON line {name, value, unit, lab, device, profile, ...} to
the file named by WORKBOOK_RESULTS (the runner sets it per notebook), else to build/interactive/results.jsonl.
`common.core.baseline` builds baselines from ledgers and judges a run against them.

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


def load_machine_baseline(path: Path | None = None) -> dict:
    """This machine's baseline file ({"results": ..., "probe": ..., "runs": ...}), {} when it has none."""
    path = Path(path or machine_baseline_path())
    return json.loads(path.read_text()) if path.exists() else {}


def baselines_for(device_id: str, machine: dict, reference_root: Path = REPO_ROOT / "data" / "baselines") -> dict:
    """The baseline to compare a run with: measured entries from this machine's own baseline only, deterministic
    entries from the committed reference device (falling back to this machine's)."""
    reference = {k: v for k, v in load_baseline(device_id, reference_root).items()
                 if not v.get("measured", "higher_is_better" in v)}
    own = dict(machine)
    own.update(reference)
    return own
