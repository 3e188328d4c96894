#!/usr/bin/env bash
# What the changes of 2026-12-05/06 still need on a GPU host (they were made with no GPU run):
# process walls of `imgops gray` (800 photos, and 3200 = the 800 hard-linked 4 times), this tree
# against an older one (AB_OLD: an older src folder, e.g. `git archive e7c6de1 src | tar x -C D`
# then AB_OLD=D/src; it gets this build's compiled files), then the switches each change
# brought, one run each: nvJPEG-only extensions and the parallel start (off by default), glibc's
# default malloc, OpenBLAS's default threads, a 512 MiB pinned pool, `-f jpg` with the Python
# module's JPEG encoder (the C API's is the default since 2026-12-06; encode.encode near 0 s
# means nvJPEG encoded, not OpenCV); the bytes of old and new; the CUDA tests of those areas.
# `--stats-json` engine seconds are printed with each wall (device.pinning: new buffers pinned).
# Results: $OUT/pending-*.txt.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
OLD=${AB_OLD:-}
export PYTHONUNBUFFERED=1
. scripts/gpu-check.d/photo-batches.bash
photo_batches pending
if [ -n "$OLD" ]; then
  cp src/imgops/_C*.so src/imgops/_cli_kernels*.so src/imgops/_build_meta.json \
    src/imgops/_device_kernels.fatbin "$OLD/imgops/" 2>/dev/null
fi
NEW=$PWD/src
gray() {  # label, src folder, input folder, args...: one wall and its engine seconds
  local label=$1 src=$2 dir=$3; shift 3
  rm -rf /tmp/imgops-pending /tmp/imgops-pending.json; mkdir -p /tmp/imgops-pending
  local s; s=$(date +%s%N)
  PYTHONPATH="$src:${PYTHONPATH:-}" timeout 200 $PY -m imgops.cli gray "$dir" \
    -d /tmp/imgops-pending -q --no-fsync --stats-json /tmp/imgops-pending.json "$@" \
    2>/tmp/imgops-pending.err
  local rc=$? ms=$(( ($(date +%s%N) - s) / 1000000 ))
  echo "$label|rc=$rc|${ms} ms|$(ls /tmp/imgops-pending | wc -l) files|$($PY -c "
import json
d = json.load(open('/tmp/imgops-pending.json'))
print(d.get('decoders'), {k: round(v, 2) for k, v in d['engine_seconds'].items()})
" 2>&1 | tail -n 1)|$(tail -c 200 /tmp/imgops-pending.err)"
}
{
  if [ -n "$OLD" ]; then
    for v in old new; do src=$NEW; [ $v = old ] && src=$OLD
      gray "800 cuda $v" "$src" "$BATCH" --device cuda
      gray "800 cpu $v" "$src" "$BATCH" --device cpu
      gray "3200 cuda $v" "$src" "$BIG" --device cuda
      gray "800 cuda -f jpg $v" "$src" "$BATCH" --device cuda -f jpg
    done
  fi
  IMGOPS_NVIMGCODEC_EXTENSIONS=nvjpeg gray "800 cuda, nvJPEG's extension only" "$NEW" "$BATCH" --device cuda
  IMGOPS_STAGE_START=parallel gray "800 cuda, parallel start" "$NEW" "$BATCH" --device cuda
  IMGOPS_MALLOC=default gray "800 cpu, glibc's default malloc" "$NEW" "$BATCH" --device cpu
  OPENBLAS_NUM_THREADS=$(nproc) gray "800 cpu, OpenBLAS's threads" "$NEW" "$BATCH" --device cpu
  IMGOPS_PINNED_MIB=512 gray "3200 cuda, 512 MiB pinned pool" "$NEW" "$BIG" --device cuda
  for round in 1 2 3; do  # nvImageCodec's per-image calls keeping the GIL (2026-12-06, untimed)
    gray "3200 cuda, nvImageCodec calls release the GIL" "$NEW" "$BIG" --device cuda
    IMGOPS_NVIMGCODEC_GIL=hold gray "3200 cuda, per-image nvImageCodec calls hold the GIL" \
      "$NEW" "$BIG" --device cuda
  done
  IMGOPS_JPEG_ENCODER_API=python gray "800 cuda -f jpg, the Python module's encoder" "$NEW" \
    "$BATCH" --device cuda -f jpg
} 2>&1 | tee "$OUT/pending-walls.txt"
same() { (cd "$1" && for f in *; do cmp -s "$f" "$2/$f" && echo same; done | wc -l); }
rm -rf /tmp/imgops-pa /tmp/imgops-pb; mkdir -p /tmp/imgops-pa /tmp/imgops-pb
$PY -m imgops.cli gray "$BATCH" -d /tmp/imgops-pa -q --no-fsync --device cpu
$PY -m imgops.cli gray "$BATCH" -d /tmp/imgops-pb -q --no-fsync --device cuda --decoder cpu
echo "cuda --decoder cpu = cpu: $(same /tmp/imgops-pb /tmp/imgops-pa) of $(ls /tmp/imgops-pa | wc -l)" \
  | tee "$OUT/pending-identical.txt"
if [ -n "$OLD" ]; then
  rm -rf /tmp/imgops-pc; mkdir -p /tmp/imgops-pc
  PYTHONPATH="$OLD" $PY -m imgops.cli gray "$BATCH" -d /tmp/imgops-pc -q --no-fsync --device cpu
  echo "old cpu = new cpu: $(same /tmp/imgops-pc /tmp/imgops-pa)" | tee -a "$OUT/pending-identical.txt"
fi
$PY -m pytest -q -p no:cacheprovider -m "(cuda or gpu_driver) and not slow" tests/test_driver_engine.py \
  tests/test_cli_gray.py tests/test_pipeline_engine.py tests/test_nvimgcodec_c.py \
  tests/test_nvimgcodec_encode_c.py tests/test_gpu_jpeg_encode.py tests/test_native_write.py \
  >"$OUT/pending-tests.txt" 2>&1
IMGOPS_JPEG_ENCODER_API=python $PY -m pytest -q -p no:cacheprovider -m "cuda and not slow" \
  tests/test_gpu_jpeg_encode.py >"$OUT/pending-tests-jpeg-python.txt" 2>&1
echo "cuda tests rc=$? $(tail -n 1 "$OUT/pending-tests.txt")"
