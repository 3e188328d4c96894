"""`imgops bin`: block means of stacks by integer factors in Z, Y and X, streamed.

The work is `imgops.volume_files.bin_file` (the volume engine with `imgops.ops.bin`).
"""

from __future__ import annotations

from pathlib import Path

import click

from ..cli_common import (
    ImgopsCommand,
    device_option,
    files_from_option,
    null_option,
    overwrite_option,
    planner_errors,
    quiet_option,
    recursive_option,
    resolve_device,
    skip_existing_option,
    verbose_option,
)
from .normvol import plan_batch, run_plan, split_name


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
    compress: str,
    chunk_mb: float,
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
    """
    from ..report import Report

    report = Report(quiet=quiet, verbose=verbose)
    with planner_errors():
        plan = plan_batch(
            inputs,
            output,
            directory,
            None,
            files_from,
            null,
            recursive,
            overwrite,
            skip_existing,
            zarr_output=False,
            default_name=lambda p: bin_output_for(p, None, directory, factors).name,
        )
    report.total = plan.total
    from ..io.volumes import quiet_tifffile
    from ..volume_files import bin_file

    if not verbose:
        quiet_tifffile()
    torch_device = resolve_device(device)

    def message(kind: str, text: str) -> None:
        (report.detail if kind == "detail" else report.info)(text)

    def work(source: Path, target: Path):
        return bin_file(
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

    run_plan(plan, report, work, "bin")
