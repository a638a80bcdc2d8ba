"""`python -m common hub start|collect|remove-accounts` (`make hub`, `make collect`). Imports what is Unix-only
(accounts) when a command runs, so `python -m common` still starts on Windows."""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from common.core.hub import settings

USAGE = {"start": "check the settings, make the learners' accounts and passwords, then run JupyterHub",
         "collect": "copy every learner's notebooks of lab NN into DIR/<learner>/ and grade them",
         "remove-accounts": "after the course: delete the learners' accounts and homes the hub made (collect first)"}


def add_parser(sub) -> None:
    h = sub.add_parser("hub", help="instructor: a JupyterHub for a class (INSTRUCTOR.md section 4)")
    cmds = h.add_subparsers(dest="hub_cmd", required=True)
    s = cmds.add_parser("start", help=USAGE["start"])
    s.add_argument("--roster", required=True, help="one learner name per line")
    s.add_argument("--ip", default="127.0.0.1", help="127.0.0.1: this machine only; 0.0.0.0: the room")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--hub-port", type=int, default=8081, help="the hub's own API, on 127.0.0.1")
    s.add_argument("--proxy-api-port", type=int, default=None, help="the proxy's API, on 127.0.0.1 (default port+1)")
    s.add_argument("--idle-minutes", type=float, default=60, help="stop a learner's server after this idle time")
    s.add_argument("--threads", type=int, default=0, help="CPU threads per learner (0: cores / learners)")
    s.add_argument("--memory-mb", type=int, default=0, help="memory per learner (0: (total - 2 GB) / learners)")
    s.add_argument("--gpus", default="auto", help="auto (nvidia-smi -L: MIG instances, else GPUs), none, or a list")
    s.add_argument("--gpu-sharing", action="store_true", help="allow more learners than MIG instances")
    s.add_argument("--profile", default="auto", help="what the labs' PROFILE = 'auto' resolves to (auto, quick, full)")
    s.add_argument("--state", default=str(settings.DEFAULT_STATE), help="the hub's own files")
    s.add_argument("--ssl-cert", default="")
    s.add_argument("--ssl-key", default="")
    s.add_argument("--check-only", action="store_true", help="check and print the settings, start nothing")
    c = cmds.add_parser("collect", help=USAGE["collect"])
    c.add_argument("--lab", required=True, help="the lab's number, e.g. 00")
    c.add_argument("--state", default=str(settings.DEFAULT_STATE))
    c.add_argument("--out", default="", help="the collected notebooks (default <state>/collected/NN)")
    c.add_argument("--grades", default="build/grades", help="where grades.csv and summary.md go")
    c.add_argument("--no-grade", action="store_true", help="collect only")
    c.add_argument("--cell-timeout", type=float, default=120)
    c.add_argument("--notebook-timeout", type=float, default=600)
    c.add_argument("--jobs", type=int, default=1)
    r = cmds.add_parser("remove-accounts", help=USAGE["remove-accounts"])
    r.add_argument("--state", default=str(settings.DEFAULT_STATE))


def run(a) -> int:
    try:
        if a.hub_cmd == "start":
            return _start(a)
        if a.hub_cmd == "collect":
            return _collect(a)
        return _remove(a)
    except ValueError as exc:
        print(f"hub: {exc}", file=sys.stderr)
        return 2


def _start(a) -> int:
    s = settings.build(Path(a.roster), ip=a.ip, port=a.port, hub_port=a.hub_port, proxy_api_port=a.proxy_api_port,
                       idle_minutes=a.idle_minutes, threads=a.threads, memory_mb=a.memory_mb, gpus=a.gpus,
                       gpu_sharing=a.gpu_sharing, state_dir=Path(a.state), ssl_cert=a.ssl_cert, ssl_key=a.ssl_key,
                       profile=a.profile)
    import importlib.util

    from common.core.grading.sandbox import INSTALL_HINT, unavailable
    from common.core.hub import accounts, collect, roster
    if importlib.util.find_spec("jupyterhub") is None:
        raise ValueError("JupyterHub is not installed in this venv: run `make hub` (it installs jupyterhub and "
                         "jupyterhub-idle-culler on demand, as `scripts/hub_setup.sh` does)")
    if unavailable():
        raise ValueError(f"each learner's server runs in a bubblewrap sandbox, and none can be made here: "
                         f"{unavailable()}; {INSTALL_HINT.split(', or pass')[0]}")
    state = Path(s.state_dir)
    state.mkdir(parents=True, exist_ok=True)
    os.chmod(state, 0o700)
    print(settings.summary(s, settings.memory_limit_kind(), state / "passwords.csv"), flush=True)
    if a.check_only:
        return 0
    accounts.ensure_accounts(s.learners, state)
    roster.passwords(s.learners, state / "passwords.csv")
    collect.roster_file(s)
    path = s.save()
    env = dict(os.environ, WORKBOOK_HUB_SETTINGS=str(path))
    config = Path(__file__).resolve().parents[3] / "hub" / "jupyterhub_config.py"
    os.chdir(state)
    # a hub started in the background of a script inherits SIGINT ignored, and so would every process it starts: the
    # idle culler then outlived the hub's stop by 30 s (JupyterHub interrupts it first); the default again
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.execve(sys.executable, [sys.executable, "-m", "jupyterhub", "-f", str(config)], env)
    return 1  # not reached


def _collect(a) -> int:
    from common.core.hub import collect
    lab = int(a.lab) if str(a.lab).isdigit() else -1
    if not 0 <= lab <= 99:
        raise ValueError(f"LAB={a.lab!r} must be a lab's number, e.g. LAB=00")
    s = settings.Settings.load(Path(a.state) / "settings.json")
    out = Path(a.out) if a.out else collect.default_dir(s, lab)
    found = collect.collect(s, lab, out)
    got = [n for n, files in found.items() if files]
    print(f"collected lab {lab:02d} from {len(got)} of {len(found)} learners into {out}"
          + (f"; nothing from {', '.join(n for n in found if n not in got)}" if len(got) < len(found) else ""))
    if a.no_grade or not got:
        return 0 if got or a.no_grade else 1
    from common.core import grading
    grading.grade(out, Path(a.grades), a.cell_timeout, a.notebook_timeout, jobs=a.jobs, roster=collect.roster_file(s))
    print(f"wrote {Path(a.grades) / 'grades.csv'} and {Path(a.grades) / 'summary.md'}")
    return 0


def _remove(a) -> int:
    from common.core.hub import accounts
    s = settings.Settings.load(Path(a.state) / "settings.json")
    if os.geteuid() != 0:
        print("not root: the dry run made no accounts; its homes are under " + str(Path(s.state_dir) / "homes"))
        return 0
    removed = accounts.remove_accounts(s.learners)
    print(f"removed {len(removed)} account(s): {', '.join(removed) or 'none'}")
    return 0
