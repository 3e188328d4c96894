"""`imgops gray`: images to exact BT.601 gray, one file, many files, folders or pipes.

Nothing heavy is imported at module level (numpy, cv2 and torch load inside the command), so
`imgops --help` stays fast.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import click

from ..cli_common import (
    Reporter,
    gray_device_option,
    overwrite_option,
    quiet_option,
    skip_existing_option,
    verbose_option,
)

FORMATS = ("png", "tif", "jpg", "bmp", "webp")
DEFAULT_PNG_LEVEL = 2  # the same as imgops.io.images.DEFAULT_PNG_LEVEL (checked by the tests)
_EXTENSIONS = {"png": ".png", "tif": ".tif", "jpg": ".jpg", "bmp": ".bmp", "webp": ".webp"}
_SUFFIX_FORMATS = {
    ".png": "png",
    ".tif": "tif",
    ".tiff": "tif",
    ".jpg": "jpg",
    ".jpeg": "jpg",
    ".jpe": "jpg",
    ".bmp": "bmp",
    ".webp": "webp",
}
#: Files a folder contributes: the suffixes OpenCV can read.
IMAGE_SUFFIXES = frozenset(
    (".png", ".jpg", ".jpeg", ".jpe", ".jfif", ".tif", ".tiff", ".bmp", ".dib", ".webp", ".gif")
    + (".pbm", ".pgm", ".ppm", ".pnm", ".pxm", ".pfm", ".sr", ".ras", ".exr", ".hdr", ".pic")
    + (".jp2", ".avif")
)
STDIO = "-"


@dataclass(frozen=True)
class _Input:
    """One input file; `base` is the folder it was found in (None when named directly)."""

    path: Path
    base: Path | None = None


def _key(path: Path) -> str:
    """A comparable form of a path (absolute, symlinks resolved where they exist)."""
    return os.path.normcase(str(path.resolve()))


def _folder_images(folder: Path, recursive: bool, skip_dir: Path | None) -> list[_Input]:
    """The image files in a folder (sorted; hidden files and `skip_dir` left out)."""
    found: list[_Input] = []
    skip_key = _key(skip_dir) if skip_dir is not None else None
    for root, dirs, files in os.walk(folder):
        root_path = Path(root)
        dirs[:] = sorted(
            d
            for d in dirs
            if recursive and not d.startswith(".") and _key(root_path / d) != skip_key
        )
        for name in sorted(files):
            if not name.startswith(".") and Path(name).suffix.lower() in IMAGE_SUFFIXES:
                found.append(_Input(root_path / name, folder))
    return found


def _read_list(stream) -> list[str]:
    """Paths from --files-from: one a line, blank lines ignored, bytes decoded as the OS does."""
    paths = []
    for raw in stream.read().splitlines():
        line = os.fsdecode(raw).rstrip("\r")
        if line.strip():
            paths.append(line)
    return paths


def _collect(names: list[str], recursive: bool, output_dir: Path | None) -> list[_Input]:
    inputs: list[_Input] = []
    for name in names:
        path = Path(name)
        if path.is_dir():
            inputs.extend(_folder_images(path, recursive, output_dir))
        else:
            inputs.append(_Input(path))
    return inputs


def _output_format(output: str | None, fmt: str | None) -> str:
    """--format, or the format -o's suffix names; a conflict between them is a usage error."""
    if output is None or output == STDIO:
        return fmt or "png"
    suffix_format = _SUFFIX_FORMATS.get(Path(output).suffix.lower())
    if suffix_format and fmt and fmt != suffix_format:
        raise click.UsageError(f"-o {output} names a {suffix_format} file but --format is {fmt}")
    return suffix_format or fmt or "png"


def _target_for(item: _Input, output_dir: Path | None, extension: str) -> Path:
    if output_dir is None:
        return item.path.with_name(f"{item.path.stem}_gray{extension}")
    if item.base is None:
        return output_dir / f"{item.path.stem}{extension}"
    relative = item.path.parent.relative_to(item.base)
    return output_dir / relative / f"{item.path.stem}{extension}"


def _pair_outputs(
    inputs: list[_Input], output_dir: Path | None, extension: str
) -> list[tuple[_Input, Path]]:
    """Each input with its output; refuses collisions and outputs that are inputs (usage errors)."""
    unique: dict[str, _Input] = {}
    for item in inputs:
        unique.setdefault(_key(item.path), item)  # the same file named twice is done once
    pairs = [(item, _target_for(item, output_dir, extension)) for item in unique.values()]
    targets = {_key(target) for _, target in pairs}
    # Earlier outputs found while listing a folder (a_gray.png beside a.png) are not inputs.
    pairs = [(item, t) for item, t in pairs if item.base is None or _key(item.path) not in targets]
    input_keys = {_key(item.path): item for item, _ in pairs}
    seen: dict[str, _Input] = {}
    for item, target in pairs:
        key = _key(target)
        if key in input_keys:
            raise click.UsageError(f"{item.path}: its output {target} would overwrite an input")
        if key in seen:
            raise click.UsageError(
                f"{seen[key].path} and {item.path} would both write {target} "
                "(rename one, or use -d with different folders)"
            )
        seen[key] = item
    return pairs


def _check_stdio(inputs: tuple[str, ...], output: str | None, files_from: str | None) -> None:
    if STDIO in inputs:
        if len(inputs) > 1 or files_from is not None:
            raise click.UsageError("'-' (stdin) must be the only input")
        if output is None:
            raise click.UsageError("reading stdin needs -o OUTPUT (or -o - for stdout)")
        if sys.stdin.isatty():
            raise click.UsageError("stdin is a terminal: pipe image data in, e.g. `< photo.jpg`")
    if output == STDIO and sys.stdout.isatty():
        raise click.UsageError(
            "refusing to write binary image data to a terminal: redirect stdout or use -o FILE"
        )


def _plan(
    inputs: tuple[str, ...],
    output: str | None,
    output_dir: Path | None,
    listed: list[str],
    recursive: bool,
    fmt: str,
) -> list[tuple[_Input | None, Path | None]]:
    """(input, output) pairs; None input means stdin, None output means stdout."""
    if output is not None:
        if STDIO in inputs:
            return [(None, None if output == STDIO else Path(output))]
        collected = _collect(list(inputs) + listed, recursive, None)
        if len(collected) != 1:
            raise click.UsageError(
                f"-o takes exactly one input, got {len(collected)}; use -d DIR for several"
            )
        target = None if output == STDIO else Path(output)
        if target is not None and target.is_dir():
            raise click.UsageError(f"-o {output} is a directory; use -d {output}")
        if target is not None and _key(target) == _key(collected[0].path):
            raise click.UsageError(f"-o {output} would overwrite its input")
        return [(collected[0], target)]
    collected = _collect(list(inputs) + listed, recursive, output_dir)
    return list(_pair_outputs(collected, output_dir, _EXTENSIONS[fmt]))


def _make_jobs(plan, stdin_data: bytes | None):
    from ..pipeline import GrayJob

    jobs = []
    for item, target in plan:
        if item is None:
            jobs.append(GrayJob(None, target, "<stdin>", stdin_data))
        else:
            jobs.append(GrayJob(item.path, target, str(item.path)))
    return jobs


def _report(reporter: Reporter, result) -> None:
    if result.status == "failed":
        reporter.error(f"{result.job.label}: {result.reason}")
        if reporter.verbose and result.error is not None:
            import traceback

            trace = traceback.format_exception(result.error)
            click.echo("".join(trace).rstrip(), err=True)
    elif result.status == "skipped":
        reporter.detail(f"{result.job.label}: skipped, {result.job.target} exists")
    else:
        if result.note:
            reporter.info(f"{result.job.label}: {result.note}")
        shape = "x".join(str(n) for n in (result.shape or ())[:2][::-1])
        where = result.job.target if result.job.target is not None else "<stdout>"
        millis = 1000 * sum(result.seconds.values())
        reporter.detail(
            f"{result.job.label} -> {where} ({shape} {result.dtype}, "
            f"{result.bytes_written} bytes, {millis:.0f} ms)"
        )


@click.command(context_settings={"max_content_width": 100})
@click.argument("inputs", nargs=-1, metavar="INPUT...")
@click.option("-o", "--output", metavar="OUTPUT", help="Output file for one input ('-' = stdout).")
@click.option(
    "-d",
    "--output-dir",
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    help="Write DIR/<stem>.<ext> for every input (folders keep their sub-folders).",
)
@click.option(
    "--files-from",
    metavar="LIST",
    help="Read input paths from LIST, one a line ('-' = stdin).",
)
@click.option("-r", "--recursive", is_flag=True, help="Descend into sub-folders of folder inputs.")
@click.option(
    "-f",
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    help="Output format  [default: png, or the suffix of -o]",
)
@click.option(
    "--png-level",
    type=click.IntRange(0, 9),
    help=f"PNG compression: 0 none (fastest, largest), 1 fast, 2 small and fast, 3-9 zlib "
    "(slower; for drawings)  "
    f"[default: {DEFAULT_PNG_LEVEL}]",
)
@click.option(
    "-j",
    "--jobs",
    type=click.IntRange(min=1),
    help="Worker threads for decoding and encoding  [default: CPU count]",
)
@click.option(
    "--stats-json",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Write counts, device and seconds per stage as JSON to FILE (for benchmarks).",
)
@gray_device_option
@overwrite_option
@skip_existing_option
@quiet_option
@verbose_option
@click.pass_context
def gray(
    ctx: click.Context,
    inputs: tuple[str, ...],
    output: str | None,
    output_dir: Path | None,
    files_from: str | None,
    recursive: bool,
    fmt: str | None,
    png_level: int | None,
    jobs: int | None,
    stats_json: Path | None,
    device: str,
    overwrite: bool,
    skip_existing: bool,
    quiet: bool,
    verbose: bool,
) -> None:
    """Convert images to gray: exact BT.601 luma, 8-bit or 16-bit, on the GPU when there is one.

    Reads what OpenCV reads (JPEG, PNG, TIFF, BMP, WebP, ...). Gray input passes through
    unchanged, alpha is dropped, palettes are expanded, 16-bit input gives 16-bit output (png or
    tif). Without -o or -d, INPUT.ext becomes INPUT_gray.png beside it. Existing outputs are
    refused unless --overwrite; an input is never overwritten.

    \b
    $ imgops gray photo.jpg -o photo_gray.png
    $ imgops gray photos/ --recursive -d gray/
    $ find . -name '*.jpg' | imgops gray --files-from - -d gray/ --skip-existing
    $ imgops gray - -o - < photo.jpg > photo_gray.png
    $ imgops gray scans/*.tif --format tif -j 8 --device cuda

    Exit status: 0 when every file was written or skipped, 1 if any failed, 2 for usage errors.
    """
    if not inputs and files_from is None:
        raise click.UsageError("no input: give INPUT... or --files-from LIST")
    if output is not None and output_dir is not None:
        raise click.UsageError("-o and -d cannot be used together")
    if overwrite and skip_existing:
        raise click.UsageError("--overwrite and --skip-existing cannot be used together")
    if output_dir is not None and output_dir.exists() and not output_dir.is_dir():
        raise click.UsageError(f"-d {output_dir} is not a directory")
    if files_from == STDIO and STDIO in inputs:
        raise click.UsageError("stdin cannot be both an input and --files-from")
    fmt = _output_format(output, fmt)
    if png_level is not None and fmt != "png":
        raise click.UsageError(f"--png-level applies to png output, not {fmt}")
    _check_stdio(inputs, output, files_from)
    listed: list[str] = []
    if files_from is not None:
        try:
            with click.open_file(files_from, "rb") as stream:
                listed = _read_list(stream)
        except OSError as error:
            raise click.BadParameter(str(error), param_hint="--files-from") from None
    plan = _plan(inputs, output, output_dir, listed, recursive, fmt)
    reporter = Reporter(quiet=quiet, verbose=verbose)
    if not plan:
        reporter.info("no image files found")
        reporter.info("0 written, 0 skipped, 0 failed")
        return

    from ..io.images import quiet_opencv
    from ..pipeline import PipelineSettings, default_jobs, run_gray

    if not verbose:
        quiet_opencv()
    stdin_data = None
    if plan[0][0] is None:
        with click.open_file(STDIO, "rb") as stream:
            stdin_data = stream.read()
    if output_dir is not None:
        for parent in sorted({str(target.parent) for _, target in plan if target is not None}):
            Path(parent).mkdir(parents=True, exist_ok=True)
    settings = PipelineSettings(
        device=device,
        jobs=jobs or default_jobs(),
        fmt=fmt,
        png_level=DEFAULT_PNG_LEVEL if png_level is None else png_level,
        overwrite=overwrite,
        skip_existing=skip_existing,
        stdout=click.open_file(STDIO, "wb") if output == STDIO else None,
    )
    job_list = _make_jobs(plan, stdin_data)
    with reporter.progress("gray", total=len(job_list)) as advance:

        def on_result(result) -> None:
            _report(reporter, result)
            advance()

        summary = run_gray(job_list, settings, on_result=on_result)
    if summary.device is not None:
        reporter.detail(f"device: {summary.device}, {settings.jobs} worker threads")
    stages = ", ".join(f"{k} {v:.2f}s" for k, v in summary.stage_seconds.items())
    reporter.detail(f"wall {summary.wall_seconds:.2f}s; stage totals: {stages}")
    if stats_json is not None:
        import json

        stats = dict(
            summary.as_dict(), jobs=settings.jobs, format=fmt, png_level=settings.png_level
        )
        stats_json.write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")
    reporter.info(summary.line())
    if summary.failed:
        ctx.exit(1)
