"""The "learner first" rules of WORKBOOK.md as functions of a solution notebook: each returns the violations it
finds (an empty list when the notebook follows the rule), so tests/test_learner_first.py runs every rule on every
converted lab and shows each one failing on a notebook broken on purpose.
"""
from __future__ import annotations

import ast
import json
import re

from common.core import lessons
from common.core.lessons import going_deeper, learner_text, tags, words

MAX_WORDS = 180  # a main-path markdown cell
MIN_BUILD_LINES = 12  # the lab's central artifact: at least one exercise this long
MAX_TABLE_ROWS = 20
MEASURED = "nbval-ignore-output"
EXEMPT_CELLS = ("## Reflection",)  # reflection questions with their worked answers (stubbed in the lab)


def _md(nb):
    return [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "markdown"]


def _code(nb):
    return [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]


def long_cells(nb, limit: int = MAX_WORDS) -> list[str]:
    """Main-path markdown cells over `limit` words (as the learner copy shows them)."""
    out = []
    for i, c in _md(nb):
        if going_deeper(c) or c.source.lstrip().startswith(EXEMPT_CELLS):
            continue
        n = words(learner_text(c.source))
        if n > limit:
            out.append(f"cell {i}: {n} words (at most {limit} on the main path; move detail to a going-deeper cell)")
    return out


def going_deeper_layout(nb) -> list[str]:
    """Going-deeper cells sit under a collapsed `### Going deeper` heading, and the main path resumes with a
    heading (otherwise collapsing would hide it)."""
    out, inside = [], False
    for i, c in enumerate(nb.cells):
        first = c.source.lstrip().splitlines()[0] if c.source.strip() else ""
        if going_deeper(c):
            if c.cell_type == "markdown" and first.startswith("### Going deeper"):
                if not any(c.metadata.get(k) for k in lessons.COLLAPSED_KEYS):
                    out.append(f"cell {i}: the 'Going deeper' heading must be collapsed by default "
                               f"(metadata {lessons.COLLAPSED_KEYS[0]}: true)")
                inside = True
            elif not inside:
                out.append(f"cell {i}: tagged going-deeper but not under a '### Going deeper' heading cell")
            continue
        if inside and not (c.cell_type == "markdown" and re.match(r"#{1,3} ", first)):
            out.append(f"cell {i}: the main path resumes after a going-deeper block without a heading of level 1-3, "
                       f"so collapsing 'Going deeper' hides it")
        inside = False
        if c.cell_type == "markdown" and first.startswith("### Going deeper"):
            out.append(f"cell {i}: a 'Going deeper' heading must itself be tagged going-deeper")
    return out


def build_exercise(nb, minimum: int = MIN_BUILD_LINES) -> list[str]:
    """At least one exercise whose solution is `minimum` lines of real logic or more."""
    found = lessons.exercises(nb)
    best = max((n for _, n in found), default=0)
    if best < minimum:
        return [f"no build exercise: the longest solution is {best} lines ({found}); the lab's central artifact "
                f"needs {minimum}-40"]
    return []


def _calls(source: str, name: str) -> list[ast.Call]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)
            and getattr(n.func, "id", getattr(n.func, "attr", None)) == name]


def predictions(nb, minimum: int = 2) -> list[str]:
    """At least `minimum` predictions, each revealed by a later cell, and the calibration table at the end."""
    out, asked, revealed = [], {}, {}
    for i, c in _code(nb):
        for call in _calls(c.source, "predict"):
            if call.args and isinstance(call.args[0], ast.Constant):
                asked.setdefault(call.args[0].value, i)
        for call in _calls(c.source, "reveal"):
            if call.args and isinstance(call.args[0], ast.Constant):
                revealed.setdefault(call.args[0].value, i)
    if len(asked) < minimum:
        out.append(f"{len(asked)} prediction(s) asked with predict(...): at least {minimum}")
    for key, i in asked.items():
        if key not in revealed:
            out.append(f"prediction {key!r} (cell {i}) is never revealed beside a measurement (reveal({key!r}, ...))")
        elif revealed[key] < i:
            out.append(f"prediction {key!r} is revealed (cell {revealed[key]}) before it is asked (cell {i})")
    code = _code(nb)
    if asked and not any(_calls(c.source, "calibration") for _, c in code[-3:]):
        out.append("the lab does not end with the learner's calibration table (calibration() in its last cells)")
    return out


def section_times(nb) -> list[str]:
    """Every timed `## ` heading states its minutes, and the title's time is their sum."""
    secs = lessons.sections(nb)
    out = [f"section '{s.title}' has no '(N min)' in its heading" for s in secs if s.timed and s.stated is None]
    total = lessons.title_minutes(nb)
    stated = sum(s.stated or 0 for s in secs if s.timed)
    if total is None:
        out.append("the title cell states no '**Time:** N minutes'")
    elif total != stated:
        out.append(f"the title says {total} minutes, the sections add up to {stated}")
    return out


def honest_times(nb, run_seconds: dict[int, float] | None = None) -> list[str]:
    """Each section's stated minutes cover the rule (reading + exercises + run time) without inflating it."""
    secs = lessons.sections(nb)
    if run_seconds:
        lessons.add_run_times(secs, run_seconds)
    out = []
    for s in secs:
        if not s.timed or s.stated is None:
            continue
        rule = s.rule_minutes()
        if s.stated < int(rule):
            out.append(f"section '{s.title}': {s.stated} min stated, the rule gives {rule:.1f} (reading {s.words} "
                       f"words, exercises {s.exercises}, run {s.run_seconds:.0f} s)")
        elif s.stated > max(rule * 1.5, rule + 5):
            out.append(f"section '{s.title}': {s.stated} min stated, the rule gives only {rule:.1f}")
    return out


NUMBER = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+|\d{3,})(?![\w])")


def _numbers(text: str) -> set[str]:
    """Figures worth comparing: decimals and integers of 3+ digits, not powers of two or round hundreds."""
    out = set()
    for m in NUMBER.finditer(text):
        token = m.group(1).replace(",", "")
        if "." in token:
            if float(token) == 0 or re.fullmatch(r"\d+\.0+", token):
                continue
            out.add(token.rstrip("0").rstrip(".") if "." in token else token)
        else:
            value = int(token)
            if value & (value - 1) == 0 or value % 100 == 0 or 1900 <= value <= 2100:
                continue
            out.add(token)
    return out


def _outputs_text(cell) -> str:
    parts = []
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream":
            parts.append(o.get("text", ""))
        data = o.get("data", {})
        parts.append(data.get("text/plain", "") if isinstance(data.get("text/plain", ""), str)
                     else "".join(data.get("text/plain", "")))
    return "\n".join(parts)


def measured_numbers_in_markdown(nb) -> list[str]:
    """No figure printed by a measured cell (nbval-ignore-output) appears in the notebook's markdown, unless the
    same figure is also in code or in a deterministic output (a size, a datasheet value)."""
    measured, fixed = set(), set()
    for _, c in _code(nb):
        (measured if MEASURED in tags(c) else fixed).update(_numbers(_outputs_text(c)))
        fixed.update(_numbers(c.source))
    measured -= fixed
    out = []
    for i, c in _md(nb):
        shared = sorted(_numbers(c.source) & measured)
        if shared:
            out.append(f"cell {i}: the markdown quotes {', '.join(shared)}, which a measured cell printed: print "
                       f"measured claims with claim(...), not in the text")
    return out


MACHINE_WORDS = re.compile(r"\b(VMs?|this machine|this CPU|laptop|a run|one run|another run|our run|measured here|"
                           r"here,|here:|\d-core|two cores|two-core|on a CPU|CPU runs?|a clean clone)\b", re.I)
FIGURE_WITH_UNIT = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?\s*(?:x\b|%|GB/s|GFLOP/s|TFLOP/s|ms\b|us\b|µs|s\b)")


def machine_figures_in_markdown(nb) -> list[str]:
    """No sentence in markdown states a figure measured on some machine (a ratio, a rate, a time beside 'a VM',
    'a 2-core CPU', 'a run'): such a figure is printed by the run with claim(...), where it is this run's own."""
    out = []
    for i, c in _md(nb):
        if c.source.lstrip().startswith(EXEMPT_CELLS):
            continue
        for sentence in re.split(r"(?<=[.;!?])\s+|\n\s*[-*] ", learner_text(c.source)):
            if MACHINE_WORDS.search(sentence) and FIGURE_WITH_UNIT.search(sentence):
                out.append(f"cell {i}: a machine's measured figure in the text: {sentence.strip()[:140]!r}")
    return out


def harness_code(nb) -> list[str]:
    """Main-path code cells carry no test-harness asserts and no comments about the test machinery."""
    out = []
    for i, c in _code(nb):
        if going_deeper(c):
            continue
        try:
            tree = ast.parse(c.source)
        except SyntaxError:
            tree = None
        if tree is not None and any(isinstance(n, ast.Assert) for n in ast.walk(tree)):
            out.append(f"cell {i}: an assert statement (use checks.verify for a correctness check before timing, "
                       f"claim(..., invariant=True) for a measured invariant; tolerances for tests live in tests/)")
        for line in c.source.splitlines():
            comment = line.split("#", 1)[1] if "#" in line else ""
            if re.search(r"make test|pytest|nbval|test worker|other worker|\bCI\b", comment):
                out.append(f"cell {i}: a comment about the test machinery: {line.strip()[:80]}")
    return out


def output_hygiene(nb) -> list[str]:
    """Outputs a learner reads: tables of at most 20 rows, no exponents on large numbers, no NaN, no `.0` floats
    for big whole numbers."""
    out = []
    for i, c in _code(nb):
        for o in c.get("outputs", []):
            html = o.get("data", {}).get("text/html", "")
            html = html if isinstance(html, str) else "".join(html)
            rows = len(re.findall(r"<tr", html.split("<tbody>", 1)[-1])) if "<tbody>" in html else 0
            if rows > MAX_TABLE_ROWS:
                out.append(f"cell {i}: a table of {rows} rows (at most {MAX_TABLE_ROWS} on the main path)")
        text = _outputs_text(c)
        for pattern, what in ((r"\d\.\d+e\+\d\d", "a large number in exponent notation"),
                              (r"(?<![\w.])\d{6,}\.0\b", "a whole number printed as a float"),
                              (r"\bNaN\b", "NaN")):
            m = re.search(pattern, text)
            if m:
                out.append(f"cell {i}: {what}: {m.group(0)!r}")
    return out


def unescaped_dollars(nb) -> list[str]:
    """A dollar amount in markdown is written \\$2, or JupyterLab renders it as math."""
    out = []
    for i, c in _md(nb):
        for m in re.finditer(r"(?<![\\$])\$(?=\d)", c.source):
            out.append(f"cell {i}: unescaped '$' before a number: {c.source[max(0, m.start() - 20):m.end() + 10]!r}")
    return out


RULES = {"long_cells": long_cells, "going_deeper_layout": going_deeper_layout, "build_exercise": build_exercise,
         "predictions": predictions, "section_times": section_times,
         "measured_numbers_in_markdown": measured_numbers_in_markdown,
         "machine_figures_in_markdown": machine_figures_in_markdown, "harness_code": harness_code,
         "output_hygiene": output_hygiene, "unescaped_dollars": unescaped_dollars}


def run_seconds(path, name: str) -> dict[int, float]:
    """{cell index: seconds} of notebook `name` from the committed record of run times (docs/section_times.json,
    written by scripts/section_times.py from `make run`), or {} when it has none."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {int(k): float(v) for k, v in record.get("notebooks", {}).get(name, {}).get("cells", {}).items()}
