#!/usr/bin/env bash
# Profile lab 04's attention kernels on a GPU runner and write small summaries into data/profiles/.
#
#   scripts/profile_attention.sh            # needs a CUDA GPU, Nsight Compute (ncu) on PATH, and the repo's .venv
#
# Writes (GPU = the hardware id, e.g. H100-SXM; see data/profiles/README.md for what each file holds):
#   data/profiles/attention_torch_profiler_<GPU>.csv   PyTorch profiler: top kernels of naive / tiled / triton / sdpa
#   data/profiles/attention_ncu_<GPU>.json             Nsight Compute summary of the Triton kernel
#   data/profiles/attention_ncu_<GPU>.csv              the same report's raw metrics (one row)
#   build/profiles/attention_triton_<GPU>.ncu-rep      the full report (open in the Nsight Compute UI; not committed)
#   build/profiles/attention_torch_trace_<GPU>.json    the Chrome trace of the Triton runs (not committed)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-data/profiles}
SEQ=${SEQ:-8192}          # sequence length profiled (bf16, head dim 128, B*N = 16k tokens, 16 heads)
# ALLOW_NO_NCU=1: without Nsight Compute, stop after the PyTorch profiler with success (make gpu-check uses it)
NCU=${NCU:-ncu}

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "profile_attention.sh: no CUDA GPU here; the GPU profile summaries stay owed" >&2
  exit 2
fi
GPU=$("$PY" -c "import sys; sys.path.insert(0, '.'); import torch; from common.core.env import identify_gpu; \
n = torch.cuda.get_device_name(0); print(identify_gpu(n) or n.replace(' ', '_'))")
mkdir -p "$OUT" build/profiles

echo "== 1/2 PyTorch profiler: naive, tiled, triton, sdpa at N=$SEQ on $GPU"
"$PY" benchmarks/attention_bench.py --torch-profile build/profiles --seqs "$SEQ"
mv "build/profiles/attention_torch_profiler_${GPU}.csv" "$OUT/"

echo "== 2/2 Nsight Compute: the Triton kernel (autotuned outside the profiled range) at N=$SEQ"
if ! command -v "$NCU" >/dev/null; then
  echo "ncu not found: install Nsight Compute or set NCU=/path/to/ncu; the ncu summary stays owed" >&2
  [ "${ALLOW_NO_NCU:-0}" = 1 ] && exit 0
  exit 3
fi
"$NCU" --profile-from-start off --target-processes all --kernel-name regex:flash_fwd_kernel --launch-count 1 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
  --section ComputeWorkloadAnalysis --section SchedulerStats --section WarpStateStats \
  --export "build/profiles/attention_triton_${GPU}" --force-overwrite \
  "$PY" benchmarks/attention_bench.py --ncu-target --seqs "$SEQ"
"$NCU" --import "build/profiles/attention_triton_${GPU}.ncu-rep" --csv --page raw > "$OUT/attention_ncu_${GPU}.csv"
"$PY" benchmarks/attention_bench.py --summarize-ncu "$OUT/attention_ncu_${GPU}.csv" "$OUT/attention_ncu_${GPU}.json"
echo "done: $(ls "$OUT"/attention_*"${GPU}"*)"
