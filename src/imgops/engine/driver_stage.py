"""The torch-free CUDA engine's device stage: the CUDA driver's context and stream, imgops'
fatbin kernels and nvImageCodec's decoder, started in a background thread (DriverStage), and
the device images the engine passes between them (DeviceImage).

This module imports no numpy, torch or nvImageCodec at import time, so the command line can
start a stage (`prestart`) before it plans the batch and imports OpenCV: the context and the
decoder's warm-up (about 0.8 s on the H200 host, the GIL released) then overlap that work.
"""

from __future__ import annotations

import ctypes
import os
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

_prestarted: dict[int, DriverStage] = {}
_prestart_lock = threading.Lock()
_kept: list[Any] = []
_warm = False  # keep_warm(): a kept stage goes back for the next batch (imgops serve)


@dataclass
class DeviceImage:
    """An 8-bit image in device memory: `height` rows of `width * channels` bytes, `pitch`
    bytes apart. `owned`: allocated by the stage (freed after the batch's copies)."""

    ptr: int
    width: int
    height: int
    channels: int
    pitch: int
    owned: bool = False

    @property
    def row_bytes(self) -> int:
        """Bytes of pixels in one row."""
        return self.width * self.channels

    @property
    def shape(self) -> tuple[int, ...]:
        """(H, W) for gray, (H, W, C) otherwise."""
        if self.channels == 1:
            return (self.height, self.width)
        return (self.height, self.width, self.channels)


def device_image(image: Any) -> DeviceImage:
    """A DeviceImage viewing a decoded image without a copy: an nvImageCodec image in device
    memory (`__cuda_array_interface__`), or any host array (`__array_interface__`: the tests'
    stand-in decoder). uint8, (H, W), (H, W, 1) or interleaved (H, W, C), rows may be pitched."""
    if isinstance(image, DeviceImage):  # imgops.io.nvimgcodec_c decodes into these
        return image
    try:
        face = image.__cuda_array_interface__
    except (AttributeError, RuntimeError):  # a host image
        import numpy as np

        face = np.asarray(image).__array_interface__
    shape = tuple(face["shape"])
    if face.get("typestr") not in ("|u1", "<u1") or len(shape) not in (2, 3):
        raise ValueError(f"unexpected decoded image {face.get('typestr')} {shape}")
    height, width = shape[0], shape[1]
    channels = shape[2] if len(shape) == 3 else 1
    strides = face.get("strides")
    pitch = strides[0] if strides else width * channels
    if strides and len(shape) == 3 and (strides[1] != channels or strides[2] != 1):
        raise ValueError(f"decoded image is not interleaved: strides {strides}")
    if strides and len(shape) == 2 and strides[1] != 1:
        raise ValueError(f"decoded image is not interleaved: strides {strides}")
    return DeviceImage(int(face["data"][0]), width, height, channels, pitch)


class DriverStage:
    """The device, a stream, the fatbin kernels and (optionally) the GPU decoder, started in a
    background thread; `future` completes when all of them are ready."""

    cuda = True

    def __init__(self, index: int, decoder_factory: Any = None, *, release: bool = True) -> None:
        self.index = index
        self.release = release
        self._decoder_factory = decoder_factory
        self.decoder: Any = None
        self.decoder_problem: str | None = None
        self._side: list[Any] = []  # side_streams()
        #: What a warm stage keeps between batches (imgops.engine.driver): the pinned host
        #: buffers, and nvImageCodec's JPEG encoders on its decoder's instance, by quality.
        self.pinned_pool: Any = None
        self.jpeg_encoders: dict[int, Any] = {}
        #: The native driver calls bound to this stage (imgops.engine.native_batch), made once.
        self.native_calls: Any = None
        self.future: Future[DriverStage] = Future()
        threading.Thread(target=self._start, name="imgops-cuda-start", daemon=True).start()

    def _start(self) -> None:
        try:
            decoder: Future[Any] | None = None
            if self._decoder_factory is not None and parallel_start():
                decoder = Future()  # nvImageCodec's instance starts beside the context
                threading.Thread(
                    target=_fill, args=(decoder, self._decoder_factory), name="imgops-gpu-decoder"
                ).start()
            from . import cuda_driver

            self.device = cuda_driver.Device(self.index)
            self.stream = self.device.stream()
            # nvImageCodec decodes on a stream of its own, which the stage's stream waits for
            # through an event recorded after each decode call, into memory allocated on that
            # stream from a pool whose cross-stream waits are off. nvJPEG's hardware engine
            # writes a batched decode's outputs when the call is made, not in the order of the
            # stream it is given, and a device-side wait does not hold it back either (nvJPEG
            # 12.3-13.2 on H100: torchcodec PR 1634; tests/decode_order.py probes it here). On
            # the stage's stream, where the previous batch's kernels, deflates and copies were
            # still queued, a decode was handed memory freed there in stream order and wrote
            # it before that work had read it: wrong pixels and unreadable PNGs in 5 of 60
            # commands of 800 photos on H100 hosts (docs/GPU.md, "The decode stream"). Here a
            # decode only gets memory whose last use is over: memory freed on another stream
            # is reused once that free has run, and only decodes are queued on this stream.
            self.decode_stream = self.device.stream()
            self.device.pool_internal_dependencies(False)
            self.kernels = cuda_driver.Kernels(self.device)
            if self._decoder_factory is not None:
                from ..io.gpu_decode import GpuDecoderUnavailable

                try:
                    made = decoder.result() if decoder is not None else self._decoder_factory()
                    self.decoder = made
                except GpuDecoderUnavailable as error:  # decoder "auto": the CPU decodes
                    self.decoder_problem = str(error)
                if self.decoder is not None:
                    self.bind(self.decoder)
                    self.decoder.warm_up(self.decode_stream.handle)
                    self.decode_stream.synchronize()
        except BaseException as error:
            self.future.set_exception(error)
        else:
            self.future.set_result(self)

    def bind(self, decoder: Any) -> None:
        """Gives a decoder that decodes into memory of ours (imgops.io.nvimgcodec_c) the
        stage's device memory, ordered on the decode stream; other decoders are left as they
        are."""
        if hasattr(decoder, "use_memory"):
            decoder.use_memory(
                lambda nbytes: self.device.alloc(nbytes, self.decode_stream),
                lambda pointer: self.device.free(pointer, self.decode_stream),
            )

    def close(self, timeout: float = 60.0) -> None:
        """Waits for the start (at most `timeout`), drains the stream, then releases the
        decoder, the stream and the context, so no native thread outlives the batch.

        A stage made with `release=False` (prestart's) is drained but kept: in a process that
        keeps stages warm (keep_warm, `imgops serve`) it goes back for the next batch on its
        GPU; otherwise (the command line, whose process exits right after the batch) it is kept
        to the exit: destroying nvImageCodec's decoder holds the GIL for ~0.3 s on the H200
        host, and the driver reclaims all of it when the process exits. A stage whose stream
        fails to drain raises that error and is never reused.
        """
        try:
            self.future.result(timeout)
        except BaseException:  # it never started (that error was reported), or still is
            return
        try:
            self.synchronize()
        except Exception:  # a failed context (e.g. an illegal address): reported, never reused
            if not self.release:
                _keep_until_exit(self)
            raise
        if not self.release:
            if _warm:
                with _prestart_lock:
                    _prestarted.setdefault(self.index, self)
            else:
                _keep_until_exit(self)
            return
        for encoder in self.jpeg_encoders.values():
            encoder.close()
        self.decoder = None
        if self.pinned_pool is not None:
            self.pinned_pool.close()
        if self.native_calls is not None:
            self.native_calls.close()
        for stream in self._side:
            stream.close()
        self.decode_stream.close()
        self.stream.close()
        self.device.close()

    def get(self) -> DriverStage:
        """This stage once started; FatalError if it cannot start."""
        try:
            return self.future.result()
        except BaseException as error:
            from .files import FatalError

            raise FatalError(error) from error

    def stream_handle(self) -> int:
        """The CUstream as an int, for nvImageCodec."""
        return self.stream.handle

    def event(self) -> Any:
        """An event recorded on the stream now."""
        return self.device.event(self.stream)

    def side_streams(self, count: int) -> list[Any]:
        """`count` more streams of this device, made once and closed with the stage: the
        deflates of a batch run on them side by side (each kernel alone fills few SMs)."""
        while len(self._side) < count:
            self._side.append(self.device.stream())
        return self._side[:count]

    def synchronize(self) -> None:
        """Waits until the stream, the decode stream and the side streams are idle."""
        self.stream.synchronize()
        self.decode_stream.synchronize()
        for stream in self._side:
            stream.synchronize()

    def new_image(self, height: int, width: int, channels: int) -> DeviceImage:
        """A packed image in stream-ordered device memory, owned by the batch."""
        pitch = width * channels
        ptr = self.device.alloc(max(1, pitch * height), self.stream)
        return DeviceImage(ptr, width, height, channels, pitch, owned=True)


#: How the stage starts: "serial" (the context, the stream and the kernels, then nvImageCodec's
#: decoder) or "parallel" (the decoder made in a thread of its own meanwhile); both take a good
#: fraction of a second without the GIL. IMGOPS_STAGE_START overrides it. "parallel" passes the
#: stand-in driver's tests but has not been measured on a GPU yet, so it is not the default.
STAGE_START_DEFAULT = "serial"


def parallel_start() -> bool:
    """Whether nvImageCodec's decoder is made beside the context (see STAGE_START_DEFAULT)."""
    return os.environ.get("IMGOPS_STAGE_START", STAGE_START_DEFAULT).strip() == "parallel"


def _fill(future: Future[Any], make: Any) -> None:
    """future gets make()'s result or its exception."""
    try:
        future.set_result(make())
    except BaseException as error:
        future.set_exception(error)


def prestart(index: int, threads: int) -> DriverStage:
    """Starts the stage for GPU `index` now, with nvImageCodec's decoder (`threads` CPU threads,
    as the engine would make it), for the next DriverEngine on that GPU (take_prestarted).
    Only for a process that exits after its batch (the command line): the stage is kept, not
    released, at the end (DriverStage.close)."""

    def decoder_factory() -> Any:
        return make_decoder(index, threads)

    with _prestart_lock:
        stage = _prestarted.get(index)
        if stage is None:
            stage = _prestarted[index] = DriverStage(index, decoder_factory, release=False)
        return stage


def make_decoder(index: int, threads: int, *, cpu_backend: bool = False) -> Any:
    """The engine's GPU decoder: nvImageCodec through its C API (imgops.io.nvimgcodec_c: its
    start and its calls release the GIL), or through its Python module
    (imgops.io.gpu_decode.BatchDecoder) with IMGOPS_NVIMGCODEC_API=python or where the installed
    nvImageCodec is not a version the C API binding was checked against."""
    from ..io import nvimgcodec_c

    if os.environ.get("IMGOPS_NVIMGCODEC_API", "c") == "python" or not nvimgcodec_c.verified():
        from ..io.gpu_decode import BatchDecoder

        return BatchDecoder(index, cpu_backend=cpu_backend, threads=threads)
    return nvimgcodec_c.CDecoder(index, cpu_backend=cpu_backend, threads=threads)


def take_prestarted(index: int) -> DriverStage | None:
    """The stage prestart() made for GPU `index` (once; None if there is none, or if it
    failed to start: the engine then starts its own and reports why)."""
    with _prestart_lock:
        stage = _prestarted.pop(index, None)
    if stage is not None and stage.future.done() and stage.future.exception() is not None:
        return None
    return stage


def discard_prestarted() -> None:
    """Forgets the stages no engine took (a batch that failed before its engine started), so
    that no later batch in this process adopts one; warm stages (keep_warm) stay."""
    if _warm:
        return
    with _prestart_lock:
        _prestarted.clear()


def keep_warm() -> None:
    """From now on this process keeps its prestarted stages between batches (`imgops serve`):
    each batch on a GPU adopts the stage prestart() made for it, context, kernels, decoder and
    pinned buffers already warm, and gives it back at its end instead of keeping it for the
    exit. Not undone: the stages live as long as the process."""
    global _warm
    _warm = True


def keeps_warm(stage: DriverStage) -> bool:
    """Whether `stage` goes back for the next batch at its end (keep_warm)."""
    return _warm and not stage.release


def ready_warm_stage(index: int) -> DriverStage | None:
    """The warm stage waiting for GPU `index` (keep_warm), started and with nvImageCodec's
    decoder; None where there is none (left in place: take_prestarted takes it)."""
    with _prestart_lock:
        stage = _prestarted.get(index)
    if stage is None or not keeps_warm(stage) or not stage.future.done():
        return None
    if stage.future.exception() is not None or stage.decoder is None:
        return None
    return stage


def warm_stages() -> dict[int, DriverStage]:
    """The stages waiting for the next batch, by GPU (started or still starting)."""
    with _prestart_lock:
        return dict(_prestarted)


def holds_kept_stage() -> bool:
    """Whether a stage was kept for the exit (the command line then leaves through os._exit)."""
    return bool(_kept)


def _keep_until_exit(stage: DriverStage) -> None:
    """Keeps `stage` (its decoder, stream and context) alive to the end of the process: one
    reference more than is ever dropped, so not even the interpreter's shutdown destroys it."""
    _kept.append(stage)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(stage))
