"""Block-scaled quantization: split the last dimension (a GEMM's reduction dimension K) into blocks, give each block a
scale (FP32, power-of-two E8M0 or E4M3 times a tensor scale), round x / scale to the element format (`quantize`,
`dequantize`), and the presets of `SCHEMES` (FP8 per tensor, 1x128, 128x128; MXFP8, MXFP4, NVFP4)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from common.kernels.lowp.formats import E8M0_MAX_EXP, E8M0_MIN_EXP, Format, e2m1, e4m3, get_format, round_to


def check_finite(x: torch.Tensor, name: str = "x") -> None:
    """Raise ValueError naming how many values are NaN/Inf and where the first is; quantizers refuse them."""
    bad = ~torch.isfinite(x)
    if bool(bad.any()):
        n_nan, n_inf = int(torch.isnan(x).sum()), int(torch.isinf(x).sum())
        first = tuple(int(i) for i in torch.nonzero(bad)[0])
        raise ValueError(f"{name} has {n_nan + n_inf} non-finite values ({n_nan} NaN, {n_inf} Inf) of {x.numel()}; "
                         f"first at index {first}: {float(x[first])}. A quantizer refuses them: one NaN/Inf would "
                         f"become its block's amax and turn the whole block's scale into NaN/Inf. Clean or mask "
                         f"them first.")


def _as_block(block, shape) -> tuple[int, int]:
    """(rows, cols) of a block over the 2-D view (leading dims flattened, last dim = K)."""
    rows, cols = shape
    if block is None:
        return rows, cols
    if isinstance(block, int):
        block = (1, block)
    if (not isinstance(block, (tuple, list)) or len(block) != 2
            or not all(isinstance(b, int) and b >= 1 for b in block)):
        raise ValueError(f"block={block!r}: give an int (1 x block along the last dim), a (rows, cols) pair of "
                         f"positive ints, or None (one block for the whole tensor)")
    return tuple(block)


def _view2d(x: torch.Tensor) -> torch.Tensor:
    if x.dim() == 0:
        raise ValueError("x is a scalar; quantize a tensor with at least one dimension")
    return x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x


def _pad_to_blocks(x2: torch.Tensor, bm: int, bk: int, pad: bool, shape) -> torch.Tensor:
    rows, cols = x2.shape
    pr, pc = (-rows) % bm, (-cols) % bk
    if pr or pc:
        if not pad:
            what = []
            if pc:
                what.append(f"the last dimension {cols} is not a multiple of the block's {bk} columns")
            if pr:
                what.append(f"the {rows} rows are not a multiple of the block's {bm} rows")
            raise ValueError(f"block={(bm, bk)} does not tile x of shape {tuple(shape)}: {'; '.join(what)}. "
                             f"Pass pad=True to zero-pad to {(rows + pr, cols + pc)} (dequantize crops it back), "
                             f"or choose a block that divides the shape.")
        x2 = torch.nn.functional.pad(x2, (0, pc, 0, pr))
    return x2


def blocks(x2: torch.Tensor, bm: int, bk: int) -> torch.Tensor:
    """A (R, C) tensor as (R/bm, C/bk, bm*bk): one row per block."""
    r, c = x2.shape
    return x2.reshape(r // bm, bm, c // bk, bk).permute(0, 2, 1, 3).reshape(r // bm, c // bk, bm * bk)


def unblocks(b: torch.Tensor, bm: int, bk: int) -> torch.Tensor:
    nr, nc, _ = b.shape
    return b.reshape(nr, nc, bm, bk).permute(0, 2, 1, 3).reshape(nr * bm, nc * bk)

@dataclass
class Quantized:
    """A quantized tensor: `q` holds element values on the element format's grid (float64, padded 2-D view),
    `scale` the effective scale per block (float64, shape (rows/bm, cols/bk)); value ~= q * scale."""

    q: torch.Tensor
    scale: torch.Tensor
    block: tuple
    elem: Format
    scale_kind: str
    shape: tuple
    e8m0_rounding: str = "floor"
    block_scale: torch.Tensor | None = None  # NVFP4: the E4M3 block scales (before the tensor scale)
    tensor_scale: float | None = None  # NVFP4: the FP32 tensor scale
    extra: dict = field(default_factory=dict)

    def bytes(self) -> float:
        """Storage: elements at their width plus the scales (E8M0/E4M3 1 byte, FP32 4 bytes)."""
        n = self.q.numel()
        per_scale = {"fp32": 4, "e8m0": 1, "e4m3": 1}[self.scale_kind]
        return n * self.elem.bits / 8 + self.scale.numel() * per_scale + (4 if self.tensor_scale else 0)


SCALE_KINDS = ("fp32", "e8m0", "e4m3")


def quantize(x, elem=e4m3, block=(1, 128), scale: str = "fp32", tensor_scale: bool = False,
             pad: bool = False, e8m0_rounding: str = "floor") -> Quantized:
    """Block-scaled quantization of `x` along its last dimension (leading dims flattened into rows).

    block: int b -> 1 x b tiles along the last dim; (bm, bk) -> bm x bk blocks; None -> one scale per tensor.
    scale: "fp32" -- amax / elem.max kept in FP32 (per-tensor FP8, DeepSeek-V3 tiles);
           "e8m0" -- 2^(floor(log2 amax) - elem.emax), clamped to E8M0 (OCP MX); with e8m0_rounding="ceil",
                     2^ceil(log2(amax / elem.max)), the smallest power of two that avoids saturation;
           "e4m3" -- amax / elem.max rounded to E4M3 (NVFP4), divided first by an FP32 tensor scale
                     amax_tensor / (elem.max * 448) when tensor_scale=True.
    Elements are rounded to nearest-even and saturate at +-elem.max. NaN/Inf inputs raise ValueError; a block
    that does not tile the shape raises ValueError unless pad=True (zero padding, cropped by `dequantize`).
    """
    elem = get_format(elem)
    if scale not in SCALE_KINDS:
        raise ValueError(f"scale={scale!r}; allowed: {', '.join(SCALE_KINDS)}")
    if e8m0_rounding not in ("floor", "ceil"):
        raise ValueError(f"e8m0_rounding={e8m0_rounding!r}; allowed: 'floor' (OCP MX v1.0), 'ceil'")
    if tensor_scale and scale != "e4m3":
        raise ValueError("tensor_scale=True goes with scale='e4m3' (NVFP4's two-level scaling)")
    x = torch.as_tensor(x)
    if not x.is_floating_point():
        x = x.to(torch.float64)
    check_finite(x)
    shape = tuple(x.shape)
    x2 = _view2d(x.detach().to("cpu", torch.float64))
    bm, bk = _as_block(block, x2.shape)
    x2 = _pad_to_blocks(x2, bm, bk, pad, shape)
    b = blocks(x2, bm, bk)
    amax = b.abs().amax(dim=-1)
    bscale, ts = None, None
    if scale == "fp32":
        s = (amax / elem.max).to(torch.float32).to(torch.float64)
        s = torch.where(s > 0, s, torch.ones_like(s))
    elif scale == "e8m0":
        if e8m0_rounding == "floor":
            _, e = torch.frexp(amax)
            exp = e.to(torch.float64) - 1 - elem.emax
        else:
            exp = torch.ceil(torch.log2(torch.where(amax > 0, amax, torch.ones_like(amax)) / elem.max))
        exp = exp.clamp(E8M0_MIN_EXP, E8M0_MAX_EXP)
        exp = torch.where(amax > 0, exp, torch.full_like(exp, E8M0_MIN_EXP))
        s = torch.pow(2.0, exp)
    else:
        ts = 1.0
        if tensor_scale:
            t_amax = float(amax.max()) if amax.numel() else 0.0
            ts = float(np.float32(t_amax / (elem.max * e4m3.max))) if t_amax > 0 else 1.0
        bscale = round_to(amax / elem.max / ts, e4m3, saturate=True)
        s = bscale * ts
    safe = torch.where(s > 0, s, torch.ones_like(s))
    q = round_to(b / safe[..., None], elem, saturate=True)
    q = torch.where(s[..., None] > 0, q, torch.zeros_like(q))
    return Quantized(q=unblocks(q, bm, bk), scale=s, block=(bm, bk), elem=elem, scale_kind=scale, shape=shape,
                     e8m0_rounding=e8m0_rounding, block_scale=bscale, tensor_scale=ts if tensor_scale else None)


def dequantize(qt: Quantized, dtype=torch.float32) -> torch.Tensor:
    """q * scale, cropped to the original shape."""
    bm, bk = qt.block
    v = unblocks(blocks(qt.q, bm, bk) * qt.scale[..., None], bm, bk)
    rows = int(np.prod(qt.shape[:-1])) if len(qt.shape) > 1 else 1
    v = v[:rows, :qt.shape[-1]]
    return v.reshape(qt.shape).to(dtype)


@dataclass(frozen=True)
class Scheme:
    name: str
    elem: Format
    block: object  # int, (bm, bk) or None
    scale: str
    tensor_scale: bool = False
    note: str = ""

    def quantize(self, x, pad: bool = False) -> Quantized:
        return quantize(x, self.elem, self.block, self.scale, self.tensor_scale, pad=pad)

    @property
    def scale_bytes(self) -> int:
        return 4 if self.scale == "fp32" else 1

    @property
    def block_elems(self) -> int | None:
        if self.block is None:
            return None
        return self.block if isinstance(self.block, int) else self.block[0] * self.block[1]

    def bytes_per_element(self) -> float:
        """Element bytes plus the amortised block scale (per-tensor scales count as 0)."""
        over = self.scale_bytes / self.block_elems if self.block_elems else 0.0
        return self.elem.bits / 8 + over


SCHEMES = {
    "fp8_tensor": Scheme("fp8_tensor", e4m3, None, "fp32", note="one FP32 scale per tensor"),
    "fp8_1x128": Scheme("fp8_1x128", e4m3, (1, 128), "fp32", note="DeepSeek-V3 activation tiles"),
    "fp8_128x128": Scheme("fp8_128x128", e4m3, (128, 128), "fp32", note="DeepSeek-V3 weight blocks"),
    "mxfp8": Scheme("mxfp8", e4m3, (1, 32), "e8m0", note="OCP MX, E4M3 elements"),
    "mxfp4": Scheme("mxfp4", e2m1, (1, 32), "e8m0", note="OCP MX, E2M1 elements"),
    "nvfp4": Scheme("nvfp4", e2m1, (1, 16), "e4m3", tensor_scale=True, note="NVIDIA, E4M3 block scale + FP32"),
}


def get_scheme(scheme) -> Scheme:
    if isinstance(scheme, Scheme):
        return scheme
    if scheme in SCHEMES:
        return SCHEMES[scheme]
    raise ValueError(f"scheme {scheme!r} is unknown; allowed: {', '.join(SCHEMES)}")


def fake_quantize(x, scheme, pad: bool = False, dtype=torch.float64) -> torch.Tensor:
    """dequantize(quantize(x)) with a named scheme: the values a low-precision kernel would see."""
    return dequantize(get_scheme(scheme).quantize(x, pad=pad), dtype=dtype)
