"""One conversation between the grader and a sandboxed kernel: JSON messages, requests that wait for their reply
while answering the other side's requests (a learner's function may call back into the grader, which may call it
again), and a deadline.

A request carries "op" and "id"; its reply carries "re" (the id). Anything else that arrives while waiting goes to
`on_other` (the runner's cell events, stray messages). Both sides use the same class over different transports: a
socket inside the sandbox, the runner's pipes on the grader's side, or two objects in one process (tests).
"""
from __future__ import annotations

import itertools
import json
import time

MAX_LINE = 64 << 20  # one message; a longer line is refused, not buffered


class ChannelClosed(EOFError):
    """The other side went away (the sandbox ended, or the grader did)."""


class JudgeTimeout(BaseException):
    """The deadline of a check passed while waiting for the learner's code (a BaseException, so that no checker's
    `except Exception` mistakes it for the learner's error)."""


def dumps(msg: dict) -> bytes:
    return json.dumps(msg, separators=(",", ":"), allow_nan=False).encode() + b"\n"


def loads(line: bytes) -> dict | None:
    """A message, or None for a line that is not one (a channel ignores it)."""
    try:
        msg = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return msg if isinstance(msg, dict) else None


class Endpoint:
    """send(msg) and recv(timeout) -> msg (None on timeout; ChannelClosed at the end) make a channel;
    handlers = {op: function(msg) -> reply dict} answer the other side's requests."""

    def __init__(self, send, recv, handlers=None, on_other=None):
        self.send, self.recv = send, recv
        self.handlers = dict(handlers or {})
        self.on_other = on_other or (lambda msg: None)
        self._ids = itertools.count(1)
        self.deadline: float | None = None

    def request(self, msg: dict) -> dict:
        """Send `msg` and return its reply, answering requests that come meanwhile."""
        msg = dict(msg, id=next(self._ids))
        self.send(msg)
        while True:
            got = self.next_message()
            if got.get("re") == msg["id"]:
                return got
            self.dispatch(got)

    def next_message(self) -> dict:
        while True:
            wait = None if self.deadline is None else self.deadline - time.monotonic()
            if wait is not None and wait <= 0:
                raise JudgeTimeout()
            got = self.recv(wait)
            if got is not None:
                return got

    def dispatch(self, msg: dict) -> None:
        """Answer a request of the other side, or pass the message to on_other."""
        handler = self.handlers.get(msg.get("op")) if "re" not in msg else None
        if handler is None:
            self.on_other(msg)
            return
        try:
            reply = handler(msg)
        except JudgeTimeout:
            raise
        except Exception as exc:  # a malformed request: say so to the other side, keep going
            reply = {"error": {"type": "ProtocolError", "module": "", "message": f"{type(exc).__name__}: {exc}"[:500],
                               "where": ""}}
        if "id" in msg:
            self.send(dict(reply, re=msg["id"]))


class Handles:
    """The grader's objects (callables, iterators, anything not data) that the kernel may use by number."""

    def __init__(self):
        self.objects: dict[int, object] = {}
        self._ids: dict[int, int] = {}

    def add(self, obj) -> int:
        key = self._ids.get(id(obj))
        if key is None or self.objects.get(key) is not obj:
            key = len(self.objects) + 1
            self.objects[key] = obj
            self._ids[id(obj)] = key
        return key

    def get(self, key):
        if int(key) not in self.objects:
            raise KeyError(f"no object number {key}")
        return self.objects[int(key)]
