"""Point-to-point under NCCL's rules, for ranks that are threads of this process (a test transport for the pipeline
executor and the learner's ring all-reduce; gloo buffers sends and hides what these rules catch):

- a send completes only once its peer has posted the matching receive, and a receive once its peer has posted the
  matching send (no buffering); messages between two ranks match in the order each posted them;
- a `batch_isend_irecv` batch is ONE work: it completes when every send and receive in it has, and `wait()` on it
  waits for all of them;
- one stream per rank: a rank's batches run one after the other, so a batch's operations are posted (can match)
  only once every earlier batch of that rank has completed.

`Rendezvous(ranks).transport(rank)` is that rank's transport for `p2p.PointToPoint` (ops in, one work out);
`ThreadDist(rendezvous, rank)` is what a thread-rank sees as `torch.distributed` (isend, irecv, P2POp,
batch_isend_irecv; a collective is refused), and `run_threads(fn, ranks)` runs fn(rank, dist) on threads -- lab 07's
checker runs the learner's ring all-reduce so. `log` keeps every message as it was matched. A wait that cannot complete within `timeout`
seconds raises `Hang`, naming what every rank is stuck on -- a deadlock under NCCL becomes a clear failure, not a
hung test -- and every other rank's wait fails at once after it.
"""
from __future__ import annotations

import threading
import time
from collections import defaultdict, deque


class Hang(RuntimeError):
    """Ranks wait on each other: under NCCL's rules this run would hang."""


class _Op:
    def __init__(self, batch, kind, rank, peer, tensor, tag):
        self.batch, self.kind, self.rank, self.peer, self.tensor, self.tag = batch, kind, rank, peer, tensor, tag
        self.done = False

    def __repr__(self):
        tag = f" {self.tag}" if self.tag is not None else ""
        return f"send{tag} to rank {self.peer}" if self.kind == "send" else f"receive{tag} from rank {self.peer}"


class _Batch:
    def __init__(self, rendezvous, rank):
        self.rendezvous, self.rank, self.ops, self.done, self.posted = rendezvous, rank, [], False, False

    def wait(self, timeout=None):
        self.rendezvous._wait(self)
        return True

    def is_completed(self):
        return self.done


class Rendezvous:
    """The wire between `ranks` thread-ranks, with NCCL's matching rules (see the module's docstring)."""

    def __init__(self, ranks: int, timeout: float = 20.0):
        self.ranks, self.timeout = ranks, timeout
        self.cv = threading.Condition()
        self.streams = {r: deque() for r in range(ranks)}
        self.sends = defaultdict(deque)  # (src, dst) -> posted, unmatched sends
        self.recvs = defaultdict(deque)  # (src, dst) -> posted, unmatched receives
        self.hang: str | None = None
        self.mismatch = None  # (send, receive) matched with different shapes or dtypes
        self.batches = 0
        self.log: list = []  # every message as matched: (source, destination, a copy of the tensor, tag)

    def transport(self, rank: int):
        """`ops` -> [one work]: [("send" | "recv", peer, tensor), ...] (an optional 4th item tags the message)."""
        def batch(ops):
            return [self.submit(rank, ops)] if ops else []
        return batch

    def submit(self, rank: int, ops) -> _Batch:
        with self.cv:
            b = _Batch(self, rank)
            for op in ops:
                kind, peer, tensor, tag = (*op, None)[:4]
                if kind not in ("send", "recv") or not isinstance(peer, int) or not 0 <= peer < self.ranks \
                        or peer == rank:
                    raise ValueError(f"rank {rank}: bad point-to-point op ({kind!r}, peer {peer}); "
                                     f"allowed: 'send' or 'recv' to another of ranks 0..{self.ranks - 1}")
                b.ops.append(_Op(b, kind, rank, peer, tensor, tag))
            self.batches += 1
            self.streams[rank].append(b)
            self._progress()
            return b

    def _progress(self) -> None:
        changed = True
        while changed:
            changed = False
            for r, stream in self.streams.items():
                while stream and stream[0].done:
                    stream.popleft()
                if stream and not stream[0].posted:  # the head of the rank's stream is the one that runs
                    head = stream[0]
                    head.posted = True
                    for op in head.ops:
                        key = (r, op.peer) if op.kind == "send" else (op.peer, r)
                        (self.sends if op.kind == "send" else self.recvs)[key].append(op)
                    changed = True
            for key in list(self.sends):
                sends, recvs = self.sends[key], self.recvs[key]
                while sends and recvs:
                    s, rv = sends.popleft(), recvs.popleft()
                    if tuple(s.tensor.shape) != tuple(rv.tensor.shape) or s.tensor.dtype != rv.tensor.dtype:
                        self.mismatch = (s, rv)
                        self.hang = (f"rank {s.rank} sent a {s.tensor.dtype} {tuple(s.tensor.shape)} tensor "
                                     f"({s.tag}) where rank {rv.rank} posted a receive of a {rv.tensor.dtype} "
                                     f"{tuple(rv.tensor.shape)} tensor ({rv.tag}): messages between two ranks match "
                                     f"in the order they are posted")
                        self.cv.notify_all()
                        return
                    rv.tensor.copy_(s.tensor)
                    self.log.append((s.rank, rv.rank, s.tensor.detach().clone(), s.tag))
                    s.done = rv.done = True
                    changed = True
            for stream in self.streams.values():
                if stream and stream[0].posted and not stream[0].done and all(op.done for op in stream[0].ops):
                    stream[0].done = True
                    changed = True
        self.cv.notify_all()

    def _wait(self, batch: _Batch) -> None:
        deadline = time.monotonic() + self.timeout
        with self.cv:
            while not batch.done:
                if self.hang:
                    raise Hang(self.hang)
                left = deadline - time.monotonic()
                if left <= 0:
                    self.hang = self.describe(batch.rank)
                    self.cv.notify_all()
                    raise Hang(self.hang)
                self.cv.wait(min(left, 0.5))

    def describe(self, rank: int) -> str:
        """What each rank's running batch still waits for."""
        lines = [f"rank {rank} waited {self.timeout:g} s; under NCCL's rules the ranks wait on each other:"]
        for r, stream in self.streams.items():
            head = next((b for b in stream if not b.done), None)
            if head is None:
                lines.append(f"  rank {r}: nothing pending")
                continue
            pending = [op for op in head.ops if not op.done]
            later = sum(1 for b in stream if b is not head and not b.done)
            lines.append(f"  rank {r}: its batch waits to " + ", ".join(map(repr, pending))
                         + (f" (peer has posted no match)" if pending else "")
                         + (f"; {later} later batch(es) queued behind it" if later else ""))
        return "\n".join(lines)


class P2POp:
    """torch.distributed.P2POp for `ThreadDist`: op is that rank's `dist.isend` or `dist.irecv`."""

    def __init__(self, op, tensor, peer, group=None, tag=0):
        self.op, self.tensor, self.peer, self.group, self.tag = op, tensor, peer, group, tag


class NotPointToPoint(RuntimeError):
    """A collective was called where only point-to-point operations are allowed."""


class ThreadDist:
    """What a thread-rank sees as `torch.distributed`: get_rank, get_world_size, isend, irecv, send, recv, P2POp and
    batch_isend_irecv, over a `Rendezvous` (NCCL's rules); any collective raises NotPointToPoint."""
    P2POp = P2POp

    def __init__(self, rendezvous: Rendezvous, rank: int):
        self._r, self._rank = rendezvous, rank

    def get_rank(self, group=None) -> int:
        return self._rank

    def get_world_size(self, group=None) -> int:
        return self._r.ranks

    def isend(self, tensor, dst, group=None, tag=0):
        return self._r.submit(self._rank, [("send", dst, tensor)])

    def irecv(self, tensor, src=None, group=None, tag=0):
        return self._r.submit(self._rank, [("recv", src, tensor)])

    def send(self, tensor, dst, group=None, tag=0) -> None:
        self.isend(tensor, dst).wait()

    def recv(self, tensor, src=None, group=None, tag=0) -> int:
        self.irecv(tensor, src).wait()
        return src

    def batch_isend_irecv(self, ops) -> list:
        batch = []
        for op in ops:
            if not isinstance(op, P2POp) or op.op not in (self.isend, self.irecv):
                raise ValueError(f"batch_isend_irecv takes dist.P2POp(dist.isend or dist.irecv, tensor, peer); "
                                 f"got {op!r}")
            batch.append(("send" if op.op == self.isend else "recv", op.peer, op.tensor))
        return [self._r.submit(self._rank, batch)] if batch else []

    def __getattr__(self, name):
        raise NotPointToPoint(f"dist.{name}: only point-to-point operations here (isend, irecv, send, recv, P2POp, "
                              f"batch_isend_irecv)")


def run_threads(fn, ranks: int, timeout: float = 10.0, wire: Rendezvous | None = None) -> tuple:
    """fn(rank, dist) on `ranks` threads, each with its `ThreadDist` over one `Rendezvous` (`wire`, or a new one):
    (results by rank, the rendezvous -- its `log` holds every message as matched). After every thread has ended,
    the first exception raised in any rank is raised (a `Hang`, or what the others then hang on)."""
    import threading
    wire = wire or Rendezvous(ranks, timeout)
    out, errors = [None] * ranks, []

    def one(r):
        try:
            out[r] = fn(r, ThreadDist(wire, r))
        except BaseException as exc:  # noqa: BLE001 (raised in the calling thread)
            with wire.cv:  # the others must not wait for this rank any more
                errors.append(exc)
                wire.hang = wire.hang or f"rank {r} raised {type(exc).__name__}: {exc}"
                wire.cv.notify_all()

    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 30)
    if errors:
        raise errors[0]
    return out, wire
