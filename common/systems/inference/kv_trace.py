"""KV-cache fragmentation over a request trace: contiguous allocation against paged allocation.

A server does not know how many tokens a request will generate. Contiguous allocation must reserve, at admission,
one run of slots for the prompt plus the most the request may generate (its max_output), first fit in the pool;
what it does not fill is wasted while the request runs (internal fragmentation), and free slots split into runs too
short for the next request (external fragmentation). Paged allocation (`common.systems.inference.paged_kv.PagedKVCache`)
takes one block at a time as the sequence grows, so a request wastes less than one block; when the pool runs dry
the most recently admitted request is preempted (its blocks freed, the request requeued to start again), as vLLM
does. `simulate` steps the trace (each step: arrivals, admissions first come first served, one token for every
running request, completions) and measures the wasted share of reserved slots, averaged over the steps.
"""
from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass

from common.core.validate import number, whole
from common.systems.inference.paged_kv import CacheFull, PagedKVCache

POLICIES = ("contiguous", "paged")


@dataclass(frozen=True)
class Request:
    arrival: int       # step at which it arrives
    prompt: int        # tokens
    output: int        # tokens it will generate (unknown to the server)
    max_output: int    # the most it may generate (known: the API's max_tokens)


def synthetic_trace(n: int = 200, seed: int = 0, prompt_median: int = 300, output_median: int = 120,
                    max_output: int = 1024, max_prompt: int = 4096, arrivals_per_step: float = 0.5) -> list:
    """Mixed lengths: prompts and outputs log-normal (sigma 1.0 and 0.9) around their medians, clipped to
    [8, max_prompt] and [1, max_output]; Poisson arrivals."""
    whole("n", n), number("arrivals_per_step", arrivals_per_step)
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(arrivals_per_step)
        p = min(max_prompt, max(8, round(rng.lognormvariate(math.log(prompt_median), 1.0))))
        o = min(max_output, max(1, round(rng.lognormvariate(math.log(output_median), 0.9))))
        out.append(Request(int(t), p, o, max_output))
    return out


class FirstFit:
    """Contiguous runs of slots out of `capacity`: first fit, neighbours merged on release."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.free = [(0, capacity)]     # (start, length), sorted

    def take(self, n: int):
        for i, (start, length) in enumerate(self.free):
            if length >= n:
                self.free[i:i + 1] = [(start + n, length - n)] if length > n else []
                return start
        return None

    def give(self, start: int, n: int) -> None:
        runs = sorted(self.free + [(start, n)])
        merged = [runs[0]]
        for s, ln in runs[1:]:
            ps, pl = merged[-1]
            if ps + pl == s:
                merged[-1] = (ps, pl + ln)
            else:
                merged.append((s, ln))
        self.free = merged


@dataclass
class TraceResult:
    policy: str
    steps: int
    waste_fraction: float      # reserved but unused slots / reserved, summed over steps
    mean_running: float        # requests decoding at once, averaged over steps
    tokens_per_step: float     # output tokens of the trace / steps (work lost to preemption not counted)
    preemptions: int


def simulate(trace: list, capacity_tokens: int, policy: str, block_size: int = 64) -> TraceResult:
    """Run the trace through a pool of `capacity_tokens` slots under one policy (see the module docstring)."""
    if policy not in POLICIES:
        raise ValueError(f"policy={policy!r} is not allowed; allowed: {', '.join(POLICIES)}")
    for r in trace:
        need = r.prompt + r.max_output if policy == "contiguous" else r.prompt + r.output
        if need > capacity_tokens:
            raise ValueError(f"a request needs {need} slots and the pool has {capacity_tokens}: it can never run")
    pending = deque(sorted(trace, key=lambda r: r.arrival))
    waiting: deque = deque()
    running: list = []                  # [request, generated, handle] in admission order
    contiguous = FirstFit(capacity_tokens)
    cache = PagedKVCache(capacity_tokens // block_size, block_size, width=1, storage=False)
    step = used = reserved = concurrent = preempted = 0
    ids = iter(range(10 ** 9))
    while pending or waiting or running:
        while pending and pending[0].arrival <= step:
            waiting.append(pending.popleft())
        while waiting:                  # admissions, first come first served
            r = waiting[0]
            if policy == "contiguous":
                handle = contiguous.take(r.prompt + r.max_output)
                if handle is None:
                    break
            else:
                handle = next(ids)
                cache.add(handle)
                if cache.blocks_needed(handle, r.prompt + 1) > cache.alloc.num_free:
                    cache.free(handle)
                    break
                cache.reserve(handle, r.prompt)
            running.append([waiting.popleft(), 0, handle])
        i = 0
        while i < len(running):         # one token each
            r, _, handle = running[i]
            if policy == "paged":
                try:
                    cache.reserve(handle, 1)
                except CacheFull:        # preempt the newest request and start it again later
                    victim = running.pop()
                    cache.free(victim[2])
                    waiting.appendleft(victim[0])
                    preempted += 1
                    continue
            running[i][1] += 1
            i += 1
        concurrent += len(running)
        used += sum(r.prompt + g for r, g, _ in running)
        reserved += sum(r.prompt + r.max_output for r, _, _ in running) if policy == "contiguous" else \
            (cache.num_blocks - cache.alloc.num_free) * block_size
        for entry in [e for e in running if e[1] >= e[0].output]:
            running.remove(entry)
            if policy == "contiguous":
                contiguous.give(entry[2], entry[0].prompt + entry[0].max_output)
            else:
                cache.free(entry[2])
        step += 1
    return TraceResult(policy, step, 1 - used / reserved if reserved else 0.0, concurrent / step,
                       sum(r.output for r in trace) / step, preempted)
