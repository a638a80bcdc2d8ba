"""Automatic prefix caching over a pool of KV blocks (vLLM's automatic prefix caching, its v1 block manager
simplified), and the hit rate it reaches on a multi-turn chat trace.

A FULL block of a request's tokens is named by hash((parent block's name, its tokens)): the parent's name makes the
name stand for the whole prefix up to that block, so the same tokens after another prefix (or at another position)
get another name. `CacheState`: the free queue (block ids, the front is evicted first), the reference count of every
block, and the names of the full blocks whose contents are kept (name -> block, and block -> name).

`allocate(state, tokens) -> (state, blocks, hit_tokens)`:
1. look up the full blocks among the first len(tokens) - 1 tokens (the last token is always computed: its logits
   start the reply), in order, stopping at the first miss; each hit takes a reference (a cached block nobody
   references leaves the free queue);
2. every other block of the request comes from the front of the free queue; a block taken there that still has a
   name is evicted (its name forgotten);
3. each new FULL block gets its name (unless that name is cached already); a partial last block never gets one, so
   it is never shared -- the request will write its next tokens there.
`release(state, blocks) -> state`: one reference less per block; a block left with none goes to the back of the free
queue -- the request's last block first, so a request's tail is evicted before its prefix, which others may share --
and keeps its name until it is evicted: the least recently used cached block goes first.
The parts are methods of `PrefixCachePolicy`, so a variant policy overrides one of them.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from common.core.validate import whole
from common.systems.inference.paged_kv import CacheFull


@dataclass
class CacheState:
    """The pool of one prefix cache (see the module docstring)."""
    block_size: int
    free: list                                       # block ids; the front is taken (evicted) first
    refs: dict                                       # block -> requests using it
    cached: dict = field(default_factory=dict)       # name -> block, full blocks whose contents are kept
    block_name: dict = field(default_factory=dict)   # block -> name


def new_state(num_blocks: int, block_size: int) -> CacheState:
    """An empty pool: every block free (0 first), none referenced, nothing cached."""
    whole("num_blocks", num_blocks), whole("block_size", block_size)
    return CacheState(block_size, list(range(num_blocks)), {b: 0 for b in range(num_blocks)})


class PrefixCachePolicy:
    """The policy of the module docstring, one method per part."""

    def name(self, parent, tokens):
        return hash((parent, tuple(tokens)))

    def lookup_blocks(self, n_tokens: int, bs: int) -> int:
        """How many leading full blocks may be looked up: those within the first n - 1 tokens."""
        return (n_tokens - 1) // bs

    def hit(self, state: CacheState, b: int) -> None:
        if state.refs[b] == 0:
            state.free.remove(b)
        state.refs[b] += 1

    def take(self, state: CacheState) -> int:
        if not state.free:
            raise CacheFull(f"no free block: all {len(state.refs)} blocks are referenced by running requests")
        b = state.free.pop(0)
        self.evict(state, b)
        state.refs[b] = 1
        return b

    def evict(self, state: CacheState, b: int) -> None:
        if b in state.block_name:
            del state.cached[state.block_name.pop(b)]

    def register(self, state: CacheState, name, b: int, full: bool) -> None:
        if full and name not in state.cached:
            state.cached[name] = b
            state.block_name[b] = name

    def hit_tokens(self, hits: int, bs: int) -> int:
        return hits * bs

    def allocate(self, state: CacheState, tokens) -> tuple:
        bs, tokens = state.block_size, list(tokens)
        blocks, parent, hits = [], None, 0
        for i in range(self.lookup_blocks(len(tokens), bs)):
            name = self.name(parent, tokens[i * bs:(i + 1) * bs])
            if name not in state.cached:
                break
            self.hit(state, state.cached[name])
            blocks.append(state.cached[name])
            parent, hits = name, hits + 1
        for i in range(hits, -(-len(tokens) // bs)):
            chunk = tokens[i * bs:(i + 1) * bs]
            b = self.take(state)
            blocks.append(b)
            parent = self.name(parent, chunk)
            self.register(state, parent, b, len(chunk) == bs)
        return state, blocks, self.hit_tokens(hits, bs)

    def release(self, state: CacheState, blocks) -> CacheState:
        for b in reversed(list(blocks)):
            state.refs[b] -= 1
            if state.refs[b] == 0:
                self.forget(state, b)
                state.free.append(b)
        return state

    def forget(self, state: CacheState, b: int) -> None:
        """What a block's name becomes when its last request ends: kept (until the block is evicted)."""


def allocate(state: CacheState, tokens) -> tuple:
    """A new request's blocks: (state, blocks, hit_tokens) -- see the module docstring."""
    return PrefixCachePolicy().allocate(state, tokens)


def release(state: CacheState, blocks) -> CacheState:
    """A finished request's blocks back: see the module docstring."""
    return PrefixCachePolicy().release(state, blocks)


# ---------------------------------------------------------------- a multi-turn trace

@dataclass(frozen=True)
class Turn:
    conversation: int
    turn: int
    prompt: tuple        # token ids: the system prompt, the conversation so far, the new user message
    reply: tuple         # token ids the model answers with


def multi_turn_trace(conversations: int = 24, turns: int = 4, system_prompts: int = 3, system_len: int = 200,
                     user_len=(20, 120), reply_len=(40, 300), vocab: int = 32000, seed: int = 0) -> list:
    """Chats in arrival order: each conversation starts with one of `system_prompts` shared system prompts, and
    each turn's prompt is the whole conversation so far plus a new user message (lengths uniform in the ranges,
    inclusive); the conversations' turns interleave at random."""
    for name, v in (("conversations", conversations), ("turns", turns), ("system_prompts", system_prompts),
                    ("system_len", system_len), ("vocab", vocab)):
        whole(name, v)
    rng = random.Random(seed)

    def text(n):
        return tuple(rng.randrange(vocab) for _ in range(n))
    systems = [text(system_len) for _ in range(system_prompts)]
    history = {c: systems[rng.randrange(system_prompts)] for c in range(conversations)}
    done = {c: 0 for c in range(conversations)}
    out = []
    while any(done[c] < turns for c in done):
        c = rng.choice([c for c in done if done[c] < turns])
        prompt = history[c] + text(rng.randint(*user_len))
        reply = text(rng.randint(*reply_len))
        out.append(Turn(c, done[c], prompt, reply))
        history[c] = prompt + reply
        done[c] += 1
    return out


@dataclass
class HitRate:
    hit_tokens: int
    prompt_tokens: int
    requests: int
    num_blocks: int
    block_size: int

    @property
    def hit_rate(self) -> float:
        """Prompt tokens served from the cache / prompt tokens."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def simulate(trace: list, num_blocks: int, block_size: int = 16, concurrent: int = 4, allocate_fn=None,
             release_fn=None) -> HitRate:
    """Serve the trace through one prefix cache, `concurrent` requests in flight (the oldest released when another
    arrives): each request holds its prompt and its reply's blocks while it runs. Hit rate over the prompt tokens.
    allocate_fn / release_fn default to this module's (a learner's pass here)."""
    whole("concurrent", concurrent)
    alloc, rel = allocate_fn or allocate, release_fn or release
    state = new_state(num_blocks, block_size)
    flight, hits, prompt = [], 0, 0
    for t in trace:
        if len(flight) == concurrent:
            state = rel(state, flight.pop(0))
        state, blocks, h = alloc(state, t.prompt + t.reply)
        flight.append(blocks)
        hits += h
        prompt += len(t.prompt)
    for blocks in flight:
        state = rel(state, blocks)
    return HitRate(hits, prompt, len(trace), num_blocks, block_size)
