#!/usr/bin/env bash
# The issue-10 photo batch on the GPU host, the numbers docs/BENCHMARKS.md reports: the 800-file
# batch, `--decoder cpu` byte identity of cuda and cpu on 200 files, and `imgops bench
# --pipeline --jpg` (imgops cpu and cuda, PNG and JPEG, the OpenCV pool, both decode floors).
# Results: $OUT/photos-*.txt|json. (engine.sh has the longer version with the crossover.)
set -uo pipefail
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
BATCH=${ENGINE_BATCH_DIR:-/tmp/imgops-photo-batch}
export PYTHONUNBUFFERED=1
[ -d "$BATCH" ] || $PY scripts/make_photo_batch.py "$BATCH" --count 800 >"$OUT/photos-batch.txt" 2>&1
timeout 120 $PY - "$BATCH" >"$OUT/photos-identical.txt" 2>&1 <<'PYEOF'
import sys, hashlib
from pathlib import Path
from imgops.engine import GRAY, Job, PipelineSettings, run_batch
files = sorted(Path(sys.argv[1]).glob("*.jpg"))[:200]
digests = {}
for device in ("cpu", "cuda"):
    out = Path(f"/tmp/imgops-identical-{device}")
    out.mkdir(exist_ok=True)
    jobs = [Job(p, out / f"{p.stem}.png", p.name) for p in files]
    summary = run_batch(jobs, GRAY, PipelineSettings(device=device, decoder="cpu", overwrite=True))
    print(device, summary.line(), f"{summary.wall_seconds:.2f} s", summary.decoders)
    digests[device] = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.iterdir()}
print("--decoder cpu: cuda bytes == cpu bytes on", len(files), "files:", digests["cpu"] == digests["cuda"])
PYEOF
timeout 400 $PY -m imgops.cli bench --pipeline "$BATCH" --reps 3 --jpg --json \
  >"$OUT/photos-bench.json" 2>"$OUT/photos-bench.log"
$PY - "$OUT/photos-bench.json" >"$OUT/photos-bench.txt" 2>&1 <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["runs"]:
    stages = {k: round(v, 2) for k, v in (r.get("stages") or {}).items()}
    print(r["tool"], "|", r["files_per_s"] and round(r["files_per_s"], 1), "files/s |",
          r.get("output_bytes"), "B | x pool", r.get("vs_pool") and round(r["vs_pool"], 2), "|",
          r.get("check") or r.get("error") or "", "|", r.get("decoders") or "", r.get("note") or "",
          stages)
PYEOF
cat "$OUT/photos-identical.txt" "$OUT/photos-bench.txt"
