"""The warm-ups of lab 14's three builds (14.9-14.13): their cases, the right answer of each, and the named wrong
answers as functions of the same arguments. A warm-up's answer is small (0 or 1, True or False), so one case cannot
tell two mistakes apart: `judge_all` runs every case first and names the mistake that gives ALL the learner's
answers, else the first case that differs.

- 14.9 `blocks_to_grow(tokens, block_size)` and 14.10 `can_admit(tokens, running, free_blocks, block_size,
  max_batch)` lead to the scheduler step (14.6);
- 14.11 `new_token_mask(seq_len, s_q, positions)` leads to the paged decode loop (14.7);
- 14.12 `block_names(tokens, block_size)` and 14.13 `hit_tokens(names, cached, n_tokens, block_size)` lead to the
  prefix cache (14.8).
"""
from __future__ import annotations

import copy

import torch

from common.core.checks import fail
from common.exercises.cases import as_number
from common.exercises.lab14_cases.watch import call
from common.systems.inference.scheduler import blocks_for


def judge_all(fn, cases: list, right, mistakes: list, describe, read, references=()) -> int:
    """Call `fn(*case)` on every case (read(got, where, case) turns an answer into comparable data, or fails); pass when
    every answer equals right(*case); else name the mistake (fn, why) whose answers equal ALL of the learner's, else
    the first case that differs. Returns the number of cases."""
    got = []
    for case in cases:
        where = describe(*case)
        got.append(read(call(fn, copy.deepcopy(case), where, references), where, case))
    expected = [right(*c) for c in cases]
    if got == expected:
        return len(cases)
    first = next(i for i, (g, e) in enumerate(zip(got, expected)) if g != e)
    where = describe(*cases[first])
    for wrong, why in mistakes:
        if [wrong(*c) for c in cases] == got:
            fail(f"{where}: {what(got[first])}: that {why} (expected {what(expected[first])})")
    fail(f"{where}: expected {what(expected[first])}, got {what(got[first])}")


def what(x) -> str:
    """An answer for a verdict: a mask as rows of 0/1, anything else as it is."""
    if isinstance(x, tuple) and x and isinstance(x[0], tuple):
        return "mask rows " + " / ".join("".join("1" if v else "0" for v in row) for row in x)
    return repr(x)


def read_whole(got, where: str, case=None) -> int:
    if isinstance(got, bool):
        return int(got)
    return as_number(got, where, "a whole number", integer=True)


def read_bool(got, where: str, case=None) -> bool:
    if hasattr(got, "item") and getattr(got, "ndim", 0) == 0:
        got = got.item()
    if not isinstance(got, (bool, int)) or got not in (0, 1):
        fail(f"{where} returned {type(got).__name__} {got!r:.60}; expected True or False")
    return bool(got)


# ---------------------------------------------------------------- 14.9

def grow_cases(rng) -> list:
    fixed = [(0, 16), (1, 16), (15, 16), (16, 16), (17, 16), (31, 16), (32, 16), (63, 64), (64, 64), (5, 1), (6, 3),
             (7, 3), (8, 3), (9, 3)]
    return fixed + [(rng.randint(0, 300), rng.choice([2, 3, 4, 5, 8, 16])) for _ in range(16)]


def grow_right(tokens, bs) -> int:
    return blocks_for(tokens + 1, bs) - blocks_for(tokens, bs)


GROW_MISTAKES = [
    (lambda t, bs: blocks_for(t + 1, bs), "is the request's whole count of blocks after the step; the question is how "
                                          "many NEW blocks it needs"),
    (lambda t, bs: 1, "asks for a new block at every step; a block holds block_size tokens, so a request needs a new "
                      "one only when its next token starts a block"),
    (lambda t, bs: (t + 1) // bs - t // bs, "rounds down: a request with tokens = k x block_size has its blocks full, "
                                            "and its next token needs a new one (ceil, not floor)"),
    (lambda t, bs: int(t % bs == 0 and t > 0), "gives a request with no tokens yet no block: its first token needs one"),
    (lambda t, bs: blocks_for(t, bs) - blocks_for(t - 1, bs) if t else 1,
     "looks at the token already written (tokens - 1 to tokens); the step writes token number tokens + 1"),
    (lambda t, bs: 0, "never asks for a block"),
]


def describe_grow(tokens, bs) -> str:
    return f"blocks_to_grow(tokens={tokens}, block_size={bs})"


# ---------------------------------------------------------------- 14.10

def admit_cases(rng) -> list:
    """(tokens, running, free_blocks, block_size, max_batch)."""
    fixed = [(15, 2, 1, 16, 4), (16, 2, 1, 16, 4), (16, 2, 2, 16, 4), (31, 3, 2, 16, 4), (32, 3, 2, 16, 4),
             (10, 4, 9, 16, 4), (10, 3, 9, 16, 4), (10, 5, 9, 16, 4), (0, 0, 1, 16, 4), (0, 0, 0, 16, 4),
             (47, 0, 3, 16, 8), (48, 0, 3, 16, 8), (5, 1, 2, 4, 2), (7, 1, 2, 4, 2), (8, 1, 2, 4, 2),
             (100, 0, 0, 16, 4)]
    rand = []
    for _ in range(16):
        bs = rng.choice([2, 4, 8, 16])
        t = rng.randint(0, 6 * bs)
        need = blocks_for(t + 1, bs)
        rand.append((t, rng.randint(0, 5), max(0, need + rng.randint(-1, 1)), bs, rng.randint(1, 5)))
    return fixed + rand


def admit_right(t, running, free, bs, mb) -> bool:
    return running < mb and blocks_for(t + 1, bs) <= free


ADMIT_MISTAKES = [
    (lambda t, r, f, bs, mb: r < mb and blocks_for(t, bs) <= f,
     "leaves no room for the token this step computes: an admitted request also computes its first new token now, "
     "so it needs blocks for tokens + 1"),
    (lambda t, r, f, bs, mb: r <= mb and blocks_for(t + 1, bs) <= f,
     "admits into a full batch: with max_batch requests running there is no place left (running < max_batch)"),
    (lambda t, r, f, bs, mb: blocks_for(t + 1, bs) <= f, "ignores max_batch"),
    (lambda t, r, f, bs, mb: r < mb, "admits past the KV budget: the request's blocks must fit in the free ones"),
    (lambda t, r, f, bs, mb: r < mb and blocks_for(t + 1, bs) < f,
     "refuses a request that fits exactly: blocks needed <= free blocks"),
    (lambda t, r, f, bs, mb: r < mb and (t + 1) // bs <= f,
     "rounds the blocks down: a partly filled block still takes a whole block (ceil)"),
    (lambda t, r, f, bs, mb: r < mb and t + 1 <= f,
     "compares tokens with blocks: convert the tokens to blocks of block_size first"),
]


def describe_admit(t, running, free, bs, mb) -> str:
    return f"can_admit(tokens={t}, running={running}, free_blocks={free}, block_size={bs}, max_batch={mb})"


# ---------------------------------------------------------------- 14.11

def mask_cases(rng) -> list:
    """(seq_len, s_q, positions): a block's token positions, some past the sequence's end (a partly filled block)."""
    fixed = [(10, 2, torch.arange(0, 16)), (7, 1, torch.arange(0, 8)), (70, 2, torch.arange(64, 80)),
             (5, 3, torch.arange(0, 8)), (33, 2, torch.arange(16, 32)), (2, 2, torch.arange(0, 4))]
    rand = []
    for _ in range(4):
        page = rng.choice([4, 8, 16])
        n = rng.randint(3, 5 * page)
        j = rng.randrange(-(-n // page))
        rand.append((n, rng.choice([1, 2, 3]), torch.arange(j * page, (j + 1) * page)))
    return fixed + rand


def _mask(pos, positions):
    return tuple(map(tuple, (positions[None, :] <= pos[:, None]).tolist()))


def mask_right(n, s, positions):
    return _mask(n - s + torch.arange(s), positions)


MASK_MISTAKES = [
    (lambda n, s, p: _mask(torch.arange(s), p), "puts the new tokens at positions 0..s_q-1; they are the LAST s_q of "
                                                "the seq_len cached tokens: new token i sits at seq_len - s_q + i"),
    (lambda n, s, p: tuple(map(tuple, (p[None, :] < (n - s + torch.arange(s))[:, None]).tolist())),
     "hides each new token from itself: a token attends its own position (<=, not <)"),
    (lambda n, s, p: tuple(map(tuple, (p[None, :] < n).expand(s, -1).tolist())),
     "is not causal across the new tokens: the first of MTP's two tokens must not see the second"),
    (lambda n, s, p: _mask(n + torch.arange(s), p), "puts the new tokens after the cache; seq_len already counts them"),
    (lambda n, s, p: _mask(n - 1 + torch.arange(s), p), "puts the first new token at seq_len - 1; the s_q new tokens "
                                                        "are the last s_q: the first sits at seq_len - s_q"),
    (lambda n, s, p: _mask(n - s + torch.arange(s), torch.arange(len(p))),
     "compares with the slot in the block (0..block_size-1); positions holds the tokens' positions in the sequence"),
    (lambda n, s, p: tuple(tuple(not v for v in row) for row in mask_right(n, s, p)),
     "marks the positions to hide; return True where the new token MAY attend"),
    (lambda n, s, p: _mask(n - 1 - torch.arange(s), p), "numbers the new tokens backwards: new token i sits at "
                                                        "seq_len - s_q + i, the last one at seq_len - 1"),
]


def describe_mask(n, s, positions) -> str:
    return f"new_token_mask(seq_len={n}, s_q={s}, positions={int(positions[0])}..{int(positions[-1])})"


def read_mask(got, where: str, case):
    """The mask as rows of bools: shape (s_q, len(positions)), bool or 0/1 values."""
    n, s, p = case
    if not isinstance(got, torch.Tensor):
        fail(f"{where} returned {type(got).__name__}; expected a bool tensor of shape ({s}, {len(p)})")
    if tuple(got.shape) == (len(p), s) and s != len(p):
        fail(f"{where}: shape {tuple(got.shape)} is (positions, s_q); return (s_q, positions): one row per new "
             f"token")
    if tuple(got.shape) != (s, len(p)):
        fail(f"{where}: shape {tuple(got.shape)}, expected ({s}, {len(p)}) = (s_q, len(positions))")
    if got.dtype != torch.bool and not bool(((got == 0) | (got == 1)).all()):
        additive = bool(((got == 0) | torch.isneginf(got)).all()) if got.is_floating_point() else False
        fail(f"{where}: values other than True/False (or 0/1)"
             + (": an additive mask (0 and -inf) is what the scores get; this function says WHERE each new token may "
                "attend, True or False" if additive else ": return where each new token may attend"))
    return tuple(map(tuple, got.bool().tolist()))


# ---------------------------------------------------------------- 14.12

def name_cases(rng) -> list:
    fixed = [(list(range(1, 13)), 4), (list(range(1, 11)), 4), ([5, 5, 5, 5, 5, 5, 5, 5, 9], 4),
             (list(range(20, 23)), 4), ([7] * 12, 3), (list(range(40, 48)), 8)]
    rand = []
    for _ in range(4):
        bs = rng.choice([2, 3, 4, 16])
        rand.append(([rng.randrange(50) for _ in range(rng.randint(1, 6 * bs))], bs))
    return fixed + rand


def check_names(names, tokens: list, bs: int, where: str) -> None:
    """A list of block names chained as hash((parent's name, tuple(block))): judged relation by relation (the first
    block's parent, None, hashes differently in another process, so its name is judged by consistency)."""
    if not isinstance(names, (list, tuple)):
        fail(f"{where} returned {type(names).__name__}; expected a list of names, one per full block")
    full, blocks = len(tokens) // bs, [tuple(tokens[i * bs:(i + 1) * bs]) for i in range(-(-len(tokens) // bs))]
    if len(names) == len(blocks) and len(blocks) != full:
        fail(f"{where}: {len(names)} names for {full} full blocks: you named the partial last block ({len(tokens) % bs}"
             f" of {bs} tokens); it never gets a name -- its request writes its next tokens there")
    if len(names) == (len(tokens) - 1) // bs and full != len(names):
        fail(f"{where}: {len(names)} names for {full} full blocks: name every full block (only a cache LOOKUP leaves "
             f"out the block holding the last token)")
    if len(names) != full:
        fail(f"{where}: {len(names)} names; expected {full}, one per full block of {bs} tokens")
    if full and names[0] is None:
        fail(f"{where}: names[0] is None -- you appended the parent before computing the block's name: append "
             f"hash((parent, tuple(block))), then make it the next block's parent")
    for i in range(1, full):
        if names[i] == hash((names[i - 1], blocks[i])):
            continue
        if names[i] == hash(blocks[i]):
            fail(f"{where}: name {i} is hash(tuple(block)): a block named by its own tokens only gets the same name "
                 f"after another prefix; name it hash((parent's name, tuple(block)))")
        if names[i] == hash((blocks[i], names[i - 1])):
            fail(f"{where}: name {i} is hash((tuple(block), parent)): the parent's name comes first, "
                 f"hash((parent's name, tuple(block))), as the cache of exercise 14.8 looks names up")
        if names[i] == hash(tuple(tokens[:(i + 1) * bs])):
            fail(f"{where}: name {i} hashes the whole prefix: it stands for the prefix too, but costs a hash of the "
                 f"whole prefix per block; chain them: hash((parent's name, tuple(block)))")
        fail(f"{where}: name {i} is not hash((names[{i - 1}], tuple(block {i}))) with block {i} = "
             f"tokens[{i * bs}:{(i + 1) * bs}]")


def first_name_consistent(fn, where_of, bs: int, rng) -> None:
    """The first block's name: the same for the same first block after any tail, different for another block."""
    a = [rng.randrange(1000) for _ in range(bs)]
    b = a[:-1] + [a[-1] + 1]
    runs = {tuple(t): call(fn, (t, bs), where_of(t, bs)) for t in (a + [1] * bs, a + [2] * (bs + 1), b + a)}
    first = [v[0] for v in runs.values()]
    if first[0] != first[1]:
        fail(f"{where_of(a + [2] * (bs + 1), bs)}: the first block's name changed with the tokens after it; it depends "
             f"on its own tokens (and its parent, None) only")
    if first[0] == first[2]:
        fail(f"{where_of(b + a, bs)}: two different first blocks got the same name")


def describe_names(tokens, bs) -> str:
    return f"block_names(tokens={tokens[:10]}{'...' if len(tokens) > 10 else ''} ({len(tokens)} tokens), block_size={bs})"


# ---------------------------------------------------------------- 14.13

def hit_cases(rng) -> list:
    """(names, cached, n_tokens, block_size): names of the request's full blocks, the cache's name -> block."""
    def case(n_tokens, bs, present):
        names = [f"n{i}" for i in range(n_tokens // bs)]
        return names, {names[i]: 10 + i for i in present}, n_tokens, bs
    fixed = [case(12, 4, [0, 1]), case(12, 4, [0, 1, 2]), case(13, 4, [0, 1, 2]), case(12, 4, [0, 2]),
             case(12, 4, [1, 2]), case(9, 4, []), case(3, 4, []), case(16, 4, [0, 1, 2, 3]), case(17, 4, [0, 1, 2, 3]),
             case(20, 4, [0, 1, 3, 4])]
    rand = []
    for _ in range(6):
        bs = rng.choice([2, 3, 4, 16])
        n = rng.randint(1, 8 * bs)
        k = n // bs
        lead = rng.randint(0, k)
        rand.append(case(n, bs, list(range(lead)) + [i for i in range(lead + 1, k) if rng.random() < 0.5]))
    return fixed + rand


def _leading(names, cached, limit):
    n = 0
    while n < limit and names[n] in cached:
        n += 1
    return n


def hit_right(names, cached, n, bs) -> int:
    return _leading(names, cached, (n - 1) // bs) * bs


HIT_MISTAKES = [
    (lambda nm, c, n, bs: _leading(nm, c, n // bs) * bs,
     "reuses the block holding the last token: its logits start the reply, so it is always computed -- look up only "
     "the full blocks within the first n_tokens - 1 tokens"),
    (lambda nm, c, n, bs: sum(x in c for x in nm[:(n - 1) // bs]) * bs,
     "counts cached blocks after the first miss: a block's KV depends on every token before it, so the shared "
     "prefix ends at the first block not cached"),
    (lambda nm, c, n, bs: _leading(nm, c, (n - 1) // bs), "counts blocks, not tokens (multiply by block_size)"),
    (lambda nm, c, n, bs: sum(x in c for x in nm) * bs, "counts every cached name: only the leading run counts, "
                                                       "and never the block holding the last token"),
    (lambda nm, c, n, bs: _leading(nm, c, n // bs - 1) * bs,
     "looks up one block fewer than it may (n_tokens // block_size - 1): a last token in a partial block leaves "
     "every full block before it to the cache -- the limit is (n_tokens - 1) // block_size blocks"),
    (lambda nm, c, n, bs: min(_leading(nm, c, (n - 1) // bs) + 1, (n - 1) // bs) * bs,
     "counts the first block that is NOT cached as a hit: the run ends before it"),
    (lambda nm, c, n, bs: min(_leading(nm, c, n // bs) * bs, n - 1),
     "serves part of the block holding the last token (capped at n_tokens - 1): hits are whole blocks, and that "
     "block is computed whole"),
    (lambda nm, c, n, bs: _leading(nm, set(c.values()), (n - 1) // bs) * bs,
     "looks the names up among the cache's block ids (cached.values()); cached maps name -> block: test "
     "`name in cached`"),
]


def describe_hit(names, cached, n, bs) -> str:
    return (f"hit_tokens(names={names[:6]}{'...' if len(names) > 6 else ''}, cached={sorted(cached)}, n_tokens={n}, "
            f"block_size={bs})")
