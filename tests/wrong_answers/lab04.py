"""Lab 04's named wrong answers: HBM bytes (4.1; its three most likely stay in test_wrong_answers.py), the online
softmax (4.2), tiled attention (4.3), the four Triton steps (4.4-4.7; their kernels live in
test_exercises_lab04_steps.py, and run here only -- the audit is their one run) and the tiled backward (4.8).
Mistakes, look-alikes and cheats: the workbook's code, torch's fused attention and autograd."""
import functools

import torch
import torch.nn.functional as F

from common.exercises import lab04
from common.kernels import attention
from test_exercises_lab04 import _bwd, _online_stats, _tiled
from test_exercises_lab04_steps import (CAUSAL_MISTAKES, LOOP_MISTAKES, ONE_BLOCK_MISTAKES, RAGGED_MISTAKES,
                                        _full, _launcher, _one, _right, triton, tl)


# ---------------------------------------------------------------------------------------------------------------- 4.2

def _online(blocks, how=None):
    """A one-pass online softmax written with one named mistake."""
    m = l = None
    for x in blocks:
        x = x.float()
        m_new = x.amax(-1) if m is None or how == "overwrite_max" else torch.maximum(m, x.amax(-1))
        if how == "first_max" and m is not None:
            m_new = m
        terms = torch.exp(x - m_new[:, None]).sum(-1)
        if l is None or how == "overwrite_sum":
            l = terms
        else:
            l = l * {"inverted": torch.exp(m_new - m)}.get(how, torch.exp(m - m_new)) + terms
        m = m_new
    if how == "first_max":
        return m, l
    return {"swapped": (l, m), "logsumexp": (m, m + torch.log(l)), "half": (m.half(), l.half())}.get(how, (m, l))


def _mean(blocks):
    parts = []
    m = l = None
    for x in blocks:
        parts.append(x.shape[1])
        x = x.float()
        m_new = x.amax(-1) if m is None else torch.maximum(m, x.amax(-1))
        t = torch.exp(x - m_new[:, None]).sum(-1)
        l = t if l is None else l * torch.exp(m - m_new) + t
        m = m_new
    return m, l / sum(parts)


def _via_library(blocks):  # the workbook's one-shot online softmax on the blocks put together
    x = torch.cat([b.clone() for b in blocks], dim=1)
    return attention.online_softmax_stats([x])


# ---------------------------------------------------------------------------------------------------------------- 4.3

def _sdpa(q, k, v, bm, bn, causal=False):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _aten_flash(q, k, v, bm, bn, causal=False):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, is_causal=causal)[0]


def _flex(q, k, v, bm, bn, causal=False):
    from torch.nn.attention.flex_attention import flex_attention
    causal_mod = lambda s, b, h, i, j: torch.where(i >= j, s, -float("inf"))  # noqa: E731
    return flex_attention(q, k, v, score_mod=causal_mod if causal else None)


def _multi_head(q, k, v, bm, bn, causal=False):  # torch's multi-head attention with identity projections, per head
    b, h, n, d = q.shape
    eye = torch.eye(d)
    mask = torch.ones(n, n, dtype=torch.bool).triu(1) if causal else None
    heads = [F.multi_head_attention_forward(
        q[:, i].transpose(0, 1), k[:, i].transpose(0, 1), v[:, i].transpose(0, 1), d, 1, None, None, None, None,
        False, 0.0, eye, None, training=False, need_weights=False, attn_mask=mask, use_separate_proj_weight=True,
        q_proj_weight=eye, k_proj_weight=eye, v_proj_weight=eye)[0].transpose(0, 1) for i in range(h)]
    return torch.stack(heads, 1)


def _full_matrix(q, k, v, bm, bn, causal=False):
    s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


# ---------------------------------------------------------------------------------------------------------- 4.4-4.7

@triton.jit
def _nothing(Q, K, V, O, sm_scale, N_CTX, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             CAUSAL: tl.constexpr):
    pass


def _sdpa_after_a_launch(q, k, v, causal=False):
    attention.launch_forward(_nothing, q, k, v, causal=causal)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _workbook_kernel(q, k, v, causal=False):
    from common.kernels.attention import triton_kernels
    return attention.launch_forward(triton_kernels.build_kernels()["plain"], q, k, v, causal=causal)


def _flash_attention(q, k, v, causal=False):
    return attention.flash_attention(q, k, v, causal)


def _own_blocks(q, k, v, causal=False):
    return attention.launch_forward(_right, q, k, v, causal=causal, block_m=32, block_n=32)


def _sdpa_only(q, k, v, causal=False):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


STEP_CHEATS = [
    (_sdpa_only, "no Triton kernel was launched"),
    (_sdpa_after_a_launch, "not the O your kernel wrote"),
    (_workbook_kernel, "flash_fwd_kernel from .*, the workbook.s own kernel"),
    (_flash_attention, "called common.kernels.attention.triton_forward.flash_attention, the reference"),
    (_own_blocks, "not the checker's BLOCK_M"),
]


def _steps(kernel, mistakes):
    return [(_launcher(kernel, m), w) for m, w in mistakes] + STEP_CHEATS


# ---------------------------------------------------------------------------------------------------------------- 4.8

def _autograd_sdpa(q, k, v, o, lse, do, bm, bn, causal):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    return torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=causal), (q, k, v), do)


def _aten_backward(q, k, v, o, lse, do, bm, bn, causal):
    out, lse_cpu = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, is_causal=causal)
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(do, q, k, v, out, lse_cpu, 0.0,
                                                                              causal)


def _vjp_of_own_forward(q, k, v, o, lse, do, bm, bn, causal):
    return torch.func.vjp(lambda a, b, c: _tiled(a, b, c, bm, bn, causal), q, k, v)[1](do)


def _backward_of_own_forward(q, k, v, o, lse, do, bm, bn, causal):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    _tiled(q, k, v, bm, bn, causal).backward(do)
    return q.grad, k.grad, v.grad


def _workbook_backward(q, k, v, o, lse, do, bm, bn, causal):
    return attention.flash_attention_backward(q, k, v, o, lse, do, causal)


def _full_matrix_backward(q, k, v, o, lse, do, bm, bn, causal):
    return tuple(t.float() for t in lab04._bwd_variant(q, k, v, do, causal, q.shape[-1] ** -0.5, bm, bn))


def _modifies_do(q, k, v, o, lse, do, bm, bn, causal):
    out = _bwd(q, k, v, o, lse, do, bm, bn, causal)
    do.mul_(1.001)
    return out


_b = functools.partial

WRONG = {
    lab04.check_standard_attention_bytes: [
        (lambda n, d, b: b * (3 * n * d + 4 * n * n), "one of Q, K, V, O is missing"),
        (lambda n, d, b: 8 * b * (4 * n * d + 4 * n * n), "in bits"),
        (lambda n, d, b: b * (8 * n * d + 4 * n * n), "counted twice .read and written."),
        (lambda n, d, b: b * 4 * n * d + 16 * n * n, "S and P counted in 4-byte floats"),
        (lambda n, d, b: 4 * n * d + b * 4 * n * n, "multiplies S and P but not Q, K, V and O"),
        (lambda n, d, b: b * (4 * n * d + 4 * d * d), "counted as d x d"),
        (lambda n, d, b: 4 * n * n * d, "FLOP count"),
        (lambda n, d, b: b * (4 * n * d + 6 * n * n), "counted three times"),
        (lambda n, d, b: b * (4 * n * d + 4 * n * n) / 2**20, "in MiB"),
        (lambda n, d, b: b * (4 * n * d + 4 * n * n) / 1e9, "in GB"),
        (lambda n, d, b: attention.standard_io_bytes(n, d, b), "the reference this exercise asks you to write"),
        (lambda n, d, b: attention.naive_moved_bytes(n, d, b), "the workbook's own code"),
    ],
    lab04.check_online_softmax: [
        (_b(_online_stats, rescale=False), "rescaled by exp"),
        (_b(_online_stats, subtract_max=False), "max is not subtracted|subtract the running max"),
        (_b(_online, how="overwrite_max"), "keep the running max"),
        (_b(_online, how="first_max"), "first block's max"),
        (_b(_online, how="inverted"), "rescale factor is inverted"),
        (_b(_online, how="overwrite_sum"), "only the last block's terms"),
        (_b(_online, how="swapped"), "came back as .l, m."),
        (_b(_online, how="logsumexp"), "the logsumexp"),
        (_b(_online, how="half"), "work in float32"),
        (_mean, "the mean of exp"),
        (lambda blocks: (lambda x: (x.amax(-1), torch.exp(x - x.amax(-1, keepdim=True)).sum(-1)))(
            torch.cat(list(blocks), dim=1)), "LAST block repeated: the blocks were kept"),
        (_via_library, "the reference this exercise asks you to write"),
    ],
    lab04.check_tiled_attention: [
        (_b(_tiled, mistake="no_rescale"), "rescale the accumulator"),
        (_b(_tiled, mistake="no_max"), "exp overflowed"),
        (_b(_tiled, mistake="direction"), "points the wrong way"),
        (_b(_tiled, mistake="off_by_one"), "diagonal is masked too"),
        (_b(_tiled, mistake="multiple"), "multiple of the block"),
        (_b(_tiled, mistake="no_scale"), "not scaled"),
        (_b(_tiled, mistake="ignore_causal"), "causal is ignored"),
        (_b(_tiled, mistake="no_skip"), "above the diagonal too"),
        (lambda q, k, v, bm, bn, causal=False: _tiled(q, k, v, bn, bm, causal), "swapped"),
        (_full_matrix, "N x N matrix was formed"),
        (_sdpa, "scaled_dot_product_attention .SDPA. computes the whole attention"),
        (_aten_flash, "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu, torch's fused attention"),
        (_flex, "torch's flex_attention .torch.nn.attention.flex_attention. computes the whole attention"),
        (_multi_head, "multi_head_attention_forward .SDPA inside. computes the whole attention"),
        (lambda q, k, v, bm, bn, causal=False: attention.naive_attention(q, k, v, causal),
         "called common.kernels.attention.reference.naive_attention, the workbook's own code"),
        (lambda q, k, v, bm, bn, causal=False: attention.flash_attention(q, k, v, causal),
         "called common.kernels.attention.triton_forward.flash_attention, the workbook's own code"),
    ],
    lab04.check_one_block: _steps(_one, ONE_BLOCK_MISTAKES),
    lab04.check_flash_loop: _steps(_full, LOOP_MISTAKES),
    lab04.check_ragged: _steps(_full, RAGGED_MISTAKES),
    lab04.check_triton_forward: _steps(_full, CAUSAL_MISTAKES),
    lab04.check_tiled_backward: [
        (_b(_bwd, mistake="no_delta"), "D = rowsum.dO \\* O. is missing"),
        (_b(_bwd, mistake="delta_do"), "D = rowsum.dO., not rowsum"),
        (_b(_bwd, mistake="tile_max"), "max of each key block"),
        (_b(_bwd, mistake="no_lse"), "without subtracting L"),
        (_b(_bwd, mistake="diagonal"), "drops the diagonal"),
        (_b(_bwd, mistake="tile_mask"), "inside the blocks that cross it"),
        (_b(_bwd, mistake="no_scale"), "lack the softmax scale"),
        (_b(_bwd, mistake="scale_twice"), "softmax scale twice"),
        (_b(_bwd, mistake="dk_no_scale"), "dK lacks the softmax scale"),
        (_b(_bwd, mistake="no_skip"), "above the diagonal too"),
        (lambda q, k, v, o, lse, do, bm, bn, c: _bwd(q, k, v, o, lse, do, bn, bm, c), "swapped"),
        (_modifies_do, "modified its input do"),
        (_full_matrix_backward, "N x N matrix was formed"),
        (_autograd_sdpa, "SDPA. computes the whole attention"),
        (_aten_backward, "torch's fused attention kernel, computes"),
        (_vjp_of_own_forward, "autograd .torch.autograd.grad. computes the gradients"),
        (_backward_of_own_forward, "autograd ..backward... computes the gradients"),
        (_workbook_backward, "flash_attention_backward, the reference"),
    ],
}
