"""Which device and decoder a batch runs on, decided before any file is touched.

`--device auto` picks CUDA only where it wins: a GPU is visible, nvImageCodec decodes on it,
imgops has CUDA kernels, and the batch holds at least `CUDA_MIN_FILES` files (below that the
start-up of torch and CUDA, a few seconds, costs more than the GPU saves). The first checks
need no torch (the driver is asked through ctypes), so a small batch on a GPU host still
starts in milliseconds on the CPU path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..io import gpu_decode
from ..io.defaults import LUMAS

if TYPE_CHECKING:
    from .types import PipelineSettings

#: Files from which `--device auto` picks CUDA (with a usable GPU and nvImageCodec): the
#: crossover measured on the H200 host (16 cores) for the issue-10 photo batch, one run,
#: wall = 7.76 s + n / 418 files/s on CUDA against 0.37 s + n / 211 on the CPU: n = 3144
#: (docs/GPU.md; scripts/gpu-check.d/profile.sh refits it). Below it the CPU path finishes
#: first: torch and nvImageCodec take 4-5 s to start there.
CUDA_MIN_FILES = 3000
#: The same crossover for ops with a driver function (imgops.engine.driver, no torch), measured
#: on an H100 host (16 cores, 2026-12-05, with the GPU deflate and the decode thread; process
#: walls of 100..3200 files of the issue-10 batch, two runs without fsync, one with): cuda
#: 2.9-3.4 s + n / 767-940 files/s against cpu 0.65-1.6 s + n / 266-330, so CUDA finishes first
#: from 909-919 files (at 800: 3.95 vs 3.66 s; at 1600: 5.01 vs 6.29 s; docs/GPU.md).
CUDA_MIN_FILES_DRIVER = 1000


class DeviceUnavailable(RuntimeError):
    """The device asked for cannot run the batch; the message says why in one line."""

    exit_code = 1


@dataclass(frozen=True)
class Plan:
    """The chosen device ("cpu", "cuda", "cuda:N"), decoder ("cpu"/"gpu") and why."""

    device: str
    decoder: str
    why: str

    @property
    def index(self) -> int:
        """The CUDA device index (0 for "cuda")."""
        return int(self.device.split(":")[1]) if ":" in self.device else 0


def cuda_device_count() -> int:
    """GPUs the CUDA driver sees (0 without a driver), asked without importing torch."""
    return gpu_decode.driver_device_count()


def _torch_cuda_problem(device: str) -> str | None:
    """Why torch cannot run imgops' kernels on `device`, or None (imports torch)."""
    import torch

    from .. import _extension

    if not torch.cuda.is_available():
        return f"--device {device}: no CUDA GPU is visible to torch"
    if not _extension.load().get("cuda_kernels"):
        return f"--device {device}: imgops was built without CUDA kernels (run `imgops doctor`)"
    index = int(device.split(":")[1]) if ":" in device else 0
    if index >= torch.cuda.device_count():
        return f"--device {device}: only {torch.cuda.device_count()} GPU(s) visible"
    return None


def check_torch_device(device: str) -> None:
    """Raises DeviceUnavailable unless torch runs imgops' CUDA kernels on `device`."""
    problem = _torch_cuda_problem(device)
    if problem is not None:
        raise DeviceUnavailable(problem)


def driver_engine_usable(op: Any) -> bool:
    """Whether CUDA batches of `op` can run on the torch-free engine (imgops.engine.driver):
    the op has a driver function and a CPU function, and imgops was built with its fatbin
    kernels. IMGOPS_CUDA_ENGINE=torch picks the torch engine instead (comparisons)."""
    if op is None or getattr(op, "driver", None) is None or op.cpu is None:
        return False
    if os.environ.get("IMGOPS_CUDA_ENGINE", "driver") == "torch":
        return False
    from .cuda_driver import kernels_path

    return kernels_path() is not None


def choose(settings: PipelineSettings, op: Any = None) -> Plan:
    """The device and decoder for a batch (see the module docstring).

    Raises:
        GpuDecoderUnavailable: decoder "gpu" where nvImageCodec cannot decode on a GPU, or
            with device "cpu".
        DeviceUnavailable: device "cuda[:N]" where no such GPU is visible to the driver.
        ValueError: unknown device, decoder or luma names; luma "stored" with decoder "gpu".
    """
    device, decoder = settings.device, settings.decoder
    if decoder not in ("auto", "cpu", "gpu"):
        raise ValueError(f"decoder must be auto, cpu or gpu, got {decoder!r}")
    if device not in ("auto", "cpu") and not device.startswith("cuda"):
        raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {device!r}")
    if settings.luma not in LUMAS:
        raise ValueError(f"luma must be exact or stored, got {settings.luma!r}")
    if settings.luma == "stored":
        return _choose_stored_luma(settings)
    if decoder == "gpu":
        if device == "cpu":
            raise gpu_decode.GpuDecoderUnavailable(
                "--decoder gpu decodes on the GPU: it needs --device cuda (or auto)"
            )
        if cuda_device_count() == 0:
            raise gpu_decode.GpuDecoderUnavailable("--decoder gpu: no CUDA GPU is visible")
        usable, why = gpu_decode.status(_index(device))
        if not usable:
            raise gpu_decode.GpuDecoderUnavailable(f"--decoder gpu: {why}")
        return Plan("cuda" if device == "auto" else device, "gpu", why)
    if device == "cpu":
        return Plan("cpu", "cpu", "--device cpu")
    if device.startswith("cuda"):
        if cuda_device_count() <= _index(device):
            raise DeviceUnavailable(f"--device {device}: no CUDA GPU is visible to torch")
        if decoder == "cpu":
            return Plan(device, "cpu", "--decoder cpu")
        if driver_engine_usable(op) and gpu_decode.installed():
            # The torch-free engine starts nvImageCodec in the background and lets the CPU
            # decode everything if it cannot start: no serial check here.
            return Plan(device, "gpu", "nvImageCodec installed (started with the engine)")
        usable, why = gpu_decode.status(_index(device))
        return Plan(device, "gpu" if usable else "cpu", why)
    return _choose_auto(settings, op)


def _choose_stored_luma(settings: PipelineSettings) -> Plan:
    """`--luma stored`: the CPU decodes (libjpeg hands out the luma plane alone), so the GPU
    would only add the upload and the PNG filter; `auto` stays on the CPU, `cuda` is obeyed."""
    device = settings.device
    if settings.decoder == "gpu":
        raise ValueError("--luma stored decodes on the CPU: it cannot take --decoder gpu")
    if device in ("auto", "cpu"):
        return Plan("cpu", "cpu", f"{device}: --luma stored decodes on the CPU")
    if cuda_device_count() <= _index(device):
        raise DeviceUnavailable(f"--device {device}: no CUDA GPU is visible to torch")
    return Plan(device, "cpu", "--luma stored decodes on the CPU")


def _choose_auto(settings: PipelineSettings, op: Any = None) -> Plan:
    files = settings.expected_files
    driver = driver_engine_usable(op)
    if driver and settings.decoder != "cpu" and warm_gpu() == 0:
        return Plan("cuda", "gpu", "auto: a warm GPU stage (imgops serve)")
    least = CUDA_MIN_FILES_DRIVER if driver else CUDA_MIN_FILES
    if files is None or files < least:
        return Plan("cpu", "cpu", f"auto: {files or 'an unknown number of'} files, CUDA from "
                    f"{least}")  # fmt: skip
    if cuda_device_count() == 0:
        return Plan("cpu", "cpu", "auto: no CUDA GPU")
    if driver and settings.decoder != "cpu":
        if not gpu_decode.installed():
            return Plan(
                "cpu", "cpu", f"auto: nvImageCodec is not installed ({gpu_decode.INSTALL_HINT})"
            )
        return Plan("cuda", "gpu", f"auto: {files} files >= {least}, the torch-free CUDA engine")
    usable, why = gpu_decode.status(0)
    if not usable:
        return Plan("cpu", "cpu", f"auto: {why}")
    problem = _torch_cuda_problem("cuda")
    if problem is not None:
        return Plan("cpu", "cpu", f"auto: {problem}")
    decoder = "cpu" if settings.decoder == "cpu" else "gpu"
    return Plan("cuda", decoder, f"auto: {files} files >= {CUDA_MIN_FILES} with {why}")


def driver_gpu_if_present(settings: PipelineSettings, op: Any = None) -> int | None:
    """The GPU on which choose() would run this batch on the torch-free engine with
    nvImageCodec decoding, should that GPU exist; None where it would not. Decided without
    the CUDA driver (cuInit takes ~0.3 s): the command line starts that engine's stage on
    this answer (imgops.engine.driver_stage.prestart), and choose() still checks the GPU."""
    device = settings.device
    if settings.decoder != "auto" or device == "cpu" or not driver_engine_usable(op):
        return None
    if settings.luma != "exact":  # decoded on the CPU (_choose_stored_luma)
        return None
    if not gpu_decode.installed():
        return None
    if device == "auto":
        files = settings.expected_files
        if warm_gpu() == 0 or (files is not None and files >= CUDA_MIN_FILES_DRIVER):
            return 0
        return None
    return _index(device)


def warm_gpu() -> int | None:
    """GPU 0 where this process keeps a started stage for it, with nvImageCodec's decoder,
    warm for the next batch (`imgops serve`; imgops.engine.driver_stage.keep_warm); else None.
    `--device auto` sends a batch of any size there: CUDA_MIN_FILES_DRIVER is the price of the
    start, which a warm stage has paid."""
    import sys

    stages = sys.modules.get("imgops.engine.driver_stage")
    if stages is None or stages.ready_warm_stage(0) is None:
        return None
    return 0


def _index(device: str) -> int:
    return int(device.split(":")[1]) if ":" in device else 0
