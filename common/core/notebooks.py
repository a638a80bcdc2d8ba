"""The labs generator: solutions/ is the single source; labs/ is made from it.

In a solution's code cells, the lines from `### BEGIN SOLUTION` to `### END SOLUTION` become one line,
`raise NotImplementedError("Exercise N.M: ...")`, indented like the marker (N.M is the first "Exercise N.M" named in
the cell). In markdown cells, `<!-- BEGIN SOLUTION -->` ... `<!-- END SOLUTION -->` becomes "*Your answer here.*". A
`predict("key", guess, ...)` call keeps its key and loses its guess (`...`): the learner writes their own.
Outputs and execution counts are cleared. Each lab carries a hash of what was generated, so a lab a learner has
edited is never overwritten: `generate` refuses, or with force=True backs it up first and says where.
"""
from __future__ import annotations

import copy
import hashlib
import json
import re
import time
from pathlib import Path

import nbformat

from common.core.env import REPO_ROOT

SOLUTIONS = REPO_ROOT / "solutions"
LABS = REPO_ROOT / "labs"
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
MD_BEGIN, MD_END = "<!-- BEGIN SOLUTION -->", "<!-- END SOLUTION -->"
MD_STUB = "*Your answer here.*"
EXERCISE_RE = re.compile(r"Exercise (\d+\.\d+)")
LEARNER_NOTE = ("> **Learner copy**, generated from `solutions/{name}`. Fill in the cells that raise "
                "`NotImplementedError`, then run the check cell below each one. Your edits are safe: `make labs` "
                "will not overwrite a lab you have changed.")


class MarkerError(ValueError):
    """A solution notebook whose BEGIN/END SOLUTION markers do not pair up."""


def notebook_names(folder: Path = SOLUTIONS) -> list[str]:
    return sorted(p.name for p in Path(folder).glob("[0-9][0-9]_*.ipynb"))


def _stub_code(source: str, where: str) -> str:
    lines = source.split("\n")
    m = EXERCISE_RE.search(source)
    label = f"Exercise {m.group(1)}" if m else "Exercise"
    out, inside = [], False
    for n, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped == BEGIN:
            if inside:
                raise MarkerError(f"{where}, line {n}: {BEGIN} inside another solution region")
            inside = True
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f'{indent}raise NotImplementedError("{label}: replace this line with your code")')
        elif stripped == END:
            if not inside:
                raise MarkerError(f"{where}, line {n}: {END} without a {BEGIN} before it")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise MarkerError(f"{where}: {BEGIN} is never closed by {END}")
    return "\n".join(out)


def _blank_predictions(source: str) -> str:
    """The learner's copy asks for the guess: `predict("key", 20, ...)` becomes `predict("key", ..., ...)`."""
    if "predict(" not in source:
        return source
    import ast
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source
    lines = source.split("\n")
    spans = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "predict" \
                and len(node.args) >= 2 and not (isinstance(node.args[1], ast.Constant) and node.args[1].value is ...):
            guess = node.args[1]
            spans.append((guess.lineno, guess.col_offset, guess.end_lineno, guess.end_col_offset))
    for l0, c0, l1, c1 in sorted(spans, reverse=True):
        if l0 != l1:
            raise MarkerError(f"a predict(...) guess must fit on one line: {lines[l0 - 1].strip()}")
        line = lines[l0 - 1]
        lines[l0 - 1] = line[:c0] + "..." + line[c1:]
    return "\n".join(lines)


def _stub_markdown(source: str, where: str) -> str:
    pattern = re.compile(re.escape(MD_BEGIN) + r".*?" + re.escape(MD_END), re.S)
    result = pattern.sub(MD_STUB, source)
    if MD_BEGIN in result or MD_END in result:
        raise MarkerError(f"{where}: unpaired {MD_BEGIN} / {MD_END}")
    return result


def cells_hash(nb) -> str:
    """Hash of the cells' types and sources: what a learner edits (outputs do not count)."""
    payload = json.dumps([[c.cell_type, c.source] for c in nb.cells], ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def make_lab(solution) -> nbformat.NotebookNode:
    """The learner's copy of a solution notebook (a NotebookNode), in memory."""
    name = solution.metadata.get("workbook", {}).get("name", "")
    lab = copy.deepcopy(solution)
    for i, cell in enumerate(lab.cells):
        where = f"{name or 'notebook'} cell {i}"
        if cell.cell_type == "code":
            cell.source = _blank_predictions(_stub_code(cell.source, where))
            cell.outputs = []
            cell.execution_count = None
        elif cell.cell_type == "markdown":
            cell.source = _stub_markdown(cell.source, where)
    note = nbformat.v4.new_markdown_cell(LEARNER_NOTE.format(name=name))
    note["id"] = "learner-note"
    lab.cells.insert(1 if lab.cells and lab.cells[0].cell_type == "markdown" else 0, note)
    lab.metadata["workbook"] = {"name": name, "generated_from": f"solutions/{name}", "cells_hash": cells_hash(lab)}
    return lab


KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


def language_info() -> dict:
    """The language_info ipykernel reports for this Python: JupyterLab writes it into a notebook when the kernel
    starts, so a notebook that already holds the same values opens unmodified (not marked unsaved)."""
    import platform
    return {"codemirror_mode": {"name": "ipython", "version": 3}, "file_extension": ".py",
            "mimetype": "text/x-python", "name": "python", "nbconvert_exporter": "python",
            "pygments_lexer": "ipython3", "version": platform.python_version()}


def normalise(nb):
    """Workbook metadata for a solution: the python3 kernel and its language_info (as the executing kernel reports
    it), no editor-specific keys (e.g. jupytext's)."""
    nb.metadata.pop("jupytext", None)
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata["language_info"] = language_info()
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    return nb


def read(path: Path):
    nb = nbformat.read(str(path), as_version=4)
    nb.metadata.setdefault("workbook", {})["name"] = Path(path).name
    return nb


def dumps(nb) -> str:
    """Deterministic notebook text (so the sync test compares strings)."""
    return nbformat.writes(nb, version=4) + "\n"


def lab_for(name: str) -> str:
    return dumps(make_lab(read(SOLUTIONS / name)))


def edited_by_learner(path: Path) -> bool:
    """True when a lab's cells no longer match the hash recorded when it was generated."""
    if not path.exists():
        return False
    nb = nbformat.read(str(path), as_version=4)
    recorded = nb.metadata.get("workbook", {}).get("cells_hash")
    return recorded is None or recorded != cells_hash(nb)


def generate(names: list[str] | None = None, force: bool = False, solutions: Path = SOLUTIONS,
             labs: Path = LABS) -> list[str]:
    """Write labs/ from solutions/; return what was done, one line per notebook.

    A lab the learner edited is left alone (a line says so) unless force=True, which first copies it to
    labs/.backup/<name>.<UTC time>.ipynb.
    """
    names = names or notebook_names(solutions)
    labs.mkdir(parents=True, exist_ok=True)
    done = []
    for name in names:
        target = labs / name
        text = dumps(make_lab(read(solutions / name)))
        if target.exists() and target.read_text() == text:
            done.append(f"{name}: up to date")
            continue
        if edited_by_learner(target):
            if not force:
                done.append(f"{name}: KEPT -- you edited labs/{name}; not overwritten "
                            f"(run `make labs FORCE=1` to back it up and regenerate)")
                continue
            backup = labs / ".backup" / f"{name[:-6]}.{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.ipynb"
            backup.parent.mkdir(exist_ok=True)
            backup.write_bytes(target.read_bytes())
            done.append(f"{name}: your edited copy was backed up to {backup.relative_to(labs.parent)}")
        target.write_text(text)
        done.append(f"{name}: written")
    return done


def out_of_sync(solutions: Path = SOLUTIONS, labs: Path = LABS) -> list[str]:
    """Names of labs whose committed text differs from what the generator makes (empty when in sync)."""
    bad = []
    for name in notebook_names(solutions):
        target = labs / name
        if not target.exists() or target.read_text() != dumps(make_lab(read(solutions / name))):
            bad.append(name)
    extra = set(notebook_names(labs)) - set(notebook_names(solutions))
    return bad + sorted(f"{n} (no solution)" for n in extra)
