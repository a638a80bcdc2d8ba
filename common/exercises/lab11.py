"""Checkers for lab 11 (beyond the GPU): KV-cache sizing, paged allocation, GPU sharing, checkpoint write time."""
from __future__ import annotations

import math

from common.core.checks import checker, expect, fail
from common.exercises.cases import as_number, expect_number, fresh_cases, learner_call
from common.systems import storage
from common.systems.host import sharing
from common.systems.inference import kvcache

BYTES_PER_VALUE = (1, 2, 4)  # FP8/INT8, BF16/FP16, FP32: each gets a fixed case


@checker("11.1", "KV-cache bytes per token (MHA / GQA)")
def check_kv_bytes_per_token(fn):
    """fn(layers, heads, kv_heads, head_dim, bytes_per_value) -> bytes of K and V cached per token."""
    with fresh_cases() as cases:
        rng = cases.rng
        # asymmetric first cases (layers, heads, kv_heads, head_dim and bytes all different, so no two mistakes give
        # the same number), every element size fixed, MHA and MQA included
        cases_ = [(24, 32, 8, 128, 2), (80, 64, 8, 96, 1), (28, 16, 4, 64, 4), (32, 32, 32, 128, 2),
                  (18, 8, 1, 256, 2)] + [
            (rng.randint(1, 96), h, rng.choice([d for d in (1, 2, 4, 8, h) if h % d == 0]), rng.choice([64, 128]),
             rng.choice(BYTES_PER_VALUE)) for h in (rng.choice([16, 32, 64, 128]) for _ in range(4))]
        for layers, heads, kv_heads, d, b in cases_:
            expected = kvcache.kv_bytes_per_token(layers, kv_heads, d, d, b)
            where = f"layers={layers}, heads={heads}, kv_heads={kv_heads}, head_dim={d}, bytes={b}"
            call = f"kv_bytes_per_token({layers}, {heads}, {kv_heads}, {d}, {b})"
            got = as_number(learner_call(fn, (layers, heads, kv_heads, d, b), call,
                                         (kvcache.kv_bytes_per_token,)), call, "bytes, a number")
            mistakes = [
                (kv_heads != heads, layers * heads * 2 * d * b,
                 f"you cached K and V for all {heads} query heads; with grouped-query attention only the "
                 f"{kv_heads} KV heads are cached"),
                (True, expected / 2, "half the answer -- both K and V are cached"),
                (layers > 1, expected / layers, "the figure for one layer -- every layer has its own cache"),
                (b != 1, expected / b, "the count of values, not bytes -- multiply by bytes_per_value"),
                (b != 2, expected / b * 2, "a fixed 2 bytes per value -- use bytes_per_value"),
                (True, expected * 8, "bits, not bytes"),
            ]
            named = [why for applies, value, why in mistakes if applies and math.isclose(got, value, rel_tol=1e-12)
                     and not math.isclose(value, expected, rel_tol=1e-12)]
            if named:
                fail(f"{where}: got {got:.10g}: {' or '.join(named)}")
            expect_number(got, expected, f"bytes per token for {where}", rtol=1e-12)
    return "K and V, per KV head, per layer (GQA caches only the KV heads), for 1-, 2- and 4-byte values"


@checker("11.2", "MLA cache bytes per token")
def check_mla_bytes_per_token(fn):
    """fn(layers, kv_lora_rank, rope_dim, bytes_per_value) -> bytes cached per token by multi-head latent attention."""
    with fresh_cases() as cases:
        rng = cases.rng
        cases_ = [(61, 512, 64, 2), (27, 256, 32, 1), (40, 1024, 64, 4)] + [
            (rng.randint(1, 100), rng.choice([256, 512, 1024]), rng.choice([32, 64]), rng.choice(BYTES_PER_VALUE))
            for _ in range(4)]
        for layers, rank, rope, b in cases_:
            expected = kvcache.mla_bytes_per_token(layers, rank, rope, b)
            where = f"layers={layers}, kv_lora_rank={rank}, rope_dim={rope}, bytes={b}"
            call = f"mla_bytes_per_token({layers}, {rank}, {rope}, {b})"
            got = as_number(learner_call(fn, (layers, rank, rope, b), call, (kvcache.mla_bytes_per_token,)),
                            call, "bytes, a number")
            if got == layers * rank * b:
                fail(f"{where}: you left out the decoupled RoPE key ({rope} values per layer), which MLA caches "
                     f"beside the latent")
            if got == 2 * expected or got == layers * (2 * rank + rope) * b:
                fail(f"{where}: got {got:.10g}: MLA caches ONE latent from which both K and V are recovered, not "
                     f"separate K and V")
            if layers > 1 and got == expected / layers:
                fail(f"{where}: got {got:.10g}, the figure for one layer -- every layer caches its own latent")
            if b != 1 and got == expected / b:
                fail(f"{where}: got {got:.10g}, the count of values -- multiply by bytes_per_value")
            expect_number(got, expected, f"MLA bytes per token for {where}", rtol=1e-12)
    return "layers x (latent + RoPE key) x bytes: 576 values per layer for DeepSeek-V3"


@checker("11.3", "waste of paged allocation")
def check_paged_waste(fn):
    """fn(lengths, block_size) -> token slots reserved but unused when each sequence gets whole blocks."""
    with fresh_cases() as cases:
        rng = cases.rng
        cases_ = [([16, 32, 48], 16), ([1, 17, 33], 16), ([5], 8), ([40, 7, 64, 100], 32)] + [
            ([rng.randint(1, 4000) for _ in range(rng.randint(1, 50))], rng.choice([8, 16, 32, 128]))
            for _ in range(5)]
        for lengths, block in cases_:
            expected = kvcache.paged_waste(lengths, block)
            shown = f"{lengths[:6]}{'...' if len(lengths) > 6 else ''}"
            call = f"paged_waste({shown}, {block})"
            passed = list(lengths)
            got = as_number(learner_call(fn, (passed, block), call, (kvcache.paged_waste,)), call,
                            "a number of token slots")
            expect(passed == lengths, f"{call}: your function changed the list of lengths it was given; work on a "
                                      f"copy")
            plus_one = sum((n // block + 1) * block - n for n in lengths)
            if got == plus_one and got != expected:
                fail(f"lengths {shown} with block {block}: got {got:.0f}; a length that is an exact multiple of "
                     f"the block fills its blocks exactly (waste 0) -- use ceil(n / block), not n // block + 1")
            if got == sum(n % block for n in lengths) and got != expected:
                fail(f"lengths {shown} with block {block}: got {got:.0f}: you counted the tokens in the last, "
                     f"partial block; the waste is the EMPTY slots of that block")
            if got == sum(-n % block for n in lengths[:1]) and len(lengths) > 1 and got != expected:
                fail(f"lengths {shown} with block {block}: got {got:.0f}, the waste of the first sequence only; "
                     f"sum over every sequence")
            expect(got == expected, f"{call}: expected {expected}, got {got:.10g}")
    return "sum of ceil(n / block) * block - n: less than one block per sequence"


@checker("11.4", "GPU sharing utilisation")
def check_shared_utilisation(fn):
    """fn(demand, n_jobs, mode) -> fraction of the GPU kept busy; mode in time-slicing, mig, mps (7 MIG slices)."""
    with fresh_cases() as cases:
        rng = cases.rng
        cases_ = [(0.1, 7, "mig"), (0.3, 3, "mig"), (0.1, 10, "mig"), (0.3, 5, "mps"), (0.1, 4, "time-slicing"),
                  (0.2, 3, "mps"), (0.05, 9, "mig")] + [
            (round(rng.uniform(0.02, 1.0), 3), rng.randint(1, 12), rng.choice(sharing.MODES)) for _ in range(8)]
        for demand, n, mode in cases_:
            expected = sharing.shared_utilisation(demand, n, mode)
            where = f"demand={demand}, n_jobs={n}, mode={mode!r}"
            call = f"shared_utilisation({demand}, {n}, {mode!r})"
            got = as_number(learner_call(fn, (demand, n, mode), call, (sharing.shared_utilisation,)), call,
                            "a fraction")
            if mode == "mig" and demand > 1 / 7 and math.isclose(got, min(n, 7) * demand):
                fail(f"{where}: a MIG instance is a hard slice of 1/7 of the SMs; a job cannot use more than its "
                     f"slice however much it wants")
            if mode == "mig" and n > 7 and math.isclose(got, n * min(demand, 1 / 7)):
                fail(f"{where}: at most 7 MIG instances fit on the GPU; the other jobs wait")
            if mode == "mig" and not math.isclose(expected, min(n, 7) / 7) and math.isclose(got, min(n, 7) / 7):
                fail(f"{where}: got {got:.4g}: a job uses at most its demand ({demand}) inside its 1/7 slice, not "
                     f"the whole slice")
            if mode == "mps" and n * demand > 1 and got > 1:
                fail(f"{where}: got {got:.4g}; utilisation cannot exceed the whole GPU (1.0)")
            if mode == "time-slicing" and n > 1 and math.isclose(got, min(1.0, n * demand)) \
                    and not math.isclose(expected, min(1.0, n * demand)):  # demand 1.0: the two agree
                fail(f"{where}: time slicing runs one context at a time, so the jobs do not add up")
            expect_number(got, expected, f"utilisation for {where}", rtol=1e-9, atol=1e-12)
    return "time slicing keeps one job's demand; MIG caps each job at its slice; MPS adds demands up to 1"


def _number(fn, name: str, args: tuple, reference, what: str) -> float:
    """The learner's fn(*args) as one number; a crash, a call to `reference` or another type is a verdict that
    writes the call out."""
    text = f"{name}({', '.join(map(str, args))})"
    return as_number(learner_call(fn, args, text, (reference,)), text, what)


@checker("11.5", "checkpoint seconds from size, ranks and bandwidth")
def check_checkpoint_seconds(fn):
    """fn(checkpoint_gb, ranks, nic_gbps, storage_gbs) -> seconds to write the checkpoint: each rank writes its share
    through its own NIC (Gbps: bits), all of them into storage of storage_gbs GB/s (bytes) in all."""
    with fresh_cases() as cases:
        rng = cases.rng
        # fixed first cases: NIC-bound, storage-bound, one rank, and DeepSeek-V3 on 256 nodes against 3FS's 6.6 TiB/s
        cases_ = [(6826.4, 256, 200.0, 7256.8), (100.0, 4, 400.0, 3.0), (40.0, 1, 100.0, 50.0),
                  (1000.0, 16, 200.0, 500.0), (250.0, 8, 25.0, 900.0)] + [
            (round(rng.uniform(1, 10_000), 1), rng.choice([1, 2, 8, 64, 512]), rng.choice([25.0, 100.0, 200.0, 400.0]),
             round(rng.uniform(1, 8000), 1)) for _ in range(6)]
        for args in cases_:
            size, ranks, nic, store = args
            expected = storage.checkpoint_seconds(*args)
            got = _number(fn, "checkpoint_seconds", args, storage.checkpoint_seconds, "seconds, a number")
            where = f"checkpoint_gb={size}, ranks={ranks}, nic_gbps={nic}, storage_gbs={store}"
            nic_s, store_s = size / ranks / (nic / 8), size / store
            mistakes = [
                (max(size / ranks / nic, store_s), "NIC rates are in gigaBITS per second: divide by 8 for bytes"),
                (nic_s, f"the storage's {store} GB/s is shared by all {ranks} writers: it caps their total"),
                (store_s, f"each rank's NIC ({nic} Gbps) also limits its share"),
                (max(size / (nic / 8), store_s), f"all {ranks} ranks write in parallel, each only its 1/{ranks} share"),
                (nic_s + store_s, "the two limits act at once (the bytes stream through both): take the slower, "
                                  "not the sum"),
                (size / (ranks * nic / 8 + store), "bandwidths in series do not add: the slower limit sets the pace"),
                (min(nic_s, store_s), "the FASTER of the two limits: the write goes at the pace of the slower one"),
                (expected / 60, "minutes, not seconds"),
                (expected * 1e9 / 2**30, "GB are 1e9 bytes here, not GiB"),
                (expected * 2**30 / 1e9, "GB are 1e9 bytes here, not GiB"),
            ]
            named = [why for value, why in mistakes if math.isclose(got, value, rel_tol=1e-9)
                     and not math.isclose(value, expected, rel_tol=1e-9)]
            if named:
                fail(f"{where}: got {got:.10g} s: {' -- or '.join(dict.fromkeys(named))}")
            expect_number(got, expected, f"seconds for {where}", rtol=1e-9)
    return "max(checkpoint / ranks / (NIC / 8), checkpoint / storage): parallel writers, shared storage"
