"""Checkers for lab 03 (fusion and Triton): bytes of an elementwise chain, a Triton vector add, a fused row softmax.

The Triton checkers hand the learner's launcher tensors that are views into larger buffers: a guard region after each
one is filled with a sentinel, so a kernel that reads or writes past the end (a missing mask) neither crashes the
process (the interpreter does not bounds-check) nor corrupts memory, and the checker sees the stray write.
"""
from __future__ import annotations

from common.core.checks import checker, expect, expect_close, expect_equal, fail
from common.exercises.cases import learner_call, record_launches, replayable, unmasked_accesses

GUARD = 1 << 17  # elements after each tensor; larger than any block a launcher would use on these sizes
SENTINEL = -12345.0  # what `out` and the guards hold before the call: a value no right answer produces here


def _launch(fn, args: tuple, call: str, references: tuple = (), **kwargs):
    """learner_call of a launcher, with NumPy's overflow warnings from the interpreter silenced (the verdict explains
    an overflow better)."""
    import functools
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return learner_call(functools.partial(fn, **kwargs), args, call, references)


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
@checker("3.1", "bytes moved by an elementwise chain, unfused vs fused")
@replayable
def check_chain_bytes(chain_bytes, cases):
    """chain_bytes(n_elements, n_ops, bytes_per_element, fused) -> bytes read + written from/to memory."""
    from common.kernels import fusion
    seed, rng = cases.seed, cases.rng
    # every element size accepted (1, 2, 4, 8 bytes) has a fixed case; asymmetric sizes first
    cases_ = [(1000, 3, 4, False), (1000, 3, 4, True), (1, 1, 2, False), (777, 5, 1, False), (513, 2, 8, True),
              (300, 4, 2, False)] + [
        (rng.randint(2, 10**8), rng.randint(2, 12), rng.choice([1, 2, 4, 8]), rng.random() < 0.5) for _ in range(4)]
    for n, ops, b, fused in cases_:
        expected = 2 * n * b * (1 if fused else ops)
        where = f"chain_bytes({n}, n_ops={ops}, bytes_per_element={b}, fused={fused}) (seed {seed})"
        got = learner_call(chain_bytes, (n, ops, b, fused), where, (fusion.chain_bytes,))
        expect(got is not None, f"{where} returned None -- return the number of bytes")
        if got != expected:
            if b == 2 and got == expected // 2:  # elements and "reads only" give one number at 2 bytes: name both
                fail(f"{where} = {got}: half the bytes -- either elements instead of bytes (multiply by "
                     f"bytes_per_element) or only the reads (or only the writes) of each pass")
            if got == expected // 2:
                fail(f"{where} = {got}: that counts only the reads (or only the writes); every pass reads its input "
                     f"and writes its output, {expected} bytes")
            if fused and ops > 1 and got == 2 * n * b * ops:
                fail(f"{where} = {got}: that is the unfused count. Fused, the intermediates stay in registers: the "
                     f"input is read once and the output written once ({expected} bytes), whatever n_ops is")
            if not fused and ops > 1 and got == 2 * n * b:
                fail(f"{where} = {got}: that is the fused count. Unfused, each of the {ops} ops is its own kernel "
                     f"that reads its input from memory and writes its output back ({expected} bytes)")
            if not fused and got == (ops + 1) * n * b:
                fail(f"{where} = {got}: you counted one read and {ops} writes; each op also reads the previous op's "
                     f"output back from memory ({expected} bytes)")
            if got == expected // b:
                fail(f"{where} = {got}: that counts elements, not bytes (multiply by bytes_per_element)")
        expect_equal(got, expected, where)
    return f"right for {len(cases_)} chains: 2*n*b per pass, n_ops passes unfused, one pass fused"


# ---------------------------------------------------------------------------------------------------- 3.2
def _add_cases(rng):
    """(n, block_size): single elements, sizes just around a block, several blocks with a ragged tail."""
    cases_ = [(1, 128), (128, 128), (129, 128), (1000, 256), (rng.randint(2, 20) * 256 + rng.randint(1, 255), 256),
              (rng.randint(3, 30) * 4096 + rng.randint(1, 4095), 4096)]
    return cases_


@checker("3.2", "Triton vector add (mask, block size, grid)",
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
            ret = _launch(vector_add, (x, y, out), where, (fusion.vector_add,), block_size=block)
        got = out if ret is None else ret
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
            fail(f"{where}: elements {first}..{n - 1} of out were never written ({int(unwritten.numel())} in all): "
                 f"the grid has too few programs. It needs ceil(n / block_size) = {-(-n // block)} programs -- "
                 f"`triton.cdiv(n, block_size)`, with the same block size that the kernel is given")
        expect_close(got, x0.double() + y0.double(), where, rtol=1e-6, atol=1e-6)
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


# ---------------------------------------------------------------------------------------------------- 3.3
def _softmax_cases(rng):
    """(rows, cols, scale, offset, strided): shapes around powers of two, one with large values, one strided."""
    return [(1, 1, 1.0, 0.0, False), (3, 7, 1.0, 0.0, False),
            (rng.randint(20, 40), rng.randint(513, 1023), 1.0, 0.0, False), (16, 128, 1.0, 0.0, False),
            (3, rng.randint(1025, 3000), 1.0, 0.0, False),
            (rng.randint(4, 9), rng.randint(100, 300), 30.0, 200.0, False),
            (rng.randint(5, 13), rng.randint(50, 250), 1.0, 0.0, True)]


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


@checker("3.3", "fused softmax over rows in Triton", in_kernel="it watches the Triton launches")
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
            ret = _launch(softmax, (x, out), where, (fusion.softmax,))
        got = out if ret is None else ret
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
