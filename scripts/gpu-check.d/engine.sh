#!/usr/bin/env bash
# The batch engine on the GPU machine (run from the repo root after the lead's build step):
# nvImageCodec's version, the engine's tests (CUDA ones included), the 800-photo batch, the
# pipeline bench (cpu/cuda, PNG and JPEG, OpenCV pool, both decode floors), the auto-device
# crossover, the GPU-vs-OpenCV decode differences, and the --decoder cpu byte-identity check.
# Results: $OUT/engine-*.txt|json. nvImageCodec comes from the wheels the lead put on PYTHONPATH.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
BATCH=${ENGINE_BATCH_DIR:-/tmp/imgops-photo-batch}
export PYTHONUNBUFFERED=1
step() {  # name, command...: output to $OUT/engine-NAME.txt, one summary line
  local name=$1; shift
  local t0=$SECONDS
  "$@" >"$OUT/engine-$name.txt" 2>&1
  local rc=$?
  echo "engine-$name rc=$rc $((SECONDS - t0))s: $(tail -n 1 "$OUT/engine-$name.txt")"
  return 0
}

step env $PY -c "
import sys, imgops
from imgops.io import gpu_decode
from imgops.engine import device
print('python', sys.version.split()[0])
print('nvImageCodec', gpu_decode.version())
print('status', gpu_decode.status())
print('cuda devices (driver)', device.cuda_device_count())
print('CUDA_MIN_FILES', device.CUDA_MIN_FILES)
"
step tests $PY -m pytest -q -rs -p no:cacheprovider tests/test_pipeline_engine.py \
  tests/test_device_limits.py tests/test_gray_standalone.py tests/test_bench.py
step batch $PY scripts/make_photo_batch.py "$BATCH" --count 800
ls "$BATCH"/*.jpg | head -n 64 >/tmp/imgops-diff-list.txt
ls samples/*.jpg >>/tmp/imgops-diff-list.txt
step decodediff bash -c "$PY -m imgops.bench.pipeline decodediff /tmp/imgops-diff-list.txt \
  > $OUT/engine-decodediff.json && $PY -c \"import json; d=json.load(open('$OUT/engine-decodediff.json')); \
print('decode differences over', d['compared'], 'files: luma max', d['luma_max'], 'mean', \
round(d['luma_mean'], 4), 'rgb max', d['rgb_max'])\""
step identical $PY - "$BATCH" <<'PYEOF'
import sys, hashlib
from pathlib import Path
from imgops.pipeline import GrayJob, PipelineSettings, run_gray
files = sorted(Path(sys.argv[1]).glob("*.jpg"))[:200]
digests = {}
for device in ("cpu", "cuda"):
    out = Path(f"/tmp/imgops-identical-{device}")
    out.mkdir(exist_ok=True)
    jobs = [GrayJob(p, out / f"{p.stem}.png", p.name) for p in files]
    settings = PipelineSettings(device=device, decoder="cpu", overwrite=True)
    summary = run_gray(jobs, settings)
    print(device, summary.line(), f"{summary.wall_seconds:.2f} s", summary.decoders)
    digests[device] = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.iterdir()}
same = digests["cpu"] == digests["cuda"]
print("--decoder cpu: cuda bytes == cpu bytes on", len(files), "files:", same)
PYEOF
step bench-pipeline bash -c "$PY -m imgops.cli bench --pipeline $BATCH --reps 3 --jpg --json \
  > $OUT/engine-bench-pipeline.json; $PY -c \"import json; d=json.load(open('$OUT/engine-bench-pipeline.json')); \
[print(r['tool'], '|', r['files_per_s'] and round(r['files_per_s'], 1), 'files/s |', r.get('output_bytes'), \
'B | x pool', r.get('vs_pool') and round(r['vs_pool'], 2), '|', r.get('check') or r.get('error') or '', \
'|', r.get('decoders') or '', r.get('note') or '', {k: round(v, 2) for k, v in (r.get('stages') or {}).items()}) \
for r in d['runs']]\""
step crossover $PY -m imgops.cli bench --crossover "$BATCH" --reps 3
cat "$OUT"/engine-decodediff.txt "$OUT"/engine-identical.txt "$OUT"/engine-bench-pipeline.txt \
  "$OUT"/engine-crossover.txt 2>/dev/null | tail -n 60
