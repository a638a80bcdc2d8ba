"""Attention three ways -- naive, tiled (FlashAttention's algorithm in PyTorch) and a Triton kernel -- with HBM bytes.

Tensors are laid out (batch, heads, seq_len, head_dim) as for `torch.nn.functional.scaled_dot_product_attention`.

- `naive_attention` materialises S = Q K^T and P = softmax(S) (the N x N matrices go through HBM);
- `online_softmax_stats` is the one-pass running max and normaliser of Milakov and Gimelshein (2018);
- `tiled_attention` is FlashAttention's forward pass in PyTorch: blocks of Q, a loop over blocks of K and V, a running
  max, sum and output accumulator rescaled whenever the max grows. It never forms the N x N matrix.
- Both take an `HBMCounter` and count the bytes they read from and write to HBM, block by block; on `meta` tensors they
  count without computing anything (`count_*_bytes`).
- `standard_io_bytes` / `flash_io_bytes` are the same counts in closed form; `flash_io_theta` is the shape of the IO
  complexity result of FlashAttention (Dao et al. 2022, arXiv 2205.14135, Theorem 2): Theta(N^2 d^2 / M).
- `flash_attention` runs a Triton FlashAttention forward (non-causal and causal, any sequence length, head dims up to
  256 in powers of two) and can return the logsumexp L per row; `launch_forward` launches any kernel with the same
  signature (the lab's exercise).
- The backward pass: `tiled_attention_backward` in PyTorch (recomputes P from Q, K and L; D = rowsum(dO * O)), counted
  like the forward (`count_flash_bwd_bytes` vs `flash_bwd_io_bytes`), and `flash_attention_backward` in Triton (dK, dV
  by key block, dQ by query block: no atomics). `flash_attn_func` is the differentiable pair.
- GPU launch configurations are pruned by the device's shared memory per block (`data/hardware.json`,
  `smem_per_block_bytes`); a shape that fits no configuration is refused with a ValueError.

Triton is imported lazily, so importing this module never fixes Triton's mode: call `common.setup()` first.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

LOG2E = 1.4426950408889634
# Launch shapes of the Triton kernel: interpreted on a CPU (few, large blocks: the interpreter pays per operation) and
# autotuned on a GPU (H100/H200-class; BLOCK_M must be a multiple of BLOCK_N, see the kernel).
CPU_BLOCKS = (64, 64)
# Every configuration is compiled for sm_90 on a CPU by tests/test_attention.py and aot_table (table committed in
# data/profiles/attention_sm90_aot.csv): none spills registers at head_dim <= 128 (4-warp 128 x 64 tiles did: dropped).
GPU_CONFIGS = [  # (BLOCK_M, BLOCK_N, num_warps, num_stages): the forward
    (128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 2), (128, 128, 8, 3), (128, 32, 4, 4),
    (64, 64, 4, 3), (64, 32, 4, 4),
]
BWD_GPU_CONFIGS = {  # the backward's two kernels: dK/dV (a key block, a loop over query blocks) and dQ (the reverse)
    "dkdv": [(32, 128, 8, 3), (64, 128, 8, 2), (64, 64, 4, 3), (32, 64, 4, 3), (16, 64, 4, 2)],
    "dq": [(128, 32, 8, 3), (128, 64, 8, 2), (64, 64, 4, 3), (64, 32, 4, 3), (64, 16, 4, 2)],
}


# ----------------------------------------------------------------------------------------------------------------------
# checks and counting

def _check_qkv(q, k, v) -> None:
    import torch
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor of shape (batch, heads, seq_len, head_dim), "
                             f"got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} has shape {tuple(t.shape)}; expected 4 dims (batch, heads, seq_len, head_dim)")
    if q.shape[:2] != k.shape[:2] or k.shape != v.shape or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not fit: k and v must have "
                         f"one shape, and q the same batch, heads and head_dim")
    if q.shape[2] < 1 or k.shape[2] < 1:
        raise ValueError(f"seq_len must be >= 1, got q {q.shape[2]}, k {k.shape[2]}")


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive int")
    return value


@dataclass
class HBMCounter:
    """Bytes read from and written to HBM (main memory) by an instrumented implementation."""

    read_bytes: int = 0
    written_bytes: int = 0

    def read(self, t) -> None:
        self.read_bytes += t.numel() * t.element_size()

    def write(self, t) -> None:
        self.written_bytes += t.numel() * t.element_size()

    @property
    def total(self) -> int:
        return self.read_bytes + self.written_bytes


def attention_flops(batch: int, heads: int, seq_len: int, head_dim: int, causal: bool = False) -> int:
    """FLOPs of an attention forward: two matmuls of 2*N*N*D each per head, 4*B*H*N^2*D; half of that when causal."""
    for name, value in (("batch", batch), ("heads", heads), ("seq_len", seq_len), ("head_dim", head_dim)):
        _positive_int(name, value)
    flops = 4 * batch * heads * seq_len * seq_len * head_dim
    return flops // 2 if causal else flops


# ----------------------------------------------------------------------------------------------------------------------
# references

def reference_attention(q, k, v, causal: bool = False, scale: float | None = None):
    """SDPA in float64 on the CPU: the yardstick every implementation here is checked against."""
    import torch
    import torch.nn.functional as F
    _check_qkv(q, k, v)
    q64, k64, v64 = (t.detach().to("cpu", torch.float64) for t in (q, k, v))
    return F.scaled_dot_product_attention(q64, k64, v64, is_causal=causal, scale=scale)


def causal_mask(n_q: int, n_k: int, device="cpu"):
    """Boolean (n_q, n_k) mask, True where query i may attend to key j (j <= i): the lower triangle, diagonal in."""
    import torch
    i = torch.arange(n_q, device=device)[:, None]
    j = torch.arange(n_k, device=device)[None, :]
    return j <= i


def naive_attention(q, k, v, causal: bool = False, scale: float | None = None, counter: HBMCounter | None = None):
    """softmax(Q K^T * scale) V with S and P materialised; `counter` gets the standard algorithm's HBM traffic.

    The count follows Algorithm 0 of the FlashAttention paper: read Q, K; write S; read S; write P; read P, V; write O.
    """
    import torch
    _check_qkv(q, k, v)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    c = counter or HBMCounter()
    if q.is_meta:  # meta tensors: count the same reads and writes, skip the arithmetic
        s = q.new_empty(q.shape[:3] + (k.shape[2],))
        o = q.new_empty(q.shape[:3] + (v.shape[3],))
        c.read(q), c.read(k), c.write(s)  # S = Q K^T
        c.read(s), c.write(s)  # P = softmax(S), of S's shape
        c.read(s), c.read(v), c.write(o)  # O = P V
        return o
    c.read(q), c.read(k)
    s = (q @ k.transpose(-2, -1)) * scale
    if causal:
        s = s.masked_fill(~causal_mask(q.shape[2], k.shape[2], q.device), float("-inf"))
    c.write(s)
    c.read(s)
    p = torch.softmax(s.float(), dim=-1).to(q.dtype)
    c.write(p)
    c.read(p), c.read(v)
    o = p @ v
    c.write(o)
    return o


def online_softmax_stats(blocks):
    """One pass over column blocks of a (rows, n) matrix: the running max m and normaliser l = sum exp(x - m).

    `blocks` is any iterable of (rows, b) tensors (it is consumed once). When a block raises the max from m to m',
    the sum so far is rescaled by exp(m - m') before the block's terms are added.
    """
    import torch
    m = l = None
    for x in blocks:
        x = x.double() if x.dtype == torch.float64 else x.float()
        m_new = x.amax(dim=-1) if m is None else torch.maximum(m, x.amax(dim=-1))
        scaled = torch.exp(x - m_new[..., None]).sum(dim=-1)
        l = scaled if l is None else l * torch.exp(m - m_new) + scaled
        m = m_new
    if m is None:
        raise ValueError("blocks is empty: online_softmax_stats needs at least one block")
    return m, l


def online_softmax(x, block: int = 64):
    """softmax over the last dim of a 2-D tensor from `online_softmax_stats` over blocks of `block` columns."""
    import torch
    _positive_int("block", block)
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x must be a 2-D tensor (rows, n), got {getattr(x, 'shape', type(x).__name__)}")
    m, l = online_softmax_stats(x[:, j:j + block] for j in range(0, x.shape[1], block))
    return (torch.exp(x.float() - m[:, None]) / l[:, None]).to(x.dtype)


def tiled_attention(q, k, v, block_m: int = 64, block_n: int = 64, causal: bool = False, scale: float | None = None,
                    counter: HBMCounter | None = None, return_lse: bool = False):
    """FlashAttention's forward pass in PyTorch: never forms the N x N matrix.

    For each block of `block_m` query rows (all heads at once), loop over blocks of `block_n` keys/values, keeping the
    running max `m`, normaliser `l` and unnormalised output `acc` (float32) and rescaling `l` and `acc` by
    exp(m_old - m_new) whenever the max grows. `counter` counts HBM traffic: each Q block read once, each K and V block
    read once per Q block, each O block written once. Causal: key blocks entirely above the diagonal are skipped.
    `return_lse=True` also returns L = m + log(l) per row (B, H, N), float32 (float64 for float64 inputs), what the
    backward pass needs to recompute P = exp(S - L); writing it adds 4 bytes per row to the count.
    """
    import torch
    _check_qkv(q, k, v)
    _positive_int("block_m", block_m)
    _positive_int("block_n", block_n)
    if causal and q.shape[2] != k.shape[2]:
        raise ValueError(f"causal attention here needs as many queries as keys; got {q.shape[2]} and {k.shape[2]}")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    c = counter or HBMCounter()
    n_q, n_k = q.shape[2], k.shape[2]
    acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    dry = q.is_meta  # meta tensors: walk the same loops and count, skip the arithmetic
    out = q.new_empty(q.shape) if dry else torch.empty_like(q)  # (empty_like on meta imports sympy: slow)
    lse = q.new_empty(q.shape[:3], dtype=acc_dtype) if (dry or return_lse) else None
    if dry:  # the K and V blocks, sliced once: every query block reads the same ones
        kv_blocks = [(j, k[:, :, j:j + block_n], v[:, :, j:j + block_n]) for j in range(0, n_k, block_n)]
    for i in range(0, n_q, block_m):
        qi = q[:, :, i:i + block_m]
        c.read(qi)
        rows = qi.shape[2]
        hi = min(n_k, i + rows) if causal else n_k
        if dry:
            for j, kj, vj in kv_blocks:
                if j >= hi:
                    break
                c.read(kj), c.read(vj)
            c.write(qi)  # the O block has the shape of the Q block
            if return_lse:
                c.write(lse[:, :, i:i + rows])
            continue
        m = torch.full(qi.shape[:3], float("-inf"), dtype=acc_dtype, device=q.device)
        l = torch.zeros(qi.shape[:3], dtype=acc_dtype, device=q.device)
        acc = torch.zeros(qi.shape, dtype=acc_dtype, device=q.device)
        for j in range(0, hi, block_n):
            kj, vj = k[:, :, j:j + block_n], v[:, :, j:j + block_n]
            c.read(kj), c.read(vj)
            s = (qi @ kj.transpose(-2, -1)).to(acc_dtype) * scale
            if causal and j + kj.shape[2] - 1 > i:  # the block crosses the diagonal
                keep = (torch.arange(j, j + kj.shape[2], device=q.device)[None, :]
                        <= torch.arange(i, i + rows, device=q.device)[:, None])
                s = s.masked_fill(~keep, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1))
            p = torch.exp(s - m_new[..., None])
            alpha = torch.exp(m - m_new)
            l = l * alpha + p.sum(dim=-1)
            acc = acc * alpha[..., None] + (p.to(v.dtype) @ vj).to(acc_dtype)
            m = m_new
        oi = (acc / l[..., None]).to(q.dtype)
        c.write(oi)
        out[:, :, i:i + rows] = oi
        if return_lse:
            lse[:, :, i:i + rows] = m + torch.log(l)
            c.write(lse[:, :, i:i + rows])
    return (out, lse) if return_lse else out


def _causal_keep(rows, cols):
    """(len(rows), len(cols)) boolean: True where query row i may see key col j (j <= i)."""
    return cols[None, :] <= rows[:, None]


def tiled_attention_backward(q, k, v, o, lse, do, block_m: int = 64, block_n: int = 64, causal: bool = False,
                             scale: float | None = None, counter: HBMCounter | None = None):
    """FlashAttention's backward pass in PyTorch: (dQ, dK, dV) without forming the N x N matrix.

    First D = rowsum(dO * O) per row (one pass over O and dO). Then, for each block of `block_n` keys (K_j, V_j read
    once, dK_j and dV_j accumulated on chip and written once), loop over the blocks of `block_m` queries: recompute
    S = Q_i K_j^T * scale and P = exp(S - L_i) from the forward's logsumexp L (no max, no sum: L already holds both),
    then dV_j += P^T dO_i, dP = dO_i V_j^T, dS = P * (dP - D_i), dK_j += dS^T Q_i * scale and dQ_i += dS K_j * scale.
    dQ is accumulated in HBM in float32 (read and written once per key block, as FlashAttention-2's atomic adds do).
    Causal: query blocks entirely above the diagonal are skipped, and P is zero where key j > query i.
    `counter` counts HBM traffic; on meta tensors only the counting runs (`count_flash_bwd_bytes`).
    """
    import torch
    _check_qkv(q, k, v)
    _positive_int("block_m", block_m)
    _positive_int("block_n", block_n)
    for name, t, shape in (("o", o, q.shape), ("do", do, q.shape), ("lse", lse, q.shape[:3])):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(shape):
            raise ValueError(f"{name} must be a tensor of shape {tuple(shape)}, got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    if causal and q.shape[2] != k.shape[2]:
        raise ValueError(f"causal attention here needs as many queries as keys; got {q.shape[2]} and {k.shape[2]}")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    c = counter or HBMCounter()
    n_q, n_k = q.shape[2], k.shape[2]
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    dry = q.is_meta
    # D = rowsum(dO * O): read O and dO, write D
    c.read(o), c.read(do)
    delta = q.new_empty(q.shape[:3], dtype=acc) if dry else (do.to(acc) * o.to(acc)).sum(-1)
    c.write(delta)
    dq_acc = q.new_empty(q.shape, dtype=acc) if dry else torch.zeros(q.shape, dtype=acc, device=q.device)
    c.write(dq_acc)  # dQ starts as zeros in HBM
    dk = k.new_empty(k.shape) if dry else torch.empty_like(k)
    dv = v.new_empty(v.shape) if dry else torch.empty_like(v)
    for j in range(0, n_k, block_n):
        kj, vj = k[:, :, j:j + block_n], v[:, :, j:j + block_n]
        c.read(kj), c.read(vj)
        cols = kj.shape[2]
        if not dry:
            dkj = torch.zeros(kj.shape, dtype=acc, device=q.device)
            dvj = torch.zeros(vj.shape, dtype=acc, device=q.device)
            col_idx = torch.arange(j, j + cols, device=q.device)
        lo = (j // block_m) * block_m if causal else 0  # the first query block with a row i >= j
        for i in range(lo, n_q, block_m):
            qi, doi = q[:, :, i:i + block_m], do[:, :, i:i + block_m]
            li, di = lse[:, :, i:i + block_m], delta[:, :, i:i + block_m]
            dqi = dq_acc[:, :, i:i + block_m]
            c.read(qi), c.read(doi), c.read(li), c.read(di), c.read(dqi)
            if not dry:
                s = (qi @ kj.transpose(-2, -1)).to(acc) * scale
                p = torch.exp(s - li.to(acc)[..., None])
                if causal and j + cols - 1 > i:  # the block crosses the diagonal
                    keep = _causal_keep(torch.arange(i, i + qi.shape[2], device=q.device), col_idx)
                    p = p.masked_fill(~keep, 0.0)
                dvj += p.transpose(-2, -1) @ doi.to(acc)
                dp = doi.to(acc) @ vj.to(acc).transpose(-2, -1)
                ds = p * (dp - di[..., None])
                dqi += (ds @ kj.to(acc)) * scale
                dkj += (ds.transpose(-2, -1) @ qi.to(acc)) * scale
            c.write(dqi)
        c.write(kj), c.write(vj)  # dK_j and dV_j have the shapes of K_j and V_j
        if not dry:
            dk[:, :, j:j + cols] = dkj.to(k.dtype)
            dv[:, :, j:j + cols] = dvj.to(v.dtype)
    c.read(dq_acc)  # the float32 accumulator, cast to the input dtype
    dq = q.new_empty(q.shape) if dry else dq_acc.to(q.dtype)
    c.write(dq)
    return dq, dk, dv


# ----------------------------------------------------------------------------------------------------------------------
# IO complexity: closed forms and counts

def standard_io_bytes(seq_len: int, head_dim: int, elem_bytes: int = 2, heads: int = 1, batch: int = 1) -> int:
    """HBM bytes of standard attention: read Q, K, V and write O (4 N d), write and read S and P (4 N^2)."""
    for name, value in (("seq_len", seq_len), ("head_dim", head_dim), ("elem_bytes", elem_bytes), ("heads", heads),
                        ("batch", batch)):
        _positive_int(name, value)
    n, d = seq_len, head_dim
    return batch * heads * elem_bytes * (4 * n * d + 4 * n * n)


def on_chip_bytes(block_m: int, block_n: int, head_dim: int, elem_bytes: int = 2) -> int:
    """On-chip (SRAM) memory one tiled program holds: a Q block and its output accumulator (block_m x d each), a K and
    a V block (block_n x d each) and the score tile S/P (block_m x block_n); all counted at `elem_bytes` as the paper
    counts elements (the running max and sum, 2 * block_m numbers, are left out)."""
    for name, value in (("block_m", block_m), ("block_n", block_n), ("head_dim", head_dim),
                        ("elem_bytes", elem_bytes)):
        _positive_int(name, value)
    return elem_bytes * (2 * block_m * head_dim + 2 * block_n * head_dim + block_m * block_n)


def blocks_for_memory(sram_bytes: int, head_dim: int, elem_bytes: int = 2) -> tuple[int, int]:
    """Block sizes (block_m, block_n) for on-chip memory of `sram_bytes`: block_m = floor(M / (5 d)) with M counted in
    elements, block_n = min(block_m, d). Then Q, O (2 block_m d), K, V (2 block_n d <= 2 block_m d) and S (block_m
    block_n <= block_m d) need at most 5 block_m d <= M elements, so the blocks always fit."""
    _positive_int("sram_bytes", sram_bytes)
    _positive_int("head_dim", head_dim)
    _positive_int("elem_bytes", elem_bytes)
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
    _positive_int("seq_len", seq_len)
    _positive_int("head_dim", head_dim)
    if block_m is None:
        if sram_bytes is None:
            raise ValueError("give sram_bytes (on-chip memory M) or block_m")
        block_m, _ = blocks_for_memory(sram_bytes, head_dim, elem_bytes)
    _positive_int("block_m", block_m)
    n, d = seq_len, head_dim
    return batch * heads * elem_bytes * (2 * n * d + math.ceil(n / block_m) * 2 * n * d)


def flash_io_theta(seq_len: int, head_dim: int, sram_bytes: int, elem_bytes: int = 2) -> float:
    """N^2 d^2 / M in bytes (M counted in elements): the growth law of Theorem 2 of FlashAttention, without its
    constant. The tiled count is about 10x this with `blocks_for_memory` (2 N d * N / block_m, block_m = M / 5d)."""
    for name, value in (("seq_len", seq_len), ("head_dim", head_dim), ("sram_bytes", sram_bytes),
                        ("elem_bytes", elem_bytes)):
        _positive_int(name, value)
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
        _positive_int(name, value)
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
        _positive_int(name, value)
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
        _positive_int(name, value)
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


# ----------------------------------------------------------------------------------------------------------------------
# Triton

_kernels: dict = {}


def _build_kernels() -> dict:
    """Define the Triton kernels on first use (importing triton then, after `setup` chose its mode)."""
    if _kernels:
        return _kernels
    global triton, tl
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def flash_fwd_kernel(Q, K, V, O, sm_scale, N_CTX, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, L=None, STORE_LSE: tl.constexpr = False):
        # One program: BLOCK_M query rows of one (batch, head). Q, K, V, O are contiguous (B*H, N_CTX, HEAD_DIM).
        # STORE_LSE: also write the logsumexp of each row's scores into L (B*H, N_CTX), float32, for the backward.
        start_m = tl.program_id(0)
        base = tl.program_id(1).to(tl.int64) * N_CTX * HEAD_DIM
        offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, HEAD_DIM)
        q = tl.load(Q + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=offs_m[:, None] < N_CTX, other=0.0)
        k_ptrs = K + base + offs_n[None, :] * HEAD_DIM + offs_d[:, None]  # a (HEAD_DIM, BLOCK_N) tile: K^T
        v_ptrs = V + base + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
        qk_scale = sm_scale * 1.4426950408889634  # exp(x) = exp2(x * log2(e))
        # Stage 1: key blocks that need no mask (entirely inside the sequence, and below the diagonal when causal).
        if CAUSAL:
            full_hi = start_m * BLOCK_M  # a multiple of BLOCK_N, since BLOCK_M is
            hi = tl.minimum((start_m + 1) * BLOCK_M, N_CTX)
        else:
            full_hi = (N_CTX // BLOCK_N) * BLOCK_N
            hi = N_CTX
        for start_n in range(0, full_hi, BLOCK_N):
            k = tl.load(k_ptrs + start_n * HEAD_DIM)
            qk = tl.dot(q, k)
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            p = tl.math.exp2(qk * qk_scale - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_ptrs + start_n * HEAD_DIM)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        # Stage 2: the blocks on the diagonal (causal) or past the last full block (any length): masked.
        for start_n in range(full_hi, hi, BLOCK_N):
            cols = start_n + offs_n
            k = tl.load(k_ptrs + start_n * HEAD_DIM, mask=cols[None, :] < N_CTX, other=0.0)
            qk = tl.dot(q, k) * qk_scale
            keep = cols[None, :] < N_CTX
            if CAUSAL:
                keep = keep & (offs_m[:, None] >= cols[None, :])
            qk = tl.where(keep, qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            p = tl.math.exp2(qk - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_ptrs + start_n * HEAD_DIM, mask=cols[:, None] < N_CTX, other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        acc = acc / l_i[:, None]
        tl.store(O + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], acc.to(O.dtype.element_ty),
                 mask=offs_m[:, None] < N_CTX)
        if STORE_LSE:  # m_i and the scores are in log2 units: L = ln(2) * (m + log2(l))
            lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453
            tl.store(L + tl.program_id(1).to(tl.int64) * N_CTX + offs_m, lse, mask=offs_m < N_CTX)

    @triton.jit
    def flash_bwd_dkdv_kernel(Q, K, V, DO, L, D, DK, DV, sm_scale, N_CTX, HEAD_DIM: tl.constexpr,
                              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
        # One program: BLOCK_N keys of one (batch, head); K and V stay on chip, the query blocks stream past.
        start_n = tl.program_id(0)
        bh = tl.program_id(1).to(tl.int64)
        base = bh * N_CTX * HEAD_DIM
        offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, HEAD_DIM)
        col_ok = offs_n < N_CTX
        k = tl.load(K + base + offs_n[:, None] * HEAD_DIM + offs_d[None, :], mask=col_ok[:, None], other=0.0)
        v = tl.load(V + base + offs_n[:, None] * HEAD_DIM + offs_d[None, :], mask=col_ok[:, None], other=0.0)
        dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
        qk_scale = sm_scale * 1.4426950408889634
        lo = 0
        if CAUSAL:  # query blocks entirely above the diagonal see none of these keys
            lo = (start_n * BLOCK_N // BLOCK_M) * BLOCK_M
        for start_m in range(lo, N_CTX, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            row_ok = offs_m < N_CTX
            q = tl.load(Q + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=row_ok[:, None], other=0.0)
            do = tl.load(DO + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=row_ok[:, None], other=0.0)
            lse = tl.load(L + bh * N_CTX + offs_m, mask=row_ok, other=0.0)
            delta = tl.load(D + bh * N_CTX + offs_m, mask=row_ok, other=0.0)
            s_t = tl.dot(k, tl.trans(q))  # (BLOCK_N, BLOCK_M): S^T, so that P^T needs no transpose
            p_t = tl.math.exp2(s_t * qk_scale - lse[None, :] * 1.4426950408889634)
            keep = col_ok[:, None] & row_ok[None, :]
            if CAUSAL:
                keep = keep & (offs_m[None, :] >= offs_n[:, None])
            p_t = tl.where(keep, p_t, 0.0)
            dv += tl.dot(p_t.to(do.dtype), do)
            dp_t = tl.dot(v, tl.trans(do))
            ds_t = p_t * (dp_t - delta[None, :])
            dk += tl.dot(ds_t.to(q.dtype), q)
        dk = dk * sm_scale
        tl.store(DK + base + offs_n[:, None] * HEAD_DIM + offs_d[None, :], dk.to(DK.dtype.element_ty),
                 mask=col_ok[:, None])
        tl.store(DV + base + offs_n[:, None] * HEAD_DIM + offs_d[None, :], dv.to(DV.dtype.element_ty),
                 mask=col_ok[:, None])

    @triton.jit
    def flash_bwd_dq_kernel(Q, K, V, DO, L, D, DQ, sm_scale, N_CTX, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                            BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
        # One program: BLOCK_M queries of one (batch, head); Q and dO stay on chip, the key blocks stream past.
        start_m = tl.program_id(0)
        bh = tl.program_id(1).to(tl.int64)
        base = bh * N_CTX * HEAD_DIM
        offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, HEAD_DIM)
        row_ok = offs_m < N_CTX
        q = tl.load(Q + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=row_ok[:, None], other=0.0)
        do = tl.load(DO + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=row_ok[:, None], other=0.0)
        lse = tl.load(L + bh * N_CTX + offs_m, mask=row_ok, other=0.0)
        delta = tl.load(D + bh * N_CTX + offs_m, mask=row_ok, other=0.0)
        dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
        qk_scale = sm_scale * 1.4426950408889634
        hi = N_CTX
        if CAUSAL:  # key blocks entirely right of the diagonal are skipped
            hi = tl.minimum((start_m + 1) * BLOCK_M, N_CTX)
        for start_n in range(0, hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            col_ok = offs_n < N_CTX
            k = tl.load(K + base + offs_n[:, None] * HEAD_DIM + offs_d[None, :], mask=col_ok[:, None], other=0.0)
            v = tl.load(V + base + offs_n[:, None] * HEAD_DIM + offs_d[None, :], mask=col_ok[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k))
            p = tl.math.exp2(s * qk_scale - lse[:, None] * 1.4426950408889634)
            keep = row_ok[:, None] & col_ok[None, :]
            if CAUSAL:
                keep = keep & (offs_m[:, None] >= offs_n[None, :])
            p = tl.where(keep, p, 0.0)
            dp = tl.dot(do, tl.trans(v))
            ds = p * (dp - delta[:, None])
            dq += tl.dot(ds.to(k.dtype), k)
        dq = dq * sm_scale
        tl.store(DQ + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], dq.to(DQ.dtype.element_ty),
                 mask=row_ok[:, None])

    _kernels["plain"] = flash_fwd_kernel
    _kernels["dkdv"] = flash_bwd_dkdv_kernel
    _kernels["dq"] = flash_bwd_dq_kernel
    return _kernels


# ----------------------------------------------------------------------------------------------------------------------
# shared memory: what a launch configuration needs, what the device has, which configurations fit

def smem_estimate_bytes(kind: str, block_m: int, block_n: int, head_dim: int, num_stages: int,
                        elem_bytes: int = 2) -> int:
    """Shared memory a kernel of this module needs at one configuration, in bytes (an estimate of Triton's layout).

    The tile that stays on chip is held once; the tiles that stream past are pipelined in `num_stages` buffers.
    "fwd": Q (block_m x d) + K and V (block_n x d each) per stage; "dkdv": K, V + Q and dO (block_m x d) per stage;
    "dq": Q, dO + K and V per stage. Checked against Triton's own count by the sm_90 compile test.
    """
    for name, value in (("block_m", block_m), ("block_n", block_n), ("head_dim", head_dim),
                        ("num_stages", num_stages), ("elem_bytes", elem_bytes)):
        _positive_int(name, value)
    held, streamed = {"fwd": (block_m, 2 * block_n), "dkdv": (2 * block_n, 2 * block_m),
                      "dq": (2 * block_m, 2 * block_n)}.get(kind, (None, None))
    if held is None:
        raise ValueError(f"kind={kind!r}; allowed: 'fwd', 'dkdv', 'dq'")
    rows = num_stages * 2 * block_m * 4 if kind == "dkdv" else 0  # L and D (float32) stream with Q and dO
    return elem_bytes * head_dim * (held + num_stages * streamed) + rows


def smem_per_block_bytes(gpu_id: str | None = None) -> int:
    """The shared memory one thread block may use on `gpu_id` (default: this machine's GPU), from data/hardware.json
    (`smem_per_block_kib`, KiB). A GPU missing from data/ falls back to what the driver reports (opt-in maximum)."""
    from common.facts import hardware
    if gpu_id is None:
        import torch
        if not torch.cuda.is_available():
            raise ValueError("gpu_id=None needs a CUDA GPU here; give a GPU id from data/hardware.json "
                             f"({', '.join(hardware.gpu_ids())})")
        from common.core.env import identify_gpu
        gpu_id = identify_gpu(torch.cuda.get_device_name(0))
        if gpu_id is None or gpu_id not in hardware.gpu_ids():
            props = torch.cuda.get_device_properties(0)
            return int(getattr(props, "shared_memory_per_block_optin", 0) or props.shared_memory_per_block)
    gid = hardware._resolve(gpu_id, hardware.gpu_ids(), "GPU id", "gpu_id")
    kib = hardware._data()["gpus"][gid].get("smem_per_block_kib")
    if kib is None:
        raise ValueError(f"data/hardware.json has no smem_per_block_kib for {gid}")
    return int(kib * 1024)


def fitting_configs(kind: str, head_dim: int, smem_bytes: int, elem_bytes: int = 2) -> list[tuple]:
    """The launch configurations (BLOCK_M, BLOCK_N, num_warps, num_stages) of `kind` whose shared memory fits in
    `smem_bytes`; a ValueError naming the head dim and the memory when none does (nothing is launched that cannot
    run)."""
    configs = GPU_CONFIGS if kind == "fwd" else BWD_GPU_CONFIGS.get(kind)
    if configs is None:
        raise ValueError(f"kind={kind!r}; allowed: 'fwd', 'dkdv', 'dq'")
    fit = [c for c in configs if smem_estimate_bytes(kind, c[0], c[1], head_dim, c[3], elem_bytes) <= smem_bytes]
    if not fit:
        need = min(smem_estimate_bytes(kind, c[0], c[1], head_dim, c[3], elem_bytes) for c in configs)
        raise ValueError(f"head_dim={head_dim}: no {kind} configuration fits in {smem_bytes // 1024} KiB of shared "
                         f"memory per block (the smallest needs {need // 1024} KiB); use a smaller head_dim")
    return fit


_tuned: dict = {}


def _tuned_kernel(kind: str, head_dim: int, elem_bytes: int):
    """The `kind` kernel autotuned over the configurations that fit this GPU's shared memory (cached per shape)."""
    import triton
    smem = smem_per_block_bytes()
    key = (kind, head_dim, elem_bytes, smem)
    if key not in _tuned:
        fit = fitting_configs(kind, head_dim, smem, elem_bytes)
        configs = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s) for bm, bn, w, s in fit]
        _tuned[key] = triton.autotune(configs, key=["N_CTX", "HEAD_DIM", "CAUSAL"])(_build_kernels()[
            "plain" if kind == "fwd" else kind])
    return _tuned[key]


def compile_for_gpu(arch: int = 90, head_dim: int = 128, causal: bool = False, block_m: int = 128,
                    block_n: int = 64, num_warps: int = 8, num_stages: int = 3, dtype: str = "bf16", kernel=None,
                    kind: str = "fwd"):
    """Compile a kernel of this module ahead of time for an NVIDIA GPU of compute capability `arch` (90: H100/H200),
    with no GPU present; return Triton's compiled kernel (`.asm["ptx"]`, `.metadata.shared` = shared memory bytes,
    `.n_regs` / `.n_spills` once `registers_and_spills` has run ptxas on it).

    kind: "fwd" (the forward, writing L too), "dkdv" or "dq" (the backward's kernels). Needs Triton's NVIDIA backend
    and TRITON_INTERPRET unset in this process (the interpreter replaces kernels).
    """
    if _interpreted():
        raise RuntimeError("compile_for_gpu needs TRITON_INTERPRET unset: run it in a process without the interpreter")
    if dtype not in ("bf16", "fp16", "fp32"):
        raise ValueError(f"dtype={dtype!r}; allowed: 'bf16', 'fp16', 'fp32'")
    if kind not in ("fwd", "dkdv", "dq"):
        raise ValueError(f"kind={kind!r}; allowed: 'fwd', 'dkdv', 'dq'")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    kernels = _build_kernels()
    ptr, f32 = f"*{dtype}", "*fp32"
    constexprs = {"HEAD_DIM": head_dim, "BLOCK_M": block_m, "BLOCK_N": block_n, "CAUSAL": bool(causal)}
    tail = {"sm_scale": "fp32", "N_CTX": "i32", "HEAD_DIM": "constexpr", "BLOCK_M": "constexpr",
            "BLOCK_N": "constexpr", "CAUSAL": "constexpr"}
    if kind == "fwd":
        kernel = kernel or kernels["plain"]
        signature = {"Q": ptr, "K": ptr, "V": ptr, "O": ptr, **tail, "L": f32, "STORE_LSE": "constexpr"}
        constexprs["STORE_LSE"] = True
        pointers = (0, 1, 2, 3, 10)
        n_ctx = 5
    else:
        kernel = kernel or kernels[kind]
        outs = {"DK": ptr, "DV": ptr} if kind == "dkdv" else {"DQ": ptr}
        signature = {"Q": ptr, "K": ptr, "V": ptr, "DO": ptr, "L": f32, "D": f32, **outs, **tail}
        pointers = tuple(range(6 + len(outs)))
        n_ctx = 7 + len(outs)
    # what a launch specialises on: 16-byte aligned pointers (torch allocations are), N_CTX a multiple of 16
    attrs = {(i,): [["tt.divisibility", 16]] for i in (*pointers, n_ctx)}
    src = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages})


def registers_and_spills(compiled, arch: int = 90) -> dict:
    """Registers per thread and spill bytes of a `compile_for_gpu` result, from Triton's bundled ptxas -v (no GPU)."""
    import os
    import re
    import subprocess
    import tempfile
    from triton.backends.nvidia.compiler import get_ptxas
    tool = get_ptxas(arch)
    ptx = compiled.asm["ptx"]
    target = re.search(r"^\.target (\S+)", ptx, re.M).group(1)
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        r = subprocess.run([getattr(tool, "path", tool), f"-arch={target}", "-v", src, "-o", os.path.join(d, "k.o")],
                           capture_output=True, text=True, timeout=300)
    text = r.stdout + r.stderr
    if r.returncode:
        raise RuntimeError(f"ptxas failed: {text[-1000:]}")
    regs = re.search(r"Used (\d+) registers", text)
    stores = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    return {"registers": int(regs.group(1)) if regs else None,
            "spill_stores": int(stores.group(1)) if stores else 0, "spill_loads": int(stores.group(2)) if stores else 0}


def aot_table(arch: int = 90, head_dims=(64, 128, 256), kinds=("fwd", "dkdv", "dq"), gpu_id: str = "H200-SXM",
              causal: bool = True, dtype: str = "bf16") -> list[dict]:
    """Compile every launch configuration ahead of time for `arch` and return one row per (kernel, head dim, config):
    shared memory (Triton's count and this module's estimate), registers per thread, spills, and whether it fits the
    per-block shared memory of `gpu_id` (data/hardware.json) -- what the GPU would refuse, found without one."""
    limit = smem_per_block_bytes(gpu_id)
    rows = []
    for kind in kinds:
        for d in head_dims:
            for bm, bn, w, st in (GPU_CONFIGS if kind == "fwd" else BWD_GPU_CONFIGS[kind]):
                c = compile_for_gpu(arch, head_dim=d, causal=causal, block_m=bm, block_n=bn, num_warps=w,
                                    num_stages=st, dtype=dtype, kind=kind)
                est = smem_estimate_bytes(kind, bm, bn, d, st, 2 if dtype != "fp32" else 4)
                rows.append({"kernel": kind, "head_dim": d, "BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w,
                             "num_stages": st, "shared_bytes": c.metadata.shared, "estimate_bytes": est,
                             **registers_and_spills(c, arch), "limit_bytes": limit,
                             "fits": c.metadata.shared <= limit, "pruned": est > limit})
    return rows


def _interpreted() -> bool:
    import os
    return os.environ.get("TRITON_INTERPRET") == "1"


def _kernel_source(kernel) -> str:
    fn = getattr(kernel, "fn", kernel)
    while hasattr(fn, "fn"):  # an autotuner wraps a JITFunction
        fn = fn.fn
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return ""


def launch_forward(kernel, q, k, v, causal: bool = False, block_m: int | None = None, block_n: int | None = None,
                   scale: float | None = None, guard: bool = True, **constexprs):
    """Run a FlashAttention forward `kernel` (the signature of `flash_fwd_kernel`) on (B, H, N, D) tensors.

    The launcher makes q, k, v contiguous, allocates O, and launches a grid (ceil(N / BLOCK_M), B * H). Block sizes:
    given, else CPU_BLOCKS under the interpreter and (128, 64) compiled. An autotuned kernel picks its own. O is
    allocated with a guard zone behind it (`guard=True`), and a kernel that writes past the end of O is reported.
    """
    import torch
    _check_qkv(q, k, v)
    if q.shape != k.shape:
        raise ValueError(f"the Triton forward needs q and k of one shape, got {tuple(q.shape)} and {tuple(k.shape)}")
    b, h, n, d = q.shape
    if d not in (16, 32, 64, 128, 256):
        raise ValueError(f"head_dim={d} is not supported by the kernel; allowed: 16, 32, 64, 128, 256")
    if "NotImplementedError" in _kernel_source(kernel):
        raise NotImplementedError("the kernel body is still a stub")
    if q.device.type == "cpu" and not _interpreted():
        raise ValueError("q is on the CPU but Triton is not in interpreter mode: call common.setup() before "
                         "anything imports triton, or move the tensors to the GPU")
    import triton
    scale = d ** -0.5 if scale is None else scale
    qc, kc, vc = (t.contiguous() for t in (q, k, v))
    if guard:
        buf = torch.full((b * h * n * d + 4096,), float("nan"), dtype=q.dtype, device=q.device)
    else:
        buf = torch.empty((b * h * n * d,), dtype=q.dtype, device=q.device)
    o = buf[: b * h * n * d].view(b, h, n, d)
    tuned = hasattr(kernel, "configs")  # a triton.autotune wrapper chooses BLOCK_M / BLOCK_N itself
    if tuned:
        grid = lambda meta: (triton.cdiv(n, meta["BLOCK_M"]), b * h)  # noqa: E731
        kernel[grid](qc, kc, vc, o, scale, n, HEAD_DIM=d, CAUSAL=bool(causal), **constexprs)
    else:
        dm, dn = CPU_BLOCKS if (_interpreted() or q.device.type == "cpu") else (128, 64)
        block_m, block_n = block_m or dm, block_n or dn
        if block_m % block_n:
            raise ValueError(f"block_m={block_m} must be a multiple of block_n={block_n}")
        if q.device.type == "cuda":
            _refuse_if_too_big("fwd", block_m, block_n, d, constexprs.get("num_stages", 3), q.element_size())
        grid = (triton.cdiv(n, block_m), b * h)
        kernel[grid](qc, kc, vc, o, scale, n, HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=bool(causal),
                     **constexprs)
    if guard and not torch.isnan(buf[b * h * n * d:]).all():
        raise RuntimeError("the kernel wrote past the end of O: mask the stores of rows >= N_CTX")
    return o


def _refuse_if_too_big(kind, block_m, block_n, head_dim, num_stages, elem_bytes):
    need = smem_estimate_bytes(kind, block_m, block_n, head_dim, num_stages, elem_bytes)
    have = smem_per_block_bytes()
    if need > have:
        raise ValueError(f"block_m={block_m}, block_n={block_n} at head_dim={head_dim} need about {need // 1024} KiB "
                         f"of shared memory per block ({num_stages} stages); this GPU allows {have // 1024} KiB")


def flash_attention(q, k, v, causal: bool = False, block_m: int | None = None, block_n: int | None = None,
                    scale: float | None = None, return_lse: bool = False):
    """The Triton FlashAttention forward of this module: autotuned on a GPU (over the configurations that fit its
    shared memory) unless block sizes are given. `return_lse=True` returns (O, L), L the logsumexp per row
    (B, H, N, float32) that the backward needs."""
    import torch
    _check_qkv(q, k, v)
    kernel = _build_kernels()["plain"]
    if q.is_cuda and not _interpreted() and not (block_m or block_n):
        kernel = _tuned_kernel("fwd", q.shape[-1], q.element_size())
    extra = {}
    if return_lse:
        b, h, n, _ = q.shape
        extra = {"L": torch.empty((b, h, n), dtype=torch.float32, device=q.device), "STORE_LSE": True}
    o = launch_forward(kernel, q, k, v, causal=causal, block_m=block_m, block_n=block_n, scale=scale, guard=False,
                       **extra)
    return (o, extra["L"]) if return_lse else o


def flash_attention_backward(q, k, v, o, lse, do, causal: bool = False, scale: float | None = None,
                             blocks: dict | None = None):
    """(dQ, dK, dV) from the Triton backward: D = rowsum(dO * O) in PyTorch, then two kernels.

    dK and dV: one program per key block, looping over the query blocks (causal: from the diagonal on); dQ: one
    program per query block, looping over the key blocks (causal: up to the diagonal). Splitting dQ off costs two
    recomputed matmuls (S and dP) per tile, but every output has one owner: no float32 atomic adds, a deterministic
    result, and autotuning may rerun a kernel freely. `blocks` = {"dkdv": (BLOCK_M, BLOCK_N), "dq": (...)}: fixed
    block sizes (default: autotuned on a GPU, 32 x 32 under the interpreter).
    """
    import torch
    import triton
    _check_qkv(q, k, v)
    if q.shape != k.shape:
        raise ValueError(f"the Triton backward needs q and k of one shape, got {tuple(q.shape)} and {tuple(k.shape)}")
    b, h, n, d = q.shape
    if d not in (16, 32, 64, 128, 256):
        raise ValueError(f"head_dim={d} is not supported by the kernel; allowed: 16, 32, 64, 128, 256")
    for name, t, shape in (("o", o, q.shape), ("do", do, q.shape), ("lse", lse, q.shape[:3])):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(shape):
            raise ValueError(f"{name} must be a tensor of shape {tuple(shape)}, got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    if q.device.type == "cpu" and not _interpreted():
        raise ValueError("q is on the CPU but Triton is not in interpreter mode: call common.setup() first")
    scale = d ** -0.5 if scale is None else scale
    qc, kc, vc, oc, doc = (t.contiguous() for t in (q, k, v, o, do))
    lse = lse.float().contiguous()
    delta = (doc.float() * oc.float()).sum(-1)  # D = rowsum(dO * O), float32 (B, H, N)
    dq, dk, dv = torch.empty_like(qc), torch.empty_like(kc), torch.empty_like(vc)
    kernels = _build_kernels()
    common_args = dict(HEAD_DIM=d, CAUSAL=bool(causal))
    for kind in ("dkdv", "dq"):
        outs = (dk, dv) if kind == "dkdv" else (dq,)
        fixed = (blocks or {}).get(kind)
        if q.is_cuda and not _interpreted() and fixed is None:
            kernel = _tuned_kernel(kind, d, q.element_size())
            along = "BLOCK_N" if kind == "dkdv" else "BLOCK_M"
            grid = lambda meta, along=along: (triton.cdiv(n, meta[along]), b * h)  # noqa: E731
            kernel[grid](qc, kc, vc, doc, lse, delta, *outs, scale, n, **common_args)
            continue
        bm, bn = fixed or (32, 32)
        _positive_int("BLOCK_M", bm)
        _positive_int("BLOCK_N", bn)
        if q.is_cuda:
            _refuse_if_too_big(kind, bm, bn, d, 3, q.element_size())
        grid = (triton.cdiv(n, bn if kind == "dkdv" else bm), b * h)
        kernels[kind][grid](qc, kc, vc, doc, lse, delta, *outs, scale, n, BLOCK_M=bm, BLOCK_N=bn, **common_args)
    return dq, dk, dv


_autograd: dict = {}


def flash_attn_func(q, k, v, causal: bool = False, scale: float | None = None):
    """Differentiable Triton attention: the forward kernel (saving O and L) and `flash_attention_backward`."""
    import torch
    if "fn" not in _autograd:
        class FlashAttentionFn(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v, causal, scale):
                o, lse = flash_attention(q, k, v, causal, scale=scale, return_lse=True)
                ctx.save_for_backward(q, k, v, o, lse)
                ctx.causal, ctx.scale = causal, scale
                return o

            @staticmethod
            def backward(ctx, do):
                q, k, v, o, lse = ctx.saved_tensors
                dq, dk, dv = flash_attention_backward(q, k, v, o, lse, do, ctx.causal, ctx.scale)
                return dq, dk, dv, None, None

        _autograd["fn"] = FlashAttentionFn
    return _autograd["fn"].apply(q, k, v, bool(causal), scale)


def sdpa(q, k, v, causal: bool = False):
    """PyTorch's fused attention (FlashAttention-2 / cuDNN / memory-efficient kernels on a GPU)."""
    import torch.nn.functional as F
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


# ----------------------------------------------------------------------------------------------------------------------
# benchmark: the four implementations across sequence lengths

IMPLEMENTATIONS = ("naive", "tiled", "triton", "sdpa")


def _impl(name: str, causal: bool, tiled_blocks: tuple[int, int]):
    if name == "naive":
        return lambda q, k, v: naive_attention(q, k, v, causal)
    if name == "tiled":
        return lambda q, k, v: tiled_attention(q, k, v, *tiled_blocks, causal=causal)
    if name == "triton":
        return lambda q, k, v: flash_attention(q, k, v, causal)
    if name == "sdpa":
        return lambda q, k, v: sdpa(q, k, v, causal)
    raise ValueError(f"implementation {name!r} is unknown; allowed: {', '.join(IMPLEMENTATIONS)}")


def benchmark(seq_lens, batch: int = 1, heads: int = 2, head_dim: int = 64, dtype=None, causal: bool = False,
              impls=IMPLEMENTATIONS, device: str | None = None, min_run_time: float = 0.05,
              tiled_blocks: tuple[int, int] = (128, 128), max_naive_bytes: float = 8 * 2**30,
              max_tiled_seq: int | None = None, progress: bool = False) -> list[dict]:
    """Time each implementation at each sequence length (verified against SDPA first); one row per pair.

    Rows: impl, seq_len, ms, tflops (FLOPs = 4 B H N^2 D, halved when causal), hbm_bytes (what each implementation
    moves: `naive_moved_bytes` for "naive", `tiled_eager_bytes` for "tiled", `flash_io_bytes` for the fused
    kernels), intensity (FLOP/B) and rel_err vs SDPA. The naive version is skipped when its N x N matrices would exceed `max_naive_bytes`, the Python-looped tiled version above
    `max_tiled_seq` (default: no limit on a CPU, 4096 on a GPU).
    """
    import torch
    from common.core import timing
    from common.core.env import current
    dev = device or current().device
    dtype = dtype or (torch.bfloat16 if dev == "cuda" else torch.float32)
    max_tiled_seq = max_tiled_seq or (4096 if dev == "cuda" else 1 << 30)
    for name in impls:
        _impl(name, causal, tiled_blocks)  # validates the names
    elem = torch.empty((), dtype=dtype).element_size()
    rows = []
    seqs = list(seq_lens)
    it = seqs
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(seqs, desc="attention benchmark")
    for n in it:
        q, k, v = (torch.randn(batch, heads, n, head_dim, device=dev, dtype=dtype) for _ in range(3))
        ref = sdpa(q, k, v, causal).float()
        flops = attention_flops(batch, heads, n, head_dim, causal)
        for name in impls:
            if name == "naive" and batch * heads * n * n * (elem + 4) > max_naive_bytes:
                continue
            if name == "tiled" and n > max_tiled_seq:
                continue
            fn = _impl(name, causal, tiled_blocks)
            out = fn(q, k, v).float()
            err = ((out - ref).abs().max() / ref.abs().max()).item()
            t = timing.bench(fn, q, k, v, label=f"{name} N={n}", device=dev, min_run_time=min_run_time,
                             warmup=0 if dev == "cpu" else 1)  # the verification call above warmed it up
            if name == "naive":  # what the eager implementations really move, not the fused algorithms' counts
                moved = naive_moved_bytes(n, head_dim, elem, heads, batch, causal)
            elif name == "tiled":
                moved = tiled_eager_bytes(n, head_dim, *tiled_blocks, elem_bytes=elem, heads=heads, batch=batch)
            else:
                bm = 128 if dev == "cuda" else CPU_BLOCKS[0]
                moved = flash_io_bytes(n, head_dim, elem_bytes=elem, block_m=bm, heads=heads, batch=batch)
            rows.append({"impl": name, "seq_len": n, "ms": t.ms, "tflops": flops / t.median_s / 1e12,
                         "hbm_bytes": moved, "intensity": flops / moved, "rel_err": err, "iqr_%": 100 * t.spread})
        del q, k, v, ref
    return rows


def ratio_table(rows: list[dict], impl: str = "triton", baseline: str = "sdpa", unit: str = "TFLOP/s"):
    """A pandas table: FLOP rate per implementation (columns) and sequence length (rows), plus impl/baseline."""
    import pandas as pd
    scale = {"TFLOP/s": 1.0, "GFLOP/s": 1e3}.get(unit)
    if scale is None:
        raise ValueError(f"unit={unit!r}; allowed: 'TFLOP/s', 'GFLOP/s'")
    df = pd.DataFrame(rows).pivot(index="seq_len", columns="impl", values="tflops") * scale
    df = df[[c for c in IMPLEMENTATIONS if c in df.columns]]
    if impl in df.columns and baseline in df.columns:
        df[f"{impl}/{baseline}"] = df[impl] / df[baseline]
    return df


# ----------------------------------------------------------------------------------------------------------------------
# benchmark: forward, backward and both, Triton against SDPA

PASSES = ("fwd", "bwd", "fwd+bwd")
PASS_FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}  # the backward's 5 matmuls against the forward's 2


def train_benchmark(seq_lens, head_dims=(64, 128), causal_modes=(False, True), tokens: int = 16384,
                    width: int = 2048, dtype=None, device: str | None = None, min_run_time: float = 0.2,
                    passes=PASSES) -> list[dict]:
    """Time the Triton kernels (`flash_attn_func`) and SDPA, forward, backward and both, through autograd.

    Shapes: batch = tokens // N (at least 1), heads = width // d (the FlashAttention papers' setting). FLOPs: the
    forward 4 B H N^2 d (halved when causal), the backward 2.5x that (FlashAttention-2's convention; the Triton
    backward really does 3.5x, since dQ's kernel recomputes S and dP). Rows: impl, pass, seq_len, head_dim, causal,
    ms, tflops; the gradients are checked against SDPA's first (max relative error in `rel_err`).
    """
    import torch
    from common.core import timing
    from common.core.env import current
    dev = device or current().device
    dtype = dtype or (torch.bfloat16 if dev == "cuda" else torch.float32)
    for name in passes:
        if name not in PASSES:
            raise ValueError(f"pass {name!r} is unknown; allowed: {', '.join(PASSES)}")
    impls = {"triton": lambda q, k, v, c: flash_attn_func(q, k, v, c),
             "sdpa": lambda q, k, v, c: sdpa(q, k, v, c)}
    rows = []
    for d in head_dims:
        heads = max(1, width // d)
        for n in seq_lens:
            batch = max(1, tokens // n)
            for causal in causal_modes:
                q, k, v = (torch.randn(batch, heads, n, d, device=dev, dtype=dtype, requires_grad=True)
                           for _ in range(3))
                do = torch.randn(batch, heads, n, d, device=dev, dtype=dtype)
                grads = {}
                for name, f in impls.items():
                    o = f(q, k, v, causal)
                    grads[name] = torch.autograd.grad(o, (q, k, v), do)
                err = max(((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
                          for a, b in zip(grads["triton"], grads["sdpa"]))
                fwd_flops = attention_flops(batch, heads, n, d, causal)
                for name, f in impls.items():
                    o = f(q, k, v, causal)
                    calls = {"fwd": lambda f=f: f(q, k, v, causal),
                             "bwd": lambda o=o: torch.autograd.grad(o, (q, k, v), do, retain_graph=True),
                             "fwd+bwd": lambda f=f: torch.autograd.grad(f(q, k, v, causal), (q, k, v), do)}
                    for p in passes:
                        t = timing.bench(calls[p], label=f"{name} {p} N={n} d={d}", device=dev,
                                         min_run_time=min_run_time, warmup=1)
                        rows.append({"impl": name, "pass": p, "seq_len": n, "head_dim": d, "causal": causal,
                                     "ms": t.ms, "tflops": PASS_FLOP_FACTOR[p] * fwd_flops / t.median_s / 1e12,
                                     "rel_err": err})
                    del o
                del q, k, v, do, grads
    return rows


def train_ratio_table(rows: list[dict], unit: str = "TFLOP/s"):
    """Per (head_dim, causal, seq_len): Triton and SDPA FLOP rates side by side and triton/sdpa, per pass."""
    import pandas as pd
    scale = {"TFLOP/s": 1.0, "GFLOP/s": 1e3}.get(unit)
    if scale is None:
        raise ValueError(f"unit={unit!r}; allowed: 'TFLOP/s', 'GFLOP/s'")
    df = pd.DataFrame(rows)
    wide = df.pivot_table(index=["head_dim", "causal", "seq_len"], columns=["pass", "impl"], values="tflops") * scale
    out = pd.DataFrame(index=wide.index)
    for p in [x for x in PASSES if x in df["pass"].unique()]:
        out[f"{p} triton"] = wide[(p, "triton")]
        out[f"{p} sdpa"] = wide[(p, "sdpa")]
        out[f"{p} ratio"] = wide[(p, "triton")] / wide[(p, "sdpa")]
    return out
