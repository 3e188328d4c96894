"""`imgops gray`: images to exact BT.601 gray, one file, many files, folders or pipes.

The command only parses options: imgops.planner decides inputs and outputs, imgops.gray_files
runs the batch engine, imgops.report counts and prints. Nothing heavy is imported at module
level (numpy, cv2 and torch load inside the command), so `imgops --help` stays fast.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..cli_common import (
    VERBOSITY,
    ImgopsCommand,
    device_option,
    files_from_option,
    name_option,
    null_option,
    output_dir_option,
    output_option,
    overwrite_option,
    planner_errors,
    quiet_option,
    recursive_option,
    scheduler_option,
    skip_existing_option,
    stats_json_option,
    verbose_option,
)
from ..errors import UsageProblem
from ..gray_files import (
    COLLISION_HINT,
    DEFAULT_JPEG_QUALITY,
    DEFAULT_NAME,
    DEFAULT_NAME_IN_DIR,
    DEFAULT_PNG_LEVEL,
    FORMATS,
    IMAGE_SUFFIXES,
    STDIO,
    engine_settings,
    name_rule,
    output_format,
    report_plan,
    run_plan,
)
from ..io.defaults import LUMAS

__all__ = ["DEFAULT_PNG_LEVEL", "FORMATS", "IMAGE_SUFFIXES", "gray"]


def _check_stdio(inputs: tuple[str, ...], output: str | None) -> None:
    if STDIO in inputs and output is None:
        raise click.UsageError("reading stdin needs -o OUTPUT (or -o - for stdout)")
    if STDIO in inputs and len(inputs) == 1 and sys.stdin.isatty():
        raise click.UsageError("stdin is a terminal: pipe image data in, e.g. `< photo.jpg`")
    if output == STDIO and sys.stdout.isatty():
        raise click.UsageError(
            "refusing to write binary image data to a terminal: redirect stdout or use -o FILE"
        )


def _gpu_decoder_unavailable() -> type[BaseException] | None:
    """imgops.io.gpu_decode.GpuDecoderUnavailable where the engine has it (imported lazily)."""
    try:
        from ..io.gpu_decode import GpuDecoderUnavailable  # type: ignore[import-not-found]
    except ImportError:
        return None
    return GpuDecoderUnavailable


@click.command(cls=ImgopsCommand, context_settings={"max_content_width": 100})
@click.argument("inputs", nargs=-1, metavar="INPUT...")
@output_option
@output_dir_option
@name_option(DEFAULT_NAME, DEFAULT_NAME_IN_DIR)
@files_from_option
@null_option
@recursive_option
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
    help="PNG compression: 0 none (fastest, largest), 1 fast, 2 small and fast, 3-9 zlib "
    f"(slower; for drawings)  [default: {DEFAULT_PNG_LEVEL}]",
)
@click.option(
    "--quality",
    type=click.IntRange(1, 100),
    help=f"JPEG quality for jpg output, 1-100  [default: {DEFAULT_JPEG_QUALITY}]",
)
@click.option(
    "--decoder",
    type=click.Choice(("auto", "cpu", "gpu")),
    default="auto",
    show_default=True,
    help="JPEG decoding: gpu (nvImageCodec; an error if it cannot run), cpu, or auto "
    "(gpu when usable).",
)
@click.option(
    "--luma",
    type=click.Choice(LUMAS),
    default="exact",
    show_default=True,
    help="exact: the BT.601 luma of the decoded pixels, the same bytes on every device. "
    "stored: a colour JPEG's own luma plane (the Y it was encoded with), decoded on the CPU "
    "without its colour planes, about 1.5x faster to decode. On 102 photos 0.43 % of the "
    "pixels (at most 2.1 % of one photo's) differ from exact's, almost all by 1, by up to 14 "
    "where saturated colours clip. Other files: exact.",
)
@click.option(
    "-j",
    "--jobs",
    type=click.IntRange(min=1),
    help="Worker threads for decoding and encoding  [default: CPU count]",
)
@click.option(
    "--fsync/--no-fsync",
    default=True,
    show_default=True,
    help="Flush each output to disk before it is renamed into place. --no-fsync is faster "
    "(a durable write costs milliseconds per file) and still never leaves a partial output "
    "when imgops fails or is stopped, but a power loss or OS crash may.",
)
@stats_json_option
@device_option
@scheduler_option
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
    name_template: str | None,
    files_from: str | None,
    null: bool,
    recursive: bool,
    fmt: str | None,
    png_level: int | None,
    quality: int | None,
    decoder: str,
    luma: str,
    jobs: int | None,
    fsync: bool,
    stats_json: Path | None,
    device: str,
    scheduler: str | None,
    overwrite: bool,
    skip_existing: bool,
    quiet: bool,
    verbose: bool,
) -> None:
    """Convert images to gray: exact BT.601 luma, 8-bit or 16-bit, on the GPU when there is one.

    Reads what OpenCV reads (JPEG, PNG, TIFF, BMP, WebP, ...). Gray input passes through
    unchanged, alpha is dropped, palettes are expanded, 16-bit input gives 16-bit output (png or
    tif). Without -o or -d, INPUT.ext becomes INPUT_gray.png beside it; with -d, DIR/INPUT.png.
    Existing outputs are refused unless --overwrite; no output ever replaces an input, another
    output or the --stats-json file, and earlier outputs (a_gray.png beside a.png) are not read
    back as inputs. a.jpg and a.png in one folder would both write a_gray.png: name them apart
    with --name '{stem}_{suffix}_gray.{ext}'.

    \b
    $ imgops gray photo.jpg -o photo_gray.png
    $ imgops gray photos/ --recursive -d gray/
    $ find . -name '*.jpg' -print0 | imgops gray --files-from - -0 -d gray/ --skip-existing
    $ imgops gray - -o - < photo.jpg > photo_gray.png
    $ imgops gray scans/*.tif --format tif -j 8 --device cuda
    $ imgops gray photos/ -d gray/ --scheduler local:4      # or tcp://HOST:PORT (imgops[dask])

    Exit status: 0 when every file was written or skipped, 1 if any failed (each named on one
    line; the others are still done), 2 for usage errors (nothing done), 130 on Ctrl-C.
    """
    from ..planner import make_output_folders
    from ..report import Report, write_stats

    if not inputs and files_from is None:
        raise click.UsageError("no input: give INPUT... or --files-from LIST")
    if scheduler is not None:  # local workers' imports start now, beside the planning
        from ..dask.run import BATCH_PRELOAD, start_local_workers

        start_local_workers(scheduler, BATCH_PRELOAD)
    from ..io.defaults import default_max_pixels  # (no numpy yet: see _prestart_cuda)

    try:  # a bad $IMGOPS_MAX_IMAGE_PIXELS is one usage error, not one error per file
        default_max_pixels()
    except ValueError as error:
        raise click.UsageError(str(error)) from None
    with planner_errors():
        fmt = output_format(output, fmt, name_template)
        if png_level is not None and fmt != "png":
            raise UsageProblem(f"--png-level applies to png output, not {fmt}")
        if quality is not None and fmt != "jpg":
            raise UsageProblem(f"--quality applies to jpg output, not {fmt}")
        if luma == "stored" and decoder == "gpu":
            raise UsageProblem("--luma stored decodes on the CPU: it cannot take --decoder gpu")
        _check_stdio(inputs, output)
        if scheduler is not None and (STDIO in inputs or output == STDIO):
            raise UsageProblem("--scheduler needs files in and out (not stdin/stdout)")
        plan = _plan(
            inputs, output, output_dir, name_template, files_from, null, recursive, fmt,
            overwrite, skip_existing, stats_json,
        )  # fmt: skip
        from ..engine.types import default_jobs

        settings = engine_settings(
            device=device,
            # On a cluster each worker's engine takes its host's CPUs shared by its workers.
            jobs=jobs or (default_jobs() if scheduler is None else None),
            fmt=fmt,
            png_level=DEFAULT_PNG_LEVEL if png_level is None else png_level,
            jpeg_quality=DEFAULT_JPEG_QUALITY if quality is None else quality,
            decoder=decoder,
            luma=luma,
            overwrite=overwrite,
            skip_existing=skip_existing,
            durable=fsync,
            expected_files=len(plan.tasks),
            stdout=click.open_file(STDIO, "wb") if output == STDIO else None,
        )
    if scheduler is not None:  # before anything is done: one line naming imgops[dask]
        from ..dask import require_dask

        require_dask("distributed")
    elif plan.tasks:
        _prestart_cuda(settings)
    report = Report(quiet=quiet or VERBOSITY.quiet, verbose=verbose or VERBOSITY.verbose)
    if output_dir is not None:
        make_output_folders(plan)
    report_plan(plan, report)
    try:
        summary = _run(plan, report, settings, verbose, scheduler) if plan.tasks else None
    finally:
        _discard_prestarted()
    if summary is not None:
        if summary.device is not None:
            if scheduler is None:
                report.detail(f"device: {summary.device}, {settings.jobs} worker threads")
            else:
                report.detail(f"device: {summary.device}, on the Dask cluster {scheduler}")
        if summary.decoders:  # e.g. "decoded: opencv-luma 95, opencv 5" (--luma stored)
            counts = sorted(summary.decoders.items(), key=lambda kv: (-kv[1], kv[0]))
            report.detail("decoded: " + ", ".join(f"{name} {count}" for name, count in counts))
        stages = ", ".join(f"{k} {v:.2f}s" for k, v in summary.stage_seconds.items())
        report.detail(f"wall {summary.wall_seconds:.2f}s; stage totals: {stages}")
    if stats_json is not None:
        stats = dict(summary.as_dict() if summary is not None else {}, **report.as_dict())
        stats.update(jobs=settings.jobs, format=fmt, png_level=settings.png_level)
        stats.update(scheduler=scheduler)
        stats.update(decoder=decoder, jpeg_quality=getattr(settings, "jpeg_quality", None))
        stats.update(luma=luma)
        try:
            write_stats(stats_json, stats)
        except OSError as error:
            report.fail(f"--stats-json {stats_json}", error.strerror or str(error))
    ctx.exit(report.finish())


def _plan(
    inputs, output, output_dir, name_template, files_from, null, recursive, fmt,
    overwrite, skip_existing, stats_json,
):  # fmt: skip
    """The planner's Plan for these options (PlanError on a batch that cannot run)."""
    from ..planner import collect_inputs, plan_outputs

    sources = collect_inputs(
        inputs,
        recursive=recursive,
        files_from=files_from,
        stdin=click.open_file(STDIO, "rb") if files_from == STDIO else None,
        null=null,
        suffixes=IMAGE_SUFFIXES,
        skip_dirs=[output_dir] if output_dir is not None else [],
    )
    return plan_outputs(
        sources,
        rule=name_rule(fmt, name_template, in_dir=output_dir is not None),
        output=output,
        output_dir=output_dir,
        overwrite=overwrite,
        skip_existing=skip_existing,
        stats_path=stats_json,
        collision_hint=COLLISION_HINT,
    )


def _prestart_cuda(settings) -> None:
    """Where the batch will run on the torch-free CUDA engine with nvImageCodec (`--device
    cuda`, or `auto` on a large batch), its CUDA stage starts now, so the driver's start, the
    context and the decoder's warm-up overlap the imports of numpy and OpenCV and the rest of
    the set-up (imgops.engine.driver_stage.prestart). Nothing up to here imports numpy (0.3 s
    on the H100 host; tests/test_cli_gray.py checks). The batch's own choice is made, and
    checked, later."""
    from ..engine.device import driver_gpu_if_present
    from ..engine.ops import GRAY

    index = driver_gpu_if_present(settings, GRAY)
    if index is not None:
        from ..engine.driver_stage import prestart
        from ..engine.types import default_jobs

        prestart(index, settings.jobs or default_jobs())


def _discard_prestarted() -> None:
    """No prestarted CUDA stage outlives its command (imgops.engine.driver_stage)."""
    stages = sys.modules.get("imgops.engine.driver_stage")
    if stages is not None:
        stages.discard_prestarted()


def _run(plan, report, settings, verbose: bool, scheduler: str | None = None):
    """Runs the batch with a progress bar (here, or on the Dask cluster `scheduler` names);
    Ctrl-C prints what was done and exits 130."""
    from ..engine.allocator import retain_freed_memory
    from ..engine.switching import batch_switch_interval
    from ..io.atomic import remove_pending_temporaries
    from ..io.images import quiet_opencv

    retain_freed_memory()  # this process's malloc keeps freed pages for the next file
    if not verbose:
        quiet_opencv()
    stdin_data = None
    if plan.tasks[0].source.path is None:
        with click.open_file(STDIO, "rb") as stream:
            stdin_data = stream.read()
    unavailable = _gpu_decoder_unavailable()
    try:
        with batch_switch_interval(), report.progress("gray", total=len(plan.tasks)) as advance:
            if scheduler is not None:
                return _run_on_cluster(plan, report, settings, scheduler, advance)
            return run_plan(plan, report, settings, stdin_data=stdin_data, advance=advance)
    except KeyboardInterrupt:  # the caller writes --stats-json, prints the line, exits 130
        remove_pending_temporaries()
        report.interrupted = True
        return None
    except Exception as error:
        if unavailable is not None and isinstance(error, unavailable):
            raise click.UsageError(str(error)) from None
        if type(error).__name__ == "DeviceUnavailable":  # imgops.engine.device: one line, exit 1
            from ..cli_common import ImgopsError

            raise ImgopsError(str(error)) from None
        raise


def _run_on_cluster(plan, report, settings, scheduler: str, advance):
    """The plan's files in partitions on the Dask cluster; results come back into `report`
    per file (and advance the bar) as each partition finishes."""
    from ..dask.run import run_gray_with_scheduler
    from ..pipeline import GrayJob

    jobs = [GrayJob(task.source.path, task.target, task.source.label) for task in plan.tasks]

    def on_result(result) -> None:
        report.add(result)
        advance()

    return run_gray_with_scheduler(scheduler, jobs, settings, on_result=on_result)
