"""Does every measured result reproduce? Run the measured labs N times and report each measured result's spread.

    python benchmarks/reproducibility.py [--runs 3] [--labs "00 01 02"] [--profile quick]

Each run executes the chosen solution notebooks with papermill (as `make run` does, into build/reproducibility/) and
reads their results ledger; the saved machine profile (build/machine/) is removed before each run unless
--keep-machine, so each run measures the ceilings afresh. For every measured result (recorded with `higher_is_better=` or `measured=True`) it
prints the median, min, max and coefficient of variation over the runs; a result is "within 15%" when every run lies
within 15% of the median. The last line is `reproducible: K of M measured results within 15% over N runs`.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.core import runner

WITHIN = 0.15


def spread(values: list[float]) -> dict:
    """median, min, max, coefficient of variation (stdev / |mean|) and whether every value is within 15% of the
    median."""
    med = statistics.median(values)
    mean = statistics.fmean(values)
    cv = statistics.stdev(values) / abs(mean) if len(values) > 1 and mean else 0.0
    within = all(abs(v - med) <= WITHIN * abs(med) for v in values) if med else all(v == 0 for v in values)
    return {"median": med, "min": min(values), "max": max(values), "cv": cv, "within": within}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3, help="how many times to run each lab (>= 2)")
    p.add_argument("--labs", default="", help='subset, e.g. "00 02" (default: every lab)')
    p.add_argument("--profile", default="quick", help="quick (default), full or auto")
    p.add_argument("--keep-machine", action="store_true",
                   help="reuse the saved machine profile (default: measure it afresh in every run, so the ceilings' "
                        "own run-to-run spread is part of the report)")
    a = p.parse_args(argv)
    if a.runs < 2:
        p.error(f"--runs={a.runs} must be >= 2 (a spread needs two runs)")
    runner.check_profile(a.profile)
    names = runner.select(a.labs)
    values: dict[tuple[str, str], list[float]] = {}
    units: dict[tuple[str, str], str] = {}
    out = runner.BUILD / "reproducibility"
    failed = 0
    for i in range(a.runs):
        if not a.keep_machine:
            for saved in runner.BUILD.joinpath("machine").glob("*.json"):
                saved.unlink()
        for name in names:
            run = runner.execute(runner.REPO_ROOT / "solutions" / name, a.profile, out / f"run{i + 1}")
            print(f"run {i + 1}/{a.runs} {name[:-6]}: {run.status} in {run.seconds:.1f} s"
                  + (f" -- {run.error}" if run.status != "ok" else ""), flush=True)
            failed += run.status != "ok"
            for r in run.records:
                if r.get("measured"):
                    values.setdefault((r["lab"], r["name"]), []).append(r["value"])
                    units[(r["lab"], r["name"])] = r["unit"]
    rows = [(key, spread(v)) for key, v in sorted(values.items()) if len(v) >= 2]
    print(f"\n{'lab':<16} {'result':<52} {'median':>11} {'min':>11} {'max':>11} {'CV':>6}  within 15%")
    for (lab, name), s in rows:
        print(f"{lab:<16} {name:<52} {s['median']:>11.4g} {s['min']:>11.4g} {s['max']:>11.4g} {s['cv']:>6.1%}  "
              f"{'yes' if s['within'] else 'NO'}  {units[(lab, name)]}")
    if failed:
        print(f"{failed} notebook run(s) failed: their results are missing from the table")
    k = sum(s["within"] for _, s in rows)
    print(f"reproducible: {k} of {len(rows)} measured results within 15% over {a.runs} runs")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
