#!/usr/bin/env bash
# GPU JPEG encode (`-f jpg` on CUDA, nvImageCodec's nvJPEG encoder), a diagnostic in < 60 s.
# Run from the repo root after the lead's build step, nvImageCodec + nvJPEG wheels on PYTHONPATH.
# Results in $OUT/jpeg-*.txt:
#   env       versions, where the nvidia wheels and libnvjpeg.so.13 are, libraries loaded
#   backends  nv.Encoder with each backend choice on GPU 0: created? encodes RGB and gray?
#   verbose   nvImageCodec's own log (PYNVIMGCODEC_VERBOSITY=4) for GPU_ONLY and HYBRID_CPU_GPU
#   psnr      samples/*.jpg (RGB and their luma): GPU encode at quality 95 vs OpenCV's, PSNR
#   cli       imgops gray --device cuda -f jpg on the samples (no OpenCV-fallback note expected)
#   tests     tests/test_gpu_jpeg_encode.py + the engine's GPU JPEG test, in the time left
set -uo pipefail
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
START=$SECONDS
BUDGET=${JPEG_BUDGET_S:-57}
step() {  # name, cap seconds, command...: output to $OUT/jpeg-NAME.txt, one summary line
  local name=$1 cap=$2; shift 2
  local left=$((BUDGET - (SECONDS - START)))
  ((left < cap)) && cap=$left
  if ((cap < 2)); then echo "jpeg-$name skipped: no time left" | tee "$OUT/jpeg-$name.txt"; return 0; fi
  local t0=$SECONDS
  timeout -k 2 "$cap" "$@" >"$OUT/jpeg-$name.txt" 2>&1
  local rc=$?
  ((rc == 124 || rc == 137)) && echo "TIMED OUT after ${cap}s" >>"$OUT/jpeg-$name.txt"
  echo "jpeg-$name rc=$rc $((SECONDS - t0))s: $(tail -n 1 "$OUT/jpeg-$name.txt")"
  return 0
}

step env 10 $PY - <<'PYEOF'
import glob, os, sys
import nvidia.nvimgcodec as nv
import nvidia
print("python", sys.version.split()[0])
print("nvImageCodec", nv.__version__, "built for CUDA", nv.__cuda_version__)
print("nvidia package dirs:", list(nvidia.__path__))
for root in nvidia.__path__:
    for lib in sorted(glob.glob(os.path.join(root, "*", "lib", "libnvjpeg*"))):
        print("  found", lib)
ext = os.path.join(os.path.dirname(nv.__file__), "extensions")
print("extensions:", sorted(os.listdir(ext)))
print("LD_LIBRARY_PATH", os.environ.get("LD_LIBRARY_PATH"))
try:
    nv.Encoder(device_id=0, backends=[nv.Backend(nv.BackendKind.HYBRID_CPU_GPU)])
except Exception as error:
    print("HYBRID_CPU_GPU encoder on GPU 0 failed:", str(error).split(" at /")[0])
maps = {line.split()[-1] for line in open("/proc/self/maps") if "/" in line}
for path in sorted(maps):
    if any(k in path for k in ("nvimgcodec", "nvjpeg", "cudart", "libcuda.so", "_ext.so")):
        print("loaded", path)
print("loaded libnvjpeg:", [p for p in maps if "/libnvjpeg.so" in p] or "NONE")
PYEOF

step backends 15 $PY - <<'PYEOF'
import torch
import nvidia.nvimgcodec as nv
from imgops.io import gpu_encode
K = nv.BackendKind
choices = {"no backends argument": None, "GPU_ONLY (the old code)": [K.GPU_ONLY],
           "HYBRID_CPU_GPU": [K.HYBRID_CPU_GPU], "HW_GPU_ONLY": [K.HW_GPU_ONLY],
           "HW_GPU_ONLY + HYBRID_CPU_GPU (imgops)": [K.HW_GPU_ONLY, K.HYBRID_CPU_GPU],
           "CPU_ONLY": [K.CPU_ONLY]}
rgb = torch.randint(0, 256, (256, 320, 3), dtype=torch.uint8, device="cuda")
gray = rgb[..., :1].contiguous()
stream = torch.cuda.current_stream().cuda_stream
for name, kinds in choices.items():
    kw = {} if kinds is None else {"backends": [nv.Backend(k) for k in kinds]}
    try:
        enc = nv.Encoder(device_id=0, **kw)
    except Exception as error:
        print(f"{name:40s} create FAILED: {str(error).split(' at /')[0]}")
        continue
    sizes = []
    for image, css in ((rgb, nv.ChromaSubsampling.CSS_420), (gray, nv.ChromaSubsampling.CSS_GRAY)):
        params = nv.EncodeParams(quality_type=nv.QualityType.QUALITY, quality_value=95.0,
                                 chroma_subsampling=css)
        out = enc.encode([nv.as_image(image, cuda_stream=stream)], ".jpg", params=params,
                         cuda_stream=stream)[0]
        sizes.append(None if out is None else len(bytes(out)))
    print(f"{name:40s} create ok, encode RGB/gray bytes: {sizes}")
print("imgops gpu_encode.status:", gpu_encode.status(0))
PYEOF

step verbose 10 env PYNVIMGCODEC_VERBOSITY=4 $PY - <<'PYEOF'
import numpy as np
import nvidia.nvimgcodec as nv
print("---- Encoder(GPU_ONLY) on GPU 0", flush=True)
try:
    nv.Encoder(device_id=0, backends=[nv.Backend(nv.BackendKind.GPU_ONLY)])
except Exception as error:
    print("failed:", error, flush=True)
print("---- Encoder(HYBRID_CPU_GPU) on GPU 0 + one encode", flush=True)
enc = nv.Encoder(device_id=0, backends=[nv.Backend(nv.BackendKind.HYBRID_CPU_GPU)])
image = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
out = enc.encode([nv.as_image(image)], ".jpg")[0]  # a host image: nvImageCodec copies it over
print("encoded bytes:", None if out is None else len(bytes(out)), flush=True)
PYEOF

grep -aE "encoder \(id:[^ ]* codec:jpeg\)|not allowed|HW (en|de)coder|nvJPEG version|failed:|encoded bytes" \
  "$OUT/jpeg-verbose.txt" | grep -v unregistering | sed 's/\x1b\[[0-9;]*m//g' | head -n 12 | sed 's/^/  /'

step psnr 20 $PY - <<'PYEOF'
import glob, statistics, time
import cv2, numpy as np, torch
from imgops.io.gpu_encode import GpuJpegEncoder
def psnr(a, b):
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)
def luma(rgb):  # the exact BT.601 gray imgops writes
    w = rgb.astype(np.int64)
    return ((299 * w[..., 0] + 587 * w[..., 1] + 114 * w[..., 2] + 500) // 1000).astype(np.uint8)
enc = GpuJpegEncoder(95, 0)
stream = torch.cuda.current_stream().cuda_stream
rows, batch = [], []
print(f"{'image':36s} {'shape':>14s} {'gpu B':>8s} {'cv B':>8s} {'gpu dB':>7s} {'cv dB':>7s}"
      f" {'gpu~cv':>7s} {'gpu ms':>7s} {'cv ms':>7s}")
for path in sorted(glob.glob("samples/*.jpg")):
    bgr = cv2.imread(path, cv2.IMREAD_UNCHANGED)
    rgb = bgr if bgr.ndim == 2 else np.ascontiguousarray(bgr[..., ::-1])
    for label, pixels in ((path.split("/")[-1], rgb), ("  its luma", None if rgb.ndim == 2 else luma(rgb))):
        if pixels is None:
            continue
        tensor = torch.from_numpy(pixels).cuda()
        batch.append(tensor)
        times, data = [], None
        for _ in range(5):
            torch.cuda.synchronize(); t = time.perf_counter()
            data = enc.encode([tensor], stream)[0]
            times.append(time.perf_counter() - t)
        cv_in = pixels if pixels.ndim == 2 else np.ascontiguousarray(pixels[..., ::-1])
        cv_times = []
        for _ in range(5):
            t = time.perf_counter()
            ok, cv_data = cv2.imencode(".jpg", cv_in, [cv2.IMWRITE_JPEG_QUALITY, 95])
            cv_times.append(time.perf_counter() - t)
        cv_back = cv2.imdecode(cv_data, cv2.IMREAD_UNCHANGED)
        if data is None:
            print(f"{label:36s} {str(pixels.shape):>14s} GPU encode returned None (OpenCV would encode it)")
            continue
        back = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
        if back.ndim == 3:
            back, cv_back = back[..., ::-1], cv_back[..., ::-1]
        print(f"{label:36s} {str(pixels.shape):>14s} {len(data):8d} {len(cv_data):8d}"
              f" {psnr(back, pixels):7.2f} {psnr(cv_back, pixels):7.2f} {psnr(back, cv_back):7.2f}"
              f" {1e3 * statistics.median(times):7.2f} {1e3 * statistics.median(cv_times):7.2f}")
torch.cuda.synchronize(); t = time.perf_counter()
out = enc.encode(batch, stream)
print(f"one batched call, {len(batch)} images: {1e3 * (time.perf_counter() - t):.1f} ms,"
      f" {sum(o is not None for o in out)}/{len(batch)} encoded")
print("dB: PSNR vs the input pixels (gpu, OpenCV), gpu~cv: the two decodes against each other; quality 95")
PYEOF

cli_check() {  # cuda then cpu on the sample JPEGs; which outputs carry nvJPEG's bytes
  local dir=/tmp/imgops-jpeg-cli
  rm -rf "$dir" && mkdir -p "$dir"
  $PY -m imgops.cli gray --device cuda -f jpg --quality 95 -d "$dir/cuda" samples/*.jpg
  echo "cuda rc=$?"
  $PY -m imgops.cli gray --device cpu -f jpg --quality 95 -q -d "$dir/cpu" samples/*.jpg
  local f b verdict
  for f in "$dir"/cuda/*.jpg; do
    [[ -e $f ]] || { echo "no cuda outputs"; return 1; }
    b=$(basename "$f")
    if cmp -s "$f" "$dir/cpu/$b"; then verdict="same bytes as cpu: OpenCV encoded it"
    else verdict="differs from cpu: nvJPEG encoded it"; fi
    echo "$b: $(stat -c %s "$f") B, cpu $(stat -c %s "$dir/cpu/$b") B, $verdict"
  done
}
export -f cli_check
export PY
step cli 20 bash -c cli_check

step tests 40 $PY -m pytest -q -rs -p no:cacheprovider tests/test_gpu_jpeg_encode.py \
  "tests/test_pipeline_engine.py::test_gpu_jpeg_output_is_close_to_the_cpu_encoders"
echo "jpeg: $((SECONDS - START))s in all"
