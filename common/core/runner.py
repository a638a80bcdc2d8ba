"""Execute notebooks with papermill, collect the results ledger, and write build/report.md.

`python -m common run --profile quick --labs "02 04"` executes the chosen solutions and their unsolved labs into
build/executed/, gathers build/results.jsonl and writes build/report.md with per-notebook status, wall time, key
results and their comparison with the baselines: measured results against this machine's own baseline
(build/baselines/<fingerprint>.json, recorded automatically by the first run), deterministic ones against the committed
reference, data/baselines/<device>.json. It writes nothing outside build/ (and temp folders).
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from common.core import notebooks, results
from common.core.env import PROFILES, REPO_ROOT

BUILD = REPO_ROOT / "build"
KINDS = ("solutions", "labs")
# The kernel's start-up log (e.g. its warning about unencrypted local TCP) would clutter the progress lines; cell
# errors still reach the notebook and the report.
KERNEL_ARGS = ["--IPKernelApp.log_level=ERROR"]


@dataclass
class Run:
    kind: str
    name: str
    status: str = "not run"  # ok / failed
    seconds: float = 0.0
    error: str = ""
    records: list = field(default_factory=list)


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
                                 kernel_name="python3", cwd=str(src.parent), progress_bar=False,
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
            strict: bool = False) -> int:
    """The `make run` job; returns the process exit code."""
    from tqdm.auto import tqdm
    check_profile(profile)
    names = select(labs)
    for kind in kinds:
        if kind not in KINDS:
            raise SystemExit(f"kind {kind!r} is not one of {', '.join(KINDS)}")
    jobs = [(kind, n) for n in names for kind in kinds if (REPO_ROOT / kind / n).exists()]
    runs = []
    bar = tqdm(jobs, desc="notebooks", unit="nb", file=sys.stdout)
    for kind, name in bar:
        bar.set_postfix_str(f"{kind}/{name}")
        run = execute(REPO_ROOT / kind / name, profile, build / "executed" / kind, kind)
        runs.append(run)
        tqdm.write(f"{'ok    ' if run.status == 'ok' else 'FAILED'} {kind}/{name} in {run.seconds:.1f} s"
                   + (f" -- {run.error}" if run.status != "ok" else ""), file=sys.stdout)
    return write_report(runs, profile, build, strict)


MEASURED_TOLERANCE = 0.5  # relative: a shared 2-core machine's run-to-run noise, see README "Reading the report"


def write_machine_baseline(records: list[dict], path: Path, tolerance: float = MEASURED_TOLERANCE,
                           note: str = "") -> Path:
    """This machine's baseline from a run's records (all devices in one file, keyed by name)."""
    by_device: dict[str, list] = {}
    for r in records:
        by_device.setdefault(r["device"], []).append(r)
    data = {"results": {}}
    for device, recs in by_device.items():
        made = results.make_baseline(recs, device, tolerance, note)
        data.update(device=device, note=made["note"])
        data["results"].update(made["results"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def write_report(runs: list[Run], profile: str, build: Path, strict: bool = False,
                 machine_baseline: Path | None = None) -> int:
    records = [r for run in runs if run.kind == "solutions" for r in run.records]
    build.mkdir(parents=True, exist_ok=True)
    with (build / "results.jsonl").open("w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    by_device: dict[str, list] = {}
    for r in records:
        by_device.setdefault(r["device"], []).append(r)
    if machine_baseline is None:
        from common.core.ceilings import fingerprint
        machine_baseline = build / "baselines" / f"{fingerprint()}.json"
    own = json.loads(machine_baseline.read_text()).get("results", {}) if machine_baseline.exists() else {}
    compared = {}
    for device, recs in by_device.items():
        for row in results.compare_with_baseline(recs, results.baselines_for(device, own)):
            compared[(row["lab"], row["name"])] = row
    first_run = not machine_baseline.exists() and bool(records) and not failures_in(runs)
    resolved = sorted({r["profile"] for r in records}) or [profile]
    lines = ["# Workbook run report", "", f"PROFILE={profile} (ran as {', '.join(resolved)}). "
             f"Devices: {', '.join(sorted(by_device)) or '-'}.",
             "", "| notebook | kind | status | wall time (s) | results | vs baseline |", "|---|---|---|---|---|---|"]
    for run in runs:
        rows = [compared.get((r["lab"], r["name"])) for r in run.records] if run.kind == "solutions" else []
        flagged = [row for row in rows if row and row["status"] in ("regression", "changed", "drift")]
        if not rows:
            verdict = "-"
        elif all(row is None or row["status"] == "new" for row in rows):
            verdict = "no baseline"
        else:
            verdict = f"{len(flagged)} flagged" if flagged else "ok"
        lines.append(f"| {run.name[:-6]} | {run.kind} | {run.status} | {run.seconds:.1f} | {len(run.records)} | "
                     f"{verdict} |")
    failures = [run for run in runs if run.status != "ok"]
    if failures:
        lines += ["", "## Failures", ""] + [f"- `{r.kind}/{r.name}`: {r.error}" for r in failures]
    if compared:
        lines += ["", "## Results", "", "| lab | name | value | unit | baseline | ratio | status |",
                  "|---|---|---|---|---|---|---|"]
        for row in compared.values():
            base = "-" if row["baseline"] is None else f"{row['baseline']:.6g}"
            ratio = "-" if row["ratio"] is None else f"{row['ratio']:.3f}"
            lines.append(f"| {row['lab']} | {row['name']} | {row['value']:.6g} | {row['unit']} | {base} | {ratio} | "
                         f"{row['status']} |")
    changed = [r for r in compared.values() if r["status"] == "changed"]
    regressions = [r for r in compared.values() if r["status"] == "regression"]
    lines += ["", f"Notebooks: {len(runs) - len(failures)} ok, {len(failures)} failed. Results: {len(records)}, "
              f"{len(regressions)} performance regressions, {len(changed)} deterministic results changed."]
    if first_run:
        write_machine_baseline(records, machine_baseline, note=f"recorded automatically by the first run, {profile}")
        lines += ["", f"This machine had no baseline: this run's results are now its baseline "
                  f"({machine_baseline.name}); measured results are compared with it from the next run on."]
    (build / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-1:]))
    print(f"Report: {build / 'report.md'}; ledger: {build / 'results.jsonl'}")
    for r in regressions + changed:
        print(f"  {r['status'].upper()}: {r['name']} = {r['value']:.6g} {r['unit']} (baseline {r['baseline']:.6g})")
    return 1 if failures or changed or (strict and regressions) else 0


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
