#!/usr/bin/env bash
# The ops helper's GPU checks (issue 16.4-16.6, 10.3): run from the repo root after the lead's build
# step (pip install -e . with FORCE_CUDA=1). Writes $OUT/ops-*.txt|json; the last line of each
# stage goes to $OUT/ops-summary.txt.
#   bash scripts/gpu-check.d/ops.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
SUMMARY="$OUT/ops-summary.txt"
: >"$SUMMARY"
stage() {  # name, command...
  local name=$1; shift
  local t0=$SECONDS
  "$@" >"$OUT/ops-$name.txt" 2>&1
  local rc=$?
  printf '%-14s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - t0))" \
    "$(tail -n 1 "$OUT/ops-$name.txt")" | tee -a "$SUMMARY"
}
$PY -c 'import imgops; print(imgops.build_info())' | tee -a "$SUMMARY"
# 1. the op tests, CPU and CUDA (CUDA = CPU bit for bit, > 2^31 elements for bin and png_filter)
stage tests $PY -m pytest -q -rs -p no:cacheprovider tests/test_ops_png_filter.py \
  tests/test_ops_bin.py tests/test_ops_api.py tests/test_registry.py tests/test_ops_gray.py \
  tests/test_ops_normvol.py tests/test_ops_histogram.py
grep -E "^(FAILED|ERROR)" "$OUT/ops-tests.txt" | head -n 20 | tee -a "$SUMMARY"
# 2. compute-sanitizer over every registered op (png_filter and bin included), then > 2^31
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
for tool in memcheck racecheck; do
  stage "$tool" compute-sanitizer --tool "$tool" --print-limit 20 --error-exitcode 9 \
    $PY scripts/sanitize_kernels.py
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/ops-$tool.txt" | tail -n 1 | tee -a "$SUMMARY"
done
stage memcheck-big compute-sanitizer --tool memcheck --print-limit 20 --error-exitcode 9 \
  $PY scripts/sanitize_kernels.py --big
unset PYTORCH_NO_CUDA_MEMORY_CACHING
# 3. kernel timings from the registry: every op on CUDA, then the CPU with 1 and all threads
stage bench-cuda bash -c "$PY -m imgops.cli bench --device cuda --json > '$OUT/ops-bench-cuda.json'"
stage bench-cpu-1 bash -c "$PY -m imgops.cli bench --device cpu --threads 1 --no-compile --json > '$OUT/ops-bench-cpu-1.json'"
stage bench-cpu bash -c "$PY -m imgops.cli bench --device cpu --no-compile --json > '$OUT/ops-bench-cpu.json'"
