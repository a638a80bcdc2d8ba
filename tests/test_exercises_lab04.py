"""Lab 04 checkers: each passes a right answer, catches each classic mistake by name, and reports a stub."""
import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere

import functools  # noqa: E402
import math  # noqa: E402

import pytest  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from common.core.checks import CheckFailed  # noqa: E402
from common.exercises import lab04  # noqa: E402
from common.kernels import attention



def _stub(*args, **kwargs):
    raise NotImplementedError("Exercise 4.x: replace this line with your code")


# ---------------------------------------------------------------------------------------------------------------- 4.1

def test_standard_bytes_right():
    assert lab04.check_standard_attention_bytes(lambda n, d, b: b * (4 * n * d + 4 * n * n)).passed


@pytest.mark.parametrize("wrong, message", [
    (lambda n, d, b: b * (4 * n * d + 2 * n * n), "written to HBM and read back"),
    (lambda n, d, b: 4 * n * d + 4 * n * n, "count of elements"),
    (lambda n, d, b: b * 4 * n * n, "left out Q, K, V"),
    (lambda n, d, b: b * (3 * n * d + 4 * n * n), "one of Q, K, V, O is missing"),
    (lambda n, d, b: b * (4 * n * d + 4 * n * n) + 1, "expected"),
])
def test_standard_bytes_wrong(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        lab04.check_standard_attention_bytes(wrong)


def test_standard_bytes_stub():
    assert lab04.check_standard_attention_bytes(_stub).status == "not attempted"


# ---------------------------------------------------------------------------------------------------------------- 4.2

def _online_stats(blocks, rescale=True, subtract_max=True):
    m = l = None
    for x in blocks:
        x = x.float()
        m_new = x.amax(-1) if m is None else torch.maximum(m, x.amax(-1))
        if not subtract_max:
            terms = torch.exp(x).sum(-1)
            l = terms if l is None else l + terms
        else:
            terms = torch.exp(x - m_new[:, None]).sum(-1)
            l = terms if l is None else (l * torch.exp(m - m_new) if rescale else l) + terms
        m = m_new
    return m, l


def test_online_softmax_right():
    assert lab04.check_online_softmax(_online_stats).passed


def test_online_softmax_no_rescale():
    with pytest.raises(CheckFailed, match="rescaled by exp"):
        lab04.check_online_softmax(functools.partial(_online_stats, rescale=False))


def test_online_softmax_max_not_subtracted():
    with pytest.raises(CheckFailed, match="max is not subtracted|subtract the running max"):
        lab04.check_online_softmax(functools.partial(_online_stats, subtract_max=False))


def test_online_softmax_overflow_named():
    # subtracting the max only of the first block: small values pass, large ones overflow
    def first_block_max(blocks):
        m0 = l = m = None
        for x in blocks:
            x = x.float()
            m0 = x.amax(-1) if m0 is None else m0
            m = x.amax(-1) if m is None else torch.maximum(m, x.amax(-1))
            t = torch.exp(x - m0[:, None]).sum(-1)
            l = t if l is None else l + t
        return m, l * torch.exp(m0 - m)
    with pytest.raises(CheckFailed, match="exp overflowed"):
        lab04.check_online_softmax(first_block_max)


def test_online_softmax_wrong_max():
    with pytest.raises(CheckFailed, match="running max m"):
        lab04.check_online_softmax(lambda blocks: (lambda m, l: (m - 1, l))(*_online_stats(blocks)))


def test_online_softmax_stub():
    assert lab04.check_online_softmax(_stub).status == "not attempted"


def _concatenated(blocks):  # not online: every block kept, one softmax at the end (the same numbers, if it worked)
    x = torch.cat(list(blocks), dim=1).float()
    m = x.amax(-1)
    return m, torch.exp(x - m[:, None]).sum(-1)


def _stacked_numpy(blocks):  # not online either: kept as NumPy views, combined at the end
    import numpy as np
    x = torch.from_numpy(np.concatenate([b.numpy() for b in blocks], axis=1))
    m = x.amax(-1)
    return m, torch.exp(x - m[:, None]).sum(-1)


@pytest.mark.parametrize("wrong", [_concatenated, _stacked_numpy])
def test_online_softmax_must_be_online(wrong):
    """Blocks arrive through one buffer (as tiles in SRAM): keeping them and taking one softmax at the end fails,
    by name."""
    with pytest.raises(CheckFailed, match="LAST block repeated: the blocks were kept"):
        lab04.check_online_softmax(wrong)


# ---------------------------------------------------------------------------------------------------------------- 4.3

def _tiled(q, k, v, block_m, block_n, causal=False, mistake=None):
    n, d = q.shape[2], q.shape[3]
    out = torch.empty_like(q)
    for i in range(0, n, block_m):
        qi = q[:, :, i:i + block_m]
        rows = qi.shape[2]
        m = torch.full(qi.shape[:3], float("-inf"))
        l = torch.zeros(qi.shape[:3])
        acc = torch.zeros(qi.shape)
        if mistake == "ignore_causal":
            causal = False
        hi = n if (not causal or mistake in ("direction", "no_skip")) else min(n, i + rows)
        step = block_n
        for j in range(0, hi, step):
            kj, vj = k[:, :, j:j + step], v[:, :, j:j + step]
            if mistake == "multiple":  # assumes every block is full: pads the last block with the next rows
                kj = k.new_zeros(k.shape[:2] + (step, d)) + 1.0
                kj[:, :, :min(step, n - j)] = k[:, :, j:j + step]
                vj = v.new_ones(v.shape[:2] + (step, d))
                vj[:, :, :min(step, n - j)] = v[:, :, j:j + step]
            s = qi @ kj.transpose(-2, -1) * (1.0 if mistake == "no_scale" else d ** -0.5)
            if causal:
                cols = torch.arange(j, j + kj.shape[2])[None, :]
                rws = torch.arange(i, i + rows)[:, None]
                keep = {"direction": cols >= rws, "off_by_one": cols < rws}.get(mistake, cols <= rws)
                s = s.masked_fill(~keep, float("-inf"))
            m_new = torch.maximum(m, s.amax(-1))
            if mistake == "no_max":
                p = torch.exp(s)
                alpha = torch.ones_like(m)
            else:
                p = torch.exp(s - m_new[..., None])
                alpha = torch.exp(m - m_new)
            if mistake == "no_rescale":
                alpha = torch.ones_like(alpha)
            l = l * alpha + p.sum(-1)
            acc = acc * alpha[..., None] + p @ vj
            m = m_new
        out[:, :, i:i + rows] = acc / l[..., None]
    return out


def test_tiled_right():
    assert lab04.check_tiled_attention(_tiled).passed


@pytest.mark.parametrize("mistake, message", [
    ("no_rescale", "rescale the accumulator"),
    ("no_max", "exp overflowed"),
    ("direction", "points the wrong way"),
    ("off_by_one", "off by one"),
    ("multiple", "multiple of the block"),
])
def test_tiled_mistakes(mistake, message):
    with pytest.raises(CheckFailed, match=message):
        lab04.check_tiled_attention(functools.partial(_tiled, mistake=mistake))


def test_tiled_materialising_naive_passes_values_but_not_shape_errors():
    # a wrong output shape is named as such
    with pytest.raises(CheckFailed, match="output shape"):
        lab04.check_tiled_attention(lambda q, k, v, bm, bn, causal=False: q[:, :, :1])


def test_tiled_stub():
    assert lab04.check_tiled_attention(_stub).status == "not attempted"


def test_tiled_sdpa_is_not_the_loop():
    def sdpa(q, k, v, bm, bn, causal=False):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    with pytest.raises(CheckFailed, match="scaled_dot_product_attention .SDPA. computes the whole attention"):
        lab04.check_tiled_attention(sdpa)


# ---------------------------------------------------------------------------------------------------------- 4.4-4.7
# The Triton steps' right and named wrong kernels are in test_exercises_lab04_steps.py (a module of its own, so the
# two halves run on two workers).

STEP_CHECKS = {"4.4": lab04.check_one_block, "4.5": lab04.check_flash_loop, "4.6": lab04.check_ragged,
               "4.7": lab04.check_triton_forward}


def test_triton_stub_kernel_is_not_attempted():
    @triton.jit
    def stub_kernel(Q, K, V, O, sm_scale, N_CTX, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
        raise NotImplementedError("Exercise 4.4: replace this line with your code")

    def flash_forward(q, k, v, causal=False):
        return attention.launch_forward(stub_kernel, q, k, v, causal=causal)
    for check in STEP_CHECKS.values():
        assert check(flash_forward).status == "not attempted"
        assert check(_stub).status == "not attempted"


# ---------------------------------------------------------------------------------------------------------------- 4.8

def _bwd(q, k, v, o, lse, do, block_m, block_n, causal=False, mistake=None):
    """The solution's tiled backward written again (a learner's own code), right or with one named mistake."""
    n, d = q.shape[2], q.shape[3]
    scale = d ** -0.5
    sc = {"no_scale": 1.0, "scale_twice": scale * scale}.get(mistake, scale)
    delta = (do.float() * o.float()).sum(-1)  # D = rowsum(dO * O)
    if mistake == "delta_do":
        delta = do.float().sum(-1)
    dq = torch.zeros(q.shape, dtype=torch.float32)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    for j in range(0, n, block_n):
        kj, vj = k[:, :, j:j + block_n].float(), v[:, :, j:j + block_n].float()
        dkj, dvj = torch.zeros_like(kj), torch.zeros_like(vj)
        lo = (j // block_m) * block_m if causal and mistake != "no_skip" else 0
        for i in range(lo, n, block_m):
            qi, doi = q[:, :, i:i + block_m].float(), do[:, :, i:i + block_m].float()
            s = qi @ kj.transpose(-2, -1) * scale
            if mistake == "tile_max":
                p = torch.exp(s - s.amax(-1, keepdim=True))
            elif mistake == "no_lse":
                p = torch.exp(s)
            else:
                p = torch.exp(s - lse[:, :, i:i + block_m, None])
            if causal and mistake != "tile_mask":
                rows = torch.arange(i, i + qi.shape[2])[:, None]
                cols = torch.arange(j, j + kj.shape[2])[None, :]
                p = p.masked_fill(cols >= rows if mistake == "diagonal" else cols > rows, 0.0)
            dvj += (p @ doi if mistake == "dv_not_transposed" else p.transpose(-2, -1) @ doi)
            dp = doi @ vj.transpose(-2, -1)
            ds = p * dp if mistake == "no_delta" else p * (dp - delta[:, :, i:i + block_m, None])
            dq[:, :, i:i + block_m] += ds @ kj * sc
            dkj += ds.transpose(-2, -1) @ qi * (1.0 if mistake == "dk_no_scale" else sc)
        dk[:, :, j:j + block_n], dv[:, :, j:j + block_n] = dkj.to(k.dtype), dvj.to(v.dtype)
    return dq.to(q.dtype), dk, dv


def test_tiled_backward_right():
    assert lab04.check_tiled_backward(_bwd).passed


def _autograd_sdpa(q, k, v, o, lse, do, bm, bn, causal):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return torch.autograd.grad(out, (q, k, v), do)


def _autograd_workbook(q, k, v, o, lse, do, bm, bn, causal):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    attention.tiled_attention(q, k, v, bm, bn, causal).backward(do)
    return q.grad, k.grad, v.grad


@pytest.mark.parametrize("wrong, message", [(_autograd_sdpa, "SDPA. computes the whole attention"),
                                            (_autograd_workbook, "common.kernels.attention.*tiled_attention")])
def test_tiled_backward_autograd_is_not_the_backward(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        lab04.check_tiled_backward(wrong)


def _wrong_bwd(mistake):
    def fn(q, k, v, o, lse, do, bm, bn, causal):
        return tuple(t.float() for t in lab04._bwd_variant(q, k, v, do, causal, q.shape[-1] ** -0.5, bm, bn,
                                                            mistake))
    return fn


@pytest.mark.parametrize("mistake, message", [
    ("no_delta", "D = rowsum"), ("block_max", "max of each key block"), ("diagonal", "drops the diagonal"),
    ("tile_mask", "inside the blocks that cross it"), ("no_scale", "lack the softmax scale")])
def test_tiled_backward_mistakes_named(mistake, message, monkeypatch):
    # the full-matrix variants would trip the N x N guard first: switch it off to test the diagnosis alone
    monkeypatch.setattr(lab04, "full_matrix_guard", lambda *a, **k: _NullGuard())
    with pytest.raises(CheckFailed, match=message):
        lab04.check_tiled_backward(_wrong_bwd(mistake))


class _NullGuard:
    seen = None
    shortcut = None
    rows: dict = {}

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def test_tiled_backward_full_matrix_caught():
    with pytest.raises(CheckFailed, match="N x N matrix was formed"):
        lab04.check_tiled_backward(_wrong_bwd(None))


def test_tiled_backward_swapped_blocks_caught():
    # block_m and block_n mixed up: right numerically, but q is cut into block_n rows (the cases use both orders)
    with pytest.raises(CheckFailed, match="swapped"):
        lab04.check_tiled_backward(lambda q, k, v, o, lse, do, bm, bn, c: _bwd(q, k, v, o, lse, do, bn, bm, c))


def test_tiled_backward_modifies_input():
    def fn(q, k, v, o, lse, do, bm, bn, causal):
        out = _bwd(q, k, v, o, lse, do, bm, bn, causal)
        do.mul_(1.0 + 1e-3)
        return out
    with pytest.raises(CheckFailed, match="modified its input do"):
        lab04.check_tiled_backward(fn)


def test_tiled_backward_wrong_type_and_stub():
    with pytest.raises(CheckFailed, match="must return a tuple"):
        lab04.check_tiled_backward(lambda *a: _bwd(*a)[0])
    assert lab04.check_tiled_backward(_stub).status == "not attempted"


def test_tiled_backward_seed_printed():
    def fn(q, k, v, o, lse, do, bm, bn, causal):
        dq, dk, dv = _bwd(q, k, v, o, lse, do, bm, bn, causal)
        return dq * 1.01, dk, dv
    with pytest.raises(CheckFailed, match=r"seed \d+"):
        lab04.check_tiled_backward(fn)


# ---------------------------------------------------------------------------------------------------- issue 12 classes

def test_standard_bytes_wrong_size_table_fails_every_call():
    # a byte-size table that treats 1-byte elements as 2 bytes: a fixed case now catches it on every call
    wrong = lambda n, d, b: max(b, 2) * (4 * n * d + 4 * n * n)  # noqa: E731
    for _ in range(3):
        with pytest.raises(CheckFailed, match=r"elem_bytes=1\) \(seed \d+\)"):
            lab04.check_standard_attention_bytes(wrong)


def test_online_softmax_overwritten_max():
    def overwrite(blocks):
        m = l = None
        for x in blocks:
            x = x.float()
            m_new = x.amax(-1)  # the block's max replaces the running max
            t = torch.exp(x - m_new[:, None]).sum(-1)
            l = t if l is None else l * torch.exp(m - m_new) + t
            m = m_new
        return m, l
    with pytest.raises(CheckFailed, match="keep the running max"):
        lab04.check_online_softmax(overwrite)


def test_tiled_attention_full_matrix_caught():
    with pytest.raises(CheckFailed, match="N x N matrix was formed"):
        lab04.check_tiled_attention(lambda q, k, v, bm, bn, causal=False: torch.softmax(
            (q @ k.transpose(-2, -1)).masked_fill(torch.ones(q.shape[2], q.shape[2], dtype=torch.bool).triu(1) & causal,
                                                  float("-inf")) * q.shape[-1] ** -0.5, -1) @ v)


def test_tiled_attention_swapped_blocks_caught():
    with pytest.raises(CheckFailed, match="swapped"):
        lab04.check_tiled_attention(lambda q, k, v, bm, bn, causal=False: _tiled(q, k, v, bn, bm, causal))


def test_tiled_attention_modifies_input_caught():
    def scales_q_in_place(q, k, v, bm, bn, causal=False):
        out = _tiled(q, k, v, bm, bn, causal)
        q.mul_(q.shape[-1] ** -0.5)
        return out
    with pytest.raises(CheckFailed, match=r"modified its input q"):
        lab04.check_tiled_attention(scales_q_in_place)


def test_tiled_attention_failure_prints_seed():
    with pytest.raises(CheckFailed, match=r"seed \d+"):
        lab04.check_tiled_attention(lambda q, k, v, bm, bn, causal=False: _tiled(
            q, k, v, bm, bn, causal) * 1.01)


@pytest.mark.parametrize("check, reference", [
    (lab04.check_standard_attention_bytes, lambda n, d, b: attention.standard_io_bytes(n, d, b)),
    (lab04.check_online_softmax, lambda blocks: attention.online_softmax_stats(blocks)),
    (lab04.check_tiled_attention, lambda q, k, v, bm, bn, causal=False: attention.tiled_attention(q, k, v, bm, bn,
                                                                                                    causal)),
    (lab04.check_triton_forward, lambda q, k, v, causal=False: attention.flash_attention(q, k, v, causal)),
    (lab04.check_tiled_backward, lambda q, k, v, o, lse, do, bm, bn, c: attention.tiled_attention_backward(
        q, k, v, o, lse, do, bm, bn, c)),
])
def test_calling_the_reference_is_caught(check, reference):
    with pytest.raises(CheckFailed, match="reference this exercise asks you to write"):
        check(reference)


# ---------------------------------------------------------------------------------------------------- issue 46: right
# answers written differently (none is refused), and the routes around the exercises (refused by name)

def test_standard_bytes_written_differently():
    assert lab04.check_standard_attention_bytes(lambda n, d, b: 4 * b * n * (d + n)).passed
    assert lab04.check_standard_attention_bytes(lambda n, d, b: float(2 * b * (2 * n * d + 2 * n * n))).passed


def _online_logaddexp(blocks):  # a running logsumexp, turned into (m, l) at the end
    m = lse = None
    for x in blocks:
        x = x.float()
        m = x.amax(-1) if m is None else torch.maximum(m, x.amax(-1))
        block = torch.logsumexp(x, -1)
        lse = block if lse is None else torch.logaddexp(lse, block)
    return m, torch.exp(lse - m)


def test_online_softmax_written_differently():
    assert lab04.check_online_softmax(_online_logaddexp).passed


def _tiled_einsum(q, k, v, block_m, block_n, causal=False):
    """Query blocks by torch.split, scores by einsum, the causal loop bounded by i + block_m and a break."""
    n, d = q.shape[2], q.shape[3]
    outs = []
    for b, qi in enumerate(q.split(block_m, dim=2)):
        i = b * block_m
        m = torch.full(qi.shape[:3], float("-inf"))
        l = torch.zeros(qi.shape[:3])
        acc = torch.zeros(qi.shape)
        for j in range(0, n, block_n):
            if causal and j >= i + block_m:
                break
            kj, vj = k[:, :, j:j + block_n], v[:, :, j:j + block_n]
            s = torch.einsum("bhmd,bhnd->bhmn", qi, kj) / math.sqrt(d)
            if causal:
                s = torch.where(torch.arange(j, j + kj.shape[2]) <= torch.arange(i, i + qi.shape[2])[:, None], s,
                                float("-inf"))
            m_new = torch.maximum(m, s.amax(-1))
            p = torch.exp(s - m_new[..., None])
            scale = torch.exp(m - m_new)
            l, acc, m = l * scale + p.sum(-1), acc * scale[..., None] + torch.einsum("bhmn,bhnd->bhmd", p, vj), m_new
        outs.append(acc / l[..., None])
    return torch.cat(outs, dim=2)


def test_tiled_written_differently():
    assert lab04.check_tiled_attention(_tiled_einsum).passed


def _bwd_query_outer(q, k, v, o, lse, do, block_m, block_n, causal=False):
    """Query blocks outside, key blocks inside (dK and dV accumulated in full), the causal loop cut at the diagonal."""
    n, d = q.shape[2], q.shape[3]
    scale = 1 / math.sqrt(d)
    delta = (do * o).sum(-1, keepdim=True)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for i in range(0, n, block_m):
        qi, doi, rows = q[:, :, i:i + block_m], do[:, :, i:i + block_m], min(block_m, n - i)
        for j in range(0, min(n, i + rows) if causal else n, block_n):
            kj, vj = k[:, :, j:j + block_n], v[:, :, j:j + block_n]
            p = torch.exp(qi @ kj.transpose(-2, -1) * scale - lse[:, :, i:i + block_m, None])
            if causal:
                p = p * (torch.arange(j, j + kj.shape[2]) <= torch.arange(i, i + rows)[:, None])
            dv[:, :, j:j + block_n] += p.transpose(-2, -1) @ doi
            ds = p * (doi @ vj.transpose(-2, -1) - delta[:, :, i:i + block_m])
            dq[:, :, i:i + block_m] += scale * ds @ kj
            dk[:, :, j:j + block_n] += scale * ds.transpose(-2, -1) @ qi
    return dq, dk, dv


def test_tiled_backward_written_differently():
    assert lab04.check_tiled_backward(_bwd_query_outer).passed
