"""Image files to gray: the code `imgops gray` runs, as a Python API (`gray_file`).

The command line and `gray_file` share everything here: the output format rules, the planner
call, the engine settings and the loop that feeds the Report. Plain Python errors (no click):
imgops.errors.PlanError for a batch that cannot run, FileFailedError for a file that failed.
numpy, OpenCV and torch load only when a file is converted.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from .errors import FileFailedError, UsageProblem
from .io.defaults import DEFAULT_PNG_LEVEL

if TYPE_CHECKING:  # the planner and report load with the first file (`imgops --help` stays fast)
    from .planner import NameRule, Plan
    from .report import Report

STDIO = "-"

__all__ = [
    "DEFAULT_JPEG_QUALITY",
    "DEFAULT_NAME",
    "DEFAULT_NAME_IN_DIR",
    "DEFAULT_PNG_LEVEL",
    "FORMATS",
    "IMAGE_SUFFIXES",
    "COLLISION_HINT",
    "gray_file",
    "output_format",
    "run_plan",
]

FORMATS = ("png", "tif", "jpg", "bmp", "webp")
DEFAULT_JPEG_QUALITY = 95
#: Output names: beside the input, and inside -d DIR.
DEFAULT_NAME = "{stem}_gray.{ext}"
DEFAULT_NAME_IN_DIR = "{stem}.{ext}"
COLLISION_HINT = "give each its own name with --name '{stem}_{suffix}_gray.{ext}'"
SUFFIX_FORMATS = {
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


def _suffix_format(where: str, suffix: str, fmt: str | None) -> str | None:
    """The format a literal suffix names; an unknown or conflicting one is a UsageProblem."""
    known = SUFFIX_FORMATS.get(suffix.lower())
    if known is None:
        if fmt is not None:
            return fmt  # the user named the format: any suffix they like
        what = f"suffix {suffix!r}" if suffix else "no suffix"
        raise UsageProblem(
            f"{where} has {what}; use one of .png .tif .jpg .bmp .webp, or -f FORMAT"
        )
    if fmt is not None and fmt != known:
        raise UsageProblem(f"{where} names a {known} file but --format is {fmt}")
    return known


def output_format(output: str | None, fmt: str | None, name: str | None = None) -> str:
    """The output format: --format, or what -o's (or --name's) suffix names; png by default."""
    if output is not None and output != STDIO:
        if Path(output).is_dir():
            raise UsageProblem(f"-o {output} is a directory; use -d {output}")
        return _suffix_format(f"-o {output}", Path(output).suffix, fmt) or "png"
    if name is not None and not name.endswith(".{ext}"):
        return _suffix_format(f"--name {name!r}", Path(name).suffix, fmt) or "png"
    return fmt or "png"


def name_rule(fmt: str, template: str | None, in_dir: bool) -> NameRule:
    """The naming rule for gray outputs of format `fmt`."""
    from .planner import NameRule

    return NameRule(template or (DEFAULT_NAME_IN_DIR if in_dir else DEFAULT_NAME), fmt)


def engine_settings(**options: Any):
    """imgops.pipeline.PipelineSettings from options; options this engine lacks must be left at
    their defaults (a UsageProblem otherwise), so newer options fail loudly on older engines.
    (From imgops.engine.types, which imports no numpy: the CUDA stage's start follows.)"""
    from .engine.types import PipelineSettings

    known = {f.name: f for f in dataclasses.fields(PipelineSettings)}
    defaults = {
        "decoder": "auto",
        "jpeg_quality": DEFAULT_JPEG_QUALITY,
        "luma": "exact",
        "expected_files": None,
    }
    kwargs = {}
    for key, value in options.items():
        if key in known:
            kwargs[key] = value
        elif key in defaults and value != defaults[key] and key != "expected_files":
            flag = {"decoder": "--decoder", "jpeg_quality": "--quality", "luma": "--luma"}[key]
            raise UsageProblem(f"{flag} {value} is not supported by this build's batch engine")
    return PipelineSettings(**kwargs)


def _jobs(plan: Plan, stdin_data: bytes | None) -> list:
    from .pipeline import GrayJob

    jobs = []
    for task in plan.tasks:
        source = task.source
        if source.path is None:
            jobs.append(GrayJob(None, task.target, source.label, stdin_data))
        else:
            jobs.append(GrayJob(source.path, task.target, source.label))
    return jobs


def report_plan(plan: Plan, report: Report) -> None:
    """Counts the planner's own entries in `report` (Report.add_plan)."""
    report.add_plan(plan)


def run_plan(
    plan: Plan,
    report: Report,
    settings: Any,
    *,
    stdin_data: bytes | None = None,
    advance: Callable[[], None] | None = None,
):
    """Runs the plan's tasks through imgops.pipeline.run_gray, feeding `report`; returns the
    engine's Summary. GpuDecoderUnavailable and a device that cannot start are raised."""
    from .pipeline import run_gray

    def on_result(result) -> None:
        report.add(result)
        if advance is not None:
            advance()

    return run_gray(_jobs(plan, stdin_data), settings, on_result=on_result)


def gray_file(
    src: str | os.PathLike,
    dst: str | os.PathLike | None = None,
    *,
    fmt: str | None = None,
    name: str | None = None,
    overwrite: bool = False,
    png_level: int = DEFAULT_PNG_LEVEL,
    quality: int = DEFAULT_JPEG_QUALITY,
    device: str = "auto",
    decoder: str = "auto",
    fsync: bool = True,
    stdout: IO[bytes] | None = None,
    luma: str = "exact",
) -> Report:
    """Converts one image file to exact BT.601 gray, as `imgops gray SRC [-o DST]` does.

    `dst` None writes `<stem>_gray.<fmt>` beside `src` (or the `name` template's file); the
    format is `fmt`, or what `dst`'s suffix names, or png. Returns the Report (its `outputs`
    holds the path written). Raises imgops.errors.PlanError (e.g. `dst` is `src`) before
    anything is done, FileFailedError naming `src` when the file cannot be converted
    (the error it came from is chained), and never leaves a partial output. `fsync` False
    skips flushing the output to disk before the rename (`imgops gray --no-fsync`). `luma`
    "stored" takes a colour JPEG's own luma plane (`imgops gray --luma stored`).

    Example:
        >>> imgops.gray_file("photo.jpg", "photo_gray.png").outputs
        ['photo_gray.png']
    """
    from .planner import collect_inputs, plan_outputs
    from .report import Report

    output = None if dst is None else os.fspath(dst)
    fmt = output_format(output, fmt, name)
    sources = collect_inputs([os.fspath(src)], suffixes=IMAGE_SUFFIXES)
    plan = plan_outputs(
        sources,
        rule=name_rule(fmt, name, in_dir=False),
        output=output,
        overwrite=overwrite,
        collision_hint=COLLISION_HINT,
    )
    if plan.problems:
        raise FileFailedError(plan.problems[0].label, plan.problems[0].reason)
    settings = engine_settings(
        device=device,
        fmt=fmt,
        png_level=png_level,
        overwrite=overwrite,
        jobs=1,
        decoder=decoder,
        durable=fsync,
        jpeg_quality=quality,
        luma=luma,
        expected_files=1,
        stdout=stdout,
    )
    report = Report(quiet=True, print_errors=False)
    report_plan(plan, report)
    summary = run_plan(plan, report, settings)
    if summary.failures:
        failure = summary.failures[0]
        raise FileFailedError(failure.job.label, failure.reason or "failed") from failure.error
    return report
