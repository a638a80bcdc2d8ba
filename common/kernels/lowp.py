"""Low-precision number formats and block-scaled quantization, computed from the bit layouts.

Formats (`fp32`, `tf32`, `bf16`, `fp16`, `e4m3`, `e5m2`, `e2m1`) are `Format` objects built from (exponent bits,
mantissa bits, what the top exponent code means); largest value, smallest normal, epsilon and every representable
value follow from the layout. `round_to(x, fmt)` rounds to a format (round-to-nearest-even, saturating or not).

Quantizers (`quantize`, `dequantize`, presets in `SCHEMES`) split the last dimension -- the reduction dimension K of
a GEMM -- into blocks, give each block a scale, and round `x / scale` to the element format:
  fp8_tensor     E4M3, one FP32 scale for the tensor (amax / 448)
  fp8_1x128      E4M3, FP32 scale per 1x128 tile (DeepSeek-V3 activations)
  fp8_128x128    E4M3, FP32 scale per 128x128 block (DeepSeek-V3 weights)
  mxfp8, mxfp4   E4M3 / E2M1, 32-element blocks, power-of-two E8M0 scale 2^(floor(log2 amax) - emax_elem)
  nvfp4          E2M1, 16-element blocks, E4M3 block scale times one FP32 tensor scale amax / (6 * 448)
`accumulate` simulates a dot product summed in an accumulator with few significand bits, optionally promoted to FP32
every N elements (the DeepSeek-V3 fix for FP8 GEMMs on H800).

Sources (specification text, read 2026-12):
- OCP 8-bit Floating Point Specification (OFP8) rev 1.0, 2023 -- E4M3 (no Inf, max 448) and E5M2 (IEEE-like):
  https://www.opencompute.org/documents/ocp-8-bit-floating-point-specification-ofp8-revision-1-0-2023-12-01-pdf-1
- OCP Microscaling Formats (MX) Specification v1.0, Sept 2023 -- E2M1, E8M0, 32-element blocks, the shared scale
  2^(floor(log2(amax)) - emax_elem), saturating element conversion:
  https://www.opencompute.org/documents/ocp-microscaling-formats-mx-v1-0-spec-final-pdf
- NVIDIA, "Introducing NVFP4 for Efficient and Accurate Low-Precision Inference", June 2025 -- 16-element blocks,
  E4M3 block scale, FP32 tensor scale: https://developer.nvidia.com/blog/introducing-nvfp4-for-efficient-and-accurate-low-precision-inference/
- DeepSeek-AI, "DeepSeek-V3 Technical Report", arXiv:2412.19437, Dec 2024, Sec. 3.3 -- 1x128 / 128x128 FP8 tiles,
  accumulation on H800 limited to about 14 bits, promotion to FP32 every N_C = 128 elements:
  https://arxiv.org/abs/2412.19437
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch


# --------------------------------------------------------------------------------------------------------------
# Formats from the bit layout
# --------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Format:
    """A binary floating-point format: 1 sign bit, `exp_bits` exponent bits, `man_bits` mantissa bits.

    `special` says what the all-ones exponent code means:
      "ieee" -- Inf and NaN (FP32, TF32, BF16, FP16, E5M2): the largest finite exponent is one below it;
      "fn"   -- finite, only mantissa all-ones is NaN (OCP E4M3): the top exponent holds numbers too;
      "none" -- no Inf, no NaN (E2M1): every code is a number.
    """

    name: str
    exp_bits: int
    man_bits: int
    special: str = "ieee"
    torch_dtype: str | None = None  # name of the torch dtype with this layout, if torch has one

    def __post_init__(self):
        if self.special not in ("ieee", "fn", "none"):
            raise ValueError(f"special={self.special!r}; allowed: 'ieee', 'fn', 'none'")

    @property
    def bits(self) -> int:
        return 1 + self.exp_bits + self.man_bits

    @property
    def bias(self) -> int:
        return 2 ** (self.exp_bits - 1) - 1

    @property
    def emax(self) -> int:
        """Exponent of the largest finite value."""
        top = 2 ** self.exp_bits - 1
        return (top - 1 if self.special == "ieee" else top) - self.bias

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal value (the subnormals share it)."""
        return 1 - self.bias

    @property
    def max(self) -> float:
        # "fn" loses the all-ones mantissa at the top exponent to NaN
        frac = 1 - 2.0 ** -self.man_bits * (2 if self.special == "fn" else 1)
        return (1 + frac) * 2.0 ** self.emax

    @property
    def smallest_normal(self) -> float:
        return 2.0 ** self.emin

    @property
    def smallest_subnormal(self) -> float:
        return 2.0 ** (self.emin - self.man_bits)

    @property
    def eps(self) -> float:
        """Distance from 1 to the next larger value."""
        return 2.0 ** -self.man_bits

    @property
    def has_inf(self) -> bool:
        return self.special == "ieee"

    @property
    def has_nan(self) -> bool:
        return self.special != "none"

    def decode(self, code: int) -> float:
        """The value of a bit pattern (an int of `bits` bits)."""
        if not 0 <= code < 2 ** self.bits:
            raise ValueError(f"code={code} is not a {self.bits}-bit pattern of {self.name}")
        sign = -1.0 if code >> (self.bits - 1) else 1.0
        e = (code >> self.man_bits) & (2 ** self.exp_bits - 1)
        m = code & (2 ** self.man_bits - 1)
        top = 2 ** self.exp_bits - 1
        if e == top and self.special == "ieee":
            return sign * math.inf if m == 0 else math.nan
        if e == top and self.special == "fn" and m == 2 ** self.man_bits - 1:
            return math.nan
        if e == 0:
            return sign * m * 2.0 ** (self.emin - self.man_bits)
        return sign * (1 + m / 2 ** self.man_bits) * 2.0 ** (e - self.bias)

    def bit_string(self, value: float) -> str:
        """'s eeee mmm' of a representable value (formats of up to 16 bits)."""
        if self.bits > 16:
            raise ValueError(f"bit_string is for formats of up to 16 bits; {self.name} has {self.bits}")
        for code in range(2 ** self.bits):
            v = self.decode(code)
            if v == value and math.copysign(1, v) == math.copysign(1, value):
                b = format(code, f"0{self.bits}b")
                return f"{b[0]} {b[1:1 + self.exp_bits]} {b[1 + self.exp_bits:]}"
        raise ValueError(f"{value!r} is not representable in {self.name}")

    def values(self) -> list[float]:
        """Every non-negative finite value, ascending (formats of up to 16 bits)."""
        if self.bits > 16:
            raise ValueError(f"values() lists formats of up to 16 bits; {self.name} has {self.bits}")
        vals = {self.decode(c) for c in range(2 ** (self.bits - 1))}
        return sorted(v for v in vals if math.isfinite(v))

    def facts(self) -> dict:
        return {"format": self.name, "bits": self.bits, "exp_bits": self.exp_bits, "man_bits": self.man_bits,
                "bias": self.bias, "max": self.max, "smallest_normal": self.smallest_normal,
                "smallest_subnormal": self.smallest_subnormal, "eps": self.eps, "inf": self.has_inf,
                "nan": self.has_nan}


fp32 = Format("FP32", 8, 23, "ieee", "float32")
tf32 = Format("TF32", 8, 10, "ieee")  # stored in 32 bits; tensor cores read 19 of them
bf16 = Format("BF16", 8, 7, "ieee", "bfloat16")
fp16 = Format("FP16", 5, 10, "ieee", "float16")
e5m2 = Format("FP8 E5M2", 5, 2, "ieee", "float8_e5m2")
e4m3 = Format("FP8 E4M3", 4, 3, "fn", "float8_e4m3fn")
e2m1 = Format("FP4 E2M1", 2, 1, "none", "float4_e2m1fn_x2")
FORMATS = {"fp32": fp32, "tf32": tf32, "bf16": bf16, "fp16": fp16, "e5m2": e5m2, "e4m3": e4m3, "e2m1": e2m1}

# E8M0, the MX scale: 8 exponent bits, no sign, no mantissa, bias 127; code 255 is NaN -> 2^-127 ... 2^127.
E8M0_MIN_EXP, E8M0_MAX_EXP = -127, 127


def get_format(fmt) -> Format:
    if isinstance(fmt, Format):
        return fmt
    if isinstance(fmt, str) and fmt.lower() in FORMATS:
        return FORMATS[fmt.lower()]
    raise ValueError(f"format {fmt!r} is unknown; allowed: {', '.join(FORMATS)} or a Format")


# --------------------------------------------------------------------------------------------------------------
# Rounding to a format
# --------------------------------------------------------------------------------------------------------------

def round_to(x, fmt, saturate: bool = True, rounding: str = "nearest") -> torch.Tensor:
    """`x` rounded to the values of `fmt` (returned as float64 holding exact grid values).

    rounding "nearest" is round-to-nearest, ties to the even mantissa (IEEE default); "truncate" rounds toward zero.
    Values beyond the largest finite one become +-max when `saturate`, else +-Inf (formats with Inf) or NaN. NaN
    stays NaN. Subnormals are kept (the grid step below the smallest normal is the subnormal step).
    """
    fmt = get_format(fmt)
    if rounding not in ("nearest", "truncate"):
        raise ValueError(f"rounding={rounding!r}; allowed: 'nearest', 'truncate'")
    x = torch.as_tensor(x).to(torch.float64)
    a = x.abs()
    _, e = torch.frexp(a)  # a = m * 2^e with m in [0.5, 1): floor(log2 a) = e - 1
    exp = torch.clamp(e.to(torch.float64) - 1, min=fmt.emin)
    step = torch.pow(2.0, exp - fmt.man_bits)
    r = a / step
    q = (torch.round(r) if rounding == "nearest" else torch.trunc(r)) * step
    over = q > fmt.max  # also catches Inf inputs
    if saturate:
        q = torch.where(over, torch.full_like(q, fmt.max), q)
    else:
        q = torch.where(over, torch.full_like(q, math.inf if fmt.has_inf else math.nan), q)
    q = torch.where(torch.isnan(a), torch.full_like(q, math.nan), q)
    return torch.copysign(q, x)


def torch_cast(x, fmt) -> torch.Tensor | None:
    """x cast to fmt's torch dtype and back to float64 (None when torch has no castable dtype for fmt)."""
    fmt = get_format(fmt)
    dt = getattr(torch, fmt.torch_dtype, None) if fmt.torch_dtype else None
    if dt is None or fmt.bits < 8:
        return None
    return torch.as_tensor(x).to(torch.float32).to(dt).to(torch.float64)


def is_power_of_two(t) -> torch.Tensor:
    """Elementwise: is each (positive, finite) value an exact power of two?"""
    t = torch.as_tensor(t).to(torch.float64)
    m, _ = torch.frexp(t)
    return (t > 0) & torch.isfinite(t) & (m == 0.5)


# --------------------------------------------------------------------------------------------------------------
# Input checks
# --------------------------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------------------------
# Block-scaled quantization
# --------------------------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------------------------
# Error measures, realistic tensors, GEMMs
# --------------------------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------------------------
# Limited-precision accumulation
# --------------------------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------------------------
# Memory and throughput
# --------------------------------------------------------------------------------------------------------------

def bytes_per_param(elem_bits: int, scale_bits: int = 0, block_elems: int | None = None) -> float:
    """Bytes per element: elem_bits / 8 plus one scale of scale_bits per block_elems elements."""
    if elem_bits <= 0:
        raise ValueError(f"elem_bits={elem_bits}: must be positive")
    if scale_bits and not block_elems:
        raise ValueError("a scale needs block_elems (elements sharing it)")
    return elem_bits / 8 + (scale_bits / 8 / block_elems if scale_bits else 0.0)


STORAGE = {  # format -> (bytes per parameter incl. scales, the hardware dtype its GEMMs run in)
    "FP32": (4.0, "tf32"),
    "BF16": (2.0, "bf16"),
    "FP8 (1x128 FP32 scales)": (bytes_per_param(8, 32, 128), "fp8"),
    "FP8 (128x128 FP32 scales)": (bytes_per_param(8, 32, 128 * 128), "fp8"),
    "MXFP8": (bytes_per_param(8, 8, 32), "fp8"),
    "MXFP4": (bytes_per_param(4, 8, 32), "fp4"),
    "NVFP4": (bytes_per_param(4, 8, 16), "fp4"),
}


def max_params_billion(hbm_gb: float, bytes_per_parameter: float, reserve_fraction: float = 0.0) -> float:
    """Parameters (in billions) whose weights fit in hbm_gb GB (1e9 bytes), keeping reserve_fraction free."""
    if hbm_gb <= 0 or bytes_per_parameter <= 0 or not 0 <= reserve_fraction < 1:
        raise ValueError(f"hbm_gb={hbm_gb}, bytes_per_parameter={bytes_per_parameter}, "
                         f"reserve_fraction={reserve_fraction}: need positive sizes and 0 <= reserve < 1")
    return hbm_gb * (1 - reserve_fraction) / bytes_per_parameter


# Weight formats for the critical batch: (label, bytes per weight incl. scales, GEMM dtype, dtype used where the
# GPU has no tensor cores for the GEMM dtype -- the weights are dequantized to it in registers -- and a note).
WEIGHT_FORMATS = [
    ("BF16 (W16A16)", 2.0, "bf16", None, "weights and math in BF16"),
    ("FP8 W8A8 (128x128 FP32 scales)", bytes_per_param(8, 32, 128 * 128), "fp8", None,
     "both operands FP8 (DeepSeek-V3)"),
    ("W8A16 (8-bit weights, BF16 math)", bytes_per_param(8), "bf16", None,
     "weight-only: 8-bit weights dequantized to BF16"),
    ("W4A16 (4-bit weights, BF16 scale per 128)", bytes_per_param(4, 16, 128), "bf16", None,
     "weight-only: 4-bit weights dequantized to BF16"),
    ("NVFP4 W4A4", bytes_per_param(4, 8, 16), "fp4", "fp8", "FP4 tensor cores; on Hopper dequantized to FP8"),
    ("MXFP4 W4A4", bytes_per_param(4, 8, 32), "fp4", "fp8", "FP4 tensor cores; on Hopper dequantized to FP8"),
]


def critical_batch(gpu_id: str, weight_bytes: float, gemm_dtype: str, fallback_dtype: str | None = None) -> dict:
    """Tokens M* at which a weight-bound GEMM (M tokens through a K x N layer, weights read once) becomes
    compute-bound: intensity 2 M K N / (K N weight_bytes) = 2 M / weight_bytes meets the ridge peak / HBM bandwidth,
    so M* = ridge * weight_bytes / 2 (dense peak of the dtype the GEMM runs in; activations' bytes neglected).
    Where the GPU lacks `gemm_dtype` tensor cores, the GEMM runs in `fallback_dtype` (None: raise)."""
    from common.facts import hardware
    if weight_bytes <= 0:
        raise ValueError(f"weight_bytes={weight_bytes}: must be positive")
    dtype, note = gemm_dtype, ""
    try:
        ridge = hardware.ridge_point(gpu_id, gemm_dtype)
    except hardware.UnsupportedDtype:
        if fallback_dtype is None:
            raise
        dtype, note = fallback_dtype, f"no {gemm_dtype} tensor cores: dequantized to {fallback_dtype}"
        ridge = hardware.ridge_point(gpu_id, fallback_dtype)
    peak = hardware.peak_tflops(gpu_id, dtype)
    m_star = ridge * weight_bytes / 2
    return {"gemm_dtype": dtype, "dense_tflops": peak, "hbm_tbs": hardware.gpu(gpu_id).hbm_bandwidth_tbs,
            "ridge": ridge, "m_star": m_star, "note": note,
            "arithmetic": f"{peak:g} TFLOP/s / {hardware.gpu(gpu_id).hbm_bandwidth_tbs:g} TB/s = {ridge:.1f} FLOP/B;"
                          f" x {weight_bytes:.4g} B / 2 = {m_star:.1f}"}
