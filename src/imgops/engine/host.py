"""The CPU engine: each worker thread carries one file through read -> decode -> op -> encode
-> write, with the op's numpy function (no torch).

OpenCV, imgops._cli_kernels and the deflate libraries release the GIL, so the threads scale
over the cores. At most `jobs + 2` files are in flight, so memory stays bounded whatever the
batch size; results come back to the calling thread in completion order.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

from ..io.images import decode_image
from .files import Writer, encode_host, failed, guard, precheck, read_job
from .ops import ImageOp
from .types import Job, JobResult, PipelineSettings, join_notes


class HostWorker:
    """Processes one job entirely on the CPU; thread-safe, never raises for a bad file."""

    def __init__(self, op: ImageOp, settings: PipelineSettings, writer: Writer) -> None:
        if op.cpu is None:
            raise ValueError(f"op {op.name} has no CPU (numpy) function")
        self.op = op
        self.settings = settings
        self.writer = writer
        self.stop = threading.Event()

    def __call__(self, job: Job) -> JobResult:
        if self.stop.is_set():
            return failed(JobResult(job, "written"), "cancelled")
        early = precheck(job, self.settings)
        if early is not None:
            return early
        return guard(JobResult(job, "written"), self._run)

    def _run(self, result: JobResult) -> None:
        seconds = result.seconds
        start = time.perf_counter()
        data = read_job(result.job)
        now = time.perf_counter()
        seconds["read"], start = now - start, now
        self.finish(result, data, start)

    def finish(self, result: JobResult, data: bytes, start: float | None = None) -> None:
        """Decodes `data` with OpenCV, runs the op, encodes and writes (the CPU fallback too)."""
        seconds, settings = result.seconds, self.settings
        start = time.perf_counter() if start is None else start
        image = decode_image(data, max_pixels=settings.max_pixels, luma=settings.luma)
        del data
        result.shape, result.dtype = image.pixels.shape, str(image.pixels.dtype)
        result.decoder = image.decoder
        result.note = join_notes(result.note, image.note)
        now = time.perf_counter()
        seconds["decode"], start = seconds.get("decode", 0.0) + now - start, now
        assert self.op.cpu is not None
        out = self.op.cpu(image.pixels, image.channel_order)
        now = time.perf_counter()
        seconds["convert"], start = now - start, now
        direct = self.writer.encode_and_write(result.job.target, out, image.channel_order)
        if direct is not None:  # one native call: encoded into the file
            result.bytes_written, seconds["encode"], seconds["write"] = direct
            return
        encoded = encode_host(out, image.channel_order, settings)
        now = time.perf_counter()
        seconds["encode"], start = now - start, now
        self.writer.write(result.job.target, encoded)
        result.bytes_written = len(encoded)
        seconds["write"] = time.perf_counter() - start


def run_host(
    jobs: Iterator[Job],
    op: ImageOp,
    settings: PipelineSettings,
    workers: int,
    on_result: Callable[[JobResult], None],
) -> None:
    """Runs every job through HostWorker threads, `workers + 2` in flight at most.

    Finished futures come back through a queue (not `wait(FIRST_COMPLETED)`, which walks every
    pending future per result): the calling thread holds the GIL as little as it can, since
    the workers need it between their codec calls.
    """
    worker = HostWorker(op, settings, Writer(settings))
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"imgops-{op.name}")
    finished: queue.SimpleQueue[Future[JobResult]] = queue.SimpleQueue()
    pending: set[Future[JobResult]] = set()
    try:
        exhausted = False
        while True:
            while not exhausted and len(pending) < workers + 2:
                job = next(jobs, None)
                if job is None:
                    exhausted = True
                else:
                    future = pool.submit(worker, job)
                    pending.add(future)
                    future.add_done_callback(finished.put)
            if not pending:
                return
            future = finished.get()
            pending.discard(future)
            on_result(future.result())
    except BaseException:
        worker.stop.set()
        pool.shutdown(wait=True, cancel_futures=True)
        # Files that were finished when the batch stopped are complete on disk: count them.
        for future in pending:
            if future.done() and not future.cancelled() and future.exception() is None:
                result = future.result()
                if result.status in ("written", "skipped"):
                    on_result(result)
        raise
    finally:
        pool.shutdown(wait=True)
