"""`imgops doctor`: what was built, what the machine has, and what to do about any mismatch."""

from __future__ import annotations

import click

from .._build_support import plan_cuda


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


def cli_kernels_built() -> bool:
    """Whether imgops._cli_kernels (the torch-free CPU kernels of the command line) imports."""
    try:
        from .. import _cli_kernels  # noqa: F401
    except ImportError:
        return False
    return True


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print build_info() as JSON.")
def doctor(as_json: bool) -> None:
    """Show how imgops was built, the GPUs seen, and any problem found with what to do.

    \b
    $ imgops doctor
    """
    import json

    import torch

    from .._extension import build_info

    info = {**build_info(), "cli_kernels": cli_kernels_built()}
    problems = find_problems(info)
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
