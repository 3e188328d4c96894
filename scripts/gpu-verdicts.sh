#!/usr/bin/env bash
# The goals still without a GPU-host verdict, in parts (run after scripts/gpu-check.sh build):
#   bash scripts/gpu-verdicts.sh fsync sched volume
#  fsync:  issue 10: the 800-file photo batch through `imgops gray -d` on cuda and cpu, with and
#          without --no-fsync (one alternated run each, process walls)
#  sched:  issue 14: 800 photos through the CLI, --scheduler local:2 vs one process, 3 alternated
#  volume: issue 12: OME-Zarr + pyramid of the 3 GB stack vs zarr writing level 0 alone, on the CPU
#          device (the CUDA run is in volume.sh)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-verdicts}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
PARTS=${*:-fsync sched volume}
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
wants() { [[ " $PARTS " == *" $1 "* ]]; }
if wants fsync; then
  BATCH=/tmp/imgops-photo-batch
  [ -d "$BATCH" ] || $PY scripts/make_photo_batch.py "$BATCH" --count 800 >"$OUT/fsync-batch.txt" 2>&1
  for rep in 1 2; do
    for device in cuda cpu; do
      for sync in --fsync --no-fsync; do
        rm -rf /tmp/imgops-fsync-out; mkdir /tmp/imgops-fsync-out
        t0=$(date +%s%N)
        timeout 120 $PY -m imgops.cli gray "$BATCH" -d /tmp/imgops-fsync-out --device "$device" -q $sync
        echo "$device $sync rc=$? wall $(( ($(date +%s%N) - t0) / 1000000 )) ms files $(ls /tmp/imgops-fsync-out | wc -l)"
      done
    done
  done > "$OUT/fsync.txt" 2>&1
  cat "$OUT/fsync.txt"
fi
if wants sched; then
  timeout 300 $PY benchmarks/dask_bench.py --skip-volume --photos 800 --cli --repeats 3 \
    --workers 2 --json "$OUT/sched-photos-local2.json" > "$OUT/sched-photos-local2.txt" 2>&1
  echo "rc=$?" >> "$OUT/sched-photos-local2.txt"
  tail -n 5 "$OUT/sched-photos-local2.txt"
fi
if wants volume; then
  timeout 240 $PY benchmarks/volume_bench.py --size-gb "${VOLUME_GB:-3}" --device cpu --modes fixed \
    --goals zarr --workdir /tmp/imgops-vol-verdict > "$OUT/volume-zarr-cpu.txt" 2>&1
  echo "rc=$?" >> "$OUT/volume-zarr-cpu.txt"
  tail -n 6 "$OUT/volume-zarr-cpu.txt"
fi
