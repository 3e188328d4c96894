"""Ahead-of-time build of imgops._C and of imgops._cli_kernels, the command line's torch-free
CPU kernels. Builds only what the machine needs (one line in the build log says what and why):

  TORCH_CUDA_ARCH_LIST set      CPU + CUDA kernels for exactly those architectures
  else a GPU is visible         CPU + CUDA kernels for the visible GPUs' architectures
  else                          CPU kernels only, unless FORCE_CUDA=1 (every supported arch)

CUDA kernels also need a torch built with CUDA and an nvcc of the same CUDA major version.
With them, csrc/device/ is compiled into imgops/_device_kernels.fatbin (same architectures, PTX
of the highest), the kernels the torch-free engine loads through the CUDA driver API.

Environment:
  FORCE_CUDA=1       build the CUDA kernels even without a GPU; fail instead of falling back
                     to a CPU-only build (CI sets it)
  IMGOPS_CPU_ONLY=1  never compile the CUDA kernels
  DEBUG=1            -O0 -g
  IMGOPS_STABLE_PROTOTYPE=1  also build imgops._C_stable, rgb_to_gray on PyTorch's stable ABI
                     (csrc/stable/; torch >= 2.10 and CPython >= 3.10 from one binary)
  TORCH_CUDA_ARCH_LIST, MAX_JOBS, CUDA_HOME as for any PyTorch extension
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
CSRC = Path("csrc")
CLI_KERNELS = "imgops._cli_kernels"
STABLE = "imgops._C_stable"


def _load_build_support():
    spec = importlib.util.spec_from_file_location(
        "imgops_build_support", ROOT / "src" / "imgops" / "_build_support.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


support = _load_build_support()

import torch  # noqa: E402

FORCE_CUDA = os.environ.get("FORCE_CUDA") == "1"
DEBUG = os.environ.get("DEBUG") == "1"
STABLE_PROTOTYPE = os.environ.get("IMGOPS_STABLE_PROTOTYPE") == "1"
PLAN = support.plan_cuda(torch.version.cuda)
if PLAN.cuda_home:
    # torch.utils.cpp_extension reads CUDA_HOME once, at import: set it to the real root first.
    os.environ["CUDA_HOME"] = PLAN.cuda_home
BUILD = support.plan_build(
    PLAN,
    force_cuda=FORCE_CUDA,
    arch_list=os.environ.get("TORCH_CUDA_ARCH_LIST"),
    visible_archs=support.visible_gpu_archs(torch) if PLAN.enabled else [],
)
if BUILD.cuda:
    os.environ["TORCH_CUDA_ARCH_LIST"] = BUILD.archs

from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension  # noqa: E402


def _warn_cpu_only(reason: str) -> None:
    bar = "!" * 78
    print(
        f"\n{bar}\nimgops: building WITHOUT CUDA kernels: {reason}\n"
        f"imgops will run on the CPU only. Set FORCE_CUDA=1 to make this an error.\n{bar}\n",
        file=sys.stderr,
    )


if not PLAN.enabled and FORCE_CUDA:
    sys.exit(f"imgops: FORCE_CUDA=1 but the CUDA kernels cannot be built: {PLAN.reason}")
if not PLAN.enabled and support.visible_gpu_archs(torch):
    _warn_cpu_only(PLAN.reason)  # a GPU this build will not use deserves more than one line
# The one line before compiling (pip shows it with -v; build_info() and doctor repeat it).
print(BUILD.summary(), file=sys.stderr, flush=True)


def make_extension(with_cuda: bool):
    """The imgops._C extension, with or without the CUDA sources."""
    kind = CUDAExtension if with_cuda else CppExtension
    return kind(
        name="imgops._C",
        sources=[os.path.relpath(s, ROOT) for s in support.source_files(ROOT / CSRC, with_cuda)],
        include_dirs=[str(ROOT / CSRC)],
        extra_compile_args=support.compile_flags(with_cuda, DEBUG),
    )


def make_stable_extension(with_cuda: bool):
    """imgops._C_stable: the stable-ABI prototype (abi3, any torch >= 2.10)."""
    kind = CUDAExtension if with_cuda else CppExtension
    return kind(
        name=STABLE,
        sources=[
            os.path.relpath(s, ROOT) for s in support.stable_source_files(ROOT / CSRC, with_cuda)
        ],
        include_dirs=[str(ROOT / CSRC)],
        extra_compile_args=support.stable_compile_flags(with_cuda, DEBUG),
        py_limited_api=True,
    )


def make_cli_kernels():
    """imgops._cli_kernels: luma and PNG filters as a plain CPython module (no torch)."""
    return Extension(
        name=CLI_KERNELS,
        sources=[f"{CSRC}/standalone/module.cpp"],
        include_dirs=[str(ROOT / CSRC)],
        extra_compile_args=["-O3", "-ffp-contract=off"],
        language="c++",
    )


class BuildImgopsExtension(BuildExtension):
    """Builds _C, falls back to CPU only when the CUDA part fails, and records build metadata."""

    def build_extension(self, ext):
        if ext.name in (CLI_KERNELS, STABLE):
            super().build_extension(ext)
            return
        with_cuda, skipped = BUILD.cuda, ""
        try:
            super().build_extension(ext)
        except Exception as error:  # a CUDA compile failure; CPU-only unless FORCE_CUDA
            if not with_cuda or FORCE_CUDA:
                raise
            _warn_cpu_only(f"the CUDA build failed: {error}")
            cpu = make_extension(False)
            ext.sources, ext.extra_compile_args = cpu.sources, cpu.extra_compile_args
            ext.libraries = [lib for lib in ext.libraries if "cuda" not in lib]
            with_cuda, skipped = False, f"the CUDA build failed: {error}"
            super().build_extension(ext)
        device_kernels = self._build_device_kernels(ext)
        self._write_meta(ext, with_cuda, skipped or BUILD.why, device_kernels)

    def run(self):
        # setuptools builds in place by switching inplace off, building into build_lib and
        # copying the extension modules back: remember that in-place was asked for, so the
        # files written beside them (_package_targets) go to src/imgops/ too.
        self._inplace_requested = bool(self.inplace)
        super().run()

    def _package_targets(self, ext, name: str) -> list[Path]:
        """Where a file installed beside the package's __init__.py goes: build_lib, and for
        in-place and editable builds src/imgops/ too."""
        targets = [Path(self.get_ext_fullpath(ext.name)).parent / name]
        inplace = getattr(self, "_inplace_requested", False) or self.inplace
        if inplace or getattr(self, "editable_mode", False):
            targets.append(ROOT / "src" / "imgops" / name)
        unique = []
        for target in targets:
            if target.resolve() not in [t.resolve() for t in unique]:
                unique.append(target)
        return unique

    def _build_device_kernels(self, ext) -> bool:
        """Compiles csrc/device/ into imgops/_device_kernels.fatbin for the torch-free engine
        (whenever this build compiles CUDA kernels); True when it is installed. A failure is
        fatal under FORCE_CUDA, else a warning. A build without it removes a stale one."""
        targets = self._package_targets(ext, support.DEVICE_KERNELS_NAME)
        built = False
        if BUILD.cuda:
            compiled = Path(self.build_temp) / support.DEVICE_KERNELS_NAME
            try:
                support.build_device_kernels(
                    PLAN.cuda_home, ROOT / CSRC, compiled, BUILD.archs, DEBUG
                )
            except (RuntimeError, ValueError) as error:
                if FORCE_CUDA:
                    raise
                print(
                    f"imgops: WARNING: the device kernels ({support.DEVICE_KERNELS_NAME}) "
                    f"failed to build; the torch-free CUDA engine is unavailable: {error}",
                    file=sys.stderr,
                )
            else:
                for target in targets:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(compiled, target)
                built = True
        if not built:
            for target in targets:
                target.unlink(missing_ok=True)
        return built

    def _write_meta(self, ext, with_cuda: bool, why: str, device_kernels: bool) -> None:
        meta = {
            "torch": torch.__version__,
            "torch_cuda": torch.version.cuda,
            "cuda_kernels": with_cuda,
            "cuda_skipped_reason": "" if with_cuda else why,
            "build_plan": BUILD.summary(),
            "nvcc": PLAN.nvcc_version,
            "cuda_home": PLAN.cuda_home,
            "archs": BUILD.archs if with_cuda else "",
            "device_kernels": device_kernels,
            "mode": "ahead-of-time",
            "debug": DEBUG,
        }
        for target in self._package_targets(ext, support.BUILD_META_NAME):
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(meta, indent=2) + "\n")


class BuildPyWithSources(build_py):
    """Ships csrc/ inside the package (imgops/_csrc) so a just-in-time rebuild can find it."""

    def run(self):
        super().run()
        if not self.editable_mode:
            shutil.copytree(
                ROOT / CSRC, Path(self.build_lib, "imgops", "_csrc"), dirs_exist_ok=True
            )


setup(
    ext_modules=[
        make_extension(BUILD.cuda),
        make_cli_kernels(),
        *([make_stable_extension(BUILD.cuda)] if STABLE_PROTOTYPE else []),
    ],
    cmdclass={
        "build_ext": BuildImgopsExtension.with_options(use_ninja=True),
        "build_py": BuildPyWithSources,
    },
)
