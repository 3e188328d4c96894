"""Shared fixtures: devices, sample files, and skipping CUDA tests where there is no GPU."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from driver_backends import backend, fake, fake_library, gpu  # noqa: F401 (fixtures)
from hypothesis import HealthCheck, settings

SAMPLES = Path(__file__).resolve().parent.parent / "samples"

settings.register_profile(
    "ci",
    deadline=None,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", deadline=None, max_examples=30)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


def cuda_ready() -> bool:
    """A GPU is visible and the CUDA kernels are compiled in (False where the torch extension
    is not prebuilt and IMGOPS_NO_JIT=1 forbids building it)."""
    import torch

    if not torch.cuda.is_available():
        return False
    from imgops import _extension

    try:
        return bool(_extension.load().get("cuda_kernels"))
    except _extension.ExtensionError:
        return False


def gpu_driver_ready() -> bool:
    """The CUDA driver sees a GPU and imgops' fatbin kernels are packaged (the torch-free
    engine's needs; torch is not imported)."""
    from imgops.engine import cuda_driver

    return cuda_driver.driver_available() and cuda_driver.kernels_path() is not None


def pytest_collection_modifyitems(config, items):
    checks = [
        ("cuda", cuda_ready, "needs a CUDA GPU and imgops' CUDA kernels"),
        ("gpu_driver", gpu_driver_ready, "needs a GPU through the CUDA driver and the fatbin"),
    ]
    for mark, ready, reason in checks:
        marked = [item for item in items if mark in item.keywords]
        if marked and not ready():
            for item in marked:
                item.add_marker(pytest.mark.skip(reason=reason))


def _device_params():
    return [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.cuda)]


@pytest.fixture(params=_device_params())
def device(request) -> str:
    """Runs a test once on the CPU and once on CUDA (skipped without a GPU)."""
    return request.param


@pytest.fixture
def samples() -> Path:
    """The folder of real sample images and scans (see samples/SOURCES.md)."""
    return SAMPLES
