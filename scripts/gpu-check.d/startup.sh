#!/usr/bin/env bash
# Start-up, shut-down and the GIL on the GPU host (issue 10), after the build step:
#  1. nvImageCodec's life cycle in a fresh process: import (with a native py-spy profile where
#     py-spy is carried), decoder, warm-up, 64-file decode, the decoder's release, the context's
#     release, and the process exit (measured from outside), with and without the release
#  2. py-spy --gil over `imgops gray --device cpu` on the 800-photo batch, with --stats-json
#  3. process walls: cpu and cuda, two alternated rounds, and cpu with -j 24
# Results: $OUT/startup-*.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
BATCH=${ENGINE_BATCH_DIR:-/tmp/imgops-photo-batch}
PARTS=${STARTUP_PARTS:-life spy walls}
wants() { [[ " $PARTS " == *" $1 "* ]]; }
SPY=$(command -v py-spy || echo /tmp/site/bin/py-spy)
export PYTHONUNBUFFERED=1
[ -d "$BATCH" ] || $PY scripts/make_photo_batch.py "$BATCH" --count 800 >"$OUT/startup-batch.txt" 2>&1
if wants life; then
  cat >/tmp/imgops-life.py <<'PYEOF'
import ctypes, os, sys, time
from pathlib import Path
t0 = t = time.perf_counter()
def lap(what):
    global t
    now = time.perf_counter(); print(f"{what:36s} {1000 * (now - t):8.1f} ms", flush=True); t = now
from imgops.engine import cuda_driver
dev = cuda_driver.Device(0); stream = dev.stream(); lap("context + stream")
from imgops.io import gpu_decode
gpu_decode.module(); lap("import nvImageCodec")
decoder = gpu_decode.BatchDecoder(0); lap("decoder")
decoder.warm_up(stream.handle); stream.synchronize(); lap("warm-up")
data = [p.read_bytes() for p in sorted(Path(sys.argv[1]).glob("*.jpg"))[:64]]
cands = [decoder.accept(d, 1 << 30) for d in data]; lap("accept 64")
images = decoder.decode([c for c in cands if c], stream.handle); stream.synchronize(); lap("decode 64")
del images
mode = sys.argv[2]
if mode == "release":
    del decoder; lap("release the decoder")
    stream.close(); dev.close(); lap("release stream + context")
elif mode == "leak":
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(decoder)); del decoder; lap("decoder kept (leaked)")
print(f"inside total {1000 * (time.perf_counter() - t0):.0f} ms", flush=True)
PYEOF
  {
    for mode in release leak release leak; do
      s=$(date +%s%N)
      $PY /tmp/imgops-life.py "$BATCH" $mode
      echo "== $mode: process wall $(( ($(date +%s%N) - s) / 1000000 )) ms"
    done
    if [ -x "$SPY" ]; then
      "$SPY" record --native -r 500 -f raw -o "$OUT/startup-import-native.txt" -- \
        $PY -c "import nvidia.nvimgcodec" >/dev/null 2>&1
      echo "py-spy native import rc=$?"
    fi
  } >"$OUT/startup-life.txt" 2>&1
  cat "$OUT/startup-life.txt"
  [ -f "$OUT/startup-import-native.txt" ] && $PY - "$OUT/startup-import-native.txt" <<'PYEOF'
import collections, sys
leaf, incl = collections.Counter(), collections.Counter()
for line in open(sys.argv[1]):
    stack, _, n = line.rstrip().rpartition(" ")
    frames = stack.split(";")
    leaf[frames[-1][:100]] += int(n)
    for f in set(x.split(" (")[0][:80] for x in frames):
        incl[f] += int(n)
print("native leaves:"); [print(" ", v, k) for k, v in leaf.most_common(15)]
print("native inclusive:"); [print(" ", v, k) for k, v in incl.most_common(45)]
PYEOF
fi
if wants spy && [ -x "$SPY" ]; then
  rm -rf /tmp/imgops-spy; mkdir -p /tmp/imgops-spy
  timeout 200 "$SPY" record --gil --threads -r 250 -f raw -o "$OUT/startup-spy-cpu.txt" -- \
    $PY -m imgops.cli gray "$BATCH" -d /tmp/imgops-spy --device cpu -q \
    --stats-json "$OUT/startup-spy-cpu.json" >"$OUT/startup-spy-cpu.log" 2>&1
  echo "py-spy gil cpu rc=$? $(grep -o "Samples: [0-9]*" "$OUT/startup-spy-cpu.log")"
  rm -rf /tmp/imgops-spy
fi
if wants walls; then
  gray() {
    local label=$1; shift
    rm -rf /tmp/imgops-w; mkdir -p /tmp/imgops-w
    local s; s=$(date +%s%N)
    timeout 200 $PY -m imgops.cli gray "$BATCH" -d /tmp/imgops-w -q "$@" 2>/tmp/imgops-w.err
    echo "$label rc=$? wall_ms $(( ($(date +%s%N) - s) / 1000000 )) files $(ls /tmp/imgops-w | wc -l) $(tail -n 1 /tmp/imgops-w.err)"
  }
  {
    for rep in 1 2; do
      gray "800 cpu" --device cpu --stats-json "$OUT/startup-cpu-$rep.json"
      gray "800 cuda" --device cuda --stats-json "$OUT/startup-cuda-$rep.json"
      gray "800 cpu -j 24" --device cpu -j 24
    done
  } >"$OUT/startup-walls.txt" 2>&1
  cat "$OUT/startup-walls.txt"
fi
