"""Exercise 14.8 (a prefix cache): scripted request sequences, random chats, and the named wrong policies as
subclasses of `prefix_cache.PrefixCachePolicy` that change one part of it."""
from __future__ import annotations

from common.systems.inference import prefix_cache
from common.systems.inference.prefix_cache import PrefixCachePolicy

class _SharePartial(PrefixCachePolicy):
    def lookup_blocks(self, n_tokens, bs):
        return -(-(n_tokens - 1) // bs)

    def register(self, state, name, b, full):
        super().register(state, name, b, True)


class _NoParentName(PrefixCachePolicy):
    def name(self, parent, tokens):
        return hash(tuple(tokens))


class _HitSetsRefToOne(PrefixCachePolicy):
    def hit(self, state, b):
        if state.refs[b] == 0:
            state.free.remove(b)
        state.refs[b] = 1


class _ReleaseFreesShared(PrefixCachePolicy):
    def release(self, state, blocks):
        for b in reversed(list(blocks)):
            if state.refs[b] > 0:
                state.refs[b] = 0
                state.free.append(b)
        return state


class _ForgetOnRelease(PrefixCachePolicy):
    def forget(self, state, b):
        self.evict(state, b)


class _EvictMostRecent(PrefixCachePolicy):
    def take(self, state):
        if not state.free:
            raise prefix_cache.CacheFull("no free block")
        b = state.free.pop()
        self.evict(state, b)
        state.refs[b] = 1
        return b


class _HitStaysInFree(PrefixCachePolicy):
    def hit(self, state, b):
        state.refs[b] += 1


class _StaleName(PrefixCachePolicy):
    def evict(self, state, b):
        pass


class _ReuseAll(PrefixCachePolicy):
    def lookup_blocks(self, n_tokens, bs):
        return n_tokens // bs


class _HitBlocks(PrefixCachePolicy):
    def hit_tokens(self, hits, bs):
        return hits


class _ReleaseHeadFirst(PrefixCachePolicy):
    def release(self, state, blocks):
        for b in blocks:
            state.refs[b] -= 1
            if state.refs[b] == 0:
                state.free.append(b)
        return state


class _TakeWithoutPop(PrefixCachePolicy):
    def take(self, state):
        if not state.free:
            raise prefix_cache.CacheFull("no free block")
        b = state.free[0]
        self.evict(state, b)
        state.refs[b] = state.refs[b] + 1
        return b


PREFIX_MISTAKES = [
    (_SharePartial, "shares a partial block: the request that owns it writes its next tokens there, into the other "
                    "requests' cache (only full blocks get a name)"),
    (_NoParentName, "names a block by its own tokens only: the same tokens after another prefix, or at another "
                    "position, would reuse KV computed in another context (name = hash((parent's name, tokens)))"),
    (_HitSetsRefToOne, "sets a shared block's reference count to 1 on a hit instead of adding one: when one of its "
                       "requests ends, the block is freed under the others"),
    (_ReleaseFreesShared, "frees a block on release although other requests still reference it"),
    (_ForgetOnRelease, "forgets a block's contents when its last request ends: a cached block keeps its name until "
                       "the pool evicts it (that is what lets the next turn of a chat hit)"),
    (_HitStaysInFree, "leaves a cached block in the free queue when a request reuses it: it could be evicted while "
                      "in use"),
    (_TakeWithoutPop, "hands out a free block without taking it off the free queue: two requests get the same block"),
    (_EvictMostRecent, "evicts the most recently freed block: take new blocks from the front of the free queue, the "
                       "least recently used first"),
    (_StaleName, "keeps the name of an evicted block: a later request would 'hit' a block that now holds other "
                 "tokens"),
    (_ReuseAll, "reuses every block of a fully cached prompt: its last token must still be computed (its logits "
                "start the reply), so look up only the full blocks within the first len(tokens) - 1 tokens"),
    (_HitBlocks, "counts hit blocks, not hit tokens"),
    (_ReleaseHeadFirst, "releases a request's blocks first to last: its prefix -- the part other requests share -- "
                        "is then evicted before its tail (release the last block first)"),
]


def prefix_scripts(rng) -> list:
    """(num_blocks, block_size, ops, label): ops ("alloc", key, tokens) / ("free", key). A scripted one (a shared
    system prompt, an identical request, a repeated block, a prompt that is all cached, everything released, then
    hits from the free queue, evictions, and a lookup of an evicted block's name), then random multi-turn chats
    through small pools."""
    S = list(range(1, 9))                                   # a system prompt of two blocks of 4
    script = [("alloc", "A", S + [100, 101, 102]), ("alloc", "B", S + [100, 101, 102]),
              ("alloc", "C", S[:4] + S[:4] + [7]), ("alloc", "D", S), ("free", "B"), ("free", "A"), ("free", "D"),
              ("free", "C"), ("alloc", "E", S + [200, 201, 202, 203, 204]), ("alloc", "F", list(range(300, 316))),
              ("alloc", "G", S[:4] + [9, 9, 9, 9, 9]), ("free", "E"), ("free", "G"),
              ("alloc", "H", list(range(400, 419))), ("alloc", "I", S + [100, 101, 102, 103, 104]), ("free", "H"),
              ("alloc", "J", S[:4] + S[:4] + [5])]
    out = [(14, 4, script, "a scripted sequence")]
    for _ in range(2):
        bs = rng.choice([2, 3, 4])
        trace = prefix_cache.multi_turn_trace(conversations=4, turns=3, system_prompts=2, system_len=3 * bs,
                                              user_len=(1, 2 * bs), reply_len=(1, 3 * bs), vocab=50,
                                              seed=rng.randrange(10 ** 6))
        ops, flight = [], []
        for i, t in enumerate(trace):
            if len(flight) == 2:
                ops.append(("free", flight.pop(0)))
            ops.append(("alloc", i, list(t.prompt + t.reply)))
            flight.append(i)
        ops += [("free", k) for k in flight]
        longest = max(len(t.prompt + t.reply) for t in trace)
        out.append((2 * -(-longest // bs) + rng.randint(0, 4), bs, ops, "a random multi-turn chat"))
    return out


def _observe(state) -> tuple:
    return tuple(state.free), tuple(sorted((b, n) for b, n in state.refs.items() if n))


def prefix_trajectory(allocate, release, num_blocks, bs, ops, call=None):
    """Yields what each op shows: (blocks, hit tokens, free queue, references) after an allocation, (free queue,
    references) after a release. `call(fn, args, i, op)` calls the functions (the checker's learner_call)."""
    call = call or (lambda fn, args, i, op: fn(*args))
    state, held = prefix_cache.new_state(num_blocks, bs), {}
    for i, op in enumerate(ops):
        if op[0] == "alloc":
            state, blocks, hits = call(allocate, (state, list(op[2])), i, op)
            held[op[1]] = list(blocks)
            yield (tuple(blocks), hits) + _observe(state)
        else:
            state = call(release, (state, list(held.pop(op[1]))), i, op)
            yield _observe(state)


def mistake_trajectory(cls, num_blocks, bs, ops) -> list:
    p, out = cls(), []
    try:
        for seen in prefix_trajectory(p.allocate, p.release, num_blocks, bs, ops):
            out.append(seen)
    except (prefix_cache.CacheFull, KeyError, ValueError):
        pass                                    # the wrong policy broke its own state: the steps before count
    return out


def describe_seen(seen) -> str:
    if len(seen) == 4:
        return f"blocks {list(seen[0])}, {seen[1]} hit tokens, free queue {list(seen[2])}, references {dict(seen[3])}"
    return f"free queue {list(seen[0])}, references {dict(seen[1])}"


def describe_op(op, bs) -> str:
    if op[0] == "free":
        return f"release(request {op[1]!r})"
    toks = op[2]
    return f"allocate(request {op[1]!r}: {len(toks)} tokens {toks[:12]}{'...' if len(toks) > 12 else ''})"
