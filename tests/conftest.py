"""Shared fixtures: devices, sample files, and skipping CUDA tests where there is no GPU."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
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
    """A GPU is visible and the CUDA kernels are compiled in."""
    import torch

    if not torch.cuda.is_available():
        return False
    from imgops import _extension

    return bool(_extension.load().get("cuda_kernels"))


def pytest_collection_modifyitems(config, items):
    if cuda_ready():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU and imgops' CUDA kernels")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


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
