"""Lab 03 checkers: right implementations pass, each classic mistake fails with a telling message, stubs are
"not attempted". The Triton kernels run under the interpreter on a CPU (setup sets TRITON_INTERPRET first)."""
from common.core.env import setup

setup("test", quiet=True)  # before triton is imported: TRITON_INTERPRET=1 where there is no GPU

import os  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from common.core.checks import CheckFailed  # noqa: E402
from common.exercises.lab03 import check_add_rmsnorm, check_softmax, check_vector_add  # noqa: E402
from common.kernels import fusion, rmsnorm  # noqa: E402


# ------------------------------------------------------------------------------------------------ 3.1 vector add
@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


@triton.jit
def add_kernel_no_mask(x_ptr, y_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    x = tl.load(x_ptr + offsets)
    y = tl.load(y_ptr + offsets)
    tl.store(out_ptr + offsets, x + y)


@triton.jit
def add_kernel_stub(x_ptr, y_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    raise NotImplementedError("Exercise 3.1: replace this line with your code")


def vector_add_right(x, y, out, block_size=1024):
    n = x.numel()
    add_kernel[(triton.cdiv(n, block_size),)](x, y, out, n, BLOCK_SIZE=block_size)
    return out


def vector_add_no_mask(x, y, out, block_size=1024):
    n = x.numel()
    add_kernel_no_mask[(triton.cdiv(n, block_size),)](x, y, out, n, BLOCK_SIZE=block_size)
    return out


def vector_add_floor_grid(x, y, out, block_size=1024):
    n = x.numel()
    add_kernel[(max(n // block_size, 1),)](x, y, out, n, BLOCK_SIZE=block_size)
    return out


def vector_add_fixed_block_in_grid(x, y, out, block_size=1024):
    n = x.numel()  # grid computed for 1024-element blocks while the kernel gets block_size
    add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK_SIZE=block_size)
    return out


def vector_add_returns_new(x, y, out, block_size=1024):
    return x - y  # a wrong result that is written nowhere


def test_vector_add_right():
    assert check_vector_add(vector_add_right).passed


def test_vector_add_right_returning_none():
    def launcher(x, y, out, block_size=1024):
        vector_add_right(x, y, out, block_size)
    assert check_vector_add(launcher).passed


def test_vector_add_missing_mask():
    with pytest.raises(CheckFailed, match="past the end of the output.*mask"):
        check_vector_add(vector_add_no_mask)


@pytest.mark.parametrize("wrong", [vector_add_floor_grid, vector_add_fixed_block_in_grid])
def test_vector_add_wrong_grid(wrong):
    with pytest.raises(CheckFailed, match=r"too few programs.*triton.cdiv"):
        check_vector_add(wrong)


def test_vector_add_never_writes_out():
    with pytest.raises(CheckFailed, match="never written"):
        check_vector_add(vector_add_returns_new)


def test_vector_add_stub_launcher():
    def stub(x, y, out, block_size=1024):
        raise NotImplementedError("Exercise 3.1: replace this line with your code")
    assert check_vector_add(stub).status == "not attempted"


def test_vector_add_stub_kernel():
    def launcher(x, y, out, block_size=1024):
        n = x.numel()
        add_kernel_stub[(triton.cdiv(n, block_size),)](x, y, out, n, BLOCK_SIZE=block_size)
        return out
    assert check_vector_add(launcher).status == "not attempted"


# ------------------------------------------------------------------------------------------------ 3.2 softmax
@triton.jit
def softmax_kernel(x_ptr, out_ptr, x_row_stride, out_row_stride, n_cols, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(axis=0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=-float("inf"))
    num = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + row * out_row_stride + cols, num / tl.sum(num, axis=0), mask=mask)


@triton.jit
def softmax_kernel_no_max(x_ptr, out_ptr, x_row_stride, out_row_stride, n_cols, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(axis=0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=-float("inf"))
    num = tl.exp(x)
    tl.store(out_ptr + row * out_row_stride + cols, num / tl.sum(num, axis=0), mask=mask)


@triton.jit
def softmax_kernel_columns(x_ptr, out_ptr, x_row_stride, out_row_stride, n_rows, BLOCK_SIZE: tl.constexpr):
    col = tl.program_id(axis=0)  # one program per column: the wrong axis
    rows = tl.arange(0, BLOCK_SIZE)
    mask = rows < n_rows
    x = tl.load(x_ptr + rows * x_row_stride + col, mask=mask, other=-float("inf"))
    num = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + rows * out_row_stride + col, num / tl.sum(num, axis=0), mask=mask)


@triton.jit
def softmax_kernel_other_zero(x_ptr, out_ptr, x_row_stride, out_row_stride, n_cols, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(axis=0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0)  # padded lanes count as exp(0 - max)
    num = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + row * out_row_stride + cols, num / tl.sum(num, axis=0), mask=mask)


@triton.jit
def softmax_kernel_store_no_mask(x_ptr, out_ptr, x_row_stride, out_row_stride, n_cols, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(axis=0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=-float("inf"))
    num = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + row * out_row_stride + cols, num / tl.sum(num, axis=0))


def _launch(kernel, x, out, rows_axis=True):
    rows, cols = x.shape
    if rows_axis:
        kernel[(rows,)](x, out, x.stride(0), out.stride(0), cols, BLOCK_SIZE=triton.next_power_of_2(cols))
    else:
        kernel[(cols,)](x, out, x.stride(0), out.stride(0), rows, BLOCK_SIZE=triton.next_power_of_2(rows))
    return out


def softmax_right(x, out):
    return _launch(softmax_kernel, x, out)


def test_softmax_right():
    assert check_softmax(softmax_right).passed


def test_softmax_right_on_contiguous_copy():
    def contiguous_first(x, out):  # handling strides by copying is fine too
        return out.copy_(_launch(softmax_kernel, x.contiguous(), torch.empty_like(out)))
    assert check_softmax(contiguous_first).passed


def test_softmax_without_max_subtraction():
    with pytest.raises(CheckFailed, match="subtract the row max"):
        check_softmax(lambda x, out: _launch(softmax_kernel_no_max, x, out))


def test_softmax_wrong_axis():
    with pytest.raises(CheckFailed, match="over each column"):
        check_softmax(lambda x, out: _launch(softmax_kernel_columns, x, out, rows_axis=False))


def test_softmax_padding_counted():
    with pytest.raises(CheckFailed, match="sums to .*-inf"):
        check_softmax(lambda x, out: _launch(softmax_kernel_other_zero, x, out))


def test_softmax_store_without_mask():
    with pytest.raises(CheckFailed, match="past the end of the output.*mask the store"):
        check_softmax(lambda x, out: _launch(softmax_kernel_store_no_mask, x, out))


def test_softmax_ignores_row_stride():
    def cols_as_stride(x, out):
        rows, cols = x.shape
        softmax_kernel[(rows,)](x, out, cols, out.stride(0), cols, BLOCK_SIZE=triton.next_power_of_2(cols))
        return out
    with pytest.raises(CheckFailed, match="strided view.*x.stride\\(0\\)"):
        check_softmax(cols_as_stride)


def test_softmax_torch_softmax_is_not_a_kernel_and_wrong_dim_is_named():
    with pytest.raises(CheckFailed, match="no Triton kernel was launched"):
        check_softmax(lambda x, out: out.copy_(torch.softmax(x, dim=-1)))
    with pytest.raises(CheckFailed, match="over each column"):
        check_softmax(lambda x, out: out.copy_(torch.softmax(x, dim=0)))


def test_softmax_stub():
    def stub(x, out):
        raise NotImplementedError("Exercise 3.2: replace this line with your code")
    assert check_softmax(stub).status == "not attempted"


# ---------------------------------------------------------------------------------------------------- issue 12 classes

def test_vector_add_modifies_input():
    def add_in_place(x, y, out, block_size=1024):
        x.add_(y)
        out.copy_(x)
        return out
    with pytest.raises(CheckFailed, match="x or y was modified"):
        check_vector_add(add_in_place)


def test_softmax_modifies_input():
    def in_place(x, out):
        x.copy_(torch.softmax(x, dim=-1))
        return out.copy_(x)
    with pytest.raises(CheckFailed, match="input x was modified"):
        check_softmax(in_place)


def test_vector_add_ignoring_block_size_caught():
    def fixed_block(x, y, out, block_size=1024):
        return vector_add_right(x, y, out, block_size=1024)  # right numbers, the parameter ignored
    with pytest.raises(CheckFailed, match="launched with BLOCK_SIZE=1024, not the block_size="):
        check_vector_add(fixed_block)


def test_softmax_not_one_program_per_row_caught():
    def two_launches(x, out):  # right numbers, but the rows split over two launches (grid != (n_rows,))
        half = max(1, x.shape[0] // 2)
        if x.shape[0] > 1:
            _launch(softmax_kernel, x[:half], out[:half])
            _launch(softmax_kernel, x[half:], out[half:])
            return out
        return _launch(softmax_kernel, x, out)
    with pytest.raises(CheckFailed, match="one program per row"):
        check_softmax(two_launches)


@triton.jit
def add_kernel_masked_store_only(x_ptr, y_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    x = tl.load(x_ptr + offsets)
    y = tl.load(y_ptr + offsets)
    tl.store(out_ptr + offsets, x + y, mask=offsets < n_elements)


def test_vector_add_unmasked_loads_caught():
    # the values are right (the store is masked), but the loads still run past the end of x and y
    def launcher(x, y, out, block_size=1024):
        add_kernel_masked_store_only[(triton.cdiv(x.numel(), block_size),)](x, y, out, x.numel(),
                                                                            BLOCK_SIZE=block_size)
    with pytest.raises(CheckFailed, match=r"without a mask \(line 4: tl.load\(x_ptr \+ offsets\)\)"):
        check_vector_add(launcher)


@pytest.mark.parametrize("check, reference", [
    (check_add_rmsnorm, lambda x, r, w, out, eps=1e-6: rmsnorm.add_rmsnorm(x, r, w, out, eps)),
    (check_vector_add, lambda x, y, out, block_size=1024: fusion.vector_add(x, y, out, block_size)),
    (check_softmax, lambda x, out: fusion.softmax(x, out)),
])
def test_calling_the_reference_is_caught(check, reference):
    with pytest.raises(CheckFailed, match="reference this exercise asks you to write"):
        check(reference)


def test_vector_add_in_pytorch_is_not_a_kernel():
    with pytest.raises(CheckFailed, match="no Triton kernel was launched"):
        check_vector_add(lambda x, y, out, block_size=1024: torch.add(x, y, out=out))


# ------------------------------------------------------------------------------------------------ 3.3 add + RMSNorm
RIGHT, IN_DTYPE, NOT_ADDED, NOT_WRITTEN, MEAN, BLOCK, EPS_OUT, NO_EPS, NO_WEIGHT, LAYERNORM, SUM, TIMES, SWAPPED = \
    range(13)


@triton.jit
def rms_kernel(x_ptr, res_ptr, w_ptr, out_ptr, x_row_stride, res_row_stride, out_row_stride, n_cols, eps,
               BLOCK_SIZE: tl.constexpr, M: tl.constexpr):
    """A learner's kernel: right with M = RIGHT, each other M plants one mistake."""
    row = tl.program_id(axis=0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0)
    r = tl.load(res_ptr + row * res_row_stride + cols, mask=mask, other=0.0)
    if M != 1:  # IN_DTYPE: no .to(tl.float32)
        x = x.to(tl.float32)
        r = r.to(tl.float32)
    h = x + r
    if M == 2:  # NOT_ADDED: the norm of x
        h = x
    if M != 3 and M != 12:  # NOT_WRITTEN, SWAPPED
        tl.store(res_ptr + row * res_row_stride + cols, x + r, mask=mask)
    if M == 4:  # MEAN
        ms = tl.sum(h, axis=0) / n_cols
    elif M == 5:  # BLOCK
        ms = tl.sum(h * h, axis=0) / BLOCK_SIZE
    elif M == 10:  # SUM
        ms = tl.sum(h * h, axis=0)
    elif M == 9:  # LAYERNORM
        mean = tl.sum(h, axis=0) / n_cols
        d = tl.where(mask, h - mean, 0.0)
        ms = tl.sum(d * d, axis=0) / n_cols
        h = d
    else:
        ms = tl.sum(h * h, axis=0) / n_cols
    if M == 6:  # EPS_OUT
        rstd = 1.0 / (tl.sqrt(ms) + eps)
    elif M == 7:  # NO_EPS
        rstd = 1.0 / tl.sqrt(ms)
    elif M == 11:  # TIMES
        rstd = tl.sqrt(ms + eps)
    else:
        rstd = 1.0 / tl.sqrt(ms + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if M == 8:  # NO_WEIGHT
        w = 1.0
    y = h * rstd * w
    if M == 12:  # SWAPPED: the output into residual, the sum into out
        tl.store(res_ptr + row * res_row_stride + cols, y, mask=mask)
        tl.store(out_ptr + row * out_row_stride + cols, x + r, mask=mask)
    else:
        tl.store(out_ptr + row * out_row_stride + cols, y, mask=mask)


@triton.jit
def rms_kernel_unmasked(x_ptr, res_ptr, w_ptr, out_ptr, x_row_stride, res_row_stride, out_row_stride, n_cols, eps,
                        BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(axis=0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols).to(tl.float32)
    r = tl.load(res_ptr + row * res_row_stride + cols).to(tl.float32)
    h = tl.where(mask, x + r, 0.0)
    tl.store(res_ptr + row * res_row_stride + cols, h, mask=mask)
    rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * out_row_stride + cols, h * rstd * w, mask=mask)


@triton.jit
def rms_kernel_store_unmasked(x_ptr, res_ptr, w_ptr, out_ptr, x_row_stride, res_row_stride, out_row_stride, n_cols,
                              eps, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(axis=0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(res_ptr + row * res_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    h = x + r
    tl.store(res_ptr + row * res_row_stride + cols, h, mask=mask)
    rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * out_row_stride + cols, h * rstd * w)


def rms_launcher(mistake=RIGHT, kernel=None, strides=True, grid=None):
    def add_rmsnorm(x, residual, weight, out, eps=1e-6):
        rows, n_cols = x.shape
        block = triton.next_power_of_2(n_cols)
        s = (x.stride(0), residual.stride(0), out.stride(0)) if strides else (n_cols,) * 3
        extra = {} if kernel is not None else {"M": mistake}
        (kernel or rms_kernel)[grid(x) if grid else (rows,)](x, residual, weight, out, *s, n_cols, eps,
                                                               BLOCK_SIZE=block, **extra)
        return out
    return add_rmsnorm


def test_add_rmsnorm_right():
    assert check_add_rmsnorm(rms_launcher()).passed


RMS_MISTAKES = {  # the planted mistake -> the words its verdict must use
    "no mask on the loads": (rms_launcher(kernel=rms_kernel_unmasked), "without a mask"),
    "no mask on the store": (rms_launcher(kernel=rms_kernel_store_unmasked), "outside its rows"),
    "mean instead of the mean of squares": (rms_launcher(MEAN), "not the mean of its squares"),
    "divided by BLOCK_SIZE": (rms_launcher(BLOCK), "divided by BLOCK_SIZE"),
    "eps outside the sqrt": (rms_launcher(EPS_OUT), "eps outside the sqrt"),
    "no eps": (rms_launcher(NO_EPS), "no eps"),
    "forgot the weight": (rms_launcher(NO_WEIGHT), "forgot the weight"),
    "residual not added": (rms_launcher(NOT_ADDED), "residual was not added"),
    "residual not written back": (rms_launcher(NOT_WRITTEN), "still holds its old values"),
    "outputs swapped": (rms_launcher(SWAPPED), "residual holds the normalised output"),
    "LayerNorm": (rms_launcher(LAYERNORM), "that is LayerNorm"),
    "sum, not mean": (rms_launcher(SUM), "not their mean"),
    "multiplied by the norm": (rms_launcher(TIMES), "multiplied by sqrt"),
    "wrong row stride": (rms_launcher(strides=False), "right on contiguous rows, wrong on strided ones"),
    "one program per element": (rms_launcher(grid=lambda x: (x.numel(),)), "one program per row"),
}


@pytest.mark.parametrize("mistake", sorted(RMS_MISTAKES))
def test_add_rmsnorm_mistakes_named(mistake):
    launcher, words = RMS_MISTAKES[mistake]
    with pytest.raises(CheckFailed, match=words):
        check_add_rmsnorm(launcher, seed=7)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="compiled Triton sums bf16 in float32 itself")
def test_add_rmsnorm_accumulated_in_bf16_named():
    with pytest.raises(CheckFailed, match="right in float32, wrong in bf16"):
        check_add_rmsnorm(rms_launcher(IN_DTYPE), seed=3)


def test_add_rmsnorm_in_pytorch_is_not_a_kernel():
    def eager(x, residual, weight, out, eps=1e-6):  # right numbers in PyTorch, written by hand: no kernel
        residual += x
        h = residual.float()
        return out.copy_(h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * weight.float())
    with pytest.raises(CheckFailed, match="no Triton kernel was launched"):
        check_add_rmsnorm(eager)


def test_add_rmsnorm_stub():
    def stub(x, residual, weight, out, eps=1e-6):
        raise NotImplementedError("Exercise 3.3: replace this line with your code")
    assert check_add_rmsnorm(stub).status == "not attempted"
