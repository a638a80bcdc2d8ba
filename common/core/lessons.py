"""A lab as the learner meets it: its sections, the words to read, the exercises to write, and honest times.

The rule for a section's minutes (CONTRIBUTING.md, "Honest times"): reading at 150 words a minute (the learner's
main path: going-deeper cells are not counted), each exercise 3 minutes plus one per line of its solution, plus the
section's measured run time on two CPU cores. Every `## ` heading states its minutes -- `## 3. Two ceilings
(12 min)` -- except the closing Summary and progress sections, and the title cell's `**Time:** N minutes` is their sum.
The text before the first `## ` heading is read as part of the first section.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

WORDS_PER_MINUTE = 150
EXERCISE_MINUTES = 3
MINUTES_PER_SOLUTION_LINE = 1
UNTIMED = ("Summary", "Your progress", "Your predictions")  # closing sections: no minutes of their own
GOING_DEEPER = "going-deeper"
COLLAPSED_KEYS = ("jp-MarkdownHeadingCollapsed", "heading_collapsed")  # JupyterLab 4; classic and nbconvert
HEADING_RE = re.compile(r"^## (?P<title>.+?)(?: \((?P<minutes>\d+) min\))?(?P<optional> \*\(optional\)\*)?\s*$", re.M)
TITLE_TIME_RE = re.compile(r"\*\*Time:\*\*\s*(?:about\s+)?(\d+)\s*min")
_SOLUTION = re.compile(r"^[ \t]*### BEGIN SOLUTION[^\n]*\n(.*?)^[ \t]*### END SOLUTION", re.M | re.S)
_MD_SOLUTION = re.compile(r"<!-- BEGIN SOLUTION -->.*?<!-- END SOLUTION -->", re.S)
EXERCISE_RE = re.compile(r"Exercise (\d+\.\d+)")


def tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def going_deeper(cell) -> bool:
    return GOING_DEEPER in tags(cell)


def learner_text(markdown: str) -> str:
    """A markdown cell as the learner copy shows it (worked answers replaced by a stub)."""
    return _MD_SOLUTION.sub("*Your answer here.*", markdown)


def words(text: str) -> int:
    """Words a reader reads: whitespace-separated tokens, without HTML comments and bare markup."""
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    return sum(1 for t in text.split() if re.search(r"[A-Za-z0-9]", t))


def solution_lines(source: str) -> int:
    """Lines of real logic between `### BEGIN SOLUTION` and `### END SOLUTION` (no blanks, no comment lines)."""
    return sum(1 for body in _SOLUTION.findall(source) for line in body.splitlines()
               if line.strip() and not line.strip().startswith("#"))


def exercises(nb) -> list[tuple[str, int]]:
    """(exercise id, solution lines) for each exercise cell of a solution notebook, in order."""
    out = []
    for cell in nb.cells:
        if cell.cell_type == "code" and "### BEGIN SOLUTION" in cell.source:
            m = EXERCISE_RE.search(cell.source)
            out.append((m.group(1) if m else "?", solution_lines(cell.source)))
    return out


@dataclass
class Section:
    title: str
    stated: int | None  # minutes the heading states
    optional: bool
    words: int = 0  # main-path words (learner copy)
    deeper_words: int = 0  # words in going-deeper cells (optional reading, not counted)
    exercises: list = field(default_factory=list)  # (id, solution lines)
    cells: list = field(default_factory=list)  # indices of the notebook's cells in this section
    run_seconds: float = 0.0

    @property
    def timed(self) -> bool:
        return not self.title.startswith(UNTIMED)

    def rule_minutes(self, run_seconds: float | None = None) -> float:
        """Minutes by the rule: reading + exercises + run time (the measured run time when given)."""
        run = self.run_seconds if run_seconds is None else run_seconds
        return (self.words / WORDS_PER_MINUTE
                + sum(EXERCISE_MINUTES + MINUTES_PER_SOLUTION_LINE * lines for _, lines in self.exercises)
                + run / 60)


def sections(nb) -> list[Section]:
    """The `## ` sections of a solution notebook (text before the first heading joins the first section)."""
    out: list[Section] = []
    pending_words, pending_cells = 0, []
    for i, cell in enumerate(nb.cells):
        src = cell.source
        if cell.cell_type == "markdown":
            heads = list(HEADING_RE.finditer(src))
            text = learner_text(src)
            if heads:
                before = learner_text(src[:heads[0].start()])
                if out and not going_deeper(cell):
                    out[-1].words += words(before)
                for n, m in enumerate(heads):
                    end = heads[n + 1].start() if n + 1 < len(heads) else len(src)
                    body = learner_text(src[m.end():end])
                    sec = Section(m.group("title").strip(), int(m.group("minutes")) if m.group("minutes") else None,
                                  bool(m.group("optional")))
                    if not out:
                        sec.words, sec.cells = pending_words, pending_cells
                    sec.words += words(m.group("title")) + words(body)
                    sec.cells.append(i)
                    out.append(sec)
                continue
            if not out:
                pending_words += words(text)
                pending_cells.append(i)
                continue
            if going_deeper(cell):
                out[-1].deeper_words += words(text)
            else:
                out[-1].words += words(text)
        elif cell.cell_type == "code":
            target = out[-1] if out else None
            if target is None:
                pending_cells.append(i)
                continue
            if "### BEGIN SOLUTION" in src:
                m = EXERCISE_RE.search(src)
                target.exercises.append((m.group(1) if m else "?", solution_lines(src)))
        if out:
            out[-1].cells.append(i)
    return out


def title_minutes(nb) -> int | None:
    """The minutes the title cell states (`**Time:** 55 minutes`), or None."""
    m = TITLE_TIME_RE.search(nb.cells[0].source) if nb.cells else None
    return int(m.group(1)) if m else None


def add_run_times(secs: list[Section], cell_seconds: dict[int, float]) -> None:
    """Attach measured run times ({cell index: seconds}, e.g. papermill's durations) to each section."""
    for s in secs:
        s.run_seconds = sum(cell_seconds.get(i, 0.0) for i in s.cells)
