"""The batch engine's records: jobs, per-file results, settings and the batch summary."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ..io.defaults import DEFAULT_PNG_LEVEL

#: Stages timed per file. "device" is the file's share of its batch on the device (kernels and
#: copies); "start" is time a file waited for torch/CUDA to start.
STAGES = ("read", "decode", "start", "convert", "device", "encode", "write")
#: Output formats the engine writes.
FORMATS = ("png", "tif", "jpg", "bmp", "webp")
DECODERS = ("auto", "cpu", "gpu")


@dataclass(frozen=True)
class Job:
    """One input and where its output goes.

    `source` None means the encoded input is in `data` (stdin); `target` None means the
    encoded output goes to the settings' `stdout` stream. `label` names the input in messages.
    """

    source: Path | None
    target: Path | None
    label: str
    data: bytes | None = field(default=None, repr=False)


#: The historical name (gray was the first op); the same type.
GrayJob = Job


@dataclass
class JobResult:
    """What happened to one job: status "written", "skipped" or "failed" (with `reason`)."""

    job: Job
    status: str
    reason: str | None = None
    error: BaseException | None = None
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    bytes_written: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    #: Something the user should know about a written file (e.g. a fallback that was taken).
    note: str | None = None
    #: Which decoder decoded the file: "opencv", "opencv-luma" (a JPEG's stored luma plane,
    #: `luma` "stored") or "nvimgcodec" (None if it was not decoded).
    decoder: str | None = None
    #: Why a file meant for the device path was converted on the CPU path instead (None if
    #: it was not): the GPU could not decode it, or the device ran out of memory.
    fallback: str | None = None


@dataclass
class PipelineSettings:
    """How the engine runs; `jobs` None means the number of usable CPUs."""

    device: str = "auto"
    jobs: int | None = None
    fmt: str = "png"
    png_level: int = DEFAULT_PNG_LEVEL
    overwrite: bool = False
    skip_existing: bool = False
    durable: bool = True
    max_pixels: int | None = None
    stdout: IO[bytes] | None = None
    #: Bytes of CPU-decoded images that may wait for the device stage (during start-up and
    #: after); bounds host memory on the device path.
    startup_buffer_bytes: int = 256 << 20
    #: torch's intra-op threads on the torch CPU device; None: 1 when several workers run.
    torch_threads: int | None = None
    #: "auto" (nvImageCodec on the GPU when the device is CUDA and it is usable), "cpu"
    #: (OpenCV), "gpu" (nvImageCodec, an error if it cannot work).
    decoder: str = "auto"
    #: JPEG quality for fmt "jpg" (1..100).
    jpeg_quality: int = 95
    #: "exact" (the BT.601 luma of the decoded pixels) or "stored" (colour JPEGs: their own
    #: luma plane, decoded alone on the CPU; imgops.io.images.decode_image).
    luma: str = "exact"
    #: Files the batch will hold, when known: `device="auto"` picks CUDA only for batches of
    #: at least imgops.engine.device.CUDA_MIN_FILES.
    expected_files: int | None = None
    #: Most files decoded together on the device (one nvImageCodec call, one launch per shape).
    batch_size: int = 64
    #: Most decoded bytes in one device batch (bounds GPU memory with large images).
    batch_bytes: int = 1 << 30
    #: While torch and CUDA start, files take the CPU path on the prep threads (the device
    #: engine; never with decoder "gpu").
    host_while_starting: bool = True
    #: Decoded bytes that may wait on the device while torch and CUDA start (the first batches
    #: decode meanwhile; bounds GPU memory during start-up).
    startup_device_bytes: int = 4 << 30
    #: Pinned host memory for rows coming back from the device (bounds host memory).
    #: Two batches of 4K gray rows are ~0.7 GB; less makes the device thread wait for encodes.
    pinned_bytes: int = 2 << 30


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
    #: Files each decoder decoded ("opencv", "opencv-luma", "nvimgcodec").
    decoders: dict[str, int] = field(default_factory=dict)
    #: Files the device path sent to the CPU path, by reason (JobResult.fallback).
    fallbacks: dict[str, int] = field(default_factory=dict)
    #: Why the device/decoder were chosen (for -v and doctor-like reports).
    choice: str | None = None
    #: Seconds the device engine's threads spent in each of their phases (waits included):
    #: where a batch on the device path spends its time. Empty on the CPU path.
    engine: dict[str, float] = field(default_factory=dict)
    #: The most GPU memory in use (the whole device, nvImageCodec's buffers included) seen after
    #: a batch on CUDA; None on the CPU.
    gpu_peak_bytes: int | None = None
    #: Files in each GPU decode call (nvImageCodec batches), in order; empty without one.
    gpu_decode_batches: list[int] = field(default_factory=list)

    def add(self, result: JobResult) -> None:
        """Counts one result."""
        if result.status == "written":
            self.written += 1
        elif result.status == "skipped":
            self.skipped += 1
        else:
            self.failed += 1
            self.failures.append(result)
        if result.decoder is not None:
            self.decoders[result.decoder] = self.decoders.get(result.decoder, 0) + 1
        if result.fallback is not None:
            self.fallbacks[result.fallback] = self.fallbacks.get(result.fallback, 0) + 1
        for stage, seconds in result.seconds.items():
            self.stage_seconds[stage] = self.stage_seconds.get(stage, 0.0) + seconds

    def as_dict(self) -> dict[str, Any]:
        """Counts, device, decoders, wall and per-stage seconds, JSON-ready."""
        return {
            "written": self.written,
            "skipped": self.skipped,
            "failed": self.failed,
            "device": self.device,
            "decoders": dict(self.decoders),
            "fallbacks": dict(self.fallbacks),
            "choice": self.choice,
            "wall_seconds": self.wall_seconds,
            "stage_seconds": dict(self.stage_seconds),
            "engine_seconds": dict(self.engine),
            "gpu_peak_bytes": self.gpu_peak_bytes,
            "gpu_decode_batches": list(self.gpu_decode_batches),
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


def join_notes(*notes: str | None) -> str | None:
    """The non-empty notes joined with "; " (None when there are none)."""
    kept = [note for note in notes if note]
    return "; ".join(kept) if kept else None
