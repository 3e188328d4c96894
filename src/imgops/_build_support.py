"""What the ahead-of-time build (setup.py) and the just-in-time build (_extension.py) share.

Pure standard library at import time, so setup.py can load this file before torch's
cpp_extension module reads CUDA_HOME.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

# Architectures built when CUDA is forced (FORCE_CUDA=1) with no GPU visible and no
# TORCH_CUDA_ARCH_LIST: every architecture torch 2.10+ CUDA 13 wheels support, plus PTX.
DEFAULT_CUDA_ARCHS = "7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX"
BUILD_META_NAME = "_build_meta.json"
# The torch-free engine kernels (csrc/device/), compiled to a fatbin the CUDA driver API loads
# (imgops.engine.cuda_driver), installed in the package beside __init__.py.
DEVICE_KERNELS_NAME = "_device_kernels.fatbin"
DEVICE_KERNELS_SOURCE = "device/engine_kernels.cu"  # relative to csrc/


@dataclass(frozen=True)
class CudaPlan:
    """Whether CUDA kernels will be compiled, and why not when they will not."""

    enabled: bool
    reason: str
    cuda_home: str | None
    nvcc_version: str | None


def find_cuda_home() -> str | None:
    """The CUDA toolkit root: $CUDA_HOME/$CUDA_PATH, else what `nvcc -dryrun` reports as TOP.

    torch's own guess takes the parent of the `nvcc` found on PATH, which is wrong when that
    `nvcc` is a wrapper script (as in /usr/local/bin here); nvcc itself knows its real root.
    """
    for var in ("CUDA_HOME", "CUDA_PATH"):
        value = os.environ.get(var)
        if value and Path(value, "bin", "nvcc").exists():
            return value
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        for candidate in ("/usr/local/cuda",):
            if Path(candidate, "bin", "nvcc").exists():
                return candidate
        return None
    try:
        out = subprocess.run(
            [nvcc, "-dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"^#\$ TOP=(.+)$", out.stderr + out.stdout, re.MULTILINE)
    if match:
        return str(Path(match.group(1).strip()).resolve())
    return str(Path(nvcc).resolve().parent.parent)


def nvcc_version(cuda_home: str) -> str | None:
    """The release number ("13.0") printed by `nvcc --version`, or None."""
    try:
        out = subprocess.run(
            [str(Path(cuda_home, "bin", "nvcc")), "--version"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"release (\d+\.\d+)", out)
    return match.group(1) if match else None


def plan_cuda(torch_cuda_version: str | None) -> CudaPlan:
    """Decide whether to compile the CUDA kernels for a torch built with `torch_cuda_version`."""
    if os.environ.get("IMGOPS_CPU_ONLY") == "1":
        return CudaPlan(False, "IMGOPS_CPU_ONLY=1 is set", None, None)
    if torch_cuda_version is None:
        return CudaPlan(False, "this torch was built without CUDA", None, None)
    cuda_home = find_cuda_home()
    if cuda_home is None:
        return CudaPlan(False, "no nvcc found (set CUDA_HOME to the CUDA toolkit)", None, None)
    version = nvcc_version(cuda_home)
    if version is None:
        return CudaPlan(False, f"could not run {cuda_home}/bin/nvcc --version", cuda_home, None)
    if version.split(".")[0] != torch_cuda_version.split(".")[0]:
        return CudaPlan(
            False,
            f"nvcc is CUDA {version} but torch was built with CUDA {torch_cuda_version}; "
            "install a matching toolkit or torch",
            cuda_home,
            version,
        )
    return CudaPlan(True, "", cuda_home, version)


@dataclass(frozen=True)
class BuildPlan:
    """What one build compiles: CUDA kernels or not, for which architectures, and why."""

    cuda: bool
    archs: str  # the TORCH_CUDA_ARCH_LIST to compile for; "" when cuda is False
    why: str  # one line for the build log and build_info()

    def summary(self) -> str:
        """The line printed before compiling."""
        what = f"CPU + CUDA kernels for {self.archs}" if self.cuda else "CPU kernels only"
        return f"imgops: building {what}: {self.why}"


def visible_gpu_archs(torch_module) -> list[str]:
    """The compute capabilities ("9.0") of the GPUs this process sees, sorted; [] without one."""
    try:
        if not torch_module.cuda.is_available():
            return []
        caps = {
            torch_module.cuda.get_device_capability(i)
            for i in range(torch_module.cuda.device_count())
        }
    except Exception:  # a broken driver counts as no GPU; the reason line says CPU only
        return []
    return [f"{major}.{minor}" for major, minor in sorted(caps)]


def plan_build(
    cuda: CudaPlan, *, force_cuda: bool, arch_list: str | None, visible_archs: list[str]
) -> BuildPlan:
    """Build only what is needed: an explicit arch list, else the visible GPUs, else CPU only.

    With no GPU visible CUDA is built only when asked for: FORCE_CUDA=1 (for every supported
    architecture, DEFAULT_CUDA_ARCHS) or an explicit TORCH_CUDA_ARCH_LIST.
    """
    arch_list = (arch_list or "").strip()
    if not cuda.enabled:
        return BuildPlan(False, "", cuda.reason)
    if arch_list:
        return BuildPlan(True, arch_list, f"TORCH_CUDA_ARCH_LIST={arch_list}")
    if visible_archs:
        gpus = ", ".join(f"sm_{a.replace('.', '')}" for a in visible_archs)
        return BuildPlan(True, ";".join(visible_archs), f"the visible GPUs are {gpus}")
    if force_cuda:
        return BuildPlan(
            True,
            DEFAULT_CUDA_ARCHS,
            "FORCE_CUDA=1 with no GPU visible and no TORCH_CUDA_ARCH_LIST: every supported "
            "architecture",
        )
    return BuildPlan(
        False,
        "",
        "no GPU is visible (FORCE_CUDA=1 or TORCH_CUDA_ARCH_LIST=... builds CUDA kernels anyway)",
    )


def source_files(csrc: Path, with_cuda: bool) -> list[str]:
    """The extension's sources under `csrc`, sorted; .cu files only when `with_cuda`."""
    files = [csrc / "ops.cpp", csrc / "checks.cpp", *sorted((csrc / "cpu").glob("*.cpp"))]
    if with_cuda:
        files += sorted((csrc / "cuda").glob("*.cu"))
    return [str(f) for f in files]


# The stable-ABI prototype (csrc/stable/, imgops._C_stable) targets this torch and CPython:
# one binary for torch >= 2.10 and CPython >= 3.10.
STABLE_TARGET_TORCH = "0x020a000000000000"  # TORCH_TARGET_VERSION for 2.10


def stable_source_files(csrc: Path, with_cuda: bool) -> list[str]:
    """The stable-ABI prototype's sources (csrc/stable/), sorted; .cu only when `with_cuda`."""
    files = sorted((csrc / "stable").glob("*.cpp"))
    if with_cuda:
        files += sorted((csrc / "stable").glob("*.cu"))
    return [str(f) for f in files]


def stable_compile_flags(with_cuda: bool, debug: bool = False) -> dict[str, list[str]]:
    """Flags for the stable-ABI prototype: the target torch, the limited C API, no ATen."""
    flags = compile_flags(with_cuda, debug)
    stable = [
        f"-DTORCH_TARGET_VERSION={STABLE_TARGET_TORCH}",
        "-DTORCH_STABLE_ONLY",
        *(["-DUSE_CUDA"] if with_cuda else []),
    ]
    return {
        "cxx": [*flags["cxx"], *stable],
        "nvcc": [*flags["nvcc"], *stable],
    }


def compile_flags(with_cuda: bool, debug: bool = False) -> dict[str, list[str]]:
    """Compiler flags for the host compiler ("cxx") and nvcc ("nvcc")."""
    opt = ["-O0", "-g"] if debug else ["-O3"]
    define = ["-DIMGOPS_WITH_CUDA"] if with_cuda else []
    cxx = [*opt, "-ffp-contract=off", *define]
    nvcc = [*opt, "--expt-relaxed-constexpr", *define]
    if debug:
        nvcc.append("-lineinfo")
    return {"cxx": cxx, "nvcc": nvcc}


_ARCH = re.compile(r"^(\d+)\.(\d+)([af]?)(\+PTX)?$")


def fatbin_gencode_flags(archs: str) -> list[str]:
    """nvcc -gencode flags for a TORCH_CUDA_ARCH_LIST ("8.0;9.0+PTX", "9.0 10.0a"): SASS for each
    architecture, plus PTX of the highest (without its a/f suffix) so newer GPUs can JIT it.

    ValueError for an entry that is not MAJOR.MINOR[a|f][+PTX] (e.g. a name like "Hopper").
    """
    entries = [a for a in re.split(r"[;\s,]+", archs.strip()) if a]
    if not entries:
        raise ValueError("no CUDA architecture to build the device kernels for")
    flags: list[str] = []
    numbers: list[tuple[int, int]] = []
    for entry in entries:
        match = _ARCH.match(entry)
        if match is None:
            raise ValueError(f"cannot read CUDA architecture {entry!r} (want e.g. 9.0 or 9.0+PTX)")
        major, minor, suffix = int(match.group(1)), int(match.group(2)), match.group(3)
        cc = f"{major}{minor}{suffix}"
        flag = f"-gencode=arch=compute_{cc},code=sm_{cc}"
        if flag not in flags:
            flags.append(flag)
        numbers.append((major, minor))
    major, minor = max(numbers)
    flags.append(f"-gencode=arch=compute_{major}{minor},code=compute_{major}{minor}")
    return flags


def device_kernels_command(
    cuda_home: str, csrc: Path, output: Path, archs: str, debug: bool = False
) -> list[str]:
    """The nvcc command line that compiles csrc/device/engine_kernels.cu into `output`."""
    return [
        str(Path(cuda_home, "bin", "nvcc")),
        "-fatbin",
        "-O3",
        "-std=c++17",
        *(["-lineinfo"] if debug else []),
        *fatbin_gencode_flags(archs),
        f"-I{csrc}",
        str(csrc / DEVICE_KERNELS_SOURCE),
        "-o",
        str(output),
    ]


def build_device_kernels(
    cuda_home: str, csrc: Path, output: Path, archs: str, debug: bool = False
) -> None:
    """Compiles the device kernels into `output` (written whole or not at all).

    RuntimeError with nvcc's output when it fails.
    """
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(output.name + ".partial")
    command = device_kernels_command(cuda_home, csrc, partial, archs, debug)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.SubprocessError) as error:
        raise RuntimeError(f"{' '.join(command)}: {error}") from error
    if done.returncode != 0 or not partial.exists():
        partial.unlink(missing_ok=True)
        raise RuntimeError(
            f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}{done.stderr}"
        )
    os.replace(partial, output)
