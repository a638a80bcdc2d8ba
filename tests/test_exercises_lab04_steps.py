"""Lab 04's Triton forward in four steps (4.4-4.7): a right kernel passes each step; the ten or more wrong kernels per
step defined here are run, and their verdicts matched, by the audit (tests/wrong_answers/lab04.py)."""
import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import pytest  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from common.core.checks import CheckFailed  # noqa: E402
from common.exercises import lab04  # noqa: E402
from common.kernels import attention  # noqa: E402

STEP_CHECKS = {"4.4": lab04.check_one_block, "4.5": lab04.check_flash_loop, "4.6": lab04.check_ragged,
               "4.7": lab04.check_triton_forward}


# Two kernels with one mistake each, chosen by MISTAKE (literal codes: a compiled kernel reads no Python globals).
# _one (a single key block): 0 right, 1 no scale, 2 scale twice, 3 exp2 without log2(e), 4 exp with log2(e), 5 max
# not subtracted, 6 not normalised, 7 max and sum over axis 0, 8 K not transposed, 9 BLOCK_M keys, 10 no head offset,
# 11 no query-tile offset.

@triton.jit
def _one(Q, K, V, O, sm_scale, N_CTX, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
         CAUSAL: tl.constexpr, MISTAKE: tl.constexpr):
    base = tl.program_id(1).to(tl.int64) * N_CTX * HEAD_DIM
    if MISTAKE == 10:
        base = tl.program_id(1).to(tl.int64) * 0
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    if MISTAKE == 11:
        offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    if MISTAKE == 9:
        offs_n = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :])
    if MISTAKE == 8:
        k = tl.load(K + base + offs_n[:, None] * HEAD_DIM + offs_d[None, :])
    else:
        k = tl.load(K + base + offs_n[None, :] * HEAD_DIM + offs_d[:, None])
    v = tl.load(V + base + offs_n[:, None] * HEAD_DIM + offs_d[None, :])
    qk_scale = sm_scale * 1.4426950408889634
    if MISTAKE == 1:
        qk_scale = 1.4426950408889634
    if MISTAKE == 2:
        qk_scale = sm_scale * sm_scale * 1.4426950408889634
    if MISTAKE == 3:
        qk_scale = sm_scale
    qk = tl.dot(q, k) * qk_scale
    if MISTAKE == 4:
        p = tl.exp(qk - tl.max(qk, 1)[:, None])
        l = tl.sum(p, 1)
    elif MISTAKE == 5:
        p = tl.math.exp2(qk)
        l = tl.sum(p, 1)
    elif MISTAKE == 7:
        p = tl.math.exp2(qk - tl.max(qk, 0)[None, :])
        l = tl.sum(p, 0)
    else:
        p = tl.math.exp2(qk - tl.max(qk, 1)[:, None])
        l = tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v)
    if MISTAKE != 6:
        acc = acc / l[:, None]
    tl.store(O + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], acc.to(O.dtype.element_ty))


# _full (the loop, masks, causal): 0 right, 1 one key block only, 2 loop step BLOCK_M, 3 no rescale, 4 l rescaled but
# not acc, 5 acc rescaled but not l, 6 not normalised, 7 no scale, 8 alpha inverted, 9 exp2 without log2(e),
# 10 max not subtracted, 11 no key mask, 12 scores of masked keys 0, 13 V unmasked, 14 key mask off by one, 15 Q load
# unmasked, 16 store unmasked, 17 K load unmasked (scores masked), 20 CAUSAL ignored, 21 causal reversed, 22 diagonal
# masked, 23 causal plus one, 24 causal mask in tile-local indices, 25 causal bound with BLOCK_N, 26 causal bound
# before the diagonal block, 27 no mask inside the diagonal block, 28 blocks above the diagonal masked, not skipped.

@triton.jit
def _full(Q, K, V, O, sm_scale, N_CTX, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
          CAUSAL: tl.constexpr, MISTAKE: tl.constexpr):
    start_m = tl.program_id(0)
    base = tl.program_id(1).to(tl.int64) * N_CTX * HEAD_DIM
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    if MISTAKE == 15:
        q = tl.load(Q + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :])
    else:
        q = tl.load(Q + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=offs_m[:, None] < N_CTX, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.4426950408889634
    if MISTAKE == 9:
        qk_scale = sm_scale
    if MISTAKE == 7:
        qk_scale = 1.4426950408889634
    hi = N_CTX
    if MISTAKE == 1:
        hi = tl.minimum(BLOCK_N, N_CTX)
    if CAUSAL and MISTAKE != 20 and MISTAKE != 28:
        if MISTAKE == 25:
            hi = tl.minimum((start_m + 1) * BLOCK_N, N_CTX)
        elif MISTAKE == 26:
            hi = tl.minimum(start_m * BLOCK_M, N_CTX)
        else:
            hi = tl.minimum((start_m + 1) * BLOCK_M, N_CTX)
    step = BLOCK_N
    if MISTAKE == 2:
        step = BLOCK_M
    for start_n in range(0, hi, step):
        cols = start_n + offs_n
        inside = cols < N_CTX
        if MISTAKE == 14:
            inside = cols <= N_CTX
        if MISTAKE == 11 or MISTAKE == 17:
            k = tl.load(K + base + cols[None, :] * HEAD_DIM + offs_d[:, None])
        else:
            k = tl.load(K + base + cols[None, :] * HEAD_DIM + offs_d[:, None], mask=inside[None, :], other=0.0)
        if MISTAKE == 11 or MISTAKE == 13:
            v = tl.load(V + base + cols[:, None] * HEAD_DIM + offs_d[None, :])
        else:
            v = tl.load(V + base + cols[:, None] * HEAD_DIM + offs_d[None, :], mask=inside[:, None], other=0.0)
        qk = tl.dot(q, k) * qk_scale
        keep = (offs_m[:, None] >= -1) & inside[None, :]
        if MISTAKE == 11:
            keep = (offs_m[:, None] >= -1) & (cols[None, :] >= 0)
        if CAUSAL and MISTAKE != 20 and MISTAKE != 27:
            if MISTAKE == 21:
                keep = keep & (offs_m[:, None] <= cols[None, :])
            elif MISTAKE == 22:
                keep = keep & (offs_m[:, None] > cols[None, :])
            elif MISTAKE == 23:
                keep = keep & (offs_m[:, None] + 1 >= cols[None, :])
            elif MISTAKE == 24:
                keep = keep & (tl.arange(0, BLOCK_M)[:, None] >= tl.arange(0, BLOCK_N)[None, :])
            else:
                keep = keep & (offs_m[:, None] >= cols[None, :])
        if MISTAKE == 12:
            qk = tl.where(keep, qk, 0.0)
        else:
            qk = tl.where(keep, qk, float("-inf"))
        if MISTAKE == 10:
            p = tl.math.exp2(qk)
            alpha = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
            m_new = m_i
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            p = tl.math.exp2(qk - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            if MISTAKE == 8:
                alpha = tl.math.exp2(m_new - m_i)
            if MISTAKE == 3:
                alpha = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
        if MISTAKE == 5:
            l_i = l_i + tl.sum(p, 1)
        else:
            l_i = l_i * alpha + tl.sum(p, 1)
        if MISTAKE == 4:
            acc = acc + tl.dot(p.to(v.dtype), v)
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    if MISTAKE != 6:
        acc = acc / l_i[:, None]
    if MISTAKE == 16:
        tl.store(O + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], acc.to(O.dtype.element_ty))
    else:
        tl.store(O + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], acc.to(O.dtype.element_ty),
                 mask=offs_m[:, None] < N_CTX)


@triton.jit
def _right(Q, K, V, O, sm_scale, N_CTX, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
           CAUSAL: tl.constexpr):
    # the solution's kernel, written again (a learner's right answer: every load and store masked)
    start_m = tl.program_id(0)
    base = tl.program_id(1).to(tl.int64) * N_CTX * HEAD_DIM
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=offs_m[:, None] < N_CTX, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    hi = N_CTX
    if CAUSAL:
        hi = tl.minimum((start_m + 1) * BLOCK_M, N_CTX)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        k = tl.load(K + base + cols[None, :] * HEAD_DIM + offs_d[:, None], mask=cols[None, :] < N_CTX, other=0.0)
        v = tl.load(V + base + cols[:, None] * HEAD_DIM + offs_d[None, :], mask=cols[:, None] < N_CTX, other=0.0)
        qk = tl.dot(q, k) * (sm_scale * 1.4426950408889634)
        keep = cols[None, :] < N_CTX
        if CAUSAL:
            keep = keep & (offs_m[:, None] >= cols[None, :])
        qk = tl.where(keep, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    tl.store(O + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], (acc / l_i[:, None]).to(O.dtype.element_ty),
             mask=offs_m[:, None] < N_CTX)


@triton.jit
def _right_exp(Q, K, V, O, sm_scale, N_CTX, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               CAUSAL: tl.constexpr):
    # a right kernel written differently: tl.exp with sm_scale alone, pointers built per block, the output normalised
    # as it is stored, and the causal bound from the tile's last row
    start_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    q_ptrs = Q + bh * N_CTX * HEAD_DIM + rows[:, None] * HEAD_DIM + dims[None, :]
    q = tl.load(q_ptrs, mask=rows[:, None] < N_CTX, other=0.0)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    end = N_CTX
    if CAUSAL:
        end = tl.minimum(start_m * BLOCK_M + BLOCK_M, N_CTX)
    for start_n in range(0, end, BLOCK_N):
        keys = start_n + tl.arange(0, BLOCK_N)
        k = tl.load(K + bh * N_CTX * HEAD_DIM + keys[None, :] * HEAD_DIM + dims[:, None], mask=keys[None, :] < N_CTX,
                    other=0.0)
        v = tl.load(V + bh * N_CTX * HEAD_DIM + keys[:, None] * HEAD_DIM + dims[None, :], mask=keys[:, None] < N_CTX,
                    other=0.0)
        s = tl.dot(q, k) * sm_scale
        ok = keys[None, :] < N_CTX
        if CAUSAL:
            ok = ok & (keys[None, :] <= rows[:, None])
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    o_ptrs = O + bh * N_CTX * HEAD_DIM + rows[:, None] * HEAD_DIM + dims[None, :]
    tl.store(o_ptrs, (acc / l_i[:, None]).to(O.dtype.element_ty), mask=rows[:, None] < N_CTX)


def _launcher(kernel, mistake=None):
    def forward(q, k, v, causal=False):
        extra = {} if mistake is None else {"MISTAKE": mistake}
        return attention.launch_forward(kernel, q, k, v, causal=causal, **extra)
    return forward


@pytest.mark.parametrize("step", sorted(STEP_CHECKS))
def test_flash_steps_right(step):
    assert STEP_CHECKS[step](_launcher(_right)).passed
    if step == "4.4":
        assert lab04.check_one_block(_launcher(_one, 0)).passed


def test_full_kernel_written_differently_passes():
    assert lab04.check_triton_forward(_launcher(_right_exp)).passed
    assert lab04.check_ragged(_launcher(_right_exp)).passed


@pytest.mark.parametrize("step", sorted(STEP_CHECKS))
def test_workbook_kernel_is_refused(step):
    """The lab's own kernel, reached without a call (the built kernels' dict), is refused by name."""
    from common.kernels.attention import triton_kernels
    kernel = triton_kernels.build_kernels()["plain"]
    with pytest.raises(CheckFailed, match="flash_fwd_kernel.*the workbook's own"):
        STEP_CHECKS[step](lambda q, k, v, causal=False: attention.launch_forward(kernel, q, k, v, causal=causal))


def test_one_block_kernel_fails_the_loop():
    with pytest.raises(CheckFailed, match="only the first BLOCK_N keys"):
        lab04.check_flash_loop(_launcher(_one, 0))


# (kernel, mistake, words), ten or more per step: run once, by the audit (tests/wrong_answers/lab04.py)
ONE_BLOCK_MISTAKES = [
    (1, "not scaled"), (2, "scaled twice"), (3, "does not include log2.e."), (4, "tl.exp used"),
    (5, "exp overflowed"), (6, "not divided by the row sum"), (7, "over axis 0"), (8, "K\\^T"),
    (9, "BLOCK_M counts query rows"), (10, "after the first was never written"), (11, "never written: each program"),
]
LOOP_MISTAKES = [
    (1, "only the first BLOCK_N keys"), (2, "advances by BLOCK_M"), (3, "not rescaled"),
    (4, "but the accumulator is not"), (5, "but the sum l is not"), (6, "not divided by the row sum"),
    (7, "not scaled"), (8, "alpha is exp.m_new - m_old."), (9, "does not include log2.e."), (10, "exp overflowed"),
]
RAGGED_MISTAKES = [
    (11, "keys past N_CTX are used"), (12, "left at 0"), (13, "V is loaded without a mask"),
    (14, "key mask is off by one"), (15, "has no mask"), (16, "past the end of O"), (17, "has no mask"),
    (2, "advances by BLOCK_M"), (3, "not rescaled"), (9, "does not include log2.e."),
]
CAUSAL_MISTAKES = [
    (20, "CAUSAL is ignored"), (21, "points the wrong way"), (22, "diagonal is masked too"),
    (23, "also sees key i \\+ 1"), (24, "inside the tiles"),
    (25, "stops at .start_m \\+ 1. \\* BLOCK_N"),
    (26, "stops before the diagonal block"), (27, "nothing is masked inside it"),
    (11, "keys past N_CTX are used"), (9, "does not include log2.e."), (28, "skipped, not masked"),
]


@pytest.mark.parametrize("step", sorted(STEP_CHECKS))
def test_triton_sdpa_is_not_the_kernel(step):
    def sdpa(q, k, v, causal=False):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    with pytest.raises(CheckFailed, match="no Triton kernel was launched"):
        STEP_CHECKS[step](sdpa)
