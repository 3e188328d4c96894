"""`imgops bin`: block means of stacks by integer factors in Z, Y and X, streamed.

The work is `imgops.volume_files.bin_file` (the volume engine with `imgops.ops.bin`).
"""

from __future__ import annotations

from pathlib import Path

import click

from ..cli_common import (
    Reporter,
    device_option,
    overwrite_option,
    quiet_option,
    resolve_device,
    skip_existing_option,
    verbose_option,
)
from ..errors import ImgopsError
from .normvol import _check_targets, collect_inputs, split_name


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


@click.command(name="bin")
@click.argument("inputs", nargs=-1, type=click.Path(path_type=Path))
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
@click.option("-r", "--recursive", is_flag=True, help="Folders: include sub-folders.")
@click.option("--files-from", type=click.File("r"), help="Read input paths from FILE ('-': stdin).")
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
    if output is not None and directory is not None:
        raise click.UsageError("use -o/--output or -d/--output-dir, not both")
    reporter = Reporter(quiet=quiet, verbose=verbose)
    try:
        paths = collect_inputs(inputs, recursive, files_from)
    except ImgopsError as error:
        raise click.UsageError(error.format_message()) from None
    if not paths:
        raise click.UsageError("no inputs (give files, folders, or --files-from)")
    if output is not None and len(paths) > 1:
        raise click.UsageError("-o/--output takes one input; use -d/--output-dir for several")
    targets = [bin_output_for(p, output, directory, factors) for p in paths]
    _check_targets(paths, targets)
    from ..io.volumes import quiet_tifffile
    from ..volume_files import bin_file

    if not verbose:
        quiet_tifffile()
    torch_device = resolve_device(device)
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
    done = failures = skipped = 0
    for path, target in zip(paths, targets, strict=True):
        if skip_existing and target.exists():
            skipped += 1
            continue
        try:
            result = bin_file(
                path,
                target,
                factors,
                chunk_mb=chunk_mb,
                device=torch_device,
                compress=compress,
                overwrite=overwrite,
                progress=reporter.progress,
                on_message=lambda kind, text: (
                    reporter.info if kind != "detail" else reporter.detail
                )(text),
            )
            done += 1
            reporter.info(result.summary())
        except ImgopsError as error:
            failures += 1
            reporter.error(error.format_message())
    if len(paths) > 1 or failures:
        summary = f"bin: {done} written, {skipped} skipped, {failures} failed"
        (reporter.error if failures and quiet else reporter.info)(summary)
    if failures:
        raise click.exceptions.Exit(1)
