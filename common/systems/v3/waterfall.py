"""DeepSeek's measured H800 step set beside lab 13's kernel-level model, and the road from it to the reported 180K.

- `trace_comparison()`: the model's F&B pair of 4 + 4 MoE layers (common.systems.v3.step) against the trace's
  measured step (common.systems.v3.trace), phase by phase;
- `gemm_comparison()`: each GEMM and attention kernel of the trace, its FLOPs from the config for the chunk's
  tokens over the trace's duration, beside the published rate the model uses for its shape;
- `waterfall()`: from the trace's step to GPU-hours per trillion tokens, term by term -- the pipeline (lab 08's
  DualPipe simulator fed the trace's own F, B, W and F&B times), the uneven stages, EP imbalance, PP sends, the
  ZeRO-1 step, the batch ramp -- each sized by a stated derivation, and what is left of 180K called "unexplained".
"""
from __future__ import annotations

from dataclasses import replace

from common.systems.v3 import kernels as v3kernels, model as v3model, step as v3step, trace as deepseek_trace

REPORTED = "gpu_hours_per_t_tokens"


def _profile(prof):
    return prof if prof is not None else deepseek_trace.load_profile()


def trace_pair(x: v3model.Inputs | None = None) -> v3step.Pair:
    """The model's F&B pair as the trace ran it: 4 MoE layers forward beside 4 backward, balanced routing."""
    x = x or v3model.defaults()
    m = v3step.blocks(v3model.config(), v3model.setup(x, 1.0))["moe"]
    return v3step.pair([m] * 4, [m] * 4)


def trace_comparison(prof=None, x: v3model.Inputs | None = None) -> dict:
    """{"rows": [(phase, model ms, trace ms)], "model_ms", "trace_ms" (GPU), "host_ms", "ratio"}."""
    prof = _profile(prof)
    p = trace_pair(x)
    model = p.phase_seconds()
    ph = deepseek_trace.phases(prof)
    rows = [(name, model.get(name, 0.0) * 1e3, ph[name]["busy_ms"] if name in ph else 0.0)
            for name in v3step.COMPUTE_ORDER + v3step.COMM_ORDER]
    trace_ms = deepseek_trace.step_ms(prof)
    return {"rows": rows, "model_ms": p.step * 1e3, "trace_ms": trace_ms, "host_ms": deepseek_trace.host_step_ms(prof),
            "ratio": p.step * 1e3 / trace_ms, "pair": p}


def class_comparison(prof=None, x: v3model.Inputs | None = None) -> list:
    """[(class, model ms, trace ms)] over the pair (4 + 4 layers; DeepEP classes summed as dispatch + combine)."""
    prof = _profile(prof)
    x = x or v3model.defaults()
    ks = v3kernels.moe_layer(v3model.config(), v3model.setup(x, 1.0))
    model = {k: 4 * v * 1e3 for k, v in v3kernels.by_class(ks).items()}
    trace = {k: v["ms"] for k, v in prof["classes"].items()}
    trace["deepep_dispatch"] = trace.get("deepep_dispatch", 0.0)
    names = [c for c in deepseek_trace.CLASSES if c in model or trace.get(c, 0.0) > 0]
    return [(c, model.get(c, 0.0), trace.get(c, 0.0)) for c in names]


def gemm_comparison(prof=None, x: v3model.Inputs | None = None) -> list:
    """One row per timed kernel (GEMMs, attention) of the trace's phases, matched to the model's kernel of the same
    class and position: (phase, name, FLOPs, trace ms, achieved TFLOP/s, model TFLOP/s, basis). The weight-gradient
    phase mlp(W) runs on two streams at once, so it gets one aggregate row."""
    prof = _profile(prof)
    x = x or v3model.defaults()
    ks = v3kernels.moe_layer(v3model.config(), v3model.setup(x, 1.0))
    rows = []
    traced = deepseek_trace.gemm_kernels(prof)
    for phase in ("attn(F)", "mlp(F)", "mlp(B)", "attn(B)", "attn(W)"):
        seen: dict = {}
        model = {}
        for k in ks:
            if k.phase == phase and k.cls in deepseek_trace.TIMED_CLASSES:
                model.setdefault(k.cls, []).append(k)
        for cls, _stream, ms in traced.get(phase, []):
            i = seen.get(cls, 0)
            seen[cls] = i + 1
            cands = [k for k in model.get(cls, []) if k.flops > 0] if cls == "attention_bwd" else model.get(cls, [])
            if cls == "attention_bwd" and ms < 1.0:
                continue   # FlashAttention's pre/post-processing: memory-bound, no FLOPs of its own
            idx = 0 if cls == "attention_bwd" else i
            if idx >= len(cands):
                continue
            k = cands[idx]
            rows.append((phase, k.name, k.flops, ms, k.flops / (ms * 1e-3) / 1e12, k.flops / k.seconds / 1e12, k.basis))
    wk = [k for k in ks if k.phase == "mlp(W)" and k.flops > 0]
    ms = deepseek_trace.phases(prof)["mlp(W)"]["busy_ms"] / deepseek_trace.phases(prof)["mlp(W)"]["count"]
    fl = sum(k.flops for k in wk)
    rows.append(("mlp(W)", "all expert weight gradients (two streams)", fl, ms, fl / (ms * 1e-3) / 1e12,
                 fl / sum(k.seconds for k in wk) / 1e12, "wgrad tables x SM share (phase busy time in the trace)"))
    return rows


def _ratios(a: dict, b: dict) -> tuple:
    return tuple(a[i] / b[i] for i in range(4))


def _rank_shape(ranks) -> tuple:
    return tuple(max(r[i] for r in ranks) for i in range(4))


def waterfall(prof=None, x: v3model.Inputs | None = None, lone_transfer_scale: float = 1.0) -> dict:
    """From the trace's measured F&B pair to GPU-hours per trillion tokens: [(term, K GPU-hours per T, how)], the
    total, the reported figure and the unexplained remainder (reported - total). `lone_transfer_scale`: a lone
    chunk's DeepEP transfers against the overlapped ones the trace timed (v3step.trace_durations)."""
    prof = _profile(prof)
    x = v3model.check_inputs(x or v3model.defaults())
    cfg = v3model.config()
    to_k = lambda sec: v3model.gpu_hours_per_t_tokens(sec, x.gpus, x.tokens_per_step) / 1e3  # noqa: E731
    m = x.micro_batches
    d_trace = v3step.trace_durations(prof, transfer_scale=lone_transfer_scale)
    fb = d_trace.fb
    terms = [("trace: F&B pair of 4 + 4 MoE layers, x micro-batches", to_k(m * fb),
              f"{fb * 1e3:.1f} ms (DeepSeek's trace, GPU) x {m} micro-batches per pipeline")]
    sim0 = v3step.makespan(x.schedule, x.pp, m, d_trace).makespan
    terms.append(("pipeline bubble and lone chunks", to_k(sim0 - m * fb),
                  f"lab 08's {x.schedule} simulator, PP{x.pp}, fed the trace's F {d_trace.F * 1e3:.0f}, "
                  f"B {d_trace.B * 1e3:.0f}, W {d_trace.W * 1e3:.0f}, F&B {fb * 1e3:.0f} ms"))
    # the model's heaviest rank against its own 4 + 4 MoE layers, as a ratio applied to the trace's times
    balanced = v3model.kernel_chunks(x, 1.0)
    blk1 = balanced["blocks"]
    four = [blk1["moe"]] * 4
    unit = (v3step.lone(four, "F"), v3step.lone(four, "B"), v3step.lone(four, "W"), v3step.pair(four, four).step)
    heavy = _rank_shape(balanced["ranks"])
    d_stage = v3step.scaled(d_trace, *_ratios(heavy, unit))
    sim1 = v3step.makespan(x.schedule, x.pp, m, d_stage).makespan
    plan = balanced["plan"]
    terms.append(("uneven stages: dense layers, embedding and heads", to_k(sim1 - sim0),
                  f"best contiguous split {[len(s) for s in plan]} blocks per stage (heads on the last); the "
                  f"heaviest rank runs {heavy[3] / unit[3]:.3f}x the 4 + 4 MoE pair in the kernel model"))
    floor = v3model.ep_imbalance_floor(cfg, x.micro_batch_tokens, x.ep)
    skewed = v3model.kernel_chunks(x, x.rows_factor or floor)
    d_imb = v3step.scaled(d_stage, *_ratios(_rank_shape(skewed["ranks"]), heavy))
    sim2 = v3step.makespan(x.schedule, x.pp, m, d_imb).makespan
    terms.append(("EP imbalance: the busiest of 64 ranks sets the pace", to_k(sim2 - sim1),
                  f"routed rows x {x.rows_factor or floor:.4f} (sampling floor of balanced routing; the trace "
                  f"simulated perfect balance)"))
    send = v3model.pp_send_seconds(x)
    d_send = replace(d_imb, comm=send)
    main = v3model.pipeline_step(x, d_send)
    terms.append(("PP sends (not in the trace)", to_k(main["result"].makespan - sim2),
                  f"{x.micro_batch_tokens} x {cfg['hidden_size']} x 2 B per micro-batch over IB at {x.ib_gbs:g} "
                  f"GB/s = {send * 1e3:.2f} ms per hop, in the simulator"))
    terms.append(("ZeRO-1 step: gradient sync beyond the idle tail + AdamW update",
                  to_k(main["dp_exposed"] + main["optimizer"]),
                  f"reduce-scatter + all-gather {main['dp_sync']:.2f} s over IB, {main['dp_exposed']:.2f} s exposed;"
                  f" optimizer {main['optimizer'] * 1e3:.1f} ms at HBM bandwidth"))
    ramp = v3model.ramp_extra_gpu_hours_per_t(x, lambda mb: v3model.pipeline_step(x, d_send, mb)["step"])
    terms.append(("batch ramp (3,072 -> 15,360 sequences over 469B tokens)", ramp["gpu_hours_per_t"] / 1e3,
                  f"{len(ramp['slices'])} slices with fewer micro-batches per pipeline, averaged over 14.8T tokens"))
    total = sum(t[1] for t in terms)
    reported = v3model.fact(REPORTED) / 1e3
    return {"terms": terms, "total_k": total, "reported_k": reported, "unexplained_k": reported - total,
            "unexplained_share": (reported - total) / reported, "step_s": main["step"], "durations": d_send}
