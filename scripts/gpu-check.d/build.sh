#!/usr/bin/env bash
# build (issue 13) on the GPU machine, after the lead's build step; results in $OUT/build-*.txt.
#  1. the stable-ABI prototype imgops._C_stable with its CUDA kernel (sm_90), its tests incl. CUDA
#  2. the build plan: what setup.py would compile here and why (the one line)
#  3. the torch 2.11 "TORCH_CHECK streaming a number crashes" probe (csrc/checks.cpp's workaround):
#     which libstdc++ copies the process maps, and whether a bare extension that streams a double
#     or an IntArrayRef into TORCH_CHECK crashes, with a backtrace when it does.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/gpu-check-out}
PY=${PY:-python3}
mkdir -p "$OUT"
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
work=$(mktemp -d)

echo "== 1. stable-ABI prototype" | tee "$OUT/build-stable.txt"
$PY - "$work" >>"$OUT/build-stable.txt" 2>&1 <<'PYEOF'
import shutil, sys, time
from pathlib import Path
sys.path.insert(0, "src")
from imgops import _build_support as support
import torch
from torch.utils import cpp_extension
home = support.find_cuda_home()
if home:
    cpp_extension.CUDA_HOME = home
flags = support.stable_compile_flags(with_cuda=True)
started = time.time()
cpp_extension.load(
    name="_C_stable",
    sources=support.stable_source_files(Path("csrc"), with_cuda=True),
    extra_cflags=[*flags["cxx"], "-DPy_LIMITED_API=0x030a0000"],
    extra_cuda_cflags=flags["nvcc"],
    extra_include_paths=["csrc"],
    build_directory=sys.argv[1],
    with_cuda=True,
    is_python_module=False,
)
shutil.copy(Path(sys.argv[1], "_C_stable.so"), "src/imgops/_C_stable.abi3.so")
print(f"built in {time.time() - started:.0f} s against torch {torch.__version__}")
PYEOF
PYTHONPATH=$PWD/src $PY -m pytest tests/test_build_stable.py -q -p no:cacheprovider -m "" \
  >>"$OUT/build-stable.txt" 2>&1
echo "stable tests rc=$?" | tee -a "$OUT/build-stable.txt"
rm -f src/imgops/_C_stable.abi3.so

echo "== 2. build plan" | tee "$OUT/build-plan.txt"
(unset TORCH_CUDA_ARCH_LIST FORCE_CUDA; PYTHONPATH=$PWD/src $PY -c "
import torch
from imgops import _build_support as s
plan = s.plan_cuda(torch.version.cuda)
print(s.plan_build(plan, force_cuda=False, arch_list=None, visible_archs=s.visible_gpu_archs(torch)).summary())
") >>"$OUT/build-plan.txt" 2>&1

echo "== 3. TORCH_CHECK number-formatting probe" | tee "$OUT/build-checkprobe.txt"
{
  g++ --version | head -1; $PY -VV; ldd "$(command -v "$PY")" | grep -i "stdc\|python"
  echo "libstdc++ the compiler links: $(g++ -print-file-name=libstdc++.so.6)"
  strings "$(g++ -print-file-name=libstdc++.so.6)" | grep -o "GLIBCXX_3\.4\.[0-9]*" | sort -V | tail -1
  $PY -c "import torch; print(torch.__version__, torch._C._GLIBCXX_USE_CXX11_ABI); print(torch.__config__.show().splitlines()[1])"
} >>"$OUT/build-checkprobe.txt" 2>&1
cat >"$work/probe.py" <<'PYEOF'
# A bare extension whose TORCH_CHECK streams a string, a dtype, a double and an IntArrayRef.
import sys
import torch
from torch.utils.cpp_extension import load_inline
if "cv2" in sys.argv:
    import cv2  # noqa: F401  (imported first, as the CLI does)
src = r'''
#include <torch/extension.h>
void check_kind(const at::Tensor& t, int64_t kind) {
  if (kind == 0) TORCH_CHECK_VALUE(false, "string ", std::string("only"));
  if (kind == 1) TORCH_CHECK_TYPE(false, "dtype ", t.scalar_type());
  if (kind == 2) TORCH_CHECK_VALUE(false, "double ", 1.5);
  if (kind == 3) TORCH_CHECK_VALUE(false, "shape ", t.sizes());
  if (kind == 4) TORCH_CHECK_VALUE(false, "int64 ", static_cast<int64_t>(7));
}
'''
mod = load_inline("imgops_checkprobe", src, functions=["check_kind"], build_directory=sys.argv[1],
                  extra_cflags=["-O3"])
maps = sorted({l.split()[-1] for l in open("/proc/self/maps") if "libstdc++" in l})
print("libstdc++ mapped:", maps)
kind = int(sys.argv[2])
try:
    mod.check_kind(torch.zeros(2, 3), kind)
except Exception as error:
    print(f"kind {kind}: {type(error).__name__}: {error}")
PYEOF
mkdir -p "$work/probe"
for variant in plain cv2; do
  for kind in 0 1 2 3 4; do
    $PY -X faulthandler "$work/probe.py" "$work/probe" "$kind" "$variant" \
      >>"$OUT/build-checkprobe.txt" 2>&1
    rc=$?
    echo "variant=$variant kind=$kind rc=$rc" | tee -a "$OUT/build-checkprobe.txt"
    if [ "$rc" -ge 128 ] && command -v gdb >/dev/null; then
      gdb -q -batch -ex run -ex bt --args $PY "$work/probe.py" "$work/probe" "$kind" "$variant" \
        2>&1 | tail -40 >>"$OUT/build-checkprobe.txt"
    fi
  done
done
rm -rf "$work"
