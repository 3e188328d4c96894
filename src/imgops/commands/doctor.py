"""`imgops doctor`: what was built, what the machine has, and what to do about any mismatch."""

from __future__ import annotations

import os
from pathlib import Path

import click

from .._build_support import plan_cuda
from ..cli_common import ImgopsCommand


def find_problems(info: dict) -> list[str]:
    """Problems in a build_info() dict, each with what to do about it."""
    problems = []
    if info["cuda_available"] and not info["cuda_kernels"]:
        why = info.get("cuda_skipped_reason") or "unknown reason"
        problems.append(
            f"a GPU is visible but the CUDA kernels are not compiled in ({why}). Install a "
            f"CUDA toolkit whose major version matches torch's CUDA {info['torch_cuda']}, set "
            "CUDA_HOME, then reinstall imgops (FORCE_CUDA=1 pip install --no-build-isolation .)"
        )
    nvcc, torch_cuda = info["nvcc_found"], info["torch_cuda"]
    if torch_cuda and nvcc and nvcc.split(".")[0] != torch_cuda.split(".")[0]:
        problems.append(
            f"nvcc is CUDA {info['nvcc_found']} but torch uses CUDA {info['torch_cuda']}: "
            "CUDA kernels cannot be built; install a matching toolkit or torch"
        )
    if info["torch_cuda"] and not info["nvcc_found"] and not info["cuda_kernels"]:
        problems.append("no nvcc found: set CUDA_HOME or put the CUDA toolkit's bin on PATH")
    if info.get("cli_kernels") is False:
        problems.append(
            "imgops._cli_kernels is not built (a just-in-time install): `imgops gray` on the CPU "
            "imports torch at start-up and filters PNG rows in numpy; reinstall imgops ahead of "
            "time (pip install --no-build-isolation .) to build it"
        )
    if info.get("rebuild_reason"):
        problems.append(
            f"the prebuilt extension was not used ({info['rebuild_reason']}); a just-in-time "
            "build was used instead. Reinstall imgops to rebuild it ahead of time"
        )
    return problems


def codec_problems(codecs: dict[str, bool]) -> list[str]:
    """Problems in io.volumes.codec_status(): TIFF compressions this install cannot decode."""
    missing = sorted(name for name, usable in codecs.items() if not usable)
    if not missing:
        return []
    return [
        f"TIFF stacks compressed with {', '.join(missing)} cannot be read: install imagecodecs "
        "(pip install imagecodecs)"
    ]


def stale_problems(folders: list[Path]) -> list[str]:
    """Temporary files left by killed imgops runs in `folders`, with the command to remove them."""
    from ..io.atomic import stale_temporaries

    problems = []
    for folder in folders:
        stale = stale_temporaries(folder) if folder.is_dir() else []
        if stale:
            names = ", ".join(str(path) for path in stale[:3]) + (" ..." if len(stale) > 3 else "")
            problems.append(
                f"{len(stale)} temporary file(s) of killed imgops runs in {folder} ({names}); the "
                "next run writing there removes them, or delete them by hand"
            )
    return problems


def codec_info() -> dict[str, str]:
    """Which decoder and encoders the gray command uses here, and which TIFF codecs are usable."""
    from ..io import gpu_decode, png, volumes

    usable, why = gpu_decode.status()
    info = {"gpu jpeg decoder": ("nvImageCodec: " if usable else "not used: ") + why}
    info["cuda engine (gray)"] = cuda_engine_info()
    info["server"] = server_info()
    info.update({f"png {level}": backend for level, backend in png.backend_info().items()})
    codecs = volumes.codec_status()
    info["tiff codecs"] = ", ".join(f"{k}{'' if v else ' (missing)'}" for k, v in codecs.items())
    return info


def cuda_engine_info() -> str:
    """Which engine `imgops gray --device cuda` runs on here, and why."""
    from ..engine import cuda_driver
    from ..engine.device import driver_engine_usable
    from ..engine.ops import GRAY

    if not driver_engine_usable(GRAY):
        if cuda_driver.kernels_path() is None:
            return "torch (imgops was built without its fatbin kernels, _device_kernels.fatbin)"
        return "torch (IMGOPS_CUDA_ENGINE=torch)"
    where = "" if cuda_driver.driver_available() else "; no CUDA driver or GPU on this machine"
    from ..io import nvimgcodec_c

    api = os.environ.get("IMGOPS_NVIMGCODEC_API", "c")
    if nvimgcodec_c.package_dir() is None:
        decoder = "nothing (nvImageCodec is not installed: the CPU decodes)"
    elif api == "python":
        decoder = "its Python module (IMGOPS_NVIMGCODEC_API=python)"
    elif not nvimgcodec_c.verified():
        decoder = f"its Python module (the C API binding is checked for {nvimgcodec_c.VERIFIED})"
    else:
        from ..engine.driver import jpeg_encoder_api

        decoder = "its C API" + (
            " (-f jpg: its JPEG encoder too, on the decoder's instance)"
            if jpeg_encoder_api() == "c"
            else " (-f jpg: the Python module's JPEG encoder, IMGOPS_JPEG_ENCODER_API=python)"
        )
    from ..io.png import DEFAULT_LEVEL, device_deflate, gpu_deflate_wanted

    if not gpu_deflate_wanted():
        deflate = "the CPU threads (IMGOPS_GPU_DEFLATE=0)"
    elif device_deflate(DEFAULT_LEVEL) is None:
        deflate = "the CPU threads (imgops._cli_kernels is not built)"
    else:
        deflate = "the GPU at --png-level 2 (the CPU encoder's bytes), the CPU at other levels"
    return (
        f"torch-free: fatbin kernels through the CUDA driver, nvImageCodec decode through "
        f"{decoder}, PNG deflate on {deflate}{where}"
    )


def server_info() -> str:
    """Whether gray/bin/normvol are relayed to an `imgops serve` here (IMGOPS_SERVER)."""
    from ..serve.client import server_status

    path, answers = server_status()
    if path is None:
        return "none (IMGOPS_SERVER is unset: each command starts its own process)"
    if answers:
        return f"gray, bin and normvol are relayed to the imgops serve at {path}"
    return f"IMGOPS_SERVER names {path}, where no server answers (commands run here)"


def server_problems(info: dict) -> list[str]:
    """IMGOPS_SERVER set with no server answering: every command prints a note."""
    if "no server answers" not in str(info.get("server", "")):
        return []
    return ["IMGOPS_SERVER is set but no imgops server answers: start one (`imgops serve &`) or "
            "unset IMGOPS_SERVER"]  # fmt: skip


def cli_kernels_built() -> bool:
    """Whether imgops._cli_kernels (the torch-free CPU kernels of the command line) imports."""
    try:
        from .. import _cli_kernels  # noqa: F401
    except ImportError:
        return False
    return True


@click.command(cls=ImgopsCommand)
@click.option("--json", "as_json", is_flag=True, help="Print build_info() as JSON.")
@click.argument(
    "folders", nargs=-1, type=click.Path(file_okay=False, path_type=Path), metavar="[FOLDER]..."
)
def doctor(as_json: bool, folders: tuple[Path, ...]) -> None:
    """Show how imgops was built, the GPUs seen, the codecs in use, and any problem found with
    what to do. FOLDERs (default: the current one) are checked for temporary files of killed runs.

    \b
    $ imgops doctor
    $ imgops doctor out/ --json
    """
    import json

    import torch

    from .._extension import build_info
    from ..io.volumes import codec_status

    info = {**build_info(), "cli_kernels": cli_kernels_built(), **codec_info()}
    problems = find_problems(info)
    problems += codec_problems(codec_status())
    problems += server_problems(info)
    problems += stale_problems(list(folders) or [Path.cwd()])
    if as_json:
        click.echo(json.dumps({**info, "problems": problems}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="imgops build", show_header=False)
    for key, value in info.items():
        table.add_row(key, ", ".join(value) if isinstance(value, list) else str(value))
    console = Console()
    console.print(table)
    if not torch.cuda.is_available():
        plan = plan_cuda(torch.version.cuda)
        console.print(f"No GPU visible: imgops runs on the CPU. ({plan.reason or 'nvcc ok'})")
    for problem in problems:
        console.print(f"[bold yellow]problem:[/] {problem}")
    if not problems:
        console.print("[green]No problems found.[/]")
