"""Execute notebooks with papermill, collect the results ledger, and write build/report.md.

`python -m common run --profile quick --labs "02 04"` executes the chosen solutions and their unsolved labs into
build/executed/, gathers build/results.jsonl and writes build/report.md with per-notebook status, wall time, key
results and their comparison with the baselines: measured results against this machine's own baseline
(build/baselines/<fingerprint>.json, recorded automatically by the first run, or over several runs by
`record_baseline`), deterministic ones against the committed reference, data/baselines/<device>.json. Each solution
runs inside a `watch.Watch` (a machine probe before and after, other processes' load during), and
`common.core.baseline` judges its results against the baseline and that moment. With `strict`, a notebook with a
candidate regression is run once more and fails the run only when the re-run confirms it. It writes nothing outside
build/ (and temp folders).
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from common.core import baseline, notebooks, report, results
from common.core.env import PROFILES, REPO_ROOT
from common.core.watch import Watch

BUILD = REPO_ROOT / "build"
KINDS = ("solutions", "labs")
# The kernel's start-up log (e.g. its warning about unencrypted local TCP) would clutter the progress lines; cell
# errors still reach the notebook and the report.
KERNEL_ARGS = ["--IPKernelApp.log_level=ERROR"]
KERNEL_NAME = "python3"  # the kernel spec `execute` starts (the tests' own runs switch it to their warm kernel)


@dataclass
class Run:
    kind: str
    name: str
    status: str = "not run"  # ok / failed
    seconds: float = 0.0
    error: str = ""
    records: list = field(default_factory=list)
    moment: dict | None = None  # the machine around it (watch.Watch): probes before and after, others' load

    @property
    def lab(self) -> str:
        return self.name[:-6]


def select(labs: str | None, folder: Path = notebooks.SOLUTIONS) -> list[str]:
    """Notebook names for a LABS selection like "02 04" or "02_roofline"; all when empty. Unknown ones fail
    before anything runs, listing what there is."""
    names = notebooks.notebook_names(folder)
    if not labs or not labs.strip():
        return names
    chosen, unknown = [], []
    for token in labs.replace(",", " ").split():
        hits = [n for n in names if n == token or n[:-6] == token or n.split("_", 1)[0] == token.zfill(2)]
        (chosen.extend(h for h in hits if h not in chosen) if hits else unknown.append(token))
    if unknown:
        raise SystemExit(f"LABS names {' '.join(unknown)}, which is not a notebook here. Notebooks: "
                         + ", ".join(n[:-6] for n in names))
    return chosen


def check_profile(profile: str) -> None:
    if profile not in PROFILES:
        raise SystemExit(f"PROFILE={profile!r} is not a profile; allowed: {', '.join(PROFILES)}")


def _first_error(nb) -> str:
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                return f"{out.get('ename')}: {out.get('evalue')}"[:500]
    return ""


def execute(src: Path, profile: str, out_dir: Path, kind: str = "solutions", timeout: int = 900) -> Run:
    """Execute one notebook with papermill (PROFILE injected), headless, its ledger in out_dir/<name>.results.jsonl."""
    import papermill as pm
    name = src.name
    out_dir.mkdir(parents=True, exist_ok=True)
    ledger = out_dir / f"{name[:-6]}.results.jsonl"
    ledger.unlink(missing_ok=True)
    run = Run(kind, name)
    saved = {k: os.environ.get(k) for k in ("WORKBOOK_RESULTS", "WORKBOOK_HEADLESS")}
    os.environ.update(WORKBOOK_RESULTS=str(ledger), WORKBOOK_HEADLESS="1")
    start = time.perf_counter()
    try:
        nb = pm.execute_notebook(str(src), str(out_dir / name), parameters={"PROFILE": profile},
                                 kernel_name=KERNEL_NAME, cwd=str(src.parent), progress_bar=False,
                                 execution_timeout=timeout, extra_arguments=KERNEL_ARGS)
        run.status = "ok"
        run.error = _first_error(nb)
    except Exception as exc:  # PapermillExecutionError carries the cell's error
        run.status = "failed"
        run.error = f"{getattr(exc, 'ename', type(exc).__name__)}: {getattr(exc, 'evalue', exc)}"[:500]
    finally:
        run.seconds = time.perf_counter() - start
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    run.records = results.read_ledger(ledger)
    return run


def run_all(profile: str = "auto", labs: str | None = None, kinds=KINDS, build: Path = BUILD,
            strict: bool = False, watch=None, machine_baseline: Path | None = None) -> int:
    """The `make run` job; returns the process exit code. `watch`: a `watch.Watch` (default: the real probe);
    `machine_baseline`: the baseline file (default: this machine's, build/baselines/<fingerprint>.json)."""
    from tqdm.auto import tqdm
    check_profile(profile)
    names = select(labs)
    for kind in kinds:
        if kind not in KINDS:
            raise SystemExit(f"kind {kind!r} is not one of {', '.join(KINDS)}")
    jobs = [(kind, n) for n in names for kind in kinds if (REPO_ROOT / kind / n).exists()]
    watch = watch or Watch()
    runs = []
    bar = tqdm(jobs, desc="notebooks", unit="nb", file=sys.stdout)
    for kind, name in bar:
        bar.set_postfix_str(f"{kind}/{name}")
        run = watched(watch, REPO_ROOT / kind / name, profile, build / "executed" / kind, kind)
        runs.append(run)
        tqdm.write(_line(run), file=sys.stdout)

    def rerun(run: Run) -> Run:
        again = watched(watch, REPO_ROOT / run.kind / run.name, profile, build / "executed" / "confirm", run.kind)
        print(_line(again, "re-run"), flush=True)
        return again

    try:
        return finish(runs, profile, build, strict, machine_baseline, rerun)
    finally:
        watch.close()


def _line(run: Run, what: str = "") -> str:
    return (f"{'ok    ' if run.status == 'ok' else 'FAILED'} {what + ' ' if what else ''}{run.kind}/{run.name} in "
            f"{run.seconds:.1f} s" + (f" -- {run.error}" if run.status != "ok" else ""))


def watched(watch, src: Path, profile: str, out_dir: Path, kind: str) -> Run:
    """`execute`, inside the watch when it is a solution (the notebooks whose results are judged)."""
    if kind != "solutions" or watch is None:
        return execute(src, profile, out_dir, kind)
    run, moment = watch.run(lambda: execute(src, profile, out_dir, kind))
    run.moment = moment
    return run


def _by_device(records: list[dict]) -> dict:
    out: dict[str, list] = {}
    for r in records:
        out.setdefault(r["device"], []).append(r)
    return out


def judge(runs: list[Run], data: dict, ref: dict | None) -> list[dict]:
    """Rows of `baseline.judge` for the solutions' records of `runs` against the machine baseline file `data`."""
    moments = {run.lab: run.moment for run in runs if run.moment}
    rows = []
    for device, recs in _by_device([r for run in runs if run.kind == "solutions" for r in run.records]).items():
        rows += baseline.judge(recs, results.baselines_for(device, data.get("results", {})), moments, ref)
    return rows


def drift_record(runs: list[Run], ref: dict | None) -> dict | None:
    """The `ledger.machine_drift` record: the probe reading farthest from the reference over the run (-0.4: the
    machine ran 40% slower at that moment than at its baseline), with the most cores other processes used."""
    seen = [baseline.machine_at(run.moment, ref) for run in runs if run.moment]
    seen = [at for at in seen if at]
    drifts = [at["drift"] for at in seen if at["drift"] is not None]
    if not drifts:
        return None
    others = [at["others"] for at in seen if at.get("others") is not None]
    device = next((r["device"] for run in runs for r in run.records), "cpu")
    return {"name": "ledger.machine_drift", "value": max(drifts, key=abs), "unit": "fraction", "lab": "ledger",
            "device": device, "measured": True, "note": f"probe farthest from the baseline's over {len(drifts)} "
            f"notebooks; others used up to {max(others, default=0.0):.2f} cores"}


def finish(runs: list[Run], profile: str, build: Path, strict: bool = False, machine_baseline: Path | None = None,
           rerun=None) -> int:
    """Judge the runs, confirm candidates (strict: `rerun(run)` executes a notebook again), write the ledger, the
    report and, on a machine without one, its baseline; return the exit code."""
    build.mkdir(parents=True, exist_ok=True)
    path = machine_baseline or results.machine_baseline_path()
    data = results.load_machine_baseline(path)
    ok = [run for run in runs if run.kind == "solutions" and run.status == "ok"]
    first_run = not data and any(run.records for run in ok)  # a failed notebook's results are left out
    ref = data.get("probe")  # None: a first run, or a baseline recorded before probes (only the load is judged)
    rows = judge(runs, data, ref)
    reruns = []
    if strict and rerun is not None:
        labs = {row["lab"] for row in baseline.candidates(rows)}
        reruns = [rerun(run) for run in runs if run.kind == "solutions" and run.lab in labs]
        rows = baseline.confirm(rows, judge(reruns, data, ref))
    # the drift against the baseline's probe, else within this run (against its own median reading)
    drift = drift_record(runs, ref or baseline.probe_reference([run.moment for run in runs if run.moment]))
    records = [r for run in runs if run.kind == "solutions" for r in run.records] + ([drift] if drift else [])
    with (build / "results.jsonl").open("w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    (build / "moments.json").write_text(json.dumps({run.lab: run.moment for run in runs if run.moment}, indent=1))
    (build / "verdicts.json").write_text(json.dumps(rows, indent=1, default=str))
    text = report.render(runs, rows, reruns, profile, data, ref, drift, strict)
    if first_run:
        write_machine_baseline([{"records": [r for run in ok for r in run.records],
                                 "moments": {run.lab: run.moment for run in ok if run.moment}}], path,
                               note=f"recorded automatically by the first run, {profile}")
        left = [run.lab for run in runs if run.kind == "solutions" and run.status != "ok"]
        but = f" (but those of {', '.join(left)}, which failed)" if left else ""
        text += (f"\nThis machine had no baseline: this run's results{but} are now its baseline ({path.name}, one run: "
                 f"each measured result's band is {baseline.DEFAULT_BAND:.0%} until `make baseline` records "
                 f"{baseline.MIN_RUNS} runs); measured results are compared with it from the next run on.\n")
    (build / "report.md").write_text(text)
    summary = report.summary(runs, rows)
    print(summary)
    print(f"Report: {build / 'report.md'}; ledger: {build / 'results.jsonl'}")
    for row in rows:
        if row["status"] in ("regression", "changed", "regression?"):
            print(f"  {row['status'].upper()}: {row['name']} = {row['value']:.6g} {row['unit']} "
                  f"(baseline {row['baseline']:.6g}, band {row['band']:.0%})")
    confirmed = [r for r in rows if r["status"] == "regression"]
    changed = [r for r in rows if r["status"] == "changed"]
    return 1 if failures_in(runs) or changed or (strict and confirmed) else 0


def write_machine_baseline(runs: list[dict], path: Path, default_band: float = baseline.DEFAULT_BAND,
                           note: str = "") -> Path:
    """This machine's baseline from runs ({"records", "moments"}), all devices in one file keyed by name; entries
    of the existing file that these runs did not record are kept."""
    old = results.load_machine_baseline(path)
    records = [r for run in runs for r in run["records"]]
    data = {"results": dict(old.get("results", {}))}
    for device in _by_device(records):
        mine = [{"records": [r for r in run["records"] if r["device"] == device], "moments": run.get("moments", {})}
                for run in runs]
        made = baseline.make(mine, device, note, default_band)
        data.update(device=device, note=note, runs=made["runs"])
        data["results"].update(made["results"])
        if "probe" in made:
            data["probe"] = made["probe"]
    data["results"] = dict(sorted(data["results"].items()))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def record_baseline(n_runs: int = 3, profile: str = "auto", labs: str | None = None, build: Path = BUILD,
                    path: Path | None = None, watch=None, default_band: float = baseline.DEFAULT_BAND) -> Path:
    """`make baseline`: execute the chosen solutions `n_runs` times, each inside the watch, and record this
    machine's baseline from all of them (median and band per result, the probe's reference and band)."""
    check_profile(profile)
    names = select(labs)
    watch = watch or Watch()
    runs = []
    try:
        for i in range(n_runs):
            got = []
            for name in names:
                run = watched(watch, REPO_ROOT / "solutions" / name, profile, build / "baseline" / f"run{i + 1}",
                              "solutions")
                print(_line(run, f"baseline run {i + 1}/{n_runs}"), flush=True)
                if run.status != "ok":
                    raise SystemExit(f"baseline: solutions/{name} failed ({run.error}); fix it before recording")
                got.append(run)
            runs.append({"records": [r for run in got for r in run.records],
                         "moments": {run.lab: run.moment for run in got if run.moment}})
    finally:
        watch.close()
    return write_machine_baseline(runs, path or results.machine_baseline_path(), default_band,
                                  note=f"{n_runs} runs of {len(names)} solutions, {profile}")


def failures_in(runs: list[Run]) -> bool:
    return any(run.status != "ok" for run in runs)


def refresh_solutions(names: list[str], timeout: int = 900) -> None:
    """Maintainer: re-execute solutions in place (PROFILE quick, headless) so their committed outputs are current."""
    import nbformat
    from nbclient import NotebookClient
    os.environ.update(WORKBOOK_PROFILE="quick", WORKBOOK_HEADLESS="1")
    os.environ["WORKBOOK_RESULTS"] = str(BUILD / "refresh" / "results.jsonl")
    for name in names:
        path = notebooks.SOLUTIONS / name
        nb = notebooks.normalise(nbformat.read(str(path), as_version=4))
        start = time.perf_counter()
        NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                       resources={"metadata": {"path": str(path.parent)}}).execute()
        notebooks.normalise(nb)
        nb.metadata.pop("workbook", None)
        nbformat.write(nb, str(path))
        print(f"refreshed solutions/{name} in {time.perf_counter() - start:.1f} s")
