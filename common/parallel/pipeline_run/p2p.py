"""One rank's point-to-point messages in one step, batch by batch as its plan (`plan.RankPlan`) lists them.

`post(k)` sends what the plan's batch k sends (the tensors `put` there) and posts its receives, in ONE
`batch_isend_irecv`; `wait(k)` waits for it (and the batches before it) and files what arrived; `take(key)` hands
a received tensor to the op that needs it; `flush()` ends the step. A tensor for a stage of this same rank is handed
over locally. Receive buffers live on the rank's device.

`transport(ops) -> works` does a batch: [("send" | "recv", peer, tensor), ...] in, one work per op (gloo) or one
for the whole batch (NCCL, and the NCCL-rules test transport `common.parallel.rendezvous`) out. With one work per op
only the receives are waited for before the step's end.
"""
from __future__ import annotations

import time


def torch_transport(ops: list, group=None) -> list:
    import torch.distributed as dist
    p2p = [dist.P2POp(dist.isend if kind == "send" else dist.irecv, t, peer, group) for kind, peer, t, *_ in ops]
    return dist.batch_isend_irecv(p2p) if p2p else []


class PointToPoint:
    """The messages of rank `plan.rank` in one step; `wait_s` adds up the time spent waiting for receives."""

    def __init__(self, plan, shape, device, transport=torch_transport):
        self.plan, self.shape, self.device, self.transport = plan, shape, device, transport
        self.inbox: dict = {}    # key -> tensor: received (waited for), or handed over locally
        self.outbox: dict = {}   # key -> tensor to send in its batch
        self.pending: dict = {}  # batch -> (recv works, [(key, buffer)], every work)
        self.sending: list = []  # works of sends, waited for at the end
        self.wait_s = 0.0

    def put(self, dst: int, key, tensor) -> None:
        (self.inbox if dst == self.plan.rank else self.outbox)[key] = tensor

    def post(self, k: int) -> None:
        import torch
        sends, recvs = self.plan.batches[k]
        ops = [("send", dst, self.outbox.pop(key), key) for dst, key in sends]
        bufs = [(key, torch.empty(self.shape, device=self.device)) for _, key in recvs]
        ops += [("recv", src, buf, key) for (src, _), (key, buf) in zip(recvs, bufs)]
        works = self.transport(ops) if ops else []
        if len(works) == len(ops):  # one work per op: wait for the receives now, the sends at the end
            self.sending += works[:len(sends)]
            self.pending[k] = (works[len(sends):], bufs)
        else:  # one work for the batch
            self.pending[k] = (works, bufs)

    def wait(self, k: int) -> None:
        t0 = time.perf_counter()
        for b in sorted(b for b in self.pending if b <= k):
            works, bufs = self.pending.pop(b)
            for work in works:
                work.wait()
            self.inbox.update(bufs)
        self.wait_s += time.perf_counter() - t0

    def take(self, key):
        return self.inbox.pop(key)

    def flush(self) -> None:
        """Wait for every batch and every send (the end of a step); nothing may be left over."""
        self.wait(len(self.plan.batches))
        for work in self.sending:
            work.wait()
        self.sending = []
        if self.inbox or self.outbox:
            raise RuntimeError(f"rank {self.plan.rank}: messages left over after the step: "
                               f"{sorted(self.inbox) + sorted(self.outbox)}")

    def exchange(self, peer: int, tensor):
        """Send `tensor` to `peer` and receive its tensor of the same shape, in one batch (an all-reduce of two
        ranks is `tensor + exchange(peer, tensor)`)."""
        buf = tensor.new_empty(tensor.shape)
        for work in self.transport([("send", peer, tensor, "mirror"), ("recv", peer, buf, "mirror")]):
            work.wait()
        return buf
