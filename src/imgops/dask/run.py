"""What the commands run when `--scheduler SPEC` is given (the option itself is the CLI's:
imgops.cli_common.scheduler_option).

- `imgops gray` (commands/gray.py): the planned files go through
  `run_gray_with_scheduler(spec, jobs, settings, on_result)`, whose results feed the one Report
  and its bar, as `run_gray` does without it.
- `imgops normvol` (commands/normvol.py): the command opens one client
  (`cluster.connect(spec, preload=VOLUME_PRELOAD)`) and runs `normalize_on_cluster(client,
  src, dst, options)` per planned volume, with the options dict it builds for
  imgops.volume_files.normalize_file.

Library code: no click. Importing this module imports neither dask nor numpy; they load when a
function here runs. Every failure that is not one file's (the extra missing, the scheduler
unreachable) is an ImgopsError (one line, exit 1); one volume's is a FileError; jobs a cluster
cannot run (stdin/stdout) are a UsageProblem (exit 2).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import FileError, ImgopsError, UsageProblem

if TYPE_CHECKING:
    from ..pipeline import GrayJob, JobResult, PipelineSettings, Summary
    from .volume import VolumeRun

__all__ = [
    "BATCH_PRELOAD",
    "VOLUME_PRELOAD",
    "check_volume_task",
    "normalize_on_cluster",
    "normalize_with_scheduler",
    "run_batch_with_scheduler",
    "run_gray_with_scheduler",
    "start_local_workers",
    "volume_layout",
]


#: What local workers import before their first task (imgops.dask.cluster.connect's preload).
BATCH_PRELOAD = ("cv2", "imgops.engine", "imgops.pipeline")
VOLUME_PRELOAD = ("torch", "zarr", "imgops.ops", "imgops.volume")


def start_local_workers(spec: str, preload: Sequence[str]) -> None:
    """For "local" / "local:N": starts now the forkserver the cluster's workers will fork from
    (imgops.dask.cluster.start_forkserver), so its imports (distributed, numpy, `preload`) run
    while this process plans the batch and imports distributed itself. Nothing for other specs,
    nor without imgops[dask] (require_dask says so later). Imports no dask here."""
    from .cluster import parse_spec, start_forkserver

    try:
        local = parse_spec(spec).kind == "local"
    except ValueError:
        return
    if local:
        start_forkserver(preload)


def run_batch_with_scheduler(
    spec: str,
    jobs: Iterable[GrayJob],
    op: Any,
    settings: PipelineSettings,
    on_result: Callable[[JobResult], None] | None = None,
) -> Summary:
    """pipeline.run_batch(jobs, op, settings, on_result), on the cluster `spec` names."""
    from .batch import remove_stale_temporaries_of, run_batch_distributed
    from .cluster import connect, parse_spec

    job_list = list(jobs)
    local = parse_spec(spec).kind != "address"
    try:
        with connect(spec, preload=BATCH_PRELOAD) as client:
            return run_batch_distributed(job_list, op, settings, on_result, client)
    except ValueError as error:  # stdin/stdout jobs
        raise UsageProblem(f"--scheduler: {error}") from None
    finally:
        if local:  # workers killed with the cluster may leave temporaries of unfinished files
            remove_stale_temporaries_of(job.target for job in job_list if job.target is not None)


def run_gray_with_scheduler(
    spec: str,
    jobs: Iterable[GrayJob],
    settings: PipelineSettings,
    on_result: Callable[[JobResult], None] | None = None,
) -> Summary:
    """pipeline.run_gray(jobs, settings, on_result), on the cluster `spec` names."""
    return run_batch_with_scheduler(spec, jobs, None, settings, on_result)


#: normvol options the cluster path takes as the single-process path does; the others
#: (--chunk-mb: blocks are the store's chunks; --predictor: TIFF only) do not apply to it.
_VOLUME_OPTIONS = ("max", "min", "percentiles", "eps", "clip", "dtype", "overwrite", "device")


def check_volume_task(src: Path, dst: Path) -> None:
    """FileError unless `src` is a zarr / OME-Zarr store and `dst` names one (cheap: no dask)."""
    from .volume import is_zarr

    if not is_zarr(Path(src)):
        raise FileError(src, "--scheduler reads zarr / OME-Zarr volumes (*.zarr), not TIFF")
    if not Path(dst).name.lower().endswith(".zarr"):
        raise FileError(dst, "--scheduler writes OME-Zarr (name the output *.ome.zarr)")


def volume_layout(src: Path, *, per: str, compress: str, pyramid: int | None, ngff: str):
    """The OmeLayout `imgops normvol` would write for `src`, read by the single-process reader
    (imgops.io.zarr_io.ZarrReader: the same axes, scale, units and display ranges); FileError
    for what the cluster path does not do (one set of bounds per volume, TCZYX order)."""
    from ..io.zarr_io import ZarrReader, _physical_scale
    from .volume import OmeLayout

    with ZarrReader(src) as reader:
        info = reader.info
    axes, sizes = info.axes, dict(zip(info.axes, info.sizes, strict=True))
    split = [a for a, word in (("C", "channel"), ("T", "time")) if word in per]
    grouped = [a for a in split if sizes.get(a, 1) > 1]
    if grouped:
        raise FileError(
            src,
            f"--scheduler normalises the whole volume with one min/max, but --per {per} "
            f"splits its {'/'.join(grouped)} axis; use --per none, or run without --scheduler",
        )
    ngff_order = "".join(a for a in "TCZ" if a in axes) + "YX"
    if axes != ngff_order:
        raise FileError(
            src,
            f"has axes {axes}, not in OME-Zarr order ({ngff_order}); run without --scheduler",
        )
    scales, units = _physical_scale(info)
    return OmeLayout(
        ngff=ngff,
        compression="zstd" if compress == "auto" else compress,
        levels=pyramid,
        axes=axes,
        scales=scales,
        units=units,
        ranges=info.ranges,
        channels=sizes.get("C", 1),
    ), info


def normalize_on_cluster(
    client: Any,
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    options: dict[str, Any],
    *,
    reporter: Any = None,
) -> VolumeRun:
    """One `imgops normvol SRC -o DST` on the cluster of `client`: `options` as the command
    builds them for imgops.volume_files.normalize_file (max, min, percentiles, per, clip, eps,
    dtype, compress, pyramid, ngff, device, overwrite, ...). Returns the VolumeRun (its
    `summary()` is the line the command prints). FileError (one line) for a bad input.
    """
    import numpy as np

    from ..volume_files import check_bounds
    from .volume import count_writes, normalize_zarr, open_zarr

    src, dst = Path(src), Path(dst)
    check_volume_task(src, dst)
    layout, info = volume_layout(
        src,
        per=options.get("per", "channel"),
        compress=options.get("compress", "auto"),
        pyramid=options.get("pyramid"),
        ngff=options.get("ngff", "0.5"),
    )
    given = {key: options[key] for key in _VOLUME_OPTIONS if key in options}
    maximum, minimum = given.get("max", "data"), given.get("min")
    for end, bound in (("max", maximum), ("min", minimum)):
        if isinstance(bound, (list, tuple)):
            raise FileError(src, f"--{end} lists values per channel; --scheduler takes one")
    if minimum is None:  # as normvol: 0 for unsigned integers, the data's min otherwise
        minimum = 0.0 if np.dtype(info.dtype).kind == "u" else "data"
    percentile = given.get("percentiles")
    device = given.get("device", "auto")
    device = getattr(device, "type", device)  # a torch.device from the command: its kind
    clip = bool(given.get("clip", False))

    def on_bounds(low: float, high: float) -> None:
        check_bounds(src, low, high)
        if reporter is not None:
            reporter.detail(f"{src}: min {low:.10g}, max {high:.10g} (on {client})")

    total = count_writes(open_zarr(src).array, ome=True, layout=layout)
    run_options = dict(
        min=None if percentile is not None else minimum,
        max=None if percentile is not None else maximum,
        percentile=percentile,
        eps=given.get("eps", 1e-20) if percentile is not None else None,
        clip=clip,
        dtype=given.get("dtype", "float32"),
        overwrite=bool(given.get("overwrite", False)),
        client=client,
        device=device,
        ome=True,
    )

    try:
        with (
            reporter.progress(dst.name, total)
            if reporter is not None
            else contextlib.nullcontext(lambda n=1: None)
        ) as advance:
            run = normalize_zarr(
                src,
                dst,
                on_bounds=on_bounds,
                on_progress=advance,
                layout=layout,
                **run_options,
            )
    except ImgopsError:
        raise
    except ValueError as error:  # bounds: a constant volume, bad percentiles
        raise FileError(src, str(error)) from None
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as error:  # a task's error on a worker: a bad chunk, a full disk
        raise FileError(src, f"{type(error).__name__}: {error}") from None
    if run.outside and reporter is not None:  # the single-process command's warning
        reporter.info(
            f"imgops: warning: {src}: {run.outside} values "
            f"({100 * run.outside / max(1, run.values):.3g}%) lie outside [min, max] and map "
            "outside [0, 1] (use --clip to clamp them)"
        )
    return run


def normalize_with_scheduler(
    spec: str,
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    reporter: Any = None,
    **options: Any,
) -> VolumeRun:
    """normalize_on_cluster on the cluster `spec` names (started and closed here)."""
    from .cluster import connect

    with connect(spec, preload=VOLUME_PRELOAD) as client:
        return normalize_on_cluster(client, src, dst, options, reporter=reporter)
