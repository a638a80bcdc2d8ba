"""Attention in PyTorch: the float64 yardstick, the naive version (S and P in HBM), the online softmax, and
FlashAttention's tiled forward and backward, each counting the HBM bytes it moves in an `HBMCounter`.

Tensors are (batch, heads, seq_len, head_dim), as for `torch.nn.functional.scaled_dot_product_attention`.
"""
from __future__ import annotations

from dataclasses import dataclass

from common.core.validate import whole


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



def check_kernel_inputs(q, k, v, what: str) -> tuple[int, int, int, int]:
    """(B, H, N, D) of q, k, v that a Triton kernel of this package can take (one shape, a supported head dim, on a
    GPU or under the interpreter); else a ValueError naming the problem."""
    import os
    _check_qkv(q, k, v)
    if q.shape != k.shape:
        raise ValueError(f"the Triton {what} needs q and k of one shape, got {tuple(q.shape)} and {tuple(k.shape)}")
    if q.shape[-1] not in (16, 32, 64, 128, 256):
        raise ValueError(f"head_dim={q.shape[-1]} is not supported by the kernel; allowed: 16, 32, 64, 128, 256")
    if q.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("q is on the CPU but Triton is not in interpreter mode: call common.setup() before "
                         "anything imports triton, or move the tensors to the GPU")
    return tuple(q.shape)

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
        whole(name, value)
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
    whole("block", block)
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
    whole("block_m", block_m)
    whole("block_n", block_n)
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
    whole("block_m", block_m)
    whole("block_n", block_n)
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
