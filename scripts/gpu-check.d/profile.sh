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
[ -d "$BATCH" ] || $PY scripts/make_photo_batch.py "$BATCH" --count "$COUNT" >"$OUT/profile-batch.txt" 2>&1
gray() {  # device, extra args...: one timed run
  local device=$1; shift
  rm -rf "/tmp/imgops-profile-$device"; mkdir -p "/tmp/imgops-profile-$device"
  local t0; t0=$(date +%s%N)
  timeout 300 $PY -m imgops.cli gray "$BATCH" -d "/tmp/imgops-profile-$device" --device "$device" -q "$@"
  local rc=$?
  echo "$device rc=$rc wall $(( ($(date +%s%N) - t0) / 1000000 )) ms $*"
}
{
  for rep in 1 2; do
    gray cuda --stats-json "$OUT/profile-cuda-$rep.json"
    gray cpu --stats-json "$OUT/profile-cpu-$rep.json"
  done
  gray cuda --jobs 8 --stats-json "$OUT/profile-cuda-j8.json"
  gray cuda --jobs 32 --stats-json "$OUT/profile-cuda-j32.json"
} >"$OUT/profile-wall.txt" 2>&1
$PY - "$OUT" >>"$OUT/profile-wall.txt" 2>&1 <<'PYEOF'
import json, sys, glob, os
for path in sorted(glob.glob(os.path.join(sys.argv[1], "profile-c*.json"))):
    d = json.load(open(path))
    files = d.get("written", 0)
    wall = d.get("wall_seconds") or 0
    print(os.path.basename(path), files, "files", f"{files / wall:.1f} files/s" if wall else "")
    print("  stages (s, summed over files):", {k: round(v, 2) for k, v in d.get("stage_seconds", {}).items()})
    print("  engine (s, summed over threads):", {k: round(v, 2) for k, v in d.get("engine_seconds", {}).items()})
PYEOF
rm -rf /tmp/imgops-profile-cuda
timeout 200 $PY scripts/profile_batch.py --interval 2 -- gray "$BATCH" -d /tmp/imgops-profile-cuda \
  --device cuda -q >"$OUT/profile-sampler-cuda.txt" 2>&1
if command -v py-spy >/dev/null || [ -x /tmp/site/bin/py-spy ]; then
  SPY=$(command -v py-spy || echo /tmp/site/bin/py-spy)
  for mode in gil idle; do
    rm -rf /tmp/imgops-profile-cuda
    flag=$([ $mode = gil ] && echo --gil || echo --idle)
    timeout 200 "$SPY" record $flag --threads -r 200 -f raw -o "$OUT/profile-spy-$mode.txt" -- \
      $PY -m imgops.cli gray "$BATCH" -d /tmp/imgops-profile-cuda --device cuda -q \
      >"$OUT/profile-spy-$mode.log" 2>&1
    echo "py-spy $mode rc=$?" >>"$OUT/profile-wall.txt"
  done
fi
cat "$OUT/profile-wall.txt"
head -n 60 "$OUT/profile-sampler-cuda.txt"
