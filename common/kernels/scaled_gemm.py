"""FP8 GEMMs through `torch._scaled_mm`: per-tensor scales, and DeepSeek-V3's fine-grained scales (1x128 activation
tiles, 128x128 weight blocks) applied per K-block and promoted into an FP32 accumulator.

`y = x @ w.T` with x (M, K) activations and w (N, K) weights, both quantized along K, the reduction dimension.

`torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=..., use_fast_accum=...)` (torch 2.13, checked by calling it):
a (M, K) row-major float8, b (K, N) column-major float8 (pass `w.t()`), FP32 scales that *multiply* the product
(decoding scales). On the CPU it accepts per-tensor scales (two scalars) and per-row scales ((M, 1) and (1, N)),
and `use_fast_accum` changes nothing (the CPU kernel sums in FP32). On CUDA (sm_89/sm_90) it also accepts the
DeepSeek block layout, scale_a (M, K/128) with scale_b (K/128, N/128), through cuBLAS >= 12.9 (pytorch PR #158037);
`use_fast_accum=True` sets cuBLAS's CUBLASLT_MATMUL_DESC_FAST_ACCUM: "intermediate results will not
periodically be promoted to a higher precision" (cuBLAS documentation; the precision kept is not documented).

`scaled_mm_fine_grained` follows DeepGEMM's design (DeepSeek-V3 report Sec. 3.3.2, N_C = 128): one FP8 MMA per
128-wide K-block with unit scales, its partial sum multiplied by that block's activation-tile scale (per row) and
weight-block scale (per 128 output columns) and added into an FP32 accumulator -- the "promotion". It runs
unchanged on a CPU and on a GPU.
"""
from __future__ import annotations

import numpy as np
import torch

from common.kernels import lowp

FP8 = torch.float8_e4m3fn
BLOCK_K = 128
ACTIVATION_TILE = (1, 128)
WEIGHT_BLOCK = (128, 128)


def _block_shape(block, shape) -> tuple[int, int]:
    rows, cols = shape
    if block is None:
        return rows, cols
    if (not isinstance(block, (tuple, list)) or len(block) != 2
            or not all(isinstance(b, int) and b >= 1 for b in block)):
        raise ValueError(f"block={block!r}: give (rows, cols) of positive ints, or None for one scale per tensor")
    bm, bk = block
    if rows % bm or cols % bk:
        raise ValueError(f"block={tuple(block)} does not tile a tensor of shape {tuple(shape)}: the rows need a "
                         f"multiple of {bm}, the columns (K) a multiple of {bk}")
    return bm, bk


def quantize_fp8(x: torch.Tensor, block=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale) with x ~= q * scale: q float8_e4m3fn of x's shape, scale float32 of shape (M/bm, K/bk) holding
    amax / 448 per block (block None: one scale, shape (1, 1)). An all-zero block gets scale 1 (q = 0), never NaN."""
    if x.dim() != 2:
        raise ValueError(f"x has shape {tuple(x.shape)}; quantize_fp8 takes a 2-D (rows, K) tensor")
    lowp.check_finite(x)
    bm, bk = _block_shape(block, x.shape)
    b = lowp.blocks(x.detach().to(torch.float64), bm, bk)
    scale = (b.abs().amax(-1) / lowp.e4m3.max).to(torch.float32)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = (b / scale.to(torch.float64)[..., None]).clamp(-lowp.e4m3.max, lowp.e4m3.max)
    return lowp.unblocks(q, bm, bk).to(x.device, torch.float32).to(FP8), scale.to(x.device)


def expand_scale(scale: torch.Tensor, block, shape) -> torch.Tensor:
    """A per-block scale repeated to one value per element of `shape`."""
    bm, bk = _block_shape(block, shape)
    return scale.repeat_interleave(bm, 0).repeat_interleave(bk, 1)


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, block=None, dtype=torch.float64) -> torch.Tensor:
    """q * scale (per block) in `dtype`."""
    return q.to(dtype) * expand_scale(scale.to(dtype), block, q.shape)


def _check_operands(xq, wq):
    if xq.dtype != FP8 or wq.dtype != FP8:
        raise ValueError(f"operands must be {FP8} (got x {xq.dtype}, w {wq.dtype}); quantize them with quantize_fp8")
    if xq.dim() != 2 or wq.dim() != 2 or xq.shape[1] != wq.shape[1]:
        raise ValueError(f"x {tuple(xq.shape)} and w {tuple(wq.shape)}: need x (M, K) and w (N, K) with the same K")


def scaled_mm_per_tensor(xq, xs, wq, ws, use_fast_accum: bool = False, out_dtype=torch.float32) -> torch.Tensor:
    """y = x @ w.T in one `torch._scaled_mm` call with one FP32 scale per operand."""
    _check_operands(xq, wq)
    if xs.numel() != 1 or ws.numel() != 1:
        raise ValueError(f"per-tensor scaling takes one scale per operand; got {xs.numel()} and {ws.numel()}")
    return torch._scaled_mm(xq, wq.t(), scale_a=xs.reshape(()).float(), scale_b=ws.reshape(()).float(),
                            out_dtype=out_dtype, use_fast_accum=use_fast_accum)


def scaled_mm_fine_grained(xq, xs, wq, ws, use_fast_accum: bool = False, block_k: int = BLOCK_K) -> torch.Tensor:
    """y = x @ w.T (float32) with 1 x block_k activation tiles (xs: (M, K/block_k)) and block_k x block_k weight
    blocks (ws: (N/block_k, K/block_k)): per K-block an FP8 `_scaled_mm` with unit scales, scaled by xs[:, k] (rows)
    and ws[:, k] (128-column groups) and added into an FP32 accumulator."""
    _check_operands(xq, wq)
    M, K = xq.shape
    N = wq.shape[0]
    if K % block_k or N % block_k:
        raise ValueError(f"K={K} and N={N} must be multiples of block_k={block_k}")
    nk = K // block_k
    if tuple(xs.shape) != (M, nk) or tuple(ws.shape) != (N // block_k, nk):
        raise ValueError(f"scales: expected xs {(M, nk)} and ws {(N // block_k, nk)}, got {tuple(xs.shape)} and "
                         f"{tuple(ws.shape)}")
    one = torch.ones((), dtype=torch.float32, device=xq.device)
    ws_cols = ws.float().repeat_interleave(block_k, 0)  # (N, K/block_k): one scale per output column
    acc = torch.zeros(M, N, dtype=torch.float32, device=xq.device)
    for k in range(nk):
        ks = slice(k * block_k, (k + 1) * block_k)
        part = torch._scaled_mm(xq[:, ks].contiguous(), wq[:, ks].contiguous().t(), scale_a=one, scale_b=one,
                                out_dtype=torch.float32, use_fast_accum=use_fast_accum)
        acc += part * xs[:, k:k + 1].float() * ws_cols[:, k][None, :]  # promotion: scale, add in FP32
    return acc


def fp8_operand_bytes(M: int, N: int, K: int) -> int:
    """Bytes of x (M, K) and w (N, K) in FP8 with DeepSeek's FP32 scales: one per 1x128 activation tile, one per
    128x128 weight block."""
    return M * K + N * K + 4 * (M * (K // BLOCK_K) + (N // BLOCK_K) * (K // BLOCK_K))


def scaled_mm_blockwise_native(xq, xs, wq, ws, out_dtype=torch.bfloat16) -> torch.Tensor:
    """One scaled-GEMM call with DeepSeek's block scales (CUDA, cuBLAS >= 12.9): `torch.nn.functional.scaled_mm` with
    ScalingType.BlockWise1x128 / BlockWise128x128 where torch has it, else `torch._scaled_mm` in the scale layouts
    cuBLAS may require; raises RuntimeError where the build or device offers none (the CPU does not)."""
    _check_operands(xq, wq)
    errors = []
    F = torch.nn.functional
    if hasattr(F, "scaled_mm") and hasattr(F, "ScalingType"):
        try:
            return F.scaled_mm(xq, wq.t(), xs.float(), F.ScalingType.BlockWise1x128, ws.float(),
                               F.ScalingType.BlockWise128x128, output_dtype=out_dtype)
        except (RuntimeError, ValueError, TypeError) as exc:
            errors.append(f"F.scaled_mm BlockWise1x128 / BlockWise128x128: {str(exc).splitlines()[0]}")
    a_layouts = [("scale_a row-major", xs.contiguous()), ("scale_a M-major", xs.t().contiguous().t())]
    b_layouts = [("scale_b row-major", ws.t().contiguous()), ("scale_b N-major", ws.contiguous().t())]
    for (na, sa), (nb, sb) in [(a, b) for a in a_layouts for b in b_layouts]:
        name = f"{na}, {nb}"
        try:
            return torch._scaled_mm(xq, wq.t(), scale_a=sa.float(), scale_b=sb.float(), out_dtype=out_dtype)
        except (RuntimeError, ValueError) as exc:
            errors.append(f"{name}: {str(exc).splitlines()[0]}")
    raise RuntimeError("blockwise _scaled_mm unavailable here -- " + " | ".join(errors))


def blockwise_native_available(xq, xs, wq, ws) -> str:
    """In words: does this device run DeepSeek's block-scaled FP8 GEMM in one call, and does it agree with the
    per-K-block promotion? (A GPU check: on a CPU torch refuses the layout.)"""
    try:
        y = scaled_mm_blockwise_native(xq, xs, wq, ws, out_dtype=torch.float32)
    except RuntimeError as exc:
        return f"no -- {str(exc)[:160]}"
    err = lowp.rel_error(scaled_mm_fine_grained(xq, xs, wq, ws).double(), y.double())
    return f"yes, relative difference from the per-K-block promotion {err:.1e}"


def gemm_flops(M: int, N: int, K: int) -> float:
    """2 M N K (one multiply and one add per product)."""
    return 2.0 * M * N * K


# --------------------------------------------------------------------------------------------------------------
# Error against K
# --------------------------------------------------------------------------------------------------------------

def error_vs_k(ks, M: int = 16, N: int = 256, seed: int = 0, model_outputs: int = 64, model_bits: int = 14,
               device: str = "cpu") -> list[dict]:
    """Per K: relative Frobenius errors of FP8 GEMMs of `lowp.make_activations(M, K)` and `lowp.make_weights(N, K)`
    (drawn on the CPU, so every device sees the same numbers; the GEMMs run on `device`).

    total_*: against the float64 product of the unquantized operands (quantization + accumulation);
    accum_*: against the float64 product of the same FP8 values (accumulation alone), per-tensor scales,
             `use_fast_accum` False / True;
    model_*: `lowp.accumulate` on the first `model_outputs` dot products of those FP8 values, a `model_bits`-bit
             truncating accumulator, without promotion and promoted to FP32 every 128 products.
    """
    rows = []
    for K in ks:
        x = lowp.make_activations(M, K, seed=seed).to(device)
        w = lowp.make_weights(N, K, seed=seed + 1).to(device)
        ref = x.double() @ w.double().T
        xq, xs = quantize_fp8(x)
        wq, ws = quantize_fp8(w)
        xd, wd = dequantize_fp8(xq, xs), dequantize_fp8(wq, ws)
        exact = xd @ wd.T
        r = {"K": K}
        for fast in (False, True):
            y = scaled_mm_per_tensor(xq, xs, wq, ws, use_fast_accum=fast)
            r[f"total_per_tensor{'_fast' if fast else ''}"] = lowp.rel_error(ref, y)
            r[f"accum_per_tensor{'_fast' if fast else ''}"] = lowp.rel_error(exact, y)
        fq, fs = quantize_fp8(x, ACTIVATION_TILE)
        gq, gs = quantize_fp8(w, WEIGHT_BLOCK)
        y = scaled_mm_fine_grained(fq, fs, gq, gs)
        r["total_fine_grained"] = lowp.rel_error(ref, y)
        r["accum_fine_grained"] = lowp.rel_error(dequantize_fp8(fq, fs, ACTIVATION_TILE)
                                                 @ dequantize_fp8(gq, gs, WEIGHT_BLOCK).T, y)
        idx = torch.arange(model_outputs, device=xd.device)
        i, j = idx % M, (idx // M) % N
        products = (xd[i] * wd[j]).cpu().numpy()
        exact_sums = products.sum(axis=1)
        for label, every in (("model_no_promotion", None), ("model_promote_128", BLOCK_K)):
            sums = lowp.accumulate(products, model_bits, every, "truncate")
            r[label] = float(np.linalg.norm(sums - exact_sums) / np.linalg.norm(exact_sums))
        rows.append(r)
    return rows


# --------------------------------------------------------------------------------------------------------------
# Speed: BF16 against FP8
# --------------------------------------------------------------------------------------------------------------

def time_gemms(M: int, N: int, K: int, device: str = "cuda", min_run_time: float = 0.2, seed: int = 0) -> dict:
    """TFLOP/s of y = x @ w.T in BF16 (`torch.mm`) and in FP8 (`_scaled_mm`, per-tensor scales, with and without
    fast accumulation; DeepSeek block scales in one call where the device offers it), and the FP8/BF16 ratios.
    Every FP8 result is checked against the BF16 one before it is timed (relative error below 10%)."""
    from common.core import timing
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).to(device)
    w = (torch.randn(N, K, generator=g) * 0.02).to(device)
    xb, wb = x.to(torch.bfloat16), w.to(torch.bfloat16)
    xq, xs = quantize_fp8(x)
    wq, ws = quantize_fp8(w)
    ref = (xb @ wb.t()).double()
    flops = gemm_flops(M, N, K)
    out = {"M": M, "N": N, "K": K}
    t = timing.bench(lambda: torch.mm(xb, wb.t()), device=device, min_run_time=min_run_time, label="bf16")
    out["bf16_tflops"] = flops / t.median_s / 1e12
    candidates = {
        "fp8_tensor": lambda: scaled_mm_per_tensor(xq, xs, wq, ws, use_fast_accum=False, out_dtype=torch.bfloat16),
        "fp8_tensor_fast": lambda: scaled_mm_per_tensor(xq, xs, wq, ws, use_fast_accum=True,
                                                        out_dtype=torch.bfloat16)}
    if device != "cpu" and M % 128 == 0 and N % 128 == 0 and K % 128 == 0:
        fq, fs = quantize_fp8(x, ACTIVATION_TILE)
        gq, gs = quantize_fp8(w, WEIGHT_BLOCK)
        candidates["fp8_blockwise"] = lambda: scaled_mm_blockwise_native(fq, fs, gq, gs)
    for name, fn in candidates.items():
        try:
            y = fn()
        except RuntimeError as exc:
            out[f"{name}_tflops"] = float("nan")
            out[f"{name}_note"] = str(exc).splitlines()[0][:200]
            continue
        err = lowp.rel_error(ref, y.double())
        if not err < 0.1:
            raise RuntimeError(f"{name} at M={M}, N={N}, K={K}: relative error {err:.3g} against BF16; not timed")
        t = timing.bench(fn, device=device, min_run_time=min_run_time, label=name)
        out[f"{name}_tflops"] = flops / t.median_s / 1e12
        out[f"{name}_vs_bf16"] = out[f"{name}_tflops"] / out["bf16_tflops"]
    return out
