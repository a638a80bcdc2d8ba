"""DeepSeek's own H800 training trace (deepseek-ai/profile-data, train.json), read: kernel classes, phases, streams.

The trace (rank 0 of 64; EP64, TP1, 4K tokens; one DualPipe pair of a forward and a backward chunk of 4 MoE
layers, balanced routing simulated, PP communication left out) is not shipped: `summarize(path)` derives figures
from it -- what `scripts/derive_deepseek_profile.py` writes to data/deepseek_profile_train.json -- and
`load_profile()` reads those figures back. The API another lab builds on:

    prof = load_profile()
    step_ms(prof)            the GPU span of the step's kernels (ms)         phases(prof)       per phase, summed
    host_step_ms(prof)       the host range ProfilerStep#1 (ms)               exposed_comm_share(prof)
    stream_busy_ms(prof)     per stream                                       idle_share(prof)
    class_shares(prof)       kernel-class time / step                         gemm_share(prof)
    timeline(prof)           [(stream, phase, layer, start_ms, end_ms, busy_ms)] for a plot
    gemm_kernels(prof)       per phase, the GEMM/attention kernel times in launch order (mean over layers)
    prof["overlap"]          compute / communication busy, their overlap, exposed communication, idle (ms);
                             transfer_busy_ms (dispatch + combine kernels only), exposed_gaps_ms (each stretch of
                             exposed communication of GAP_US or more: [start, end]), exposed_short_ms (the rest)
    prof["grids"]            {class: {CTAs per launch: kernels}} for the GEMM, attention and DeepEP classes
    CLASSES, classify(name)  the kernel classes and the rule that assigns them

The step is the GPU's: from the first to the last kernel the step's host range (`ProfilerStep#1`) launched. The
host range itself closes earlier (the host runs ahead of the GPU, and waits for it only at DeepEP's syncs), so
its duration is kept too (`host_step_ms`) but is not the step. Phases are the `user_annotation` ranges, each GPU
kernel charged to the range whose host call launched it (common.core.traces.attribute).
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from common.core import traces
from common.core.env import REPO_ROOT

PROFILE_PATH = REPO_ROOT / "data" / "deepseek_profile_train.json"
STEP_WINDOW = "ProfilerStep#1"
CONTAINERS = ("1F1B",)             # annotations that hold the phases rather than being one
SOURCE = {"repository": "deepseek-ai/profile-data", "commit": "4496024", "file": "train.json",
          "url": "https://github.com/deepseek-ai/profile-data/blob/4496024/train.json", "date": "2025-02-27"}
COMPUTE_PHASES = ("attn(F)", "mlp(F)", "mlp(B)", "mlp(W)", "attn(B)", "attn(W)")
COMM_PHASES = ("dispatch(F)", "combine(F)", "dispatch(B)", "combine(B)")
CLASSES = {   # class -> what it holds (labels for tables)
    "fp8_gemm": "FP8 GEMM (dense layers' projections, shared expert, every weight gradient)",
    "grouped_gemm": "grouped FP8 GEMM (routed experts, forward and dgrad)",
    "bf16_gemm": "BF16 GEMM (router)",
    "attention_fwd": "attention forward (FlashAttention)",
    "attention_bwd": "attention backward (FlashAttention, with its pre/post-processing)",
    "deepep_dispatch": "DeepEP dispatch",
    "deepep_combine": "DeepEP combine",
    "deepep_notify": "DeepEP notify (token counts, syncs with the other ranks)",
    "quantize": "quantize / cast / transpose (FP8 1x128 and 128x1)",
    "norm": "norm (RMSNorm and its backward)",
    "permute": "permute / unpermute / routing (top-k)",
    "elementwise": "elementwise (SwiGLU, RoPE, copies, small PyTorch ops)",
    "other": "other",
}
COMM_CLASSES = ("deepep_dispatch", "deepep_combine", "deepep_notify")
TRANSFER_CLASSES = ("deepep_dispatch", "deepep_combine")   # the kernels that move tokens (notify only counts and waits)
GAP_US = 50.0   # an exposed stretch of communication this long or longer is listed on its own
GEMM_CLASSES = ("fp8_gemm", "grouped_gemm", "bf16_gemm")
TIMED_CLASSES = GEMM_CLASSES + ("attention_fwd", "attention_bwd")


def classify(name: str) -> str:
    """The class of a kernel, from its (demangled) name in DeepSeek's trace."""
    n = name
    if "dpsk::ep::" in n:
        if "notify" in n:
            return "deepep_notify"
        return "deepep_combine" if "combine" in n else "deepep_dispatch"
    if "m_grouped" in n:
        return "grouped_gemm"
    if "GemmKernel" in n:
        return "fp8_gemm"
    if "xmma_gemm" in n or "cublas" in n.lower() or "gemm_bf16" in n:
        return "bf16_gemm"
    if "FlashAttnBwd" in n or "flash_bwd" in n:
        return "attention_bwd"
    if "flash" in n.lower():
        return "attention_fwd"
    if any(w in n for w in ("cast", "transpose", "quant")):
        return "quantize"
    if "layer_norm" in n or "rms_norm" in n or "rmsnorm" in n:
        return "norm"
    if any(w in n for w in ("fused_mapping", "expand_to_fused", "reduce_fused", "count_expert", "topk", "TopK",
                            "scatter_gather", "unique_group", "aux_fi")):
        return "permute"
    if any(w in n for w in ("elementwise", "rotary", "swiglu", "copy", "Memcpy", "Memset", "reduce_kernel",
                            "distribution", "Distribution")):
        return "elementwise"
    return "other"


def _ms(us) -> float:
    return round(float(us) / 1e3, 4)


def _minus(a, b) -> list:
    """Sorted disjoint intervals `a` without sorted disjoint intervals `b`."""
    out = []
    for s, t in a:
        cur = s
        for u, v in b:
            if v <= cur or u >= t:
                continue
            if u > cur:
                out.append((cur, u))
            cur = max(cur, v)
        if cur < t:
            out.append((cur, t))
    return out


def _grids(gpu) -> dict:
    """{class: {CTAs per launch: kernels}}: the grids the GEMM, attention and DeepEP kernels were launched with."""
    out: dict = {}
    for e in gpu:
        grid = (e.get("args") or {}).get("grid")
        if not grid or classify(e["name"]) not in TIMED_CLASSES + COMM_CLASSES:
            continue
        ctas = 1
        for g in grid:
            ctas *= int(g)
        by = out.setdefault(classify(e["name"]), {})
        by[str(ctas)] = by.get(str(ctas), 0) + 1
    return {k: dict(sorted(v.items(), key=lambda kv: -kv[1])) for k, v in sorted(out.items())}


def summarize(path) -> dict:
    """Figures of the trace at `path` (DeepSeek's train.json or a file of the same format); errors name what is
    missing (not JSON, truncated, no traceEvents, no annotations, no kernel events, no step window)."""
    data = traces.read_trace(path)
    events = traces.complete_events(data)
    try:
        step = traces.find_window(events, STEP_WINDOW)
    except ValueError:
        raise ValueError(f"trace {Path(path).name!r} has no {STEP_WINDOW!r} range: expected one profiler step "
                         f"(torch.profiler schedule with record_function ranges)") from None
    ranges = traces.annotations(events, step, exclude=(STEP_WINDOW,) + CONTAINERS)
    if not ranges:
        raise ValueError(f"trace {Path(path).name!r} has no user_annotation ranges inside {STEP_WINDOW!r}: the "
                         f"phases (attn(F), dispatch(F), ...) are what this reader needs")
    kernels = [e for e in traces.gpu_events(events) if e.get("cat") == "kernel"]
    if not kernels:
        raise ValueError(f"trace {Path(path).name!r} has no kernel events: it was recorded without CUDA activities "
                         f"(torch.profiler needs ProfilerActivity.CUDA)")
    rows = traces.phase_table(events, step, exclude=(STEP_WINDOW,) + CONTAINERS)
    gpu = [e for row in rows for e in row["events"]]
    if not gpu:
        raise ValueError(f"trace {Path(path).name!r}: no kernel was launched inside the phases of {STEP_WINDOW!r} "
                         f"(no 'correlation' ids linking kernels to their launches?)")
    t0, t1 = traces.span(gpu)
    comm = [e for e in gpu if classify(e["name"]) in COMM_CLASSES]
    compute = [e for e in gpu if classify(e["name"]) not in COMM_CLASSES]
    gemms = [e for e in gpu if classify(e["name"]) in GEMM_CLASSES]
    transfers = [e for e in gpu if classify(e["name"]) in TRANSFER_CLASSES]
    alone = _minus(traces.merged_intervals(comm), traces.merged_intervals(compute))
    long_gaps = [(s_, t_) for s_, t_ in alone if t_ - s_ >= GAP_US]
    span_us = t1 - t0
    classes = {c: {"ms": 0.0, "kernels": 0} for c in CLASSES}
    for e in gpu:
        c = classes[classify(e["name"])]
        c["ms"] += e["dur"] / 1e3
        c["kernels"] += 1
    for c in classes.values():
        c["ms"] = round(c["ms"], 4)
        c["share_of_step"] = round(c["ms"] * 1e3 / span_us, 5)
    counts: dict = {}
    phase_rows, timeline, gemm_rows = [], [], {}
    for row in rows:
        layer = counts.get(row["name"], 0)
        counts[row["name"]] = layer + 1
        per_class: dict = {}
        for e in row["events"]:
            k = classify(e["name"])
            per_class[k] = round(per_class.get(k, 0.0) + e["dur"] / 1e3, 4)
        phase_rows.append({"name": row["name"], "layer": layer, "host_ms": _ms(row["host_dur"]),
                           "gpu_start_ms": None if row["gpu_start"] is None else _ms(row["gpu_start"] - t0),
                           "gpu_end_ms": None if row["gpu_end"] is None else _ms(row["gpu_end"] - t0),
                           "busy_ms": _ms(row["busy"]), "kernels": len(row["events"]),
                           "streams": {str(k): _ms(v) for k, v in row["streams"].items()}, "classes": per_class})
        by_stream: dict = {}
        for e in row["events"]:
            by_stream.setdefault(str(traces.stream_of(e)), []).append(e)
        for st, ev in sorted(by_stream.items()):
            s0, s1 = traces.span(ev)
            timeline.append([st, row["name"], layer, _ms(s0 - t0), _ms(s1 - t0), _ms(traces.busy(ev))])
        timed = [e for e in sorted(row["events"], key=lambda e: e["ts"]) if classify(e["name"]) in TIMED_CLASSES]
        gemm_rows.setdefault(row["name"], []).append([[classify(e["name"]), str(traces.stream_of(e)), e["dur"]]
                                                      for e in timed])
    gemm_kernels = {}
    for name, layers in gemm_rows.items():
        if len({len(x) for x in layers}) != 1:
            continue   # the layers ran different kernel lists: no per-position mean
        gemm_kernels[name] = [[layers[0][i][0], layers[0][i][1], round(sum(x[i][2] for x in layers) / len(layers) / 1e3,
                                                                        4)] for i in range(len(layers[0]))]
    meta = {k: data.get(k) for k in ("traceName", "distributedInfo")}
    dev = (data.get("deviceProperties") or [{}])[0]
    streams = traces.stream_busy(gpu)
    return {
        "about": "Figures derived from DeepSeek's PyTorch-profiler trace of one DualPipe step on H800 (common/systems/"
                 "deepseek_trace.py; regenerate with scripts/derive_deepseek_profile.py). Times in ms from the first "
                 "GPU kernel of the step. Not the trace itself.",
        "source": dict(SOURCE),
        "sources": {"profile_data": {"title": "deepseek-ai/profile-data, train.json (commit 4496024)",
                                     "url": SOURCE["url"], "date": SOURCE["date"]}},
        "trace": {"device": dev.get("name"), "num_sms": dev.get("numSms"), "trace_name": meta["traceName"],
                  "rank": (meta["distributedInfo"] or {}).get("rank"),
                  "world_size": (meta["distributedInfo"] or {}).get("world_size")},
        "step": {"window": STEP_WINDOW, "gpu_ms": _ms(span_us), "host_ms": _ms(step[1] - step[0]),
                 "first_kernel_after_host_start_ms": _ms(t0 - step[0]), "kernels": len(gpu)},
        "streams": {str(k): {"busy_ms": _ms(v), "kernels": sum(1 for e in gpu if str(traces.stream_of(e)) == str(k)),
                             "comm_kernels": sum(1 for e in comm if str(traces.stream_of(e)) == str(k))}
                    for k, v in streams.items()},
        "overlap": {"compute_busy_ms": _ms(traces.busy(compute)), "comm_busy_ms": _ms(traces.busy(comm)),
                    "overlap_ms": _ms(traces.overlap(comm, compute)),
                    "exposed_comm_ms": _ms(traces.exposed(comm, compute)),
                    "idle_ms": _ms(span_us - traces.busy(gpu)), "gemm_busy_ms": _ms(traces.busy(gemms)),
                    "transfer_busy_ms": _ms(traces.busy(transfers)),
                    "exposed_gaps_ms": [[_ms(s_ - t0), _ms(t_ - t0)] for s_, t_ in long_gaps],
                    "exposed_short_ms": _ms(traces.total(alone) - traces.total(long_gaps))},
        "grids": _grids(gpu),
        "classes": classes,
        "phases": phase_rows,
        "timeline": timeline,
        "gemm_kernels": gemm_kernels,
    }


# ---------------------------------------------------------------- the derived figures

@lru_cache(maxsize=4)
def _load(path: str) -> dict:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p} is missing: run `python scripts/derive_deepseek_profile.py PATH/TO/train.json` "
                                f"(train.json from {SOURCE['url']})")
    return json.loads(p.read_text())


def load_profile(path=None) -> dict:
    """The figures of data/deepseek_profile_train.json (or of `path`, a summarize() output)."""
    return _load(str(path or PROFILE_PATH))


def step_ms(prof) -> float:
    return prof["step"]["gpu_ms"]


def host_step_ms(prof) -> float:
    return prof["step"]["host_ms"]


def exposed_comm_share(prof) -> float:
    return prof["overlap"]["exposed_comm_ms"] / step_ms(prof)


def idle_share(prof) -> float:
    return prof["overlap"]["idle_ms"] / step_ms(prof)


def gemm_share(prof) -> float:
    """Share of the step during which at least one GEMM runs."""
    return prof["overlap"]["gemm_busy_ms"] / step_ms(prof)


def stream_busy_ms(prof) -> dict:
    return {k: v["busy_ms"] for k, v in prof["streams"].items()}


def class_shares(prof) -> dict:
    """{class: kernel time / step}. Classes on different streams overlap, so the shares sum to more than 1."""
    return {k: v["share_of_step"] for k, v in prof["classes"].items()}


def phases(prof) -> dict:
    """{phase name: {"count", "busy_ms" (summed over its instances), "host_ms", "classes": {class: ms}}}."""
    out: dict = {}
    for row in prof["phases"]:
        p = out.setdefault(row["name"], {"count": 0, "busy_ms": 0.0, "host_ms": 0.0, "classes": {}})
        p["count"] += 1
        p["busy_ms"] += row["busy_ms"]
        p["host_ms"] += row["host_ms"]
        for k, v in row["classes"].items():
            p["classes"][k] = p["classes"].get(k, 0.0) + v
    return out


def timeline(prof) -> list[tuple]:
    """[(stream, phase, layer, start_ms, end_ms, busy_ms)]: one bar per phase instance and stream."""
    return [tuple(r) for r in prof["timeline"]]


def transfer_busy_ms(prof) -> float:
    """Time DeepEP's dispatch and combine kernels run (its notify kernels, which count tokens and wait for the
    other ranks, left out)."""
    return prof["overlap"]["transfer_busy_ms"]


def exposed_gaps(prof) -> list[tuple]:
    """[(start_ms, end_ms)]: each stretch of at least GAP_US in which communication runs with no compute beside it."""
    return [tuple(g) for g in prof["overlap"]["exposed_gaps_ms"]]


def grids(prof) -> dict:
    """{class: {CTAs per launch: kernels}}."""
    return {k: {int(c): n for c, n in v.items()} for k, v in prof["grids"].items()}


def gemm_kernels(prof) -> dict:
    """{phase: [(class, stream, mean ms)]}: the GEMM and attention kernels of each phase in launch order, averaged
    over the layers (phases whose layers ran different kernel lists are left out)."""
    return {k: [tuple(x) for x in v] for k, v in prof["gemm_kernels"].items()}
