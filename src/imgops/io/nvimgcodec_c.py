"""nvImageCodec's JPEG decoder through its C API (ctypes), for the torch-free CUDA engine.

Why not the Python module: `import nvidia.nvimgcodec` creates a library instance inside the
module's initialisation, and on the H200 host that takes about 1 s (nvJPEG's start and its probe
for a hardware JPEG encoder, per instance) with the GIL held, which stalls every other thread of
imgops for that second. Here every library call is a ctypes call, which releases the GIL: the
instance starts in the background while the first files take the CPU path at full speed.

The decoder has the interface of imgops.io.gpu_decode.BatchDecoder (`accept`, `decode`,
`warm_up`, `backend`) with one difference: the caller provides the output memory through
`use_memory(allocate, free)` (the engine's stream-ordered device memory), and `decode` returns
imgops.engine.driver_stage.DeviceImage objects that own it. With the CPU backend (the tests)
the outputs are numpy arrays in host memory.

The structures below follow nvimgcodec.h of nvImageCodec 0.9 (the header ships in the wheel;
tests/test_nvimgcodec_c.py checks the layouts against it with a C compiler where one is found).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .gpu_decode import GpuDecoderUnavailable, _quiet_stderr, jpeg_is_whole, warm_up_jpeg

# nvimgcodecStructureType_t
_INSTANCE_CREATE_INFO, _DECODE_PARAMS, _ORIENTATION = 2, 5, 7
_IMAGE_INFO, _IMAGE_PLANE_INFO, _BACKEND, _BACKEND_PARAMS, _EXECUTION_PARAMS = 11, 12, 17, 29, 30
# enums
_CPU_ONLY, _GPU_ONLY, _HYBRID_CPU_GPU, _HW_GPU_ONLY = 1, 2, 3, 4  # nvimgcodecBackendKind_t
_LOAD_HINT_FIXED = 2
_DEVICE_CPU_ONLY = -99999
_COLORSPEC_UNKNOWN, _COLORSPEC_SRGB, _COLORSPEC_GRAY, _COLORSPEC_SYCC = 0, 1, 2, 3
_SAMPLEFORMAT_P_Y, _SAMPLEFORMAT_I_RGB = 3, 8
_UINT8 = 0x0802
_BUFFER_DEVICE, _BUFFER_HOST = 1, 2
_PROCESSING_SUCCESS = 1
#: nvimgcodecProcessingStatus names, for the reason a file went to the CPU path.
_PROCESSING_NAMES = {
    0x0: "no status", 0x2: "saturated", 0x3: "failed", 0x5: "colour spec unsupported",
    0x7: "image corrupted", 0x9: "orientation unsupported", 0xB: "codec unsupported",
    0x11: "region unsupported", 0x13: "no backend supports it", 0x21: "sampling unsupported",
    0x23: "encoding unsupported", 0x41: "sample type unsupported",
    0x43: "resolution unsupported", 0x81: "sample format unsupported",
    0x83: "code stream unsupported", 0x101: "number of images unsupported",
    0x201: "number of planes unsupported", 0x401: "number of channels unsupported",
    0x801: "quality type unsupported", 0x1001: "quality value unsupported",
    0x2001: "tiling unsupported",
}  # fmt: skip
_MAX_PLANES = 32


class _Orientation(ctypes.Structure):
    _fields_ = [
        ("struct_type", ctypes.c_int),
        ("struct_size", ctypes.c_size_t),
        ("struct_next", ctypes.c_void_p),
        ("rotated", ctypes.c_int),
        ("flip_x", ctypes.c_int),
        ("flip_y", ctypes.c_int),
    ]


class _PlaneInfo(ctypes.Structure):
    _fields_ = [
        ("struct_type", ctypes.c_int),
        ("struct_size", ctypes.c_size_t),
        ("struct_next", ctypes.c_void_p),
        ("width", ctypes.c_uint32),
        ("height", ctypes.c_uint32),
        ("row_stride", ctypes.c_size_t),
        ("num_channels", ctypes.c_uint32),
        ("sample_type", ctypes.c_int),
        ("precision", ctypes.c_uint8),
    ]


class _ImageInfo(ctypes.Structure):
    _fields_ = [
        ("struct_type", ctypes.c_int),
        ("struct_size", ctypes.c_size_t),
        ("struct_next", ctypes.c_void_p),
        ("codec_name", ctypes.c_char * 256),
        ("color_spec", ctypes.c_int),
        ("chroma_subsampling", ctypes.c_int),
        ("sample_format", ctypes.c_int),
        ("orientation", _Orientation),
        ("num_planes", ctypes.c_uint32),
        ("plane_info", _PlaneInfo * _MAX_PLANES),
        ("buffer", ctypes.c_void_p),
        ("buffer_kind", ctypes.c_int),
        ("cuda_stream", ctypes.c_void_p),
    ]


class _InstanceCreateInfo(ctypes.Structure):
    _fields_ = [
        ("struct_type", ctypes.c_int),
        ("struct_size", ctypes.c_size_t),
        ("struct_next", ctypes.c_void_p),
        ("load_builtin_modules", ctypes.c_int),
        ("load_extension_modules", ctypes.c_int),
        ("extension_modules_path", ctypes.c_char_p),
        ("create_debug_messenger", ctypes.c_int),
        ("debug_messenger_desc", ctypes.c_void_p),
        ("message_severity", ctypes.c_uint32),
        ("message_category", ctypes.c_uint32),
    ]


class _BackendParams(ctypes.Structure):
    _fields_ = [
        ("struct_type", ctypes.c_int),
        ("struct_size", ctypes.c_size_t),
        ("struct_next", ctypes.c_void_p),
        ("load_hint", ctypes.c_float),
        ("load_hint_policy", ctypes.c_int),
    ]


class _Backend(ctypes.Structure):
    _fields_ = [
        ("struct_type", ctypes.c_int),
        ("struct_size", ctypes.c_size_t),
        ("struct_next", ctypes.c_void_p),
        ("kind", ctypes.c_int),
        ("params", _BackendParams),
    ]


class _ExecutionParams(ctypes.Structure):
    _fields_ = [
        ("struct_type", ctypes.c_int),
        ("struct_size", ctypes.c_size_t),
        ("struct_next", ctypes.c_void_p),
        ("device_allocator", ctypes.c_void_p),
        ("pinned_allocator", ctypes.c_void_p),
        ("max_num_cpu_threads", ctypes.c_int),
        ("executor", ctypes.c_void_p),
        ("device_id", ctypes.c_int),
        ("pre_init", ctypes.c_int),
        ("skip_pre_sync", ctypes.c_int),
        ("num_backends", ctypes.c_int),
        ("backends", ctypes.POINTER(_Backend)),
    ]


class _DecodeParams(ctypes.Structure):
    _fields_ = [
        ("struct_type", ctypes.c_int),
        ("struct_size", ctypes.c_size_t),
        ("struct_next", ctypes.c_void_p),
        ("apply_exif_orientation", ctypes.c_int),
    ]


def _new(cls: type, type_id: int, **values: Any) -> Any:
    """A structure with its type and size set, then `values`."""
    return cls(struct_type=type_id, struct_size=ctypes.sizeof(cls), **values)


def _execution_params(
    kinds: Sequence[int], device_id: int, threads: int
) -> tuple[_ExecutionParams, Any]:
    """Execution parameters for a decoder or encoder on these backend kinds (each with the
    whole load); the backends array is returned too, to be kept alive with them."""
    hint = _new(_BackendParams, _BACKEND_PARAMS, load_hint=1.0, load_hint_policy=_LOAD_HINT_FIXED)
    backends = (_Backend * len(kinds))(
        *[_new(_Backend, _BACKEND, kind=kind, params=hint) for kind in kinds]
    )
    params = _new(
        _ExecutionParams,
        _EXECUTION_PARAMS,
        max_num_cpu_threads=threads,
        device_id=_DEVICE_CPU_ONLY if list(kinds) == [_CPU_ONLY] else device_id,
        num_backends=len(kinds),
        backends=backends,
    )
    return params, backends


def _packed_image_info(
    pointer: int, width: int, height: int, channels: int, pitch: int, host: bool,
    cuda_stream: int, **values: Any,
) -> _ImageInfo:  # fmt: skip
    """An image of one plane of uint8 pixels, gray (P_Y) or RGB (I_RGB), at `pointer` (host
    or device memory) with rows `pitch` bytes apart; `values` set the other fields.

    Gray is P_Y, as nvImageCodec's Python module and DALI describe it (one plane: the same
    memory as I_Y; some nvJPEG decoder versions list P_Y as supported but not I_Y)."""
    gray = channels == 1
    info = _new(
        _ImageInfo,
        _IMAGE_INFO,
        color_spec=_COLORSPEC_GRAY if gray else _COLORSPEC_SRGB,
        sample_format=_SAMPLEFORMAT_P_Y if gray else _SAMPLEFORMAT_I_RGB,
        num_planes=1,
        buffer=pointer,
        buffer_kind=_BUFFER_HOST if host else _BUFFER_DEVICE,
        cuda_stream=cuda_stream or None,
        **values,
    )
    plane = info.plane_info[0]
    plane.struct_type, plane.struct_size = _IMAGE_PLANE_INFO, ctypes.sizeof(_PlaneInfo)
    plane.width, plane.height, plane.row_stride = width, height, pitch
    plane.num_channels, plane.sample_type, plane.precision = channels, _UINT8, 8
    return info


def _processing_statuses(lib: Any, future: ctypes.c_void_p, count: int) -> list[int]:
    """Waits for a decode or encode call's future; its per-image statuses (0 where none came
    back), the future destroyed."""
    try:
        _check("nvimgcodecFutureWaitForAll", lib.nvimgcodecFutureWaitForAll(future))
        statuses = (ctypes.c_uint32 * count)()
        size = ctypes.c_size_t(count)
        status = lib.nvimgcodecFutureGetProcessingStatus(future, statuses, ctypes.byref(size))
        _check("nvimgcodecFutureGetProcessingStatus", status)
        return list(statuses[: size.value]) + [0] * (count - size.value)
    finally:
        lib.nvimgcodecFutureDestroy(future)


def processing_status_name(status: int) -> str:
    """A processing status as words with its value, e.g. "saturated (0x2)"."""
    return f"{_PROCESSING_NAMES.get(status, 'status')} ({status:#x})"


#: nvImageCodec versions (major, minor) whose nvimgcodec.h these structures were checked against;
#: with any other the engine uses the Python module (imgops.engine.driver_stage.make_decoder).
VERIFIED = ((0, 9),)


def verified() -> bool:
    """Whether the installed nvImageCodec is a version this binding was checked against."""
    parts = version().split(".")
    try:
        return (int(parts[0]), int(parts[1])) in VERIFIED
    except (IndexError, ValueError):
        return False


def version() -> str:
    """The installed nvImageCodec's version, from the package metadata (no import)."""
    from importlib import metadata

    for name in ("nvidia-nvimgcodec-cu13", "nvidia-nvimgcodec-cu12"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def package_dir() -> str | None:
    """The folder of the installed nvidia.nvimgcodec package (found without importing it)."""
    try:
        spec = importlib.util.find_spec("nvidia.nvimgcodec")
    except (ImportError, ValueError):
        return None
    return os.path.dirname(spec.origin) if spec is not None and spec.origin else None


_library: Any = None


def library() -> Any:
    """libnvimgcodec from the installed wheel, its functions typed; GpuDecoderUnavailable
    where it is missing."""
    global _library
    if _library is not None:
        return _library
    root = package_dir()
    path = os.path.join(root, "libnvimgcodec.so.0") if root else None
    if path is None or not os.path.exists(path):
        from .gpu_decode import INSTALL_HINT

        raise GpuDecoderUnavailable(f"nvImageCodec is not installed: {INSTALL_HINT}")
    try:
        lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as error:
        raise GpuDecoderUnavailable(f"nvImageCodec failed to load: {error}") from None
    handle, p = ctypes.c_void_p, ctypes.POINTER
    signatures = {
        "nvimgcodecInstanceCreate": [p(handle), p(_InstanceCreateInfo)],
        "nvimgcodecInstanceDestroy": [handle],
        "nvimgcodecDecoderCreate": [handle, p(handle), p(_ExecutionParams), ctypes.c_char_p],
        "nvimgcodecDecoderDestroy": [handle],
        "nvimgcodecCodeStreamCreateFromHostMem": [
            handle,
            p(handle),
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_void_p,
        ],  # fmt: skip
        "nvimgcodecCodeStreamDestroy": [handle],
        "nvimgcodecCodeStreamGetImageInfo": [handle, p(_ImageInfo)],
        "nvimgcodecImageCreate": [handle, p(handle), p(_ImageInfo)],
        "nvimgcodecImageDestroy": [handle],
        "nvimgcodecDecoderDecode": [
            handle,
            p(handle),
            p(handle),
            ctypes.c_int,
            p(_DecodeParams),
            p(handle),
        ],  # fmt: skip
        "nvimgcodecEncoderCreate": [handle, p(handle), p(_ExecutionParams), ctypes.c_char_p],
        "nvimgcodecEncoderDestroy": [handle],
        "nvimgcodecCodeStreamCreateToHostMem": [
            handle,
            p(handle),
            ctypes.c_void_p,
            ctypes.c_void_p,
            p(_ImageInfo),
        ],  # fmt: skip
        "nvimgcodecEncoderEncode": [
            handle,
            p(handle),
            p(handle),
            ctypes.c_int,
            ctypes.c_void_p,
            p(handle),
        ],  # fmt: skip
        "nvimgcodecFutureWaitForAll": [handle],
        "nvimgcodecFutureGetProcessingStatus": [handle, p(ctypes.c_uint32), p(ctypes.c_size_t)],
        "nvimgcodecFutureDestroy": [handle],
    }
    for name, args in signatures.items():
        function = getattr(lib, name)
        function.argtypes, function.restype = args, ctypes.c_int
    if quick_calls_hold_gil():
        holding = ctypes.PyDLL(path, handle=lib._handle)
        for name in QUICK_CALLS:
            held = getattr(holding, name)
            held.argtypes, held.restype = signatures[name], ctypes.c_int
            setattr(lib, name, held)
    _library = lib
    return lib


#: Calls that take microseconds per image and never call back into Python: with
#: IMGOPS_NVIMGCODEC_GIL=hold they keep the GIL (ctypes.PyDLL on the same handle) instead of
#: handing it to one of the engine's ~35 threads and waiting to win it back, once per image on
#: the prep threads (code stream, image info) and the decode thread (image create, destroy).
#: Decode, encode, the futures and the instance and decoder starts always release it (the
#: encoder's resize callback runs on nvImageCodec's own threads).
QUICK_CALLS = (
    "nvimgcodecCodeStreamCreateFromHostMem",
    "nvimgcodecCodeStreamGetImageInfo",
    "nvimgcodecCodeStreamDestroy",
    "nvimgcodecImageCreate",
    "nvimgcodecImageDestroy",
)

#: "hold" since 2026-12-07: on an H100 host (16 cores), 3200 photos cold on cuda, two rounds
#: alternated, hold took 6.26 and 6.00 s against release's 6.54 and 6.85 s (nvImageCodec's
#: decode calls 2.24/2.13 s against 2.62/2.32 s); docs/BENCHMARKS.md.
NVIMGCODEC_GIL_DEFAULT = "hold"


def quick_calls_hold_gil() -> bool:
    """Whether QUICK_CALLS keep the GIL (IMGOPS_NVIMGCODEC_GIL=hold|release), read once when
    the library is loaded."""
    value = os.environ.get("IMGOPS_NVIMGCODEC_GIL", NVIMGCODEC_GIL_DEFAULT).strip().lower()
    return value == "hold"


#: The extensions a GPU decoder loads (IMGOPS_NVIMGCODEC_EXTENSIONS: "all", or names such as
#: "nvjpeg,jpeg_turbo"): the engine decodes only baseline JPEGs on the GPU and everything else
#: with OpenCV, so it needs nvJPEG's extension alone; each other one is created at the
#: instance's start (nvJPEG 2000's, nvTIFF's, OpenCV's...). Not yet measured on a GPU (whether
#: the others cost anything there; nvJPEG's own start, with its probes of the hardware encoder
#: and decoder, is most of it), so every extension is still loaded by default.
GPU_EXTENSIONS_DEFAULT = "all"


def gpu_extensions() -> tuple[str, ...] | None:
    """The extension names a GPU decoder's instance loads; None: every installed one."""
    chosen = os.environ.get("IMGOPS_NVIMGCODEC_EXTENSIONS", GPU_EXTENSIONS_DEFAULT).strip()
    if chosen in ("", "all"):
        return None
    return tuple(name.strip() for name in chosen.split(",") if name.strip())


def _extension_subset(folder: str, names: tuple[str, ...]) -> str:
    """A new temporary folder holding links to `folder`'s lib<name>_ext.so* for `names`."""
    import tempfile

    subset = tempfile.mkdtemp(prefix="imgops-nvimgcodec-")
    for entry in os.listdir(folder):
        if any(entry.startswith(f"lib{name}_ext.so") for name in names):
            os.symlink(os.path.join(folder, entry), os.path.join(subset, entry))
    return subset


@contextlib.contextmanager
def _removed_after(folder: str | None) -> Iterator[None]:
    """Removes the temporary folder of links after the block (the libraries stay loaded)."""
    try:
        yield
    finally:
        if folder is not None:
            import shutil

            shutil.rmtree(folder, ignore_errors=True)


class NvImgCodecError(RuntimeError):
    """A library call failed: `status` is its nvimgcodecStatus_t."""

    def __init__(self, call: str, status: int) -> None:
        name = _STATUS_NAMES.get(status)
        said = f"{status} ({name})" if name else str(status)
        super().__init__(f"{call} failed with nvImageCodec status {said}")
        self.call, self.status = call, status


#: nvimgcodecStatus_t, as nvimgcodec.h names them (7, "arch mismatch", is what a decoder or an
#: encoder made for backends with no implementation of the codec fails with).
_STATUS_NAMES = {
    1: "not initialized", 2: "invalid parameter", 3: "bad code stream",
    4: "code stream unsupported", 5: "allocator failure", 6: "execution failed",
    7: "arch mismatch: no backend of the kinds asked for implements it", 8: "internal error",
    9: "implementation unsupported", 10: "missed dependencies",
    11: "extension not initialized", 12: "extension invalid parameter",
    13: "extension bad code stream", 14: "extension code stream unsupported",
    15: "extension allocator failure", 16: "extension arch mismatch",
    17: "extension internal error", 18: "extension implementation not supported",
    19: "extension incomplete bitstream", 20: "extension execution failed",
    21: "extension CUDA call error",
}  # fmt: skip


def _check(call: str, status: int) -> None:
    if status != 0:
        raise NvImgCodecError(call, status)


@dataclass
class Candidate:
    """A file the decoder accepted: its code stream (over `data`, kept alive with it), the
    decoded size (after the EXIF orientation) and whether it is gray."""

    stream: ctypes.c_void_p
    data: bytes
    width: int
    height: int
    gray: bool
    owner: CDecoder
    orientation: tuple[int, int, int] = (0, 0, 0)  # EXIF: rotated, flip_x, flip_y

    @property
    def nbytes(self) -> int:
        """Bytes of the decoded image (uint8, 1 or 3 channels, packed rows)."""
        return self.width * self.height * (1 if self.gray else 3)

    def __del__(self) -> None:
        lib = _library
        if lib is not None and self.stream and not sys.is_finalizing():
            lib.nvimgcodecCodeStreamDestroy(self.stream)
            self.stream = ctypes.c_void_p()


class CDecoder:
    """One nvImageCodec instance and decoder (GPU: the hardware engine, then nvJPEG's CUDA
    decoder; `cpu_backend`: the CPU backend, for tests). Not thread-safe for `decode` (the
    engine's device thread owns it); `accept` may run on any thread."""

    def __init__(self, device_id: int = 0, *, cpu_backend: bool = False, threads: int = 0):
        lib = library()
        self._lib = lib
        self.cpu_backend = cpu_backend
        self._instance = ctypes.c_void_p()
        self._decoder = ctypes.c_void_p()
        self._instance_users = 1  # the decoder; each encoder made on its instance adds one
        self._instance_lock = threading.Lock()
        self._closed = False
        root = package_dir()
        folder = os.path.join(root, "extensions") if root else None
        only = None if cpu_backend else gpu_extensions()
        if folder is not None and only is not None:
            folder = _extension_subset(folder, only)  # removed once the instance loaded them
        info = _new(
            _InstanceCreateInfo,
            _INSTANCE_CREATE_INFO,
            load_builtin_modules=1,
            load_extension_modules=1,
            extension_modules_path=folder.encode() if folder else None,
        )
        kinds = [_CPU_ONLY] if cpu_backend else [_HW_GPU_ONLY, _GPU_ONLY]
        params, _backends = _execution_params(kinds, device_id, threads)
        instance, decoder = ctypes.byref(self._instance), ctypes.byref(self._decoder)
        try:
            with _quiet_stderr(), _removed_after(folder if only is not None else None):
                status = lib.nvimgcodecInstanceCreate(instance, ctypes.byref(info))
                _check("nvimgcodecInstanceCreate", status)
                status = lib.nvimgcodecDecoderCreate(
                    self._instance, decoder, ctypes.byref(params), None
                )
                _check("nvimgcodecDecoderCreate", status)
        except NvImgCodecError as error:
            self.close()
            raise GpuDecoderUnavailable(
                f"nvImageCodec {version()} cannot decode on GPU {device_id}: {error}"
            ) from None
        self._decode_params = _new(_DecodeParams, _DECODE_PARAMS, apply_exif_orientation=1)
        #: Why each image of the last decode() call failed (None where it was decoded).
        self.last_failures: list[str | None] = []
        self._allocate: Callable[[int], int] | None = None
        self._free: Callable[[int], None] | None = None

    @property
    def backend(self) -> str:
        """Which backends decode: "gpu" (hardware engine, else CUDA) or "cpu" (tests)."""
        return "cpu" if self.cpu_backend else "gpu"

    def use_memory(self, allocate: Callable[[int], int], free: Callable[[int], None]) -> None:
        """Device memory for the outputs: allocate(nbytes) -> pointer, free(pointer), both
        ordered on the stream that decode() is given (GPU backends)."""
        self._allocate, self._free = allocate, free

    def share_instance(self) -> ctypes.c_void_p:
        """The decoder's library instance, for an encoder made on it (its nvJPEG start is paid
        once); the instance lives until the decoder and every such user released it."""
        with self._instance_lock:
            if not self._instance or self._instance_users == 0:
                raise GpuDecoderUnavailable("the nvImageCodec decoder was closed")
            self._instance_users += 1
            return self._instance

    def release_instance(self) -> None:
        """One user fewer of the instance; the last one destroys it (the GIL released)."""
        with self._instance_lock:
            if self._instance_users == 0:
                return
            self._instance_users -= 1
            if self._instance_users == 0 and self._instance:
                self._lib.nvimgcodecInstanceDestroy(self._instance)
                self._instance = ctypes.c_void_p()

    def close(self) -> None:
        """Destroys the decoder, and the instance unless an encoder still uses it."""
        if self._decoder:
            self._lib.nvimgcodecDecoderDestroy(self._decoder)
            self._decoder = ctypes.c_void_p()
        if not self._closed:  # the decoder's own share, once (a failed start's too)
            self._closed = True
            self.release_instance()

    def __del__(self) -> None:
        # Not while the interpreter shuts down: the CUDA context it decoded in may be gone by
        # then, and the process's exit frees everything anyway.
        if not sys.is_finalizing():
            self.close()

    def warm_up(self, cuda_stream: int = 0) -> None:
        """Decodes one small JPEG, so the backend's one-time set-up is paid before the first
        real batch. Never raises."""
        try:
            candidate = self.accept(warm_up_jpeg(), 1 << 20)
            if candidate is not None:
                for out in self.decode([candidate], cuda_stream):
                    self.release(out)
        except Exception:  # a warm-up is an optimisation only
            pass

    def accept(self, data: bytes, max_pixels: int) -> Candidate | None:
        """A Candidate when the GPU decodes this file like OpenCV would, else None (CPU):
        8-bit JPEG, 1 component (gray) or 3 (YCbCr, or RGB), at most `max_pixels` pixels.
        Never raises."""
        if not data.startswith(b"\xff\xd8\xff") or not jpeg_is_whole(data):
            return None
        lib, stream = self._lib, ctypes.c_void_p()
        status = lib.nvimgcodecCodeStreamCreateFromHostMem(
            self._instance, ctypes.byref(stream), data, len(data), None
        )
        if status != 0:
            return None
        candidate = Candidate(stream, data, 0, 0, False, self)  # destroys the stream if refused
        info = _new(_ImageInfo, _IMAGE_INFO)
        if lib.nvimgcodecCodeStreamGetImageInfo(stream, ctypes.byref(info)) != 0:
            return None
        if info.codec_name != b"jpeg" or info.num_planes < 1:
            return None
        planes = info.plane_info[: info.num_planes]
        channels = sum(plane.num_channels for plane in planes)
        if any(plane.sample_type != _UINT8 or plane.precision not in (0, 8) for plane in planes):
            return None
        width, height = planes[0].width, planes[0].height
        if not 0 < width * height <= max_pixels:
            return None
        if info.orientation.rotated in (90, 270):
            width, height = height, width
        candidate.width, candidate.height = width, height
        turn = info.orientation
        candidate.orientation = (turn.rotated, turn.flip_x, turn.flip_y)
        spec = info.color_spec
        if channels == 1 and spec in (_COLORSPEC_GRAY, _COLORSPEC_UNKNOWN):
            candidate.gray = True
            return candidate
        if channels == 3 and spec in (_COLORSPEC_SYCC, _COLORSPEC_SRGB):
            return candidate
        return None  # CMYK, YCCK, 2 or 4 components, other colour specs

    def decode(self, batch: Sequence[Candidate], cuda_stream: int = 0) -> list[Any]:
        """Decodes a batch, colour and gray images in one call each; one entry per candidate:
        the image (a DeviceImage that owns its device memory, or a numpy array with the CPU
        backend), or None (failed; `last_failures` says why).

        Colour images come back (H, W, 3) RGB, gray ones (H, W, 1), uint8, packed rows,
        ordered on `cuda_stream`. A failed image's memory is freed here (stream-ordered).
        The two kinds are never mixed in one call: nvJPEG's hardware decoder takes one output
        format per batch and fails the whole batch otherwise (status 0x3 for every image of
        it, as seen on an H100), as the Python module avoids by decoding them apart too.
        """
        return self.submit(batch, cuda_stream).result()

    def submit(self, batch: Sequence[Candidate], cuda_stream: int = 0) -> PendingDecode:
        """decode() in two halves: queues the batch's calls; the PendingDecode's result()
        waits for them and gives what decode() gives. nvimgcodecDecoderDecode itself returned
        only once its batch was decoded on an H100 host (0.42 ms a file in the call, 0.002 ms
        waiting for the future: scripts/decode_split_probe.py), so submitting the next batch
        before taking this one's result gained nothing there; the engine decodes one batch
        at a time."""
        parts: list[tuple[list[int], _Part]] = []
        try:
            for gray in (False, True):
                picked = [i for i, candidate in enumerate(batch) if candidate.gray == gray]
                if picked:
                    part = self._start_alike([batch[i] for i in picked], cuda_stream)
                    parts.append((picked, part))
        except Exception:  # the colour images' memory too, when the gray call failed
            for _, part in parts:
                self._abandon(part)
            raise
        return PendingDecode(self, len(batch), parts)

    def _start_alike(self, batch: Sequence[Candidate], cuda_stream: int) -> _Part:
        """One nvImageCodec call for candidates that are all colour or all gray, queued."""
        lib = self._lib
        outputs: list[Any] = []
        images = (ctypes.c_void_p * len(batch))()
        streams = (ctypes.c_void_p * len(batch))(*[c.stream.value for c in batch])
        part = _Part(outputs, images, None)
        try:
            for i, candidate in enumerate(batch):
                out, pointer = self._output(candidate)
                outputs.append(out)
                info = self._image_info(candidate, pointer, cuda_stream)
                image = ctypes.c_void_p()
                status = lib.nvimgcodecImageCreate(
                    self._instance, ctypes.byref(image), ctypes.byref(info)
                )
                _check("nvimgcodecImageCreate", status)
                images[i] = image.value
            part.future = self._submit(streams, images, len(batch))
        except Exception:
            self._abandon(part)
            raise
        return part

    def _finish_alike(self, part: _Part) -> tuple[list[Any], list[str | None]]:
        """Waits for one call; its images and failures (a failed image's memory freed)."""
        try:
            statuses = _processing_statuses(self._lib, part.future, len(part.outputs))
        except Exception:
            part.future = None  # destroyed by _processing_statuses
            self._abandon(part)
            raise
        part.future = None
        self._destroy_images(part)
        results: list[Any] = []
        failures: list[str | None] = []
        for out, status in zip(part.outputs, statuses, strict=True):
            if status == _PROCESSING_SUCCESS:
                results.append(out)
                failures.append(None)
            else:
                self.release(out)
                results.append(None)
                failures.append(processing_status_name(status))
        return results, failures

    def _abandon(self, part: _Part) -> None:
        """A call that will not be used: waits for it where it was queued (its outputs are
        being written), then frees its images and their memory."""
        if part.future is not None:
            with contextlib.suppress(Exception):
                _processing_statuses(self._lib, part.future, len(part.outputs))
            part.future = None
        self._destroy_images(part)
        for out in part.outputs:
            self.release(out)

    def _destroy_images(self, part: _Part) -> None:
        for k, image in enumerate(part.images):
            if image:
                self._lib.nvimgcodecImageDestroy(image)
                part.images[k] = None

    def release(self, out: Any) -> None:
        """Frees a decoded image's memory (device images; host arrays are garbage-collected)."""
        if out is not None and getattr(out, "owned", False) and self._free is not None:
            self._free(out.ptr)
            out.owned = False

    # ------------------------------------------------------------------ internals
    def _output(self, candidate: Candidate) -> tuple[Any, int]:
        """The output of one image: memory from use_memory() as a DeviceImage that owns it
        (host memory with the CPU backend: the tests' stand-in driver), else (CPU backend)
        a numpy array."""
        channels = 1 if candidate.gray else 3
        if self._allocate is None:
            if not self.cpu_backend:
                raise RuntimeError("CDecoder.decode on a GPU needs use_memory() first")
            import numpy as np

            array = np.empty((candidate.height, candidate.width, channels), np.uint8)
            return array, array.ctypes.data
        from ..engine.driver_stage import DeviceImage

        pitch = candidate.width * channels
        pointer = self._allocate(max(1, pitch * candidate.height))
        image = DeviceImage(pointer, candidate.width, candidate.height, channels, pitch, True)
        return image, pointer

    def _image_info(self, candidate: Candidate, pointer: int, cuda_stream: int) -> _ImageInfo:
        channels = 1 if candidate.gray else 3
        rotated, flip_x, flip_y = candidate.orientation
        # the stream's EXIF orientation, which apply_exif_orientation then applies
        turn = _new(_Orientation, _ORIENTATION, rotated=rotated, flip_x=flip_x, flip_y=flip_y)
        width, height = candidate.width, candidate.height
        return _packed_image_info(
            pointer, width, height, channels, width * channels, self.cpu_backend, cuda_stream,
            orientation=turn,
        )  # fmt: skip

    def _submit(self, streams: Any, images: Any, count: int) -> ctypes.c_void_p:
        """nvimgcodecDecoderDecode: the call's future (the decode runs on)."""
        lib, future = self._lib, ctypes.c_void_p()
        params = ctypes.byref(self._decode_params)
        status = lib.nvimgcodecDecoderDecode(
            self._decoder, streams, images, count, params, ctypes.byref(future)
        )
        _check("nvimgcodecDecoderDecode", status)
        return future


@dataclass
class _Part:
    """One queued nvImageCodec decode call: its outputs, image handles and future."""

    outputs: list[Any]
    images: Any
    future: ctypes.c_void_p | None


class PendingDecode:
    """A batch submitted to a CDecoder (CDecoder.submit); result() once."""

    def __init__(self, decoder: CDecoder, count: int, parts: list[tuple[list[int], _Part]]):
        self._decoder, self._count, self._parts = decoder, count, parts
        self.failures: list[str | None] = [None] * count

    def result(self) -> list[Any]:
        """Waits for the batch: one entry per candidate as CDecoder.decode gives (the
        decoder's last_failures and this object's failures say why an entry is None)."""
        results: list[Any] = [None] * self._count
        parts, self._parts = self._parts, []
        try:
            while parts:
                picked, part = parts[0]
                decoded, failures = self._decoder._finish_alike(part)
                parts.pop(0)
                for i, image, why in zip(picked, decoded, failures, strict=True):
                    results[i], self.failures[i] = image, why
        except Exception:  # the other calls' images are freed too
            for _, part in parts[1:] if parts else []:
                self._decoder._abandon(part)
            for out in results:
                self._decoder.release(out)
            raise
        self._decoder.last_failures = list(self.failures)
        return results

    def abandon(self) -> None:
        """The batch will not be used: waits for its calls and frees every image."""
        parts, self._parts = self._parts, []
        for _, part in parts:
            self._decoder._abandon(part)
