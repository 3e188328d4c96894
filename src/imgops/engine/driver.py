"""The CUDA engine without torch: nvImageCodec decodes, imgops' fatbin kernels run the op and
the PNG filter through the CUDA driver API (imgops.engine.cuda_driver), CPU threads deflate.

`import torch` alone takes about 3 s on the H200 host, and the torch engine
(imgops.engine.batched.DeviceEngine) pays it before the GPU does any work. This engine keeps
the same pipeline (prep threads, one device thread, encode threads; the same bounds) and the
same bytes, but its device stage (imgops.engine.driver_stage) starts in a fraction of that: the
driver's primary context, one stream, the fatbin module, and nvImageCodec's decoder (through its
C API, imgops.io.nvimgcodec_c: the GIL stays free), all in a background thread while the first
files take the CPU path.

Per batch: nvImageCodec decodes the accepted JPEGs (the decode thread: one call, on the
stage's decode stream, into the stage's memory: a stream of its own, which the stage's stream
waits for through an event, so a decode never queues behind the previous batch's device work
and never gets memory that work still uses; see DriverStage._start) -> on the device thread
`op.driver` per image (gray: one kernel into stream-ordered device memory) -> the PNG row
filter kernel -> the deflate kernels (png_deflate_kernels.cuh: the CPU encoder's exact zlib
stream) -> the stream copied into a reused pinned buffer laid out as the PNG file -> an event;
the encode threads wait for it, add the chunk framing and CRCs in place and write the file,
in one native call (png_finish_zlib_to_file; IMGOPS_FINISH_TO_FILE=0: png_finish_zlib, then
the write). The deflates of a batch spread over side streams (IMGOPS_DEFLATE_STREAMS, default
4), each waiting for its image's filtered rows; the stage's stream waits for all of them before
the batch's event. With IMGOPS_DEVICE_NATIVE=all the filter, deflate and copies of 8 images
at a time are queued by one native call with the GIL released, as are the op's launches where
it has a batch form (imgops.engine.native_batch; not yet the default, see
DEVICE_NATIVE_DEFAULT there); else one ctypes call at a time (_filter_rows, _deflate_rows).
(With IMGOPS_GPU_DEFLATE=0, or at PNG levels the device deflate does not serve, the filtered
rows come back and the encode threads deflate them; `-f jpg`: nvImageCodec's encoder.) Device
buffers are freed in stream order right after the copies are queued (with the native tail, in
one native call for the batch: _free_owned).

What the GPU does not decode (PNG, TIFF, CMYK or 12-bit JPEG, ...) takes the whole CPU path on
the prep thread: the conversion is ~1 % of such a file's time, so uploading it gains nothing.
With `--decoder cpu` the torch engine runs instead (it uploads CPU-decoded images).
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

import numpy as np

from ..io.png import device_deflate, gpu_deflate_wanted
from .batched import DeviceEngine, _encode_png_filtered, _Item
from .buffers import BufferPool
from .driver_stage import (
    DeviceImage,
    DriverStage,
    device_image,
    keeps_warm,
    ready_warm_stage,
    take_prestarted,
)
from .native_batch import IMAGE_FIELDS, native_calls_for
from .types import join_notes

__all__ = ["DeviceImage", "DriverEngine", "DriverStage", "device_image"]


class DriverEngine(DeviceEngine):
    """DeviceEngine with the torch-free device stage (see the module docstring)."""

    def __init__(self, *args: Any, index: int = 0, **kwargs: Any) -> None:
        self._index = index
        self.deflate: Any = None  # set with the pinned pool (_first_batch)
        self.finish_to_file = False  # frame and write in one native call (_first_batch)
        self.deflate_streams = 1
        super().__init__(*args, **kwargs)
        if self.op.driver is None or self.host is None:
            raise ValueError(f"op {self.op.name} has no driver or no CPU function")

    def _make_stage(self, device: str) -> DriverStage:
        factory = self._decoder_factory
        if self.settings.decoder == "gpu":
            warm = ready_warm_stage(self._index)  # imgops serve: its decoder, already made
            if warm is not None and take_prestarted(self._index) is warm:
                decoder = warm.decoder
                self._decoder_factory = lambda: decoder
                return warm
            factory = None  # created in run(), on the calling thread, so that it fails early
        else:
            self._decoder_factory = None  # the stage creates it in the background
            if factory is not None:
                prestarted = take_prestarted(self._index)  # the command line's early start
                if prestarted is not None:
                    return prestarted
        return DriverStage(self._index, factory)

    # ---------------------------------------------------------------- prep threads
    def _read_and_decode(self, item: _Item) -> None:
        stage = self.stage
        if self.decoder is None and (stage.future.done() or not self.host_while_starting):
            stage.get()  # waits where files must not take the CPU path; FatalError if it failed
            self.decoder = stage.decoder  # (the same object every time; None: CPU decodes)
        super()._read_and_decode(item)

    def _decode_on_host(self, item: _Item, start: float) -> None:
        self._finish_on_host(item, start)

    # ---------------------------------------------------------------- the device thread
    def _decode_stream(self) -> int:
        """The stage's decode stream (see DriverStage.decode_stream)."""
        stage = self.stage.get()  # the stage starts in well under a second
        if self.decoder is not None and self.decoder is not stage.decoder:
            stage.bind(self.decoder)  # --decoder gpu: made in run(), on the calling thread
        return stage.decode_stream.handle

    def _decoded_event(self) -> Any:
        """An event on the decode stream after the batch's decode."""
        stage = self.stage.get()
        return stage.device.event(stage.decode_stream, blocking=False)

    def _wait_decoded(self, stage: DriverStage, pending: Any) -> None:
        """The stage's stream waits for the decode of `pending` before its kernels, and
        before any free of its images (on the failure paths too)."""
        if pending.ready is not None:
            ready, pending.ready = pending.ready, None
            try:
                stage.stream.wait(ready)
            finally:
                ready.close()

    def _first_batch(self, stage: Any) -> None:
        """The pinned pool from the driver (its buffers freed at the end, unless the stage is
        kept warm: then they stay with it) and the row encoder; nothing was decoded before the
        stage (decodes wait for its stream)."""
        limit = _pinned_limit(self.settings.pinned_bytes)
        pool = stage.pinned_pool  # a warm stage's, pinned by an earlier batch
        if pool is None:
            pool = BufferPool(
                limit, pin=True, allocate=stage.device.pinned, dispose=lambda b: b.close()
            )
            if keeps_warm(stage):
                stage.pinned_pool = pool
        pool.limit = limit
        pool.allocate_seconds = 0.0  # (this batch's pinning, for device.pinning)
        self.pool = pool
        self.filtered = _encode_png_filtered()
        self.deflate = None  # imgops._cli_kernels where the device deflates (its framing)
        if self.filtered and gpu_deflate_wanted():
            self.deflate = device_deflate(self.settings.png_level)
        self.finish_to_file = finish_to_file_wanted() and hasattr(
            self.deflate, "png_finish_zlib_to_file"
        )
        self.deflate_streams = _deflate_streams()
        self.tail = native_calls_for(stage, "tail") if self.deflate is not None else None
        self._taken: list[Any] = []  # (set per batch in _run_batch)

    def _run_batch(
        self, stage: DriverStage, batch: list[_Item], images: dict[int, Any]
    ) -> tuple[Any, list[Any]]:
        from .cuda_driver import CudaError

        start = time.perf_counter()
        self._pool_wait = 0.0
        self._taken = []  # pinned buffers of this batch not yet with an encode thread
        keep: list[Any] = []
        # device memory of this batch not yet freed: the images decoded into the stage's
        # memory (freed in stream order after the copies), then the op's outputs and rows
        owned = [image.ptr for image in map(device_image, images.values()) if image.owned]
        live: list[tuple[_Item, DeviceImage]] = []
        try:
            pending: list[tuple[_Item, DeviceImage]] = []
            for i, item in enumerate(batch):
                if i not in images:
                    continue
                image = device_image(images[i])
                if not image.owned:
                    keep.append(images[i])  # nvImageCodec owns it: alive to the batch's event
                item.order = "rgb" if image.channels == 3 else None
                item.result.decoder = "nvimgcodec"
                item.result.shape, item.result.dtype = image.shape, "uint8"
                pending.append((item, image))
            outs = self._run_op_batch(stage, pending, owned)
            driver = self.op.driver
            for n, (item, image) in enumerate(pending):
                out = outs[n] if outs is not None else driver(stage, image, item.order)  # type: ignore[misc]
                if out.owned and out is not image:  # (an op may pass its input through)
                    owned.append(out.ptr)
                live.append((item, out))
            event = self._send_back(stage, live, owned, time.perf_counter() - start)
        except CudaError as error:
            if not error.out_of_memory:
                self._give_back_failed(stage, owned)
                raise
            self._give_back(stage, owned)
            self._batch_to_cpu(batch)
            return None, []
        except BaseException:
            self._give_back_failed(stage, owned)
            raise
        self.phases.add("device.run", time.perf_counter() - start - self._pool_wait)
        free, total = stage.device.mem_info()
        self.gpu_peak_bytes = max(self.gpu_peak_bytes or 0, total - free)
        return event, keep

    def _run_op_batch(
        self, stage: DriverStage, pending: list[tuple[_Item, DeviceImage]], owned: list[int]
    ) -> list[DeviceImage] | None:
        """The op over the whole batch in one call (op.driver_batch), or None where the op has
        no batch form or declines (the caller runs op.driver per image). The outputs a failed
        call allocated join `owned`, to be freed with the batch's memory."""
        from .cuda_driver import CudaError

        if self.op.driver_batch is None or not pending:
            return None
        try:
            return self.op.driver_batch(
                stage, [image for _, image in pending], [item.order for item, _ in pending]
            )
        except CudaError as error:
            owned.extend(getattr(error, "owned", ()))
            raise

    def _give_back(self, stage: DriverStage, owned: list[int]) -> None:
        """A batch that stops in _run_batch: once its queued work is done, its device memory
        and the pinned buffers it took go back."""
        stage.synchronize()  # (copies queued into the pinned buffers have landed)
        for ptr in owned:
            stage.device.free(ptr, stage.stream)
        owned.clear()
        for buffer in self._taken:
            self.pool.release(buffer)  # type: ignore[union-attr]
        self._taken = []

    def _give_back_failed(self, stage: DriverStage, owned: list[int]) -> None:
        """_give_back for a batch that failed: what can be freed is (a warm stage outlives the
        command); a device that fails to drain keeps its memory (that stage is not reused)."""
        with contextlib.suppress(Exception):
            self._give_back(stage, owned)

    def _send_back(
        self,
        stage: DriverStage,
        live: list[tuple[_Item, DeviceImage]],
        owned: list[int],
        seconds: float,
    ) -> Any:
        """Filters (PNG) or encodes (JPEG) each output, copies it into a pinned buffer, frees
        the batch's device memory in stream order and queues the encodes."""
        if not live:
            return None
        share = seconds / len(live)
        jpegs: list[bytes | None] = [None] * len(live)
        if self.settings.fmt == "jpg" and self._jpeg_factory is not None:
            jpegs = self._encode_jpegs_on_device(stage, live)
        filtered = self.settings.fmt == "png" and self.filtered
        side = stage.side_streams(self.deflate_streams) if self.deflate_streams > 1 else []
        if (
            filtered
            and self.tail is not None
            and all(jpeg is None for jpeg in jpegs)
            and all(out.height for _, out in live)
        ):  # all queued natively, the side streams joined
            copies, deflated = self._queue_tail(stage, live, owned, side), 0
        else:
            copies, deflated = self._queue_each(stage, live, jpegs, filtered, owned, side)
        for stream in side[:deflated]:  # the batch's event covers the side streams' work
            joined = stage.device.event(stream, blocking=False)
            stage.stream.wait(joined)
            joined.close()
        event = stage.event()
        self._free_owned(stage, owned)  # stream order: reused only after the copies above
        self._taken = []  # from here on each buffer is its encode thread's to give back
        for item, buffer, host, jpeg in copies:
            item.result.seconds["device"] = share
            self.encoders.submit(self._finish, item, event, buffer, host, jpeg)
        return event

    def _free_owned(self, stage: DriverStage, owned: list[int]) -> None:
        """Queues the freeing of the batch's device memory on the stage's stream: one native
        call with the native tail (one GIL release for the batch), else one call each. On a
        failure `owned` keeps what was not freed (the caller gives it back)."""
        from .cuda_driver import CudaError

        if self.tail is not None:
            try:
                self.tail.free(owned, stage.stream)
            except CudaError as error:
                owned[:] = getattr(error, "owned", owned)
                raise
            owned.clear()
            return
        for done, ptr in enumerate(owned):
            try:
                stage.device.free(ptr, stage.stream)
            except CudaError:
                del owned[:done]
                raise
        owned.clear()

    def _queue_each(
        self,
        stage: DriverStage,
        live: list[tuple[_Item, DeviceImage]],
        jpegs: list[bytes | None],
        filtered: bool,
        owned: list[int],
        side: list[Any],
    ) -> tuple[list[tuple[_Item, Any, Any, bytes | None]], int]:
        """Each output's way back, queued from Python: a device JPEG as it is, else the PNG
        row filter (when `filtered`), device deflate (on the side streams in turn) and the copy
        into a pinned buffer. Returns the copies and how many side streams took work."""
        deflated = 0  # images deflated on the device: side[i % len(side)] took image i
        copies: list[tuple[_Item, Any, Any, bytes | None]] = []
        for (item, out), jpeg in zip(live, jpegs, strict=True):
            if jpeg is not None:
                copies.append((item, None, None, jpeg))
                continue
            if filtered:
                source = self._filter_rows(stage, out, owned)
                pitch = out.row_bytes + 1
                nbytes = out.height * pitch
                if self.deflate is not None and out.height:
                    stream = side[deflated % len(side)] if side else stage.stream
                    deflated += 1
                    copies.append(self._deflate_rows(stage, item, out, source, owned, stream))
                    continue
            else:
                source, pitch = out.ptr, out.pitch
                nbytes = out.pitch * (out.height - 1) + out.row_bytes if out.height else 0
            buffer = self._acquire(max(1, nbytes))
            if nbytes:
                stage.device.copy_to_host(buffer.ptr, source, nbytes, stage.stream)
            item.extra["out_shape"], item.extra["itemsize"] = out.shape, 1
            host = _host_view(buffer, nbytes, out, pitch, rows=bool(filtered))
            copies.append((item, buffer, host, None))
        return copies, min(deflated, len(side))

    def _queue_tail(
        self,
        stage: DriverStage,
        live: list[tuple[_Item, DeviceImage]],
        owned: list[int],
        side: list[Any],
    ) -> list[tuple[_Item, Any, np.ndarray, None]]:
        """The PNG tail of every output (filter, device deflate, the copies into pinned
        buffers laid out as the PNG file, as _filter_rows and _deflate_rows queue it) in one
        native call per TAIL_CHUNK images (imgops.engine.native_batch): a chunk's launches
        start while the next chunk's pinned buffers are taken from the pool."""
        from ..io.png import filter_code_for
        from .cuda_driver import CudaError

        kernels = self.deflate
        code = filter_code_for(self.settings.png_level)
        streams = [stage.stream, *side]
        copies = []
        for start in range(0, len(live), TAIL_CHUNK):
            chunk = live[start : start + TAIL_CHUNK]
            images = np.empty((len(chunk), IMAGE_FIELDS), dtype=np.int64)
            for n, (item, out) in enumerate(chunk):
                out_bytes = kernels.png_deflate_layout(out.row_bytes + 1, out.height)[2]
                room = kernels.png_file_room(out_bytes)
                buffer = self._acquire(room + 8)  # the stream's length in the last 8 bytes
                images[n] = (out.ptr, out.pitch, out.row_bytes, out.height, out.channels,
                             buffer.ptr)  # fmt: skip
                item.extra["out_shape"], item.extra["itemsize"] = out.shape, 1
                item.extra["zlib"] = (room, out_bytes)
                copies.append((item, buffer, buffer.array()[: room + 8], None))
            stage.device.make_current()
            last = start + TAIL_CHUNK >= len(live)
            try:
                self.tail.png_tail(images, code, streams, first=start, join=last)
            except CudaError as error:
                owned.extend(getattr(error, "owned", ()))
                raise
        return copies

    def _acquire(self, nbytes: int) -> Any:
        """A pinned buffer of at least nbytes from the pool (the wait is timed)."""
        waited = time.perf_counter()
        buffer = self.pool.acquire(nbytes, held=len(self._taken))  # type: ignore[union-attr]
        self._taken.append(buffer)
        waited = time.perf_counter() - waited
        self._pool_wait += waited
        self.phases.add("device.wait_pool", waited)
        return buffer

    def _deflate_rows(
        self,
        stage: DriverStage,
        item: _Item,
        out: DeviceImage,
        rows: int,
        owned: list[int],
        stream: Any,
    ) -> tuple[_Item, Any, np.ndarray, None]:
        """Deflates the filtered rows on the device (the CPU encoder's bytes) and queues the
        copy of the zlib stream, and of its length, into a pinned buffer laid out as the PNG
        file: the encode thread frames it in place (png_finish_zlib). On a side stream the
        work waits for the rows, and the rows and the workspace are freed there."""
        from .cuda_driver import DeflateLayout

        kernels = self.deflate
        device = stage.device
        pitch = out.row_bytes + 1
        layout = DeflateLayout(*kernels.png_deflate_layout(pitch, out.height))
        work = device.alloc(layout.total, stream)
        owned.append(work)
        if stream is not stage.stream:  # the side stream frees the rows and the workspace
            filtered = device.event(stage.stream, blocking=False)
            stream.wait(filtered)
            filtered.close()
        stage.kernels.png_deflate(rows, pitch, out.height, work, layout, stream)
        room = kernels.png_file_room(layout.out_bytes)
        buffer = self._acquire(room + 8)  # the stream's length in the last 8 bytes
        device.copy_to_host(
            buffer.ptr + kernels.PNG_HEAD_BYTES, work + layout.out, layout.out_bytes, stream
        )
        device.copy_to_host(buffer.ptr + room, work + layout.size, 8, stream)
        if stream is not stage.stream:
            for ptr in (work, rows):
                owned.remove(ptr)
                device.free(ptr, stream)
        item.extra["out_shape"], item.extra["itemsize"] = out.shape, 1
        item.extra["zlib"] = (room, layout.out_bytes)
        return item, buffer, buffer.array()[: room + 8], None

    def _filter_rows(self, stage: DriverStage, out: DeviceImage, owned: list[int]) -> int:
        """The PNG-filtered rows of `out` in device memory (the CPU filter's bytes)."""
        from ..io.png import filter_code_for

        nbytes = out.height * (out.row_bytes + 1)
        rows = stage.device.alloc(max(1, nbytes), stage.stream)
        owned.append(rows)
        if out.height:
            stage.kernels.png_filter_u8(
                out.ptr, out.pitch, out.row_bytes, out.height, out.channels,
                filter_code_for(self.settings.png_level), rows, stage.stream,
            )  # fmt: skip
        return rows

    def _encode_jpegs_on_device(
        self, stage: DriverStage, live: list[tuple[_Item, DeviceImage]]
    ) -> list[bytes | None]:
        """nvImageCodec's JPEG encoder over the batch's outputs (None: OpenCV encodes it)."""
        from ..io.gpu_decode import GpuDecoderUnavailable
        from .cuda_driver import DeviceArray

        if not hasattr(self, "_jpeg"):
            try:
                self._jpeg = self._make_jpeg_encoder(stage)
            except GpuDecoderUnavailable as error:
                self._jpeg_factory = None
                first = live[0][0].result
                first.note = join_notes(
                    first.note, f"{error}; every file is encoded with OpenCV instead"
                )
                return [None] * len(live)
        arrays = [
            DeviceArray(
                out.ptr, (out.height, out.width, out.channels), (out.pitch, out.channels, 1)
            )
            for _, out in live
        ]
        encoded = self._jpeg.encode_arrays(arrays, stage.stream_handle())
        for (item, out), data in zip(live, encoded, strict=True):
            if data is None:
                item.result.note = join_notes(
                    item.result.note,
                    f"nvJPEG did not encode it ({out.width}x{out.height}): OpenCV instead",
                )
        return encoded

    def _make_jpeg_encoder(self, stage: DriverStage) -> Any:
        """nvImageCodec's JPEG encoder: where the stage's decoder is the C API's, the C API
        encoder on that decoder's own instance (imgops.io.nvimgcodec_encode_c: no second start,
        no import with the GIL held); else, or with IMGOPS_JPEG_ENCODER_API=python, the
        factory's (the Python module)."""
        from ..io.nvimgcodec_c import CDecoder

        decoder = stage.decoder
        if isinstance(decoder, CDecoder) and jpeg_encoder_api() == "c":
            from ..io.nvimgcodec_encode_c import CEncoder

            quality = self.settings.jpeg_quality
            kept = stage.jpeg_encoders.get(quality)  # a warm stage's, from an earlier batch
            if kept is not None:
                return kept
            encoder = CEncoder(
                quality,
                self._index,
                decoder=decoder,
                cpu_backend=decoder.cpu_backend,
                threads=2 if decoder.cpu_backend else 0,
            )
            if keeps_warm(stage):
                stage.jpeg_encoders[quality] = encoder
            return encoder
        return self._jpeg_factory()  # type: ignore[misc]

    # ---------------------------------------------------------------- encode threads
    @staticmethod
    def _host_array(host: Any) -> np.ndarray:
        return host if host.flags.c_contiguous else np.ascontiguousarray(host)

    def _encode(self, item: _Item, host: Any, jpeg: bytes | None) -> bytes | memoryview:
        """As DeviceEngine._encode; a zlib stream deflated on the device is framed in place."""
        zlib = item.extra.get("zlib")
        if zlib is None or jpeg is not None:
            return super()._encode(item, host, jpeg)
        room, out_bytes = zlib
        size = int.from_bytes(host[room : room + 8].tobytes(), "little")
        if not 6 <= size <= out_bytes:
            raise RuntimeError(f"the device deflate gave a stream of {size} bytes")
        shape = item.extra["out_shape"]
        channels = 1 if len(shape) == 2 else shape[2]
        n = self.deflate.png_finish_zlib(host, size, shape[1], shape[0], channels, 1)
        return memoryview(host[:n])

    def _encode_and_write(self, item: _Item, host: Any, jpeg: bytes | None) -> None:
        """As DeviceEngine._encode_and_write; a zlib stream deflated on the device is framed
        and written in one native call (one GIL hand-off per file instead of three), unless
        IMGOPS_FINISH_TO_FILE=0 (comparisons; read once per batch, with the compiled module's
        support, in _first_batch) or the output goes to stdout. On an H100 host,
        alternated on one warm server, 800 photos took 930 ms (median of 14) against 962 ms,
        3200 photos 3.27 s against 3.40 s (docs/BENCHMARKS.md, 2026-12-07 fifth session)."""
        zlib = item.extra.get("zlib")
        target = item.result.job.target
        done = None
        if zlib is not None and jpeg is None and target is not None and self.finish_to_file:
            room, out_bytes = zlib
            done = self.writer.finish_zlib_and_write(
                target, host, room, out_bytes, item.extra["out_shape"]
            )
        if done is None:
            super()._encode_and_write(item, host, jpeg)
            return
        result = item.result
        result.bytes_written, result.seconds["encode"], result.seconds["write"] = done
        self.phases.add("encode.encode", done[1])
        self.phases.add("encode.write", done[2])

    def run(self, jobs: Any, on_result: Any) -> None:
        """As DeviceEngine.run; the pinned buffers are freed at the end."""
        try:
            super().run(jobs, on_result)
        finally:
            jpeg = getattr(self, "_jpeg", None)
            kept = jpeg in self.stage.jpeg_encoders.values()  # a warm stage keeps it
            if jpeg is not None and hasattr(jpeg, "close") and not kept:
                jpeg.close()  # (a C API encoder gives the decoder's instance back)
            self.decoder = None
            if self.pool is not None and self.pool is not self.stage.pinned_pool:
                self.pool.close()
            self.stage.close()


#: Images per native call of the PNG tail (_queue_tail).
TAIL_CHUNK = 8


def finish_to_file_wanted() -> bool:
    """Whether the encode threads frame and write a device-deflated PNG in one native call:
    yes unless IMGOPS_FINISH_TO_FILE=0 (then png_finish_zlib, then the write: for comparisons;
    the bytes are the same either way)."""
    return os.environ.get("IMGOPS_FINISH_TO_FILE", "1").strip() != "0"


def jpeg_encoder_api() -> str:
    """ "c" or "python": IMGOPS_JPEG_ENCODER_API, the API the torch-free engine encodes `-f jpg`
    through where its decoder is the C API's (default "c": nvJPEG's encoder on the decoder's
    instance; "python": the Python module's encoder, a second instance)."""
    value = os.environ.get("IMGOPS_JPEG_ENCODER_API", "c").strip().lower()
    return "python" if value == "python" else "c"


def _deflate_streams() -> int:
    """How many side streams the deflates of a batch spread over: IMGOPS_DEFLATE_STREAMS
    (default 4; 1 or less: the stage's own stream, one image after another)."""
    value = os.environ.get("IMGOPS_DEFLATE_STREAMS", "4")
    try:
        return max(1, int(value))
    except ValueError:
        return 4


def _pinned_limit(default: int) -> int:
    """Bytes of pinned host buffers the pool may hold: IMGOPS_PINNED_MIB (MiB, for comparisons:
    a smaller pool pins less while the batch runs, a larger one waits less for the encode
    threads), else the settings' pinned_bytes."""
    value = os.environ.get("IMGOPS_PINNED_MIB", "").strip()
    try:
        return int(value) << 20 if value and int(value) > 0 else default
    except ValueError:
        return default


def _host_view(buffer: Any, nbytes: int, out: DeviceImage, pitch: int, rows: bool) -> np.ndarray:
    """The copied bytes as numpy: filtered rows (H, row_bytes + 1), or pixels (H, W[, C])."""
    flat = buffer.array()[:nbytes]
    if rows:
        return flat.reshape(out.height, pitch)
    if out.height == 0:
        return np.zeros(out.shape, np.uint8)
    strides = (pitch, out.channels, 1) if out.channels > 1 else (pitch, 1)
    return np.lib.stride_tricks.as_strided(flat, shape=out.shape, strides=strides)
