"""The learner-first rules (WORKBOOK.md, CONTRIBUTING.md) on every lab that has been rebuilt to them, and each rule
shown failing on a notebook broken on purpose.

PENDING is the one list of labs not yet rebuilt, with the issue that rebuilds them; each lab issue empties its part.
"""
import copy

import nbformat
import pytest

import learner_rules as rules
from common.core import lessons, notebooks
from common.core.env import REPO_ROOT

PENDING = {  # lab: the issue that rebuilds it (one line each, so each issue removes its own)
}
NAMES = notebooks.notebook_names()
CONVERTED = [n for n in NAMES if n[:2] not in PENDING]
RUN_TIMES = REPO_ROOT / "docs" / "section_times.json"


def _solution(name):
    return nbformat.read(str(notebooks.SOLUTIONS / name), as_version=4)


def test_pending_names_only_real_labs():
    assert set(PENDING) <= {n[:2] for n in NAMES}, f"PENDING names labs that do not exist: {sorted(PENDING)}"


@pytest.mark.parametrize("rule", sorted(rules.RULES))
@pytest.mark.parametrize("name", CONVERTED)
def test_rule_holds(name, rule):
    found = rules.RULES[rule](_solution(name))
    assert not found, f"{name} breaks the rule {rule}:\n" + "\n".join(found)


@pytest.mark.parametrize("name", CONVERTED)
def test_stated_times_are_honest(name):
    found = rules.honest_times(_solution(name), rules.run_seconds(RUN_TIMES, name))
    assert not found, f"{name}: stated times do not follow the rule (CONTRIBUTING.md, 'Honest times'):\n" + \
        "\n".join(found)


# --- each rule fails on a notebook broken on purpose -----------------------------------------------------------------

def _md(text, **meta):
    cell = nbformat.v4.new_markdown_cell(text)
    cell.metadata.update(meta)
    return cell


def _code(text, outputs=(), tags=()):
    cell = nbformat.v4.new_code_cell(text)
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=t) for t in outputs]
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


def good_notebook():
    """A small lab that follows every rule."""
    solution = "\n".join(f"    x{i} = {i}" for i in range(12))
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        _md("# Lab 99 -- A lab\n\nWhat you build.\n\n**Time:** 21 minutes (the sum of the sections)."),
        _code('PROFILE = "auto"', tags=["parameters"]),
        _md("## 1. Build it (18 min)\nWrite the thing."),
        _code("# Exercise 99.1: the thing\ndef thing():\n    ### BEGIN SOLUTION\n" + solution +
              "\n    ### END SOLUTION"),
        _code("check_thing(thing)"),
        _code('predict("speed", 20, "GB/s")'),
        _code('predict("bound", "memory-bound", choices=["memory-bound", "compute-bound"])'),
        _code('reveal("speed", speed)\nreveal("bound", bound)', outputs=["measured 13.57 GB/s\n"],
              tags=["nbval-ignore-output"]),
        _md("### Going deeper: why it wobbles", tags=["going-deeper"], **{"jp-MarkdownHeadingCollapsed": True}),
        _md(" ".join(["detail"] * 300), tags=["going-deeper"]),
        _md("## 2. Use it (3 min)\nThe thing costs \\$2 an hour."),
        _md("## Summary"),
        _code("calibration()"),
    ]
    return nb


BREAKAGES = {
    "long_cells": lambda nb: nb.cells[2].__setitem__("source", nb.cells[2].source + " word" * 200),
    "going_deeper_layout": lambda nb: nb.cells[8].metadata.pop("jp-MarkdownHeadingCollapsed"),
    "build_exercise": lambda nb: nb.cells[3].__setitem__("source", "# Exercise 99.1: the thing\ndef thing():\n"
                                                         "    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION"),
    "predictions": lambda nb: nb.cells[7].__setitem__("source", 'reveal("speed", speed)'),
    "section_times": lambda nb: nb.cells[10].__setitem__("source", "## 2. Use it (9 min)\nThe thing."),
    "measured_numbers_in_markdown": lambda nb: nb.cells[10].__setitem__(
        "source", "## 2. Use it (3 min)\nThis machine copies 13.57 GB/s."),
    "machine_figures_in_markdown": lambda nb: nb.cells[10].__setitem__(
        "source", "## 2. Use it (3 min)\nOn a 2-core VM the fused chain ran 3.7x faster."),
    "harness_code": lambda nb: nb.cells[7].__setitem__("source", nb.cells[7].source + "\nassert speed > 1"),
    "output_hygiene": lambda nb: nb.cells[7].outputs.append(
        nbformat.v4.new_output("stream", name="stdout", text="7.027200e+04 bytes\n")),
    "unescaped_dollars": lambda nb: nb.cells[10].__setitem__("source", "## 2. Use it (3 min)\nIt costs $2 an hour."),
}


def test_the_good_notebook_follows_every_rule():
    nb = good_notebook()
    for name, rule in rules.RULES.items():
        assert not rule(nb), f"{name} rejects the good notebook: {rule(nb)}"


@pytest.mark.parametrize("rule", sorted(rules.RULES))
def test_each_rule_fails_on_a_broken_notebook(rule):
    assert set(BREAKAGES) == set(rules.RULES), "every rule needs a breakage"
    nb = copy.deepcopy(good_notebook())
    BREAKAGES[rule](nb)
    assert rules.RULES[rule](nb), f"{rule} did not notice the notebook broken on purpose"


def test_going_deeper_must_not_swallow_the_main_path():
    nb = good_notebook()
    nb.cells[10].source = "Back on the main path, without a heading."
    assert any("collapsing" in v for v in rules.going_deeper_layout(nb))


def test_dishonest_times_are_named():
    nb = good_notebook()
    assert not rules.honest_times(nb)
    nb.cells[2].source = "## 1. Build it (5 min)\nWrite the thing."  # 12 lines of solution alone take 15 minutes
    assert any("the rule gives" in v for v in rules.honest_times(nb))
    nb.cells[2].source = "## 1. Build it (90 min)\nWrite the thing."
    assert any("only" in v for v in rules.honest_times(nb))


def test_sections_are_read_as_the_learner_reads_them():
    secs = lessons.sections(good_notebook())
    assert [s.title for s in secs] == ["1. Build it", "2. Use it", "Summary"]
    assert secs[0].exercises == [("99.1", 12)] and secs[0].stated == 18
    assert secs[0].deeper_words >= 300 and 0 < secs[0].words < 40
