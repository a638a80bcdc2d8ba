"""Does every measured result reproduce? Run the labs N times and report each result's spread, by kind.

    python benchmarks/reproducibility.py [--runs 3] [--labs "00 01 02"] [--profile quick]

Each run executes the chosen solution notebooks with papermill (as `make run` does, into build/reproducibility/),
each inside a `watch.Watch` (a machine probe before and after, other processes' load during), and reads their
ledgers; the saved machine profile (build/machine/) is removed before each run unless --keep-machine, so each run
measures the ceilings afresh. Results are grouped by kind (`common.core.baseline.kind`): deterministic, dimensionless
measured (ratios, fractions, speed-ups, errors) and absolute speeds (times and rates), the last both raw and
normalised by the machine (result / probe at the same moment, as `make run` judges them). Per result: median, min,
max and coefficient of variation; "within 15%" when every run lies within 15% of the median. The last line:
`reproducible within 15% over N runs: deterministic K/M, dimensionless K/M, speeds raw K/M, speeds normalised K/M`.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.core import baseline, runner  # noqa: E402
from common.core.watch import Watch  # noqa: E402

WITHIN = 0.15
KINDS = ("deterministic", "ratio", "speed")
LABEL = {"deterministic": "deterministic", "ratio": "dimensionless", "speed": "speeds"}


def spread(values: list[float]) -> dict:
    """median, min, max, coefficient of variation (stdev / |mean|) and whether every value is within 15% of the
    median."""
    med = statistics.median(values)
    mean = statistics.fmean(values)
    cv = statistics.stdev(values) / abs(mean) if len(values) > 1 and mean else 0.0
    within = all(abs(v - med) <= WITHIN * abs(med) for v in values) if med else all(v == 0 for v in values)
    return {"median": med, "min": min(values), "max": max(values), "cv": cv, "within": within}


def share(rows: list, key: str = "within") -> str:
    return f"{sum(r[key] for r in rows)}/{len(rows)}"


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
    got: dict[tuple[str, str], list] = {}
    moments, out, failed = [], runner.BUILD / "reproducibility", 0
    watch = Watch()
    try:
        for i in range(a.runs):
            if not a.keep_machine:
                for saved in runner.BUILD.joinpath("machine").glob("*.json"):
                    saved.unlink()
            for name in names:
                run = runner.watched(watch, runner.REPO_ROOT / "solutions" / name, a.profile, out / f"run{i + 1}",
                                     "solutions")
                print(f"run {i + 1}/{a.runs} {name[:-6]}: {run.status} in {run.seconds:.1f} s, machine "
                      f"{baseline.describe(baseline.machine_at(run.moment, None))}"
                      + (f" -- {run.error}" if run.status != "ok" else ""), flush=True)
                failed += run.status != "ok"
                moments.append(run.moment)
                for r in run.records:
                    got.setdefault((r["lab"], r["name"]), []).append((r, run.moment))
    finally:
        watch.close()
    ref = baseline.probe_reference([m for m in moments if m])
    rows = []
    for (lab, name), seen in sorted(got.items()):
        if len(seen) < 2:
            continue
        rec = seen[-1][0]
        row = {"lab": lab, "name": name, "kind": baseline.kind(rec), "unit": rec["unit"],
               **spread([r["value"] for r, _ in seen])}
        if row["kind"] == "speed":
            norm = [baseline.per_probe(r, baseline.machine_at(m, ref)) for r, m in seen]
            if all(v is not None for v in norm):
                n = spread(norm)
                row.update(norm_cv=n["cv"], norm_within=n["within"])
        rows.append(row)
    drifted = [at for at in (baseline.machine_at(m, ref) for m in moments) if at and at["drifted"]]
    print(f"\n{'kind':<13} {'lab':<16} {'result':<50} {'median':>10} {'min':>10} {'max':>10} {'CV':>6} 15%  "
          f"{'CV/probe':>8} 15%")
    for kind in KINDS:
        for r in (r for r in rows if r["kind"] == kind):
            norm = (f"{r['norm_cv']:>8.1%} {'yes' if r['norm_within'] else 'NO ':<3}" if "norm_cv" in r else "")
            print(f"{LABEL[kind]:<13} {r['lab']:<16} {r['name']:<50} {r['median']:>10.4g} {r['min']:>10.4g} "
                  f"{r['max']:>10.4g} {r['cv']:>6.1%} {'yes' if r['within'] else 'NO ':<3}  {norm} {r['unit']}")
    if ref:
        print(f"machine probe over {ref['readings']} readings: copy {ref['copy_gbps']:.1f} GB/s, matmul "
              f"{ref['matmul_gflops']:.1f} GFLOP/s, spread {ref['spread']:.1%} (log sd); {len(drifted)} of "
              f"{len(moments)} notebook runs drifted or busy (others up to "
              f"{max((m['others'] or 0.0 for m in moments if m), default=0.0):.2f} cores)")
    if failed:
        print(f"{failed} notebook run(s) failed: their results are missing from the table")
    by = {k: [r for r in rows if r["kind"] == k] for k in KINDS}
    normed = [r for r in by["speed"] if "norm_within" in r]
    print(f"reproducible within 15% over {a.runs} runs: deterministic {share(by['deterministic'])}, dimensionless "
          f"{share(by['ratio'])}, speeds raw {share(by['speed'])}, speeds normalised {share(normed, 'norm_within')}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
