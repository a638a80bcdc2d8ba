"""FlashAttention benchmark: naive, tiled PyTorch, Triton and PyTorch SDPA across sequence lengths, in TFLOP/s.

    .venv/bin/python benchmarks/attention_bench.py                 # GPU: bf16, d=128, N 1k..16k, causal and not
    .venv/bin/python benchmarks/attention_bench.py --seqs 128 256  # CPU: float32, the Triton kernel interpreted

FLOPs = 4 * B * H * N^2 * D (halved when causal). Every implementation is checked against SDPA before it is timed.
Prints one table per mode with the ratio triton/sdpa; the target on an H100/H200 is >= 0.8 for bf16, d=128,
N = 4k..16k. B * N is held at 16k tokens and H * D at 2048 (the FlashAttention papers' setting).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None) -> int:
    import torch
    gpu = torch.cuda.is_available() and os.environ.get("WORKBOOK_FORCE_CPU") != "1"
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seqs", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384] if gpu else [128, 256])
    p.add_argument("--head-dim", type=int, default=128 if gpu else 64)
    p.add_argument("--dtype", default="bfloat16" if gpu else "float32", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--tokens", type=int, default=16384 if gpu else 256, help="batch = max(1, tokens // N)")
    p.add_argument("--heads", type=int, default=None, help="default 2048 // head_dim on a GPU, 2 on a CPU")
    p.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    p.add_argument("--impls", nargs="+", default=["naive", "tiled", "triton", "sdpa"])
    p.add_argument("--min-run-time", type=float, default=0.2 if gpu else 0.05)
    p.add_argument("--target", type=float, default=0.8, help="triton/sdpa forward ratio to report against")
    p.add_argument("--bwd-target", type=float, default=0.6, help="triton/sdpa backward ratio to report against")
    p.add_argument("--train-head-dims", type=int, nargs="+", default=[64, 128] if gpu else [32],
                   help="head dims of the forward/backward/fwd+bwd table (Triton vs SDPA)")
    p.add_argument("--train-seqs", type=int, nargs="+", default=None, help="default: --seqs on a GPU, 64 on a CPU")
    p.add_argument("--no-train", action="store_true", help="skip the forward/backward/fwd+bwd table")
    p.add_argument("--torch-profile", metavar="DIR", help="profile the four implementations with the PyTorch "
                   "profiler at one size (--seqs[0]) and write a summary CSV and a trace into DIR, then exit")
    p.add_argument("--ncu-target", action="store_true", help="run the Triton kernel once between "
                   "cudaProfilerStart/Stop at --seqs[0] (for ncu --profile-from-start off), then exit")
    p.add_argument("--summarize-ncu", nargs=2, metavar=("RAW_CSV", "OUT_JSON"), help="turn `ncu --import ... --csv "
                   "--page raw` output into a small JSON summary, then exit")
    p.add_argument("--aot-table", metavar="CSV", help="compile every kernel configuration for sm_90 on this machine "
                   "(no GPU needed; TRITON_INTERPRET unset) and write shared memory, registers and spills per "
                   "configuration into CSV, then exit")
    args = p.parse_args(argv)
    if args.aot_table:
        return aot_table(args.aot_table)
    if args.summarize_ncu:
        return summarize_ncu(*args.summarize_ncu)

    from common import setup
    from common.kernels import attention
    env = setup("04_flash_attention", "full" if gpu else "quick")
    dtype = getattr(torch, args.dtype)
    heads = args.heads or (max(1, 2048 // args.head_dim) if gpu else 2)
    import pandas as pd
    pd.set_option("display.width", 160)
    if args.torch_profile or args.ncu_target:
        n = args.seqs[0]
        q, k, v = (torch.randn(max(1, args.tokens // n), heads, n, args.head_dim, device=env.device, dtype=dtype)
                   for _ in range(3))
        if args.ncu_target:
            attention.flash_attention(q, k, v)  # autotune and compile outside the profiled range
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
            attention.flash_attention(q, k, v)
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()
            return 0
        return torch_profile(args.torch_profile, q, k, v, args.impls, env)
    worst = None
    for causal in {"both": [False, True], "yes": [True], "no": [False]}[args.causal]:
        rows = []
        for n in args.seqs:
            batch = max(1, args.tokens // n)
            rows += attention.benchmark([n], batch=batch, heads=heads, head_dim=args.head_dim, dtype=dtype,
                                        causal=causal, impls=args.impls, min_run_time=args.min_run_time)
        unit = "TFLOP/s" if gpu else "GFLOP/s"
        table = attention.ratio_table(rows, unit=unit)
        errs = pd.DataFrame(rows).pivot(index="seq_len", columns="impl", values="rel_err")
        print(f"\n== {env.device_name} | {args.dtype} | d={args.head_dim} | H={heads} | B*N={args.tokens} | "
              f"{'causal' if causal else 'non-causal'} | {unit} (FLOPs = 4BHN^2D{'/2' if causal else ''}) ==")
        print(table.round(3).to_string())
        print("relative error vs SDPA (max |diff| / max |sdpa|):", ", ".join(
            f"{c} {errs[c].max():.1e}" for c in errs.columns))
        if "triton/sdpa" in table.columns:
            big = table[table.index >= 4096]["triton/sdpa"] if gpu else table["triton/sdpa"]
            if len(big):
                worst = big.min() if worst is None else min(worst, big.min())
    if worst is not None:
        scope = "N >= 4096" if gpu else "all N (CPU: the interpreter, not a performance figure)"
        if gpu:
            verdict = "meets" if worst >= args.target else "misses"
            print(f"\nworst triton/sdpa over {scope}: {worst:.2f} -- {verdict} the target {args.target}")
        else:
            print(f"\nworst triton/sdpa over {scope}: {worst:.2f} (the {args.target} target applies to a GPU)")
    if not args.no_train:
        train(args, gpu, dtype, env)
    return 0


def train(args, gpu, dtype, env) -> None:
    """Forward, backward and fwd+bwd: Triton (flash_attn_func) and SDPA side by side, causal and not."""
    from common.kernels import attention
    seqs = args.train_seqs or (args.seqs if gpu else [64])
    causal = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
    rows = attention.train_benchmark(seqs, head_dims=args.train_head_dims, causal_modes=causal,
                                     tokens=args.tokens, width=2048 if gpu else 64, dtype=dtype,
                                     min_run_time=args.min_run_time)
    unit = "TFLOP/s" if gpu else "GFLOP/s"
    table = attention.train_ratio_table(rows, unit=unit)
    print(f"\n== {env.device_name} | {args.dtype} | Triton vs SDPA, forward / backward / both | {unit} "
          f"(FLOPs: fwd 4BHN^2d, bwd 2.5x, fwd+bwd 3.5x; halved when causal) ==")
    if not gpu:
        print("CPU: the Triton kernels run in the interpreter -- these timings are NOT GPU speed, only a smoke test")
    print(table.round(3).to_string())
    print("max relative error of the gradients vs SDPA:", f"{max(r['rel_err'] for r in rows):.1e}")
    if gpu:
        big = table[table.index.get_level_values("seq_len") >= 4096]
        for col, target in (("fwd ratio", args.target), ("bwd ratio", args.bwd_target)):
            if col in big and len(big):
                worst = big[col].min()
                print(f"worst {col} at N >= 4096: {worst:.2f} -- {'meets' if worst >= target else 'misses'} "
                      f"the target {target}")


def aot_table(path: str) -> int:
    import csv
    import datetime

    import triton

    from common.kernels import attention
    rows = attention.aot_table(90)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        f.write(f"# sm_90 ahead-of-time compile of common/kernels/attention/ kernels, bf16, causal; triton {triton.__version__}, "
                f"{datetime.date.today().isoformat()}; limit = H200-SXM smem_per_block_kib (data/hardware.json)\n")
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    bad = [r for r in rows if r["fits"] == r["pruned"]]
    print(f"wrote {out} ({len(rows)} configurations; {sum(r['pruned'] for r in rows)} pruned by shared memory)")
    if bad:
        print("the estimate disagrees with Triton on:", bad)
        return 1
    return 0


def torch_profile(out_dir, q, k, v, impls, env) -> int:
    """Profile each implementation (3 warm-up calls, 5 profiled) and write, per implementation, its five kernels
    with the most device time to <out_dir>/attention_torch_profiler_<gpu>.csv, and the trace next to it."""
    import csv
    import datetime

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from common.kernels import attention
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if q.is_cuda else [])
    b, h, n, d = q.shape
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in impls:
        fn = attention.implementation(name, False, (128, 128))
        for _ in range(3):
            fn(q, k, v)
        if q.is_cuda:
            torch.cuda.synchronize()
        with profile(activities=acts, record_shapes=False) as prof:
            for _ in range(5):
                with record_function(f"attention.{name}"):
                    fn(q, k, v)
            if q.is_cuda:
                torch.cuda.synchronize()
        if name == "triton":
            prof.export_chrome_trace(str(out / f"attention_torch_trace_{env.device_id}.json"))
        events = []
        for e in prof.key_averages():
            dev_us = getattr(e, "self_device_time_total", None)
            if dev_us is None:
                dev_us = getattr(e, "self_cuda_time_total", 0)
            if dev_us or not q.is_cuda:
                events.append((dev_us if q.is_cuda else e.self_cpu_time_total, e))
        for t_us, e in sorted(events, key=lambda x: -x[0])[:5]:
            rows.append({"gpu": env.device_id, "device_name": env.device_name,
                         "date": datetime.date.today().isoformat(), "torch": torch.__version__,
                         "shape_BHNd": f"{b}x{h}x{n}x{d}", "dtype": str(q.dtype).replace("torch.", ""), "impl": name,
                         "kernel": e.key[:120], "calls": e.count, "time_us_per_call": round(t_us / 5, 2),
                         "time_kind": "self device time" if q.is_cuda else "self CPU time"})
    path = out / f"attention_torch_profiler_{env.device_id}.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {path} ({len(rows)} rows)")
    return 0


STALL_PREFIX = "smsp__average_warps_issue_stalled_"
NCU_METRICS = {  # raw metric -> name in the summary
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved_occupancy_pct",
    "sm__maximum_warps_per_active_cycle_pct": "theoretical_occupancy_pct",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": "memory_throughput_pct_of_peak",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_throughput_pct_of_peak",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_throughput_pct_of_peak",
    "gpu__time_duration.sum": "duration",
    "launch__registers_per_thread": "registers_per_thread",
    "launch__shared_mem_per_block_dynamic": "dynamic_shared_memory_per_block",
    "launch__grid_size": "grid_size",
    "launch__block_size": "block_size",
}


def summarize_ncu(raw_csv: str, out_json: str) -> int:
    """Summarise `ncu --import R.ncu-rep --csv --page raw` (first row names, second row units, a row per kernel)."""
    import csv
    import json
    with open(raw_csv, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    start = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
    names, units, kernels = rows[start], rows[start + 1], rows[start + 2:]
    summaries = []
    for r in kernels:
        rec = dict(zip(names, r))
        unit = dict(zip(names, units))
        s = {"kernel": rec.get("Kernel Name", "")[:120], "device": rec.get("device__attribute_display_name", "")}
        for metric, key in NCU_METRICS.items():
            if metric in rec:
                s[key] = rec[metric] + (f" {unit[metric]}" if unit.get(metric) and "pct" not in key else "")
        stalls = {}
        for m, val in rec.items():
            if m.startswith(STALL_PREFIX) and m.endswith("_per_issue_active.ratio"):
                try:
                    stalls[m[len(STALL_PREFIX):-len("_per_issue_active.ratio")]] = float(val.replace(",", ""))
                except ValueError:
                    pass
        s["top_warp_stall_reasons_cycles_per_issue"] = dict(sorted(stalls.items(), key=lambda x: -x[1])[:6])
        summaries.append(s)
    Path(out_json).write_text(json.dumps(summaries, indent=1) + "\n")
    print(f"wrote {out_json} ({len(summaries)} kernel(s))")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
