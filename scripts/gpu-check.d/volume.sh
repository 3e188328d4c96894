#!/usr/bin/env bash
# volume (issue 12, 16.3 volume engine, 16.5 `imgops bin`) on the GPU machine, after the lead's
# build step; results in $OUT/volume-*.txt|json.
#  1. the CUDA tests of the device limits (the OOM retry line, the cache handed back between
#     files), the volume engine, normvol hyperstacks and the bin CLI (-m cuda), and the CPU
#     tests of the same files (they must pass on torch 2.11 too)
#  2. a 16 GB normvol benchmark on CUDA: the per-channel percentile path and OME-Zarr with pyramid
#     (issue 12's zarr goal), then the 2-channel vs 1-channel percentile goal at 4 GB (disk: the
#     hyperstack copy and the float32 output of 16 GB would not fit the 64 GB disk)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-check-out}
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
FILES="tests/test_device_limits.py tests/test_volume_engine.py tests/test_hyperstack.py tests/test_cli_bin.py tests/test_zarr.py tests/test_volume_streaming.py tests/test_volumes.py tests/test_cli_normvol.py"

echo "== 1. CUDA tests (volume engine, hyperstacks, bin)" | tee "$OUT/volume-tests.txt"
$PY -m pytest $FILES -m cuda -q -p no:cacheprovider -rs >>"$OUT/volume-tests.txt" 2>&1
echo "cuda tests exit $?" | tee -a "$OUT/volume-tests.txt"
$PY -m pytest $FILES -m "not cuda" -q -x -p no:cacheprovider >>"$OUT/volume-tests.txt" 2>&1
echo "cpu tests exit $?" | tee -a "$OUT/volume-tests.txt"

echo "== 2. 16 GB normvol --device cuda: percentile (per channel path) + OME-Zarr goal" \
  | tee "$OUT/volume-bench16.txt"
$PY benchmarks/volume_bench.py --size-gb "${VOLUME_GB:-16}" --device cuda --modes percentile \
  --goals zarr --workdir /tmp/imgops-vol-part --json >"$OUT/volume-bench16.json" 2>>"$OUT/volume-bench16.txt"
echo "exit $?" | tee -a "$OUT/volume-bench16.txt"
echo "== 3. 2-channel vs 1-channel percentile, 4 GB, cuda" | tee "$OUT/volume-channels.txt"
$PY benchmarks/volume_bench.py --size-gb "${VOLUME_CHANNELS_GB:-4}" --device cuda --modes fixed \
  --goals channels --workdir /tmp/imgops-vol-part >>"$OUT/volume-channels.txt" 2>&1
echo "exit $?" | tee -a "$OUT/volume-channels.txt"
tail -n 3 "$OUT/volume-tests.txt" "$OUT/volume-channels.txt"
