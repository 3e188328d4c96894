"""`imgops doctor`: the build it reports and the problems it names, each with what to do."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from imgops.cli import cli
from imgops.commands.doctor import find_problems

HEALTHY = {
    "cuda_available": True,
    "cuda_kernels": True,
    "cuda_skipped_reason": "",
    "torch_cuda": "13.0",
    "nvcc_found": "13.0",
    "rebuild_reason": "",
    "cli_kernels": True,
}


def test_a_healthy_build_has_no_problems():
    assert find_problems(HEALTHY) == []
    assert find_problems({**HEALTHY, "cuda_available": False, "torch_cuda": None}) == []


def test_each_problem_says_what_to_do():
    cases = {
        "the CUDA kernels are not compiled in": {"cuda_kernels": False, "cuda_skipped_reason": "x"},
        "cannot be built; install a matching": {"nvcc_found": "12.8"},
        "no nvcc found": {"cuda_kernels": False, "nvcc_found": None},
        "a just-in-time build was used": {"rebuild_reason": "built for torch 2.10"},
        "imgops._cli_kernels is not built": {"cli_kernels": False},
    }
    for needle, change in cases.items():
        problems = find_problems({**HEALTHY, **change})
        assert any(needle in problem for problem in problems), (needle, problems)


def test_doctor_json_reports_the_build_and_the_cli_kernels():
    result = CliRunner().invoke(cli, ["doctor", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert info["cli_kernels"] is True  # built ahead of time with the package
    assert {"torch", "cuda_kernels", "problems"} <= set(info)


def test_doctor_names_missing_tiff_codecs():
    from imgops.commands.doctor import codec_problems

    assert codec_problems({"LZW": True, "ZSTD": True}) == []
    (problem,) = codec_problems({"LZW": False, "ZSTD": True, "JPEG": False})
    assert "JPEG, LZW" in problem and "imagecodecs" in problem


def test_doctor_lists_temporaries_of_killed_runs(tmp_path):
    import os

    from imgops.commands.doctor import stale_problems
    from imgops.io.atomic import temporary_path_for

    assert stale_problems([tmp_path]) == []
    temp = temporary_path_for(tmp_path / "photo_gray.png")
    dead_pid = 2**22 + 12345  # above any pid_max this test meets
    temp = temp.with_name(temp.name.replace(f"-{os.getpid()}-", f"-{dead_pid}-"))
    temp.write_bytes(b"partial")
    old = temp.stat().st_mtime - 3600
    os.utime(temp, (old, old))
    (problem,) = stale_problems([tmp_path])
    assert str(temp) in problem and "1 temporary file" in problem


def test_doctor_shows_the_decoder_and_encoders():
    from imgops.commands.doctor import codec_info

    info = codec_info()
    assert info["png level 2"] and "gpu jpeg decoder" in info and "tiff codecs" in info


def test_doctor_says_where_the_cuda_engine_deflates(monkeypatch):
    from imgops.commands.doctor import cuda_engine_info
    from imgops.engine.device import driver_engine_usable
    from imgops.engine.ops import GRAY

    if not driver_engine_usable(GRAY):
        pytest.skip("the torch engine serves --device cuda here (no fatbin kernels)")
    monkeypatch.setenv("IMGOPS_GPU_DEFLATE", "0")
    assert "PNG deflate on the CPU threads (IMGOPS_GPU_DEFLATE=0)" in cuda_engine_info()
    monkeypatch.delenv("IMGOPS_GPU_DEFLATE", raising=False)  # the default
    assert "PNG deflate on the GPU at --png-level 2" in cuda_engine_info()


def test_doctor_says_which_api_decodes_and_encodes_jpeg(monkeypatch):
    """With nvImageCodec 0.9 installed the torch-free engine decodes through the C API, and
    encodes -f jpg through it too unless IMGOPS_JPEG_ENCODER_API=python;
    IMGOPS_NVIMGCODEC_API=python names the Python module for both."""
    from imgops.commands.doctor import cuda_engine_info
    from imgops.engine.device import driver_engine_usable
    from imgops.engine.ops import GRAY
    from imgops.io import nvimgcodec_c

    if not driver_engine_usable(GRAY):
        pytest.skip("the torch engine serves --device cuda here (no fatbin kernels)")
    if nvimgcodec_c.package_dir() is None or not nvimgcodec_c.verified():
        pytest.skip("nvImageCodec 0.9 is not installed")
    monkeypatch.delenv("IMGOPS_NVIMGCODEC_API", raising=False)
    monkeypatch.delenv("IMGOPS_JPEG_ENCODER_API", raising=False)
    assert "its C API (-f jpg: its JPEG encoder too" in cuda_engine_info()
    monkeypatch.setenv("IMGOPS_JPEG_ENCODER_API", "python")
    assert "its C API (-f jpg: the Python module's JPEG encoder" in cuda_engine_info()
    monkeypatch.setenv("IMGOPS_NVIMGCODEC_API", "python")
    info = cuda_engine_info()
    assert "its Python module (IMGOPS_NVIMGCODEC_API=python)" in info and "C API" not in info
