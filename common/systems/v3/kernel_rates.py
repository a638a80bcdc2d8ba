"""Published kernel rates at DeepSeek-V3's shapes, from data/kernel_rates.json: DeepGEMM's FP8 GEMM tables (forward,
weight gradient), FlashAttention-3's forward and backward, and the HBM bound of memory-bound kernels.

A shape that is not in a table gets the rate of its **nearest tabled row**: the smallest sum of |log2(x / x_row)|
over the dimensions (M, N, K, and the number of groups for grouped GEMMs). No interpolation and no fit: the row used
is returned with the rate, so a lab can show it. How the three GEMMs of a linear layer Y[M, N] = X[M, K] W[N, K]^T
map onto the tables:
- forward: (M, N, K) in the forward table (DeepGEMM's first release; grouped rows for the routed experts);
- dgrad dX[M, K] = dY[M, N] W[N, K]: a forward-kind GEMM of shape (M, K, N), looked up in the same table;
- wgrad dW = dY^T X over the M tokens: DeepGEMM's weight-gradient table, whose rows are (K, N, tokens) -- the
  forward weight transposed, reduced over the tokens.
The tables were measured with all 132 SMs of an H800; `sm_share` scales a rate to the SMs a kernel gets (112 while
DeepEP's kernels hold 20). `generation="cutlass"`: the internal CUTLASS-based kernels DeepGEMM was measured against
(the ones DeepSeek's trace ran) -- each forward row divided by its own `speedup_vs_internal_cutlass`, the wgrad rates
by PR #95's ~20%. On another GPU the rate scales with its dense peak for that dtype (an assumption: the
same efficiency), and memory-bound kernels run at its HBM bandwidth.

Attention: FlashAttention-3's BF16 figures at the tabled sequence length nearest `seq` (4,096 is tabled), head dim
128 (MLA's 192/128 heads are not tabled; larger heads run faster, so this understates the rate); the causal
backward, which the paper does not plot, is the non-causal backward scaled by causal / non-causal forward at the
same length. FLOPs as FlashAttention counts them: 2 s^2 h (d_qk + d_v), halved with the causal mask; backward 2.5x.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache

from common.core.env import REPO_ROOT
from common.core.validate import number
from common.facts import hardware

RATES_PATH = REPO_ROOT / "data" / "kernel_rates.json"
TABLE_GPU = "H800-SXM"       # where DeepGEMM measured its tables
KINDS = ("fwd", "dgrad", "wgrad")
GENERATIONS = ("deepgemm", "cutlass")


@lru_cache(maxsize=1)
def load_rates() -> dict:
    return json.loads(RATES_PATH.read_text())


def source(key: str) -> str:
    """'title (url, date)' of a source key of data/kernel_rates.json."""
    src = load_rates()["sources"].get(key)
    if src is None:
        known = ", ".join(load_rates()["sources"])
        raise ValueError(f"{key!r} is not a source in data/kernel_rates.json; known: {known}")
    return f"{src['title']} ({src['url']}, {src['date']})"


@dataclass(frozen=True)
class Rate:
    """A published rate and where it came from."""
    tflops: float            # at the kernel's SM share, on the kernel's GPU
    table: str               # "normal", "grouped_contiguous", "wgrad dense", "wgrad grouped", "fa3 forward", ...
    row: tuple               # the tabled row used
    distance: float          # 0 for an exact match (sum of |log2| over the dimensions)
    tabled_tflops: float     # the row's figure (132 SMs, H800)

    def describe(self) -> str:
        exact = "exact" if self.distance == 0 else f"nearest, {self.distance:.2f} log2 away"
        return f"{self.table} {self.row} {self.tabled_tflops:g} TFLOP/s ({exact})"


def _share(sm_share) -> float:
    s = number("sm_share", sm_share, meaning="a fraction of the SMs in (0, 1]")
    if s > 1:
        raise ValueError(f"sm_share={sm_share!r} is not allowed; allowed: a fraction of the SMs in (0, 1]")
    return s


def _nearest(rows, dims, key):
    """The row (and its distance) minimising sum |log2(d / row_d)| over `key(row)` aligned with `dims`."""
    best, best_d = None, math.inf
    for row in rows:
        d = sum(abs(math.log2(a / b)) for a, b in zip(dims, key(row)))
        if d < best_d - 1e-12:
            best, best_d = row, d
    return best, best_d


@lru_cache(maxsize=64)
def _peak(gpu_id: str, dtype: str) -> float:
    return hardware.peak_tflops(gpu_id, dtype)


@lru_cache(maxsize=16)
def hbm_tbs(gpu_id: str) -> float:
    return hardware.gpu(gpu_id).hbm_bandwidth_tbs


@lru_cache(maxsize=16)
def sms(gpu_id: str) -> int:
    return hardware.gpu(gpu_id).sms


def table_peak(dtype: str = "fp8") -> float:
    """The dense peak of the GPU the tables were measured on (H800)."""
    return _peak(TABLE_GPU, dtype)


def peak_scale(gpu_id: str, dtype: str = "fp8") -> float:
    """How much faster than the H800 the tables' kernels are assumed to run on `gpu_id` (dense peak ratio)."""
    return _peak(gpu_id, dtype) / _peak(TABLE_GPU, dtype)


def gemm_rate(m, n, k, kind: str = "fwd", groups: int = 1, sm_share: float = 1.0, gpu_id: str = TABLE_GPU,
              generation: str = "deepgemm") -> Rate:
    """DeepGEMM's FP8 rate for the forward, dgrad or wgrad GEMM of a linear layer Y[m, n] = X[m, k] W[n, k]^T
    (grouped: `groups` experts of `m` rows each), at `sm_share` of the SMs of `gpu_id` (or, with
    `generation="cutlass"`, the rate of the internal kernels DeepGEMM was measured against)."""
    m, n, k = (number(nm, v) for nm, v in (("m", m), ("n", n), ("k", k)))
    g = number("groups", groups)
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} is not allowed; allowed: {', '.join(KINDS)}")
    if generation not in GENERATIONS:
        raise ValueError(f"generation={generation!r} is not allowed; allowed: {', '.join(GENERATIONS)}")
    old = generation == "cutlass"
    scale = _share(sm_share) * peak_scale(gpu_id, "fp8")
    r = load_rates()
    if kind == "wgrad":
        table = r["deepgemm_wgrad"]
        if groups > 1:
            row, d = _nearest(table["grouped"], (g, k, n, m), lambda x: x[:4])
            name, tf = "wgrad grouped", row[4]
        else:
            row, d = _nearest(table["dense"], (k, n, m), lambda x: x[:3])
            name, tf = "wgrad dense", row[3]
        tf = tf / table["speedup_vs_internal_cutlass"] if old else tf
    else:
        shape = (m, n, k) if kind == "fwd" else (m, k, n)
        table = r["deepgemm_fp8"]
        if groups > 1:
            row, d = _nearest(table["grouped_contiguous"], (g,) + shape, lambda x: x[:4])
            name, tf = "grouped_contiguous", row[4] / (row[6] if old else 1)
        else:
            row, d = _nearest(table["normal"], shape, lambda x: x[:3])
            name, tf = "normal", row[3] / (row[5] if old else 1)
    name = f"{name} (internal CUTLASS)" if old else name
    return Rate(tf * scale, name, tuple(row), d, float(tf))


def gemm_seconds(m, n, k, kind: str = "fwd", groups: int = 1, sm_share: float = 1.0, gpu_id: str = TABLE_GPU,
                 generation: str = "deepgemm"):
    """(seconds, Rate) of that GEMM: 2 m n k x groups FLOPs at its published rate."""
    rate = gemm_rate(m, n, k, kind, groups, sm_share, gpu_id, generation)
    return 2.0 * m * n * k * groups / (rate.tflops * 1e12), rate


def bf16_gemm_rate(m, n, k, sm_share: float = 1.0, gpu_id: str = TABLE_GPU, efficiency: float | None = None) -> Rate:
    """BF16 GEMMs (router, output head). No BF16 GEMM rate was published for these shapes, so an assumption: by
    default the BF16 dense peak times the fraction of the FP8 peak DeepGEMM reaches at the nearest forward shape (the
    low end of lab 13's range); with `efficiency`, that fraction of the BF16 dense peak (the high end: 0.75, what
    FlashAttention-3's BF16 kernels reach on the same SMs)."""
    if efficiency is not None:
        eff = number("efficiency", efficiency, meaning="a fraction of the BF16 dense peak in (0, 1]")
        if eff > 1:
            raise ValueError(f"efficiency={efficiency!r} is not allowed; allowed: a fraction in (0, 1]")
        tf = eff * _peak(gpu_id, "bf16") * _share(sm_share)
        return Rate(tf, f"bf16 at {eff:g} of its dense peak (assumed)", (), 0.0, eff * _peak(TABLE_GPU, "bf16"))
    fp8 = gemm_rate(m, n, k, "fwd", 1, 1.0, TABLE_GPU)
    eff = fp8.tabled_tflops / _peak(TABLE_GPU, "fp8")
    tf = eff * _peak(gpu_id, "bf16") * _share(sm_share)
    return Rate(tf, "bf16 at the FP8 table's efficiency", fp8.row, fp8.distance, fp8.tabled_tflops)


def attention_flops(seq, heads, d_qk, d_v, causal: bool = True, direction: str = "forward") -> float:
    """FlashAttention's count for one sequence: 2 s^2 h (d_qk + d_v), halved if causal; backward 2.5x forward."""
    if direction not in ("forward", "backward"):
        raise ValueError(f"direction={direction!r} is not allowed; allowed: 'forward', 'backward'")
    f = 2.0 * number("seq", seq) ** 2 * number("heads", heads) * (number("d_qk", d_qk) +
                                                                          number("d_v", d_v))
    f = f / 2 if causal else f
    return 2.5 * f if direction == "backward" else f


def attention_rate(direction: str, seq, causal: bool = True, sm_share: float = 1.0, gpu_id: str = TABLE_GPU,
                   head_dim: int = 128) -> Rate:
    """FlashAttention-3's BF16 TFLOP/s (H100 SXM5) for `direction` at the tabled length nearest `seq`."""
    fa = load_rates()["flash_attention_3"]
    lens = fa["seqlens"]
    number("seq", seq)
    i = min(range(len(lens)), key=lambda j: abs(math.log2(seq / lens[j])))
    dist = abs(math.log2(seq / lens[i]))
    hd = str(head_dim)
    scale = _share(sm_share) * peak_scale(gpu_id, "bf16")
    if direction == "forward":
        panel = "causal" if causal else "noncausal"
        if hd not in fa["forward"][panel]:
            raise ValueError(f"head_dim={head_dim!r} is not tabled; tabled: {', '.join(fa['forward'][panel])}")
        tf = fa["forward"][panel][hd][i]
        return Rate(tf * scale, f"fa3 forward {panel} hdim {hd}", (lens[i],), dist, float(tf))
    if direction != "backward":
        raise ValueError(f"direction={direction!r} is not allowed; allowed: 'forward', 'backward'")
    if hd not in fa["backward"]["noncausal"]:
        raise ValueError(f"head_dim={head_dim!r} is not tabled for the backward; tabled: "
                         f"{', '.join(fa['backward']['noncausal'])}")
    tf = fa["backward"]["noncausal"][hd][i]
    if causal:
        tf = tf * fa["forward"]["causal"][hd][i] / fa["forward"]["noncausal"][hd][i]
    label = "fa3 backward " + ("causal (non-causal x fwd causal/non-causal)" if causal else "noncausal") + f" hdim {hd}"
    return Rate(tf * scale, label, (lens[i],), dist, float(tf))


def hbm_seconds(nbytes, gpu_id: str = TABLE_GPU) -> float:
    """A memory-bound kernel: bytes read + written over the datasheet HBM bandwidth (a lower bound on its time)."""
    return number("nbytes", nbytes, strict=False) / (hbm_tbs(gpu_id) * 1e12)
