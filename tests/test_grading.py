"""The instructor's grader against hostile notebooks, all graded in one run (in parallel, tiny notebooks, lab 10's
checkers, which need no torch): forged verdicts, a remount, /proc/<pid>/root, /dev/shm, reads outside, killing an
outside process by PID, a loopback connection, memory growth, a fork bomb, detached processes, huge output -- and the
verdict gaps (syntax error, time limits, two copies, unmatched files, roster, exits, a malformed file). Afterwards
nothing outside the sandbox has changed and no process of it is left."""
import csv
import hashlib
import os
import socket
import subprocess
import shutil
import sys
import time

import nbformat
import psutil
import pytest

from common.core import checks, grading
from common.core.env import REPO_ROOT
from common.core import bwrap
from common.core.grading import sandbox

pytestmark = [pytest.mark.notebooks, pytest.mark.sandbox, pytest.mark.skipif(not sys.platform.startswith("linux"),
                                                        reason="the sandbox is Linux-only")]

LAB = "10_scaling_and_cost.ipynb"
HEAD = "from common.exercises.lab10 import check_train_flops, check_implied_mfu, check_training_days"
RIGHT = "check_train_flops(lambda n, d: 6 * n * d)"
MARK = f"wbhostile{os.getpid()}"  # in every file name and process the hostile notebooks leave
LIMITS = grading.Limits(memory_mb=1024, processes=64, cpu_s=60, file_size_mb=16, tmpfs_mb=64)


def _write(path, *sources):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))


def _escape_cells(secret, outside_pid, port):
    checker = REPO_ROOT / "common" / "exercises" / "lab10.py"
    return [
        # remount the root read-write, or gain capabilities in a nested user namespace
        "import subprocess\nfor cmd in (['mount', '-o', 'remount,bind,rw', '/'], ['unshare', '-Urm', 'true']):\n"
        "    print(cmd[0], subprocess.run(cmd, capture_output=True, text=True).returncode)",
        # rewrite the checker, directly and through every /proc/<pid>/root
        f"import glob\nfor p in [{str(checker)!r}] + glob.glob('/proc/*/root{checker}'):\n"
        f"    try:\n        open(p, 'a').write('\\ndef check_train_flops(f): pass\\n'); print('WROTE', p)\n"
        f"    except OSError as e:\n        print('refused', p, type(e).__name__)",
        # leave files in /dev/shm, /tmp and home
        f"for d in ('/dev/shm', '/tmp', '/home/learner'):\n    open(d + '/{MARK}', 'w').write('left')",
        # read outside: the planted secret, another process's environment, the shadow file
        f"import glob\nfor p in [{str(secret)!r}, '/etc/shadow'] + glob.glob('/proc/*/environ'):\n"
        f"    try:\n        print(p, open(p).read()[:40])\n    except OSError as e:\n        print('refused', p)",
        # connect to a listener on the host's loopback
        f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2); print('CONNECTED')\n"
        f"except OSError as e:\n    print('no connection', type(e).__name__)",
        RIGHT,
        # kill a process outside by its PID, then every process it may signal (the sandbox's own: its runner too)
        f"import os, signal\nfor pid in ({outside_pid}, -1):\n    try:\n        os.kill(pid, signal.SIGTERM)\n"
        f"    except OSError as e:\n        print('kill', pid, type(e).__name__)"]


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    saved = dict(checks._in_kernel)
    checks._in_kernel["10.5"] = "made in-kernel for this test"
    tmp = tmp_path_factory.mktemp("grading")
    outside = tmp / "outside"
    outside.mkdir()
    secret = outside / "secret.txt"
    secret.write_text(f"{MARK}-secret")
    os.chmod(outside, 0o755)
    os.chmod(secret, 0o644)
    sleeper = subprocess.Popen(["sleep", "300"])
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    port = listener.getsockname()[1]
    root = tmp / "class"
    _write(root / "ada" / LAB, HEAD, RIGHT, "check_implied_mfu(lambda *a: 0.5)")
    _write(root / "ada" / "old" / "10_copy.ipynb", HEAD, "check_train_flops(lambda n, d: 2 * n * d)")
    _write(root / "ada" / "notes.ipynb", "print('not a lab')")
    _write(root / "bob" / LAB, HEAD, "def f(n, d):\n    raise NotImplementedError\ncheck_train_flops(f)",
           "import sys\nsys.exit(3)", "check_implied_mfu(lambda *a: 0.5)")
    _write(root / "dan" / LAB, HEAD, RIGHT, "import os\nos._exit(1)", "check_implied_mfu(lambda *a: 0.5)")
    _write(root / "eve" / LAB, HEAD, *_escape_cells(secret, sleeper.pid, port))
    _write(root / "fay" / LAB, HEAD,  # forge: the kernel's own records, printed verdicts, the grader's channel
           "from common.core import checks\nfor e in ('10.1', '10.2', '10.3', '10.4', '10.5'):\n"
           "    checks._status[e] = 'passed'; checks._details[e] = 'correct'\n"
           "checks.progress_records = lambda lab: [{'exercise': '10.1', 'status': 'passed'}]\n"
           "print('PASS Exercise 10.1 (training FLOPs with 6ND): correct')",
           "import common.exercises.remote as r\nep = r._state['endpoint']\n"
           "ep.send({'op': 'kernel_verdict', 'exercise': '10.2', 'status': 'passed', 'detail': 'forged', 'id': 99})\n"
           "ep.send({'op': 'verdict', 'exercise': '10.3', 'status': 'passed', 're': 1})",
           "checks.submission_hook = None\ncheck_implied_mfu(lambda *a: 0.5)\ncheck_train_flops(lambda n, d: 6*n*d)")
    _write(root / "gus" / LAB, HEAD, "chunks = []\ntry:\n    while True:\n        chunks.append(bytearray(10 << 20))\n"
           "except MemoryError:\n    print(f'MemoryError after {len(chunks) * 10} MB')\ndel chunks", RIGHT)
    _write(root / "hal" / LAB, HEAD,
           f"import subprocess, os\nsubprocess.Popen('setsid sleep 4321.{os.getpid()} &', shell=True)\n"
           f"if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        os.execvp('sleep', ['sleep', "
           f"'4322.{os.getpid()}'])\n    os._exit(0)",
           # a fork bomb: refused at the process limit; the children are then killed so that the check can run
           "import os, signal, time\nkids = []\ntry:\n    while True:\n        pid = os.fork()\n        if pid == 0:\n"
           "            time.sleep(300)\n            os._exit(0)\n        kids.append(pid)\nexcept OSError:\n    pass\n"
           "for pid in kids:\n    os.kill(pid, signal.SIGKILL)\n    os.waitpid(pid, 0)\n"
           "print(f'fork refused after {len(kids)}')",
           RIGHT)
    _write(root / "ivy" / LAB, HEAD, "import sys\nfor _ in range(50):\n    sys.stdout.write('x' * (1 << 20) + '\\n')",
           RIGHT)
    # the two time limits in two notebooks, graded side by side: in one they took 10 s each, one after the other.
    # Cells that never end, asleep rather than spinning: a spin burned a core the other test worker needed for 20 s
    _write(root / "abe" / LAB, HEAD, "def train_flops(n, d)\n    return 6 * n * d", "check_train_flops(train_flops)",
           "import time\ndef slow(*a):\n    while True:\n        time.sleep(0.05)\ncheck_implied_mfu(slow)")
    _write(root / "ace" / LAB, HEAD, "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n"
           "    time.sleep(0.05)", "check_training_days(lambda *a: 1.0)")
    _write(root / "amy" / LAB, HEAD, RIGHT, "from common.systems.cluster import scaling\ncheck_training_days(lambda f, g, gpu, "
           "dt, mfu: f / (g * scaling.peak_tflops(gpu, dt) * 1e12 * mfu) / 86400)")
    (root / "kim").mkdir()
    (root / "kim" / LAB).write_text("{ not json")
    roster = tmp / "roster.txt"
    roster.write_text("ada\nbob\n# a comment\nzed\n")
    checker_hash = hashlib.sha256((REPO_ROOT / "common" / "exercises" / "lab10.py").read_bytes()).hexdigest()
    out = tmp / "grades"
    os.environ["WORKBOOK_TEST_SECRET"] = f"{MARK}-environ"  # in the grader's environment: /proc/<pid>/environ
    t0 = time.time()
    rows = grading.grade(root, out, cell_timeout=6, notebook_timeout=50, progress=lambda *_: None, jobs=4,
                         roster=roster, limits=LIMITS)
    seconds = time.time() - t0
    os.environ.pop("WORKBOOK_TEST_SECRET")
    connected = []
    try:
        connected.append(listener.accept())
    except OSError:
        pass
    yield {"rows": rows, "out": out, "secret": secret, "sleeper": sleeper, "connected": connected, "root": root,
           "seconds": seconds, "checker_hash": checker_hash}
    sleeper.kill()
    listener.close()
    checks._in_kernel.clear()
    checks._in_kernel.update(saved)


def _by(graded):
    return {(r["file"], r["exercise"]): r for r in graded["rows"]}


def _kept(graded, rel):
    return nbformat.read(str(graded["out"] / rel), as_version=4)


def _printed(graded, rel):
    return "".join(o.get("text", "") + o.get("evalue", "") for c in _kept(graded, rel)["cells"]
                   for o in c.get("outputs", []))


def test_verdicts(graded):
    by = _by(graded)
    assert by[("ada/" + LAB, "10.1")]["status"] == "passed" and by[("ada/" + LAB, "10.1")]["judged"] == "grader"
    assert by[("ada/" + LAB, "10.2")]["status"] == "failed" and by[("ada/" + LAB, "10.2")]["verdict"]
    assert by[("ada/" + LAB, "10.3")]["status"] == "not checked"
    assert "no cell calls check_adam_state" in by[("ada/" + LAB, "10.3")]["verdict"]
    assert by[("ada/old/10_copy.ipynb", "10.1")]["status"] == "failed"  # two copies: one row each, a file column
    assert "2ND" in by[("ada/old/10_copy.ipynb", "10.1")]["verdict"]
    assert by[("bob/" + LAB, "10.1")]["status"] == "not attempted"
    assert by[("bob/" + LAB, "10.2")]["status"] == "failed"  # sys.exit did not end the notebook
    assert by[("dan/" + LAB, "10.1")]["status"] == "passed"  # judged before the kernel died
    assert "the kernel died in cell 3" in by[("dan/" + LAB, "10.2")]["verdict"]
    assert by[("kim/" + LAB, "10.1")]["status"] == "not checked"
    assert "not a readable notebook" in by[("kim/" + LAB, "10.1")]["verdict"]
    with (graded["out"] / "grades.csv").open() as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(graded["rows"]) and list(table[0]) == grading.report.FIELDS
    summary = (graded["out"] / "summary.md").read_text()
    assert "| ada | ada/10_scaling_and_cost.ipynb | 10 | 1 of 6 | 1 | 0 | 4 |" in summary
    assert "| 10.1 | training FLOPs with 6ND |" in summary and "x train_flops(" in summary  # class summary
    assert "ada/notes.ipynb: not named like a lab" in summary and "- zed" in summary and "- bob" not in summary


def test_forged_verdicts_are_not_believed(graded):
    by = _by(graded)
    fay = {ex: by[("fay/" + LAB, ex)] for ex in ("10.1", "10.2", "10.3", "10.4", "10.5")}
    assert all(r["status"] != "passed" for r in fay.values()), fay
    assert "a verdict that the grader did not give" in fay["10.2"]["verdict"]


def test_syntax_error_and_time_limits_are_named(graded):
    by = _by(graded)
    assert "cell 2 has a SyntaxError at line 1" in by[("abe/" + LAB, "10.1")]["verdict"]
    assert by[("abe/" + LAB, "10.2")]["status"] == "failed"
    assert "cell time limit of 6 s" in by[("abe/" + LAB, "10.2")]["verdict"]
    assert "did not stop after cell 2 ran past the time limit" in by[("ace/" + LAB, "10.5")]["verdict"]


def test_escapes_fail_and_nothing_outside_changes(graded):
    assert hashlib.sha256((REPO_ROOT / "common" / "exercises" / "lab10.py").read_bytes()).hexdigest() == \
        graded["checker_hash"]
    text = _printed(graded, "eve/" + LAB)
    assert "WROTE" not in text and "CONNECTED" not in text and f"{MARK}-secret" not in text
    assert f"{MARK}-environ" not in text and "root:" not in text  # another process's environment, /etc/shadow
    assert "mount 32" in text or "mount 1" in text, text[:2000]  # the remount was refused
    assert _by(graded)[("eve/" + LAB, "10.1")]["status"] == "passed"  # and the checker was still the real one
    assert graded["sleeper"].poll() is None  # killed by PID: still alive
    assert not graded["connected"]  # the loopback listener got no connection
    for d in ("/dev/shm", "/tmp", os.path.expanduser("~")):
        assert not os.path.exists(os.path.join(d, MARK)), d
    assert graded["secret"].read_text() == f"{MARK}-secret"
    assert sorted(p.name for p in graded["root"].iterdir()) == ["abe", "ace", "ada", "amy", "bob", "dan", "eve",
                                                                "fay", "gus", "hal", "ivy", "kim"]


def test_limits_hold_and_no_process_is_left(graded):
    by = _by(graded)
    assert "MemoryError after" in _printed(graded, "gus/" + LAB) and by[("gus/" + LAB, "10.1")]["status"] == "passed"
    hal = _printed(graded, "hal/" + LAB)
    kids = int(hal.split("fork refused after ")[1].split()[0])
    assert kids < LIMITS.processes and by[("hal/" + LAB, "10.1")]["status"] == "passed"
    left = [p.info for p in psutil.process_iter(["pid", "cmdline", "uids"])
            if str(os.getpid()) in " ".join(p.info["cmdline"] or []) and "sleep" in " ".join(p.info["cmdline"] or [])
            or (os.geteuid() == 0 and p.info["uids"] and sandbox.SANDBOX_UID <= p.info["uids"].real < 65534)]
    assert not left, left
    if os.geteuid() == 0:
        assert not [p for p in os.listdir("/sys/fs/cgroup/memory") if p.startswith("workbook-grade")] \
            if os.path.isdir("/sys/fs/cgroup/memory") else True


def test_huge_output_is_capped(graded):
    assert (graded["out"] / "ivy" / LAB).stat().st_size < 1 << 20
    assert "cut by the grader" in _printed(graded, "ivy/" + LAB)
    assert _by(graded)[("ivy/" + LAB, "10.1")]["status"] == "passed"
    assert graded["seconds"] < 60, graded["seconds"]


def test_in_kernel_exercises_are_marked(graded):
    """An exercise that only the kernel can judge (10.5, made one for this test) is judged there and marked."""
    row = _by(graded)[("amy/" + LAB, "10.5")]
    assert row["status"] == "passed" and row["judged"] == "learner's kernel", row
    assert _by(graded)[("amy/" + LAB, "10.1")]["judged"] == "grader"
    assert "Judged in the learner's kernel" in (graded["out"] / "summary.md").read_text()


def test_refused_without_a_sandbox(tmp_path, monkeypatch):
    _write(tmp_path / "c" / "amy" / LAB, HEAD, RIGHT)
    monkeypatch.setattr(grading, "unavailable", lambda: "bwrap is not installed")
    with pytest.raises(grading.SandboxUnavailable, match="bwrap is not installed.*--unsafe-no-sandbox"):
        grading.grade(tmp_path / "c", tmp_path / "out", progress=lambda *_: None)


def test_grade_bad_input(tmp_path):
    with pytest.raises(ValueError, match="not a folder"):
        grading.grade(tmp_path / "missing", tmp_path / "out")
    _write(tmp_path / "notes.ipynb", "1")
    with pytest.raises(ValueError, match="holds no lab notebooks.*notes.ipynb: not named like a lab"):
        grading.grade(tmp_path, tmp_path / "out")
    with pytest.raises(ValueError, match="not named like a lab"):
        grading.lab_number("notes.ipynb")
    with pytest.raises(ValueError, match="--roster"):
        grading.read_roster(tmp_path / "nobody.txt")
    r = subprocess.run(["make", "-s", "grade"], cwd=REPO_ROOT, capture_output=True, text=True)
    assert r.returncode != 0 and "DIR=" in r.stderr + r.stdout



def test_instructor_lists_the_exercises_judged_in_the_kernel():
    """INSTRUCTOR.md's table of exercises judged in the learner's kernel is the checkers' in_kernel= declarations."""
    import importlib
    import re
    for lab in range(15):
        try:
            importlib.import_module(f"common.exercises.lab{lab:02d}")
        except ModuleNotFoundError:
            pass
    text = (REPO_ROOT / "INSTRUCTOR.md").read_text()
    table = text.split("**Exercises judged in the learner's kernel.**")[1].split("\n\n")[1]
    listed = dict(re.findall(r"^\| (\d+\.\d+) \| (.+?) \|$", table, re.M))
    declared = {ex: why for ex, why in checks.judged_in_kernel().items()
                if ex in checks._titles and why != "made in-kernel for this test"}  # the fixture's, while it runs
    assert listed == declared


def test_a_workbook_under_tmp_or_home_is_not_hidden(monkeypatch, tmp_path):
    """The sandbox's /tmp and home are fresh tmpfs: a workbook, or a Python, that lives under either must be bound on
    top of them, not under them (a clone in /tmp once graded every notebook 'not checked': the sandbox ended at once)."""
    from common.core.grading import sandbox
    monkeypatch.setattr(sandbox, "REPO_ROOT", tmp_path / "workbook")
    box = sandbox.Sandbox(0, sandbox.Limits())
    cmd = box.command(["true"], {})
    shutil.rmtree(box._tmp, ignore_errors=True)

    def at(flag, path):
        return next(i for i in range(len(cmd) - 1) if cmd[i] == flag and cmd[i + 1 + (flag != "--tmpfs")] == path)
    tmp_fs, home_fs = at("--tmpfs", "/tmp"), at("--tmpfs", sandbox.HOME)
    common = at("--ro-bind", str(tmp_path / "workbook" / "common"))
    labs = at("--tmpfs", str(tmp_path / "workbook" / "labs"))
    assert tmp_fs < common and home_fs < common and common < labs


def test_an_interpreter_behind_a_symlink_is_bound_where_the_grader_names_it(monkeypatch, tmp_path):
    """A venv in /tmp linked into the checkout as .venv: the runner starts by the linked path, so the sandbox binds the
    real folder there too (before, every notebook was 'not checked: the sandbox ended before the notebook did')."""
    real = tmp_path / "venv"
    (real / "bin").mkdir(parents=True)
    link = tmp_path / "checkout" / ".venv"
    link.parent.mkdir()
    link.symlink_to(real)
    monkeypatch.setattr(sys, "prefix", str(link))
    monkeypatch.setattr(sys, "executable", str(link / "bin" / "python"))
    assert (str(real), str(link)) in bwrap.python_aliases()
    assert (str(real), str(link), False) in sandbox.Sandbox(0, sandbox.Limits())._binds()


def test_a_kernel_that_cannot_start_is_one_grader_error(tmp_path, monkeypatch):
    """When the sandboxed interpreter cannot start, grading stops once with the sandbox's own words, instead of
    grading every exercise of every notebook 'not checked'."""
    monkeypatch.setattr(bwrap, "python_roots", lambda: [])  # the interpreter is not bound: it cannot start
    monkeypatch.setattr(bwrap, "python_aliases", lambda: [])
    if os.path.realpath(sys.executable).startswith("/usr/"):
        pytest.skip("this Python lives under /usr, which the sandbox always binds")
    _write(tmp_path / "class" / "ada" / LAB, HEAD, RIGHT)
    with pytest.raises(grading.GraderError, match=r"could not start a notebook's kernel(.|\n)*said") as info:
        grading.grade(tmp_path / "class", tmp_path / "out", cell_timeout=6, notebook_timeout=30,
                      progress=lambda *_: None)
    assert "No such file" in str(info.value) or "execvp" in str(info.value), str(info.value)


def test_concurrent_graders_take_different_uids():
    """Two graders' sandboxes at once never share a uid (each one's clean-up kills every process of its uid)."""
    first, fd1 = sandbox.claim_uid(0)
    second, fd2 = sandbox.claim_uid(0)
    try:
        assert first == sandbox.SANDBOX_UID and second == first + 1
    finally:
        os.close(fd1)
    again, fd3 = sandbox.claim_uid(0)
    os.close(fd2)
    os.close(fd3)
    assert again == first, "a released uid is taken again"
