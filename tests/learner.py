"""Test helper: a learner's own copy of a reference function.

A checker catches a call to the workbook's reference (by its code object, whatever name it is imported under). A
test that needs a right answer which is not the reference itself uses `own_copy(reference)`: the same logic in a
function with its own code object, as a learner who wrote the same code would have.
"""
import functools
import types


def own_copy(fn):
    """fn's logic in a new function with its own code object (named learner_<name>), so reference watching does not
    see it as the reference."""
    code = fn.__code__.replace(co_name=f"learner_{fn.__name__}")
    copy = types.FunctionType(code, fn.__globals__, f"learner_{fn.__name__}", fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    return functools.update_wrapper(copy, fn, assigned=("__doc__", "__module__"), updated=())
