"""Collect a lab from every learner on the hub into the grader's layout, `DIR/<learner>/NN_name.ipynb`, then grade it.

The learners' files are only read (never written, moved or touched), each without following links and only when the
learner owns it (see `accounts.notebooks_of`). DIR is the collector's own folder, marked with `.collected`; it is
emptied before each collection, so a notebook a learner has since deleted is not graded again.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from common.core.hub import accounts
from common.core.hub.settings import Settings

MARKER = ".collected"


def default_dir(settings: Settings, lab: int) -> Path:
    return Path(settings.state_dir) / "collected" / f"{lab:02d}"


def collect(settings: Settings, lab: int, out: Path) -> dict[str, list[str]]:
    """Copy every learner's `labs/NN_*.ipynb` of lab `lab` to out/<learner>/; {learner: file names} (empty for a
    learner with nothing to collect)."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        if not (out / MARKER).exists():
            raise ValueError(f"--out {str(out)!r} is a folder with files the collector did not write; give an empty "
                             f"or new folder")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("written by `python -m common hub collect`; emptied on each collection\n")
    found = {}
    for name in settings.learners:
        who = accounts.learner(name, Path(settings.state_dir))
        files = accounts.notebooks_of(who, lab)
        for fname, data in files.items():
            target = out / name / fname
            target.parent.mkdir(exist_ok=True)
            target.write_bytes(data)
        found[name] = sorted(files)
    return found


def roster_file(settings: Settings) -> Path:
    """The hub's roster as the grader reads one (written next to the settings)."""
    path = Path(settings.state_dir) / "roster.txt"
    path.write_text("".join(f"{n}\n" for n in settings.learners))
    return path
