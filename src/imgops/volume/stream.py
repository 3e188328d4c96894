"""Streaming: chunks of planes through the device, read, computed and written concurrently.

A reader thread fills input buffers (a chunk and its Z halo), the calling thread moves each
chunk to the device and runs `fn`, and either a writer thread hands the results' pages to a
writer (`map_volume`) or `merge` folds the per-chunk results into one (`reduce_volume`):

- CPU: `fn`'s output tensors are the write buffers; at most `slots` of them live at once.
- CUDA: pinned host buffers (double-buffered), H2D on a copy stream, `fn` on the current
  stream, D2H on a third stream, CUDA events between them; the reader refills a pinned buffer
  only after its H2D copy has finished, the writer writes a page buffer only after its D2H copy.

So host and device memory stay about `ChunkPlan.buffer_bytes` whatever the size of the volume.
Any error or Ctrl-C stops all three stages; the caller's atomic output removes the partial file.
When the device runs out of memory (`torch.OutOfMemoryError`, or `MemoryError` on the host),
the run starts over with half the planes per chunk, down to one unit (`run_with_smaller_chunks`).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from .chunks import ChunkPlan, host_bytes

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = [
    "Span",
    "StreamAborted",
    "StreamStats",
    "map_volume",
    "reduce_volume",
    "out_of_memory_reason",
    "release_cached_memory",
    "release_free_heap",
    "retry_note",
    "run_with_smaller_chunks",
    "torch_dtype",
]

_POLL_S = 0.05


class StreamAborted(RuntimeError):
    """Raised inside a stage when another stage failed or the run was interrupted."""


class Span(NamedTuple):
    """One chunk: output planes start..stop, read as read_start..read_stop (with the halo)."""

    start: int
    stop: int
    read_start: int
    read_stop: int

    @property
    def core(self) -> slice:
        """The chunk's own planes within the planes read (drops the halo)."""
        return slice(self.start - self.read_start, self.stop - self.read_start)


@dataclass
class StreamStats:
    """What a run did: for tests, the benchmark and -v."""

    chunks: int = 0
    slices: int = 0
    slices_per_chunk: int = 0
    peak_buffer_bytes: int = 0
    seconds: float = 0.0
    device: str = "cpu"


def torch_dtype(name: str):
    """The torch dtype of a dtype name."""
    import torch

    return getattr(torch, name)


class _Budget:
    """Tracks buffer bytes alive, to report (and test) the peak."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.alive = 0
        self.peak = 0

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.alive += nbytes
            self.peak = max(self.peak, self.alive)

    def remove(self, nbytes: int) -> None:
        with self._lock:
            self.alive -= nbytes


def _get(q: queue.Queue, abort: threading.Event) -> Any:
    while True:
        try:
            return q.get(timeout=_POLL_S)
        except queue.Empty:
            if abort.is_set():
                raise StreamAborted("stopped") from None


def _put(q: queue.Queue, item: Any, abort: threading.Event) -> None:
    while True:
        try:
            q.put(item, timeout=_POLL_S)
            return
        except queue.Full:
            if abort.is_set():
                raise StreamAborted("stopped") from None


class _InputSlot:
    """One input buffer: host memory (pinned on CUDA) and, on CUDA, its device twin and event."""

    def __init__(self, planes: int, plane_shape, dtype, device) -> None:
        import torch

        cuda = device.type == "cuda"
        full = (planes, *plane_shape)
        self.host = torch.empty(full, dtype=dtype, pin_memory=cuda)
        self.array = self.host.numpy()
        self.device_buffer = torch.empty(full, dtype=dtype, device=device) if cuda else None
        self.copied = torch.cuda.Event() if cuda else None  # H2D done: host buffer reusable
        self.used = torch.cuda.Event() if cuda else None  # fn done: device buffer reusable
        self.span: Span | None = None

    def wait_reusable(self) -> None:
        """Blocks until the previous H2D copy out of the host buffer has finished."""
        if self.copied is not None:
            self.copied.synchronize()

    def to_device(self, count: int, copy_stream) -> torch.Tensor:
        """The first `count` planes on the device (enqueued on `copy_stream` on CUDA)."""
        import torch

        if self.device_buffer is None:
            return self.host[:count]
        with torch.cuda.stream(copy_stream):
            copy_stream.wait_event(self.used)
            self.device_buffer[:count].copy_(self.host[:count], non_blocking=True)
            self.copied.record(copy_stream)
        torch.cuda.current_stream().wait_event(self.copied)
        return self.device_buffer[:count]

    def release_device(self) -> None:
        """Marks the device buffer reusable after the work enqueued so far."""
        if self.used is not None:
            self.used.record()


class _Stages:
    """The shared plumbing: a reader thread that fills input slots in chunk order."""

    def __init__(self, reader, plan: ChunkPlan, device, budget: _Budget) -> None:
        import torch

        self.reader, self.plan, self.device, self.budget = reader, plan, device, budget
        self.abort = threading.Event()
        self.errors: list[BaseException] = []
        dtype = torch_dtype(reader.info.dtype)
        self.free: queue.Queue = queue.Queue()
        self.filled: queue.Queue = queue.Queue(maxsize=plan.slots)
        self.copy_stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        planes = min(plan.read_slices, plan.depth) if plan.depth else 1
        for _ in range(min(plan.slots, max(plan.chunk_count, 1))):
            slot = _InputSlot(planes, reader.info.shape[1:], dtype, device)
            budget.add(host_bytes(slot.host.nbytes, slot.device_buffer is not None))
            self.free.put(slot)
        self.thread = threading.Thread(target=self._read_all, name="imgops-read", daemon=True)

    def _read_all(self) -> None:
        try:
            for start, stop in self.plan.chunks():
                read_start, read_stop = self.plan.read_range(start, stop)
                slot = _get(self.free, self.abort)
                slot.wait_reusable()
                self.reader.read_into(read_start, slot.array[: read_stop - read_start])
                slot.span = Span(start, stop, read_start, read_stop)
                _put(self.filled, slot, self.abort)
            _put(self.filled, None, self.abort)
        except StreamAborted:
            pass
        except BaseException as error:  # handed to the main thread, which re-raises it
            self.fail(error)

    def fail(self, error: BaseException) -> None:
        """Records the first real error and stops every stage."""
        if not isinstance(error, StreamAborted):
            self.errors.append(error)
        self.abort.set()

    def chunks(self) -> Iterator[_InputSlot]:
        """Filled input slots, in order, until the end of the volume."""
        while True:
            slot = _get(self.filled, self.abort)
            if slot is None:
                return
            yield slot

    def raise_first_error(self) -> None:
        """Re-raises the first error a stage recorded, if any."""
        if self.errors:
            raise self.errors[0]

    @contextlib.contextmanager
    def running(self, *helpers: threading.Thread) -> Iterator[None]:
        """Runs the reader and `helpers` around the caller's loop; stops and joins them at the end.

        An error in the loop stops every stage and is raised; a StreamAborted in the loop means
        another stage failed, and that stage's first error is raised instead.
        """
        threads = (self.thread, *helpers)
        for thread in threads:
            thread.start()
        try:
            yield
        except StreamAborted:
            self.abort.set()  # another stage failed; its error is raised below
        except BaseException as error:
            self.fail(error)
            raise
        finally:
            self.abort.set()  # every thread has finished unless something failed: stop them then
            for thread in reversed(threads):
                thread.join()
        self.raise_first_error()


def _on_device(device):
    """Makes `device` current on CUDA, so streams and events all belong to it."""
    import torch

    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reduce_volume(
    reader,
    fn: Callable[[torch.Tensor, Span], Any],
    merge: Callable[[Any, Any], Any],
    plan: ChunkPlan,
    device,
    *,
    initial: Any = None,
    on_progress: Callable[[int], None] | None = None,
) -> Any:
    """Folds `fn(chunk, span)` over every chunk with `merge(acc, part)`; writes nothing.

    `chunk` holds the planes span.read_start..span.read_stop on `device` (use `span.core` for the
    chunk's own planes). `fn` must not keep `chunk` (its buffer is refilled); `merge` runs in
    chunk order on the calling thread. Returns the merged value (`initial` for an empty volume).
    """
    with _on_device(device):
        result = _reduce(reader, fn, merge, plan, device, initial, on_progress)
    release_cached_memory(device)  # the pass's buffers are gone with _reduce's frame
    return result


def _reduce(reader, fn, merge, plan, device, initial, on_progress) -> Any:
    """The pass itself: its buffers are freed when this frame ends."""
    stages = _Stages(reader, plan, device, _Budget())
    acc = initial
    completed = False
    with stages.running():
        for slot in stages.chunks():
            span = slot.span
            chunk = slot.to_device(span.read_stop - span.read_start, stages.copy_stream)
            part = fn(chunk, span)
            slot.release_device()
            acc = part if acc is None else merge(acc, part)
            stages.free.put(slot)  # the reader waits for the slot's H2D copy before refilling
            if on_progress is not None:
                on_progress(span.stop - span.start)
        _synchronize(device)
        completed = True
    if not completed:
        raise StreamAborted("the first pass stopped early")
    return acc


class _Outputs:
    """Output buffers for the writer: fn's results (CPU) or pinned slots filled by D2H (CUDA)."""

    def __init__(self, plan: ChunkPlan, device, budget: _Budget) -> None:
        import torch

        self.device, self.budget, self.plan = device, budget, plan
        self.cuda = device.type == "cuda"
        self.free: queue.Queue = queue.Queue()
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        for _ in range(plan.slots):
            self.free.put(None)  # CPU: permission to hold one result; CUDA: a lazy pinned slot

    def reserve(self, abort: threading.Event) -> Any:
        """Waits for a free output slot (bounds memory) and returns its token."""
        return _get(self.free, abort)

    def take(self, token, pieces: list[torch.Tensor]) -> tuple[list, Callable[[], None]]:
        """Stages fn's result pieces for writing; returns (host sources, release)."""
        import torch

        nbytes = sum(p.nbytes for p in pieces)
        if not self.cuda:
            self.budget.add(nbytes)

            def release_cpu() -> None:
                self.budget.remove(nbytes)
                self.free.put(None)

            return [(p, None) for p in pieces], release_cpu
        planes = sum(p.shape[0] for p in pieces)
        shape, dtype = tuple(pieces[0].shape[1:]), pieces[0].dtype
        if token is None or token[0].shape[0] < planes or token[0].shape[1:] != shape:
            if token is not None:
                self.budget.remove(host_bytes(token[0].nbytes, True))
            host = torch.empty((planes, *shape), dtype=dtype, pin_memory=True)
            self.budget.add(host_bytes(host.nbytes, True))
            token = (host, torch.cuda.Event())
        host, done = token
        self.stream.wait_stream(torch.cuda.current_stream())
        sources, at = [], 0
        with torch.cuda.stream(self.stream):
            for piece in pieces:
                count = piece.shape[0]
                host[at : at + count].copy_(piece, non_blocking=True)
                piece.record_stream(self.stream)
                sources.append((host[at : at + count], done))
                at += count
            done.record(self.stream)
        return sources, lambda: self.free.put(token)


def map_volume(
    reader,
    fn: Callable[[torch.Tensor, Span], torch.Tensor | list[torch.Tensor]],
    write_pages: Callable[[Iterator[np.ndarray]], Any],
    plan: ChunkPlan,
    device,
    *,
    on_progress: Callable[[int], None] | None = None,
) -> StreamStats:
    """Runs `fn(chunk, span)` on every chunk; `write_pages` consumes the result pages in order.

    `fn` returns the output planes of the span (a tensor (m, Y', X'), or a list of them in plane
    order); `write_pages(pages)` runs in the writer thread and must consume every page (for
    example `lambda pages: write_volume(tmp, pages, info, dtype)`). Raises the first error of any
    stage; the caller's atomic output discards the partial file.
    """
    with _on_device(device):
        stats = _map(reader, fn, write_pages, plan, device, on_progress)
    release_cached_memory(device)  # the pass's buffers are gone with _map's frame
    return stats


def _map(reader, fn, write_pages, plan, device, on_progress) -> StreamStats:
    budget = _Budget()
    started = time.perf_counter()
    stages = _Stages(reader, plan, device, budget)
    outputs = _Outputs(plan, device, budget)
    to_write: queue.Queue = queue.Queue(maxsize=plan.slots)
    stats = StreamStats(slices_per_chunk=plan.slices_per_chunk, device=str(device))
    finished = threading.Event()

    def pages() -> Iterator[np.ndarray]:
        while True:
            item = _get(to_write, stages.abort)
            if item is None:
                finished.set()
                return
            sources, release, count = item
            for tensor, done in sources:
                if done is not None:
                    done.synchronize()
                yield from tensor.numpy()
            del sources
            release()
            stats.chunks += 1
            stats.slices += count
            if on_progress is not None:
                on_progress(count)

    def write_all() -> None:
        try:
            write_pages(pages())
            if not finished.is_set():
                raise RuntimeError("the writer stopped before the last page")
        except BaseException as error:
            stages.fail(error)

    writer = threading.Thread(target=write_all, name="imgops-write", daemon=True)
    completed = False
    with stages.running(writer):
        for slot in stages.chunks():
            span = slot.span
            token = outputs.reserve(stages.abort)
            chunk = slot.to_device(span.read_stop - span.read_start, stages.copy_stream)
            result = fn(chunk, span)
            pieces = list(result) if isinstance(result, (list, tuple)) else [result]
            slot.release_device()
            if device.type != "cuda":
                stages.free.put(slot)  # fn has returned: the input buffer is free
            sources, release = outputs.take(token, pieces)
            if device.type == "cuda":
                stages.free.put(slot)  # the reader waits on the slot's H2D event itself
            del result, pieces, chunk
            _put(to_write, (sources, release, span.stop - span.start), stages.abort)
        _put(to_write, None, stages.abort)
        while writer.is_alive():  # stays responsive to Ctrl-C
            writer.join(timeout=_POLL_S)
        stages.raise_first_error()
        completed = True
    if not completed:
        raise StreamAborted("the volume stream stopped early")
    stats.peak_buffer_bytes = budget.peak
    stats.seconds = time.perf_counter() - started
    return stats


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None where the C library has none (looked up once)."""
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release_free_heap() -> bool:
    """Hands the C heap's free pages back to the system (glibc's `malloc_trim`; a no-op
    elsewhere). Buffers that threads allocated and freed otherwise stay resident in their
    malloc arenas (and a process's exit then adds its own peak on top of them). True where
    the C library has malloc_trim."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
    return trim is not None


def release_cached_memory(device) -> None:
    """Hands the allocator's cached blocks back to the driver (CUDA), and the C heap's free
    pages back to the system (every device: `release_free_heap`).

    Called once per pass and once per file, never per chunk: the blocks of freed tensors go
    back, so `torch.cuda.memory_reserved()` drops to what live tensors need.
    """
    release_free_heap()
    kind = device.type if hasattr(device, "type") else str(device).split(":")[0]
    if kind == "cuda":
        import torch

        if torch.cuda.is_initialized():
            torch.cuda.synchronize(device)  # blocks freed with record_stream wait for their events
            torch.cuda.empty_cache()


def release_device_memory(device) -> None:
    """Frees unreachable tensors and hands cached blocks back to the driver (CUDA only)."""
    gc.collect()  # a failed stream leaves its buffers in a traceback cycle
    release_cached_memory(device)


def _out_of_memory_types() -> tuple[type[BaseException], ...]:
    import torch

    return (torch.OutOfMemoryError, MemoryError)


def out_of_memory_reason(error: BaseException, device) -> str:
    """The reason a retry names: "out of GPU memory" for a torch out-of-memory error on a CUDA
    device, else "out of memory" (host memory: `MemoryError`, or the CPU allocator's error)."""
    import torch

    on_gpu = (device.type if hasattr(device, "type") else str(device).split(":")[0]) == "cuda"
    if on_gpu and isinstance(error, torch.OutOfMemoryError):
        return "out of GPU memory"
    return "out of memory"


def retry_note(reason: str, old: ChunkPlan, new: ChunkPlan) -> str:
    """The line a retry prints, e.g. "out of GPU memory with 32 planes per chunk; retrying
    with 16"."""
    return (
        f"{reason} with {old.slices_per_chunk} planes per chunk; "
        f"retrying with {new.slices_per_chunk}"
    )


def run_with_smaller_chunks(
    run: Callable[[ChunkPlan], Any],
    plan: ChunkPlan,
    device,
    *,
    on_retry: Callable[[ChunkPlan, ChunkPlan], None] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> tuple[Any, ChunkPlan]:
    """(run(plan), plan), halving the planes per chunk after each out-of-memory error.

    Only `torch.OutOfMemoryError` and `MemoryError` are retried; each try starts the pass over
    (the caller's writer must start its output afresh). With one unit per chunk the error goes
    to the caller. `on_retry(old, new)` is told before each retry, and `on_note` gets the line
    to print (`retry_note`: "out of GPU memory ..." on CUDA, "out of memory ..." on the host).
    """
    oom = _out_of_memory_types()
    while True:
        try:
            return run(plan), plan
        except oom as error:
            if plan.slices_per_chunk <= plan.align:
                raise
            reason = out_of_memory_reason(error, device)
        # Out of the except block: the failed try's buffers are referenced only by the
        # traceback's frames; collect them so the smaller try has the whole device.
        release_device_memory(device)
        smaller = plan.halved()
        if on_retry is not None:
            on_retry(plan, smaller)
        if on_note is not None:
            on_note(retry_note(reason, plan, smaller))
        plan = smaller
