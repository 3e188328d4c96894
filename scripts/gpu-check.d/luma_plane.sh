#!/usr/bin/env bash
# Can the GPU hand out a colour JPEG's stored luma plane, as libjpeg does for `imgops gray
# --luma stored`? scripts/luma_plane_probe.py on the photo batch: nvImageCodec asked for P_Y on
# colour JPEGs (hardware+gpu backends), its files/s against the colour decode, and its plane
# against OpenCV's IMREAD_GRAYSCALE and against the exact luma of its own colour decode.
# LUMA_PLANE_KINDS=cpu: no GPU (a dry run on nvImageCodec's CPU backend). $OUT/luma-plane.txt.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
timeout 240 $PY scripts/luma_plane_probe.py "${LUMA_PLANE_KINDS:-hardware+gpu}" \
  "${ENGINE_BATCH_DIR:-/tmp/imgops-photo-batch}" "${LUMA_PLANE_FILES:-128}" \
  2>&1 | tee "$OUT/luma-plane.txt" | tail -n 4
