"""build/report.md: what `make run` executed, and each result against this machine's baseline at that moment.

`render` writes the page: the machine (the baseline's probe, this run's drift and other processes' load), one row
per notebook, the failures, one row per result (value, baseline, band, ratio, the speed over the probe, the machine
at that moment, status, the re-run's value when there was one) and the re-runs. `summary` is its last line.
"""
from __future__ import annotations

from common.core import baseline
from common.core.measurement import INJECT_ENV, injected_slowdown

STATUS_HELP = {
    "ok": "within its band (or, for a speed, within it once divided by the probe)",
    "improved": "better than its band",
    "moved": "a measured result without a direction, beyond its band",
    "new": "no baseline entry yet",
    "changed": "a deterministic result moved: the arithmetic changed (fails the run)",
    "machine drifted": "worse than its band while the machine itself drifted or was busy: not judged",
    "regression?": "a candidate: worse than its band, not re-run (STRICT=1 re-runs it)",
    "not confirmed": "a candidate the re-run did not confirm",
    "regression": "a candidate the re-run confirmed (fails STRICT=1)",
}


def _num(x, fmt: str = ".6g") -> str:
    return "-" if x is None else format(x, fmt)


def _band(band) -> str:
    return "-" if band is None else format(band, ".0%") if band >= 0.01 else format(band, ".0e")


def render(runs: list, rows: list[dict], reruns: list, profile: str, data: dict, ref: dict | None,
           drift: dict | None, strict: bool) -> str:
    records = [r for run in runs if run.kind == "solutions" for r in run.records]
    devices = sorted({r["device"] for r in records})
    resolved = sorted({r["profile"] for r in records}) or [profile]
    lines = ["# Workbook run report", "", f"PROFILE={profile} (ran as {', '.join(resolved)}). "
             f"Devices: {', '.join(devices) or '-'}. STRICT={'1' if strict else 'off'}.", ""]
    if injected_slowdown() > 1.0:
        lines += [f"**{INJECT_ENV}={injected_slowdown():g}: a planted slowdown is active** (timed helpers sleep "
                  "inside their timings; only the runner's test sets it).", ""]
    lines += _machine(data, ref, drift)
    by_lab = {}
    for row in rows:
        by_lab.setdefault(row["lab"], []).append(row)
    lines += ["", "| notebook | kind | status | wall time (s) | results | machine | vs baseline |",
              "|---|---|---|---|---|---|---|"]
    for run in runs:
        mine = by_lab.get(run.lab, []) if run.kind == "solutions" else []
        flagged = [r for r in mine if r["status"] in baseline.FLAGGED + ("machine drifted", "not confirmed")]
        if not mine:
            verdict = "-"
        elif all(r["status"] == "new" for r in mine):
            verdict = "no baseline"
        else:
            verdict = ", ".join(f"{sum(r['status'] == s for r in flagged)} {s}"
                                for s in dict.fromkeys(r["status"] for r in flagged)) or "ok"
        at = baseline.machine_at(run.moment, ref) if run.kind == "solutions" else None
        lines.append(f"| {run.lab} | {run.kind} | {run.status} | {run.seconds:.1f} | {len(run.records)} | "
                     f"{baseline.describe(at)} | {verdict} |")
    failures = [run for run in runs if run.status != "ok"]
    if failures:
        lines += ["", "## Failures", ""] + [f"- `{r.kind}/{r.name}`: {r.error}" for r in failures]
    if rows:
        lines += ["", "## Results", "", "| lab | name | kind | value | unit | baseline | band | ratio | per probe | "
                  "machine | status | re-run |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for row in rows:
            rerun = "-" if "rerun" not in row else f"{row['rerun']:.6g} ({row['rerun_status']}, " \
                f"{baseline.describe(row.get('rerun_machine'))})"
            lines.append(f"| {row['lab']} | {row['name']} | {row['kind']} | {row['value']:.6g} | {row['unit']} | "
                         f"{_num(row['baseline'])} | {_band(row['band'])} | {_num(row['ratio'], '.3f')} | "
                         f"{_num(row['per_probe'], '.3f')} | {baseline.describe(row['machine'])} | "
                         f"{row['status']} | {rerun} |")
        seen = dict.fromkeys(r["status"] for r in rows)
        lines += ["", "Statuses: " + "; ".join(f"`{s}`: {STATUS_HELP[s]}" for s in seen if s in STATUS_HELP) + "."]
    if reruns:
        lines += ["", "## Re-runs (STRICT=1: notebooks with a candidate regression, executed once more)", ""]
        lines += [f"- `{r.kind}/{r.name}`: {r.status} in {r.seconds:.1f} s, machine "
                  f"{baseline.describe(baseline.machine_at(r.moment, ref))}" for r in reruns]
    lines += ["", summary(runs, rows)]
    return "\n".join(lines) + "\n"


def _machine(data: dict, ref: dict | None, drift: dict | None) -> list[str]:
    if not data:
        base = "this machine has no baseline yet (this run records one)"
    else:
        base = f"this machine's baseline: {data.get('runs', 1)} run(s)"
        if data.get("probe"):
            p = data["probe"]
            base += (f"; its probe: copy {p['copy_gbps']:.1f} GB/s, matmul {p['matmul_gflops']:.1f} GFLOP/s, band "
                     f"{p['band']:.0%} over {p['readings']} readings")
    out = [f"Machine: {base}."]
    busy = (data.get("probe") or {}).get("others")
    if busy is not None and busy > baseline.LOAD_LIMIT:
        out.append(f"**The baseline was recorded while other processes used up to {busy:.2f} cores**: its probe band "
                   f"and its results' bands are those of a busy machine, and a result is judged only at a moment "
                   f"when others use at most {baseline.LOAD_LIMIT} cores -- record it again on a quiet machine "
                   "(`make baseline`).")
    if drift is not None:
        out.append(f"This run: `ledger.machine_drift` = {drift['value']:+.1%} (the probe reading farthest from "
                   f"{'the baseline' if data.get('probe') else 'this run'}'s; {drift['note'].split('; ')[-1]}).")
    elif ref is None:
        out.append("This run: no probe readings (the machine's drift is unknown).")
    return [" ".join(out)]


def summary(runs: list, rows: list[dict]) -> str:
    failures = sum(run.status != "ok" for run in runs)
    count = {s: sum(r["status"] == s for r in rows) for s in STATUS_HELP}
    records = sum(len(run.records) for run in runs if run.kind == "solutions")
    return (f"Notebooks: {len(runs) - failures} ok, {failures} failed. Results: {records}, "
            f"{count['regression']} confirmed performance regressions, {count['regression?']} candidates not re-run, "
            f"{count['not confirmed']} not confirmed by a re-run, {count['machine drifted']} not judged (machine "
            f"drifted), {count['changed']} deterministic results changed.")
