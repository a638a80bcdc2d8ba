"""The roofline model: arithmetic intensity, attainable performance, ridge point, bound, and the plot.

    intensity = FLOPs / bytes moved to and from main memory          (FLOP/B)
    attainable = min(peak FLOP/s, intensity * bandwidth B/s)          (FLOP/s)
    ridge      = peak FLOP/s / bandwidth B/s                           (FLOP/B)
Below the ridge a kernel is memory-bound, at or above it compute-bound.

A `Roof` is one (peak, bandwidth) pair with a name: from the datasheet (`Roof.datasheet("H100-SXM", "bf16")`, dense by
default) or measured on this device (`Roof.measured()`, using common.core.ceilings, the code lab 00 uses). The cost
functions (`gemm_cost`, `softmax_cost`, ...) state one FLOP/byte convention each and are the reference for lab 02's
exercises; later labs reuse them. `plot(ceilings=[...], points=[...], ax=None)` draws any number of roofs and labelled
kernel points on log-log axes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

from common.core.validate import number, whole

# bytes per element of the dtypes the workbook uses (fp4 packs two values per byte)
DTYPE_BYTES = {"fp64": 8, "float64": 8, "fp32": 4, "float32": 4, "tf32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2,
               "float16": 2, "fp8": 1, "float8": 1, "int8": 1, "fp4": 0.5}


def dtype_bytes(dtype) -> float:
    """Bytes per element: "bf16" -> 2, "fp32" -> 4, "fp4" -> 0.5; a torch dtype works too."""
    name = str(dtype).replace("torch.", "").lower()
    if name.startswith("float8"):
        name = "fp8"
    if name not in DTYPE_BYTES:
        raise ValueError(f"dtype={dtype!r} has no known size; allowed: {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[name]


def _positive(name: str, value, allow_zero: bool = False) -> float:
    return number(name, value, strict=not allow_zero)


def _dims(**dims) -> None:
    for name, v in dims.items():
        whole(name, v)


# ---------------------------------------------------------------------------------------------------- the model
def arithmetic_intensity(flops: float, bytes_moved: float) -> float:
    """FLOPs per byte of main-memory traffic."""
    return _positive("flops", flops, allow_zero=True) / _positive("bytes_moved", bytes_moved)


def ridge_point(peak_flops: float, bandwidth: float) -> float:
    """Intensity (FLOP/B) where the roof bends: peak FLOP/s / bandwidth B/s (any consistent units)."""
    return _positive("peak_flops", peak_flops) / _positive("bandwidth", bandwidth)


def attainable(intensity, peak_flops: float, bandwidth: float):
    """min(peak, intensity * bandwidth): the best rate a kernel of that intensity can reach. Works on arrays."""
    import numpy as np
    peak, bw = _positive("peak_flops", peak_flops), _positive("bandwidth", bandwidth)
    x = np.asarray(intensity, dtype=float)
    if np.any(np.isnan(x)) or np.any(x < 0):
        raise ValueError(f"intensity={intensity!r} must be >= 0 FLOP/B")
    out = np.minimum(peak, x * bw)
    return float(out) if out.ndim == 0 else out


def bound(intensity: float, peak_flops: float, bandwidth: float) -> str:
    """"memory-bound" below the ridge point, "compute-bound" at or above it."""
    x = _positive("intensity", intensity, allow_zero=True)
    return "memory-bound" if x < ridge_point(peak_flops, bandwidth) else "compute-bound"


def fraction_of_attainable(flops: float, bytes_moved: float, seconds: float, peak_flops: float,
                           bandwidth: float) -> float:
    """Achieved FLOP/s over the roof at this kernel's intensity (1.0 = on the roof)."""
    achieved = _positive("flops", flops) / _positive("seconds", seconds)
    return achieved / attainable(arithmetic_intensity(flops, bytes_moved), peak_flops, bandwidth)


# ---------------------------------------------------------------------------------------------------- costs
@dataclass(frozen=True)
class Cost:
    """FLOPs and minimum main-memory bytes of one operation (each input read once, each output written once)."""
    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        return arithmetic_intensity(self.flops, self.bytes)

    def __iter__(self):  # allows `flops, nbytes = gemm_cost(...)`
        return iter((self.flops, self.bytes))


def vector_add_cost(n: int, dtype="fp32") -> Cost:
    """c = a + b on n elements: n FLOPs; read a and b, write c."""
    _dims(n=n)
    b = dtype_bytes(dtype)
    return Cost(n, 3 * n * b)


def gemm_cost(m: int, n: int, k: int, dtype="bf16") -> Cost:
    """C (m x n) = A (m x k) @ B (k x n): 2*m*n*k FLOPs; read A and B once, write C once."""
    _dims(m=m, n=n, k=k)
    b = dtype_bytes(dtype)
    return Cost(2 * m * n * k, (m * k + k * n + m * n) * b)


SOFTMAX_FLOPS_PER_ELEMENT = 5  # max, subtract, exp, sum, divide (exp counted as one FLOP)


def softmax_cost(rows: int, cols: int, dtype="fp32") -> Cost:
    """Row softmax of a rows x cols matrix: 5 FLOPs per element; read x once, write y once."""
    _dims(rows=rows, cols=cols)
    b = dtype_bytes(dtype)
    return Cost(SOFTMAX_FLOPS_PER_ELEMENT * rows * cols, 2 * rows * cols * b)


LAYERNORM_FLOPS_PER_ELEMENT = 8  # mean 1 (add), variance 3 (sub, square, add), normalise 2 (sub, mul), affine 2


def layernorm_cost(rows: int, cols: int, dtype="fp32") -> Cost:
    """LayerNorm over the last dim with weight and bias: 8 FLOPs per element (per-row sqrt ignored);
    read x, write y, read weight and bias (cols each)."""
    _dims(rows=rows, cols=cols)
    b = dtype_bytes(dtype)
    return Cost(LAYERNORM_FLOPS_PER_ELEMENT * rows * cols, (2 * rows * cols + 2 * cols) * b)


def attention_cost(batch: int, heads: int, seq: int, head_dim: int, dtype="bf16") -> Cost:
    """Naive attention O = softmax(Q K^T / sqrt(d)) V, three kernels with S and P stored in main memory.

    FLOPs per (batch, head): Q K^T 2*s*s*d, P V 2*s*s*d, softmax 5*s*s (the scale is folded into Q, not counted).
    Bytes per (batch, head): Q K^T reads Q, K (2*s*d) and writes S (s*s); softmax reads S and writes P (2*s*s);
    P V reads P (s*s) and V (s*d) and writes O (s*d): 4*s*d + 4*s*s elements.
    """
    _dims(batch=batch, heads=heads, seq=seq, head_dim=head_dim)
    b = dtype_bytes(dtype)
    bh, s, d = batch * heads, seq, head_dim
    return Cost(bh * (4 * s * s * d + SOFTMAX_FLOPS_PER_ELEMENT * s * s), bh * (4 * s * d + 4 * s * s) * b)


OP_SHAPES = {"vector_add": ("n",), "gemm": ("m", "n", "k"), "softmax": ("rows", "cols"),
             "layernorm": ("rows", "cols"), "attention": ("batch", "heads", "seq", "head_dim")}
_OP_COSTS = {"vector_add": vector_add_cost, "gemm": gemm_cost, "softmax": softmax_cost,
             "layernorm": layernorm_cost, "attention": attention_cost}


def op_cost(op: str, shape, dtype="bf16") -> Cost:
    """The Cost of operation `op` (a key of OP_SHAPES) on `shape`, the tuple of its dimensions in OP_SHAPES order."""
    if op not in OP_SHAPES:
        raise ValueError(f"op={op!r} is not an operation here; allowed: {', '.join(OP_SHAPES)}")
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    if len(shape) != len(OP_SHAPES[op]):
        raise ValueError(f"shape={shape!r} for {op} must be ({', '.join(OP_SHAPES[op])})")
    return _OP_COSTS[op](*shape, dtype)


def predict_op(op: str, shape, dtype, peak_flops: float, bandwidth: float) -> dict:
    """The roofline's prediction for one operation on one roof (peak FLOP/s, bandwidth B/s): its FLOPs, minimum
    bytes, intensity, bound, attainable FLOP/s and time in seconds (FLOPs / attainable, i.e. the slower of
    FLOPs / peak and bytes / bandwidth). The reference of lab 02's predictor exercise."""
    cost = op_cost(op, shape, dtype)
    rate = attainable(cost.intensity, peak_flops, bandwidth)
    return {"flops": cost.flops, "bytes": cost.bytes, "intensity": cost.intensity,
            "bound": bound(cost.intensity, peak_flops, bandwidth), "attainable": rate, "seconds": cost.flops / rate}


def decode_gemm_intensity(batch: int, k: int, n: int, dtype="bf16") -> float:
    """Intensity of a decode-time matmul: `batch` token vectors (batch x k) times a weight (k x n)."""
    return gemm_cost(batch, n, k, dtype).intensity


def critical_batch(peak_flops: float, bandwidth: float, k: int = 8192, n: int = 8192, dtype="bf16") -> int:
    """Smallest batch at which a decode matmul (batch x k) @ (k x n) reaches the ridge point (compute-bound).

    Solves 2*B*k*n / (b*(B*k + k*n + B*n)) >= R for the smallest integer B; raises ValueError when no batch gets
    there (the ridge is above the weight-only limit 2*k*n / (b*(k+n))).
    """
    _dims(k=k, n=n)
    r, b = ridge_point(peak_flops, bandwidth), dtype_bytes(dtype)
    denom = 2 * k * n - r * b * (k + n)
    if denom <= 0:
        raise ValueError(f"no batch makes a ({k} x {n}) {dtype} decode matmul compute-bound at ridge {r:.1f} FLOP/B: "
                         f"its intensity never exceeds {2 * k * n / (b * (k + n)):.1f} FLOP/B")
    batch = max(1, math.ceil(r * b * k * n / denom - 1e-9))
    while decode_gemm_intensity(batch, k, n, dtype) < r:  # guard against rounding at the boundary
        batch += 1
    return batch


# ---------------------------------------------------------------------------------------------------- roofs
@dataclass(frozen=True)
class Roof:
    """One roofline: a compute peak (FLOP/s) and a memory bandwidth (B/s), with a name and a line style."""
    name: str
    peak_flops: float  # FLOP/s
    bandwidth: float  # bytes/s
    kind: str = "datasheet"  # "datasheet" or "measured": measured roofs are drawn solid, datasheet ones dashed

    def __post_init__(self):
        _positive("peak_flops", self.peak_flops)
        _positive("bandwidth", self.bandwidth)
        if self.kind not in ("datasheet", "measured"):
            raise ValueError(f"kind={self.kind!r}; allowed: 'datasheet', 'measured'")

    @property
    def ridge(self) -> float:
        return ridge_point(self.peak_flops, self.bandwidth)

    def attainable(self, intensity):
        return attainable(intensity, self.peak_flops, self.bandwidth)

    def bound(self, intensity: float) -> str:
        return bound(intensity, self.peak_flops, self.bandwidth)

    def fraction(self, flops: float, bytes_moved: float, seconds: float) -> float:
        return fraction_of_attainable(flops, bytes_moved, seconds, self.peak_flops, self.bandwidth)

    def critical_batch(self, k: int = 8192, n: int = 8192, dtype="bf16") -> int:
        """Smallest batch at which a (batch x k) @ (k x n) decode matmul reaches this roof's ridge."""
        return critical_batch(self.peak_flops, self.bandwidth, k, n, dtype)

    @classmethod
    def datasheet(cls, gpu_id: str, dtype: str = "bf16", sparse: bool = False) -> "Roof":
        """The published roof of a GPU in data/hardware.json: dense tensor peak (by default) and HBM bandwidth."""
        from common.facts import hardware
        g = hardware.gpu(gpu_id)
        peak = hardware.peak_tflops(g.id, dtype, sparse) * 1e12
        d = hardware.normalize_dtype(dtype)
        return cls(f"{g.id} {d}{' sparse' if sparse else ''} (datasheet)", peak, g.hbm_bandwidth_tbs * 1e12)

    @classmethod
    def from_ceilings(cls, copy, matmul, name: str | None = None) -> "Roof":
        """From common.core.ceilings measurements: copy bandwidth (GB/s) and matmul rate (GFLOP/s)."""
        if getattr(copy, "unit", "GB/s") != "GB/s" or getattr(matmul, "unit", "GFLOP/s") != "GFLOP/s":
            raise ValueError(f"expected a GB/s copy ceiling and a GFLOP/s matmul ceiling, got {copy.unit!r} and "
                             f"{matmul.unit!r}")
        return cls(name or f"measured ({matmul.detail.split(',')[0]})", matmul.value * 1e9, copy.value * 1e9,
                   kind="measured")

    @classmethod
    def from_profile(cls, prof, name: str | None = None) -> "Roof":
        """The roof of a saved machine profile (common.core.ceilings.machine_profile)."""
        return cls.from_ceilings(prof.copy, prof.matmul, name or f"measured ({prof.device}, {prof.threads} threads)")

    @classmethod
    def measured(cls, copy_bytes: int | None = None, matmul_n: int | None = None, device: str | None = None,
                 min_run_time: float = 0.2, name: str | None = None) -> "Roof":
        """Measure this device's roof now with common.core.ceilings (copy bandwidth, square matmul rate)."""
        from common.core import ceilings
        copy = ceilings.measure_copy_bandwidth(copy_bytes, device, min_run_time)
        mm = ceilings.measure_matmul_rate(matmul_n, device=device, min_run_time=min_run_time)
        return cls.from_ceilings(copy, mm, name)


def gpu_roofs(gpu_id: str, dtypes: Sequence[str] | None = None, sparse: bool = False) -> list[Roof]:
    """One datasheet roof per supported dtype of a GPU (several compute ceilings under one HBM slope)."""
    from common.facts import hardware
    dtypes = list(dtypes) if dtypes is not None else hardware.supported_dtypes(gpu_id)
    return [Roof.datasheet(gpu_id, d, sparse) for d in dtypes]


# ---------------------------------------------------------------------------------------------------- points
@dataclass(frozen=True)
class Point:
    """A kernel on the roofline: its intensity and, if measured, its achieved FLOP/s (else drawn on the roof)."""
    label: str
    intensity: float  # FLOP/B
    flops_per_s: float | None = None  # achieved; None = a prediction, placed on the highest roof

    @classmethod
    def from_cost(cls, label: str, cost: Cost, seconds: float | None = None) -> "Point":
        rate = None if seconds is None else cost.flops / _positive("seconds", seconds)
        return cls(label, cost.intensity, rate)


def _as_point(p) -> Point:
    if isinstance(p, Point):
        return p
    if isinstance(p, dict):
        return Point(p["label"], float(p["intensity"]), p.get("flops_per_s"))
    if isinstance(p, (tuple, list)) and len(p) in (2, 3):
        return Point(str(p[0]), float(p[1]), None if len(p) == 2 or p[2] is None else float(p[2]))
    raise ValueError(f"point {p!r} is not a Point, a dict with label/intensity[/flops_per_s], or a tuple "
                     f"(label, intensity[, flops_per_s])")


# ---------------------------------------------------------------------------------------------------- plot
def _unit(max_flops: float) -> tuple[float, str]:
    for scale, name in ((1e15, "PFLOP/s"), (1e12, "TFLOP/s"), (1e9, "GFLOP/s")):
        if max_flops >= 10 * scale or scale == 1e9:
            return scale, name
    return 1e9, "GFLOP/s"


def _num(v: float) -> str:
    """3 significant digits without exponents for the sizes on a roofline: 1,979 / 67 / 4.8 / 0.083."""
    if v >= 100:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def plot(ceilings: Iterable[Roof], points: Iterable = (), ax=None, title: str | None = None,
         xlim: tuple[float, float] | None = None, ylim: tuple[float, float] | None = None, legend: bool = True,
         place_on: Roof | None = None):
    """Draw roofs (dashed: datasheet, solid: measured) and labelled kernel points on log-log axes; return the axes.

    ceilings: Roof objects. points: Point objects, dicts or tuples (label, intensity[, achieved FLOP/s]); a point
    without an achieved rate is drawn hollow at its intensity on `place_on` (the roof of its dtype; default: the
    highest roof drawn), a prediction. Labels of points close together are stacked so they do not overlap. Pass `ax`
    to draw into a subplot.
    """
    import numpy as np

    from common.core import plots
    roofs = list(ceilings)
    if not roofs:
        raise ValueError("ceilings is empty: pass at least one Roof (Roof.datasheet(...) or Roof.measured())")
    for r in roofs:
        if not isinstance(r, Roof):
            raise ValueError(f"ceilings must hold Roof objects, got {type(r).__name__}")
    pts = [_as_point(p) for p in points]
    if ax is None:
        _, ax = plots.figure(logx=True, logy=True)
    else:
        ax.set_xscale("log")
        ax.set_yscale("log")
    ridges = [r.ridge for r in roofs]
    xs_pts = [p.intensity for p in pts if p.intensity > 0]
    lo = min(ridges + xs_pts) / 30
    hi = max(ridges + xs_pts) * 30
    if xlim:
        lo, hi = xlim
    scale, unit = _unit(max(r.peak_flops for r in roofs))
    x = np.logspace(math.log10(lo), math.log10(hi), 256)
    colors = plots.PALETTE
    for i, r in enumerate(roofs):
        style = "-" if r.kind == "measured" else "--"
        ax.plot(x, r.attainable(x) / scale, style, color=colors[i % len(colors)], lw=2 if r.kind == "measured" else 1.5,
                label=f"{r.name}: {_num(r.peak_flops / scale)} {unit}, {_num(r.bandwidth / 1e9)} GB/s, "
                      f"ridge {_num(r.ridge)} FLOP/B")
        ax.plot([r.ridge], [r.peak_flops / scale], "o", color=colors[i % len(colors)], ms=4)
    if place_on is not None and not isinstance(place_on, Roof):
        raise ValueError(f"place_on must be a Roof (the roof predictions sit on), got {type(place_on).__name__}")
    placed = []
    for p in pts:
        if p.flops_per_s is not None:
            y = p.flops_per_s
        elif place_on is not None:
            y = float(place_on.attainable(p.intensity))
        else:
            y = max(r.attainable(p.intensity) for r in roofs)
        hollow = p.flops_per_s is None
        ax.plot([p.intensity], [y / scale], "D" if not hollow else "o", ms=7, color="black",
                mfc="none" if hollow else "black")
        near = sum(1 for (px, py) in placed if abs(math.log10(px / p.intensity)) < 0.35
                   and abs(math.log10(py / y)) < 0.35)
        placed.append((p.intensity, y))
        ax.annotate(p.label, (p.intensity, y / scale), textcoords="offset points", xytext=(6, 6 - 11 * near),
                    fontsize=8)
    ax.set_xlim(lo, hi)
    if ylim:
        ax.set_ylim(*ylim)
    ax.set_xlabel("arithmetic intensity (FLOP per byte of main memory)")
    ax.set_ylabel(f"attainable performance ({unit})")
    if title:
        ax.set_title(title)
    if legend:
        ax.legend(loc="upper left", fontsize=7)
    return ax


def plot_side_by_side(datasheet: Iterable[Roof], measured: Iterable[Roof], points: Iterable = (),
                      titles: tuple[str, str] = ("datasheet ceilings", "measured ceilings")):
    """Two panels: datasheet roofs (with the points placed as predictions) and measured roofs (with the points as
    measured). Returns the figure; show it with plots.show(fig)."""
    import matplotlib.pyplot as plt

    from common.core import plots
    plots.use_house_style()
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.6))
    pts = [_as_point(p) for p in points]
    plot(datasheet, [Point(p.label, p.intensity) for p in pts], ax=a, title=titles[0])
    plot(measured, pts, ax=b, title=titles[1])
    return fig
