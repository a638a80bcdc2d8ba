"""What lab 05's checkers share: random tensors over several orders of magnitude, tensor results unpacked and compared
element by element, a block-scaled result's (q, scale) checked for shape, axis, zero blocks, scales and rounding."""
from __future__ import annotations

import torch

from common.core.checks import expect_equal, fail
from common.kernels import lowp


def rand_tensor(rows, cols, gen, spread=3.0):
    """Values over several orders of magnitude, rows with different sizes, a few outliers."""
    x = torch.randn(rows, cols, generator=gen, dtype=torch.float64)
    x *= torch.exp(spread * torch.randn(rows, 1, generator=gen, dtype=torch.float64))
    x.view(-1)[torch.randint(0, x.numel(), (max(1, x.numel() // 200),), generator=gen)] *= 20
    return x.to(torch.float32)


class Float8Watch(torch.overrides.TorchFunctionMode):
    """Records whether any torch call inside it names a float8 dtype (a cast to FP8 does the rounding for you)."""

    def __init__(self):
        super().__init__()
        self.used = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(isinstance(a, torch.dtype) and "float8" in str(a) for a in (*args, *kwargs.values())):
            self.used = True
        return func(*args, **kwargs)



def as_tensor(v, what):
    if v is None:
        fail(f"{what} is None -- did the function forget to return it?")
    try:
        return torch.as_tensor(v).to(torch.float64)
    except Exception:
        fail(f"{what}: expected a tensor, got {type(v).__name__}")


def unpack(out, n, what):
    if not isinstance(out, (tuple, list)) or len(out) != n:
        fail(f"{what} must return a tuple of {n} items, got {type(out).__name__}"
             f"{f' of {len(out)}' if isinstance(out, (tuple, list)) else ''}")
    return out


def first_diff(got, exp):
    bad = ~((got == exp) | (torch.isnan(got) & torch.isnan(exp)))
    if not bool(bad.any()):
        return None
    idx = tuple(int(i) for i in torch.nonzero(bad)[0])
    return idx, int(bad.sum())



def check_blockwise(fn_name, out, x, bm, bk, elem, ref_scale, scale_name):
    """Shape, axis, scale values of a (q, scale) result; all-zero blocks must give finite scales and q = 0 (any
    finite scale is accepted there: the block decodes to 0 whatever it is). Returns q and the scale with the
    zero blocks' entries set to the reference's."""
    q, scale = unpack(out, 2, fn_name)
    q, scale = as_tensor(q, "q"), as_tensor(scale, "scale")
    M, K = x.shape
    expect_equal(tuple(q.shape), (M, K), "q shape (same as x)")
    want = (M // bm, K // bk)
    wrong_axis = (M // bk, K // bm)
    if tuple(scale.shape) != want:
        if tuple(scale.shape) == wrong_axis and want != wrong_axis:
            fail(f"wrong block axis: scale has shape {tuple(scale.shape)}, i.e. blocks of {bk}x{bm}; blocks are "
                 f"{bm}x{bk} ({bm} rows by {bk} columns), contiguous along the LAST dimension (K, the reduction "
                 f"dimension of the GEMM), so scale must have shape {want}")
        fail(f"scale shape: expected {want} (one per {bm}x{bk} block), got {tuple(scale.shape)}")
    raw = scale
    zero = lowp.blocks(x.double(), bm, bk).abs().amax(-1) == 0
    if bool(zero.any()):
        idx = tuple(int(i) for i in torch.nonzero(zero)[0])
        if not bool(torch.isfinite(scale[zero]).all()):
            fail(f"block {idx} is all zeros and its scale came out {float(scale[idx])}: amax = 0 must not give a "
                 f"NaN/Inf scale (log2(0) = -inf, 0/0 = NaN); give such a block any finite scale (the reference uses "
                 f"{float(ref_scale[idx]):g}) and q = 0")
        qz = lowp.blocks(q, bm, bk)[zero]
        if not bool((qz == 0).all()):
            bad = float(qz[qz != 0][0]) if bool((qz == qz).all()) else float("nan")
            fail(f"block {idx} is all zeros but its q holds {bad} (x / scale with scale = 0 is NaN): an all-zero "
                 f"block must quantize to q = 0")
        scale = torch.where(zero, ref_scale, scale)
    if not torch.allclose(scale, ref_scale, rtol=1e-6, atol=0):
        if bm == 1 and M % bk == 0:
            wrong = lowp.quantize(x.T.contiguous(), elem, (1, bk), scale_name).scale.T.reshape(-1)
            if wrong.numel() == raw.numel() and torch.allclose(raw.reshape(-1).sort().values,
                                                              wrong.sort().values, rtol=1e-6):
                fail(f"wrong block axis: your scales are those of blocks of {bk} consecutive ROWS (down a column); "
                     f"a block is {bk} consecutive elements of a row (along K)")
        if bm != bk and (M % bk == 0) and (K % bm == 0):
            swapped = lowp.quantize(x, elem, (bk, bm), scale_name).scale
            if swapped.numel() == raw.numel() and torch.allclose(raw.reshape(-1), swapped.reshape(-1), rtol=1e-6):
                fail(f"block rows and columns swapped: your scales are those of {bk}x{bm} blocks; block={(bm, bk)} "
                     f"means {bm} rows by {bk} columns")
    return q, scale


def expand(scale, bm, bk):
    return scale.repeat_interleave(bm, 0).repeat_interleave(bk, 1)


def check_elements(q, x, s_full, elem, ignore=None):
    """Elements saturated, on the grid, and the nearest-even rounding of x / scale; elements where `ignore` is True
    (a block whose scale underflowed to 0, so every element dequantises to 0 whatever it holds) are not judged."""
    if ignore is not None and bool(ignore.any()):
        q = torch.where(ignore, torch.zeros_like(q), q)
        x = torch.where(ignore, torch.zeros_like(x), x)
    ref_q = lowp.round_to(x.double() / s_full, elem, saturate=True)
    if not torch.equal(q.double(), ref_q) and torch.allclose(q.double(), ref_q * s_full, rtol=1e-6, atol=0):
        fail(f"q holds the dequantized values (q x scale, back on x's scale): return q itself -- the {elem.name} "
             f"values x / scale rounds to -- and the scale separately (q x scale is what a GEMM recovers)")
    over = q.abs() > elem.max
    if bool(over.any()) or not bool(torch.isfinite(q).all()):
        idx = tuple(int(i) for i in torch.nonzero(over | ~torch.isfinite(q))[0])
        fail(f"no saturation: q{idx} = {float(q[idx]):g} lies outside +-{elem.max:g} ({elem.name}'s range); "
             f"x / scale = {float(x[idx] / s_full[idx]):g} must clamp to +-{elem.max:g}")
    d = first_diff(q, ref_q)
    if d is not None:
        idx, n = d
        if torch.equal(q.double(), lowp.round_to(x.double() / s_full, elem, saturate=True, rounding="truncate")):
            fail(f"element {idx}: x / scale = {float(x[idx] / s_full[idx]):.9g} was truncated toward zero to "
                 f"{float(q[idx]):.9g}: round to the NEAREST {elem.name} value, ties to even "
                 f"({float(ref_q[idx]):.9g}); {n} of {q.numel()} elements differ")
        on_grid = bool((lowp.round_to(q[idx], elem) == q[idx]))
        fail(f"element {idx}: x / scale = {float(x[idx] / s_full[idx]):.9g} should round to {float(ref_q[idx]):.9g} "
             f"in {elem.name}, got {float(q[idx]):.9g}" + ("" if on_grid else f" (not a {elem.name} value at all)")
             + f"; {n} of {q.numel()} elements differ")


def with_zero_block(x, bm, bk):
    """x with its second block (or first, when there is one) set to zero."""
    x = x.clone()
    nb = (x.shape[0] // bm) * (x.shape[1] // bk)
    i = 1 if nb > 1 else 0
    r, c = divmod(i, x.shape[1] // bk)
    x[r * bm:(r + 1) * bm, c * bk:(c + 1) * bk] = 0
    return x


def expect_refusal(fn, what, *args):
    try:
        fn(*args)
    except ValueError:
        return
    except NotImplementedError:
        raise
    except Exception as exc:
        fail(f"{what} raised {type(exc).__name__} ({exc}); a block that does not tile x must raise ValueError "
             f"naming the block and the shape")
    fail(f"{what} did not refuse: the block does not tile x, so the function must raise ValueError naming the "
         f"block and the shape instead of quantizing a partial tile silently")
