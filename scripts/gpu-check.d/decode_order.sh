#!/usr/bin/env bash
# Whether nvImageCodec's GPU decode writes memory that work queued on a stream still reads
# (tests/decode_order.py): its engine's own decode stream (must stay clean) against the stage's
# stream (nvJPEG's hardware decode writes when called: docs/GPU.md, "The decode stream"), with
# a sample JPEG and, where the photo batch exists, one of its photos. $OUT/decode-order.txt.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
{
  $PY tests/decode_order.py "${DECODE_ORDER_ROUNDS:-5}"
  photo=${ENGINE_BATCH_DIR:-/tmp/imgops-photo-batch}/photo_0001.jpg
  [ -f "$photo" ] && $PY tests/decode_order.py "${DECODE_ORDER_ROUNDS:-5}" "$photo"
} 2>&1 | tee "$OUT/decode-order.txt" | grep -E "skipped|corrupted"
