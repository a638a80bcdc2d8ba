"""Device memory: a small model of PyTorch's CUDA caching allocator, and activation memory measured exactly.

The caching allocator (PyTorch docs, "CUDA semantics -- memory management") keeps freed blocks for reuse instead of
returning them to the driver: `reserved` (segments obtained from cudaMalloc) >= `allocated` (live tensors). Blocks are
carved from segments (2 MiB for small requests, the rounded request for large ones) and split; a request that no free
block can hold grows `reserved` even when the free bytes add up -- fragmentation. `CachingAllocatorModel` reproduces
that behaviour in a few lines so a CPU can show it; on a GPU, `torch.cuda.memory_stats()` shows the real one.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

SMALL_LIMIT = 1 << 20  # requests up to 1 MiB come from 2 MiB segments
SMALL_SEGMENT = 2 << 20
ROUND = 512  # every request is rounded up to a multiple of 512 bytes
LARGE_ROUND = 2 << 20  # large segments are rounded up to 2 MiB


@dataclass
class _Block:
    segment: int
    offset: int
    size: int
    free: bool = True


@dataclass
class CachingAllocatorModel:
    """Best-fit allocation from cached segments, splitting blocks; freeing only marks a block free (and merges
    neighbours). No segment is ever returned, as with PyTorch until `torch.cuda.empty_cache()`."""

    blocks: list = field(default_factory=list)
    segments: list = field(default_factory=list)  # segment sizes
    live: dict = field(default_factory=dict)  # handle -> block
    _next: int = 0

    def malloc(self, nbytes: int) -> int:
        if nbytes <= 0:
            raise ValueError(f"nbytes={nbytes} must be > 0")
        size = -(-nbytes // ROUND) * ROUND
        small = size <= SMALL_LIMIT
        fits = [b for b in self.blocks if b.free and b.size >= size
                and (self.segments[b.segment] == SMALL_SEGMENT) == small]
        if fits:
            block = min(fits, key=lambda b: b.size)
        else:
            seg_size = SMALL_SEGMENT if small else -(-size // LARGE_ROUND) * LARGE_ROUND
            self.segments.append(seg_size)
            block = _Block(len(self.segments) - 1, 0, seg_size)
            self.blocks.append(block)
        if block.size > size:  # split: the remainder stays cached
            rest = _Block(block.segment, block.offset + size, block.size - size)
            self.blocks.insert(self.blocks.index(block) + 1, rest)
            block.size = size
        block.free = False
        self._next += 1
        self.live[self._next] = block
        return self._next

    def free(self, handle: int) -> None:
        block = self.live.pop(handle, None)
        if block is None:
            raise ValueError(f"handle {handle} is not a live allocation")
        block.free = True
        merged = []
        for b in self.blocks:  # merge adjacent free blocks of the same segment
            if merged and merged[-1].free and b.free and merged[-1].segment == b.segment \
                    and merged[-1].offset + merged[-1].size == b.offset:
                merged[-1].size += b.size
            else:
                merged.append(b)
        self.blocks = merged

    def stats(self) -> dict:
        allocated = sum(b.size for b in self.blocks if not b.free)
        reserved = sum(self.segments)
        free_blocks = [b.size for b in self.blocks if b.free]
        return {"allocated": allocated, "reserved": reserved, "cached_free": reserved - allocated,
                "largest_free_block": max(free_blocks, default=0),
                "fragmentation": (reserved - allocated) / reserved if reserved else 0.0}


def saved_activation_bytes(fn, *args) -> tuple[object, int]:
    """Run fn(*args) and count the bytes of tensors autograd saves for the backward pass (exact, device-independent:
    the activation memory a training step holds at its peak, parameters aside)."""
    total = {"bytes": 0}
    seen = set()

    def pack(t):
        key = (t.untyped_storage().data_ptr(), t.dtype, tuple(t.shape))
        if key not in seen:
            seen.add(key)
            total["bytes"] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    return out, total["bytes"]
