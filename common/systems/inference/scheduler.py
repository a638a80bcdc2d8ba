"""One step of a continuous-batching scheduler over a paged KV cache (vLLM's, simplified: whole blocks, one token per
running sequence per step, recompute preemption), and a trace driven through any such step function.

State: `running` (oldest admitted first) and `waiting` (queue order) lists of `Seq`, and the pool's free blocks. A
running sequence holds ceil(tokens / block_size) blocks, tokens = prompt + generated; a waiting one holds none.
One step (`schedule_step`):
1. finish -- a running sequence that has generated all its max_new tokens leaves; its blocks go back to the pool;
2. grow -- each running sequence, oldest first, needs room for the token this step computes: a new block when its
   tokens + 1 cross a block boundary. When the pool is empty, preempt the most recently admitted running sequence
   (it may be the one asking): its blocks go back to the pool and it goes to the FRONT of the queue, keeping its
   tokens, which it will recompute when admitted again;
3. admit -- from the front of the queue, first come first served, while fewer than max_batch run and the front
   sequence's tokens + 1 fit in the free blocks; stop at the first that does not fit (admitting a later, smaller
   one instead would let a long request wait forever);
4. advance -- every running sequence computes one token (its first, for one just admitted): generated + 1.
The steps are methods of `Scheduler`, so a variant policy overrides one of them.
"""
from __future__ import annotations

import copy
import random
from dataclasses import dataclass

from common.core.validate import whole


@dataclass
class Seq:
    """A request: its prompt's tokens, the tokens it will generate (max_new) and has generated so far."""
    rid: int
    prompt: int
    max_new: int
    generated: int = 0

    @property
    def tokens(self) -> int:
        """Tokens in its KV cache while it runs."""
        return self.prompt + self.generated


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks of `block_size` tokens that `tokens` tokens occupy."""
    return -(-tokens // block_size)


class Scheduler:
    """The policy of the module docstring, one method per part of the step."""

    def finish(self, running, free, bs):
        done = [s for s in running if s.generated >= s.max_new]
        free += sum(blocks_for(s.tokens, bs) for s in done)
        return [s for s in running if s.generated < s.max_new], done, free

    def grow_need(self, s, bs) -> int:
        return blocks_for(s.tokens + 1, bs) - blocks_for(s.tokens, bs)

    def victim(self, running) -> int:
        """Index of the sequence to preempt: the most recently admitted."""
        return len(running) - 1

    def preempt(self, running, waiting, i, free, bs):
        v = running.pop(i)
        waiting.insert(0, v)
        return free + blocks_for(v.tokens, bs)

    def grow(self, running, waiting, free, bs):
        i = 0
        while i < len(running):
            need = self.grow_need(running[i], bs)
            if need <= free:
                free -= need
                i += 1
                continue
            j = self.victim(running)
            free = self.preempt(running, waiting, j, free, bs)
            if j < i:
                i -= 1
        return free

    def admit_need(self, s, bs) -> int:
        return blocks_for(s.tokens + 1, bs)

    def admit(self, running, waiting, free, bs, max_batch):
        while waiting and len(running) < max_batch and self.admit_need(waiting[0], bs) <= free:
            s = waiting.pop(0)
            free -= self.admit_need(s, bs)
            running.append(s)
        return free

    def advance(self, running, admitted) -> None:
        for s in running:
            s.generated += 1

    def step(self, running, waiting, free_blocks, block_size, max_batch):
        running, waiting = list(running), list(waiting)
        running, finished, free = self.finish(running, free_blocks, block_size)
        free = self.grow(running, waiting, free, block_size)
        before = {id(s) for s in running}
        free = self.admit(running, waiting, free, block_size, max_batch)
        self.advance(running, [s for s in running if id(s) not in before])
        return running, waiting, finished, free


def schedule_step(running: list, waiting: list, free_blocks: int, block_size: int, max_batch: int) -> tuple:
    """One step of the module docstring's policy. The Seq objects are updated in place (generated + 1); returns
    (running, waiting, finished, free_blocks) -- new lists."""
    whole("free_blocks", free_blocks, minimum=0), whole("block_size", block_size), whole("max_batch", max_batch)
    return Scheduler().step(running, waiting, free_blocks, block_size, max_batch)


def canonical(result) -> tuple:
    """A step's result as comparable data: ((rid, generated) running), ((rid, generated) waiting), sorted finished
    rids, free blocks."""
    running, waiting, finished, free = result
    return (tuple((s.rid, s.generated) for s in running), tuple((s.rid, s.generated) for s in waiting),
            tuple(sorted(s.rid for s in finished)), free)


def random_trace(n: int, seed: int = 0, prompt=(1, 40), max_new=(1, 24), arrivals_per_step: float = 1.5) -> list:
    """(arrival step, Seq) for n requests, lengths uniform in the ranges (inclusive), Poisson-like arrivals."""
    whole("n", n)
    rng = random.Random(seed)
    t, out = 0.0, []
    for rid in range(n):
        t += rng.expovariate(arrivals_per_step)
        out.append((int(t), Seq(rid, rng.randint(*prompt), rng.randint(*max_new))))
    return out


@dataclass
class TraceRun:
    steps: int
    output_tokens: int       # one per running sequence per step
    preemptions: int
    recomputed_tokens: int   # tokens a preempted sequence computed again when it was admitted again
    mean_running: float
    history: list            # canonical(result) of every step


def run_trace(step_fn, trace: list, num_blocks: int, block_size: int, max_batch: int, max_steps: int = 10000):
    """Drive `step_fn(running, waiting, free_blocks, block_size, max_batch)` over a trace of (arrival, Seq): each
    step, the arrivals join the back of the queue, then one step runs. Stops when every request finished."""
    pending = sorted(copy.deepcopy(trace), key=lambda a: a[0])
    running, waiting, free = [], [], num_blocks
    steps = tokens = preempted = recomputed = 0
    history, was_preempted = [], set()
    while pending or running or waiting:
        if steps >= max_steps:
            raise RuntimeError(f"the trace did not finish in {max_steps} steps")
        while pending and pending[0][0] <= steps:
            waiting.append(pending.pop(0)[1])
        before = {s.rid: s.tokens for s in running}
        running, waiting, finished, free = step_fn(running, waiting, free, block_size, max_batch)
        for s in waiting:
            if s.rid in before:
                preempted += 1
                was_preempted.add(s.rid)
        recomputed += sum(s.tokens - 1 for s in running if s.rid not in before and s.rid in was_preempted)
        tokens += len(running)
        steps += 1
        history.append(canonical((running, waiting, finished, free)))
    return TraceRun(steps, tokens, preempted, recomputed, tokens / steps if steps else 0.0, history)
