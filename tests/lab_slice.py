"""The cells of an unsolved lab that its test must execute: those its stubs can change, and what they need.

`make test` runs every lab twice. nbval re-executes the solution, every cell. The unsolved lab's run is there to show
that the learner's copy survives its stubs: each check says "not attempted yet", each `if ready(...)` cell takes its
not-ready branch, nothing downstream of an exercise crashes. A cell of the lab whose code is the solution's, and
which reads nothing an exercise defines (directly or through other cells), runs exactly as it does under nbval: the
same code on the same inputs. Executing it again proves nothing new, so the unsolved run leaves it out, unless a cell
it does execute needs a name the cell defines (reaching definitions, computed to a fixed point).

Kept: the parameters, the set-up cell, every cell that differs from the solution (the stubbed exercises); every cell that calls a
checker or asks for a verdict (`check_*`, `ready`, `progress`, `status`); every cell that reads, outside an
`if ready(...)` body (dead code in an unsolved lab), a name computed from an exercise; and the latest earlier
definition of every name a kept cell reads before it binds it. The browser test (`make test-browser`) still runs
every lab whole, in JupyterLab.
"""
from __future__ import annotations

import ast
import builtins

from common.core import notebooks

VERDICT_CALLS = ("ready", "status", "progress", "progress_records")
_BUILTINS = set(dir(builtins)) | {"display", "get_ipython", "__name__"}


def _call_name(node) -> str:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _is_ready_test(test) -> bool:
    return any(isinstance(n, ast.Call) and _call_name(n) == "ready" for n in ast.walk(test))


class _Names(ast.NodeVisitor):
    """Visits a cell in evaluation order: `needs` are the global names read before the cell binds them, `binds`
    the names it binds at top level; function and comprehension scopes keep their own names."""

    def __init__(self, modules: set[str] = frozenset()):
        self.modules = modules  # import-bound names: calling a method of one changes no name of the notebook
        self.binds: set[str] = set()
        self.needs: set[str] = set()
        self.verdict = False
        self.local: list[set[str]] = []  # the enclosing function/comprehension scopes

    def _read(self, name):
        if any(name in scope for scope in self.local) or name in _BUILTINS:
            return
        if name not in self.binds:
            self.needs.add(name)

    def _bind(self, name):
        (self.local[-1] if self.local else self.binds).add(name)

    def visit_Name(self, node):
        (self._read if isinstance(node.ctx, ast.Load) else self._bind)(node.id)

    def visit_Assign(self, node):
        self.visit(node.value)
        for t in node.targets:
            self.visit(t)

    def visit_AnnAssign(self, node):
        if node.value is not None:
            self.visit(node.value)
        self.visit(node.target)

    def visit_AugAssign(self, node):
        self.visit(node.value)
        if isinstance(node.target, ast.Name):
            self._read(node.target.id)
        self.visit(node.target)

    def visit_NamedExpr(self, node):
        self.visit(node.value)
        self.visit(node.target)

    def visit_For(self, node):
        self.visit(node.iter)
        self.visit(node.target)
        for s in node.body + node.orelse:
            self.visit(s)

    def visit_If(self, node):
        self.visit(node.test)
        if _is_ready_test(node.test):  # an unsolved lab never enters it
            self.verdict = True
        else:
            for s in node.body:
                self.visit(s)
        for s in node.orelse:
            self.visit(s)

    def visit_Import(self, node):
        for a in node.names:
            self._bind((a.asname or a.name).split(".")[0])

    visit_ImportFrom = visit_Import

    def visit_Call(self, node):
        if _call_name(node) in VERDICT_CALLS or _call_name(node).startswith("check_"):
            self.verdict = True
        self.generic_visit(node)
        f = node.func  # `rows.append(x)`: the object may change in place, which counts as binding it again
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id not in self.modules:
            if not self.local or not any(f.value.id in s for s in self.local):
                self.binds.add(f.value.id)

    def _store_base(self, node):
        base = node
        while isinstance(base, (ast.Attribute, ast.Subscript)):
            base = base.value
        if isinstance(base, ast.Name) and not any(base.id in s for s in self.local):
            self._read(base.id)
            self.binds.add(base.id)

    def visit_Attribute(self, node):
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self._store_base(node)
        self.generic_visit(node)

    def visit_Subscript(self, node):
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self._store_base(node)
        self.generic_visit(node)

    def _function(self, node, args):
        for d in getattr(node, "decorator_list", []):
            self.visit(d)
        for default in args.defaults + [d for d in args.kw_defaults if d is not None]:
            self.visit(default)
        params = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
        params |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
        body = node.body if isinstance(node.body, list) else [node.body]
        assigned = {n.id for s in body for n in ast.walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        self.local.append(params | assigned)
        for s in body:
            self.visit(s)
        self.local.pop()

    def visit_FunctionDef(self, node):
        self._function(node, node.args)
        self._bind(node.name)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node):
        self._function(node, node.args)

    def visit_ClassDef(self, node):
        for b in node.bases + node.decorator_list:
            self.visit(b)
        self.local.append({n.id for s in node.body for n in ast.walk(s) if isinstance(n, ast.Name)
                           and isinstance(n.ctx, ast.Store)})
        for s in node.body:
            self.visit(s)
        self.local.pop()
        self._bind(node.name)

    def _comprehension(self, node, parts):
        bound = {n.id for g in node.generators for n in ast.walk(g.target) if isinstance(n, ast.Name)}
        self.visit(node.generators[0].iter)  # evaluated in the enclosing scope
        self.local.append(bound)
        for i, g in enumerate(node.generators):
            if i:
                self.visit(g.iter)
            for cond in g.ifs:
                self.visit(cond)
        for p in parts:
            self.visit(p)
        self.local.pop()

    def visit_ListComp(self, node):
        self._comprehension(node, [node.elt])

    visit_SetComp = visit_GeneratorExp = visit_ListComp

    def visit_DictComp(self, node):
        self._comprehension(node, [node.key, node.value])


def imported_names(sources: list[str]) -> set[str]:
    """The names a notebook binds by import, and `env` (the set-up cell's Env, whose methods change nothing)."""
    out = {"env"}
    for src in sources:
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        out |= {(a.asname or a.name).split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in n.names}
    return out


def cell_names(source: str, modules: set[str] = frozenset()) -> tuple[set[str], set[str], bool]:
    """(binds, needs, asks_for_a_verdict) of one code cell; a cell that does not parse touches everything."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {"*"}, {"*"}, True
    v = _Names(modules)
    for stmt in tree.body:
        v.visit(stmt)
    return v.binds, v.needs, v.verdict


def kept_cells(solution) -> list[int]:
    """Indices (into the generated lab's cells) of the code cells the unsolved lab's test executes, in order."""
    lab = notebooks.make_lab(solution)
    sol_code = [c for c in solution.cells if c.cell_type == "code"]
    lab_code = [(i, c) for i, c in enumerate(lab.cells) if c.cell_type == "code"]
    if len(sol_code) != len(lab_code):
        return [i for i, _ in lab_code]
    modules = imported_names([c.source for c in sol_code])
    cells = []
    for s, (i, c) in zip(sol_code, lab_code):
        binds, needs, verdict = cell_names(c.source, modules)
        differs = s.source != c.source
        cells.append({"i": i, "binds": binds, "needs": needs, "differs": differs,
                      "keep": differs or verdict or "*" in needs or "parameters" in c.metadata.get("tags", [])
                      or "setup(" in c.source})
    tainted: set[str] = set().union(*(c["binds"] for c in cells if c["differs"]))
    changed = True
    while changed:  # whatever is computed from an exercise runs differently in the lab
        changed = False
        for c in cells:
            if c["needs"] & tainted and not c["keep"]:
                c["keep"] = changed = True
            if c["keep"] and c["needs"] & tainted and not c["binds"] <= tainted:
                tainted |= c["binds"]
                changed = True
    changed = True
    while changed:  # every name a kept cell reads comes from the latest earlier cell that binds it
        changed = False
        for pos, c in enumerate(cells):
            if not c["keep"]:
                continue
            for name in c["needs"]:
                for earlier in reversed(cells[:pos]):
                    if name in earlier["binds"] or "*" in earlier["binds"]:
                        if not earlier["keep"]:
                            earlier["keep"] = changed = True
                        break
    return [c["i"] for c in cells if c["keep"]]
