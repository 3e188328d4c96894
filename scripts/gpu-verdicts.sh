#!/usr/bin/env bash
# The goals still without a GPU-host verdict, in one call (run after scripts/gpu-check.sh build):
#  1. the CUDA device-limit tests, 3 rounds (a once-seen 2 MiB cache leftover between files)
#  2. issue 14: 800 photos through the CLI, --scheduler local:2 vs one process, 3 alternated runs
#  3. issue 12: OME-Zarr + pyramid of the 3 GB stack vs zarr writing level 0 alone
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-verdicts}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
for round in 1 2 3; do
  timeout 120 $PY -m pytest tests/test_device_limits.py -m cuda -q -p no:cacheprovider 2>&1 | tail -n 2
done > "$OUT/limits.txt"
timeout 300 $PY benchmarks/dask_bench.py --skip-volume --photos 800 --cli --repeats 3 \
  --workers 2 --json "$OUT/sched-photos-local2.json" > "$OUT/sched-photos-local2.txt" 2>&1
echo "rc=$?" >> "$OUT/sched-photos-local2.txt"
timeout 240 $PY benchmarks/volume_bench.py --size-gb "${VOLUME_GB:-3}" --device cuda --modes fixed \
  --goals zarr --workdir /tmp/imgops-vol-verdict > "$OUT/volume-zarr.txt" 2>&1
echo "rc=$?" >> "$OUT/volume-zarr.txt"
tail -n 4 "$OUT"/*.txt
