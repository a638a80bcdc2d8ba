"""One DualPipe rank's order written as tokens, the way DeepSeek's runtime reads: "F0" / "F1" a forward of the
rank's early / late chunk (its next micro-batch), "B0" / "B1" a full backward, "Bi0" / "Bi1" a zero-bubble backward
(input gradients now, the weight pass queued), "W" the oldest queued weight pass, "F0&B1" / "F1&B0" an overlapped
pair. The early chunk of rank r is its stage of the direction fed at its own end: (direction 0, stage r) in the first
half of the ranks, (direction 1, stage pp-1-r) in the second; the late chunk is the other one.

`to_ops` turns a rank's tokens into the schedule's work items (micro-batches in order per chunk), `to_tokens` the
other way; `dualpipe_tokens` is DeepSeek's order (`schedules.dualpipe`) in tokens; `steps_of` where each of its eight
steps begins; `schedule_from` builds the whole schedule from a function giving one rank's tokens.
"""
from __future__ import annotations

from common.parallel.pipeline.schedules import Schedule, check_dualpipe_args, dualpipe, dualpipe_stages

TOKENS = ("F0", "F1", "B0", "B1", "Bi0", "Bi1", "W", "F0&B1", "F1&B0")
STEPS = {1: "nF0: warm-up forwards of the early chunk", 2: "nF0F1: a forward of each chunk, in turn",
         3: "nB1W1F1: zero-bubble backward of the late chunk, a weight pass, a forward of the late chunk",
         4: "nF0B1F1B0: the main step, overlapped pairs F0&B1 and F1&B0",
         5: "nB1F1B0: a backward of the late chunk, then the pair F1&B0",
         6: "nB1B0: backwards of both chunks, the last h+1 of them zero-bubble",
         7: "nWB0: a weight pass, then a zero-bubble backward of the early chunk", 8: "nW: the weight passes left"}


def chunks(pp: int, rank: int) -> tuple:
    """(early, late) chunk of `rank` as (direction, stage)."""
    forward, reverse = dualpipe_stages(pp, rank)
    return (forward, reverse) if rank < pp // 2 else (reverse, forward)


def to_ops(tokens, pp: int, micro_batches: int, rank: int) -> list:
    """The schedule's ops (tuples of work items) of one rank's tokens; ValueError for a token it does not know, a W
    with no weight pass queued, or more forwards or backwards of a chunk than it has micro-batches."""
    chunk, m = chunks(pp, rank), micro_batches // 2
    nf, nb, queue, ops = [0, 0], [0, 0], [], []

    def item(kind, phase):
        counter = nf if kind == "F" else nb
        if counter[phase] >= m:
            raise ValueError(f"rank {rank}: more than micro_batches/2 = {m} {'forwards' if kind == 'F' else 'backwards'}"
                             f" of chunk {phase}")
        counter[phase] += 1
        d, s = chunk[phase]
        out = (kind, d, s, counter[phase] - 1)
        if kind == "Bi":
            queue.append(("W", d, s, counter[phase] - 1))
        return out

    for k, tok in enumerate(tokens):
        if tok not in TOKENS:
            raise ValueError(f"rank {rank}: op {k} is {tok!r}; allowed: {', '.join(TOKENS)}")
        if tok == "W":
            if not queue:
                raise ValueError(f"rank {rank}: op {k} is a W, but no weight pass is queued (a Bi queues one)")
            ops.append((queue.pop(0),))
        elif "&" in tok:
            f, b = tok.split("&")
            ops.append((item("F", int(f[1])), item("B", int(b[1]))))
        else:
            ops.append((item(tok[:-1], int(tok[-1])),))
    return ops


def to_tokens(ops: list, pp: int, rank: int) -> list:
    """One rank's ops as tokens."""
    phase = {key: i for i, key in enumerate(chunks(pp, rank))}

    def one(item):
        kind, d, s, _ = item
        return "W" if kind == "W" else f"{kind}{phase[(d, s)]}"
    return ["&".join(one(item) for item in op) for op in ops]


def dualpipe_tokens(pp: int, micro_batches: int, rank: int) -> list:
    """DeepSeek's order of `rank` (schedules.dualpipe, after dualpipe/dualpipe.py), in tokens."""
    return to_tokens(dualpipe(pp, micro_batches).ops[rank], pp, rank)


def steps_of(pp: int, micro_batches: int, rank: int) -> list:
    """The index in `dualpipe_tokens` where each of the eight steps begins (eight numbers, then the length)."""
    n, m, h = pp // 2, micro_batches // 2, min(rank, pp - 1 - rank)
    main = m - 2 * n + h + 1
    sizes = [2 * (n - h - 1), 2 * (h + 1), 3 * (n - h - 1), 2 * main + (h == n - 1 and main > 0), 2 * (n - h - 1),
             2 * (h + 1), 2 * (n - h - 1)]
    starts = [0]
    for size in sizes:
        starts.append(starts[-1] + size)
    return starts + [len(dualpipe_tokens(pp, micro_batches, rank))]


def schedule_from(rank_tokens, pp: int, micro_batches: int, name: str = "dualpipe (yours)") -> Schedule:
    """The DualPipe schedule whose rank r runs `rank_tokens(pp, micro_batches, r)`."""
    check_dualpipe_args(pp, micro_batches)
    ref = dualpipe(pp, micro_batches)
    ops = [to_ops(rank_tokens(pp, micro_batches, r), pp, micro_batches, r) for r in range(pp)]
    return Schedule(name, pp, ref.stages, ref.micro_batches, 2, dict(ref.placement), ops)
