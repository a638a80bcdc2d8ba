"""Exercise checkers that say what is wrong.

A checker is a function decorated with `@checker("4.2", "online softmax")`. It calls the learner's function, compares
with `expect_close` / `expect_equal` / `expect`, and returns a short success detail. The decorator turns the outcome
into a verdict:
- passed: prints "PASS Exercise 4.2 (online softmax): <detail>";
- not attempted (the learner's function still raises NotImplementedError): prints so, does not raise;
- wrong: raises `CheckFailed` (an AssertionError) whose message names expected vs got, the first mismatching index
  or the invariant that failed. In a notebook (after `setup()`) it prints "FAIL Exercise 4.2 (...): <message>"
  instead and the cell does not fail, so Run All goes on to the progress cell.
Later cells that need an exercise ask `if ready("4.2"):` and otherwise say what to finish first.
"""
from __future__ import annotations

import functools
import math
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

PASSED, FAILED, NOT_ATTEMPTED, NEEDS_TRITON = "passed", "failed", "not attempted", "needs Triton"
_status: dict[str, str] = {}
_titles: dict[str, str] = {}
_details: dict[str, str] = {}


class CheckFailed(AssertionError):
    """A checker's verdict that the learner's answer is wrong; the message says how."""


@dataclass
class Verdict:
    exercise: str
    title: str
    status: str
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    def _ipython_display_(self) -> None:
        """Already printed by the checker: show nothing more when a check is a cell's last expression."""

    def __str__(self) -> str:
        mark = {PASSED: "PASS", FAILED: "FAIL", NOT_ATTEMPTED: "TODO", NEEDS_TRITON: "SKIP"}[self.status]
        return f"{mark} Exercise {self.exercise} ({self.title}): {self.detail}"


def status(exercise: str) -> str | None:
    """passed / failed / not attempted, or None when its check has not run in this session."""
    return _status.get(exercise)


def reset() -> None:
    """Forget all verdicts (tests use this)."""
    _status.clear()
    _details.clear()


def _exercise_key(exercise: str) -> tuple:
    return tuple(int(p) for p in exercise.split(".") if p.isdigit())


def progress_records(lab: int | str) -> list[dict]:
    """One record per exercise of lab `lab` (e.g. 4 or "04"): exercise, title, status, first line of the verdict.

    status is passed / failed / not attempted, or "not checked" when its check cell has not run in this session."""
    try:
        n = int(lab)
    except (TypeError, ValueError):
        raise ValueError(f"lab={lab!r} is not a lab number (0-99, e.g. 4 or '04')") from None
    ids = sorted((e for e in _titles if e.split(".")[0] == str(n)), key=_exercise_key)
    return [{"exercise": e, "title": _titles[e], "status": _status.get(e, "not checked"),
             "verdict": _details.get(e, "")} for e in ids]


def progress(lab: int | str) -> None:
    """Print which exercises of this lab passed, failed, were not attempted or not checked yet (the records
    themselves: progress_records; nothing is returned, so a cell ending in progress(N) prints the table once)."""
    records = progress_records(lab)
    if not records:
        print(f"Lab {int(lab):02d} has no exercises.")
        return
    width = max(len(r["title"]) for r in records)
    for r in records:
        line = f"  {r['exercise']:>5}  {r['title']:<{width}}  {r['status']}"
        if r["status"] == FAILED:
            line += f" -- {r['verdict']}"
        print(line)
    counts = {s: sum(r["status"] == s for r in records)
              for s in (PASSED, FAILED, NOT_ATTEMPTED, NEEDS_TRITON, "not checked")}
    print(f"Lab {int(lab):02d}: {counts[PASSED]} of {len(records)} exercises passed, {counts[FAILED]} failed, "
          f"{counts[NOT_ATTEMPTED]} not attempted, {counts['not checked']} not checked yet"
          + (f", {counts[NEEDS_TRITON]} need Triton (not installed here)." if counts[NEEDS_TRITON] else "."))


def first_line(message: str) -> str:
    """A verdict's first line, at most 300 characters (what progress tables and grades show)."""
    return (str(message).strip().splitlines() or [""])[0][:300]


def _set(exercise: str, status_: str, message: str) -> None:
    _status[exercise] = status_
    _details[exercise] = first_line(message)


def ready(exercise: str) -> bool:
    """True when `exercise` passed its check; otherwise print what to finish first and return False."""
    if _status.get(exercise) == PASSED:
        return True
    why = {None: "its check has not run yet", NOT_ATTEMPTED: "it is not attempted yet",
           FAILED: "its check failed", NEEDS_TRITON: "it needs Triton, which is not installed here"
           }[_status.get(exercise)]
    title = _titles.get(exercise, "")
    print(f"Skipped: this cell needs Exercise {exercise}{f' ({title})' if title else ''}, and {why}. "
          f"Finish it, run its check, then run this cell again.")
    return False


def _is_learner_file(filename: str) -> bool:
    """Is this a frame of the learner's own code (a notebook cell, a script), not a library's or the workbook's?"""
    import sysconfig
    if filename.startswith("<") and not filename.startswith("<ipython-input"):
        return False
    libraries = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    workbook = str(Path(__file__).resolve().parents[1])  # common/
    return not any(filename.startswith(p) for p in libraries | {workbook}) and "site-packages" not in filename


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc` and the exceptions it was raised from, outermost first (Triton's interpreter re-raises the learner's
    error as an InterpreterError from it)."""
    out = []
    while exc is not None and exc not in out:
        out.append(exc)
        exc = exc.__cause__ or (exc.__context__ if not exc.__suppress_context__ else None)
    return out


def _learner_error(exc: BaseException) -> str:
    """One line naming an exception raised inside the learner's code, at the learner's own line (library frames
    trimmed: a Triton kernel's error is reported where the learner's kernel source raised it, with the original
    error, not the interpreter's wrapper); for code that ran in a sandbox, the frame it reported."""
    remote = getattr(exc, "_remote_where", None)
    if remote is not None:
        return f"your code raised {type(exc).__name__}: {exc}" + (f" (at {remote})" if remote else "")
    chain = _chain(exc)
    for inner in reversed(chain):  # innermost exception first: the one raised where the mistake is
        frames = [f for f in traceback.extract_tb(inner.__traceback__) if _is_learner_file(f.filename)]
        if frames:
            f = frames[-1]
            cell = "your cell" if "ipykernel" in f.filename or f.filename.startswith("<ipython") else f.filename
            return (f"your code raised {type(inner).__name__}: {inner} (in {cell}, line {f.lineno}"
                    + (f": {f.line}" if f.line else "") + ")")
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].name}, line {frames[-1].lineno}: {frames[-1].line})" if frames else ""
    return f"your code raised {type(exc).__name__}: {exc}{where}"


def needs_triton(exc: BaseException) -> bool:
    """Was `exc` raised because Triton is not installed here (a ModuleNotFoundError for triton, anywhere in its
    chain)? A checker then reports "needs Triton", not a failure."""
    return any(isinstance(e, ModuleNotFoundError) and (e.name or "").split(".")[0] == "triton" for e in _chain(exc))


_checkers: dict[str, Callable] = {}
_in_kernel: dict[str, str] = {}
# Set by the grader inside a sandboxed kernel (common.exercises.remote): submission_hook(exercise, title, args,
# kwargs, judge_here) -> Verdict sends the check to the grader, which judges it in its own process.
submission_hook: Callable | None = None
# In a notebook (install_notebook_handler), a failed check prints its verdict instead of raising, so that Run All
# goes on to the progress cell; elsewhere (tests, scripts) it raises CheckFailed.
_print_failures = False


def _judge(exercise: str, title: str, check: Callable, args: tuple, kwargs: dict) -> tuple[Verdict, Exception | None]:
    """Run one check; (its verdict, the learner's exception when the learner's code crashed)."""
    try:
        detail = check(*args, **kwargs)
    except NotImplementedError as exc:
        return Verdict(exercise, title, NOT_ATTEMPTED, f"not attempted yet -- {exc}" if str(exc) else
                       "not attempted yet"), None
    except CheckFailed as exc:
        return Verdict(exercise, title, FAILED, str(exc)), None
    except Exception as exc:  # the learner's code crashed: say where, as a verdict
        if needs_triton(exc):
            said = str(exc) if "needs Triton" in str(exc) else f"needs Triton, which is not installed here ({exc})"
            return Verdict(exercise, title, NEEDS_TRITON, said), None
        return Verdict(exercise, title, FAILED, _learner_error(exc)), exc
    return Verdict(exercise, title, PASSED, detail or "correct"), None


def judge(exercise: str, *args, **kwargs) -> Verdict:
    """The verdict of exercise `exercise`'s checker on these arguments, without printing, raising or recording it
    (the grader judges a sandboxed learner's functions this way, in its own process)."""
    run = _checkers[exercise]
    return _judge(exercise, run.title, run.check, args, kwargs)[0]


def judged_in_kernel() -> dict[str, str]:
    """{exercise: why} for the checkers that only the learner's own kernel can run (the grader marks them)."""
    return dict(_in_kernel)


def checker(exercise: str, title: str, in_kernel: str = ""):
    """Decorate a check function; see the module docstring for the verdicts it gives. `in_kernel` says why the
    grader cannot judge it out of process from the learner's results alone (e.g. it times the learner's code)."""
    def wrap(check: Callable[..., str | None]):
        _titles[exercise] = title
        if in_kernel:
            _in_kernel[exercise] = in_kernel

        @functools.wraps(check)
        def run(*args, **kwargs) -> Verdict:
            crash = None
            if submission_hook is not None:
                verdict = submission_hook(exercise, title, args, kwargs,
                                          lambda: _judge(exercise, title, check, args, kwargs)[0])
            else:
                verdict, crash = _judge(exercise, title, check, args, kwargs)
            _set(exercise, verdict.status, verdict.detail)
            if verdict.status == FAILED and not _print_failures:
                raise CheckFailed(f"Exercise {exercise} ({title}): {verdict.detail}") from crash
            print(verdict)
            return verdict

        run.exercise = exercise
        run.title = title
        run.check = check
        _checkers[exercise] = run
        return run
    return wrap


def fail(message: str) -> None:
    raise CheckFailed(message)


def expect(condition: bool, message: str) -> None:
    """Fail with `message` (the invariant, stated) when `condition` is false."""
    if not condition:
        raise CheckFailed(message)


def near(got: Any, value: float, rtol: float = 1e-6) -> bool:
    """True when `got` is a number within `rtol` of `value` (False for non-numbers): for spotting a known mistake."""
    try:
        return math.isclose(float(got), float(value), rel_tol=rtol)
    except (TypeError, ValueError):
        return False


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.6g}"
    return repr(x)


def expect_equal(got: Any, expected: Any, what: str = "result") -> None:
    """Exact equality for ints, strings, tuples, lists and dicts, with the first difference named."""
    if isinstance(expected, (list, tuple)) and isinstance(got, (list, tuple)):
        if len(got) != len(expected):
            fail(f"{what}: expected {len(expected)} items, got {len(got)} (expected {_short(expected)}, "
                 f"got {_short(got)})")
        for i, (g, e) in enumerate(zip(got, expected)):
            if g != e:
                fail(f"{what}: first difference at index {i}: expected {_fmt(e)}, got {_fmt(g)}")
        return
    if isinstance(expected, dict) and isinstance(got, dict):
        missing, extra = set(expected) - set(got), set(got) - set(expected)
        if missing or extra:
            fail(f"{what}: keys differ: missing {sorted(map(str, missing))}, unexpected {sorted(map(str, extra))}")
        for k in expected:
            expect_equal(got[k], expected[k], f"{what}[{k!r}]")
        return
    if got != expected:
        fail(f"{what}: expected {_fmt(expected)}, got {_fmt(got)}")


def _short(seq, n: int = 8) -> str:
    items = list(seq)
    body = ", ".join(_fmt(x) for x in items[:n])
    return f"[{body}{', ...' if len(items) > n else ''}]"


def _as_numpy(x: Any):
    import numpy as np
    try:
        import torch
        if isinstance(x, torch.Tensor):
            return x.detach().to("cpu", dtype=torch.float64).numpy()
    except ImportError:
        pass
    return np.asarray(x, dtype=np.float64)


def expect_close(got: Any, expected: Any, what: str = "result", rtol: float = 1e-5, atol: float = 1e-8) -> None:
    """Numerical closeness for scalars, arrays and tensors: shape first, then NaN/Inf, then values.

    On a mismatch, names the first mismatching index, expected vs got there, how many elements differ and the
    largest absolute error.
    """
    import numpy as np
    if got is None:
        fail(f"{what}: got None -- did the function forget to return its result?")
    if (not hasattr(expected, "shape") and not isinstance(expected, (list, tuple))) or (
            getattr(expected, "shape", None) == () and getattr(got, "shape", ()) == ()):
        try:
            g, e = float(got), float(expected)
        except (TypeError, ValueError):
            fail(f"{what}: expected a number like {_fmt(expected)}, got {type(got).__name__} {_fmt(got)}")
        if math.isnan(g) and not math.isnan(e):
            fail(f"{what}: got NaN, expected {_fmt(e)}")
        if not math.isclose(g, e, rel_tol=rtol, abs_tol=atol):
            rel = abs(g - e) / abs(e) if e else float("inf")
            fail(f"{what}: expected {_fmt(e)}, got {_fmt(g)} (relative error {rel:.3g}, allowed {rtol:g})")
        return
    g, e = _as_numpy(got), _as_numpy(expected)
    if g.shape != e.shape:
        fail(f"{what}: shape: expected {tuple(e.shape)}, got {tuple(g.shape)}")
    bad_nan = np.isnan(g) & ~np.isnan(e)
    if bad_nan.any():
        idx = tuple(int(i) for i in np.argwhere(bad_nan)[0])
        fail(f"{what}: NaN at index {idx} ({int(bad_nan.sum())} NaNs in all) where {_fmt(float(e[idx]))} "
             f"was expected")
    close = np.isclose(g, e, rtol=rtol, atol=atol, equal_nan=True)
    if not close.all():
        idx = tuple(int(i) for i in np.argwhere(~close)[0])
        err = np.abs(g - e)
        fail(f"{what}: {int((~close).sum())} of {close.size} elements differ; first at index {idx}: expected "
             f"{_fmt(float(e[idx]))}, got {_fmt(float(g[idx]))}; largest abs error {float(np.nanmax(err)):.3g} "
             f"(rtol {rtol:g}, atol {atol:g})")


def verify(got: Any, expected: Any, what: str = "result", rtol: float = 1e-5, atol: float = 1e-8) -> None:
    """Verify before timing: a kernel's result against a reference (in higher precision); a mismatch raises
    CheckFailed naming the first differing element (FAIL ... in a notebook), a match prints one line."""
    expect_close(got, expected, what, rtol=rtol, atol=atol)
    print(f"verified: {what} matches its reference")


def install_notebook_handler() -> None:
    """In IPython: a failed check prints its verdict (FAIL ...) and the cell goes on, so Run All reaches the
    progress cell; a CheckFailed raised anyway (a learner's own expect()) shows as its message alone."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    ip = get_ipython()
    if ip is None:
        return

    def handler(shell, etype, value, tb, tb_offset=None):
        text = f"FAIL {value}"
        shell._showtraceback(etype, value, [text])
        return [text]

    global _print_failures
    _print_failures = True
    ip.set_custom_exc((CheckFailed,), handler)
