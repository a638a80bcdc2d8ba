"""Can a busy machine fool `make run STRICT=1`? A baseline run, then STRICT runs under load and with a planted slowdown.

    python benchmarks/strict_under_load.py [--labs "00 01 02 03"] [--profile quick] [--skip-planted]

Into build/strict_under_load/ (its own baseline file: this machine's build/baselines/ is left alone):
1. `baseline`: a run of the chosen solutions that records the baseline (one run, as a fresh clone's first `make run`);
2. `busy`: STRICT with a CPU-bound process (a Python busy loop pinned to one core) running throughout: it should pass,
   its report showing the drift;
3. `planted`: STRICT with WORKBOOK_INJECT_SLOWDOWN=3 (`measurement.interleaved_samples` sleeps twice its own time
   inside each timing) and no busy loop: it should fail on the slowed results once their re-run confirms them --
   unless the machine itself drifted at those moments, which the report then says.
Prints per step: exit code, `ledger.machine_drift`, the most cores other processes used, and the results' statuses.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.core import measurement, runner  # noqa: E402

BUSY_LOOP = "import os\nos.sched_setaffinity(0, {0})\nwhile True:\n    pass\n"


def step(name: str, build: Path, own: Path, profile: str, labs: str, strict: bool) -> dict:
    code = runner.run_all(profile, labs, kinds=("solutions",), build=build / name, strict=strict,
                          machine_baseline=own)
    ledger = [json.loads(x) for x in (build / name / "results.jsonl").read_text().splitlines()]
    drift = next((r for r in ledger if r["name"] == "ledger.machine_drift"), None)
    statuses = collections.Counter(r["status"] for r in json.loads((build / name / "verdicts.json").read_text()))
    return {"step": name, "exit": code, "drift": drift["value"] if drift else None,
            "others": drift["note"].split("up to ")[-1] if drift else "-", "statuses": dict(statuses)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--labs", default="00 01 02 03", help="solutions to run (default: the measurement labs 00-03)")
    p.add_argument("--profile", default="quick")
    p.add_argument("--skip-planted", action="store_true", help="only the baseline and the busy STRICT run")
    a = p.parse_args(argv)
    build = runner.BUILD / "strict_under_load"
    own = build / "baseline.json"
    own.unlink(missing_ok=True)
    steps = [step("baseline", build, own, a.profile, a.labs, strict=False)]
    busy = subprocess.Popen([sys.executable, "-c", BUSY_LOOP])
    try:
        steps.append(step("busy", build, own, a.profile, a.labs, strict=True))
    finally:
        busy.kill()
        busy.wait()
    if not a.skip_planted:
        os.environ[measurement.INJECT_ENV] = "3"
        try:
            steps.append(step("planted", build, own, a.profile, a.labs, strict=True))
        finally:
            os.environ.pop(measurement.INJECT_ENV)
    print(f"\n{'step':<10} {'exit':>4} {'drift':>8}  {'others':<12} statuses")
    for s in steps:
        drift = "-" if s["drift"] is None else f"{s['drift']:+.1%}"
        print(f"{s['step']:<10} {s['exit']:>4} {drift:>8}  {s['others']:<12} "
              + ", ".join(f"{k} {v}" for k, v in sorted(s["statuses"].items())))
    print(f"reports: {build}/<step>/report.md")
    ok = steps[1]["exit"] == 0 and (a.skip_planted or steps[2]["exit"] == 1
                                    or steps[2]["statuses"].get("machine drifted"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
