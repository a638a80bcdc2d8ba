"""Command line: `python -m common labs|check-sync|run|refresh|baseline|machine|inventory|grade|hub` (the Makefile
calls these)."""
from __future__ import annotations

import argparse
import json
import sys

from common.core import baseline, notebooks, results, runner


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m common", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("labs", help="regenerate labs/ from solutions/ (never overwrites a lab you edited)")
    g.add_argument("--labs", default="", help='subset, e.g. "02 04"')
    g.add_argument("--force", action="store_true", help="back up edited labs to labs/.backup/, then regenerate")
    sub.add_parser("check-sync", help="exit 1 when labs/ differs from what solutions/ generate")
    r = sub.add_parser("run", help="execute notebooks with papermill into build/, write the ledger and report")
    r.add_argument("--profile", default="auto")
    r.add_argument("--labs", default="")
    r.add_argument("--kinds", default="solutions,labs")
    r.add_argument("--strict", action="store_true", help="also fail on performance regressions")
    f = sub.add_parser("refresh", help="maintainer: re-execute solutions in place to refresh reference outputs")
    f.add_argument("--labs", default="")
    b = sub.add_parser("baseline", help="record this machine's baseline (build/baselines/<fingerprint>.json): run "
                                        "the solutions --runs times, or take the last run's ledger (--from-last)")
    b.add_argument("--runs", type=int, default=3, help="how many runs of the solutions (at least 3 give each "
                                                       "measured result a band from its own spread)")
    b.add_argument("--labs", default="", help='subset, e.g. "01 02" (other entries of the baseline are kept)')
    b.add_argument("--profile", default="auto")
    b.add_argument("--from-last", action="store_true", help="no execution: build/results.jsonl and "
                                                            "build/moments.json of the last `make run` (one run)")
    b.add_argument("--tolerance", type=float, default=baseline.DEFAULT_BAND,
                   help="the band of a measured result seen in fewer than 3 runs (relative)")
    b.add_argument("--reference", action="store_true",
                   help="maintainer: write the committed reference data/baselines/<device>.json from "
                        "build/results.jsonl instead (deterministic results only)")
    m = sub.add_parser("machine", help="print this machine's profile (ceilings, caches), measuring it if absent")
    m.add_argument("--refresh", action="store_true", help="measure again and save")
    sub.add_parser("inventory", help="print this machine's inventory as JSON")
    gr = sub.add_parser("grade", help="instructor: run learners' lab notebooks in sandboxes, write grades.csv")
    gr.add_argument("dir", help="folder of notebooks: DIR/<learner>/NN_name.ipynb (or DIR/NN_name.ipynb)")
    gr.add_argument("--out", default="build/grades", help="where grades.csv, summary.md and the executed notebooks go")
    gr.add_argument("--cell-timeout", type=float, default=120, help="seconds per cell")
    gr.add_argument("--notebook-timeout", type=float, default=600, help="seconds per notebook")
    gr.add_argument("--jobs", type=int, default=1, help="notebooks graded at once (each gets cores / jobs threads)")
    gr.add_argument("--roster", default=None, help="file of learner names (one per line): list who submitted nothing")
    gr.add_argument("--memory-mb", type=int, default=4096, help="memory per notebook's sandbox")
    gr.add_argument("--max-processes", type=int, default=128, help="processes and threads per sandbox")
    gr.add_argument("--unsafe-no-sandbox", action="store_true",
                    help="grade without bubblewrap: the notebooks run as you, unisolated (only for trusted notebooks)")
    from common.core.hub import cli as hub_cli
    hub_cli.add_parser(sub)
    a = p.parse_args(argv)

    if a.cmd == "labs":
        for line in notebooks.generate(runner.select(a.labs), force=a.force):
            print(line)
        return 0
    if a.cmd == "check-sync":
        bad = notebooks.out_of_sync()
        if bad:
            print("labs/ is out of sync with solutions/: " + ", ".join(bad) + " -- run `make labs`")
            return 1
        print("labs/ is in sync with solutions/")
        return 0
    if a.cmd == "run":
        return runner.run_all(a.profile, a.labs, tuple(k for k in a.kinds.split(",") if k), strict=a.strict)
    if a.cmd == "refresh":
        runner.refresh_solutions(runner.select(a.labs))
        return 0
    if a.cmd == "baseline":
        return _baseline(a)
    if a.cmd == "machine":
        from common.core import ceilings, env
        env.setup("machine", quiet=True)
        prof = ceilings.machine_profile(refresh=a.refresh)
        print(prof.summary())
        print(f"saved in {ceilings.profile_path(prof.fingerprint).relative_to(runner.REPO_ROOT)}")
        return 0
    if a.cmd == "grade":
        from pathlib import Path

        from common.core import grading
        try:
            limits = grading.Limits(memory_mb=a.memory_mb, processes=a.max_processes)
            grading.grade(Path(a.dir), Path(a.out), a.cell_timeout, a.notebook_timeout, jobs=a.jobs,
                          roster=Path(a.roster) if a.roster else None, limits=limits,
                          unsafe_no_sandbox=a.unsafe_no_sandbox)
        except (ValueError, grading.GraderError) as exc:
            print(f"grade: {exc}")
            return 2
        print(f"wrote {Path(a.out) / 'grades.csv'} and {Path(a.out) / 'summary.md'}")
        return 0
    if a.cmd == "hub":
        return hub_cli.run(a)
    if a.cmd == "inventory":
        from common.core import env
        print(json.dumps(env.inventory(), indent=1))
        return 0
    return 2


def _baseline(a) -> int:
    if a.tolerance <= 0:
        print(f"--tolerance={a.tolerance} must be > 0 (a relative band, e.g. 0.5)")
        return 2
    if a.reference or a.from_last:
        records = results.read_ledger(runner.BUILD / "results.jsonl")
        if not records:
            print("build/results.jsonl is empty: run `make run` first")
            return 1
    if a.reference:
        by_device = {}
        for rec in records:
            by_device.setdefault(rec["device"], []).append(rec)
        for device, recs in by_device.items():
            path = runner.REPO_ROOT / "data" / "baselines" / f"{device}.json"
            data = baseline.make([{"records": recs}], device, deterministic_only=True)
            data = {k: data[k] for k in ("device", "note", "results")}
            path.write_text(json.dumps(data, indent=1) + "\n")
            print(f"wrote {path.relative_to(runner.REPO_ROOT)} ({len(data['results'])} deterministic results)")
        return 0
    if a.from_last:
        moments_file = runner.BUILD / "moments.json"
        moments = json.loads(moments_file.read_text()) if moments_file.exists() else {}
        path = runner.write_machine_baseline([{"records": records, "moments": moments}],
                                             results.machine_baseline_path(), a.tolerance, "from the last run")
    else:
        if a.runs < 1:
            print(f"--runs={a.runs} must be >= 1 (3 or more give each result a band from its own spread)")
            return 2
        path = runner.record_baseline(a.runs, a.profile, a.labs, default_band=a.tolerance)
    data = results.load_machine_baseline(path)
    print(f"wrote {path.relative_to(runner.REPO_ROOT)} ({len(data['results'])} results, {data.get('runs', 1)} "
          f"run(s)): this machine's baseline")
    return 0


if __name__ == "__main__":
    sys.exit(main())
