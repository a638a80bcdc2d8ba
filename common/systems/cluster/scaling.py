"""The arithmetic of scale: training FLOPs (6ND), GPU-hours, days, dollars, energy, implied MFU, memory per parameter.

Training FLOPs follow the standard approximation C = 6 N D (Kaplan et al. 2020, section 2.1; Hoffmann et al. 2022):
per token, the forward pass costs about 2 FLOPs per parameter (a multiply and an add) and the backward pass twice
that. Assumptions: N counts the parameters a token actually touches (the *activated* ones for a mixture of experts),
embeddings and attention's sequence-length term are ignored, and no activation recomputation is counted (full
recomputation would add one more forward: 8 N D). Published facts come from data/claims.json; GPU peaks from
common.facts.hardware (dense unless asked otherwise -- MFU is always measured against the dense peak).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache

from common.core.env import REPO_ROOT
from common.core.validate import number

CLAIMS_PATH = REPO_ROOT / "data" / "claims.json"
SECONDS_PER_HOUR = 3600.0

# Bytes per parameter of what training keeps per parameter (ZeRO paper, arXiv:1910.02054, section 3.1):
# mixed-precision Adam keeps BF16/FP16 weights (2) and gradients (2) plus an FP32 master copy (4) and the two FP32
# moments m and v (4 + 4) = 16 bytes.
ADAM_MIXED_BYTES = {"weights": 2, "grads": 2, "master": 4, "adam_m": 4, "adam_v": 4}
# What the training state costs per parameter under other choices (weights + grads + optimizer), for comparison.
# adam_mixed: the classic recipe above; adam_fp8: an aggressive low-precision recipe with FP8 weights and gradients,
# an FP32 master copy and BF16 moments (DeepSeek-V3 keeps its moments in BF16); adafactor: BF16 weights and
# gradients, an FP32 master, a factored second moment (~0.1 B/param) and no first moment; sgd: BF16 weights and
# gradients with an FP32 master copy, no optimizer state.
STATE_BYTES = {"adam_mixed": 16.0, "adam_fp8": 1 + 1 + 4 + 2 + 2, "adafactor": 2 + 2 + 4 + 0.1, "sgd": 2 + 2 + 4}
WEIGHT_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp4": 0.5}


# ---------------------------------------------------------------- input checks

def _positive(name: str, value) -> float:
    return number(name, value)


def check_mfu(mfu) -> float:
    """MFU as a fraction in (0, 1]; a percentage such as 40 is refused with a hint."""
    try:
        v = float(mfu)
    except (TypeError, ValueError):
        raise ValueError(f"mfu={mfu!r} is not a number; allowed: a fraction in (0, 1]") from None
    if not (0 < v <= 1):
        hint = f" (did you mean {v / 100:g}? give MFU as a fraction, not a percentage)" if 1 < v <= 100 else ""
        raise ValueError(f"mfu={mfu!r} is outside (0, 1]{hint}")
    return v


def _hardware():
    from common.facts import hardware
    return hardware


def known_gpus() -> list[str]:
    try:
        return list(_hardware().gpu_ids())
    except Exception:
        return []


def check_gpu(gpu_id: str) -> str:
    """Raise ValueError naming `gpu_id` and the GPUs data/ knows, unless it is one of them."""
    ids = known_gpus()
    if gpu_id not in ids:
        raise ValueError(f"gpu_id={gpu_id!r} is not a GPU in data/; allowed: {', '.join(ids) or '(none loaded)'}")
    return gpu_id


def peak_tflops(gpu_id: str, dtype: str = "bf16", sparse: bool = False) -> float:
    """Datasheet tensor peak from common.facts.hardware (dense by default); clear errors for unknown ids and dtypes."""
    check_gpu(gpu_id)
    hw = _hardware()
    try:
        return float(hw.peak_tflops(gpu_id, dtype, sparse=sparse))
    except Exception as exc:  # UnsupportedDtype and friends, re-raised as a ValueError that says what is allowed
        raise ValueError(f"dtype={dtype!r} on {gpu_id}: {exc}") from None


def hbm_gb(gpu_id: str) -> float:
    check_gpu(gpu_id)
    return float(_hardware().gpu(gpu_id).hbm_gb)


def tdp_w(gpu_id: str) -> float:
    check_gpu(gpu_id)
    return float(_hardware().gpu(gpu_id).tdp_w)


# ---------------------------------------------------------------- published figures

@lru_cache(maxsize=1)
def load_claims() -> dict:
    return json.loads(CLAIMS_PATH.read_text())


def claim(group: str, name: str):
    """The value of a published figure, e.g. claim("deepseek_v3", "gpu_hours_total") -> 2788000.0."""
    data = load_claims()["claims"]
    if group not in data:
        raise ValueError(f"claim group {group!r} is not in data/claims.json; allowed: {', '.join(sorted(data))}")
    if name not in data[group]:
        raise ValueError(f"claim {name!r} is not in group {group!r}; allowed: {', '.join(sorted(data[group]))}")
    return data[group][name]["value"]


def claim_source(group: str, name: str) -> str:
    """'title (url, date)' of the source of a published figure."""
    entry = load_claims()["claims"][group][name]
    src = load_claims()["sources"][entry["source"]]
    return f"{src['title']} ({src['url']}, {src['date']})"


# ---------------------------------------------------------------- FLOPs, time, money, energy

def train_flops(params, tokens, flops_per_param_token: float = 6.0) -> float:
    """C = 6 N D: training FLOPs for `params` (activated) parameters on `tokens` tokens."""
    return _positive("flops_per_param_token", flops_per_param_token) * _positive("params", params) * \
        _positive("tokens", tokens)


def tokens_for_flops(flops, params, flops_per_param_token: float = 6.0) -> float:
    """The D that makes 6 N D equal `flops`."""
    return _positive("flops", flops) / (_positive("flops_per_param_token", flops_per_param_token) *
                                        _positive("params", params))


def gpu_hours(flops, gpu_id: str, mfu, dtype: str = "bf16") -> float:
    """GPU-hours to do `flops` at a fraction `mfu` of the GPU's dense `dtype` peak."""
    rate = peak_tflops(gpu_id, dtype, sparse=False) * 1e12 * check_mfu(mfu)
    return _positive("flops", flops) / rate / SECONDS_PER_HOUR


def implied_mfu(flops, hours, peak_tflops_dense) -> float:
    """The model FLOPs utilisation that `flops` done in `hours` GPU-hours implies: achieved / dense peak."""
    achieved = _positive("flops", flops) / (_positive("gpu_hours", hours) * SECONDS_PER_HOUR)
    return achieved / (_positive("peak_tflops_dense", peak_tflops_dense) * 1e12)


def wall_days(hours, gpus) -> float:
    """Calendar days for `hours` GPU-hours spread over `gpus` GPUs (perfect scaling)."""
    return _positive("gpu_hours", hours) / _positive("gpus", gpus) / 24.0


def cost_usd(hours, usd_per_gpu_hour) -> float:
    return _positive("gpu_hours", hours) * _positive("usd_per_gpu_hour", usd_per_gpu_hour)


def energy_mwh(hours, watts_per_gpu, pue: float = 1.0) -> float:
    """Energy at the wall: GPU-hours x watts per GPU x PUE, in MWh (1 MWh = 1e6 Wh)."""
    pue = _positive("pue", pue)
    if pue < 1:
        raise ValueError(f"pue={pue!r} is below 1; a power usage effectiveness is >= 1 (1.0 = no overhead)")
    return _positive("gpu_hours", hours) * _positive("watts_per_gpu", watts_per_gpu) * pue / 1e6


# ---------------------------------------------------------------- memory

def adam_state_bytes(params) -> dict:
    """Per-part bytes of mixed-precision Adam training state for `params` parameters, and the total (16 B/param)."""
    n = _positive("params", params)
    parts = {k: b * n for k, b in ADAM_MIXED_BYTES.items()}
    parts["total"] = sum(parts.values())
    return parts


def weight_bytes(params, precision: str = "bf16") -> float:
    if precision not in WEIGHT_BYTES:
        raise ValueError(f"precision={precision!r} is not known; allowed: {', '.join(WEIGHT_BYTES)}")
    return _positive("params", params) * WEIGHT_BYTES[precision]


def state_bytes(params, recipe: str = "adam_mixed") -> float:
    """Bytes of weights + gradients + optimizer state under a training `recipe` (see STATE_BYTES)."""
    if recipe not in STATE_BYTES:
        raise ValueError(f"recipe={recipe!r} is not known; allowed: {', '.join(STATE_BYTES)}")
    return _positive("params", params) * STATE_BYTES[recipe]


def gpus_to_hold(total_bytes, gpu_id: str, usable_fraction: float = 1.0) -> int:
    """The fewest GPUs whose HBM (GB = 1e9 bytes, as datasheets count) holds `total_bytes`."""
    frac = _positive("usable_fraction", usable_fraction)
    if frac > 1:
        raise ValueError(f"usable_fraction={usable_fraction!r} is above 1; allowed: (0, 1]")
    return math.ceil(_positive("total_bytes", total_bytes) / (hbm_gb(gpu_id) * 1e9 * frac))


def racks_to_hold(total_bytes, gpus_per_rack: int = 72, gpu_id: str = "GB200", usable_fraction: float = 1.0) -> int:
    """NVL72 racks (72 GPUs each) needed just to hold `total_bytes` in HBM."""
    return math.ceil(gpus_to_hold(total_bytes, gpu_id, usable_fraction) / _positive("gpus_per_rack", gpus_per_rack))


# ---------------------------------------------------------------- a whole plan

@dataclass
class TrainingPlan:
    params: float          # total parameters
    active_params: float   # parameters each token touches (= params for a dense model)
    tokens: float
    gpu_id: str
    dtype: str
    gpus: int
    mfu: float
    usd_per_gpu_hour: float
    flops: float
    gpu_hours: float
    days: float
    cost_usd: float
    energy_mwh: float
    weights_tb: float
    state_tb: float
    gpus_to_hold_state: int

    def rows(self) -> list[tuple[str, str]]:
        from common.core.claims import readable
        return [("training FLOPs (6ND)", readable(self.flops)),
                ("GPU-hours", readable(self.gpu_hours)),
                (f"days on {self.gpus:,} x {self.gpu_id}", f"{self.days:,.1f}"),
                ("cost (USD)", readable(self.cost_usd)),
                ("energy (MWh, GPU TDP only)", f"{self.energy_mwh:,.0f}"),
                ("weights (TB)", f"{self.weights_tb:,.1f}"),
                ("training state (TB)", f"{self.state_tb:,.1f}"),
                ("GPUs just to hold the state", f"{self.gpus_to_hold_state:,}")]


def plan_training(params, tokens, gpu_id: str = "GB200", gpus: int = 100_000, mfu: float = 0.4,
                  dtype: str = "bf16", active_fraction: float = 1.0, usd_per_gpu_hour: float = 2.0,
                  weight_precision: str = "bf16", recipe: str = "adam_mixed", pue: float = 1.0) -> TrainingPlan:
    """Everything lab 10 asks of a training run, from its size, the hardware and an assumed MFU."""
    frac = _positive("active_fraction", active_fraction)
    if frac > 1:
        raise ValueError(f"active_fraction={active_fraction!r} is above 1; allowed: (0, 1]")
    active = _positive("params", params) * frac
    flops = train_flops(active, tokens)
    hours = gpu_hours(flops, gpu_id, mfu, dtype)
    state = state_bytes(params, recipe)
    return TrainingPlan(params=float(params), active_params=active, tokens=float(tokens), gpu_id=gpu_id, dtype=dtype,
                        gpus=int(_positive("gpus", gpus)), mfu=check_mfu(mfu),
                        usd_per_gpu_hour=float(usd_per_gpu_hour), flops=flops, gpu_hours=hours,
                        days=wall_days(hours, gpus), cost_usd=cost_usd(hours, usd_per_gpu_hour),
                        energy_mwh=energy_mwh(hours, tdp_w(gpu_id), pue),
                        weights_tb=weight_bytes(params, weight_precision) / 1e12, state_tb=state / 1e12,
                        gpus_to_hold_state=gpus_to_hold(state, gpu_id))


# ---------------------------------------------------------------- lab 10's planning explorer

# the explorer's controls: (low, high, step) sliders and option lists, as widgets.explore takes them. The steps are
# fine enough to type a real run's figures into a slider's box exactly (DeepSeek-V3: 0.671T parameters, 14.8T
# tokens, 5.51% active, 2,048 GPUs; an MFU to 0.01)
PLAN_CONTROLS = {"params_t": (0.001, 1000.0, 0.001), "tokens_t": (0.1, 1000.0, 0.1), "active_pct": (0.01, 100.0, 0.01),
                 "precision": ["bf16", "fp8", "fp4"], "gpu": ["GB200", "B200", "H100-SXM", "H800-SXM"],
                 "gpus": (8, 1_000_000, 1), "mfu": (0.01, 1.0, 0.01), "usd_per_gpu_hour": (0.01, 20.0, 0.01)}
PLAN_DEFAULTS = {"params_t": 100.0, "tokens_t": 29.0, "active_pct": 100.0, "precision": "bf16", "gpu": "GB200",
                 "gpus": 100_000, "mfu": 0.4, "usd_per_gpu_hour": 2.0}
_READOUT = {"params_t": ".3f", "tokens_t": ".1f", "active_pct": ".2f", "mfu": ".2f", "usd_per_gpu_hour": ".2f"}


def plan_controls() -> dict:
    """The explorer's controls as widgets whose boxes show every digit a step allows (a slider's default shows two
    decimals: 0.671 would read 0.67), so a typed value reads as typed; the plain specs without ipywidgets."""
    try:
        import ipywidgets
    except ImportError:
        return dict(PLAN_CONTROLS)
    out = {}
    for name, spec in PLAN_CONTROLS.items():
        if not isinstance(spec, tuple):
            out[name] = spec
        elif isinstance(spec[2], int):
            out[name] = ipywidgets.IntSlider(value=PLAN_DEFAULTS[name], min=spec[0], max=spec[1], step=spec[2],
                                             description=name)
        else:
            out[name] = ipywidgets.FloatSlider(value=PLAN_DEFAULTS[name], min=spec[0], max=spec[1], step=spec[2],
                                               readout_format=_READOUT[name], description=name)
    return out


def snap_controls(values: dict, controls: dict = PLAN_CONTROLS) -> dict:
    """Slider values put back on their step grid: a browser sends 28.999999999999996 for 29 and
    100.00000000000001 for 100, which would fail `active_fraction <= 1`. A value off the range by more than half a
    step, or an option not offered, is a ValueError naming the control."""
    out = {}
    for name, value in values.items():
        spec = controls.get(name)
        if spec is None:
            raise ValueError(f"{name}={value!r} is not a control; controls: {', '.join(controls)}")
        if isinstance(spec, tuple):
            lo, hi, step = spec
            try:
                x = float(value)
            except (TypeError, ValueError):
                raise ValueError(f"{name}={value!r} must be a number in [{lo}, {hi}]") from None
            if not (lo - step / 2 <= x <= hi + step / 2):
                raise ValueError(f"{name}={value!r} is outside [{lo}, {hi}]")
            x = min(hi, max(lo, lo + round((x - lo) / step) * step))
            digits = max(0, -math.floor(math.log10(step)) + 1) if step < 1 else 0
            out[name] = int(round(x)) if isinstance(lo, int) and isinstance(step, int) else round(x, digits)
        else:
            if value not in spec:
                raise ValueError(f"{name}={value!r}; allowed: {', '.join(map(str, spec))}")
            out[name] = value
    return out


def plan_figure(plan: "TrainingPlan", title: str):
    """Days to train against the GPU count at three MFUs, this plan marked. Fixed margins, no tight_layout (which
    can fail inside a widget redraw), so the figure draws the same on every call."""
    from common.core import plots
    fig, ax = plots.figure(title, "GPUs", "days to train", logx=True, logy=True)
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.13, top=0.9)
    counts = [1_000, 3_000, 10_000, 30_000, 100_000, 300_000, 1_000_000]
    peak = peak_tflops(plan.gpu_id, plan.dtype) * 1e12
    for m in (0.2, 0.4, 0.6):
        ax.plot(counts, [plan.flops / (c * peak * m) / 86400 for c in counts], marker="o", label=f"MFU {m:.0%}")
    ax.scatter([plan.gpus], [plan.days], s=120, color="black", zorder=3, label="this plan")
    ax.axhline(365, ls="--", color="gray", label="one year")
    ax.legend(fontsize=8)
    return fig
