"""Options and helpers shared by every imgops command (rasterio's `rio` is the model).

Nothing here imports torch: `imgops --help` must stay fast.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import click

from .errors import ImgopsError

DEVICE_HELP = "auto (CUDA when a GPU and the CUDA kernels are present), cpu, cuda or cuda:N."


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
GRAY_DEVICE_HELP = (
    "auto (the CPU: for image files the conversion is a few percent of the work, and the CPU "
    "path starts without torch), cpu, cuda or cuda:N. Every device gives the same bits."
)
gray_device_option = click.option(
    "--device",
    default="auto",
    show_default=True,
    callback=_validate_device,
    help=GRAY_DEVICE_HELP,
)
overwrite_option = click.option(
    "--overwrite", is_flag=True, help="Replace existing outputs (refused otherwise)."
)
skip_existing_option = click.option(
    "--skip-existing", is_flag=True, help="Skip inputs whose output exists (resumable batches)."
)
quiet_option = click.option("-q", "--quiet", is_flag=True, help="No progress, no summary.")
verbose_option = click.option(
    "-v", "--verbose", is_flag=True, help="More detail, and full tracebacks on errors."
)


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


@dataclass
class Reporter:
    """Messages and progress on stderr; silent with -q, detailed with -v."""

    quiet: bool = False
    verbose: bool = False

    @property
    def show_progress(self) -> bool:
        return not self.quiet and sys.stderr.isatty()

    def info(self, message: str) -> None:
        if not self.quiet:
            click.echo(message, err=True)

    def detail(self, message: str) -> None:
        if self.verbose and not self.quiet:
            click.echo(message, err=True)

    def error(self, message: str) -> None:
        """Errors are printed even with -q: one line each."""
        click.echo(f"imgops: error: {message}", err=True)

    @contextlib.contextmanager
    def progress(self, description: str, total: float | None) -> Iterator[Callable[..., None]]:
        """A rich progress bar on stderr (only on a terminal); yields advance(n=1)."""
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

        with Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            disable=not self.show_progress,
            transient=False,
        ) as bar:
            task = bar.add_task(description, total=total)
            yield lambda n=1: bar.advance(task, n)
