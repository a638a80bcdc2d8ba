"""How lab 14's checkers call the learner's function: `learner_call` with the library watch on (the workbook's
kernels, moe, parallel and systems code is refused unless the exercise hands it over: `allowed`), and a watch on the
checker's own code too -- its references and right answers (`_kv_reference`, `decode_variant`, `hit_right`, ...)
live in `common.exercises`, which the library watch does not cover, and a notebook can import them.

Locally a call into the checker's code counts only when the caller is outside `common/` (the named wrong answers
defined in `common.exercises` build on the same helpers); in the grader's sandbox, where no code of `common` runs on
the learner's behalf, they are watched as references."""
from __future__ import annotations

import functools
import importlib
import sys

from common.core.checks import fail
from common.exercises.cases import COMMON, _reference_name, _remote, learner_call, refused

MODULES = ("common.exercises.lab14", "common.exercises.lab14_cases.decode_cases",
           "common.exercises.lab14_cases.mla_cases", "common.exercises.lab14_cases.prefix_cases",
           "common.exercises.lab14_cases.scheduler_cases", "common.exercises.lab14_cases.warmup_cases")


@functools.lru_cache(maxsize=None)
def checker_code() -> tuple:
    """The named functions and methods defined in lab 14's checker modules (this one excepted)."""
    out = []
    for name in MODULES:
        module = importlib.import_module(name)
        for obj in vars(module).values():
            members = vars(obj).values() if isinstance(obj, type) and obj.__module__ == name else (obj,)
            for f in members:
                f = getattr(f, "fget", f)
                code = getattr(f, "__code__", None)
                if code is not None and code.co_filename == module.__file__ and "<" not in f.__qualname__:
                    out.append(f)
    return tuple(out)


def call(fn, args: tuple, where: str, references=(), allowed=()):
    """fn(*args) as `learner_call` does it, refusing the references, the workbook's library (but `allowed`) and the
    checker's own code, with a verdict that says what was called."""
    references = tuple(references)
    own = checker_code()
    used: set = set()
    for ref in references + own:
        if fn is (getattr(*ref) if isinstance(ref, tuple) else ref):
            fail(f"{where} called {_reference_name(ref)}, the reference this exercise asks you to write (you passed "
                 f"it itself); write it yourself")
    if _remote(fn) is not None:
        got = learner_call(fn, args, where, references + own, used=used, allowed=allowed, library=True)
    else:
        seen: list = []
        codes = {f.__code__: _reference_name(f) for f in own}
        functions = {f.__code__ for f in own if "." not in f.__qualname__}   # a partial of one: called from spied

        def spied(*a):
            before = sys.getprofile()

            def profile(frame, event, arg):
                if before is not None:
                    before(frame, event, arg)
                if event == "call" and frame.f_code in codes and frame.f_back is not None:
                    caller = frame.f_back.f_code
                    if not caller.co_filename.startswith(COMMON) or (caller is spied.__code__
                                                                      and frame.f_code in functions):
                        seen.append(codes[frame.f_code])
            sys.setprofile(profile)
            try:
                return fn(*a)
            finally:
                sys.setprofile(before)
        got = learner_call(spied, args, where, references, used=used, allowed=allowed, library=True)
        used.update(seen)
    if used:
        names = {_reference_name(r) for r in references}
        ours = {_reference_name(f) for f in own}
        name = min(used, key=lambda n: (n in names, n in ours, n))     # what the learner's code called itself
        if name in ours:
            fail(f"{where} called {name}, the checker's own code (its reference, cases or named mistakes); write "
                 f"it yourself with torch, math and what the exercise hands you")
        raise refused(where, name, references)
    return got
