"""`imgops normvol`: stacks to float32/float16, per channel, streamed chunk by chunk.

The work is `imgops.volume_files.normalize_file`; this module parses options, plans the
inputs and outputs, and reports (one line per file, warnings, the batch summary).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import click

from ..cli_common import (
    ImgopsCommand,
    device_option,
    files_from_option,
    name_option,
    null_option,
    overwrite_option,
    planner_errors,
    quiet_option,
    recursive_option,
    resolve_device,
    scheduler_option,
    skip_existing_option,
    stats_json_option,
    verbose_option,
)
from ..errors import FileError
from .volume_batch import plan_batch, run_plan, split_name

PER_HELP = (
    "Statistics per channel (the default wherever the stack has a C axis), per time point, "
    "per channel and time point, or one set for the whole stack."
)


def _parse_bound(ctx: click.Context, param: click.Parameter, text: str | None):
    """A number, 'dtype', 'data', or a comma list of numbers (one per channel)."""
    if text is None:
        return None
    word = text.strip().lower()
    if word in ("dtype", "data"):
        return word
    parts = [p.strip() for p in word.split(",")]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise click.BadParameter(
            f"expected a number, 'dtype', 'data' or numbers per channel (a,b,...), got {text!r}"
        ) from None
    if not all(math.isfinite(v) for v in values):
        raise click.BadParameter(f"must be a finite number, got {text!r}")
    return values[0] if len(values) == 1 else values


def _check_percentiles(ctx: click.Context, param: click.Parameter, value):
    if value is None:
        return None
    low, high = value
    if not all(math.isfinite(v) for v in value) or not 0 <= low < high <= 100:
        raise click.BadParameter(f"need 0 <= LO < HI <= 100, got {low:g} {high:g}")
    return (low, high)


def _positive(ctx: click.Context, param: click.Parameter, value: float) -> float:
    if not math.isfinite(value) or value <= 0:
        raise click.BadParameter(f"must be a positive number of MiB, got {value:g}")
    return value


def output_for(path: Path, output: Path | None, directory: Path | None) -> Path:
    """Where one input's result goes: -o, DIR/<stem><suffix>, or <stem>_norm<suffix> beside
    the input (`.ome.tif` stays `.ome.tif`)."""
    if output is not None:
        return output
    stem, suffix = split_name(path)
    if suffix.endswith(".zarr"):
        suffix = ".ome.zarr"
    if directory is not None:
        return directory / f"{stem}{suffix}"
    return path.with_name(f"{stem}_norm{suffix}")


@click.command(cls=ImgopsCommand)
@click.argument("inputs", nargs=-1, type=click.Path(path_type=Path, readable=False))
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Output (.tif or .ome.zarr).")
@click.option(
    "-d",
    "--output-dir",
    "--dir",
    "directory",
    type=click.Path(path_type=Path, file_okay=False),
    help="Write DIR/<name> for each input (created if missing).",
)
@recursive_option
@files_from_option
@null_option
@name_option("{stem}_norm.tif", "{stem}.tif")
@click.option(
    "--max",
    "maximum",
    metavar="N|dtype|data|N,N,..",
    callback=_parse_bound,
    help="Value mapped to 1: a number, 'dtype' (the integer type's max), 'data' (the group's "
    "max, the default) or one number per channel.",
)
@click.option(
    "--min",
    "minimum",
    metavar="N|dtype|data|N,N,..",
    callback=_parse_bound,
    help="Value mapped to 0. Default: 0 for unsigned integer stacks, 'data' (the group's min) "
    "for signed and float stacks. The values used are printed.",
)
@click.option(
    "--percentile",
    "percentiles",
    nargs=2,
    type=float,
    metavar="LO HI",
    callback=_check_percentiles,
    help="CSBDeep's normalize: map each group's exact LO and HI percentiles (numpy's definition) "
    "to 0 and 1, (x - lo) / (hi - lo + eps) in float32. Not with --min/--max.",
)
@click.option(
    "--per",
    type=click.Choice(["channel", "time", "channel,time", "none"]),
    default="channel",
    show_default=True,
    help=PER_HELP,
)
@click.option("--clip", is_flag=True, help="Clamp the result to [0, 1] (NaN stays NaN).")
@click.option(
    "--eps", type=float, default=1e-20, show_default=True, help="--percentile: CSBDeep's eps."
)
@click.option(
    "--dtype",
    type=click.Choice(["float32", "float16"]),
    default="float32",
    show_default=True,
    help="Output type (float16 halves the output; not for ImageJ readers).",
)
@click.option(
    "--compress",
    type=click.Choice(["auto", "none", "zlib", "zstd", "lzw", "blosc"]),
    default="auto",
    show_default=True,
    help="TIFF: auto = zlib when the input was compressed, else none (both ImageJ-readable); "
    "zstd is not read by ImageJ. Zarr: auto = zstd (level 1); blosc, zlib, none.",
)
@click.option(
    "--predictor/--no-predictor",
    default=None,
    help="Floating-point predictor (default: with zstd only; ImageJ reads none).",
)
@click.option(
    "--pyramid",
    type=click.IntRange(1, 12),
    default=None,
    help="OME-Zarr: resolution levels (default: down to 256 pixels).",
)
@click.option(
    "--ngff",
    type=click.Choice(["0.5", "0.4"]),
    default="0.5",
    show_default=True,
    help="OME-Zarr: NGFF version (0.5: Zarr v3; 0.4: Zarr v2).",
)
@click.option(
    "--chunk-mb",
    type=float,
    default=256,
    show_default=True,
    callback=_positive,
    help="Memory for plane buffers in flight (host, and GPU on CUDA); chunks are whole planes.",
)
@stats_json_option
@device_option
@scheduler_option
@overwrite_option
@skip_existing_option
@quiet_option
@verbose_option
def normvol(
    inputs: tuple[Path, ...],
    output: Path | None,
    directory: Path | None,
    recursive: bool,
    files_from,
    null: bool,
    name_template: str | None,
    maximum,
    minimum,
    percentiles,
    per: str,
    clip: bool,
    eps: float,
    dtype: str,
    compress: str,
    predictor: bool | None,
    pyramid: int | None,
    ngff: str,
    chunk_mb: float,
    stats_json: Path | None,
    device: str,
    scheduler: str | None,
    overwrite: bool,
    skip_existing: bool,
    quiet: bool,
    verbose: bool,
) -> int:
    """Normalise stacks: out = (x - min) / (max - min), per channel, streamed in chunks.

    Reads TIFF stacks and hyperstacks (ImageJ, OME, multi-page; any tifffile codec; axes
    T, Z, C, Y, X) of uint8/16, int16, uint32, int32, float16 or float32, of any size: memory
    stays about --chunk-mb. Writes float32 (or float16) TIFF keeping axes, resolution,
    ImageJ Info/Labels/ranges and OME-XML, or OME-Zarr (-o x.ome.zarr) with a pyramid.
    Default output: <stem>_norm.tif (or .ome.tif) beside the input. NaN/inf are left out of
    the statistics and written as they are. See docs/VOLUMES.md.

    \b
    $ imgops normvol scan.tif                      # max = the data's max (printed)
    $ imgops normvol scan.tif --max 4095 -o out.tif
    $ imgops normvol cells.tif --percentile 1 99.8 --clip      # per channel, CSBDeep-style
    $ imgops normvol scan.tif -o scan.ome.zarr
    $ imgops normvol folder/ -r --percentile 1 99.8 -d normalised/
    $ imgops normvol scan.zarr --percentile 1 99.8 --scheduler local:4   # scan_norm.ome.zarr

    With --scheduler (imgops[dask]) zarr / OME-Zarr inputs are normalised chunk-parallel on a
    Dask cluster into OME-Zarr, one set of bounds per volume (see docs/DASK.md).
    """
    if output is not None and directory is not None:
        raise click.UsageError("use -o/--output or -d/--output-dir, not both")
    if percentiles is not None and (maximum is not None or minimum is not None):
        raise click.UsageError("--percentile sets both ends; drop --min/--max")
    if isinstance(maximum, float) and isinstance(minimum, float) and maximum <= minimum:
        raise click.BadParameter(
            f"--max {maximum:g} must be greater than --min {minimum:g}", param_hint="--max"
        )
    if isinstance(maximum, float) and minimum is None and maximum <= 0:
        raise click.BadParameter(
            f"--max {maximum:g} must be greater than --min (default 0 for unsigned stacks)",
            param_hint="--max",
        )
    from ..report import Report

    report = Report(quiet=quiet, verbose=verbose)
    with planner_errors():
        plan = plan_batch(
            inputs,
            output,
            directory,
            name_template,
            files_from,
            null,
            recursive,
            overwrite,
            skip_existing,
            default_name=lambda p: output_for(p, None, directory).name,
            stats_path=stats_json,
        )
    report.total = plan.total
    if not verbose:
        from ..io.volumes import quiet_tifffile

        quiet_tifffile()
    torch_device = resolve_device(device) if scheduler is None else device
    options = dict(
        max=maximum if maximum is not None else "data",
        min=minimum,
        percentiles=percentiles,
        per=per,
        clip=clip,
        eps=eps,
        dtype=dtype,
        compress=compress,
        predictor=predictor,
        pyramid=pyramid,
        ngff=ngff,
        chunk_mb=chunk_mb,
        device=torch_device,
        overwrite=overwrite,
    )
    files: list[dict] = []
    started = time.perf_counter()

    def stats() -> dict:
        return {
            "command": "normvol",
            "device": str(torch_device),
            "scheduler": scheduler,
            "chunk_mb": chunk_mb,
            "compress": compress,
            "wall_seconds": time.perf_counter() - started,
            "files": files,
        }

    def record(src: Path, dst: Path, result) -> None:
        entry: dict = {"input": str(src), "output": str(dst)}
        if hasattr(result, "labels"):  # NormalizeResult: bounds per group
            entry["bounds"] = {
                label: [lo, hi]
                for label, lo, hi in zip(result.labels, result.lows, result.highs, strict=True)
            }
            entry["seconds"] = result.seconds
        elif hasattr(result, "low"):  # dask.volume.VolumeRun: one pair of bounds
            entry["bounds"] = {"all": [result.low, result.high]}
            entry["seconds"] = sum(result.seconds.values())
        entry["outside_0_1"] = getattr(result, "outside", 0)
        files.append(entry)

    if scheduler is not None:
        _run_on_cluster(plan, report, options, scheduler, stats_json, stats, record)
        return

    def work(src: Path, dst: Path):
        result = _normalise_one(src, dst, options, report)
        record(src, dst, result)
        return result

    run_plan(plan, report, work, "normvol", stats_path=stats_json, stats=stats)


def _run_on_cluster(plan, report, options: dict, scheduler: str, stats_path, stats, record) -> None:
    """The plan on the Dask cluster `scheduler` names: inputs that cannot go there fail
    without starting one, then one connection serves every volume."""
    from ..dask import require_dask
    from ..dask.cluster import connect
    from ..dask.run import (
        VOLUME_PRELOAD,
        check_volume_task,
        normalize_on_cluster,
        start_local_workers,
    )

    start_local_workers(scheduler, VOLUME_PRELOAD)  # its imports (torch) beside ours below
    require_dask("dask.array", "distributed", "zarr")
    problems: dict[Path, FileError] = {}
    for task in plan.tasks:
        try:
            check_volume_task(task.source.path, task.target)
        except FileError as error:
            problems[task.source.path] = error

    def work_on(client):
        def work(src: Path, dst: Path):
            if src in problems:
                raise problems[src]
            result = normalize_on_cluster(client, src, dst, options, reporter=report)
            record(src, dst, result)
            return result

        return work

    if len(problems) == len(plan.tasks):  # nothing for a cluster to do
        run_plan(plan, report, work_on(None), "normvol", stats_path=stats_path, stats=stats)
        return
    with connect(scheduler, preload=VOLUME_PRELOAD) as client:
        run_plan(plan, report, work_on(client), "normvol", stats_path=stats_path, stats=stats)


def _normalise_one(path: Path, target: Path, options: dict, reporter):
    from ..volume_files import normalize_file

    def message(kind: str, text: str) -> None:
        if kind == "warning":
            reporter.info(f"imgops: warning: {text}")
        elif kind == "info":
            reporter.info(text)
        else:
            reporter.detail(text)

    return normalize_file(path, target, **options, on_message=message, progress=reporter.progress)


def _smaller_chunks_on_gpu_oom(run, plan, path: Path, device, reporter):
    """(run(plan), plan) halving the chunk after GPU out-of-memory errors (CUDA only; kept for
    callers of the old name: the engine's `run_with_smaller_chunks` is the one place)."""
    from ..volume import run_with_smaller_chunks

    if device.type != "cuda":
        return run(plan), plan

    def note(old, new) -> None:
        reporter.info(
            f"{path}: out of GPU memory with {old.slices_per_chunk} slices per chunk; "
            f"retrying with {new.slices_per_chunk}"
        )

    return run_with_smaller_chunks(run, plan, device, on_retry=note)
