"""No module-level mutable state in common/parallel: what a rank is, what a launch started, which process groups a
worker uses -- a small object handed to who needs it (a `Launch`, the process group itself, a `WeightGradStore`), never
a dict or list of a module that a function fills (the old `context`, `last_run`, `_LINEAR` and `_GROUPS`).
Module-level containers are constants, named in capitals, and no function changes one."""
import ast
from pathlib import Path

from common.core.env import REPO_ROOT

PARALLEL = REPO_ROOT / "common" / "parallel"
MUTATORS = {"append", "extend", "update", "clear", "pop", "popitem", "setdefault", "add", "remove", "insert",
            "discard"}


def _module_containers(tree) -> dict:
    out = {}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            v = node.value
            mutable = isinstance(v, (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)) or (
                isinstance(v, ast.Call) and getattr(v.func, "id", "") in ("dict", "list", "set", "defaultdict"))
            for t in targets:
                if isinstance(t, ast.Name) and mutable:
                    out[t.id] = node.lineno
    return out


def _problems(path: Path) -> list:
    tree = ast.parse(path.read_text())
    names = _module_containers(tree)
    found = [f"{path.name}:{line}: {name} is a module-level container not named as a constant"
             for name, line in names.items() if name.lstrip("_") != name.lstrip("_").upper()]
    for func in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        for node in ast.walk(func):
            if isinstance(node, ast.Global):
                found.append(f"{path.name}:{node.lineno}: `global {', '.join(node.names)}` in {func.name}")
            target = None
            if isinstance(node, (ast.Assign, ast.AugAssign)):
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                    if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name):
                        target = t.value.id
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in MUTATORS and isinstance(node.func.value, ast.Name):
                target = node.func.value.id
            if target in names and not _local(func, target):
                found.append(f"{path.name}:{node.lineno}: {func.name} changes the module's {target}")
    return found


def _local(func, name: str) -> bool:
    """`name` is assigned (or a parameter) inside `func`: a local of the same name, not the module's."""
    args = func.args
    params = {a.arg for a in args.args + args.kwonlyargs + args.posonlyargs}
    assigned = {t.id for n in ast.walk(func) if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    return name in params | assigned


def test_no_module_level_mutable_state_in_common_parallel():
    problems = [p for path in sorted(PARALLEL.rglob("*.py")) if path.name != "__main__.py" for p in _problems(path)]
    assert not problems, "\n".join(problems)


def test_the_check_finds_the_old_state(tmp_path):
    old = tmp_path / "old.py"
    old.write_text("context: dict = {}\nlast_run = {}\n_LINEAR = []\n_GROUPS = {}\n\n"
                   "def run(rank):\n    context.update(rank=rank)\n    last_run['pids'] = [1]\n\n"
                   "def linear():\n    if not _LINEAR:\n        _LINEAR.append(1)\n\n"
                   "def groups(key):\n    _GROUPS[key] = 1\n")
    found = "\n".join(_problems(old))
    for what in ("context is a module-level container", "last_run is a module-level container",
                 "run changes the module's context", "run changes the module's last_run",
                 "linear changes the module's _LINEAR", "groups changes the module's _GROUPS"):
        assert what in found, (what, found)
