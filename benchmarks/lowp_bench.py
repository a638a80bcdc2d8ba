"""FP8 against BF16 GEMMs (lab 05): TFLOP/s of y = x @ w.T side by side, and the FP8/BF16 ratio.

    .venv/bin/python benchmarks/lowp_bench.py                 # GPU: transformer-sized GEMMs
    .venv/bin/python benchmarks/lowp_bench.py --out build/gpu # also writes lowp_bench.csv and lowp_bench_table.txt there

Columns: BF16 (`torch.mm`), FP8 E4M3 with per-tensor scales through `torch._scaled_mm` without and with
`use_fast_accum`, and FP8 with DeepSeek-V3's block scales (1x128 activations, 128x128 weights) in one `_scaled_mm`
call where the GPU and cuBLAS offer it (>= 12.9, sm_90). Each FP8 result is checked against BF16 before it is timed.
Shapes: square GEMMs and DeepSeek-V3's (hidden 7168, MoE expert width 2048) at 4096-16384 tokens.

On a CPU the script runs tiny shapes to show it works: CPU timings of FP8 are NOT a tensor-core result (the CPU
kernel converts FP8 to FP32 in software), and none of them is a performance figure.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

GPU_SHAPES = ["4096x4096x4096", "8192x8192x8192", "4096x7168x2048", "4096x2048x7168", "16384x7168x7168"]
CPU_SHAPES = ["128x128x256", "256x256x512"]


def main(argv=None) -> int:
    import torch
    gpu = torch.cuda.is_available() and os.environ.get("WORKBOOK_FORCE_CPU") != "1"
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", default=GPU_SHAPES if gpu else CPU_SHAPES, help="MxNxK")
    p.add_argument("--min-run-time", type=float, default=0.3 if gpu else 0.05)
    p.add_argument("--out", type=Path, default=None, help="folder for lowp_bench.csv and lowp_bench_table.txt")
    args = p.parse_args(argv)

    from common import setup
    env = setup("05_low_precision", "full" if gpu else "quick", quiet=True)
    import pandas as pd

    from common.kernels import scaled_gemm
    pd.set_option("display.width", 200)
    pd.set_option("display.max_columns", 20)
    print(env.summary())
    if not gpu:
        print("CPU: FP8 runs through a software conversion, not tensor cores -- these timings show that the code "
              "runs, they are not FP8 performance.\n")
    rows = []
    for shape in args.shapes:
        try:
            M, N, K = (int(v) for v in shape.lower().split("x"))
        except ValueError:
            raise SystemExit(f"--shapes {shape!r}: expected MxNxK, e.g. 4096x4096x4096") from None
        rows.append(scaled_gemm.time_gemms(M, N, K, env.device, args.min_run_time))
        torch.cuda.empty_cache() if gpu else None
    df = pd.DataFrame(rows)
    cols = ["M", "N", "K", "bf16_tflops"] + [c for c in df.columns if c.endswith("_tflops") and c != "bf16_tflops"] \
        + [c for c in df.columns if c.endswith("_vs_bf16")]
    table = df[cols].round(3)
    print(table.to_string(index=False))
    for c in [c for c in df.columns if c.endswith("_note")]:
        for note in df[c].dropna().unique():
            print(f"{c[:-5]}: {note}")
    if gpu and "fp8_tensor_fast_vs_bf16" in df:
        print(f"\nFP8 (per-tensor, fast accumulation) / BF16: median {df['fp8_tensor_fast_vs_bf16'].median():.2f}x "
              f"over {len(df)} shapes")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        df.to_csv(args.out / "lowp_bench.csv", index=False)
        (args.out / "lowp_bench_table.txt").write_text(f"{env.summary()}\n\n{table.to_string(index=False)}\n")
        print(f"wrote {args.out / 'lowp_bench.csv'} and {args.out / 'lowp_bench_table.txt'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
