"""Triton for a notebook's kernel cells, or a stand-in that says it is missing, so every lab runs to the end.

    from common.core.tritonlang import triton, tl      # after setup(): the real modules where Triton is installed

Triton ships for Linux only. Where it is missing (macOS, native Windows) `triton` and `tl` are stand-ins: a
`@triton.jit` kernel still defines, and launching it raises `TritonMissing` (a ModuleNotFoundError), which a
checker reports as "needs Triton" instead of a failure. `needs_triton(what)` guards a cell that runs Triton code:
it prints one line naming what is missing and where it runs, and returns False.

Import the names after `setup()` (which puts Triton in interpreter mode on a CPU before anything imports it).
"""
from __future__ import annotations

import importlib.util

WHERE = ("Triton ships for Linux only: run this lab on Linux or in WSL (`pip install triton`; on a CPU it runs "
         "under its interpreter), or on any GPU box")
LABS = ("03", "04", "14")  # the labs with Triton cells (set-up names them)


class TritonMissing(ModuleNotFoundError):
    """A Triton kernel was launched (or a Triton API used) where Triton is not installed."""

    def __init__(self, what: str = "this cell"):
        super().__init__(f"{what} needs Triton, which is not installed here. {WHERE}.", name="triton")


def available() -> bool:
    """Is Triton importable here? (Found, not imported: cheap.)"""
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):
        return False


def needs_triton(what: str) -> bool:
    """True when Triton can run here; otherwise print one line saying what is skipped and where it runs."""
    if available():
        return True
    print(f"Skipped: {what} needs Triton, which is not installed here. {WHERE}.")
    return False


class _AbsentKernel:
    """What `@triton.jit` gives where Triton is missing: a kernel that defines, and refuses to launch."""

    def __init__(self, fn):
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "kernel")
        self.__doc__ = getattr(fn, "__doc__", None)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            raise TritonMissing(f"the Triton kernel {self.__name__}")
        return launch

    def __call__(self, *args, **kwargs):
        raise TritonMissing(f"the Triton kernel {self.__name__}")


class _Absent:
    """A stand-in for the `triton` and `triton.language` modules: attributes resolve (for decorators and
    annotations such as `tl.constexpr`), calls raise TritonMissing; cdiv and next_power_of_2 work."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Absent(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise TritonMissing(f"`{self._name}`")

    def __repr__(self) -> str:
        return f"<{self._name}: Triton is not installed here>"

    @staticmethod
    def jit(fn=None, **kwargs):
        if fn is None:
            return _AbsentKernel
        return _AbsentKernel(fn)

    @staticmethod
    def autotune(*args, **kwargs):
        return lambda fn: fn

    heuristics = autotune

    @staticmethod
    def cdiv(a: int, b: int) -> int:
        return -(-a // b)

    @staticmethod
    def next_power_of_2(n: int) -> int:
        return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def __getattr__(name: str):
    if name in ("triton", "tl"):
        if available():
            import triton
            import triton.language as tl
            return triton if name == "triton" else tl
        return _Absent("triton" if name == "triton" else "triton.language")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
