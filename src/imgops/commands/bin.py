"""`imgops bin`: block means of stacks by integer factors in Z, Y and X, streamed.

The work is `imgops.volume_files.bin_file` (the volume engine with `imgops.ops.bin`); the plan
and the batch loop are the volume commands' (imgops.commands.volume_batch).
"""

from __future__ import annotations

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
    skip_existing_option,
    stats_json_option,
    verbose_option,
)
from .volume_batch import plan_batch, run_plan, split_name


def _factor(ctx: click.Context, param: click.Parameter, value):
    if value is None:
        return None
    if any(f < 1 for f in value):
        raise click.BadParameter(
            f"factors must be positive integers, got {' '.join(map(str, value))}"
        )
    if all(f == 1 for f in value):
        raise click.BadParameter("all factors are 1: nothing to bin")
    return tuple(value)


def bin_output_for(path: Path, output: Path | None, directory: Path | None, factors) -> Path:
    """-o, DIR/<name>, or <stem>_bin<fz><fy><fx><suffix> beside the input."""
    if output is not None:
        return output
    stem, suffix = split_name(path)
    if suffix.endswith(".zarr"):
        suffix = ".tif"
    if directory is not None:
        return directory / f"{stem}{suffix}"
    return path.with_name(f"{stem}_bin{''.join(map(str, factors))}{suffix}")


def _is_binned(candidate: Path, source: Path, factors) -> bool:
    """Whether the stack `candidate` has the planes, size and type `source` binned by `factors`
    has (an earlier `imgops bin` output, left out of a rerun over a folder or a glob)."""
    from ..errors import ImgopsError
    from ..io.volumes import open_volume
    from ..volume_files import binned_info

    try:
        with open_volume(source) as reader:
            expected = binned_info(reader.info, factors)
        with open_volume(candidate) as reader:
            found = reader.info
    except (ImgopsError, OSError, ValueError):
        return False
    return (found.shape, found.dtype) == (expected.shape, expected.dtype)


@click.command(cls=ImgopsCommand, name="bin")
@click.argument("inputs", nargs=-1, type=click.Path(path_type=Path, readable=False))
@click.option(
    "--factor",
    "factors",
    nargs=3,
    type=int,
    required=True,
    callback=_factor,
    metavar="FZ FY FX",
    help="Block size in Z, Y and X (e.g. 1 2 2: halve Y and X).",
)
@click.option(
    "-o", "--output", type=click.Path(path_type=Path, dir_okay=False), help="Output file."
)
@click.option(
    "-d",
    "--output-dir",
    "directory",
    type=click.Path(path_type=Path, file_okay=False),
    help="Write DIR/<name> for each input (created if missing).",
)
@recursive_option
@files_from_option
@null_option
@name_option("{stem}_bin<FZ><FY><FX>.tif", "{stem}.tif")
@click.option(
    "--compress",
    type=click.Choice(["auto", "none", "zlib", "zstd", "lzw"]),
    default="auto",
    show_default=True,
    help="auto = zlib when the input was compressed, else none.",
)
@click.option(
    "--chunk-mb",
    type=click.FloatRange(min=0, min_open=True),
    default=256,
    show_default=True,
    help="Memory for plane buffers in flight; chunks are whole Z blocks.",
)
@stats_json_option
@device_option
@overwrite_option
@skip_existing_option
@quiet_option
@verbose_option
def bin_command(
    inputs: tuple[Path, ...],
    factors: tuple[int, int, int],
    output: Path | None,
    directory: Path | None,
    recursive: bool,
    files_from,
    null: bool,
    name_template: str | None,
    compress: str,
    chunk_mb: float,
    stats_json: Path | None,
    device: str,
    overwrite: bool,
    skip_existing: bool,
    quiet: bool,
    verbose: bool,
) -> None:
    """Bin stacks: the mean of each FZ x FY x FX block (Fiji's Bin, average, with crop).

    Trailing partial blocks are dropped; 8/16-bit integers give the exact mean rounded half up,
    float32 the exact mean. Hyperstacks bin Z within each channel and time point. Memory stays
    about --chunk-mb; resolution, spacing and physical sizes are scaled.

    \b
    $ imgops bin stack.tif --factor 1 2 2            # stack_bin122.tif
    $ imgops bin scans/ --factor 2 2 2 -d binned/
    $ imgops bin scans/ -r --factor 1 4 4 --name '{parent}_{stem}_small.{ext}'
    """
    import time

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
            zarr_output=False,
            default_name=lambda p: bin_output_for(p, None, directory, factors).name,
            stats_path=stats_json,
            earlier_output=lambda candidate, source: _is_binned(candidate, source, factors),
        )
    report.total = plan.total
    from ..io.volumes import quiet_tifffile
    from ..volume_files import bin_file

    if not verbose:
        quiet_tifffile()
    torch_device = resolve_device(device)

    def message(kind: str, text: str) -> None:
        (report.detail if kind == "detail" else report.info)(text)

    files: list[dict] = []

    def work(source: Path, target: Path):
        result = bin_file(
            source,
            target,
            factors,
            chunk_mb=chunk_mb,
            device=torch_device,
            compress=compress,
            overwrite=overwrite,
            progress=report.progress,
            on_message=message,
        )
        files.append(
            {
                "input": str(source),
                "output": str(target),
                "shape": list(result.shape),
                "seconds": result.seconds,
            }
        )
        return result

    started = time.perf_counter()

    def stats() -> dict:
        return {
            "command": "bin",
            "factors": list(factors),
            "device": str(torch_device),
            "chunk_mb": chunk_mb,
            "compress": compress,
            "wall_seconds": time.perf_counter() - started,
            "files": files,
        }

    run_plan(plan, report, work, "bin", stats_path=stats_json, stats=stats)
