#!/usr/bin/env bash
# Where the 800-photo batch spends its time on the GPU host (run from the repo root after the
# build step): wall time of `imgops gray` on cuda and cpu (two runs each, --stats-json with the
# device engine's per-thread phases), the in-process stack sampler (scripts/profile_batch.py),
# and py-spy's GIL/idle profiles where py-spy is installed and may attach.
# Results: $OUT/profile-*.txt|json.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
BATCH=${ENGINE_BATCH_DIR:-/tmp/imgops-photo-batch}
COUNT=${PROFILE_COUNT:-800}
export PYTHONUNBUFFERED=1
# imgops' CLI, then its peak RSS on stderr
MAXRSS='import resource, runpy, sys
sys.argv = ["imgops"] + sys.argv[1:]
try:
    runpy.run_module("imgops.cli", run_name="__main__")
finally:
    print("peak RSS", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024, "MiB", file=sys.stderr)'
[ -d "$BATCH" ] || $PY scripts/make_photo_batch.py "$BATCH" --count "$COUNT" >"$OUT/profile-batch.txt" 2>&1
gray() {  # device, extra args...: one timed run
  local device=$1; shift
  rm -rf "/tmp/imgops-profile-$device"; mkdir -p "/tmp/imgops-profile-$device"
  local t0; t0=$(date +%s%N)
  timeout 300 $PY -c "$MAXRSS" gray "$BATCH" -d "/tmp/imgops-profile-$device" --device "$device" -q "$@"
  local rc=$?
  echo "$device rc=$rc wall $(( ($(date +%s%N) - t0) / 1000000 )) ms $*"
}
{
  for rep in 1 2; do
    gray cuda --stats-json "$OUT/profile-cuda-$rep.json"
    gray cpu --stats-json "$OUT/profile-cpu-$rep.json"
  done
} >"$OUT/profile-wall.txt" 2>&1
# Start-up, piece by piece, each in a fresh process.
{
  $PY -X importtime -c "import torch" 2>/tmp/imgops-importtime.txt
  sort -t'|' -k2 -n /tmp/imgops-importtime.txt | tail -n 12
  $PY - "$BATCH" <<'PYEOF'
import sys, time
t = time.perf_counter()
def lap(what):
    global t
    now = time.perf_counter(); print(f"{what:40s} {1000 * (now - t):8.1f} ms"); t = now
import torch; lap("import torch")
torch.cuda.init(); torch.zeros(1, device="cuda"); lap("CUDA context")
from imgops import _extension; _extension.load(); lap("imgops extension load")
from imgops.io import gpu_decode; gpu_decode.module(); lap("import nvImageCodec")
decoder = gpu_decode.BatchDecoder(0); lap("nvImageCodec decoder")
from pathlib import Path
data = [p.read_bytes() for p in sorted(Path(sys.argv[1]).glob("*.jpg"))[:64]]
cands = [decoder.accept(d, 1 << 30) for d in data]; lap("accept 64 files")
decoder.decode([c for c in cands if c], 0); torch.cuda.synchronize(); lap("first decode, 64 files")
decoder.decode([c for c in cands if c], 0); torch.cuda.synchronize(); lap("second decode, 64 files")
PYEOF
} >"$OUT/profile-startup.txt" 2>&1
# Steady state: a 4x larger batch (the same photos), files/s of the extra files.
BIG=/tmp/imgops-photo-batch-big
[ -d "$BIG" ] || $PY scripts/make_photo_batch.py "$BIG" --count $((4 * COUNT)) >>"$OUT/profile-batch.txt" 2>&1
{
  for device in cuda cpu; do
    rm -rf /tmp/imgops-profile-big; mkdir -p /tmp/imgops-profile-big
    t0=$(date +%s%N)
    timeout 300 $PY -c "$MAXRSS" gray "$BIG" -d /tmp/imgops-profile-big --device $device -q \
      --stats-json "$OUT/profile-big-$device.json"
    echo "big $device rc=$? wall $(( ($(date +%s%N) - t0) / 1000000 )) ms"
  done
  rm -rf /tmp/imgops-profile-big
} >>"$OUT/profile-wall.txt" 2>&1
rm -rf /tmp/imgops-profile-cuda
timeout 200 $PY scripts/profile_batch.py --interval 2 -- gray "$BATCH" -d /tmp/imgops-profile-cuda \
  --device cuda -q >"$OUT/profile-sampler-cuda.txt" 2>&1
if command -v py-spy >/dev/null || [ -x /tmp/site/bin/py-spy ]; then
  SPY=$(command -v py-spy || echo /tmp/site/bin/py-spy)
  for mode in gil; do
    rm -rf /tmp/imgops-profile-cuda
    flag=$([ $mode = gil ] && echo --gil || echo --idle)
    timeout 200 "$SPY" record $flag --threads -r 200 -f raw -o "$OUT/profile-spy-$mode.txt" -- \
      $PY -m imgops.cli gray "$BATCH" -d /tmp/imgops-profile-cuda --device cuda -q \
      >"$OUT/profile-spy-$mode.log" 2>&1
    echo "py-spy $mode rc=$?" >>"$OUT/profile-wall.txt"
  done
fi
$PY - "$OUT" >>"$OUT/profile-wall.txt" 2>&1 <<'PYEOF'
import json, sys, glob, os
for path in sorted(glob.glob(os.path.join(sys.argv[1], "profile-c*.json")) + glob.glob(os.path.join(sys.argv[1], "profile-big-*.json"))):
    d = json.load(open(path))
    files = d.get("written", 0)
    wall = d.get("wall_seconds") or 0
    print(os.path.basename(path), files, "files", f"{files / wall:.1f} files/s" if wall else "")
    print("  stages (s, summed over files):", {k: round(v, 2) for k, v in d.get("stage_seconds", {}).items()})
    print("  engine (s, summed over threads):", {k: round(v, 2) for k, v in d.get("engine_seconds", {}).items()})
    print("  GPU memory in use, peak:", d.get("gpu_peak_bytes"))
PYEOF
cat "$OUT/profile-wall.txt" "$OUT/profile-startup.txt"
head -n 60 "$OUT/profile-sampler-cuda.txt"
# The crossover of --device auto, from a two-point model per device (wall = fixed + files / rate,
# fitted to the 800-file and the 4x batch; process walls, start-up included).
$PY - "$OUT/profile-wall.txt" "$COUNT" <<'PYEOF' | tee -a "$OUT/profile-wall.txt"
import re, statistics, sys
text = open(sys.argv[1]).read()
small = int(sys.argv[2])
fit = {}
for device in ("cuda", "cpu"):
    a = statistics.median([int(m) / 1000 for m in re.findall(rf"(?m)^{device} rc=0 wall (\d+) ms", text)])
    b = [int(m) / 1000 for m in re.findall(rf"(?m)^big {device} rc=0 wall (\d+) ms", text)][0]
    rate = 3 * small / (b - a)
    fixed = a - small / rate
    fit[device] = (fixed, rate)
    print(f"model {device}: {fixed:.2f} s fixed + files / {rate:.1f} files/s")
(fc, rc), (fp, rp) = fit["cuda"], fit["cpu"]
if rc > rp:
    print(f"model crossover: CUDA first from {int((fc - fp) / (1 / rp - 1 / rc)) + 1} files")
else:
    print("model crossover: none (the CPU path is faster per file)")
PYEOF
