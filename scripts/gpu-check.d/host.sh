#!/usr/bin/env bash
# What bounds the CPU side of `imgops gray` on the GPU host (issue 10), after the build step:
#  1. the host: CPUs, SMT, the filesystem of /tmp
#  2. scripts/host_profile.py: OpenCV decode, imgops deflate and durable writes, 1..16 threads
#  3. nvImageCodec's import, piece by piece (with and without a visible GPU)
#  4. py-spy --gil over `imgops gray --device cuda` (where py-spy is carried and may attach)
#  5. `imgops bench --pipeline` on the 800-photo batch: the pool, both floors, imgops cpu + cuda
# Results: $OUT/host-*.txt|json.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
BATCH=${ENGINE_BATCH_DIR:-/tmp/imgops-photo-batch}
PARTS=${HOST_PARTS:-host profile import spy pipeline}
wants() { [[ " $PARTS " == *" $1 "* ]]; }
export PYTHONUNBUFFERED=1
[ -d "$BATCH" ] || $PY scripts/make_photo_batch.py "$BATCH" --count 800 >"$OUT/host-batch.txt" 2>&1
if wants host; then
  { lscpu | grep -E "Model name|^CPU\(s\)|Thread|Core|Socket|MHz|NUMA node"; nproc; df -hT /tmp;
    free -g; cat /proc/pressure/cpu 2>/dev/null; uptime; } >"$OUT/host-machine.txt" 2>&1
  cat "$OUT/host-machine.txt"
fi
if wants profile; then
  timeout 240 $PY scripts/host_profile.py "$BATCH" --files 64 --threads 1,2,4,8,16 \
    --json "$OUT/host-profile.json" 2>&1 | tee "$OUT/host-profile.txt"
fi
if wants import; then
  {
    for v in "" "CUDA_VISIBLE_DEVICES="; do
      env $v $PY -c "import time; t = time.perf_counter(); import nvidia.nvimgcodec as n; \
print('import nvimgcodec ${v:-(GPU visible)}', round(1000 * (time.perf_counter() - t)), 'ms')"
    done
    $PY -X importtime -c "import nvidia.nvimgcodec" 2>&1 | sort -t'|' -k2 -n | tail -n 6
    $PY - <<'PYEOF'
import ctypes, glob, os, time, importlib.util
spec = importlib.util.find_spec("nvidia.nvimgcodec")
root = os.path.dirname(spec.origin)
libs = sorted(glob.glob(os.path.join(root, "**", "*.so*"), recursive=True))
jpeg = importlib.util.find_spec("nvidia.nvjpeg")
if jpeg and jpeg.submodule_search_locations:
    libs = sorted(glob.glob(os.path.join(list(jpeg.submodule_search_locations)[0], "**", "*.so*"), recursive=True)) + libs
for path in libs:
    t = time.perf_counter()
    try:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        what = "ok"
    except OSError as error:
        what = f"failed: {str(error)[:80]}"
    print(f"dlopen {os.path.relpath(path, os.path.dirname(root)):70s} {1000 * (time.perf_counter() - t):7.1f} ms {os.path.getsize(path) >> 20} MiB {what}")
t = time.perf_counter()
import nvidia.nvimgcodec
print(f"import after the dlopens {1000 * (time.perf_counter() - t):.1f} ms")
PYEOF
  } >"$OUT/host-import.txt" 2>&1
  cat "$OUT/host-import.txt"
fi
if wants spy; then
  SPY=$(command -v py-spy || echo /tmp/site/bin/py-spy)
  if [ -x "$SPY" ]; then
    rm -rf /tmp/imgops-spy; mkdir -p /tmp/imgops-spy
    timeout 200 "$SPY" record --gil --threads -r 250 -f raw -o "$OUT/host-spy-gil.txt" -- \
      $PY -m imgops.cli gray "$BATCH" -d /tmp/imgops-spy --device cuda -q \
      --stats-json "$OUT/host-spy-stats.json" >"$OUT/host-spy.log" 2>&1
    echo "py-spy gil rc=$? $(tail -n 2 "$OUT/host-spy.log" | tr '\n' ' ')"
    rm -rf /tmp/imgops-spy
  else
    echo "py-spy: not carried"
  fi
fi
if wants pipeline; then
  timeout 400 $PY -m imgops.cli bench --pipeline "$BATCH" --reps 1 --jpg --json \
    >"$OUT/host-pipeline.json" 2>"$OUT/host-pipeline.err"
  echo "bench --pipeline rc=$?"; tail -n 3 "$OUT/host-pipeline.err"
  $PY -c "import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps(d)[:3000])" "$OUT/host-pipeline.json"
fi
