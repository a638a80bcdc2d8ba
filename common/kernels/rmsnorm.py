"""A fused residual add + RMSNorm forward, the everyday kernel of a pre-norm transformer (Llama, DeepSeek-V3):

    residual <- x + residual                                   (the residual stream, updated in place)
    out      <- residual / sqrt(mean(residual^2) + eps) * weight  (over each row; float32 arithmetic)

`add_rmsnorm` is the workbook's Triton kernel (one program per row, masked for any hidden size, each tensor's own row
stride, float32 accumulation): lab 03's build exercise and its reference. `add_rmsnorm_eager` is the same in eager
PyTorch, one kernel per op as Hugging Face's LlamaRMSNorm runs it; `reference` is the float64 answer a checker compares
with. `fused_bytes` and `common.kernels.fusion.eager_traffic` give the bytes each moves; `compare` times them.

Triton is imported lazily, after `common.core.env` has set TRITON_INTERPRET where there is no GPU.
"""
from __future__ import annotations

import functools

from common.core.validate import number, whole

EPS = 1e-6


def reference(x, residual, weight, eps: float = EPS):
    """(out, new residual) in float64: h = x + residual, out = h / sqrt(mean(h^2) + eps) * weight (x, residual as
    given, e.g. already rounded to bf16)."""
    h = x.double() + residual.double()
    rstd = (h.pow(2).mean(dim=-1, keepdim=True) + eps).rsqrt()
    return h * rstd * weight.double(), h


def add_rmsnorm_eager(x, residual, weight, eps: float = EPS):
    """Eager PyTorch, one kernel per op (as Hugging Face's LlamaRMSNorm after a residual add): updates `residual` in
    place and returns the normalised rows in x's dtype."""
    import torch
    residual.add_(x)
    h = residual.float()
    rstd = torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (h * rstd).to(x.dtype) * weight


def fused_bytes(rows: int, hidden: int, bytes_per_element: float) -> float:
    """What a fused kernel moves at least: reads x and residual, writes residual and out, reads the weight once."""
    whole("rows", rows, 0)
    whole("hidden", hidden, 0)
    number("bytes_per_element", bytes_per_element)
    return (4 * rows * hidden + hidden) * bytes_per_element


@functools.lru_cache(maxsize=1)
def _kernel():
    from common.core.env import current
    if current().triton_mode == "unavailable":
        raise RuntimeError("triton is not installed here: the fused RMSNorm cannot run (install triton, or run on "
                           "Linux)")
    import triton
    import triton.language as tl

    @triton.jit
    def add_rmsnorm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, x_row_stride, res_row_stride, out_row_stride, n_cols,
                           eps, BLOCK_SIZE: tl.constexpr):
        row = tl.program_id(axis=0)                      # one program per row
        cols = tl.arange(0, BLOCK_SIZE)                  # BLOCK_SIZE >= n_cols, a power of two
        mask = cols < n_cols
        x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        r = tl.load(res_ptr + row * res_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        h = x + r                                        # masked lanes are 0: they add nothing to the sum
        tl.store(res_ptr + row * res_row_stride + cols, h, mask=mask)  # the residual stream, written back
        rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / n_cols + eps)  # mean over the real columns, in float32
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * out_row_stride + cols, h * rstd * w, mask=mask)

    return triton, add_rmsnorm_kernel


def add_rmsnorm(x, residual, weight, out=None, eps: float = EPS):
    """The fused Triton kernel: residual += x in place, out = RMSNorm(residual) * weight; returns out."""
    import torch
    for name, t in (("x", x), ("residual", residual), ("weight", weight)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if x.dim() != 2 or residual.shape != x.shape or weight.shape != (x.shape[1],):
        raise ValueError(f"x and residual must be (rows, hidden) and weight (hidden,): got {tuple(x.shape)}, "
                         f"{tuple(residual.shape)}, {tuple(weight.shape)}")
    if out is None:
        out = torch.empty_like(x)
    if any(t.stride(-1) != 1 for t in (x, residual, weight, out)):
        raise ValueError("every tensor needs unit stride along the hidden dimension (rows may be strided)")
    number("eps", eps)
    rows, cols = x.shape
    if rows and cols:
        triton, kernel = _kernel()
        kernel[(rows,)](x, residual, weight, out, x.stride(0), residual.stride(0), out.stride(0), cols, eps,
                        BLOCK_SIZE=triton.next_power_of_2(cols))
    return out


def inputs(rows: int, hidden: int, dtype, device, seed: int = 0):
    """Fresh (x, residual, weight) drawn in float64 from `seed` (the same on every CPU), cast to `dtype`."""
    import torch
    whole("rows", rows)
    whole("hidden", hidden)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, hidden, generator=gen, dtype=torch.float64)
    residual = torch.randn(rows, hidden, generator=gen, dtype=torch.float64)
    weight = 1.0 + 0.5 * torch.randn(hidden, generator=gen, dtype=torch.float64)
    return tuple(t.to(device=device, dtype=dtype) for t in (x, residual, weight))


def compare(impls: dict, x, residual, weight, copy_gbps: float, min_run_time: float = 0.2) -> dict:
    """Time each implementation `fn(x, residual, weight)` (on its own copy of the residual, which every call updates
    in place); {name: fusion.measure row}, whose fraction_of_copy_bw counts the fused kernel's bytes for every row."""
    from common.kernels import fusion
    nbytes = fused_bytes(*x.shape, x.element_size())
    out = {}
    for name, fn in impls.items():
        res = residual.clone()
        out[name] = fusion.measure(name, fn, x, res, weight, min_bytes=int(nbytes), copy_gbps=copy_gbps,
                                   min_run_time=min_run_time)
    return out
