"""Inside the sandbox: run one learner notebook and relay the kernel's checks to the grader.

`python -m common.core.grading.runner LIMITS_JSON` first lowers its own resource limits (memory, CPU time, processes,
file size; the kernel and everything it starts inherit them and cannot raise them), then reads one line from stdin:
{"notebook": <the notebook's JSON>, "name": "NN_name.ipynb", "cell_timeout": s}. It runs every code cell in a fresh
kernel, errors allowed, and writes JSON lines to stdout: {"ev": "cell_start", "index"}, {"ev": "cell", "index",
"cell", "seconds", "timed_out"} with the cell's outputs capped, and {"ev": "end", "note"}. Before the first cell it
connects the kernel to a socket of its own (`common.exercises.remote.install`); what the kernel sends there (its
check cells' requests) goes to stdout, and the grader's stdin lines go back to the kernel.

Nothing here is trusted by the grader: the learner's code shares this process's user and could rewrite any of it.
The grader reads this stream as data, with caps, and judges in its own process.
"""
from __future__ import annotations

import asyncio
import json
import os
import resource
import sys
import time
from pathlib import Path

CHANNEL = "/tmp/.workbook-grade.sock"  # inside the sandbox (its own /tmp); --unsafe-no-sandbox passes another
STREAM_CAP = 64 << 10  # characters of stdout/stderr kept per cell (head and tail)
DATA_CAP = 2 << 20  # bytes of one rich output (an image); larger ones are replaced by a note


def apply_limits(limits: dict) -> None:
    """Lower soft and hard limits to the given values (bytes, seconds, processes)."""
    names = {"memory": resource.RLIMIT_AS, "data": resource.RLIMIT_DATA, "cpu": resource.RLIMIT_CPU,
             "processes": resource.RLIMIT_NPROC, "file_size": resource.RLIMIT_FSIZE, "open_files": resource.RLIMIT_NOFILE,
             "core": resource.RLIMIT_CORE}
    for key, value in limits.items():
        which = names[key]
        soft, hard = resource.getrlimit(which)
        value = int(value) if hard == resource.RLIM_INFINITY else min(int(value), hard)
        resource.setrlimit(which, (value, value))


def _emit(msg: dict) -> None:
    sys.stdout.buffer.write(json.dumps(msg, separators=(",", ":")).encode() + b"\n")
    sys.stdout.buffer.flush()


def cap_text(text: str, cap: int = STREAM_CAP) -> str:
    if len(text) <= cap:
        return text
    head, tail = text[:cap * 3 // 4], text[-cap // 4:]
    return f"{head}\n[... {len(text) - len(head) - len(tail):,} characters cut by the grader ...]\n{tail}"


def cap_outputs(outputs: list) -> list:
    """The outputs of one cell with long streams cut and large rich outputs replaced by a note."""
    kept = []
    for out in outputs:
        out = dict(out)
        if out.get("output_type") == "stream":
            out["text"] = cap_text(str(out.get("text", "")))
        elif out.get("output_type") == "error":
            out["evalue"] = cap_text(str(out.get("evalue", "")), 4000)
            out["traceback"] = [cap_text(str(t), 4000) for t in list(out.get("traceback", []))[-30:]]
        elif "data" in out:
            data = {}
            for mime, value in dict(out["data"]).items():
                size = len(json.dumps(value))
                data[mime] = value if size <= DATA_CAP else f"[{mime} of {size:,} bytes cut by the grader]"
            out["data"] = data
        kept.append(out)
    return kept


def _client_class():
    from nbclient import NotebookClient

    class CappedClient(NotebookClient):
        """Keeps at most 4 x STREAM_CAP characters of streams per cell while the cell runs (a cell that prints
        gigabytes does not fill this process)."""

        def output(self, outs, msg, display_id, cell_index):
            if msg.get("msg_type") == "stream":
                held = sum(len(o.get("text", "")) for o in outs if o.get("output_type") == "stream")
                if held > 4 * STREAM_CAP:
                    self.dropped = getattr(self, "dropped", 0) + len(msg["content"].get("text", ""))
                    return None
            return super().output(outs, msg, display_id, cell_index)
    return CappedClient


class Relay:
    """The kernel's one connection to the channel socket, and the grader's lines (stdin) that go back to it."""

    def __init__(self):
        self.writer = None

    async def on_kernel(self, reader, writer):
        if self.writer is not None:  # only the connection made before the first cell counts
            writer.close()
            return
        self.writer = writer
        while True:
            line = await reader.readline()
            if not line:
                break
            sys.stdout.buffer.write(line if line.endswith(b"\n") else line + b"\n")
            sys.stdout.buffer.flush()

    async def from_grader(self, rest: bytes = b""):
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=64 << 20)
        reader.feed_data(rest)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(0, "rb", buffering=0))
        while True:
            line = await reader.readline()
            if not line:
                return
            if self.writer is not None:
                self.writer.write(line)
                await self.writer.drain()


NO_KERNEL = "the grader could not connect to the kernel"  # the grader stops on it: nothing can be graded


async def run(start: dict, rest: bytes = b"") -> None:
    import nbformat
    cell_timeout = float(start["cell_timeout"])
    nb = nbformat.reads(json.dumps(start["notebook"]), as_version=4)
    folder = Path.cwd()
    (folder / Path(str(start["name"])).name).write_text(json.dumps(start["notebook"]))
    channel = str(start.get("channel") or CHANNEL)
    relay = Relay()
    server = await asyncio.start_unix_server(relay.on_kernel, channel, limit=64 << 20)
    grader_lines = asyncio.ensure_future(relay.from_grader(rest))
    client = _client_class()(nb, timeout=cell_timeout, allow_errors=True, interrupt_on_timeout=True,
                             error_on_timeout={"ename": "CellTimeoutError", "evalue": "", "traceback": []},
                             kernel_name="python3", resources={"metadata": {"path": str(folder)}})
    note = ""
    async with client.async_setup_kernel():
        reply = await client.async_wait_for_reply(client.kc.execute(
            f"import common.exercises.remote as _grading\n_grading.install({channel!r})\ndel _grading",
            silent=True, store_history=False))
        if not reply or reply["content"].get("status") != "ok":
            note = NO_KERNEL
        for index, cell in enumerate(nb.cells if not note else []):
            if cell.cell_type != "code":
                continue
            _emit({"ev": "cell_start", "index": index})
            client.dropped = 0
            t0 = time.monotonic()
            try:
                await client.async_execute_cell(cell, index, execution_count=index + 1)
            except Exception as exc:  # DeadKernelError: the kernel exited (os._exit, a crash, a kill)
                note = f"the kernel died in cell {index + 1} ({type(exc).__name__})"
            seconds = time.monotonic() - t0
            timed_out = seconds >= cell_timeout
            if timed_out:
                cell.outputs.append(nbformat.v4.new_output(
                    "error", ename="CellTimeoutError", evalue=f"stopped at the cell time limit of {cell_timeout:g} s",
                    traceback=[]))
            if client.dropped:
                cell.outputs.append(nbformat.v4.new_output(
                    "stream", name="stdout", text=f"[... {client.dropped:,} more characters cut by the grader ...]\n"))
            _emit({"ev": "cell", "index": index, "cell": dict(cell, outputs=cap_outputs(cell.outputs)),
                   "seconds": round(seconds, 3), "timed_out": timed_out})
            if note:
                break
            if timed_out and not await _responsive(client):
                note = (f"the kernel did not stop after cell {index + 1} ran past the time limit; later cells were "
                        f"not run")
                break
        _emit({"ev": "end", "note": note})  # before the kernel's shutdown: the grader ends the sandbox now
    server.close()
    grader_lines.cancel()


async def _responsive(client) -> bool:
    """After a timed-out cell: does the kernel answer within 3 s (the interrupt worked)?"""
    try:
        reply = await asyncio.wait_for(client.async_wait_for_reply(client.kc.execute("pass", silent=True)), 3)
    except Exception:
        return False
    return bool(reply)


def _first_line() -> tuple[bytes, bytes]:
    """The first line of stdin and whatever came after it, read without a buffer that could swallow later lines."""
    data = b""
    while b"\n" not in data:
        chunk = os.read(0, 1 << 20)
        if not chunk:
            break
        data += chunk
    line, _, rest = data.partition(b"\n")
    return line, rest


def skip_slow_imports() -> None:
    """nbformat validates with jsonschema, which compiles a grammar for one IRI format check at import when the
    optional rfc3987_syntax is installed (about 2.5 s of CPU): notebooks here are checked without it."""
    sys.modules.setdefault("rfc3987_syntax", None)


def main() -> None:
    skip_slow_imports()
    apply_limits(json.loads(sys.argv[1]))
    line, rest = _first_line()
    asyncio.run(run(json.loads(line), rest))


if __name__ == "__main__":
    main()
