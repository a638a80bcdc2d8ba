"""The Triton kernels' source: the FlashAttention forward (optionally writing the logsumexp L) and the backward's two
kernels, dK/dV by key block and dQ by query block (no atomics). Defined on first use, so that importing this module
never imports triton before `common.setup()` chose its mode."""
from __future__ import annotations

_kernels: dict = {}


def build_kernels() -> dict:
    """{"plain": forward, "dkdv": ..., "dq": ...}: the kernels, defined on first use (importing triton then)."""
    if _kernels:
        return _kernels
    global triton, tl
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
