#!/usr/bin/env bash
# A/B process walls of `imgops gray` on the 800-photo batch: this tree against an older one
# (AB_OLD: a folder holding an older `imgops` package, e.g. `git archive REV src | tar x -C D`
# then AB_OLD=D/src), after the build step; the older tree gets this build's compiled files.
# Rounds alternate old and new. Extra runs: AB_EXTRA="cpu -j 14;cuda -j 12" (new tree only).
# Results: $OUT/ab-walls.txt and a median table.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
BATCH=${ENGINE_BATCH_DIR:-/tmp/imgops-photo-batch}
ROUNDS=${AB_ROUNDS:-3}
OLD=${AB_OLD:-}
if [ -z "$OLD" ]; then echo "ab: AB_OLD (an older src folder) not set: nothing to compare"; exit 0; fi
export PYTHONUNBUFFERED=1
[ -d "$BATCH" ] || $PY scripts/make_photo_batch.py "$BATCH" --count 800 >"$OUT/ab-batch.txt" 2>&1
cp src/imgops/_C*.so src/imgops/_cli_kernels*.so src/imgops/_build_meta.json \
  src/imgops/_device_kernels.fatbin "$OLD/imgops/" 2>/dev/null
gray() {  # label, src folder, device, extra args...
  local label=$1 src=$2 device=$3; shift 3
  rm -rf /tmp/imgops-ab; mkdir -p /tmp/imgops-ab
  local s; s=$(date +%s%N)
  PYTHONPATH="$src:${PYTHONPATH:-}" timeout 200 $PY -m imgops.cli gray "$BATCH" -d /tmp/imgops-ab \
    --device "$device" -q "$@" 2>/tmp/imgops-ab.err
  echo "$label|rc=$?|$(( ($(date +%s%N) - s) / 1000000 ))|$(ls /tmp/imgops-ab | wc -l)|$(tail -n 1 /tmp/imgops-ab.err)"
}
{
  for rep in $(seq 1 "$ROUNDS"); do
    for device in cpu cuda; do
      gray "old $device" "$OLD" $device
      gray "new $device" "$PWD/src" $device
    done
    IFS=';' read -ra extra <<<"${AB_EXTRA:-}"
    for e in "${extra[@]}"; do
      set -- $e
      gray "new $*" "$PWD/src" "$@"
    done
  done
} >"$OUT/ab-walls.txt" 2>&1
$PY scripts/walls_table.py "$OUT/ab-walls.txt"
