"""The audit of named wrong answers (tests/wrong_answers/labNN.py): each wrong answer's verdict names it; every
checker whose solution has more than one line has at least ten named wrong answers; a right answer is never refused
(each checker's own tests pass right answers)."""
import importlib
import pkgutil

import nbformat
import pytest

import wrong_answers
from common.core import checks, lessons, notebooks
from test_wrong_answers import WRONG as EARLY
from test_wrong_answers import run_named
from test_wrong_answers_late import WRONG as LATE

MIN_NAMED = 10
# Labs whose checkers are not yet audited to MIN_NAMED (empty since issue 46; a new lab may start here): a lab leaves when its
# audit module lands, and test_pending_labs_are_still_short keeps the set honest.
PENDING: set[str] = set()
MODULES = [importlib.import_module(f"wrong_answers.{m.name}") for m in pkgutil.iter_modules(wrong_answers.__path__)]
AUDIT = {}
for _module in MODULES:
    for _check, _answers in _module.WRONG.items():
        AUDIT.setdefault(_check, []).extend(_answers)
CASES = [(check, i, wrong, words) for check, answers in AUDIT.items() for i, (wrong, words) in enumerate(answers)]


def _lab(exercise: str) -> str:
    return f"{int(exercise.split('.')[0]):02d}"


def _audit_class(cases):
    """A test class for one lab's entries: `make test`'s --dist loadscope hands each class to a worker, so the labs'
    audits run on both workers instead of one module's worth on one."""
    @pytest.mark.parametrize("check, i, wrong, words", cases, ids=[f"{c.exercise}-{i}" for c, i, _, _ in cases])
    def test_wrong_answer_is_named(self, check, i, wrong, words):
        run_named(check, wrong, words, seeds=(1,))
    return {"test_wrong_answer_is_named": test_wrong_answer_is_named}


for _name in sorted({_lab(c.exercise) for c, *_ in CASES}):
    globals()[f"TestAuditLab{_name}"] = type(f"TestAuditLab{_name}", (),
                                             _audit_class([c for c in CASES if _lab(c[0].exercise) == _name]))


def solution_lines() -> dict[str, int]:
    """{exercise: lines of its solution} over every solution notebook."""
    out = {}
    for name in notebooks.notebook_names():
        out.update(lessons.exercises(nbformat.read(str(notebooks.SOLUTIONS / name), as_version=4)))
    return out


def short_checkers() -> dict[str, int]:
    """{exercise: distinct named wrong answers} for every checker with more than one solution line under MIN_NAMED."""
    named = {}
    for table in (EARLY, LATE, AUDIT):
        for check, answers in table.items():
            named.setdefault(check.exercise, set()).update(words for _, words in answers)
    for lab in range(15):
        importlib.import_module(f"common.exercises.lab{lab:02d}")
    return {ex: len(named.get(ex, ())) for ex, lines in solution_lines().items()
            if lines > 1 and len(named.get(ex, ())) < MIN_NAMED and ex in checks._titles}


def test_every_checker_names_ten_wrong_answers():
    short = {ex: n for ex, n in short_checkers().items() if _lab(ex) not in PENDING}
    assert not short, (f"checkers with fewer than {MIN_NAMED} distinct named wrong answers in the audit "
                       f"(tests/wrong_answers/labNN.py and the tables of test_wrong_answers*.py): {short}")


def test_pending_labs_are_still_short():
    done = PENDING - {_lab(ex) for ex in short_checkers()}
    assert not done, f"labs {sorted(done)} meet the audit's bar: remove them from PENDING"
