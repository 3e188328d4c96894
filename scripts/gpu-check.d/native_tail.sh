#!/usr/bin/env bash
# The device thread's native calls (imgops.engine.native_batch) on the GPU: their tests and the
# driver's (tests/test_native_tail.py, tests/test_cuda_driver.py: the exact luma, every image's
# file the CPU encoder's, byte for byte), then one warm `imgops serve` writing the 800 photos
# with the native calls and with the per-image Python ones (IMGOPS_DEVICE_NATIVE=none): the two
# folders must hold the same bytes. The native calls' GPU tests also run under
# compute-sanitizer's memcheck. $OUT/native-tail-tests.txt, $OUT/native-tail.txt.
# SERVE_DEVICE=cpu: no GPU (a dry run of the script: both folders come from the CPU path).
set -uo pipefail
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
DEV=${SERVE_DEVICE:-cuda}
REPORT=$OUT/native-tail.txt
export PYTHONUNBUFFERED=1
# (NATIVE_TAIL_TESTS adds test files, e.g. tests/test_decode_stream_order.py; the > 2 GiB
# kernel tests, marked slow, are left to the tests stage of gpu-check.sh)
IMGOPS_NO_JIT=1 timeout 300 $PY -m pytest -q -rs -p no:cacheprovider -m "not slow" \
  tests/test_native_tail.py tests/test_cuda_driver.py ${NATIVE_TAIL_TESTS:-} \
  >"$OUT/native-tail-tests.txt" 2>&1
echo "tests rc=$? $(tail -n 1 "$OUT/native-tail-tests.txt")" | tee "$REPORT"
if command -v compute-sanitizer >/dev/null && [ "$DEV" = cuda ]; then
  # the native calls' launches under memcheck (API errors off: the tests provoke some)
  IMGOPS_NO_JIT=1 timeout 240 compute-sanitizer --tool memcheck --report-api-errors no \
    --print-limit 20 --error-exitcode 9 $PY -m pytest -q -p no:cacheprovider \
    -m "gpu_driver and not slow" tests/test_native_tail.py >"$OUT/native-tail-memcheck.txt" 2>&1
  echo "memcheck rc=$? $(grep -E "ERROR SUMMARY" "$OUT/native-tail-memcheck.txt" | tail -n 1)" \
    "$(tail -n 1 "$OUT/native-tail-memcheck.txt" | head -c 120)" | tee -a "$REPORT"
fi
. scripts/gpu-check.d/photo-batches.bash
photo_batches native-tail
mkdir -p /tmp/imgops-native-tail && chmod 700 /tmp/imgops-native-tail
SOCKET=/tmp/imgops-native-tail/server.sock
$PY -m imgops.entry serve --device "$DEV" --idle-timeout 0 --socket "$SOCKET" -v \
  2>"$OUT/native-tail-server.log" &
SERVER=$!
for _ in $(seq 900); do
  grep -q "ready at" "$OUT/native-tail-server.log" && break
  sleep 0.1
done
for tail in all none all none; do
  IMGOPS_DEVICE_NATIVE=$tail IMGOPS_SERVER=$SOCKET timed_gray "/tmp/imgops-native-tail-$tail" \
    "/tmp/imgops-native-tail-$tail.json" "/tmp/imgops-native-tail-$tail.err" "$BATCH" \
    --device "$DEV"
  echo "$tail rc=$GRAY_RC $GRAY_MS ms $(ls "/tmp/imgops-native-tail-$tail" | wc -l) files" \
    "$(engine_stats "/tmp/imgops-native-tail-$tail.json")" | tee -a "$REPORT"
done
$PY -m imgops.entry serve --stop --socket "$SOCKET"
wait "$SERVER"
$PY - /tmp/imgops-native-tail-all /tmp/imgops-native-tail-none <<'PYEOF' | tee -a "$REPORT"
# The two folders: the same names, the same bytes.
import sys
from pathlib import Path
a, b = (Path(p) for p in sys.argv[1:3])
names = sorted(p.name for p in a.iterdir())
other = sorted(p.name for p in b.iterdir())
differ = [n for n in names if n in other and (a / n).read_bytes() != (b / n).read_bytes()]
print(f"native calls vs none: {len(names)} and {len(other)} files, same names "
      f"{names == other}, {len(differ)} differ{': ' + ', '.join(differ[:5]) if differ else ''}")
PYEOF
rm -rf /tmp/imgops-native-tail-all /tmp/imgops-native-tail-none
