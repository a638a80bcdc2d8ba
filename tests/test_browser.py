"""The labs in a real browser: JupyterLab in headless Chromium, Run All, then every widget control moved.

Run with `make test-browser` (it installs Playwright and, as root, Debian's chromium). Skipped in `make test`
unless WORKBOOK_BROWSER=1. Per notebook: it opens unmodified (not marked unsaved), every cell runs within the
limits with no error output and nothing on stderr, each explore() shows exactly one widget, and each control of each
widget, moved from the widget's starting state, redraws its output (a new plot or new text) without an error;
redraw times are printed and written to
build/browser/redraw.md. Screenshots of failures go to build/browser/.
"""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.notebooks, pytest.mark.skipif(os.environ.get("WORKBOOK_BROWSER") != "1",
                                                        reason="browser test: run `make test-browser`")]

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "build" / "browser"
SOLUTIONS_TOO = ["02_roofline.ipynb", "07_collectives.ipynb", "10_scaling_and_cost.ipynb"]
CELL_LIMIT, NOTEBOOK_LIMIT = 240, 900
REDRAW_LIMIT = 5.0  # a control that takes longer has not redrawn at all, for this test
NOTEBOOKS = [f"labs/{p.name}" for p in sorted((REPO / "labs").glob("[0-9][0-9]_*.ipynb"))] + \
            [f"solutions/{n}" for n in SOLUTIONS_TOO]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    from browser import JupyterLab
    OUT.mkdir(parents=True, exist_ok=True)
    server = JupyterLab(tmp_path_factory.mktemp("jupyterlab"), NOTEBOOKS, OUT / "server.log")
    yield server
    server.close()


@pytest.fixture(scope="module")
def browser():
    from browser import chromium
    with chromium() as b:
        yield b


def _explore_calls(path: Path) -> int:
    nb = json.loads(path.read_text())
    return sum(len(re.findall(r"^\s*(?:widgets\.)?explore\(", "".join(c["source"]), re.M))
               for c in nb["cells"] if c["cell_type"] == "code")


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda n: n.replace("/", ":"))
def test_notebook_in_browser(notebook, lab, browser):
    from browser import NotebookPage
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    shot = OUT / (notebook.replace("/", "_").replace(".ipynb", "") + ".png")
    try:
        nb = NotebookPage(page, lab.notebook_url(notebook))
        time.sleep(1)
        assert not nb.dirty(), f"{notebook} is marked unsaved right after opening"
        deeper = _going_deeper_body(REPO / notebook)
        hidden = page.evaluate("() => window.jupyterapp.shell.currentWidget.content.widgets.map(w => w.isHidden)")
        shown = [i for i in deeper if not hidden[i]]
        assert not shown, f"{notebook}: going-deeper cells {shown} are shown on opening (their heading must be collapsed)"
        t0 = time.time()
        state = nb.run_all(CELL_LIMIT, NOTEBOOK_LIMIT)
        print(f"\n{notebook}: ran all cells in {time.time() - t0:.1f} s")
        errors = [f"cell {c['i']}: {e}" for c in state["cells"] for e in c["errors"]]
        assert not errors, f"{notebook}: error outputs\n" + "\n".join(errors)
        stderr = [f"cell {c['i']}: {t.strip()[:300]}" for c in state["cells"] for t in c["stderr"] if t.strip()]
        assert not stderr, f"{notebook}: stderr output (red in JupyterLab)\n" + "\n".join(stderr)
        widgets = nb.widgets()
        assert len(widgets) == _explore_calls(REPO / notebook), \
            f"{notebook}: {len(widgets)} widgets shown for {_explore_calls(REPO / notebook)} explore() calls"
        rows = []
        for w, widget in enumerate(widgets):
            widget.scroll_into_view_if_needed()
            for r in nb.move_every_control(widget, REDRAW_LIMIT):
                rows.append((w, r))
                print(f"  widget {w} {r['control']:<20} redraw {r['seconds']:.2f} s"
                      f"{'' if r['changed'] else ' (no new image)'}{' ERROR' if r['error'] else ''}")
        with (OUT / "redraw.md").open("a") as f:
            for w, r in rows:
                f.write(f"| {notebook} | {w} | {r['control']} | {r['seconds']:.2f} | {r['changed']} |\n")
        bad = [f"widget {w} control {r['control']}: " + (r["error"][-600:] or f"no new plot in {REDRAW_LIMIT:g} s")
               for w, r in rows if r["error"] or not r["changed"]]
        assert not bad, f"{notebook}:\n" + "\n".join(bad)
    except BaseException:
        page.screenshot(path=str(shot), full_page=True)
        raise
    finally:
        page.close()
        lab.shutdown_kernels()


def _going_deeper_body(path: Path) -> list[int]:
    """Indices of the cells under a collapsed 'Going deeper' heading (the heading itself stays visible)."""
    cells = json.loads(path.read_text())["cells"]
    return [i for i, c in enumerate(cells) if "going-deeper" in c.get("metadata", {}).get("tags", [])
            and not "".join(c["source"]).lstrip().startswith("### Going deeper")]


def _with_wrong_answers(root: Path) -> str:
    """A copy of lab 10 with two exercises answered wrong: 10.1 gives 2ND, 10.2's code crashes. Returns its path."""
    import nbformat
    nb = nbformat.read(str(REPO / "labs" / "10_scaling_and_cost.ipynb"), as_version=4)
    answers = {"def train_flops(": "def train_flops(params, tokens):\n    return 2 * params * tokens  # forward only",
               "def implied_mfu(": "def implied_mfu(flops, gpu_hours, gpu_id, dtype):\n    return flops / 0"}
    for cell in nb.cells:
        for head, body in answers.items():
            if cell.cell_type == "code" and head in cell.source:
                cell.source = body
    rel = "labs/10_wrong_answers.ipynb"
    nbformat.write(nb, str(root / rel))
    return rel


def test_run_all_reaches_the_progress_cell_after_failed_checks(lab, browser):
    """A failed check prints its verdict and the cell does not fail, so Run All goes on: every cell runs, the
    progress cell says which exercises failed and why."""
    from browser import NotebookPage
    rel = _with_wrong_answers(lab.root)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        nb = NotebookPage(page, lab.notebook_url(rel))
        state = nb.run_all(CELL_LIMIT, NOTEBOOK_LIMIT)  # raises when Run All stops at a cell
        errors = [f"cell {c['i']}: {e}" for c in state["cells"] for e in c["errors"]]
        assert not errors, errors
        text = page.evaluate("() => Array.from(document.querySelectorAll('.jp-OutputArea-output'))"
                             ".map(e => e.textContent).join('\\n')")
        assert "FAIL Exercise 10.1 (training FLOPs with 6ND)" in text and "2ND" in text
        assert "FAIL Exercise 10.2 (implied MFU)" in text and "ZeroDivisionError" in text
        assert "Lab 10: 0 of 6 exercises passed, 2 failed, 4 not attempted" in text, text[-2000:]
    except BaseException:
        page.screenshot(path=str(OUT / "run_all_wrong_answers.png"), full_page=True)
        raise
    finally:
        page.close()
        lab.shutdown_kernels()
