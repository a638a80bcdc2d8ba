"""How many tasks (processes + threads) each solution's grading sandbox holds at most, beside the grader's limit.

Usage (as root, so each sandbox runs as its own uid): python benchmarks/sandbox_tasks.py [NN_name.ipynb ...]
Grades each solution in its sandbox while sampling every 50 ms the tasks of the sandbox's uid; prints one row per
notebook and the limit's margin over the most any of them needed (`grading.Limits.processes` is set from this).
Do not run another grading (or `make test`) at the same time: a closing sandbox ends every process of its uid.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from common.core import grading  # noqa: E402
from common.core.grading import sandbox  # noqa: E402


def _sample(uid: int, stop: threading.Event, peak: list) -> None:
    while not stop.is_set():
        procs = tasks = 0
        for p in psutil.process_iter(["uids", "num_threads"]):
            try:
                if p.info["uids"] and p.info["uids"].real == uid:
                    procs, tasks = procs + 1, tasks + (p.info["num_threads"] or 1)
            except psutil.Error:
                pass
        peak[0] = max(peak[0], (tasks, procs))
        time.sleep(0.05)


def main(names: list[str]) -> int:
    if os.geteuid() != 0:
        print("run as root: only then does each sandbox run as its own uid, whose tasks can be counted")
        return 1
    names = names or sorted(p.name for p in (ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
    print(f"{'notebook':<45} {'tasks':>6} {'processes':>9} {'passed':>7} {'seconds':>8}")
    most = 0
    for name in names:
        peak, stop = [(0, 0)], threading.Event()
        t = threading.Thread(target=_sample, args=(sandbox.SANDBOX_UID, stop, peak))
        t.start()
        t0 = time.time()
        result = grading.grade_notebook(ROOT / "solutions" / name, cell_timeout=300, notebook_timeout=900, slot=0)
        stop.set()
        t.join()
        statuses = [r["status"] for r in result["records"]]
        most = max(most, peak[0][0])
        print(f"{name:<45} {peak[0][0]:>6} {peak[0][1]:>9} {statuses.count('passed'):>3}/{len(statuses):<3} "
              f"{time.time() - t0:>8.0f}")
    limit = grading.Limits().processes
    print(f"most tasks: {most}; the limit: {limit} ({limit / most:.1f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
