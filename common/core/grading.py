"""Grade learners' lab notebooks: `python -m common grade DIR`.

Every notebook under DIR (`DIR/<learner>/NN_name.ipynb`, or `DIR/NN_name.ipynb` for one learner) runs top to bottom in
a fresh kernel, in its own temporary folder that holds copies of `common/` and `data/`, under a time limit per cell
and per notebook. Run as root on Linux, the kernel sees every file outside its folder read-only (a private mount
namespace), so a notebook cannot change them; a notebook that loops forever, calls `sys.exit`, kills its kernel or deletes files ends with
its own row and cannot stop the others. Each exercise's verdict comes from the checkers' own records (a cell appended
at the end), or, when the kernel did not live that long, from the verdicts the check cells printed.

Output: `grades.csv` (learner, lab, exercise, title, status, verdict) and `summary.md` in --out, and the summary on
stdout. A status is passed / failed / not attempted / not checked (its check cell never ran, e.g. after a timeout).
"""
from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat

from common.core.env import REPO_ROOT

MARK = "<<workbook-grade>>"
VERDICT_RE = re.compile(r"^(?:FAIL )?(PASS|TODO|FAIL)? ?Exercise (\d+\.\d+) \((.*?)\): (.*)$")
LAB_RE = re.compile(r"^(\d\d)_")


def lab_number(path: Path) -> int:
    """The lab number from a notebook's file name (`04_flash_attention.ipynb` -> 4)."""
    m = LAB_RE.match(Path(path).name)
    if not m:
        raise ValueError(f"notebook {Path(path).name!r} is not named like a lab (NN_name.ipynb, e.g. 04_flash_attention"
                         f".ipynb)")
    return int(m.group(1))


def exercises_of(lab: int) -> dict[str, str]:
    """{exercise id: title} of every checker of lab `lab` (importing its checker module registers them)."""
    import importlib

    from common.core import checks
    try:
        importlib.import_module(f"common.exercises.lab{lab:02d}")
    except ModuleNotFoundError:
        return {}
    return {r["exercise"]: r["title"] for r in checks.progress_records(lab)}


def find_notebooks(folder: Path) -> list[tuple[str, Path]]:
    """(learner, path) for every lab notebook under `folder`; the learner is the first sub-folder's name."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"DIR={str(folder)!r} is not a folder of learners' notebooks")
    found = []
    for path in sorted(folder.rglob("*.ipynb")):
        rel = path.relative_to(folder)
        if ".ipynb_checkpoints" in rel.parts or not LAB_RE.match(path.name):
            continue
        found.append((rel.parts[0] if len(rel.parts) > 1 else folder.name, path))
    return found


def verdicts_from_outputs(nb) -> dict[str, tuple[str, str]]:
    """{exercise: (status, first line)} from what the check cells printed (PASS / TODO lines, FAIL errors)."""
    found = {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error" and out.get("ename") == "CheckFailed":
                lines = [out.get("evalue", "")]
            elif out.get("output_type") == "stream":
                lines = out.get("text", "").splitlines()
            else:
                continue
            for line in lines:
                m = VERDICT_RE.match(line.strip())
                if not m:
                    continue
                mark, ex, _title, detail = m.groups()
                status = {"PASS": "passed", "TODO": "not attempted"}.get(mark or "", "failed")
                found[ex] = (status, detail[:300])
    return found


def _records_from_final_cell(nb) -> list[dict] | None:
    for cell in reversed(nb.cells):
        for out in cell.get("outputs", []):
            text = out.get("text", "") if out.get("output_type") == "stream" else ""
            for line in text.splitlines():
                if line.startswith(MARK):
                    return json.loads(line[len(MARK):])
    return None


def _sandbox(tmp: Path, notebook: Path) -> Path:
    """A folder with copies of the workbook's code and data and of the learner's notebook."""
    shutil.copytree(REPO_ROOT / "common", tmp / "common", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO_ROOT / "data", tmp / "data")
    (tmp / "labs").mkdir()
    target = tmp / "labs" / notebook.name
    shutil.copy(notebook, target)
    return target


# Inside a private mount namespace: every mount read-only except the sandbox (and /proc, /sys, /dev), then the command.
_READ_ONLY_SCRIPT = (
    'box="$1"; shift; mount --bind "$box" "$box" || exit 97; '
    'for m in $(awk \'{print $5}\' /proc/self/mountinfo | sort -u); do case "$m" in '
    '/proc|/proc/*|/sys|/sys/*|/dev|/dev/*|"$box"|"$box"/*) ;; *) mount -o remount,bind,ro "$m" 2>/dev/null;; esac; '
    'done; touch "$box/.sealed" || exit 98; exec "$@"')


def read_only_prefix(tmp: Path) -> list[str]:
    """As root on Linux with `unshare`: a command prefix that makes every file outside `tmp` read-only for what it
    runs. Elsewhere [] (run the grader as an unprivileged user or in a container to protect your files)."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0 or not shutil.which("unshare"):
        return []
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", _READ_ONLY_SCRIPT, "sh", str(tmp)]


def grade_notebook(path: Path, cell_timeout: float = 120, notebook_timeout: float = 600) -> dict:
    """Run one learner notebook in a sandbox; return {"lab", "records", "note"}."""
    lab = lab_number(path)
    expected = exercises_of(lab)
    note = ""
    nb = None
    with tempfile.TemporaryDirectory(prefix="workbook-grade-") as tmpdir:
        tmp = Path(tmpdir)
        target = _sandbox(tmp, Path(path))
        out = tmp / "executed.ipynb"
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ")}
        env.update(PYTHONPATH=str(tmp), HOME=str(tmp), WORKBOOK_HEADLESS="1", WORKBOOK_PROFILE="quick",
                   WORKBOOK_RESULTS=str(tmp / "results.jsonl"), MPLBACKEND="Agg", PYTHONHASHSEED="0",
                   JUPYTER_RUNTIME_DIR=str(tmp / ".runtime"), MPLCONFIGDIR=str(tmp / ".mpl"), TMPDIR=str(tmp),
                   TRITON_CACHE_DIR=str(tmp / ".triton"), TORCHINDUCTOR_CACHE_DIR=str(tmp / ".inductor"))
        cmd = read_only_prefix(tmp) + [sys.executable, "-m", "common.core.grading", str(target), str(out), str(lab),
                                       str(cell_timeout)]
        proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            log, _ = proc.communicate(timeout=notebook_timeout)
            if proc.returncode:
                note = (log.decode(errors="replace").strip().splitlines() or ["the run failed"])[-1][:200]
        except subprocess.TimeoutExpired:
            note = f"stopped after the notebook limit of {notebook_timeout:g} s"
        finally:
            _kill_group(proc)
        if out.exists():
            try:
                nb = nbformat.read(str(out), as_version=4)
            except Exception as exc:  # a notebook that damaged its own output
                note = note or f"unreadable executed notebook: {exc}"
    records = _records(nb, expected)
    return {"lab": lab, "records": records, "note": note}


def _kill_group(proc) -> None:
    """Kill the grading process, its kernel (which runs in a session of its own) and anything they started."""
    import psutil
    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    for p in family:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    psutil.wait_procs(family, timeout=5)


def _records(nb, expected: dict[str, str]) -> list[dict]:
    final = _records_from_final_cell(nb) if nb is not None else None
    if final is not None:
        by_id = {r["exercise"]: r for r in final}
    else:
        printed = verdicts_from_outputs(nb) if nb is not None else {}
        by_id = {ex: {"exercise": ex, "title": expected.get(ex, ""), "status": s, "verdict": v}
                 for ex, (s, v) in printed.items()}
    rows = []
    for ex, title in expected.items():
        rows.append(by_id.get(ex, {"exercise": ex, "title": title, "status": "not checked", "verdict": ""}))
    return rows


def grade(folder: Path, out_dir: Path, cell_timeout: float = 120, notebook_timeout: float = 600,
          progress=print) -> list[dict]:
    """Grade every learner notebook under `folder`; write grades.csv and summary.md into `out_dir`; return rows."""
    notebooks = find_notebooks(folder)
    if not notebooks:
        raise ValueError(f"DIR={str(folder)!r} holds no lab notebooks (NN_name.ipynb)")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, (learner, path) in enumerate(notebooks, 1):
        progress(f"[{i}/{len(notebooks)}] {learner}: {path.name}")
        result = grade_notebook(path, cell_timeout, notebook_timeout)
        for r in result["records"]:
            rows.append({"learner": learner, "lab": f"{result['lab']:02d}", "exercise": r["exercise"],
                         "title": r["title"], "status": r["status"],
                         "verdict": r["verdict"] or result["note"]})
        if not result["records"]:
            rows.append({"learner": learner, "lab": f"{result['lab']:02d}", "exercise": "", "title": "",
                         "status": "no exercises", "verdict": result["note"]})
    with (out_dir / "grades.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["learner", "lab", "exercise", "title", "status", "verdict"])
        w.writeheader()
        w.writerows(rows)
    summary = summary_table(rows)
    (out_dir / "summary.md").write_text(summary + "\n")
    progress(summary)
    return rows


def summary_table(rows: list[dict]) -> str:
    """Markdown: one line per learner and lab with counts of passed / failed / not attempted / not checked."""
    keys = sorted({(r["learner"], r["lab"]) for r in rows})
    lines = ["| learner | lab | passed | failed | not attempted | not checked |", "|---|---|---|---|---|---|"]
    for learner, lab in keys:
        mine = [r for r in rows if r["learner"] == learner and r["lab"] == lab]
        count = {s: sum(r["status"] == s for r in mine) for s in ("passed", "failed", "not attempted", "not checked")}
        lines.append(f"| {learner} | {lab} | {count['passed']} of {len(mine)} | {count['failed']} | "
                     f"{count['not attempted']} | {count['not checked']} |")
    return "\n".join(lines)


def _execute(src: str, dst: str, lab: int, cell_timeout: float) -> None:
    """Inside the sandbox: execute the notebook (errors allowed), then record the checkers' verdicts."""
    from nbclient import NotebookClient
    nb = nbformat.read(src, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(
        f"import json as _json\nfrom common.core.checks import progress_records as _pr\n"
        f"print({MARK!r} + _json.dumps(_pr({lab})))"))
    client = NotebookClient(nb, timeout=cell_timeout, allow_errors=True, interrupt_on_timeout=True,
                            kernel_name="python3", resources={"metadata": {"path": str(Path(src).parent)}})
    client.on_cell_executed = lambda **_: nbformat.write(nb, dst)  # what ran survives a kill at the time limit
    try:
        client.execute()
    finally:
        nbformat.write(nb, dst)


if __name__ == "__main__":
    _execute(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
