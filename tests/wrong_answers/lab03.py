"""Named wrong answers for lab 03's Triton checkers (3.1 vector add, 3.2 row softmax, 3.3 residual add + RMSNorm):
the lab test's launchers and kernels with one mistake each, plus look-alikes and cheats (torch, the workbook's
reference launcher, the workbook's own kernel). Each runs under the Triton interpreter on a CPU, so a wrong answer
costs one or two cheap cases before its verdict."""
from common.core.env import setup

setup("test", quiet=True)  # before triton is imported: TRITON_INTERPRET=1 where there is no GPU

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from common.exercises import lab03  # noqa: E402
from common.kernels import fusion, rmsnorm  # noqa: E402
from test_exercises_lab03 import (RMS_MISTAKES, _launch, rms_launcher, add_kernel, add_kernel_masked_store_only,  # noqa: E402
                                  softmax_kernel, softmax_kernel_columns, softmax_kernel_no_max,
                                  softmax_kernel_other_zero, softmax_kernel_store_no_mask, vector_add_floor_grid,
                                  vector_add_no_mask, vector_add_returns_new, vector_add_right)


@triton.jit
def _add_no_pid(x_ptr, y_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.arange(0, BLOCK_SIZE)  # every program handles block 0
    mask = offsets < n_elements
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def _add_x_twice(x_ptr, y_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(axis=0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(x_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def _softmax_unnormalised(x_ptr, out_ptr, x_row_stride, out_row_stride, n_cols, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(axis=0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=-float("inf"))
    tl.store(out_ptr + row * out_row_stride + cols, tl.exp(x - tl.max(x, axis=0)), mask=mask)


def _add_with(kernel, grid=None):
    def vector_add(x, y, out, block_size=1024):
        n = x.numel()
        kernel[(grid(n, block_size) if grid else triton.cdiv(n, block_size),)](x, y, out, n, BLOCK_SIZE=block_size)
        return out
    return vector_add


def _in_place(x, y, out, block_size=1024):
    x.add_(y)
    return out.copy_(x)


def _two_launches(x, out):
    half = max(1, x.shape[0] // 2)
    if x.shape[0] > 1:
        _launch(softmax_kernel, x[:half], out[:half])
        _launch(softmax_kernel, x[half:], out[half:])
        return out
    return _launch(softmax_kernel, x, out)


def _cols_as_stride(x, out):
    rows, cols = x.shape
    softmax_kernel[(rows,)](x, out, cols, out.stride(0), cols, BLOCK_SIZE=triton.next_power_of_2(cols))
    return out


def _workbook_softmax_kernel(x, out):
    rows, cols = x.shape
    fusion._kernels().softmax[(rows,)](x, out, x.stride(0), out.stride(0), cols, BLOCK_SIZE=triton.next_power_of_2(cols))
    return out


def _softmax_for_show(x, out):  # torch.softmax fills out; a kernel launched into scratch memory, for show
    _launch(softmax_kernel, x, torch.empty_like(out))
    return out.copy_(torch.softmax(x, dim=-1))


def _add_for_show(x, y, out, block_size=1024):
    vector_add_right(x, y, torch.empty_like(out), block_size)
    return torch.add(x, y, out=out)


def _residual_in_torch(x, residual, weight, out, eps=1e-6):  # the fusion undone: the add in PyTorch, the norm fused
    residual.add_(x)
    return rms_launcher()(torch.zeros_like(x), residual, weight, out, eps)


def _add_block_by_block(x, y, out, block_size=1024):  # a Python loop of one-program launches
    n = x.numel()
    for start in range(0, n, block_size):
        add_kernel[(1,)](x[start:], y[start:], out[start:], n - start, BLOCK_SIZE=block_size)
    return out


def _rmsnorm_twice(x, residual, weight, out, eps=1e-6):  # two launches: the add and the norm not in one kernel
    rms_launcher()(x, residual, weight, out, eps)
    return rms_launcher()(torch.zeros_like(x), residual, weight, out, eps)


def _eager_rmsnorm(x, residual, weight, out, eps=1e-6):  # right numbers, in PyTorch: no kernel
    residual += x
    h = residual.float()
    return out.copy_(h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * weight.float())


WRONG = {
    lab03.check_vector_add: [
        (vector_add_no_mask, "past the end of the output"),
        (vector_add_floor_grid, "too few programs"),
        (vector_add_returns_new, "never written \\(it still holds"),
        (lambda x, y, out, block_size=1024: vector_add_right(x, y, out, block_size=1024),
         "launched with BLOCK_SIZE=1024, not the block_size="),
        (_add_with(add_kernel_masked_store_only), "has a load or store without a mask"),
        (lambda x, y, out, block_size=1024: torch.add(x, y, out=out), "no Triton kernel was launched"),
        (lambda x, y, out, block_size=1024: fusion.vector_add(x, y, out, block_size),
         "reference this exercise asks you to write"),
        (_in_place, "x or y was modified"),
        (_add_with(add_kernel, grid=lambda n, b: n), "one program per element"),
        (_add_with(_add_no_pid), "every program wrote the same block"),
        (_add_with(_add_x_twice), "the second load reads x_ptr"),
        (lambda x, y, out, block_size=1024: _add_with(fusion._kernels().add)(x, y, out, block_size),
         "workbook's own"),
        (_add_for_show, "computed with torch \\(add\\) beside the kernel"),
        (_add_block_by_block, "kernel launches for one add"),
    ],
    lab03.check_softmax: [
        (lambda x, out: _launch(softmax_kernel_no_max, x, out), "subtract the row max"),
        (lambda x, out: _launch(softmax_kernel_columns, x, out, rows_axis=False), "over each column"),
        (lambda x, out: _launch(softmax_kernel_other_zero, x, out), "sums to .*-inf"),
        (lambda x, out: _launch(softmax_kernel_store_no_mask, x, out), "mask the store"),
        (_cols_as_stride, "strided view.*x.stride\\(0\\)"),
        (lambda x, out: out.copy_(torch.softmax(x, dim=-1)), "no Triton kernel was launched"),
        (lambda x, out: fusion.softmax(x, out), "reference this exercise asks you to write"),
        (lambda x, out: out.copy_(x.copy_(torch.softmax(x, dim=-1))), "input x was modified"),
        (_two_launches, "one program per row"),
        (lambda x, out: _launch(_softmax_unnormalised, x, out), "unnormalised"),
        (_workbook_softmax_kernel, "workbook's own"),
        (_softmax_for_show, "computed with torch \\(softmax\\) beside the kernel"),
    ],
    lab03.check_add_rmsnorm: [(launcher, words) for launcher, words in RMS_MISTAKES.values()] + [
        (_eager_rmsnorm, "no Triton kernel was launched"),
        (_residual_in_torch, "computed with torch \\(add_\\) beside the kernel"),
        (_rmsnorm_twice, "into ONE kernel"),
        (lambda x, r, w, out, eps=1e-6: rmsnorm.add_rmsnorm(x, r, w, out, eps),
         "reference this exercise asks you to write"),
        (lambda x, r, w, out, eps=1e-6: out.copy_(rmsnorm.add_rmsnorm_eager(x, r, w, eps)),
         "called common.kernels.rmsnorm.add_rmsnorm_eager, the workbook's own code"),
    ],
}
