"""Reading a learner's ring all-reduce by its messages (lab 07's checker, exercise 7.3).

Every rank's input is a code: element i of rank r is c(i) * M + 2^r, where c(i) is the chunk of i when the tensor is
cut with `torch.tensor_split` into p chunks. A sum of some ranks' copies of one chunk is c * k * M + (the sum of their
2^r), so any tensor a rank sends says which chunk it is and whose values it holds (`decode`): "rank 2 sent chunk 3
where the ring step needs chunk 1", "rank 1's chunk 0 holds ranks {1} where it should hold {0, 1}". The codes are
small integers, exact in float32, whatever order the additions take.
"""
from __future__ import annotations

M = 64  # above 2^p - 1 for p <= 5 ranks


def encoded(shape, p: int) -> list:
    """Each rank's input (float32, `shape`)."""
    import torch
    n = 1
    for d in shape:
        n *= d
    chunk = torch.zeros(n, dtype=torch.float64)
    for c, idx in enumerate(torch.tensor_split(torch.arange(n), p)):
        chunk[idx] = c
    return [(chunk * M + 2 ** r).float().reshape(shape) for r in range(p)]


def expected(shape, p: int):
    return sum(x.double() for x in encoded(shape, p)).float()


def decode(t, p: int):
    """(chunk, set of ranks) when `t` is one chunk summed over a set of ranks, else None."""
    import torch
    v = t.detach().double().reshape(-1)
    if v.numel() == 0 or not torch.equal(v, v.round()):
        return None
    v = v.long()
    mask = v % M
    if not bool((mask == mask[0]).all()) or not 0 < int(mask[0]) < 2 ** p:
        return None
    ranks = {r for r in range(p) if int(mask[0]) >> r & 1}
    rest = v - mask
    if bool((rest % (len(ranks) * M) != 0).any()):
        return None
    chunks = rest // (len(ranks) * M)
    if not bool((chunks == chunks[0]).all()):
        return None
    return int(chunks[0]), ranks


def ring_of(start: int, step: int, k: int, p: int) -> set:
    """{start, start - step, ..., start - k*step} mod p: the ranks whose values a chunk holds after k additions."""
    return {(start - step * i) % p for i in range(k + 1)}


def read_messages(log: list, p: int, n: int, complete: bool = True) -> str | None:
    """What is wrong with the ring's messages (`Rendezvous.log`: (source, destination, tensor, tag) as matched), in
    the learner's terms, or None. The ring may turn either way (every rank to rank + 1, or every rank to rank - 1).
    `complete`: the log is the whole run (else the messages up to a hang: counts are not judged)."""
    sent = {r: [(dst, t) for src, dst, t, _ in log if src == r] for r in range(p)}
    sizes = {t.numel() for _, t in (m for msgs in sent.values() for m in msgs)}
    chunk_sizes = {int(c.numel()) for c in _chunks(n, p)}
    for r, msgs in sent.items():
        far = [dst for dst, _ in msgs if dst not in ((r + 1) % p, (r - 1) % p)]
        if far:
            return f"rank {r} sent to rank {far[0]}, which is not its neighbour: in a ring every rank sends to rank + 1"
    if n in sizes and n not in chunk_sizes:
        return (f"a message held all {n} elements: each ring step sends one chunk of about n/p elements (the chunks "
                f"of torch.tensor_split(x.view(-1), p)), not the whole tensor")
    if not sizes <= chunk_sizes | {0}:
        return (f"messages of {sorted(sizes - chunk_sizes)} elements, where torch.tensor_split(x.view(-1), {p}) makes "
                f"chunks of {sorted(chunk_sizes)}: cut x with tensor_split (torch.chunk cuts differently, and can "
                f"give fewer than p chunks)")
    step = 1 if p == 2 or all(not msgs or msgs[0][0] == (r + 1) % p for r, msgs in sent.items()) else -1
    wrong = _first_wrong(sent, p, step)
    counts = {r: len(msgs) for r, msgs in sent.items()}
    if complete and any(c != 2 * (p - 1) for c in counts.values()):
        r = next(r for r, c in counts.items() if c != 2 * (p - 1))
        why = " -- p steps per phase instead of p-1" if counts[r] == 2 * p else ""
        if counts[r] == p - 1:
            why = (" -- only the reduce-scatter: the all-gather phase is missing" if wrong is None or
                   wrong[0] >= p - 1 else " -- no chunk was summed on the way: the reduce-scatter phase is missing")
        return (f"rank {r} sent {counts[r]} messages; a ring all-reduce over p = {p} ranks sends 2(p-1) = "
                f"{2 * (p - 1)}: p-1 reduce-scatter steps, then p-1 all-gather steps{why}")
    return wrong[1] if wrong else None


def _first_wrong(sent: dict, p: int, step: int):
    """(message index, what is wrong) of the first message that is not the ring's, or None."""
    for r, msgs in sent.items():
        for k, (_, t) in enumerate(msgs[:2 * (p - 1)]):
            if t.numel() == 0:
                continue
            got = decode(t, p)
            phase, i = ("reduce-scatter", k) if k < p - 1 else ("all-gather", k - (p - 1))
            if phase == "reduce-scatter":
                want_chunk, want_ranks = (r - step * i) % p, ring_of(r, step, i, p)
            else:
                want_chunk, want_ranks = (r + step * (1 - i)) % p, set(range(p))
            if got is None and phase == "all-gather":
                return k, (f"rank {r}'s message at step {i} of the all-gather holds more than every rank's values "
                           f"once: in the all-gather copy what you receive into the chunk (irecv into it); adding it "
                           f"counts ranks twice")
            if got is None:
                return k, (f"rank {r}'s message at step {i} of the {phase} is not one chunk's sum (its elements mix "
                           f"chunks, or a chunk was added twice)")
            chunk, ranks = got
            if chunk != want_chunk:
                return k, (f"rank {r} sent chunk {chunk} at step {i} of the {phase}, where the ring step needs chunk "
                           f"{want_chunk} (chunk (rank {'-' if step == 1 else '+'} step) mod p"
                           f"{' + 1' if phase == 'all-gather' and step == 1 else ''})")
            if ranks != want_ranks:
                if phase == "reduce-scatter" and ranks == {r}:
                    return k, (f"rank {r}'s chunk {chunk} at step {i} of the reduce-scatter holds only its own "
                               f"values, where it should hold the sum of ranks {sorted(want_ranks)}: add what you "
                               f"received into your chunk before sending it on")
                if phase == "reduce-scatter" and r not in ranks:
                    return k, (f"rank {r}'s chunk {chunk} at step {i} of the reduce-scatter holds ranks "
                               f"{sorted(ranks)} but not rank {r}'s own values: add what you receive to your chunk "
                               f"(chunk += received), do not receive into it")
                return k, (f"rank {r}'s chunk {chunk} at step {i} of the {phase} holds the sum of ranks "
                           f"{sorted(ranks)}, where it should hold ranks {sorted(want_ranks)}")
    return None


def read_result(out, x, p: int, r: int):
    """What is wrong with rank r's result chunk by chunk, or None (decoded as the messages are)."""
    n = x.numel()
    full = set(range(p))
    for c, part in enumerate(_chunks(n, p, out.reshape(-1))):
        if part.numel() == 0:
            continue
        got = decode(part, p)
        if got is not None and got[1] == full:
            continue
        if got is not None:
            return f"rank {r}'s chunk {c} holds the sum of ranks {sorted(got[1])} only"
        return f"rank {r}'s chunk {c} holds more than every rank's values once: a chunk was added twice"
    return None


def _chunks(n: int, p: int, t=None):
    import torch
    return torch.tensor_split(torch.zeros(n) if t is None else t, p)
