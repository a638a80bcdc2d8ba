"""Ordered, batched point-to-point messages between pipeline ranks (activations forward, gradients back).

Between two ranks, messages are matched in the order the sender sends them -- NCCL requires it, and gloo does it
per tag -- so a receiver that needs message k from a peer first receives (and keeps) the ones before it; it knows
them because it knows the sender's op list (`messages`). As in picotron and DualPipe, every exchange is ONE
`torch.distributed.batch_isend_irecv`: the sends the previous op produced and the receives the next op needs go out
together, so two ranks that send to each other at the same time cannot block one another (under NCCL a lone send
may wait for its receiver, and a pair of them, each waiting, is a deadlock). The op waits only for its receives;
sends are waited for at the end of the step (`flush`). Receive buffers live on the rank's device.

`transport(ops) -> works` does the batch: [("send" | "recv", peer, tensor), ...] in, one work per op out (or one
for the whole batch, as NCCL coalesces). `torch_transport` is the real one; a test may pass another.
"""
from __future__ import annotations

import time


def messages(schedule, dev: int) -> list:
    """The messages device `dev` sends, in its order: (destination, (kind, direction, stage, micro_batch)) with kind
    "act" (a forward's output, for stage + 1) or "grad" (an input gradient, for stage - 1); local hand-offs (both
    stages on `dev`) left out."""
    out = []
    for op in schedule.ops[dev]:
        for kind, d, s, j in op:
            if kind == "F" and s < schedule.stages - 1:
                dst, msg = schedule.placement[(d, s + 1)], ("act", d, s, j)
            elif kind in ("B", "Bi") and s > 0:
                dst, msg = schedule.placement[(d, s - 1)], ("grad", d, s, j)
            else:
                continue
            if dst != dev:
                out.append((dst, msg))
    return out


def torch_transport(ops: list, group=None) -> list:
    import torch.distributed as dist
    p2p = [dist.P2POp(dist.isend if kind == "send" else dist.irecv, t, peer, group) for kind, peer, t in ops]
    return dist.batch_isend_irecv(p2p) if p2p else []


class PointToPoint:
    """One rank's messages in one step. `send(dst, key, tensor)` queues; `receive(needs)` sends what is queued and
    receives what `needs` ([(source, key)]) asks for -- and every earlier message of those sources -- in one batch,
    waits for the receives only, and returns the tensors in the order of `needs`; `flush()` ends the step.
    `wait_s` adds up the time spent waiting for receives."""

    def __init__(self, schedule, rank: int, shape, device, transport=torch_transport):
        self.rank, self.shape, self.device, self.transport = rank, shape, device, transport
        self.order = {src: [m for dst, m in messages(schedule, src) if dst == rank]
                      for src in range(len(schedule.ops)) if src != rank}
        self.posted = dict.fromkeys(self.order, 0)  # messages of each source already asked for
        self.inbox: dict = {}   # key -> tensor (received, or handed over locally)
        self.queued: list = []  # ("send", dst, tensor) not yet sent
        self.sending: list = []  # (work, tensor) of sends in flight
        self.wait_s = 0.0

    def send(self, dst: int, key, tensor) -> None:
        if dst == self.rank:
            self.inbox[key] = tensor
        else:
            self.queued.append(("send", dst, tensor))

    def receive(self, needs: list) -> list:
        import torch
        recvs = []
        for src, key in needs:
            if src == self.rank or key in self.inbox:
                continue
            upto = self.order[src].index(key)
            while self.posted[src] <= upto:  # in the sender's order: the earlier messages first
                buf = torch.empty(self.shape, device=self.device)
                recvs.append((self.order[src][self.posted[src]], buf))
                self.queued.append(("recv", src, buf))
                self.posted[src] += 1
        self._post()
        t0 = time.perf_counter()
        for work in self._recv_works:
            work.wait()
        self.wait_s += time.perf_counter() - t0
        self.inbox.update(recvs)
        return [self.inbox.pop(key) for _, key in needs]

    def _post(self) -> None:
        ops, self.queued = self.queued, []
        works = self.transport(ops) if ops else []
        self._recv_works = []
        if len(works) == len(ops):  # one work per op (gloo): wait for the receives now, the sends at the end
            for work, (kind, _, t) in zip(works, ops):
                (self.sending.append((work, t)) if kind == "send" else self._recv_works.append(work))
        else:  # one work for the whole batch (NCCL coalesces): the receives come with the sends
            self.sending += [(work, ops) for work in works]
            self._recv_works = works

    def flush(self) -> None:
        """Send what is still queued and wait for every send (the end of a step)."""
        self._post()
        for work, _ in self.sending:
            work.wait()
        self.sending = []
        if self.inbox or any(self.posted[s] != len(o) for s, o in self.order.items()):
            raise RuntimeError(f"rank {self.rank}: messages left over after the step: {sorted(self.inbox)}")
