"""What the volume commands (`imgops normvol`, `imgops bin`) share: the plan of a batch of
stacks (imgops.planner, plus `.zarr` stores and `-o x.ome.zarr`), the loop that runs one
volume at a time into the one Report, and the names of stacks (`x.ome.tif` keeps `.ome.tif`).

CLI code (click exceptions for usage errors and the exit status); nothing heavy at import.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ..errors import FileError, ImgopsError

__all__ = ["INPUT_SUFFIXES", "output_stem", "plan_batch", "run_plan", "split_name"]

#: Suffixes a stack's name ends in (longest first: `.ome.tif` before `.tif`).
TIFF_SUFFIXES = (".ome.tiff", ".ome.tif", ".tiff", ".tif", ".ome.zarr", ".zarr")
#: What folders, globs and --files-from pick up (`.zarr` stores are named one by one).
INPUT_SUFFIXES = (".tif", ".tiff")


def split_name(path: Path) -> tuple[str, str]:
    """(stem, suffix) with the OME part kept in the suffix: x.ome.tif -> (x, .ome.tif)."""
    name = path.name
    for suffix in TIFF_SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)], name[-len(suffix) :]
    return path.stem, path.suffix or ".tif"


def output_stem(path: Path) -> str:
    """The input's name without its TIFF (and OME) suffix: `{stem}` of --name."""
    return split_name(path)[0]


def plan_batch(
    inputs, output, directory, name_template, files_from, null, recursive, overwrite,
    skip_existing, *, default_name: Callable[[Path], str], zarr_output: bool = True,
    stats_path: Path | None = None,
    earlier_output: Callable[[Path, Path], bool] | None = None,
):  # fmt: skip
    """The shared planner's Plan (imgops.planner) for a volume command; `.zarr` stores named as
    inputs, and `-o x.ome.zarr` (a folder the planner would refuse; `zarr_output`), are planned
    here. `default_name(input)` is the output's file name without --name; `stats_path`
    (--stats-json) may be no input or output of the batch.

    The planner leaves out an input named as another input's output when it has that input's
    width and height (an earlier run's output). A command whose output has another size (bin)
    says what its output looks like: `earlier_output(candidate, source)`, True when the file
    `candidate` is what this command wrote for `source`."""
    from ..planner import NameRule as Rule
    from ..planner import (
        Plan,
        Source,
        Task,
        check_stats_path,
        collect_inputs,
        make_output_folders,
        plan_outputs,
    )

    names = [str(n) for n in inputs]
    stores = [Path(n) for n in names if n.lower().rstrip("/").endswith(".zarr")]
    names = [n for n in names if not n.lower().rstrip("/").endswith(".zarr")]
    sources = collect_inputs(
        names,
        recursive=recursive,
        files_from=files_from,
        null=null,
        suffixes=INPUT_SUFFIXES,
        skip_dirs=[directory] if directory is not None else [],
    )
    sources.items.extend(Source(p) for p in stores)
    if not sources.items and not sources.problems:
        raise click.UsageError("no inputs (give files, folders, or --files-from)")
    zarr_target = output is not None and str(output).lower().rstrip("/").endswith(".zarr")
    if zarr_target and zarr_output:
        if len(sources.items) + len(sources.problems) != 1:
            raise click.UsageError("-o takes exactly one input; use -d DIR for several")
        plan = Plan(problems=list(sources.problems))
        target = Path(output)
        if sources.items:
            item = sources.items[0]
            if item.path is not None and target.absolute() == item.path.absolute():
                raise click.UsageError(f"-o {output} would overwrite its input")
            if target.exists() and not overwrite and skip_existing:
                from ..planner import Problem

                plan.skipped.append(Problem(item.label, f"skipped, {target} exists"))
                return plan
            plan.tasks.append(Task(item, target))
        if stats_path is not None:
            check_stats_path(stats_path, sources, plan)
        return plan
    if name_template is not None:
        rule = Rule(name_template, "tif", stem=output_stem)
    else:  # the command's own name (x.ome.tif -> x_norm.ome.tif, ...)
        rule = Rule("{stem}", "", stem=default_name)
    left_out = []
    if output is None and earlier_output is not None:
        left_out = _leave_out_earlier_outputs(sources, rule, directory, earlier_output)
    plan = plan_outputs(
        sources,
        rule=rule,
        output=output,
        output_dir=directory,
        overwrite=overwrite,
        skip_existing=skip_existing,
        stats_path=stats_path,
    )
    plan.left_out[:0] = left_out
    make_output_folders(plan)
    return plan


def _leave_out_earlier_outputs(sources, rule, directory, earlier_output) -> list:
    """Takes out of `sources` the inputs that are another input's output by name and, as
    `earlier_output` says, by content; returns them as the planner's left-out entries."""
    from ..planner import Problem, _path_key, _target_for

    makers = {
        _path_key(_target_for(item, rule, directory)): item
        for item in sources.items
        if item.path is not None
    }
    kept, left = [], []
    for item in sources.items:
        maker = makers.get(_path_key(item.path)) if item.path is not None else None
        if maker is not None and maker is not item and earlier_output(item.path, maker.path):
            left.append(Problem(item.label, f"left out: the output of {maker.label}"))
        else:
            kept.append(item)
    sources.items[:] = kept
    return left


def run_plan(
    plan,
    report,
    work,
    command: str,
    *,
    stats_path: Path | None = None,
    stats: Callable[[], dict[str, Any]] | None = None,
) -> None:
    """Runs `work(source, target)` for every task; every failure is one line and the batch goes
    on; Ctrl-C prints what was done. With `stats_path` (--stats-json) the Report's counts and
    failed inputs, and what `stats()` adds, are written there as JSON (also after Ctrl-C, with
    "interrupted": true). Exits with the Report's status."""
    from ..io.atomic import remove_pending_temporaries

    report.add_plan(plan)
    try:
        for task in plan.tasks:
            source = task.source.path
            try:
                result = work(source, task.target)
                report.wrote(task.source.label, task.target)
                report.info(result.summary())
            except FileError as error:
                report.fail(error.path, error.problem, error)
            except ImgopsError as error:
                report.fail(task.source.label, error.format_message(), error)
            except MemoryError as error:
                report.fail(task.source.label, "out of memory (try a smaller --chunk-mb)", error)
            except Exception as error:  # torch.OutOfMemoryError after halving to one plane
                if type(error).__name__ != "OutOfMemoryError":
                    raise
                report.fail(
                    task.source.label,
                    "out of GPU memory even with one plane per chunk "
                    "(free GPU memory, or use --device cpu)",
                    error,
                )
    except KeyboardInterrupt:
        remove_pending_temporaries()
        report.interrupted = True
        _write_stats(report, stats_path, stats)
        report.error(report.interrupted_line())
        raise click.exceptions.Exit(report.exit_code) from None
    _write_stats(report, stats_path, stats)
    if plan.total > 1 or report.failures:
        summary = f"{command}: {report.line()}"
        if report.failures and report.quiet:
            report.error(summary)
        else:
            report.info(summary)
    if report.exit_code:
        raise click.exceptions.Exit(report.exit_code)


def _write_stats(report, path: Path | None, stats: Callable[[], dict[str, Any]] | None) -> None:
    """--stats-json: the Report's counts and failures, and the command's `stats()`; a file that
    cannot be written is one more failure (as for gray)."""
    if path is None:
        return
    from ..report import write_stats

    data = dict(report.as_dict(), **(stats() if stats is not None else {}))
    try:
        write_stats(path, data)
    except OSError as error:
        report.fail(f"--stats-json {path}", error.strerror or str(error))
