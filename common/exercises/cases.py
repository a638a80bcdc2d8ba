"""Random cases a learner cannot memorise, and learner calls whose failures say which call was made.

`seeded()` draws a fresh seed per checker call and returns (rng, seed); `with reproducible(seed):` appends the seed
to any verdict raised inside, so the learner can replay the failing cases (`random.Random(seed)`).
`call(fn, text, *args)` runs the learner's function; an exception (other than NotImplementedError, which means "not
attempted") becomes a verdict naming the call, what was expected and what was raised.
"""
from __future__ import annotations

import contextlib
import random
import secrets

from common.checks import CheckFailed, _learner_error


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


def as_number(got, text: str, integer: bool = False):
    """The learner's result as a float (or an int when `integer`), or a verdict saying what came back."""
    if got is None:
        raise CheckFailed(f"{text} returned None -- did the function forget to return its result?")
    if isinstance(got, bool) or not hasattr(got, "__float__"):
        raise CheckFailed(f"{text} returned {type(got).__name__} {got!r}; expected a number")
    value = float(got)
    if integer:
        if not value.is_integer():
            raise CheckFailed(f"{text} returned {got!r}; expected a whole number")
        return int(value)
    return value
