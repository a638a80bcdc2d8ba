import os
import sys
from pathlib import Path

# Tests run headless, on the quick profile, and never write a ledger into the repo's build/interactive/.
os.environ.setdefault("WORKBOOK_HEADLESS", "1")
os.environ.setdefault("WORKBOOK_PROFILE", "quick")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402
import warm_kernels  # noqa: E402


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
    config.addinivalue_line("markers", "sandbox: needs the grader's bubblewrap sandbox (skipped without it, outside CI)")
    controller = getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput")
    if not controller and os.environ.get("WORKBOOK_BROWSER") != "1":  # JupyterLab starts its own kernels
        config._kernel_server = warm_kernels.start()  # each process that runs tests (not xdist's controller)


def pytest_collection_modifyitems(config, items):
    """Without a working bubblewrap (missing, or no user namespaces) a learner's `make test` skips the grading tests
    with one line on how to install it; under CI (CI set) a missing sandbox still fails them."""
    marked = [item for item in items if item.get_closest_marker("sandbox")]
    if not marked or os.environ.get("CI"):
        return
    from common.core.grading import sandbox
    why = sandbox.unavailable()
    if why:
        skip = pytest.mark.skip(reason=f"grading tests need the sandbox: {why} -- install bubblewrap "
                                       f"(Debian/Ubuntu: sudo apt-get install -y bubblewrap) to run them")
        for item in marked:
            item.add_marker(skip)


def pytest_unconfigure(config):
    server = getattr(config, "_kernel_server", None)
    if server is not None:
        warm_kernels.stop(server)



if os.environ.get("WORKBOOK_LOOPBACK") == "1":  # judge every check through the grader's wire format (see remote.py)
    from common.core import checks as _checks
    from common.exercises import remote as _remote
    _checks.submission_hook = _remote.loopback_hook
