"""Grade one learner notebook: run it in a sandbox, judge each check cell in the grader's own process, and say why an
exercise was not checked.

The runner inside the sandbox streams cell events; a check cell sends {"op": "judge", "exercise", "args"}; the
grader runs that exercise's pristine checker with `RemoteFunction`s standing for the learner's functions and sends
the verdict back. Exercises only a kernel can judge (`checks.judged_in_kernel()`) get "judge here", and their
verdicts are marked as judged in the learner's kernel. Nothing the kernel says about its own verdicts is read
otherwise: forging `checks._status` changes nothing here.
"""
from __future__ import annotations

import json
import queue
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

from common.core import checks
from common.core.grading import codec
from common.core.grading.channel import MAX_LINE, ChannelClosed, Endpoint, JudgeTimeout, dumps, loads
from common.core.grading.remote import RemoteFunction
from common.core.grading.runner import NO_KERNEL, cap_outputs, skip_slow_imports
from common.core.grading.sandbox import Limits, Sandbox, limits_json

GRADER, KERNEL = "grader", "learner's kernel"
MAX_NOTEBOOK_BYTES = 50 << 20  # a submitted file larger than this is not run
MAX_STREAM_BYTES = 256 << 20  # all a sandbox may send; past it the sandbox is stopped


class GraderError(RuntimeError):
    """The grader could not run notebooks here at all (the sandboxed interpreter or kernel did not start): reported
    once, with the sandbox's own error output, instead of "not checked" for every exercise of every notebook."""


class CellEnded(JudgeTimeout):
    """The check's cell ended (its time limit, or the kernel died) while the grader waited for the learner's code."""


def read_notebook(path: Path):
    """The learner's notebook as a NotebookNode, or a ValueError saying why it cannot be run."""
    skip_slow_imports()
    import nbformat
    size = Path(path).stat().st_size
    if size > MAX_NOTEBOOK_BYTES:
        raise ValueError(f"the file is {size / 2**20:.0f} MB, more than the {MAX_NOTEBOOK_BYTES >> 20} MB a notebook "
                         f"may have")
    try:
        return nbformat.reads(Path(path).read_text(errors="replace"), as_version=4)
    except Exception as exc:  # malformed JSON, not a notebook
        raise ValueError(f"not a readable notebook ({type(exc).__name__}: {str(exc)[:200]})") from None


class Run:
    """One notebook's grading: events from the sandbox, verdicts judged here."""

    def __init__(self, nb, name: str, expected: dict[str, str], cell_timeout: float, notebook_timeout: float):
        self.nb, self.name, self.expected = nb, name, expected
        self.cell_timeout, self.notebook_timeout = cell_timeout, notebook_timeout
        self.verdicts: dict[str, dict] = {}
        self.pending_kernel: dict[str, int | None] = {}
        self.cells: dict[int, dict] = {}
        self.started: set[int] = set()
        self.current: int | None = None
        self.note = ""
        self.done = False
        self.heard = False  # any event from the runner inside the sandbox
        self.judging = False
        self.inbox: queue.Queue = queue.Queue()
        self.endpoint: Endpoint | None = None
        self.stderr = b""

    # -- the stream from the sandbox -------------------------------------------------------------------------
    def reader(self, stream) -> None:
        """Thread: parse the sandbox's stdout into messages, with a cap per line and in all."""
        total = 0
        try:
            while True:
                line = stream.readline(MAX_LINE + 1)
                if not line:
                    break
                total += len(line)
                if total > MAX_STREAM_BYTES:
                    self.inbox.put({"ev": "flood"})
                    break
                if len(line) > MAX_LINE and not line.endswith(b"\n"):
                    while line and not line.endswith(b"\n"):  # skip the rest of an over-long line
                        line = stream.readline(MAX_LINE)
                        total += len(line)
                    continue
                msg = loads(line)
                if msg is not None:
                    self.inbox.put(msg)
        except (OSError, ValueError):
            pass
        self.inbox.put(None)

    def drain(self, stream) -> None:
        """Thread: keep the last 4 KB of the sandbox's stderr (the runner's own failures)."""
        try:
            while True:
                chunk = stream.read(1 << 16)
                if not chunk:
                    return
                self.stderr = (self.stderr + chunk)[-4096:]
        except (OSError, ValueError):
            return

    def recv(self, timeout):
        try:
            msg = self.inbox.get(timeout=timeout if timeout is None or timeout > 0 else 0.001)
        except queue.Empty:
            return None
        if msg is None:
            self.inbox.put(None)  # stays closed for every later read
            raise ChannelClosed()
        return msg

    def on_event(self, msg: dict) -> None:
        ev = msg.get("ev")
        index = msg.get("index")
        self.heard = self.heard or ev in ("cell_start", "cell", "end")
        if ev == "cell_start" and isinstance(index, int):
            self.started.add(index)
            self.current = index
        elif ev == "cell" and isinstance(index, int) and isinstance(msg.get("cell"), dict):
            self.cells[index] = {"outputs": msg["cell"].get("outputs", []), "seconds": msg.get("seconds"),
                                 "timed_out": bool(msg.get("timed_out")),
                                 "execution_count": msg["cell"].get("execution_count")}
            if self.judging and index == self.current:
                raise CellEnded()
        elif ev == "end":
            self.note = str(msg.get("note", ""))[:300]
            self.done = True
            if self.judging:
                raise CellEnded()
        elif ev == "flood":
            self.note = f"the notebook sent more than {MAX_STREAM_BYTES >> 20} MB of output; it was stopped"
            self.done = True

    # -- requests of the kernel ----------------------------------------------------------------------------------
    def on_judge(self, msg: dict) -> dict:
        ex = str(msg.get("exercise", ""))
        if ex not in checks._checkers or (self.expected and ex not in self.expected):
            return {"status": "unknown", "detail": f"exercise {ex} is not an exercise of this lab"}
        if self.judging:
            return {"status": "unknown", "detail": "a check called inside another check is not judged"}
        if ex in checks.judged_in_kernel():
            self.pending_kernel[ex] = self.current
            return {"judge_here": True}
        ep = self.endpoint
        args = [RemoteFunction(ep, i, d.get("name", "fn")) if isinstance(d, dict) and d.get("$") == "learner_fn"
                else codec.decode(d) for i, d in enumerate(msg.get("args", []))]
        kwargs = {str(k): RemoteFunction(ep, str(k), d.get("name", "fn")) if isinstance(d, dict) and
                  d.get("$") == "learner_fn" else codec.decode(d) for k, d in dict(msg.get("kwargs", {})).items()}
        outer = ep.deadline
        ep.deadline = min(outer or float("inf"), time.monotonic() + self.cell_timeout)
        self.judging = True
        try:
            verdict = checks.judge(ex, *args, **kwargs)
            status, detail = verdict.status, verdict.detail
        except codec.NotSendable:  # this checker's cases are not data: let the kernel judge it, and say so
            self.pending_kernel[ex] = self.current
            return {"judge_here": True}
        except CellEnded:
            cell = self.cells.get(self.current, {})
            status = checks.FAILED
            detail = (f"the check did not finish within the cell time limit of {self.cell_timeout:g} s"
                      if cell.get("timed_out") or not self.note else f"the check did not finish: {self.note}")
        except JudgeTimeout:
            status, detail = checks.FAILED, (f"the check did not finish within the cell time limit of "
                                             f"{self.cell_timeout:g} s (the learner's code was still running)")
        finally:
            self.judging = False
            ep.deadline = outer
        self.verdicts[ex] = {"status": status, "verdict": checks.first_line(detail), "judged": GRADER,
                             "cell": self.current}
        return {"status": status, "detail": detail}

    def on_kernel_verdict(self, msg: dict) -> dict:
        ex = str(msg.get("exercise", ""))
        if ex not in self.pending_kernel:
            return {"ok": False}
        cell = self.pending_kernel.pop(ex)
        status = msg.get("status")
        if status not in (checks.PASSED, checks.FAILED, checks.NOT_ATTEMPTED):
            return {"ok": False}
        self.verdicts[ex] = {"status": status, "verdict": checks.first_line(str(msg.get("detail", ""))),
                             "judged": KERNEL, "cell": cell}
        return {"ok": True}

    # -- the whole run -----------------------------------------------------------------------------------------
    def drive(self, proc, channel: str = "") -> None:
        """Send the notebook, then answer the sandbox until it ends, dies or runs out of time."""
        threading.Thread(target=self.reader, args=(proc.stdout,), daemon=True).start()
        drainer = None
        if proc.stderr is not None:
            drainer = threading.Thread(target=self.drain, args=(proc.stderr,), daemon=True)
            drainer.start()
        send_lock = threading.Lock()

        def send(msg):
            with send_lock:
                proc.stdin.write(dumps(msg))
                proc.stdin.flush()
        self.endpoint = Endpoint(send, self.recv, {"judge": self.on_judge, "kernel_verdict": self.on_kernel_verdict},
                                 self.on_event)
        self.endpoint.deadline = time.monotonic() + self.notebook_timeout
        try:
            send({"notebook": self.nb, "name": self.name, "cell_timeout": self.cell_timeout, "channel": channel})
            while not self.done:
                self.endpoint.dispatch(self.endpoint.next_message())
        except JudgeTimeout:
            where = f" (in cell {self.current + 1})" if self.current is not None else ""
            self.note = f"stopped after the notebook limit of {self.notebook_timeout:g} s{where}"
        except (ChannelClosed, BrokenPipeError, OSError):
            if not self.done:
                self.note = self.note or "the sandbox ended before the notebook did"
                if drainer is not None:  # it ended: its last words are on their way (the grader may report them)
                    drainer.join(timeout=5)

    def executed_notebook(self):
        """The learner's notebook with the outputs the sandbox reported (capped again here), sources untouched."""
        import copy
        nb = copy.deepcopy(self.nb)
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            got = self.cells.get(index)
            cell.outputs = []
            cell.execution_count = None
            if got:
                try:
                    import nbformat
                    cell.outputs = [nbformat.from_dict(o) for o in cap_outputs(list(got["outputs"])[:200])]
                    cell.execution_count = got["execution_count"] if isinstance(got["execution_count"], int) else None
                except Exception:  # outputs that are not outputs
                    cell.outputs = []
        return nb

    def records(self) -> list[dict]:
        rows = []
        for ex, title in self.expected.items():
            v = self.verdicts.get(ex)
            if v is None:
                v = {"status": "not checked", "verdict": self.why_not_checked(ex), "judged": "", "cell": None}
            rows.append({"exercise": ex, "title": title, **v})
        return rows

    def why_not_checked(self, exercise: str) -> str:
        """Why exercise `exercise` has no verdict: its check cell, what happened to it, and earlier syntax errors."""
        name = getattr(checks._checkers.get(exercise), "__name__", "")
        pattern = re.compile(rf"\b{re.escape(name)}\s*\(") if name else None
        where = [i for i, c in enumerate(self.nb.cells) if c.cell_type == "code" and pattern and
                 pattern.search(c.source)]
        syntax = self.syntax_errors(before=where[0] if where else len(self.nb.cells))
        if not where:
            return f"no cell calls {name or 'its checker'}(...)" + syntax
        i = where[0]
        cell = self.cells.get(i)
        if cell is None:
            why = self.note or ("the notebook stopped before it" if i not in self.started else "it did not finish")
            return f"its check cell (cell {i + 1}) did not run: {why}" + syntax
        if cell["timed_out"]:
            return f"its check cell (cell {i + 1}) stopped at the cell time limit of {self.cell_timeout:g} s" + syntax
        printed = " ".join(str(o.get("text", "")) + str(o.get("evalue", "")) for o in cell["outputs"])
        if f"Exercise {exercise} (" in printed:
            return (f"its check cell (cell {i + 1}) shows a verdict that the grader did not give (the check ran "
                    f"without the grader; it does not count)" + syntax)
        err = next((o for o in cell["outputs"] if o.get("output_type") == "error"), None)
        if err is not None:
            return (f"its check cell (cell {i + 1}) raised {str(err.get('ename'))[:60]}: "
                    f"{str(err.get('evalue'))[:160]}" + syntax)
        return f"its check cell (cell {i + 1}) ran, but no check reached the grader (is the checker replaced?)" + syntax

    def syntax_errors(self, before: int) -> str:
        found = []
        for i, cell in sorted(self.cells.items()):
            if i >= before:
                continue
            for o in cell["outputs"]:
                if o.get("output_type") == "error" and o.get("ename") in ("SyntaxError", "IndentationError",
                                                                          "TabError"):
                    text = " ".join(str(t) for t in o.get("traceback", [])) + " " + str(o.get("evalue", ""))
                    line = re.findall(r"line (\d+)", re.sub(r"\x1b\[[0-9;]*m", "", text))
                    at = f" at line {line[-1]}" if line else ""
                    found.append(f"cell {i + 1} has a {o['ename']}{at}: {str(o.get('evalue'))[:100]}")
        return ("; " + "; ".join(found[:2])) if found else ""


def grade_one(path: Path, expected: dict[str, str], cell_timeout: float, notebook_timeout: float, limits: Limits,
              slot: int = 0, threads: int = 1, sandboxed: bool = True) -> dict:
    """Run one notebook; {"records", "note", "notebook" (the executed notebook, or None)}."""
    path = Path(path)
    try:
        nb = read_notebook(path)
    except ValueError as exc:
        run = Run(None, path.name, expected, cell_timeout, notebook_timeout)
        run.nb = type("Empty", (), {"cells": []})()
        return {"records": [dict(r, verdict=f"not run: {exc}") for r in run.records()], "note": str(exc),
                "notebook": None}
    run = Run(nb, path.name, expected, cell_timeout, notebook_timeout)
    argv = [sys.executable, "-m", "common.core.grading.runner", limits_json(limits)]
    if sandboxed:
        box = Sandbox(slot, limits, threads)
        proc = box.start(argv)
        try:
            run.drive(proc)
            oom = box.out_of_memory()
        finally:
            box.close()
        if oom:
            run.note = "; ".join(filter(None, [run.note, f"the sandbox reached its memory limit ({limits.memory_mb} MB)"]))
    else:
        run.note = ""
        with tempfile.TemporaryDirectory(prefix="workbook-unsafe-") as tmp:
            import os
            import subprocess
            env = dict(Sandbox(slot, limits, threads).environment(), PATH=os.environ.get("PATH", ""),
                       HOME=tmp, TMPDIR=tmp)
            env.update({k: f"{tmp}/{k.lower()}" for k in ("JUPYTER_RUNTIME_DIR", "MPLCONFIGDIR", "IPYTHONDIR")})
            proc = subprocess.Popen(argv, cwd=tmp, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True)
            try:
                run.drive(proc, channel=f"{tmp}/grade.sock")
            finally:
                _kill_tree(proc)
    if not run.started and (not run.heard or run.note == NO_KERNEL):
        said = run.stderr.decode(errors="replace").strip()[-1500:] or "(nothing on stderr)"
        raise GraderError(f"the grader could not start a notebook's kernel{' in its sandbox' if sandboxed else ''} "
                          f"({run.note or 'it ended before the runner said anything'}); nothing was graded. It said:"
                          f"\n{said}")
    return {"records": run.records(), "note": run.note, "notebook": run.executed_notebook()}


def _kill_tree(proc) -> None:
    """--unsafe-no-sandbox: kill the runner, its kernel and what they started (a detached process may survive)."""
    import os
    import signal

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


def dumps_notebook(nb) -> str:
    import nbformat
    return nbformat.writes(nb) if nb is not None else json.dumps({})
