"""Learners' accounts and their own copies of the workbook.

Run as root, the hub gives each learner on the roster a Unix user of their own (made here with useradd, marked
"workbook hub learner" so the hub never takes over an account it did not make), whose home is mode 0700. Otherwise
(a laptop dry run) every learner is you, with a home under the hub's state folder. A learner's copy is
`~/workbook/`: `labs/` (the instructor's `labs/NN_*.ipynb`, copied when missing, never overwritten; never the
solutions) and `build/` (their own machine profile and results). What the hub writes in a learner's home it writes
through descriptors that follow no link and open no existing file, owned by the learner, so a link they planted cannot
make root write elsewhere; what it reads there (collecting) it reads only from files the learner owns.
"""
from __future__ import annotations

import json
import os
import pwd
import subprocess
from dataclasses import dataclass
from pathlib import Path

from common.core.env import REPO_ROOT

MARK = "workbook hub learner"
WORKBOOK = "workbook"
# JupyterLab defaults for a learner (written only where the learner has no setting of their own): no news feed (the
# room's box may be offline), every cell rendered (search finds text in any cell)
LAB_SETTINGS = {"@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                                    "checkForUpdates": False},
                "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"}}


@dataclass(frozen=True)
class Learner:
    """A learner as the box knows them: the Unix user their server runs as, and their home on the host."""
    name: str
    uid: int
    gid: int
    home: Path

    @property
    def workbook(self) -> Path:
        return self.home / WORKBOOK


def as_root() -> bool:
    return os.geteuid() == 0


def learner(name: str, state_dir: Path) -> Learner:
    """The learner `name`: their Unix user as root (which must be one the hub made), else you, with a home under
    `state_dir`/homes."""
    if not as_root():
        return Learner(name, os.getuid(), os.getgid(), Path(state_dir).resolve() / "homes" / name)
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        raise ValueError(f"learner {name!r} has no Unix account: start the hub with `make hub ROSTER=...` (it makes "
                         f"one for each learner on the roster)") from None
    if MARK not in pw.pw_gecos:
        raise ValueError(_not_ours(name, pw))
    return Learner(name, pw.pw_uid, pw.pw_gid, Path(pw.pw_dir))


def _not_ours(name, pw) -> str:
    return (f"roster name {name!r} is an existing account on this machine (uid {pw.pw_uid}) that the hub did not "
            f"make; the hub runs learners only as accounts of its own: rename the learner in the roster (e.g. "
            f"{name}1)")


def ensure_accounts(names: list[str], state_dir: Path) -> list[Learner]:
    """Each learner's account and home (0700), made when missing; a ValueError for a name taken by an account the hub
    did not make (checked for every name before any account is made)."""
    if as_root():
        for name in names:
            try:
                pw = pwd.getpwnam(name)
            except KeyError:
                continue
            if MARK not in pw.pw_gecos:
                raise ValueError(_not_ours(name, pw))
        for name in names:
            try:
                pwd.getpwnam(name)
            except KeyError:
                run = subprocess.run(["useradd", "--create-home", "--user-group", "--shell", "/bin/bash",
                                      "--comment", MARK, name], capture_output=True, text=True)
                if run.returncode:
                    raise ValueError(f"useradd {name} failed: {run.stderr.strip()}") from None
    out = [learner(n, state_dir) for n in names]
    for who in out:
        if not as_root():
            who.home.mkdir(parents=True, exist_ok=True)
        os.chmod(who.home, 0o700)
    return out


def remove_accounts(names: list[str]) -> list[str]:
    """Delete the accounts the hub made (and their homes, with the learners' notebooks: collect first); the names
    removed. Accounts the hub did not make are left alone."""
    removed = []
    for name in names:
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            continue
        if MARK in pw.pw_gecos:
            subprocess.run(["userdel", "--remove", name], capture_output=True, text=True)
            removed.append(name)
    return removed


def lab_files(root: Path = REPO_ROOT) -> dict[str, bytes]:
    """{file name: content} of the instructor's `labs/NN_*.ipynb`."""
    return {p.name: p.read_bytes() for p in sorted((Path(root) / "labs").glob("[0-9][0-9]_*.ipynb"))}


def _subdir(parent: int, name: str, who: Learner) -> int:
    """An open descriptor of folder `name` in the folder `parent`, made (owned by the learner) when missing; an
    OSError when it is a link (never followed)."""
    try:
        os.mkdir(name, 0o755, dir_fd=parent)
        made = True
    except FileExistsError:
        made = False
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
    if made and as_root():
        os.fchown(fd, who.uid, who.gid)
    return fd


def _new_file(folder: int, name: str, data: bytes, who: Learner) -> bool:
    """Write `name` in `folder` only when nothing (not even a link) has that name; owned by the learner."""
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=folder)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        if as_root():
            os.fchown(f.fileno(), who.uid, who.gid)
    return True


def _at(home: int, parts: tuple[str, ...], who: Learner, fn) -> None:
    """fn(descriptor of home/parts...), each folder made when missing, none followed through a link."""
    fds = [home]
    try:
        for part in parts:
            fds.append(_subdir(fds[-1], part, who))
        fn(fds[-1])
    finally:
        for fd in fds[1:]:
            os.close(fd)


def prepare_copy(who: Learner, labs: dict[str, bytes], mountpoints: list[str] = ()) -> Path:
    """The learner's `~/workbook/` with `labs/` (each lab they do not have yet; theirs are never touched), `build/`,
    the empty folders where their server shows the instructor's read-only `common/` and `data/` (`mountpoints`), and
    the JupyterLab defaults where they have none. Everything is made through descriptors that never follow a link
    and never open an existing file, and is owned by the learner. Returns the workbook folder."""
    try:
        home = os.open(who.home, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        raise ValueError(f"{who.name}'s home {who.home} cannot be opened ({exc.strerror})") from None
    try:
        for folder in ["labs", "build", *mountpoints]:
            _at(home, (WORKBOOK, folder), who, lambda fd: None)
        _at(home, (WORKBOOK, "labs"), who,
            lambda fd: [_new_file(fd, name, data, who) for name, data in labs.items()])
        for rel, value in LAB_SETTINGS.items():
            *folders, name = (".jupyter", "lab", "user-settings", *rel.split("/"))
            _at(home, tuple(folders), who, lambda fd: _new_file(fd, name, json.dumps(value).encode(), who))
    except OSError as exc:
        raise ValueError(f"cannot prepare {who.name}'s copy of the workbook in {who.home}: {exc} (the hub follows no "
                         f"link in a learner's home)") from None
    finally:
        os.close(home)
    return who.workbook


def notebooks_of(who: Learner, lab: int) -> dict[str, bytes]:
    """{file name: content} of the learner's `labs/NN_*.ipynb` for lab `lab`, read without following links and only
    when the learner owns the file (a link to someone else's file is skipped)."""
    folder = who.workbook / "labs"
    out = {}
    if not folder.is_dir() or folder.is_symlink():
        return out
    for path in sorted(folder.glob(f"{lab:02d}_*.ipynb")):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_uid == who.uid and (st.st_mode & 0o170000) == 0o100000:
                out[path.name] = f.read()
    return out

