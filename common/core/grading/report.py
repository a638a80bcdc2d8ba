"""What the grader writes: grades.csv (one row per file and exercise), summary.md (per learner and file, a class
summary per exercise, unmatched files, who submitted nothing), and each executed notebook for disputes."""
from __future__ import annotations

import csv
import re
from collections import Counter
from pathlib import Path

FIELDS = ["learner", "file", "lab", "exercise", "title", "status", "judged", "verdict"]
STATUSES = ("passed", "failed", "not attempted", "not checked")


def write_csv(rows: list[dict], path: Path) -> None:
    with Path(path).open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def summary_table(rows: list[dict]) -> str:
    """Markdown: one line per learner and file with counts of passed / failed / not attempted / not checked."""
    keys = sorted({(r["learner"], r.get("file", ""), r["lab"]) for r in rows})
    lines = ["| learner | file | lab | passed | failed | not attempted | not checked |", "|---|---|---|---|---|---|---|"]
    for learner, file, lab in keys:
        mine = [r for r in rows if (r["learner"], r.get("file", ""), r["lab"]) == (learner, file, lab) and r["exercise"]]
        count = Counter(r["status"] for r in mine)
        lines.append(f"| {learner} | {file} | {lab} | {count['passed']} of {len(mine)} | {count['failed']} | "
                     f"{count['not attempted']} | {count['not checked']} |")
    return "\n".join(lines)


def _verdict_key(verdict: str) -> str:
    """A failed verdict with its random numbers and seed taken out, so that one mistake is counted once."""
    text = re.sub(r"\s*\(random cases: seed \d+\)|\s*\[replay with seed=\d+\]|\[random case, seed \d+\]", "", verdict)
    return re.sub(r"-?\d+(\.\d+)?(e[+-]?\d+)?", "#", text).strip()


def class_summary(rows: list[dict], top: int = 3) -> str:
    """Markdown: per exercise, how many files passed it, and its most common failed verdicts (first lines)."""
    by_ex: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["exercise"]:
            by_ex.setdefault((int(r["lab"]), tuple(int(p) for p in r["exercise"].split(".")), r["exercise"],
                              r["title"]), []).append(r)
    lines = ["| exercise | title | passed | failed | not attempted | not checked | most common failed verdicts |",
             "|---|---|---|---|---|---|---|"]
    for (_, _, ex, title), mine in sorted(by_ex.items()):
        count = Counter(r["status"] for r in mine)
        failed = Counter()
        example = {}
        for r in mine:
            if r["status"] == "failed":
                key = _verdict_key(r["verdict"])
                failed[key] += 1
                example.setdefault(key, r["verdict"])
        common = "<br>".join(f"{n} x {example[k][:160].replace('|', '/')}" for k, n in failed.most_common(top))
        rate = f"{count['passed']} of {len(mine)} ({100 * count['passed'] / len(mine):.0f}%)"
        lines.append(f"| {ex} | {title} | {rate} | {count['failed']} | {count['not attempted']} | "
                     f"{count['not checked']} | {common} |")
    return "\n".join(lines)


def summary_markdown(rows: list[dict], unmatched: list[str], missing: list[str], in_kernel: dict[str, str],
                     settings: str) -> str:
    parts = ["# Grades", "", settings, "", "## Per learner and file", "", summary_table(rows), "",
             "## Class summary per exercise", "", class_summary(rows), ""]
    kernel = sorted({r["exercise"] for r in rows if r.get("judged") == "learner's kernel"})
    if kernel:
        parts += ["## Judged in the learner's kernel", "",
                  "These verdicts come from the learner's own kernel (a notebook could forge them): "
                  + ", ".join(f"{e} ({in_kernel.get(e, '')})" for e in kernel), ""]
    parts += ["## Files not graded", ""]
    parts += [f"- {u}" for u in unmatched] or ["none"]
    if missing is not None:
        parts += ["", "## Learners on the roster with nothing graded", ""]
        parts += [f"- {m}" for m in missing] or ["none"]
    return "\n".join(parts) + "\n"


def read_roster(path: Path) -> list[str]:
    """Learner names, one per line (blank lines and # comments ignored)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--roster {str(path)!r} is not a file (one learner's folder name per line)")
    names = [ln.split("#")[0].strip() for ln in path.read_text().splitlines()]
    return [n for n in names if n]
