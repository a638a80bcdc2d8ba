"""The class list: learner names from a roster file (one per line, the file `make grade ROSTER=` reads too), checked
before anything is created, and each learner's password, made by the hub and kept in a file only its owner reads."""
from __future__ import annotations

import csv
import os
import re
import secrets
from pathlib import Path

# A learner's name becomes a Unix user (useradd's rule, lower case as JupyterHub normalises it) and a folder name
NAME_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
NAME_RULE = ("1-32 characters: lower-case letters, digits, '_' or '-', starting with a letter or '_' (it becomes a "
             "Unix user name and a folder of the grader's DIR)")
RESERVED = {"root", "admin", "hub", "user", "nobody", "daemon", "bin", "sys", "learner"}
# Passwords read aloud or copied from a slip: no 0/o, 1/l/i
ALPHABET = "abcdefghjkmnpqrstuvwxyz23456789"


def parse(text: str, source: str = "roster") -> list[str]:
    """Learner names from roster text (blank lines and # comments ignored); a ValueError naming the line of the first
    invalid name or the lines of a repeated one."""
    names, lines = [], {}
    for number, line in enumerate(text.splitlines(), 1):
        name = line.split("#")[0].strip()
        if not name:
            continue
        if not NAME_RE.match(name) or name in RESERVED:
            why = f"a name the hub keeps for itself ({', '.join(sorted(RESERVED))})" if name in RESERVED else NAME_RULE
            raise ValueError(f"{source} line {number}: {name!r} is not a valid learner name: use {why}")
        if name in lines:
            raise ValueError(f"{source}: {name!r} is listed twice (lines {lines[name]} and {number}); each learner "
                             f"needs exactly one line")
        lines[name] = number
        names.append(name)
    if not names:
        raise ValueError(f"{source} names no learner: write one learner name per line")
    return names


def read(path: Path) -> list[str]:
    """`parse` of the roster file at `path`."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"ROSTER={str(path)!r} is not a file: write one learner name per line (e.g. learners.txt)")
    return parse(path.read_text(), f"roster {path}")


def new_password(length: int = 10) -> str:
    half = length // 2
    word = "".join(secrets.choice(ALPHABET) for _ in range(length))
    return f"{word[:half]}-{word[half:]}"


def passwords(names: list[str], path: Path) -> dict[str, str]:
    """{name: password} for the roster: the ones already in `path` (a CSV of name,password) kept, a new one made for
    each learner without; the file is rewritten with mode 0600. Names no longer on the roster stay in the file but
    cannot log in (the hub allows only the roster)."""
    path = Path(path)
    known = {}
    if path.exists():
        with path.open(newline="") as f:
            known = {row["learner"]: row["password"] for row in csv.DictReader(f) if row.get("password")}
    out = dict(known)
    for name in names:
        out.setdefault(name, new_password())
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["learner", "password"])
        w.writerows(sorted(out.items()))
    os.chmod(path, 0o600)
    return {n: out[n] for n in names}
