#!/usr/bin/env bash
# The GPU deflate (csrc/device/png_deflate_kernels.cuh) on the GPU host, after the build step:
#  1. its tests on the GPU: the kernels' bytes against the CPU encoder (over 2^31 bytes too), the
#     torch-free engine, the CLI's CUDA tests
#  2. compute-sanitizer memcheck and racecheck over the deflate tests
#  3. the kernels alone: milliseconds per 4K gray frame (3840x2160), one stream, after warm-up
#  4. byte identity: 160 photos + the samples through the CUDA engine with the GPU deflate and
#     with IMGOPS_GPU_DEFLATE=0 (every JPEG on the GPU: no CPU path during start-up)
#  5. process walls of `imgops gray` on the 800-photo batch: cuda, cuda with the deflates on
#     the stage's one stream, cuda with the CPU deflate, cpu, alternated rounds (DEFLATE_ROUNDS, default 3), with each run's --stats-json
# Results: $OUT/deflate-*. DEFLATE_PARTS narrows (tests sanitize kernels identity walls).
set -uo pipefail
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
BATCH=${ENGINE_BATCH_DIR:-/tmp/imgops-photo-batch}
ROUNDS=${DEFLATE_ROUNDS:-3}
PARTS=${DEFLATE_PARTS:-tests sanitize kernels identity walls}
wants() { [[ " $PARTS " == *" $1 "* ]]; }
export PYTHONUNBUFFERED=1

if wants tests; then
  timeout 300 $PY -m pytest -q -rs -p no:cacheprovider tests/test_cuda_driver.py \
    tests/test_driver_engine.py tests/test_png_deflate_parallel.py >"$OUT/deflate-tests.txt" 2>&1
  echo "tests rc=$? $(tail -n 1 "$OUT/deflate-tests.txt")"
  grep -E "^(FAILED|ERROR)" "$OUT/deflate-tests.txt" | head -n 20
  timeout 200 $PY -m pytest -q -rs -p no:cacheprovider -m cuda tests/test_cli_gray.py \
    >"$OUT/deflate-cli.txt" 2>&1
  echo "cli cuda tests rc=$? $(tail -n 1 "$OUT/deflate-cli.txt")"
  grep -E "^(FAILED|ERROR)" "$OUT/deflate-cli.txt" | head -n 20
fi
if wants sanitize; then
  for tool in memcheck racecheck; do
    timeout 240 compute-sanitizer --tool "$tool" --report-api-errors no --print-limit 20 \
      --error-exitcode 9 $PY -m pytest -q -p no:cacheprovider -m "gpu_driver and not slow" \
      -k "png_deflate and gpu" tests/test_cuda_driver.py >"$OUT/deflate-$tool.txt" 2>&1
    echo "$tool rc=$? $(tail -n 1 "$OUT/deflate-$tool.txt" | head -c 200)" \
      "$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/deflate-$tool.txt" | tail -n 1)"
  done
fi
if wants kernels; then
  timeout 150 $PY - >"$OUT/deflate-kernels.txt" 2>&1 <<'PYEOF'
import statistics, time
from pathlib import Path
import cv2, numpy as np
from imgops.engine import cuda_driver as cd
from imgops.native import cli_kernels
from imgops.io.png import filter_code_for
from imgops.reference import png_filter_reference
k = cli_kernels()
dev = cd.Device(0); stream = dev.stream(); kernels = cd.Kernels(dev)
photo = sorted(Path("samples").glob("*.jpg"))[0]
page = np.full((2160, 3840), 250, np.uint8)  # a scanned page: flat, a few dark strokes
page[200:1900:40, 300:3500] = 30
frames = {"photo": cv2.resize(cv2.imread(str(photo), cv2.IMREAD_GRAYSCALE), (3840, 2160)),
          "page": page}
for label, gray in frames.items():
    rows = np.ascontiguousarray(png_filter_reference(gray, filter_code_for(2)))
    h, row = rows.shape
    layout = cd.DeflateLayout(*k.png_deflate_layout(row, h))
    src = dev.alloc(rows.nbytes, stream); work = dev.alloc(layout.total, stream)
    with dev.pinned(rows.nbytes) as staging:
        staging.array()[:] = rows.reshape(-1)
        dev.copy_to_device(src, staging.ptr, rows.nbytes, stream); stream.synchronize()
    laps = []
    for rep in range(30):
        t = time.perf_counter()
        kernels.png_deflate(src, row, h, work, layout, stream); stream.synchronize()
        laps.append(time.perf_counter() - t)
    t = time.perf_counter()
    for rep in range(30):
        kernels.png_deflate(src, row, h, work, layout, stream)
    stream.synchronize(); queued = (time.perf_counter() - t) / 30
    side = [dev.stream() for _ in range(4)]  # 4 streams, a workspace each, round robin
    works = [dev.alloc(layout.total, stream) for _ in side]; stream.synchronize()
    t = time.perf_counter()
    for rep in range(32):
        kernels.png_deflate(src, row, h, works[rep % 4], layout, side[rep % 4])
    for s_ in side:
        s_.synchronize()
    four = (time.perf_counter() - t) / 32
    # each stage alone (synchronized, in order: each needs its predecessors' results)
    params = [cd.ctypes.c_uint64(src), cd.ctypes.c_longlong(row), cd.ctypes.c_longlong(h),
              cd.ctypes.c_uint64(work)]
    stages = {name: [] for name in ("memset",) + cd._DEFLATE_KERNELS}
    for rep in range(15):
        t = time.perf_counter(); dev.memset(work, 0, layout.total, stream); stream.synchronize()
        stages["memset"].append(time.perf_counter() - t)
        for function, name, (grid, block) in zip(kernels._deflate, cd._DEFLATE_KERNELS,
                                                 kernels.deflate_shapes(h, layout)):
            t = time.perf_counter()
            kernels._launch(function, name, (grid, 1), block, stream, params); stream.synchronize()
            stages[name].append(time.perf_counter() - t)
    cpu = []
    for rep in range(5):
        t = time.perf_counter(); png = k.png_encode_filtered(rows.tobytes(), row - 1, h, 1, 1)
        cpu.append(time.perf_counter() - t)
    with dev.pinned(8) as size:
        dev.copy_to_host(size.ptr, work + layout.size, 8, stream); stream.synchronize()
        n = int(size.array().view(np.uint64)[0])
    with dev.pinned(n) as out:
        dev.copy_to_host(out.ptr, work + layout.out, n, stream); stream.synchronize()
        same = out.array()[:n].tobytes() == png[k.PNG_HEAD_BYTES : k.PNG_HEAD_BYTES + n]
    print(f"4K {label} ({h}x{row - 1}, {layout.blocks} blocks): GPU deflate "
          f"{1000 * statistics.median(laps):.3f} ms synchronized each, {1000 * queued:.3f} ms "
          f"queued back to back, {1000 * four:.3f} ms a frame on 4 streams; CPU encoder one thread {1000 * statistics.median(cpu):.2f} ms; "
          f"stream {n} bytes, the CPU's: {same}")
    print("  stages (ms, median of 15, each synchronized):",
          {k_.replace("imgops_png_deflate_", ""): round(1000 * statistics.median(v), 3)
           for k_, v in stages.items()})
    dev.free(src, stream); dev.free(work, stream)
PYEOF
  tail -n 4 "$OUT/deflate-kernels.txt"
fi
[ -d "$BATCH" ] || $PY scripts/make_photo_batch.py "$BATCH" --count 800 >"$OUT/deflate-batch.txt" 2>&1
if wants identity; then
  timeout 150 $PY - "$BATCH" >"$OUT/deflate-identity.txt" 2>&1 <<'PYEOF'
import os, sys
from pathlib import Path
from imgops.engine import GRAY, Job, PipelineSettings, run_batch
files = sorted(Path(sys.argv[1]).glob("*.jpg"))[:160] + sorted(Path("samples").glob("*.jpg"))
out = {}
for flag in ("1", "0"):
    os.environ["IMGOPS_GPU_DEFLATE"] = flag
    d = Path(f"/tmp/imgops-deflate-{flag}"); d.mkdir(exist_ok=True)
    jobs = [Job(p, d / f"{i:03d}.png", p.name) for i, p in enumerate(files)]
    s = run_batch(jobs, GRAY, PipelineSettings(device="cuda", overwrite=True, host_while_starting=False))
    print(f"IMGOPS_GPU_DEFLATE={flag}", s.line(), s.decoders, f"wall {s.wall_seconds:.2f} s")
    out[flag] = d
same = sum((out["1"] / f"{i:03d}.png").read_bytes() == (out["0"] / f"{i:03d}.png").read_bytes()
           for i in range(len(files)))
print(f"GPU deflate vs CPU deflate: {same} of {len(files)} outputs byte-identical")
PYEOF
  tail -n 3 "$OUT/deflate-identity.txt"
fi
if wants walls; then
  gray() {  # label, env assignments...
    local label=$1; shift
    rm -rf /tmp/imgops-w; mkdir -p /tmp/imgops-w
    local s; s=$(date +%s%N)
    timeout 100 env "$@" $PY -m imgops.cli gray "$BATCH" -d /tmp/imgops-w -q --device "$DEV" \
      --stats-json "$OUT/deflate-$label-$rep.json" 2>/tmp/imgops-w.err
    echo "$label|rc=$?|$(( ($(date +%s%N) - s) / 1000000 ))|$(ls /tmp/imgops-w | wc -l)|$(tail -n 1 /tmp/imgops-w.err)"
  }
  {
    for rep in $(seq 1 "$ROUNDS"); do
      DEV=cuda gray cuda IMGOPS_GPU_DEFLATE=1
      DEV=cuda gray cuda-1-stream IMGOPS_GPU_DEFLATE=1 IMGOPS_DEFLATE_STREAMS=1
      DEV=cuda gray cuda-cpu-deflate IMGOPS_GPU_DEFLATE=0
      DEV=cpu gray cpu IMGOPS_GPU_DEFLATE=1
    done
  } >"$OUT/deflate-walls.txt" 2>&1
  $PY scripts/walls_table.py "$OUT/deflate-walls.txt" --stats "$OUT" --prefix deflate
  $PY - "$OUT"/deflate-cuda-1.json <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
print("cuda run 1 phases:", {k: round(v, 2) for k, v in sorted(d.get("engine_seconds", {}).items())})
PYEOF
fi
