"""The layout of common/ holds: packages by concern, imports pointing down, no cycle, no module over 500 lines.

The rules are functions of a {module name: source} map, so each is shown failing on a small tree that breaks it.
"""
import ast
from pathlib import Path

import pytest

from common.core.env import REPO_ROOT

# Lower layers first: a module may import its own package and the packages before it, never one after it.
LAYERS = ("core", "facts", "kernels", "moe", "parallel", "systems", "exercises")
TOP = ("common", "common.__main__")  # the package's entry points sit above every layer
MAX_LINES = 500


def sources(root: Path = REPO_ROOT / "common") -> dict[str, str]:
    """{dotted module name: source} of every .py file under `root` (a package's __init__ is the package's name)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = ("common",) + path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path.read_text()
    return out


def imports(name: str, source: str, known: set[str]) -> set[str]:
    """The `common` modules that `name` imports anywhere in its source (function bodies included)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.split(".")[0] == \
                "common":
            for alias in node.names:  # `from common.kernels import attention`: a submodule if there is one
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in known else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "common"}
    return {m for m in found if m != name}


def layer(name: str) -> int:
    if name in TOP:
        return len(LAYERS)
    return LAYERS.index(name.split(".")[1])


def import_graph(tree: dict[str, str]) -> dict[str, set[str]]:
    """{module: the common modules it imports} (each source parsed once)."""
    known = set(tree)
    return {a: imports(a, src, known) for a, src in tree.items()}


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """'a -> b' for every import from a lower layer to a higher one."""
    return sorted(f"{a} -> {b}" for a, deps in graph.items() for b in deps if layer(b) > layer(a))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import cycles among the modules (each as the list of modules around it), found by depth-first search."""
    graph = {a: sorted(deps & set(graph)) for a, deps in graph.items()}
    state, stack, found = {}, [], []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in graph[node]:
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def long_modules(tree: dict[str, str], limit: int = MAX_LINES) -> list[str]:
    return sorted(f"{m} ({src.count(chr(10))} lines)" for m, src in tree.items() if src.count("\n") > limit)


def packages(root: Path = REPO_ROOT / "common") -> set[str]:
    """The dotted names of the packages (folders with an __init__.py) under `root`."""
    return {".".join(("common",) + p.parent.relative_to(root).parts) for p in root.rglob("__init__.py")}


def flat_modules(tree: dict[str, str], pkgs: set[str]) -> list[str]:
    """Modules directly under common/ other than its __init__ and __main__ (a package there is fine)."""
    return sorted(m for m in tree if m.count(".") == 1 and m not in TOP and m not in pkgs)


def unknown_packages(tree: dict[str, str]) -> list[str]:
    return sorted({m.split(".")[1] for m in tree if m not in TOP and m.split(".")[1] not in LAYERS})


@pytest.fixture(scope="module")
def tree() -> dict[str, str]:  # read when a test here runs, not when pytest collects (each worker collects all)
    return sources()


@pytest.fixture(scope="module")
def graph(tree) -> dict[str, set[str]]:
    return import_graph(tree)


def test_the_tree_was_read(tree):
    assert {"common.core.env", "common.kernels.attention", "common.exercises.cases"} <= set(tree)


def test_no_import_points_up(graph):
    bad = upward_imports(graph)
    assert not bad, ("imports from a lower layer to a higher one (order: " + " < ".join(LAYERS) + "):\n"
                     + "\n".join(bad))


def test_no_import_cycle(graph):
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_no_module_over_500_lines(tree):
    assert not long_modules(tree), f"modules over {MAX_LINES} lines: {long_modules(tree)}"


def test_no_flat_module_and_every_package_is_a_layer(tree):
    flat = flat_modules(tree, packages())
    assert not flat, f"modules directly under common/: {flat}; put each in a package"
    assert not unknown_packages(tree), f"packages outside the layers {LAYERS}: {unknown_packages(tree)}"


@pytest.mark.parametrize("package", LAYERS)
def test_every_package_says_what_lives_there_and_who_may_import_it(package, tree):
    doc = ast.get_docstring(ast.parse(tree[f"common.{package}"]))
    assert doc and len(doc.splitlines()) >= 2, f"common/{package}/__init__.py needs a docstring of a few lines"
    assert "import" in doc, f"common/{package}/__init__.py must say what may import it"


# ----------------------------------------------------------------------------------------- the rules can fail
def test_an_upward_import_is_found_also_inside_a_function():
    tree = {"common.core.timing": "def f():\n    from common.kernels import attention\n",
            "common.kernels.attention": "from common.core import timing\n"}
    assert upward_imports(import_graph(tree)) == ["common.core.timing -> common.kernels.attention"]


def test_a_cycle_is_found():
    tree = {"common.kernels.a": "from common.kernels import b\n", "common.kernels.b": "import common.kernels.c\n",
            "common.kernels.c": "from common.kernels.a import x\n", "common.kernels.d": "from common.kernels import a\n"}
    assert cycles(import_graph(tree)) == [["common.kernels.a", "common.kernels.b", "common.kernels.c",
                                           "common.kernels.a"]]
    assert not cycles(import_graph({k: v for k, v in tree.items() if k != "common.kernels.c"}))


def test_a_long_flat_module_in_an_unknown_package_is_found():
    tree = {"common.helpers": "x = 1\n" * 501, "common.misc.tool": "", "common.core.env": "x = 1\n" * 500}
    assert long_modules(tree) == ["common.helpers (501 lines)"]
    assert flat_modules(tree, {"common.misc"}) == ["common.helpers"]
    assert unknown_packages(tree) == ["helpers", "misc"]
