"""A paged KV cache: fixed-size blocks handed out as sequences grow (vLLM's PagedAttention, arXiv 2309.06180; FlashMLA
reads BF16 blocks of 64 tokens through a block table), copy-on-write prefix sharing, and an FP8 format of the cache.

`PagedKVCache(num_blocks, block_size, width, layers)` holds `storage` (layers, num_blocks, block_size, width) and a
block table per sequence. `reserve(seq, n)` makes room for n more tokens -- all or nothing; `extend(seq, n)` does the
same and returns their flat slots (block * block_size + offset); `write(layer, slots, rows)` stores values there;
`append(seq, rows)` does both.
`fork(parent, child)` shares the parent's blocks (reference counts); the first write into a shared, partly filled
last block copies it first (copy-on-write), so a child never changes its parent's cache. Bad input raises before
anything changes: a request longer than the pool (`CacheFull`), an unknown or freed sequence, a write into a free
or a shared block, a stale block table (`check_table`).
Fragmentation over a request trace, paged against contiguous allocation: `common.systems.inference.kv_trace`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from common.core.validate import whole


class CacheFull(RuntimeError):
    """Not enough free blocks for a request; nothing was changed."""


class BlockAllocator:
    """Free list and reference counts of `num_blocks` blocks: a stack, blocks 0, 1, 2, ... first, then the most
    recently freed block first."""

    def __init__(self, num_blocks: int):
        self.num_blocks = whole("num_blocks", num_blocks)
        self.refcount = [0] * num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))   # a stack: pop() gives 0 first

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self) -> int:
        if not self._free:
            raise CacheFull(f"no free block (all {self.num_blocks} in use)")
        b = self._free.pop()
        self.refcount[b] = 1
        return b

    def incref(self, b: int) -> None:
        if self.refcount[b] < 1:
            raise ValueError(f"block {b} is free: a freed block cannot be shared")
        self.refcount[b] += 1

    def decref(self, b: int) -> bool:
        """Drop one reference; True when the block became free."""
        if self.refcount[b] < 1:
            raise ValueError(f"block {b} is free already: freed twice")
        self.refcount[b] -= 1
        if self.refcount[b] == 0:
            self._free.append(b)
            return True
        return False


@dataclass
class _Seq:
    blocks: list = field(default_factory=list)
    length: int = 0


class PagedKVCache:
    """Block allocation, block tables and (unless storage=False) the cached values themselves."""

    def __init__(self, num_blocks: int, block_size: int = 64, width: int = 576, layers: int = 1,
                 dtype=torch.float32, device="cpu", storage: bool = True):
        for name, v in (("block_size", block_size), ("width", width), ("layers", layers)):
            whole(name, v)
        self.alloc = BlockAllocator(num_blocks)
        self.num_blocks, self.block_size, self.width, self.layers = num_blocks, block_size, width, layers
        self.storage = torch.zeros(layers, num_blocks, block_size, width, dtype=dtype, device=device) \
            if storage else None
        self._seqs: dict = {}
        self._freed: set = set()

    # ------------------------------------------------------------ sequences
    def _seq(self, seq_id) -> _Seq:
        if seq_id in self._seqs:
            return self._seqs[seq_id]
        if seq_id in self._freed:
            raise ValueError(f"seq_id={seq_id!r} was freed; its blocks may now hold another request's cache")
        known = ", ".join(map(repr, list(self._seqs)[:8])) or "none"
        raise ValueError(f"seq_id={seq_id!r} is not in the cache (known: {known})")

    def add(self, seq_id) -> None:
        """A new, empty sequence."""
        if seq_id in self._seqs:
            raise ValueError(f"seq_id={seq_id!r} is in the cache already")
        self._freed.discard(seq_id)
        self._seqs[seq_id] = _Seq()

    def fork(self, parent, child) -> None:
        """`child` starts as `parent`'s prefix: the same blocks, shared (copy-on-write on the first write)."""
        p = self._seq(parent)
        self.add(child)
        for b in p.blocks:
            self.alloc.incref(b)
        self._seqs[child] = _Seq(list(p.blocks), p.length)

    def free(self, seq_id) -> None:
        """Release a sequence; blocks no other sequence shares go back to the free list."""
        s = self._seq(seq_id)
        for b in s.blocks:
            self.alloc.decref(b)
        del self._seqs[seq_id]
        self._freed.add(seq_id)

    def length(self, seq_id) -> int:
        return self._seq(seq_id).length

    def blocks(self, seq_id) -> list:
        return list(self._seq(seq_id).blocks)

    @property
    def seq_ids(self) -> list:
        return list(self._seqs)

    # ------------------------------------------------------------ growth
    def blocks_needed(self, seq_id, n: int) -> int:
        """Blocks `extend(seq_id, n)` would take from the free list (new blocks plus a copy-on-write copy)."""
        s = self._seq(seq_id)
        bs = self.block_size
        new = -(-(s.length + n) // bs) - len(s.blocks)
        cow = 1 if s.length % bs and n > 0 and self.alloc.refcount[s.blocks[-1]] > 1 else 0
        return new + cow

    def reserve(self, seq_id, n: int) -> None:
        """Room for `n` more tokens of `seq_id` (its length grows by n), all or nothing: CacheFull changes nothing."""
        whole("n", n, meaning="tokens to add")
        s = self._seq(seq_id)
        need = self.blocks_needed(seq_id, n)
        if need > self.alloc.num_free:
            raise CacheFull(f"seq_id={seq_id!r} needs {need} more blocks of {self.block_size} tokens for {n} "
                            f"tokens; {self.alloc.num_free} of {self.num_blocks} are free (the whole pool holds "
                            f"{self.num_blocks * self.block_size} tokens); nothing was changed")
        bs = self.block_size
        if s.length % bs and self.alloc.refcount[s.blocks[-1]] > 1:        # copy-on-write of a shared last block
            old = s.blocks[-1]
            new = self.alloc.alloc()
            if self.storage is not None:
                self.storage[:, new] = self.storage[:, old]
            self.alloc.decref(old)
            s.blocks[-1] = new
        while len(s.blocks) * bs < s.length + n:
            s.blocks.append(self.alloc.alloc())
        s.length += n

    def extend(self, seq_id, n: int) -> torch.Tensor:
        """`reserve`, then the flat slots (block * block_size + offset) of the n new tokens: (n,) int64."""
        self.reserve(seq_id, n)
        s = self._seqs[seq_id]
        pos = torch.arange(s.length - n, s.length)
        return torch.tensor(s.blocks, dtype=torch.int64)[pos // self.block_size] * self.block_size + \
            pos % self.block_size

    def truncate(self, seq_id, length: int) -> None:
        """Keep the first `length` tokens (drop rejected speculative tokens, or undo a step); whole blocks past the
        end go back to the pool."""
        s = self._seq(seq_id)
        if whole("length", length, minimum=0) > s.length:
            raise ValueError(f"length={length!r} is not allowed; allowed: 0..{s.length} (seq_id={seq_id!r})")
        keep = -(-length // self.block_size)
        for b in s.blocks[keep:]:
            self.alloc.decref(b)
        del s.blocks[keep:]
        s.length = length

    def write(self, layer: int, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """storage[layer] at `slots` (from `extend`) = rows (len(slots), width). Refuses slots in free or shared
        blocks: writing them would change another request's cache."""
        if self.storage is None:
            raise ValueError("this cache was made with storage=False: it has nowhere to write")
        if not 0 <= layer < self.layers:
            raise ValueError(f"layer={layer} is not allowed; allowed: 0..{self.layers - 1}")
        slots = torch.as_tensor(slots, dtype=torch.int64).reshape(-1)
        if rows.shape != (slots.numel(), self.width):
            raise ValueError(f"rows has shape {tuple(rows.shape)}; expected ({slots.numel()}, {self.width})")
        if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= self.num_blocks * self.block_size):
            raise ValueError(f"slots must lie in 0..{self.num_blocks * self.block_size - 1}")
        for b in set((slots // self.block_size).tolist()):
            if self.alloc.refcount[b] == 0:
                raise ValueError(f"block {b} is free: writing a freed block would corrupt whoever gets it next")
            if self.alloc.refcount[b] > 1:
                raise ValueError(f"block {b} is shared by {self.alloc.refcount[b]} sequences: writing it would change "
                                 f"the others (take slots from extend(), which copies a shared block first)")
        self.storage[layer].view(-1, self.width)[slots] = rows.to(self.storage.dtype)

    def append(self, seq_id, rows: torch.Tensor) -> torch.Tensor:
        """extend + write: rows (n, width) for a one-layer cache, or (layers, n, width)."""
        rows = rows[None] if rows.dim() == 2 and self.layers == 1 else rows
        if rows.dim() != 3 or rows.shape[0] != self.layers or rows.shape[2] != self.width or rows.shape[1] < 1:
            raise ValueError(f"rows has shape {tuple(rows.shape)}; expected ({self.layers}, n, {self.width})")
        slots = self.extend(seq_id, rows.shape[1])
        for layer in range(self.layers):
            self.write(layer, slots, rows[layer])
        return slots

    # ------------------------------------------------------------ reading
    def block_table(self, seq_ids, width: int | None = None) -> torch.Tensor:
        """(len(seq_ids), width) int32: each sequence's blocks, padded with 0 (never read: seq_lens bound it)."""
        rows = [self._seq(s).blocks for s in seq_ids]
        w = max([len(r) for r in rows] + [1]) if width is None else width
        if any(len(r) > w for r in rows):
            raise ValueError(f"width={w} is smaller than a sequence's {max(len(r) for r in rows)} blocks")
        table = torch.zeros(len(rows), w, dtype=torch.int32)
        for i, r in enumerate(rows):
            table[i, :len(r)] = torch.tensor(r, dtype=torch.int32)
        return table

    def seq_lens(self, seq_ids) -> torch.Tensor:
        return torch.tensor([self._seq(s).length for s in seq_ids], dtype=torch.int32)

    def gather(self, seq_id, layer: int = 0) -> torch.Tensor:
        """A contiguous copy of one sequence's cache: (length, width)."""
        s = self._seq(seq_id)
        if self.storage is None:
            raise ValueError("this cache was made with storage=False: it holds no values")
        flat = self.storage[layer].view(-1, self.width)
        pos = torch.arange(s.length)
        return flat[torch.tensor(s.blocks, dtype=torch.int64)[pos // self.block_size] * self.block_size
                    + pos % self.block_size].clone()

    def check_table(self, seq_ids, table: torch.Tensor) -> None:
        """Raise if `table` (from block_table) no longer matches the cache: a stale table would read blocks that were
        freed and may now hold another request's tokens."""
        for i, sid in enumerate(seq_ids):
            s = self._seq(sid)
            got = table[i, :len(s.blocks)].tolist()
            for j, (g, e) in enumerate(zip(got, s.blocks)):
                if g != e:
                    state = "free" if self.alloc.refcount[g] == 0 else "in use, but not as this block"
                    raise ValueError(f"block table row {i} (seq_id={sid!r}), entry {j}: block {g}, which is {state}; "
                                     f"the sequence's block {j} is {e} -- the table is stale (take a new one)")

    def stats(self) -> dict:
        """Token slots reserved (allocated blocks x block_size) and used (a shared block counted once)."""
        bs = self.block_size
        fill = {}
        for s in self._seqs.values():
            for i, b in enumerate(s.blocks):
                fill[b] = max(fill.get(b, 0), min(bs, s.length - i * bs))
        reserved = len(fill) * bs
        used = sum(fill.values())
        return {"sequences": len(self._seqs), "blocks_used": len(fill), "blocks_free": self.alloc.num_free,
                "reserved_tokens": reserved, "used_tokens": used,
                "waste_fraction": 1 - used / reserved if reserved else 0.0,
                "shared_blocks": sum(1 for b in fill if self.alloc.refcount[b] > 1)}


# ---------------------------------------------------------------- an FP8 cache

def fp8_kv(kv: torch.Tensor, rope_dim: int, block: int = 128) -> tuple:
    """FlashMLA's FP8 KV format: the latent part in float8 E4M3 with one FP32 scale per `block` values, the RoPE part
    kept in BF16. Returns (the cache as the kernel would see it after dequantisation, bytes per token)."""
    from common.kernels import lowp
    lat, rope = kv[..., :kv.shape[-1] - rope_dim], kv[..., kv.shape[-1] - rope_dim:]
    if lat.shape[-1] % block:
        raise ValueError(f"the latent part ({lat.shape[-1]} values) is not a multiple of block={block}")
    deq = lowp.dequantize(lowp.quantize(lat, "e4m3", block=(1, block), scale="fp32"), dtype=torch.float64)
    per_token = lat.shape[-1] * 1 + lat.shape[-1] // block * 4 + rope_dim * 2
    return torch.cat([deq.to(kv.dtype), rope.to(torch.bfloat16).to(kv.dtype)], dim=-1), per_token
