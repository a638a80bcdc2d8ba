"""Execution time of each `## ` section of each executed notebook (papermill's per-cell durations).

Usage: python scripts/section_times.py [build/executed/solutions]  ->  a markdown table per lab, for INSTRUCTOR.md.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def section_times(path: Path) -> list[tuple[str, float]]:
    nb = json.loads(path.read_text())
    sections: list[list] = [["(set-up)", 0.0]]
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if cell["cell_type"] == "markdown":  # a heading may sit anywhere in a cell, after the last takeaway
            sections += [[line[3:].strip(), 0.0] for line in src.splitlines() if line.startswith("## ")]
        duration = cell.get("metadata", {}).get("papermill", {}).get("duration")
        if duration:
            sections[-1][1] += float(duration)
    return [(name, secs) for name, secs in sections]


def main(folder: str = "build/executed/solutions") -> int:
    paths = sorted(Path(folder).glob("[0-9][0-9]_*.ipynb"))
    if not paths:
        print(f"no executed notebooks in {folder}: run `make run` first")
        return 1
    for path in paths:
        rows = section_times(path)
        print(f"\n**{path.stem}** (total {sum(s for _, s in rows):.0f} s)\n")
        print("| section | run time (s) |\n|---|---|")
        for name, secs in rows:
            print(f"| {name} | {secs:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
