"""`imgops normvol`: stacks to float32/float16, per channel, streamed chunk by chunk.

The work is `imgops.volume_files.normalize_file`; this module parses options, plans the
inputs and outputs, and reports (one line per file, warnings, the batch summary).
"""

from __future__ import annotations

import math
import traceback
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
from ..errors import FileError, ImgopsError

_TIFF_SUFFIXES = (".ome.tiff", ".ome.tif", ".tiff", ".tif")
_INPUT_SUFFIXES = (".tif", ".tiff")
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


def split_name(path: Path) -> tuple[str, str]:
    """(stem, suffix) with the OME part kept in the suffix: x.ome.tif -> (x, .ome.tif)."""
    name = path.name
    for suffix in _TIFF_SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)], name[-len(suffix) :]
    return path.stem, path.suffix or ".tif"


def output_stem(path: Path) -> str:
    """The input's name without its TIFF (and OME) suffix."""
    return split_name(path)[0]


def output_for(path: Path, output: Path | None, directory: Path | None) -> Path:
    """Where one input's result goes: -o, DIR/<stem><suffix>, or <stem>_norm<suffix> beside
    the input (`.ome.tif` stays `.ome.tif`)."""
    if output is not None:
        return output
    stem, suffix = split_name(path)
    if directory is not None:
        return directory / f"{stem}{suffix}"
    return path.with_name(f"{stem}_norm{suffix}")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and a.samefile(b)
    except OSError:
        return False


def collect_inputs(paths, recursive: bool, files_from) -> list[Path]:
    """Files as given; folders expanded to their TIFF files (sorted; all levels with -r);
    --files-from adds one path a line ('-' is stdin)."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            pattern = "**/*" if recursive else "*"
            try:
                entries = sorted(path.glob(pattern))
            except OSError as error:
                raise FileError(path, f"cannot list the folder: {error.strerror}") from error
            files = [p for p in entries if p.is_file() and p.suffix.lower() in _INPUT_SUFFIXES]
            if not files:
                raise FileError(path, "no .tif/.tiff files in this folder")
            found.extend(files)
        else:
            found.append(path)
    if files_from is not None:
        found.extend(Path(line.strip()) for line in files_from if line.strip())
    return found


@click.command()
@click.argument("inputs", nargs=-1, type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Output (.tif or .ome.zarr).")
@click.option(
    "-d",
    "--output-dir",
    "--dir",
    "directory",
    type=click.Path(path_type=Path, file_okay=False),
    help="Write DIR/<name> for each input (created if missing).",
)
@click.option("-r", "--recursive", is_flag=True, help="Folders: include sub-folders.")
@click.option(
    "--files-from",
    type=click.File("r"),
    help="Read input paths from FILE, one a line ('-' for stdin).",
)
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
    type=click.Choice(["auto", "none", "zlib", "zstd", "lzw"]),
    default="auto",
    show_default=True,
    help="TIFF: auto = zlib when the input was compressed, else none (both ImageJ-readable); "
    "zstd is not read by ImageJ. Zarr: auto = zstd.",
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
    "--chunk-mb",
    type=float,
    default=256,
    show_default=True,
    callback=_positive,
    help="Memory for plane buffers in flight (host, and GPU on CUDA); chunks are whole planes.",
)
@device_option
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
    chunk_mb: float,
    device: str,
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
    if output is not None and output.is_dir() and not output.name.lower().endswith(".zarr"):
        raise click.BadParameter(f"{output} is a directory", param_hint="-o/--output")
    reporter = Reporter(quiet=quiet, verbose=verbose)
    try:
        paths = collect_inputs(inputs, recursive, files_from)
    except FileError as error:
        raise click.UsageError(error.format_message()) from None
    if not paths:
        raise click.UsageError("no inputs (give files, folders, or --files-from)")
    if output is not None and len(paths) > 1:
        raise click.UsageError("-o/--output takes one input; use -d/--output-dir for several")
    paths, own = _drop_own_outputs(paths, output, directory)
    for path, source in own:
        reporter.detail(f"{path}: skipped (it is the output of {source})")
    targets = [output_for(path, output, directory) for path in paths]
    _check_targets(paths, targets)
    if not verbose:
        from ..io.volumes import quiet_tifffile

        quiet_tifffile()
    torch_device = resolve_device(device)
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
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
        chunk_mb=chunk_mb,
        device=torch_device,
        overwrite=overwrite,
    )
    failures = done = skipped = 0
    for path, target in zip(paths, targets, strict=True):
        if skip_existing and target.exists():
            reporter.detail(f"{target}: exists, skipped")
            skipped += 1
            continue
        try:
            result = _normalise_one(path, target, options, reporter)
            done += 1
            reporter.info(result.summary())
        except ImgopsError as error:
            failures += 1
            reporter.error(error.format_message())
            if verbose:
                traceback.print_exc()
        except MemoryError:
            failures += 1
            reporter.error(f"{path}: out of memory (try a smaller --chunk-mb)")
        except Exception as error:  # torch.OutOfMemoryError after halving to one plane
            if type(error).__name__ != "OutOfMemoryError":
                raise
            failures += 1
            reporter.error(
                f"{path}: out of GPU memory even with one plane per chunk "
                "(free GPU memory, or use --device cpu)"
            )
    if len(paths) > 1 or failures:
        summary = f"normvol: {done} written, {skipped} skipped, {failures} failed"
        if failures and quiet:
            reporter.error(summary)
        else:
            reporter.info(summary)
    if failures:
        raise click.exceptions.Exit(1)
    return 0


def _normalise_one(path: Path, target: Path, options: dict, reporter: Reporter):
    from ..volume_files import normalize_file

    def message(kind: str, text: str) -> None:
        if kind == "warning":
            reporter.info(f"imgops: warning: {text}")
        elif kind == "info":
            reporter.info(text)
        else:
            reporter.detail(text)

    return normalize_file(path, target, **options, on_message=message, progress=reporter.progress)


def _drop_own_outputs(paths: list[Path], output, directory) -> tuple[list[Path], list]:
    """Inputs that are another input's default output (a rerun over `*.tif`) are left out."""
    if output is not None or directory is not None:
        return paths, []
    produced = {}
    for path in paths:
        produced.setdefault(output_for(path, None, None).absolute(), path)
    kept, own = [], []
    for path in paths:
        source = produced.get(path.absolute())
        if source is not None and source != path:
            own.append((path, source))
        else:
            kept.append(path)
    return kept, own


def _check_targets(inputs: list[Path], targets: list[Path]) -> None:
    """No output may be another output, or any input of the batch (same path or same inode)."""
    seen: dict[Path, Path] = {}
    resolved_inputs = {p.resolve(): p for p in inputs}
    for path, target in zip(inputs, targets, strict=True):
        key = target.resolve()
        if key in seen:
            raise click.UsageError(f"{seen[key]} and {path} would both write {target}")
        seen[key] = path
        if key in resolved_inputs or any(_same_file(p, target) for p in inputs):
            victim = resolved_inputs.get(key, path)
            raise click.UsageError(f"{victim}: the output of {path} would overwrite the input")
