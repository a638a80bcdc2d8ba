"""Drive JupyterLab in a headless Chromium (Playwright), as a learner would: open a notebook, Run All, move widgets.

`JupyterLab(root)` starts `jupyter lab` on 127.0.0.1 with a free port and a random token on a folder of notebook
copies (so nothing a learner wrote is saved over); `Lab.open(path)` returns a `NotebookPage` that can run all cells,
report error outputs, and move every control of every interactive widget, timing the redraw. Everything started
here (server, kernels, browser) is stopped by `close()`, also when a test fails.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def chromium_path() -> str:
    """The system Chromium; a clear message when there is none."""
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    raise RuntimeError("no Chromium found: install Debian's `chromium` (apt-get install -y chromium), or set "
                       "CHROMIUM=/path/to/chrome; `make test-browser` installs it when run as root")


@contextlib.contextmanager
def chromium():
    """The system Chromium, headless, driven by Playwright; closed on leaving the block."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=os.environ.get("CHROMIUM") or chromium_path(),
                              args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            yield b
        finally:
            b.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JupyterLab:
    """A JupyterLab server on a copy of `notebooks` (paths relative to the repository), stopped by close()."""

    def __init__(self, workdir: Path, notebooks: list[str], log: Path):
        self.root = Path(workdir)
        for rel in notebooks:
            target = self.root / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO / rel, target)
        self.port, self.token = free_port(), secrets.token_hex(16)
        settings = self.root / ".settings" / "@jupyterlab" / "apputils-extension"
        settings.mkdir(parents=True)
        (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')  # no news pop-up
        tracker = self.root / ".settings" / "@jupyterlab" / "notebook-extension"
        tracker.mkdir(parents=True)
        # render every cell (no virtual scrolling), so widgets and outputs below the fold are in the page
        (tracker / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}')
        env = dict(os.environ, PYTHONPATH=str(REPO), JUPYTER_RUNTIME_DIR=str(self.root / ".runtime"),
                   JUPYTERLAB_SETTINGS_DIR=str(self.root / ".settings"),
                   JUPYTERLAB_WORKSPACES_DIR=str(self.root / ".workspaces"))
        for headless_marker in ("WORKBOOK_HEADLESS", "CI", "PAPERMILL_EXECUTION"):  # see common.core.env.is_headless:
            env.pop(headless_marker, None)  # the widgets must be interactive here, also when CI runs this test
        self.log = open(log, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={self.port}",
             f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root}",
             "--LabApp.expose_app_in_browser=True",
             *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []),
             ],
            cwd=self.root, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 90
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.proc.returncode}; see {log}")
            try:
                urllib.request.urlopen(f"{self.url}/api/status?token={self.token}", timeout=2)
                return
            except OSError:
                time.sleep(0.5)
        self.close()
        raise RuntimeError(f"jupyter lab did not answer on port {self.port} within 90 s; see {log}")

    def notebook_url(self, rel: str) -> str:
        """`rel` opened in a workspace of its own, reset: JupyterLab restores a workspace's tabs, so one shared
        workspace reopened every earlier notebook, with a kernel each, and once their kernels were shut down a
        'Select Kernel' dialog blocked Run All (seen at lab 14, 15 tabs in)."""
        name = "".join(ch if ch.isalnum() else "-" for ch in rel)
        return f"{self.url}/lab/workspaces/{name}/tree/{rel}?reset&token={self.token}"

    def shutdown_kernels(self) -> None:
        """Shut down every running session's kernel (between notebooks, so they do not pile up)."""
        import json
        auth = {"Authorization": f"token {self.token}"}
        with urllib.request.urlopen(urllib.request.Request(f"{self.url}/api/sessions", headers=auth)) as r:
            sessions = json.load(r)
        for s in sessions:
            req = urllib.request.Request(f"{self.url}/api/sessions/{s['id']}", headers=auth, method="DELETE")
            urllib.request.urlopen(req).close()

    def close(self) -> None:
        """Stop the server and every kernel it started (they run in its process group or below it)."""
        import psutil
        try:
            family = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            family = []
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        for p in family:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        self.proc.wait()
        psutil.wait_procs(family, timeout=5)
        self.log.close()


# JavaScript run in the page: the notebook panel of the current tab, through the app JupyterLab exposes.
_PANEL = "const app = window.jupyterapp; const panel = app.shell.currentWidget;"
_STATE = _PANEL + """
const cells = panel.content.widgets.map((w, i) => {
  const m = w.model; const out = m.type === 'code' ? m.outputs.toJSON() : [];
  return {i, type: m.type, count: m.type === 'code' ? m.executionCount : null,
          running: w.node.querySelector('.jp-InputPrompt')?.textContent.includes('*') || false,
          errors: out.filter(o => o.output_type === 'error').map(o => o.ename + ': ' + o.evalue),
          stderr: out.filter(o => o.output_type === 'stream' && o.name === 'stderr').map(o => o.text)};
});
return {cells, dirty: panel.context.model.dirty, kernel: panel.sessionContext.session?.kernel?.status};
"""


class NotebookPage:
    def __init__(self, page, url: str):
        self.page = page
        page.goto(url)
        page.wait_for_function("window.jupyterapp && window.jupyterapp.shell.currentWidget && "
                               "window.jupyterapp.shell.currentWidget.sessionContext && "
                               "window.jupyterapp.shell.currentWidget.sessionContext.session && "
                               "window.jupyterapp.shell.currentWidget.sessionContext.session.kernel && "
                               "window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status === 'idle'",
                               timeout=120_000)
        tabs = page.evaluate("() => Array.from(window.jupyterapp.shell.widgets('main')).length")
        if tabs != 1:
            raise AssertionError(f"{tabs} tabs open in the notebook's workspace, expected 1 (a restored workspace?)")

    def state(self) -> dict:
        return self.page.evaluate(f"() => {{ {_STATE} }}")

    def dirty(self) -> bool:
        return self.state()["dirty"]

    def run_all(self, cell_limit: float, notebook_limit: float) -> dict:
        """Run All Cells and wait until every code cell ran; raise TimeoutError naming a cell past its limit."""
        self.page.evaluate(f"() => {{ {_PANEL} return app.commands.execute('notebook:run-all-cells'); }}")
        start = last_change = time.time()
        last_done = -1
        while True:
            st = self.state()
            code = [c for c in st["cells"] if c["type"] == "code"]
            done = sum(1 for c in code if c["count"] is not None and not c["running"])
            if done == len(code) and st["kernel"] == "idle":
                return st
            now = time.time()
            if done != last_done:
                last_done, last_change = done, now
            running = next((c["i"] for c in code if c["running"]), None)
            if running is None and st["kernel"] == "idle" and now - last_change > 10:
                errors = [f"cell {c['i']}: {e[:300]}" for c in code for e in c["errors"]]
                raise RuntimeError(f"Run All stopped after {done} of {len(code)} code cells"
                                   + (": " + "; ".join(errors) if errors else " (no error output)"))
            if now - last_change > cell_limit:
                raise TimeoutError(f"cell {running} ran past the {cell_limit:g} s limit per cell")
            if now - start > notebook_limit:
                raise TimeoutError(f"the notebook ran past its {notebook_limit:g} s limit (at cell {running})")
            time.sleep(0.25)

    def widgets(self):
        """Locators of the interactive widgets (ipywidgets.interactive containers)."""
        return self.page.locator(".widget-interact").all()

    def move_every_control(self, widget, redraw_limit: float) -> list[dict]:
        """Move each control of `widget` once from the widget's starting state (then put it back); for each, the
        time until the output changed (a new plot image or new printed text) and any error shown."""
        results = []
        controls = widget.locator(".widget-slider, .widget-dropdown, .widget-checkbox, .widget-toggle-buttons").all()
        for control in controls:
            label = (control.locator(".widget-label").first.text_content() or "").strip("\u200b ").strip()
            if not label:  # a checkbox shows its description beside the box
                label = (control.text_content() or "?").strip("\u200b ").strip()
            before = self._snapshot(widget)
            t0 = time.time()
            undo = self._move(control)
            changed, error = False, ""
            while time.time() - t0 < redraw_limit:
                error = self._error_text(widget)
                if error:
                    break
                now = self._snapshot(widget)
                if now[0] and now != before:
                    changed = True
                    break
                time.sleep(0.05)
            results.append({"control": label, "seconds": time.time() - t0, "changed": changed, "error": error})
            undo()
            deadline = time.time() + redraw_limit
            while self._snapshot(widget) != before and time.time() < deadline:
                time.sleep(0.05)
        return results

    def _snapshot(self, widget) -> tuple:
        """(plot image, printed text) of the widget's output, read in one step (a redraw replaces the nodes)."""
        img, text = widget.evaluate(
            "el => [el.querySelector('.jp-OutputArea-output img')?.getAttribute('src') || '', "
            "Array.from(el.querySelectorAll('.jp-OutputArea-output pre')).map(p => p.textContent).join(' ')]")
        return (img or text, text)

    def _error_text(self, widget) -> str:
        return widget.evaluate(
            "el => { const e = el.querySelector(\".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
            ", .jp-RenderedText[data-mime-type='application/vnd.jupyter.stderr']\"); "
            "return e ? e.textContent.slice(-1500) : ''; }")

    @staticmethod
    def _move(control):
        """Move one control one step, as a learner would; return a function that moves it back."""
        cls = control.get_attribute("class") or ""
        if "widget-dropdown" in cls:
            select = control.locator("select")
            values = [o.get_attribute("value") for o in select.locator("option").all()]
            current = select.input_value()
            nxt = values[(values.index(current) + 1) % len(values)] if current in values else values[-1]
            select.select_option(nxt)
            return lambda: select.select_option(current)
        if "widget-checkbox" in cls:
            box = control.locator("input[type=checkbox]")
            box.click()
            return box.click
        if "widget-toggle-buttons" in cls:
            buttons = control.locator("button").all()
            active = [b for b in buttons if "mod-active" in (b.get_attribute("class") or "")]
            idle = [b for b in buttons if b not in active]
            (idle or buttons)[0].click()
            return (active[0].click if active else (lambda: None))
        # a slider: one step with the keyboard, as a learner nudging it (back, when it sits at its maximum)
        handle = control.locator(".noUi-handle").first
        readout = control.locator(".widget-readout").first
        before = readout.text_content()
        handle.focus()
        handle.press("ArrowRight")
        back = "ArrowLeft"
        if readout.text_content() == before:
            handle.press("ArrowLeft")
            back = "ArrowRight"

        def undo():
            handle.focus()
            handle.press(back)
        return undo
