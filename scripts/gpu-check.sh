#!/usr/bin/env bash
# On the GPU machine, in one call: build imgops for sm_90, run every test (CUDA ones included),
# compute-sanitizer memcheck and racecheck over the kernels, the CLI on CPU vs CUDA, and timings.
# Logs go to $OUT (or ./gpu-check-out); a summary is printed last.
#   bash scripts/gpu-check.sh [stage...]   stages: build tests sanitize cli bench pipeline volume parts
#   (parts: every scripts/gpu-check.d/*.sh, each area's own GPU checks, run after the build;
#   PARTS="engine ops" narrows it)
#   (variants, not in the default list: benchmarks/kernel_variants.cu, the kernel design experiments)
#   (default: all); TESTS="tests/test_x.py ..." narrows the test stage.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
STAGES=${*:-build tests sanitize cli bench pipeline volume parts}
TESTS=${TESTS:-tests}
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST="9.0" MAX_JOBS=${MAX_JOBS:-16} FORCE_CUDA=1
note() { echo "$*" | tee -a "$SUMMARY"; }
run_stage() {  # name, command...
  local name=$1; shift
  local t0=$SECONDS
  "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  note "$(printf '%-9s rc=%-3s %4ss  %s' "$name" "$rc" "$((SECONDS - t0))" "$(tail -n 1 "$OUT/$name.log")")"
  return $rc
}
wants() { [[ " $STAGES " == *" $1 "* ]]; }

note "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null)"
if wants build; then
  run_stage build bash -c "$PY -m pip install --no-build-isolation --no-deps -e . && \
    $PY -c 'import imgops, json; print(json.dumps(imgops.build_info()))'" || { cat "$OUT/build.log" | tail -40; exit 1; }
  $PY -c 'import imgops; i = imgops.build_info(); print("cuda_kernels", i["cuda_kernels"], i["mode"], i["archs"], i["devices"])' | tee -a "$SUMMARY"
fi
if wants tests; then
  # Worker processes (pytest-xdist, if present) so that a crash fails one test, not the run.
  XDIST=$($PY -c "import xdist" 2>/dev/null && echo "-n 4")
  run_stage tests $PY -m pytest -q -rs -p no:cacheprovider $XDIST --junitxml="$OUT/junit.xml" $TESTS
  grep -E "passed|failed" "$OUT/tests.log" | tail -n 3 >>"$SUMMARY"
  grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -n 30 | tee -a "$SUMMARY"
fi
if wants sanitize; then
  export PYTORCH_NO_CUDA_MEMORY_CACHING=1
  for tool in memcheck racecheck; do
    run_stage "$tool" compute-sanitizer --tool "$tool" --print-limit 20 --error-exitcode 9 \
      $PY scripts/sanitize_kernels.py
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Hazard" "$OUT/$tool.log" | tail -n 2 | tee -a "$SUMMARY"
  done
  # 64-bit indexing: each kernel over more than 2^31 elements under memcheck
  run_stage memcheck-big compute-sanitizer --tool memcheck --print-limit 20 --error-exitcode 9 \
    $PY scripts/sanitize_kernels.py --big
  grep -E "ERROR SUMMARY" "$OUT/memcheck-big.log" | tail -n 1 | tee -a "$SUMMARY"
  unset PYTORCH_NO_CUDA_MEMORY_CACHING
fi
if wants variants; then
  run_stage variants bash -c "nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 \
    benchmarks/kernel_variants.cu -o /tmp/kernel_variants && /tmp/kernel_variants"
  cat "$OUT/variants.log" | tee -a "$SUMMARY"
fi
if wants cli; then
  run_stage cli bash scripts/cli_cpu_vs_cuda.sh "$OUT"
fi
if wants bench; then
  run_stage bench $PY -m imgops.cli bench --device cuda
  tail -n 40 "$OUT/bench.log"
fi
if wants pipeline; then  # imgops gray vs the OpenCV pool: 20 copies of every sample, 60 of each JPEG
  rm -rf /tmp/imgops-photos /tmp/imgops-jpegs && mkdir -p /tmp/imgops-photos /tmp/imgops-jpegs
  for i in $(seq 1 20); do for f in samples/*.jpg samples/*.png; do
    cp "$f" "/tmp/imgops-photos/$i-$(basename "$f")"; done; done
  for i in $(seq 1 60); do for f in samples/*.jpg; do
    cp "$f" "/tmp/imgops-jpegs/$i-$(basename "$f")"; done; done
  for run in "photos cpu" "photos cuda" "jpegs cpu" "jpegs cpu 1"; do
    set -- $run
    name="pipeline-$1-$2${3:+-level$3}"
    run_stage "$name" bash -c "$PY -m imgops.cli bench --pipeline /tmp/imgops-$1 --reps 3 \
      --gray-device $2 ${3:+--png-level $3} --json > /tmp/$name.json"
    $PY -c "import json,sys; d=json.load(open(sys.argv[1])); [print(sys.argv[2], r['tool'], \
      round(r['wall_s'],2), 's', r['output_bytes'], 'B', r.get('check', ''), \
      {k: round(v, 2) for k, v in (r.get('stages') or {}).items()}) for r in d['runs']]" \
      "/tmp/$name.json" "$name" | tee -a "$SUMMARY"
  done
fi
if wants volume && [ -f benchmarks/volume_bench.py ]; then
  run_stage volume $PY benchmarks/volume_bench.py --size-gb "${VOLUME_GB:-16}" --device cuda \
    --workdir /tmp/imgops-vol --modes "${VOLUME_MODES:-fixed}"
  cat "$OUT/volume.log" | tee -a "$SUMMARY"
fi
if wants parts; then
  for part in scripts/gpu-check.d/*.sh; do
    [ -f "$part" ] || continue
    name=$(basename "$part" .sh)
    [ -z "${PARTS:-}" ] || [[ " $PARTS " == *" $name "* ]] || continue
    OUT="$OUT" PY="$PY" run_stage "part-$name" bash "$part"
    tail -n 15 "$OUT/part-$name.log" | tee -a "$SUMMARY"
  done
fi
echo "==== summary"
cat "$SUMMARY"
