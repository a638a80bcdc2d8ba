"""Every checker is importable and has tests that drive it (right and wrong answers live in test_exercises_labNN)."""
import importlib
import pkgutil
import re

import pytest

import common.exercises
from common.core.env import REPO_ROOT


def _checkers():
    found = []
    for mod in pkgutil.iter_modules(common.exercises.__path__):
        module = importlib.import_module(f"common.exercises.{mod.name}")
        for name, obj in vars(module).items():
            if callable(obj) and hasattr(obj, "exercise") and obj.__module__ == module.__name__:
                found.append((mod.name, name, obj))
    return found


CHECKERS = _checkers()


def test_there_are_checkers():
    assert len(CHECKERS) >= 5


@pytest.mark.parametrize("module,name", [(m, n) for m, n, _ in CHECKERS])
def test_checker_has_tests(module, name):
    test_file = REPO_ROOT / "tests" / f"test_exercises_{module}.py"
    assert test_file.exists(), f"{module} has checkers but no {test_file.name}"
    text = test_file.read_text()
    assert re.search(rf"\b{name}\b", text), f"{name} ({module}) is not exercised by {test_file.name}"
    assert "CheckFailed" in text, f"{test_file.name} must feed its checkers wrong answers (expect CheckFailed)"


def test_exercise_ids_are_unique():
    ids = [obj.exercise for _, _, obj in CHECKERS]
    dupes = {i for i in ids if ids.count(i) > 1}
    assert not dupes, f"exercise ids used by more than one checker: {sorted(dupes)}"


@pytest.mark.parametrize("module,name", [(m, n) for m, n, _ in CHECKERS])
def test_checker_ids_match_their_lab(module, name):
    obj = dict(((m, n), o) for m, n, o in CHECKERS)[(module, name)]
    assert obj.exercise.split(".")[0] == str(int(module[3:])), f"{name} in {module} has id {obj.exercise}"
