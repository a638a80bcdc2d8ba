"""What `common.parallel.distributed.run_workers` says when ranks fail, in the words of what happened: the first
rank that raised (its exception, traceback and last output), a rank that called sys.exit, exited without a word (its
exit code) or was killed by a signal -- and, before anything starts, a script that would start its ranks again
because it has no `if __name__ == "__main__":` guard."""
from __future__ import annotations

import contextlib
import pickle
import re
import sys
from pathlib import Path

_SIGNALS = {"SIGKILL": "out of memory? the kernel's OOM killer sends SIGKILL", "SIGSEGV": "a crash in native code",
            "SIGABRT": "an abort in native code", "SIGBUS": "a crash in native code"}
_GUARD = re.compile(r"""^if\s+(__name__\s*==\s*['"]__main__['"]|['"]__main__['"]\s*==\s*__name__)\s*:""", re.M)


class WorkerError(RuntimeError):
    """A worker failed; `rank`, `exc_type`, `worker_traceback` and `output` (what it printed) say where and how."""
    def __init__(self, message: str, rank: int, exc_type: str = "", worker_traceback: str = "", output: str = ""):
        super().__init__(message)
        self.rank, self.exc_type, self.worker_traceback, self.output = rank, exc_type, worker_traceback, output


def check_main_guard() -> None:
    """ValueError when this process runs a script (or `-m` module) with no `if __name__ == "__main__":`: each rank
    starts by importing it again (multiprocessing does), and would run the launch again, and again."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path or not Path(path).is_file() or Path(path).suffix != ".py":
        return  # a notebook's kernel, python -c, an interactive session: nothing is imported again
    with contextlib.suppress(OSError):
        if not _GUARD.search(Path(path).read_text(errors="replace")):
            raise ValueError(f"{Path(path).name} has no `if __name__ == \"__main__\":` guard: every rank starts by "
                             f"importing the script that launched it, and would run its launch again. Put the "
                             f"script's work (the run_workers call) under that guard.")


def read_log(logs: str, rank: int) -> str:
    path = Path(logs, f"rank{rank}.log")
    return path.read_bytes().decode(errors="replace") if path.exists() else ""


def _how(exc, log: str) -> str:
    """How a rank that reported nothing ended."""
    name = getattr(exc, "signal_name", None)
    if name:
        return f"was killed by {name}" + (f" ({_SIGNALS[name]})" if name in _SIGNALS else "")
    code = getattr(exc, "exit_code", 0)
    if "bootstrapping phase" in log:
        return (f"exited with code {code} while starting: it imported the script that launched it, which launched "
                f"again (no `if __name__ == \"__main__\":` guard?)")
    if code:
        return f"exited with code {code} without reporting a result (os._exit, or a crash outside Python)"
    return "exited without reporting a result (interrupted?)"


def failure(store, logs: str, world_size: int, exc) -> WorkerError:
    """The first rank that reported an error (its peers then fail on a lost connection), or the one that died."""
    reports = [pickle.loads(store.get(f"result/{r}")) if store.check([f"result/{r}"]) else ("", None)
               for r in range(world_size)]
    errors = {r: info for r, (status, info) in enumerate(reports) if status == "error"}
    r = min(errors, key=lambda k: errors[k][4]) if errors else getattr(exc, "error_index", 0)
    etype, message, tb, blob, _ = errors.get(r, ("", "", "", None, 0))
    out = read_log(logs, r)
    if etype == "SystemExit":
        text = f"rank {r} of {world_size} called sys.exit({message}): exit code {message or 0}"
    elif errors:
        text = f"rank {r} of {world_size} raised {etype}: {message}\n--- traceback in rank {r} ---\n{tb.rstrip()}"
    else:
        text = f"rank {r} of {world_size} {_how(exc, out)}"
    err = WorkerError(text + (f"\n--- last output of rank {r} ---\n{out[-2000:].strip()}" if out.strip() else ""),
                      r, etype, tb, out)
    with contextlib.suppress(Exception):  # the exception's class may not import here: the text says it all
        err.__cause__ = pickle.loads(blob) if blob else None
    return err
