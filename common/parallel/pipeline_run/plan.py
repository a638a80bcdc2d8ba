"""Each rank's plan of a pipeline step: its ops, and the point-to-point batches between them with every send and
receive listed -- made before any process starts, and checked against NCCL's rules.

Rank r posts batch k (one `batch_isend_irecv`) just before its op k, and batch n after its last op. Batch k holds the
sends op k-1 produced and the receives the planner placed there. Under NCCL a send completes only once its peer has
posted the matching receive, a batch is one work, and a rank's batches run one after the other on one stream. So a
receive posted only when the op that needs it is next (the executor before this one) can leave two ranks each
waiting on a send the other has not posted a receive for -- DualPipe did, at every pp. Here a receive is posted in
the receiver's batch before the first of its ops that starts after the sender's op ends, in a simulated run of the
schedule (`pipeline.simulate`): as DualPipe's own runtime does, the next receives go out before the compute, with
the sends of the op before. `check` then plays every rank's posts and waits under NCCL's rules and raises `Deadlock`
naming what each rank is stuck on; `make` checks every plan it makes. The plan is static, so if it completes in one
order it completes in every timing (a batch only ever waits for its peers' batches to be posted).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from common.parallel import pipeline
from common.parallel.pipeline import Deadlock


@dataclass
class RankPlan:
    """`ops`: the rank's ops in order. `batches[k]`: (sends, receives) posted before op k (k = len(ops): after the
    last), each a list of (peer, key); a key is ("act" | "grad", direction, stage, micro_batch) -- a forward's output
    of that stage, or its input gradient. `waits[k]`: the batches (indices) to wait for before op k -- the last one
    holding a receive op k needs (waiting for a batch waits for the ones before it too). `mirror`: the rank holding
    the other copy of this rank's stages (DualPipe), or None."""
    rank: int
    ops: list
    batches: list = field(default_factory=list)
    waits: list = field(default_factory=list)
    mirror: int | None = None


def inputs_of(schedule, item):
    """(source rank, message key) that work item needs from another stage, or None."""
    kind, d, s, j = item
    if kind == "F" and s > 0:
        return schedule.placement[(d, s - 1)], ("act", d, s - 1, j)
    if kind in ("B", "Bi") and s < schedule.stages - 1:
        return schedule.placement[(d, s + 1)], ("grad", d, s + 1, j)
    return None


def output_of(schedule, item):
    """(destination rank, message key) of what the work item sends, or None."""
    kind, d, s, j = item
    if kind == "F" and s < schedule.stages - 1:
        return schedule.placement[(d, s + 1)], ("act", d, s, j)
    if kind in ("B", "Bi") and s > 0:
        return schedule.placement[(d, s - 1)], ("grad", d, s, j)
    return None


def mirror_of(schedule, rank: int):
    """DualPipe: the rank holding the other direction's copy of this rank's stages (pp-1-rank); None otherwise."""
    return len(schedule.ops) - 1 - rank if schedule.directions == 2 else None


def make(schedule, durations: pipeline.Durations | None = None) -> list:
    """Every rank's `RankPlan`, checked (`check`). The receives are placed by a simulated run with `durations`
    (default F=1, B=2, W=1: the ratio of a real backward to its forward)."""
    sim = pipeline.simulate(schedule, durations or pipeline.Durations())
    starts = [[span[0] for span in spans] for spans in sim.spans]
    ends = [[span[1] for span in spans] for spans in sim.spans]
    plans = [RankPlan(r, list(ops), [([], []) for _ in range(len(ops) + 1)], [[] for _ in ops],
                      mirror_of(schedule, r)) for r, ops in enumerate(schedule.ops)]
    sent = []  # (send time, source, destination, key, index of the op that produced it)
    for r, ops in enumerate(schedule.ops):
        for k, op in enumerate(ops):
            for item in op:
                out = output_of(schedule, item)
                if out is not None and out[0] != r:
                    plans[r].batches[k + 1][0].append(out)
                    sent.append((ends[r][k], r, out[0], out[1]))
    needed = {}  # key -> index of the op of its receiver that needs it
    for r, ops in enumerate(schedule.ops):
        for k, op in enumerate(ops):
            for item in op:
                need = inputs_of(schedule, item)
                if need is not None and need[0] != r:
                    needed[need[1]] = k
    last = {}  # (source, destination) -> batch of the last receive placed: messages match in order
    for t, src, dst, key in sorted(sent, key=lambda s: (s[0], s[1])):
        k = next((i for i, st in enumerate(starts[dst]) if st >= t), len(starts[dst]))
        k = min(max(k, last.get((src, dst), 0)), needed[key])
        last[(src, dst)] = k
        plans[dst].batches[k][1].append((src, key))
    for p in plans:
        where = {key: b for b, (_, recvs) in enumerate(p.batches) for _, key in recvs}
        waited = -1
        for k, op in enumerate(p.ops):
            need = [where[n[1]] for n in (inputs_of(schedule, item) for item in op) if n and n[0] != p.rank]
            if need and max(need) > waited:
                waited = max(need)
                p.waits[k] = [waited]
    check(plans)
    return plans


def check(plans: list) -> None:
    """Play the plans under NCCL's rules (a send matches only a posted receive, a batch is one work, one stream per
    rank; each rank posts its batches in order and waits where its plan waits, and for all at the end). Raises
    `Deadlock` naming each stuck rank's pending operations; ValueError for a receive no rank sends."""
    n = len(plans)
    pc = [0] * n            # next step of each rank: 2k = post batch k, 2k+1 = wait before op k
    stream = [deque() for _ in range(n)]  # posted batches not yet complete: (index, pending ops)
    done = [set() for _ in range(n)]
    unmatched = {"send": {}, "recv": {}}  # (src, dst) -> deque of keys posted by the running batches

    def post_head(r):
        if stream[r] and not stream[r][0][2]:
            b, pending, _ = stream[r][0]
            stream[r][0] = (b, pending, True)
            for kind, peer, key in pending:
                pair = (r, peer) if kind == "send" else (peer, r)
                unmatched[kind].setdefault(pair, deque()).append((key, r, b))

    progress = True
    while progress:
        progress = False
        for r, p in enumerate(plans):
            while True:
                step, k = divmod(pc[r], 2)[1], pc[r] // 2
                if k > len(p.ops):
                    break
                if step == 0:  # post batch k
                    sends, recvs = p.batches[k]
                    ops = [("send", d, key) for d, key in sends] + [("recv", s, key) for s, key in recvs]
                    stream[r].append((k, ops, False))
                    post_head(r)
                elif k < len(p.ops):  # wait before op k
                    if any(b not in done[r] for b in p.waits[k]):
                        break
                else:  # the end: every batch
                    if stream[r]:
                        break
                pc[r] += 1
                progress = True
        for pair in list(unmatched["send"]):
            sends, recvs = unmatched["send"][pair], unmatched["recv"].get(pair, deque())
            while sends and recvs:
                (skey, src, sb), (rkey, dst, rb) = sends.popleft(), recvs.popleft()
                if skey != rkey:
                    raise Deadlock(f"rank {dst} posted a receive of {rkey} from rank {src} where rank {src} sends "
                                   f"{skey}: messages between two ranks match in the order they are posted")
                for rank, b, kind, peer in ((src, sb, "send", dst), (dst, rb, "recv", src)):
                    head = stream[rank][0]
                    head[1].remove((kind, peer, skey))
                progress = True
        for r in range(n):
            while stream[r] and stream[r][0][2] and not stream[r][0][1]:
                done[r].add(stream[r].popleft()[0])
                post_head(r)
                progress = True
    stuck = [r for r in range(n) if pc[r] // 2 <= len(plans[r].ops)]
    if stuck:
        lines = []
        for r in stuck:
            head = stream[r][0] if stream[r] else None
            what = ", ".join(f"{kind} {key} {'to' if kind == 'send' else 'from'} rank {peer}"
                             for kind, peer, key in head[1]) if head else "nothing"
            lines.append(f"rank {r} before op {pc[r] // 2}: its batch {head[0] if head else '-'} waits to {what}")
        raise Deadlock("under NCCL's rules these ranks wait on each other forever:\n  " + "\n  ".join(lines))
