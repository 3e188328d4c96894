#!/usr/bin/env bash
# issue 14 on the GPU machine: `--scheduler local-cuda` (dask_cuda.LocalCUDACluster, never run
# before) and where local:2's start-up goes on that host. Run from the repo root after the lead's
# build step, with the wheels of docs/DASK.md ("local-cuda on the GPU host") carried in .whl-dask
# (WHEELS="DIR ..." to look elsewhere; .whl too). They go into /tmp/site (no deps, no index).
# Results: $OUT/dask-cuda-*.txt, one "VERDICT <check>: ok|FAIL|skip ..." line per check in
# $OUT/dask-cuda-verdicts.txt (and on stdout). About 1-3 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
PY=${PY:-${PYTHON:-python3}}
SITE=${SITE:-/tmp/site}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
VERDICTS="$OUT/dask-cuda-verdicts.txt"
: >"$VERDICTS"
verdict() { echo "VERDICT $*" | tee -a "$VERDICTS"; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# 0. The carried wheels into $SITE. typing_extensions only where the image's is older than zarr
#    needs (>= 4.14): a newer copy would shadow the one torch and the rest of the image use.
wheels=()
for dir in ${WHEELS:-.whl-dask .whl}; do
  for whl in "$dir"/*.whl; do [ -f "$whl" ] && wheels+=("$whl"); done
done
if $PY -c "from importlib.metadata import version as v; from packaging.version import Version as V
import sys; sys.exit(V(v('typing_extensions')) < V('4.14'))" 2>/dev/null; then
  kept=(); for whl in "${wheels[@]}"; do [[ $(basename "$whl") == typing_extensions-* ]] || kept+=("$whl"); done
  wheels=("${kept[@]}")
fi
{
  echo "wheels: ${#wheels[@]}"; printf '  %s\n' "${wheels[@]}"
  [ ${#wheels[@]} -eq 0 ] || $PY -m pip install -q --no-index --no-deps --no-compile \
    --target "$SITE" "${wheels[@]}"
  echo "install rc=$?"
} >"$OUT/dask-cuda-install.txt" 2>&1
export PYTHONPATH=$SITE:${PYTHONPATH:-$PWD/src}
$PY - >"$OUT/dask-cuda-versions.txt" 2>&1 <<'PYEOF'
import importlib, sys
from importlib.metadata import version
print(sys.version)
for dist in ("dask", "distributed", "dask-cuda", "zarr", "numcodecs", "numpy", "pandas",
             "cuda-core", "nvidia-ml-py", "typing_extensions", "tornado", "torch"):
    try:
        print(f"{dist} {version(dist)}")
    except Exception as error:
        print(f"{dist} MISSING ({error})")
for module in ("dask.array", "distributed", "zarr", "dask_cuda", "cuda.core"):
    try:
        importlib.import_module(module)
        print(f"import {module}: ok")
    except Exception as error:
        print(f"import {module}: FAIL {type(error).__name__}: {error}")
PYEOF
if grep -q "import dask_cuda: ok" "$OUT/dask-cuda-versions.txt" \
  && grep -q "import zarr: ok" "$OUT/dask-cuda-versions.txt"; then
  verdict "install: ok ($(grep -E '^(dask|distributed|dask-cuda|zarr|cuda-core) ' \
    "$OUT/dask-cuda-versions.txt" | tr '\n' ' '))"
else
  verdict "install: FAIL ($(grep -E 'FAIL|MISSING' "$OUT/dask-cuda-versions.txt" | head -3 | tr '\n' ' '))"
  exit 0
fi

# 1. local:2 start-up on this host, in fresh processes: client import of distributed, cluster
#    start, close, what the workers imported (torch?), NVML's state; imgops' local config
#    ("now": no NVML metrics, no profiler) against distributed's defaults ("dist"), 3 alternated.
cat >"$work/startup.py" <<'PYEOF'
import json, resource, sys, time
T0 = time.perf_counter()
HEAVY = ("torch", "imgops._C", "imgops.ops", "cv2", "pandas", "pyarrow", "numba", "cupy", "pynvml")


def state():
    import sys
    from distributed.diagnostics import nvml
    return {"modules": sorted(m for m in HEAVY if m in sys.modules), "nvml": nvml.NVML_STATE.name}


if __name__ == "__main__":
    from imgops.dask import cluster
    from imgops.dask.run import BATCH_PRELOAD
    if sys.argv[1] == "dist":  # distributed's defaults for NVML and the profiler
        cluster.LOCAL_WORKER_CONFIG = {
            k: v for k, v in cluster.LOCAL_WORKER_CONFIG.items() if "MALLOC" in k}
    out = {"variant": sys.argv[1]}
    a = time.perf_counter()
    with cluster.connect("local:2", preload=BATCH_PRELOAD) as client:
        out["start_s"] = round(time.perf_counter() - a, 2)
        out["workers"] = list(client.run(state).values())
        out["client"] = state()
        b = time.perf_counter()
    out["close_s"] = round(time.perf_counter() - b, 2)
    out["total_s"] = round(time.perf_counter() - T0, 2)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out["client_cpu_s"] = round(usage.ru_utime + usage.ru_stime, 2)
    print(json.dumps(out))
PYEOF
for rep in 1 2 3; do
  for variant in now dist; do
    timeout 120 $PY "$work/startup.py" "$variant"
  done
done >"$OUT/dask-cuda-startup.txt" 2>&1
$PY - "$OUT/dask-cuda-startup.txt" <<'PYEOF' | tee -a "$OUT/dask-cuda-startup.txt"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
for variant in ("now", "dist"):
    r = [x for x in rows if x["variant"] == variant]
    if r:
        med = {k: statistics.median(x[k] for x in r) for k in ("start_s", "close_s", "total_s", "client_cpu_s")}
        print(variant, "medians", med, "workers", r[-1]["workers"], "client", r[-1]["client"])
PYEOF
if grep -q '"torch"' "$OUT/dask-cuda-startup.txt"; then
  verdict "local:2 torch-free: FAIL (see dask-cuda-startup.txt)"
elif grep -q '^now medians' "$OUT/dask-cuda-startup.txt"; then
  verdict "local:2 torch-free: ok; $(grep -E '^(now|dist) medians' "$OUT/dask-cuda-startup.txt" \
    | sed 's/workers.*//' | tr '\n' ' ')"
else
  verdict "local:2 start-up: FAIL (see dask-cuda-startup.txt)"
fi
one=samples/coffee_rgb.png
for rep in 1 2 3; do
  for kind in single local2; do
    rm -rf "$work/one"
    extra=(); [ $kind = local2 ] && extra=(--scheduler local:2)
    t0=$(date +%s%N)
    timeout 60 $PY -m imgops.cli gray "$one" -d "$work/one" -q "${extra[@]}"
    echo "$kind rc=$? wall_ms $(( ($(date +%s%N) - t0) / 1000000 ))"
  done
done >"$OUT/dask-cuda-one-file.txt" 2>&1
verdict "one file, single vs local:2 walls (ms): $(awk '{print $1"="$4}' \
  "$OUT/dask-cuda-one-file.txt" | tr '\n' ' ')"

# 2. A local-cuda cluster: one worker per GPU, each pinned to its own, multicast off.
timeout 180 $PY - >"$OUT/dask-cuda-cluster.txt" 2>&1 <<'PYEOF'
import json, os, time
from imgops.engine.device import cuda_device_count
from imgops.dask.cluster import connect


def where():
    import os
    return {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "NCCL_NVLS_ENABLE",
            "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")}


if __name__ == "__main__":
    gpus = cuda_device_count()
    t0 = time.perf_counter()
    with connect("local-cuda") as client:
        started = time.perf_counter() - t0
        info = client.run(where)
        t1 = time.perf_counter()
    closed = time.perf_counter() - t1
    print(json.dumps(info, indent=1))
    firsts = sorted(v["CUDA_VISIBLE_DEVICES"].split(",")[0] for v in info.values())
    ok = (len(info) == gpus and len(set(firsts)) == gpus
          and all(v["NCCL_NVLS_ENABLE"] == "0" for v in info.values()))
    print(f"RESULT {'ok' if ok else 'FAIL'}: {len(info)} workers for {gpus} GPUs, "
          f"start {started:.1f} s, close {closed:.1f} s")
PYEOF
echo "rc=$?" >>"$OUT/dask-cuda-cluster.txt"
verdict "local-cuda cluster: $(grep -h '^RESULT' "$OUT/dask-cuda-cluster.txt" | sed 's/^RESULT //' \
  || true)$(grep -q '^RESULT' "$OUT/dask-cuda-cluster.txt" || echo "FAIL ($(tail -n 2 "$OUT/dask-cuda-cluster.txt" | tr '\n' ' '))")"

# 3. imgops gray on 48 photos with --scheduler local-cuda: the same bytes as the single process
#    with the same flags (default device: auto, the CPU below 3000 files; and --device cuda).
mkdir -p "$work/photos"
for i in $(seq 1 12); do
  for f in samples/flower_progressive_3mp.jpg samples/rocket_baseline_rgb.jpg \
    samples/coffee_rgb.png samples/flower_rgb_3mp.png; do
    cp "$f" "$work/photos/$i-$(basename "$f")"
  done
done
for flags in "" "--device cuda"; do
  name=gray-${flags:+cuda}; name=${name%-}
  {
    for kind in single cuda; do
      extra=(); [ $kind = cuda ] && extra=(--scheduler local-cuda)
      t0=$(date +%s%N)
      timeout 240 $PY -m imgops.cli gray "$work/photos" -d "$work/$name-$kind" -q $flags "${extra[@]}" \
        --stats-json "$work/$name-$kind.json"
      echo "$kind rc=$? wall_ms $(( ($(date +%s%N) - t0) / 1000000 ))"
      $PY -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: d.get(k) for k in ('written','failed','device','wall_seconds')})" \
        "$work/$name-$kind.json" 2>&1
    done
  } >"$OUT/dask-cuda-$name.txt" 2>&1
  count=$(ls "$work/$name-cuda" 2>/dev/null | wc -l)
  if [ "$count" -eq 48 ] && diff -r "$work/$name-single" "$work/$name-cuda" >/dev/null; then
    verdict "$name local-cuda: ok (48 files, bytes equal the single process; $(grep -h wall_ms \
      "$OUT/dask-cuda-$name.txt" | tr '\n' ' '))"
  else
    verdict "$name local-cuda: FAIL ($count files; see dask-cuda-$name.txt)"
  fi
done

# 4. imgops normvol of a small zarr with --scheduler local-cuda (blocks on each worker's GPU):
#    every level equal to the single-process OME-Zarr bit for bit.
timeout 240 $PY - "$work" >"$OUT/dask-cuda-normvol.txt" 2>&1 <<'PYEOF'
import os, subprocess, sys, time
from pathlib import Path
import numpy as np, zarr
work = Path(sys.argv[1])
data = np.random.default_rng(0).normal(1500, 400, (32, 512, 512)).clip(0, 4095).astype("uint16")
zarr.create_array(str(work / "scan.zarr"), shape=data.shape, chunks=(8, 256, 256),
                  dtype="uint16")[...] = data
walls = {}
for kind, extra in (("single", []), ("cuda", ["--scheduler", "local-cuda"])):
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "imgops.cli", "normvol", str(work / "scan.zarr"),
                           "-o", str(work / f"{kind}.ome.zarr"), "--percentile", "1", "99.8",
                           "--clip", "-q", *extra], capture_output=True, text=True)
    walls[kind] = time.perf_counter() - t0
    print(kind, "rc", proc.returncode, f"{walls[kind]:.1f} s", proc.stderr[-800:])
a = zarr.open_group(str(work / "single.ome.zarr"), mode="r")
b = zarr.open_group(str(work / "cuda.ome.zarr"), mode="r")
names = sorted(n for n, _ in a.arrays())
same = names == sorted(n for n, _ in b.arrays()) and all(
    a[n][...].tobytes() == b[n][...].tobytes() for n in names)
print(f"RESULT {'ok' if same and names else 'FAIL'}: {len(names)} levels "
      f"{'equal' if same else 'DIFFER'}; single {walls['single']:.1f} s, "
      f"local-cuda {walls['cuda']:.1f} s")
PYEOF
echo "rc=$?" >>"$OUT/dask-cuda-normvol.txt"
verdict "normvol local-cuda: $(grep -h '^RESULT' "$OUT/dask-cuda-normvol.txt" | sed 's/^RESULT //' \
  || true)$(grep -q '^RESULT' "$OUT/dask-cuda-normvol.txt" || echo "FAIL ($(tail -n 3 "$OUT/dask-cuda-normvol.txt" | tr '\n' ' '))")"
