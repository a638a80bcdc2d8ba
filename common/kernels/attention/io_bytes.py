"""How many HBM bytes attention moves: closed forms (standard, FlashAttention forward and backward, the IO-complexity
Theta) and the same counts taken by running the PyTorch implementations on meta tensors; what eager PyTorch really
moves (`naive_moved_bytes`, `tiled_eager_bytes`)."""
from __future__ import annotations

import math

from common.core.validate import whole
from common.kernels.attention.reference import HBMCounter, naive_attention, tiled_attention, tiled_attention_backward


def standard_io_bytes(seq_len: int, head_dim: int, elem_bytes: int = 2, heads: int = 1, batch: int = 1) -> int:
    """HBM bytes of standard attention: read Q, K, V and write O (4 N d), write and read S and P (4 N^2)."""
    for name, value in (("seq_len", seq_len), ("head_dim", head_dim), ("elem_bytes", elem_bytes), ("heads", heads),
                        ("batch", batch)):
        whole(name, value)
    n, d = seq_len, head_dim
    return batch * heads * elem_bytes * (4 * n * d + 4 * n * n)


def on_chip_bytes(block_m: int, block_n: int, head_dim: int, elem_bytes: int = 2) -> int:
    """On-chip (SRAM) memory one tiled program holds: a Q block and its output accumulator (block_m x d each), a K and
    a V block (block_n x d each) and the score tile S/P (block_m x block_n); all counted at `elem_bytes` as the paper
    counts elements (the running max and sum, 2 * block_m numbers, are left out)."""
    for name, value in (("block_m", block_m), ("block_n", block_n), ("head_dim", head_dim),
                        ("elem_bytes", elem_bytes)):
        whole(name, value)
    return elem_bytes * (2 * block_m * head_dim + 2 * block_n * head_dim + block_m * block_n)


def blocks_for_memory(sram_bytes: int, head_dim: int, elem_bytes: int = 2) -> tuple[int, int]:
    """Block sizes (block_m, block_n) for on-chip memory of `sram_bytes`: block_m = floor(M / (5 d)) with M counted in
    elements, block_n = min(block_m, d). Then Q, O (2 block_m d), K, V (2 block_n d <= 2 block_m d) and S (block_m
    block_n <= block_m d) need at most 5 block_m d <= M elements, so the blocks always fit."""
    whole("sram_bytes", sram_bytes)
    whole("head_dim", head_dim)
    whole("elem_bytes", elem_bytes)
    m_elems = sram_bytes // elem_bytes
    block_m = m_elems // (5 * head_dim)
    if block_m < 1:
        raise ValueError(f"sram_bytes={sram_bytes} cannot hold even one row of Q, K, V and O at head_dim={head_dim} "
                         f"({5 * head_dim * elem_bytes} bytes needed); the theorem assumes M >= d")
    return block_m, min(block_m, head_dim)


def flash_io_bytes(seq_len: int, head_dim: int, sram_bytes: int | None = None, elem_bytes: int = 2,
                   block_m: int | None = None, block_n: int | None = None, heads: int = 1, batch: int = 1) -> int:
    """HBM bytes of the tiled (non-causal) forward: Q read and O written once (2 N d), K and V read once per block of
    queries (ceil(N / block_m) * 2 N d). Give `sram_bytes` (blocks from `blocks_for_memory`) or `block_m`."""
    whole("seq_len", seq_len)
    whole("head_dim", head_dim)
    if block_m is None:
        if sram_bytes is None:
            raise ValueError("give sram_bytes (on-chip memory M) or block_m")
        block_m, _ = blocks_for_memory(sram_bytes, head_dim, elem_bytes)
    whole("block_m", block_m)
    n, d = seq_len, head_dim
    return batch * heads * elem_bytes * (2 * n * d + math.ceil(n / block_m) * 2 * n * d)


def flash_io_theta(seq_len: int, head_dim: int, sram_bytes: int, elem_bytes: int = 2) -> float:
    """N^2 d^2 / M in bytes (M counted in elements): the growth law of Theorem 2 of FlashAttention, without its
    constant. The tiled count is about 10x this with `blocks_for_memory` (2 N d * N / block_m, block_m = M / 5d)."""
    for name, value in (("seq_len", seq_len), ("head_dim", head_dim), ("sram_bytes", sram_bytes),
                        ("elem_bytes", elem_bytes)):
        whole(name, value)
    m_elems = sram_bytes / elem_bytes
    return elem_bytes * seq_len ** 2 * head_dim ** 2 / m_elems


def _meta_qkv(seq_len, head_dim, elem_bytes, heads, batch):
    import torch
    dtype = {2: torch.float16, 4: torch.float32, 8: torch.float64}.get(elem_bytes)
    if dtype is None:
        raise ValueError(f"elem_bytes={elem_bytes!r} is not a float size; allowed: 2, 4, 8")
    shape = (batch, heads, seq_len, head_dim)
    return [torch.empty(shape, dtype=dtype, device="meta") for _ in range(3)]


def count_standard_bytes(seq_len: int, head_dim: int, elem_bytes: int = 2, heads: int = 1, batch: int = 1,
                         causal: bool = False) -> int:
    """HBM bytes counted by running `naive_attention` on meta tensors (no arithmetic, only the bookkeeping)."""
    c = HBMCounter()
    naive_attention(*_meta_qkv(seq_len, head_dim, elem_bytes, heads, batch), causal=causal, counter=c)
    return c.total


def count_flash_bytes(seq_len: int, head_dim: int, block_m: int, block_n: int, elem_bytes: int = 2, heads: int = 1,
                      batch: int = 1, causal: bool = False) -> int:
    """HBM bytes counted by running `tiled_attention` on meta tensors (no arithmetic, only the bookkeeping)."""
    c = HBMCounter()
    tiled_attention(*_meta_qkv(seq_len, head_dim, elem_bytes, heads, batch), block_m=block_m, block_n=block_n,
                    causal=causal, counter=c)
    return c.total


def naive_moved_bytes(seq_len: int, head_dim: int, elem_bytes: int = 2, heads: int = 1, batch: int = 1,
                      causal: bool = False) -> int:
    """HBM bytes that `naive_attention` really moves in eager PyTorch -- more than Algorithm 0's 4 N^2 elements:

    Q K^T writes S (e per element); `* scale` is a pass of its own (read e, write e); causal: the boolean N x N mask
    is built (write 1), inverted (read 1, write 1) once, and applied (read e, write e; the mask read 1, once); the
    softmax runs in float32: a
    conversion when e != 4 (read e, write 4), the softmax (read 4, write 4), the conversion back (read 4, write e);
    P V reads P (e). Plus Q, K, V read and O written (4 N d e). No reuse through caches is assumed: each eager op's
    output goes to memory. 16-bit, non-causal: 28 N^2 bytes against Algorithm 0's 8 N^2."""
    for name, value in (("seq_len", seq_len), ("head_dim", head_dim), ("elem_bytes", elem_bytes), ("heads", heads),
                        ("batch", batch)):
        whole(name, value)
    e, n, d = elem_bytes, seq_len, head_dim
    convert = (e + 4) if e != 4 else 0
    per_score = e + 2 * e + (2 * e if causal else 0) + convert + 8 + convert + e
    return batch * heads * (4 * n * d * e + n * n * per_score) + (4 * n * n if causal else 0)


def tiled_eager_bytes(seq_len: int, head_dim: int, block_m: int, block_n: int, elem_bytes: int = 2, heads: int = 1,
                      batch: int = 1) -> int:
    """HBM bytes that the PyTorch `tiled_attention` really moves (non-causal) when every eager op's output goes to
    memory: per (query block, key block) tile, the matmul's S (write e), its float32 copy and the scale pass, the max,
    the subtraction and exp (read and write each), the sum, P's conversion, P V (read P and V_j, write the product,
    convert it), and the accumulator's rescale and add (block_m x d float32, read and written three times); per query
    block the final division, conversion and copy into O. It is what the roofline of the PyTorch-tiled version must
    use: `flash_io_bytes` counts what a fused kernel moves, with S and P on chip."""
    for name, value in (("seq_len", seq_len), ("head_dim", head_dim), ("block_m", block_m), ("block_n", block_n),
                        ("elem_bytes", elem_bytes), ("heads", heads), ("batch", batch)):
        whole(name, value)
    e, n, d = elem_bytes, seq_len, head_dim
    a = 8 if e == 8 else 4
    conv = (e + a) if e != a else 0
    total = 0
    for i in range(0, n, block_m):
        r = min(block_m, n - i)
        total += r * d * e  # Q block read
        for j in range(0, n, block_n):
            c = min(block_n, n - j)
            t = r * c
            total += c * d * e + t * e  # K_j read, S written by the matmul
            total += t * conv + 2 * t * a  # float32 copy of S, the scale pass
            total += t * a + r * a  # amax
            total += 2 * t * a + 2 * t * a  # s - m, exp
            total += t * a  # p.sum
            total += t * conv  # P back to the input dtype
            total += t * e + c * d * e + r * d * e + r * d * conv  # P V: read P and V_j, write, convert
            total += 2 * r * d * a + 3 * r * d * a  # acc * alpha (read, write), acc + pv (read 2, write 1)
            total += 3 * r * a + 5 * r * a + 6 * r * a  # the running max, alpha = exp(m - m_new), l * alpha + sum
        total += 2 * r * a + r * d * a  # m, l and acc initialised
        total += 2 * r * d * a + r * d * (a + e) + 2 * r * d * e  # acc / l, to(dtype), copy into O
    return batch * heads * total


def flash_bwd_io_bytes(seq_len: int, head_dim: int, block_n: int, elem_bytes: int = 2, heads: int = 1,
                       batch: int = 1, acc_bytes: int | None = None) -> int:
    """HBM bytes of `tiled_attention_backward` (non-causal) in closed form, with T = ceil(N / block_n) key blocks:

    D pass: read O, dO (2 N d e), write D (N a); dQ zeroed (N d a); K, V read and dK, dV written once (4 N d e);
    per key block: Q and dO read (2 N d e), L and D read (2 N a), the dQ accumulator read and written (2 N d a);
    at the end dQ read (N d a) and written in the input dtype (N d e). e = elem_bytes, a = acc_bytes (4: float32;
    8 for float64 inputs). The forward reads K and V once per query block; the backward reads Q, dO (and dQ) once per
    key block: the same N^2 d / block growth, about 3x the forward's bytes at equal blocks (float32 dQ).
    """
    for name, value in (("seq_len", seq_len), ("head_dim", head_dim), ("block_n", block_n),
                        ("elem_bytes", elem_bytes), ("heads", heads), ("batch", batch)):
        whole(name, value)
    a = acc_bytes or (8 if elem_bytes == 8 else 4)
    n, d, e = seq_len, head_dim, elem_bytes
    t = math.ceil(n / block_n)
    per_head = (2 * n * d * e + n * a + n * d * a + 4 * n * d * e + t * (2 * n * d * e + 2 * n * a + 2 * n * d * a)
                + n * d * a + n * d * e)
    return batch * heads * per_head


def count_flash_bwd_bytes(seq_len: int, head_dim: int, block_m: int, block_n: int, elem_bytes: int = 2,
                          heads: int = 1, batch: int = 1, causal: bool = False) -> int:
    """HBM bytes counted by running `tiled_attention_backward` on meta tensors (no arithmetic, only the bookkeeping)."""
    import torch
    q, k, v = _meta_qkv(seq_len, head_dim, elem_bytes, heads, batch)
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    lse = torch.empty(q.shape[:3], dtype=acc, device="meta")
    c = HBMCounter()
    tiled_attention_backward(q, k, v, q, lse, q, block_m=block_m, block_n=block_n, causal=causal, counter=c)
    return c.total
