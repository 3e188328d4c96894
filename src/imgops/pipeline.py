"""The gray batch pipeline: decode threads -> device -> encode threads -> atomic writes.

One process serves the whole batch. On the CPU (`--device cpu`, and `auto`) the conversion runs
in imgops._cli_kernels, the torch op's own loops without torch, so the batch never imports torch:
for JPEG/PNG files the conversion is a few percent of a file's time, and starting torch (and
CUDA, and copying each image there and back) costs more than it could save. With
`--device cuda` torch and CUDA start once, in the background, when the first colour image needs
them (gray images, skipped and failed files never wait for them). Each worker thread
carries one file through decode -> gray -> encode -> write (OpenCV releases the GIL, so threads
scale), and at most `jobs + 2` files are in flight, so memory stays bounded whatever the batch
size. A failure in one file is recorded in its result and never stops the others.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from .io.atomic import OutputExistsError, write_bytes_atomic
from .io.images import (
    DEFAULT_PNG_LEVEL,
    DecodedImage,
    ImageDecodeError,
    ImageEncodeError,
    decode_image,
    encode_image,
)
from .io.inputs import read_input_bytes, write_stream
from .native import cli_kernels

__all__ = ["GrayConverter", "GrayJob", "JobResult", "PipelineSettings", "Summary", "run_gray"]

#: Stages timed per file; "start" is time a file waited for the device stage to start.
STAGES = ("read", "decode", "start", "convert", "encode", "write")


@dataclass(frozen=True)
class GrayJob:
    """One input and where its gray image goes.

    `source` None means the encoded input is in `data` (stdin); `target` None means the
    encoded output goes to the pipeline's `stdout` stream. `label` names the input in messages.
    """

    source: Path | None
    target: Path | None
    label: str
    data: bytes | None = field(default=None, repr=False)


@dataclass
class JobResult:
    """What happened to one job: status "written", "skipped" or "failed" (with `reason`)."""

    job: GrayJob
    status: str
    reason: str | None = None
    error: BaseException | None = None
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    bytes_written: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    #: Something the user should know about a written file (e.g. a fallback that was taken).
    note: str | None = None


@dataclass
class PipelineSettings:
    """How the pipeline runs; `jobs` None means the number of usable CPUs."""

    device: str = "auto"
    jobs: int | None = None
    fmt: str = "png"
    png_level: int = DEFAULT_PNG_LEVEL
    overwrite: bool = False
    skip_existing: bool = False
    durable: bool = True
    max_pixels: int | None = None
    stdout: IO[bytes] | None = None
    #: Bytes of decoded images that may wait while torch/CUDA start (the threads keep decoding).
    startup_buffer_bytes: int = 256 << 20
    #: torch's intra-op threads for the CPU kernel; None: 1 when several workers run (they
    #: already fill the cores; nested parallelism only contends), else torch's default.
    torch_threads: int | None = None


@dataclass
class Summary:
    """Counts for the batch, the failed results, and the total seconds spent in each stage."""

    written: int = 0
    skipped: int = 0
    failed: int = 0
    failures: list[JobResult] = field(default_factory=list)
    stage_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    wall_seconds: float = 0.0
    device: str | None = None

    def add(self, result: JobResult) -> None:
        """Counts one result."""
        if result.status == "written":
            self.written += 1
        elif result.status == "skipped":
            self.skipped += 1
        else:
            self.failed += 1
            self.failures.append(result)
        for stage, seconds in result.seconds.items():
            self.stage_seconds[stage] = self.stage_seconds.get(stage, 0.0) + seconds

    def as_dict(self) -> dict[str, Any]:
        """Counts, device, wall and per-stage seconds, JSON-ready (for --stats-json and bench)."""
        return {
            "written": self.written,
            "skipped": self.skipped,
            "failed": self.failed,
            "device": self.device,
            "wall_seconds": self.wall_seconds,
            "stage_seconds": dict(self.stage_seconds),
        }

    def line(self) -> str:
        """The one-line summary: "N written, M skipped, K failed"."""
        return f"{self.written} written, {self.skipped} skipped, {self.failed} failed"


def default_jobs() -> int:
    """The number of CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


class GrayConverter:
    """The device stage: imgops.ops.rgb_to_gray(..., channel_order="bgr") on one device.

    Safe to call from many threads. On CUDA each thread has its own stream, the host side of
    the copies is pinned memory from torch's caching host allocator, and copies are
    non-blocking; the returned array may be a view of pinned memory.
    """

    def __init__(self, device: str = "auto", *, torch_threads: int | None = None) -> None:
        import torch

        from . import ops
        from .cli_common import resolve_device

        self.device = resolve_device(device)
        if torch_threads is not None and self.device.type == "cpu":
            torch.set_num_threads(torch_threads)
        self._torch = torch
        self._rgb_to_gray = ops.rgb_to_gray
        self._local = threading.local()
        if self.device.type == "cuda":
            torch.cuda.init()

    def convert(self, image: DecodedImage) -> np.ndarray:
        """The gray (H, W) array of a decoded image; gray images pass through unchanged."""
        return self.convert_noting(image)[0]

    def convert_noting(self, image: DecodedImage) -> tuple[np.ndarray, str | None]:
        """Like `convert`, with a note when the GPU ran out of memory and the CPU took over.

        The CPU kernel gives the same bits, so the fallback changes speed, never the output.
        """
        if image.is_gray:
            return image.pixels, None
        order = image.channel_order or "bgr"
        if self.device.type != "cuda":
            return self._convert_cpu(image.pixels, order), None
        try:
            return self._convert_cuda(image.pixels, order), None
        except self._torch.OutOfMemoryError:
            pass
        self._torch.cuda.empty_cache()  # outside the except block: the failed try is released
        note = "out of GPU memory for this image: converted on the CPU instead"
        return self._convert_cpu(image.pixels, order), note

    def _convert_cpu(self, pixels: np.ndarray, channel_order: str) -> np.ndarray:
        tensor = self._torch.from_numpy(pixels)  # shares memory: no copy
        return self._rgb_to_gray(tensor, channel_order=channel_order).numpy()

    def _convert_cuda(self, pixels: np.ndarray, channel_order: str) -> np.ndarray:
        torch = self._torch
        stream = getattr(self._local, "stream", None)
        if stream is None:
            stream = self._local.stream = torch.cuda.Stream(self.device)
        dtype = torch.from_numpy(pixels[:0, :0]).dtype
        # Pinned buffers from torch's caching host allocator: reused once the copies that used
        # them have finished, so steady state allocates nothing.
        host_in = torch.empty(pixels.shape, dtype=dtype, pin_memory=True)
        host_in.numpy()[...] = pixels
        host_out = torch.empty(pixels.shape[:2], dtype=dtype, pin_memory=True)
        with torch.cuda.stream(stream):
            device_in = host_in.to(self.device, non_blocking=True)
            device_out = self._rgb_to_gray(device_in, channel_order=channel_order)
            host_out.copy_(device_out, non_blocking=True)
        stream.synchronize()
        return host_out.numpy()  # keeps host_out alive until the encoder is done with it


class StandaloneCpuConverter:
    """The CPU device stage without torch: imgops._cli_kernels, the torch op's own loops.

    Starts in microseconds where the torch path first waits seconds for `import torch`; gives
    the same bits (tests/test_gray_standalone.py). One image per call, GIL released.
    """

    device = "cpu"

    def __init__(self, module: Any) -> None:
        self._module = module

    def convert(self, image: DecodedImage) -> np.ndarray:
        """The gray (H, W) array of a decoded image; gray images pass through unchanged."""
        return self.convert_noting(image)[0]

    def convert_noting(self, image: DecodedImage) -> tuple[np.ndarray, str | None]:
        """Like `convert` (the note is always None: there is no fallback to take)."""
        if image.is_gray:
            return image.pixels, None
        pixels = np.ascontiguousarray(image.pixels)
        out = np.empty(pixels.shape[:2], dtype=pixels.dtype)
        bgr = (image.channel_order or "bgr") == "bgr"
        self._module.rgb_to_gray(pixels, out, pixels.itemsize, bgr)
        return out, None


def standalone_cpu_converter() -> StandaloneCpuConverter | None:
    """The torch-free CPU converter, or None where the package was built without it (JIT)."""
    module = cli_kernels()
    return StandaloneCpuConverter(module) if module is not None else None


class _ConverterLoader:
    """Starts the device stage (torch, the extension, CUDA) once, in the background, when needed.

    Batches of gray images, skipped or failed files never pay for importing torch.
    """

    def __init__(self, device: str, torch_threads: int | None) -> None:
        self._device = device
        self._torch_threads = torch_threads
        self._lock = threading.Lock()
        self.future: Future[GrayConverter] | None = None

    def start(self) -> Future[GrayConverter]:
        """Starts loading (once) in a background thread; the future holds the converter.

        On the CPU (`cpu`, and `auto`: see the module docstring) the torch-free converter is
        ready at once where it was built.
        """
        with self._lock:
            if self.future is None:
                self.future = Future()
                standalone = standalone_cpu_converter() if self._device in ("auto", "cpu") else None
                if standalone is not None:
                    self.future.set_result(standalone)
                else:
                    threading.Thread(target=self._load, name="imgops-device-start").start()
            return self.future

    def _load(self) -> None:
        assert self.future is not None
        try:
            device = "cpu" if self._device == "auto" else self._device  # see start()
            converter = GrayConverter(device, torch_threads=self._torch_threads)
        except BaseException as error:  # reported once by run_gray
            self.future.set_exception(error)
        else:
            self.future.set_result(converter)

    def ready(self) -> GrayConverter | None:
        """The converter if it has started, else None (starting it if nobody has)."""
        future = self.start()
        return self.get() if future.done() else None

    def get(self) -> GrayConverter:
        """The converter, waiting for it to start; raises _FatalError if it cannot start."""
        try:
            return self.start().result()
        except BaseException as error:
            raise _FatalError(error) from error

    def loaded(self) -> GrayConverter | None:
        """The converter if it started successfully, else None (never starts it)."""
        future = self.future
        if future is not None and future.done() and future.exception() is None:
            return future.result()
        return None


class _FatalError(Exception):
    """The device stage failed to start: the batch cannot go on."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


@dataclass
class _Parked:
    """A decoded colour image waiting for the device stage to finish starting."""

    result: JobResult
    image: DecodedImage


class _ParkingBudget:
    """Bytes of decoded images that may wait for the device stage (thread-safe)."""

    def __init__(self, limit: int) -> None:
        self._left = limit
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> bool:
        """Reserves `nbytes` if they fit."""
        with self._lock:
            if nbytes > self._left:
                return False
            self._left -= nbytes
            return True

    def give(self, nbytes: int) -> None:
        """Returns bytes reserved by take."""
        with self._lock:
            self._left += nbytes


class _Worker:
    """Carries one job through read -> decode -> convert -> encode -> write.

    While the device stage starts, decoded colour images are parked (up to a byte budget) so
    the threads keep decoding instead of waiting; `resume` finishes a parked image.
    """

    def __init__(self, settings: PipelineSettings, loader: _ConverterLoader) -> None:
        self.settings = settings
        self.loader = loader
        self.parking = _ParkingBudget(settings.startup_buffer_bytes)
        self.stop = threading.Event()
        self._stdout_lock = threading.Lock()

    def __call__(self, job: GrayJob) -> JobResult | _Parked:
        result = JobResult(job, "written")
        if self.stop.is_set():
            return self._failed(result, "cancelled")
        settings, target = self.settings, job.target
        if target is not None and target.exists():
            if settings.skip_existing:
                result.status = "skipped"
                return result
            if not settings.overwrite:
                return self._failed(result, f"output {target} exists (use --overwrite)")
        return self._guard(result, self._front)

    def resume(self, parked: _Parked) -> JobResult:
        """Converts, encodes and writes a parked image."""
        self.parking.give(parked.image.pixels.nbytes)
        result = self._guard(parked.result, lambda r: self._back(r, parked.image))
        assert isinstance(result, JobResult)
        return result

    def _guard(self, result: JobResult, step) -> JobResult | _Parked:
        """Runs a step; any error of this file becomes a failed result, never an exception."""
        try:
            return step(result) or result
        except _FatalError:
            raise
        except (ImageDecodeError, ImageEncodeError) as error:
            return self._failed(result, str(error))
        except OutputExistsError:
            return self._failed(result, f"output {result.job.target} exists (use --overwrite)")
        except OSError as error:
            return self._failed(result, _describe_os_error(error, result.job), error)
        except Exception as error:  # one bad file must never stop the batch
            return self._failed(result, f"{type(error).__name__}: {error}", error)

    @staticmethod
    def _failed(result: JobResult, reason: str, error: BaseException | None = None) -> JobResult:
        result.status, result.reason, result.error = "failed", reason, error
        return result

    def _front(self, result: JobResult) -> JobResult | _Parked | None:
        job, seconds = result.job, result.seconds
        start = time.perf_counter()
        data = job.data if job.data is not None else _read_bytes(job.source)
        now = time.perf_counter()
        seconds["read"], start = now - start, now
        image = decode_image(data, max_pixels=self.settings.max_pixels)
        del data
        result.shape, result.dtype = image.pixels.shape, str(image.pixels.dtype)
        seconds["decode"] = time.perf_counter() - start
        if not image.is_gray and self.loader.ready() is None:
            if self.parking.take(image.pixels.nbytes):
                return _Parked(result, image)
            start = time.perf_counter()
            self.loader.get()  # the budget is full: wait for the device stage
            seconds["start"] = time.perf_counter() - start
        return self._back(result, image)

    def _back(self, result: JobResult, image: DecodedImage) -> None:
        settings, seconds = self.settings, result.seconds
        start = time.perf_counter()
        if image.is_gray:
            gray = image.pixels
        else:
            gray, result.note = self.loader.get().convert_noting(image)
        now = time.perf_counter()
        seconds["convert"], start = now - start, now
        encoded = encode_image(gray, settings.fmt, png_level=settings.png_level)
        now = time.perf_counter()
        seconds["encode"], start = now - start, now
        self._write(result.job.target, encoded)
        result.bytes_written = len(encoded)
        seconds["write"] = time.perf_counter() - start

    def _write(self, target: Path | None, encoded: bytes) -> None:
        if target is None:
            stream = self.settings.stdout
            if stream is None:
                raise ValueError("no output stream for a job without a target")
            with self._stdout_lock:
                write_stream(stream, encoded)
            return
        settings = self.settings
        try:
            write_bytes_atomic(
                target, encoded, overwrite=settings.overwrite, durable=settings.durable
            )
        except OutputExistsError:
            raise
        except OSError as error:  # name the target, not the temporary file
            raise OSError(
                error.errno, f"cannot write: {error.strerror or error}", str(target)
            ) from error


def _read_bytes(path: Path | None) -> bytes:
    if path is None:
        raise ValueError("a job needs a source path or data")
    return read_input_bytes(path)


def _describe_os_error(error: OSError, job: GrayJob) -> str:
    problem = error.strerror or str(error)
    name = error.filename
    if name is not None and job.source is not None and Path(name) == job.source:
        return problem
    if name is not None:
        return f"{name}: {problem}"
    return problem


def run_gray(
    jobs: Iterable[GrayJob],
    settings: PipelineSettings,
    on_result: Callable[[JobResult], None] | None = None,
) -> Summary:
    """Runs every job through the pipeline; returns the counts, failures and stage times.

    `on_result` is called in the calling thread once per job as it finishes (for progress and
    per-file messages). An error that stops the whole batch (the device cannot start, Ctrl-C)
    is raised after the files in progress finish; everything written so far is complete.

    Example:
        >>> jobs = [GrayJob(Path("a.jpg"), Path("a_gray.png"), "a.jpg")]
        >>> run_gray(jobs, PipelineSettings(device="cpu")).line()
        '1 written, 0 skipped, 0 failed'
    """
    started = time.perf_counter()
    workers = settings.jobs or default_jobs()
    torch_threads = settings.torch_threads or (1 if workers > 1 else None)
    loader = _ConverterLoader(settings.device, torch_threads)
    if settings.device not in ("auto", "cpu"):
        try:
            loader.get()  # a device the user asked for must work before any file is touched
        except _FatalError as error:
            raise error.cause from None
    worker = _Worker(settings, loader)
    summary = Summary()
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="imgops-gray")
    try:
        _drive(iter(jobs), pool, worker, workers + 2, summary, on_result)
    except _FatalError as error:
        worker.stop.set()
        pool.shutdown(wait=True, cancel_futures=True)
        raise error.cause from None
    except BaseException:
        worker.stop.set()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    converter = loader.loaded()
    summary.device = str(converter.device) if converter is not None else None
    summary.wall_seconds = time.perf_counter() - started
    return summary


def _drive(
    source: Iterator[GrayJob],
    pool: ThreadPoolExecutor,
    worker: _Worker,
    window: int,
    summary: Summary,
    on_result: Callable[[JobResult], None] | None,
) -> None:
    """Keeps `window` jobs in flight, collects results, resumes parked images once possible."""
    pending: set[Future[Any]] = set()
    parked: list[_Parked] = []
    exhausted = False
    while True:
        while not exhausted and len(pending) < window:
            job = next(source, None)
            if job is None:
                exhausted = True
            else:
                pending.add(pool.submit(worker, job))
        started = worker.loader.future
        if parked and started is not None and started.done():
            worker.loader.get()  # raises _FatalError if the device stage failed
            pending.update(pool.submit(worker.resume, item) for item in parked)
            parked.clear()
        if not pending and not parked:
            return
        waiting = set(pending)
        if parked and started is not None:
            waiting.add(started)  # wake up when the device stage is ready
        done, _ = wait(waiting, return_when=FIRST_COMPLETED)
        for future in done:
            if future is started:
                continue
            pending.discard(future)
            outcome = future.result()
            if isinstance(outcome, _Parked):
                parked.append(outcome)
                continue
            summary.add(outcome)
            if on_result is not None:
                on_result(outcome)
