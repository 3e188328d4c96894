#!/usr/bin/env bash
# IMGOPS_DECODE_STREAM=own (the default: nvImageCodec decodes on a stream of its own; the
# stage's stream waits for each decode through an event) against "stage" (the stage's stream):
# two warm `imgops serve` processes on GPU 0, one per setting (it is read when the stage
# starts), 800-photo and 3200-photo commands relayed to each in turn, each caller and both
# servers under scripts/timeline.py (--engine: every decode call, nvimgcodecDecoderDecode
# itself, the device batches, the relayed command's plan and engine); every 800-photo command's
# outputs kept and checked against the exact luma of OpenCV's decode at the end
# (serve_verify.py; "stage" wrote wrong pixels in 2 of 32 such commands on H100 hosts,
# 2026-12-07). After the build step (or with the torch-free CLI's compiled files in src/imgops).
# Results: $OUT/decode-stream-walls.txt (label|rc|ms|files|stats, then the checks),
# $OUT/decode-stream-timeline.txt and -timeline-stage.txt (each process's marks after a line
# giving its start in CLOCK_BOOTTIME, so that the callers' and the server's marks line up),
# $OUT/decode-stream-verify.txt. DECODE_STREAM_ROUNDS: rounds of 800 (default 6).
# SERVE_DEVICE=cpu: no GPU (a dry run of this script).
set -uo pipefail
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
ROUNDS=${DECODE_STREAM_ROUNDS:-6}
DEV=${SERVE_DEVICE:-cuda}
WALLS=$OUT/decode-stream-walls.txt TL=$OUT/decode-stream-timeline.txt
TL_STAGE=$OUT/decode-stream-timeline-stage.txt
export PYTHONUNBUFFERED=1
. scripts/gpu-check.d/photo-batches.bash
photo_batches decode-stream
SOCKETS=/tmp/imgops-decode-stream
mkdir -p "$SOCKETS" && chmod 700 "$SOCKETS"
: >"$WALLS"
IMGOPS_DECODE_STREAM=own $PY scripts/timeline.py --engine "$TL" serve --device "$DEV" \
  --idle-timeout 0 --socket "$SOCKETS/own.sock" -v 2>"$OUT/decode-stream-own.log" &
OWN=$!
IMGOPS_DECODE_STREAM=stage $PY scripts/timeline.py --engine "$TL_STAGE" \
  serve --device "$DEV" --idle-timeout 0 --socket "$SOCKETS/stage.sock" -v \
  2>"$OUT/decode-stream-stage.log" &
STAGE=$!
for _ in $(seq 600); do
  grep -q "ready at" "$OUT/decode-stream-own.log" && grep -q "ready at" "$OUT/decode-stream-stage.log" && break
  sleep 0.1
done
KEEP=/tmp/imgops-decode-stream-runs
rm -rf "$KEEP" && mkdir -p "$KEEP"
gray() {  # label, server (own|stage), input folder, gray's options...
  local label=$1 server=$2 dir=$3; shift 3
  IMGOPS_SERVER=$SOCKETS/$server.sock GRAY_CMD="$PY scripts/timeline.py --caller $TL" timed_gray \
    /tmp/imgops-decode-stream-out /tmp/imgops-decode-stream.json /tmp/imgops-decode-stream.err \
    "$dir" --device "$DEV" "$@"
  echo "$label|rc=$GRAY_RC|$GRAY_MS ms|$(ls /tmp/imgops-decode-stream-out | wc -l) files|$(engine_stats \
    /tmp/imgops-decode-stream.json)|$(tail -c 200 /tmp/imgops-decode-stream.err)" | tee -a "$WALLS"
  [ "$dir" = "$BATCH" ] && mv /tmp/imgops-decode-stream-out "$KEEP/${label// /-}"
}
gray "warm-up own 800" own "$BATCH"
gray "warm-up stage 800" stage "$BATCH"
for round in $(seq "$ROUNDS"); do
  gray "800 own $round" own "$BATCH"
  gray "800 stage $round" stage "$BATCH"
done
gray "3200 own" own "$BIG"
gray "3200 stage" stage "$BIG"
$PY -m imgops.entry serve --stop --socket "$SOCKETS/own.sock"
$PY -m imgops.entry serve --stop --socket "$SOCKETS/stage.sock"
wait "$OWN" "$STAGE"
$PY scripts/gpu-check.d/serve_verify.py "$BATCH" "$KEEP"/* >"$OUT/decode-stream-verify.txt" 2>&1
grep -E "checked|largest" "$OUT/decode-stream-verify.txt" | sed "s|$KEEP/||" | tee -a "$WALLS"
rm -rf "$KEEP"
