"""Finds and loads the compiled kernels (imgops._C), or builds them just in time.

The prebuilt module is used when it exists and was built for the running torch (recorded in
_build_meta.json beside it, checked *before* the module is loaded, so a torch upgrade never ends
in an "undefined symbol" crash). Otherwise the same sources are compiled with
torch.utils.cpp_extension.load into a per-user cache keyed by torch version, CUDA version and
architecture, under a file lock, with one line on stderr while it compiles.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import json
import os
import platform
import sys
import threading
from pathlib import Path
from typing import Any

from . import _build_support as support

_PACKAGE_DIR = Path(__file__).resolve().parent
_load_lock = threading.Lock()
_info: dict[str, Any] | None = None


class ExtensionError(RuntimeError):
    """The compiled kernels could not be loaded or built."""


def load() -> dict[str, Any]:
    """Loads the kernels once per process and returns what was loaded (see build_info)."""
    global _info
    with _load_lock:
        if _info is None:
            _info = _load_uncached()
        return _info


def _load_uncached() -> dict[str, Any]:
    import torch

    problem = "IMGOPS_FORCE_JIT=1 is set" if os.environ.get("IMGOPS_FORCE_JIT") == "1" else None
    meta = _read_prebuilt_meta()
    if problem is None:
        problem = _prebuilt_problem(meta, torch.__version__)
    if problem is None:
        try:
            module = importlib.import_module("imgops._C")
            return {**meta, "mode": "ahead-of-time", "path": module.__file__}
        except ImportError as error:
            problem = f"the prebuilt module failed to load ({error})"
    if os.environ.get("IMGOPS_NO_JIT") == "1":
        raise ExtensionError(f"imgops: {problem}, and IMGOPS_NO_JIT=1 forbids a rebuild")
    return _build_just_in_time(problem)


def _read_prebuilt_meta() -> dict[str, Any]:
    try:
        return json.loads((_PACKAGE_DIR / support.BUILD_META_NAME).read_text())
    except (OSError, ValueError):
        return {}


def _prebuilt_problem(meta: dict[str, Any], torch_version: str) -> str | None:
    """Why the prebuilt module must not be loaded, or None when it fits the running torch."""
    if importlib.util.find_spec("imgops._C") is None:
        return "no prebuilt module"
    if not meta:
        return "the prebuilt module has no build metadata"
    if meta.get("torch") != torch_version:
        return f"the prebuilt module was built for torch {meta.get('torch')}, not {torch_version}"
    return None


def _find_sources() -> Path:
    for candidate in (_PACKAGE_DIR / "_csrc", _PACKAGE_DIR.parent.parent / "csrc"):
        if (candidate / "ops.cpp").exists():
            return candidate
    raise ExtensionError("imgops: cannot rebuild the kernels: the C++ sources are not installed")


def cache_root() -> Path:
    """Where just-in-time builds live: $IMGOPS_CACHE_DIR, else ~/.cache/imgops/jit."""
    env = os.environ.get("IMGOPS_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "imgops" / "jit"


def _build_key(torch_module, plan: support.CudaPlan, archs: str, sources: list[str]) -> str:
    digest = hashlib.sha256()
    for path in sources + sorted(str(p) for p in Path(sources[0]).parent.rglob("*.h*")):
        digest.update(Path(path).read_bytes())
    cuda = (
        f"cu{plan.nvcc_version}-sm{archs.replace(';', '_').replace('+', '')}"
        if plan.enabled
        else "cpu"
    )
    py = f"py{sys.version_info.major}{sys.version_info.minor}"
    machine = platform.machine()
    return f"torch{torch_module.__version__}-{cuda}-{py}-{machine}-{digest.hexdigest()[:12]}"


@contextlib.contextmanager
def _exclusive_lock(directory: Path):
    """An flock on directory/.imgops.lock: released by the kernel when the holder dies."""
    directory.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not POSIX: torch's own lock file is all we have
        yield
        return
    with open(directory / ".imgops.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build_just_in_time(reason: str) -> dict[str, Any]:
    import torch

    plan = support.plan_cuda(torch.version.cuda)
    build = support.plan_build(
        plan,
        force_cuda=os.environ.get("FORCE_CUDA") == "1",
        arch_list=os.environ.get("TORCH_CUDA_ARCH_LIST"),
        visible_archs=support.visible_gpu_archs(torch) if plan.enabled else [],
    )
    if not build.cuda:
        plan = support.CudaPlan(False, build.why, plan.cuda_home, plan.nvcc_version)
    try:
        return _compile(torch, plan, reason, build.archs)
    except Exception as error:
        if not plan.enabled or os.environ.get("FORCE_CUDA") == "1":
            raise ExtensionError(f"imgops: building the kernels failed: {error}") from error
        print(
            f"imgops: the CUDA kernels failed to build ({error}); building CPU only",
            file=sys.stderr,
        )
        cpu_plan = support.CudaPlan(False, f"the CUDA build failed: {error}", None, None)
        return _compile(torch, cpu_plan, reason, "")


def _compile(torch_module, plan: support.CudaPlan, reason: str, archs: str) -> dict[str, Any]:
    csrc = _find_sources()
    sources = support.source_files(csrc, plan.enabled)
    archs = archs if plan.enabled else ""
    key = _build_key(torch_module, plan, archs, sources)
    build_dir = cache_root() / key
    cuda_home = plan.cuda_home or support.find_cuda_home()
    if cuda_home:  # before torch.utils.cpp_extension guesses (and warns) at import
        os.environ.setdefault("CUDA_HOME", cuda_home)
    if archs:
        os.environ["TORCH_CUDA_ARCH_LIST"] = archs
    from torch.utils import cpp_extension

    if plan.cuda_home:
        cpp_extension.CUDA_HOME = plan.cuda_home  # read at import; we may come after that
    library = build_dir / "imgops_jit.so"
    what = f"CPU+CUDA kernels for {archs}" if plan.enabled else "CPU kernels"
    if not library.exists():
        why = "" if plan.enabled else f"; CPU only: {plan.reason}"
        print(
            f"imgops: compiling the {what} for torch {torch_module.__version__} "
            f"({reason}{why}); once, into {build_dir}",
            file=sys.stderr,
            flush=True,
        )
    flags = support.compile_flags(plan.enabled)
    with _exclusive_lock(build_dir):
        # We hold the only lock: a torch "lock" file left here is from a killed build.
        with contextlib.suppress(FileNotFoundError):
            (build_dir / "lock").unlink()
        cpp_extension.load(
            name="imgops_jit",
            sources=sources,
            extra_cflags=flags["cxx"],
            extra_cuda_cflags=flags["nvcc"],
            extra_include_paths=[str(csrc)],
            build_directory=str(build_dir),
            with_cuda=plan.enabled,
            is_python_module=False,
            verbose=os.environ.get("IMGOPS_VERBOSE_BUILD") == "1",
        )
    return {
        "torch": torch_module.__version__,
        "torch_cuda": torch_module.version.cuda,
        "cuda_kernels": plan.enabled,
        "cuda_skipped_reason": plan.reason,
        "nvcc": plan.nvcc_version,
        "cuda_home": plan.cuda_home,
        "archs": archs,
        "mode": "just-in-time",
        "rebuild_reason": reason,
        "build_plan": f"imgops: built the {what}",
        "path": str(library),
    }


def build_info() -> dict[str, Any]:
    """What a user needs to debug an install: versions, nvcc, CUDA kernels, build mode, archs."""
    import torch

    from . import __version__

    info = dict(load())
    compiled = json.loads(torch.ops.imgops._build_config())
    plan = support.plan_cuda(torch.version.cuda)
    devices = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(i)
            devices.append(f"cuda:{i} {torch.cuda.get_device_name(i)} (sm_{major}{minor})")
    return {
        "imgops": __version__,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "devices": devices,
        "nvcc_found": plan.nvcc_version,
        "cuda_home": plan.cuda_home,
        "cuda_kernels": bool(compiled["cuda_kernels"]),
        "built_against_torch": compiled["torch"],
        "mode": info.get("mode"),
        "archs": info.get("archs", ""),
        "device_kernels": device_kernels_built(),
        "cuda_skipped_reason": ""
        if compiled["cuda_kernels"]
        else info.get("cuda_skipped_reason", ""),
        "rebuild_reason": info.get("rebuild_reason", ""),
        "build_plan": info.get("build_plan", ""),
        "extension_path": info.get("path"),
    }


def device_kernels_built() -> bool:
    """Whether the prebuilt package has the torch-free engine's kernels: its build metadata says
    so and imgops/_device_kernels.fatbin is there."""
    meta = _read_prebuilt_meta()
    return (
        bool(meta.get("device_kernels")) and (_PACKAGE_DIR / support.DEVICE_KERNELS_NAME).is_file()
    )
