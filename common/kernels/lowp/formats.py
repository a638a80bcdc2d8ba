"""Number formats from their bit layouts (`Format`: largest value, smallest normal, epsilon, every representable
value), rounding to a format (`round_to`: round-to-nearest-even, saturating or not), and torch's own casts.

Sources: OCP OFP8 rev 1.0 (E4M3, E5M2) and OCP MX v1.0 (E2M1, E8M0): see `common.kernels.lowp`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


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
