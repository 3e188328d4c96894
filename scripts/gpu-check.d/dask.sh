#!/usr/bin/env bash
# imgops.dask on the GPU machine (run from the repo root after the lead's build step).
# Writes $OUT/dask-*.txt|json. Needs dask, distributed, zarr in the environment (imgops[dask]);
# dask-cuda for the local-cuda part (skipped with a note where it is missing).
set -u
OUT=${OUT:-/tmp}
export PYTHONPATH=${PYTHONPATH:-$PWD/src}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PYTHON:-python}

if ! $PY -c "import dask.array, distributed, zarr" 2>"$OUT/dask-missing.txt"; then
  echo "imgops[dask] (dask, distributed, zarr) not installed here: dask checks skipped" \
    | tee -a "$OUT/dask-missing.txt"
  exit 0
fi

# 1. The CI tests, now with each worker's blocks on the GPU (device "auto"): the results must
#    still equal the CPU op bit for bit.
timeout 600 $PY -m pytest tests/test_dask_arrays.py tests/test_dask_cluster.py \
  tests/test_dask_errors.py -q -p no:cacheprovider > "$OUT/dask-tests.txt" 2>&1
echo "tests rc=$?" >> "$OUT/dask-tests.txt"

# 2. local-cuda: one worker per GPU, pinned, multicast off, blocks on the GPU, exact result.
timeout 600 $PY - > "$OUT/dask-local-cuda.txt" 2>&1 <<'PYEOF'
import json, os, tempfile
import numpy as np, torch, zarr
import dask.array as da
from imgops import ops
from imgops.dask import arrays
from imgops.dask.cluster import connect

def where():
    import torch
    from imgops.dask._blocks import block_device
    return {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "NCCL_NVLS_ENABLE",
            "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")} | {
            "device": str(block_device("auto")), "gpus_seen": torch.cuda.device_count()}

try:
    import dask_cuda  # noqa: F401
except ImportError:
    print("dask-cuda not installed: local-cuda skipped"); raise SystemExit(0)
data = np.random.default_rng(0).integers(0, 4096, (64, 512, 512), dtype=np.uint16)
with tempfile.TemporaryDirectory() as tmp, connect("local-cuda") as client:
    print(json.dumps(client.run(where), indent=1))
    z = zarr.create_array(f"{tmp}/in.zarr", shape=data.shape, chunks=(8, 512, 512), dtype="uint16")
    z[...] = data
    vol = da.from_zarr(f"{tmp}/in.zarr")
    low, high = arrays.percentiles(vol, (1, 99.8))
    assert [low, high] == list(np.percentile(data, (1, 99.8))), (low, high)
    out = arrays.normalize(vol, percentile=(1, 99.8), clip=True).compute()
    ref = ops.normalize_volume(torch.from_numpy(data), max=high, min=low, clip=True).numpy()
    print("local-cuda exact:", bool(np.array_equal(out, ref)), "workers:", len(client.run(where)))
PYEOF
echo "local-cuda rc=$?" >> "$OUT/dask-local-cuda.txt"

# 3. Benchmarks: the issue's 4 GB volume on local:2 vs one process, and the photo batch.
timeout 600 $PY benchmarks/dask_bench.py --volume-mb 4096 --photos 800 --workers 2 \
  --json "$OUT/dask-bench.json" > "$OUT/dask-bench.txt" 2>&1
echo "bench rc=$?" >> "$OUT/dask-bench.txt"
