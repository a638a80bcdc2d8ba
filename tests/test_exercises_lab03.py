"""Lab 03 checkers: right implementations pass, each classic mistake fails with a telling message, stubs are
"not attempted". The Triton kernels run under the interpreter on a CPU (setup sets TRITON_INTERPRET first)."""
from common.core.env import setup

setup("test", quiet=True)  # before triton is imported: TRITON_INTERPRET=1 where there is no GPU

import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from common.core.checks import CheckFailed  # noqa: E402
from common.exercises.lab03 import check_chain_bytes, check_softmax, check_vector_add  # noqa: E402
from common.kernels import fusion


# ------------------------------------------------------------------------------------------------ 3.1 chain bytes
def chain_bytes_right(n, n_ops, b, fused):
    return 2 * n * b * (1 if fused else n_ops)


def test_chain_bytes_right():
    assert check_chain_bytes(chain_bytes_right).passed


@pytest.mark.parametrize("wrong, match", [
    (lambda n, ops, b, fused: n * b * (1 if fused else ops), "only the reads"),
    (lambda n, ops, b, fused: 2 * n * b * ops, "unfused count"),
    (lambda n, ops, b, fused: 2 * n * b, "fused count"),
    (lambda n, ops, b, fused: 2 * n * b if fused else (ops + 1) * n * b, "one read and"),
    (lambda n, ops, b, fused: 2 * n * (1 if fused else ops), "elements, not bytes"),
])
def test_chain_bytes_wrong(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        check_chain_bytes(wrong)


def test_chain_bytes_stub():
    def stub(n, ops, b, fused):
        raise NotImplementedError("Exercise 3.1: replace this line with your code")
    assert check_chain_bytes(stub).status == "not attempted"


# ------------------------------------------------------------------------------------------------ 3.2 vector add
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
    raise NotImplementedError("Exercise 3.2: replace this line with your code")


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
        raise NotImplementedError("Exercise 3.2: replace this line with your code")
    assert check_vector_add(stub).status == "not attempted"


def test_vector_add_stub_kernel():
    def launcher(x, y, out, block_size=1024):
        n = x.numel()
        add_kernel_stub[(triton.cdiv(n, block_size),)](x, y, out, n, BLOCK_SIZE=block_size)
        return out
    assert check_vector_add(launcher).status == "not attempted"


# ------------------------------------------------------------------------------------------------ 3.3 softmax
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
        raise NotImplementedError("Exercise 3.3: replace this line with your code")
    assert check_softmax(stub).status == "not attempted"


# ---------------------------------------------------------------------------------------------------- issue 12 classes

def test_chain_bytes_wrong_size_table_fails_every_call():
    # a byte table that rounds 1-byte elements up to 2 and 8-byte ones down to 4 fails on every call (fixed cases)
    wrong = lambda n, ops, b, fused: 2 * n * min(max(b, 2), 4) * (1 if fused else ops)  # noqa: E731
    for _ in range(3):
        with pytest.raises(CheckFailed, match=r"seed \d+"):
            check_chain_bytes(wrong)


def test_chain_bytes_aliased_mistakes_name_both():
    # at 2 bytes per element, counting elements and counting reads only give one number: both are named
    def elements_at_two(n, ops, b, fused):
        right = 2 * n * b * (1 if fused else ops)
        return right // 2 if b == 2 else right
    with pytest.raises(CheckFailed, match="either elements instead of bytes .* or only the reads"):
        check_chain_bytes(elements_at_two)


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
    (check_chain_bytes, lambda n, ops, b, fused: fusion.chain_bytes(n, ops, b, fused)),
    (check_vector_add, lambda x, y, out, block_size=1024: fusion.vector_add(x, y, out, block_size)),
    (check_softmax, lambda x, out: fusion.softmax(x, out)),
])
def test_calling_the_reference_is_caught(check, reference):
    with pytest.raises(CheckFailed, match="reference this exercise asks you to write"):
        check(reference)


def test_vector_add_in_pytorch_is_not_a_kernel():
    with pytest.raises(CheckFailed, match="no Triton kernel was launched"):
        check_vector_add(lambda x, y, out, block_size=1024: torch.add(x, y, out=out))
