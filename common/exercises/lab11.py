"""Checkers for lab 11 (beyond the GPU): KV-cache sizing, paged allocation, GPU sharing."""
from __future__ import annotations

import math
import random

from common import kvcache, sharing
from common.checks import checker, expect, expect_close


@checker("11.1", "KV-cache bytes per token (MHA / GQA)")
def check_kv_bytes_per_token(fn):
    """fn(layers, heads, kv_heads, head_dim, bytes_per_value) -> bytes of K and V cached per token."""
    rng = random.Random()
    cases = [(32, 32, 32, 128, 2), (80, 64, 8, 128, 2)] + [
        (rng.randint(1, 96), h, rng.choice([d for d in (1, 2, 4, 8, h) if h % d == 0]), rng.choice([64, 128]),
         rng.choice([1, 2, 4])) for h in (rng.choice([16, 32, 64, 128]) for _ in range(5))]
    for layers, heads, kv_heads, d, b in cases:
        expected = kvcache.kv_bytes_per_token(layers, kv_heads, d, d, b)
        got = fn(layers, heads, kv_heads, d, b)
        where = f"layers={layers}, heads={heads}, kv_heads={kv_heads}, head_dim={d}, bytes={b}"
        if kv_heads != heads and got == kvcache.kv_bytes_per_token(layers, heads, d, d, b):
            expect(False, f"{where}: you cached K and V for all {heads} query heads; with grouped-query attention "
                          f"only the {kv_heads} KV heads are cached")
        if got == expected / 2:
            expect(False, f"{where}: got {got}, half the answer -- both K and V are cached")
        if got == expected / layers and layers > 1:
            expect(False, f"{where}: got {got}, the figure for one layer -- every layer has its own cache")
        expect_close(got, expected, f"bytes per token for {where}", rtol=1e-12, atol=0)
    return "K and V, per KV head, per layer (GQA caches only the KV heads)"


@checker("11.2", "MLA cache bytes per token")
def check_mla_bytes_per_token(fn):
    """fn(layers, kv_lora_rank, rope_dim, bytes_per_value) -> bytes cached per token by multi-head latent attention."""
    rng = random.Random()
    cases = [(61, 512, 64, 2)] + [(rng.randint(1, 100), rng.choice([256, 512, 1024]), rng.choice([32, 64]),
                                   rng.choice([1, 2])) for _ in range(5)]
    for layers, rank, rope, b in cases:
        expected = kvcache.mla_bytes_per_token(layers, rank, rope, b)
        got = fn(layers, rank, rope, b)
        where = f"layers={layers}, kv_lora_rank={rank}, rope_dim={rope}, bytes={b}"
        if got == layers * rank * b:
            expect(False, f"{where}: you left out the decoupled RoPE key ({rope} values per layer), which MLA "
                          f"caches beside the latent")
        if got == 2 * expected:
            expect(False, f"{where}: got twice the answer -- MLA caches ONE latent from which both K and V are "
                          f"recovered, not separate K and V")
        expect_close(got, expected, f"MLA bytes per token for {where}", rtol=1e-12, atol=0)
    return "layers x (latent + RoPE key) x bytes: 576 values per layer for DeepSeek-V3"


@checker("11.3", "waste of paged allocation")
def check_paged_waste(fn):
    """fn(lengths, block_size) -> token slots reserved but unused when each sequence gets whole blocks."""
    rng = random.Random()
    cases = [([16, 32, 48], 16), ([1, 17, 33], 16), ([5], 8)] + [
        ([rng.randint(1, 4000) for _ in range(rng.randint(1, 50))], rng.choice([8, 16, 32, 128])) for _ in range(5)]
    for lengths, block in cases:
        expected = kvcache.paged_waste(lengths, block)
        got = fn(list(lengths), block)
        if lengths == [16, 32, 48] and got != 0:
            expect(False, f"lengths {lengths} with block {block}: got {got}; a length that is an exact multiple of "
                          f"the block fills its blocks exactly (waste 0) -- use ceil(n / block), not n // block + 1")
        if lengths == [1, 17, 33] and got == sum(n - (n // block) * block for n in lengths):
            expect(False, f"lengths {lengths} with block {block}: you counted the tokens in the last, partial block; "
                          f"the waste is the EMPTY slots of that block")
        expect(got == expected, f"paged_waste({lengths[:6]}{'...' if len(lengths) > 6 else ''}, {block}): "
                                f"expected {expected}, got {got}")
    return "sum of ceil(n / block) * block - n: less than one block per sequence"


@checker("11.4", "GPU sharing utilisation")
def check_shared_utilisation(fn):
    """fn(demand, n_jobs, mode) -> fraction of the GPU kept busy; mode in time-slicing, mig, mps (7 MIG slices)."""
    rng = random.Random()
    cases = [(0.1, 7, "mig"), (0.3, 3, "mig"), (0.1, 10, "mig"), (0.3, 5, "mps"), (0.1, 4, "time-slicing")] + [
        (round(rng.uniform(0.02, 1.0), 3), rng.randint(1, 12), rng.choice(sharing.MODES)) for _ in range(8)]
    for demand, n, mode in cases:
        expected = sharing.shared_utilisation(demand, n, mode)
        got = fn(demand, n, mode)
        where = f"demand={demand}, n_jobs={n}, mode={mode!r}"
        if mode == "mig" and demand > 1 / 7 and math.isclose(got, min(n, 7) * demand):
            expect(False, f"{where}: a MIG instance is a hard slice of 1/7 of the SMs; a job cannot use more than "
                          f"its slice however much it wants")
        if mode == "mig" and n > 7 and math.isclose(got, n * min(demand, 1 / 7)):
            expect(False, f"{where}: at most 7 MIG instances fit on the GPU; the other jobs wait")
        if mode == "mps" and n * demand > 1 and got > 1:
            expect(False, f"{where}: got {got:.3f}; utilisation cannot exceed the whole GPU (1.0)")
        if mode == "time-slicing" and n > 1 and math.isclose(got, min(1.0, n * demand)):
            expect(False, f"{where}: time slicing runs one context at a time, so the jobs do not add up")
        expect_close(got, expected, f"utilisation for {where}", rtol=1e-9, atol=1e-12)
    return "time slicing keeps one job's demand; MIG caps each job at its slice; MPS adds demands up to 1"
