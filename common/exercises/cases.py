"""What every checker shares: random cases from a fresh seed per call (printed in a failure), learner calls whose
crash, wrong return type or call to the reference becomes a verdict naming the call, and a record of Triton launches.

    with fresh_cases() as cases:          # a new seed each call; a CheckFailed inside gets "(random cases: seed N)"
        x = torch.randn(4, generator=cases.gen); n = cases.rng.randint(1, 9)
        got = as_number(learner_call(fn, (x, n), f"fn(x [4], {n})", (topology.fn,)), f"fn(x [4], {n})")

    @checker("5.1", "...")
    @replayable                           # check(fn, cases) inside fresh_cases; the checker takes seed=N to replay
    def check_x(fn, cases): ...

`learner_call(..., expected="a number of bytes")` says what the call should have returned when it crashes;
`watched(references)` spies on the reference functions an exercise asks the learner to write.
"""
from __future__ import annotations

import contextlib
import functools
import math
import os
import random
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

from common.core.checks import CheckFailed, _learner_error, needs_triton


@dataclass
class Cases:
    seed: int
    rng: random.Random

    @functools.cached_property
    def gen(self):
        """A torch.Generator seeded with the same seed (torch is imported on first use: arithmetic labs skip it)."""
        import torch
        return torch.Generator().manual_seed(self.seed)

    def tag(self, is_random: bool) -> str:
        """" [random case, seed N]" for a random case, "" for a fixed one (for a case's description)."""
        return f" [random case, seed {self.seed}]" if is_random else ""


@contextlib.contextmanager
def fresh_cases(seed: int | None = None, replay: bool = False):
    """Random cases from a new seed (or `seed`, to reproduce a failure); a failure that does not name the seed yet
    gets "(random cases: seed N)" appended (with `replay`, also "[replay with seed=N]")."""
    seed = secrets.randbits(31) if seed is None else int(seed)
    cases = Cases(seed, random.Random(seed))
    try:
        yield cases
    except CheckFailed as exc:
        if f"seed {seed}" in str(exc):
            raise
        raise CheckFailed(f"{exc} (random cases: seed {seed})" + (f" [replay with seed={seed}]" if replay else "")) \
            from None


def replayable(check):
    """Decorator: run `check(fn, cases)` inside fresh_cases; the decorated checker takes `seed=` to replay."""
    @functools.wraps(check)
    def run(fn, seed=None):
        with fresh_cases(seed, replay=True) as cases:
            return check(fn, cases)
    return run


class Streamed:
    """Tensor blocks streamed through ONE buffer, as tiles through SRAM: each block is copied into the memory of the
    previous one, so a function that keeps the blocks (a list, torch.cat at the end) holds the last block many times
    over, and only a function that updates its state as each block arrives gets the right answer. One pass only.
    (The grader's sandbox streams the same way: common.exercises.remote.)"""
    streams_into_one_buffer = True

    def __init__(self, blocks):
        self._blocks = iter(blocks)
        self._buffer = None

    def __iter__(self):
        return self

    def __next__(self):
        block = next(self._blocks)
        n = block.numel()
        if self._buffer is None or self._buffer.numel() < n or self._buffer.dtype != block.dtype:
            self._buffer = block.new_empty(n)
        return self._buffer[:n].view(block.shape).copy_(block)


def _reraise_stub(exc: BaseException) -> None:
    """A stubbed @triton.jit kernel raises a compile error whose text names its NotImplementedError: not attempted."""
    text = f"{type(exc).__name__}: {exc}"
    if "NotImplementedError" in text and "replace this line with your code" in text:
        raise NotImplementedError(str(exc).strip().splitlines()[-1][:200]) from None


def _reference_name(ref) -> str:
    return f"{ref[0].__name__}.{ref[1]}" if isinstance(ref, tuple) else f"{ref.__module__}.{ref.__qualname__}"


def learner_call(fn, args: tuple, call: str, references=(), used: set | None = None, expected: str = "",
                 allowed=(), library: bool = False):
    """fn(*args); an exception other than NotImplementedError (or a checker's own CheckFailed) becomes a verdict
    naming `call` (and, with `expected`, what it should have returned).

    `references`: the `common` functions this exercise asks the learner to write, as functions or (module, name)
    pairs (see `watched`); a call to one is a verdict, or, with `used` (a set), is added to it for the checker to
    refuse once the numbers are right. With `library`, any other call from the learner's code into the workbook's
    library (common's kernels, moe, parallel and systems packages) is refused the same way -- helpers that together
    do the exercise are a route around it -- unless `allowed` names it: qualified names or prefixes
    ("common.systems.inference.scheduler.Seq" allows Seq's methods), for what the exercise hands the learner.
    """
    references = tuple(references)
    allowed = tuple(allowed)
    remote = _remote(fn)
    itself = None
    for ref in references:
        if fn is (getattr(*ref) if isinstance(ref, tuple) else ref):
            itself = _reference_name(ref)
    if itself and used is None:
        raise _passed_itself(call, itself)
    try:
        if remote is not None:  # the learner's function runs in a sandbox (the grader): it reports what it called
            result, called, itself = remote(args, references, allowed if library else None)
        else:
            with watched(references, allowed, library) as called:
                result = fn(*args)
    except (NotImplementedError, CheckFailed):
        raise
    except Exception as exc:
        if needs_triton(exc):  # Triton is not installed here: the verdict is "needs Triton", not a mistake
            raise
        _reraise_stub(exc)
        should = f" should return {expected};" if expected else ":"
        raise CheckFailed(f"{call}{should} {_learner_error(exc)}") from exc
    if itself:
        if used is None:
            raise _passed_itself(call, itself)
        used.add(itself)
    if called and used is not None:
        used.update(called)
    elif called:
        raise refused(call, called[0], references)
    return result


def refused(call: str, name: str, references=()) -> CheckFailed:
    """The verdict on a learner's function that called `name` of the workbook instead of doing the exercise."""
    if name in {_reference_name(r) for r in references}:
        return CheckFailed(f"{call} called {name}, the reference this exercise asks you to write; write it yourself "
                           f"(torch and math built-ins are fine)")
    return CheckFailed(f"{call} called {name}, the workbook's own code, which does (part of) this exercise for you; "
                       f"write it yourself with torch, math and what the exercise hands you")


def _passed_itself(call: str, name: str) -> CheckFailed:
    return CheckFailed(f"{call} called {name}, the reference this exercise asks you to write (you passed {name} "
                       f"itself); write it yourself")


def _remote(fn):
    """fn's remote_call(args, references, allowed) -> (result, called, itself) when fn stands for a learner's function
    in a sandbox (common.core.grading.remote.RemoteFunction, or a functools.partial of one); else None."""
    if isinstance(fn, functools.partial):
        inner = getattr(fn.func, "remote_call", None)
        if inner is None:
            return None
        return lambda args, refs, allowed=(): inner(tuple(fn.args) + tuple(args), dict(fn.keywords), refs, allowed)
    inner = getattr(fn, "remote_call", None)
    return None if inner is None else (lambda args, refs, allowed=(): inner(tuple(args), {}, refs, allowed))


def as_number(got, call: str, what: str = "a number", integer: bool = False):
    """float(got) (an int when `integer`) for one number (a 0-d tensor or array too), or a verdict saying what came
    back instead."""
    if got is None:
        raise CheckFailed(f"{call} returned None -- return {what}")
    try:
        if isinstance(got, (str, bytes, bool)) or getattr(got, "ndim", 0):
            raise TypeError
        value = float(got)
    except (TypeError, ValueError, RuntimeError):
        raise CheckFailed(f"{call} returned {type(got).__name__} {got!r:.80}; expected {what}") from None
    if integer:
        if not value.is_integer():
            raise CheckFailed(f"{call} returned {got!r}; expected a whole number")
        return int(value)
    return value


def digits(x: float) -> str:
    """A float with enough digits to show a difference that %.6g hides."""
    return f"{float(x):.17g}"


def expect_number(got: float, expected: float, what: str, rtol: float, atol: float = 0.0) -> None:
    """Scalar closeness, printed with enough digits to show the difference (checks.expect_close prints 6)."""
    if not math.isclose(float(got), float(expected), rel_tol=rtol, abs_tol=atol):
        rel = abs(got - expected) / abs(expected) if expected else float("inf")
        raise CheckFailed(f"{what}: expected {digits(expected)}, got {digits(got)} (relative error {rel:.3g}, "
                          f"allowed {rtol:g})")


COMMON = str(Path(__file__).resolve().parents[1]) + os.sep  # common/
LIBRARY = tuple(COMMON + p + os.sep for p in ("kernels", "moe", "parallel", "systems"))  # what the labs teach


def _allowed(name: str, allowed: tuple) -> bool:
    return any(name == a or name.startswith(a + ".") for a in allowed)


@contextlib.contextmanager
def watched(references, allowed=(), library: bool = True):
    """Spy on the references while the block runs; yields the list of their names that were called.

    A (module, name) pair is replaced by a spy in its module (a call through the module is seen); a function is
    watched by its code object (a call is seen whatever name or import path the learner used). With `library`, a
    call from code outside `common/` (the learner's) into the workbook's library -- common's kernels, moe, parallel
    and systems packages -- is recorded too, as "module.qualname", unless `allowed` names it or a prefix of it."""
    called: list[str] = []
    saved = []
    codes = {}
    allowed = tuple(allowed)
    for ref in references:
        if not isinstance(ref, tuple):
            codes[ref.__code__] = _reference_name(ref)
            continue
        module, name = ref
        real = getattr(module, name)

        def spy(*a, _real=real, _name=_reference_name(ref), **k):
            called.append(_name)
            return _real(*a, **k)
        saved.append((module, name, real))
        setattr(module, name, spy)
    before = sys.getprofile()

    def profile(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if code in codes:
            called.append(codes[code])
        elif library and code.co_filename.startswith(LIBRARY):
            caller = frame.f_back
            if caller is not None and not caller.f_code.co_filename.startswith(COMMON):
                name = f"{frame.f_globals.get('__name__', '?')}.{getattr(code, 'co_qualname', code.co_name)}"
                if not _allowed(name, allowed) and name not in called:
                    called.append(name)
    if codes or library:
        sys.setprofile(profile)
    try:
        yield called
    finally:
        if codes or library:
            sys.setprofile(before)
        for module, name, real in saved:
            setattr(module, name, real)


@contextlib.contextmanager
def record_launches():
    """Record (in the yielded list) every Triton launch `kernel[grid](...)` made inside the block: its grid (None
    when the grid is a function), the kernel, its positional arguments, and its int / bool keyword arguments (the
    constexprs such as BLOCK_SIZE)."""
    from triton.runtime.jit import KernelInterface  # the base of compiled and interpreted kernels: kernel[grid]
    launches: list[dict] = []
    original = KernelInterface.__dict__["__getitem__"]

    def getitem(kernel, grid):
        launch = original(kernel, grid)

        def run(*args, **kwargs):
            launches.append({"grid": None if callable(grid) else tuple(grid), "kernel": kernel, "args": args,
                             "constants": {k: v for k, v in kwargs.items() if isinstance(v, (int, bool))}})
            return launch(*args, **kwargs)
        return run
    KernelInterface.__getitem__ = getitem
    try:
        yield launches
    finally:
        KernelInterface.__getitem__ = original


def unmasked_accesses(kernel) -> list[str]:
    """The `tl.load` / `tl.store` calls in a Triton kernel's own source that pass neither a mask nor a boundary_check,
    as "line N: <call>" (lines counted from the `def`); empty when the source cannot be read. A masked store hides an
    unmasked load from the result, but not from the memory system: the load still reads past the end."""
    import ast
    import inspect
    import textwrap
    try:
        src = textwrap.dedent(inspect.getsource(getattr(kernel, "fn", kernel)))
        tree = ast.parse(src)
    except (OSError, TypeError, SyntaxError):
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("load", "store"):
            mask_position = 1 if node.func.attr == "load" else 2  # tl.load(ptr, mask), tl.store(ptr, value, mask)
            keywords = {k.arg for k in node.keywords}
            if not ({"mask", "boundary_check"} & keywords or len(node.args) > mask_position):
                found.append(f"line {node.lineno - 1}: {ast.get_source_segment(src, node)}")
    return found
