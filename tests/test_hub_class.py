"""A class on the hub: `python -m common hub start` on 127.0.0.1 with three learners, each logged in by headless
Chromium, who opens labs/00_orientation.ipynb, runs it, solves exercise 0.1 as a learner would (pastes the code, runs
the cell and its check) and saves. Then: each learner has their own copy and their own thread and memory limit, no
learner can read another's files (their permissions, and their server's view), no solution is in any learner's copy;
the instructor collects lab 00 and grades it (three rows for 0.1 in grades.csv, each passed), the learners' files
untouched; the hub stops and leaves no process behind. Prints the class's figures (login to first cell, memory per
learner server) and writes them to build/browser/hub_class.md.

Run with `make test-browser` (it installs JupyterHub, the proxy, Playwright and Chromium); needs root (it makes the
learners' Unix users, and removes them at the end).
"""
from __future__ import annotations

import csv
import glob
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.notebooks,
              pytest.mark.skipif(os.environ.get("WORKBOOK_BROWSER") != "1",
                                 reason="class test: run `make test-browser`"),
              pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                                 reason="the class test makes the learners' Unix users: run it as root")]

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "build" / "browser"
LAB = "labs/00_orientation.ipynb"
LEARNERS = ["wbclass-ada", "wbclass-bo", "wbclass-cy"]


def _solution_of(exercise_head: str) -> str:
    """The solution's code of the exercise cell, as a learner would write it (without the solution markers)."""
    nb = json.loads((REPO / "solutions" / "00_orientation.ipynb").read_text())
    source = next("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code" and
                  "".join(c["source"]).startswith(exercise_head))
    return "\n".join(ln for ln in source.splitlines() if "SOLUTION" not in ln)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _wait_for_hub(url: str, proc, log: Path, seconds: float = 90) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the hub exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            urllib.request.urlopen(f"{url}/hub/api", timeout=2).close()
            return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"the hub did not answer within {seconds:g} s:\n{log.read_text()[-3000:]}")


def _processes_of(uids: set[int]) -> list:
    import psutil
    return [p for p in psutil.process_iter(["pid", "uids", "cmdline"]) if p.info["uids"] and
            p.info["uids"].real in uids]


def _family(pid: int) -> list:
    import psutil
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _stop(proc) -> float:
    """SIGTERM the hub (it stops every server and the proxy first); seconds it took, SIGKILL to its group after 60."""
    t0 = time.time()
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return time.time() - t0


class Learner:
    """One learner's browser tab, from the hub's login page to a saved notebook."""

    def __init__(self, browser, url: str, name: str, password: str):
        self.name, self.password, self.url = name, password, url
        self.context = browser.new_context(viewport={"width": 1400, "height": 1000})
        self.page = self.context.new_page()
        self.times = {}

    def log_in(self) -> None:
        self.page.goto(f"{self.url}/hub/login")
        self.page.fill("#username_input", self.name)
        self.page.fill("#password_input", self.password)
        self.times["login"] = time.time()
        self.page.click("#login_submit")

    def server_ready(self) -> bool:
        """True once the hub has sent the learner on to their JupyterLab (the spawn is done). (The page is asked for
        its address: Playwright's cached page.url only moves while the test calls into Playwright.)"""
        try:
            href = self.page.evaluate("() => location.href")
        except Exception:  # noqa: BLE001 -- navigating at that moment
            return False
        if f"/user/{self.name}/lab" in href:
            self.times.setdefault("server", time.time())
            return True
        return False

    def open_notebook(self) -> None:
        self.page.goto(f"{self.url}/user/{self.name}/lab/workspaces/class/tree/{LAB}?reset", wait_until="commit")

    def evaluate(self, script: str):
        from browser import _PANEL
        return self.page.evaluate(f"() => {{ {_PANEL} {script} }}")

    def kernel_idle(self) -> bool:
        try:
            idle = bool(self.page.evaluate(
                "() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget; "
                "return !!(w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel && "
                "w.sessionContext.session.kernel.status === 'idle'); }"))
        except Exception:  # noqa: BLE001 -- the page is still loading
            return False
        if idle:
            self.times.setdefault("kernel", time.time())
        return idle

    def run_all(self) -> None:
        self.times["run_all"] = time.time()
        self.evaluate("app.commands.execute('notebook:run-all-cells'); return null;")  # not awaited: all at once

    def state(self) -> dict:
        from browser import _STATE
        return self.page.evaluate(f"() => {{ {_STATE} }}")

    def ran_all(self) -> bool:
        """True once every code cell has run (and the kernel is idle); notes when the first one had."""
        st = self.state()
        code = [c for c in st["cells"] if c["type"] == "code"]
        done = sum(1 for c in code if c["count"] is not None and not c["running"])
        if done:
            self.times.setdefault("first_cell", time.time())
        return done == len(code) and st["kernel"] == "idle"

    def errors(self) -> list[str]:
        return [f"cell {c['i']}: {e[:300]}" for c in self.state()["cells"] for e in c["errors"]]

    def solve_and_save(self, head: str, solution: str) -> str:
        """Paste the solution into the exercise's cell, run it and its check cell (Shift+Enter twice), save (Ctrl+S);
        the check cell's text."""
        index = self.evaluate(f"return panel.content.widgets.findIndex(w => w.model.sharedModel.getSource()"
                              f".startsWith({json.dumps(head)}));")
        cell = self.page.locator(".jp-Notebook .jp-Cell").nth(index)
        cell.locator(".cm-content").click()
        self.page.keyboard.press("Control+a")
        self.page.keyboard.insert_text(solution)
        self.page.keyboard.press("Shift+Enter")
        self.page.keyboard.press("Shift+Enter")
        check = self.page.locator(".jp-Notebook .jp-Cell").nth(index + 1)
        deadline = time.time() + 60
        text = ""
        while time.time() < deadline and "Exercise 0.1" not in text:
            text = check.locator(".jp-OutputArea").text_content() or ""
            time.sleep(0.2)
        self.page.keyboard.press("Control+s")
        deadline = time.time() + 30
        while time.time() < deadline and self.state()["dirty"]:
            time.sleep(0.2)
        return text

    def close(self) -> None:
        self.context.close()


@pytest.fixture(scope="module")
def browser():
    from browser import chromium
    with chromium() as b:
        yield b


def test_a_class_of_three_on_the_hub(tmp_path, browser):
    from browser import free_port
    from common.core.hub import accounts
    t_start = time.time()
    OUT.mkdir(parents=True, exist_ok=True)
    accounts.remove_accounts(LEARNERS)  # a run killed before its clean-up left them
    state, roster = tmp_path / "hub", tmp_path / "learners.txt"
    roster.write_text("# the class test's roster\n" + "\n".join(LEARNERS) + "\n")
    port, hub_port, api_port = free_port(), free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    log = OUT / "hub_class.log"
    instructor_lab = REPO / LAB
    lab_sha = _sha(instructor_lab)
    proc = subprocess.Popen(
        [sys.executable, "-m", "common", "hub", "start", "--roster", str(roster), "--port", str(port), "--hub-port",
         str(hub_port), "--proxy-api-port", str(api_port), "--state", str(state), "--idle-minutes", "30"],
        cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    learners, figures, started = [], {}, []
    try:
        _wait_for_hub(url, proc, log)
        started = _family(proc.pid)
        passwords = {r["learner"]: r["password"] for r in csv.DictReader((state / "passwords.csv").open())}
        settings = json.loads((state / "settings.json").read_text())
        who = {n: accounts.learner(n, state) for n in LEARNERS}
        for n in LEARNERS:  # the notebook records when each cell ran (cell metadata), for the figures below
            _write_as(who[n], ".jupyter/lab/user-settings/@jupyterlab/notebook-extension/tracker.jupyterlab-settings",
                      json.dumps({"windowingMode": "none", "recordTiming": True}))
        figures["hub start (s)"] = round(time.time() - t_start, 1)

        # three learners log in at once; each server spawns in its sandbox; each opens lab 00 and runs it all
        learners = [Learner(browser, url, n, passwords[n]) for n in LEARNERS]
        for learner in learners:
            learner.log_in()
        _until(lambda: all([x.server_ready() for x in learners]), 180, "every learner's server started")
        for learner in learners:
            learner.open_notebook()
        _until(lambda: all([x.kernel_idle() for x in learners]), 120, "every learner's kernel ready")
        for learner in learners:
            learner.run_all()
        _until(lambda: all([x.ran_all() for x in learners]), 180, "Run All done for everyone")
        figures["run all, three at once (s)"] = round(time.time() - min(x.times["run_all"] for x in learners), 1)
        for learner in learners:
            assert not learner.errors(), f"{learner.name}: {learner.errors()}"

        # each solves exercise 0.1 by pasting the solution, runs its check, saves
        head = "# Exercise 0.1"
        solution = _solution_of(head)
        for learner in learners:
            verdict = learner.solve_and_save(head, solution)
            assert "PASS Exercise 0.1" in verdict, f"{learner.name}: {verdict!r}"

        # their own copies, owned by them, with their solution, the instructor's lab untouched
        copies = {n: who[n].workbook / LAB for n in LEARNERS}
        for n, path in copies.items():
            st = path.stat()
            assert st.st_uid == who[n].uid and "2 * n_elements" in path.read_text(), n
            assert (who[n].home.stat().st_mode & 0o777) == 0o700, n
        assert len({p.stat().st_ino for p in copies.values()}) == 3
        assert _sha(instructor_lab) == lab_sha

        # each server: its learner's uid, its own thread limit and memory cgroup (or RLIMIT_DATA), a view of its own
        def running(n, module):
            return [p for p in _processes_of({who[n].uid}) if p.info["cmdline"][1:3] == ["-m", module]]
        servers = {n: running(n, "jupyterhub.singleuser") for n in LEARNERS}
        kernels = {n: running(n, "ipykernel_launcher") for n in LEARNERS}
        groups = set()
        for n in LEARNERS:
            assert len(servers[n]) == 1 and kernels[n], (n, servers[n], kernels[n])
            env = kernels[n][0].environ()
            assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == str(settings["threads"]), env
            assert env["WORKBOOK_HUB_LEARNER"] == n
            memory = env["WORKBOOK_HUB_MEMORY"]
            if "cgroup" in memory:  # the kernel is in the server's memory cgroup, limited to the learner's share
                line = next(ln for ln in Path(f"/proc/{kernels[n][0].pid}/cgroup").read_text().splitlines()
                            if ":memory:" in ln or ln.startswith("0::"))
                group = line.split(":", 2)[2]
                knob = Path(f"/sys/fs/cgroup/memory{group}/memory.limit_in_bytes") if ":memory:" in line else \
                    Path(f"/sys/fs/cgroup{group}/memory.max")
                assert "workbook-hub-" in group and int(knob.read_text()) == settings["memory_mb"] << 20, (line, knob)
                groups.add(group)
            else:
                assert f"{settings['memory_mb'] << 20} " in Path(f"/proc/{kernels[n][0].pid}/limits").read_text()
            root = Path(f"/proc/{servers[n][0].pid}/root")
            assert sorted(os.listdir(root / "home")) == [n]  # no other learner's home exists in its view
            assert not (root / str(REPO).lstrip("/") / "solutions").exists()
            assert (root / str(REPO).lstrip("/") / "common" / "core" / "env.py").exists()
        assert len(groups) in (0, 3), groups  # a cgroup each, when cgroups are used

        # idle servers are culled after the time the instructor set (30 minutes here)
        assert any(p.cmdline()[1:4] == ["-m", "jupyterhub_idle_culler", "--timeout=1800"] for p in started)

        # no learner can read another's files: as learner A, read B's notebook
        for a, b in zip(LEARNERS, LEARNERS[1:] + LEARNERS[:1]):
            run = subprocess.run(["setpriv", f"--reuid={who[a].uid}", f"--regid={who[a].gid}", "--clear-groups",
                                  "cat", str(copies[b])], capture_output=True, text=True)
            assert run.returncode != 0 and "Permission denied" in run.stderr, (a, b, run.returncode, run.stderr)

        # the solutions are in no learner's copy: no solutions/ folder, no file with a solution's markers
        for n in LEARNERS:
            for path in who[n].home.rglob("*"):
                assert "solutions" not in path.relative_to(who[n].home).parts, path
                if path.is_file() and path.suffix in (".ipynb", ".py", ".md"):
                    text = path.read_text(errors="replace")
                    assert "BEGIN SOLUTION" not in text, path

        # memory of each learner's server (JupyterLab + the kernel of lab 00), unique set size summed
        figures["memory per learner (MB)"] = [
            round(sum(p.memory_full_info().uss for p in _processes_of({who[n].uid})) / 2**20) for n in LEARNERS]
        figures["login to server (s)"] = [round(x.times["server"] - x.times["login"], 1) for x in learners]
        figures["login to notebook open, kernel ready (s)"] = [round(x.times["kernel"] - x.times["login"], 1)
                                                               for x in learners]
        ran = {n: _cell_times(copies[n]) for n in LEARNERS}
        figures["login to first cell run (s)"] = [round(ran[x.name][0] - x.times["login"], 1) for x in learners]
        figures["run all, each (s)"] = [round(ran[n][1] - ran[n][0], 1) for n in LEARNERS]

        # the instructor collects lab 00 and grades it; the learners' files are only read
        before = {n: (_sha(p), p.stat().st_mtime_ns) for n, p in copies.items()}
        t0 = time.time()
        grades = tmp_path / "grades"
        run = subprocess.run([sys.executable, "-m", "common", "hub", "collect", "--lab", "00", "--state", str(state),
                              "--grades", str(grades), "--jobs", "3"], cwd=REPO, capture_output=True, text=True)
        figures["collect and grade (s)"] = round(time.time() - t0, 1)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
        assert {n: (_sha(p), p.stat().st_mtime_ns) for n, p in copies.items()} == before
        rows = list(csv.DictReader((grades / "grades.csv").open()))
        solved = [r for r in rows if r["exercise"] == "0.1"]
        assert sorted(r["learner"] for r in solved) == LEARNERS, rows
        assert all(r["status"] == "passed" for r in solved), [(r["learner"], r["status"], r["verdict"]) for r in solved]
        others = [(r["learner"], r["exercise"], r["status"], r["verdict"]) for r in rows if r["exercise"] != "0.1"]
        assert all(status == "not attempted" for _, _, status, _ in others), others
    finally:
        for learner in learners:
            learner.close()
        figures["hub stop (s)"] = round(_stop(proc), 1)
        left = [p for p in started + _processes_of({who_uid for who_uid in _uids(LEARNERS)}) if p.is_running()
                and p.status() != "zombie"]
        accounts.remove_accounts(LEARNERS)
        figures["total (s)"] = round(time.time() - t_start, 1)
        print("\nhub class:", json.dumps(figures))
        with (OUT / "hub_class.md").open("w") as f:
            f.write("| figure | value |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in figures.items()))
    assert not left, f"processes left after the hub stopped: {[(p.pid, _cmdline(p)) for p in left]}"
    cgroups = glob.glob("/sys/fs/cgroup/workbook-hub-*") + glob.glob("/sys/fs/cgroup/*/workbook-hub-*")
    assert not cgroups, cgroups


def _write_as(who, rel: str, text: str) -> None:
    """A file in the learner's home, owned by them (as the hub's own defaults are)."""
    path = who.home / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    for p in [path] + [q for q in path.parents if who.home in q.parents]:
        os.chown(p, who.uid, who.gid)


def _cell_times(path: Path) -> tuple[float, float]:
    """(when the first code cell started, when the last code cell of the first Run All ended), in epoch seconds, from
    the timing JupyterLab records in the saved notebook's cell metadata."""
    from datetime import datetime
    nb = json.loads(path.read_text())
    starts, ends = [], []
    for c in nb["cells"]:
        ex = c.get("metadata", {}).get("execution", {})
        if c["cell_type"] == "code" and "iopub.execute_input" in ex:
            starts.append(datetime.fromisoformat(ex["iopub.execute_input"].replace("Z", "+00:00")).timestamp())
            ends.append(datetime.fromisoformat(ex["shell.execute_reply"].replace("Z", "+00:00")).timestamp())
    return min(starts), sorted(ends)[-3]  # the last two ends are exercise 0.1 solved and checked later


def _cmdline(p) -> str:
    try:
        return " ".join(p.cmdline())[:200]
    except Exception:  # noqa: BLE001 -- gone meanwhile
        return "?"


def _uids(names: list[str]) -> set[int]:
    import pwd
    out = set()
    for n in names:
        try:
            out.add(pwd.getpwnam(n).pw_uid)
        except KeyError:
            pass
    return out


def _until(ready, seconds: float, what: str) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if ready():
            return
        time.sleep(0.5)
    raise TimeoutError(f"not within {seconds:g} s: {what}")
