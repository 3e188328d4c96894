#!/usr/bin/env bash
# `--scheduler` on the commands, on the GPU machine (run from the repo root after the lead's
# build step). Writes $OUT/sched-*.txt|json. Needs imgops[dask] (dask, distributed, zarr);
# dask-cuda for the local-cuda part (skipped with a note where it is missing).
set -u
OUT=${OUT:-/tmp}
export PYTHONPATH=${PYTHONPATH:-$PWD/src}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PYTHON:-python}

if ! $PY -c "import dask.array, distributed, zarr" 2>"$OUT/sched-missing.txt"; then
  echo "imgops[dask] not installed here: --scheduler checks skipped" | tee -a "$OUT/sched-missing.txt"
  exit 0
fi

# 1. The CLI tests: workers' normvol blocks now run on the GPU (device auto); the outputs must
#    still equal the single-process command's bit for bit.
timeout 300 $PY -m pytest tests/test_cli_scheduler.py -q -p no:cacheprovider \
  > "$OUT/sched-tests.txt" 2>&1
echo "tests rc=$?" >> "$OUT/sched-tests.txt"

# 2. The 800-photo goal through the CLI (fresh processes, cluster start included), local:2 and
#    local:8 against the single process; 3 alternated runs each, medians and pair ratios.
for workers in 2 8; do
  timeout 600 $PY benchmarks/dask_bench.py --skip-volume --photos 800 --cli --repeats 3 \
    --workers "$workers" --json "$OUT/sched-photos-local$workers.json" \
    > "$OUT/sched-photos-local$workers.txt" 2>&1
  echo "rc=$?" >> "$OUT/sched-photos-local$workers.txt"
done

# 3. local-cuda: gray and normvol on one worker per GPU, against the single process.
{
  if ! $PY -c "import dask_cuda" 2>/dev/null; then
    echo "dask-cuda not installed: local-cuda skipped"
  else
    work=$(mktemp -d)
    mkdir "$work/in"
    for i in $(seq 1 64); do cp samples/flower_progressive_3mp.jpg "$work/in/$i.jpg"; done
    timeout 300 $PY -m imgops.cli gray "$work/in" -d "$work/single" -q; echo "single rc=$?"
    timeout 300 $PY -m imgops.cli gray "$work/in" -d "$work/cuda" -q --scheduler local-cuda
    echo "local-cuda rc=$?"
    diff -r "$work/single" "$work/cuda" && echo "gray outputs identical"
    rm -rf "$work"
  fi
} > "$OUT/sched-local-cuda.txt" 2>&1
