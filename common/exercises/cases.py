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


def learner_call(fn, args: tuple, call: str):
    """fn(*args); an exception other than NotImplementedError becomes a verdict naming `call`."""
    try:
        return fn(*args)
    except NotImplementedError:
        raise
    except Exception as exc:
        raise CheckFailed(f"{call}: {_learner_error(exc)}") from exc


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
