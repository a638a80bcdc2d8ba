#!/usr/bin/env bash
# One prepared GPU check (`make gpu-check`): labs 00-05 at PROFILE=full, the kernel benchmarks, the sm_90 compile
# table and the profiler recipe, everything under ${OUT:-build/gpu}. Budget: 8.75 minutes on an H200 (each step has
# its own timeout, 525 s in all). Fails loudly: every failing step is named at the end and the exit status is 1.
#   DRY_RUN=1 scripts/gpu_check.sh   # print the steps and check that their files exist; runs nothing (any machine)
# Never changes the card's settings.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-build/gpu}"
OUT_DIR="$OUT"
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3
LABS="${GPU_LABS:-00 01 02 03 04 05}"
failed=()

step() {  # step NAME TIMEOUT_S LOGFILE COMMAND...
  local name=$1 limit=$2 log=$3; shift 3
  if [ "${DRY_RUN:-0}" = 1 ]; then
    echo "[dry-run] $name (timeout ${limit}s) > $log: $*"
    return 0
  fi
  echo "== $name (timeout ${limit}s)"
  local t0=$SECONDS
  if timeout "$limit" "$@" > "$log" 2>&1; then
    echo "   ok in $((SECONDS - t0)) s"
  else
    echo "!! FAILED: $name (exit $?, $((SECONDS - t0)) s); last lines of $log:"
    tail -n 20 "$log"
    failed+=("$name")
  fi
}

mkdir -p "$OUT"
if [ "${DRY_RUN:-0}" != 1 ]; then
  if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check.sh: no CUDA GPU here (use DRY_RUN=1 to check the recipe)" >&2
    exit 2
  fi
  {
    echo "# GPU check $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv || true
    "$PY" -m common inventory
  } > "$OUT/inventory.txt" 2>&1
fi
for f in benchmarks/attention_bench.py benchmarks/fusion_bench.py benchmarks/mla_decode_bench.py \
  scripts/profile_attention.sh; do
  [ -f "$f" ] || { echo "!! missing $f"; failed+=("missing $f"); }
done

# 1. the attention and fusion benchmarks (forward table, then forward/backward/fwd+bwd vs SDPA; most of the 150 s is
#    compiling and autotuning the three kernels, cached on disk for the labs that follow)
step "attention benchmark" 150 "$OUT/attention_bench.txt" "$PY" benchmarks/attention_bench.py --min-run-time 0.1 \
  --seqs 1024 4096 16384
step "fusion benchmark" 40 "$OUT/fusion_bench.txt" "$PY" benchmarks/fusion_bench.py
# 2. low precision (another lab's benchmark; only when present)
if [ -f benchmarks/lowp_bench.py ]; then
  step "low-precision benchmark" 50 "$OUT/lowp_bench.txt" "$PY" benchmarks/lowp_bench.py --out "$OUT_DIR"
fi
# 2b. lab 14's MLA decode kernel: bf16 GPU test, then GB/s and fraction of HBM in FlashMLA's shapes (ledger:
#     mla.decode_hbm_fraction in $OUT/mla_decode_results.jsonl)
step "MLA decode benchmark" 45 "$OUT/mla_decode_bench.txt" env WORKBOOK_RESULTS="$OUT/mla_decode_results.jsonl" \
  bash -c "$PY -m pytest tests/test_mla.py -q -x -p no:cacheprovider -k gpu && $PY benchmarks/mla_decode_bench.py"
# 3. the profiler recipe (PyTorch profiler + Nsight Compute when ncu exists), summaries under $OUT/profiles
step "profiler recipe" 60 "$OUT/profile_attention.txt" env ALLOW_NO_NCU=1 OUT="$OUT/profiles" SEQ=4096 bash scripts/profile_attention.sh
# 4. the GPU tests of the kernels (bf16 forward and backward against SDPA)
step "attention GPU tests" 30 "$OUT/test_attention.txt" "$PY" -m pytest tests/test_attention.py -q -x -p no:cacheprovider -k "_gpu and not compile"
# 5. labs 00-05 at PROFILE=full (solutions), ledger and report
step "labs $LABS at PROFILE=full" 150 "$OUT/run.txt" "$PY" -m common run --profile full --labs "$LABS" --kinds solutions
if [ "${DRY_RUN:-0}" != 1 ]; then
  cp -r build/report.md build/results.jsonl build/executed "$OUT"/ 2>/dev/null || true
fi

if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu-check FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "gpu-check passed; results under $OUT"
