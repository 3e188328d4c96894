"""The loader and the three builds: ahead of time, just in time, and load_inline."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import imgops
from imgops import _build_support, _extension

ROOT = Path(__file__).resolve().parent.parent


def test_build_info_reports_what_a_user_needs():
    info = imgops.build_info()
    for key in ("torch", "torch_cuda", "nvcc_found", "cuda_kernels", "mode", "archs", "devices"):
        assert key in info
    assert info["torch"] == torch.__version__
    assert info["mode"] in ("ahead-of-time", "just-in-time")
    assert torch.__version__.startswith(info["built_against_torch"])
    compiled = json.loads(torch.ops.imgops._build_config())
    assert info["cuda_kernels"] == compiled["cuda_kernels"]


def test_prebuilt_module_for_another_torch_is_not_loaded(tmp_path):
    meta = {"torch": "1.0.0", "cuda_kernels": False}
    problem = _extension._prebuilt_problem(meta, torch.__version__)
    if problem != "no prebuilt module":
        assert "built for torch 1.0.0" in problem
    assert _extension._prebuilt_problem({}, torch.__version__) in (
        "no prebuilt module",
        "the prebuilt module has no build metadata",
    )


def _fake_nvcc(directory: Path, release: str, top: str) -> Path:
    bin_dir = directory / "bin"
    bin_dir.mkdir(parents=True)
    nvcc = bin_dir / "nvcc"
    nvcc.write_text(
        "#!/bin/sh\n"
        'case "$1" in --version) '
        f'echo "Cuda compilation tools, release {release}, V{release}.1";;\n'
        f'  *) echo "#$ TOP={top}/bin/.." >&2;; esac\n'
    )
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def test_cuda_home_comes_from_nvcc_not_from_the_wrapper_location(tmp_path, monkeypatch):
    real_root = tmp_path / "cuda-real"
    (real_root / "bin").mkdir(parents=True)
    wrapper_bin = _fake_nvcc(tmp_path / "wrapper", "13.0", str(real_root))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", f"{wrapper_bin}{os.pathsep}{os.environ['PATH']}")
    assert _build_support.find_cuda_home() == str(real_root.resolve())


def test_cuda_major_mismatch_means_cpu_only_with_a_reason(tmp_path, monkeypatch):
    root = tmp_path / "cuda"
    _fake_nvcc(root.parent / "cuda", "12.4", str(root))
    monkeypatch.setenv("CUDA_HOME", str(root))
    plan = _build_support.plan_cuda("13.0")
    assert not plan.enabled
    assert "12.4" in plan.reason and "13.0" in plan.reason
    assert _build_support.plan_cuda(None).reason == "this torch was built without CUDA"
    monkeypatch.setenv("IMGOPS_CPU_ONLY", "1")
    assert not _build_support.plan_cuda("13.0").enabled


CUDA_OK = _build_support.CudaPlan(True, "", "/usr/local/cuda", "13.0")


def test_build_plan_explicit_arch_list_wins():
    build = _build_support.plan_build(
        CUDA_OK, force_cuda=False, arch_list="8.6;9.0", visible_archs=["12.0"]
    )
    assert (build.cuda, build.archs) == (True, "8.6;9.0")
    assert build.summary() == (
        "imgops: building CPU + CUDA kernels for 8.6;9.0: TORCH_CUDA_ARCH_LIST=8.6;9.0"
    )


def test_build_plan_visible_gpus_only():
    build = _build_support.plan_build(
        CUDA_OK, force_cuda=False, arch_list=" ", visible_archs=["8.0", "9.0"]
    )
    assert (build.cuda, build.archs) == (True, "8.0;9.0")
    assert "sm_80, sm_90" in build.summary()


def test_build_plan_no_gpu_means_cpu_only_unless_forced():
    cpu = _build_support.plan_build(CUDA_OK, force_cuda=False, arch_list=None, visible_archs=[])
    assert not cpu.cuda and cpu.archs == ""
    assert cpu.summary().startswith("imgops: building CPU kernels only: no GPU is visible")
    forced = _build_support.plan_build(CUDA_OK, force_cuda=True, arch_list=None, visible_archs=[])
    assert (forced.cuda, forced.archs) == (True, _build_support.DEFAULT_CUDA_ARCHS)
    assert "FORCE_CUDA=1" in forced.why


def test_build_plan_without_a_usable_toolkit_says_why():
    no_nvcc = _build_support.CudaPlan(False, "no nvcc found", None, None)
    build = _build_support.plan_build(
        no_nvcc, force_cuda=False, arch_list="9.0", visible_archs=["9.0"]
    )
    assert not build.cuda
    assert build.summary() == "imgops: building CPU kernels only: no nvcc found"


class _FakeCuda:
    def __init__(self, caps):
        self.caps = caps

    def is_available(self):
        return bool(self.caps)

    def device_count(self):
        return len(self.caps)

    def get_device_capability(self, index):
        return self.caps[index]


def test_visible_gpu_archs_are_deduplicated_and_sorted():
    fake = type("FakeTorch", (), {"cuda": _FakeCuda([(9, 0), (8, 6), (9, 0)])})
    assert _build_support.visible_gpu_archs(fake) == ["8.6", "9.0"]
    none = type("FakeTorch", (), {"cuda": _FakeCuda([])})
    assert _build_support.visible_gpu_archs(none) == []


def test_sources_and_flags():
    sources = _build_support.source_files(ROOT / "csrc", with_cuda=True)
    assert any(s.endswith("ops.cpp") for s in sources)
    assert any(s.endswith(".cu") for s in sources)
    assert not any(s.endswith(".cu") for s in _build_support.source_files(ROOT / "csrc", False))
    flags = _build_support.compile_flags(with_cuda=True)
    assert "-DIMGOPS_WITH_CUDA" in flags["cxx"] and "-ffp-contract=off" in flags["cxx"]


JIT_CHECK = (
    "import imgops, torch; info = imgops.build_info(); "
    "assert info['mode'] == 'just-in-time', info; "
    "x = torch.tensor([[[255, 0, 0]]], dtype=torch.uint8); "
    "assert imgops.rgb_to_gray(x).item() == 76; print('JIT-OK')"
)


@pytest.mark.slow
def test_just_in_time_build_two_processes_at_once_and_a_stale_lock(tmp_path):
    """Two processes build the same cache at once: one compiles, the other waits; both work."""
    env = {
        **os.environ,
        "IMGOPS_FORCE_JIT": "1",
        "IMGOPS_CACHE_DIR": str(tmp_path / "cache"),
        "IMGOPS_CPU_ONLY": "1",
    }
    # A torch lock file left by a killed build must not make the next build wait forever.
    first = subprocess.run(
        [sys.executable, "-c", JIT_CHECK], env=env, capture_output=True, text=True, timeout=900
    )
    assert first.returncode == 0, first.stderr
    assert "compiling the CPU kernels" in first.stderr
    build_dirs = [p for p in (tmp_path / "cache").iterdir() if p.is_dir()]
    assert len(build_dirs) == 1
    (build_dirs[0] / "lock").write_text("stale")
    (build_dirs[0] / "imgops_jit.so").unlink()  # force a rebuild with the stale lock present
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", JIT_CHECK],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err
        assert "JIT-OK" in out


@pytest.mark.slow
def test_load_inline_prototype_example(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "prototype_inline.py"),
            "--build-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "prototype verified" in result.stdout
