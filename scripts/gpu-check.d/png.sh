#!/usr/bin/env bash
# png helper: the PNG encoder runs on the CPU; this checks that files written from the CUDA
# png_filter op rows equal encode_png (tests/test_png_torch.py), runs the encoder's tests, and
# measures it on one core of the GPU host (quieter than the 2-core dev box). Run from the repo
# root after the lead's build step. Results: $OUT/png-tests.txt, $OUT/png-bench.md.
set -u
OUT="${OUT:-out}"
mkdir -p "$OUT"
PY="${PYTHON:-python}"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -m pytest tests/test_png.py tests/test_png_encoder.py tests/test_png_torch.py -q -p no:cacheprovider \
  > "$OUT/png-tests.txt" 2>&1
echo "pytest rc=$?" >> "$OUT/png-tests.txt"
taskset -c 2 "$PY" benchmarks/png_encoders.py --reps 9 > "$OUT/png-bench.md" 2>&1 \
  || "$PY" benchmarks/png_encoders.py --reps 9 > "$OUT/png-bench.md" 2>&1
echo "bench rc=$?" >> "$OUT/png-bench.md"
