"""The CUDA driver backends the driver-level tests run on (test_cuda_driver.py,
test_native_tail.py; conftest.py makes the fixtures everyone's):

* "fake": a stand-in libcuda over host memory compiled from tests/fake_cuda/fake_libcuda.cpp
  (it checks what ctypes and native callers pass: 64-bit pointers, pitches, the kernel
  parameters and grid sizes; its kernels are the CPU references);
* "gpu": the real driver and the real kernels (marked gpu_driver: skipped without a GPU or
  without the packaged fatbin; no torch extension needed).
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from imgops.engine import cuda_driver as cd

ROOT = Path(__file__).resolve().parent.parent
FAKE_SOURCE = Path(__file__).resolve().parent / "fake_cuda" / "fake_libcuda.cpp"
FATBIN_MAGIC = b"\x50\xed\x55\xba"


@pytest.fixture(scope="session")
def fake_library(tmp_path_factory) -> Path:
    """tests/fake_cuda/fake_libcuda.cpp, compiled once."""
    compiler = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip("no C++ compiler for the fake libcuda")
    if not FAKE_SOURCE.exists():  # an sdist's tests
        pytest.skip(f"no {FAKE_SOURCE.name}")
    out = tmp_path_factory.mktemp("fake_cuda") / "libfakecuda.so"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-std=c++17", "-O1", f"-I{ROOT / 'csrc'}",
         str(FAKE_SOURCE), "-o", str(out)],
        check=True,
    )  # fmt: skip
    return out


class Backend:
    """A Device, a stream and the kernels, on the fake library or the GPU."""

    def __init__(self, kind: str, device: cd.Device, kernels: cd.Kernels, lib=None):
        self.kind = kind
        self.device = device
        self.kernels = kernels
        self.stream = device.stream()
        self.lib = lib  # the fake's CDLL (its counters), None on the GPU

    def counter(self, name: str, ctype=ctypes.c_int):
        """One of the fake library's counters."""
        return ctype.in_dll(self.lib, name).value

    def launch_shape(self) -> tuple[list[int], list[int]]:
        """The fake's last launch: (grid, block)."""
        grid = (ctypes.c_uint * 3).in_dll(self.lib, "fake_last_grid")
        block = (ctypes.c_uint * 3).in_dll(self.lib, "fake_last_block")
        return list(grid), list(block)

    def upload(self, array: np.ndarray) -> int:
        """A device copy of `array`'s bytes (freed by the test through free())."""
        data = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
        ptr = self.device.alloc(max(1, data.size), self.stream)
        with self.device.pinned(max(1, data.size)) as staging:
            staging.array()[: data.size] = data
            self.device.copy_to_device(ptr, staging.ptr, data.size, self.stream)
            self.stream.synchronize()
        return ptr

    def download(self, ptr: int, nbytes: int) -> np.ndarray:
        with self.device.pinned(max(1, nbytes)) as staging:
            self.device.copy_to_host(staging.ptr, ptr, nbytes, self.stream)
            self.stream.synchronize()
            return staging.array()[:nbytes].copy()

    def free(self, *ptrs: int) -> None:
        for ptr in ptrs:
            self.device.free(ptr, self.stream)
        self.stream.synchronize()

    def close(self) -> None:
        self.stream.close()


@pytest.fixture(scope="module")
def gpu() -> Backend:
    if not cd.driver_available():
        pytest.skip("the CUDA driver sees no GPU")
    path = cd.kernels_path()
    if path is None:
        pytest.fail(
            f"no {cd.KERNELS_NAME} in the package: rebuild with FORCE_CUDA=1 "
            "(python setup.py build_ext --inplace, or pip install -e .)"
        )
    device = cd.Device(0)
    kernels = cd.Kernels(device)
    backend = Backend("gpu", device, kernels)
    yield backend
    backend.close()
    kernels.close()
    device.close()


@pytest.fixture
def fake(fake_library, monkeypatch, tmp_path) -> Backend:
    monkeypatch.setattr(cd, "_LIBRARY_NAMES", (str(fake_library),))
    monkeypatch.setattr(cd, "_lib", None)
    fatbin = tmp_path / cd.KERNELS_NAME
    fatbin.write_bytes(FATBIN_MAGIC + np.random.default_rng().bytes(60))
    device = cd.Device(0)
    kernels = cd.Kernels(device, fatbin)
    backend = Backend("fake", device, kernels, ctypes.CDLL(str(fake_library)))
    yield backend
    backend.close()
    kernels.close()
    device.close()


@pytest.fixture(params=["fake", pytest.param("gpu", marks=pytest.mark.gpu_driver)])
def backend(request) -> Backend:
    return request.getfixturevalue(request.param)
