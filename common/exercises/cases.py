"""What every checker's random cases share: a fresh seed per call, printed in a failure, and learner calls that
report a crash or a wrong return type as a verdict naming the call.

    with fresh_cases() as cases:          # a new seed each call; a CheckFailed inside gets "(random cases: seed N)"
        x = torch.randn(4, generator=cases.gen); n = cases.rng.randint(1, 9)
        got = learner_call(fn, (x, n), f"fn(x [4], {n})")   # crash -> CheckFailed naming the call

The same pieces one at a time: `seeded()` -> (rng, seed) and `with reproducible(seed):`; `call(fn, text, *args)`
(a crash names the call and what it should return); `watched(references)` spies on the reference functions an
exercise asks the learner to write.
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
    for module, name in references:
        if fn is getattr(module, name):
            raise CheckFailed(f"{call}: you passed {module.__name__}.{name} itself, the reference this exercise "
                              f"asks you to write; write it yourself")
    try:
        with watched(references) as called:
            result = fn(*args)
    except NotImplementedError:
        raise
    except Exception as exc:
        raise CheckFailed(f"{call}: {_learner_error(exc)}") from exc
    if called:
        raise CheckFailed(f"{call} called {called[0]}, the reference this exercise asks you to write; write it "
                          f"yourself (torch and math built-ins are fine)")
    return result


def as_number(got, call: str, what: str = "a number", integer: bool = False):
    """float(got) (an int when `integer`), or a verdict saying what came back instead."""
    if got is None:
        raise CheckFailed(f"{call} returned None -- return {what}")
    try:
        if isinstance(got, (str, bytes, bool)):
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
    import math
    if not math.isclose(float(got), float(expected), rel_tol=rtol, abs_tol=atol):
        rel = abs(got - expected) / abs(expected) if expected else float("inf")
        raise CheckFailed(f"{what}: expected {digits(expected)}, got {digits(got)} (relative error {rel:.3g}, "
                          f"allowed {rtol:g})")


def seeded(factory=random.Random):
    """(rng, seed): a fresh seed per call; `factory` is random.Random or numpy.random.default_rng."""
    seed = secrets.randbits(32)
    return factory(seed), seed


@contextlib.contextmanager
def reproducible(seed: int):
    """Add the random cases' seed to a verdict raised in the block."""
    try:
        yield
    except CheckFailed as exc:
        raise CheckFailed(f"{exc} [random cases drawn with seed {seed}]") from None


@contextlib.contextmanager
def watched(references):
    """Replace each (module, name) by a spy while the block runs; yields the list of names that were called."""
    called: list[str] = []
    saved = []
    for module, name in references:
        real = getattr(module, name)

        def spy(*a, _real=real, _name=f"{module.__name__}.{name}", **k):
            called.append(_name)
            return _real(*a, **k)
        saved.append((module, name, real))
        setattr(module, name, spy)
    try:
        yield called
    finally:
        for module, name, real in saved:
            setattr(module, name, real)


def call(fn, text: str, *args, expected: str = "a result", references=()):
    """fn(*args); a crash is reported as `text` raised X (expected: ...), not as the checker's own error.

    `references`: (module, name) pairs of the workbook's own reference for this exercise; a learner's function that
    calls one fails, since the exercise is to write it."""
    try:
        with watched(references) as called:
            out = fn(*args)
    except NotImplementedError:
        raise
    except CheckFailed:
        raise
    except Exception as exc:
        raise CheckFailed(f"{text} should return {expected}; {_learner_error(exc)}") from exc
    if called:
        raise CheckFailed(f"{text} calls {called[0]}, the workbook's reference answer: this exercise is to write it "
                          f"yourself")
    return out
