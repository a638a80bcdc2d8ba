"""The pipeline executor's ranks as threads of this process, over an in-memory transport (a test harness: fast,
and a test can swap a piece of the executor for a broken one): `wire="buffered"` buffers sends as gloo does (`delay`
seconds are added to every receive), `wire="nccl"` has NCCL's rendezvous rules (`common.parallel.rendezvous`)."""
import queue
import threading
import time

import torch

from common.parallel import pipeline
from common.parallel.rendezvous import Rendezvous
from common.parallel import pipeline_run as R


class _Done:
    def wait(self):
        pass


class _Recv:
    def __init__(self, q, buf, delay):
        self.q, self.buf, self.delay = q, buf, delay

    def wait(self):
        time.sleep(self.delay)
        self.buf.copy_(self.q.get(timeout=60))


class Wire:
    """Queues between every pair of threads; `transport(rank)` is that rank's `p2p` transport."""

    def __init__(self, ranks: int, delay: float = 0.0):
        self.queues = {(a, b): queue.Queue() for a in range(ranks) for b in range(ranks)}
        self.delay = delay

    def transport(self, rank: int):
        def send_and_receive(ops):
            works = []
            for kind, peer, t, *_ in ops:
                if kind == "send":
                    self.queues[(rank, peer)].put(t.detach().clone())
                    works.append(_Done())
                else:
                    works.append(_Recv(self.queues[(peer, rank)], t, self.delay))
            return works
        return send_and_receive


def run(name: str, pp: int, micro_batches: int, batch: int = 32, blocks: int = 4, hidden: int = 16,
        delay: float = 0.0, seed: int = 0, wire: str = "buffered", timeout: float = 20.0, lr: float = 0.0) -> dict:
    """One step of schedule `name` on `pp` threads: per rank (spans, end, peak bytes, stage bytes, receive wait),
    the gradient error against one process (summed over ranks), and the worst gradient and weight (after the SGD
    step with `lr`) of any copy any rank holds."""
    sched = pipeline.build(name, pp, micro_batches)
    model = R.make_model(blocks, hidden, seed)
    x_all, t_all = R.make_batch(batch, hidden, seed + 1)
    wire = Wire(pp, delay) if wire == "buffered" else Rendezvous(pp, timeout)
    stages = [R.Stage(sched, r, model, x_all, t_all, torch.device("cpu")) for r in range(pp)]
    plans = R.plan.make(sched)
    links = [R.PointToPoint(plans[r], (stages[r].rows, hidden), torch.device("cpu"), wire.transport(r))
             for r in range(pp)]
    out, errors = [None] * pp, []

    def rank(r):
        try:
            spans, end = R.run_step(plans[r], sched, stages[r], links[r], lr)
            out[r] = {"spans": spans, "end": end, "peak_bytes": stages[r].live.peak,
                      "stage_bytes": stages[r].stage_bytes(), "recv_wait": links[r].wait_s}
        except BaseException as exc:  # noqa: BLE001 (reported in the main thread)
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(pp)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120 + timeout)
    if errors:
        raise errors[0]
    flat = sum(s.gradient(blocks) for s in stages)
    blocks_ref = R.reference_gradients(blocks, hidden, batch, seed)
    ref = torch.cat([t.flatten() for blk in blocks_ref for t in blk])
    copies = [s.errors(model, blocks_ref, lr) for s in stages]  # every copy, DualPipe's mirrors too, after the step
    return {"ranks": out, "grad_err": float((flat - ref).abs().max()), "schedule": sched, "stages": stages,
            "copy_grad_err": max(c[0] for c in copies), "weight_err": max(c[1] for c in copies)}
