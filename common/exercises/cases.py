"""What every checker's random cases share: a fresh seed per call, printed in a failure, and learner calls that
report a crash or a wrong return type as a verdict naming the call.

    with fresh_cases() as cases:          # a new seed each call; a CheckFailed inside gets "(random cases: seed N)"
        x = torch.randn(4, generator=cases.gen); n = cases.rng.randint(1, 9)
        got = learner_call(fn, (x, n), f"fn(x [4], {n})")   # crash -> CheckFailed naming the call
"""
from __future__ import annotations

import contextlib
import random
import secrets
from dataclasses import dataclass

import torch

from common.checks import CheckFailed, _learner_error


@dataclass
class Cases:
    seed: int
    rng: random.Random
    gen: torch.Generator


@contextlib.contextmanager
def fresh_cases(seed: int | None = None):
    """Random cases from a new seed (or `seed`, to reproduce a failure); the seed is appended to a failure."""
    seed = secrets.randbits(31) if seed is None else int(seed)
    cases = Cases(seed, random.Random(seed), torch.Generator().manual_seed(seed))
    try:
        yield cases
    except CheckFailed as exc:
        raise CheckFailed(f"{exc} (random cases: seed {seed})") from None


def learner_call(fn, args: tuple, call: str, references: tuple = ()):
    """fn(*args); an exception other than NotImplementedError becomes a verdict naming `call`.

    `references`: (module, name) pairs of the `common` functions this exercise asks the learner to write; a call
    to one of them (through its module, e.g. `moe.deepseek_v3_gate`) is caught and named.
    """
    called: list[str] = []
    saved = [(module, name, getattr(module, name)) for module, name in references]
    for module, name, original in saved:
        if fn is original:
            raise CheckFailed(f"{call}: you passed {module.__name__}.{name} itself, the reference this exercise "
                              f"asks you to write; write it yourself")

    def spy(module, name, original):
        def wrapper(*a, **kw):
            called.append(f"{module.__name__}.{name}")
            return original(*a, **kw)
        return wrapper

    for module, name, original in saved:
        setattr(module, name, spy(module, name, original))
    try:
        result = fn(*args)
    except NotImplementedError:
        raise
    except Exception as exc:
        raise CheckFailed(f"{call}: {_learner_error(exc)}") from exc
    finally:
        for module, name, original in saved:
            setattr(module, name, original)
    if called:
        raise CheckFailed(f"{call} called {called[0]}, the reference this exercise asks you to write; write it "
                          f"yourself (torch and math built-ins are fine)")
    return result


def as_number(got, call: str, what: str = "a number") -> float:
    """float(got), or a verdict saying what came back instead."""
    if got is None:
        raise CheckFailed(f"{call} returned None -- return {what}")
    try:
        if isinstance(got, (str, bytes)):
            raise TypeError
        return float(got)
    except (TypeError, ValueError, RuntimeError):
        raise CheckFailed(f"{call} returned {type(got).__name__} {got!r:.80}; expected {what}") from None


def digits(x: float) -> str:
    """A float with enough digits to show a difference that %.6g hides."""
    return f"{float(x):.17g}"


def expect_number(got: float, expected: float, what: str, rtol: float, atol: float = 0.0) -> None:
    """Scalar closeness, printed with enough digits to show the difference (checks.expect_close prints 6)."""
    import math
    if not math.isclose(float(got), float(expected), rel_tol=rtol, abs_tol=atol):
        rel = abs(got - expected) / abs(expected) if expected else float("inf")
        raise CheckFailed(f"{what}: expected {digits(expected)}, got {digits(got)} (relative error {rel:.3g}, "
                          f"allowed {rtol:g})")
