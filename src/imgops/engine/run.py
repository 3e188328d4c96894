"""`run_batch`: every job through one op, on the device and decoder `device.choose` picks."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from .device import Plan, choose, driver_engine_usable
from .files import FatalError
from .host import run_host
from .ops import GRAY, ImageOp
from .types import FORMATS, Job, JobResult, PipelineSettings, Summary, default_jobs


def run_batch(
    jobs: Iterable[Job],
    op: ImageOp,
    settings: PipelineSettings,
    on_result: Callable[[JobResult], None] | None = None,
) -> Summary:
    """Runs every job through `op`; returns the counts, failures and stage times.

    `on_result` is called in the calling thread once per job as it finishes (progress and
    per-file messages). Device and decoder are chosen before any file is touched (see
    imgops.engine.device.choose). An error that stops the whole batch (the device cannot start,
    Ctrl-C) is raised after the files in progress finish; everything written is complete.

    Raises:
        GpuDecoderUnavailable: decoder "gpu" cannot work here.
        DeviceUnavailable: the CUDA device asked for is not usable.
        ValueError: unknown format, device or decoder.

    Example:
        >>> jobs = [Job(Path("a.jpg"), Path("a_gray.png"), "a.jpg")]
        >>> run_batch(jobs, GRAY, PipelineSettings(device="cpu")).line()
        '1 written, 0 skipped, 0 failed'
    """
    if settings.fmt not in FORMATS:
        raise ValueError(f"unknown format {settings.fmt!r} (expected one of {', '.join(FORMATS)})")
    if not 1 <= settings.jpeg_quality <= 100:
        raise ValueError(f"JPEG quality must be 1..100, got {settings.jpeg_quality}")
    started = time.perf_counter()
    plan = choose(settings, op)
    workers = settings.jobs or default_jobs()
    summary = Summary(device=plan.device, choice=plan.why)

    def collect(result: JobResult) -> None:
        summary.add(result)
        if on_result is not None:
            on_result(result)

    if plan.device == "cpu" and op.cpu is not None:
        run_host(iter(jobs), op, settings, workers, collect)
    else:
        engine = device_engine(op, settings, plan, workers)
        try:
            engine.run(iter(jobs), collect)
        except FatalError as error:  # the device failed: the original error, once
            raise error.cause from None
        finally:
            if engine.pool is not None:  # (within device.wait_pool: the acquires that allocated)
                engine.phases.add("device.pinning", engine.pool.allocate_seconds)
            summary.engine = engine.phases.snapshot()
            summary.gpu_peak_bytes = engine.gpu_peak_bytes
            summary.gpu_decode_batches = list(engine.decode_batches)
    summary.wall_seconds = time.perf_counter() - started
    return summary


def device_engine(op: ImageOp, settings: PipelineSettings, plan: Plan, workers: int, *,
                  cpu_backend: bool = False):  # fmt: skip
    """The batched engine for a plan (torch's CPU device where plan.device is "cpu").

    `cpu_backend=True` decodes (and encodes JPEG) with nvImageCodec's CPU backend: the tests
    run every device-engine path on a machine without a GPU that way.
    """
    from .batched import DeviceEngine

    decoder_factory = jpeg_factory = None
    if plan.decoder == "gpu" or cpu_backend:
        from ..io.gpu_decode import BatchDecoder

        def decoder_factory():
            return BatchDecoder(plan.index, cpu_backend=cpu_backend, threads=workers)

    if settings.fmt == "jpg" and (plan.device.startswith("cuda") or cpu_backend):
        from ..io.gpu_encode import GpuJpegEncoder

        def jpeg_factory():
            return GpuJpegEncoder(settings.jpeg_quality, plan.index, cpu_backend=cpu_backend)

    cuda = plan.device.startswith("cuda") and plan.decoder == "gpu" and not cpu_backend
    if cuda and driver_engine_usable(op):
        from .driver import DriverEngine
        from .driver_stage import make_decoder

        def decoder_factory():
            return make_decoder(plan.index, workers)

        return DriverEngine(
            op, settings, plan.device, workers, decoder_factory, jpeg_factory, index=plan.index
        )
    return DeviceEngine(op, settings, plan.device, workers, decoder_factory, jpeg_factory)


def run_gray(
    jobs: Iterable[Job],
    settings: PipelineSettings,
    on_result: Callable[[JobResult], None] | None = None,
) -> Summary:
    """`run_batch` with the gray op (exact BT.601 luma)."""
    return run_batch(jobs, GRAY, settings, on_result)
