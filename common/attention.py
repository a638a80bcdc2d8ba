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
  256 in powers of two); `launch_forward` launches any kernel with the same signature (the lab's exercise).

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
GPU_CONFIGS = [  # (BLOCK_M, BLOCK_N, num_warps, num_stages)
    (128, 64, 4, 3), (128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 2), (128, 128, 8, 3), (128, 32, 4, 4),
    (64, 64, 4, 3), (64, 32, 4, 4),
]


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
                    counter: HBMCounter | None = None):
    """FlashAttention's forward pass in PyTorch: never forms the N x N matrix.

    For each block of `block_m` query rows (all heads at once), loop over blocks of `block_n` keys/values, keeping the
    running max `m`, normaliser `l` and unnormalised output `acc` (float32) and rescaling `l` and `acc` by
    exp(m_old - m_new) whenever the max grows. `counter` counts HBM traffic: each Q block read once, each K and V block
    read once per Q block, each O block written once. Causal: key blocks entirely above the diagonal are skipped.
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
    return out


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
                         BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
        # One program: BLOCK_M query rows of one (batch, head). Q, K, V, O are contiguous (B*H, N_CTX, HEAD_DIM).
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

    _kernels["plain"] = flash_fwd_kernel
    if torch.cuda.is_available() and not _interpreted():
        configs = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
                   for bm, bn, w, s in GPU_CONFIGS]
        _kernels["tuned"] = triton.autotune(configs, key=["N_CTX", "HEAD_DIM", "CAUSAL"])(flash_fwd_kernel)
    return _kernels


def compile_for_gpu(arch: int = 90, head_dim: int = 128, causal: bool = False, block_m: int = 128,
                    block_n: int = 64, num_warps: int = 8, num_stages: int = 3, dtype: str = "bf16", kernel=None):
    """Compile a forward kernel ahead of time for an NVIDIA GPU of compute capability `arch` (90: H100/H200), with no
    GPU present; return Triton's compiled kernel (`.asm["ptx"]`, `.metadata.shared` = shared memory bytes).

    Needs Triton's NVIDIA backend and TRITON_INTERPRET unset in this process (the interpreter replaces kernels).
    """
    if _interpreted():
        raise RuntimeError("compile_for_gpu needs TRITON_INTERPRET unset: run it in a process without the interpreter")
    if dtype not in ("bf16", "fp16", "fp32"):
        raise ValueError(f"dtype={dtype!r}; allowed: 'bf16', 'fp16', 'fp32'")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    kernel = kernel or _build_kernels()["plain"]
    ptr = f"*{dtype}"
    signature = {"Q": ptr, "K": ptr, "V": ptr, "O": ptr, "sm_scale": "fp32", "N_CTX": "i32", "HEAD_DIM": "constexpr",
                 "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "CAUSAL": "constexpr"}
    constexprs = {"HEAD_DIM": head_dim, "BLOCK_M": block_m, "BLOCK_N": block_n, "CAUSAL": bool(causal)}
    # what a launch specialises on: 16-byte aligned pointers (torch allocations are), N_CTX a multiple of 16
    attrs = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3, 5)}
    src = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages})


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
        grid = (triton.cdiv(n, block_m), b * h)
        kernel[grid](qc, kc, vc, o, scale, n, HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=bool(causal),
                     **constexprs)
    if guard and not torch.isnan(buf[b * h * n * d:]).all():
        raise RuntimeError("the kernel wrote past the end of O: mask the stores of rows >= N_CTX")
    return o


def flash_attention(q, k, v, causal: bool = False, block_m: int | None = None, block_n: int | None = None,
                    scale: float | None = None):
    """The Triton FlashAttention forward of this module: autotuned on a GPU unless block sizes are given."""
    kernels = _build_kernels()
    kernel = kernels["plain"] if (block_m or block_n or "tuned" not in kernels) else kernels["tuned"]
    return launch_forward(kernel, q, k, v, causal=causal, block_m=block_m, block_n=block_n, scale=scale, guard=False)


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

    Rows: impl, seq_len, ms, tflops (FLOPs = 4 B H N^2 D, halved when causal), hbm_bytes (standard count for
    "naive", the tiled count with `tiled_blocks` for the others), intensity (FLOP/B) and rel_err vs SDPA. The naive
    version is skipped when its N x N matrices would exceed `max_naive_bytes`, the Python-looped tiled version above
    `max_tiled_seq` (default: no limit on a CPU, 4096 on a GPU).
    """
    import torch
    from common import timing
    from common.env import current
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
            if name == "naive":
                moved = standard_io_bytes(n, head_dim, elem, heads, batch)
            else:
                bm = min(tiled_blocks[0], n) if name == "tiled" else (128 if dev == "cuda" else CPU_BLOCKS[0])
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
