"""`run_batch_distributed`: the photo batch engine, one partition of the file list per Dask task.

Each task runs the single-host engine (`imgops.pipeline.run_batch`, or `run_gray` where the
engine has no generic entry yet) on its worker, so the codec path, the torch-free CPU kernels
and the GPU decode all come along. Only job descriptions (paths) go out and `JobResult`s come
back: pixels never cross the network, so inputs and outputs must be on a filesystem every
worker sees (the same paths).

Contract, as `imgops.pipeline.run_batch`: `on_result` is called in the calling thread once per
file (progress is task progress: a partition's files arrive when its task finishes), failures
come back per file, and the returned `Summary` counts everything.

Lost workers. Distributed re-runs a task whose worker died (up to `distributed.scheduler.
allowed-failures`). The outputs the lost attempt finished are complete (the engine writes each
file to a temporary name and renames it), so the client decides "output exists" once, before
anything runs, and the workers run with skip-existing: a re-run skips what the lost attempt
wrote and reports it as written. Temporary files a killed worker left are removed when the
partition re-runs on the same host. A task that fails for good (KilledWorker) fails its files
with the reason; any other error (the device cannot start) stops the batch, as on one host.

Ctrl-C (any exception in the caller's thread, including one raised by `on_result`): a Dask
Event tells every running partition to stop after the files in progress (which finish
atomically), partitions not started are cancelled, and the client waits (up to `grace_s`) until no
partition runs any more, then re-raises.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._extra import require_dask

if TYPE_CHECKING:
    import distributed

    from ..pipeline import GrayJob, JobResult, PipelineSettings, Summary

__all__ = ["partition", "remove_stale_temporaries_of", "run_batch_distributed", "run_partition"]

#: Partitions per worker thread: enough for balance and a live progress bar, few enough that
#: the per-task overhead (a few ms) stays small against the files' time.
PARTITIONS_PER_SLOT = 8
MIN_PARTITION_FILES = 4
_STOP_POLL_S = 0.2
WORKER_LOST = "worker lost"


class _Stopped(Exception):
    """Raised inside a partition when the client asked every partition to stop."""


def partition(jobs: Sequence[Any], parts: int) -> list[list[Any]]:
    """`jobs` cut into at most `parts` contiguous, nearly equal lists (none empty)."""
    parts = max(1, min(parts, len(jobs)))
    size, extra = divmod(len(jobs), parts)
    out, start = [], 0
    for index in range(parts):
        stop = start + size + (1 if index < extra else 0)
        out.append(list(jobs[start:stop]))
        start = stop
    return [part for part in out if part]


def _engine(op: Any) -> Callable[..., Any]:
    """The single-host batch entry for `op`: run_batch(jobs, op, ...) or, before it, run_gray."""
    from .. import pipeline

    chosen = pipeline.GRAY if op is None else op  # no op given: the gray op
    return lambda jobs, settings, on_result: pipeline.run_batch(jobs, chosen, settings, on_result)


def _temporary_pattern(target: Path) -> tuple[str, str]:
    """(prefix, suffix) of the temporary names imgops.io.atomic gives `target`'s writers."""
    from ..io.atomic import TEMP_MARKER, temporary_path_for

    example = temporary_path_for(target).name
    return example.split(TEMP_MARKER, 1)[0] + TEMP_MARKER, Path(example).suffix


def remove_stale_temporaries_of(targets: Iterable[Path]) -> list[Path]:
    """Removes the temporaries of `targets` whose writer process (on this host) is gone.

    imgops.io.atomic.stale_temporaries finds them (its name rule and pid check), at any age:
    a worker that died with the cluster cannot come back to finish them. Only the temporaries of
    `targets` are touched, never those of other writers in the same folders (on a shared
    filesystem a "dead" pid may be another host's live writer). Returns what was removed.
    """
    from ..io.atomic import stale_temporaries

    wanted: dict[Path, set[tuple[str, str]]] = defaultdict(set)
    for target in targets:
        wanted[Path(target).parent].add(_temporary_pattern(Path(target)))
    removed = []
    for folder, patterns in wanted.items():
        for path in stale_temporaries(folder, min_age_seconds=0):
            name = path.name
            if any(name.startswith(p) and name.endswith(s) for p, s in patterns):
                with contextlib.suppress(OSError):
                    path.unlink()
                    removed.append(path)
    return removed


def _portable(result: JobResult) -> JobResult:
    """The result without its exception object (tracebacks may not pickle; `reason` has it)."""
    return dataclasses.replace(result, error=None) if result.error is not None else result


def run_partition(
    jobs: list[GrayJob],
    op: Any,
    settings: PipelineSettings,
    stop_name: str | None,
    engine_threads: dict[str, int] | None = None,
) -> tuple[list[JobResult], str | None]:
    """On a worker: the single-host engine over `jobs`; returns (results, device).

    Stops after the files in progress when the Dask Event `stop_name` is set.
    """
    import distributed

    remove_stale_temporaries_of(job.target for job in jobs if job.target is not None)
    threads = settings.jobs
    if threads is None:
        host = distributed.get_worker().address.split("://", 1)[-1].rsplit(":", 1)[0]
        threads = (engine_threads or {}).get(host, 1)
    stop = distributed.Event(stop_name) if stop_name else None
    results: list[JobResult] = []
    if stop is not None and stop.is_set():
        return results, None
    checked = [0.0]

    def collect(result: JobResult) -> None:
        results.append(_portable(result))
        now = time.monotonic()
        if stop is not None and now - checked[0] >= _STOP_POLL_S:
            checked[0] = now
            if stop.is_set():
                raise _Stopped

    local = dataclasses.replace(settings, jobs=threads, stdout=None)
    summary = None
    with contextlib.suppress(_Stopped):
        summary = _engine(op)(jobs, local, collect)
    return results, getattr(summary, "device", None)


def _threads_per_host(client: distributed.Client) -> dict[str, int]:
    """Engine threads per task on each host: the host's CPUs shared by its worker threads."""
    workers = client.scheduler_info().get("workers", {})
    slots: dict[str, int] = defaultdict(int)
    for address, info in workers.items():
        slots[address.split("://", 1)[-1].rsplit(":", 1)[0]] += int(info.get("nthreads", 1))
    cpus = client.run(_cpu_count)  # {worker address: CPUs usable there}
    out = {}
    for address, count in cpus.items():
        host = address.split("://", 1)[-1].rsplit(":", 1)[0]
        out[host] = max(1, count // max(1, slots[host]))
    return out


def _cpu_count() -> int:
    from ..pipeline import default_jobs

    return default_jobs()


def _precheck(jobs, settings, summary, on_result) -> list[GrayJob]:
    """Decides "output exists" once, here, before anything runs (see the module docstring)."""
    from ..pipeline import JobResult

    todo = []
    for job in jobs:
        if job.source is None or job.target is None:
            raise ValueError(
                f"{job.label}: a distributed batch needs files in and out (no stdin/stdout)"
            )
        if job.target.exists() and not settings.overwrite:
            if settings.skip_existing:
                result = JobResult(job, "skipped")
            else:
                result = JobResult(job, "failed", f"output {job.target} exists (use --overwrite)")
            summary.add(result)
            if on_result is not None:
                on_result(result)
            continue
        todo.append(job)
    return todo


def run_batch_distributed(
    jobs: Iterable[GrayJob],
    op: Any,
    settings: PipelineSettings,
    on_result: Callable[[JobResult], None] | None = None,
    client: distributed.Client | None = None,
    *,
    partitions: int | None = None,
    grace_s: float = 30.0,
) -> Summary:
    """Runs `jobs` through `op` on the cluster of `client`; the contract of pipeline.run_batch.

    `op` is an `imgops.pipeline.ImageOp` (None or GRAY: gray). `partitions` defaults to
    PARTITIONS_PER_SLOT per worker thread (at least MIN_PARTITION_FILES files each).

    Example:
        >>> with connect("local:2") as client:
        ...     summary = run_batch_distributed(jobs, GRAY, PipelineSettings(), client=client)
    """
    (distributed,) = require_dask("distributed")
    from ..pipeline import JobResult, Summary

    client = client or distributed.get_client()
    started = time.perf_counter()
    summary = Summary()
    todo = _precheck(list(jobs), settings, summary, on_result)
    if not todo:
        summary.wall_seconds = time.perf_counter() - started
        return summary
    slots = sum(int(w.get("nthreads", 1)) for w in client.scheduler_info()["workers"].values())
    count = partitions or max(1, min(slots * PARTITIONS_PER_SLOT, len(todo) // MIN_PARTITION_FILES))
    parts = partition(todo, count)
    remote = dataclasses.replace(settings, skip_existing=True, stdout=None)
    threads = _threads_per_host(client) if settings.jobs is None else None
    run_id = uuid.uuid4().hex[:12]
    stop = distributed.Event(f"imgops-stop-{run_id}", client=client)
    futures = [
        client.submit(
            run_partition,
            part,
            op,
            remote,
            stop.name,
            threads,
            key=f"imgops-batch-{run_id}-{index}",
            pure=False,
        )
        for index, part in enumerate(parts)
    ]
    part_of = {future.key: part for future, part in zip(futures, parts, strict=True)}
    devices: set[str] = set()
    try:
        for future in distributed.as_completed(futures):
            results, device = _collect(future, part_of[future.key], JobResult)
            if device:
                devices.add(device)
            for result in results:
                summary.add(result)
                if on_result is not None:
                    on_result(result)
    except BaseException:
        _stop_all(client, stop, futures, grace_s)
        raise
    finally:
        with contextlib.suppress(Exception):
            stop.clear()
    summary.device = ", ".join(sorted(devices)) or None
    summary.wall_seconds = time.perf_counter() - started
    return summary


def _collect(future, part: list[GrayJob], result_type) -> tuple[list[JobResult], str | None]:
    """The results of one partition; a partition lost for good fails each of its files."""
    import distributed

    try:
        results, device = future.result()
    except (distributed.scheduler.KilledWorker, distributed.comm.CommClosedError) as error:
        reason = f"{WORKER_LOST} ({type(error).__name__}: its task failed on every retry)"
        return [result_type(job, "failed", reason) for job in part], None
    for result in results:
        if result.status == "skipped":  # finished by an earlier attempt of this partition
            result.status = "written"
            result.note = "written by an earlier attempt (a worker was lost)"
    return results, device


def _stop_all(client, stop, futures, grace_s: float) -> None:
    """Cancels the partitions not started, tells the running ones to stop after their current
    files, and waits (up to `grace_s`) until none runs any more."""
    from .cluster import wait_until_not_running

    with contextlib.suppress(Exception):
        stop.set()
    with contextlib.suppress(Exception):
        client.cancel(futures, force=True)
    wait_until_not_running(client, {future.key for future in futures}, grace_s)
