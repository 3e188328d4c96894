#!/usr/bin/env bash
# nvImageCodec through its C API (imgops.io.nvimgcodec_c) on the GPU host, after the build step:
#  1. its tests and the torch-free engine's on the GPU
#  2. byte identity: the same JPEGs, all decoded on the GPU (no CPU path during start-up), with
#     the C API and with the Python module (IMGOPS_NVIMGCODEC_API=python)
#  3. process walls of `imgops gray` on the 800-photo batch: cuda (C API), cuda (Python module),
#     cpu, alternated rounds
# Results: $OUT/capi-*.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
BATCH=${ENGINE_BATCH_DIR:-/tmp/imgops-photo-batch}
ROUNDS=${CAPI_ROUNDS:-3}
export PYTHONUNBUFFERED=1
timeout 240 $PY -m pytest -q -rs -p no:cacheprovider tests/test_nvimgcodec_c.py tests/test_cuda_driver.py \
  tests/test_driver_engine.py >"$OUT/capi-tests.txt" 2>&1
echo "tests rc=$? $(tail -n 1 "$OUT/capi-tests.txt")"; grep -E "^(FAILED|ERROR)" "$OUT/capi-tests.txt" | head
timeout 200 $PY -m pytest -q -rs -p no:cacheprovider -m cuda tests/test_cli_gray.py >"$OUT/capi-cli.txt" 2>&1
echo "cli cuda tests rc=$? $(tail -n 1 "$OUT/capi-cli.txt")"; grep -E "^(FAILED|ERROR)" "$OUT/capi-cli.txt" | head
[ -d "$BATCH" ] || $PY scripts/make_photo_batch.py "$BATCH" --count 800 >"$OUT/capi-batch.txt" 2>&1
timeout 150 $PY - "$BATCH" >"$OUT/capi-identity.txt" 2>&1 <<'PYEOF'
import os, sys
from pathlib import Path
from imgops.engine import GRAY, Job, PipelineSettings, run_batch
files = sorted(Path(sys.argv[1]).glob("*.jpg"))[:160] + sorted(Path("samples").glob("*.jpg"))
out = {}
for api in ("c", "python"):
    os.environ["IMGOPS_NVIMGCODEC_API"] = api
    d = Path(f"/tmp/imgops-api-{api}"); d.mkdir(exist_ok=True)
    jobs = [Job(p, d / f"{i:03d}.png", p.name) for i, p in enumerate(files)]
    s = run_batch(jobs, GRAY, PipelineSettings(device="cuda", overwrite=True, host_while_starting=False))
    print(api, s.line(), s.decoders, f"wall {s.wall_seconds:.2f} s")
    out[api] = d
same = sum((out["c"] / f"{i:03d}.png").read_bytes() == (out["python"] / f"{i:03d}.png").read_bytes()
           for i in range(len(files)))
print(f"C API vs Python module: {same} of {len(files)} outputs byte-identical")
PYEOF
tail -n 3 "$OUT/capi-identity.txt"
gray() {
  local label=$1; shift
  rm -rf /tmp/imgops-w; mkdir -p /tmp/imgops-w
  local s; s=$(date +%s%N)
  timeout 100 env "$@" $PY -m imgops.cli gray "$BATCH" -d /tmp/imgops-w -q --device "$DEV" \
    --stats-json "$OUT/capi-$label-$rep.json" 2>/tmp/imgops-w.err
  echo "$label|rc=$?|$(( ($(date +%s%N) - s) / 1000000 ))|$(ls /tmp/imgops-w | wc -l)|$(tail -n 1 /tmp/imgops-w.err)"
}
{
  for rep in $(seq 1 "$ROUNDS"); do
    DEV=cuda gray cuda-c IMGOPS_NVIMGCODEC_API=c
    DEV=cuda gray cuda-python IMGOPS_NVIMGCODEC_API=python
    DEV=cpu gray cpu IMGOPS_NVIMGCODEC_API=c
  done
} >"$OUT/capi-walls.txt" 2>&1
$PY scripts/walls_table.py "$OUT/capi-walls.txt" --stats "$OUT" --prefix capi
