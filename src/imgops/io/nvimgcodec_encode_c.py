"""nvImageCodec's JPEG encoder through its C API (ctypes), for `-f jpg` on the torch-free engine.

The Python module's encoder (imgops.io.gpu_encode.GpuJpegEncoder) costs the engine two things
on the device thread at its first batch: `import nvidia.nvimgcodec`, about a second with the
GIL held (its own library instance, with nvJPEG's start and hardware probes), and the encoder.
Here the encoder is made on the C API decoder's instance (CDecoder.share_instance), whose start
was paid in the background, and every call is a ctypes call that releases the GIL. The
interface and the choices are GpuJpegEncoder's: `encode_arrays(arrays, cuda_stream)`, nvJPEG's
hardware encoder then its CUDA encoder (HW_GPU_ONLY, HYBRID_CPU_GPU), 4:2:0 for colour,
optimised Huffman tables, None for an image it did not encode (OpenCV encodes that one).
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Sequence
from typing import Any

from .gpu_decode import GpuDecoderUnavailable, _quiet_stderr
from .gpu_encode import MAX_GPU_IMAGE_BYTES, GpuEncoderUnavailable
from .nvimgcodec_c import (
    _COLORSPEC_UNKNOWN,
    _CPU_ONLY,
    _HW_GPU_ONLY,
    _HYBRID_CPU_GPU,
    _PROCESSING_SUCCESS,
    CDecoder,
    NvImgCodecError,
    _check,
    _execution_params,
    _ImageInfo,
    _new,
    _packed_image_info,
    _processing_statuses,
    library,
    version,
)

# nvimgcodecStructureType_t, nvimgcodecQualityType_t, nvimgcodecChromaSubsampling_t
_ENCODE_PARAMS, _JPEG_ENCODE_PARAMS = 6, 14
_QUALITY_TYPE_QUALITY = 2
_SAMPLING_444, _SAMPLING_420, _SAMPLING_GRAY = 0, 3, 7
_COLORSPEC_UNCHANGED = _COLORSPEC_UNKNOWN  # nvimgcodec.h: the same value


class _EncodeParams(ctypes.Structure):
    _fields_ = [
        ("struct_type", ctypes.c_int),
        ("struct_size", ctypes.c_size_t),
        ("struct_next", ctypes.c_void_p),
        ("quality_type", ctypes.c_int),
        ("quality_value", ctypes.c_float),
    ]


class _JpegEncodeParams(ctypes.Structure):
    _fields_ = [
        ("struct_type", ctypes.c_int),
        ("struct_size", ctypes.c_size_t),
        ("struct_next", ctypes.c_void_p),
        ("optimized_huffman", ctypes.c_int),
    ]


#: unsigned char* (*nvimgcodecResizeBufferFunc_t)(void* ctx, size_t req_size)
_RESIZE = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)


class _Outputs:
    """The host buffers nvImageCodec asks for, one per image of a call (ctx = index + 1):
    grown with the bytes already written kept, shrunk by remembering the smaller size."""

    def __init__(self, count: int) -> None:
        self.buffers: list[Any] = [None] * count
        self.sizes = [0] * count

    def resize(self, ctx: int | None, size: int) -> int | None:
        index = (ctx or 0) - 1
        if not 0 <= index < len(self.buffers):
            return None
        buffer = self.buffers[index]
        if buffer is None or len(buffer) < size:
            grown = ctypes.create_string_buffer(max(1, size))
            if buffer is not None:
                ctypes.memmove(grown, buffer, self.sizes[index])
            self.buffers[index] = buffer = grown
        self.sizes[index] = size
        return ctypes.addressof(buffer)

    def data(self, index: int) -> bytes | None:
        buffer = self.buffers[index]
        return None if buffer is None else ctypes.string_at(buffer, self.sizes[index])


def _pixels(array: Any, cpu_backend: bool) -> tuple[int, int, int, int, int] | None:
    """(pointer, height, width, channels, row pitch) of a uint8 image given by
    `__cuda_array_interface__` (GPU) or `__array_interface__` (the CPU backend): (H, W, 1) or
    (H, W, 3) with packed pixels, not empty, at most MAX_GPU_IMAGE_BYTES; else None."""
    interface = getattr(array, "__cuda_array_interface__", None)
    if interface is None and cpu_backend:
        interface = getattr(array, "__array_interface__", None)
    if interface is None or interface.get("typestr") not in ("|u1", "<u1", ">u1"):
        return None
    shape = tuple(interface["shape"])
    if len(shape) == 2:
        shape = (*shape, 1)
    if len(shape) != 3 or shape[2] not in (1, 3):
        return None
    height, width, channels = shape
    strides = interface.get("strides")
    pitch = width * channels
    if strides is not None:  # (an axis of length 1 may have any stride)
        strides = (*strides, 1) if len(strides) == 2 else tuple(strides)
        if (width > 1 and strides[1] != channels) or (channels > 1 and strides[2] != 1):
            return None
        if height > 1:
            pitch = strides[0]
        if pitch < width * channels:
            return None
    if height * width * channels == 0 or height * width * channels > MAX_GPU_IMAGE_BYTES:
        return None
    return int(interface["data"][0]), height, width, channels, int(pitch)


class CEncoder:
    """One nvImageCodec JPEG encoder at a fixed quality, made on a CDecoder's instance (or on
    an instance of its own); owned by one thread. `cpu_backend`: nvImageCodec's CPU encoder
    on host arrays (the tests)."""

    def __init__(
        self,
        quality: int = 95,
        device_id: int = 0,
        *,
        decoder: CDecoder | None = None,
        cpu_backend: bool = False,
        threads: int = 0,
        optimized_huffman: bool = True,
    ) -> None:
        self._encoder = ctypes.c_void_p()
        self._owner: CDecoder | None = None  # whose instance this encoder holds a share of
        if not 1 <= int(quality) <= 100:
            raise ValueError(f"JPEG quality must be 1..100, not {quality}")
        self._lib = lib = library()
        self.quality, self.cpu_backend, self.device_id = int(quality), cpu_backend, device_id
        if decoder is None:
            decoder = CDecoder(device_id, cpu_backend=cpu_backend, threads=threads)
            decoder.share_instance()
            decoder.close()  # its decoder goes; the instance stays while this encoder lives
        else:
            decoder.share_instance()
        self._owner = decoder
        kinds = [_CPU_ONLY] if cpu_backend else [_HW_GPU_ONLY, _HYBRID_CPU_GPU]
        params, self._backends = _execution_params(kinds, device_id, threads)
        try:
            with _quiet_stderr():
                status = lib.nvimgcodecEncoderCreate(
                    decoder._instance, ctypes.byref(self._encoder), ctypes.byref(params), None
                )
            _check("nvimgcodecEncoderCreate", status)
        except NvImgCodecError as error:
            self.close()
            where = "the CPU" if cpu_backend else f"GPU {device_id}"
            raise GpuEncoderUnavailable(
                f"nvImageCodec {version()} cannot encode JPEG on {where}: {error}"
            ) from None
        self._jpeg_params = _new(
            _JpegEncodeParams, _JPEG_ENCODE_PARAMS, optimized_huffman=int(optimized_huffman)
        )
        self._params = _new(
            _EncodeParams,
            _ENCODE_PARAMS,
            struct_next=ctypes.addressof(self._jpeg_params),
            quality_type=_QUALITY_TYPE_QUALITY,
            quality_value=float(self.quality),
        )

    def close(self) -> None:
        """Destroys the encoder and gives the instance back (the GIL released)."""
        if self._encoder:
            self._lib.nvimgcodecEncoderDestroy(self._encoder)
            self._encoder = ctypes.c_void_p()
        owner, self._owner = self._owner, None
        if owner is not None:
            owner.release_instance()

    def __del__(self) -> None:
        if not sys.is_finalizing() and hasattr(self, "_encoder"):
            self.close()

    def encode_arrays(self, arrays: Sequence[Any], cuda_stream: int = 0) -> list[bytes | None]:
        """JPEG bytes of each image (uint8 (H, W, 1) gray or (H, W, 3) RGB, rows may be
        pitched; device memory, or host memory with the CPU backend), in one call that waits
        for the work queued on `cuda_stream` before it reads the pixels; None where it failed
        or the image is refused (see _pixels): OpenCV encodes those."""
        out: list[bytes | None] = [None] * len(arrays)
        picked = [(i, p) for i, a in enumerate(arrays) if (p := _pixels(a, self.cpu_backend))]
        if not picked or not self._encoder:
            return out
        lib, owner = self._lib, self._owner
        if owner is None:
            return out
        count = len(picked)
        outputs = _Outputs(count)
        resize = _RESIZE(outputs.resize)  # alive until the call's end
        images = (ctypes.c_void_p * count)()
        streams = (ctypes.c_void_p * count)()
        try:
            for k, (_, pixels) in enumerate(picked):
                source, target = self._image_infos(pixels, cuda_stream)
                image, stream = ctypes.c_void_p(), ctypes.c_void_p()
                status = lib.nvimgcodecImageCreate(
                    owner._instance, ctypes.byref(image), ctypes.byref(source)
                )
                _check("nvimgcodecImageCreate", status)
                images[k] = image.value
                status = lib.nvimgcodecCodeStreamCreateToHostMem(
                    owner._instance,
                    ctypes.byref(stream),
                    ctypes.c_void_p(k + 1),
                    ctypes.cast(resize, ctypes.c_void_p),
                    ctypes.byref(target),
                )
                _check("nvimgcodecCodeStreamCreateToHostMem", status)
                streams[k] = stream.value
            statuses = self._run(images, streams, count)
        except NvImgCodecError:
            return out  # the whole call failed: OpenCV encodes these
        finally:
            for image in images:
                if image:
                    lib.nvimgcodecImageDestroy(image)
            for stream in streams:
                if stream:
                    lib.nvimgcodecCodeStreamDestroy(stream)
        for k, ((i, _), status) in enumerate(zip(picked, statuses, strict=True)):
            if status == _PROCESSING_SUCCESS:
                out[i] = outputs.data(k)
        return out

    def _image_infos(
        self, pixels: tuple[int, int, int, int, int], cuda_stream: int
    ) -> tuple[_ImageInfo, _ImageInfo]:
        """The input image's description and the JPEG code stream's (4:2:0 or gray)."""
        pointer, height, width, channels, pitch = pixels
        host = self.cpu_backend
        source = _packed_image_info(pointer, width, height, channels, pitch, host, cuda_stream)
        if channels == 1:  # nvJPEG's CUDA encoder refuses Y input not marked as gray sampling
            source.chroma_subsampling = _SAMPLING_GRAY
        target = _packed_image_info(
            pointer, width, height, channels, pitch, host, cuda_stream, codec_name=b"jpeg",
            chroma_subsampling=_SAMPLING_GRAY if channels == 1 else _SAMPLING_420,
        )  # fmt: skip
        target.color_spec = _COLORSPEC_UNCHANGED  # as the Python module asks (nvJPEG picks)
        return source, target

    def _run(self, images: Any, streams: Any, count: int) -> list[int]:
        lib, future = self._lib, ctypes.c_void_p()
        status = lib.nvimgcodecEncoderEncode(
            self._encoder, images, streams, count, ctypes.byref(self._params), ctypes.byref(future)
        )
        _check("nvimgcodecEncoderEncode", status)
        return _processing_statuses(lib, future, count)


__all__ = ["CEncoder", "GpuDecoderUnavailable"]
