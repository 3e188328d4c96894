"""The `imgops` command line: a click group; each subcommand lives in imgops.commands.

torch, cv2 and tifffile are imported lazily, inside the commands, so `imgops --help` is fast.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import NoReturn

import click

from . import __version__
from .cli_common import VERBOSITY, set_group_verbosity
from .commands.bench import bench
from .commands.bin import bin_command
from .commands.doctor import doctor
from .commands.gray import gray
from .commands.normvol import normvol
from .commands.serve import serve
from .io import decoder_warnings, signals
from .io.atomic import remove_pending_temporaries


def _print_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    import torch

    from ._extension import build_info

    info = build_info()
    kernels = "CPU+CUDA" if info["cuda_kernels"] else "CPU"
    click.echo(
        f"imgops {__version__}, torch {torch.__version__}, CUDA {torch.version.cuda or 'none'}, "
        f"extension {info['mode']} ({kernels} kernels)"
    )
    ctx.exit()


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show imgops, torch, CUDA and extension build versions.",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress, no summary (errors still print).")
@click.option("-v", "--verbose", is_flag=True, help="More detail, and tracebacks on errors.")
@click.pass_context
def cli(ctx: click.Context, quiet: bool, verbose: bool) -> None:
    """imgops: images and 3-D scans to analysis-ready data, on the GPU when there is one.

    -q and -v may be given before the command (imgops -q gray ...) or after it.

    \b
    $ imgops gray photo.jpg -o photo_gray.png
    $ imgops normvol scan.tif --max 4095
    $ imgops doctor
    """
    set_group_verbosity(ctx, quiet, verbose)


cli.add_command(gray)
cli.add_command(normvol)
cli.add_command(bin_command)
cli.add_command(bench)
cli.add_command(doctor)
cli.add_command(serve)


#: Commands whose decoders (OpenCV's libpng, libjpeg, libtiff) print on descriptor 2 (serve:
#: the gray commands it runs).
_DECODING_COMMANDS = frozenset({"gray", "serve"})


def _decodes_images(args: list[str]) -> bool:
    """Whether this run decodes images (`imgops [-q|-v] gray ...`, not a --help): only then is
    descriptor 2 captured. The capture's exit waits up to 0.2 s for its reader thread
    (imgops.io.decoder_warnings.uninstall), which `imgops --help` must not pay."""
    if "-h" in args or "--help" in args:
        return False
    command = next((a for a in args if not a.startswith("-")), None)
    return command in _DECODING_COMMANDS


def single_threaded_blas() -> None:
    """Asks numpy's OpenBLAS for no threads of its own (OPENBLAS_NUM_THREADS=1), unless the
    caller set it: imgops does no linear algebra, and at numpy's import each of OpenBLAS's
    threads (one per core but one) spins about 0.1 s of CPU before it sleeps -- here one
    thread, 0.10 s of user time; on a 16-core host ~1.5 core-seconds at the moment the
    workers start decoding. Only takes effect before numpy's first import (the CLI imports it
    lazily, inside the commands)."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def main(relay: bool = True) -> None:
    """Runs the CLI (`python -m imgops.cli`; the `imgops` executable comes through
    imgops.entry); Ctrl-C exits 130 and SIGTERM 143, leaving no partial output.

    With IMGOPS_SERVER set (and `relay`: the caller has not tried already), a command a server
    can run is handed to the `imgops serve` process (imgops.serve.client), which is already
    warm; without a server it runs here. For commands that decode images, warnings that C
    libraries print on descriptor 2 are captured from here on and reported with the file they
    came from (imgops.io.decoder_warnings).
    """
    from . import serve

    if relay and serve.wanted():
        from .serve import client

        forwarded = client.forward(sys.argv[1:])
        if forwarded is not None:
            sys.exit(forwarded)
    single_threaded_blas()
    signals.install()
    if _decodes_images(sys.argv[1:]):
        decoder_warnings.install()  # libpng/libjpeg lines: attributed to their file, not raw
    _leave(run_command(None))


def run_command(args: list[str] | None) -> int:
    """Runs one command line (`args` without the program name; None: sys.argv) and returns its
    exit status: errors print one line (the traceback too with -v), Ctrl-C prints
    "interrupted" and gives 130. The process's state (signals, descriptor 2) is the caller's:
    main() here, or the `imgops serve` loop for each command it is handed."""
    try:
        result = cli.main(args=args, standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt):
        remove_pending_temporaries()
        click.echo("imgops: interrupted", err=True)
        return 130
    except click.ClickException as error:
        error.show()
        return error.exit_code
    except click.exceptions.Exit as done:
        return done.exit_code
    except BrokenPipeError:
        return 1
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except Exception as error:  # anything unexpected: one line unless -v asks for the traceback
        remove_pending_temporaries()
        if VERBOSITY.verbose:
            import traceback

            traceback.print_exc()
            return 1
        click.echo(f"imgops: error: {type(error).__name__}: {error}", err=True)
        return 1
    return result if isinstance(result, int) else 0


def _leave(code: int) -> NoReturn:
    """sys.exit(code), except after a batch on the torch-free CUDA engine, whose stage was kept
    (imgops.engine.driver_stage): then the captured warnings and the streams are flushed and
    the process leaves through os._exit, skipping the interpreter's shutdown and the CUDA
    driver's exit handlers, which would tear down a context and a decoder that the kernel
    reclaims anyway. Every output is already complete (committed) by then."""
    stage_module = sys.modules.get("imgops.engine.driver_stage")
    if stage_module is None or not stage_module.holds_kept_stage():
        sys.exit(code)
    decoder_warnings.uninstall()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
