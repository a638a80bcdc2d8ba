"""The python3-warm kernel's launcher (tests/warm_kernels.py says why): hand this kernel's start to the fork server
named by WORKBOOK_KERNEL_SERVER, stand in for the forked kernel (forward signals, exit when it exits), or, with no
server to take it, become an ordinary ipykernel. Standard library only: it starts with `python -S`."""
import json
import os
import select
import signal
import socket
import sys
import time

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def ordinary_kernel():
    os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", *sys.argv[1:]])


def kernel_from_server(path):
    """The pid of a kernel the server forked for this launcher, or None."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        request = {"argv": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd(), "launcher": os.getpid()}
        socket.send_fds(sock, [json.dumps(request).encode()], [0, 1, 2])
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = sock.recv(64)
            if not chunk:
                return None
            reply += chunk
        return int(reply) if reply.strip().isdigit() else None
    except OSError:
        return None
    finally:
        sock.close()


def forward(pid):
    def handler(signum, _frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass
    for sig in FORWARDED:
        signal.signal(sig, handler)


def alive(pid, pidfd):
    if pidfd is not None:
        return not select.select([pidfd], [], [], 0.5)[0]
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    time.sleep(0.05)
    return True


def stand_in(pid):
    """Wait until the kernel exits; if this launcher's parent dies first (as an ordinary kernel would notice), kill
    the kernel."""
    parent = os.getppid()
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    while alive(pid, pidfd):
        if os.getppid() != parent:
            os.kill(pid, signal.SIGKILL)
            return


def server_ready(path, patience=30.0):
    """Whether the server listens at `path`, waiting while it is alive and still importing."""
    try:
        server = int(open(os.path.join(os.path.dirname(path), "server.pid")).read())
    except (OSError, ValueError):
        return os.path.exists(path)
    deadline = time.monotonic() + patience
    while not os.path.exists(path) and time.monotonic() < deadline:
        try:
            os.kill(server, 0)
        except ProcessLookupError:
            return False
        time.sleep(0.05)
    return os.path.exists(path)


def main():
    path = os.environ.get("WORKBOOK_KERNEL_SERVER")
    pid = kernel_from_server(path) if path and server_ready(path) else None
    if pid is None:
        ordinary_kernel()
    forward(pid)
    stand_in(pid)


if __name__ == "__main__":
    main()
