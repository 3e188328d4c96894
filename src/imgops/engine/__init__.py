"""The batch engine: files through one per-image op, on the CPU or in batches on a GPU.

* ops.py: `ImageOp` (the op parameter) and `GRAY`.
* types.py: `Job`, `JobResult`, `PipelineSettings`, `Summary`.
* device.py: which device and decoder a batch runs on (`--device auto`, the crossover).
* host.py: the CPU engine (one thread per file, no torch).
* batched.py: the device engine (nvImageCodec batches, op and PNG filter on the device).
* files.py, buffers.py: per-file steps and the memory bounds they share.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Each public name and the submodule it lives in. Imported on first use (PEP 562), so that
#: importing one submodule, e.g. imgops.engine.driver_stage, does not import numpy, OpenCV and
#: the engines: the command line starts the CUDA stage before those imports.
_EXPORTS = {
    "CUDA_MIN_FILES": "device",
    "DeviceUnavailable": "device",
    "GRAY": "ops",
    "ImageOp": "ops",
    "run_batch": "run",
    "run_gray": "run",
    "STAGES": "types",
    "GrayJob": "types",
    "Job": "types",
    "JobResult": "types",
    "PipelineSettings": "types",
    "Summary": "types",
    "default_jobs": "types",
}

__all__ = [  # (the keys of _EXPORTS)
    "CUDA_MIN_FILES",
    "GRAY",
    "STAGES",
    "DeviceUnavailable",
    "GrayJob",
    "ImageOp",
    "Job",
    "JobResult",
    "PipelineSettings",
    "Summary",
    "default_jobs",
    "run_batch",
    "run_gray",
]
assert sorted(__all__) == sorted(_EXPORTS)

if TYPE_CHECKING:
    from .device import CUDA_MIN_FILES, DeviceUnavailable
    from .ops import GRAY, ImageOp
    from .run import run_batch, run_gray
    from .types import STAGES, GrayJob, Job, JobResult, PipelineSettings, Summary, default_jobs


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
