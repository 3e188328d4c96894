"""The CUDA driver API through ctypes: a device, streams, events, memory and imgops' own kernels.

The torch-free CUDA engine runs on this module alone (plus nvImageCodec for decoding): no torch,
no CUDA runtime, nothing to compile at run time. The kernels (csrc/device/engine_kernels.cu)
come prebuilt as imgops/_device_kernels.fatbin (setup.py builds it with the CUDA kernels) and
are loaded with cuModuleLoadData.

Every driver call checks its CUresult and raises CudaError with the driver's error name and
text and the call's name. Every public method first makes the device's primary context current
on the calling thread (a thread-local check when it already is), so a device thread can
allocate and launch while encode threads wait on events. ctypes drops the GIL during every
driver call, so waiting on an event or a stream never blocks other Python threads.

Objects are released by their close() methods (all idempotent; each class is also a context
manager); close the streams, events, buffers and kernels of a Device before the Device itself.
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import numpy

__all__ = [
    "CudaError",
    "Device",
    "DeviceArray",
    "Event",
    "Kernels",
    "PinnedBuffer",
    "Stream",
    "driver_available",
    "function_address",
    "kernels_path",
]

#: The file name of the packaged kernels (_build_support.DEVICE_KERNELS_NAME).
KERNELS_NAME = "_device_kernels.fatbin"
#: The shared-library names of the CUDA driver, tried in order (as gpu_decode does).
_LIBRARY_NAMES = ("libcuda.so.1", "libcuda.so", "nvcuda.dll")

# CUresult codes, flags and attributes used here (cuda.h).
CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_NOT_READY = 600
_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
_CU_STREAM_NON_BLOCKING = 0x1
_CU_EVENT_BLOCKING_SYNC = 0x1
_CU_EVENT_DISABLE_TIMING = 0x2
_CU_MEMHOSTALLOC_PORTABLE = 0x1
_CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES = 3
_CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4
# Codes that are not the driver's: no driver library, and a closed Device.
_NO_DRIVER = -1

# The block sizes the kernels are written for (png_filter_kernel.cuh's kRowThreads).
_PNG_ROW_THREADS = 256
_GRAY_THREADS = 256
_MAX_GRID_X = 0x7FFFFFFF
_MAX_GRID_Y = 65535
# png_deflate_kernels.cuh: its five kernels in launch order, and their block sizes
_DEFLATE_KERNELS = (
    "imgops_png_deflate_breaks",
    "imgops_png_deflate_sample",
    "imgops_png_deflate_count",
    "imgops_png_deflate_plan",
    "imgops_png_deflate_write",
)
_DEFLATE_SAMPLE_THREADS = 128
_DEFLATE_BLOCK_THREADS = 512

# Names and texts of common codes, for when the driver cannot be asked (no libcuda, or a code
# raised before it loaded); the driver's own cuGetErrorName/cuGetErrorString win otherwise.
_KNOWN_ERRORS: dict[int, tuple[str, str]] = {
    _NO_DRIVER: ("CUDA_DRIVER_NOT_FOUND", "the CUDA driver library (libcuda) could not be loaded"),
    0: ("CUDA_SUCCESS", "no error"),
    1: ("CUDA_ERROR_INVALID_VALUE", "invalid argument"),
    2: ("CUDA_ERROR_OUT_OF_MEMORY", "out of memory"),
    3: ("CUDA_ERROR_NOT_INITIALIZED", "initialization error"),
    4: ("CUDA_ERROR_DEINITIALIZED", "driver shutting down"),
    35: ("CUDA_ERROR_INSUFFICIENT_DRIVER", "CUDA driver is a stub library"),
    100: ("CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"),
    101: ("CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"),
    200: ("CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"),
    201: ("CUDA_ERROR_INVALID_CONTEXT", "invalid device context"),
    209: (
        "CUDA_ERROR_NO_BINARY_FOR_GPU",
        "no kernel image is available for execution on the device",
    ),
    218: ("CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"),
    222: (
        "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
        "the provided PTX was compiled with an unsupported toolchain.",
    ),
    400: ("CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"),
    500: ("CUDA_ERROR_NOT_FOUND", "named symbol not found"),
    600: ("CUDA_ERROR_NOT_READY", "device not ready"),
    700: ("CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"),
    701: ("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"),
    719: ("CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"),
    999: ("CUDA_ERROR_UNKNOWN", "unknown error"),
}


class CudaError(RuntimeError):
    """A CUDA driver call failed: str() is "NAME: text (call)", e.g.
    "CUDA_ERROR_OUT_OF_MEMORY: out of memory (cuMemAllocAsync)".

    code is the CUresult (-1: the driver library itself is missing), name its CUDA_ERROR_* name,
    call the driver function (or step) that failed.
    """

    code: int
    name: str
    call: str

    def __init__(self, code: int, call: str, name: str | None = None, text: str | None = None):
        if name is None or text is None:
            found_name, found_text = _describe(code)
            name = name if name is not None else found_name
            text = text if text is not None else found_text
        self.code = int(code)
        self.name = name
        self.call = call
        self.text = text
        super().__init__(f"{name}: {text} ({call})")

    def __reduce__(self):  # picklable (threads hand errors over through futures)
        return (type(self), (self.code, self.call, self.name, self.text))

    @property
    def out_of_memory(self) -> bool:
        """True for CUDA_ERROR_OUT_OF_MEMORY: the caller may free memory and try smaller."""
        return self.code == CUDA_ERROR_OUT_OF_MEMORY


def _describe(code: int) -> tuple[str, str]:
    """(name, text) of a CUresult: the driver's words when it is loaded, else a short table."""
    lib = _lib
    if lib is not None and code >= 0:
        name, text = ctypes.c_char_p(), ctypes.c_char_p()
        if (
            lib.cuGetErrorName(code, ctypes.byref(name)) == CUDA_SUCCESS
            and lib.cuGetErrorString(code, ctypes.byref(text)) == CUDA_SUCCESS
            and name.value
            and text.value
        ):
            return name.value.decode(errors="replace"), text.value.decode(errors="replace")
    return _KNOWN_ERRORS.get(code, (f"CUresult {code}", "unrecognized CUDA error code"))


def _check(result: int, call: str) -> None:
    """Raises CudaError unless `result` is CUDA_SUCCESS."""
    if result != CUDA_SUCCESS:
        raise CudaError(result, call)


# --- the library ---------------------------------------------------------------------------

_c_int_p = ctypes.POINTER(ctypes.c_int)
_c_size_p = ctypes.POINTER(ctypes.c_size_t)
_c_void_pp = ctypes.POINTER(ctypes.c_void_p)
_c_ull_p = ctypes.POINTER(ctypes.c_ulonglong)
_c_char_pp = ctypes.POINTER(ctypes.c_char_p)
_CUdeviceptr = ctypes.c_ulonglong

# name: argtypes (every function returns a CUresult, an int). Handles (CUcontext, CUstream,
# CUevent, CUmodule, CUfunction, CUmemoryPool) are c_void_p; device pointers c_ulonglong.
_PROTOTYPES: dict[str, list[Any]] = {
    "cuInit": [ctypes.c_uint],
    "cuGetErrorName": [ctypes.c_int, _c_char_pp],
    "cuGetErrorString": [ctypes.c_int, _c_char_pp],
    "cuDeviceGetCount": [_c_int_p],
    "cuDeviceGet": [_c_int_p, ctypes.c_int],
    "cuDeviceGetName": [ctypes.c_char_p, ctypes.c_int, ctypes.c_int],
    "cuDeviceTotalMem_v2": [_c_size_p, ctypes.c_int],
    "cuDeviceGetAttribute": [_c_int_p, ctypes.c_int, ctypes.c_int],
    "cuDevicePrimaryCtxRetain": [_c_void_pp, ctypes.c_int],
    "cuDevicePrimaryCtxRelease_v2": [ctypes.c_int],
    "cuCtxSetCurrent": [ctypes.c_void_p],
    "cuMemGetInfo_v2": [_c_size_p, _c_size_p],
    "cuStreamCreate": [_c_void_pp, ctypes.c_uint],
    "cuStreamSynchronize": [ctypes.c_void_p],
    "cuStreamDestroy_v2": [ctypes.c_void_p],
    "cuStreamWaitEvent": [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint],
    "cuEventCreate": [_c_void_pp, ctypes.c_uint],
    "cuEventRecord": [ctypes.c_void_p, ctypes.c_void_p],
    "cuEventSynchronize": [ctypes.c_void_p],
    "cuEventQuery": [ctypes.c_void_p],
    "cuEventDestroy_v2": [ctypes.c_void_p],
    "cuDeviceGetDefaultMemPool": [_c_void_pp, ctypes.c_int],
    "cuMemPoolSetAttribute": [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p],
    "cuMemPoolTrimTo": [ctypes.c_void_p, ctypes.c_size_t],
    "cuMemAllocAsync": [_c_ull_p, ctypes.c_size_t, ctypes.c_void_p],
    "cuMemFreeAsync": [_CUdeviceptr, ctypes.c_void_p],
    "cuMemHostAlloc": [_c_void_pp, ctypes.c_size_t, ctypes.c_uint],
    "cuMemFreeHost": [ctypes.c_void_p],
    "cuMemcpyDtoHAsync_v2": [ctypes.c_void_p, _CUdeviceptr, ctypes.c_size_t, ctypes.c_void_p],
    "cuMemcpyHtoDAsync_v2": [_CUdeviceptr, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p],
    "cuMemsetD8Async": [_CUdeviceptr, ctypes.c_ubyte, ctypes.c_size_t, ctypes.c_void_p],
    "cuModuleLoadData": [_c_void_pp, ctypes.c_void_p],
    "cuModuleGetFunction": [_c_void_pp, ctypes.c_void_p, ctypes.c_char_p],
    "cuModuleUnload": [ctypes.c_void_p],
    "cuLaunchKernel": [
        ctypes.c_void_p,  # CUfunction
        ctypes.c_uint,  # grid x, y, z
        ctypes.c_uint,
        ctypes.c_uint,
        ctypes.c_uint,  # block x, y, z
        ctypes.c_uint,
        ctypes.c_uint,
        ctypes.c_uint,  # dynamic shared memory bytes
        ctypes.c_void_p,  # CUstream
        _c_void_pp,  # kernel parameters
        _c_void_pp,  # extra
    ],
}

#: Calls that only queue work or book-keep (microseconds, never waiting for the GPU): made
#: holding the GIL (ctypes.PyDLL). A ctypes call through CDLL releases the GIL and must win it
#: back after; with 16 prep and 16 encode threads wanting it, the device thread waited up to
#: the switch interval (5 ms) after every launch and allocation (py-spy --native on the H100
#: host, 3200 photos: most of its time in take_gil's pthread_cond_timedwait). Waits (stream
#: and event synchronization), pinned allocations and module loads still release it.
#: IMGOPS_DRIVER_GIL=release releases it around every call (comparisons).
_QUICK_CALLS = (
    "cuCtxSetCurrent",
    "cuLaunchKernel",
    "cuMemAllocAsync",
    "cuMemFreeAsync",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemsetD8Async",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventDestroy_v2",
    "cuStreamWaitEvent",
    "cuMemGetInfo_v2",
    "cuGetErrorName",
    "cuGetErrorString",
)

_lib: ctypes.CDLL | None = None
_lib_lock = threading.Lock()


def _hold_gil_in_quick_calls(lib: ctypes.CDLL) -> None:
    """Rebinds lib's _QUICK_CALLS to foreign functions that keep the GIL (same library
    handle, same prototypes), unless IMGOPS_DRIVER_GIL=release."""
    if os.environ.get("IMGOPS_DRIVER_GIL", "hold") == "release":
        return
    holding = ctypes.PyDLL(lib._name, handle=lib._handle)
    for name in _QUICK_CALLS:
        released = getattr(lib, name)
        held = getattr(holding, name)
        held.argtypes, held.restype = released.argtypes, released.restype
        setattr(lib, name, held)


def _driver() -> ctypes.CDLL:
    """libcuda with every prototype declared, loaded once; CudaError (code -1) without it."""
    global _lib
    lib = _lib
    if lib is not None:
        return lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        problems = []
        for name in _LIBRARY_NAMES:
            try:
                lib = ctypes.CDLL(name)
            except OSError as error:
                problems.append(str(error))
                continue
            try:
                for function, argtypes in _PROTOTYPES.items():
                    entry = getattr(lib, function)
                    entry.argtypes = argtypes
                    entry.restype = ctypes.c_int
            except AttributeError as error:  # a driver older than cuMemAllocAsync (11.2)
                raise CudaError(_NO_DRIVER, "dlsym", text=f"{name} is too old: {error}") from None
            _hold_gil_in_quick_calls(lib)
            _lib = lib
            return lib
        raise CudaError(
            _NO_DRIVER,
            "dlopen",
            text="the CUDA driver library could not be loaded: " + "; ".join(problems),
        )


def _call(function: str, *args: Any) -> None:
    """Calls a driver function and raises CudaError naming it unless it succeeded."""
    _check(getattr(_driver(), function)(*args), function)


def function_address(name: str) -> int:
    """The address of the loaded driver's function `name` (one of the declared prototypes),
    for native code that calls the driver itself (imgops.engine.native_batch)."""
    if name not in _PROTOTYPES:
        raise ValueError(f"{name} is not a declared driver function")
    address = ctypes.cast(getattr(_driver(), name), ctypes.c_void_p).value
    if not address:
        raise CudaError(500, name, text=f"{name} has no address")
    return int(address)


def driver_available() -> bool:
    """True when libcuda loads, cuInit(0) succeeds and it sees at least one GPU; never raises."""
    try:
        lib = _driver()
        count = ctypes.c_int(0)
        if lib.cuInit(0) != CUDA_SUCCESS:
            return False
        if lib.cuDeviceGetCount(ctypes.byref(count)) != CUDA_SUCCESS:
            return False
        return count.value >= 1
    except Exception:
        return False


def kernels_path() -> Path | None:
    """The packaged kernels (imgops/_device_kernels.fatbin, beside imgops/__init__.py), or None
    when this build has none (built without CUDA, or from a source tree never built)."""
    path = Path(__file__).resolve().parent.parent / KERNELS_NAME
    return path if path.is_file() else None


# --- the device ------------------------------------------------------------------------------

_current = threading.local()  # .token: the Device whose context is current on this thread


class Device:
    """One GPU's primary context (the context the CUDA runtime, torch and nvImageCodec share).

    Creating it initializes the driver, retains the primary context and makes it current on the
    calling thread; its default memory pool keeps freed memory for reuse (release threshold set
    to the maximum), so cuMemAllocAsync after cuMemFreeAsync costs no system call.
    """

    index: int
    name: str
    total_memory: int
    multiprocessors: int

    def __init__(self, index: int = 0) -> None:
        lib = _driver()
        _call("cuInit", 0)
        device = ctypes.c_int(0)
        _call("cuDeviceGet", ctypes.byref(device), int(index))
        self.index = int(index)
        self._device = device.value
        self._lock = threading.Lock()
        self._closed = False
        self._token = object()
        context = ctypes.c_void_p()
        _call("cuDevicePrimaryCtxRetain", ctypes.byref(context), self._device)
        self._context = context
        try:
            self.make_current()
            raw = ctypes.create_string_buffer(256)
            _call("cuDeviceGetName", raw, len(raw), self._device)
            self.name = raw.value.decode(errors="replace")
            total = ctypes.c_size_t(0)
            _call("cuDeviceTotalMem_v2", ctypes.byref(total), self._device)
            self.total_memory = total.value
            sms = ctypes.c_int(0)
            _call(
                "cuDeviceGetAttribute",
                ctypes.byref(sms),
                _CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                self._device,
            )
            self.multiprocessors = max(1, sms.value)
            pool = ctypes.c_void_p()
            _call("cuDeviceGetDefaultMemPool", ctypes.byref(pool), self._device)
            self._pool = pool
            threshold = ctypes.c_ulonglong(0xFFFFFFFFFFFFFFFF)
            _call(
                "cuMemPoolSetAttribute",
                pool,
                _CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                ctypes.byref(threshold),
            )
        except BaseException:
            lib.cuDevicePrimaryCtxRelease_v2(self._device)
            self._closed = True
            raise

    def __repr__(self) -> str:
        return f"Device({self.index}, {self.name!r})"

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def make_current(self) -> None:
        """Makes the primary context current on the calling thread (cuCtxSetCurrent); a
        thread-local check only when this Device already made it current here."""
        if self._closed:
            raise CudaError(201, "make_current", text="the Device is closed")
        if getattr(_current, "token", None) is self._token:
            return
        _call("cuCtxSetCurrent", self._context)
        _current.token = self._token

    def mem_info(self) -> tuple[int, int]:
        """(free, total) bytes of device memory (memory cached in the pool counts as used)."""
        self.make_current()
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        _call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        return free.value, total.value

    def stream(self) -> Stream:
        """A new stream that does not synchronize with the legacy default stream."""
        self.make_current()
        handle = ctypes.c_void_p()
        _call("cuStreamCreate", ctypes.byref(handle), _CU_STREAM_NON_BLOCKING)
        return Stream(self, handle.value)

    def event(self, stream: Stream, *, blocking: bool = True) -> Event:
        """An event (timing disabled) recorded on `stream` now: done once the work queued on
        the stream so far is. blocking (the default): Event.synchronize sleeps instead of
        spinning a CPU core (the encode threads need their cores)."""
        self.make_current()
        handle = ctypes.c_void_p()
        flags = _CU_EVENT_DISABLE_TIMING | (_CU_EVENT_BLOCKING_SYNC if blocking else 0)
        _call("cuEventCreate", ctypes.byref(handle), flags)
        event = Event(self, handle.value)
        try:
            _call("cuEventRecord", ctypes.c_void_p(event._handle), ctypes.c_void_p(stream.handle))
        except BaseException:
            event.close()
            raise
        return event

    def alloc(self, nbytes: int, stream: Stream) -> int:
        """nbytes of device memory from the default pool, ordered on `stream`
        (cuMemAllocAsync); 0 for nbytes 0. CudaError (out_of_memory) when it does not fit."""
        if nbytes < 0:
            raise ValueError(f"cannot allocate {nbytes} bytes")
        if nbytes == 0:
            return 0
        self.make_current()
        ptr = ctypes.c_ulonglong(0)
        _call("cuMemAllocAsync", ctypes.byref(ptr), nbytes, ctypes.c_void_p(stream.handle))
        return ptr.value

    def free(self, ptr: int, stream: Stream) -> None:
        """Returns memory from alloc() to the pool once `stream` reaches this point
        (cuMemFreeAsync); 0 is ignored."""
        if not ptr:
            return
        self.make_current()
        _call("cuMemFreeAsync", _CUdeviceptr(ptr), ctypes.c_void_p(stream.handle))

    def pool_internal_dependencies(self, allowed: bool) -> None:
        """Whether the default pool may hand an allocation on one stream memory freed on
        another by making the first wait for the second (CUDA's default: yes). Off, streams
        that allocate and free apart (a decode stream, the stage's) never wait for each
        other through the pool; it grows instead, and reuses memory whose free is done."""
        self.make_current()
        value = ctypes.c_int(1 if allowed else 0)
        _call(
            "cuMemPoolSetAttribute",
            self._pool,
            _CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
            ctypes.byref(value),
        )

    def trim_pool(self, keep: int = 0) -> None:
        """Gives memory the pool holds unused back to the system, keeping at least `keep`
        bytes reserved (cuMemPoolTrimTo)."""
        self.make_current()
        _call("cuMemPoolTrimTo", self._pool, keep)

    def pinned(self, nbytes: int) -> PinnedBuffer:
        """nbytes of page-locked host memory usable from every context (cuMemHostAlloc,
        portable): the fast target of copy_to_host and source of copy_to_device."""
        if nbytes < 0:
            raise ValueError(f"cannot allocate {nbytes} bytes")
        self.make_current()
        ptr = ctypes.c_void_p()
        if nbytes:
            _call("cuMemHostAlloc", ctypes.byref(ptr), nbytes, _CU_MEMHOSTALLOC_PORTABLE)
        return PinnedBuffer(self, ptr.value or 0, nbytes)

    def copy_to_host(self, dst: int, src: int, nbytes: int, stream: Stream) -> None:
        """Queues a copy of nbytes from device address src to host address dst on `stream`
        (cuMemcpyDtoHAsync; asynchronous only into pinned memory). The call keeps the GIL
        (_QUICK_CALLS): into pageable memory it would hold it for the whole copy."""
        if nbytes <= 0:
            return
        self.make_current()
        _call(
            "cuMemcpyDtoHAsync_v2",
            ctypes.c_void_p(dst),
            _CUdeviceptr(src),
            nbytes,
            ctypes.c_void_p(stream.handle),
        )

    def memset(self, dst: int, value: int, nbytes: int, stream: Stream) -> None:
        """Queues setting nbytes at device address dst to the byte `value` on `stream`
        (cuMemsetD8Async)."""
        if nbytes <= 0:
            return
        self.make_current()
        _call(
            "cuMemsetD8Async",
            _CUdeviceptr(dst),
            ctypes.c_ubyte(value),
            nbytes,
            ctypes.c_void_p(stream.handle),
        )

    def copy_to_device(self, dst: int, src: int, nbytes: int, stream: Stream) -> None:
        """Queues a copy of nbytes from host address src to device address dst on `stream`
        (cuMemcpyHtoDAsync; asynchronous only from pinned memory). The call keeps the GIL
        (_QUICK_CALLS): from pageable memory it would hold it for the whole copy."""
        if nbytes <= 0:
            return
        self.make_current()
        _call(
            "cuMemcpyHtoDAsync_v2",
            _CUdeviceptr(dst),
            ctypes.c_void_p(src),
            nbytes,
            ctypes.c_void_p(stream.handle),
        )

    def close(self) -> None:
        """Releases the primary context (idempotent). Close this device's streams, events,
        buffers and kernels first: the context may be destroyed with everything in it."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if getattr(_current, "token", None) is self._token:
            _current.token = None
        _call("cuDevicePrimaryCtxRelease_v2", self._device)


class _Resource:
    """A driver object of one Device, closed once (thread-safe, idempotent)."""

    def __init__(self, device: Device) -> None:
        self._owner = device
        self._close_lock = threading.Lock()
        self._closed = False

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _claim_close(self) -> bool:
        """True for the one caller that must release the object."""
        with self._close_lock:
            if self._closed:
                return False
            self._closed = True
            return True

    def close(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


class Stream(_Resource):
    """A CUDA stream (created non-blocking). handle: the CUstream as an int (never 0), what
    nvImageCodec takes as cuda_stream."""

    handle: int

    def __init__(self, device: Device, handle: int) -> None:
        super().__init__(device)
        self.handle = int(handle)

    def __repr__(self) -> str:
        return f"Stream(0x{self.handle:x})"

    def synchronize(self) -> None:
        """Waits (without the GIL) until everything queued on the stream is done."""
        self._owner.make_current()
        _call("cuStreamSynchronize", ctypes.c_void_p(self.handle))

    def wait(self, event: Event) -> None:
        """Work queued on this stream from now on waits until `event` (as recorded now) is
        done (cuStreamWaitEvent); the host does not wait."""
        self._owner.make_current()
        _call("cuStreamWaitEvent", ctypes.c_void_p(self.handle), ctypes.c_void_p(event._handle), 0)

    def close(self) -> None:
        """Destroys the stream (idempotent); work already queued still completes."""
        if self._claim_close():
            self._owner.make_current()
            _call("cuStreamDestroy_v2", ctypes.c_void_p(self.handle))


class Event(_Resource):
    """An event recorded on a stream (Device.event)."""

    def __init__(self, device: Device, handle: int) -> None:
        super().__init__(device)
        self._handle = int(handle)

    def synchronize(self) -> None:
        """Waits until the work before the event is done; ctypes releases the GIL meanwhile."""
        self._owner.make_current()
        _call("cuEventSynchronize", ctypes.c_void_p(self._handle))

    def done(self) -> bool:
        """Whether the work before the event is done, without waiting (cuEventQuery)."""
        self._owner.make_current()
        result = _driver().cuEventQuery(ctypes.c_void_p(self._handle))
        if result == CUDA_ERROR_NOT_READY:
            return False
        _check(result, "cuEventQuery")
        return True

    def close(self) -> None:
        """Destroys the event (idempotent; safe while work before it is still running)."""
        if self._claim_close():
            self._owner.make_current()
            _call("cuEventDestroy_v2", ctypes.c_void_p(self._handle))


class PinnedBuffer(_Resource):
    """Page-locked host memory (Device.pinned): ptr, its address (0 when nbytes is 0), nbytes."""

    ptr: int
    nbytes: int

    def __init__(self, device: Device, ptr: int, nbytes: int) -> None:
        super().__init__(device)
        self.ptr = int(ptr)
        self.nbytes = int(nbytes)

    def __repr__(self) -> str:
        return f"PinnedBuffer(0x{self.ptr:x}, {self.nbytes})"

    def array(self) -> numpy.ndarray:
        """A flat uint8 numpy view of all nbytes (no copy); valid until close()."""
        import numpy as np

        if self._closed:
            raise ValueError("the pinned buffer is closed")
        if self.nbytes == 0:
            return np.empty(0, np.uint8)
        raw = (ctypes.c_uint8 * self.nbytes).from_address(self.ptr)
        return np.frombuffer(raw, dtype=np.uint8)

    def close(self) -> None:
        """Frees the memory (idempotent); no view from array() may be used after."""
        if self._claim_close() and self.ptr:
            self._owner.make_current()
            _call("cuMemFreeHost", ctypes.c_void_p(self.ptr))


class DeviceArray:
    """A view of device memory for libraries that take __cuda_array_interface__ (version 3),
    such as nvImageCodec's encoder. It owns nothing: the memory must outlive its use.

    shape in items, strides in bytes (None: C-contiguous), typestr a numpy type string
    ("|u1"), stream the CUstream the data is ordered on (None: the consumer need not wait;
    0 is not allowed by the protocol).
    """

    def __init__(
        self,
        ptr: int,
        shape: tuple[int, ...],
        strides: tuple[int, ...] | None,
        typestr: str = "|u1",
        stream: int | None = None,
    ) -> None:
        if strides is not None and len(strides) != len(shape):
            raise ValueError(f"strides {strides} do not match shape {shape}")
        if stream == 0:
            raise ValueError("stream 0 is ambiguous in __cuda_array_interface__: use 1 or None")
        self.ptr = int(ptr)
        self.shape = tuple(int(s) for s in shape)
        self.strides = None if strides is None else tuple(int(s) for s in strides)
        self.typestr = typestr
        self.stream = stream

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """The CUDA Array Interface (version 3) dictionary of this view."""
        interface: dict[str, Any] = {
            "shape": self.shape,
            "typestr": self.typestr,
            "data": (self.ptr, False),
            "strides": self.strides,
            "version": 3,
        }
        if self.stream is not None:
            interface["stream"] = int(self.stream)
        return interface


class DeflateLayout(NamedTuple):
    """One image's deflate workspace (imgops._cli_kernels.png_deflate_layout(row, height)):
    total bytes, where the zlib stream lands and its room, where its uint64 length lands, and
    the count of deflate blocks."""

    total: int
    out: int
    out_bytes: int
    size: int
    blocks: int


class Kernels:
    """imgops' device kernels (the packaged fatbin) loaded into a Device's context once.

    Launches are asynchronous on the given stream; each checks cuLaunchKernel's result.
    Pointers are device addresses (ints), pitches byte distances between row starts.
    """

    def __init__(self, device: Device, path: Path | None = None) -> None:
        path = path if path is not None else kernels_path()
        if path is None:
            raise FileNotFoundError(
                f"imgops was built without its device kernels ({KERNELS_NAME}): rebuild with "
                "the CUDA kernels (FORCE_CUDA=1)"
            )
        image = ctypes.create_string_buffer(Path(path).read_bytes())
        self._device = device
        device.make_current()
        module = ctypes.c_void_p()
        _call("cuModuleLoadData", ctypes.byref(module), image)
        self._module = module
        self._closed = False
        self._lock = threading.Lock()
        try:
            self._gray = self._function(b"imgops_gray_u8")
            self._png_filter = self._function(b"imgops_png_filter_u8")
            self._deflate = [self._function(name.encode()) for name in _DEFLATE_KERNELS]
        except BaseException:
            self.close()
            raise
        self.path = Path(path)

    def __enter__(self) -> Kernels:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _function(self, name: bytes) -> ctypes.c_void_p:
        function = ctypes.c_void_p()
        try:
            _call("cuModuleGetFunction", ctypes.byref(function), self._module, name)
        except CudaError as error:
            raise CudaError(
                error.code, f"cuModuleGetFunction {name.decode()}", error.name, error.text
            ) from None
        return function

    def _launch(
        self,
        function: ctypes.c_void_p,
        name: str,
        grid: tuple[int, int],
        block: int,
        stream: Stream,
        params: list[Any],
    ) -> None:
        if self._closed:
            raise CudaError(400, f"cuLaunchKernel {name}", text="the kernels are closed")
        self._device.make_current()
        pointers = (ctypes.c_void_p * len(params))(
            *[ctypes.cast(ctypes.byref(p), ctypes.c_void_p) for p in params]
        )
        result = _driver().cuLaunchKernel(
            function,
            grid[0],
            grid[1],
            1,
            block,
            1,
            1,
            0,
            ctypes.c_void_p(stream.handle),
            ctypes.cast(pointers, _c_void_pp),
            None,
        )
        _check(result, f"cuLaunchKernel {name}")

    def gray_u8(
        self,
        src: int,
        src_pitch: int,
        dst: int,
        dst_pitch: int,
        width: int,
        height: int,
        bgr: bool,
        stream: Stream,
    ) -> None:
        """Gray rows at dst (dst_pitch bytes apart) from interleaved 3-channel uint8 rows at src
        (src_pitch bytes apart; RGB, or BGR when bgr): (299 R + 587 G + 114 B + 500) // 1000."""
        if width < 0 or height < 0:
            raise ValueError(f"bad image size {width}x{height}")
        if src_pitch < 3 * width or dst_pitch < width:
            raise ValueError(
                f"pitches {src_pitch} (source) and {dst_pitch} (gray) are too small for "
                f"{width} pixels"
            )
        if width == 0 or height == 0:
            return
        # One thread per pixel across (blocks no wider than the row), one block row per image
        # row up to the grid's limit; the kernel's grid-stride loops cover the rest.
        threads = min(_GRAY_THREADS, (width + 31) // 32 * 32)
        grid_x = min((width + threads - 1) // threads, _MAX_GRID_X)
        grid_y = min(height, _MAX_GRID_Y)
        params = [
            ctypes.c_uint64(src),
            ctypes.c_longlong(src_pitch),
            ctypes.c_uint64(dst),
            ctypes.c_longlong(dst_pitch),
            ctypes.c_longlong(width),
            ctypes.c_longlong(height),
            ctypes.c_int(1 if bgr else 0),
        ]
        self._launch(self._gray, "imgops_gray_u8", (grid_x, grid_y), threads, stream, params)

    def png_filter_u8(
        self,
        src: int,
        src_pitch: int,
        row_bytes: int,
        height: int,
        bpp: int,
        filter: int,
        dst: int,
        stream: Stream,
    ) -> None:
        """PNG-filtered rows at dst: height rows of row_bytes + 1 bytes (the filter type, then
        the residuals), contiguous, from the uint8 rows at src (src_pitch bytes apart). filter
        0..4 for that filter on every row, -1 for the adaptive choice per row (the torch op
        png_filter's rule, byte for byte); bpp: bytes per complete pixel, 1..8."""
        if not -1 <= filter <= 4:
            raise ValueError(f"filter must be -1..4, not {filter}")
        if not 1 <= bpp <= 8:
            raise ValueError(f"bpp must be 1..8, not {bpp}")
        if row_bytes < 0 or height < 0 or src_pitch < row_bytes:
            raise ValueError(f"bad rows: {height} of {row_bytes} bytes, {src_pitch} bytes apart")
        if height == 0:
            return
        blocks = min(height, self._device.multiprocessors * 16)
        params = [
            ctypes.c_uint64(src),
            ctypes.c_longlong(src_pitch),
            ctypes.c_longlong(row_bytes),
            ctypes.c_longlong(height),
            ctypes.c_int(bpp),
            ctypes.c_int(filter),
            ctypes.c_uint64(dst),
        ]
        self._launch(
            self._png_filter, "imgops_png_filter_u8", (blocks, 1), _PNG_ROW_THREADS, stream, params
        )

    def png_deflate(
        self,
        rows: int,
        row: int,
        height: int,
        workspace: int,
        layout: DeflateLayout,
        stream: Stream,
    ) -> None:
        """The zlib stream of height PNG-filtered rows of `row` bytes (the filter byte included;
        contiguous at rows), exactly the bytes of the CPU encoder's deflate (imgops._cli_kernels
        png_encode_filtered), written into the workspace at `workspace`: layout.total bytes from
        imgops._cli_kernels.png_deflate_layout(row, height), zeroed here. The stream lands at
        workspace + layout.out, its length (a uint64) at workspace + layout.size."""
        if row < 1 or height < 1:
            raise ValueError(f"bad rows: {height} of {row} bytes")
        self._device.memset(workspace, 0, layout.total, stream)
        params = [
            ctypes.c_uint64(rows),
            ctypes.c_longlong(row),
            ctypes.c_longlong(height),
            ctypes.c_uint64(workspace),
        ]
        for function, name, (grid, block) in zip(
            self._deflate, _DEFLATE_KERNELS, self.deflate_shapes(height, layout), strict=True
        ):
            self._launch(function, name, (grid, 1), block, stream, params)

    def native_handles(self) -> list[int]:
        """The CUfunction handles of the gray kernel, the PNG filter and the five deflate
        kernels, for native code that launches them (imgops.engine.native_batch)."""
        if self._closed:
            raise CudaError(400, "native_handles", text="the kernels are closed")
        functions = [self._gray, self._png_filter, *self._deflate]
        return [int(f.value or 0) for f in functions]

    def deflate_shapes(self, height: int, layout: DeflateLayout) -> list[tuple[int, int]]:
        """(grid, threads) of each deflate kernel, in launch order: the kernels loop
        grid-stride, one thread block per deflate block, per sampled row (at most height / 4
        plus a stripe's remainder each), and one thread for the plan."""
        most = self._device.multiprocessors * 16
        blocks = min(layout.blocks, most)
        sampled = min(height // 4 + 9, most)
        return [
            (blocks, _DEFLATE_BLOCK_THREADS),
            (sampled, _DEFLATE_SAMPLE_THREADS),
            (blocks, _DEFLATE_BLOCK_THREADS),
            (1, 1),
            (blocks, _DEFLATE_BLOCK_THREADS),
        ]

    def close(self) -> None:
        """Unloads the module (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._device.make_current()
        _call("cuModuleUnload", self._module)
