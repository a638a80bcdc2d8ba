"""Checkers for lab 03 (fusion and Triton): a Triton vector add, a fused row softmax, and the lab's build exercise, a
fused residual add + RMSNorm forward checked against a float64 reference on awkward shapes, strides and dtypes.

The Triton checkers hand the learner's launcher tensors that are views into larger buffers: a guard region after each
one is filled with a sentinel, so a kernel that reads or writes past the end (a missing mask) neither crashes the
process (the interpreter does not bounds-check) nor corrupts memory, and the checker sees the stray write.
"""
from __future__ import annotations

import contextlib

from common.core.checks import checker, expect, expect_close, expect_equal, fail
from common.exercises.cases import learner_call, record_launches, replayable, unmasked_accesses

GUARD = 1 << 17  # elements after each tensor; larger than any block a launcher would use on these sizes
SENTINEL = -12345.0  # what `out` and the guards hold before the call: a value no right answer produces here


def _launch(fn, args: tuple, call: str, references: tuple = (), **kwargs):
    """learner_call of a launcher, with NumPy's overflow warnings from the interpreter silenced (the verdict explains
    an overflow better); any call into the workbook's library is refused but what the notebook hands the learner."""
    import functools
    import warnings
    with warnings.catch_warnings(), _torch_math() as math_ops:
        warnings.simplefilter("ignore", RuntimeWarning)
        result = learner_call(functools.partial(fn, **kwargs), args, call, references, library=True, allowed=ALLOWED)
    return result, math_ops


ALLOWED = ("common.kernels.fusion.softmax_num_warps",)  # the solution of 3.2 sizes its warps with it
# torch arithmetic a launcher has no use for: the exercise computes it inside the kernel (the interpreter itself only
# reads pointers, sizes and strides)
MATH = {"softmax", "log_softmax", "exp", "exp_", "add", "add_", "__add__", "__radd__", "__iadd__", "sub", "sub_",
        "__sub__", "mul", "mul_", "__mul__", "__rmul__", "div", "div_", "__truediv__", "rsqrt", "sqrt", "pow",
        "__pow__", "mean", "sum", "rms_norm", "layer_norm", "amax", "max", "logsumexp", "norm", "square"}


@contextlib.contextmanager
def _torch_math():
    """Record (in the yielded list) the torch arithmetic (MATH) called while the block runs."""
    from torch.overrides import TorchFunctionMode
    called: list[str] = []

    class Watch(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = getattr(func, "__name__", "")
            if name in MATH and name not in called:
                called.append(name)
            return func(*args, **(kwargs or {}))
    with Watch():
        yield called


def _math_beside(launches: list, math_ops: list, where: str, what: str) -> None:
    """Refuse a result computed in PyTorch beside a launched kernel (a kernel launched for show, or a fusion undone)."""
    if launches and math_ops:
        fail(f"{where}: your launcher computed with torch ({', '.join(math_ops)}) beside the kernel it launched: the "
             f"exercise is the kernel -- do {what} inside it, in one launch, and use torch only to size the grid")


def _own_kernels(launches: list, where: str) -> None:
    """Refuse a launch of one of the workbook's own Triton kernels (common.kernels.*): the exercise is the kernel."""
    for lc in launches:
        fn = getattr(lc["kernel"], "fn", lc["kernel"])
        module = getattr(fn, "__module__", "") or ""
        if module.startswith("common."):
            fail(f"{where}: launched {module}.{getattr(fn, '__name__', 'a kernel')}, the workbook's own kernel, "
                 f"which does this exercise for you; write the @triton.jit kernel yourself")


def _guarded(t, fill=None):
    """A copy of `t` as a view into a buffer with GUARD extra elements after it (filled with `fill` or SENTINEL).

    Returns (view, buffer). 2-D tensors keep their shape and row stride; the guard follows the last row."""
    import torch
    n = t.numel()
    buf = torch.full((n + GUARD,), SENTINEL if fill is None else fill, dtype=t.dtype, device=t.device)
    view = buf[:n].view(t.shape)
    view.copy_(t)
    return view, buf


def _guarded_out(shape, device):
    """An output tensor of `shape` holding SENTINEL, followed by a SENTINEL guard; returns (view, buffer)."""
    import torch
    n = 1
    for s in shape:
        n *= s
    buf = torch.full((n + GUARD,), SENTINEL, dtype=torch.float32, device=device)
    return buf[:n].view(shape), buf


def _expect_guard_intact(buf, n: int, what: str, hint: str) -> None:
    import torch
    guard = buf[n:]
    touched = guard != SENTINEL  # NaN counts as touched too
    if bool(touched.any()):
        idx = torch.nonzero(touched).flatten()
        fail(f"{what}: the kernel wrote {int(idx.numel())} element(s) past the end of the output (n={n}; the first "
             f"stray write lands {int(idx[0]) + 1} element(s) beyond it). {hint}")


# ---------------------------------------------------------------------------------------------------- 3.1
def _add_cases(rng):
    """(n, block_size): single elements, sizes just around a block, several blocks with a ragged tail."""
    cases_ = [(1, 128), (128, 128), (129, 128), (1000, 256), (rng.randint(2, 20) * 256 + rng.randint(1, 255), 256),
              (rng.randint(3, 30) * 4096 + rng.randint(1, 4095), 4096)]
    return cases_


@checker("3.1", "Triton vector add (mask, block size, grid)",
         in_kernel="it watches the Triton launches and reads the kernel's source")
@replayable
def check_vector_add(vector_add, cases):
    """vector_add(x, y, out, block_size) -> out = x + y with a Triton kernel; float32, fresh inputs each call."""
    import torch

    from common.core.env import current
    from common.kernels import fusion
    device = current().device
    seed, rng, gen = cases.seed, cases.rng, cases.gen
    cases_ = _add_cases(rng)
    kernels = {}
    for n, block in cases_:
        x0 = torch.randn(n, generator=gen).to(device)
        y0 = torch.randn(n, generator=gen).to(device)
        x, _ = _guarded(x0, fill=float("nan"))  # an unmasked load reads NaN, never past the allocation
        y, _ = _guarded(y0, fill=float("nan"))
        out, out_buf = _guarded_out((n,), device)
        where = f"vector_add with n={n}, block_size={block} (seed {seed})"
        with record_launches() as launches:
            ret, math_ops = _launch(vector_add, (x, y, out), where, (fusion.vector_add,), block_size=block)
        got = out if ret is None else ret
        _own_kernels(launches, where)
        _math_beside(launches, math_ops, where, "the add")
        if len(launches) > 1:
            fail(f"{where}: {len(launches)} kernel launches for one add: launch once, with a grid of "
                 f"triton.cdiv(n, block_size) programs -- each program handles its own block (a Python loop of launches "
                 f"pays a launch each)")
        sizes = {lc["constants"].get("BLOCK_SIZE") for lc in launches} - {None}
        if sizes and sizes != {block}:
            fail(f"{where}: the kernel was launched with BLOCK_SIZE={sorted(sizes)[0]}, not the block_size={block} "
                 f"the launcher was given -- pass block_size through (and size the grid with it)")
        expect(isinstance(got, torch.Tensor), f"{where} returned {type(got).__name__}, expected the tensor out")
        expect(torch.equal(x, x0) and torch.equal(y, y0), f"{where}: x or y was modified -- write only into out")
        _expect_guard_intact(out_buf, n, where, "The last block runs past n: mask the store (and the loads) with "
                                                "`mask = offsets < n_elements`.")
        unwritten = torch.nonzero(out == SENTINEL).flatten()
        if unwritten.numel():
            first = int(unwritten[0])
            if first == 0:
                fail(f"{where}: out was never written (it still holds what it held before the call). Does the "
                     f"launcher start the kernel with a grid, `add_kernel[grid](...)`, and store into out_ptr?")
            grids = [lc["grid"][0] for lc in launches if lc["grid"]]
            if grids and max(grids) >= -(-n // block):
                fail(f"{where}: elements {first}..{n - 1} of out were never written although the grid has "
                     f"{max(grids)} programs: every program wrote the same block -- offset each program's block by "
                     f"its id, `offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)`")
            fail(f"{where}: elements {first}..{n - 1} of out were never written ({int(unwritten.numel())} in all): "
                 f"the grid has too few programs. It needs ceil(n / block_size) = {-(-n // block)} programs -- "
                 f"`triton.cdiv(n, block_size)`, with the same block size that the kernel is given")
        _name_add(got, x0.double(), y0.double(), where)
        grids = [lc["grid"][0] for lc in launches if lc["grid"]]
        if grids and max(grids) > -(-n // block):
            fail(f"{where}: launched a grid of {max(grids)} programs for {-(-n // block)} blocks of {block}: "
                 f"{'one program per element' if max(grids) == n else 'more programs than blocks'} -- each program "
                 f"handles BLOCK_SIZE elements, so the grid is triton.cdiv(n, block_size)")
        kernels.update((id(lc["kernel"]), lc["kernel"]) for lc in launches)
    expect(kernels, "the values are right, but no Triton kernel was launched -- the exercise is the kernel: launch "
                    "add_kernel[grid](...) instead of computing x + y in PyTorch")
    for kernel in kernels.values():  # right values; now the property the values cannot show
        unmasked = unmasked_accesses(kernel)
        if unmasked:
            fail(f"the values are right, but {getattr(kernel, '__name__', 'the kernel')} has a load or store without a "
                 f"mask ({unmasked[0]}): the last program still reads past the end of x and y -- on a GPU that reads "
                 f"another tensor's memory or faults, even though the masked store hides it from out. Pass "
                 f"`mask=offsets < n_elements` to every tl.load and tl.store")
    return (f"x + y right for {len(cases_)} sizes and block sizes, including sizes that are not a multiple of the "
            f"block; nothing written past the end")


def _name_add(got, x, y, where: str) -> None:
    """Name what out holds when it is not x + y (x alone, y alone, x - y, x * y, 2x), or say where it first differs."""
    import torch
    g = got.double()
    if torch.allclose(g, x + y, rtol=1e-6, atol=1e-6):
        return
    for value, what in ((x, "x alone: y was never added"), (y, "y alone: x was never added"),
                        (x - y, "x - y: subtract where the exercise adds"), (x * y, "x * y: multiply where the "
                                                                                   "exercise adds"),
                        (2 * x, "x + x: the second load reads x_ptr, not y_ptr")):
        if torch.allclose(g, value, rtol=1e-6, atol=1e-6):
            fail(f"{where}: out holds {what}")
    expect_close(got, x + y, where, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------------------- 3.2
def _softmax_cases(rng):
    """(rows, cols, scale, offset, strided): shapes around powers of two, one with large values, one strided."""
    return [(1, 1, 1.0, 0.0, False), (3, 7, 1.0, 0.0, False),
            (rng.randint(4, 9), rng.randint(100, 300), 30.0, 200.0, False),
            (rng.randint(5, 13), rng.randint(50, 250), 1.0, 0.0, True),
            (rng.randint(20, 40), rng.randint(513, 1023), 1.0, 0.0, False), (16, 128, 1.0, 0.0, False),
            (3, rng.randint(1025, 3000), 1.0, 0.0, False)]


def _softmax_diagnosis(got, x0, where):
    """Name the classic mistake when the learner's rows are wrong."""
    import torch
    g = got.double()
    if not bool(torch.isfinite(g).all()):
        bad = torch.nonzero(~torch.isfinite(g))[0].tolist()
        big = float(x0.abs().max())
        if big > 80:
            fail(f"{where}: non-finite value (NaN or inf) at index {tuple(bad)} on inputs as large as {big:.0f}. "
                 f"exp(x) overflows float32 above x = 88.7: subtract the row max before exp "
                 f"(softmax(x) = softmax(x - max(x)), mathematically the same)")
        fail(f"{where}: non-finite value (NaN or inf) at index {tuple(bad)}")
    rows, cols = x0.shape
    x = x0.double()
    numerators = (x - x.max(dim=-1, keepdim=True).values).exp()
    if torch.allclose(g, numerators, rtol=1e-4, atol=1e-6) or torch.allclose(g, x.exp(), rtol=1e-4, atol=1e-6):
        fail(f"{where}: out holds exp(x - max) (or exp(x)) unnormalised: divide each row by its sum, so that it "
             f"sums to 1")
    if rows > 1 and cols > 1:
        by_column = torch.softmax(x0.double(), dim=0)
        if torch.allclose(g, by_column, rtol=1e-4, atol=1e-6):
            fail(f"{where}: your result is the softmax over each column (dim=0); softmax here is over each row "
                 f"(dim=-1): every row of the output must sum to 1")
    sums = g.sum(dim=1)
    off = torch.nonzero((sums - 1).abs() > 1e-4).flatten()
    if off.numel():
        r = int(off[0])
        fail(f"{where}: row {r} of the output sums to {float(sums[r]):.6g}, not 1 ({int(off.numel())} of {rows} rows "
             f"are off). Are masked-off lanes loaded as -inf (`other=-float('inf')`) so they add nothing to the sum, "
             f"and does each program read its own row (row * row_stride)?")


@checker("3.2", "fused softmax over rows in Triton", in_kernel="it watches the Triton launches")
@replayable
def check_softmax(softmax, cases):
    """softmax(x, out) -> out = softmax of each row of the 2-D float32 x (one program per row, one read, one write)."""
    import torch

    from common.core.env import current
    from common.kernels import fusion
    device = current().device
    seed, rng, gen = cases.seed, cases.rng, cases.gen
    cases_ = _softmax_cases(rng)
    launched = False
    for rows, cols, scale, offset, strided in cases_:
        x0 = torch.randn(rows, cols, generator=gen).to(device) * scale + offset
        if strided:  # rows further apart than cols: the kernel must use the row stride, not assume cols
            wide, wide_buf = _guarded(torch.randn(rows, cols + 64, device=device), fill=float("nan"))
            x = wide[:, :cols]
            x.copy_(x0)
        else:
            x, _ = _guarded(x0, fill=float("nan"))
        out, out_buf = _guarded_out((rows, cols), device)
        where = (f"softmax of a {rows}x{cols} matrix" + (f" with values around {offset:.0f} +- {scale:.0f}"
                                                          if offset else "") + (" (a strided view)" if strided else "")
                 + f" (seed {seed})")
        with record_launches() as launches:
            ret, math_ops = _launch(softmax, (x, out), where, (fusion.softmax,))
        got = out if ret is None else ret
        _own_kernels(launches, where)
        _math_beside(launches, math_ops, where, "the max, the exp, the sum and the division")
        if len(launches) > 1:
            fail(f"{where}: {len(launches)} kernel launches for one softmax: one launch, one program per row -- a "
                 f"fused softmax reads each row once and writes it once")
        grids = [lc["grid"] for lc in launches if lc["grid"] is not None]
        expect(isinstance(got, torch.Tensor), f"{where}: returned {type(got).__name__}, expected the tensor out")
        expect(torch.equal(x, x0), f"{where}: the input x was modified -- write only into out")
        _expect_guard_intact(out_buf, rows * cols, where, "The block is wider than a row (a power of two >= cols): "
                                                          "mask the store with `cols < n_cols`.")
        if bool((out == SENTINEL).any()):
            r = int(torch.nonzero(out == SENTINEL)[0][0])
            fail(f"{where}: row {r} of out was never written: launch one program per row (grid = (n_rows,))")
        expected = torch.softmax(x0.double(), dim=-1)
        if not torch.allclose(got.double(), expected, rtol=1e-5, atol=1e-6):
            _softmax_diagnosis(got, x0, where)
        if strided and not torch.allclose(got.double(), expected, rtol=1e-5, atol=1e-6):
            fail(f"{where}: wrong on a strided view (row stride {x.stride(0)}, {cols} columns) although the rows are "
                 f"contiguous: step between rows with x.stride(0), not with the number of columns")
        if grids and grids[-1][0] != rows:  # right numbers from another design: the exercise asks for this one
            fail(f"{where}: launched a grid of {grids[-1]} for {rows} rows -- one program per row: grid = (n_rows,)")
        expect_close(got, expected, where, rtol=1e-5, atol=1e-6)
        launched = launched or bool(launches)
    expect(launched, "the values are right, but no Triton kernel was launched -- the exercise is the kernel "
                     "(torch.softmax or a PyTorch expression is not it): launch softmax_kernel[grid](...)")
    return (f"matches torch.softmax over rows for {len(cases_)} shapes (columns not a power of two, large values, a "
            f"strided view)")


# ---------------------------------------------------------------------------------------------------- 3.3
def _rows_buffer(rows: int, cols: int, pad: int, dtype, device, fill: float):
    """A (rows, cols) view whose rows are `cols + pad` apart in a buffer filled with `fill`, with GUARD elements after
    the last row; returns (view, buffer, mask of the buffer's elements that belong to the view)."""
    import torch
    width = cols + pad
    buf = torch.full((rows * width + GUARD,), fill, dtype=dtype, device=device)
    view = buf[:rows * width].view(rows, width)[:, :cols]
    inside = torch.zeros(buf.numel(), dtype=torch.bool, device=device)
    inside[:rows * width].view(rows, width)[:, :cols] = True
    return view, buf, inside


def _rmsnorm_cases(rng):
    """(rows, cols, dtype, strided, scale, eps): float32 first (a dtype mistake then shows as 'right in float32'),
    hidden sizes that are not powers of two, a case of tiny values where eps matters, strided rows."""
    import torch
    f32, bf16 = torch.float32, torch.bfloat16
    return [(3, 7, f32, False, 1.0, 1e-6), (4, 96, f32, False, 1e-3, 1e-5),
            (3, rng.randint(129, 500), f32, True, 1.0, 1e-6), (4, rng.randint(257, 700), bf16, False, 1.0, 1e-6),
            (3, rng.randint(65, 300), bf16, True, 1.0, 1e-5),
            (rng.randint(2, 4), rng.randint(33, 1000), rng.choice([f32, bf16]), rng.random() < 0.5, 1.0, 1e-6)]


def _rmsnorm_mistakes(x, r, w, eps: float, block: int) -> list[tuple[str, object]]:
    """(what the learner did, the output it gives) for the classic mistakes, in float64."""
    h = x + r
    ms = (h * h).mean(-1, keepdim=True)
    total = (h * h).sum(-1, keepdim=True)
    return [
        ("the row's mean, not the mean of its squares: RMSNorm divides by sqrt(mean(h * h) + eps)",
         h / (h.mean(-1, keepdim=True) + eps).sqrt() * w),
        ("that is LayerNorm: RMSNorm does not subtract the row mean",
         (h - h.mean(-1, keepdim=True)) / (h.var(-1, unbiased=False, keepdim=True) + eps).sqrt() * w),
        ("the sum of squares was divided by BLOCK_SIZE (the padded width), not by n_cols: the masked lanes are not "
         "columns", h / (total / block + eps).sqrt() * w),
        ("the sum of squares, not their mean: divide the sum by n_cols", h / (total + eps).sqrt() * w),
        ("eps outside the sqrt: the norm is sqrt(mean(h * h) + eps), not sqrt(mean(h * h)) + eps",
         h / (ms.sqrt() + eps) * w),
        ("no eps: sqrt(mean(h * h) + eps) keeps a row of tiny values from blowing up", h / ms.sqrt() * w),
        ("forgot the weight: multiply column j by weight[j]", h / (ms + eps).sqrt()),
        ("the residual was not added before the norm: normalise h = x + residual, not x",
         x / ((x * x).mean(-1, keepdim=True) + eps).sqrt() * w),
        ("multiplied by sqrt(mean(h * h) + eps); divide by it (or multiply by its rsqrt)", h * (ms + eps).sqrt() * w),
    ]


def _close(got, want, rtol: float, atol: float) -> bool:
    import torch
    return bool(torch.allclose(got.double(), want, rtol=rtol, atol=atol, equal_nan=True))


def _expect_masked(kernels: dict, why: str) -> None:
    for kernel in kernels.values():
        unmasked = unmasked_accesses(kernel)
        if unmasked:
            fail(f"{getattr(kernel, '__name__', 'the kernel')} has a load or store without a mask ({unmasked[0]}): "
                 f"{why} -- pass `mask=cols < n_cols` to every tl.load and tl.store (and `other=0.0` to the loads)")


@checker("3.3", "fused residual add + RMSNorm in Triton", in_kernel="it watches the Triton launches and reads the "
                                                                    "kernel's source")
@replayable
def check_add_rmsnorm(add_rmsnorm, cases):
    """add_rmsnorm(x, residual, weight, out, eps) -> out: residual += x in place, out = RMSNorm(residual) * weight,
    one Triton program per row, for float32 and bf16 rows of any hidden size and row stride."""
    import torch

    from common.core.env import current
    from common.kernels import rmsnorm
    device = current().device
    seed, rng, gen = cases.seed, cases.rng, cases.gen
    todo = _rmsnorm_cases(rng)
    right = {"float32": False, "contiguous": False}
    kernels = {}
    for rows, cols, dtype, strided, scale, eps in todo:
        draw = [torch.randn(rows, cols, generator=gen, dtype=torch.float64) * scale for _ in range(2)]
        w0 = (1.0 + 0.5 * torch.randn(cols, generator=gen, dtype=torch.float64)).to(dtype).to(device)
        x0, r0 = (t.to(dtype).to(device) for t in draw)
        pads = (64, 32, 16) if strided else (0, 0, 0)
        x, _, _ = _rows_buffer(rows, cols, pads[0], dtype, device, float("nan"))
        res, res_buf, res_in = _rows_buffer(rows, cols, pads[1], dtype, device, SENTINEL)
        out, out_buf, out_in = _rows_buffer(rows, cols, pads[2], dtype, device, SENTINEL)
        weight, _ = _guarded(w0, fill=float("nan"))
        x.copy_(x0)
        res.copy_(r0)
        name = {torch.float32: "float32", torch.bfloat16: "bf16"}[dtype]
        where = (f"add_rmsnorm on {rows} x {cols} {name} rows" + (" (strided: row strides "
                 f"{x.stride(0)}, {res.stride(0)}, {out.stride(0)})" if strided else "")
                 + (f", values around {scale:g}" if scale != 1 else "") + f", eps={eps:g} (seed {seed})")
        with record_launches() as launches:
            ret, math_ops = _launch(add_rmsnorm, (x, res, weight, out), where, (rmsnorm.add_rmsnorm,), eps=eps)
        got = out if ret is None else ret
        expect(isinstance(got, torch.Tensor), f"{where} returned {type(got).__name__}, expected the tensor out")
        _own_kernels(launches, where)
        _math_beside(launches, math_ops, where, "the residual add and the norm (the fusion is the point: h = x + "
                     "residual is read once, in registers)")
        kernels.update((id(lc["kernel"]), lc["kernel"]) for lc in launches)
        if len(launches) > 1:
            fail(f"{where}: {len(launches)} kernel launches per call: the exercise fuses the residual add and the norm "
                 f"into ONE kernel, one program per row (h = x + residual stays in registers between them)")
        grids = [lc["grid"] for lc in launches if lc["grid"] is not None]
        if grids and grids[-1][0] != rows:
            fail(f"{where}: launched a grid of {grids[-1]} programs for {rows} rows -- one program per row, grid = "
                 f"(n_rows,): the mean of squares needs the whole row in one program")
        expect(torch.equal(x, x0) and torch.equal(weight, w0), f"{where}: x or weight was modified -- write only "
                                                               f"residual and out")
        fill = torch.tensor(SENTINEL, dtype=dtype, device=device)
        for buf, inside, what in ((out_buf, out_in, "out"), (res_buf, res_in, "residual")):
            stray = ((buf != fill) & ~inside).nonzero().flatten()
            if stray.numel() and strided and right["contiguous"]:  # masks were right on contiguous rows
                fail(f"{where}: the kernel wrote {stray.numel()} element(s) of {what} between the rows: right on "
                     f"contiguous rows, wrong on strided ones -- step between rows with each tensor's own row stride "
                     f"(x.stride(0), residual.stride(0), out.stride(0)), not with n_cols")
            if stray.numel():
                fail(f"{where}: the kernel wrote {stray.numel()} element(s) of {what} outside its rows (past a row's "
                     f"last column or past the tensor): mask every store with `cols < n_cols`")
        if bool((got == fill).any()):
            r = int((got == fill).nonzero()[0][0])
            fail(f"{where}: row {r} of out was never written: launch one program per row, grid = (n_rows,), and "
                 f"store the normalised row into out")
        y_ref, h_ref = rmsnorm.reference(x0, r0, w0, eps)
        tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
        if torch.equal(res, r0):
            fail(f"{where}: residual still holds its old values: store h = x + residual back into residual (the "
                 f"next layer reads the updated residual stream)")
        if _close(res, y_ref, **tol) and not _close(res, h_ref, **tol):
            fail(f"{where}: residual holds the normalised output: store h = x + residual into residual and the "
                 f"normalised rows into out")
        if not _close(got, y_ref, **tol):
            named = [m for m, y in _rmsnorm_mistakes(x0.double(), r0.double(), w0.double(), eps,
                                                     1 << (cols - 1).bit_length())
                     if _close(got, y, **tol) and not torch.allclose(y, y_ref, **tol)]
            if named:
                fail(f"{where}: {named[0]}" + (f" (or: {named[1]})" if len(named) > 1 else ""))
            if dtype == torch.bfloat16 and right["float32"]:
                fail(f"{where}: right in float32, wrong in bf16: convert the loaded rows to float32 "
                     f"(`.to(tl.float32)`) and accumulate the sum of squares, the rsqrt and the scaling in float32; "
                     f"the store casts back to bf16")
            _expect_masked(kernels, "the block is wider than the row, so the lanes past n_cols read the next row or "
                                    "past the tensor and enter the sum of squares")
            if strided and right["contiguous"]:
                fail(f"{where}: right on contiguous rows, wrong on strided ones: step between rows with each "
                     f"tensor's own row stride (x.stride(0), residual.stride(0), out.stride(0)), not with n_cols")
        expect_close(res, h_ref, f"{where}: residual after the call (x + residual)", **tol)
        expect_close(got, y_ref, f"{where}: out", **tol)
        right["float32"] = right["float32"] or dtype == torch.float32
        right["contiguous"] = right["contiguous"] or not strided
    expect(kernels, "the values are right, but no Triton kernel was launched -- the exercise is the kernel: launch "
                    "add_rmsnorm_kernel[grid](...) instead of computing it in PyTorch")
    _expect_masked(kernels, "the values are right, but the block is wider than the row: the lanes past n_cols read "
                            "the next row or past the tensor, on a GPU another tensor's memory or a fault")
    return (f"right for {len(todo)} cases against float64 (float32 and bf16, hidden sizes that are not powers of two, "
            f"strided rows, tiny values where eps matters): residual updated in place, out normalised and weighted")
