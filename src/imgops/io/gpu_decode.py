"""JPEG decode in batches on the GPU with nvImageCodec (the optional extra ``imgops[gpu]``).

`BatchDecoder.decode` takes the encoded bytes of many files, decodes them in one nvImageCodec
call straight into device memory (the GPU's hardware JPEG engine where it has one, else
nvJPEG's CUDA decoder) and hands each image to torch without a copy (DLPack). EXIF orientation
is applied as OpenCV applies it.

Only what the GPU decodes like the CPU path is sent there: baseline and progressive JPEGs of
8-bit YCbCr or gray. Everything else (CMYK/YCCK, 12-bit, PNG, TIFF, anything nvImageCodec cannot
parse) is left to the caller's CPU decode (OpenCV), file by file, and so is any file the batch
call returns no image for (corrupt data): the output never depends on the backend.

nvImageCodec is imported lazily, on first use; its loader's messages about optional codecs
(nvJPEG2000, nvTIFF) are kept off the user's terminal.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BatchDecoder",
    "Candidate",
    "GpuDecoderUnavailable",
    "installed",
    "module",
    "status",
    "version",
]

INSTALL_HINT = "pip install 'imgops[gpu]' (nvidia-nvimgcodec-cu13 and nvidia-nvjpeg)"


class GpuDecoderUnavailable(RuntimeError):
    """`--decoder gpu` cannot work here (no nvImageCodec, no GPU); the message says why."""

    exit_code = 2


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Sends file descriptor 2 to /dev/null for the duration (native loader messages)."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


_import_lock = threading.Lock()


@functools.cache
def _load() -> tuple[Any, str | None]:
    # Fatal messages only (read once, at import): per-image errors would print among the progress
    # lines; a file nvImageCodec refuses goes to the CPU decoder, which names any problem.
    os.environ.setdefault("PYNVIMGCODEC_VERBOSITY", "1")
    with _import_lock, _quiet_stderr():
        try:
            import nvidia.nvimgcodec as nvimgcodec
        except ImportError as error:
            return None, f"nvImageCodec is not installed ({error.name or error}): {INSTALL_HINT}"
        except Exception as error:  # a broken install: say so, never crash the caller
            return None, f"nvImageCodec failed to load: {type(error).__name__}: {error}"
    return nvimgcodec, None


def module() -> Any:
    """The nvidia.nvimgcodec module; GpuDecoderUnavailable if it is not installed."""
    found, problem = _load()
    if found is None:
        raise GpuDecoderUnavailable(problem)
    return found


def installed() -> bool:
    """Whether nvImageCodec is installed, found without importing it (milliseconds)."""
    import importlib.util

    try:
        return importlib.util.find_spec("nvidia.nvimgcodec") is not None
    except (ImportError, ValueError):
        return False


def version() -> str | None:
    """nvImageCodec's version, or None when it is not installed."""
    found, _ = _load()
    return getattr(found, "__version__", "unknown") if found is not None else None


@functools.cache
def driver_device_count() -> int:
    """GPUs the CUDA driver sees (0 without a driver), asked through ctypes: no torch, no
    nvImageCodec, a few milliseconds."""
    import ctypes

    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            driver = ctypes.CDLL(name)
        except OSError:
            continue
        count = ctypes.c_int(0)
        if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return 0
        return count.value
    return 0


def status(device_id: int = 0) -> tuple[bool, str]:
    """(usable, one line why) for `imgops doctor`: installed, a GPU, and a decoder starts."""
    found, problem = _load()
    if found is None:
        return False, problem or "nvImageCodec is not installed"
    if driver_device_count() <= device_id:
        return (
            False,
            f"nvImageCodec {version()} is installed, but no CUDA GPU {device_id} is visible",
        )
    try:
        BatchDecoder(device_id)
    except GpuDecoderUnavailable as error:
        return False, str(error)
    return True, f"nvImageCodec {version()}: JPEG decode on GPU {device_id}"


@dataclass
class Candidate:
    """A file the GPU decoder accepted: its parsed stream, size and whether it is gray."""

    stream: Any
    width: int
    height: int
    gray: bool

    @property
    def nbytes(self) -> int:
        """Bytes of the decoded image (uint8, 1 or 3 channels)."""
        return self.width * self.height * (1 if self.gray else 3)


class BatchDecoder:
    """One nvImageCodec decoder; `decode` runs a batch, `accept` says what it may decode.

    `cpu_backend=True` uses nvImageCodec's CPU backend instead of the GPU (no GPU needed: the
    tests use it to drive every code path here); images then live in host memory.
    Not thread-safe: one thread (the engine's device thread) owns it.
    """

    def __init__(self, device_id: int = 0, *, cpu_backend: bool = False, threads: int = 0):
        nv = module()
        self._nv = nv
        self.cpu_backend = cpu_backend
        try:
            with _quiet_stderr():  # the loader's notes on optional codecs
                if cpu_backend:
                    backends = [nv.Backend(nv.BackendKind.CPU_ONLY)]
                    self._decoder = nv.Decoder(
                        device_id=nv.NVIMGCODEC_DEVICE_CPU_ONLY,
                        max_num_cpu_threads=threads,
                        backends=backends,
                    )
                else:  # hardware engine first, then nvJPEG's CUDA decoder; never a CPU backend
                    backends = [
                        nv.Backend(nv.BackendKind.HW_GPU_ONLY),
                        nv.Backend(nv.BackendKind.GPU_ONLY),
                    ]
                    self._decoder = nv.Decoder(
                        device_id=device_id, max_num_cpu_threads=threads, backends=backends
                    )
        except Exception as error:  # RuntimeError "CUDA Runtime failure" without a GPU
            reason = str(error).split(" at /")[0]  # drop the build machine's source path
            raise GpuDecoderUnavailable(
                f"nvImageCodec {version()} cannot decode on GPU {device_id}: {reason}"
            ) from None
        self._colour = nv.DecodeParams(
            apply_exif_orientation=True,
            color_spec=nv.ColorSpec.SRGB,
            allow_any_depth=False,
            sample_format=nv.SampleFormat.I_RGB,
        )
        self._gray = nv.DecodeParams(
            apply_exif_orientation=True,
            color_spec=nv.ColorSpec.GRAY,
            allow_any_depth=False,
            sample_format=nv.SampleFormat.I_Y,
        )

    @property
    def backend(self) -> str:
        """Which backends decode: "gpu" (hardware engine, else CUDA) or "cpu" (tests)."""
        return "cpu" if self.cpu_backend else "gpu"

    def warm_up(self, cuda_stream: int = 0) -> None:
        """Decodes one small JPEG, so the backend's one-time set-up (about 0.7 s for the first
        call on an H200) is paid before the first real batch. Never raises."""
        with contextlib.suppress(Exception):
            candidate = self.accept(warm_up_jpeg(), 1 << 20)
            if candidate is not None:
                self.decode([candidate], cuda_stream)

    def accept(self, data: bytes, max_pixels: int) -> Candidate | None:
        """A Candidate when the GPU decodes this file like OpenCV would, else None (CPU).

        8-bit baseline/progressive JPEG, 1 or 3 components in YCbCr or gray, at most
        `max_pixels` pixels. Never raises: an unparsable file goes to the CPU decoder, which
        names the problem.
        """
        if not data.startswith(b"\xff\xd8\xff"):
            return None
        # nvImageCodec decodes a truncated file without a word; OpenCV's path refuses it.
        # Such files go to the CPU, which names the problem, so the backend never shows.
        if not jpeg_is_whole(data):
            return None
        nv = self._nv
        try:
            stream = nv.CodeStream(data)
            codec, spec = stream.codec_name, stream.color_spec
            channels, precision = stream.num_channels, stream.precision
            width, height = stream.width, stream.height
        except Exception:
            return None
        if codec != "jpeg" or precision not in (0, 8) or not 0 < width * height <= max_pixels:
            return None
        if channels == 1 and spec in (nv.ColorSpec.GRAY, nv.ColorSpec.UNKNOWN):
            return Candidate(stream, width, height, gray=True)
        if channels == 3 and spec in (nv.ColorSpec.SYCC, nv.ColorSpec.SRGB):
            return Candidate(stream, width, height, gray=False)
        return None  # CMYK, YCCK, 2 or 4 components, other colour specs

    def decode(self, batch: Sequence[Candidate], cuda_stream: int = 0) -> list[Any]:
        """Decodes a batch; one entry per candidate: an nvImageCodec Image, or None (failed).

        Colour images come back (H, W, 3) RGB, gray ones (H, W, 1), uint8, ordered on
        `cuda_stream` (an int cudaStream_t): work queued on it after this call sees them.
        """
        results: list[Any] = [None] * len(batch)
        for gray, params in ((False, self._colour), (True, self._gray)):
            picked = [i for i, c in enumerate(batch) if c.gray == gray]
            if not picked:
                continue
            streams = [batch[i].stream for i in picked]
            try:
                images = self._decoder.decode(streams, params=params, cuda_stream=cuda_stream)
            except Exception:  # the whole call failed: every file goes to the CPU decoder
                images = [None] * len(picked)
            for i, image in zip(picked, images, strict=True):
                results[i] = image
        return results


#: A small colour JPEG (128x96 ramps, made once with OpenCV's encoder at its defaults), base64:
#: a constant, so that a decoder's warm-up imports neither OpenCV nor numpy (the GPU stage's
#: thread would otherwise wait for those imports, ~0.3-0.8 s, before its first decode).
_WARM_UP_JPEG = (
    "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDAAIBAQEBAQIBAQECAgICAgQDAgICAgUEBAMEBgUGBgYFBgYGBwkIBgcJ"
    "BwYGCAsICQoKCgoKBggLDAsKDAkKCgr/2wBDAQICAgICAgUDAwUKBwYHCgoKCgoKCgoKCgoKCgoKCgoKCgoKCgoK"
    "CgoKCgoKCgoKCgoKCgoKCgoKCgoKCgoKCgr/wAARCABgAIADASIAAhEBAxEB/8QAHwAAAQUBAQEBAQEAAAAAAAAA"
    "AAECAwQFBgcICQoL/8QAtRAAAgEDAwIEAwUFBAQAAAF9AQIDAAQRBRIhMUEGE1FhByJxFDKBkaEII0KxwRVS0fAk"
    "M2JyggkKFhcYGRolJicoKSo0NTY3ODk6Q0RFRkdISUpTVFVWV1hZWmNkZWZnaGlqc3R1dnd4eXqDhIWGh4iJipKT"
    "lJWWl5iZmqKjpKWmp6ipqrKztLW2t7i5usLDxMXGx8jJytLT1NXW19jZ2uHi4+Tl5ufo6erx8vP09fb3+Pn6/8QA"
    "HwEAAwEBAQEBAQEBAQAAAAAAAAECAwQFBgcICQoL/8QAtREAAgECBAQDBAcFBAQAAQJ3AAECAxEEBSExBhJBUQdh"
    "cRMiMoEIFEKRobHBCSMzUvAVYnLRChYkNOEl8RcYGRomJygpKjU2Nzg5OkNERUZHSElKU1RVVldYWVpjZGVmZ2hp"
    "anN0dXZ3eHl6goOEhYaHiImKkpOUlZaXmJmaoqOkpaanqKmqsrO0tba3uLm6wsPExcbHyMnK0tPU1dbX2Nna4uPk"
    "5ebn6Onq8vP09fb3+Pn6/9oADAMBAAIRAxEAPwC3Bff7VXYL7/armYL7/aq7BfD1r/P2jlumx/p5mU9zpoL73q5B"
    "fe9c1Bfe9XYL73r1qOW7aH5/mU9zpYL7/aq7Bf8AvXNQX/8AtVdgvvevVo5brsfn+ZT3OlgvversF971zMF971dg"
    "vvevVo5bpsfn+ZT3Omgvv9qrsF9/tVzMF9/tVdt77p81etRy3bQ/P8ynudNBff7VXIL7/armoL7/AGquwX3+1XrU"
    "ct02Pz/Mp7nSwX3+1V2C+/2q5qC+/wBqrkF97161HLdtD8/zKe500F9/tVdgvveuZgvv9qrsF9716tHLddj8/wAy"
    "nufEsF971dgvv9quagvversF/wD7VflFHLdNj/bbMp7nSwX/AL1dgvveuZgvversF97161HLdtD8/wAynudNBfe9"
    "XYL7/armYL73q7Bff7VerRy3XY/P8ynudNBff7VXYL7/AGq5m3vunzVdgvv9qvVo5bpsfn+ZT3Olgvv9qrsF9/tV"
    "zUF9/tVdgvv9qvWo5btofn+ZT3Olgvv9qrsF9/tVzMF971dgvv8Aar1qOW6bH59mU9zpoL73q7Bfe9czBfe9XYL7"
    "3r1qOW7aH5/mU9zpoL73q5Bff7Vc1Bfe9XYL7/ar1aOW67H5/mU9z4lgvversF971zMF971dgvvevyijlumx/ttm"
    "U9zpoL7/AGquwX3+1XMwX3+1V23vunzV61HLdtD8/wAynudLBff7VXYL7/armoL7/aq7Bff7VerRy3XY/P8AMp7n"
    "SwX3+1V2C+/2q5mC+/2quwX3+1Xq0ct02Pz/ADKe500F9/tVdgvveuZgvv8Aaq7Bfe9etRy3bQ/P8ynudNBfe9XY"
    "L73rmYL73q7Bfe9etRy3TY/P8ynudLBff7VXYL73rmoL7/aq7Bfe9etRy3bQ/P8AMp7nSwX3vV2C+/2q5qC+/wBq"
    "rkF9/tV61HLddj8/zKe58TQX3+1VyC+/2q5q3vunzVdgvv8Aar8no5bpsf7bZlPc6WC+/wBqrsF9/tVzUF9/tVcg"
    "vv8Aar1qOW7aH5/mU9zpoL7/AGquwX3+1XMwX3+1V2C+/wBqvVo5brsfn+ZT3OmgvversF971zMF971dgvvevVo5"
    "bpsfn+ZT3OlgvversF9/tVzUF971dgvv9qvWo5btofn+ZT3OlgvversF971zUF971cgvv9qvXo5bpsfn+ZT3Omgv"
    "v9qrsF9/tVzMF9/tVdgvv9qvVo5btofn+ZT3Omgvv9qrsF9/tVzMF90+arsF9/tV61HLddj8/wAynufEsF9/tVdg"
    "vv8AarmYL7/aq7Bff7Vfk9HLdNj/AG2zKe500F9/tVdgvveuZgvv9qrsF97161HLdtD8/wAynudNBfe9XIL73rmo"
    "L73q7Bfe9etRy3XY/P8AMp7nSwX3+1V2C+965qC+/wBqrsF9716tHLdNj8/zKe50sF971dgvj61zMF971dgvv9qv"
    "Vo5btofn+ZT3Omgvv9qrsF9/tVzMF9/tVdgvunzV69HLdNj8+zKe500F9/tVcgvv9quagvv9qrsF9716tHLdtD8/"
    "zKe50sF9/tVdgvv9quagvverkF97161HLddj8/zKe58TQX3vV2C+965mC+96uwX3vX5RRy3TY/22zKe50sF971dg"
    "vv8AarmoL73q7Bff7VerRy3bQ/P8ynudLBfe9XYL73rmoL73q5Bfe9etRy3XY/P8ynudNBfH1q7Bff7VczBff7VX"
    "YL7/AGq9Wjlumx+f5lPc6aC+/wBqrsF9/tVzMF90+arsF9/tV6tHLdtD8/zKe50sF9/tVdgvv9quagvversF9716"
    "9HLdNj8/zKe50sF9/tVdgvh61zMF971dgvv9qvVo5btofn+ZT3OmgvversF/71zMF/71dgvvevWo5brsfn+ZT3P/"
    "2Q=="
)


def warm_up_jpeg() -> bytes:
    """A small colour JPEG (128x96 ramps, 4:2:0 baseline) for a decoder's warm-up decode."""
    import base64

    return base64.b64decode(_WARM_UP_JPEG)


def jpeg_is_whole(data: bytes) -> bool:
    """Whether a JPEG's structure is complete (images.jpeg_structure_problem finds nothing).

    The usual file, its header segments inside the data up to the first scan and its last two
    bytes the end-of-image marker, is answered from the headers alone; anything else is
    scanned in full. (The scan holds the GIL: ~0.2-0.8 ms a photo, on every prep thread.)
    """
    end, pos = len(data), 2
    if data.endswith(b"\xff\xd9"):
        while pos + 4 <= end and data[pos] == 0xFF:
            marker = data[pos + 1]
            if marker == 0xFF:  # fill byte
                pos += 1
                continue
            if marker == 0xDA:  # the first scan starts inside the file: whole
                length = int.from_bytes(data[pos + 2 : pos + 4], "big")
                return pos + 2 + length < end - 2
            if 0xD0 <= marker <= 0xD9 or marker == 0x01:
                break  # not where headers belong: let the full check say what it is
            pos += 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")
    from .images import jpeg_structure_problem  # (numpy: only off the usual files' path)

    return jpeg_structure_problem(data) is None


def as_tensor(image: Any) -> Any:
    """A torch tensor sharing the decoded image's memory (DLPack on the GPU, numpy on the host)."""
    import numpy as np
    import torch

    nv = module()
    if image.buffer_kind != nv.ImageBufferKind.STRIDED_DEVICE:
        return torch.from_numpy(np.asarray(image))
    try:  # DLPack: torch passes its current stream, nvImageCodec orders its decode before it
        return torch.from_dlpack(image)
    except (TypeError, BufferError):  # an older DLPack handshake: the CUDA array interface
        return torch.as_tensor(image, device=f"cuda:{image.device_id}")
