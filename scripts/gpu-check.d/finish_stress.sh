#!/usr/bin/env bash
# Two questions in one run of a warm `imgops serve` process on GPU 0, photo commands relayed:
#  1. Speed: framing and writing a device-deflated PNG in one native call (the default,
#     png_finish_zlib_to_file) against png_finish_zlib then the write (IMGOPS_FINISH_TO_FILE=0),
#     alternated (the variable travels with each relayed command), 800 and 3200 photos.
#  2. Correctness under repetition: every 800-photo command's outputs are compared byte for
#     byte with the first one's (same_outputs.py), which is checked against the exact luma of
#     OpenCV's decode (serve_verify.py); a command that differs is kept (up to KEEP_MAX) and
#     checked the same way at the end. (Until 2026-12-07 it also ran servers decoding on the
#     stage's stream, IMGOPS_DECODE_STREAM=stage, removed: docs/GPU.md, "The decode stream".)
# Rounds go on for STRESS_SECONDS (default 300). After the build step, or with the torch-free
# CLI's compiled files in src/imgops. Results: $OUT/finish-stress-walls.txt
# (label|rc|ms|files|stats|comparison), $OUT/finish-stress-verify.txt, the servers' logs.
# SERVE_DEVICE=cpu: no GPU (a dry run of the script).
set -uo pipefail
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
DEV=${SERVE_DEVICE:-cuda}
LIMIT=${STRESS_SECONDS:-300}
KEEP_MAX=${KEEP_MAX:-8}
WALLS=$OUT/finish-stress-walls.txt
export PYTHONUNBUFFERED=1
. scripts/gpu-check.d/photo-batches.bash
photo_batches finish-stress
SOCKETS=/tmp/imgops-finish-stress
mkdir -p "$SOCKETS" && chmod 700 "$SOCKETS"
: >"$WALLS"
$PY -m imgops.entry serve --device "$DEV" --idle-timeout 0 --socket "$SOCKETS/own.sock" -v \
  2>"$OUT/finish-stress-own.log" &
for _ in $(seq 900); do
  grep -q "ready at" "$OUT/finish-stress-own.log" && break
  sleep 0.1
done
WORK=/tmp/imgops-finish-stress-out KEEP=/tmp/imgops-finish-stress-kept REF=/tmp/imgops-finish-stress-ref
rm -rf "$WORK" "$KEEP" "$REF" && mkdir -p "$KEEP"
kept=0
gray() {  # label, fused (1|0), input folder
  local label=$1 fused=$2 dir=$3
  IMGOPS_SERVER=$SOCKETS/own.sock IMGOPS_FINISH_TO_FILE=$fused \
    timed_gray "$WORK" /tmp/imgops-finish-stress.json /tmp/imgops-finish-stress.err "$dir" \
    --device "$DEV"
  local files stats; files=$(ls "$WORK" | wc -l) stats=$(engine_stats /tmp/imgops-finish-stress.json)
  local compared="-"
  if [ "$dir" = "$BATCH" ]; then
    if [ ! -d "$REF" ]; then
      mv "$WORK" "$REF"; compared="reference"
    else
      compared=$($PY scripts/gpu-check.d/same_outputs.py "$REF" "$WORK" | sed "s|$WORK: ||")
      if [[ "$compared" != *identical* ]] && [ "$kept" -lt "$KEEP_MAX" ]; then
        mv "$WORK" "$KEEP/${label// /-}"; kept=$((kept + 1))
      fi
    fi
  fi
  echo "$label|rc=$GRAY_RC|$GRAY_MS ms|$files files|$stats|$compared|$(tail -c 160 /tmp/imgops-finish-stress.err)" | tee -a "$WALLS"
}
gray "warm-up fused 800" 1 "$BATCH"   # the reference
$PY scripts/gpu-check.d/serve_verify.py "$BATCH" "$REF" >"$OUT/finish-stress-verify.txt" 2>&1
grep -E "checked|largest" "$OUT/finish-stress-verify.txt" | sed "s|^|reference: |" | head -n 8 | tee -a "$WALLS"
began=$SECONDS round=0
while [ $((SECONDS - began)) -lt "$LIMIT" ]; do
  round=$((round + 1))
  if [ $((round % 2)) = 1 ]; then
    gray "800 fused $round" 1 "$BATCH"; gray "800 split $round" 0 "$BATCH"
  else
    gray "800 split $round" 0 "$BATCH"; gray "800 fused $round" 1 "$BATCH"
  fi
done
for k in 1 2 3; do
  gray "3200 fused $k" 1 "$BIG"; gray "3200 split $k" 0 "$BIG"
done
rm -rf "$WORK"
$PY -m imgops.entry serve --stop --socket "$SOCKETS/own.sock"
wait
if [ "$kept" -gt 0 ]; then
  $PY scripts/gpu-check.d/serve_verify.py "$BATCH" "$KEEP"/* >>"$OUT/finish-stress-verify.txt" 2>&1
  grep -E "checked|largest" "$OUT/finish-stress-verify.txt" | sed "s|$KEEP/||" | tail -n 40 | tee -a "$WALLS"
fi
$PY - "$WALLS" <<'PYEOF' | tee -a "$WALLS"
# Per setting: commands, how many differed from the reference, the median wall of 800 and 3200.
import re, statistics, sys
rows = [line.rstrip("\n").split("|") for line in open(sys.argv[1]) if line.count("|") >= 5]
groups = {}
for row in rows:
    label = row[0]
    if label.startswith("warm-up"):
        continue
    size, setting = label.split()[:2]
    ms = int(re.sub(r"\D", "", row[2]) or 0)
    g = groups.setdefault((size, setting), {"ms": [], "differ": 0, "n": 0})
    g["ms"].append(ms); g["n"] += 1
    g["differ"] += "differ" in row[5]
for (size, setting), g in sorted(groups.items()):
    print(f"summary {size} {setting}: {g['n']} commands, {g['differ']} differ, "
          f"median {statistics.median(g['ms'])} ms, min {min(g['ms'])} ms")
PYEOF
rm -rf "$KEEP" "$REF"
