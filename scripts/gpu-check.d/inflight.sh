#!/usr/bin/env bash
# IMGOPS_DECODE_IN_FLIGHT=2 (the decode thread submits the next nvImageCodec call before it
# waits for the last; off by default, added 2026-12-07 without a GPU run) against 1: process
# walls of `imgops gray` relayed to a warm `imgops serve` (800 photos x3, 3200 x2, alternated),
# the outputs of the last run checked against OpenCV's luma; then the server's RSS, threads and
# GPU memory over further commands (does it settle?); then scripts/decode_split_probe.py.
# After the build step (or with the torch-free CLI's compiled files in src/imgops).
# INFLIGHT_DEVICE=cpu: a dry run without a GPU (the probe then fails: it needs CUDA).
# INFLIGHT_MEMORY=0: without the memory rows.
# Results: $OUT/inflight-walls.txt, $OUT/inflight-memory.txt, $OUT/inflight-probe.txt.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
WALLS=$OUT/inflight-walls.txt
DEV=${INFLIGHT_DEVICE:-cuda}  # cpu: a dry run of this script without a GPU
export PYTHONUNBUFFERED=1
. scripts/gpu-check.d/photo-batches.bash
photo_batches inflight
SOCKET=/tmp/imgops-inflight/s.sock
mkdir -p "$(dirname $SOCKET)" && chmod 700 "$(dirname $SOCKET)"
$PY -m imgops.cli serve --socket $SOCKET --device "$DEV" -v --idle-timeout 0 2>"$OUT/inflight-log.txt" &
SERVER=$!
for _ in $(seq 600); do grep -q "ready at" "$OUT/inflight-log.txt" && break; sleep 0.1; done
gray() {  # label, input folder, in flight (1|2), gray's options...
  local label=$1 dir=$2 n=$3; shift 3
  rm -rf /tmp/imgops-inflight-out; mkdir -p /tmp/imgops-inflight-out
  local s; s=$(date +%s%N)
  IMGOPS_SERVER=$SOCKET IMGOPS_DECODE_IN_FLIGHT=$n timeout 200 $PY -m imgops.entry gray "$dir" \
    -d /tmp/imgops-inflight-out -q --no-fsync --stats-json /tmp/imgops-inflight.json "$@" \
    2>/tmp/imgops-inflight.err
  local rc=$? ms=$(( ($(date +%s%N) - s) / 1000000 ))
  echo "$label|rc=$rc|$ms ms|$($PY -c "
import json
d = json.load(open('/tmp/imgops-inflight.json'))
e = d['engine_seconds']
b = d.get('gpu_decode_batches') or [0]
print(d.get('decoders'), round(d['wall_seconds'], 3),
      {k: round(v, 2) for k, v in e.items() if k.startswith('device.') and v > 0.01},
      f'decode calls {len(b)}, files {min(b)}-{max(b)}, mean {sum(b) / len(b):.1f}')
" 2>&1 | tail -n 1)|$(tail -c 200 /tmp/imgops-inflight.err)" | tee -a "$WALLS"
}
memory() {  # label
  echo "$1|$(grep -E 'VmRSS|VmHWM' /proc/$SERVER/status | tr -s ' \t' ' ' | tr '\n' ' ')threads $(ls /proc/$SERVER/task | wc -l)|GPU $(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2>/dev/null | awk -F', ' -v p="$SERVER" '$1 == p {print $2}')" | tee -a "$OUT/inflight-memory.txt"
}
: >"$WALLS"
gray "warm-up" "$BATCH" 1 --device "$DEV"
for round in 1 2 3; do
  gray "800, in flight 1" "$BATCH" 1 --device "$DEV"
  gray "800, in flight 2" "$BATCH" 2 --device "$DEV"
done
$PY scripts/gpu-check.d/serve_verify.py "$BATCH" /tmp/imgops-inflight-out 2>&1 | tee -a "$WALLS"
for round in 1 2; do
  gray "3200, in flight 1" "$BIG" 1 --device "$DEV"
  gray "3200, in flight 2" "$BIG" 2 --device "$DEV"
done
memory "after the A/B"
if [ "${INFLIGHT_MEMORY:-1}" = 1 ]; then  # 0: skip the memory rows (a short call)
  for i in 1 2 3 4 5; do gray "800 #$i" "$BATCH" 1 --device "$DEV" >/dev/null; memory "after 800 #$i"; done
  for i in 1 2 3; do gray "800 jpg #$i" "$BATCH" 1 --device "$DEV" -f jpg >/dev/null; memory "after jpg #$i"; done
  for i in 1 2 3 4 5; do gray "800 again #$i" "$BATCH" 1 --device "$DEV" >/dev/null; memory "after 800 again #$i"; done
fi
kill -TERM $SERVER
wait $SERVER
timeout 120 $PY scripts/decode_split_probe.py "$BATCH" 2>&1 | tee "$OUT/inflight-probe.txt"
