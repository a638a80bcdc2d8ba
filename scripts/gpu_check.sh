#!/usr/bin/env bash
# One prepared GPU check: the kernels' notebooks at PROFILE=full plus the kernel benchmarks, results under $OUT.
# Run on a GPU machine: `make gpu-check` (OUT defaults to build/gpu). Never changes the card's settings.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-build/gpu}"
mkdir -p "$OUT"
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3
status=0
{
  echo "# GPU check $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv || true
  "$PY" -m common inventory
} > "$OUT/inventory.txt" 2>&1
for b in benchmarks/*.py; do
  [ -f "$b" ] || continue
  name=$(basename "$b" .py)
  echo "== $b"
  timeout 300 "$PY" "$b" > "$OUT/$name.txt" 2>&1 || { echo "benchmark $b failed"; status=1; }
  tail -n 30 "$OUT/$name.txt"
done
timeout 1200 "$PY" -m common run --profile full --labs "${GPU_LABS:-00 01 02 03 04 05}" --kinds solutions || status=1
cp -r build/report.md build/results.jsonl build/executed "$OUT"/ 2>/dev/null || true
exit $status
