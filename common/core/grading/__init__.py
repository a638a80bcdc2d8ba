"""Grade learners' lab notebooks: `python -m common grade DIR` (`make grade DIR=...`).

Every notebook under DIR (`DIR/<learner>/NN_name.ipynb`, or `DIR/NN_name.ipynb` for one learner) runs top to bottom
in a fresh kernel inside a bubblewrap sandbox (`sandbox`: unprivileged, own namespaces, read-only workbook, limits).
Each check cell's verdict is judged in the grader's own process by the pristine checker (`session`, `remote`): the
sandbox only runs the learner's functions on the grader's cases and returns the results as data. Exercises that only
the kernel can judge are marked "learner's kernel". Without bubblewrap the grader refuses, unless
unsafe_no_sandbox=True (`--unsafe-no-sandbox`).

Modules: codec (values as data), channel (the conversation), remote (the learner's function, seen from the grader),
runner (inside the sandbox), sandbox (bubblewrap and limits), session (one notebook), report (CSV and summary).
Output in --out: grades.csv (learner, file, lab, exercise, title, status, judged, verdict), summary.md, and each
executed notebook as <learner>/<file>. A status is passed / failed / not attempted / not checked (with the reason).
"""
from __future__ import annotations

import importlib
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common.core.grading.report import class_summary, read_roster, summary_markdown, summary_table, write_csv
from common.core.grading.sandbox import INSTALL_HINT, Limits, unavailable
from common.core.grading.session import GraderError, dumps_notebook, grade_one

LAB_RE = re.compile(r"^(\d\d)_")

__all__ = ["GraderError", "grade", "grade_notebook", "lab_number", "exercises_of", "find_notebooks", "unmatched_files", "Limits",
           "SandboxUnavailable", "summary_table", "class_summary", "read_roster"]


class SandboxUnavailable(ValueError):
    """No sandbox can be made on this machine (the grader refuses unless told --unsafe-no-sandbox)."""


def lab_number(path: Path) -> int:
    """The lab number from a notebook's file name (`04_flash_attention.ipynb` -> 4)."""
    m = LAB_RE.match(Path(path).name)
    if not m:
        raise ValueError(f"notebook {Path(path).name!r} is not named like a lab (NN_name.ipynb, e.g. 04_flash_attention"
                         f".ipynb)")
    return int(m.group(1))


def exercises_of(lab: int) -> dict[str, str]:
    """{exercise id: title} of every checker of lab `lab` (importing its checker module registers them)."""
    from common.core import checks
    try:
        importlib.import_module(f"common.exercises.lab{lab:02d}")
    except ModuleNotFoundError:
        return {}
    return {r["exercise"]: r["title"] for r in checks.progress_records(lab)}


def _candidates(folder: Path):
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"DIR={str(folder)!r} is not a folder of learners' notebooks")
    for path in sorted(folder.rglob("*.ipynb")):
        rel = path.relative_to(folder)
        if ".ipynb_checkpoints" in rel.parts or any(p.startswith(".") for p in rel.parts):
            continue
        yield (rel.parts[0] if len(rel.parts) > 1 else folder.name), path, rel


def find_notebooks(folder: Path) -> list[tuple[str, Path]]:
    """(learner, path) for every lab notebook under `folder`; the learner is the first sub-folder's name."""
    return [(learner, path) for learner, path, _ in _candidates(folder) if LAB_RE.match(path.name)]


def unmatched_files(folder: Path) -> list[str]:
    """Notebooks under `folder` that are not graded, each with the reason (not named NN_name.ipynb)."""
    return [f"{rel}: not named like a lab (NN_name.ipynb)" for _, path, rel in _candidates(folder)
            if not LAB_RE.match(path.name)]


def grade_notebook(path: Path, cell_timeout: float = 120, notebook_timeout: float = 600, limits: Limits = Limits(),
                   unsafe_no_sandbox: bool = False, slot: int = 0, threads: int = 1) -> dict:
    """Run one learner notebook in a sandbox; {"lab", "records", "note", "notebook"}."""
    lab = lab_number(path)
    result = grade_one(Path(path), exercises_of(lab), cell_timeout, notebook_timeout, limits, slot, threads,
                       sandboxed=not unsafe_no_sandbox)
    return dict(result, lab=lab)


def grade(folder: Path, out_dir: Path, cell_timeout: float = 120, notebook_timeout: float = 600, progress=print,
          jobs: int = 1, roster: Path | None = None, limits: Limits = Limits(), unsafe_no_sandbox: bool = False
          ) -> list[dict]:
    """Grade every learner notebook under `folder`, `jobs` at a time; write grades.csv, summary.md and the executed
    notebooks into `out_dir`; return the rows."""
    folder, out_dir = Path(folder), Path(out_dir)
    notebooks = find_notebooks(folder)
    unmatched = unmatched_files(folder)
    names = read_roster(roster) if roster is not None else None
    if not notebooks:
        raise ValueError(f"DIR={str(folder)!r} holds no lab notebooks (NN_name.ipynb)"
                         + (f"; not graded: {'; '.join(unmatched[:5])}" if unmatched else ""))
    for name, value in (("cell_timeout", cell_timeout), ("notebook_timeout", notebook_timeout), ("jobs", jobs)):
        if not value > 0:
            raise ValueError(f"{name}={value!r} must be > 0")
    if not unsafe_no_sandbox and unavailable():
        raise SandboxUnavailable(f"cannot grade in a sandbox: {unavailable()}; {INSTALL_HINT}")
    out_dir.mkdir(parents=True, exist_ok=True)
    for lab in sorted({lab_number(p) for _, p in notebooks}):
        exercises_of(lab)  # import the pristine checkers once, before any thread
    threads = max(1, (os.cpu_count() or 1) // jobs)
    slots, lock, done = list(range(jobs)), threading.Lock(), [0]

    def one(item):
        learner, path = item
        with lock:
            slot = slots.pop()
        try:
            result = grade_notebook(path, cell_timeout, notebook_timeout, limits, unsafe_no_sandbox, slot, threads)
        finally:
            with lock:
                slots.append(slot)
                done[0] += 1
                progress(f"[{done[0]}/{len(notebooks)}] {learner}: {path.relative_to(folder)}")
        return learner, path, result

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(one, notebooks))
    rows = []
    for learner, path, result in results:
        rel = str(path.relative_to(folder))
        lab = f"{result['lab']:02d}"
        for r in result["records"]:
            rows.append({"learner": learner, "file": rel, "lab": lab, "exercise": r["exercise"], "title": r["title"],
                         "status": r["status"], "judged": r.get("judged", ""),
                         "verdict": r["verdict"] or result["note"]})
        if not result["records"]:
            rows.append({"learner": learner, "file": rel, "lab": lab, "exercise": "", "title": "",
                         "status": "no exercises", "judged": "", "verdict": result["note"]})
        if result["notebook"] is not None:
            kept = out_dir / rel if len(Path(rel).parts) > 1 else out_dir / learner / rel
            kept.parent.mkdir(parents=True, exist_ok=True)
            kept.write_text(dumps_notebook(result["notebook"]))
    write_csv(rows, out_dir / "grades.csv")
    from common.core import checks
    missing = None if names is None else [n for n in names if n not in {learner for learner, _ in notebooks}]
    settings = (f"Cell limit {cell_timeout:g} s, notebook limit {notebook_timeout:g} s, {jobs} at a time, "
                + ("NO SANDBOX (--unsafe-no-sandbox)" if unsafe_no_sandbox else f"sandboxed ({limits.memory_mb} MB, "
                   f"{limits.processes} processes, {limits.cpu_s} s CPU per process)") + ".")
    text = summary_markdown(rows, unmatched, missing, checks.judged_in_kernel(), settings)
    (out_dir / "summary.md").write_text(text)
    progress(summary_table(rows))
    if unmatched:
        progress("not graded: " + "; ".join(unmatched))
    if missing:
        progress("on the roster with nothing graded: " + ", ".join(missing))
    return rows
