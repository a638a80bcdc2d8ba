"""How much a format loses: relative errors, realistic tensors (activations with outlier channels, weights), a GEMM's
error under two quantization schemes, and a dot product summed in an accumulator with few significand bits, optionally
promoted to FP32 every N elements (DeepSeek-V3's fix for FP8 GEMMs on H800, Sec. 3.3 of its report)."""
from __future__ import annotations

import numpy as np
import torch

from common.kernels.lowp.block_scaling import fake_quantize


def rel_error(reference, approx) -> float:
    """Relative error in the Frobenius norm: ||approx - reference||_2 / ||reference||_2 (float64)."""
    r = torch.as_tensor(reference).to(torch.float64)
    a = torch.as_tensor(approx).to(torch.float64)
    if r.shape != a.shape:
        raise ValueError(f"shapes differ: reference {tuple(r.shape)}, approx {tuple(a.shape)}")
    den = float(torch.linalg.vector_norm(r))
    if den == 0:
        raise ValueError("reference is all zeros: relative error undefined")
    return float(torch.linalg.vector_norm(a - r)) / den


def make_activations(rows: int = 256, cols: int = 4096, seed: int = 0, outlier_channels: int = 8,
                     outlier_scale: float = 30.0, df: float = 4.0) -> torch.Tensor:
    """LLM-like activations (float32, on the CPU so every machine draws the same numbers): heavy-tailed rows
    (Student-t with `df` degrees of freedom, unit scale) plus `outlier_channels` columns `outlier_scale` times
    larger -- the systematic outlier features seen in transformer activations."""
    if rows < 1 or cols < 1:
        raise ValueError(f"rows={rows}, cols={cols}: both must be >= 1")
    if not 0 <= outlier_channels <= cols:
        raise ValueError(f"outlier_channels={outlier_channels}: allowed 0..cols ({cols})")
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(rows, cols, generator=g, dtype=torch.float64)
    chi2 = (torch.randn(rows, cols, int(df), generator=g, dtype=torch.float64) ** 2).sum(-1)
    x = z / torch.sqrt(chi2 / df)
    idx = torch.randperm(cols, generator=g)[:outlier_channels]
    x[:, idx] *= outlier_scale
    return x.to(torch.float32)


def make_weights(rows: int = 1024, cols: int = 4096, seed: int = 1, std: float = 0.02) -> torch.Tensor:
    """Weight-like tensor (float32, CPU): normal with `std`, rows with slightly different norms."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g, dtype=torch.float64) * std
    w *= torch.exp(0.3 * torch.randn(rows, 1, generator=g, dtype=torch.float64))
    return w.to(torch.float32)


def quantized_gemm_error(x, w, x_scheme, w_scheme) -> float:
    """Relative error of y = x @ w.T with both operands fake-quantized, against the float64 product."""
    ref = x.to(torch.float64) @ w.to(torch.float64).T
    y = fake_quantize(x, x_scheme) @ fake_quantize(w, w_scheme).T
    return rel_error(ref, y)


def round_significand(a, bits: int, rounding: str = "truncate") -> np.ndarray:
    """`a` rounded to `bits` significant bits (implicit one included), exponent unbounded (numpy, float64)."""
    if bits < 1:
        raise ValueError(f"bits={bits}: need at least 1 significand bit")
    if rounding not in ("nearest", "truncate"):
        raise ValueError(f"rounding={rounding!r}; allowed: 'nearest', 'truncate'")
    m, e = np.frexp(np.asarray(a, dtype=np.float64))
    s = np.ldexp(m, bits)
    s = np.rint(s) if rounding == "nearest" else np.trunc(s)
    return np.ldexp(s, e - bits)


def accumulate(products, acc_bits: int = 14, promote_every: int | None = None, rounding: str = "truncate",
               checkpoints=None):
    """Sum `products` (shape (batch, K)) along K in an accumulator of `acc_bits` significand bits.

    Each addition is rounded to `acc_bits` bits (truncation models the alignment shift of a tensor core adder).
    With promote_every=N, the limited accumulator is added into an FP32 register every N products and restarted
    (DeepSeek-V3 Sec. 3.3.2, N_C = 128). Returns the sums (float64, shape (batch,)), or, with `checkpoints` (a list
    of K values), a dict {k: sums of the first k products}.
    """
    p = np.asarray(products, dtype=np.float64)
    if p.ndim != 2:
        raise ValueError(f"products has shape {p.shape}; expected (batch, K)")
    if not np.isfinite(p).all():
        raise ValueError(f"products has {int((~np.isfinite(p)).sum())} non-finite values")
    if promote_every is not None and promote_every < 1:
        raise ValueError(f"promote_every={promote_every}: a positive number of products, or None")
    batch, K = p.shape
    wanted = set(checkpoints or [])
    bad = [k for k in wanted if not 1 <= k <= K]
    if bad:
        raise ValueError(f"checkpoints {sorted(bad)} outside 1..K={K}")
    acc = np.zeros(batch)
    total = np.zeros(batch, dtype=np.float32)
    out = {}
    for k in range(K):
        acc = round_significand(acc + p[:, k], acc_bits, rounding)
        if promote_every and (k + 1) % promote_every == 0:
            total = (total + acc.astype(np.float32)).astype(np.float32)
            acc = np.zeros(batch)
        if k + 1 in wanted:
            out[k + 1] = total.astype(np.float64) + acc
    if checkpoints:
        return out
    return total.astype(np.float64) + acc
