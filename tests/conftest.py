import os
import sys
from pathlib import Path

# Tests run headless, on the quick profile, and never write a ledger into the repo's build/interactive/.
os.environ.setdefault("WORKBOOK_HEADLESS", "1")
os.environ.setdefault("WORKBOOK_PROFILE", "quick")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _ledger_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBOOK_RESULTS", str(tmp_path / "results.jsonl"))
    from common.core import checks
    checks.reset()
    yield


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op torch thread for a module's small elementwise work (avoids OpenMP contention on a busy CPU);
    restored afterwards. Use with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def pytest_configure(config):
    config.addinivalue_line("markers", "notebooks: executes notebooks (slow)")



if os.environ.get("WORKBOOK_LOOPBACK") == "1":  # judge every check through the grader's wire format (see remote.py)
    from common.core import checks as _checks
    from common.exercises import remote as _remote
    _checks.submission_hook = _remote.loopback_hook


# Scheduling. `make test` runs `-n 2 --dist loadscope --no-loadscope-reorder`: a scope (a module; a class for each
# unsolved lab) goes to one worker, which takes the next scope once it has at most 2 tests left -- so one-test scopes
# are taken several at a time, and a long one at the end leaves the other worker idle (about 20 s of a 5-minute run).
# Longest first: the unsolved-lab runs (5-20 s, one test each), the solutions' nbval runs, the modules that start
# processes; then the rest, whose small tests fill the tail. Order within a scope is kept (the sort is stable).
HEAVY_FIRST = ("tests/test_notebooks.py::TestUnsolvedLab", "solutions/", "tests/test_torchrun.py",
               "tests/test_grading.py", "tests/test_runner.py", "tests/test_distributed.py",
               "tests/test_exercises_lab04.py", "tests/test_beyond_gpu.py", "tests/test_ceilings.py",
               "tests/test_attention.py", "tests/test_storage.py")


def pytest_collection_modifyitems(config, items):
    def rank(item):
        return next((i for i, prefix in enumerate(HEAVY_FIRST) if item.nodeid.startswith(prefix)), len(HEAVY_FIRST))
    items[:] = sorted(items, key=rank)
