#!/usr/bin/env bash
# The sample images through `imgops gray` on CPU and on CUDA: wall time of each batch, and the
# outputs must be byte-identical with --decoder cpu (the GPU decoder's pixels differ slightly:
# docs/GPU.md). Usage: bash scripts/cli_cpu_vs_cuda.sh OUTDIR
set -euo pipefail
out=${1:-/tmp/imgops-cli}
PY=${PYTHON:-python3}
inputs=(samples/*.jpg samples/*.png)
decoder=()
if $PY -m imgops.cli gray --help | grep -q -- "--decoder"; then decoder=(--decoder cpu); fi
for dev in cpu cuda; do
  rm -rf "$out/gray-$dev"; mkdir -p "$out/gray-$dev"
  t0=$EPOCHREALTIME
  $PY -m imgops.cli gray "${inputs[@]}" -d "$out/gray-$dev" --device "$dev" "${decoder[@]}" -q
  t1=$EPOCHREALTIME
  echo "gray batch of ${#inputs[@]} sample images on $dev: $(awk "BEGIN{printf \"%.2f\", $t1 - $t0}") s (incl. start-up)"
done
diff -r "$out/gray-cpu" "$out/gray-cuda" && echo "CPU and CUDA outputs byte-identical ($(ls "$out/gray-cpu" | wc -l) files)"
