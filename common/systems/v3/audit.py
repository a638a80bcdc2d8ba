"""What lab 13's prediction rests on, and how far each judgement call moves it.

- `provenance()`: every input of the prediction, marked *earned* (a published rate, a datasheet or a reported fact,
  used as published), *in-sample* (a structure read from DeepSeek's trace itself: the kernel list, the phase order,
  the 4 + 4-layer pair, the micro-batch) or *assumed* (a judgement call, with the alternative lab 13 tries);
- `JUDGEMENT_CALLS`, `trace_ratio_band()`: the model's F&B pair against the trace's measured step with each judgement
  call flipped alone -- the band of `trace_step_ratio`;
- `deepep_effective_gbps()`: the bytes the model says DeepEP's dispatch and combine send over InfiniBand, over the
  time the trace's transfer kernels ran (notify kernels left out);
- `waterfall_bands()`: each term of the trace-anchored waterfall with the range its judgement calls give;
- `mfu_mixed_peak()`: MFU against the peak of the FLOPs' own mix (FP8 GEMMs; BF16 attention core, router and head),
  where `mfu_fp8` divides every FLOP by the FP8 peak;
- `reconcile()`: the kernel model's share of 180K and the waterfall's, in one identity.
`TARGET`: the one band a prediction must land in against a measurement (within 25%: 0.8-1.25).
Nothing here is fitted: each alternative is a stated, sourced or named value, moved alone.
"""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from common.facts import hardware
from common.systems.v3 import kernels as v3kernels, model as v3model, trace as deepseek_trace, waterfall as v3waterfall

TARGET = (0.8, 1.25)
BF16_HIGH = 0.75  # FlashAttention-3's BF16 kernels reach 75% of the H100's BF16 peak (data: fa3_bf16_utilization)


def in_target(ratio: float) -> bool:
    return TARGET[0] <= ratio <= TARGET[1]


def _defaults(prof, x):
    return (prof if prof is not None else deepseek_trace.load_profile()), (x or v3model.defaults())


def deepep_effective_gbps(prof=None, x: v3model.Inputs | None = None) -> dict:
    """{"dispatch", "combine", "all": GB/s}: the model's InfiniBand bytes of the trace's 4 + 4 layers' DeepEP
    transfers (FP8 dispatch, BF16 combine, node-limited and de-duplicated) over the trace's kernel time for them."""
    prof, x = _defaults(prof, x)
    layer = v3kernels.moe_layer(v3model.config(), v3model.setup(x, 1.0))
    comm = [k for k in layer if k.cls in ("deepep_dispatch", "deepep_combine")]
    ph = deepseek_trace.phases(prof)
    out, total_bytes, total_ms = {}, 0.0, 0.0
    for cls, name in (("deepep_dispatch", "dispatch"), ("deepep_combine", "combine")):
        ks = [k for k in comm if k.cls == cls]
        nbytes = sum(k.bytes * ph[k.phase]["count"] for k in ks)
        ms = sum(ph[k.phase]["classes"].get(cls, 0.0) for k in ks)
        out[name] = nbytes / (ms * 1e-3) / 1e9
        total_bytes, total_ms = total_bytes + nbytes, total_ms + ms
    out["all"] = total_bytes / (total_ms * 1e-3) / 1e9
    out["gb"], out["ms"] = total_bytes / 1e9, total_ms
    return out


def at_trace_bandwidth(x: v3model.Inputs, prof=None) -> v3model.Inputs:
    """`x` with DeepEP's dispatch and combine at the bandwidths the trace's kernels achieved (IB for PP and ZeRO-1
    left at the reported figure)."""
    bw = deepep_effective_gbps(prof, x)
    return replace(x, judgement=tuple(x.judgement) + (("dispatch_gbs", round(bw["dispatch"], 2)),
                                                      ("combine_gbs", round(bw["combine"], 2))))


# name: (what the alternative is, the Setup fields it sets)
JUDGEMENT_CALLS = {
    "no Q/K assembly": ("the 'assemble Q and K' copies left out: a fused kernel could avoid them",
                        (("qk_assembly", False),)),
    "CUTLASS kernels": ("GEMMs at the internal CUTLASS kernels' rates the trace ran (DeepGEMM's rows over their own "
                        "stated speed-up; wgrad over PR #95's 1.2)", (("kernels", "cutlass"),)),
    "BF16 at 75%": ("BF16 GEMMs at 75% of the BF16 peak (FlashAttention-3's utilization) instead of the FP8 table's "
                    "efficiency", (("bf16_efficiency", BF16_HIGH),)),
    "DeepEP as traced": ("DeepEP's dispatch and combine at the bandwidths the trace's kernels achieved, not the "
                         "README's 50-51 GB/s", None),
}


def with_call(x: v3model.Inputs, name: str, prof=None) -> v3model.Inputs:
    """`x` with one judgement call flipped."""
    if name not in JUDGEMENT_CALLS:
        raise ValueError(f"{name!r} is not a judgement call; known: {', '.join(JUDGEMENT_CALLS)}")
    fields = JUDGEMENT_CALLS[name][1]
    return at_trace_bandwidth(x, prof) if fields is None else replace(x, judgement=tuple(x.judgement) + fields)


def trace_ratio_band(prof=None, x: v3model.Inputs | None = None) -> dict:
    """{"central", "rows": [(call, what, ratio)], "low", "high"}: model pair / trace step, each call flipped alone."""
    prof, x = _defaults(prof, x)
    central = v3waterfall.trace_comparison(prof, x)["ratio"]
    rows = [(name, what, v3waterfall.trace_comparison(prof, with_call(x, name, prof))["ratio"])
            for name, (what, _) in JUDGEMENT_CALLS.items()]
    values = [central] + [r[2] for r in rows]
    return {"central": central, "rows": rows, "low": min(values), "high": max(values)}


@lru_cache(maxsize=4)
def _waterfalls(x: v3model.Inputs):
    prof = deepseek_trace.load_profile()
    eff = deepep_effective_gbps(prof, x)["all"]
    runs = {"as stated": v3waterfall.waterfall(prof, x)}
    for name in JUDGEMENT_CALLS:
        runs[name] = v3waterfall.waterfall(prof, with_call(x, name, prof))
    scale = eff / v3model.fact("deepep_ep64_dispatch_gbs")
    runs["lone transfers at the README's rate"] = v3waterfall.waterfall(prof, x, lone_transfer_scale=scale)
    return runs


def waterfall_bands(x: v3model.Inputs | None = None) -> dict:
    """{"terms": [(term, K GPU-h, low, high, the call that gives the low, the one that gives the high)], "total":
    (central, low, high), "unexplained": (central, low, high) as shares of 180K}: each term's range over the judgement
    calls, each flipped alone ("-" where none moves it: the trace's measured step, or no stated alternative)."""
    x = x or v3model.defaults()
    runs = _waterfalls(x)
    central = runs["as stated"]
    terms = []
    for i, (term, value, _) in enumerate(central["terms"]):
        moved = {name: run["terms"][i][1] for name, run in runs.items()}
        if term.startswith("EP imbalance"):  # perfect balance, as the trace simulated it, costs nothing
            moved["perfect balance"] = 0.0
        lo_by, hi_by = min(moved, key=moved.get), max(moved, key=moved.get)
        terms.append((term, value, moved[lo_by], moved[hi_by], lo_by if moved[lo_by] < value - 0.05 else "-",
                      hi_by if moved[hi_by] > value + 0.05 else "-"))
    totals = [run["total_k"] for run in runs.values()] + [central["total_k"] - terms[3][1]]
    reported = central["reported_k"]
    return {"terms": terms, "total": (central["total_k"], min(totals), max(totals)),
            "unexplained": tuple((reported - t) / reported for t in (central["total_k"], max(totals), min(totals)))}


def mfu_mixed_peak(pred) -> float:
    """MFU against the mixed peak: the step's training FLOPs over the time they would take with each FLOP at its
    own precision's dense peak (FP8 GEMMs, BF16 attention core, router and head)."""
    x = pred.inputs
    comps = v3model.forward_flops_per_token(seq=x.sequence_length)
    flops = {p: sum(f for _, q, f in comps if q == p) for p in v3model.PRECISIONS}
    ideal = sum(flops[p] / (hardware.peak_tflops(x.gpu_id, p) * 1e12) for p in v3model.PRECISIONS)
    mixed_peak = sum(flops.values()) / ideal
    return pred.mfu_fp8 * hardware.peak_tflops(x.gpu_id, "fp8") * 1e12 / mixed_peak


def reconcile(prof=None, x: v3model.Inputs | None = None) -> dict:
    """The kernel model's GPU-hours / reported (`model`), the trace-anchored waterfall's (`waterfall`) and the
    model's pair / the trace's (`ratio`): the model's prediction is the waterfall's with the trace's pair replaced by
    the model's, so `model` ~ `waterfall` x `ratio`; `rest` is what the terms that do not scale with the pair leave."""
    prof, x = _defaults(prof, x)
    model = v3model.predict(x).vs_reported
    wf = v3waterfall.waterfall(prof, x)
    water = wf["total_k"] / wf["reported_k"]
    ratio = v3waterfall.trace_comparison(prof, x)["ratio"]
    return {"model": model, "waterfall": water, "ratio": ratio, "scaled": water * ratio, "rest": model - water * ratio}


def provenance() -> list[dict]:
    """Every input of the prediction: {"input", "kind" (earned / in-sample / assumed), "source"}."""
    rows = [
        ("GEMM rates per shape (forward, dgrad)", "earned", "DeepGEMM README, first release (132 SMs, H800)"),
        ("weight-gradient GEMM rates", "earned", "DeepGEMM PR #95 tables"),
        ("attention forward / backward rates", "earned", "FlashAttention-3 paper, H100 SXM5, head dim 128"),
        ("FP8 / BF16 dense peaks, HBM bandwidth, SMs", "earned", "NVIDIA H800 datasheet (data/hardware.json)"),
        ("DeepEP bandwidth, 50-51 GB/s", "earned", "DeepEP README, EP64 normal kernels"),
        ("run: GPUs, PP16, EP64, batch, ramp, 20 SMs, 4 nodes", "earned", "DeepSeek-V3 technical report"),
        ("model shapes", "earned", "DeepSeek-V3 config.json"),
        ("which kernels a layer runs (casts, transposes, copies)", "in-sample", "read from the trace's kernel names"),
        ("phase order and dependencies of the F&B pair", "in-sample", "the trace's schedule"),
        ("4 + 4 MoE layers per pair, 4,096-token micro-batch", "in-sample", "the trace (and DeepEP's README)"),
        ("compute on 112 SMs while DeepEP holds 20", "earned", "V3 report; the trace's grids (112 and 20 CTAs)"),
        ("memory-bound kernels at the datasheet HBM rate", "assumed", "a lower bound on their time"),
        ("a shape not tabled takes its nearest row", "assumed", "no interpolation"),
        ("MLA's 192-wide heads at FA3's head-dim-128 rate", "assumed", "wider heads run faster: understated"),
        ("BF16 GEMMs (router, heads): no published rate", "assumed", "range: FP8 table's efficiency to 75%"),
        ("DeepGEMM's rates, where the trace ran CUTLASS", "assumed", "alternative: CUTLASS rates (stated speed-ups)"),
        ("stage split: the best contiguous one", "assumed", "DeepSeek's split is not published"),
        ("EP imbalance: the sampling floor", "assumed", "the trace simulated perfect balance"),
        ("batch ramp: linear over 469B tokens", "assumed", "the report says 'gradually'"),
    ]
    return [{"input": i, "kind": k, "source": s} for i, k, s in rows]


def short_source(text: str, width: int = 40) -> str:
    """A source's title for a table cell: before its URL and any colon or parenthesis, cut at a word boundary."""
    import re
    title = re.split(r"[:(]", text.split(" (http")[0])[0].strip()
    if len(title) <= width:
        return title
    return title[:width].rsplit(" ", 1)[0] + " ..."
