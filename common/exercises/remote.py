"""The kernel's side of grading: a check cell sends its exercise to the grader, which judges it in its own process.

Inside a sandboxed kernel the grader's runner calls `install(socket_path)` before the learner's first cell. From then
on a check cell (`check_x(my_fn)`) does not judge itself: it tells the grader which exercise it is, and answers the
grader's requests -- call my_fn on these arguments -- until the grader sends the verdict, which the cell prints as
usual (so `ready()` works). The grader's pristine checker draws the cases, compares, and keeps its own record: what
this kernel believes about its verdicts is never read. For exercises that only the kernel can judge (they time the
learner's code, or watch Triton launches) the grader answers "judge here" and marks the verdict as judged in the
learner's kernel.

`loopback(fn)` runs the same conversation inside one process (no sandbox), for tests of the wire format.
"""
from __future__ import annotations

import importlib
import socket

from common.core import checks
from common.core.grading import codec
from common.core.grading.channel import MAX_LINE, Endpoint, dumps, loads
from common.core.grading.remote import RemoteFunction, describe_exception, exception_from
from common.exercises.cases import Streamed, _reference_name, watched

_state: dict = {"endpoint": None, "submitted": ((), {})}


def install(path: str) -> None:
    """Connect to the grader's runner at `path` and route every check through it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    reader = sock.makefile("rb")

    def recv(timeout):
        line = reader.readline(MAX_LINE)
        if not line:
            raise EOFError("the grader closed the channel")
        return loads(line)

    _state["endpoint"] = Endpoint(lambda msg: sock.sendall(dumps(msg)), recv, {"call": _call})
    checks.submission_hook = _submit


def _describe(arg):
    if callable(arg) and not isinstance(arg, type):
        return {"$": "learner_fn", "name": str(getattr(arg, "__name__", "fn"))[:100]}
    return codec.encode(arg, strict=False)


def _submit(exercise, title, args, kwargs, judge_here):
    endpoint = _state["endpoint"]
    _state["submitted"] = (tuple(args), dict(kwargs))
    reply = endpoint.request({"op": "judge", "exercise": exercise, "args": [_describe(a) for a in args],
                              "kwargs": {k: _describe(v) for k, v in kwargs.items()}})
    if reply.get("judge_here"):
        verdict = judge_here()
        endpoint.request({"op": "kernel_verdict", "exercise": exercise, "status": verdict.status,
                          "detail": verdict.detail})
        return verdict
    status = reply.get("status")
    if status not in (checks.PASSED, checks.FAILED, checks.NOT_ATTEMPTED):
        return checks.Verdict(exercise, title, checks.FAILED, f"the grader could not judge this check: "
                                                              f"{reply.get('detail', reply)}")
    return checks.Verdict(exercise, title, status, str(reply.get("detail", "")))


def _resolve(spec: dict):
    module = importlib.import_module(str(spec["module"]))
    if spec.get("kind") == "function":  # a function, or a method or property getter by its qualified name
        obj = module
        for part in str(spec["name"]).split("."):
            obj = getattr(obj, part) if not isinstance(obj, type) else obj.__dict__.get(part, getattr(obj, part))
        return obj.fget if isinstance(obj, property) else obj
    return module, str(spec["name"])


def _call(msg: dict) -> dict:
    """Call the submitted learner function on the grader's arguments; report the result and the side effects."""
    endpoint = _state["endpoint"]
    args, kwargs = _state["submitted"]
    key = msg["arg"]
    fn = args[int(key)] if isinstance(key, int) else kwargs[str(key)]
    stubs = _Stubs(endpoint)
    call_args = codec.decode(msg.get("args", []), stubs)
    call_kwargs = codec.decode(msg.get("kwargs", {}), stubs)
    refs = [_resolve(spec) for spec in msg.get("refs", [])]
    itself = next((_reference_name(r) for r in refs if fn is (getattr(*r) if isinstance(r, tuple) else r)), None)
    before = [dumps({"v": codec.encode(a, strict=False)}) for a in call_args]
    before_kw = {k: dumps({"v": codec.encode(v, strict=False)}) for k, v in call_kwargs.items()}
    reply: dict = {"itself": itself}
    allowed = msg.get("allowed")
    with watched(refs, [str(a)[:200] for a in allowed or []][:50], library=allowed is not None) as called:
        try:
            result = fn(*call_args, **call_kwargs)
            reply["ok"] = True
        except (Exception, SystemExit) as exc:  # KeyboardInterrupt (the cell's time limit) ends the cell
            reply.update(ok=False, error=describe_exception(exc))
    reply["called"] = list(called)
    mutated = []
    for i, a in enumerate(call_args):
        now = codec.encode(a, strict=False)
        if dumps({"v": now}) != before[i]:
            mutated.append([["args", i], now])
    for k, v in call_kwargs.items():
        now = codec.encode(v, strict=False)
        if dumps({"v": now}) != before_kw[k]:
            mutated.append([["kwargs", k], now])
    reply["mutated"] = mutated
    if reply["ok"]:
        alias = next((i for i, a in enumerate(call_args) if result is a and not isinstance(a, (int, float, str,
                                                                                               bool, type(None)))),
                     None)
        if alias is not None:
            reply["alias"] = alias
        else:
            reply["result"] = codec.encode(result, strict=False)
    return reply


class _Stubs:
    """Stand-ins, in the kernel, for the grader's objects among the arguments: a function for a callable, an
    iterator for an iterator, a proxy (calls, attributes, items, len, iteration) for anything else."""

    def __init__(self, endpoint):
        self.endpoint = endpoint

    def __call__(self, kind, key, name):
        if kind == "iterator":
            return _RemoteIterator(self, key)
        if kind == "stream":  # blocks through one buffer, here as in the grader (cases.Streamed)
            return Streamed(_RemoteIterator(self, key))
        if kind == "callable":
            def callback(*a, **k):
                return self.ask(key, "call", args=codec.encode(list(a), strict=False), kwargs=codec.encode(k, strict=False))
            callback.__name__ = callback.__qualname__ = name or "callback"
            return callback
        return _RemoteObject(self, key, name)

    def ask(self, key, do, **fields):
        reply = self.endpoint.request({"op": "obj", "h": key, "do": do, **fields})
        if not reply.get("ok"):
            raise exception_from(reply.get("error") or {})
        if reply.get("stop"):
            raise StopIteration
        return codec.decode(reply.get("result"), self)


class _RemoteIterator:
    def __init__(self, stubs, key):
        self._stubs, self._key = stubs, key

    def __iter__(self):
        return self

    def __next__(self):
        return self._stubs.ask(self._key, "next")


class _RemoteObject:
    """One of the grader's objects (e.g. a checker's wrapper that counts calls), used from the kernel."""

    def __init__(self, stubs, key, name):
        object.__setattr__(self, "_stubs", stubs)
        object.__setattr__(self, "_key", key)
        object.__setattr__(self, "_name", name)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return self._stubs.ask(self._key, "getattr", name=name)

    def __call__(self, *a, **k):
        return self._stubs.ask(self._key, "call", args=codec.encode(list(a), strict=False),
                               kwargs=codec.encode(k, strict=False))

    def __getitem__(self, key):
        return self._stubs.ask(self._key, "getitem", key=codec.encode(key, strict=False))

    def __len__(self):
        return self._stubs.ask(self._key, "len")

    def __bool__(self):  # else Python asks __len__, which a random.Random has not
        return self._stubs.ask(self._key, "bool")

    def __iter__(self):
        return self._stubs.ask(self._key, "iter")

    def __contains__(self, key):
        return self._stubs.ask(self._key, "contains", key=codec.encode(key, strict=False))

    def __repr__(self):
        return f"<{self._name} (the grader's)>"


def loopback(exercise: str, args: tuple, kwargs: dict | None = None):
    """The grader's verdict on a check's arguments (the learner's functions among them) for `exercise`, every call
    going through the wire format in this process (encode, decode, call, encode, decode), as it would with the
    learner's kernel in a sandbox."""
    kwargs = dict(kwargs or {})
    to_kernel, to_grader = [], []
    kernel = Endpoint(lambda m: to_grader.append(loads(dumps(m))), None, {"call": _call})
    grader = Endpoint(lambda m: to_kernel.append(loads(dumps(m))), None)

    def receiver(inbox, peer, peer_inbox):
        def recv(timeout):
            while not inbox:  # let the other side work until it has said something
                if not peer_inbox:
                    raise RuntimeError("loopback: both sides are waiting")
                peer.dispatch(peer_inbox.pop(0))
            return inbox.pop(0)
        return recv

    kernel.recv = receiver(to_kernel, grader, to_grader)
    grader.recv = receiver(to_grader, kernel, to_kernel)

    def stand_in(key, value):
        if callable(value) and not isinstance(value, type):
            return RemoteFunction(grader, key, getattr(value, "__name__", "fn"))
        return codec.decode(loads(dumps({"v": codec.encode(value)}))["v"])

    saved = dict(_state)
    _state.update(endpoint=kernel, submitted=(tuple(args), kwargs))
    try:
        return checks.judge(exercise, *(stand_in(i, a) for i, a in enumerate(args)),
                            **{k: stand_in(k, v) for k, v in kwargs.items()})
    finally:
        _state.update(saved)


NOT_SENT: dict[str, str] = {}  # exercise: why, for checkers that loopback_hook had to judge locally


def loopback_hook(exercise, title, args, kwargs, judge_here):
    """checks.submission_hook for tests (WORKBOOK_LOOPBACK=1): every check judged as the grader would judge it."""
    if exercise in checks.judged_in_kernel():
        return judge_here()
    try:
        return loopback(exercise, args, kwargs)
    except codec.NotSendable as exc:
        NOT_SENT[exercise] = str(exc)
        return judge_here()
