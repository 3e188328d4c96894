"""Per-file steps both engines share: target checks, reading, host encoding, atomic writes.

Every error of one file becomes that file's failed result (`guard`), never an exception that
stops the batch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np

from ..io.atomic import OutputExistsError, write_bytes_atomic
from ..io.images import ImageDecodeError, ImageEncodeError, encode_image
from ..io.inputs import read_input_bytes, write_stream
from .types import Job, JobResult, PipelineSettings

_T = TypeVar("_T")


class FatalError(Exception):
    """The batch cannot go on (the device failed); `cause` is the original error."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def exists_reason(target: Path | None) -> str:
    """The one wording of the no-clobber refusal."""
    return f"output {target} exists (use --overwrite)"


def precheck(job: Job, settings: PipelineSettings) -> JobResult | None:
    """A skipped or failed result when the target already exists, else None (go on)."""
    target = job.target
    if target is not None and target.exists():
        if settings.skip_existing:
            return JobResult(job, "skipped")
        if not settings.overwrite:
            return failed(JobResult(job, "written"), exists_reason(target))
    return None


def failed(result: JobResult, reason: str, error: BaseException | None = None) -> JobResult:
    """Marks a result failed with a one-line reason."""
    result.status, result.reason, result.error = "failed", reason, error
    return result


def guard(result: JobResult, step: Callable[[JobResult], object]) -> JobResult:
    """Runs `step(result)`; any error of this file becomes a failed result."""
    try:
        step(result)
    except FatalError:
        raise
    except (ImageDecodeError, ImageEncodeError) as error:
        return failed(result, str(error))
    except OutputExistsError:
        return failed(result, exists_reason(result.job.target))
    except OSError as error:
        return failed(result, describe_os_error(error, result.job), error)
    except Exception as error:  # one bad file must never stop the batch
        return failed(result, f"{type(error).__name__}: {error}", error)
    return result


def describe_os_error(error: OSError, job: Job) -> str:
    """The OS error's text, naming the file unless it is the job's own input."""
    problem = error.strerror or str(error)
    name = error.filename
    if name is not None and job.source is not None and Path(name) == job.source:
        return problem
    if name is not None:
        return f"{name}: {problem}"
    return problem


def read_job(job: Job) -> bytes:
    """The job's encoded input bytes (stdin data, or the file)."""
    if job.data is not None:
        return job.data
    if job.source is None:
        raise ValueError("a job needs a source path or data")
    return read_input_bytes(job.source)


def encode_host(array: np.ndarray, channel_order: str | None, settings: PipelineSettings) -> bytes:
    """Encodes an op's result on the CPU in settings.fmt (JPEG at settings.jpeg_quality)."""
    if array.ndim == 3 and channel_order == "rgb":
        array = array[..., ::-1]  # encode_image takes OpenCV's BGR
    if settings.fmt != "jpg":
        return encode_image(array, settings.fmt, png_level=settings.png_level)
    return encode_jpeg_opencv(array, settings.jpeg_quality)


def encode_jpeg_opencv(array: np.ndarray, quality: int) -> bytes:
    """JPEG bytes of a gray or BGR uint8 array with OpenCV at `quality`."""
    import cv2

    if array.dtype != np.uint8:
        raise ImageEncodeError("16-bit images can be written as png or tif only, not jpg")
    ok, encoded = cv2.imencode(
        ".jpg", np.ascontiguousarray(array), [cv2.IMWRITE_JPEG_QUALITY, int(quality)]
    )
    if not ok:
        raise ImageEncodeError("jpg encoding failed")
    return encoded.tobytes()


class Writer:
    """Writes encoded outputs: atomically to their target, or in order to the stdout stream."""

    def __init__(self, settings: PipelineSettings) -> None:
        self._settings = settings
        self._stdout_lock = threading.Lock()

    def write(self, target: Path | None, encoded: bytes | memoryview) -> None:
        """Writes one output; OSError names the target, never the temporary file."""
        settings = self._settings
        if target is None:
            if settings.stdout is None:
                raise ValueError("no output stream for a job without a target")
            with self._stdout_lock:
                write_stream(settings.stdout, encoded)
            return
        self._named(
            target,
            lambda: write_bytes_atomic(
                target, encoded, overwrite=settings.overwrite, durable=settings.durable
            ),
        )

    def encode_and_write(
        self, target: Path | None, array: np.ndarray, channel_order: str | None
    ) -> tuple[int, float, float] | None:
        """Encodes a PNG output straight into its file in one native call (the GIL released,
        the thread's output buffer reused: imgops.io.png.write_png_atomic); returns (bytes,
        encode seconds, write seconds), or None where that does not serve this output (another
        format or level, stdout, no compiled module): then encode_host and write."""
        settings = self._settings
        if target is None or settings.fmt != "png" or array.dtype not in (np.uint8, np.uint16):
            return None
        if array.ndim == 3 and array.shape[2] == 3:
            rgb = array if channel_order == "rgb" else array[..., ::-1]
        elif array.ndim == 2:
            rgb = array
        else:
            return None
        from ..io.png import write_png_atomic

        return self._named(
            target,
            lambda: write_png_atomic(
                target,
                rgb,
                level=settings.png_level,
                overwrite=settings.overwrite,
                durable=settings.durable,
            ),
        )

    def finish_zlib_and_write(
        self,
        target: Path,
        buffer: np.ndarray,
        room: int,
        out_bytes: int,
        shape: tuple[int, ...],
    ) -> tuple[int, float, float] | None:
        """Frames the GPU's zlib stream in `buffer` into its PNG file and writes it, in one
        native call (imgops.io.png.write_zlib_png_atomic); returns (bytes, framing seconds,
        write seconds), or None where the compiled module lacks that call."""
        from ..io.png import write_zlib_png_atomic

        settings = self._settings
        return self._named(
            target,
            lambda: write_zlib_png_atomic(
                target,
                buffer,
                room=room,
                out_bytes=out_bytes,
                width=shape[1],
                height=shape[0],
                channels=1 if len(shape) == 2 else shape[2],
                overwrite=settings.overwrite,
                durable=settings.durable,
            ),
        )

    @staticmethod
    def _named(target: Path, write: Callable[[], _T]) -> _T:
        """write(); an OSError of it names the target (never the temporary file)."""
        try:
            return write()
        except OutputExistsError:
            raise
        except OSError as error:
            raise OSError(
                error.errno, f"cannot write: {error.strerror or error}", str(target)
            ) from error
