"""The batch engine's public names (the engine lives in imgops.engine; this module re-exports).

`run_batch(jobs, op, settings, on_result)` runs any `ImageOp`; `run_gray` is it with `GRAY`.
"""

from .engine import (
    CUDA_MIN_FILES,
    GRAY,
    STAGES,
    DeviceUnavailable,
    GrayJob,
    ImageOp,
    Job,
    JobResult,
    PipelineSettings,
    Summary,
    default_jobs,
    run_batch,
    run_gray,
)

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
