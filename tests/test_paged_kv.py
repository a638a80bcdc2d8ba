"""common.systems.inference.paged_kv (allocation, copy-on-write, errors that never corrupt another request) and
common.systems.inference.kv_trace (fragmentation, paged against contiguous)."""
import pytest
import torch

from common.systems.inference import kv_trace
from common.systems.inference.paged_kv import BlockAllocator, CacheFull, PagedKVCache, fp8_kv


def _rows(n, width=4, layers=1, seed=0):
    return torch.randn(layers, n, width, generator=torch.Generator().manual_seed(seed))


def _snapshot(cache):
    return {s: cache.gather(s).clone() for s in cache.seq_ids}


def _invariants(cache):
    """Every block is free or referenced exactly as often as the sequences hold it."""
    held = {}
    for s in cache.seq_ids:
        for b in cache.blocks(s):
            held[b] = held.get(b, 0) + 1
    for b in range(cache.num_blocks):
        assert cache.alloc.refcount[b] == held.get(b, 0)
    assert cache.alloc.num_free == cache.num_blocks - len(held)


def test_append_gather_and_block_table():
    c = PagedKVCache(10, block_size=4, width=4)
    c.add("a"), c.add("b")
    ra, rb = _rows(6, seed=1), _rows(9, seed=2)
    c.append("a", ra[0][:3]), c.append("b", rb[0][:5]), c.append("a", ra[0][3:]), c.append("b", rb[0][5:])
    assert torch.equal(c.gather("a"), ra[0]) and torch.equal(c.gather("b"), rb[0])
    t = c.block_table(["a", "b"])
    assert t.shape == (2, 3) and t.dtype == torch.int32 and t[0, 2] == 0        # padding
    assert c.seq_lens(["a", "b"]).tolist() == [6, 9]
    st = c.stats()
    assert st["reserved_tokens"] == 5 * 4 and st["used_tokens"] == 15 and st["waste_fraction"] == pytest.approx(0.25)
    _invariants(c)


def test_free_returns_blocks_and_a_freed_sequence_is_refused():
    c = PagedKVCache(4, block_size=4, width=4)
    c.add(1)
    c.append(1, _rows(10)[0])
    c.free(1)
    assert c.alloc.num_free == 4
    with pytest.raises(ValueError, match=r"seq_id=1 was freed; its blocks may now hold another request's cache"):
        c.extend(1, 1)
    with pytest.raises(ValueError, match=r"seq_id=1 was freed"):
        c.free(1)
    with pytest.raises(ValueError, match=r"seq_id=7 is not in the cache"):
        c.gather(7)
    with pytest.raises(ValueError, match=r"is in the cache already"):
        c.add(2), c.add(2)


def test_request_longer_than_the_pool_changes_nothing():
    c = PagedKVCache(6, block_size=4, width=4)
    c.add("a"), c.add("b")
    c.append("a", _rows(7, seed=3)[0]), c.append("b", _rows(5, seed=4)[0])
    before, free = _snapshot(c), c.alloc.num_free
    c.add("big")
    with pytest.raises(CacheFull, match=r"seq_id='big' needs 7 more blocks of 4 tokens for 25 tokens; 2 of 6 are "
                                        r"free \(the whole pool holds 24 tokens\); nothing was changed"):
        c.append("big", _rows(25)[0])
    assert c.alloc.num_free == free and c.length("big") == 0
    assert all(torch.equal(before[s], c.gather(s)) for s in before)
    _invariants(c)


def test_copy_on_write_keeps_the_parent_intact():
    c = PagedKVCache(8, block_size=4, width=4)
    c.add("p")
    prefix = _rows(6, seed=5)[0]
    c.append("p", prefix)
    c.fork("p", "c")
    assert c.blocks("c") == c.blocks("p") and c.stats()["shared_blocks"] == 2
    mine = _rows(3, seed=6)[0]
    c.append("c", mine)                      # writes into the shared, half-filled last block: copied first
    assert torch.equal(c.gather("p"), prefix)
    assert torch.equal(c.gather("c"), torch.cat([prefix, mine]))
    assert c.blocks("c")[0] == c.blocks("p")[0] and c.blocks("c")[1] != c.blocks("p")[1]
    c.free("p")
    assert torch.equal(c.gather("c")[:6], prefix)
    _invariants(c)


def test_writes_into_free_or_shared_blocks_are_refused():
    c = PagedKVCache(6, block_size=4, width=4)
    c.add("a")
    c.append("a", _rows(4)[0])
    c.fork("a", "b")
    shared = torch.tensor([c.blocks("a")[0] * 4])
    with pytest.raises(ValueError, match=r"block 0 is shared by 2 sequences: writing it would change the others"):
        c.write(0, shared, torch.zeros(1, 4))
    with pytest.raises(ValueError, match=r"block 5 is free: writing a freed block would corrupt"):
        c.write(0, torch.tensor([5 * 4 + 1]), torch.zeros(1, 4))
    with pytest.raises(ValueError, match=r"rows has shape \(2, 4\); expected \(1, 4\)"):
        c.write(0, torch.tensor([1]), torch.zeros(2, 4))
    with pytest.raises(ValueError, match=r"layer=1 is not allowed"):
        c.write(1, torch.tensor([1]), torch.zeros(1, 4))


def test_a_stale_block_table_is_caught_and_the_new_owner_is_safe():
    c = PagedKVCache(4, block_size=4, width=4)
    c.add("old")
    c.append("old", _rows(8, seed=7)[0])
    stale = c.block_table(["old"])
    c.free("old")
    c.add("new")
    new_rows = _rows(8, seed=8)[0]
    c.append("new", new_rows)                 # reuses the freed blocks
    with pytest.raises(ValueError, match=r"seq_id='old' was freed"):
        c.check_table(["old"], stale)
    assert c.blocks("new") == [1, 0]                          # the most recently freed block first
    with pytest.raises(ValueError, match=r"entry 0: block 0, which is in use, but not as this block; the "
                                         r"sequence's block 0 is 1 -- the table is stale"):
        c.check_table(["new"], stale)
    c.check_table(["new"], c.block_table(["new"]))
    assert torch.equal(c.gather("new"), new_rows)


def test_truncate_and_double_free_guard():
    c = PagedKVCache(5, block_size=4, width=4)
    c.add(0)
    c.append(0, _rows(10)[0])
    c.truncate(0, 5)
    assert c.length(0) == 5 and len(c.blocks(0)) == 2 and c.alloc.num_free == 3
    with pytest.raises(ValueError, match=r"length=6 is not allowed; allowed: 0..5"):
        c.truncate(0, 6)
    a = BlockAllocator(2)
    b = a.alloc()
    a.decref(b)
    with pytest.raises(ValueError, match=r"block 0 is free already: freed twice"):
        a.decref(b)
    with pytest.raises(ValueError, match=r"num_blocks=0 must be an integer >= 1"):
        BlockAllocator(0)


def test_multi_layer_append():
    c = PagedKVCache(4, block_size=2, width=3, layers=2)
    c.add(0)
    r = _rows(3, width=3, layers=2)
    c.append(0, r)
    assert torch.equal(c.gather(0, 1), r[1]) and torch.equal(c.gather(0, 0), r[0])
    with pytest.raises(ValueError, match=r"expected \(2, n, 3\)"):
        c.append(0, r[0])


def test_fp8_kv_format_and_error():
    kv = torch.randn(50, 576, generator=torch.Generator().manual_seed(0))
    deq, per_token = fp8_kv(kv, 64)
    assert per_token == 656                                   # FlashMLA's FP8 format
    rel = float((deq[:, :512] - kv[:, :512]).norm() / kv[:, :512].norm())
    assert 0.005 < rel < 0.05                                 # E4M3: 3 mantissa bits
    assert float((deq[:, 512:] - kv[:, 512:]).abs().max()) < 0.02   # RoPE part in BF16
    with pytest.raises(ValueError, match=r"not a multiple of block=128"):
        fp8_kv(kv[:, :300], 64)


def test_trace_paged_wastes_little_and_admits_more():
    trace = kv_trace.synthetic_trace(120, seed=1)
    paged = kv_trace.simulate(trace, 32768, "paged")
    contiguous = kv_trace.simulate(trace, 32768, "contiguous")
    assert paged.waste_fraction < 0.1 < 0.4 < contiguous.waste_fraction
    assert paged.mean_running > 1.3 * contiguous.mean_running and paged.steps < contiguous.steps
    assert kv_trace.simulate(trace, 32768, "paged") == paged          # deterministic
    with pytest.raises(ValueError, match=r"policy='buddy' is not allowed"):
        kv_trace.simulate(trace, 32768, "buddy")
    with pytest.raises(ValueError, match=r"can never run"):
        kv_trace.simulate(trace, 512, "contiguous")


def test_first_fit_merges_neighbours():
    f = kv_trace.FirstFit(100)
    a, b, c = f.take(30), f.take(30), f.take(30)
    assert (a, b, c) == (0, 30, 60) and f.take(20) is None
    f.give(a, 30), f.give(b, 30)
    assert f.free[0] == (0, 60) and f.take(50) == 0
