"""The device engine: files decoded in batches, the op run on the device, codecs on CPU threads.

    prep threads (jobs)      decode thread        device thread (one)      encode threads (jobs)
    read file ------------>  batch of up to  -->  CPU-decoded: pinned  --> wait for the batch's
    JPEG: parse header       batch_size files:    staging -> device        event, then deflate
    else: OpenCV decode      nvImageCodec         op.torch per shape       the filtered rows
      (byte budget)   ---->  decode (one call)    group (one launch),      (or encode JPEG)
                             -> DLPack            png_filter on the        -> atomic write
                                                  device, rows -> reused   -> result
                                                  pinned buffers, event

Everything overlaps: while the device thread queues batch k, the decode thread decodes batch
k+1 (nvImageCodec's call returns once its batch is decoded), the prep threads read batch k+2
and the encode threads deflate batch k-1. torch and CUDA start in a background thread while
the first files are read and parsed; the first nvImageCodec batch needs no torch.
What bounds memory, whatever the batch size: `window` files in flight in all; CPU-decoded
images by `startup_buffer_bytes`; device memory by two batches of `batch_bytes` on the device
and one decoded ahead (by `startup_device_bytes` while torch starts); rows coming back by the
pinned pool (`pinned_bytes`).

A file nvImageCodec cannot decode (or an out-of-memory batch) goes through the CPU path
(HostWorker) instead, with the same bits; a failing file never stops the others.

The same code runs on torch's CPU device (no streams, plain buffers): the tests drive it there.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..io.images import DecodedImage, decode_image, default_max_pixels
from .buffers import BufferPool, ByteBudget
from .files import FatalError, Writer, encode_host, failed, guard, precheck, read_job
from .host import HostWorker
from .ops import ImageOp
from .phases import Phases
from .types import Job, JobResult, PipelineSettings, join_notes

_DONE = object()
#: Batches the decode thread may decode ahead of the one the device thread runs.
_DECODE_AHEAD = 1


@dataclass
class _Item:
    """One file on its way through the device engine."""

    result: JobResult
    data: bytes | None = None  # encoded input (kept for the CPU fallback)
    candidate: Any = None  # gpu_decode.Candidate: decode on the device
    image: DecodedImage | None = None  # decoded on the CPU
    budget: int = 0  # bytes of `image` held in the decoded-image budget
    order: str | None = None  # channel order of the op's input ("rgb", "bgr", None)
    output: Any = None  # the op's result (device tensor)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Decoded:
    """A batch from the decode thread: its items, the GPU-decoded images by position, and the
    stream they were decoded on (0: before the stage's stream existed)."""

    batch: list[_Item]
    images: dict[int, Any]
    stream: int
    #: An event the device's stream waits for before it uses the images, where they were
    #: decoded on a stream of their own (imgops.engine.driver); None otherwise.
    ready: Any = None


class TorchStage:
    """torch, the extension and (on CUDA) a stream, started once in a background thread."""

    def __init__(self, device: str, torch_threads: int | None) -> None:
        self._device = device
        self._threads = torch_threads
        self.future: Future[TorchStage] = Future()
        threading.Thread(target=self._start, name="imgops-torch-start", daemon=True).start()

    def _start(self) -> None:
        try:
            import torch

            from .. import _extension

            _extension.load()
            self.torch = torch
            self.device = torch.device(self._device)
            self.cuda = self.device.type == "cuda"
            if self.cuda:
                from .device import check_torch_device

                check_torch_device(self._device)
                torch.cuda.init()
                self.stream = torch.cuda.Stream(self.device)
            elif self._threads is not None:
                torch.set_num_threads(self._threads)
            self.png_filter = _png_filter_op(torch)
        except BaseException as error:
            self.future.set_exception(error)
        else:
            self.future.set_result(self)

    def get(self) -> TorchStage:
        """This stage once started; FatalError if it cannot start."""
        try:
            return self.future.result()
        except BaseException as error:
            raise FatalError(error) from error

    def stream_context(self):
        """The CUDA stream as the current stream (a no-op on the CPU)."""
        return self.torch.cuda.stream(self.stream) if self.cuda else contextlib.nullcontext()

    def stream_handle(self) -> int:
        """The cudaStream_t as an int (0 on the CPU)."""
        return self.stream.cuda_stream if self.cuda else 0

    def event(self) -> Any:
        """An event recorded on the stream now (None on the CPU: work is already done)."""
        if not self.cuda:
            return None
        event = self.torch.cuda.Event()
        event.record(self.stream)
        return event


def _png_filter_op(torch: Any) -> Callable[[Any, int], Any] | None:
    """torch.ops.imgops.png_filter where the extension has it, else None."""
    try:
        return torch.ops.imgops.png_filter.default
    except (AttributeError, RuntimeError):
        return None


def _encode_png_filtered() -> Callable[..., bytes] | None:
    """imgops.io.png.encode_png_filtered and filter_code_for, where the PNG encoder has them."""
    from ..io import png

    if hasattr(png, "encode_png_filtered") and hasattr(png, "filter_code_for"):
        return png.encode_png_filtered
    return None


def flip_channels(tensor: Any) -> Any:
    """The tensor with its last (channel) axis reversed: BGR <-> RGB, any integer dtype.

    torch before 2.12 has no CPU flip for uint16; int16 has the same bits.
    """
    torch = __import__("torch")
    if tensor.dtype == torch.uint16:
        return tensor.view(torch.int16).flip(-1).view(torch.uint16)
    return tensor.flip(-1)


class DeviceEngine:
    """Runs jobs through the pipeline in the module docstring; see run()."""

    def __init__(
        self,
        op: ImageOp,
        settings: PipelineSettings,
        device: str,
        workers: int,
        decoder_factory: Callable[[], Any] | None,
        jpeg_encoder_factory: Callable[[], Any] | None = None,
    ) -> None:
        self.op, self.settings, self.workers = op, settings, workers
        self.writer = Writer(settings)
        self.host = HostWorker(op, settings, self.writer) if op.cpu is not None else None
        #: While torch starts, files take the CPU path on the prep threads (not with
        #: --decoder gpu, which asks for the GPU's decode of every file).
        self.host_while_starting = (
            settings.host_while_starting and self.host is not None and settings.decoder != "gpu"
        )
        self.stop = threading.Event()
        self.results: queue.Queue[Any] = queue.Queue()
        self.items: queue.Queue[Any] = queue.Queue()
        self.decoded_budget = ByteBudget(settings.startup_buffer_bytes)
        self._decoder_factory = decoder_factory
        self._jpeg_factory = jpeg_encoder_factory
        self.stage = self._make_stage(device)
        self.decoder: Any = None
        self.max_pixels = settings.max_pixels or default_max_pixels()
        # Five batches: one gathered and decoding, one decoded ahead, two on the device, one
        # being encoded (while torch starts, the first ones decode and wait on the device).
        self.window = 5 * settings.batch_size + 2 * workers
        self.filtered = None  # set on the device thread
        self.pool: BufferPool | None = None
        self.max_in_flight = 0
        self.phases = Phases()
        self.gpu_peak_bytes: int | None = None
        #: Files in each GPU decode call, in order (the decode thread's batches).
        self.decode_batches: list[int] = []

    def _make_stage(self, device: str) -> Any:
        """The device stage, starting in the background: torch, the extension, a stream."""
        return TorchStage(device, self.settings.torch_threads or (1 if self.workers > 1 else None))

    # ---------------------------------------------------------------- the calling thread
    def run(self, jobs: Iterator[Job], on_result: Callable[[JobResult], None]) -> None:
        """Feeds jobs (at most `window` in flight), reports results in this thread."""
        if self._decoder_factory is not None:
            self.decoder = self._decoder_factory()  # raises GpuDecoderUnavailable early
        # Reading and a header check take a few ms a file; with GPU decode, half the workers do
        # it and the rest of the cores stay with the encodes (the CPU decodes need them all).
        # While torch starts they run whole files on the CPU path: all the workers then.
        gpu_decode = self.decoder is not None and not self.host_while_starting
        preps = max(2, self.workers // 2) if gpu_decode else self.workers
        prep = ThreadPoolExecutor(preps, thread_name_prefix="imgops-prep")
        self.encoders = ThreadPoolExecutor(self.workers, thread_name_prefix="imgops-encode")
        device_thread = threading.Thread(target=self._device_loop, name="imgops-device")
        device_thread.start()
        in_flight, exhausted = 0, False
        try:
            while True:
                while not exhausted and in_flight < self.window:
                    job = next(jobs, None)
                    if job is None:
                        exhausted = True
                        break
                    prep.submit(self._prep, job)
                    in_flight += 1
                    self.max_in_flight = max(self.max_in_flight, in_flight)
                if in_flight == 0:
                    break
                outcome = self.results.get()
                if isinstance(outcome, FatalError):
                    raise outcome
                in_flight -= 1
                on_result(outcome)
        except BaseException:
            self._shut_down(prep, device_thread)
            # Files finished while the batch stopped are complete on disk: count them.
            while True:
                try:
                    outcome = self.results.get_nowait()
                except queue.Empty:
                    break
                if isinstance(outcome, JobResult) and outcome.status in ("written", "skipped"):
                    on_result(outcome)
            raise
        self._shut_down(prep, device_thread)

    def _shut_down(self, prep: ThreadPoolExecutor, device_thread: threading.Thread) -> None:
        self.stop.set()
        self.items.put(_DONE)
        prep.shutdown(wait=True, cancel_futures=True)
        device_thread.join()
        # Not cancelled: a queued encode holds a pinned buffer that must go back to the pool
        # (a warm stage's outlives the batch); after the stop each one only gives it back.
        self.encoders.shutdown(wait=True)

    # ---------------------------------------------------------------- prep threads
    def _prep(self, job: Job) -> None:
        """Checks, reads and (CPU) decodes one job; posts exactly one result or queues it."""
        item = _Item(JobResult(job, "written"))
        try:
            if self.stop.is_set():
                self.results.put(failed(item.result, "cancelled"))
                return
            early = precheck(job, self.settings)
            if early is not None:
                self.results.put(early)
                return
            result = guard(item.result, lambda r: self._read_and_decode(item))
        except BaseException as error:  # guard lets nothing through; this is a bug
            self.results.put(FatalError(error))
            return
        if result.status == "failed" or item.extra.get("done_on_host"):
            self._release(item)
            self.results.put(result)
        else:
            self.items.put(item)

    def _read_and_decode(self, item: _Item) -> None:
        seconds = item.result.seconds
        start = time.perf_counter()
        item.data = read_job(item.result.job)
        now = time.perf_counter()
        seconds["read"], start = now - start, now
        self.phases.add("prep.read", seconds["read"])
        if self.host_while_starting and not self.stage.future.done():
            # torch and CUDA are still starting (seconds): this file takes the CPU path now
            # instead of waiting, so a small batch on CUDA finishes no later than on the CPU.
            self._finish_on_host(item, start)
            return
        if self.decoder is not None:
            item.candidate = self.decoder.accept(item.data, self.max_pixels)
            now = time.perf_counter()
            seconds["decode"], start = now - start, now  # the header check; + the batch's share
            self.phases.add("prep.parse", seconds["decode"])
            if item.candidate is not None:
                return
        self._decode_on_host(item, start)

    def _finish_on_host(self, item: _Item, start: float) -> None:
        """The whole CPU path for this file, here on the prep thread (the same bytes)."""
        data, item.data = item.data, None
        self.host.finish(item.result, data, start)  # type: ignore[union-attr]
        item.extra["done_on_host"] = True
        self.phases.add("prep.host_path", time.perf_counter() - start)

    def _decode_on_host(self, item: _Item, start: float) -> None:
        """A file the GPU does not decode: OpenCV decodes it here; the device runs the op."""
        seconds = item.result.seconds
        image = decode_image(
            item.data, max_pixels=self.settings.max_pixels, luma=self.settings.luma
        )
        item.result.decoder = image.decoder
        item.result.note = join_notes(item.result.note, image.note)
        item.result.shape, item.result.dtype = image.pixels.shape, str(image.pixels.dtype)
        now = time.perf_counter()
        self.phases.add("prep.cpu_decode", now - start)
        with self.phases.timed("prep.wait_budget"):
            if not self.decoded_budget.take(image.pixels.nbytes, self.stop):
                raise RuntimeError("cancelled")
        item.image, item.budget, item.order = image, image.pixels.nbytes, image.channel_order
        seconds["decode"] = seconds.get("decode", 0.0) + now - start

    def _release(self, item: _Item) -> None:
        if item.budget:
            self.decoded_budget.give(item.budget)
            item.budget = 0
        item.image = None

    # ---------------------------------------------------------------- the device thread
    def _device_loop(self) -> None:
        """Runs decoded batches on the device, hands rows to the encoders.

        A decode thread (`_decode_loop`) gathers and decodes the next batch while this one
        runs the last: nvImageCodec's call returns only when its batch is decoded, and
        queueing a batch's kernels and copies takes a fraction of that. Until the stage is
        ready, decoded batches wait (at most startup_device_bytes): the first decodes overlap
        the start-up of torch and CUDA.
        """
        retiring: tuple[Any, list[Any]] | None = None
        waiting: list[_Decoded] = []
        if self.decoder is not None and self.host_while_starting:
            with self.phases.timed("device.warm_up"):  # while the first files take the CPU path
                self.decoder.warm_up()
        decoded: queue.Queue[Any] = queue.Queue()
        room = threading.Semaphore(_DECODE_AHEAD)
        decoding = threading.Thread(
            target=self._decode_loop, args=(decoded, room), name="imgops-decode"
        )
        decoding.start()
        try:
            while not self.stop.is_set():
                entry = self._next_decoded(decoded, room, block=not waiting)
                if entry is not None:
                    waiting.append(entry)
                ready = self.stage.future.done()
                held = sum(self._item_bytes(i) for e in waiting for i in e.batch)
                if entry is not None and not ready and held < self.settings.startup_device_bytes:
                    continue
                if entry is None and not waiting:
                    break
                stage = self._started(waiting)
                while waiting:
                    pending = waiting.pop(0)  # (from here on _run_batch frees its memory)
                    if pending.stream == 0 and pending.images and stage.cuda:
                        self._decoded_before_stream(stage)
                    self._wait_decoded(stage, pending)
                    event, keep = self._run_batch(stage, pending.batch, pending.images)
                    if retiring is not None and retiring[0] is not None:
                        with self.phases.timed("device.wait_previous"):
                            retiring[0].synchronize()  # at most two batches alive on the device
                    retiring = (event, keep)
        except FatalError as error:
            self.results.put(error)
        except BaseException as error:  # a bug or a device failure: stop the batch, say why
            self.results.put(FatalError(error))
        finally:
            room.release()  # a decode thread waiting for room sees the stop (or the end)
            decoding.join()
            self._discard_unrun(waiting, decoded)

    def _discard_unrun(self, waiting: list[_Decoded], decoded: queue.Queue[Any]) -> None:
        """Batches decoded but never run (the batch failed or was cancelled): their images'
        memory goes back to the decoder, so a process that stays up (imgops serve) does not
        keep it. Nothing is left after a batch that ran to its end."""
        entries = list(waiting)
        waiting.clear()
        while True:
            try:
                entry = decoded.get_nowait()
            except queue.Empty:
                break
            if entry is not _DONE:
                entries.append(entry)
        release = getattr(self.decoder, "release", None)
        for entry in entries:
            for image in entry.images.values():
                if release is not None:
                    with contextlib.suppress(Exception):  # (a failed device frees nothing)
                        release(image)
            entry.images.clear()
            if entry.ready is not None:
                with contextlib.suppress(Exception):
                    entry.ready.close()
                entry.ready = None
            for item in entry.batch:
                self._release(item)

    def _decode_loop(self, decoded: queue.Queue[Any], room: threading.Semaphore) -> None:
        """The decode thread: gathers batches and decodes them, at most _DECODE_AHEAD ahead
        of the device thread; puts _DONE last, whatever happens.

        One nvImageCodec call at a time: the call returns only when its batch is decoded (on
        an H100 host the call took 0.42 ms a file and its future 0.002 ms), so a second call
        submitted before the first is waited for overlapped nothing (IMGOPS_DECODE_IN_FLIGHT=2,
        tried and removed 2026-12-07: 800 photos relayed, 762-850 ms with one against 765-782
        with two; docs/BENCHMARKS.md), and neither did two or three decode threads with a
        decoder each (1886-2024 files/s alone, 1934-2070 with more: the engines are full)."""
        try:
            while True:
                while not room.acquire(timeout=0.1):
                    if self.stop.is_set():
                        return
                if self.stop.is_set():
                    return
                batch = self._gather(block=True)
                if batch is None:
                    return
                decoded.put(self._decode_batch(batch))
        except FatalError as error:
            self.results.put(error)
        except BaseException as error:  # a bug or a device failure: stop the batch, say why
            self.results.put(FatalError(error))
        finally:
            decoded.put(_DONE)

    def _next_decoded(
        self, decoded: queue.Queue[Any], room: threading.Semaphore, block: bool
    ) -> _Decoded | None:
        """The next decoded batch (waiting for it if `block`); None when none came or the
        input ended."""
        start = time.perf_counter()
        try:
            entry = decoded.get(timeout=None if block else 0.02)
        except queue.Empty:
            return None
        finally:
            self.phases.add("device.wait_decode", time.perf_counter() - start)
        if entry is _DONE:
            decoded.put(_DONE)  # seen again by the next call
            return None
        room.release()
        return entry

    def _decoded_event(self) -> Any:
        """An event recorded where the batch just decoded is complete, for the device's
        stream to wait on; None here (torch: decodes run on the stage's stream)."""
        return None

    def _wait_decoded(self, stage: Any, pending: _Decoded) -> None:
        """Orders the device's stream after the decode of `pending` (see _decoded_event)."""

    def _decoded_before_stream(self, stage: TorchStage) -> None:
        """A batch decoded on the default stream before the stage's existed: wait for it."""
        stage.torch.cuda.synchronize()

    def _started(self, waiting: list[_Decoded]) -> TorchStage:
        """The torch stage (waiting for it); the wait is charged to the files that waited."""
        start = time.perf_counter()
        stage = self.stage.get()
        waited = time.perf_counter() - start
        self.phases.add("device.wait_torch", waited)
        if self.pool is None:
            self._first_batch(stage)
        items = [item for entry in waiting for item in entry.batch]
        if waited > 1e-3 and items:
            for item in items:
                item.result.seconds["start"] = waited / len(items)
        return stage

    def _first_batch(self, stage: Any) -> None:
        """Once, when the stage is first used: the pinned pool and the PNG row encoder."""
        self.pool = BufferPool(self.settings.pinned_bytes, pin=stage.cuda)
        self.filtered = stage.png_filter is not None and _encode_png_filtered()

    def _gather(self, block: bool) -> list[_Item] | None:
        """The next batch: one item (waiting for it if `block`), then whatever is queued,
        within batch_size and batch_bytes. None when nothing came (or the input ended)."""
        start = time.perf_counter()
        try:
            first = self.items.get(timeout=None if block else 0.02)
        except queue.Empty:
            return None
        finally:
            self.phases.add("device.wait_items", time.perf_counter() - start)
        if first is _DONE:
            self.items.put(_DONE)  # seen again by the next call
            return None
        batch, nbytes = [first], self._item_bytes(first)
        while len(batch) < self.settings.batch_size and nbytes < self.settings.batch_bytes:
            try:
                item = self.items.get_nowait()
            except queue.Empty:
                break
            if item is _DONE:
                self.items.put(_DONE)
                break
            batch.append(item)
            nbytes += self._item_bytes(item)
        return batch

    @staticmethod
    def _item_bytes(item: _Item) -> int:
        if item.candidate is not None:
            return item.candidate.nbytes
        return item.image.pixels.nbytes if item.image is not None else 0

    def _decode_batch(self, batch: list[_Item]) -> _Decoded:
        """nvImageCodec decodes the batch's JPEGs in one call; failures go to the CPU path."""
        picked = [i for i, item in enumerate(batch) if item.candidate is not None]
        if not picked:
            return _Decoded(batch, {}, 0)
        stream = self._decode_stream()
        start = time.perf_counter()
        self.decode_batches.append(len(picked))
        decoded = self.decoder.decode([batch[i].candidate for i in picked], stream)
        took = time.perf_counter() - start
        first = not getattr(self, "_decoded_once", False)
        self._decoded_once = True
        self.phases.add("device.decode_first" if first else "device.decode", took)
        share = took / len(picked)
        failures = getattr(self.decoder, "last_failures", None) or [None] * len(picked)
        images = {}
        for i, image, failure in zip(picked, decoded, failures, strict=True):
            seconds = batch[i].result.seconds
            seconds["decode"] = seconds.get("decode", 0.0) + share
            if image is None:
                why = "nvImageCodec could not decode it"
                self._fallback(batch[i], f"{why}: {failure}" if failure else why)
            else:
                images[i] = image
        return _Decoded(batch, images, stream, self._decoded_event() if images else None)

    def _decode_stream(self) -> int:
        """The stream nvImageCodec decodes on: the stage's once started, else the default (0);
        the device thread synchronizes the device for batches decoded before that."""
        stage = self.stage.future
        return stage.result().stream_handle() if stage.done() and not stage.exception() else 0

    def _fallback(self, item: _Item, why: str) -> None:
        """Sends one file through the CPU path (same bits); its result is posted from there."""
        item.extra["fallback"] = why
        item.result.fallback = why
        data, image = item.data, item.image
        item.data = None
        item.candidate = None

        def run() -> None:
            try:
                outcome = attempt() if not self.stop.is_set() else cancelled()
            except BaseException as error:  # guard lets nothing through; this is a bug
                outcome = FatalError(error)
            self.results.put(outcome)

        def cancelled() -> JobResult:
            self._release(item)
            return failed(item.result, "cancelled")

        def attempt() -> JobResult:
            result = item.result
            if self.host is None:
                self._release(item)
                return failed(result, f"{why}, and op {self.op.name} has no CPU path")
            if image is not None:
                outcome = guard(result, lambda r: self._host_from_image(r, image))
            else:
                outcome = guard(result, lambda r: self.host.finish(r, data))  # type: ignore[union-attr]
            self._release(item)
            return outcome

        self.encoders.submit(run)

    def _batch_to_cpu(self, batch: list[_Item]) -> None:
        """A batch the device ran out of memory for: every file not already on the CPU path
        goes there (the same bits), with a note."""
        for item in batch:
            if "fallback" not in item.extra:
                item.result.note = "out of GPU memory for this batch: converted on the CPU"
                self._fallback(item, "out of GPU memory")

    def _host_from_image(self, result: JobResult, image: DecodedImage) -> None:
        assert self.op.cpu is not None
        start = time.perf_counter()
        out = self.op.cpu(image.pixels, image.channel_order)
        now = time.perf_counter()
        result.seconds["convert"], start = now - start, now
        encoded = encode_host(out, image.channel_order, self.settings)
        now = time.perf_counter()
        result.seconds["encode"], start = now - start, now
        self.writer.write(result.job.target, encoded)
        result.bytes_written = len(encoded)
        result.seconds["write"] = time.perf_counter() - start

    def _run_batch(
        self, stage: TorchStage, batch: list[_Item], images: dict[int, Any]
    ) -> tuple[Any, list[Any]]:
        """Runs the op over the batch on the device; queues rows back and the encodes.

        Returns the batch's event and what must outlive it (decoded images, staging buffers).
        """
        torch = stage.torch
        start = time.perf_counter()
        self._pool_wait = 0.0
        live: list[_Item] = []
        keep: list[Any] = []
        try:
            with stage.stream_context():
                for i, item in enumerate(batch):
                    if i in images:
                        self._take_gpu_image(item, images[i], stage, keep)
                        live.append(item)
                    elif item.image is not None:
                        self._upload(item, stage, keep)
                        live.append(item)
                self._apply_op(live, stage)
                for item in live:
                    item.extra["out_shape"] = tuple(item.output.shape)
                    item.extra["itemsize"] = item.output.element_size()
                    item.output = self._to_output(item.output, item.order, stage)
                # The copies back and the batch's event go on the same stream as the kernels:
                # an encode thread that waits for the event then reads finished rows.
                event = self._send_back(stage, live, time.perf_counter() - start)
        except torch.OutOfMemoryError:
            for item in batch:
                item.output = None
            images.clear()
            keep.clear()
            if stage.cuda:
                stage.stream.synchronize()
                torch.cuda.empty_cache()
            self._batch_to_cpu(batch)
            return None, []
        self.phases.add("device.run", time.perf_counter() - start - self._pool_wait)
        if stage.cuda:  # the whole device: nvImageCodec allocates outside torch's allocator
            free, total = torch.cuda.mem_get_info(stage.device)
            self.gpu_peak_bytes = max(self.gpu_peak_bytes or 0, total - free)
        return event, keep

    def _take_gpu_image(self, item: _Item, image: Any, stage: TorchStage, keep: list) -> None:
        from ..io.gpu_decode import as_tensor

        tensor = as_tensor(image)
        if tensor.device.type != stage.device.type:
            tensor = tensor.to(stage.device)
        if item.candidate.gray:
            tensor, item.order = tensor[..., 0], None
        else:
            item.order = "rgb"
        keep.append(image)  # nvImageCodec owns the memory: alive until the batch's event
        item.output = tensor
        item.result.decoder = "nvimgcodec"
        item.result.shape, item.result.dtype = tuple(tensor.shape), "uint8"

    def _upload(self, item: _Item, stage: TorchStage, keep: list) -> None:
        torch = stage.torch
        pixels = np.ascontiguousarray(item.image.pixels)
        host = torch.from_numpy(pixels)
        if stage.cuda:
            staging = torch.empty(host.shape, dtype=host.dtype, pin_memory=True)
            staging.copy_(host)
            keep.append(staging)  # alive until the batch's event
            item.output = staging.to(stage.device, non_blocking=True)
        else:
            item.output = host
        self._release(item)  # the decoded image may go: the bytes are staged

    def _apply_op(self, live: list[_Item], stage: TorchStage) -> None:
        """op.torch once per group of same-shape images (one launch for the group)."""
        groups: dict[tuple[Any, ...], list[_Item]] = {}
        for item in live:
            key = (tuple(item.output.shape), item.output.dtype, item.order)
            groups.setdefault(key, []).append(item)
        torch = stage.torch
        for (_, _, order), members in groups.items():
            tensors = [m.output for m in members]
            stacked = torch.stack(tensors) if len(tensors) > 1 else tensors[0].unsqueeze(0)
            out = self.op.torch(stacked, order)
            for index, member in enumerate(members):
                member.output = out[index]

    def _to_output(self, tensor: Any, order: str | None, stage: TorchStage) -> Any:
        """What comes back to the host: filtered PNG rows where the device filters, else pixels."""
        if self.settings.fmt == "png" and self.filtered:
            from ..io.png import filter_code_for

            if tensor.dim() == 3 and order == "bgr":
                tensor = flip_channels(tensor)  # PNG stores RGB
            return stage.png_filter(tensor.contiguous(), filter_code_for(self.settings.png_level))
        return tensor.contiguous()

    def _send_back(self, stage: TorchStage, live: list[_Item], seconds: float) -> Any:
        """Copies each output into a pooled (pinned) buffer, then queues its encode."""
        if not live:
            return None
        jpegs: list[bytes | None] = [None] * len(live)
        if self.settings.fmt == "jpg" and self._jpeg_factory is not None:
            jpegs = self._encode_jpegs(stage, live)
        copies = []
        taken = 0  # this batch's buffers so far: the pool must not wait for them alone
        for item, jpeg in zip(live, jpegs, strict=True):
            if jpeg is not None:
                copies.append((item, None, None, jpeg))
                continue
            tensor = item.output
            waited = time.perf_counter()
            buffer = self.pool.acquire(tensor.numel() * tensor.element_size(), held=taken)
            taken += 1
            waited = time.perf_counter() - waited
            self._pool_wait += waited
            self.phases.add("device.wait_pool", waited)
            host = buffer[: tensor.numel() * tensor.element_size()].view(tensor.dtype)
            host = host.view(tensor.shape)
            host.copy_(tensor, non_blocking=stage.cuda)
            item.output = None  # the allocator reuses it only after the copy (stream order)
            copies.append((item, buffer, host, None))
        event = stage.event()
        share = (seconds + 0.0) / len(live)
        for item, buffer, host, jpeg in copies:
            item.result.seconds["device"] = share
            self.encoders.submit(self._finish, item, event, buffer, host, jpeg)
        return event

    def _encode_jpegs(self, stage: TorchStage, live: list[_Item]) -> list[bytes | None]:
        """JPEG bytes from the GPU encoder per item (None: OpenCV encodes it on a CPU thread).

        Where the GPU encoder cannot be created, the batch goes on with OpenCV's encoder and
        the first file says why, once.
        """
        if not hasattr(self, "_jpeg"):
            from ..io.gpu_decode import GpuDecoderUnavailable

            try:
                self._jpeg = self._jpeg_factory()
            except GpuDecoderUnavailable as error:
                self._jpeg_factory = None
                live[0].result.note = join_notes(
                    live[0].result.note, f"{error}; every file is encoded with OpenCV instead"
                )
                return [None] * len(live)
        tensors = []
        for item in live:
            tensor = item.output
            if tensor.dim() == 3 and item.order == "bgr":
                tensor = flip_channels(tensor)
            tensors.append(tensor if tensor.dtype == stage.torch.uint8 else None)
        picked = [i for i, t in enumerate(tensors) if t is not None]
        encoded = self._jpeg.encode([tensors[i] for i in picked], stage.stream_handle())
        out: list[bytes | None] = [None] * len(live)
        for i, data in zip(picked, encoded, strict=True):
            out[i] = data
            if data is None:  # tiny or refused: said, so the encoder is never a mystery
                shape = "x".join(map(str, tensors[i].shape))
                live[i].result.note = join_notes(
                    live[i].result.note, f"nvJPEG did not encode it ({shape}): OpenCV instead"
                )
        return out

    # ---------------------------------------------------------------- encode threads
    @staticmethod
    def _host_array(host: Any) -> np.ndarray:
        """The rows or pixels that came back, as numpy (here: a pinned torch tensor)."""
        return host.numpy()

    def _finish(self, item: _Item, event: Any, buffer: Any, host: Any, jpeg: bytes | None) -> None:
        outcome: JobResult | FatalError
        try:
            if event is not None:
                with self.phases.timed("encode.wait_device"):
                    event.synchronize()  # (also before a stopped batch's buffer goes back)
            if self.stop.is_set():
                outcome = failed(item.result, "cancelled")
            else:
                outcome = guard(item.result, lambda r: self._encode_and_write(item, host, jpeg))
        except BaseException as error:  # a CUDA error surfaced by the event: fatal
            outcome = FatalError(error)
        finally:
            item.output = None
            if buffer is not None:
                self.pool.release(buffer)
        self.results.put(outcome)

    def _encode(self, item: _Item, host: Any, jpeg: bytes | None) -> bytes | memoryview:
        """The output file's bytes from what came back from the device."""
        settings = self.settings
        if jpeg is not None:
            return jpeg
        if settings.fmt == "png" and self.filtered:
            shape, itemsize = item.extra["out_shape"], item.extra["itemsize"]
            return self.filtered(
                self._host_array(host),
                width=shape[1],
                height=shape[0],
                channels=1 if len(shape) == 2 else shape[2],
                bit_depth=8 * itemsize,
                level=settings.png_level,
            )
        return encode_host(self._host_array(host), item.order, settings)

    def _encode_and_write(self, item: _Item, host: Any, jpeg: bytes | None) -> None:
        result = item.result
        start = time.perf_counter()
        encoded = self._encode(item, host, jpeg)
        now = time.perf_counter()
        result.seconds["encode"], start = now - start, now
        self.writer.write(result.job.target, encoded)
        result.bytes_written = len(encoded)
        result.seconds["write"] = time.perf_counter() - start
        self.phases.add("encode.encode", result.seconds["encode"])
        self.phases.add("encode.write", result.seconds["write"])
