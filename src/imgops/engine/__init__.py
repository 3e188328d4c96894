"""The batch engine: files through one per-image op, on the CPU or in batches on a GPU.

* ops.py: `ImageOp` (the op parameter) and `GRAY`.
* types.py: `Job`, `JobResult`, `PipelineSettings`, `Summary`.
* device.py: which device and decoder a batch runs on (`--device auto`, the crossover).
* host.py: the CPU engine (one thread per file, no torch).
* batched.py: the device engine (nvImageCodec batches, op and PNG filter on the device).
* files.py, buffers.py: per-file steps and the memory bounds they share.
"""

from .device import CUDA_MIN_FILES, DeviceUnavailable
from .ops import GRAY, ImageOp
from .run import run_batch, run_gray
from .types import STAGES, GrayJob, Job, JobResult, PipelineSettings, Summary, default_jobs

__all__ = [
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
