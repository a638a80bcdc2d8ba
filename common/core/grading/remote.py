"""The grader's side of a learner's function that lives in a sandboxed kernel.

`RemoteFunction` stands in for the learner's function inside a pristine checker running in the grader's process: a
call sends the checker's arguments as data, the kernel calls the learner's function on them, and what comes back is
data again (its result, what it changed in its arguments, which workbook references it called). A callable or an
iterator or any other object among the arguments stays in the grader; the kernel gets a stand-in that asks for its
calls, attributes, items and iteration. An exception of the
learner's code comes back as the same built-in exception type (or a RemoteError named like it) with its message and
the line it came from, so a checker says "your code raised ValueError: ... (at f, line 3: ...)" as it does in a
kernel.
"""
from __future__ import annotations

import builtins

from common.core.grading import codec
from common.core.grading.channel import Handles


class RemoteError(Exception):
    """An exception of the learner's code whose type is not a built-in one."""


def exception_from(error: dict) -> BaseException:
    """The exception an error record describes (built-in types by name, RemoteError subclasses otherwise)."""
    name = str(error.get("type", "Exception"))[:80]
    message = str(error.get("message", ""))[:2000]
    cls = getattr(builtins, name, None) if error.get("module") == "builtins" else None
    exc = None
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            exc = cls(message)
        except Exception:  # a built-in that wants other arguments
            exc = None
    if exc is None:
        safe = "".join(c for c in name if c.isalnum() or c == "_") or "Exception"
        exc = type(safe, (RemoteError,), {})(message)
    exc._remote_where = str(error.get("where", ""))[:400]
    return exc


def describe_exception(exc: BaseException) -> dict:
    """An error record for `exc`: type, module, message and the innermost frame of its traceback."""
    import traceback
    frames = traceback.extract_tb(exc.__traceback__)
    where = getattr(exc, "_remote_where", "") or (
        f"{frames[-1].name}, line {frames[-1].lineno}: {frames[-1].line}" if frames else "")
    return {"type": type(exc).__name__, "module": type(exc).__module__, "message": str(exc)[:2000], "where": where}


def write_back(orig, new) -> None:
    """Make `orig` (a grader-side argument) hold what the learner's code left in its copy `new`."""
    import sys
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(orig, torch.Tensor) and isinstance(new, torch.Tensor):
        with torch.no_grad():
            if orig.shape == new.shape and orig.dtype == new.dtype:
                orig.copy_(new.to(orig.device))
            else:
                orig.data = new.to(orig.device)
        return
    np = sys.modules.get("numpy")
    if np is not None and isinstance(orig, np.ndarray) and isinstance(new, np.ndarray) and orig.shape == new.shape:
        orig[...] = new
        return
    if isinstance(orig, list) and isinstance(new, list):
        if len(orig) == len(new):
            for i, (o, n) in enumerate(zip(orig, new)):
                if _replaceable(o, n):
                    orig[i] = n
                else:
                    write_back(o, n)
        else:
            orig[:] = new
        return
    if isinstance(orig, dict) and isinstance(new, dict):
        for k in list(orig):
            if k not in new:
                del orig[k]
        for k, n in new.items():
            if k in orig and not _replaceable(orig[k], n):
                write_back(orig[k], n)
            else:
                orig[k] = n
        return
    if isinstance(orig, tuple) and isinstance(new, tuple) and len(orig) == len(new):
        for o, n in zip(orig, new):
            write_back(o, n)
        return
    import dataclasses
    if dataclasses.is_dataclass(orig) and type(new) is type(orig) and not orig.__dataclass_params__.frozen:
        for f in dataclasses.fields(orig):       # a mutable dataclass of `common` (a cache's state): field by field
            o, n = getattr(orig, f.name), getattr(new, f.name)
            if _replaceable(o, n):
                setattr(orig, f.name, n)
            else:
                write_back(o, n)


def _replaceable(o, n) -> bool:
    """True when `o` is immutable (a number, a string): the new value replaces it in its container."""
    return isinstance(o, (int, float, complex, str, bytes, type(None))) or type(o) is not type(n)


class RemoteFunction:
    """The learner's function number `index` of the current check, called through `endpoint`."""

    def __init__(self, endpoint, index, name: str = "fn"):
        self.endpoint, self.index = endpoint, index
        self.__name__ = self.__qualname__ = str(name)[:100] or "fn"
        self.handles = Handles()
        self._callback_error: BaseException | None = None
        endpoint.handlers.update(obj=self._object)

    def __repr__(self) -> str:
        return f"<your function {self.__name__} (in the sandbox)>"

    def __call__(self, *args, **kwargs):
        return self.remote_call(args, kwargs)[0]

    def remote_call(self, args: tuple, kwargs: dict | None = None, references=(), allowed=None):
        """(result, names of the references it called -- and, when `allowed` is given (a list, maybe empty), of the
        workbook's library functions it called that `allowed` does not name -- name of the reference it IS or
        None)."""
        kwargs = dict(kwargs or {})
        refs = [_reference_spec(r) for r in references]
        msg = {"op": "call", "arg": self.index, "args": codec.encode(list(args), self.handles),
               "kwargs": codec.encode(kwargs, self.handles), "refs": refs,
               "allowed": None if allowed is None else [str(a)[:200] for a in allowed][:50]}
        self._callback_error = None
        reply = self.endpoint.request(msg)
        for path, value in reply.get("mutated", []):
            where, key = path
            target = args[int(key)] if where == "args" else kwargs.get(str(key))
            write_back(target, codec.decode(value))
        called = [str(c)[:200] for c in reply.get("called", [])][:20]
        itself = reply.get("itself")
        if not reply.get("ok"):
            if self._callback_error is not None:
                raise self._callback_error
            raise exception_from(reply.get("error") or {})
        if "alias" in reply:
            result = args[int(reply["alias"])]
        else:
            result = codec.decode(reply.get("result"), strict_stubs)
        return result, called, (str(itself)[:200] if itself else None)

    def _object(self, msg: dict) -> dict:
        """The kernel uses one of the grader's objects (a callback, an iterator, a checker's wrapper)."""
        obj = self.handles.get(msg["h"])
        do = msg.get("do")
        try:
            if do == "call":
                value = obj(*codec.decode(msg.get("args", []), strict_stubs),
                            **codec.decode(msg.get("kwargs", {}), strict_stubs))
            elif do == "next":
                try:
                    value = next(obj)
                except StopIteration:
                    return {"ok": True, "stop": True}
            elif do == "getattr":
                name = str(msg.get("name", ""))
                if name.startswith("_"):
                    raise AttributeError(f"{type(obj).__name__!r} object has no attribute {name!r} here")
                value = getattr(obj, name)
            elif do == "getitem":
                value = obj[codec.decode(msg.get("key"), strict_stubs)]
            elif do == "len":
                value = len(obj)
            elif do == "bool":  # `rng or random.Random()`: truthiness without __len__
                value = bool(obj)
            elif do == "iter":
                value = iter(obj)
            elif do == "contains":
                value = codec.decode(msg.get("key"), strict_stubs) in obj
            else:
                raise ValueError(f"unknown operation {do!r}")
        except Exception as exc:  # the checker's own object refused: the check ends with its exception
            self._callback_error = exc
            return {"ok": False, "error": describe_exception(exc)}
        return {"ok": True, "result": codec.encode(value, self.handles)}


def strict_stubs(kind, key, name):
    raise ValueError(f"the sandbox sent a {kind}; only data may come back")


def _reference_spec(ref) -> dict:
    """A reference the exercise asks the learner to write, as the kernel can find it again."""
    if isinstance(ref, tuple):
        module, name = ref
        return {"module": module.__name__, "name": name, "kind": "attr"}
    return {"module": ref.__module__, "name": ref.__qualname__, "kind": "function"}
