"""The tests' warm kernels (tests/warm_kernels.py): a forked kernel runs code as a fresh one would, in the launcher's
environment and directory, obeys interrupts, dies with its launcher, and without a server the launcher starts an
ordinary kernel."""
import contextlib
import os
import signal
import time

import pytest
import warm_kernels
from jupyter_client.manager import start_new_kernel

PROBE = ("import os, sys; print(os.getpid(), os.getcwd(), os.environ.get('WARM_PROBE'), 'torch' in sys.modules, "
         "sys.path[0] == os.getcwd(), sep='|')")


def _run(kc, code, timeout=60):
    out = []
    reply = kc.execute_interactive(code, timeout=timeout,
                                   output_hook=lambda m: out.append(m["content"].get("text", "")))
    return reply["content"]["status"], "".join(out)


@contextlib.contextmanager
def _kernel(cwd):
    km, kc = start_new_kernel(kernel_name=warm_kernels.KERNEL_NAME, cwd=str(cwd))
    try:
        yield km, kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


@pytest.fixture
def kernel(tmp_path, monkeypatch):
    monkeypatch.setenv("WARM_PROBE", "from the launcher")
    with _kernel(tmp_path) as both:
        yield both


@pytest.mark.skipif(not os.environ.get(warm_kernels.ENV), reason="no kernel server in this process")
def test_a_forked_kernel_runs_where_and_as_its_launcher_says(kernel, tmp_path):
    km, kc = kernel
    status, out = _run(kc, PROBE)
    pid, cwd, probe, preloaded, cwd_first = out.strip().split("|")
    assert status == "ok" and int(pid) != km.provisioner.process.pid, "the kernel is the server's fork, not the launcher"
    assert (cwd, probe) == (str(tmp_path), "from the launcher"), out
    assert (preloaded, cwd_first) == ("True", "False"), "torch preloaded; the working directory not first on sys.path"


@pytest.mark.skipif(not os.environ.get(warm_kernels.ENV), reason="no kernel server in this process")
def test_two_forked_kernels_draw_different_random_numbers(tmp_path):
    seen = []
    for _ in range(2):
        with _kernel(tmp_path) as (_, kc):
            seen.append(_run(kc, "import numpy, torch; print(numpy.random.randint(1 << 30), torch.randint(1 << 30, "
                                 "(1,)).item())")[1])
    (np_a, torch_a), (np_b, torch_b) = (line.split() for line in seen)
    assert np_a != np_b and torch_a != torch_b, f"numpy and torch each draw anew in each kernel: {seen}"


@pytest.mark.skipif(not os.environ.get(warm_kernels.ENV), reason="no kernel server in this process")
def test_an_interrupt_reaches_a_forked_kernel(kernel):
    km, kc = kernel
    # stop_on_error=False: an erroring request otherwise makes ipykernel abort the requests that reach it while it
    # clears its queue, and under load the next one could arrive in that window ('aborted', seen with 2 workers)
    msg_id = kc.execute("import time\nfor _ in range(600):\n    time.sleep(0.1)", stop_on_error=False)
    time.sleep(0.5)
    km.interrupt_kernel()
    reply = kc.get_shell_msg(timeout=30)
    while reply["parent_header"].get("msg_id") != msg_id:  # a readiness probe's late kernel_info reply (seen under load)
        reply = kc.get_shell_msg(timeout=30)
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
    assert _run(kc, "print(1 + 1)") == ("ok", "2\n"), "the kernel goes on after an interrupt"


@pytest.mark.skipif(not os.environ.get(warm_kernels.ENV), reason="no kernel server in this process")
def test_a_killed_launcher_takes_its_kernel_with_it(kernel):
    km, kc = kernel
    pid = int(_run(kc, PROBE)[1].split("|")[0])
    os.kill(km.provisioner.process.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    pytest.fail(f"the kernel {pid} outlived its launcher")


def test_without_a_server_the_launcher_starts_an_ordinary_kernel(tmp_path, monkeypatch):
    monkeypatch.setenv(warm_kernels.ENV, str(tmp_path / "no-server.sock"))
    with _kernel(tmp_path) as (km, kc):
        status, out = _run(kc, "import os; print(os.getpid())")
        assert status == "ok" and int(out) == km.provisioner.process.pid, "the launcher became the kernel"
