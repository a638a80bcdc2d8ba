"""Warm notebook kernels for the tests: a fork server that has imported numpy, torch, pandas and matplotlib once, and
forks a kernel from itself for each notebook the tests execute.

Every notebook `make test` runs (nbval's 15 solutions, the 15 unsolved labs) used to start a fresh kernel and import
torch in it: about 3 s of CPU each on a 2-core VM, before the notebook's first line. Here one server per pytest
worker pays that once. The kernel spec `python3-warm` (tests/jupyter/kernels/) starts a tiny stdlib-only launcher
(`launch.py` there) in its place; the launcher hands the connection file, its environment, its working directory and
its stdin/stdout/stderr to the server over a Unix socket, the server forks, and the child becomes the kernel
(`ipykernel_launcher` as usual). The launcher stays as the kernel's stand-in for jupyter_client: it forwards the
signals it gets (interrupt, terminate) and exits when the kernel does; if the launcher is killed, the kernel kills
its own process group. With no server (`make nbval`, a server that died, a refused request) the launcher becomes an
ordinary kernel, so nothing depends on the server being there.

What the fork must not carry over: the server imports only third-party packages whose import reads no setting a test
changes, or imports them as a kernel would (never `common`; triton only with torch._dynamo on a CPU build of
torch, in interpreter mode as `common.setup` puts it; pandas and matplotlib: see `_preload`), has no thread of its own when it forks
(checked; OpenBLAS's pool, started by numpy's import, is shut down by OpenBLAS's fork handler), and the child takes
the launcher's environment, working directory and sys.path, and fresh numpy and torch seeds, as a new process would.

Not for `make run` or the grader: the runner meters the CPU of its own process tree (a forked kernel is not its
child) and the grader's kernels run in a sandbox.
"""
from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ENV = "WORKBOOK_KERNEL_SERVER"  # the server's socket path, for the launchers
KERNEL_NAME = "python3-warm"
JUPYTER_DIR = Path(__file__).resolve().parent / "jupyter"  # holds kernels/python3-warm/
# torch is most of the cost (about 3 s of CPU to import here). Left out, because they read their surroundings when
# imported: pandas (whether __main__ is a script decides display.max_columns), matplotlib (MPLBACKEND, rc files),
# ipykernel (JPY_PARENT_PID and JPY_INTERRUPT_EVENT, into its traitlets' defaults)
PRELOAD = ("numpy", "torch", "pandas", "matplotlib")


def _preload() -> None:
    """Import PRELOAD as a kernel would have them: pandas decides at import whether it runs in a Jupyter kernel
    (display.max_columns 20, against a terminal's 0: a table's width), and matplotlib takes its backend from
    MPLBACKEND at import, which ipykernel sets to its inline backend when unset. (pyplot is left out: it loads the
    backend, whose hooks need the kernel's shell.)"""
    import builtins
    import importlib
    import types
    builtins.get_ipython = lambda: types.SimpleNamespace(kernel=True)  # what pandas asks, only while it loads
    backend = os.environ.get("MPLBACKEND")
    if not backend:
        os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    try:
        for name in PRELOAD:
            importlib.import_module(name)
    finally:
        del builtins.get_ipython
        if not backend:
            os.environ.pop("MPLBACKEND", None)
    import torch
    if torch.version.cuda is None and torch.version.hip is None:  # a CPU build: no GPU, so Triton is interpreted
        os.environ["TRITON_INTERPRET"] = "1"  # as common.setup sets it on a CPU, before anything imports triton
        importlib.import_module(DYNAMO)


# torch.compile, DDP, DTensor and activation checkpointing import it on first use (2.5 s here, with sympy and triton)
DYNAMO = "torch._dynamo"


def use_warm_kernels() -> None:
    """Make the `python3-warm` kernel spec findable in this process and its children (JUPYTER_PATH)."""
    paths = os.environ.get("JUPYTER_PATH", "")
    if str(JUPYTER_DIR) not in paths.split(os.pathsep):
        os.environ["JUPYTER_PATH"] = os.pathsep.join(p for p in (str(JUPYTER_DIR), paths) if p)


def start() -> subprocess.Popen:
    """Start a server for this process (it dies with it) and point the launchers at it; it listens once its imports
    are done (launchers that come earlier wait for it: a kernel of their own would import as long)."""
    use_warm_kernels()
    path = Path(tempfile.mkdtemp(prefix="workbook-kernels-")) / "server.sock"
    proc = subprocess.Popen([sys.executable, __file__, str(path), str(os.getpid())], stdin=subprocess.DEVNULL)
    (path.parent / "server.pid").write_text(str(proc.pid))  # launchers wait for a live server that is still importing
    os.environ[ENV] = str(path)
    return proc


def stop(proc: subprocess.Popen) -> None:
    path = os.environ.pop(ENV, None)
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if path:
        for name in (Path(path).name, "server.pid"):
            (Path(path).parent / name).unlink(missing_ok=True)
        Path(path).parent.rmdir()


# ---------------------------------------------------------------------------------------------- the server
def _die_with(parent: int) -> None:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(0)


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _safe_to_fork(preloaded: int) -> bool:
    """No Python thread but this one, and no native thread started since the preload (whose own are OpenBLAS's pool,
    which its fork handler shuts down before a fork and starts again on demand)."""
    return threading.active_count() == 1 and _threads() <= preloaded


def _reap(*_):
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def serve(path: str, parent: int) -> None:
    _die_with(parent)
    _preload()
    import gc
    gc.freeze()  # the preloaded objects out of the collector's reach: a kernel's collections then never walk (and so
    #              copy, page by page) the heap it shares with this server
    preloaded = _threads()
    sys.stdout.flush(), sys.stderr.flush()
    signal.signal(signal.SIGCHLD, _reap)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path + ".tmp")
    os.rename(path + ".tmp", path)  # launchers see the socket only once it is bound
    server.listen(8)
    while True:
        conn, _ = server.accept()
        fds = []
        try:
            msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            request = json.loads(msg)
            if not _safe_to_fork(preloaded):  # a fork would copy a thread's half-held locks: an ordinary kernel then
                conn.sendall(b"refused: the server has threads\n")
            elif os.fork() == 0:
                server.close()
                _become_kernel(conn, fds, request)  # never returns
        except OSError:
            pass  # the launcher gets no pid and starts an ordinary kernel
        finally:  # the child has its own copies
            for fd in fds:
                os.close(fd)
            conn.close()


def _watch_launcher(launcher: int) -> None:
    """Kill this kernel's process group when its launcher dies (jupyter_client killed it, or its parent died)."""
    try:
        fd = os.pidfd_open(launcher)
    except (AttributeError, OSError):
        return
    import select
    select.select([fd], [], [])
    os.killpg(os.getpgid(0), signal.SIGKILL)


def _become_kernel(conn: socket.socket, fds: list, request: dict) -> None:
    code = 1
    try:
        os.setsid()
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in zip((0, 1, 2), fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        if DYNAMO in sys.modules:  # triton came with it, in interpreter mode: this kernel's setup() will say the same
            os.environ["TRITON_INTERPRET"] = "1"
        import matplotlib  # the backend this kernel's environment names, as its own import would take it
        matplotlib.rcParams["backend"] = os.environ.get("MPLBACKEND") or "module://matplotlib_inline.backend_inline"
        sys.argv = ["ipykernel_launcher", *request["argv"]]
        del sys.path[0]  # as ipykernel_launcher does with the working directory (IPython puts '' back)
        import numpy
        import torch
        numpy.random.seed(int.from_bytes(os.urandom(4), "little"))
        torch.seed()
        conn.sendall(f"{os.getpid()}\n".encode())
        threading.Thread(target=_watch_launcher, args=(request["launcher"],), daemon=True).start()
        from ipykernel import kernelapp
        kernelapp.launch_new_instance()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0
    finally:  # an interpreter's exit, but never back into the server's loop
        atexit._run_exitfuncs()  # multiprocessing's and tempfile's clean-ups among them, as at a kernel's exit
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
