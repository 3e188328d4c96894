"""Options and helpers shared by every imgops command (rasterio's `rio` is the model).

The input and output options (`-o`, `-d/--output-dir`, `--name`, `--overwrite`,
`--skip-existing`, `-r`, `--files-from`, `-0`, `--stats-json`, `--device`, `--scheduler`) are
defined once here and feed imgops.planner; `plan_errors` turns the planner's plain errors into
exit codes, and every command (`ImgopsCommand`) turns the library's ImgopsError and PlanError
into one line with its exit status. Nothing here imports torch or dask: `imgops --help` must
stay fast.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click

from .errors import OVERWRITE_HINT, FileError, ImgopsError, PlanError  # noqa: F401 (re-exported)
from .report import Report as Reporter  # noqa: F401  (the one Report, under the name bench uses)


class CliError(click.ClickException):
    """An ImgopsError as click shows it: one line `imgops: error: ...`, its exit status."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    def show(self, file=None) -> None:
        click.echo(f"imgops: error: {self.format_message()}", err=True)


@contextlib.contextmanager
def cli_errors() -> Iterator[None]:
    """Turns the library's plain errors into click's: ImgopsError (FileError, SchedulerError,
    ...) into CliError, PlanError (UsageProblem, ...) as `plan_errors` does."""
    try:
        yield
    except ImgopsError as error:
        raise CliError(error.format_message(), error.exit_code) from error
    except PlanError as error:
        raise plan_errors(error) from None


class ImgopsCommand(click.Command):
    """click.Command whose parsing and body report ImgopsError and PlanError as one line with
    their exit status (every command)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        with cli_errors():
            return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context):
        with cli_errors():
            return super().invoke(ctx)


@dataclass
class Verbosity:
    """-q/-v of the invocation running now (the group's or the command's); read by cli.main."""

    quiet: bool = False
    verbose: bool = False


#: The current invocation's -q/-v. Set afresh by the group and by every command's -q/-v
#: callbacks, never carried from one invocation to the next (CliRunner runs many in a process).
VERBOSITY = Verbosity()

#: Where the group leaves its -q/-v for the command's options (click shares ctx.meta).
_GROUP_KEY = "imgops.verbosity"


def set_group_verbosity(ctx: click.Context, quiet: bool, verbose: bool) -> None:
    """Records the group's -q/-v (imgops -q gray ...) for the command about to run."""
    ctx.meta[_GROUP_KEY] = Verbosity(quiet=quiet, verbose=verbose)
    VERBOSITY.quiet, VERBOSITY.verbose = quiet, verbose


def _group_verbosity(ctx: click.Context) -> Verbosity:
    return ctx.meta.get(_GROUP_KEY) or Verbosity()


def _set_quiet(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    VERBOSITY.quiet = bool(value) or _group_verbosity(ctx).quiet
    return VERBOSITY.quiet


def _set_verbose(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    VERBOSITY.verbose = bool(value) or _group_verbosity(ctx).verbose
    return VERBOSITY.verbose


#: Files from which `imgops gray --device auto` picks CUDA: imgops.engine.device's
#: CUDA_MIN_FILES_DRIVER (the torch-free CUDA engine) and CUDA_MIN_FILES (the torch engine, where
#: imgops was built without its fatbin kernels), repeated here so that --help does not import
#: the engine (tests/test_cli_help.py checks them).
GRAY_CUDA_MIN_FILES = 1000
GRAY_CUDA_MIN_FILES_TORCH = 3000

#: What --device auto means, for every command.
DEVICE_HELP = (
    "auto: the GPU when it pays (a CUDA GPU visible and imgops' CUDA kernels built; gray also "
    f"needs nvImageCodec and at least {GRAY_CUDA_MIN_FILES} files, {GRAY_CUDA_MIN_FILES_TORCH} "
    "on the torch engine, any number where `imgops serve` keeps the GPU warm), else the CPU; "
    "or cpu, "
    "cuda, cuda:N. Every device gives the same bits."
)


def _validate_device(ctx: click.Context, param: click.Parameter, value: str) -> str:
    value = value.strip().lower()
    if value in ("auto", "cpu", "cuda"):
        return value
    if value.startswith("cuda:") and value[5:].isdigit():
        return value
    raise click.BadParameter(f"expected auto, cpu, cuda or cuda:N, got {value!r}")


device_option = click.option(
    "--device", default="auto", show_default=True, callback=_validate_device, help=DEVICE_HELP
)
gray_device_option = device_option  # the same meaning for every command (kept for imports)
overwrite_option = click.option(
    "--overwrite",
    is_flag=True,
    help="Replace existing outputs (refused otherwise). Inputs are never replaced.",
)
skip_existing_option = click.option(
    "--skip-existing", is_flag=True, help="Skip inputs whose output exists (resumable batches)."
)
quiet_option = click.option(
    "-q",
    "--quiet",
    is_flag=True,
    callback=_set_quiet,
    help="No progress, no summary (errors are still printed).",
)
verbose_option = click.option(
    "-v", "--verbose", is_flag=True, callback=_set_verbose, help="More detail, and tracebacks."
)
output_option = click.option(
    "-o", "--output", metavar="OUTPUT", help="Output file for one input ('-' = stdout)."
)
output_dir_option = click.option(
    "-d",
    "--output-dir",
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    help="Write every output into DIR (created; inputs found in folders keep their sub-folders).",
)
recursive_option = click.option(
    "-r", "--recursive", is_flag=True, help="Descend into sub-folders of folder inputs."
)
files_from_option = click.option(
    "--files-from",
    metavar="LIST",
    help="Read input paths from LIST, one a line ('-' = stdin; NUL-separated with -0).",
)
null_option = click.option(
    "-0", "--null", is_flag=True, help="--files-from entries end in NUL bytes (find -print0)."
)
stats_json_option = click.option(
    "--stats-json",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Write counts, failed inputs with reasons, device and stage seconds as JSON to FILE "
    "(written atomically; never an input or output of the batch).",
)


def name_option(default_beside: str, default_in_dir: str):
    """--name TEMPLATE with the command's defaults (beside the input, and with -d)."""
    return click.option(
        "--name",
        "name_template",
        metavar="TEMPLATE",
        help="Output file name: fields {stem} {ext} {suffix} {parent}  "
        f"[default: '{default_beside}', with -d '{default_in_dir}']",
    )


SCHEDULER_HELP = (
    "Run on a Dask cluster (needs imgops[dask]): local:N (N worker processes on this host), "
    "local-cuda (one worker per GPU, needs dask-cuda) or tcp://HOST:PORT (a running scheduler; "
    "inputs and outputs must be on storage every worker sees)."
)


def _check_spec(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    from .dask.cluster import parse_spec  # plain Python: imports no dask

    try:
        parse_spec(value)
    except ValueError as error:
        raise click.BadParameter(str(error)) from None
    return value


#: `--scheduler SPEC` (env IMGOPS_SCHEDULER): adds `scheduler: str | None`; the commands then
#: run through imgops.dask.run (dask loads only there).
scheduler_option = click.option(
    "--scheduler",
    "scheduler",
    metavar="SPEC",
    default=None,
    envvar="IMGOPS_SCHEDULER",
    callback=_check_spec,
    help=SCHEDULER_HELP,
)


def plan_errors(error: PlanError) -> click.ClickException:
    """The click exception for a planner error: exit 2 (usage) or 1 (an input problem)."""
    if error.exit_code == 2:
        return click.UsageError(str(error))
    return CliError(str(error), error.exit_code)


@contextlib.contextmanager
def planner_errors() -> Iterator[None]:
    """Turns imgops.errors.PlanError raised inside into the matching click exception."""
    try:
        yield
    except PlanError as error:
        raise plan_errors(error) from None


OVERWRITE_RULE = f"Existing outputs are refused {OVERWRITE_HINT}; inputs are never replaced."


def resolve_device(name: str):
    """The torch.device for --device; `auto` picks CUDA only when GPU and CUDA kernels are there."""
    import torch

    from . import _extension

    cuda_kernels = bool(_extension.load().get("cuda_kernels"))
    if name == "auto":
        return torch.device("cuda" if cuda_kernels and torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ImgopsError(f"--device {name}: no CUDA GPU is visible to torch")
    if not cuda_kernels:
        raise ImgopsError(
            f"--device {name}: imgops was built without CUDA kernels (run `imgops doctor`)"
        )
    device = torch.device(name)
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise ImgopsError(f"--device {name}: only {torch.cuda.device_count()} GPU(s) visible")
    return device
