"""Device memory: a model of PyTorch's CUDA caching allocator, and activation memory measured exactly.

The caching allocator (PyTorch docs, "CUDA semantics -- memory management") keeps freed blocks for reuse instead of
returning them to the driver: `reserved` (segments obtained from cudaMalloc) >= `allocated` (live blocks).
`CachingAllocatorModel` follows the sizing rules of `c10/cuda/CUDACachingAllocator.cpp` (default settings, one
stream, no `expandable_segments`, no `max_split_size_mb`), so its `allocated` and `reserved` match
`torch.cuda.memory_allocated()` / `memory_reserved()` for the same sequence of requests in a fresh process:
- every request is rounded up to a multiple of kMinBlockSize = 512 B;
- requests up to kSmallSize = 1 MiB use the small pool, whose segments are kSmallBuffer = 2 MiB;
- larger requests use the large pool: a request under kMinLargeAlloc = 10 MiB gets a kLargeBuffer = 20 MiB segment
  (later 1-10 MiB requests are carved from its rest), a larger one a segment rounded up to kRoundLarge = 2 MiB;
- a request takes the smallest free block of its pool that holds it (best fit), else a new segment;
- the block is split when the rest is worth keeping: >= 512 B in the small pool, > 1 MiB in the large pool (a
  large-pool block with a smaller rest is handed out whole and counted whole in `allocated`);
- freeing marks the block free and merges it with free neighbours of the same segment; segments are never returned
  (until `torch.cuda.empty_cache()`).
A request that no free block can hold grows `reserved` even when the free bytes add up: fragmentation.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from common.core.validate import whole

# the constants of c10/cuda/CUDACachingAllocator.cpp
K_MIN_BLOCK_SIZE = 512  # every request is rounded up to a multiple of 512 bytes
K_SMALL_SIZE = 1 << 20  # largest "small" request: 1 MiB
K_SMALL_BUFFER = 2 << 20  # small requests are packed into 2 MiB segments
K_LARGE_BUFFER = 20 << 20  # requests between 1 and 10 MiB get a 20 MiB segment
K_MIN_LARGE_ALLOC = 10 << 20  # from 10 MiB on, a segment is the request rounded up to kRoundLarge
K_ROUND_LARGE = 2 << 20
# the names of earlier versions of this module
SMALL_LIMIT, SMALL_SEGMENT, ROUND, LARGE_ROUND = K_SMALL_SIZE, K_SMALL_BUFFER, K_MIN_BLOCK_SIZE, K_ROUND_LARGE


def round_size(nbytes: int) -> int:
    """The block size a request of `nbytes` asks for: a multiple of 512 B (at least 512)."""
    return max(K_MIN_BLOCK_SIZE, -(-nbytes // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE)


def segment_size(size: int) -> int:
    """The cudaMalloc size of a new segment for a rounded request `size` (PyTorch's get_allocation_size)."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE


def should_split(block_size: int, size: int) -> bool:
    """Whether a free block of `block_size` is split to serve `size`: the rest must be >= 512 B in the small pool,
    > 1 MiB in the large pool."""
    rest = block_size - size
    return rest >= K_MIN_BLOCK_SIZE if size <= K_SMALL_SIZE else rest > K_SMALL_SIZE


@dataclass
class _Block:
    segment: int
    offset: int
    size: int
    free: bool = True


@dataclass
class CachingAllocatorModel:
    """PyTorch's caching allocator on one stream, in a few lines (see the module docstring for its rules)."""

    blocks: list = field(default_factory=list)
    segments: list = field(default_factory=list)  # segment sizes
    live: dict = field(default_factory=dict)  # handle -> block
    _next: int = 0

    def __post_init__(self):
        self._pool: list[bool] = []  # per segment: True for the small pool

    def malloc(self, nbytes: int) -> int:
        """Allocate `nbytes`; returns a handle for `free`."""
        whole("nbytes", nbytes)
        size = round_size(nbytes)
        small = size <= K_SMALL_SIZE
        fits = [b for b in self.blocks if b.free and b.size >= size and self._pool[b.segment] == small]
        if fits:
            block = min(fits, key=lambda b: (b.size, b.segment, b.offset))
        else:
            self.segments.append(segment_size(size))
            self._pool.append(small)
            block = _Block(len(self.segments) - 1, 0, self.segments[-1])
            self.blocks.append(block)
        if should_split(block.size, size):  # the rest stays cached as a free block
            rest = _Block(block.segment, block.offset + size, block.size - size)
            self.blocks.insert(self.blocks.index(block) + 1, rest)
            block.size = size
        block.free = False
        self._next += 1
        self.live[self._next] = block
        return self._next

    def free(self, handle: int) -> None:
        """Free a live allocation: its block stays cached and merges with free neighbours of its segment."""
        block = self.live.pop(handle, None)
        if block is None:
            raise ValueError(f"handle {handle!r} is not a live allocation")
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
        """allocated / reserved bytes (as torch.cuda.memory_allocated / memory_reserved), the cached free bytes,
        the largest free block and the fragmentation (cached free / reserved)."""
        allocated = sum(b.size for b in self.blocks if not b.free)
        reserved = sum(self.segments)
        free_blocks = [b.size for b in self.blocks if b.free]
        return {"allocated": allocated, "reserved": reserved, "cached_free": reserved - allocated,
                "largest_free_block": max(free_blocks, default=0), "segments": len(self.segments),
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


def step_cpu_ms(variants: dict, x, rounds: int = 3, steps: int = 3) -> dict:
    """Median CPU milliseconds of one training step (forward, `.sum().backward()`) of each variant {name: fn} on x,
    on ONE thread, the variants interleaved round by round: CPU time (time.process_time) of one thread is what the
    step costs, which the machine's other load moves far less than it moves wall-clock time."""
    import statistics
    import time

    import torch
    if rounds < 1 or steps < 1:
        raise ValueError(f"rounds={rounds} and steps={steps} must be >= 1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        samples: dict = {name: [] for name in variants}
        for _ in range(rounds):
            for name, fn in variants.items():
                start = time.process_time()
                for _ in range(steps):
                    fn(x).sum().backward()
                samples[name].append((time.process_time() - start) / steps * 1e3)
    finally:
        torch.set_num_threads(threads)
    return {name: statistics.median(v) for name, v in samples.items()}
