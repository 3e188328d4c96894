"""The streaming volume engine behind `imgops normvol`: chunks of whole slices through the device.

A stack is cut into chunks of K whole slices, K chosen so that every buffer in flight fits the
memory budget (`plan_chunks`). A reader thread fills input buffers, the calling thread moves each
chunk to the device and runs the kernel, a writer thread hands the pages to the TIFF writer:

- CPU: the kernel's output tensors are the write buffers; at most `slots` of them live at once.
- CUDA: pinned host buffers (double-buffered), H2D on a copy stream, the kernel on the current
  stream, D2H on a third stream, CUDA events between them; the reader refills a pinned buffer
  only after its H2D copy has finished, the writer writes a page buffer only after its D2H copy.

So reading, copying, computing and writing overlap, and host and device memory stay
`ChunkPlan.buffer_bytes` (about the budget) whatever the size of the volume. Any error or Ctrl-C
stops all three stages; the caller's atomic output then removes the partial file.

The first pass (`scan_volume`) reads the stack once more and writes nothing: per chunk a min/max
reduction on the device, or, for percentiles, an exact value histogram
(`imgops.ops.value_histogram`) accumulated on the device.

Percentiles follow numpy's default definition exactly (`numpy.percentile(data, q)`, method
"linear", Hyndman & Fan type 7): with the n values sorted as x[0..n-1], h = (n - 1) * q / 100,
i = floor(h), g = h - i, the result is x[i] + g * (x[i+1] - x[i]), evaluated with numpy's own
float64 steps (for g >= 0.5 as x[i+1] - (1 - g) * (x[i+1] - x[i])). Both order statistics are read
from the cumulative histogram, so the result equals numpy's bit for bit on integer data.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import torch

    from .io.volumes import VolumeReader

__all__ = [
    "DEFAULT_CHUNK_MB",
    "ChunkPlan",
    "DataStats",
    "StreamStats",
    "normalize_stream",
    "percentile_from_histogram",
    "plan_chunks",
    "scan_volume",
]

DEFAULT_CHUNK_MB = 256
DEFAULT_SLOTS = 2
_POLL_S = 0.05
_ITEMSIZE = {"uint8": 1, "uint16": 2, "int16": 2, "float16": 2, "float32": 4}


class StreamAborted(RuntimeError):
    """Raised inside a stage when another stage failed or the run was interrupted."""


@dataclass(frozen=True)
class ChunkPlan:
    """How a (Z, Y, X) stack is cut: K slices per chunk, `slots` chunks of buffers in flight."""

    depth: int
    slices_per_chunk: int
    slots: int
    in_slice_bytes: int
    out_slice_bytes: int
    pinned: bool = False  # CUDA: pinned host buffers, which torch rounds up to powers of two

    @property
    def chunk_count(self) -> int:
        """Number of chunks (the last one may be shorter)."""
        return math.ceil(self.depth / self.slices_per_chunk) if self.depth else 0

    @property
    def buffer_bytes(self) -> int:
        """Bytes of host slice buffers in flight at most (on CUDA the device holds as much)."""
        k = self.slices_per_chunk
        return self.slots * _slot_bytes(
            k * self.in_slice_bytes, k * self.out_slice_bytes, self.pinned
        )

    def halved(self) -> ChunkPlan:
        """The same plan with half the slices per chunk (at least one)."""
        return dataclasses.replace(self, slices_per_chunk=max(1, self.slices_per_chunk // 2))

    def chunks(self) -> Iterator[tuple[int, int]]:
        """(start, stop) slice ranges, in order."""
        for start in range(0, self.depth, self.slices_per_chunk):
            yield start, min(start + self.slices_per_chunk, self.depth)


def _slot_bytes(in_bytes: int, out_bytes: int, pinned: bool) -> int:
    if not pinned:
        return in_bytes + out_bytes
    return sum((1 << (n - 1).bit_length()) if n > 0 else 0 for n in (in_bytes, out_bytes))


def _host_bytes(nbytes: int, pinned: bool) -> int:
    """Host memory a buffer takes: torch's pinned allocator rounds up to a power of two."""
    return _slot_bytes(nbytes, 0, pinned) if pinned else nbytes


def plan_chunks(
    shape: tuple[int, int, int],
    in_dtype: str,
    out_dtype: str = "float32",
    chunk_mb: float = DEFAULT_CHUNK_MB,
    slots: int = DEFAULT_SLOTS,
    *,
    pinned: bool = False,
) -> ChunkPlan:
    """The largest K whose `slots` input+output chunk buffers fit `chunk_mb` MiB (at least 1 slice).

    `pinned=True` (the CUDA path) counts buffers as torch's pinned allocator sizes them (rounded
    up to a power of two), so the budget holds there too.

    Example:
        >>> plan_chunks((100, 512, 512), "uint16", "float32", chunk_mb=12).slices_per_chunk
        4
    """
    if not chunk_mb > 0:
        raise ValueError(f"chunk_mb must be positive, got {chunk_mb}")
    depth, height, width = shape
    in_bytes = height * width * _ITEMSIZE[in_dtype]
    out_bytes = height * width * _ITEMSIZE[out_dtype]
    budget = int(chunk_mb * 2**20)
    k = budget // max(1, slots * (in_bytes + out_bytes))
    k = max(1, min(k, max(depth, 1)))
    while k > 1 and slots * _slot_bytes(k * in_bytes, k * out_bytes, pinned) > budget:
        k -= 1
    return ChunkPlan(depth, k, slots, in_bytes, out_bytes, pinned)


@dataclass
class DataStats:
    """Result of the first pass: the data's min and max, and the value histogram if asked for."""

    minimum: int
    maximum: int
    histogram: np.ndarray | None = None
    offset: int = 0  # value of bin 0 (-32768 for int16)
    count: int = 0

    def percentile(self, q: float) -> float:
        """numpy.percentile(data, q) (method "linear"), exactly; needs the histogram."""
        if self.histogram is None:
            raise ValueError("percentiles need the histogram pass (scan_volume(histogram=True))")
        return percentile_from_histogram(self.histogram, q, self.offset)


@dataclass
class StreamStats:
    """What a run did: for tests, the benchmark and -v."""

    chunks: int = 0
    slices: int = 0
    slices_per_chunk: int = 0
    peak_buffer_bytes: int = 0
    seconds: float = 0.0
    device: str = "cpu"


class _Budget:
    """Tracks slice-buffer bytes alive, to report (and test) the peak."""

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


def _order_statistic(cumulative: np.ndarray, k: int) -> int:
    """Bin index of the k-th smallest value (0-based) given cumulative counts."""
    import numpy as np

    return int(np.searchsorted(cumulative, k, side="right"))


def percentile_from_histogram(histogram: np.ndarray, q: float, offset: int = 0) -> float:
    """numpy.percentile(values, q) (default "linear" method) from the values' full histogram.

    `histogram[b]` counts the value `b + offset`. The float64 steps are numpy's own, so the result
    equals numpy's bit for bit (for int16 data numpy subtracts the neighbours in int16 and can wrap
    when they are more than 32767 apart; here the difference is exact).
    """
    import numpy as np

    if not 0.0 <= q <= 100.0 or math.isnan(q):
        raise ValueError(f"percentile must be within 0..100, got {q}")
    cumulative = np.cumsum(np.asarray(histogram, dtype=np.int64))
    n = int(cumulative[-1]) if cumulative.size else 0
    if n == 0:
        raise ValueError("percentile of an empty volume")
    fraction = float(np.true_divide(q, 100))
    virtual = (n - 1) * fraction
    if virtual >= n - 1:
        below = above = n - 1
    elif virtual < 0:
        below = above = 0
    else:
        below = math.floor(virtual)
        above = below + 1
    gamma = virtual - below if below != above else 0.0
    a = _order_statistic(cumulative, below) + offset
    b = _order_statistic(cumulative, above) + offset
    diff = b - a
    if gamma >= 0.5:
        return float(b - diff * (1 - gamma))
    return float(a + diff * gamma)


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

    def __init__(self, plan: ChunkPlan, shape: tuple[int, int, int], dtype, device) -> None:
        import torch

        cuda = device.type == "cuda"
        full = (plan.slices_per_chunk, *shape[1:])
        self.host = torch.empty(full, dtype=dtype, pin_memory=cuda)
        self.array = self.host.numpy()
        self.device_buffer = torch.empty(full, dtype=dtype, device=device) if cuda else None
        self.copied = torch.cuda.Event() if cuda else None  # H2D done: host buffer reusable
        self.used = torch.cuda.Event() if cuda else None  # kernel done: device buffer reusable
        self.start = self.stop = 0

    def wait_reusable(self) -> None:
        """Blocks until the previous H2D copy out of the host buffer has finished."""
        if self.copied is not None:
            self.copied.synchronize()

    def to_device(self, count: int, copy_stream) -> torch.Tensor:
        """The first `count` slices on the device (enqueued on `copy_stream` on CUDA)."""
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
        """Marks the device buffer reusable after the kernels enqueued so far."""
        if self.used is not None:
            self.used.record()


class _Stages:
    """The shared plumbing: a reader thread that fills input slots in chunk order."""

    def __init__(self, reader: VolumeReader, plan: ChunkPlan, device, budget: _Budget) -> None:
        import torch

        self.reader, self.plan, self.device, self.budget = reader, plan, device, budget
        self.abort = threading.Event()
        self.errors: list[BaseException] = []
        dtype = {"uint8": torch.uint8, "uint16": torch.uint16, "int16": torch.int16}[
            reader.info.dtype
        ]
        self.free: queue.Queue = queue.Queue()
        self.filled: queue.Queue = queue.Queue(maxsize=plan.slots)
        self.copy_stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        for _ in range(min(plan.slots, max(plan.chunk_count, 1))):
            slot = _InputSlot(plan, reader.info.shape, dtype, device)
            budget.add(_host_bytes(slot.host.nbytes, slot.device_buffer is not None))
            self.free.put(slot)
        self.thread = threading.Thread(target=self._read_all, name="imgops-read", daemon=True)

    def _read_all(self) -> None:
        try:
            for start, stop in self.plan.chunks():
                slot = _get(self.free, self.abort)
                slot.wait_reusable()
                self.reader.read_into(start, slot.array[: stop - start])
                slot.start, slot.stop = start, stop
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
        """Filled input slots, in order, until the end of the stack."""
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


def _synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _histogram_bins(dtype: str) -> tuple[int, int]:
    return (256, 0) if dtype == "uint8" else (65536, -32768 if dtype == "int16" else 0)


def _chunk_min_max(chunk: torch.Tensor) -> torch.Tensor:
    """[min, max] of a chunk as int32 on its device.

    torch has no aminmax for uint16, so uint16 is viewed as int16 with the sign bit flipped
    (u ^ 0x8000 read as int16 is u - 32768: order-preserving, exact, no wider copy).
    """
    import torch

    if chunk.dtype == torch.uint16:
        low, high = torch.aminmax(chunk.view(torch.int16) ^ -32768)
        return torch.stack((low.to(torch.int32), high.to(torch.int32))) + 32768
    low, high = torch.aminmax(chunk)
    return torch.stack((low.to(torch.int32), high.to(torch.int32)))


def _merge_min_max(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    import torch

    return torch.stack((torch.minimum(a[0], b[0]), torch.maximum(a[1], b[1])))


def scan_volume(
    reader: VolumeReader,
    plan: ChunkPlan,
    device,
    *,
    histogram: bool = False,
    on_progress: Callable[[int], None] | None = None,
) -> DataStats:
    """First pass: the data's min and max (and the exact value histogram), reading every chunk once.

    Runs on `device` (a torch.device); nothing is written. `on_progress(n)` gets slices done.
    """
    with _on_device(device):
        return _scan(reader, plan, device, histogram, on_progress)


def _on_device(device):
    """Makes `device` current on CUDA, so streams and events all belong to it."""
    import torch

    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _scan(reader, plan, device, histogram, on_progress) -> DataStats:

    from . import ops

    budget = _Budget()
    stages = _Stages(reader, plan, device, budget)
    counts: torch.Tensor | None = None
    extremes: torch.Tensor | None = None
    completed = False
    with stages.running():
        for slot in stages.chunks():
            chunk = slot.to_device(slot.stop - slot.start, stages.copy_stream)
            if histogram:
                part = ops.value_histogram(chunk)
                counts = part if counts is None else counts.add_(part)
            else:
                part = _chunk_min_max(chunk)
                extremes = part if extremes is None else _merge_min_max(extremes, part)
            slot.release_device()
            stages.free.put(slot)  # the reader waits for the slot's H2D copy before refilling it
            if on_progress is not None:
                on_progress(slot.stop - slot.start)
        _synchronize(device)
        completed = True
    if not completed:
        raise StreamAborted("the first pass stopped early")
    return _data_stats(reader.info.dtype, counts, extremes, histogram)


def _data_stats(dtype: str, counts, extremes, histogram: bool) -> DataStats:
    import numpy as np

    bins, offset = _histogram_bins(dtype)
    if histogram:
        table = counts.cpu().numpy() if counts is not None else np.zeros(bins, np.int64)
        occupied = np.flatnonzero(table)
        if occupied.size == 0:
            return DataStats(0, 0, table, offset, 0)
        low, high = int(occupied[0]) + offset, int(occupied[-1]) + offset
        return DataStats(low, high, table, offset, int(table.sum()))
    if extremes is None:
        return DataStats(0, 0)
    low, high = (int(v) for v in extremes.cpu().tolist())
    return DataStats(low, high)


class _Outputs:
    """Output buffers for the writer: kernel results (CPU) or pinned slots filled by D2H (CUDA)."""

    def __init__(self, plan: ChunkPlan, shape, dtype, device, budget: _Budget) -> None:
        import torch

        self.device, self.budget = device, budget
        self.cuda = device.type == "cuda"
        self.free: queue.Queue = queue.Queue()
        if self.cuda:
            self.stream = torch.cuda.Stream(device)
            full = (plan.slices_per_chunk, *shape[1:])
            for _ in range(plan.slots):
                host = torch.empty(full, dtype=dtype, pin_memory=True)
                budget.add(_host_bytes(host.nbytes, pinned=True))
                self.free.put((host, torch.cuda.Event()))
        else:
            for _ in range(plan.slots):
                self.free.put(None)  # permission to hold one kernel result

    def take(self, result: torch.Tensor, abort: threading.Event) -> tuple[Any, Callable[[], None]]:
        """Stages `result` for writing; returns (host array source, release) once a slot is free."""
        import torch

        token = _get(self.free, abort)
        count = result.shape[0]
        if not self.cuda:
            self.budget.add(result.nbytes)

            def release_cpu(nbytes: int = result.nbytes) -> None:
                self.budget.remove(nbytes)
                self.free.put(None)

            return (result, None), release_cpu
        host, done = token
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            host[:count].copy_(result, non_blocking=True)
            done.record(self.stream)
        result.record_stream(self.stream)
        return (host[:count], done), lambda: self.free.put(token)

    def reserve_cpu_slot(self, abort: threading.Event) -> None:
        """CPU path: waits for permission to create one more kernel result (bounds memory)."""
        if not self.cuda:
            _put(self.free, _get(self.free, abort), abort)


def normalize_stream(
    reader: VolumeReader,
    write_pages: Callable[[Iterator[np.ndarray]], Any],
    plan: ChunkPlan,
    device,
    *,
    maximum: float,
    minimum: float = 0.0,
    dtype: str = "float32",
    clip: bool = False,
    on_progress: Callable[[int], None] | None = None,
) -> StreamStats:
    """Normalises the whole stack chunk by chunk; `write_pages` consumes the pages in order.

    `write_pages(pages)` runs in the writer thread and must consume every page (for example
    `lambda pages: write_volume(tmp, pages, info, dtype)`). Raises the first error of any stage;
    the caller's atomic output discards the partial file.
    """
    with _on_device(device):
        return _normalize(
            reader, write_pages, plan, device, maximum, minimum, dtype, clip, on_progress
        )


def _normalize(
    reader, write_pages, plan, device, maximum, minimum, dtype, clip, on_progress
) -> StreamStats:
    import torch

    from . import ops

    out_dtype = {"float32": torch.float32, "float16": torch.float16}[dtype]
    budget = _Budget()
    started = time.perf_counter()
    stages = _Stages(reader, plan, device, budget)
    outputs = _Outputs(plan, reader.info.shape, out_dtype, device, budget)
    to_write: queue.Queue = queue.Queue(maxsize=plan.slots)
    stats = StreamStats(slices_per_chunk=plan.slices_per_chunk, device=str(device))

    finished = threading.Event()

    def pages() -> Iterator[np.ndarray]:
        while True:
            item = _get(to_write, stages.abort)
            if item is None:
                finished.set()
                return
            (tensor, done), release, count = item
            if done is not None:
                done.synchronize()
            array = tensor.numpy()
            yield from array
            del array, tensor
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
            count = slot.stop - slot.start
            outputs.reserve_cpu_slot(stages.abort)
            chunk = slot.to_device(count, stages.copy_stream)
            result = ops.normalize_volume(chunk, maximum, minimum, dtype=out_dtype, clip=clip)
            slot.release_device()
            if device.type != "cuda":
                stages.free.put(slot)  # the kernel has returned: the input buffer is free
            source, release = outputs.take(result, stages.abort)
            if device.type == "cuda":
                stages.free.put(slot)  # the reader waits on the slot's H2D event itself
            del result, chunk
            _put(to_write, (source, release, count), stages.abort)
        _put(to_write, None, stages.abort)
        _join(writer, stages)
        completed = True
    if not completed:
        raise StreamAborted("the volume stream stopped early")
    stats.peak_buffer_bytes = budget.peak
    stats.seconds = time.perf_counter() - started
    return stats


def _join(thread: threading.Thread, stages: _Stages) -> None:
    """Waits for `thread` while staying responsive to Ctrl-C."""
    while thread.is_alive():
        thread.join(timeout=_POLL_S)
    stages.raise_first_error()
