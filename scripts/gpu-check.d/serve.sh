#!/usr/bin/env bash
# `imgops serve` on a GPU host: process walls of `imgops gray` relayed to a server that keeps
# GPU 0 warm against cold runs, on the 800-photo batch and the same hard-linked 4 times
# (3200), PNG and `-f jpg`, with the OpenCV 16-process pool of `imgops bench` as the baseline;
# small batches (1, 64 files) relayed on cuda and cpu; 64 single-file calls under xargs -P
# (nproc at once: the server runs them one after another), relayed and cold; the relayed
# outputs checked against the exact luma of OpenCV's decode; then IMGOPS_NVIMGCODEC_GIL=hold
# against release (cold, 3200).
# After the build step (or with the torch-free CLI's compiled files in src/imgops).
# Each call goes through `python -m imgops.entry` (what the installed `imgops` runs; before
# 2026-12-07 through imgops.cli, which imports the command line before relaying).
# SERVE_DEVICE=cpu: the server keeps no GPU warm (a dry run of this script without a GPU).
# Results: $OUT/serve-walls.txt (label|rc|ms|files|stats), $OUT/serve-log.txt.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
ROUNDS=${SERVE_ROUNDS:-2}
WALLS=$OUT/serve-walls.txt
export PYTHONUNBUFFERED=1
. scripts/gpu-check.d/photo-batches.bash
photo_batches serve
for n in 1 64; do
  if [ ! -d "$BATCH-$n" ]; then
    mkdir -p "$BATCH-$n"
    ls "$BATCH" | head -n $n | while read -r f; do ln "$BATCH/$f" "$BATCH-$n/$f"; done
  fi
done
ls "$BATCH"/* >/tmp/imgops-serve-list.txt
gray() {  # label, input folder, env (VAR=value or -), gray's options...
  local label=$1 dir=$2 env=$3; shift 3
  [ "$env" = - ] && env=IMGOPS_SERVE_CHECK=1
  rm -rf /tmp/imgops-serve /tmp/imgops-serve.json; mkdir -p /tmp/imgops-serve
  local s; s=$(date +%s%N)
  env "$env" timeout 200 $PY -m imgops.entry gray "$dir" -d /tmp/imgops-serve -q --no-fsync \
    --stats-json /tmp/imgops-serve.json "$@" 2>/tmp/imgops-serve.err
  local rc=$? ms=$(( ($(date +%s%N) - s) / 1000000 ))
  echo "$label|rc=$rc|$ms ms|$(ls /tmp/imgops-serve | wc -l) files|$($PY -c "
import json
d = json.load(open('/tmp/imgops-serve.json'))
e = d['engine_seconds']
keys = ('device.decode', 'device.wait_decode', 'device.pinning', 'device.wait_pool')
print(d.get('choice'), d.get('decoders'), round(d['wall_seconds'], 3),
      {k: round(e.get(k, 0), 2) for k in keys})
" 2>&1 | tail -n 1)|$(tail -c 200 /tmp/imgops-serve.err)" | tee -a "$WALLS"
}
pool() {  # label, format: the OpenCV pool that imgops bench times
  rm -rf /tmp/imgops-serve-pool
  local s; s=$(date +%s%N)
  OPENBLAS_NUM_THREADS=1 timeout 200 $PY src/imgops/bench/opencv_pool.py --files-from \
    /tmp/imgops-serve-list.txt --jobs "$(nproc)" -d /tmp/imgops-serve-pool --format "$2" \
    >/tmp/imgops-serve-pool.err 2>&1
  local rc=$?
  echo "$1|rc=$rc|$(( ($(date +%s%N) - s) / 1000000 )) ms|$(ls /tmp/imgops-serve-pool | wc -l) files|$(du -sb /tmp/imgops-serve-pool | cut -f1) bytes" | tee -a "$WALLS"
}
server_memory() {  # label: the server's RSS, threads and GPU memory (growth across commands?)
  local gpu; gpu=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2>/dev/null \
    | awk -F', ' -v p="$SERVER" '$1 == p {print $2}')
  echo "$1|server $(grep -E 'VmRSS|VmHWM' /proc/$SERVER/status | tr -s ' \t' ' ' | tr '\n' ' ')threads $(ls /proc/$SERVER/task | wc -l)|GPU ${gpu:-?}" | tee -a "$WALLS"
}
verify() {  # input folder: the outputs of the last gray run against OpenCV's luma
  $PY scripts/gpu-check.d/serve_verify.py "$1" /tmp/imgops-serve 2>&1 | tee -a "$WALLS"
}
: >"$WALLS"
SOCKET=/tmp/imgops-serve-check/s.sock
mkdir -p "$(dirname $SOCKET)" && chmod 700 "$(dirname $SOCKET)"
$PY -m imgops.cli serve --socket $SOCKET --device "${SERVE_DEVICE:-cuda}" -v --idle-timeout 0 2>"$OUT/serve-log.txt" &
SERVER=$!
for _ in $(seq 600); do grep -q "ready at" "$OUT/serve-log.txt" && break; sleep 0.1; done
head -n 1 "$OUT/serve-log.txt" | tee -a "$WALLS"
RELAY=IMGOPS_SERVER=$SOCKET
gray "warm-up: 64 relayed, cuda" "$BATCH-64" $RELAY --device cuda
for round in $(seq "$ROUNDS"); do
  gray "800 relayed cuda" "$BATCH" $RELAY --device cuda
  gray "800 relayed auto" "$BATCH" $RELAY --device auto
  gray "800 relayed cpu" "$BATCH" $RELAY --device cpu
  gray "800 cold cuda" "$BATCH" - --device cuda
  gray "800 cold cpu" "$BATCH" - --device cpu
  pool "800 opencv pool png" png
  server_memory "after round $round of 800"
done
gray "800 relayed cuda (checked)" "$BATCH" $RELAY --device cuda
verify "$BATCH"
for round in $(seq "$ROUNDS"); do
  gray "3200 relayed cuda" "$BIG" $RELAY --device cuda
  gray "3200 cold cuda" "$BIG" - --device cuda
done
for n in 1 64; do
  gray "$n relayed cuda" "$BATCH-$n" $RELAY --device cuda
  gray "$n relayed cpu" "$BATCH-$n" $RELAY --device cpu
done
ls "$BATCH-64"/* >/tmp/imgops-serve-64.txt
each() {  # label, env (VAR=value or -): 64 single-file calls, xargs -P nproc, as a shell loop runs
  local env=$2; [ "$env" = - ] && env=IMGOPS_SERVE_CHECK=1
  rm -rf /tmp/imgops-serve; mkdir -p /tmp/imgops-serve
  local s; s=$(date +%s%N)
  env "$env" xargs -P "$(nproc)" -I{} sh -c \
    "$PY -m imgops.entry gray {} -o /tmp/imgops-serve/\$(basename {} .jpg).png -q --no-fsync" \
    </tmp/imgops-serve-64.txt 2>/tmp/imgops-serve.err
  echo "$1|rc=$?|$(( ($(date +%s%N) - s) / 1000000 )) ms|$(ls /tmp/imgops-serve | wc -l) files|$(tail -c 200 /tmp/imgops-serve.err)" | tee -a "$WALLS"
}
for round in $(seq "$ROUNDS"); do
  each "64 single-file calls, xargs -P $(nproc), relayed" $RELAY
  each "64 single-file calls, xargs -P $(nproc), cold" -
done
for round in $(seq "$ROUNDS"); do
  gray "800 relayed cuda -f jpg" "$BATCH" $RELAY --device cuda -f jpg
  gray "800 cold cuda -f jpg" "$BATCH" - --device cuda -f jpg
  gray "800 cold cpu -f jpg" "$BATCH" - --device cpu -f jpg
  pool "800 opencv pool jpg" jpg
done
server_memory "at the end"
$PY -m imgops.cli serve --socket $SOCKET --status 2>&1 | tee -a "$WALLS"
kill -TERM $SERVER
wait $SERVER
echo "server exit $? ; socket left: $(ls $SOCKET 2>/dev/null || echo none)" | tee -a "$WALLS"
for round in $(seq "$ROUNDS"); do  # nvImageCodec's per-image calls releasing or keeping the GIL
  gray "3200 cold cuda, GIL release" "$BIG" IMGOPS_NVIMGCODEC_GIL=release --device cuda
  gray "3200 cold cuda, GIL hold" "$BIG" IMGOPS_NVIMGCODEC_GIL=hold --device cuda
done
verify "$BIG"
