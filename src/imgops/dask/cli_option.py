"""`--scheduler SPEC` for the commands, and the glue the commands call when it is given.

Wiring (the lead, in commands/gray.py and commands/normvol.py):

    from ..dask.cli_option import scheduler_option, run_gray_with_scheduler
    @scheduler_option
    def gray(..., scheduler: str | None):
        ...
        run = run_gray if scheduler is None else partial(run_gray_with_scheduler, scheduler)
        summary = run(job_list, settings, on_result=on_result)

This module imports only click; dask loads when a command actually runs with --scheduler. Every
failure that is not one file's (the extra missing, the scheduler unreachable) is an ImgopsError:
one line, exit 1.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..errors import FileError, ImgopsError

if TYPE_CHECKING:
    from ..pipeline import GrayJob, JobResult, PipelineSettings, Summary
    from .volume import VolumeRun

__all__ = [
    "normalize_with_scheduler",
    "run_batch_with_scheduler",
    "run_gray_with_scheduler",
    "scheduler_option",
]

SCHEDULER_HELP = (
    "Run on a Dask cluster (needs imgops[dask]): local:N (N worker processes on this host), "
    "local-cuda (one worker per GPU, needs dask-cuda) or tcp://HOST:PORT (a running scheduler; "
    "inputs and outputs must be on storage every worker sees)."
)


def _check_spec(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    from .cluster import parse_spec  # click-only module: no dask import

    try:
        parse_spec(value)
    except ValueError as error:
        raise click.BadParameter(str(error)) from None
    return value


#: The option: `@scheduler_option` adds `scheduler: str | None` (env IMGOPS_SCHEDULER).
scheduler_option = click.option(
    "--scheduler",
    "scheduler",
    metavar="SPEC",
    default=None,
    envvar="IMGOPS_SCHEDULER",
    callback=_check_spec,
    help=SCHEDULER_HELP,
)


def run_batch_with_scheduler(
    spec: str,
    jobs: Iterable[GrayJob],
    op: Any,
    settings: PipelineSettings,
    on_result: Callable[[JobResult], None] | None = None,
) -> Summary:
    """pipeline.run_batch(jobs, op, settings, on_result), on the cluster `spec` names."""
    from .batch import remove_stale_temporaries, run_batch_distributed
    from .cluster import connect, parse_spec

    job_list = list(jobs)
    local = parse_spec(spec).kind != "address"
    try:
        with connect(spec) as client:
            return run_batch_distributed(job_list, op, settings, on_result, client)
    except ValueError as error:  # stdin/stdout jobs
        raise click.UsageError(f"--scheduler: {error}") from None
    finally:
        if local:  # workers killed with the cluster may leave temporaries of unfinished files
            remove_stale_temporaries(job.target for job in job_list if job.target is not None)


def run_gray_with_scheduler(
    spec: str,
    jobs: Iterable[GrayJob],
    settings: PipelineSettings,
    on_result: Callable[[JobResult], None] | None = None,
) -> Summary:
    """pipeline.run_gray(jobs, settings, on_result), on the cluster `spec` names."""
    return run_batch_with_scheduler(spec, jobs, None, settings, on_result)


def normalize_with_scheduler(
    spec: str,
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    reporter: Any = None,
    **options: Any,
) -> VolumeRun:
    """volume.normalize_zarr(src, dst, **options) on the cluster `spec` names.

    `options`: min, max ("data", "dtype" or numbers), percentile, clip, dtype, overwrite,
    device. `reporter` (imgops.cli_common.Reporter) gets the bounds line and a progress bar of
    the chunk writes.
    """
    from .cluster import connect
    from .volume import count_blocks, is_zarr, normalize_zarr, open_zarr

    src, dst = Path(src), Path(dst)
    if not is_zarr(src):
        raise FileError(src, "--scheduler reads zarr / OME-Zarr volumes (*.zarr)")
    if not dst.name.lower().endswith(".zarr"):
        raise FileError(
            dst, "--scheduler writes zarr / OME-Zarr (name the output *.zarr or *.ome.zarr)"
        )
    blocks = count_blocks(open_zarr(src).array)

    def on_bounds(low: float, high: float) -> None:
        if reporter is not None:
            reporter.info(f"{src}: min {low:.10g}, max {high:.10g}")

    try:
        with connect(spec) as client:
            if reporter is None:
                return normalize_zarr(src, dst, client=client, on_bounds=on_bounds, **options)
            with reporter.progress(dst.name, blocks) as advance:
                return normalize_zarr(
                    src, dst, client=client, on_bounds=on_bounds, on_progress=advance, **options
                )
    except ImgopsError:
        raise
    except ValueError as error:  # bounds: a constant volume, bad percentiles
        raise FileError(src, str(error)) from None
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as error:  # a task's error on a worker: a bad chunk, a full disk
        raise FileError(src, f"{type(error).__name__}: {error}") from None
