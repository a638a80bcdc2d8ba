"""The unsolved lab's run keeps every cell its stubs can change and what those cells need, and only those."""
import re

import lab_slice
import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

EXERCISE = "# Exercise 1.1: double\ndef double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION\n"


def _solution(*sources):
    cells = [new_markdown_cell("# Lab 01 -- demo")]
    cells.append(new_code_cell('PROFILE = "auto"', metadata={"tags": ["parameters"]}))
    cells += [new_code_cell(s) for s in sources]
    return new_notebook(cells=cells)


def _kept_sources(nb):
    from common.core import notebooks
    lab = notebooks.make_lab(nb)
    return [lab.cells[i].source for i in lab_slice.kept_cells(nb)]


def test_a_measurement_read_only_inside_a_ready_branch_is_left_out():
    nb = _solution("from common import setup\nenv = setup('01_demo', PROFILE)",
                   "slow = sum(range(10**6))",  # stands for a measured cell: nothing the stub changes reads it
                   EXERCISE, "check_double(double)",
                   "if ready('1.1'):\n    print(double(slow))\nelse:\n    print('finish 1.1 first')")
    kept = _kept_sources(nb)
    assert "slow = sum(range(10**6))" not in kept
    assert len(kept) == 5 and kept[0] == 'PROFILE = "auto"' and "NotImplementedError" in kept[2]


def test_what_a_stub_feeds_is_kept_with_what_it_needs():
    nb = _solution("from common import setup\nenv = setup('01_demo', PROFILE)",
                   "base = 3", "unrelated = 4",
                   EXERCISE, "check_double(double)",
                   "y = double(base)",          # no ready() guard: this is what the unsolved run must execute
                   "z = y + 1")
    kept = _kept_sources(nb)
    assert "base = 3" in kept and "y = double(base)" in kept and "z = y + 1" in kept
    assert "unrelated = 4" not in kept


def test_an_object_changed_in_place_keeps_the_cell_that_changed_it():
    nb = _solution("from common import setup\nenv = setup('01_demo', PROFILE)",
                   "rows = []", "rows.append(1)", "other = [x for x in range(3)]",
                   EXERCISE, "check_double(double)", "if ready('1.1'):\n    pass\nprint(len(rows))")
    kept = _kept_sources(nb)
    assert "rows = []" in kept and "rows.append(1)" in kept and "other = [x for x in range(3)]" not in kept


def test_names_bound_in_a_function_or_a_comprehension_are_not_needs():
    binds, needs, verdict = lab_slice.cell_names("def f(a):\n    b = a + c\n    return b\nq = [i * k for i in r]")
    assert binds == {"f", "q"} and needs == {"c", "k", "r"} and not verdict
    binds, needs, verdict = lab_slice.cell_names("x = x + 1\nprint(ready('2.1'))")
    assert needs == {"x", "ready"} and verdict


def test_every_lab_keeps_its_exercises_checks_and_progress():
    from common.core import notebooks
    for name in notebooks.notebook_names():
        sol = nbformat.read(str(notebooks.SOLUTIONS / name), as_version=4)
        lab = notebooks.make_lab(sol)
        kept = set(lab_slice.kept_cells(sol))
        for i, c in enumerate(lab.cells):
            if c.cell_type == "code" and (re.search(r"NotImplementedError|\bcheck_\w+\(|\bprogress\(|\bsetup\(",
                                                    c.source) or "parameters" in c.metadata.get("tags", [])):
                assert i in kept, f"{name} cell {i} must run in the unsolved lab's test"
