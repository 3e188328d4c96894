#!/usr/bin/env bash
# The torch-free CUDA engine (imgops.engine.driver) on the GPU host, after the build step:
#  1. its tests and the engine/codec tests on the GPU
#  2. compute-sanitizer memcheck + racecheck over the fatbin kernels (the driver tests)
#  3. the issue-10 photo batch: process walls of `imgops gray DIR -d OUT -q` on cpu, on cuda with
#     the driver engine and on cuda with the torch engine (IMGOPS_CUDA_ENGINE=torch), 800 and
#     3200 files, alternated, peak RSS; the per-phase seconds of the driver run (--stats-json)
#  4. GPU decode vs OpenCV decode: luma differences of the driver engine's outputs
#  5. start-up piece by piece without torch
# Results: $OUT/driver-*.txt|json; a verdict table is printed last.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
BATCH=${ENGINE_BATCH_DIR:-/tmp/imgops-photo-batch}
BIG=/tmp/imgops-photo-batch-big
PARTS=${DRIVER_PARTS:-tests sanitize walls diff startup}
wants() { [[ " $PARTS " == *" $1 "* ]]; }
export PYTHONUNBUFFERED=1
MAXRSS='import resource, runpy, sys
sys.argv = ["imgops"] + sys.argv[1:]
try:
    runpy.run_module("imgops.cli", run_name="__main__")
finally:
    print("peak RSS", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024, "MiB", file=sys.stderr)'

if wants tests; then
  timeout 400 $PY -m pytest -q -rs -p no:cacheprovider tests/test_cuda_driver.py \
    tests/test_driver_engine.py tests/test_pipeline_engine.py tests/test_ops_png_filter.py \
    tests/test_gpu_jpeg_encode.py tests/test_cli_gray.py >"$OUT/driver-tests.txt" 2>&1
  echo "tests rc=$? $(tail -n 1 "$OUT/driver-tests.txt")"
  grep -E "^(FAILED|ERROR)" "$OUT/driver-tests.txt" | head -n 20
fi
if wants sanitize; then
  for tool in memcheck racecheck; do
    # (API errors off: two tests provoke out-of-memory and a bad module on purpose)
    timeout 300 compute-sanitizer --tool "$tool" --report-api-errors no --print-limit 20 --error-exitcode 9 \
      $PY -m pytest -q -p no:cacheprovider -m "gpu_driver and not slow" tests/test_cuda_driver.py \
      >"$OUT/driver-$tool.txt" 2>&1
    echo "$tool rc=$? $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/driver-$tool.txt" | tail -n 1)"
  done
fi
[ -d "$BATCH" ] || $PY scripts/make_photo_batch.py "$BATCH" --count 800 >"$OUT/driver-batch.txt" 2>&1
gray() {  # label, dir, device, extra args...: one timed run in a fresh process
  local label=$1 dir=$2 device=$3; shift 3
  rm -rf /tmp/imgops-driver-out; mkdir -p /tmp/imgops-driver-out
  local t0; t0=$(date +%s%N)
  timeout 300 $PY -c "$MAXRSS" gray "$dir" -d /tmp/imgops-driver-out --device "$device" -q "$@" \
    2>/tmp/imgops-driver-err.txt
  local rc=$?
  echo "$label rc=$rc wall_ms $(( ($(date +%s%N) - t0) / 1000000 )) files $(ls /tmp/imgops-driver-out | wc -l) $(tail -n 1 /tmp/imgops-driver-err.txt)"
}
if wants walls; then
  {
    for rep in 1 2; do
      gray "800 cpu" "$BATCH" cpu
      gray "800 cuda-driver" "$BATCH" cuda --stats-json "$OUT/driver-stats-$rep.json"
      export IMGOPS_CUDA_ENGINE=torch
      gray "800 cuda-torch" "$BATCH" cuda
      unset IMGOPS_CUDA_ENGINE
      gray "800 cuda-driver --no-fsync" "$BATCH" cuda --no-fsync
      gray "800 cpu --no-fsync" "$BATCH" cpu --no-fsync
    done
    gray "800 cuda-driver -f jpg" "$BATCH" cuda -f jpg --stats-json "$OUT/driver-stats-jpg.json"
    gray "800 cpu -f jpg" "$BATCH" cpu -f jpg
    [ -d "$BIG" ] || $PY scripts/make_photo_batch.py "$BIG" --count 3200 >>"$OUT/driver-batch.txt" 2>&1
    gray "3200 cpu" "$BIG" cpu
    gray "3200 cuda-driver" "$BIG" cuda --stats-json "$OUT/driver-stats-big.json"
    for n in 100 200 400; do
      rm -rf /tmp/imgops-small; mkdir /tmp/imgops-small
      ls "$BATCH"/*.jpg | head -n $n | xargs -I{} cp {} /tmp/imgops-small/
      gray "$n cpu" /tmp/imgops-small cpu
      gray "$n cuda-driver" /tmp/imgops-small cuda
    done
  } >"$OUT/driver-walls.txt" 2>&1
  cat "$OUT/driver-walls.txt"
  $PY - "$OUT"/driver-stats-1.json <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
print("driver run:", {k: d.get(k) for k in ("written", "failed", "device", "decoders", "wall_seconds", "gpu_peak_bytes")})
print("engine phases:", {k: round(v, 2) for k, v in sorted(d.get("engine_seconds", {}).items())})
PYEOF
fi
if wants diff; then
  timeout 200 $PY - "$BATCH" >"$OUT/driver-diff.txt" 2>&1 <<'PYEOF'
import sys
from pathlib import Path
import cv2, numpy as np
from imgops.engine import GRAY, Job, PipelineSettings, run_batch
files = sorted(Path(sys.argv[1]).glob("*.jpg"))[:100] + sorted(Path("samples").glob("*.jpg"))
out = {}
for device in ("cpu", "cuda"):
    d = Path(f"/tmp/imgops-diff-{device}"); d.mkdir(exist_ok=True)
    jobs = [Job(p, d / f"{i:03d}.png", p.name) for i, p in enumerate(files)]
    # host_while_starting off: every JPEG the GPU accepts is decoded there (none during start-up)
    s = run_batch(jobs, GRAY, PipelineSettings(device=device, overwrite=True, host_while_starting=False))
    print(device, s.line(), s.decoders, s.choice)
    out[device] = d
worst, same, total = 0, 0, 0
for i, p in enumerate(files):
    a = cv2.imread(str(out["cpu"] / f"{i:03d}.png"), cv2.IMREAD_UNCHANGED).astype(int)
    b = cv2.imread(str(out["cuda"] / f"{i:03d}.png"), cv2.IMREAD_UNCHANGED).astype(int)
    diff = np.abs(a - b).max() if a.shape == b.shape else 999
    worst = max(worst, diff); same += diff == 0; total += 1
    if diff > 1: print("DIFF", p.name, diff)
print(f"luma, GPU decode vs OpenCV decode: {total} files, max |diff| {worst}, identical files {same}")
PYEOF
  tail -n 3 "$OUT/driver-diff.txt"
fi
if wants startup; then
  $PY - "$BATCH" >"$OUT/driver-startup.txt" 2>&1 <<'PYEOF'
import sys, time
t = time.perf_counter()
def lap(what):
    global t
    now = time.perf_counter(); print(f"{what:40s} {1000 * (now - t):8.1f} ms"); t = now
from imgops.engine import cuda_driver; lap("import cuda_driver")
dev = cuda_driver.Device(0); stream = dev.stream(); lap("driver context + stream")
kernels = cuda_driver.Kernels(dev); lap("fatbin module load")
from imgops.io import gpu_decode; gpu_decode.module(); lap("import nvImageCodec")
decoder = gpu_decode.BatchDecoder(0); lap("nvImageCodec decoder")
decoder.warm_up(stream.handle); stream.synchronize(); lap("warm-up decode")
print("torch imported:", "torch" in sys.modules)
PYEOF
  cat "$OUT/driver-startup.txt"
fi
