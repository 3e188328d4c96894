#!/usr/bin/env bash
# Where a warm server's 800-photo commands spend their wall (relayed, --no-fsync): a server
# under scripts/timeline.py --engine, RAMP_ROUNDS commands (default 6) relayed to it, then one
# line per command from scripts/timeline_ramps.py (first file read, first decode, last decode,
# last device batch, last encode, the command's end; decode and device busy times) beside the
# caller's wall and the engine's phases. $OUT/warm-ramps.txt, the timelines in $OUT.
# SERVE_DEVICE=cpu: no GPU (a dry run of the script).
set -uo pipefail
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
DEV=${SERVE_DEVICE:-cuda}
ROUNDS=${RAMP_ROUNDS:-6}
REPORT=$OUT/warm-ramps.txt TL=$OUT/warm-ramps-server.txt TLC=$OUT/warm-ramps-callers.txt
export PYTHONUNBUFFERED=1
. scripts/gpu-check.d/photo-batches.bash
photo_batches warm-ramps
mkdir -p /tmp/imgops-warm-ramps && chmod 700 /tmp/imgops-warm-ramps
SOCKET=/tmp/imgops-warm-ramps/server.sock
rm -f "$TL" "$TLC"
: >"$REPORT"
$PY scripts/timeline.py --engine "$TL" serve --device "$DEV" --idle-timeout 0 --socket "$SOCKET" \
  -v 2>"$OUT/warm-ramps-server.log" &
SERVER=$!
for _ in $(seq 900); do
  grep -q "ready at" "$OUT/warm-ramps-server.log" && break
  sleep 0.1
done
for round in $(seq 0 "$ROUNDS"); do  # round 0 warms the server up
  IMGOPS_SERVER=$SOCKET GRAY_CMD="$PY scripts/timeline.py --caller $TLC" timed_gray \
    /tmp/imgops-warm-ramps-out /tmp/imgops-warm-ramps.json /tmp/imgops-warm-ramps.err \
    "$BATCH" --device "$DEV"
  echo "round $round|rc=$GRAY_RC|$GRAY_MS ms|$(ls /tmp/imgops-warm-ramps-out | wc -l) files|$(engine_stats \
    /tmp/imgops-warm-ramps.json)" | tee -a "$REPORT"
done
$PY -m imgops.entry serve --stop --socket "$SOCKET"
wait "$SERVER"
$PY scripts/timeline_ramps.py "$TL" | tee -a "$REPORT"
rm -rf /tmp/imgops-warm-ramps-out
