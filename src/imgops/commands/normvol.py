"""`imgops normvol`: TIFF stacks to float32/float16 in [0, 1], streamed chunk by chunk."""

from __future__ import annotations

import math
import traceback
from dataclasses import dataclass
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

_TYPE_RANGE = {"uint8": (0, 255), "uint16": (0, 65535), "int16": (-32768, 32767)}
_TIFF_SUFFIXES = (".ome.tiff", ".ome.tif", ".tiff", ".tif")


@dataclass(frozen=True)
class Bound:
    """One end of the range: a number, the input type's limit (`dtype`) or the data's (`data`)."""

    kind: str  # "number", "dtype" or "data"
    value: float = 0.0

    def describe(self) -> str:
        return f"{self.value:g}" if self.kind == "number" else self.kind


def _parse_bound(ctx: click.Context, param: click.Parameter, text: str | None) -> Bound | None:
    if text is None:
        return None
    word = text.strip().lower()
    if word in ("dtype", "data"):
        return Bound(word)
    try:
        value = float(word)
    except ValueError:
        raise click.BadParameter(f"expected a number, 'dtype' or 'data', got {text!r}") from None
    if not math.isfinite(value):
        raise click.BadParameter(f"must be a finite number, got {text!r}")
    return Bound("number", value)


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


def output_stem(path: Path) -> str:
    """The input's name without its TIFF (and OME) suffix."""
    name = path.name
    for suffix in _TIFF_SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def output_for(path: Path, output: Path | None, directory: Path | None) -> Path:
    """Where one input's result goes: -o, DIR/<stem>.tif, or <stem>_norm.tif beside the input."""
    if output is not None:
        return output
    if directory is not None:
        return directory / f"{output_stem(path)}.tif"
    return path.with_name(f"{output_stem(path)}_norm.tif")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and a.samefile(b)
    except OSError:
        return False


@dataclass
class _Settings:
    maximum: Bound | None
    minimum: Bound | None
    percentiles: tuple[float, float] | None
    clip: bool
    dtype: str
    chunk_mb: float
    overwrite: bool


@click.command()
@click.argument("inputs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "-o", "--output", type=click.Path(path_type=Path, dir_okay=False), help="Output file."
)
@click.option(
    "-d",
    "--dir",
    "directory",
    type=click.Path(path_type=Path, file_okay=False),
    help="Write DIR/<stem>.tif for each input (created if missing).",
)
@click.option(
    "--max",
    "maximum",
    metavar="N|dtype|data",
    callback=_parse_bound,
    help="Value mapped to 1: a number, 'dtype' (the input type's max) or 'data' "
    "(the data's max, the default; printed).",
)
@click.option(
    "--min",
    "minimum",
    metavar="N|dtype|data",
    callback=_parse_bound,
    help="Value mapped to 0: a number (default 0), 'dtype' or 'data'.",
)
@click.option(
    "--percentile",
    "percentiles",
    nargs=2,
    type=float,
    metavar="LO HI",
    callback=_check_percentiles,
    help="Map the data's LO and HI percentiles to 0 and 1 (exact; numpy.percentile's "
    "default 'linear' definition). Not with --min/--max.",
)
@click.option("--clip", is_flag=True, help="Clamp the result to [0, 1].")
@click.option(
    "--dtype",
    type=click.Choice(["float32", "float16"]),
    default="float32",
    show_default=True,
    help="Output type (float16 halves the output; not for ImageJ readers).",
)
@click.option(
    "--chunk-mb",
    type=float,
    default=256,
    show_default=True,
    callback=_positive,
    help="Memory for slice buffers in flight (host, and GPU on CUDA); chunks are whole slices.",
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
    maximum: Bound | None,
    minimum: Bound | None,
    percentiles: tuple[float, float] | None,
    clip: bool,
    dtype: str,
    chunk_mb: float,
    device: str,
    overwrite: bool,
    skip_existing: bool,
    quiet: bool,
    verbose: bool,
) -> int:
    """Normalise TIFF stacks: out = (x - min) / (max - min), streamed in chunks of whole slices.

    Reads uint8/uint16/int16 stacks (multi-page, ImageJ, OME, zlib; LZW etc. with
    imagecodecs; 2-D images as one slice) of any size: memory stays about --chunk-mb.
    Writes float32 (or float16) pages, BigTIFF past 4 GB, keeping axes, resolution and
    ImageJ spacing. Default output: <stem>_norm.tif beside the input.

    \b
    $ imgops normvol scan.tif                      # max = the data's max (printed)
    $ imgops normvol scan.tif --max 4095 -o out.tif
    $ imgops normvol scan.tif --max dtype --dtype float16
    $ imgops normvol *.tif --percentile 1 99.8 --clip -d normalised/
    """
    if output is not None and directory is not None:
        raise click.UsageError("use -o/--output or -d/--dir, not both")
    if output is not None and len(inputs) > 1:
        raise click.UsageError("-o/--output takes one input; use -d/--dir for several")
    if percentiles is not None and (maximum is not None or minimum is not None):
        raise click.UsageError("--percentile sets both ends; drop --min/--max")
    if (
        maximum is not None
        and minimum is not None
        and maximum.kind == minimum.kind == "number"
        and maximum.value <= minimum.value
    ):
        raise click.BadParameter(
            f"--max {maximum.value:g} must be greater than --min {minimum.value:g}",
            param_hint="--max",
        )
    if maximum is not None and minimum is None and maximum.kind == "number" and maximum.value <= 0:
        raise click.BadParameter(
            f"--max {maximum.value:g} must be greater than --min (default 0)", param_hint="--max"
        )
    targets = [output_for(path, output, directory) for path in inputs]
    _check_targets(inputs, targets)
    reporter = Reporter(quiet=quiet, verbose=verbose)
    settings = _Settings(
        maximum=maximum or (None if percentiles else Bound("data")),
        minimum=minimum or (None if percentiles else Bound("number", 0.0)),
        percentiles=percentiles,
        clip=clip,
        dtype=dtype,
        chunk_mb=chunk_mb,
        overwrite=overwrite,
    )
    if not verbose:
        from ..io.volumes import quiet_tifffile

        quiet_tifffile()
    torch_device = resolve_device(device)
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
    failures = done = skipped = 0
    for path, target in zip(inputs, targets, strict=True):
        if skip_existing and target.exists():
            reporter.detail(f"{target}: exists, skipped")
            skipped += 1
            continue
        try:
            _normalise_one(path, target, settings, torch_device, reporter)
            done += 1
        except ImgopsError as error:
            failures += 1
            reporter.error(error.format_message())
            if verbose:
                traceback.print_exc()
        except (MemoryError, RuntimeError) as error:
            if not _out_of_memory(error):
                raise
            failures += 1
            reporter.error(f"{path}: {_out_of_memory_advice(error, torch_device)}")
            if verbose:
                traceback.print_exc()
        finally:
            _release_device_memory(torch_device)
    if len(inputs) > 1 or failures:
        summary = f"normvol: {done} written, {skipped} skipped, {failures} failed"
        if failures and quiet:
            reporter.error(summary)
        else:
            reporter.info(summary)
    if failures:
        raise click.exceptions.Exit(1)
    return 0


def _smaller_chunks_on_gpu_oom(run, plan, path: Path, device, reporter):
    """(run(plan), plan), halving the slices per chunk after each GPU out-of-memory error.

    Each try starts the pass over (the output of a failed try is discarded by atomic_output);
    with one slice per chunk the error goes to the caller, which reports it.
    """
    import torch

    while True:
        try:
            return run(plan), plan
        except torch.OutOfMemoryError:
            if device.type != "cuda" or plan.slices_per_chunk == 1:
                raise
        # Out of the except block: the failed try's device buffers are referenced only by the
        # traceback's frames (a cycle through the recorded error); collect them, then hand the
        # cached blocks back so the smaller try has the whole device.
        _release_device_memory(device)
        smaller = plan.halved()
        reporter.info(
            f"{path}: out of GPU memory with {plan.slices_per_chunk} slices per chunk; "
            f"retrying with {smaller.slices_per_chunk}"
        )
        plan = smaller


def _out_of_memory_advice(error: BaseException, device) -> str:
    import torch

    if isinstance(error, torch.OutOfMemoryError):
        return (
            "out of GPU memory even with one slice per chunk (free GPU memory, or use --device cpu)"
        )
    return "out of memory (try a smaller --chunk-mb)"


def _release_device_memory(device) -> None:
    """Frees unreachable tensors and hands the cached blocks back to the driver (CUDA only)."""
    if device.type == "cuda":
        import gc

        import torch

        gc.collect()  # a failed stream leaves its buffers in a traceback cycle
        torch.cuda.empty_cache()


def _out_of_memory(error: BaseException) -> bool:
    """Host or GPU allocation failures (torch reports both as RuntimeError subclasses)."""
    text = str(error).lower()
    return isinstance(error, MemoryError) or "out of memory" in text or "allocate" in text


def _check_targets(inputs: tuple[Path, ...], targets: list[Path]) -> None:
    seen: dict[Path, Path] = {}
    for path, target in zip(inputs, targets, strict=True):
        key = target.resolve()
        if key in seen:
            raise click.UsageError(f"{seen[key]} and {path} would both write {target}")
        seen[key] = path
        if key == path.resolve() or _same_file(path, target):
            raise click.UsageError(f"{path}: the output would overwrite the input")


def _resolve_bound(bound: Bound, end: str, dtype: str, stats) -> float:
    if bound.kind == "number":
        return bound.value
    if bound.kind == "dtype":
        low, high = _TYPE_RANGE[dtype]
        return float(high if end == "max" else low)
    return float(stats.maximum if end == "max" else stats.minimum)


def _normalise_one(path: Path, target: Path, settings: _Settings, device, reporter) -> None:
    from ..io.atomic import OutputExistsError, atomic_output, check_output_folder
    from ..io.volumes import open_volume, write_volume
    from ..volume import normalize_stream, plan_chunks, scan_volume

    with open_volume(path) as reader:
        info = reader.info
        plan = plan_chunks(
            info.shape,
            info.dtype,
            settings.dtype,
            settings.chunk_mb,
            pinned=device.type == "cuda",
        )
        reporter.detail(
            f"{path}: {'x'.join(map(str, info.shape))} {info.dtype} ({info.axes}, "
            f"{info.compression}, {info.read_mode} reads); {plan.chunk_count} chunks of "
            f"{plan.slices_per_chunk} slices, {plan.buffer_bytes / 2**20:.0f} MiB of buffers, "
            f"{device}"
        )
        if not settings.overwrite and target.exists():
            raise FileError(target, "output exists (use --overwrite)")
        try:
            check_output_folder(target)
        except OSError as error:
            raise FileError(target, f"cannot write: {error.strerror}") from error
        needs_scan = settings.percentiles is not None or "data" in (
            settings.maximum.kind,
            settings.minimum.kind,
        )
        stats = None
        if needs_scan:

            def scan(plan):
                with reporter.progress(f"{path.name}: scanning", info.depth) as advance:
                    return scan_volume(
                        reader,
                        plan,
                        device,
                        histogram=settings.percentiles is not None,
                        on_progress=advance,
                    )

            stats, plan = _smaller_chunks_on_gpu_oom(scan, plan, path, device, reporter)
        if settings.percentiles is not None:
            low, high = (stats.percentile(q) for q in settings.percentiles)
            lo_q, hi_q = settings.percentiles
            reporter.info(
                f"{path}: percentiles {lo_q:g}% = {low:.10g}, {hi_q:g}% = {high:.10g} "
                f"(data {stats.minimum}..{stats.maximum})"
            )
        else:
            high = _resolve_bound(settings.maximum, "max", info.dtype, stats)
            low = _resolve_bound(settings.minimum, "min", info.dtype, stats)
            if stats is not None:
                reporter.info(f"{path}: data min {stats.minimum}, max {stats.maximum}")
        if not high > low:
            raise FileError(
                path,
                f"max {high:.10g} is not above min {low:.10g} "
                "(a constant volume? set --max/--min explicitly)",
            )
        reporter.detail(f"{path}: normalising with min {low:.10g}, max {high:.10g}")

        def normalise(plan):
            with (
                atomic_output(target, overwrite=settings.overwrite) as temp,
                reporter.progress(path.name, info.depth) as advance,
            ):
                return normalize_stream(
                    reader,
                    lambda pages: write_volume(temp, pages, info, settings.dtype),
                    plan,
                    device,
                    maximum=high,
                    minimum=low,
                    dtype=settings.dtype,
                    clip=settings.clip,
                    on_progress=advance,
                )

        try:
            result, plan = _smaller_chunks_on_gpu_oom(normalise, plan, path, device, reporter)
        except OutputExistsError as error:
            raise FileError(target, "output exists (use --overwrite)") from error
        except OSError as error:
            # numpy's short writes (a full disk, a file size limit) carry no errno
            problem = error.strerror or f"{error} (disk full?)"
            raise FileError(target, f"cannot write: {problem}") from error
        reporter.detail(
            f"{target}: {result.slices} slices in {result.chunks} chunks, {result.seconds:.2f} s, "
            f"peak buffers {result.peak_buffer_bytes / 2**20:.1f} MiB"
        )
